"""Following a run directory as it grows (no Textual here: the app drives it from a thread).

``RunTailer.poll()`` returns every record appended since the previous poll, across ``run.jsonl``
and every ``samples.rank<R>.jsonl``. Files are read by byte offset; a line without its newline
yet is held back until the rest arrives, so a writer caught mid-line never yields a broken
record. A directory that does not exist yet is waited for. A ``restart`` record naming a
``child_run`` makes the tailer follow that directory too (a new segment of the same lineage).

>>> import tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp()) / "run"
>>> t = RunTailer(d)
>>> t.poll().records
[]
>>> from monitor.runlog import RunWriter
>>> w = RunWriter(d); _ = w.header(run_id="r", config={}); w.close()
>>> [r["type"] for r in t.poll().records]
['header']
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from monitor.runlog import RUN_FILE, RunLogError, parse_line

_SAMPLES_RE = re.compile(r"^samples\.rank(\d+)\.jsonl$")
# One poll reads at most this much of one file, so a huge finished run arrives in batches
# and the dashboard paints its first chart long before the last byte is parsed.
MAX_READ = 8 << 20


class FileFollower:
    """One JSON-lines file read incrementally by byte offset."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.lineno = 0
        self.partial = b""

    def read(self, warnings: list[str], limit: int = MAX_READ) -> tuple[list[dict[str, Any]], bool]:
        """New complete records, and whether unread bytes remain past ``limit``."""
        try:
            size = os.stat(self.path).st_size
        except OSError:
            return [], False
        if size < self.offset:  # replaced or truncated: start over rather than read garbage
            warnings.append(f"{self.path}: file shrank; reading it again from the start")
            self.offset, self.lineno, self.partial = 0, 0, b""
        if size == self.offset:
            return [], False
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read(min(limit, size - self.offset))
        except OSError as exc:
            warnings.append(f"{self.path}: cannot read ({exc.strerror or exc})")
            return [], False
        self.offset += len(data)
        data = self.partial + data
        lines = data.split(b"\n")
        self.partial = lines.pop()  # bytes after the last newline: a line still being written
        records = []
        for line in lines:
            self.lineno += 1
            if not line.strip():
                continue
            try:
                records.append(parse_line(line, f"{self.path}:{self.lineno}"))
            except RunLogError as exc:  # one bad line must not stop a live view
                warnings.append(str(exc))
        return records, self.offset < size


@dataclass
class TailBatch:
    """What one poll found."""

    records: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    waiting_for: str | None = None  # a directory or file that does not exist yet
    more: bool = False  # unread bytes remain: poll again at once

    def __bool__(self) -> bool:
        return bool(self.records or self.warnings)


class RunTailer:
    """Every record appended to a run directory (and to the child runs it restarts into)."""

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        p = Path(run_dir)
        if p.name == RUN_FILE:
            p = p.parent
        self.root = p
        self.dirs: list[Path] = [p]
        self._files: dict[Path, FileFollower] = {}

    def _follower(self, path: Path) -> FileFollower:
        f = self._files.get(path)
        if f is None:
            f = self._files[path] = FileFollower(path)
        return f

    def _child_dir(self, parent: Path, child: object) -> Path | None:
        if not isinstance(child, str) or not child:
            return None
        c = Path(child)
        return c if c.is_absolute() else parent / c

    def poll(self) -> TailBatch:
        batch = TailBatch()
        for d in list(self.dirs):  # the list grows while we read when a restart names a child
            run_file = d / RUN_FILE
            if not run_file.is_file():
                if batch.waiting_for is None:
                    batch.waiting_for = str(run_file if d.is_dir() else d)
                continue
            records, more = self._follower(run_file).read(batch.warnings)
            batch.more |= more
            for r in records:
                if r["type"] == "restart":
                    child = self._child_dir(d, r.get("child_run"))
                    if child is not None and child not in self.dirs:
                        self.dirs.append(child)
            batch.records.extend(records)
            try:
                names = sorted(os.listdir(d))
            except OSError:
                names = []
            for name in names:
                if _SAMPLES_RE.match(name):
                    recs, more = self._follower(d / name).read(batch.warnings)
                    batch.more |= more
                    batch.records.extend(r for r in recs if r["type"] == "sample")
        return batch
