"""The run header: model, key configuration, segment and restarts, live status."""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from rich.text import Text
from textual.widgets import Static

from grpo_monitor.detectors.stall import stall_status
from grpo_monitor.app.dashboard.model import RunModel
from grpo_monitor.app.dashboard.text import visible
from grpo_monitor.app.dashboard.widgets.common import role_style


def _g(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, float):
        return f"{v:g}"
    return visible(v)


class RunHeader(Static):
    """Two lines: who and where the run is, then the configuration that decides its behaviour."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__("", markup=False, **kwargs)
        self._last: Text | None = None
        self._lines = -1
        self._step_times: deque[tuple[int, float]] = deque(maxlen=64)
        self._shown: tuple[RunModel, str, str] | None = None

    # A stalled run sends nothing: the header looks again on its own.
    STALL_CHECK_S = 5.0

    def on_mount(self) -> None:
        self.set_interval(self.STALL_CHECK_S, self._recheck)

    def _recheck(self) -> None:
        if self._shown is not None:
            self.show(*self._shown)

    def _stall(self, model: RunModel) -> str | None:
        """"stalled: no step for ..." while a live run's newest step is older than k times its median interval."""
        rec = model.last_step
        if not rec or model.finished or model.source_format is not None:
            return None
        store = model.store
        if store.has("system/wall_time"):  # the whole history's clock, there from the first read
            lo = max(0, store.n - 64)
            walls, steps = store.column("system/wall_time")[lo:], store.steps[lo:]
            pairs = [(int(a), float(b)) for a, b in zip(steps, walls) if b == b]
            status = stall_status(pairs, time.time())
            return status.text() if status is not None else None
        step, t = rec.get("step"), rec.get("time")
        times = self._step_times
        if type(step) is int and isinstance(t, (int, float)) and not isinstance(t, bool):
            if times and step < times[-1][0]:
                times.clear()  # a new segment counts from its own steps
            if not times or step > times[-1][0]:
                times.append((step, float(t)))
        status = stall_status(times, time.time())
        return status.text() if status is not None else None

    def _judgement(self, model: RunModel) -> tuple[str, str] | None:
        """A warning when no failure detector can judge what the run logs (as ``analyze`` reports
        it; the Detectors panel shows each one's state), recomputed only when the logged names or
        the detectors' states change."""
        try:
            from grpo_monitor.analysis.replay import judgement_line

            cov, found = model.coverage()
            judged: tuple[str, str] | None = judgement_line(cov, found)
            if judged[1] != "warning":
                judged = None
        except Exception:  # the header must draw whatever the coverage check makes of an odd log
            judged = None
        return judged

    WARNING_CHARS = 200

    def _warnings(self, model: RunModel) -> str | None:
        """One line: how many warnings the readers and the run's notes gave, how many lines of the
        run's files were left out as not records, and the newest warning."""
        if not model.warning_count and not model.skipped:
            return None
        parts = []
        if model.warning_count:
            parts.append(f"{model.warning_count} warning{'s' if model.warning_count != 1 else ''}")
        if model.skipped:
            parts.append(f"{model.skipped} unreadable record{'s' if model.skipped != 1 else ''} skipped")
        text = "⚠ " + " · ".join(parts)
        if model.warnings:
            latest = visible(model.warnings[-1])
            if len(latest) > self.WARNING_CHARS:
                latest = latest[: self.WARNING_CHARS - 1] + "…"
            text += f" — latest: {latest}"
        return text

    def show(self, model: RunModel, status: str, status_role: str) -> None:
        self._shown = (model, status, status_role)
        app = self.app
        t = Text(no_wrap=False)
        t.append("● ", role_style(app, status_role))
        h = model.header
        t.append(visible(h.get("run_id") or "run"), role_style(app, "primary", bold=True))
        t.append(f"  {status}", role_style(app, status_role))
        if model.store.n:
            t.append(f"  step {int(model.store.steps[-1])}")
        restarts = len(model.restarts)
        t.append(f"  seg {model.segment} · {restarts} restart{'s' if restarts != 1 else ''}", role_style(app, "muted"))
        mi = model.model_info
        if mi.get("class"):
            t.append("  " + visible(mi["class"]))
        if model.is_moe:
            e, k = mi.get("num_experts"), mi.get("top_k")
            t.append(" MoE" + (f" {e}×top{k}" if e and k else ""), role_style(app, "accent"))
        if model.source_format:
            t.append(f"  ({visible(model.source_format)})", role_style(app, "muted"))
        judged = self._judgement(model)
        if judged is not None:
            t.append(f"  {judged[0]}", role_style(app, judged[1]))
        stalled = self._stall(model)
        if stalled is not None:
            t.append(f"  {stalled}", role_style(app, "warning"))
        t.append("\n")
        cfg = model.config
        items = [
            ("loss_type", "loss_type"),
            ("G", "num_generations"),
            ("lr", "learning_rate"),
            ("β", "beta"),
            ("max_len", "max_completion_length"),
            ("IS", "importance_sampling_level"),
        ]
        first = True
        for label, key in items:
            if key in cfg:
                if not first:
                    t.append(" · ", role_style(app, "muted"))
                first = False
                t.append(f"{label} ", role_style(app, "muted"))
                t.append(_g(cfg[key]))
        if "epsilon" in cfg:
            eh = cfg.get("epsilon_high")
            t.append(" · ε " if not first else "ε ", role_style(app, "muted"))
            t.append(_g(cfg["epsilon"]) + ("/" + _g(eh) if eh is not None else ""))
            first = False
        if first:
            t.append("no configuration recorded", role_style(app, "muted"))
        warned = self._warnings(model)
        if warned:
            t.append("\n")
            t.append(warned, role_style(app, "warning"))
        if t == self._last:
            return
        # A new step number must not cost a layout pass over the whole screen: only a change in
        # the number of wrapped lines does.
        width = self.content_region.width or self.app.size.width
        lines = len(t.wrap(self.app.console, max(1, width)))
        self.update(t, layout=lines != self._lines)
        self._last, self._lines = t, lines
