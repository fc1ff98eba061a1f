"""Tables of numbers found anywhere in a log: HTML ``<table>``s, pipe/markdown tables and
whitespace-aligned columns, each read as one row per step when a column is named like a step
(``Step``, ``step``, ``global_step``, ``iteration``, ``iter``, ``update``, ``_step``).

That is how the transformers notebook progress table reaches a saved notebook or an HTML export,
how ``tabulate``/``rich``/markdown reports print a training loop, and how ``print(df)`` prints a
pandas frame. A text holding several tables (a cell run again, a display updated while training, an
SFT phase before the GRPO one) gives the longest training run's table (see ``choose``), and the
source's ``meta["table"]`` and a warning say which. ``read_printed`` reads a notebook's or a kernel
log's printed text: its console log (``readers/console.py``) or its best table, whichever holds more.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from html import unescape
from html.parser import HTMLParser
from pathlib import Path

from grpo_monitor.core.metrics import SUMMARY_KEYS, normalize
from grpo_monitor.core.runlog import Skipped
from grpo_monitor.detectors.numbers import to_number
from grpo_monitor.readers._base import (
    Normalizer,
    Probe,
    Reader,
    Source,
    SourceError,
    StepTable,
    as_step,
    finish,
    guess_context,
    note_skipped,
    step_column,
    step_fault,
    usable_step,
)

STEP_NAMES = "step, global_step, iteration, iter, update, _step"
# Cells that stand for "no value" in printed tables (transformers writes "No log" before the first loss).
_GAPS = frozenset({"", "-", "—", "–", "no log", "none", "null", "n/a", "na"})


@dataclass
class Table:
    """A table as printed: its header, its rows of cell texts, what and where it is."""

    header: list[str]
    rows: list[list[str]]
    kind: str  # "HTML table", "markdown table", "aligned columns"
    where: str
    order: int = 0  # position among the tables of one document
    lines: list[int] | None = None  # the line each row is on, where the table is a text's lines

    @property
    def step_col(self) -> int | None:
        return step_column(self.header)

    def describe(self) -> str:
        return f"the {self.kind} in {self.where} ({len(self.rows)} rows x {len(self.header)} columns)"

    def usable(self) -> bool:
        """A step-like column with an integer step on some row, and another column holding a number."""
        col = self.step_col
        if col is None or not self.rows:
            return False
        stepped = [r for r in self.rows if len(r) == len(self.header) and as_step(r[col].strip()) is not None]
        return bool(stepped) and any(_number(c) for r in stepped[:50] for i, c in enumerate(r) if i != col)

    def has_reward(self) -> bool:
        return any(normalize(h) == "reward" or normalize(h).startswith("rewards/") for h in self.header)


def _number(cell: str) -> bool:
    return to_number(cell) is not None


def _cell(cell: str) -> float | None:
    try:  # the common cell, a plain number; no gap word or percentage is one float() reads
        return float(cell)
    except ValueError:
        pass
    text = cell.strip()
    if text.lower() in _GAPS:
        return None
    if text.endswith("%"):
        x = to_number(text[:-1])
        return None if x is None else x / 100
    return to_number(text)


# -------------------------------------------------------------------------------- finding them


class _HtmlTables(HTMLParser):
    """Every ``<table>`` as rows of cell texts (``<th>`` and ``<td>`` alike); tags left open are closed."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tables: list[list[list[str]]] = []
        self._open: list[list[list[str]]] = []
        self._row: list[str] | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self._open.append([])
        elif not self._open:
            return
        elif tag == "tr":
            self._end_row()
            self._row = []
        elif tag in ("td", "th"):
            self._end_cell()
            if self._row is None:
                self._row = []
            self._cell = []
        elif tag == "br" and self._cell is not None:
            self._cell.append(" ")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th"):
            self._end_cell()
        elif tag == "tr":
            self._end_row()
        elif tag == "table" and self._open:
            self._end_row()
            self.tables.append(self._open.pop())

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)

    def _end_cell(self) -> None:
        if self._cell is not None and self._row is not None:
            self._row.append(" ".join("".join(self._cell).split()))
        self._cell = None

    def _end_row(self) -> None:
        self._end_cell()
        if self._row and self._open:
            self._open[-1].append(self._row)
        self._row = None


_TABLE = re.compile(r"(?is)<table\b[^>]*>(.*?)</table\s*>")
_TABLE_OPEN = re.compile(r"(?i)<table\b")
_SECTION = re.compile(r"(?i)</?(?:thead|tbody|tfoot)\b[^<>]*>")
_ROW_OPEN = re.compile(r"(?i)<tr\b[^<>]*>")
_CELL = re.compile(r"(?i)<t[dh]\b[^<>]*>([^<]*)</t[dh]\s*>")
_ROW_END = re.compile(r"(?i)</tr\s*>\s*(?:</?(?:thead|tbody|tfoot)\b[^<>]*>\s*)*$")


def _plain_tables(html: str) -> list[list[list[str]]] | None:
    """The tables of ``html`` when each is plain (rows of ``<td>``/``<th>`` cells holding text alone, as the
    transformers progress table is): a few regular-expression passes instead of a Python call per tag, which a
    million-row table needs. None for anything else, which the HTML parser reads; both agree where both apply."""
    found = list(_TABLE.finditer(html))
    if len(found) != len(_TABLE_OPEN.findall(html)):
        return None  # a nested or unclosed table
    tables = []
    for m in found:
        # Row by row, each row's text a slice of its own: no copy of the whole table is made.
        starts = [r.span() for r in _ROW_OPEN.finditer(html, m.start(1), m.end(1))]
        if _SECTION.sub("", html[m.start(1):starts[0][0] if starts else m.end(1)]).strip():
            return None
        rows = []
        for k, (_, body) in enumerate(starts):
            chunk = html[body:starts[k + 1][0] if k + 1 < len(starts) else m.end(1)]
            cells = _CELL.findall(chunk)
            tags = chunk.count("<")
            if tags != 2 * len(cells) + 1:
                tags -= len(_SECTION.findall(chunk))  # </tbody> after the last row, <tbody> before the first
            if tags != 2 * len(cells) + 1 or not _ROW_END.search(chunk):
                return None  # markup inside a cell, a row left open: the parser decides
            if cells:
                rows.append([" ".join((unescape(c) if "&" in c else c).split()) for c in cells])
        tables.append(rows)
    return tables


def html_tables(html: str, where: str, order: int = 0) -> list[Table]:
    """The tables of an HTML text; the first row is the header."""
    tables = _plain_tables(html)
    if tables is None:
        parser = _HtmlTables()
        parser.feed(html)
        parser.close()
        tables = parser.tables
    out = []
    for i, rows in enumerate(tables):
        if len(rows) >= 2:
            name = where if len(tables) == 1 else f"{where}, table {i + 1}"
            out.append(Table(rows[0], rows[1:], "HTML table", name, order + len(out)))
    return out


_PIPES = str.maketrans({"│": "|", "┃": "|", "║": "|"})
_RULE = re.compile(r"^[\s+|:=\-\u2500-\u257f]*$")  # rules of dashes, equals signs and box-drawing characters
_STEPLIKE = re.compile(r"(?i)(?<![\w/])(?:global[_ ]?step|step|iteration|iter|update|_step)(?![\w/])")
_MAX_LINE = 4000


def text_tables(text: str, where: str = "the text", order: int = 0) -> list[Table]:
    """HTML, pipe/markdown and whitespace-aligned tables of a text, in the order they appear."""
    found: list[tuple[int, Table]] = []
    if "<table" in text:
        for m in re.finditer(r"(?is)<table\b.*?</table>", text):
            line = text.count("\n", 0, m.start()) + 1
            found.extend((m.start(), t) for t in html_tables(m.group(), f"{where}, line {line}"))
    lines = text.splitlines()
    offsets = [0]
    for ln in lines:
        offsets.append(offsets[-1] + len(ln) + 1)
    found.extend((offsets[i], t) for i, t in _pipe_tables(lines, where))
    found.extend((offsets[i], t) for i, t in _aligned_tables(lines, where))
    found.sort(key=lambda x: x[0])
    return [Table(t.header, t.rows, t.kind, t.where, order + k, t.lines) for k, (_, t) in enumerate(found)]


def _pipe_tables(lines: Sequence[str], where: str) -> Iterable[tuple[int, Table]]:
    i = 0
    while i < len(lines):
        if "|" not in lines[i].translate(_PIPES) or len(lines[i]) > _MAX_LINE:
            i += 1
            continue
        start, rows, row_lines = i, [], []
        while i < len(lines) and len(lines[i]) <= _MAX_LINE and (
                "|" in (line := lines[i].translate(_PIPES)) or (rows and _RULE.match(line) and line.strip())):
            if not _RULE.match(line):
                cells = [c.strip() for c in line.strip().strip("|").split("|")]
                if len(cells) >= 2:
                    rows.append(cells)
                    row_lines.append(i + 1)
            i += 1
        if len(rows) >= 3 and all(len(r) == len(rows[0]) for r in rows[1:]):
            yield start, Table(rows[0], rows[1:], "markdown table", f"{where}, line {start + 1}", lines=row_lines[1:])


def _aligned_tables(lines: Sequence[str], where: str) -> Iterable[tuple[int, Table]]:
    i = 0
    while i < len(lines) - 2:
        line = lines[i]
        if len(line) > _MAX_LINE or "|" in line or not _STEPLIKE.search(line):
            i += 1
            continue
        width = len(lines[i + 1].split())
        header = _header_fields(line, width)
        if header is None:
            i += 1
            continue
        rows = []
        j = i + 1
        while j < len(lines):
            cells = lines[j].split()
            if len(cells) not in (len(header), len(header) + 1) or not all(_numeric_token(c) for c in cells):
                break
            rows.append(cells[-len(header):])  # a pandas frame's own index leads each row
            j += 1
        if len(rows) >= 2:
            yield i, Table(header, rows, "aligned columns", f"{where}, line {i + 1}",
                           lines=list(range(i + 2, i + 2 + len(rows))))
            i = j
        else:
            i += 1


def _header_fields(line: str, width: int) -> list[str] | None:
    """The column names of a header line: split on runs of two spaces when that fits the rows
    below ("Training Loss" is one name), else on any whitespace."""
    text = line.strip()
    for fields in (re.split(r"\s{2,}|\t", text), text.split()):
        if len(fields) >= 2 and width in (len(fields), len(fields) + 1) and step_column(fields) is not None:
            return fields
    return None


def _numeric_token(cell: str) -> bool:
    return cell.lower() in _GAPS or to_number(cell.rstrip("%")) is not None


# ------------------------------------------------------------------------------ choosing one


def _snapshot_of(a: Table, b: Table) -> bool:
    """``a`` is an earlier state of ``b``: the same columns, its rows the first of ``b``'s."""
    return (a is not b and a.header == b.header and len(a.rows) <= len(b.rows) and b.rows[:len(a.rows)] == a.rows
            and (len(a.rows) < len(b.rows) or b.order > a.order))


def choose(tables: Sequence[Table]) -> tuple[Table, list[str]]:
    """The table of the longest training run, and what was left out.

    Earlier snapshots of a table (a display updated while the run trained) are the same run; a
    table with a reward column is the GRPO run, one without (an SFT phase before it, a dataset
    preview) gives way to it; of the rest, the one with the most rows, the last on a tie.
    """
    usable = [t for t in tables if t.usable()]
    runs = [t for t in usable if not any(_snapshot_of(t, o) for o in usable)]
    rewarded = [t for t in runs if t.has_reward()]
    pool = rewarded or runs
    chosen = max(pool, key=lambda t: (len(t.rows), t.order))
    notes = []
    snapshots = len(usable) - len(runs)
    if snapshots:
        notes.append(f"left out {snapshots} earlier snapshot(s) of the same table")
    others = [t for t in runs if t is not chosen]
    if others:
        why = "without a reward column" if rewarded and all(not t.has_reward() for t in others) else "of other runs"
        notes.append(f"left out {len(others)} table(s) {why}: " + "; ".join(t.describe() for t in others[:4]))
    return chosen, notes


def table_source(path: Path, table: Table, notes: Sequence[str] = (), found: int = 1) -> Source:
    """One row per step of ``table``; the rows whose step cell is not an integer are skipped."""
    src = Source(path=path, format="table")
    col = table.step_col
    assert col is not None
    header = table.header
    steps = StepTable()
    norm = Normalizer(drop=SUMMARY_KEYS)
    skipped = Skipped()
    width = len(header)
    names = [(i, h) for i, h in enumerate(header) if i != col and h]
    for r, row in enumerate(table.rows):
        step = usable_step(row[col].strip()) if len(row) == width else None
        if step is None:
            at = f"{path}:{table.lines[r]}" if table.lines else f"{path}: {table.where}, row {r + 1}"
            why = (f"{len(row)} cell(s) where the header has {width}" if len(row) != width
                   else f"step cell {row[col].strip()[:40]!r} is no step ({step_fault(row[col].strip())})")
            skipped.add(f"{at}: {why}")
            continue
        steps.add(step, norm({h: _cell(row[i]) for i, h in names}))
    if not len(steps):
        raise SourceError(path, f"{table.describe()}: no row with an integer step")
    finish(src, steps, "rows")
    if spelled := norm.spellings():
        src.meta["spellings"] = spelled
    src.context = guess_context(src.metric_names(), None, [s for s, _ in src.steps])
    src.meta["table"] = table.describe()
    src.meta["steps_from"] = f"the '{header[col]}' column"
    if found > 1:
        src.meta["tables_found"] = found
        src.warnings.append(f"{path}: {found} tables with a step column; read {table.describe()}"
                            + "".join(f"; {n}" for n in notes))
    note_skipped(src, skipped)
    return src


def best_table(path: Path, tables: Sequence[Table]) -> Source | None:
    usable = [t for t in tables if t.usable()]
    if not usable:
        return None
    chosen, notes = choose(usable)
    return table_source(path, chosen, notes, len(usable))


# ------------------------------------------------------------------------ printed output


def _richness(src: Source) -> tuple[bool, bool, int, int]:
    """A reward first, then steps the log states (not assumed), then more steps, then more metrics."""
    names = src.metric_names()
    stated = not str(src.meta.get("steps_from", "")).startswith("assumed")
    return (any(n == "reward" or n.startswith("rewards/") for n in names), stated, len(src.steps), len(names))


def read_printed(path: Path, text: str, logging_steps: int | None, label: str,
                 tables: Sequence[Table] = ()) -> Source:
    """What a notebook or kernel printed: its console log, or its best table (``tables`` found in
    its HTML outputs, and any in ``text``), whichever ranks first by ``_richness``."""
    from grpo_monitor.readers.console import read_console, sniff

    candidates: list[Source] = []
    console_error: SourceError | None = None
    fmt = sniff(text) if text.strip() else None
    if fmt is not None:
        try:
            candidates.append(read_console(path, text, fmt, logging_steps))
        except SourceError as exc:
            console_error = exc
    table = best_table(path, [*tables, *text_tables(text, "the printed text", order=len(tables))])
    if table is not None:
        candidates.append(table)
    if not candidates:
        if console_error is not None:
            raise console_error
        raise SourceError(path, f"{label} holds no training log (no table with a step column, no printed metrics "
                                "dicts, verl 'step:N - key:value' lines, or lines with a step counter and name: value pairs)")
    return max(candidates, key=_richness)


# ----------------------------------------------------------------------------------- reader


class TableReader(Reader):
    name = "table"
    formats = ("table",)
    describes = "a table with a step column"

    def sniff(self, probe: Probe) -> str | None:
        if probe.layout != "text":
            return None
        tables = [t for t in text_tables(probe.text(), "the text") if t.usable()]
        if not tables:
            return None
        probe.cache["tables"] = tables
        return "table"

    def read(self, probe: Probe, fmt: str) -> Source:
        from grpo_monitor.readers.model import model_in_text, set_model

        src = best_table(probe.path, probe.cache.get("tables") or text_tables(probe.text(), "the text"))
        if src is None:
            raise SourceError(probe.path, f"no table with a step-like column ({STEP_NAMES})")
        set_model(src, model_in_text(probe.text(), "the log"))
        return src

    def near_miss(self, probe: Probe) -> str | None:
        if probe.layout != "text":
            return None
        found = [t for t in text_tables(probe.text(), "the text") if t.step_col is None]
        if not found:
            return None
        t = found[0]
        shown = ", ".join(t.header[:6]) + (", ..." if len(t.header) > 6 else "")
        return f"{t.describe()} has no step-like column ({STEP_NAMES}); columns: {shown}"
