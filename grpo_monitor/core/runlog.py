"""The run directory: an append-only, schema-versioned JSON-lines log.

Layout of ``<run_dir>/``::

    run.jsonl              header, step, summary, finding, recommendation, restart and note records
                           (written by rank 0 only)
    samples.rank<R>.jsonl  one sample record per completion, written by rank R

Every record is one JSON object on one line with a ``type`` field. A line is written with a
single ``os.write`` on a file opened with ``O_APPEND``, so a crash can tear at most the last
line, and every record is in the operating system's hands the moment ``append`` returns.
Non-finite floats are written as the strings ``"nan"``, ``"inf"`` and ``"-inf"``; ``None`` is a
gap (TRL logs ``None`` when every value in the logging window was NaN).

A bad record costs that record alone: readers stream the files, skip a line that does not parse
(or is too long, or holds NUL bytes) and count it with its file and line (``Skipped``). A write
that fails (the disk full, an I/O error) costs the records of that write: the writer cuts what it
left half-written before it appends again, counts what it could not write and says so in the log
(``write_failed`` notes, read back by ``write_losses``) as soon as it can write again, so a
reader can tell how much of the run is missing and why.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo_monitor.core.jsonparse import fast_loads, loads
from grpo_monitor.core.metrics import decode, encode

SCHEMA_VERSION = 1
RUN_FILE = "run.jsonl"
SAMPLES_GLOB = "samples.rank*.jsonl"
RECORD_TYPES = ("header", "step", "summary", "sample", "finding", "recommendation", "restart", "note")
_SAMPLES_RE = re.compile(r"^samples\.rank(\d+)\.jsonl$")
# The longest line a reader takes as a record: far beyond any the writer makes (a header, an MoE
# step's expert loads, a kept completion's text are kilobytes), small enough to hold in memory.
MAX_RECORD_BYTES = 16 << 20
READ_CHUNK = 1 << 20
_STEP_MIN, _STEP_MAX = -(2**63), 2**63 - 1
logger = logging.getLogger("grpo_monitor")


class RunLogError(ValueError):
    """An unusable run log; the message is one line naming the file (and line) and the fault."""


def plain_step(value: Any) -> int | None:
    """A step as the writer writes it: a plain integer in the 64-bit range; None for anything
    else (a bool, a string, a float, even an integral one: a record that says ``"step": 2.0``
    was not written by us and must not stand in for step 2).

    >>> [plain_step(v) for v in (3, True, "4", 5.5, 2.0, 2**63)]
    [3, None, None, None, None, None]
    """
    return value if type(value) is int and _STEP_MIN <= value <= _STEP_MAX else None


class Skipped:
    """Records a reader left out, each alone: how many, and where (the first ``SHOWN``).

    >>> s = Skipped(); s.add("run.jsonl:3: corrupt record"); s.count, s.line()
    (1, 'skipped 1 unreadable record (the rest was read): run.jsonl:3: corrupt record')
    """

    SHOWN = 20

    def __init__(self) -> None:
        self.count = 0
        self.where: list[str] = []
        self._seen: set[Any] = set()

    def add(self, message: str, key: Any = None) -> None:
        """Count one skipped record; ``key`` (e.g. file and line) counts a record read twice once."""
        if key is not None:
            if key in self._seen:
                return
            self._seen.add(key)
        self.count += 1
        if len(self.where) < self.SHOWN:
            self.where.append(message)

    def merge(self, other: Skipped) -> None:
        self.count += other.count
        self.where.extend(other.where[: max(0, self.SHOWN - len(self.where))])

    def line(self) -> str | None:
        """One line saying how many records were skipped and where the first ones were."""
        if not self.count:
            return None
        shown = "; ".join(self.where[:3])
        more = f"; and {self.count - 3} more" if self.count > 3 else ""
        plural = "s" if self.count != 1 else ""
        return f"skipped {self.count} unreadable record{plural} (the rest was read): {shown}{more}"

    def to_dict(self) -> dict[str, Any]:
        return {"count": self.count, "where": list(self.where)}


def samples_file(rank: int) -> str:
    return f"samples.rank{int(rank)}.jsonl"


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, float):
        return encode(obj)
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if obj is None or isinstance(obj, (str, int, bool)):
        return obj
    try:  # numpy scalars and the like
        return _jsonable(obj.item())
    except Exception:
        return str(obj)


_encoder = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def dumps(record: Mapping[str, Any]) -> str:
    try:  # the common case: plain finite values, encoded in C
        return _encoder.encode(record)
    except (ValueError, TypeError):
        return _encoder.encode(_jsonable(record))


def _cut_torn_tail(fd: int) -> int:
    size = os.fstat(fd).st_size
    if not size or os.pread(fd, 1, size - 1) == b"\n":
        return 0
    chunk = 1 << 16
    end = size
    while end > 0:
        start = max(0, end - chunk)
        block = os.pread(fd, end - start, start)
        nl = block.rfind(b"\n")
        if nl >= 0:
            keep = start + nl + 1
            break
        end = start
    else:
        keep = 0
    os.ftruncate(fd, keep)
    return size - keep


class JsonlWriter:
    """Line-atomic appends to one JSON-lines file.

    An append that fails part-way (the disk filled mid-line) leaves a torn line: the writer cuts
    the file back to its last whole record at once and, where the file system refused that too,
    before its next append, so no record is ever written after a fragment."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        self._lock = threading.Lock()
        # A previous writer killed mid-line left a torn tail: that record was never complete, so it
        # is cut off, and the file stays a sequence of whole records that every reader accepts.
        self.truncated_bytes = _cut_torn_tail(self._fd)
        self._whole = os.fstat(self._fd).st_size  # bytes of whole records
        self._torn = False

    @staticmethod
    def encode(records: Iterable[Mapping[str, Any]]) -> bytes:
        return "".join(dumps(r) + "\n" for r in records).encode("utf-8")

    def append(self, records: Iterable[Mapping[str, Any]]) -> int:
        return self.append_bytes(self.encode(records))

    def append_bytes(self, data: bytes) -> int:
        if not data:
            return 0
        with self._lock:
            if self._torn:
                self._cut()
            view = memoryview(data)
            try:
                while view:
                    n = os.write(self._fd, view)
                    view = view[n:]
            except OSError:
                self._torn = True
                try:
                    self._cut()
                except OSError:
                    pass  # tried again before the next append
                raise
            self._whole += len(data)
        return len(data)

    def _cut(self) -> None:
        size = os.fstat(self._fd).st_size
        if size > self._whole:
            os.ftruncate(self._fd, self._whole)
        elif size < self._whole:  # shortened by someone else: keep what is whole of it
            _cut_torn_tail(self._fd)
            self._whole = os.fstat(self._fd).st_size
        self._torn = False

    def free_bytes(self) -> int | None:
        """Bytes the file system has room for (None where it cannot tell)."""
        try:
            st = os.fstatvfs(self._fd)
        except (OSError, AttributeError):
            return None
        return st.f_bavail * st.f_frsize

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


RESERVE_FILE = ".grpo-monitor-reserve"
RESERVE_BYTES = 128 << 10
_DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


def _error_text(exc: OSError) -> str:
    return exc.strerror or str(exc) or type(exc).__name__


class _Loss:
    """Records of one file that could not be written and that no note has counted yet."""

    def __init__(self, file: str, exc: OSError) -> None:
        self.file = file
        self.error = _error_text(exc)
        self.disk_full = exc.errno in _DISK_FULL
        self.by_type: dict[str, int] = {}
        self.first_step: int | None = None
        self.last_step: int | None = None
        self.ongoing = True  # writes to the file still fail
        self.told = False  # a note has said that the outage began

    def add(self, records: Iterable[Mapping[str, Any]]) -> None:
        for r in records:
            kind = str(r.get("type"))
            self.by_type[kind] = self.by_type.get(kind, 0) + 1
            step = plain_step(r.get("step"))
            if step is not None:
                self.first_step = step if self.first_step is None else min(self.first_step, step)
                self.last_step = step if self.last_step is None else max(self.last_step, step)

    @property
    def due(self) -> bool:
        return not self.told or not self.ongoing

    def note(self, ongoing: bool, closing: bool = False) -> dict[str, Any]:
        a, b = self.first_step, self.last_step
        lost = ", ".join(f"{n} {t} record{'s' if n != 1 else ''}" for t, n in self.by_type.items()) or "no record"
        steps = "" if a is None else f" (step {a})" if a == b else f" (steps {a}-{b})"
        cause = "the disk filled" if self.disk_full else f"writing failed ({self.error})"
        if not ongoing and not self.by_type:
            what = f"{self.file} can be written again"
        elif not ongoing:
            what = f"{lost}{steps} could not be written to {self.file}; it is written again from here"
        elif closing:
            what = f"{lost}{steps} could not be written to {self.file}, which still failed when the run log was closed"
        else:
            what = f"{self.file} cannot be written; its records are counted and left out until it can ({lost}{steps} so far)"
        return {"type": "note", "step": a, "level": "warning", "kind": "write_failed", "file": self.file,
                "error": self.error, "disk_full": self.disk_full, "lost": dict(self.by_type),
                "first_step": a, "last_step": b, "ongoing": ongoing, "final": closing, "message": f"{cause}: {what}"}

    def counted(self) -> None:
        self.by_type = {}
        self.first_step = self.last_step = None
        self.told = True


class RunWriter:
    """Writes one run directory. Rank 0 writes ``run.jsonl``; every rank writes its own samples.

    A write that fails costs the records of that write, never the run: they are counted, and the
    count goes into ``run.jsonl`` as a ``write_failed`` note when it can be written (at once when
    the disk filled, and again when writing works again or the writer closes). The error goes to
    ``on_error("run log", exc)`` once per outage (without ``on_error``: raised at every failed
    write). Rank 0 keeps a small reserve file (``RESERVE_FILE``) beside the log and gives it up
    when the disk fills, which leaves those notes room; while the disk is full, a write is tried
    only once the file system has room for it and for the reserve again.
    """

    def __init__(self, run_dir: str | os.PathLike[str], rank: int = 0, on_error: Any = None) -> None:
        self.run_dir = Path(run_dir)
        self.rank = int(rank)
        self.is_main = self.rank == 0
        self.on_error = on_error
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._run = JsonlWriter(self.run_dir / RUN_FILE) if self.is_main else None
        self._samples: JsonlWriter | None = None
        self._losses: dict[str, _Loss] = {}
        self._full = False  # a write found the disk full, and no write has found room since
        self._error: OSError | None = None  # to report once the write at hand is done with
        self._reserve = self.run_dir / RESERVE_FILE if self.is_main else None
        self._make_reserve()

    def write(self, *records: Mapping[str, Any]) -> None:
        if self._run is not None:
            self._append(self._run, list(records))
            self._report()

    def header(self, **fields: Any) -> dict[str, Any]:
        record = {"type": "header", "schema": SCHEMA_VERSION, **fields}
        self.write(record)
        return record

    def step(self, step: int, metrics: Mapping[str, float | None], time: float) -> None:
        self.write({"type": "step", "step": int(step), "time": time, "metrics": dict(metrics)})

    def samples(self, records: Iterable[Mapping[str, Any]]) -> None:
        rows = [{"type": "sample", **r} for r in records]
        if self._samples is None:
            try:
                self._samples = JsonlWriter(self.run_dir / samples_file(self.rank))
            except OSError as exc:
                self._failed(samples_file(self.rank), rows, exc)
                self._report()
                return
        self._append(self._samples, rows)
        self._report()

    def _append(self, writer: JsonlWriter, records: list[Mapping[str, Any]], force: bool = False,
                closing: bool = False) -> None:
        """``force``: write the notes due even while the disk is full (into the reserve's room)."""
        name = writer.path.name
        notes: list[_Loss] = []
        if writer is self._run:
            # The notes go ahead of the records they precede; this file's own outage ends with
            # this write when it succeeds (a forced write of notes alone does not end it).
            ends = bool(records) and not force
            notes = [loss for loss in self._losses.values()
                     if loss.due or (closing and loss.by_type) or (ends and loss.file == name)]
            rows = [loss.note(ongoing=loss.ongoing and not (ends and loss.file == name), closing=closing)
                    for loss in notes] + records
        else:
            rows = records
        if not rows:
            return
        data = writer.encode(rows)
        if self._full and not force:
            free = writer.free_bytes()
            if free is not None and free < len(data) + RESERVE_BYTES:
                self._failed(name, records, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), tried=False)
                return
        try:
            writer.append_bytes(data)
        except OSError as exc:
            self._failed(name, records, exc)
            return
        for loss in notes:
            if loss.file == name and records and not force:
                loss.ongoing = False
                logger.warning("grpo-monitor: %s can be written again (%s)", writer.path, loss.note(False)["message"])
            if loss.ongoing:
                loss.counted()
            else:
                del self._losses[loss.file]
        if force:
            return
        if self._full:
            self._full = False
            self._make_reserve()
        own = self._losses.get(name)
        if own is not None and own.ongoing:  # a samples file writable again: its note goes to run.jsonl
            own.ongoing = False
            logger.warning("grpo-monitor: %s can be written again (%s)", writer.path, own.note(False)["message"])
            if self._run is not None:
                self._append(self._run, [])

    def _failed(self, name: str, records: list[Mapping[str, Any]], exc: OSError, tried: bool = True) -> None:
        loss = self._losses.get(name)
        new_outage = loss is None or not loss.ongoing
        if loss is None:
            loss = self._losses[name] = _Loss(name, exc)
        elif new_outage:
            loss.ongoing, loss.told = True, False
        loss.add(records)
        if new_outage or self.on_error is None:
            self._error = exc
        if tried and exc.errno in _DISK_FULL and not self._full:
            self._full = True
            self._release_reserve()
            if self._run is not None:
                self._append(self._run, [], force=True)  # say so now, in the room the reserve left

    def _report(self) -> None:
        exc, self._error = self._error, None
        if exc is None:
            return
        if self.on_error is None:
            raise exc
        self.on_error("run log", exc)

    def _make_reserve(self) -> None:
        if self._reserve is None:
            return
        try:
            fd = os.open(self._reserve, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                os.posix_fallocate(fd, 0, RESERVE_BYTES)
            finally:
                os.close(fd)
        except (OSError, AttributeError):  # no room for it, or no fallocate here: go without
            self._release_reserve()

    def _release_reserve(self) -> None:
        if self._reserve is not None:
            try:
                os.unlink(self._reserve)
            except OSError:
                pass

    def close(self) -> None:
        if self._run is not None and self._losses:
            if self._full:
                self._release_reserve()
            self._append(self._run, [], force=True, closing=True)
            self._error = None  # already reported: closing reports nothing new
        for w in (self._run, self._samples):
            if w is not None:
                w.close()
        self._release_reserve()


def _decode_metrics(metrics: Any) -> dict[str, float | None]:
    if not isinstance(metrics, Mapping):
        return {}
    if type(metrics) is dict and set(map(type, metrics.values())) <= _PLAIN:
        return metrics  # the common case, checked at C speed: a freshly parsed dict, nothing to decode
    return {str(k): decode(v) for k, v in metrics.items()}


_PLAIN = frozenset({float, type(None)})


MAX_DEPTH = 100  # deeper than any record the writer makes; deeper values break the code that walks them
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def too_deep(data: bytes) -> bool:
    """JSON text ``data`` (already known to parse) nests deeper than ``MAX_DEPTH``."""
    if data.count(b"[") + data.count(b"{") <= MAX_DEPTH:
        return False  # the common case, told at C speed: too few brackets to nest that deep
    depth = 0
    for b in _JSON_STRING.sub(b"", data).translate(None, _NOT_BRACKETS):
        if b in (0x5B, 0x7B):
            depth += 1
            if depth > MAX_DEPTH:
                return True
        else:
            depth -= 1
    return False


def _short(value: Any) -> str:
    text = repr(value) if not isinstance(value, (dict, list)) else type(value).__name__
    return text if len(text) <= 40 else text[:37] + "..."


class _NotARecord(Exception):
    """Why a line is not a run-log record (``parse_line`` adds where it is)."""


def _record(line: bytes) -> dict[str, Any]:
    try:
        record = loads(line)
    except RecursionError:
        raise _NotARecord("corrupt record (nested too deeply)") from None
    except (ValueError, UnicodeDecodeError) as exc:
        text = " ".join(str(exc).split())[:80]
        raise _NotARecord(f"corrupt record ({exc.__class__.__name__}: {text})") from None
    if not isinstance(record, dict) or record.get("type") not in RECORD_TYPES:
        raise _NotARecord("not a run-log record (no known 'type' field)")
    if too_deep(line):
        raise _NotARecord(f"corrupt record (nested deeper than {MAX_DEPTH} levels)")
    kind = record["type"]
    if kind in ("step", "summary", "sample"):
        # The writer writes a step as a plain integer: anything else (true, "4", 5.5, even 2.0)
        # was not written by it, and read as a step it would overwrite a real step's record.
        if plain_step(record.get("step")) is None:
            raise _NotARecord(f"{kind} record without an integer 'step' (got {_short(record.get('step'))})")
        if kind == "sample":
            record["rewards"] = _decode_metrics(record.get("rewards"))
        else:
            record["metrics"] = _decode_metrics(record.get("metrics"))
    return record


def parse_line(line: bytes, where: str) -> dict[str, Any]:
    """One run-log record; ``RunLogError`` (one line naming ``where``) when the line is not one."""
    try:
        return _record(line)
    except _NotARecord as exc:
        raise RunLogError(f"{where}: {exc}") from None


class LineSplitter:
    """The lines of a file read a piece at a time, numbered from 1, as ``(lineno, line, why)``.

    A line longer than ``MAX_RECORD_BYTES`` or holding a NUL byte (a hole of a sparse file, the
    zeros a power cut leaves) is never held whole: it comes out as ``(lineno, None, why)`` once
    its newline is read, and meanwhile ``discarding`` tells the reader it may jump over holes.

    >>> s = LineSplitter(); s.feed(b'{"a": 1}\n{"b"'), s.feed(b': 2}\n\x00\x00'), s.feed(b'\x00\n'), s.tail()
    ([(1, b'{"a": 1}', '')], [(2, b'{"b": 2}', '')], [(3, None, 'NUL bytes in the line')], None)
    """

    def __init__(self) -> None:
        self.lineno = 0
        self.discarding = False
        self.why = ""
        self._parts: list[bytes] = []
        self._size = 0

    def feed(self, data: bytes) -> list[tuple[int, bytes | None, str]]:
        out: list[tuple[int, bytes | None, str]] = []
        if self.discarding:
            nl = data.find(b"\n")
            if nl < 0:
                return out
            self.discarding = False
            out.append((self.lineno, None, self.why))
            data = data[nl + 1 :]
        lines = data.split(b"\n")
        rest = lines.pop()
        if lines and self._parts:
            lines[0] = b"".join(self._parts) + lines[0]
            self._parts, self._size = [], 0
        for line in lines:
            self.lineno += 1
            if len(line) > MAX_RECORD_BYTES:
                out.append((self.lineno, None, f"a line of {len(line):,} bytes, beyond the {MAX_RECORD_BYTES:,} a record may have"))
            else:
                out.append((self.lineno, line, ""))
        if rest:
            self._parts.append(rest)
            self._size += len(rest)
            if b"\x00" in rest or self._size > MAX_RECORD_BYTES:
                self.why = "NUL bytes in the line" if b"\x00" in rest else f"a line beyond the {MAX_RECORD_BYTES:,} bytes a record may have"
                self._parts, self._size = [], 0
                self.lineno += 1
                self.discarding = True
        return out

    def tail(self) -> tuple[int, bytes | None] | None:
        """The last line when the file does not end with a newline (None when it does)."""
        if self.discarding:
            return self.lineno, None
        if self._parts:
            return self.lineno + 1, b"".join(self._parts)
        return None


def next_data(fd: int, pos: int) -> int:
    """Where the file's data resumes at or after ``pos``: a hole (all NUL bytes, so no newline and
    no record) is jumped over instead of read; ``pos`` where the file system cannot tell."""
    seek_data = getattr(os, "SEEK_DATA", None)
    if seek_data is None:
        return pos
    try:
        return os.lseek(fd, pos, seek_data)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # nothing but a hole up to the end
            return max(pos, os.fstat(fd).st_size)
        return pos


def _skip(skipped: Skipped | None, where: str, why: str) -> None:
    if skipped is not None:
        skipped.add(f"{where}: {why}")


def iter_records(path: Path, warnings: list[str] | None = None,
                 skipped: Skipped | None = None) -> Iterator[dict[str, Any]]:
    """Every record of one JSON-lines file, read a chunk at a time (memory does not grow with the
    file). A line that is not a record costs that line alone: it is skipped and counted in
    ``skipped`` with its file and line. A torn last line (no newline) is skipped and reported in
    ``warnings``. ``RunLogError`` only when the file cannot be opened."""
    try:
        fh = open(path, "rb", buffering=0)
    except OSError as exc:
        raise RunLogError(f"{path}: cannot read ({exc.strerror or exc})") from None
    lines = LineSplitter()
    pos = 0
    try:
        while True:
            if lines.discarding:
                pos = next_data(fh.fileno(), pos)
            try:
                fh.seek(pos)
                chunk = fh.read(READ_CHUNK)
            except OSError as exc:
                if warnings is not None:
                    warnings.append(f"{path}: cannot read past byte {pos} ({exc.strerror or exc}); "
                                    "the records before it were read")
                return
            if not chunk:
                break
            pos += len(chunk)
            for lineno, line, why in lines.feed(chunk):
                if line is None:
                    _skip(skipped, f"{path}:{lineno}", why)
                elif line.strip():
                    try:
                        record = _record(line)
                    except _NotARecord as exc:  # the place is formatted only for a line that is left out
                        _skip(skipped, f"{path}:{lineno}", str(exc))
                        continue
                    yield record
        tail = lines.tail()
        if tail is not None:
            lineno, line = tail
            try:
                if line is None:
                    raise RunLogError("unusable")
                if line.strip():
                    yield parse_line(line, f"{path}:{lineno}")
            except RunLogError:
                if warnings is not None:
                    warnings.append(f"{path}:{lineno}: skipped a half-written last line")
    finally:
        fh.close()


@dataclass
class RunLog:
    """A parsed run directory."""

    path: Path
    header: dict[str, Any] = field(default_factory=dict)
    steps: list[dict[str, Any]] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)
    findings: list[dict[str, Any]] = field(default_factory=list)
    recommendations: list[dict[str, Any]] = field(default_factory=list)
    restarts: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] | None = None
    notes: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    skipped: Skipped = field(default_factory=Skipped)  # lines that were not records, each left out alone
    header_count: int = 0

    def add(self, record: dict[str, Any]) -> None:
        kind = record["type"]
        if kind == "header":
            self.header_count += 1
            if not self.header:  # a resumed segment appends a second header: the first one names the run
                self.header = record
        elif kind == "step":
            self.steps.append(record)
        elif kind == "sample":
            self.samples.append(record)
        elif kind == "finding":
            self.findings.append(record)
        elif kind == "recommendation":
            self.recommendations.append(record)
        elif kind == "restart":
            self.restarts.append(record)
        elif kind == "summary":
            self.summary = record
        elif kind == "note":
            self.notes.append(record)

    def samples_by_step(self) -> dict[int, list[dict[str, Any]]]:
        """Each step's samples from every rank, in global batch order (as the live detectors saw them)."""
        out: dict[int, list[dict[str, Any]]] = {}
        for s in self.samples:
            out.setdefault(int(s.get("step", -1)), []).append(s)
        for rows in out.values():
            if any(r.get("rank", 0) for r in rows):  # several ranks' files: merge by global index
                rows.sort(key=batch_index)
        return out


@dataclass
class WriteLoss:
    """What the writer could not write, summed over its ``write_failed`` notes."""

    records: dict[str, int]  # by record type
    first_step: int | None
    last_step: int | None
    disk_full: bool
    errors: list[str]
    ongoing: bool  # the log ends while writing still failed
    uncounted: bool  # ... and without the writer's closing count: more may be missing than counted

    @property
    def steps(self) -> int:
        """Step records not written (each a logged step missing from the log)."""
        return self.records.get("step", 0)

    def line(self, recorded_steps: int) -> str:
        """One sentence for a report: what is missing, why, and how much of the run the log holds."""
        parts = [f"{self.steps} step record{'s' if self.steps != 1 else ''}"] if self.steps else []
        if self.records.get("summary"):
            parts.append("the final summary")
        parts += [f"{n} {kind} record{'s' if n != 1 else ''}" for kind, n in self.records.items()
                  if kind not in ("step", "summary")]
        a, b = self.first_step, self.last_step
        span = "" if a is None else f" (step {a})" if a == b else f" (steps {a}-{b})"
        cause = "the disk filled" if self.disk_full else f"writing the log failed ({'; '.join(self.errors)})"
        text = f"{cause}: {', '.join(parts) or 'records'}{span} could not be written"
        if self.steps:
            text += f"; the log holds {recorded_steps} of the {recorded_steps + self.steps} steps logged"
        if self.uncounted:
            text += "; the log ends while writing still failed, so more may be missing"
        elif self.ongoing:
            text += "; writing still failed when the run ended"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {"records": dict(self.records), "steps": self.steps, "first_step": self.first_step,
                "last_step": self.last_step, "disk_full": self.disk_full, "errors": list(self.errors),
                "ongoing": self.ongoing, "uncounted": self.uncounted}


def write_losses(notes: Iterable[Mapping[str, Any]]) -> WriteLoss | None:
    """The records a run's writer could not write, from its ``write_failed`` notes (None: none)."""
    records: dict[str, int] = {}
    first = last = None
    disk_full = False
    errors: list[str] = []
    ongoing: dict[str, tuple[bool, bool]] = {}  # file -> (still failing, counted to the end)
    seen = False
    for note in notes:
        if note.get("kind") != "write_failed":
            continue
        seen = True
        lost = note.get("lost")
        for kind, n in (lost.items() if isinstance(lost, Mapping) else ()):
            if type(n) is int and n > 0:
                records[str(kind)] = records.get(str(kind), 0) + n
        a, b = plain_step(note.get("first_step")), plain_step(note.get("last_step"))
        if a is not None:
            first = a if first is None else min(first, a)
        if b is not None:
            last = b if last is None else max(last, b)
        disk_full |= note.get("disk_full") is True
        error = note.get("error")
        if isinstance(error, str) and error not in errors:
            errors.append(error)
        ongoing[str(note.get("file"))] = (note.get("ongoing") is True, note.get("final") is True)
    if not seen:
        return None
    return WriteLoss(records, first, last, disk_full, errors, any(o for o, _ in ongoing.values()),
                     any(o and not final for o, final in ongoing.values()))


def batch_index(sample: dict[str, Any]) -> int:
    """A sample's position in the step's global generation batch (0 when it has none)."""
    return _int(sample.get("index"))


def _int(value: Any) -> int:
    return value if type(value) is int else 0


def is_run_dir(path: str | os.PathLike[str]) -> bool:
    """``path`` holds a ``run.jsonl`` (False where it cannot be looked into: reading it says why)."""
    try:
        return (Path(path) / RUN_FILE).is_file()
    except OSError:
        return False


def read_run(path: str | os.PathLike[str], samples: bool = True) -> RunLog:
    """Read a run directory (or its ``run.jsonl``) with every rank's samples merged
    (``samples=False``: without them; ``SampleIndex`` reads them a step at a time)."""
    p = Path(path)
    try:
        if p.is_file() and p.name == RUN_FILE:
            p = p.parent
        if not p.exists():
            raise RunLogError(f"{p}: no such file or directory")
        run_file = p / RUN_FILE
        if not run_file.is_file():
            raise RunLogError(f"{p}: not a grpo-monitor run directory (no {RUN_FILE})")
    except OSError as exc:  # a folder the user cannot enter, say
        raise RunLogError(f"{exc.filename or p}: cannot read ({exc.strerror or exc})") from None
    log = RunLog(path=p)
    for record in iter_records(run_file, log.warnings, log.skipped):
        log.add(record)
    if not log.header:
        raise RunLogError(f"{run_file}: no header record")
    try:
        names = sorted(os.listdir(p)) if samples else []
    except OSError as exc:
        log.warnings.append(f"{p}: cannot list the samples files ({exc.strerror or exc})")
        names = []
    for name in names:
        if _SAMPLES_RE.match(name):
            try:
                for record in iter_records(p / name, log.warnings, log.skipped):
                    if record["type"] == "sample":
                        log.samples.append(record)
            except RunLogError as exc:
                log.warnings.append(str(exc))
    log.samples.sort(key=lambda s: (s["step"], _int(s.get("rank")), batch_index(s)))
    if log.skipped.count:
        log.warnings.append(log.skipped.line())  # type: ignore[arg-type]
    # A run resumed from a checkpoint logs some steps again: the latest record of a step wins.
    dedup: dict[int, dict[str, Any]] = {}
    for rec in log.steps:
        dedup[rec["step"]] = rec
    log.steps = [dedup[s] for s in sorted(dedup)]
    return log


# -- samples by step -----------------------------------------------------------------------------
# A long run's samples files hold millions of records: readers index them by step (byte ranges)
# and parse a step's records only when they are needed, so memory and start-up time do not grow
# with the run. The writer puts ``type`` and ``step`` first in every sample record and appends a
# logging step's records in one write, so each step is one contiguous block per file: the index
# finds where a block ends with one regular-expression search (C speed) instead of a parse per line.

_SAMPLE_HEAD = re.compile(rb'\{"type":"sample","step":(-?\d{1,19})[,}]')
_BLOCK_ENDS: dict[bytes, re.Pattern[bytes]] = {}
SCAN_CHUNK = 32 << 20  # more than MAX_RECORD_BYTES: a chunk without a newline holds no record


def _block_end(step: bytes) -> re.Pattern[bytes]:
    """The first line that does not start a sample record of ``step``."""
    pat = _BLOCK_ENDS.get(step)
    if pat is None:
        if len(_BLOCK_ENDS) > 4096:
            _BLOCK_ENDS.clear()
        pat = _BLOCK_ENDS[step] = re.compile(rb'\n(?!\{"type":"sample","step":' + step + rb'[,}])')
    return pat


class SampleIndex:
    """Where each step's sample records are in a run directory's sample files.

    ``scan`` reads what was appended since the last scan (complete lines only, unless ``final``:
    then a last line without its newline counts if it parses, as in ``read_run``); ``load(step)``
    parses that step's records from every rank's file, merged in global batch order as
    ``RunLog.samples_by_step`` does. A line that is not a sample record is left out and counted
    in ``skipped`` (found by the scan, or by ``load`` for a line that starts like a record and
    does not parse); a line beyond ``MAX_RECORD_BYTES`` is skipped without being read whole.
    Thread-safe: a dashboard thread scans while the screen loads.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> w = RunWriter(d); w.samples([{"step": s, "index": i} for s in (1, 2) for i in range(3)]); w.close()
    >>> idx = SampleIndex(d); _ = idx.scan(final=True)
    >>> idx.steps(), idx.count, [r["index"] for r in idx.load(2)]
    ([1, 2], 6, [0, 1, 2])
    """

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.run_dir = Path(run_dir)
        # step -> (file, start, end, lines, number of the first line)
        self.blocks: dict[int, list[tuple[Path, int, int, int, int]]] = {}
        self.count = 0
        self.warnings: list[str] = []
        self.skipped = Skipped()
        self.version = 0  # bumped when the index grows
        self._offsets: dict[Path, int] = {}
        self._lines: dict[Path, int] = {}
        self._discarding: dict[Path, str] = {}  # file -> why the line being read is left out
        self._lock = threading.Lock()

    def files(self) -> list[Path]:
        try:
            names = sorted(os.listdir(self.run_dir))
        except OSError:
            return []
        return [self.run_dir / n for n in names if _SAMPLES_RE.match(n)]

    def scan(self, final: bool = False, budget: int | None = None) -> bool:
        """Index new bytes of every samples file (at most ``budget`` bytes in all); True when
        unread bytes remain."""
        left = budget
        for path in self.files():
            try:
                size = os.stat(path).st_size
            except OSError:
                continue
            start = self._offsets.get(path, 0)
            if size < start:  # replaced or truncated: index it again from the start
                self.warnings.append(f"{path}: file shrank; indexing it again from the start")
                with self._lock:
                    for step, blocks in list(self.blocks.items()):
                        kept = [b for b in blocks if b[0] != path]
                        self.count -= sum(b[3] for b in blocks if b[0] == path)
                        if kept:
                            self.blocks[step] = kept
                        else:
                            del self.blocks[step]
                start = self._offsets[path] = 0
                self._lines[path] = 0
                self._discarding.pop(path, None)
            while start < size:
                if left is not None and left <= 0:
                    return True
                n = min(SCAN_CHUNK, size - start) if left is None else min(SCAN_CHUNK, size - start, max(left, 1 << 16))
                try:
                    with open(path, "rb") as fh:
                        if path in self._discarding:
                            stop = self._skip_line(path, fh, start, size, final)
                            data = b""
                        else:
                            fh.seek(start)
                            data = fh.read(n)
                            if b"\n" not in data and start + len(data) < size and n < SCAN_CHUNK:
                                fh.seek(start)  # a line longer than the budget's slice: take a whole chunk
                                data = fh.read(min(SCAN_CHUNK, size - start))
                except OSError as exc:
                    self.warnings.append(f"{path}: cannot read ({exc.strerror or exc})")
                    break
                if not data:  # a skipped line's bytes
                    if left is not None:
                        left -= stop - start
                    start = self._offsets[path] = stop
                    continue
                end = data.rfind(b"\n") + 1
                last = start + len(data) >= size
                if end == 0 and not last:
                    # A chunk without a newline is beyond any record: left out, never read whole.
                    self._lines[path] = self._lines.get(path, 0) + 1
                    self._discarding[path] = ("NUL bytes in the line" if b"\x00" in data
                                              else f"a line beyond the {MAX_RECORD_BYTES:,} bytes a record may have")
                    end = len(data)
                else:
                    if end:
                        self._index(path, data, start, end)
                    tail = data[end:]
                    if last and final and tail.strip():
                        if b"\x00" in tail:
                            self._lines[path] = self._lines.get(path, 0) + 1
                            self.warnings.append(f"{path}:{self._lines[path]}: skipped a half-written last line")
                        else:
                            self._index_torn(path, tail, start + end)
                        end = len(data)
                if end == 0:
                    break  # only a line still being written
                start += end
                self._offsets[path] = start
                if left is not None:
                    left -= end
                if last:
                    break
        return False

    def _skip_line(self, path: Path, fh: Any, start: int, size: int, final: bool) -> int:
        """Past the line being left out: after its newline, or the end of what is written."""
        pos = start
        while pos < size:
            pos = next_data(fh.fileno(), pos)
            if pos >= size:
                break
            fh.seek(pos)
            block = fh.read(min(READ_CHUNK, size - pos))
            if not block:
                break
            nl = block.find(b"\n")
            if nl >= 0:
                lineno = self._lines.get(path, 0)
                self.skipped.add(f"{path}:{lineno}: {self._discarding.pop(path)}", key=(path, lineno))
                return pos + nl + 1
            pos += len(block)
        if final:
            why = self._discarding.pop(path)
            self.warnings.append(f"{path}:{self._lines.get(path, 0)}: skipped a half-written last line ({why})")
        return max(pos, size)

    def _add(self, path: Path, step: int, start: int, end: int, lines: int, first: int) -> None:
        blocks = self.blocks.setdefault(step, [])
        if blocks and blocks[-1][0] == path and blocks[-1][2] == start:  # split by a chunk boundary
            p, s0, _, n, f = blocks[-1]
            blocks[-1] = (p, s0, end, n + lines, f)
        else:
            blocks.append((path, start, end, lines, first))
        self.count += lines

    def _index(self, path: Path, data: bytes, base: int, end: int) -> None:
        added = 0
        pos = 0
        lineno = self._lines.get(path, 0)
        with self._lock:
            while pos < end:
                m = _SAMPLE_HEAD.match(data, pos)
                if m is not None and plain_step(int(m.group(1))) is not None:
                    e = _block_end(m.group(1)).search(data, pos, end - 1)
                    stop = e.start() + 1 if e is not None else end
                    lines = data.count(b"\n", pos, stop)
                    self._add(path, int(m.group(1)), base + pos, base + stop, lines, lineno + 1)
                    lineno += lines
                    added += lines
                    pos = stop
                    continue
                stop = data.index(b"\n", pos) + 1
                lineno += 1
                line = data[pos:stop]
                if line.strip():  # a record written some other way: read its step the slow way
                    try:
                        rec = parse_line(line, f"{path}:{lineno}")
                    except RunLogError as exc:
                        self.skipped.add(str(exc), key=(path, lineno))
                    else:
                        if rec["type"] == "sample":
                            self._add(path, rec["step"], base + pos, base + stop, 1, lineno)
                            added += 1
                pos = stop
            self._lines[path] = lineno
            if added:
                self.version += 1

    def _index_torn(self, path: Path, tail: bytes, at: int) -> None:
        lineno = self._lines.get(path, 0) + 1
        try:
            rec = parse_line(tail, f"{path}:{lineno}")
        except RunLogError:
            self.warnings.append(f"{path}:{lineno}: skipped a half-written last line")
            return
        if rec["type"] == "sample":
            with self._lock:
                self._add(path, rec["step"], at, at + len(tail), 1, lineno)
                self.version += 1

    def steps(self) -> list[int]:
        with self._lock:
            return sorted(self.blocks)

    def count_of(self, step: int) -> int:
        with self._lock:
            return sum(b[3] for b in self.blocks.get(step, ()))

    def load(self, step: int) -> list[dict[str, Any]]:
        """The step's sample records from every rank, in global batch order."""
        with self._lock:
            blocks = list(self.blocks.get(step, ()))
        rows: list[dict[str, Any]] = []
        handles: dict[Path, Any] = {}
        try:
            for path, start, end, _, first in sorted(blocks, key=lambda b: (str(b[0].name), b[1])):
                fh = handles.get(path)
                if fh is None:
                    fh = handles[path] = open(path, "rb")
                fh.seek(start)
                rows.extend(_parse_block(fh.read(end - start), path, first, self.skipped))
        except OSError as exc:
            self.warnings.append(f"{path}: cannot read ({exc.strerror or exc})")
        finally:
            for fh in handles.values():
                fh.close()
        # (Every line of a block starts a sample record of this step: the scan found it so.)
        rows = [r for r in rows if r.get("step") == step]
        if len(blocks) == 1:
            index = [r.get("index") for r in rows]
            if set(map(type, index)) == {int} and all(a < b for a, b in zip(index, index[1:])):
                return rows  # one rank's block, already in batch order
        rows.sort(key=lambda s: (_int(s.get("rank")), batch_index(s)))
        if any(r.get("rank", 0) for r in rows):
            rows.sort(key=batch_index)
        return rows


_ORJSON_DEPTH = 1024  # the deepest document orjson parses
_WRAP_OPEN, _WRAP_CLOSE = b"[" * (_ORJSON_DEPTH - 1 - MAX_DEPTH), b"]" * (_ORJSON_DEPTH - 1 - MAX_DEPTH)


def _parse_block(data: bytes, path: Path, first: int, skipped: Skipped) -> list[dict[str, Any]]:
    body = data.rstrip(b"\n")
    if not body:
        return []
    try:  # one parse for the whole block: far cheaper than one per line
        # Wrapped in levels that leave a record exactly MAX_DEPTH of orjson's 1024, the parse
        # itself refuses a record nested deeper (as ``parse_line`` does), at no cost per byte.
        if fast_loads is None:
            raise ValueError("no orjson: line by line")
        wrapped = fast_loads(_WRAP_OPEN + b"[" + body.replace(b"\n", b",") + b"]" + _WRAP_CLOSE)
        records = wrapped
        for _ in range(len(_WRAP_OPEN)):
            records = records[0]
        if set(map(type, records)) != {dict}:
            raise ValueError("not all records")
    except (ValueError, UnicodeDecodeError, RecursionError):
        records = []
        for lineno, line in enumerate(body.split(b"\n"), first):
            if not line.strip():
                continue
            try:
                rec = parse_line(line, f"{path}:{lineno}")
            except RunLogError as exc:
                skipped.add(str(exc), key=(path, lineno))
                continue
            if rec["type"] == "sample":
                records.append(rec)
        return records
    if b'"nan"' in data or b'inf"' in data or data.count(b'"rewards":{') != len(records):
        for r in records:  # non-finite rewards written as strings, or rewards not a plain dict
            r["rewards"] = _decode_metrics(r.get("rewards"))
    return records


class StepSamples(Mapping[int, list[dict[str, Any]]]):
    """A run's samples by step, read from disk when a step is asked for (``streamed``: a reader
    that goes through every step should take each one once, in step order)."""

    streamed = True

    def __init__(self, index: SampleIndex) -> None:
        self.index = index
        self._cache: tuple[int, list[dict[str, Any]]] | None = None

    def __getitem__(self, step: int) -> list[dict[str, Any]]:
        if step not in self.index.blocks:
            raise KeyError(step)
        cached = self._cache
        if cached is not None and cached[0] == step:
            return cached[1]
        rows = self.index.load(step)
        self._cache = (step, rows)
        return rows

    def __iter__(self) -> Iterator[int]:
        return iter(self.index.steps())

    def __len__(self) -> int:
        return len(self.index.blocks)

    def __contains__(self, step: object) -> bool:
        return step in self.index.blocks


def steps_frame(steps: Iterable[tuple[int, Mapping[str, float | None]]]):
    """One row per logged step (index ``step``), one column per metric; a gap is NaN."""
    import pandas as pd

    steps = list(steps)
    frame = pd.DataFrame.from_records([dict(m) for _, m in steps], index=pd.Index([s for s, _ in steps], name="step"))
    return frame.astype("float64") if not frame.empty else frame


def load_run(path: str | os.PathLike[str]):
    """A run directory as a ``pandas.DataFrame``: one row per logged step, one column per metric."""
    log = read_run(path)
    return steps_frame((r["step"], r["metrics"]) for r in log.steps)
