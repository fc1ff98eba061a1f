"""The live dashboard: ``grpo-monitor watch RUN``.

A thread worker follows the run directory (``grpo_monitor.app.dashboard.tail``) and posts one
``RecordsArrived`` message per poll; the app folds the records into a ``RunModel`` and tells the
visible panel to redraw. A path that is not a run directory is read once with
``grpo_monitor.readers.load_source`` and replayed through the detectors, so the same dashboard opens
a finished run, a ``trainer_state.json``, a TensorBoard folder or a CSV/JSONL export.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import Footer, TabbedContent, TabPane
from textual.worker import get_current_worker

from grpo_monitor.core.runlog import RUN_FILE
from grpo_monitor.app.dashboard import is_starting_run
from grpo_monitor.app.dashboard.messages import RecordsArrived, RunFound, SourceFailed
from grpo_monitor.app.dashboard.model import RunModel
from grpo_monitor.app.dashboard.tail import RunTailer
from grpo_monitor.app.dashboard.widgets.board import DetectorPanel
from grpo_monitor.app.dashboard.widgets.device import DevicePanel
from grpo_monitor.app.dashboard.widgets.header import RunHeader
from grpo_monitor.app.dashboard.widgets.help import HelpScreen
from grpo_monitor.app.dashboard.widgets.moe import MoePanel
from grpo_monitor.app.dashboard.widgets.notes import NotesPanel
from grpo_monitor.app.dashboard.widgets.overview import OverviewPanel
from grpo_monitor.app.dashboard.widgets.recommendations import RecommendationPanel
from grpo_monitor.app.dashboard.widgets.samples import SamplesPanel

TABS = ["overview", "detectors", "recommendations", "samples", "moe", "device"]
TAB_TITLES = {
    "overview": "Overview",
    "detectors": "Detectors",
    "recommendations": "Recommendations",
    "samples": "Samples",
    "moe": "MoE",
    "device": "Device",
}
# Panels shown only once the run has what they draw.
OPTIONAL_TABS = ("moe", "device")
POLL_INTERVAL = 0.2
THEMES = ("textual-dark", "textual-light")


def replay_source(path: str | Path, warnings: list[str] | None = None) -> list[dict[str, Any]]:
    """A foreign log (or finished run) as run-log records, findings replayed by the engine; what
    the reader said about the log (lines it skipped, ...) goes into ``warnings``.

    Raises ``grpo_monitor.readers.SourceError`` (one line) when the path is not a readable log.
    """
    from grpo_monitor.analysis.analyze import crash_findings
    from grpo_monitor.readers import load_source

    src = load_source(path)
    if warnings is not None:
        warnings.extend(src.warnings)
    ctx = src.context
    records: list[dict[str, Any]] = [
        {
            "type": "header",
            "run_id": Path(str(path)).name,
            "config": dict(ctx.config),
            "model": dict(ctx.model),
            "reward_funcs": list(ctx.reward_names),
            "segment": 0,  # recorded as the callback records it (0 for the first); shown from 1
            "source_format": src.format,
        }
    ]
    run = src.run
    if run is not None:  # our own run directory: its recorded findings are the truth
        records = []
        if run.header:
            records.append(dict(run.header))
        for s in run.steps:
            records.append(dict(s))
        by_step = src.samples if isinstance(src.samples, Mapping) else {}
        records += [dict(r) for step in by_step for r in by_step[step]]
        records += [dict(r) for r in (*run.samples, *run.findings, *run.recommendations, *run.restarts)]
        if run.summary:
            records.append(dict(run.summary))
        records.extend({"type": "finding", **f.to_dict()} for f in crash_findings(src, path))
        return records
    from grpo_monitor.analysis.prepare import names_with_values, prepare_names
    from grpo_monitor.analysis.replay import replay_session, session_coverage

    src, logged = prepare_names(src)
    records[0]["reward_funcs"] = list(src.context.reward_names)

    def each(step: int, metrics: Mapping[str, Any], batch: Any, out: Any) -> None:
        records.append({"type": "step", "step": int(step), "metrics": dict(metrics), "detectors": dict(out.states)})
        for s in batch or ():
            records.append({"type": "sample", "step": int(step), **s})
        records.extend({"type": "finding", **f.to_dict()} for f in out.findings)
        records.extend(out.recommendations)  # the same recommendations the live monitor and `analyze` give

    session = replay_session(src, each=each)
    records.extend({"type": "finding", **f.to_dict()} for f in crash_findings(src, path))
    # What could judge the run, as `analyze` reports it: the board shows a detector without its inputs as such.
    records.append({"type": "coverage", "coverage": session_coverage(session, src, names_with_values(src.steps, logged))})
    return records


def is_run_path(p: Path) -> bool:
    """Tail ``p`` as a run directory: it is one, or it is a run about to start (it does not exist
    yet, or holds nothing but what a run writes before its first record)."""
    if p.name == RUN_FILE:
        return True
    try:
        if not p.exists():
            return True
        return p.is_dir() and ((p / RUN_FILE).is_file() or is_starting_run(p))
    except OSError:  # cannot be looked into: the tailer waits for it and says why
        return True


class DashboardScreen(Screen[None]):
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (140, "-wide")]
    BINDINGS = [
        Binding("tab", "next_tab(1)", "Next panel", show=False),
        Binding("shift+tab", "next_tab(-1)", "Previous panel", show=False),
        *(Binding(str(i + 1), f"show_tab('{t}')", TAB_TITLES[t], show=False) for i, t in enumerate(TABS)),
    ]

    def compose(self) -> ComposeResult:
        yield RunHeader(id="run-header")
        with TabbedContent(id="tabs", initial="overview"):
            with TabPane("1 Overview", id="overview"):
                yield OverviewPanel(id="overview-panel")
            with TabPane("2 Detectors", id="detectors"):
                yield DetectorPanel(id="detectors-panel")
                yield NotesPanel(id="notes-panel")
            with TabPane("3 Recommendations", id="recommendations"):
                yield RecommendationPanel(id="recommendations-panel")
            with TabPane("4 Samples", id="samples"):
                yield SamplesPanel(id="samples-panel")
            with TabPane("5 MoE", id="moe"):
                yield MoePanel(id="moe-panel")
            with TabPane("6 Device", id="device"):
                yield DevicePanel(id="device-panel")
        yield Footer()

    def on_mount(self) -> None:
        for tab in OPTIONAL_TABS:
            self.query_one(TabbedContent).hide_tab(tab)
        self._shown: set[str] = set()
        self._dirty: set[str] = set(TABS)
        self._labels: dict[str, str] = {}
        self.query_one(OverviewPanel).bind(self.model)
        self.query_one(MoePanel).bind(self.model)
        self.query_one(DevicePanel).bind(self.model)

    @property
    def model(self) -> RunModel:
        return self.app.model  # type: ignore[attr-defined]

    def visible_tabs(self) -> list[str]:
        return [t for t in TABS if t not in OPTIONAL_TABS or t in self._shown]

    def action_show_tab(self, tab: str) -> None:
        if tab in self.visible_tabs():
            self.query_one(TabbedContent).active = tab

    def action_next_tab(self, delta: int) -> None:
        tabs = self.visible_tabs()
        active = self.query_one(TabbedContent).active
        i = tabs.index(active) if active in tabs else 0
        self.query_one(TabbedContent).active = tabs[(i + delta) % len(tabs)]

    @on(TabbedContent.TabActivated)
    def _tab_activated(self, event: TabbedContent.TabActivated) -> None:
        tab = event.pane.id or ""
        self.update_panel(tab, force=True)
        panel = self.panel(tab)
        if panel is not None:
            panel.focus_main()

    def panel(self, tab: str) -> Any:
        try:
            return self.query_one(f"#{tab}-panel")
        except Exception:
            return None

    def update_panel(self, tab: str, force: bool = False) -> None:
        if tab not in self._dirty and not force:
            return
        self._dirty.discard(tab)
        panel = self.panel(tab)
        if panel is None:
            return
        panel.show(self.model)
        if tab == "detectors":
            self.query_one(NotesPanel).show(self.model)

    def apply(self, changed: set[str], status: str, role: str) -> None:
        """Fold a batch's changes into the panels; panels not on screen are redrawn when shown."""
        model = self.model
        try:
            header = self.query_one(RunHeader)
        except NoMatches:  # the app is closing: a batch the reader posted late has nothing to draw on
            return
        header.show(model, status, role)
        affected: set[str] = set()
        if changed & {"steps", "rewind", "findings", "header"}:
            affected.add("overview")
            # Charts are cheap and redraw only what is on screen.
            self.query_one(OverviewPanel).show(model)
        if changed & {"detectors", "findings"}:
            affected.add("detectors")
        if changed & {"recommendations", "header"}:
            affected.add("recommendations")
        if "samples" in changed or "header" in changed:
            affected.add("samples")
        if changed & {"moe", "steps", "rewind", "header"} and model.is_moe:
            affected.add("moe")
        if changed & {"steps", "rewind", "header"} and model.has_device:
            affected.add("device")
        self._dirty |= affected
        for tab, has in (("moe", model.is_moe), ("device", model.has_device)):
            if has and tab not in self._shown:
                self._shown.add(tab)
                self.query_one(TabbedContent).show_tab(tab)
        self._relabel()
        active = self.query_one(TabbedContent).active
        if active in self._dirty and active != "overview":
            self.update_panel(active)

    def _relabel(self) -> None:
        m = self.model
        counts = {
            "detectors": len(m.findings),
            "recommendations": len(m.recommendations),
            "samples": m.sample_count,
        }
        tc = self.query_one(TabbedContent)
        for i, t in enumerate(TABS):
            label = f"{i + 1} {TAB_TITLES[t]}" + (f" ({counts[t]})" if counts.get(t) else "")
            if self._labels.get(t) != label:
                self._labels[t] = label
                tc.get_tab(t).label = label


class WatchApp(App[None]):
    """The grpo-monitor dashboard for one run (live or finished) or any log ``analyze`` reads."""

    CSS_PATH = "app.tcss"
    TITLE = "grpo-monitor"
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("question_mark", "help", "Help"),
        Binding("t", "toggle_theme", "Theme"),
    ]

    def __init__(
        self, path: str | Path, poll_interval: float = POLL_INTERVAL, wait: bool = False,
        records: list[dict[str, Any]] | None = None, warnings: list[str] | None = None,
    ) -> None:
        super().__init__()
        self._replayed = records  # a foreign log already read by ``replay_source``
        self._replay_warnings = list(warnings or [])  # what its reader said about it
        self.path = Path(path)
        self.poll_interval = poll_interval
        # Without ``wait`` a log that cannot be read closes the app (``run_watch`` then reports
        # ``error`` in one line); with it the error is shown and a folder is still watched.
        self.wait = wait
        self.model = RunModel()
        self.status = "starting"
        self.status_role = "muted"
        self.caught_up = threading.Event()  # set once everything on disk at start is shown
        self.error: str | None = None
        self.batches = 0

    async def on_mount(self) -> None:
        await self.push_screen(DashboardScreen(id="dashboard"))
        self._follow()

    def _dashboard(self) -> DashboardScreen:
        for s in self.screen_stack:
            if isinstance(s, DashboardScreen):
                return s
        raise LookupError("dashboard not mounted")

    # -- reading the run -------------------------------------------------------------------
    @work(thread=True, exclusive=True, group="follow")
    def _follow(self) -> None:
        try:
            self._read_run()
        except Exception as exc:  # whatever the files hold, one line on screen, never a worker traceback
            text = " ".join(str(exc).split())
            self.post_message(SourceFailed(f"{self.path}: cannot read ({type(exc).__name__}{': ' + text if text else ''})"))

    def _read_run(self) -> None:
        worker = get_current_worker()
        wait = threading.Event()
        if self._replayed is not None:
            self.post_message(RecordsArrived(self._replayed, warnings=self._replay_warnings, caught_up=True))
            return
        if not is_run_path(self.path):
            warnings: list[str] = []
            try:
                records = replay_source(self.path, warnings)
            except Exception as exc:  # SourceError, or a reader that is not there
                self.post_message(SourceFailed(str(exc).splitlines()[0] if str(exc) else type(exc).__name__))
                if not self.path.is_dir():
                    return
                # A folder without a log yet may still become a run directory: keep watching it.
            else:
                self.post_message(RecordsArrived(records, warnings=warnings, caught_up=True))
                return
        tailer = RunTailer(self.path, index_samples=True, find_run=True)
        root = tailer.root
        caught_up = False
        last_wait: str | None = None
        last_skipped = 0
        while not worker.is_cancelled:
            batch = tailer.poll()
            if tailer.root != root:
                root = tailer.root
                self.post_message(RunFound(root))
            newly_caught_up = not batch.more and not caught_up and batch.waiting_for is None
            if batch or newly_caught_up or batch.waiting_for != last_wait or batch.skipped != last_skipped:
                self.post_message(
                    RecordsArrived(
                        batch.records, warnings=batch.warnings, waiting_for=batch.waiting_for,
                        caught_up=newly_caught_up, sample_indexes=batch.sample_indexes, skipped=batch.skipped,
                    )
                )
                caught_up |= newly_caught_up
                last_wait = batch.waiting_for
                last_skipped = batch.skipped
            if not batch.more:
                wait.wait(self.poll_interval)

    def on_run_found(self, message: RunFound) -> None:
        self.path = Path(message.run_dir)
        self.notify(str(self.path), title="following the run directory that appeared", timeout=6)

    def on_records_arrived(self, message: RecordsArrived) -> None:
        model = self.model
        changed = model.ingest(message.records)
        if message.sample_indexes is not None and model.set_sample_indexes(message.sample_indexes):
            changed.add("samples")
        first_warning = not model.warning_count
        if model.warn(message.warnings, message.skipped) and first_warning and model.warnings:
            self.notify(model.warnings[-1], title="the run's log has problems (see the header)", severity="warning", timeout=8)
        if message.waiting_for:
            self.status, self.status_role = f"waiting for {message.waiting_for}", "warning"
        elif model.source_format is not None:
            self.status, self.status_role = "replayed", "muted"
        elif model.finished:
            self.status, self.status_role = "finished", "muted"
        else:
            self.status, self.status_role = "live", "ok"
        self.batches += 1
        self._dashboard().apply(changed or {"header"}, self.status, self.status_role)
        if message.caught_up:
            self.caught_up.set()

    def on_source_failed(self, message: SourceFailed) -> None:
        self.error = message.error
        if not self.wait:
            self.exit(return_code=2)
            return
        self.status, self.status_role = f"cannot read: {message.error}", "critical"
        self._dashboard().apply(set(), self.status, self.status_role)
        self.notify(message.error, title="cannot read this log", severity="error", timeout=10)

    # -- actions ---------------------------------------------------------------------------
    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def action_toggle_theme(self) -> None:
        self.theme = THEMES[1] if self.theme == THEMES[0] else THEMES[0]

    def watch_theme(self, theme: str) -> None:
        # Table cells carry colours resolved from the theme: redraw them.
        try:
            dash = self._dashboard()
        except LookupError:
            return
        dash._dirty |= set(TABS)
        dash.apply({"steps", "findings", "recommendations", "samples", "detectors"}, self.status, self.status_role)
