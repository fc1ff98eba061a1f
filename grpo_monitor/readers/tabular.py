"""Metric exports: CSV (W&B history, any table with a step column) and JSON lines (verl, ...)."""

from __future__ import annotations

import csv
import io
import json
from itertools import accumulate
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from grpo_monitor.core.jsonparse import loads
from grpo_monitor.core.metrics import SUMMARY_KEYS, normalize
from grpo_monitor.core.runlog import Skipped
from grpo_monitor.readers._base import (
    COUNTER_NAME,
    STEP_FIELDS,
    Normalizer,
    Probe,
    Reader,
    Source,
    SourceError,
    StepTable,
    decode_head,
    finish,
    guess_context,
    loads_lenient,
    note_skipped,
    plan_names,
    refuse_if_mostly_skipped,
    step_fault,
    step_rank,
    usable_step,
)

NESTED_FIELDS = ("data", "metrics")
PANDAS_FROM_CHARS = 4_000_000


# --------------------------------------------------------------------------------------- JSONL


def _lines(path: Path) -> tuple[list[bytes], bytes]:
    data = path.read_bytes()
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    lines = data.split(b"\n")
    return lines, lines.pop()  # the torn tail is b"" when the file ends with a newline


def read_jsonl(path: Path) -> Source:
    """One JSON object per line, each with a step field at the top level or inside ``data``/``metrics``.

    A half-written last line is skipped with a warning; any other bad line (not JSON, not an object, a step
    that is no step) costs that line alone: it is skipped and named (``Skipped``), the rest is read.
    """
    lines, torn = _lines(path)
    src = Source(path=path, format="jsonl")
    skipped = Skipped()
    records = _parse_all(path, lines, skipped)
    if torn.strip():
        try:
            records.append((len(lines) + 1, loads_lenient(torn)))
        except (ValueError, RecursionError):
            src.warnings.append(f"{path}:{len(lines) + 1}: skipped a half-written last line")
    table = StepTable()
    norm = Normalizer(drop=SUMMARY_KEYS)
    no_step = 0
    held_out = 0
    shapes: dict[tuple[Any, ...], str | None] = {}
    for lineno, rec in records:
        if not isinstance(rec, dict):
            skipped.add(f"{path}:{lineno}: a JSON {_json_kind(rec)}, not an object")
            continue
        keys = tuple(rec)
        nested = shapes.get(keys, False)
        if nested is False:
            nested = shapes[keys] = _only_nested(keys)
        if nested is not None and type(inner := rec[nested]) is dict:
            # ``{"step": 7, "data": {...}}``: the flattened record would only add step fields,
            # which normalising drops, so the metrics are the nested dict's; no flat copy needed.
            key, value = _step_field(rec, inner)
            metrics_of = inner
        else:
            metrics_of = _flatten(rec)
            key, value = _step_field(metrics_of)
        if key is None:
            no_step += 1
            continue
        step = usable_step(value)
        if step is None:
            skipped.add(f"{path}:{lineno}: '{key}' is no step ({step_fault(value)})")
            continue
        if held_out_record(rec):
            metrics_of = _as_held_out(metrics_of)
            held_out += 1
        elif key not in STEP_FIELDS:
            metrics_of = {k: v for k, v in metrics_of.items() if k != key}
        table.add(step, norm(metrics_of))
    refuse_if_mostly_skipped(path, skipped, len(table), "lines")
    if not len(table):
        raise SourceError(path, f"no line has a step field ({', '.join(STEP_FIELDS)})")
    note_skipped(src, skipped)
    if no_step:
        src.warnings.append(f"{path}: skipped {no_step} line(s) without a step field")
    if held_out:
        src.warnings.append(f"{path}: {held_out} evaluation record(s) (their type says so) read as held-out metrics")
    finish(src, table, "lines")
    if spelled := norm.spellings():
        src.meta["spellings"] = spelled
    src.context = guess_context(src.metric_names(), None, [s for s, _ in src.steps])
    return src


def _parse_all(path: Path, lines: list[bytes], skipped: Skipped) -> list[tuple[int, Any]]:
    out = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append((i, loads(line)))
        except (ValueError, RecursionError) as exc:
            if type(exc) is ValueError:  # an integer of thousands of digits, not broken JSON: the step decides
                try:
                    out.append((i, loads_lenient(line)))
                    continue
                except (ValueError, RecursionError):
                    pass
            msg = exc.msg if isinstance(exc, json.JSONDecodeError) else exc.__class__.__name__
            skipped.add(f"{path}:{i}: corrupt JSON line ({msg})")
    return out


def _json_kind(value: Any) -> str:
    return {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(value), "number")


def _only_nested(keys: tuple[Any, ...]) -> str | None:
    """The nested field of a record shaped ``{step fields..., "data": {...}}``, else None."""
    nested = [k for k in keys if k in NESTED_FIELDS]
    if len(nested) != 1:
        return None
    others = [k for k in keys if k != nested[0]]
    return nested[0] if all(isinstance(k, str) and normalize(k) == "step" for k in others) else None


def _flatten(rec: dict[str, Any]) -> dict[str, Any]:
    nested = [rec[k] for k in NESTED_FIELDS if isinstance(rec.get(k), dict)]
    if not nested:
        return rec
    flat = {k: v for k, v in rec.items() if k not in NESTED_FIELDS}
    for inner in nested:
        flat.update(inner)
    return flat


def _step_field(rec: dict[str, Any], inner: dict[str, Any] | None = None) -> tuple[str | None, Any]:
    """The best step field with a value and that value; ``inner`` (a nested dict) wins over
    ``rec`` for a field both hold, as it does when the record is flattened. A trainer's own counter
    (``grpo_step``) counts where none of the usual fields is there."""
    for key in STEP_FIELDS:
        v = inner[key] if inner is not None and key in inner else rec.get(key)
        if v is not None:
            return key, v
    for d in (inner, rec):
        for key, v in (d or {}).items():
            if v is not None and isinstance(key, str) and COUNTER_NAME.match(key.lower()):
                return key, v
    return None, None


# A record's kind, where a trainer writes rollouts and evaluations to one file: ``{"type": "eval", ...}``.
_KIND_FIELDS = ("type", "split", "phase", "mode", "kind")
_EVAL_KINDS = frozenset({"eval", "evaluation", "val", "valid", "validation", "test", "heldout", "held_out"})


def held_out_record(rec: Mapping[str, Any]) -> bool:
    """A record a trainer marks as an evaluation (``"type": "eval"``, ``"split": "validation"``)."""
    for key in _KIND_FIELDS:
        v = rec.get(key)
        if isinstance(v, str):
            return v.strip().lower() in _EVAL_KINDS
    return False


def _as_held_out(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """An evaluation record's metrics under held-out names (``accuracy`` -> ``eval_accuracy``), step fields and
    the record's kind left out; names already held-out stay."""
    out: dict[str, Any] = {}
    for k, v in metrics.items():
        if not isinstance(k, str) or k in _KIND_FIELDS or step_rank(k) is not None:
            continue
        low = k.lower()
        out[k if low.startswith(("eval", "val", "test")) else f"eval_{k}"] = v
    return out


def _short(value: Any) -> str:
    text = repr(value) if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


# ----------------------------------------------------------------------------------------- CSV


def _header(text: str) -> tuple[list[str], str] | None:
    first = text.split("\n", 1)[0].rstrip("\r")
    for delim in (",", "\t", ";"):
        if delim in first:
            try:
                return next(csv.reader([first], delimiter=delim)), delim
            except (csv.Error, StopIteration):
                return None
    return None


def looks_like_csv(head: bytes) -> bool:
    """Text whose first line splits into several columns."""
    text = decode_head(head)
    return text is not None and _header(text) is not None


def read_csv(path: Path) -> Source:
    """A metric table: one row per logged step, a step column, empty cells for unmeasured metrics.

    W&B exports are understood: ``_``-prefixed bookkeeping columns are dropped, and a panel
    export's ``<run> - <metric>`` columns lose the run prefix and their ``__MIN``/``__MAX`` twins.
    A bad row (a step cell that is no step, a stray byte that is not UTF-8, a quote that never
    closes) costs that row alone: it is skipped and named (``Skipped``), the rest is read.
    """
    data = path.read_bytes()
    try:
        text = data.decode("utf-8-sig")
        clean = True
    except UnicodeDecodeError:  # the rows holding the bad bytes are bad records; the others read
        text = data.decode("utf-8-sig", "replace")
        clean = False
    del data
    found = _header(text)
    if found is None:
        raise SourceError(path, "no CSV header line")
    header, delim = found
    src = Source(path=path, format="csv")
    step_col, columns = _csv_columns(path, header, src.warnings)
    skipped = Skipped()
    # pandas takes most of a second to import: worth it only for a long export.
    fast = (_read_regular(text, delim, len(header), step_col, columns)
            if clean and len(text) >= PANDAS_FROM_CHARS else None)
    if fast is not None:
        steps, names, values, present = fast
        ragged = empty = 0
    else:
        steps, names, values, present, ragged, empty = _read_cells(path, text, delim, len(header), step_col, columns,
                                                                   skipped, clean)
    del text
    table = StepTable()
    matrix = values.tolist()
    full = present.all(axis=1).tolist() if len(names) else [True] * len(steps)
    for k, step in enumerate(steps):
        if step is None:
            continue
        if full[k]:
            table.add(step, dict(zip(names, matrix[k])))
        else:
            r = matrix[k]
            table.add(step, {names[j]: r[j] for j in np.flatnonzero(present[k]).tolist()})
    refuse_if_mostly_skipped(path, skipped, len(table), "rows")
    if not len(table):
        raise SourceError(path, "no row with a step value")
    note_skipped(src, skipped)
    if empty:
        src.warnings.append(f"{path}: skipped {empty} row(s) with an empty step cell")
    if ragged:
        src.warnings.append(f"{path}: {ragged} row(s) do not have as many cells as the header")
    finish(src, table, "rows")
    src.context = guess_context(src.metric_names(), None, [s for s, _ in src.steps])
    return src


def _read_cells(
    path: Path, text: str, delim: str, width: int, step_col: int, columns: list[tuple[int, str]],
    skipped: Skipped, clean: bool = True,
) -> tuple[list[int | None], list[str], np.ndarray, np.ndarray, int, int]:
    """Any table, cell by cell with the ``csv`` module: ragged rows, quoted cells, empty step
    cells; a bad row is left out and named in ``skipped``."""
    rows, lines = _csv_rows(path, text, delim, width, step_col, skipped)
    ragged = 0
    kept_rows: list[list[str]] = []
    steps: list[int | None] = []
    empty = 0
    for row, lineno in zip(rows, lines):
        if not clean and any("\ufffd" in c for c in row):
            skipped.add(f"{path}:{lineno}: not UTF-8 text (a bad byte in the row)")
            continue
        if len(row) <= step_col:
            skipped.add(f"{path}:{lineno}: {len(row)} cell(s) where the header has {width}, no step cell")
            continue
        cell = row[step_col].strip()
        if not cell:
            skipped.add(f"{path}:{lineno}: empty step cell")
            continue
        step = usable_step(cell)
        if step is None:
            skipped.add(f"{path}:{lineno}: step cell {_short(cell)} is no step ({step_fault(cell)})")
            continue
        if len(row) != width:  # a torn last row, or a writer that changed its columns: missing cells are gaps
            ragged += 1
            if len(row) < width:
                row = row + [""] * (width - len(row))
        kept_rows.append(row)
        steps.append(step)
    names, values, present = _numeric_columns(kept_rows, columns)
    return steps, names, values, present, ragged, empty


def _csv_rows(path: Path, text: str, delim: str, width: int, step_col: int,
              skipped: Skipped) -> tuple[list[list[str]], list[int]]:
    """The rows after the header and the line each starts on. A quote that never closes would swallow the
    rest of the file into one cell (a stray one, the next stray quote's rows in between): its row is skipped,
    saying where it began and how many lines it took, and reading starts again on the line after it."""
    rows: list[list[str]] = []
    lines: list[int] = []
    offsets: list[int] | None = None  # where each physical line starts, worked out at the first broken quote
    base = 0  # physical lines before the current reader's text
    stream = io.StringIO(text, newline="")
    reader = csv.reader(stream, delimiter=delim)
    at = 0  # lines the current reader has consumed
    try:
        next(reader)
        at = reader.line_num
    except (csv.Error, StopIteration):
        return rows, lines
    while True:
        broken: str | None = None
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:  # a field beyond the csv module's limit: a quote that ran on
            row = None
            broken = f"malformed CSV ({one_line_exc(exc)})"
        first, last = base + at + 1, base + reader.line_num
        at = reader.line_num
        if row is not None and not row:
            continue
        if row is not None and (last > first or (row and row[-1][-1:] in ("\n", "\r"))):
            if offsets is None:
                offsets = [0, *accumulate(len(ln) for ln in io.StringIO(text, newline=""))]
            broken = _broken_quote(row, text[offsets[first - 1]:offsets[min(last, len(offsets) - 1)]],
                                   last >= len(offsets) - 1, delim, width, step_col)
        if broken is None:
            rows.append(row)  # type: ignore[arg-type]
            lines.append(first)
            continue
        took = last - first
        skipped.add(f"{path}:{first}: {broken}" + (f"; it took {took} more line(s), to line {last}, which are read "
                                                   "again as rows" if took else ""))
        if offsets is None:
            offsets = [0, *accumulate(len(ln) for ln in io.StringIO(text, newline=""))]
        if first >= len(offsets) - 1:
            break
        base, at = first, 0
        stream.seek(offsets[first])  # a StringIO's positions are character offsets: no copy of the rest
        reader = csv.reader(stream, delimiter=delim)
    return rows, lines


def _broken_quote(row: list[str], physical: str, at_end: bool, delim: str, width: int, step_col: int) -> str | None:
    """Why a row read over several lines (or holding a line break) is a quote gone wrong, else None (a quoted
    cell with line breaks in it, which CSV allows)."""
    if at_end and physical.count('"') % 2:
        return "a quote opened in this row never closes"
    if len(row) != width:
        return f"a quoted cell runs over several lines and leaves the row {len(row)} cell(s) wide, not {width}"
    for cell in row:
        inner = cell.replace("\r\n", "\n").replace("\r", "\n").split("\n")[1:-1]
        for line in inner:
            cells = next(csv.reader([line], delimiter=delim), [])
            if len(cells) == width and usable_step(cells[step_col].strip()) is not None:
                return "a quote in this row swallows the rows after it"
    return None


def _numeric_columns(rows: list[list[str]], columns: list[tuple[int, str]]) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Metric names and, per row and column, the value and whether the cell held a number.

    A column is parsed in one C-level conversion when every cell is a number; one with empty
    cells (an eval metric, a metric logged every few steps) or words goes cell by cell.
    """
    names, positions = _metric_columns(columns)
    values = np.full((len(rows), len(names)), np.nan)
    present = np.ones((len(rows), len(names)), dtype=bool)
    by_column = list(zip(*rows)) if rows else []
    for j, i in enumerate(positions):
        col = by_column[i] if rows else ()
        try:
            values[:, j] = np.fromiter(map(float, col), dtype=np.float64, count=len(col))
            continue
        except ValueError:
            pass
        _cells_into(col, values[:, j], present[:, j])
    return names, values, present


def _metric_columns(columns: list[tuple[int, str]]) -> tuple[list[str], list[int]]:
    """The metric names kept, and the column each is read from."""
    keep = plan_names((name for _, name in columns), SUMMARY_KEYS)
    index = {name: i for i, name in columns}  # a repeated header name: its last column, as in a dict
    return [name for _, name in keep], [index[key] for key, _ in keep]


def _cells_into(col: Any, values: np.ndarray, present: np.ndarray) -> None:
    for k, cell in enumerate(col):
        x = _cell(cell) if cell else _DROP
        if x is _DROP:
            present[k] = False
        else:
            values[k] = x


def _read_regular(
    text: str, delim: str, width: int, step_col: int, columns: list[tuple[int, str]]
) -> tuple[list[int], list[str], np.ndarray, np.ndarray] | None:
    """The common export, parsed by pandas' C reader: no quoting, every row as wide as the header,
    an integer in every step cell. ``None`` for anything else, which ``_read_cells`` then reads
    cell by cell (and reports with line numbers). Both give the same table where both apply.
    """
    if '"' in text:
        return None
    import pandas as pd

    # pandas 2's default float parser can be one ulp off; 3 reads floats exactly by default.
    exact = {"float_precision": "round_trip"} if int(pd.__version__.split(".")[0]) < 3 else {}
    try:
        frame = pd.read_csv(io.StringIO(text), sep=delim, header=None, skiprows=1, na_filter=False,
                            low_memory=False, engine="c", **exact)
    except Exception:  # ragged rows, odd bytes: the careful reader decides
        return None
    # Every delimiter a separator (no quoting) and every row as wide as the header: a short row
    # would be padded with NaN, where it means "not measured".
    if frame.shape[1] != width or text.count(delim) != (width - 1) * (len(frame) + 1):
        return None
    step_cells = frame.iloc[:, step_col]
    if step_cells.dtype.kind != "i" or len(frame) == 0:  # int64: every step in range (uint64 ones may not be)
        return None
    if (step_cells < 0).any():  # a bad record: the careful reader names its line
        return None
    names, positions = _metric_columns(columns)
    values = np.full((len(frame), len(names)), np.nan)
    present = np.ones((len(frame), len(names)), dtype=bool)
    for j, i in enumerate(positions):
        col = frame.iloc[:, i]
        kind = col.dtype.kind
        if kind in "fiu":
            values[:, j] = col.to_numpy(dtype=np.float64)
        elif kind == "b":  # True/False words: no measurement
            present[:, j] = False
        else:
            _cells_into(col.tolist(), values[:, j], present[:, j])
    return step_cells.tolist(), names, values, present


_DROP = object()


def _cell(text: str) -> Any:
    """A cell's number; words (``true``, ``null``) are no measurement."""
    try:
        return float(text)
    except ValueError:
        return _DROP


def one_line_exc(exc: BaseException) -> str:
    return str(exc).replace("\n", " ")[:120]


def _csv_columns(path: Path, header: list[str], warnings: list[str]) -> tuple[int, list[tuple[int, str]]]:
    names = [h.strip() for h in header]
    # W&B panel export: "Step", "<run> - <metric>", "<run> - <metric>__MIN", "<run> - <metric>__MAX"
    keep = [i for i, n in enumerate(names) if not (n.endswith("__MIN") or n.endswith("__MAX"))]
    kept = set(keep)  # a 100k-column export tests membership once per column: a list would make it quadratic
    prefixes = {names[i].split(" - ", 1)[0] for i in keep if " - " in names[i]}
    if len(prefixes) == 1 and all(" - " in names[i] or _is_step(names[i]) for i in keep):
        names = [n.split(" - ", 1)[1] if " - " in n else n for n in names]
    elif len(prefixes) > 1:
        warnings.append(f"{path}: columns of {len(prefixes)} runs; metric names keep their run prefix")
    step_cols = [(i, n) for i, n in enumerate(names) if _is_step(n)]
    if not step_cols:
        shown = ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")
        raise SourceError(path, "CSV without a step column (step, global_step, iteration, iter, update, _step, ...); "
                                f"columns: {shown}")
    step_col = min(step_cols, key=lambda c: step_rank(c[1]))[0]
    skip = {i for i, _ in step_cols}
    columns = [
        (i, n)
        for i, n in enumerate(names)
        if i in kept and i not in skip and n and not n.startswith("_") and not n.startswith("Unnamed: ")
    ]
    return step_col, columns


def _is_step(name: str) -> bool:
    return step_rank(name) is not None


def csv_has_step(head: bytes) -> bool:
    """The header line of ``head`` names a step-like column (a W&B panel's ``<run> - <name>`` too)."""
    found = _header(decode_head(head) or "")
    return found is not None and any(_is_step(h.strip().split(" - ", 1)[-1]) for h in found[0])


# --------------------------------------------------------------------------------- readers


class JsonlReader(Reader):
    name = "jsonl"
    formats = ("jsonl",)
    describes = "JSONL"

    def sniff(self, probe: Probe) -> str | None:
        return "jsonl" if probe.layout == "lines" else None

    def read(self, probe: Probe, fmt: str) -> Source:
        return read_jsonl(probe.path)


class CsvReader(Reader):
    name = "csv"
    formats = ("csv",)
    describes = "CSV with a step column"

    def sniff(self, probe: Probe) -> str | None:
        return "csv" if self._csv_like(probe) and csv_has_step(probe.head) else None

    def read(self, probe: Probe, fmt: str) -> Source:
        return read_csv(probe.path)

    def near_miss(self, probe: Probe) -> str | None:
        if not self._csv_like(probe):
            return None
        try:
            read_csv(probe.path)
        except SourceError as exc:  # what the CSV lacks: the columns it found and the step it needs
            return exc.what
        return None

    @staticmethod
    def _csv_like(probe: Probe) -> bool:
        return probe.layout == "text" and probe.start[:1] not in (b"[", b"{") and looks_like_csv(probe.head)

