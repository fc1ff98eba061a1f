"""Findings in the experiment trackers the trainer reports to: W&B, trackio, TensorBoard, MLflow.

Each sink writes into the run the trainer's own integration opened (never a second one) and is
built only for the integrations in ``args.report_to``. The tracker library is imported here, on
first use: a tracker that is missing or raises costs its sink only (the dispatcher isolates it).

Every sink has two calls: ``event(message)`` for a finding, a resolved episode, a restart or a
crash, and ``summary(state)`` with the run's verdict, its findings and recommendations so far
(after each finding, and once more at the trainer's final log, while every integration still has
its run open). A tracker's library can take tens of milliseconds for one call (W&B building a
table, MLflow writing files), so the calls are made by ``TrackerWorker`` on a thread of its own:
the training thread only hands them over.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

TRACKERS = ("wandb", "trackio", "tensorboard", "mlflow")
FINDING_COLUMNS = ["severity", "detector", "step", "onset_step", "status", "message", "variant", "recommended"]
REC_COLUMNS = ["variant", "detector", "step", "python", "cli_flags", "config_overrides"]
VERDICT_LEVEL = {"healthy": 0, "warning": 1, "critical": 2}


def _has_class(obj: Any, name: str) -> bool:
    return any(c.__name__ == name for c in type(obj).__mro__)


def reported_trackers(trainer: Any) -> list[str]:
    """The trackers among ``TRACKERS`` this trainer reports to (``"all"`` means the integrations it
    actually built callbacks for)."""
    report_to = getattr(getattr(trainer, "args", None), "report_to", None) or []
    if isinstance(report_to, str):
        report_to = [report_to]
    names = [str(r).lower() for r in report_to]
    if "all" in names:
        cbs = getattr(getattr(trainer, "callback_handler", None), "callbacks", [])
        by_class = {"wandb": "WandbCallback", "trackio": "TrackioCallback", "tensorboard": "TensorBoardCallback",
                    "mlflow": "MLflowCallback"}
        names = [t for t, cls in by_class.items() if any(_has_class(cb, cls) for cb in cbs)]
    return [t for t in TRACKERS if t in names]


class SummaryState:
    """What a summary call hands each sink."""

    def __init__(self, step: int, verdict: str, findings: Sequence[Mapping[str, Any]], recs: Sequence[Mapping[str, Any]],
                 status: Mapping[tuple[str, Any], str], final: bool, delivery: Mapping[str, Any] | None = None) -> None:
        # Copies: the training thread goes on changing its own lists while a sink writes these.
        self.step, self.verdict, self.final = step, verdict, final
        self.findings, self.recs, self.status = [dict(f) for f in findings], [dict(r) for r in recs], dict(status)
        self.delivery = dict(delivery) if delivery else None

    def finding_rows(self) -> list[list[Any]]:
        recs = {(r.get("detector"), r.get("step")): r for r in self.recs}
        rows = []
        for f in self.findings:
            rec = recs.get((f["detector"], f["step"]))
            rows.append([f["severity"], f["detector"], int(f["step"]),
                         -1 if f.get("onset_step") is None else int(f["onset_step"]),
                         self.status.get((f["detector"], f.get("onset_step")), "open"), f.get("message", ""),
                         f.get("variant") or "", rec.get("python", "") if rec else ""])
        return rows

    def rec_rows(self) -> list[list[Any]]:
        return [[r.get("variant") or "", r.get("detector") or "", int(r.get("step") or 0), r.get("python") or "",
                 r.get("cli_flags") or "", json.dumps(r.get("config_overrides") or {}, sort_keys=True, default=str)]
                for r in self.recs]

    def markdown(self) -> str:
        out = [f"**Verdict: {self.verdict}** at step {self.step}", ""]
        if self.findings:
            out += ["| " + " | ".join(FINDING_COLUMNS) + " |", "|" + "---|" * len(FINDING_COLUMNS)]
            out += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in self.finding_rows()]
        else:
            out.append("No warning or critical finding.")
        totals = self.delivery_totals()
        if totals:
            out += ["", f"Alerts: {totals['messages']} message(s), {totals['delivered']} delivered, "
                        f"{totals['unconfirmed']} sent without an answer, {totals['lost']} lost"]
        if self.recs:
            out += ["", "**Recommendations**", ""]
            out += [f"- **{r.get('variant')}** (from {r.get('detector')} at step {r.get('step')}): `{r.get('python')}` — "
                    f"TRL flags `{r.get('cli_flags')}`" for r in self.recs]
        return "\n".join(out)

    def to_json(self) -> dict[str, Any]:
        out = {"verdict": self.verdict, "step": self.step, "final": self.final,
               "findings": [dict(f) for f in self.findings], "recommendations": [dict(r) for r in self.recs]}
        if self.delivery is not None:
            out["alerts_delivery"] = self.delivery
        return out

    def delivery_totals(self) -> dict[str, int]:
        """Over every destination: messages, delivered, unconfirmed, lost (empty without any)."""
        if not self.delivery:
            return {}
        keys = ("messages", "delivered", "unconfirmed", "lost")
        return {k: sum(int(d.get(k, 0)) for d in self.delivery.get("destinations", [])) for k in keys}


def _md_cell(v: Any) -> str:
    return str(v).replace("|", "\\|").replace("\n", " ")


class WandbSink:
    """``wandb.alert`` per event (warning → WARN, critical → ERROR, resolved → INFO), the findings
    and recommendations as ``wandb.Table``s, the verdict in the run summary."""

    name = "wandb"

    def __init__(self, trainer: Any) -> None:
        import wandb

        self.wandb = wandb
        self.run = wandb.run
        if self.run is None:
            raise RuntimeError("no W&B run is open (the trainer's WandbCallback opens it)")

    def event(self, m: Mapping[str, Any]) -> None:
        level = {"critical": self.wandb.AlertLevel.ERROR, "warning": self.wandb.AlertLevel.WARN}.get(m["level"], self.wandb.AlertLevel.INFO)
        # W&B titles are under 64 characters; the wait only guards against W&B's own de-duplication
        # by title, since episodes are already de-duplicated here.
        self.run.alert(title=_title(m)[:63], text=m["text"], level=level, wait_duration=1)

    def summary(self, s: SummaryState) -> None:
        data: dict[str, Any] = {"train/global_step": s.step}
        if s.findings:
            data["grpo_monitor/findings"] = self.wandb.Table(columns=FINDING_COLUMNS, data=s.finding_rows())
        if s.recs:
            data["grpo_monitor/recommendations"] = self.wandb.Table(columns=REC_COLUMNS, data=s.rec_rows())
        if len(data) > 1:
            self.run.log(data)
        self.run.summary.update({"grpo_monitor/verdict": s.verdict, "grpo_monitor/findings_count": len(s.findings),
                                 "grpo_monitor/recommended": ", ".join(r.get("variant") or "" for r in s.recs),
                                 **{f"grpo_monitor/alerts_{k}": v for k, v in s.delivery_totals().items()}})


class TrackioSink:
    """``trackio.alert`` with the matching ``AlertLevel``; the verdict and the findings table logged
    at the trainer's current trackio step (no extra step on its axis)."""

    name = "trackio"

    def __init__(self, trainer: Any) -> None:
        import trackio
        from trackio import context_vars

        self.trackio = trackio
        self.context_vars = context_vars
        self.run = context_vars.current_run.get()
        if self.run is None:
            raise RuntimeError("no trackio run is open (the trainer's TrackioCallback opens it)")

    def event(self, m: Mapping[str, Any]) -> None:
        lv = self.trackio.AlertLevel
        level = {"critical": lv.ERROR, "warning": lv.WARN}.get(m["level"], lv.INFO)
        if self.context_vars.current_run.get() is self.run:
            self.trackio.alert(_title(m), m["text"], level)
        else:  # the integration finished its run already: still that run, never a new one
            self.run.alert(title=_title(m), text=m["text"], level=level)

    def summary(self, s: SummaryState) -> None:
        data: dict[str, Any] = {"grpo_monitor/verdict": s.verdict, "grpo_monitor/verdict_level": VERDICT_LEVEL[s.verdict],
                                "grpo_monitor/findings_count": len(s.findings)}
        if s.findings:
            data["grpo_monitor/findings"] = self.trackio.Table(columns=FINDING_COLUMNS, data=s.finding_rows())
        if s.recs:
            data["grpo_monitor/recommendations"] = self.trackio.Table(columns=REC_COLUMNS, data=s.rec_rows())
        step = max(int(getattr(self.run, "_next_step", 1)) - 1, 0)
        self.run.log(data, step=step)


class TensorBoardSink:
    """The findings table, recommendations and verdict as text summaries in the trainer's own
    event file (the writer its ``TensorBoardCallback`` holds). Each finding's own text is already
    written per step by the callback (``grpo_monitor/findings``)."""

    name = "tensorboard"

    def __init__(self, trainer: Any) -> None:
        cbs = getattr(getattr(trainer, "callback_handler", None), "callbacks", [])
        self.cb = next((cb for cb in cbs if _has_class(cb, "TensorBoardCallback")), None)
        if self.cb is None:
            raise RuntimeError("the trainer has no TensorBoardCallback")
        self._own: Any = None

    def _writer(self) -> Any:
        writer = getattr(self.cb, "tb_writer", None)
        if writer is not None:
            return writer
        if self._own is None and getattr(self.cb, "logging_dir", None) and getattr(self.cb, "_SummaryWriter", None):
            self._own = self.cb._SummaryWriter(log_dir=self.cb.logging_dir)  # same directory as the scalars
        return self._own

    def event(self, m: Mapping[str, Any]) -> None:
        # Findings are written with their step's scalars by the callback; the rest of the story here.
        if m["event"] in ("resolved", "restart", "crash"):
            writer = self._writer()
            if writer is not None:
                writer.add_text("grpo_monitor/alerts", f"**{m['title']}**\n\n{m['text']}", m.get("step") or 0)
                writer.flush()

    def summary(self, s: SummaryState) -> None:
        writer = self._writer()
        if writer is None:
            return
        writer.add_text("grpo_monitor/findings_table", s.markdown(), s.step)
        if s.recs:
            writer.add_text("grpo_monitor/recommendations", "\n".join(
                f"- **{r.get('variant')}**: `{r.get('python')}` — `{r.get('cli_flags')}`" for r in s.recs), s.step)
        writer.add_text("grpo_monitor/verdict", s.verdict, s.step)
        totals = s.delivery_totals()
        if totals:
            writer.add_text("grpo_monitor/alerts_delivery", json.dumps(totals), s.step)
        writer.flush()

    def close(self) -> None:
        if self._own is not None:
            self._own.close()


class MlflowSink:
    """Findings as tags of the trainer's active MLflow run, one set per episode
    (``grpo_monitor.<detector>.<step it opened>.<warning|critical|resolved>``) beside the detector's
    current ``grpo_monitor.<detector>.state``, a restart or a crash as ``grpo_monitor.restart`` /
    ``grpo_monitor.crash``, the verdict as ``grpo_monitor.verdict``, and ``grpo_monitor/findings.json``
    / ``findings.md`` artifacts."""

    name = "mlflow"

    def __init__(self, trainer: Any) -> None:
        import mlflow

        run = mlflow.active_run()
        if run is None:
            raise RuntimeError("no MLflow run is active (the trainer's MLflowCallback starts it)")
        self.run_id = run.info.run_id
        # The client writes by run id, so the run stays ours after the integration ends it.
        self.client = mlflow.MlflowClient(tracking_uri=mlflow.get_tracking_uri())

    def event(self, m: Mapping[str, Any]) -> None:
        if m["event"] in ("restart", "crash"):
            self.client.set_tag(self.run_id, f"grpo_monitor.{m['event']}", f"{m['title']}: {m['text']}"[:5000])
            return
        f = m["finding"] or {}
        det = f.get("detector")
        opened = (m.get("episode") or {}).get("opened_at", f.get("step"))
        if m["event"] == "resolved":
            stage, value = "resolved", f"step {m.get('resolved_step')} (the episode reached {f.get('severity')} at step {f.get('step')})"
            state = f"resolved at step {m.get('resolved_step')}"
        else:
            onset = f" (onset ~{f['onset_step']})" if f.get("onset_step") is not None else ""
            stage, value = f["severity"], f"step {f.get('step')}{onset}: {f.get('message', '')}"
            state = f"{f['severity']} since step {opened}"
        # Each episode under its own opening step: a reopened detector never overwrites the one before.
        self.client.set_tag(self.run_id, f"grpo_monitor.{det}.{opened}.{stage}", value[:5000])
        self.client.set_tag(self.run_id, f"grpo_monitor.{det}.state", state)

    def summary(self, s: SummaryState) -> None:
        self.client.set_tag(self.run_id, "grpo_monitor.verdict", s.verdict)
        self.client.set_tag(self.run_id, "grpo_monitor.findings_count", str(len(s.findings)))
        if s.recs:
            self.client.set_tag(self.run_id, "grpo_monitor.recommended", ", ".join(r.get("variant") or "" for r in s.recs))
        for k, v in s.delivery_totals().items():
            self.client.set_tag(self.run_id, f"grpo_monitor.alerts_{k}", str(v))
        self.client.log_text(self.run_id, json.dumps(s.to_json(), indent=1, default=str), "grpo_monitor/findings.json")
        self.client.log_text(self.run_id, s.markdown(), "grpo_monitor/findings.md")


SINKS = {"wandb": WandbSink, "trackio": TrackioSink, "tensorboard": TensorBoardSink, "mlflow": MlflowSink}


def _title(m: Mapping[str, Any]) -> str:
    """A short title for tracker alerts: ``grpo-monitor critical: entropy_collapse``."""
    f = m.get("finding") or {}
    if m["event"] in ("finding", "resolved"):
        return f"grpo-monitor {m['level']}: {f.get('detector', '')}"
    return str(m["title"])


def build_sinks(trainer: Any, names: Iterable[str], on_error: Any) -> list[Any]:
    sinks = []
    for name in names:
        try:
            sinks.append(SINKS[name](trainer))
        except Exception as exc:
            on_error(f"alerts to {name}", exc)
    return sinks


class TrackerWorker:
    """Makes the sinks' calls on a daemon thread, in the order they were handed over; of the summaries
    only the latest is written (each one holds everything before it). A sink that raises is dropped
    and its error kept for the training thread (``take_errors``)."""

    def __init__(self, sinks: Sequence[Any]) -> None:
        self.sinks = list(sinks)
        self._events: deque[Mapping[str, Any]] = deque()
        self._summary: SummaryState | None = None
        self._busy = False
        self._errors: list[tuple[str, BaseException]] = []
        self._cv = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="grpo-monitor-trackers", daemon=True)
        self._thread.start()

    def event(self, m: Mapping[str, Any]) -> None:
        with self._cv:
            self._events.append(m)
            self._cv.notify()

    def summary(self, state: SummaryState) -> None:
        with self._cv:
            self._summary = state
            self._cv.notify()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._events and self._summary is None:
                    self._busy = False
                    self._cv.notify_all()
                    self._cv.wait()
                self._busy = True
                if self._events:
                    method, arg = "event", self._events.popleft()
                else:
                    method, arg, self._summary = "summary", self._summary, None
            for sink in list(self.sinks):
                fn = getattr(sink, method, None)
                if fn is None:
                    continue
                try:
                    fn(arg)
                except Exception as exc:
                    with self._cv:
                        self.sinks = [s for s in self.sinks if s is not sink]
                        self._errors.append((f"alerts to {sink.name}", exc))

    def drain(self, deadline: float) -> bool:
        """Wait until every call handed over is made, or ``deadline`` (``time.monotonic()``)."""
        with self._cv:
            while self._events or self._summary is not None or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(left)
        return True

    def take_errors(self) -> list[tuple[str, BaseException]]:
        with self._cv:
            out, self._errors = self._errors, []
        return out

    def close(self, deadline: float) -> list[tuple[str, BaseException]]:
        """Drain, then let each sink close what it opened; the errors not yet taken."""
        self.drain(deadline)
        for sink in list(self.sinks):
            close = getattr(sink, "close", None)
            if close is not None:
                try:
                    close()
                except Exception as exc:
                    self._errors.append((f"alerts to {sink.name}", exc))
        return self.take_errors()
