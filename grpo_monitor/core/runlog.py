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

The writer is ``core.runlog_writer``; a long run's samples are read a step at a time through
``core.sample_index``.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo_monitor.core.jsonparse import loads
from grpo_monitor.core.metrics import decode, encode

SCHEMA_VERSION = 1
RUN_FILE = "run.jsonl"
SAMPLES_GLOB = "samples.rank*.jsonl"
RECORD_TYPES = ("header", "step", "summary", "sample", "finding", "recommendation", "restart", "note")
SAMPLES_RE = re.compile(r"^samples\.rank(\d+)\.jsonl$")
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


def jsonable(obj: Any) -> Any:
    if isinstance(obj, float):
        return encode(obj)
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if obj is None or isinstance(obj, (str, int, bool)):
        return obj
    try:  # numpy scalars and the like
        return jsonable(obj.item())
    except Exception:
        return str(obj)


_encoder = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def dumps(record: Mapping[str, Any]) -> str:
    try:  # the common case: plain finite values, encoded in C
        return _encoder.encode(record)
    except (ValueError, TypeError):
        return _encoder.encode(jsonable(record))


def decode_metrics(metrics: Any) -> dict[str, float | None]:
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
        if kind == "step" and record["step"] < 0:  # no trainer counts below 0: read as a step it would lead the curve
            raise _NotARecord(f"step record with a negative 'step' ({record['step']})")
        if kind == "sample":
            record["rewards"] = decode_metrics(record.get("rewards"))
        else:
            record["metrics"] = decode_metrics(record.get("metrics"))
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
    for _, record in numbered_records(path, warnings, skipped):
        yield record


def numbered_records(path: Path, warnings: list[str] | None = None,
                     skipped: Skipped | None = None) -> Iterator[tuple[int, dict[str, Any]]]:
    """``iter_records`` with each record's line number."""
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
                    yield lineno, record
        tail = lines.tail()
        if tail is not None:
            lineno, line = tail
            try:
                if line is None:
                    raise RunLogError("unusable")
                if line.strip():
                    yield lineno, parse_line(line, f"{path}:{lineno}")
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


def batch_index(sample: dict[str, Any]) -> int:
    """A sample's position in the step's global generation batch (0 when it has none)."""
    return _int(sample.get("index"))


def _int(value: Any) -> int:
    return value if type(value) is int else 0


def no_header(run_file: str | os.PathLike[str], first: Mapping[str, Any] | None = None) -> str | None:
    """The one-line fault of a run log whose first record is not its header (``first``; None: it has no record
    at all), as every reader says it; None when the header is there.

    >>> no_header("run.jsonl", {"type": "step", "step": 1}), no_header("run.jsonl", {"type": "header"})
    ('run.jsonl: no header record (its first record is a step record)', None)
    """
    if first is not None and first.get("type") == "header":
        return None
    what = f" (its first record is a {first.get('type')} record)" if first is not None else ""
    return f"{run_file}: no header record{what}"


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
    first = None
    lines: dict[int, int] = {}  # id of a step record -> its line, to name the records of a step logged twice
    resumes: list[tuple[int, int]] = []  # (line, resumed_from_step) of each header that resumes the run
    for lineno, record in numbered_records(run_file, log.warnings, log.skipped):
        first = first or record
        kind = record["type"]
        if kind == "step":
            lines[id(record)] = lineno
        elif kind == "header" and log.header_count and type(record.get("resumed_from_step")) is int:
            resumes.append((lineno, record["resumed_from_step"]))
        log.add(record)
    if not log.header:
        raise RunLogError(str(no_header(run_file, first)))
    try:
        names = sorted(os.listdir(p)) if samples else []
    except OSError as exc:
        log.warnings.append(f"{p}: cannot list the samples files ({exc.strerror or exc})")
        names = []
    for name in names:
        if SAMPLES_RE.match(name):
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
    twice: list[tuple[int, int, int]] = []  # (step, line of the record dropped, line of the one kept)
    for rec in log.steps:
        old = dedup.get(rec["step"])
        if old is not None:
            twice.append((rec["step"], lines.get(id(old), 0), lines.get(id(rec), 0)))
        dedup[rec["step"]] = rec
    if twice:
        log.warnings.append(logged_twice_note(run_file, twice, resumes))
    log.steps = [dedup[s] for s in sorted(dedup)]
    return log


def logged_twice_note(run_file: Path, twice: list[tuple[int, int, int]], resumes: list[tuple[int, int]]) -> str:
    """One line naming the steps a run log holds more than one record of, and which record was kept: the later
    one, as a run resumed from a checkpoint logs the steps after the checkpoint again and its records are the
    ones the trainer went on from. Without a resume header between them the cause is unknown, and said so.

    >>> logged_twice_note(Path("run.jsonl"), [(31, 32, 45), (32, 33, 46)], [(44, 30)])
    'run.jsonl: steps 31-32 logged twice (lines 32-33 and 45-46; a resume from step 30 at line 44): the later records kept'
    """
    steps = sorted({s for s, _, _ in twice})
    ranges = _ranges(steps)
    shown = ", ".join(ranges[:5]) + (f" and {len(ranges) - 5} more range(s)" if len(ranges) > 5 else "")
    what = f"step {shown}" if len(steps) == 1 else f"steps {shown}"
    dropped = _ranges(sorted({a for _, a, _ in twice if a}))
    kept = _ranges(sorted({b for _, _, b in twice if b}))
    where = f"lines {', '.join(dropped[:3])} and {', '.join(kept[:3])}" if dropped and kept else ""
    first_dropped, last_kept = min(a for _, a, _ in twice), max(b for _, _, b in twice)
    resume = [(line, at) for line, at in resumes if first_dropped < line < last_kept]
    if resume:
        why = ", ".join(f"a resume from step {at} at line {line}" for line, at in resume[:3])
        tail = "the later records kept"
    else:
        why = "no resume header between them"
        tail = "the later records kept (the latest record of a step wins)"
    inside = "; ".join(x for x in (where, why) if x)
    return f"{run_file}: {what} logged {'twice' if len(twice) == len(steps) else 'more than once'} ({inside}): {tail}"


def _ranges(numbers: list[int]) -> list[str]:
    """Sorted distinct integers as ``a-b`` runs of consecutive ones."""
    out: list[str] = []
    start = prev = None
    for n in numbers:
        if prev is not None and n == prev + 1:
            prev = n
            continue
        if start is not None:
            out.append(f"{start}-{prev}" if prev != start else f"{start}")
        start = prev = n
    if start is not None:
        out.append(f"{start}-{prev}" if prev != start else f"{start}")
    return out


def steps_frame(steps: Iterable[tuple[int, Mapping[str, float | None]]]):
    """One row per logged step (index ``step``), one column per metric; a gap is NaN."""
    import pandas as pd

    steps = list(steps)
    frame = pd.DataFrame.from_records([dict(m) for _, m in steps], index=pd.Index([s for s, _ in steps], name="step"))
    return frame.astype("float64") if not frame.empty else frame


def run_frame(path: str | os.PathLike[str]):
    """A run directory as a ``pandas.DataFrame``: one row per logged step, one column per metric."""
    log = read_run(path)
    return steps_frame((r["step"], r["metrics"]) for r in log.steps)

