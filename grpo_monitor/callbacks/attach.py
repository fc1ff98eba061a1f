"""``attach(trainer)``: the two-line integration."""

from __future__ import annotations

import functools
import logging
import os
import sys
from pathlib import Path
from collections.abc import Mapping, Sequence
from typing import Any

from grpo_monitor.callbacks.finding_costs import FindingCosts
from grpo_monitor.callbacks.monitor_callback import MonitorCallback
from grpo_monitor.callbacks.options import DeviceOptions, RestartOptions, RouterOptions, SampleOptions, SegmentPlace
from grpo_monitor.callbacks.reward_tap import SampleRetention
from grpo_monitor.core.runlog import RUN_FILE
from grpo_monitor.detectors.base import Detector

logger = logging.getLogger("grpo_monitor")


def default_run_dir(trainer: Any) -> Path:
    return Path(trainer.args.output_dir) / "grpo-monitor"


def _check_overrides_applied(args: Any, overrides: dict[str, Any]) -> None:
    from grpo_monitor.core.recommend import _same

    missing = {k: v for k, v in overrides.items() if k != "output_dir" and not _same(getattr(args, k, None), v)}
    if missing:
        logger.warning(
            "grpo-monitor: this relaunch did not apply the restart overrides %s: parse TRL flags "
            "(HfArgumentParser/TrlParser) or call `args = grpo_monitor.core.restart.patched_args(args)` before building the trainer",
            missing,
        )


def _check_reward_roles(trainer: Any, options: dict[str, Any]) -> None:
    """A named correctness or format reward must be one of the trainer's reward functions: a typo
    would otherwise leave every sample's ``correct`` empty for the whole run."""
    names = list(getattr(trainer, "reward_func_names", None) or [])
    if not names:
        return
    for option in ("correctness_reward", "format_reward"):
        value = options.get(option)
        if value is not None and value not in names:
            raise ValueError(f"{option}={value!r} is not one of this trainer's reward functions "
                             f"({', '.join(names)}); pass one of those names")


def _is_main_process(trainer: Any) -> bool:
    accelerator = getattr(trainer, "accelerator", None)
    if accelerator is not None and hasattr(accelerator, "is_main_process"):
        return bool(accelerator.is_main_process)
    return int(getattr(trainer.args, "process_index", 0) or 0) == 0


def _say(message: str) -> None:
    """An INFO line that shows by default: through logging where it is set up to show INFO, else
    on stderr (Python's default logging drops INFO), and not at all where a user raised the
    monitor's logger above INFO on purpose."""
    if logger.isEnabledFor(logging.INFO) and logger.hasHandlers():
        logger.info(message)
    elif logger.level == logging.NOTSET or logger.isEnabledFor(logging.INFO):
        print(message, file=sys.stderr, flush=True)


def _role(callback: MonitorCallback, option: str, given: dict[str, Any]) -> str:
    name = getattr(callback, option)
    if name is None:
        return "none recognised"
    return f"{name} ({'given' if given.get(option) else 'guessed from its name'})"


def _announce(callback: MonitorCallback, given: dict[str, Any]) -> None:
    """Where the run log goes and which reward functions the monitor takes as correctness and as
    format; a warning naming the option when no correctness reward was recognised."""
    names = callback.reward_names
    _say(f"grpo-monitor: run log in {callback.run_dir / RUN_FILE}; correctness reward: "
         f"{_role(callback, 'correctness_reward', given)}, format reward: {_role(callback, 'format_reward', given)}"
         + (f" (reward functions: {', '.join(names)})" if names else ""))
    if names and callback.correctness_reward is None:
        candidates = [n for n in names if n != callback.format_reward] or names
        logger.warning(
            "grpo-monitor: none of the reward functions (%s) was recognised as the correctness reward, so no "
            "sample is marked right or wrong: the run header records none, the dashboard's ok column and correct "
            "filter stay empty, and detectors that read correctness go without it. Name it: "
            "attach(trainer, correctness_reward=%r)", ", ".join(names), candidates[0])


def _unknown_keywords(unknown: Sequence[str]) -> str:
    """The one-line error for keywords ``attach`` does not take, with the nearest it does.

    >>> _unknown_keywords(["correctnes_reward"])
    "grpo_monitor.attach() got an unexpected keyword argument 'correctnes_reward' (did you mean correctness_reward?); see help(grpo_monitor.attach)"
    """
    import difflib
    import inspect

    known = [n for n in inspect.signature(attach).parameters if n not in ("trainer", "alert_options")]
    hints = [m[0] for k in unknown for m in [difflib.get_close_matches(k, known, n=1)] if m]
    hint = f" (did you mean {', '.join(hints)}?)" if hints else ""
    many = len(unknown) > 1
    return (f"grpo_monitor.attach() got {'' if many else 'an '}unexpected keyword argument{'s' if many else ''} "
            f"{', '.join(map(repr, unknown))}{hint}; see help(grpo_monitor.attach)")


def _note_interruptions(trainer: Any, callback: MonitorCallback) -> None:
    """A training loop that leaves by an exception (Ctrl-C, a crash) calls no callback: ``train`` is
    wrapped so the monitor can say so (``MonitorCallback.interrupted``); the exception goes on unchanged."""
    train = trainer.train

    @functools.wraps(train)
    def train_and_note(*args: Any, **kwargs: Any) -> Any:
        try:
            return train(*args, **kwargs)
        except BaseException as exc:
            callback.interrupted(exc)
            raise

    trainer.train = train_and_note


def attach(
    trainer: Any,
    run_dir: str | os.PathLike[str] | None = None,
    *,
    detectors: Sequence[Detector] | None = None,
    correctness_reward: str | None = None,
    format_reward: str | None = None,
    correct_threshold: float = 0.0,
    sample_text: str | Mapping[str, int] | SampleRetention = "default",
    max_text_chars: int = 2000,
    router_tap: bool = True,
    moe_probe_every: int = 10,
    device_health: bool = True,
    device_interval_s: float = 1.0,
    nvml_device: int | str | None = None,
    auto_restart: bool = False,
    max_restarts: int = 2,
    restart_from: str = "before_onset",
    alerts: Any = None,
    dashboard: bool = False,
    require_reward_gate: bool = False,
    gate_min_agreement: float = 0.9,
    place: SegmentPlace | None = None,
    gpu_hour_price: float | None = None,
    rules: str | os.PathLike[str] | Sequence[Any] | None = None,
    **alert_options: Any,
) -> MonitorCallback:
    """Attach the monitor to a ``GRPOTrainer`` (or any TRL/transformers trainer) and return its callback.

    ``run_dir`` defaults to ``<output_dir>/grpo-monitor``; under ``grpo-monitor supervise`` the
    supervisor's segment directory wins.

    - ``detectors``: a list replacing the built-in set.
    - ``correctness_reward`` / ``format_reward``: reward function names, checked against the trainer's;
      guessed from the names otherwise (a warning names the option when no correctness reward is
      recognised). ``correct_threshold``: a correctness reward above it counts as correct (default 0).
    - ``sample_text``: which completions keep text (``"default"`` keeps, per step, 32 completions drawn
      fairly plus the best and worst of 8 groups and 4 truncated ones, all of a step with at most 32;
      ``"all"``, ``"none"``, or a ``SampleRetention``/dict with ``fair``, ``groups``, ``truncated``; every
      completion keeps its numbers either way); ``max_text_chars``: characters kept per text (head and tail).
    - ``router_tap``: False leaves a MoE model's routers unhooked (no ``moe/*`` routing metrics);
      ``moe_probe_every``: the routing flip-rate probe interval in steps.
    - ``device_health``: the GPU's utilisation, memory, temperature, power, SM clock and throttle reasons
      through NVML (``pip install 'grpo-monitor[gpu]'``), read every ``device_interval_s`` seconds on a
      thread of its own, plus the share of time spent generating, as ``system/gpu_*`` metrics; nothing
      happens without NVML or a GPU. ``nvml_device`` (an NVML index or UUID) watches that device instead
      of the one each rank trains on.
    - ``auto_restart``: stop on a confirmed finding and write a restart plan (off by default);
      ``max_restarts`` (default 2); ``restart_from`` (``before_onset``, ``latest`` or ``initial``).
    - ``alerts``: a destination or a list of them (a Slack, Discord, Teams, PagerDuty or other webhook URL,
      ``mailto:ADDRESS``, or a dict with its own ``headers``, ``template``, ``mention``, ...; default
      ``$GRPO_MONITOR_WEBHOOK_URL``; False turns every alert off, the trackers' too), with ``alerts_*``
      options: ``alerts_format`` (``slack``/``discord``/``teams``/``pagerduty``/``generic``, else from the
      URL), ``alerts_min_severity`` (``warning`` or ``critical``), ``alerts_trackers`` (True: the trackers
      in ``args.report_to``; False or a list of names), ``alerts_per_minute``/``alerts_burst`` (rate
      limit), ``alerts_retries``, ``alerts_timeout``, ``alerts_flush_timeout``, ``alerts_headers``,
      ``alerts_template``, ``alerts_mention`` (critical messages only), ``alerts_max_per_run``,
      ``alerts_cooldown_steps`` — all checked here; see ``docs/ALERTS.md``.
    - ``require_reward_gate=True`` refuses to train (``RewardGateError``, naming the command to run) until
      ``grpo-monitor inspect-rewards`` has saved a passed verdict for these reward functions in the run
      directory, with at least ``gate_min_agreement`` of the judged samples agreed with.
    - ``dashboard=True`` prints the ``grpo-monitor watch`` command for this run.
    - ``place``: where the run stands in a restarted lineage (``run_with_restarts`` and the supervisor
      set it).
    - ``gpu_hour_price``: the price of one GPU-hour; each finding's ``evidence["cost"]`` (steps, wall time and
      GPU-hours since its onset, the share of rollouts without learning signal or cut) then has money too.
    - ``rules``: a team's rule file (JSON, YAML or TOML; see the README) or its rules as dicts: extra checks
      that raise findings like the built-in detectors, recorded in the run header.

    The main process says once where the run log goes and which reward functions count as correctness
    and as format.

    >>> monitor_cb = attach(trainer)          # doctest: +SKIP
    >>> trainer.train()                       # doctest: +SKIP
    """
    from grpo_monitor.core.restart import env_state

    for cb in getattr(trainer.callback_handler, "callbacks", []):
        if isinstance(cb, MonitorCallback):
            return cb  # attaching twice would double-wrap the reward functions
    supervised = env_state()
    directory = Path(supervised["run_dir"] or run_dir or default_run_dir(trainer))
    if place is None:
        place = SegmentPlace(parent_run=supervised["parent_run"])
        if supervised["run_dir"]:
            place = SegmentPlace(segment=supervised["segment"], restarts_done=supervised["segment"],
                                 tried=supervised["tried"], applied_overrides=supervised["overrides"],
                                 lineage_root=directory.parent if supervised["segment"] > 0 else directory,
                                 parent_run=supervised["parent_run"])
            auto_restart = auto_restart or bool(supervised["auto_restart"])
            if supervised["max_restarts"] is not None:
                max_restarts = supervised["max_restarts"]
            _check_overrides_applied(trainer.args, supervised["overrides"])
    unknown = [k for k in alert_options if not k.startswith("alerts_")]
    if unknown:
        raise TypeError(_unknown_keywords(unknown))
    if require_reward_gate:
        from grpo_monitor.preflight.reward_gate import require_gate

        # Every rank checks, so all of them refuse together.
        logger.info("grpo-monitor: %s", require_gate(trainer, directory, gate_min_agreement))
    from grpo_monitor.alerts import AlertOptions, watch_training

    # Checked here (those from the environment too), so a mistyped option fails at attach time rather than
    # as a warning mid-run.
    alert_opts = AlertOptions.of({**({"alerts": alerts} if alerts is not None else {}), **alert_options})
    from grpo_monitor.core.rules import load_rules

    # Built and checked here, so a broken rule file fails at attach time, not mid-run.
    costs = FindingCosts(gpu_hour_price, load_rules(rules) if rules is not None else ())
    given = {"correctness_reward": correctness_reward, "format_reward": format_reward}
    _check_reward_roles(trainer, given)
    callback = MonitorCallback(
        trainer, directory, detectors=detectors,
        samples=SampleOptions(correctness_reward, format_reward, correct_threshold, max_text_chars, sample_text),
        restarts=RestartOptions(auto_restart, max_restarts, restart_from),
        place=place,
        router=RouterOptions(router_tap, moe_probe_every),
        alerts=alert_opts,
        costs=costs,
        device=DeviceOptions(device_health, device_interval_s, nvml_device),
    )
    trainer.add_callback(callback)
    if alert_opts.enabled:
        watch_training(trainer, lambda: callback.alerts)  # a crash is said in the alerts, then raised unchanged
    _note_interruptions(trainer, callback)
    if _is_main_process(trainer):
        _announce(callback, given)
    if dashboard and getattr(trainer.args, "process_index", 0) == 0:
        print(f"grpo-monitor: watch this run in another terminal with:  grpo-monitor watch {directory}")
    return callback
