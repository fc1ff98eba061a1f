"""The run directory's writer: line-atomic appends, the torn tail cut before the next append, and what a failed
write cost, counted and said in the log (``write_failed`` notes) as soon as it can be written again; ``write_losses``
reads those notes back. The layout and the record types are ``core.runlog``'s.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_monitor.core.runlog import RUN_FILE, SCHEMA_VERSION, dumps, plain_step, samples_file

logger = logging.getLogger("grpo_monitor")


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


