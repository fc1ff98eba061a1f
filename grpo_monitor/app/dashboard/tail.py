"""Following a run directory as it grows (no Textual here: the app drives it from a thread).

``RunTailer.poll()`` returns every record appended since the previous poll, across ``run.jsonl``
and every ``samples.rank<R>.jsonl``. Files are read by byte offset; a line without its newline
yet is held back until the rest arrives, so a writer caught mid-line never yields a broken
record. A directory that does not exist yet is waited for. A ``restart`` record naming a
``child_run`` makes the tailer follow that directory too (a new segment of the same lineage, a
sibling of the segment that stopped: ``core.restart.child_run_dir``). With ``find_run=True`` a folder
without a run log of its own (a Trainer output_dir watched before training starts) is searched for one,
and the run directory that appears in it is followed instead (``root``).
With ``index_samples=True`` (the dashboard) the sample files are not parsed but indexed by step
(``grpo_monitor.core.sample_index.SampleIndex``), a bounded number of bytes per poll, and a step's samples are
read when shown: the dashboard's memory and start-up time do not grow with the samples.

>>> import tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp()) / "run"
>>> t = RunTailer(d)
>>> t.poll().records
[]
>>> from grpo_monitor.core.runlog_writer import RunWriter
>>> w = RunWriter(d); _ = w.header(run_id="r", config={}); w.close()
>>> [r["type"] for r in t.poll().records]
['header']
"""

from __future__ import annotations

import math
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo_monitor.core.restart import child_run_dir
from grpo_monitor.core.runlog import RUN_FILE, LineSplitter, RunLogError, next_data, parse_line
from grpo_monitor.core.sample_index import SampleIndex

_SAMPLES_RE = re.compile(r"^samples\.rank(\d+)\.jsonl$")
# One poll reads at most this much of one file, so a huge finished run arrives in batches
# and the dashboard paints its first chart long before the last byte is parsed.
MAX_READ = 8 << 20
# Sample bytes indexed per poll: the index scan holds the interpreter, so it goes in slices the
# screen can interleave with (a 500 MB samples file is indexed in a second or two).
INDEX_BUDGET = 48 << 20
# How often a folder still without a run log is searched for a run directory appearing inside it.
FIND_EVERY = 1.0


class FileFollower:
    """One JSON-lines file read incrementally by byte offset. A line that is not a record is left
    out and counted (``skipped``), with a warning naming file and line; a line beyond any record's
    size (or holding NUL bytes) is never held in memory."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.lines = LineSplitter()
        self.skipped = 0

    @property
    def lineno(self) -> int:
        return self.lines.lineno

    def read(self, warnings: list[str], limit: int = MAX_READ) -> tuple[list[dict[str, Any]], bool]:
        """New complete records, and whether unread bytes remain past ``limit``."""
        try:
            size = os.stat(self.path).st_size
        except OSError:
            return [], False
        if size < self.offset:  # replaced or truncated: start over rather than read garbage
            warnings.append(f"{self.path}: file shrank; reading it again from the start")
            self.offset, self.lines = 0, LineSplitter()
        if size == self.offset:
            return [], False
        try:
            with open(self.path, "rb") as fh:
                if self.lines.discarding:  # inside a line left out: jump over holes, never read them
                    self.offset = min(size, next_data(fh.fileno(), self.offset))
                fh.seek(self.offset)
                data = fh.read(min(limit, size - self.offset))
        except OSError as exc:
            warnings.append(f"{self.path}: cannot read ({exc.strerror or exc})")
            return [], False
        self.offset += len(data)
        records = []
        for lineno, line, why in self.lines.feed(data):
            where = f"{self.path}:{lineno}"
            if line is None:
                self.skipped += 1
                warnings.append(f"{where}: {why}: skipped")
            elif line.strip():
                try:
                    records.append(parse_line(line, where))
                except RunLogError as exc:  # one bad line must not stop a live view
                    self.skipped += 1
                    warnings.append(f"{exc}: skipped")
        return records, self.offset < size


@dataclass
class TailBatch:
    """What one poll found."""

    records: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    waiting_for: str | None = None  # a directory or file that does not exist yet
    more: bool = False  # unread bytes remain: poll again at once
    sample_indexes: list[SampleIndex] = field(default_factory=list)
    samples_grew: bool = False
    skipped: int = 0  # lines left out as not records, in every file followed so far

    def __bool__(self) -> bool:
        return bool(self.records or self.warnings or self.samples_grew)


class RunTailer:
    """Every record appended to a run directory (and to the child runs it restarts into)."""

    def __init__(self, run_dir: str | os.PathLike[str], index_samples: bool = False, find_run: bool = False) -> None:
        p = Path(run_dir)
        if p.name == RUN_FILE:
            p = p.parent
        self.root = p
        # A Trainer output_dir given before the run starts: its run directory (``<output_dir>/grpo-monitor``,
        # where ``attach`` writes by default) appears inside it, and is what to follow.
        self.find_run = find_run
        self._looked = -math.inf
        self.dirs: list[Path] = [p]
        self._files: dict[Path, FileFollower] = {}
        self.index_samples = index_samples
        self.indexes: dict[Path, SampleIndex] = {}
        self._index_warned: dict[Path, tuple[int, int]] = {}  # warnings and skip messages passed on
        self._said: set[str] = set()
        self.skipped = 0

    def _follower(self, path: Path) -> FileFollower:
        f = self._files.get(path)
        if f is None:
            f = self._files[path] = FileFollower(path)
        return f

    def _say_once(self, batch: TailBatch, line: str) -> None:
        if line not in self._said:
            self._said.add(line)
            batch.warnings.append(line)

    def _find_run(self) -> None:
        """Follow the run directory found in the folder watched, once one holds a run log; only while
        nothing has been read, and at most every ``FIND_EVERY`` seconds (the search walks the folder)."""
        now = time.monotonic()
        if now - self._looked < FIND_EVERY:
            return
        self._looked = now
        root = self.root
        try:
            if not root.is_dir() or (root / RUN_FILE).is_file():
                return
        except OSError:
            return
        from grpo_monitor.app.dashboard import run_path

        found = run_path(root)
        if found != root:
            self.root, self.dirs = found, [found]

    def poll(self) -> TailBatch:
        batch = TailBatch()
        if self.find_run and not self._files and len(self.dirs) == 1:
            self._find_run()
        for d in list(self.dirs):  # the list grows while we read when a restart names a child
            run_file = d / RUN_FILE
            try:
                present = run_file.is_file()
                missing = str(run_file if d.is_dir() else d)
            except OSError as exc:  # a folder on the way that cannot be entered: wait, and say why
                present, missing = False, str(d)
                self._say_once(batch, f"{d}: cannot read ({exc.strerror or exc})")
            if not present:
                if batch.waiting_for is None:
                    batch.waiting_for = missing
                continue
            records, more = self._follower(run_file).read(batch.warnings)
            batch.more |= more
            for r in records:
                if r["type"] == "restart":
                    child = child_run_dir(d, r.get("child_run"))
                    if child is not None and child not in self.dirs:
                        self.dirs.append(child)
            batch.records.extend(records)
            if self.index_samples:
                idx = self.indexes.get(d)
                if idx is None:
                    # The first poll brings the run's records alone: the screen draws them while
                    # the samples are indexed by the polls that follow at once.
                    idx = self.indexes[d] = SampleIndex(d)
                    batch.more = True
                    continue
                before = idx.version
                batch.more |= idx.scan(budget=INDEX_BUDGET)
                batch.samples_grew |= idx.version != before
                continue
            try:
                names = sorted(os.listdir(d))
            except OSError:
                names = []
            for name in names:
                if _SAMPLES_RE.match(name):
                    recs, more = self._follower(d / name).read(batch.warnings)
                    batch.more |= more
                    batch.records.extend(r for r in recs if r["type"] == "sample")
        batch.sample_indexes = [self.indexes[d] for d in self.dirs if d in self.indexes]
        for d, idx in self.indexes.items():
            # The index finds bad lines as it scans, and as the screen loads a step's samples.
            seen_w, seen_s = self._index_warned.get(d, (0, 0))
            batch.warnings.extend(idx.warnings[seen_w:])
            batch.warnings.extend(f"{w}: skipped" for w in idx.skipped.where[seen_s:])
            self._index_warned[d] = (len(idx.warnings), len(idx.skipped.where))
        self.skipped = sum(f.skipped for f in self._files.values()) + sum(i.skipped.count for i in self.indexes.values())
        batch.skipped = self.skipped
        return batch
