"""Findings in the experiment trackers the trainer reports to: W&B, trackio, TensorBoard, MLflow.

Each sink writes into the run the trainer's own integration opened (never a second one) and is
built only for the integrations in ``args.report_to``. The tracker library is imported here, on
first use: a tracker that is missing or raises costs its sink only (the dispatcher isolates it).

Every sink has two calls: ``event(message)`` for a finding or a resolved episode, and
``summary(state)`` with the run's verdict, its findings and recommendations so far (after each
finding, and once more at the trainer's final log, while every integration still has its run open).
"""

from __future__ import annotations

import json
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
                 status: Mapping[tuple[str, Any], str], final: bool) -> None:
        self.step, self.verdict, self.findings, self.recs, self.status, self.final = step, verdict, findings, recs, status, final

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
        if self.recs:
            out += ["", "**Recommendations**", ""]
            out += [f"- **{r.get('variant')}** (from {r.get('detector')} at step {r.get('step')}): `{r.get('python')}` — "
                    f"TRL flags `{r.get('cli_flags')}`" for r in self.recs]
        return "\n".join(out)

    def to_json(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "step": self.step, "final": self.final,
                "findings": [dict(f) for f in self.findings], "recommendations": [dict(r) for r in self.recs]}


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
                                 "grpo_monitor/recommended": ", ".join(r.get("variant") or "" for r in s.recs)})


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
        if m["event"] == "resolved":
            writer = self._writer()
            if writer is not None:
                writer.add_text("grpo_monitor/alerts", f"**{m['title']}**\n\n{m['text']}", m.get("resolved_step") or 0)
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
        writer.flush()

    def close(self) -> None:
        if self._own is not None:
            self._own.close()


class MlflowSink:
    """Findings as tags of the trainer's active MLflow run (``grpo_monitor.<detector>.<warning|critical|resolved>``,
    ``grpo_monitor.verdict``) and ``grpo_monitor/findings.json`` / ``findings.md`` artifacts."""

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
        f = m["finding"] or {}
        if m["event"] == "resolved":
            key, value = "resolved", f"step {m.get('resolved_step')} (the episode reached {f.get('severity')} at step {f.get('step')})"
        else:
            onset = f" (onset ~{f['onset_step']})" if f.get("onset_step") is not None else ""
            key, value = f["severity"], f"step {f.get('step')}{onset}: {f.get('message', '')}"
        # One tag per detector and stage (warning, critical, resolved); the latest episode's wins.
        self.client.set_tag(self.run_id, f"grpo_monitor.{f.get('detector')}.{key}", value[:5000])

    def summary(self, s: SummaryState) -> None:
        self.client.set_tag(self.run_id, "grpo_monitor.verdict", s.verdict)
        self.client.set_tag(self.run_id, "grpo_monitor.findings_count", str(len(s.findings)))
        if s.recs:
            self.client.set_tag(self.run_id, "grpo_monitor.recommended", ", ".join(r.get("variant") or "" for r in s.recs))
        self.client.log_text(self.run_id, json.dumps(s.to_json(), indent=1, default=str), "grpo_monitor/findings.json")
        self.client.log_text(self.run_id, s.markdown(), "grpo_monitor/findings.md")


SINKS = {"wandb": WandbSink, "trackio": TrackioSink, "tensorboard": TensorBoardSink, "mlflow": MlflowSink}


def _title(m: Mapping[str, Any]) -> str:
    """A short title for tracker alerts: ``critical: entropy_collapse``."""
    f = m.get("finding") or {}
    return f"grpo-monitor {m['level']}: {f.get('detector', '')}"


def build_sinks(trainer: Any, names: Iterable[str], on_error: Any) -> list[Any]:
    sinks = []
    for name in names:
        try:
            sinks.append(SINKS[name](trainer))
        except Exception as exc:
            on_error(f"alerts to {name}", exc)
    return sinks
