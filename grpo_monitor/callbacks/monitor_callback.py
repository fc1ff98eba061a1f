"""The training-side monitor: a ``TrainerCallback`` that streams every logged step into the run
directory and through the detectors.

Per logging step it normalises the metrics TRL passes to ``on_log``, adds the monitor's own
(MoE routing, per-sample statistics), attaches the completions the reward tap recorded since the
last log, runs the engine, and appends step, sample and finding records. Rank 0 writes the
shared files; every rank writes its own samples. Any exception inside the monitor is logged once
per component and the training goes on.
"""

from __future__ import annotations

import logging
import os
import platform
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from grpo_monitor.callbacks.model_facts import model_facts
from grpo_monitor.callbacks.reward_tap import (
    _CORRECT_HINTS,
    _FORMAT_HINTS,
    RewardTap,
    SampleRetention,
    exchange_size,
    guess_component,
    pack_samples,
    unpack_samples,
)
from grpo_monitor.detectors.base import Detector, RunContext
from grpo_monitor.alerts import build_dispatcher, redact
from grpo_monitor.core.engine import Engine
from grpo_monitor.core.telemetry import system_metrics
from grpo_monitor.core.metrics import SUMMARY_KEYS, normalize_metrics
from grpo_monitor.core.recommend import Recommender
from grpo_monitor.core.recommend import title as rec_title
from grpo_monitor.core.runlog import RunWriter, _jsonable, batch_index

logger = logging.getLogger("grpo_monitor")
# Detector states as TensorBoard scalars: a flat line at 0 is healthy.
TB_STATE_CODES = {"warming_up": 0.0, "ok": 0.0, "warning": 1.0, "critical": 2.0, "disabled": -1.0}


def library_versions() -> dict[str, str | None]:
    from importlib import metadata

    out: dict[str, str | None] = {"python": platform.python_version()}
    for dist in ("grpo-monitor", "trl", "transformers", "torch", "accelerate", "datasets", "numpy"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def sample_metrics(samples: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Per-step statistics of the step's completions that TRL does not log."""
    if not samples:
        return {}
    out: dict[str, float] = {"samples/count": float(len(samples))}
    correct = [s["length"] for s in samples if s.get("correct") is True]
    wrong = [s["length"] for s in samples if s.get("correct") is False]
    if correct:
        out["samples/mean_length_correct"] = sum(correct) / len(correct)
    if wrong:
        out["samples/mean_length_incorrect"] = sum(wrong) / len(wrong)
    if correct or wrong:
        out["samples/correct_frac"] = len(correct) / (len(correct) + len(wrong))
    return out


class MonitorCallback(TrainerCallback):
    def __init__(
        self,
        trainer: Any,
        run_dir: str | os.PathLike[str],
        detectors: Sequence[Detector] | None = None,
        correctness_reward: str | None = None,
        format_reward: str | None = None,
        correct_threshold: float = 0.0,
        parent_run: str | None = None,
        moe_probe_every: int = 10,
        router_tap: bool = True,
        max_text_chars: int = 2000,
        sample_text: Any = "default",
        auto_restart: bool = False,
        max_restarts: int = 2,
        restart_from: str = "before_onset",
        segment: int = 0,
        tried: Sequence[str] = (),
        applied_overrides: dict[str, Any] | None = None,
        restarts_done: int = 0,
        lineage_root: str | os.PathLike[str] | None = None,
        alerts: Any = None,
    ) -> None:
        from grpo_monitor.core.restart import RESTART_FROM

        if restart_from not in RESTART_FROM:
            raise ValueError(f"restart_from must be one of {RESTART_FROM}, got {restart_from!r}")
        if max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {max_restarts}")
        self.trainer = trainer
        self.run_dir = Path(run_dir)
        self.correct_threshold = correct_threshold
        self.parent_run = parent_run
        self.moe_probe_every = moe_probe_every
        self.use_router_tap = bool(router_tap)
        self.max_text_chars = max_text_chars
        self.sample_text = SampleRetention.of(sample_text)
        self.exchange_bytes = 0  # what this rank sent at the last log (numbers of its completions)
        self.auto_restart = bool(auto_restart)
        self.max_restarts = int(max_restarts)
        self.restart_from = restart_from
        self.segment = int(segment)
        self.tried = list(tried)
        self.applied_overrides = dict(applied_overrides or {})
        self.restarts_done = int(restarts_done)
        self.lineage_root = Path(lineage_root) if lineage_root is not None else self.run_dir
        self.restart_plan: Any = None
        self.run_id = uuid.uuid4().hex[:12]
        self.recommender: Any = None
        self.errors: dict[str, str] = {}
        self._tb: Any = None
        self.writer: RunWriter | None = None
        self.router_tap: Any = None
        self.last_step_written = -1
        self._digest: list[Any] = []
        self._ranks_disagreed = False
        self.alert_options = alerts  # a webhook URL, False, or alert options (monitor.alerts)
        self.alerts: Any = None
        args = trainer.args
        self.reward_names = list(getattr(trainer, "reward_func_names", []) or [])
        self.correctness_reward = correctness_reward or guess_component(self.reward_names, _CORRECT_HINTS)
        self.format_reward = format_reward or guess_component(self.reward_names, _FORMAT_HINTS)
        self.context = RunContext(
            config={},
            model={},
            reward_names=self.reward_names,
            correctness_reward=self.correctness_reward,
            format_reward=self.format_reward,
            logging_steps=int(getattr(args, "logging_steps", 1) or 1),
        )
        self._detectors = detectors
        self.engine: Engine | None = None
        self.reward_tap = self._install_reward_tap()

    # -- fault isolation -------------------------------------------------------------------

    def report_error(self, component: str, exc: BaseException) -> None:
        """Log a monitor fault once per component; the run is never interrupted by it."""
        if component in self.errors:
            return
        self.errors[component] = f"{type(exc).__name__}: {exc}"
        logger.warning("grpo-monitor: %s failed (%s: %s); training continues", component, type(exc).__name__, exc)
        if self.writer is not None and component != "run log":
            try:
                self.writer.write({"type": "note", "step": None, "level": "warning",
                                   "message": f"{component} failed: {type(exc).__name__}: {exc}"})
            except Exception:
                pass

    def _guard(self, component: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as exc:
            self.report_error(component, exc)
            return None

    # -- set-up ---------------------------------------------------------------------------

    def _install_reward_tap(self) -> RewardTap | None:
        trainer = self.trainer
        funcs = getattr(trainer, "reward_funcs", None)
        if not funcs:
            return None
        tokenizer = getattr(trainer, "_tokenizer", None) or getattr(trainer, "processing_class", None)
        eos = list(getattr(trainer, "eos_token_ids", None) or [getattr(tokenizer, "eos_token_id", None)])
        pad = getattr(tokenizer, "pad_token_id", None)
        tap = RewardTap(
            names=self.reward_names,
            num_generations=getattr(trainer, "num_generations", None) or trainer.args.num_generations,
            eos_and_pad=[*eos, pad],
            process_index=getattr(trainer.args, "process_index", 0),
            correctness_reward=self.correctness_reward,
            correct_threshold=self.correct_threshold,
            max_text_chars=self.max_text_chars,
            on_error=self.report_error,
        )
        import torch.nn as nn

        for i, (func, name) in enumerate(zip(list(funcs), self.reward_names)):
            if isinstance(func, nn.Module) or hasattr(func, "__grpo_monitor_tap__"):
                continue  # reward models are called on tokenized text, not completion ids
            funcs[i] = tap.wrap(func, name)
        return tap

    def on_train_begin(self, args, state, control, **kwargs):
        self._guard("run log", self._begin, args, state, kwargs.get("model"))
        if "learning_rate" in self.applied_overrides and int(state.global_step) > 0:
            self._guard("restart learning rate", self._reapply_learning_rate, args, kwargs)

    def _reapply_learning_rate(self, args: Any, kwargs: dict[str, Any]) -> None:
        # Resumed from a checkpoint, the optimizer and scheduler came back at their saved rates.
        from grpo_monitor.core.restart import reapply_learning_rate

        if reapply_learning_rate(kwargs.get("optimizer"), kwargs.get("lr_scheduler"), float(args.learning_rate)):
            logger.warning("grpo-monitor: resumed at learning_rate=%g (the checkpoint's optimizer had its old rate)",
                           float(args.learning_rate))

    def _begin(self, args: Any, state: Any, model: Any) -> None:
        rank = int(getattr(args, "process_index", 0))
        model = model if model is not None else self.trainer.model
        facts = self._guard("model facts", model_facts, model) or {}
        config = _jsonable(args.to_dict())
        self.context.config = config
        self.context.model = facts
        self.engine = Engine(self.context, self._detectors, on_error=self.report_error)
        self.recommender = Recommender(config, is_moe=self.context.is_moe, tried=self.tried, segment=self.segment)
        # A write that fails (the disk full) is reported once; the writer counts what it lost and says so in the log.
        self.writer = RunWriter(self.run_dir, rank=rank if not state.is_world_process_zero else 0, on_error=self.report_error)
        if state.is_world_process_zero:
            self.writer.header(
                run_id=self.run_id,
                start_time=time.time(),
                versions=library_versions(),
                config=config,
                model=facts,
                world_size=int(getattr(args, "world_size", 1)),
                parent_run=self.parent_run,
                reward_funcs=self.reward_names,
                correctness_reward=self.correctness_reward,
                format_reward=self.format_reward,
                resumed_from_step=int(state.global_step),
                argv=redact(sys.argv, self.alert_options),  # a webhook URL on the command line stays out of the log
                segment=self.segment,
                applied_overrides=self.applied_overrides,
                tried_variants=self.tried,
                auto_restart=self.auto_restart,
            )
            lint_findings = self._guard("lint", self._lint, state) or []
            if lint_findings:
                # A pre-flight finding that names a variant carries its diff like any other finding.
                recs = self._guard("recommendations", lambda: [
                    r for r in (self.recommender(f.to_dict()) for f in lint_findings) if r is not None]) or []
                self.writer.write(*({"type": "finding", **f.to_dict()} for f in lint_findings), *recs)
            for f in lint_findings:
                # logging_steps > 1 is said once, here, in one line: detection is coarser, nothing else changes.
                logger.log(logging.INFO if f.severity == "info" and f.detector != "config_logging_steps" else logging.WARNING,
                           "grpo-monitor: [%s] %s: %s", f.severity, f.detector, f.message)
        if state.is_world_process_zero:
            self.alerts = self._guard("alerts", build_dispatcher, self.trainer, self.run_dir, self.run_id,
                                      self.alert_options, self.report_error)
        if facts.get("is_moe"):
            self._guard("router tap", self._install_router_tap, model)

    def _lint(self, state: Any) -> list[Any]:
        from grpo_monitor.preflight.lint import lint_trainer

        return lint_trainer(self.trainer, first_run=not self.parent_run and int(state.global_step) == 0)

    def _install_router_tap(self, model: Any) -> None:
        if not self.use_router_tap:
            return
        from grpo_monitor.callbacks.router_tap import RouterTap

        tap = RouterTap.for_model(model, probe_every=self.moe_probe_every)
        if tap is None:
            return
        tap.install()
        self.router_tap = tap

    # -- per step -------------------------------------------------------------------------

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs:
            step = int(state.global_step)
            local = (self._guard("reward tap", self.reward_tap.drain, step) or []) if self.reward_tap else []
            # Every rank reaches this collective at every log, whatever failed above: a rank that
            # skipped it would leave the others waiting forever.
            batch, digests, self.exchange_bytes = _share_across_ranks(local, self._digest, self.report_error)
            if self.reward_tap is not None:
                self._guard("samples", self._keep_text, step, local, batch)
            findings = self._guard("step record", self._log, state, dict(logs), local, batch)
            self._digest = [(f.detector, f.severity, f.step) for f in findings or []]
            if digests is not None and state.is_world_process_zero:
                self._guard("rank agreement", self._check_agreement, step, digests)
            if self.auto_restart and self.restart_plan is None:
                self._guard("auto-restart", self._maybe_restart, args, state, control, findings or [])
        return control

    def _keep_text(self, step: int, local: list[dict[str, Any]], merged: list[dict[str, Any]]) -> None:
        """Text excerpts for the completions the retention policy picks from the whole step."""
        tap = self.reward_tap
        try:
            keep = self.sample_text.select(merged, step) if merged else set()
        except Exception:
            tap.add_text((), None)  # let go of the step's texts, then report
            raise
        tap.add_text(local, lambda r: (r.get("rank"), r.get("index")) in keep)

    def _log(self, state: Any, logs: dict[str, Any], local: list[dict[str, Any]], samples: list[dict[str, Any]]) -> list[Any]:
        """One step record: ``local`` are this rank's samples (its own file), ``samples`` the
        whole step's from every rank, which the detectors see on every rank alike."""
        step = int(state.global_step)
        writer = self.writer
        if writer is None:
            return []
        if SUMMARY_KEYS & logs.keys():
            writer.write({"type": "summary", "step": step, "metrics": normalize_metrics(logs)})
            if self.alerts is not None:  # the trainer's last log: every tracker still has its run open
                self._guard("alerts", self.alerts.finish, step)
            return []
        metrics = normalize_metrics(logs)
        metrics.update(self._guard("system metrics", system_metrics, True) or {})
        if local:
            self._guard("samples", writer.samples, local)
        if samples:
            metrics.update(sample_metrics(samples))
        now = time.time()
        # The wall clock as a metric too: detectors see metrics only, and a stall shows in its gaps.
        metrics["system/wall_time"] = now
        record: dict[str, Any] = {"type": "step", "step": step, "time": now, "metrics": metrics}
        if self.router_tap is not None:
            moe = self._guard("router tap", self.router_tap.collect, step)
            if moe:
                metrics.update(moe)
                loads = getattr(self.router_tap, "layer_loads", None)
                if loads:
                    record["moe_load"] = loads
        findings = self.engine.update(step, metrics, samples) if self.engine is not None else []
        if self.engine is not None:
            record["detectors"] = self.engine.state_names()
        recs = [r for r in (self.recommender(f.to_dict()) for f in findings) if r is not None]
        if state.is_world_process_zero and self.engine is not None:
            self._guard("tensorboard", self._to_tensorboard, step, record.get("detectors", {}), findings, recs)
        if state.is_world_process_zero:
            writer.write(record, *({"type": "finding", **f.to_dict()} for f in findings), *recs)
            for f in findings:
                logger.warning("grpo-monitor: [%s] %s at step %d: %s", f.severity, f.detector, f.step, f.message)
            for r in recs:
                logger.warning("grpo-monitor: %s: %s", rec_title(r), r["python"] or r["extra"].get("advice", ""))
            if self.alerts is not None:
                self._guard("alerts", self.alerts.on_step, step, record.get("detectors", {}), findings, recs)
        self.last_step_written = step
        return findings

    def _check_agreement(self, step: int, digests: list[Any]) -> None:
        """Every rank runs the detectors on the same inputs, so their findings must agree; a
        disagreement (a detector failing on one rank only, say) is recorded once."""
        if self._ranks_disagreed or all(d == digests[0] for d in digests):
            return
        self._ranks_disagreed = True
        differing = [r for r, d in enumerate(digests) if d != digests[0]]
        message = (f"findings differ across ranks before step {step}: rank 0 {digests[0]}, "
                   + ", ".join(f"rank {r} {digests[r]}" for r in differing))
        logger.warning("grpo-monitor: %s", message)
        if self.writer is not None:
            self.writer.write({"type": "note", "step": step, "level": "warning", "message": message})

    def _to_tensorboard(self, step: int, states: dict[str, str], findings: list[Any], recs: list[dict[str, Any]]) -> None:
        """Findings where TensorBoard users look: one scalar per detector state, and the findings as text."""
        writer = self._tb_writer()
        if writer is None:
            return
        for det, st in states.items():
            writer.add_scalar(f"grpo_monitor/{det}", TB_STATE_CODES.get(st, 0.0), step)
        if findings:
            text = "\n\n".join(
                f"**[{f.severity}] {f.detector}** at step {f.step}"
                + (f" (onset ~{f.onset_step})" if f.onset_step is not None else "") + f": {f.message}"
                for f in findings)
            text += "".join((f"\n\nRecommended **{r['variant']}**" if r.get("status") == "recommended" else f"\n\n**{rec_title(r)}**")
                            + f": `{r['python']}` — `{r['cli_flags']}`" for r in recs)
            writer.add_text("grpo_monitor/findings", text, step)
        writer.flush()

    def _tb_writer(self) -> Any:
        if self._tb is None:
            from transformers.integrations import TensorBoardCallback

            for cb in self.trainer.callback_handler.callbacks:
                if isinstance(cb, TensorBoardCallback) and getattr(cb, "tb_writer", None) is not None:
                    self._tb = cb.tb_writer  # the same event file as the run's own scalars
                    break
            else:
                self._tb = False
        return self._tb or None

    # -- auto-restart ---------------------------------------------------------------------

    def _maybe_restart(self, args: Any, state: Any, control: Any, findings: list[Any]) -> None:
        plan = None
        try:
            plan = self._decide(args, state, findings)
        except Exception as exc:  # still join the collective below, or the other ranks would wait forever
            self.report_error("auto-restart", exc)
        plan = _agree_across_ranks(plan)
        if plan is None:
            return
        self.restart_plan = plan
        control.should_training_stop = True
        control.should_save = True  # checkpoint at the stop; every checkpoint is kept
        if state.is_world_process_zero:
            from grpo_monitor.core.restart import write_plan

            write_plan(self.run_dir, plan)
            if self.writer is not None:
                self.writer.write({"type": "restart", "step": plan.step, "variant": plan.variant,
                                   "config_overrides": plan.config_overrides, "resume_from": plan.resume_from,
                                   "child_run": Path(plan.next_run_dir).name, "reasons": plan.reasons})
            logger.warning("grpo-monitor: stopping at step %d to restart with %s (%s); resume from %s",
                           plan.step, plan.variant, plan.config_overrides, plan.resume_from or "the initial model")

    def _decide(self, args: Any, state: Any, findings: list[Any]) -> Any:
        from grpo_monitor.core.recommend import recommend

        if self.restarts_done >= self.max_restarts:
            return None
        for f in findings:
            rec = recommend(f.to_dict(), self.context.config, is_moe=self.context.is_moe, tried=self.tried)
            if rec is not None:
                return self._plan(args, state, f, rec)
        return None

    def _plan(self, args: Any, state: Any, finding: Any, rec: dict[str, Any]) -> Any:
        from grpo_monitor.core.catalogue import validate
        from grpo_monitor.core.restart import RestartPlan, choose_checkpoint, segment_dir

        diff = validate(rec["config_overrides"])
        nxt = self.segment + 1
        output_dir = getattr(args, "output_dir", None)
        # Each segment trains into <first output_dir>/segment-<n>, so no checkpoint is overwritten.
        base_output = (Path(output_dir).parent if self.segment > 0 else Path(output_dir)) if output_dir else None
        return RestartPlan(
            segment=self.segment,
            step=int(state.global_step),
            variant=rec["variant"],
            config_overrides=diff,
            cumulative_overrides={k: v for k, v in {**self.applied_overrides, **diff}.items() if k != "output_dir"},
            resume_from=choose_checkpoint(output_dir, finding.onset_step, int(state.global_step), self.restart_from),
            onset_step=finding.onset_step,
            findings=[finding.to_dict()],
            reasons=rec["reasons"],
            tried=[*self.tried, rec["variant"]],
            parent_run=self.run_id,
            output_dir=output_dir,
            next_run_dir=str(segment_dir(self.lineage_root, nxt)),
            next_output_dir=str(Path(base_output) / f"segment-{nxt}") if base_output else None,
            restarts_done=self.restarts_done + 1,
        )

    def on_train_end(self, args, state, control, **kwargs):
        if self.alerts is not None:
            self._guard("alerts", self.alerts.close)
            self.alerts = None
        if self.router_tap is not None:
            self._guard("router tap", self.router_tap.remove)
            self.router_tap = None
        if self.reward_tap is not None:
            self._guard("reward tap", self.reward_tap.close)
        if self.writer is not None:
            self._guard("run log", self.writer.close)
            self.writer = None


def _distributed() -> Any:
    """``torch.distributed`` when this process is one of several ranks, else None."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    return dist


def _share_across_ranks(
    local: list[dict[str, Any]], digest: list[Any], report: Any
) -> tuple[list[dict[str, Any]], list[Any] | None, int]:
    """The step's samples from every rank (by global index) and each rank's findings of the
    previous log, and the bytes this rank sent; on one process, this rank's samples, no digests.

    Ranks send each completion's numbers packed (``pack_samples``: a few dozen bytes per
    completion), never its text, and every rank unpacks all parts alike, its own included, so
    the detectors of every rank see the same values."""
    dist = _distributed()
    if dist is None:
        return local, None, 0
    try:
        packed: Any = pack_samples(local)
    except Exception as exc:  # still join the collective below, or the other ranks would wait forever
        report("rank exchange", exc)
        packed = None
    payload = (packed, digest)
    gathered: list[Any] = [None] * dist.get_world_size()
    try:
        dist.all_gather_object(gathered, payload)
    except Exception as exc:  # the collective itself failed: go on with this rank's own view
        report("rank exchange", exc)
        return local, None, 0
    merged: list[dict[str, Any]] = []
    try:
        for part in gathered:
            if part and part[0] is not None:
                merged.extend(unpack_samples(part[0]))
    except Exception as exc:
        report("rank exchange", exc)
        merged = list(local)
    merged.sort(key=batch_index)
    return merged, [part[1] if part else None for part in gathered], exchange_size(payload)


def _agree_across_ranks(plan: Any) -> Any:
    """Every rank adopts rank 0's decision, so all of them stop at the same step (or none does)."""
    dist = _distributed()
    if dist is None:
        return plan
    box = [plan]
    dist.broadcast_object_list(box, src=0)
    return box[0]
