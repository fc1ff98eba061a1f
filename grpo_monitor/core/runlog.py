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
"""

from __future__ import annotations

import json
import os
import re
import threading
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
_SAMPLES_RE = re.compile(r"^samples\.rank(\d+)\.jsonl$")


class RunLogError(ValueError):
    """An unusable run log; the message is one line naming the file (and line) and the fault."""


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
    """Line-atomic appends to one JSON-lines file."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        self._lock = threading.Lock()
        # A previous writer killed mid-line left a torn tail: that record was never complete, so it
        # is cut off, and the file stays a sequence of whole records that every reader accepts.
        self.truncated_bytes = _cut_torn_tail(self._fd)

    def append(self, records: Iterable[Mapping[str, Any]]) -> int:
        data = "".join(dumps(r) + "\n" for r in records).encode("utf-8")
        if not data:
            return 0
        with self._lock:
            view = memoryview(data)
            while view:
                n = os.write(self._fd, view)
                view = view[n:]
        return len(data)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RunWriter:
    """Writes one run directory. Rank 0 writes ``run.jsonl``; every rank writes its own samples."""

    def __init__(self, run_dir: str | os.PathLike[str], rank: int = 0) -> None:
        self.run_dir = Path(run_dir)
        self.rank = int(rank)
        self.is_main = self.rank == 0
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._run = JsonlWriter(self.run_dir / RUN_FILE) if self.is_main else None
        self._samples: JsonlWriter | None = None

    def write(self, *records: Mapping[str, Any]) -> None:
        if self._run is not None:
            self._run.append(records)

    def header(self, **fields: Any) -> dict[str, Any]:
        record = {"type": "header", "schema": SCHEMA_VERSION, **fields}
        self.write(record)
        return record

    def step(self, step: int, metrics: Mapping[str, float | None], time: float) -> None:
        self.write({"type": "step", "step": int(step), "time": time, "metrics": dict(metrics)})

    def samples(self, records: Iterable[Mapping[str, Any]]) -> None:
        if self._samples is None:
            self._samples = JsonlWriter(self.run_dir / samples_file(self.rank))
        self._samples.append({"type": "sample", **r} for r in records)

    def close(self) -> None:
        for w in (self._run, self._samples):
            if w is not None:
                w.close()


def _decode_metrics(metrics: Any) -> dict[str, float | None]:
    if not isinstance(metrics, Mapping):
        return {}
    if type(metrics) is dict and set(map(type, metrics.values())) <= _PLAIN:
        return metrics  # the common case, checked at C speed: a freshly parsed dict, nothing to decode
    return {str(k): decode(v) for k, v in metrics.items()}


_PLAIN = frozenset({float, type(None)})


def parse_line(line: bytes, where: str) -> dict[str, Any]:
    try:
        record = loads(line)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RunLogError(f"{where}: corrupt record ({exc.__class__.__name__}: {str(exc)[:80]})") from None
    if not isinstance(record, dict) or record.get("type") not in RECORD_TYPES:
        raise RunLogError(f"{where}: not a run-log record (no known 'type' field)")
    if record["type"] in ("step", "summary"):
        try:
            record["step"] = int(record["step"])
        except (KeyError, TypeError, ValueError):
            raise RunLogError(f"{where}: {record['type']} record without an integer 'step'") from None
        record["metrics"] = _decode_metrics(record.get("metrics"))
    elif record["type"] == "sample":
        record["rewards"] = _decode_metrics(record.get("rewards"))
    return record


def iter_records(path: Path, warnings: list[str] | None = None) -> Iterator[dict[str, Any]]:
    """Every record of one JSON-lines file. A torn last line (no newline) is skipped and reported
    in ``warnings``; any other corrupt line raises ``RunLogError`` naming file and line."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise RunLogError(f"{path}: cannot read ({exc.strerror or exc})") from None
    lines = data.split(b"\n")
    torn = lines.pop()  # b"" when the file ends with a newline
    for lineno, line in enumerate(lines, 1):
        if line.strip():
            yield parse_line(line, f"{path}:{lineno}")
    if torn.strip():
        try:
            yield parse_line(torn, f"{path}:{len(lines) + 1}")
        except RunLogError:
            if warnings is not None:
                warnings.append(f"{path}:{len(lines) + 1}: skipped a half-written last line")


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

    def add(self, record: dict[str, Any]) -> None:
        kind = record["type"]
        if kind == "header":
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
    i = sample.get("index")
    return i if type(i) is int else 0


def is_run_dir(path: str | os.PathLike[str]) -> bool:
    return (Path(path) / RUN_FILE).is_file()


def read_run(path: str | os.PathLike[str], samples: bool = True) -> RunLog:
    """Read a run directory (or its ``run.jsonl``) with every rank's samples merged
    (``samples=False``: without them; ``SampleIndex`` reads them a step at a time)."""
    p = Path(path)
    if p.is_file() and p.name == RUN_FILE:
        p = p.parent
    if not p.exists():
        raise RunLogError(f"{p}: no such file or directory")
    run_file = p / RUN_FILE
    if not run_file.is_file():
        raise RunLogError(f"{p}: not a grpo-monitor run directory (no {RUN_FILE})")
    log = RunLog(path=p)
    for record in iter_records(run_file, log.warnings):
        log.add(record)
    if not log.header:
        raise RunLogError(f"{run_file}: no header record")
    for sample_file in sorted(p.iterdir()) if samples else ():
        if _SAMPLES_RE.match(sample_file.name):
            for record in iter_records(sample_file, log.warnings):
                if record["type"] == "sample":
                    log.samples.append(record)
    log.samples.sort(key=lambda s: (s.get("step", 0), s.get("rank", 0), s.get("index", 0)))
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

_SAMPLE_HEAD = re.compile(rb'\{"type":"sample","step":(-?\d+)[,}]')
_BLOCK_ENDS: dict[bytes, re.Pattern[bytes]] = {}
SCAN_CHUNK = 32 << 20


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
    ``RunLog.samples_by_step`` does. Thread-safe: a dashboard thread scans while the screen loads.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> w = RunWriter(d); w.samples([{"step": s, "index": i} for s in (1, 2) for i in range(3)]); w.close()
    >>> idx = SampleIndex(d); _ = idx.scan(final=True)
    >>> idx.steps(), idx.count, [r["index"] for r in idx.load(2)]
    ([1, 2], 6, [0, 1, 2])
    """

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.run_dir = Path(run_dir)
        self.blocks: dict[int, list[tuple[Path, int, int, int]]] = {}  # step -> (file, start, end, lines)
        self.count = 0
        self.warnings: list[str] = []
        self.version = 0  # bumped when the index grows
        self._offsets: dict[Path, int] = {}
        self._lines: dict[Path, int] = {}
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
            while start < size:
                if left is not None and left <= 0:
                    return True
                n = min(SCAN_CHUNK, size - start) if left is None else min(SCAN_CHUNK, size - start, max(left, 1 << 16))
                try:
                    with open(path, "rb") as fh:
                        fh.seek(start)
                        data = fh.read(n)
                except OSError as exc:
                    self.warnings.append(f"{path}: cannot read ({exc.strerror or exc})")
                    break
                end = data.rfind(b"\n") + 1
                last = start + len(data) >= size
                if end == 0 and not last:  # one line longer than the chunk: read it whole
                    with open(path, "rb") as fh:
                        fh.seek(start)
                        data = fh.read(size - start)
                    end = data.rfind(b"\n") + 1
                    last = True
                if end:
                    self._index(path, data, start, end)
                tail = data[end:]
                if last and final and tail.strip():
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

    def _add(self, path: Path, step: int, start: int, end: int, lines: int) -> None:
        blocks = self.blocks.setdefault(step, [])
        if blocks and blocks[-1][0] == path and blocks[-1][2] == start:  # split by a chunk boundary
            p, s0, _, n = blocks[-1]
            blocks[-1] = (p, s0, end, n + lines)
        else:
            blocks.append((path, start, end, lines))
        self.count += lines

    def _index(self, path: Path, data: bytes, base: int, end: int) -> None:
        added = 0
        pos = 0
        lineno = self._lines.get(path, 0)
        with self._lock:
            while pos < end:
                m = _SAMPLE_HEAD.match(data, pos)
                if m is not None:
                    e = _block_end(m.group(1)).search(data, pos, end - 1)
                    stop = e.start() + 1 if e is not None else end
                    lines = data.count(b"\n", pos, stop)
                    self._add(path, int(m.group(1)), base + pos, base + stop, lines)
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
                        self.warnings.append(str(exc))
                    else:
                        step = rec.get("step")
                        if rec["type"] == "sample" and type(step) is int:
                            self._add(path, step, base + pos, base + stop, 1)
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
        step = rec.get("step")
        if rec["type"] == "sample" and type(step) is int:
            with self._lock:
                self._add(path, step, at, at + len(tail), 1)
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
            for path, start, end, _ in sorted(blocks, key=lambda b: (str(b[0].name), b[1])):
                fh = handles.get(path)
                if fh is None:
                    fh = handles[path] = open(path, "rb")
                fh.seek(start)
                rows.extend(_parse_block(fh.read(end - start), path, self.warnings))
        except OSError as exc:
            self.warnings.append(f"{path}: cannot read ({exc.strerror or exc})")
        finally:
            for fh in handles.values():
                fh.close()
        # (Every line of a block starts a sample record of this step: the scan found it so.)
        if len(blocks) == 1:
            index = [r.get("index") for r in rows]
            if set(map(type, index)) == {int} and all(a < b for a, b in zip(index, index[1:])):
                return rows  # one rank's block, already in batch order
        try:
            rows.sort(key=lambda s: (s.get("rank", 0), s.get("index", 0)))
        except TypeError:
            pass
        if any(r.get("rank", 0) for r in rows):
            rows.sort(key=batch_index)
        return rows


def _parse_block(data: bytes, path: Path, warnings: list[str]) -> list[dict[str, Any]]:
    body = data.rstrip(b"\n")
    if not body:
        return []
    try:  # one parse for the whole block: far cheaper than one per line
        records = loads(b"[" + body.replace(b"\n", b",") + b"]")
        if set(map(type, records)) != {dict}:
            raise ValueError("not all records")
    except (ValueError, UnicodeDecodeError):
        records = []
        for line in body.split(b"\n"):
            if not line.strip():
                continue
            try:
                rec = parse_line(line, str(path))
            except RunLogError as exc:
                warnings.append(str(exc))
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
