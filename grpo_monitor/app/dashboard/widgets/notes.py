"""Patterns in the run that look wrong but are normal GRPO behaviour, with why and when they would not be."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.widgets import Label, Static

from grpo_monitor.app.dashboard.model import RunModel
from grpo_monitor.app.dashboard.text import literal, visible
from grpo_monitor.app.dashboard.widgets.common import role_style

TITLE = "Looks odd but is normal"


def notes_of(model: RunModel) -> list[dict[str, Any]]:
    """``grpo_monitor.analysis.explain`` over what the dashboard holds: the stored columns, the latest config.

    >>> m = RunModel()
    >>> _ = m.ingest([{"type": "header", "config": {"num_iterations": 1, "gradient_accumulation_steps": 1}},
    ...               *({"type": "step", "step": s, "metrics": {"clip_ratio/region_mean": 0.0}} for s in range(1, 9))])
    >>> [n["id"] for n in notes_of(m)]
    ['clip_ratio_zero']
    """
    from grpo_monitor.analysis.explain import explain_columns

    store = model.store
    return explain_columns(store.steps, {n: store.column(n) for n in store.names}, model.config)


class NotesPanel(Vertical):
    """One entry per note: the pattern with the run's numbers, then why it is fine and when it would not be.

    The notes are recomputed from the whole history, so a live run recomputes them only once it has
    grown by a fiftieth (or finished): cheap on a long run, and never more than 2% behind.
    """

    DEFAULT_CSS = """
    NotesPanel { height: auto; max-height: 35%; }
    NotesPanel.-empty { display: none; }
    #notes-label { height: 1; padding: 0 1; background: $boost; color: $foreground; text-style: bold; }
    #notes-scroll { height: auto; max-height: 100%; }
    #notes-text { padding: 0 1; }
    """

    def compose(self) -> ComposeResult:
        yield Label(TITLE, id="notes-label", markup=False)
        with VerticalScroll(id="notes-scroll", can_focus=False):
            yield Static("", id="notes-text", markup=False)

    def on_mount(self) -> None:
        self.notes: list[dict[str, Any]] = []
        self._seen: tuple[int, int, bool] | None = None
        self.add_class("-empty")

    def show(self, model: RunModel) -> None:
        n, gen, done = model.store.n, model.store.gen, model.finished
        if self._seen is not None:
            last_n, last_gen, last_done = self._seen
            if (gen, done) == (last_gen, last_done) and n - last_n < max(1, last_n // 50):
                return
        self._seen = (n, gen, done)
        try:
            self.notes = notes_of(model)
        except Exception:  # advice only: the dashboard keeps drawing without it
            self.notes = []
        self.set_class(not self.notes, "-empty")
        self.query_one("#notes-label", Label).update(f"{TITLE} ({len(self.notes)})")
        app = self.app
        t = Text()
        for i, note in enumerate(self.notes):
            if i:
                t.append("\n")
            t.append(visible(note.get("id")), role_style(app, "info", bold=True))
            t.append("  ")
            t.append_text(literal(note.get("pattern")))
            t.append("\n  why: ", role_style(app, "muted"))
            t.append_text(literal(note.get("why")))
            t.append("\n  unless: ", role_style(app, "muted"))
            t.append_text(literal(note.get("unless")))
        self.query_one("#notes-text", Static).update(t)
