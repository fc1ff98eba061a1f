"""Auto-restart: on a confirmed finding whose recommended change is new to the lineage, stop the run (on
every rank at the same step), checkpoint, and write the restart plan the next segment starts from.

A confirmed finding no configuration change cures (a reward function that never pays, an engine fault, a task
already solved) stops the run too, with the reason and what the run has cost so far, and no plan: training on
to ``max_steps`` would only spend compute, and no restart can do better. The lineage ends there."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from grpo_monitor.callbacks.options import RestartOptions, SegmentPlace
from grpo_monitor.core.catalogue import validate
from grpo_monitor.core.recommend import recommend
from grpo_monitor.core.restart import PLAN_FILE, RestartPlan, choose_checkpoint, segment_dir, write_plan
from grpo_monitor.detectors.base import Finding, RunContext


@dataclasses.dataclass(frozen=True)
class Halt:
    """A stop without a restart: the finding no configuration change cures, why, what to do instead, and its cost."""

    step: int
    detector: str
    severity: str
    reason: str
    advice: str
    cost: dict[str, Any]

    def record(self) -> dict[str, Any]:
        """The run log's note for it (``event: "stopped"``), which ``analyze`` reports as the run's status."""
        return {"type": "note", "step": self.step, "level": "warning", "event": "stopped", "detector": self.detector,
                "message": f"stopped by the monitor at step {self.step}: {self.detector} ({self.severity}) has no "
                           f"configuration cure left: {self.reason}", "advice": self.advice, "cost": self.cost}


def without_cure(finding: Finding, context: RunContext) -> bool:
    """A confirmed finding no ``GRPOConfig`` change cures: a critical one with neither a variant nor an override
    nor a remedy the recommender knows (a reward bug, an engine fault), or a task the diagnosis calls saturated
    (stopping is the advice itself), or one whose cure the run's config has already. A finding whose cure the
    restart budget leaves untried has one: the run trains on, as the budget says."""
    if finding.detector.startswith("config_") or finding.severity == "info":
        return False
    ev = finding.evidence or {}
    if ev.get("signal") == "saturated" and finding.detector == "no_learning_signal":
        return True
    return (finding.severity == "critical" and finding.variant is None and not finding.config_overrides
            and recommend(finding.to_dict(), context.config, is_moe=context.is_moe, tried=[]) is None)


logger = logging.getLogger("grpo_monitor")


class RestartPolicy:
    """Decides whether a step's findings stop the run, and builds the plan when they do."""

    def __init__(self, options: RestartOptions | None, place: SegmentPlace, lineage_root: Path, run_id: str) -> None:
        self.options = options
        self.place = place
        self.lineage_root = lineage_root
        self.run_id = run_id
        self.plan: RestartPlan | None = None
        self.halted: Halt | None = None
        # The command that relaunches this script after a stop, when nothing else will (a plain script with
        # ``attach(auto_restart=...)``, not under ``supervise`` or ``run_with_restarts``): said at the stop.
        self.relaunch_hint: str | None = None

    @property
    def active(self) -> bool:
        """Still watching: asked for, and not decided yet."""
        return self.options is not None and self.plan is None and self.halted is None

    def decide(self, args: Any, state: Any, findings: list[Finding], context: RunContext) -> RestartPlan | Halt | None:
        """The plan for the first finding whose recommendation is a change not yet tried, within the budget; else a
        halt for the first confirmed finding no change cures; else None (train on)."""
        if self.options is not None and self.place.restarts_done < self.options.max_restarts:
            for f in findings:
                rec = recommend(f.to_dict(), context.config, is_moe=context.is_moe, tried=list(self.place.tried))
                if rec is not None:
                    return self._plan(args, state, f, rec)
        for f in findings:
            if without_cure(f, context):
                ev = f.evidence or {}
                # A cure the run's config already has (a restart applied it) and the failure back: nothing left to change.
                cure = recommend(f.to_dict(), {}, is_moe=context.is_moe, tried=[])
                reason = (f"its configuration cure ({cure['variant']}) is in force already and it came back: {f.message}"
                          if cure is not None else f.message)
                return Halt(step=int(state.global_step), detector=f.detector, severity=f.severity, reason=reason,
                            advice=str(ev.get("advice") or "fix what the finding names, then start a new run"),
                            cost=dict(ev.get("cost") or {}))
        return None

    def _plan(self, args: Any, state: Any, finding: Finding, rec: dict[str, Any]) -> RestartPlan:
        diff = validate(rec["config_overrides"])
        place = self.place
        nxt = place.segment + 1
        output_dir = getattr(args, "output_dir", None)
        # Each segment trains into <first output_dir>/segment-<n>, so no checkpoint is overwritten.
        base_output = (Path(output_dir).parent if place.segment > 0 else Path(output_dir)) if output_dir else None
        return RestartPlan(
            segment=place.segment,
            step=int(state.global_step),
            variant=rec["variant"],
            config_overrides=diff,
            cumulative_overrides={k: v for k, v in {**place.applied_overrides, **diff}.items() if k != "output_dir"},
            resume_from=choose_checkpoint(output_dir, finding.onset_step, int(state.global_step),
                                          self.options.restart_from),
            onset_step=finding.onset_step,
            findings=[finding.to_dict()],
            reasons=rec["reasons"],
            tried=[*place.tried, rec["variant"]],
            parent_run=self.run_id,
            output_dir=output_dir,
            next_run_dir=str(segment_dir(self.lineage_root, nxt)),
            next_output_dir=str(Path(base_output) / f"segment-{nxt}") if base_output else None,
            restarts_done=place.restarts_done + 1,
        )

    def halt(self, halt: Halt, control: Any, main: bool) -> dict[str, Any]:
        """Stop with a checkpoint and no plan; on the main process say why and what it cost. The note to write."""
        self.halted = halt
        control.should_training_stop = True
        control.should_save = True
        if main:
            from grpo_monitor.core.cost import cost_phrase

            spent = cost_phrase(halt.cost) if halt.cost else ""
            logger.warning("grpo-monitor: stopping at step %d without a restart: %s (%s) has no configuration cure left. %s%s "
                           "Next: %s", halt.step, halt.detector, halt.severity, halt.reason,
                           f" Cost so far: {spent}." if spent else "", halt.advice)
        return halt.record()

    def stop(self, plan: RestartPlan, control: Any, run_dir: Path | None) -> dict[str, Any]:
        """Stop with a checkpoint (every checkpoint is kept); on the main process (``run_dir`` given) write
        the plan. Returns the run-log record of the restart."""
        self.plan = plan
        control.should_training_stop = True
        control.should_save = True
        if run_dir is not None:
            write_plan(run_dir, plan)
            logger.warning("grpo-monitor: stopping at step %d to restart with %s (%s); resume from %s",
                           plan.step, plan.variant, plan.config_overrides, plan.resume_from or "the initial model")
            if self.relaunch_hint:
                logger.warning("grpo-monitor: nothing relaunches this script by itself (the plan is in %s): run it "
                               "under the supervisor, which relaunches it with the variant's flags at each such "
                               "stop:  %s  (or train through grpo_monitor.run_with_restarts)",
                               run_dir / PLAN_FILE, self.relaunch_hint)
        return {"type": "restart", "step": plan.step, "variant": plan.variant,
                "config_overrides": plan.config_overrides, "resume_from": plan.resume_from,
                "child_run": Path(plan.next_run_dir).name, "reasons": plan.reasons}
