"""The samples browser: every recorded completion, filterable, shown verbatim.

Samples are read a step at a time (``RunModel.samples_of``): the newest steps until there are
enough rows to show, or the steps a filter names; a text, correctness or truncation filter looks
back through at most ``SCAN_SAMPLES`` samples. Completions kept as numbers only (the retention
policy) show their numbers, without text. ``Enter`` on a row opens ``SampleScreen``: the sample
in full, scrollable, ``Esc`` closes it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import DataTable, Input, Label, Static

from grpo_monitor.app.dashboard.model import RunModel
from grpo_monitor.app.dashboard.text import literal, one_line, visible
from grpo_monitor.app.dashboard.widgets.common import role_style, short
from grpo_monitor.app.dashboard.widgets.chart import fmt

MAX_ROWS = 500  # newest matching samples shown; a filter narrows the rest down
SCAN_SAMPLES = 200_000  # samples a filter reads at most, newest steps first


@dataclass
class SampleFilter:
    """Parsed filter text: step numbers or ranges, correct/incorrect, truncated, free text.

    >>> f = SampleFilter.parse("10-20 incorrect  foo")
    >>> f.steps, f.correct, f.text
    ([(10, 20)], False, ['foo'])
    >>> f.matches({"step": 12, "correct": False, "prompt": "", "completion": "a FOO b"})
    True
    """

    steps: list[tuple[int, int]] = field(default_factory=list)
    correct: bool | None = None
    truncated: bool | None = None
    text: list[str] = field(default_factory=list)

    @classmethod
    def parse(cls, spec: str) -> SampleFilter:
        f = cls()
        for tok in spec.split():
            low = tok.lower()
            m = re.fullmatch(r"(?:step[=:])?(\d+)(?:(?:-|\.\.)(\d+))?", low)
            if m:
                a = int(m.group(1))
                b = int(m.group(2)) if m.group(2) else a
                f.steps.append((min(a, b), max(a, b)))
            elif low in ("correct", "right", "✓", "+correct"):
                f.correct = True
            elif low in ("incorrect", "wrong", "✗", "-correct", "!correct"):
                f.correct = False
            elif low in ("truncated", "trunc"):
                f.truncated = True
            elif low in ("complete", "!truncated", "-truncated"):
                f.truncated = False
            else:
                f.text.append(low)
        return f

    def __bool__(self) -> bool:
        return bool(self.steps or self.text) or self.correct is not None or self.truncated is not None

    def matches(self, s: dict[str, Any]) -> bool:
        if self.steps:
            st = s.get("step")
            if not isinstance(st, int) or not any(a <= st <= b for a, b in self.steps):
                return False
        if self.correct is not None and s.get("correct") is not self.correct:
            return False
        if self.truncated is not None and bool(s.get("truncated")) is not self.truncated:
            return False
        if self.text:
            hay = f"{s.get('prompt', '')}\n{s.get('completion', '')}".lower()
            if not all(t in hay for t in self.text):
                return False
        return True

    def describe(self) -> str:
        parts = [f"step {a}" if a == b else f"steps {a}-{b}" for a, b in self.steps]
        if self.correct is not None:
            parts.append("correct" if self.correct else "incorrect")
        if self.truncated is not None:
            parts.append("truncated" if self.truncated else "complete")
        parts += [repr(t) for t in self.text]
        return ", ".join(parts)


class SamplesPanel(Vertical):
    BINDINGS = [
        Binding("slash", "open_filter", "Filter"),
        Binding("escape", "close_filter", "Close filter", show=False),
    ]

    def compose(self) -> ComposeResult:
        yield Input(
            placeholder="12 | 10-20 | correct | incorrect | truncated | text  (Enter applies, Esc closes)",
            id="sample-filter",
        )
        yield Label("", id="samples-status", markup=False)
        yield DataTable(id="samples-table", cursor_type="row", zebra_stripes=True)
        with VerticalScroll(id="sample-detail-scroll"):
            yield Static("", id="sample-detail", markup=False)

    def on_mount(self) -> None:
        self._model: RunModel | None = None
        self._filter = SampleFilter()
        self._shown_version: object = None
        self._components: list[str] = []
        self._width = 0
        self._text_w = 40
        self._prompt_w = 0
        self._rows: list[int] = []
        self._loaded: list[dict[str, Any]] = []
        self.query_one("#sample-filter", Input).display = False

    # -- filter ----------------------------------------------------------------------------
    def action_open_filter(self) -> None:
        inp = self.query_one("#sample-filter", Input)
        inp.display = True
        inp.focus()

    def action_close_filter(self) -> None:
        inp = self.query_one("#sample-filter", Input)
        if inp.display:
            inp.display = False
            self.query_one("#samples-table", DataTable).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id != "sample-filter":
            return
        event.stop()
        self.set_filter(event.value)
        event.input.display = False
        self.query_one("#samples-table", DataTable).focus()

    def set_filter(self, spec: str) -> None:
        self._filter = SampleFilter.parse(spec)
        self.query_one("#sample-filter", Input).value = spec
        self._shown_version = None
        if self._model is not None:
            self.show(self._model)

    # -- table -----------------------------------------------------------------------------
    def show(self, model: RunModel) -> None:
        self._model = model
        key = (model.sample_version, self.app.theme, self.query_one("#samples-table").size.width)
        if key == self._shown_version:
            return
        self._shown_version = key
        app = self.app
        table = self.query_one("#samples-table", DataTable)
        comps = model.reward_components()
        width = table.size.width or self.size.width or self.app.size.width
        if comps != self._components or not table.columns or width != self._width:
            table.clear(columns=True)
            heads = [_short_name(c) for c in comps]
            table.add_column("step")
            table.add_column("#")
            table.add_column("ok")
            for h in heads:
                table.add_column(h, width=max(5, len(h)))
            table.add_column("len")
            table.add_column("trunc")
            # What is left of the width goes to the completion: the column a reader scans.
            # (Each column is padded by one cell on both sides; the prompt joins when wide.)
            used = 6 + 5 + 4 + sum(max(5, len(h)) + 2 for h in heads) + 5 + 7 + 2 + 1
            self._prompt_w = 24 if width >= 120 else 0
            if self._prompt_w:
                used += self._prompt_w + 2
            self._text_w = max(20, width - used)
            table.add_column("completion", width=self._text_w)
            if self._prompt_w:
                table.add_column("prompt", width=self._prompt_w)
            self._components = comps
            self._width = width
        keep_key = None
        if table.row_count and table.cursor_row < len(self._rows):
            keep_key = self._rows[table.cursor_row]
        table.clear()
        loaded, complete = self._load(model)
        self._loaded = loaded
        matched = [i for i, s in enumerate(loaded) if self._filter.matches(s)]
        shown = sorted(
            matched[-MAX_ROWS * 4 :] if len(matched) > MAX_ROWS * 4 else matched,
            key=lambda i: (-_int(loaded[i].get("step")), _int(loaded[i].get("index"))),
        )[:MAX_ROWS]
        self._rows = shown
        total = model.sample_count
        for i in shown:
            s = loaded[i]
            rewards = s.get("rewards") if isinstance(s.get("rewards"), dict) else {}
            c = s.get("correct")
            table.add_row(
                Text(short(s.get("step"))),
                Text(short(s.get("index"))),
                Text("✓" if c is True else "✗" if c is False else "—",
                     style=role_style(app, "ok" if c is True else "critical" if c is False else "muted")),
                *(Text(fmt(rewards.get(k)) if rewards.get(k) is not None else "—") for k in comps),
                Text(short(s.get("length"))),
                Text("yes" if s.get("truncated") else "no",
                     style=role_style(app, "warning" if s.get("truncated") else "muted")),
                one_line(s.get("completion"), self._text_w),
                *([one_line(s.get("prompt"), self._prompt_w)] if self._prompt_w else []),
                key=str(i),
            )
        status = f"{len(shown)} of {total} samples"
        if len(matched) > len(shown):
            status = f"newest {len(shown)} of {len(matched)} matching ({total} samples)"
        elif self._filter:
            status = f"{len(matched)} of {total} samples match"
        if not complete and self._filter:
            status += f" (newest {len(loaded)} read)"
        if self._filter:
            status += f" · filter: {self._filter.describe()}"
        status += "  (/ to filter)"
        self.query_one("#samples-status", Label).update(status)
        if table.row_count:
            row = shown.index(keep_key) if keep_key in shown else 0
            table.move_cursor(row=row)
            self._detail(shown[row])
        else:
            self.query_one("#sample-detail", Static).update(Text("No samples match." if total else "No samples recorded yet.", style=role_style(app, "muted")))

    def _load(self, model: RunModel) -> tuple[list[dict[str, Any]], bool]:
        """The samples this view draws from, newest steps first, and whether that is all that
        the filter could match."""
        steps = model.sample_steps()
        if self._filter.steps:
            steps = [st for st in steps if any(a <= st <= b for a, b in self._filter.steps)]
        narrowing = self._filter.text or self._filter.correct is not None or self._filter.truncated is not None
        want = SCAN_SAMPLES if narrowing else MAX_ROWS * 4
        rows: list[dict[str, Any]] = []
        chunks: list[list[dict[str, Any]]] = []
        found = 0
        for k, st in enumerate(reversed(steps)):
            batch = model.samples_of(st)
            chunks.append(batch)
            found += sum(1 for r in batch if self._filter.matches(r)) if narrowing else len(batch)
            total = sum(map(len, chunks))
            if found >= MAX_ROWS or total >= want:
                complete = k == len(steps) - 1
                break
        else:
            complete = True
        for batch in reversed(chunks):
            rows.extend(batch)
        return rows, complete

    def _detail(self, index: int) -> None:
        if self._model is None or not 0 <= index < len(self._loaded):
            return
        self.query_one("#sample-detail", Static).update(sample_text(self.app, self._loaded[index]))

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.row_key.value is not None:
            self._detail(int(event.row_key.value))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.row_key.value is None:
            return
        index = int(event.row_key.value)
        self._detail(index)
        if 0 <= index < len(self._loaded):
            self.app.push_screen(SampleScreen(self._loaded[index]))

    def on_resize(self) -> None:
        if self._model is not None:
            self.call_after_refresh(self.show, self._model)  # column widths follow the table's width

    def focus_main(self) -> None:
        self.query_one("#samples-table", DataTable).focus()


def _int(v: Any) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else -1


def _short_name(reward: str) -> str:
    """A reward function's name without the ``_reward`` boilerplate, for a column header."""
    for suffix in ("_reward", "_func", "_fn"):
        if reward.endswith(suffix) and len(reward) > len(suffix):
            return reward[: -len(suffix)]
    return reward


def sample_text(app: Any, s: dict[str, Any], full: bool = False) -> Text:
    """One sample as text: its numbers, then prompt and completion verbatim.

    ``full`` (the sample screen) gives each number a line of its own and every reward component,
    so nothing is cut to the width of a summary line.
    """
    head = role_style(app, "primary", bold=True)
    muted = role_style(app, "muted")
    t = Text()
    c = s.get("correct")
    correct = "yes" if c is True else "no" if c is False else "unknown"
    rewards = s.get("rewards") if isinstance(s.get("rewards"), dict) else {}
    if full:
        rows = [
            ("step", short(s.get("step"))), ("sample", short(s.get("index"))), ("group", short(s.get("group"))),
            ("rank", short(s.get("rank"))), ("length", f"{short(s.get('length'))} tokens"),
            ("truncated", "yes" if s.get("truncated") else "no"), ("correct", correct),
        ]
        for name, value in rows:
            t.append(f"{name:<10}", muted)
            t.append(visible(value) + "\n")
        t.append("rewards\n", muted)
        pad = max((len(visible(k)) for k in rewards), default=0)
        for k, v in rewards.items():
            t.append(f"  {visible(k):<{pad}}", muted)
            t.append(f"  {fmt(v) if v is not None else '—'}\n")
        if not rewards:
            t.append("  none recorded\n", muted)
    else:
        t.append(f"step {short(s.get('step'))} · sample {short(s.get('index'))} · group {short(s.get('group'))}"
                 f" · rank {short(s.get('rank'))} · {short(s.get('length'))} tokens"
                 f"{' · truncated' if s.get('truncated') else ''} · correct: {correct}\n", muted)
        if rewards:
            t.append("rewards: ", muted)
            t.append(visible(", ".join(f"{k}={fmt(v) if v is not None else '—'}" for k, v in rewards.items())) + "\n")
    t.append("\nPROMPT\n", head)
    t.append_text(literal(s.get("prompt")))
    if "completion" in s:
        t.append("\n\nCOMPLETION", head)
        chars = s.get("chars")
        if isinstance(chars, int) and isinstance(s.get("completion"), str) and chars > len(s["completion"]):
            t.append(f"  (head and tail of {chars} characters)", muted)
        t.append("\n", head)
        t.append_text(literal(s.get("completion")))
    else:
        t.append("\n\nCOMPLETION\n", head)
        t.append("text not kept for this completion (sample_text policy); its numbers: ", muted)
        t.append(f"tail repetition {fmt(s.get('tail_rep')) if s.get('tail_rep') is not None else '—'}, "
                 f"{short(s.get('chars'))} characters")
    return t


class SampleScreen(ModalScreen[None]):
    """One sample in full over the dashboard: its numbers, prompt and completion, scrollable.

    ``Esc`` closes it. Model output is shown literally, as in the table.

    >>> screen = SampleScreen({"step": 3, "index": 0, "prompt": "2+2?", "completion": "4", "correct": True})
    >>> screen.sample["completion"]
    '4'
    """

    BINDINGS = [Binding("escape", "dismiss", "Close")]

    def __init__(self, sample: dict[str, Any]) -> None:
        super().__init__()
        self.sample = sample

    def compose(self) -> ComposeResult:
        s = self.sample
        title = (f"step {short(s.get('step'))} · sample {short(s.get('index'))}"
                 "   ↑ ↓ PgUp PgDn scroll · Esc closes")
        with Vertical(id="sample-box"):
            yield Label(title, id="sample-screen-title", markup=False)
            with VerticalScroll(id="sample-full-scroll"):
                yield Static(sample_text(self.app, s, full=True), id="sample-full", markup=False)

    def on_mount(self) -> None:
        self.query_one("#sample-full-scroll", VerticalScroll).focus()
