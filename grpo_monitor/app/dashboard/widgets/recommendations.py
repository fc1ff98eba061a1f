"""Recommendations: the exact ``GRPOConfig`` change and CLI flags, ready to copy."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, DataTable, Label, TextArea

from grpo_monitor.core.recommend import ADVICE, IN_CONFIG, RECOMMENDED, TRIED, title
from grpo_monitor.app.dashboard.model import RunModel
from grpo_monitor.app.dashboard.text import one_line, visible
from grpo_monitor.app.dashboard.widgets.common import pyrepr, role_style, short

_UNSET = object()


def recommendation_text(rec: dict[str, Any], config: dict[str, Any]) -> str:
    """The recommendation as plain text: Python call, CLI flags, the diff against the run, advice
    that is not a config field, reasons. Advice from a warning, a change tried earlier in the
    lineage and settings the run already has say so in the first line.

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
    >>> print(recommendation_text({"step": 3, "variant": "code_change", "detector": "reward_broken",
    ...     "status": "advice", "severity": "critical", "config_overrides": {}, "python": "", "cli_flags": "",
    ...     "extra": {"advice": "return a float for every completion"}}, {}))
    # advice: change the code (from a critical finding; advice only, never triggers a restart), at step 3 (reward_broken)
    <BLANKLINE>
    # Also
    - advice: return a float for every completion
    """
    status = rec.get("status") or RECOMMENDED
    where = f"at step {short(rec.get('step'))}" + (f" ({visible(rec.get('detector'))})" if rec.get("detector") else "")
    if status == RECOMMENDED:
        lines = [f"# {visible(rec.get('variant') or 'change')}, recommended {where}"]
    else:
        lines = [f"# {visible(title(rec))}, {where}"]
    if rec.get("python"):
        lines += ["", "# Python", visible(rec.get("python") or "")]
    if rec.get("cli_flags"):
        lines += ["", "# CLI flags", visible(rec.get("cli_flags") or "")]
    overrides = rec.get("config_overrides")
    settings = rec.get("settings")
    if isinstance(overrides, dict) and overrides:
        lines += ["", "# Change against this run's config"]
        # The record's own "current" values: a lineage's earlier segment ran with other settings than the latest.
        recorded = rec.get("current") if isinstance(rec.get("current"), dict) else None
        for k, v in overrides.items():
            cur = recorded.get(k, _UNSET) if recorded is not None else config.get(k, _UNSET)
            if cur is not _UNSET:
                lines.append(visible(f"- {k}={pyrepr(cur)}"))
            lines.append(visible(f"+ {k}={pyrepr(v)}"))
    elif isinstance(settings, dict) and settings:
        lines += ["", "# Already in this run's config"] + [visible(f"  {k}={pyrepr(v)}") for k, v in settings.items()]
    extra = rec.get("extra")
    if isinstance(extra, dict) and extra:
        lines += ["", "# Also"] + [visible(f"- {k}: {v}") for k, v in extra.items()]
    reasons = rec.get("reasons")
    if reasons:
        lines += ["", "# Why"] + [visible(f"- {r}") for r in reasons]
    return "\n".join(lines)


def variant_cell(rec: dict[str, Any]) -> str:
    """The table's variant column: the name, and what the record is when it is not a switch to make."""
    name = visible(rec.get("variant") or "—")
    status = rec.get("status") or RECOMMENDED
    return name if status == RECOMMENDED else f"{name} ({STATUS_WORDS.get(status, status)})"


STATUS_WORDS = {ADVICE: "advice, no restart", TRIED: "tried", IN_CONFIG: "in config"}


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
                Text(variant_cell(r), style=role_style(self.app, "accent")),
                Text(visible(r.get("detector") or "—")),
                one_line(r.get("cli_flags"), 80),
                key=str(i),
            )
        if table.row_count:
            table.move_cursor(row=table.row_count - 1 if follow else row)
            self._select(table.cursor_row)
        else:
            self.query_one("#rec-text", TextArea).load_text(
                "No recommendation yet: no finding has named a variant, a remedy or a fix. A confirmed (critical) "
                "finding recommends a switch; a warning's variant shows here as advice."
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
