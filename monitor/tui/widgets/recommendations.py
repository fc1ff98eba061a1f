"""Recommendations: the exact ``GRPOConfig`` change and CLI flags, ready to copy."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, DataTable, Label, TextArea

from grpo_monitor.monitor.tui.model import RunModel
from grpo_monitor.monitor.tui.text import one_line, visible
from grpo_monitor.monitor.tui.widgets.common import pyrepr, role_style, short

_UNSET = object()


def recommendation_text(rec: dict[str, Any], config: dict[str, Any]) -> str:
    """The recommendation as plain text: Python call, CLI flags, the diff against the run, reasons.

    >>> print(recommendation_text({"step": 40, "variant": "dr_grpo", "detector": "length_reward_coupling",
    ...     "config_overrides": {"loss_type": "dr_grpo"}, "python": "GRPOConfig(..., loss_type='dr_grpo')",
    ...     "cli_flags": "--loss_type dr_grpo", "reasons": ["length tracks reward"]}, {"loss_type": "dapo"}))
    # dr_grpo, recommended at step 40 (length_reward_coupling)
    <BLANKLINE>
    # Python
    GRPOConfig(..., loss_type='dr_grpo')
    <BLANKLINE>
    # CLI flags
    --loss_type dr_grpo
    <BLANKLINE>
    # Change against this run's config
    - loss_type='dapo'
    + loss_type='dr_grpo'
    <BLANKLINE>
    # Why
    - length tracks reward
    """
    lines = [
        f"# {visible(rec.get('variant') or 'change')}, recommended at step {short(rec.get('step'))}"
        + (f" ({visible(rec.get('detector'))})" if rec.get("detector") else ""),
        "",
        "# Python",
        visible(rec.get("python") or ""),
        "",
        "# CLI flags",
        visible(rec.get("cli_flags") or ""),
    ]
    overrides = rec.get("config_overrides")
    if isinstance(overrides, dict) and overrides:
        lines += ["", "# Change against this run's config"]
        for k, v in overrides.items():
            cur = config.get(k, _UNSET)
            if cur is not _UNSET:
                lines.append(visible(f"- {k}={pyrepr(cur)}"))
            lines.append(visible(f"+ {k}={pyrepr(v)}"))
    reasons = rec.get("reasons")
    if reasons:
        lines += ["", "# Why"] + [visible(f"- {r}") for r in reasons]
    return "\n".join(lines)


class RecommendationPanel(Vertical):
    BINDINGS = [
        Binding("c", "copy_python", "Copy Python"),
        Binding("y", "copy_cli", "Copy CLI flags"),
    ]

    def compose(self) -> ComposeResult:
        yield DataTable(id="recs", cursor_type="row")
        with Horizontal(id="rec-buttons"):
            yield Button("Copy Python (c)", id="copy-python", compact=True)
            yield Button("Copy CLI flags (y)", id="copy-cli", compact=True)
            yield Label("", id="rec-status", markup=False)
        yield TextArea("", id="rec-text", read_only=True, soft_wrap=True, show_line_numbers=False)

    def on_mount(self) -> None:
        self._model: RunModel | None = None
        self._selected = -1
        table = self.query_one("#recs", DataTable)
        table.add_columns("step", "variant", "detector", "CLI flags")

    def show(self, model: RunModel) -> None:
        self._model = model
        table = self.query_one("#recs", DataTable)
        row = table.cursor_row
        follow = table.row_count == 0 or row >= table.row_count - 1
        table.clear()
        for i, r in enumerate(model.recommendations):
            table.add_row(
                Text(short(r.get("step"))),
                Text(visible(r.get("variant") or "—"), style=role_style(self.app, "accent")),
                Text(visible(r.get("detector") or "—")),
                one_line(r.get("cli_flags"), 80),
                key=str(i),
            )
        if table.row_count:
            table.move_cursor(row=table.row_count - 1 if follow else row)
            self._select(table.cursor_row)
        else:
            self.query_one("#rec-text", TextArea).load_text(
                "No recommendation yet. The monitor recommends a GRPO variant only on a confirmed symptom."
            )

    def _select(self, index: int) -> None:
        if self._model is None or not 0 <= index < len(self._model.recommendations):
            return
        self._selected = index
        rec = self._model.recommendations[index]
        ta = self.query_one("#rec-text", TextArea)
        text = recommendation_text(rec, self._model.config)
        if ta.text != text:
            ta.load_text(text)

    def current(self) -> dict[str, Any] | None:
        if self._model is None or not 0 <= self._selected < len(self._model.recommendations):
            return None
        return self._model.recommendations[self._selected]

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.row_key.value is not None:
            self._select(int(event.row_key.value))

    def _copy(self, field: str, what: str) -> None:
        rec = self.current()
        status = self.query_one("#rec-status", Label)
        if rec is None or not rec.get(field):
            status.update("nothing to copy")
            return
        self.app.copy_to_clipboard(str(rec[field]))
        status.update(f"copied {what} to the clipboard")

    def action_copy_python(self) -> None:
        self._copy("python", "the GRPOConfig call")

    def action_copy_cli(self) -> None:
        self._copy("cli_flags", "the CLI flags")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "copy-python":
            self.action_copy_python()
        elif event.button.id == "copy-cli":
            self.action_copy_cli()

    def focus_main(self) -> None:
        self.query_one("#recs", DataTable).focus()
