"""A run directory's samples by step: where each step's records are in every rank's file, parsed only when
a step is asked for, so a long run's millions of sample records never sit in memory at once.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from grpo_monitor.core.jsonparse import fast_loads
from grpo_monitor.core.runlog import (
    MAX_DEPTH, MAX_RECORD_BYTES, READ_CHUNK, SAMPLES_RE, RunLogError, Skipped, batch_index, decode_metrics, next_data,
    parse_line, plain_step,
)

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
        return [self.run_dir / n for n in names if SAMPLES_RE.match(n)]

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
        rows.sort(key=lambda s: (_plain_int(s.get("rank")), batch_index(s)))
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
            r["rewards"] = decode_metrics(r.get("rewards"))
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




def _plain_int(value: Any) -> int:
    return value if type(value) is int else 0
