"""The detector board (each detector's state now) and every finding raised so far."""

from __future__ import annotations


from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.widgets import DataTable, Label, Static

from grpo_monitor.core.finding_samples import pick_samples
from grpo_monitor.detectors import DETECTOR_IDS
from grpo_monitor.app.dashboard.model import RunModel
from grpo_monitor.app.dashboard.text import literal, one_line, visible
from grpo_monitor.app.dashboard.widgets.common import STATE_ROLE, evidence_text, role_style, short


class DetectorPanel(Vertical):
    def compose(self) -> ComposeResult:
        yield DataTable(id="board", cursor_type="row", zebra_stripes=True)
        yield Label("Findings", id="findings-label", classes="section", markup=False)
        yield DataTable(id="findings", cursor_type="row")
        with VerticalScroll(id="finding-detail-scroll", can_focus=False):
            yield Static("", id="finding-detail", markup=False)

    def on_mount(self) -> None:
        board = self.query_one("#board", DataTable)
        # "last finding": the severity of the latest finding the detector raised, which its state outlives
        # once the episode ends ("cleared").
        board.add_columns("detector", "state", "last finding", "step", "onset", "latest evidence")
        table = self.query_one("#findings", DataTable)
        table.add_columns("step", "onset", "severity", "detector", "variant", "message")
        self._model: RunModel | None = None

    def show(self, model: RunModel) -> None:
        self._model = model
        app = self.app
        board = self.query_one("#board", DataTable)
        latest = model.latest_findings_by_detector()
        ids = [d for d in DETECTOR_IDS if d in model.detector_states or d in latest]
        ids += sorted(d for d in {*model.detector_states, *latest} if d not in ids)
        if not ids:
            ids = list(DETECTOR_IDS)
        row = board.cursor_row
        board.clear()
        for d in ids:
            state = model.shown_state(d)
            f = latest.get(d)
            sev = str(f.get("severity")) if f else ""
            onset = f.get("onset_step") if f else None
            shown_sev = f"{sev} (cleared)" if sev and sev != "info" and state != sev else sev
            board.add_row(
                Text(visible(d)),
                Text(visible(state), style=role_style(app, STATE_ROLE.get(state, "muted"), bold=state == "critical")),
                Text(shown_sev, style=role_style(app, "muted" if shown_sev != sev else (sev or "muted"))),
                Text(short(f.get("step")) if f else ""),
                Text(short(onset) if onset is not None else ""),
                one_line(evidence_text(f.get("evidence")) if f else ""),
                key=d,
            )
        if board.row_count:
            board.move_cursor(row=min(row, board.row_count - 1))

        table = self.query_one("#findings", DataTable)
        row = table.cursor_row
        was_empty = table.row_count == 0
        table.clear()
        for i, f in enumerate(model.findings):
            sev = str(f.get("severity"))
            onset = f.get("onset_step")
            table.add_row(
                Text(short(f.get("step"))),
                Text(short(onset) if onset is not None else "—"),
                Text(sev, style=role_style(app, sev, bold=sev == "critical")),
                Text(visible(f.get("detector"))),
                Text(visible(f.get("variant") or "—")),
                one_line(f.get("message"), 120),
                key=str(i),
            )
        self.query_one("#findings-label", Label).update(f"Findings ({len(model.findings)})")
        if table.row_count:
            # Follow the newest finding until the user moves the cursor.
            table.move_cursor(row=table.row_count - 1 if was_empty or row >= table.row_count - 2 else row)
            self._detail(int(table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value or 0))
        else:
            self.query_one("#finding-detail", Static).update(Text("No findings yet.", style=role_style(app, "muted")))

    def _detail(self, index: int) -> None:
        if self._model is None or not 0 <= index < len(self._model.findings):
            return
        f = self._model.findings[index]
        app = self.app
        t = Text()
        sev = str(f.get("severity"))
        t.append(f"{sev.upper()} ", role_style(app, sev, bold=True))
        t.append(visible(f.get("detector")), "bold")
        t.append(f"  raised at step {short(f.get('step'))}")
        if f.get("onset_step") is not None:
            t.append(f", onset ≈ step {short(f.get('onset_step'))}")
        if f.get("variant"):
            t.append(f"  → {visible(f.get('variant'))}", role_style(app, "accent"))
        t.append("\n")
        t.append_text(literal(f.get("message")))
        ev = f.get("evidence")
        if ev:
            t.append("\nevidence: ", role_style(app, "muted"))
            t.append_text(literal(evidence_text(ev)))
        co = f.get("config_overrides")
        if co:
            t.append("\noverrides: ", role_style(app, "muted"))
            t.append_text(literal(", ".join(f"{k}={v!r}" for k, v in co.items())))
        self._samples(t, pick_samples(f, self._model.sample_steps(), self._model.samples_of))
        self.query_one("#finding-detail", Static).update(t)

    def _samples(self, t: Text, picks: list[dict]) -> None:
        """The completions behind the finding (``core.finding_samples``), one line each."""
        if not picks:
            return
        muted = role_style(self.app, "muted")
        t.append(f"\nsamples ({visible(picks[0].get('why'))}):", muted)
        for p in picks:
            t.append(f"\n  step {short(p.get('step'))} #{short(p.get('index'))}", "bold")
            t.append(f"  reward {short(p.get('reward'))}  length {short(p.get('length'))}"
                     + ("  truncated" if p.get("truncated") else ""), muted)
            if p.get("excerpt"):
                t.append("\n    ")
                t.append_text(literal(p.get("excerpt")))

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table.id == "findings" and event.row_key.value is not None:
            self._detail(int(event.row_key.value))

    def focus_main(self) -> None:
        self.query_one("#board", DataTable).focus()
