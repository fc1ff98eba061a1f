"""The training-side monitor: a ``TrainerCallback`` that streams every logged step into the run
directory and through the detectors.

Per logging step it normalises the metrics TRL passes to ``on_log``, adds the monitor's own (MoE
routing, per-sample statistics, process memory, the device's health), takes the completions the reward tap recorded since
the last log from every rank, runs the engine, and appends step, sample and finding records. It is
composed of small parts, each guarded on its own: the run log (``core.runlog_writer.RunWriter``), the sample
tap (``reward_tap``), the router tap (``router_tap``), the rank exchange (``rank_exchange``), alerts
(``alerts``), the TensorBoard mirror, the restart policy (``restart_policy``), the findings' cost, time
to failure and team rules (``finding_costs``) and the device's health (``device_health``: NVML readings from a
thread of their own, and the time spent generating). Rank 0 writes the
shared files; every rank writes its own samples. Any exception inside the monitor is logged once per
part and the training goes on.
"""

from __future__ import annotations

import logging
import os
import platform
import sys
import time
import traceback
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from grpo_monitor.alerts import build_dispatcher, redact
from grpo_monitor.callbacks.finding_costs import FindingCosts
from grpo_monitor.callbacks.device_health import DeviceHealth
from grpo_monitor.callbacks.model_facts import model_facts
from grpo_monitor.callbacks.options import DeviceOptions, RestartOptions, RouterOptions, SampleOptions, SegmentPlace
from grpo_monitor.callbacks.rank_exchange import RankExchange
from grpo_monitor.callbacks.restart_policy import Halt, RestartPolicy
from grpo_monitor.callbacks.reward_tap import RewardTap
from grpo_monitor.callbacks.tensorboard_mirror import TensorBoardMirror
from grpo_monitor.core.crashes import read_crash
from grpo_monitor.core.device import combine_ranks
from grpo_monitor.core.metrics import SUMMARY_KEYS, normalize_metrics
from grpo_monitor.core.recommend import title as rec_title
from grpo_monitor.core.runlog_writer import RunWriter
from grpo_monitor.core.runlog import jsonable
from grpo_monitor.core.session import Session, SessionOptions, open_session
from grpo_monitor.core.telemetry import system_metrics
from grpo_monitor.detectors.base import Detector, RunContext
from grpo_monitor.detectors.signals import reward_roles

logger = logging.getLogger("grpo_monitor")


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
    """The monitor inside a trainer; ``attach(trainer)`` builds it from its options and adds it."""

    def __init__(
        self,
        trainer: Any,
        run_dir: str | os.PathLike[str],
        *,
        detectors: Sequence[Detector] | None = None,
        correctness_reward: str | None = None,
        format_reward: str | None = None,
        samples: SampleOptions = SampleOptions(),
        restarts: RestartOptions | None = None,
        place: SegmentPlace = SegmentPlace(),
        router: RouterOptions | None = RouterOptions(),
        alerts: Any = None,
        costs: FindingCosts | None = None,
        device: DeviceOptions | None = DeviceOptions(),
    ) -> None:
        """``restarts``, ``router`` and ``device`` None turn that part off; ``alerts`` is an
        ``AlertOptions`` or what its ``to`` takes."""
        self.trainer = trainer
        self.costs = costs or FindingCosts()
        self.run_dir = Path(run_dir)
        self.samples = samples
        self.router_options = router
        self.place = place
        self.run_id = uuid.uuid4().hex[:12]
        self.restarts = RestartPolicy(restarts, place, place.root(self.run_dir), self.run_id)
        self.errors: dict[str, str] = {}
        self.exchange = RankExchange(self.report_error)
        self.tensorboard = TensorBoardMirror(trainer)
        self.device = DeviceHealth(trainer, device)
        self.alert_options = alerts  # an AlertOptions, or what its ``to`` takes (grpo_monitor.alerts)
        self.alerts: Any = None
        self.writer: RunWriter | None = None
        self.router_tap: Any = None
        self.session: Session | None = None
        self._detectors = detectors
        self.last_step_written = -1
        self._step_metrics: dict[str, Any] = {}
        self.reward_names = list(getattr(trainer, "reward_func_names", []) or [])
        guessed_correct, guessed_format = reward_roles(self.reward_names)
        self.correctness_reward = correctness_reward or guessed_correct
        self.format_reward = format_reward or guessed_format
        self.context = RunContext(
            reward_names=self.reward_names,
            correctness_reward=self.correctness_reward,
            format_reward=self.format_reward,
            logging_steps=int(getattr(trainer.args, "logging_steps", 1) or 1),
        )
        self.reward_tap = self._install_reward_tap()

    @property
    def restart_plan(self) -> Any:
        """The plan this run stopped for (None while it runs on, or when it ran to its end)."""
        return self.restarts.plan

    @property
    def exchange_bytes(self) -> int:
        """What this rank sent to the others at the last log (the numbers of its completions)."""
        return self.exchange.sent_bytes

    # -- fault isolation -------------------------------------------------------------------

    def report_error(self, component: str, exc: BaseException) -> None:
        """Log a monitor fault once per component; the run is never interrupted by it."""
        if component in self.errors:
            return
        self.errors[component] = f"{type(exc).__name__}: {exc}"
        logger.warning("grpo-monitor: %s failed (%s: %s); training continues", component, type(exc).__name__, exc)
        if self.writer is not None and component != "run log":
            self._note(None, f"{component} failed: {type(exc).__name__}: {exc}")

    def _note(self, step: int | None, message: str) -> None:
        try:
            self.writer.write({"type": "note", "step": step, "level": "warning", "message": message})  # type: ignore[union-attr]
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
            correct_threshold=self.samples.correct_threshold,
            max_text_chars=self.samples.max_text_chars,
            on_error=self.report_error,
            training=lambda: bool(getattr(getattr(trainer, "model", None), "training", True)),
        )
        import torch.nn as nn

        for i, (func, name) in enumerate(zip(list(funcs), self.reward_names)):
            if isinstance(func, nn.Module) or hasattr(func, "__grpo_monitor_tap__"):
                continue  # reward models are called on tokenized text, not completion ids
            funcs[i] = tap.wrap(func, name)
        return tap

    def on_train_begin(self, args, state, control, **kwargs):
        self._guard("run log", self._begin, args, state, kwargs.get("model"))
        if "learning_rate" in self.place.applied_overrides and int(state.global_step) > 0:
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
        config = jsonable(args.to_dict())
        self.context.config = config
        self.context.model = facts
        self.session = open_session(self.context, SessionOptions(
            detectors=self.costs.detectors(self._detectors), devices=self.costs.devices(args),
            gpu_hour_price=self.costs.gpu_hour_price, tried=list(self.place.tried), segment=self.place.segment,
            on_error=self.report_error))
        self._guard("imports", self.session.engine.warm_up)
        # A write that fails (the disk full) is reported once; the writer counts what it lost and says so in the log.
        self.writer = RunWriter(self.run_dir, rank=rank if not state.is_world_process_zero else 0,
                                on_error=self.report_error)
        device = self._guard("device health", self.device.start)
        if state.is_world_process_zero:
            self.writer.header(
                run_id=self.run_id,
                start_time=time.time(),
                versions=library_versions(),
                config=config,
                model=facts,
                world_size=int(getattr(args, "world_size", 1)),
                parent_run=self.place.parent_run,
                reward_funcs=self.reward_names,
                correctness_reward=self.correctness_reward,
                format_reward=self.format_reward,
                resumed_from_step=int(state.global_step),
                argv=redact(sys.argv, self.alert_options),  # a webhook URL on the command line stays out of the log
                segment=self.place.segment,
                applied_overrides=dict(self.place.applied_overrides),
                tried_variants=list(self.place.tried),
                auto_restart=self.restarts.options is not None,
                **self.costs.header_fields(),
                **({"device": device} if device else {}),  # the GPU as NVML reports it, when it does
            )
            self._guard("lint", self._preflight, state)
            self.alerts = self._guard("alerts", lambda: build_dispatcher(
                self.trainer, self.run_dir, self.run_id, self.alert_options, self.report_error,
                note=lambda record: self.writer.write(record) if self.writer is not None else None,
                segment=self.place.segment, lineage_root=self.restarts.lineage_root))
        if facts.get("is_moe"):
            self._guard("router tap", self._install_router_tap, model)

    def _preflight(self, state: Any) -> None:
        """The recipe's pre-flight findings, recorded first as the run meets them."""
        from grpo_monitor.preflight.lint import lint_trainer

        findings = lint_trainer(self.trainer, first_run=not self.place.parent_run and int(state.global_step) == 0)
        if not findings:
            return
        # A pre-flight finding that names a variant carries its diff like any other finding.
        recs = self._guard("recommendations", self.session.preflight, findings) or []
        self.writer.write(*({"type": "finding", **f.to_dict()} for f in findings), *recs)  # type: ignore[union-attr]
        for f in findings:
            # logging_steps > 1 is said once, here, in one line: detection is coarser, nothing else changes.
            logger.log(logging.INFO if f.severity == "info" and f.detector != "config_logging_steps" else logging.WARNING,
                       "grpo-monitor: [%s] %s: %s", f.severity, f.detector, f.message)

    def _install_router_tap(self, model: Any) -> None:
        if self.router_options is None:
            return
        from grpo_monitor.callbacks.router_tap import RouterTap

        tap = RouterTap.for_model(model, probe_every=self.router_options.probe_every)
        if tap is None:
            return
        tap.install()
        self.router_tap = tap

    # -- per step -------------------------------------------------------------------------

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs:
            step = int(state.global_step)
            local = (self._guard("reward tap", self.reward_tap.drain, step) or []) if self.reward_tap else []
            device = (self._guard("device health", self.device.collect) or None) if self.device.active else None
            # Every rank reaches this collective at every log, whatever failed above.
            batch, digests = self.exchange.share(local, device)
            if self.reward_tap is not None:
                self._guard("samples", self._keep_text, step, local, batch)
            findings = self._guard("step record", self._record, state, dict(logs), local, batch) or []
            self.exchange.remember(findings)
            if digests is not None and state.is_world_process_zero:
                message = self.exchange.disagreement(step, digests)
                if message:
                    logger.warning("grpo-monitor: %s", message)
                    self._note(step, message)
            if self.restarts.active:
                self._guard("auto-restart", self._maybe_restart, args, state, control, findings)
        return control

    def _keep_text(self, step: int, local: list[dict[str, Any]], merged: list[dict[str, Any]]) -> None:
        """Text excerpts for the completions the retention policy picks from the whole step."""
        tap = self.reward_tap
        try:
            keep = self.samples.sample_text.select(merged, step) if merged else set()
        except Exception:
            tap.add_text((), None)  # let go of the step's texts, then report
            raise
        tap.add_text(local, lambda r: (r.get("rank"), r.get("index")) in keep)

    def _record(self, state: Any, logs: dict[str, Any], local: list[dict[str, Any]],
                samples: list[dict[str, Any]]) -> list[Any]:
        """One step record: ``local`` are this rank's samples (its own file), ``samples`` the whole step's
        from every rank, which the detectors see on every rank alike."""
        step = int(state.global_step)
        writer = self.writer
        if writer is None or self.session is None:
            return []
        if SUMMARY_KEYS & logs.keys():
            # The trainer's last log: every tracker still has its run open. The alerts' end message,
            # flush and delivery counts come first, so the summary record carries the counts.
            delivery = self._guard("alerts", self.alerts.finish, step) if self.alerts is not None else None
            writer.write({"type": "summary", "step": step, "metrics": normalize_metrics(logs),
                          **({"alerts": delivery} if delivery else {})})
            return []
        metrics = normalize_metrics(logs)
        metrics.update(self._guard("system metrics", system_metrics, True) or {})
        if local:
            self._guard("samples", writer.samples, local)
        metrics.update(sample_metrics(samples))
        devices = self.exchange.devices
        if any(devices):
            for name, value in combine_ranks(devices).items():
                if name not in metrics:  # torch's own reading of the capacity comes first
                    metrics[name] = value
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
        # The Trainer logs an evaluation as a second log of the same step; a reader keeps the latest record of
        # a step (a resumed run re-logs steps), so this one carries the step's training metrics too. The
        # engine sees the evaluation alone, as it saw the training log before it.
        logged = record["metrics"] = {**self._step_metrics, **metrics} if step == self.last_step_written else metrics
        if len(devices) > 1 and any(devices):
            record["devices"] = [{"rank": r, **(d or {})} for r, d in enumerate(devices)]
        outcome = self.session.update(step, metrics, samples)
        findings, recs = outcome.findings, outcome.recommendations
        states = record["detectors"] = outcome.states
        if state.is_world_process_zero:
            self._guard("tensorboard", self.tensorboard.write, step, states, findings, recs)
            writer.write(record, *({"type": "finding", **f.to_dict()} for f in findings), *recs)
            for f in findings:
                logger.warning("grpo-monitor: [%s] %s at step %d: %s%s", f.severity, f.detector, f.step, f.message,
                               FindingCosts.suffix(f))
            for r in recs:
                logger.warning("grpo-monitor: %s: %s", rec_title(r), r["python"] or r["extra"].get("advice", ""))
            if self.alerts is not None:
                self._guard("alerts", self.alerts.on_step, step, states, findings, recs)
        self.last_step_written = step
        self._step_metrics = logged
        return findings

    def _maybe_restart(self, args: Any, state: Any, control: Any, findings: list[Any]) -> None:
        plan = None
        try:
            plan = self.restarts.decide(args, state, findings, self.context)
        except Exception as exc:  # still join the collective below, or the other ranks would wait forever
            self.report_error("auto-restart", exc)
        plan = RankExchange.agree(plan)
        if plan is None:
            return
        if isinstance(plan, Halt):
            note = self.restarts.halt(plan, control, bool(state.is_world_process_zero))
            if state.is_world_process_zero and self.writer is not None:
                self.writer.write(note)
            return
        record = self.restarts.stop(plan, control, self.run_dir if state.is_world_process_zero else None)
        if state.is_world_process_zero:
            if self.writer is not None:
                self.writer.write(record)
            if self.alerts is not None:
                self._guard("alerts", self.alerts.restart, plan.to_dict())

    def interrupted(self, exc: BaseException) -> None:
        """The training loop left with ``exc`` (Ctrl-C, a crash, ``sys.exit``), which calls no callback:
        the alerts say a crash or Ctrl-C (a deliberate exit is no crash) and are flushed and counted; the
        console and the run log, whose steps stay as they are, say it once; then what ``on_train_end``
        would have let go of is let go of. Each part is guarded: the caller raises ``exc`` unchanged."""
        state = getattr(self.trainer, "state", None)
        step = getattr(state, "global_step", 0)
        step = step if isinstance(step, int) else 0
        if self.alerts is not None and isinstance(exc, (Exception, KeyboardInterrupt)):
            self._guard("alerts", self.alerts.crash, exc, step)
        try:
            main = bool(getattr(state, "is_world_process_zero", True))
            how = "interrupted (Ctrl-C)" if isinstance(exc, KeyboardInterrupt) else \
                f"stopped by {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}".rstrip(": ")
            logged = self.last_step_written
            message = (f"the run was {how} after step {logged}, the last it logged, before its end" if logged >= 0
                       else f"the run was {how} before its first logged step")
            if main and self.writer is not None:
                note = {"type": "note", "step": step, "level": "warning", "event": "interrupted",
                        "exception": type(exc).__name__, "message": message}
                crashed = read_crash("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
                if crashed is not None:  # analyze names the cause and sizes the fix from the header's config
                    note["crash"] = {**crashed.to_dict(), "at": f"the {type(exc).__name__} that stopped the run"
                                     + (f" after step {logged}" if logged >= 0 else " before its first logged step")}
                self.writer.write(note)
                logger.warning("grpo-monitor: %s; the run log keeps every step up to it (%s): grpo-monitor analyze "
                               "%s reports it as interrupted", message, self.run_dir / "run.jsonl", self.run_dir)
        except Exception as err:  # saying so must never hide the interruption itself
            self.report_error("interruption note", err)
        self.on_train_end(getattr(self.trainer, "args", None), getattr(self.trainer, "state", None), None)

    def on_train_end(self, args, state, control, **kwargs):
        self._guard("device health", self.device.stop)
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
