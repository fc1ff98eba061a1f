"""``attach(trainer)``: the two-line integration."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from grpo_monitor.callbacks.monitor_callback import MonitorCallback

logger = logging.getLogger("grpo_monitor")


def default_run_dir(trainer: Any) -> Path:
    return Path(trainer.args.output_dir) / "grpo-monitor"


def _check_overrides_applied(args: Any, overrides: dict[str, Any]) -> None:
    from grpo_monitor.monitor.recommend import _same

    missing = {k: v for k, v in overrides.items() if k != "output_dir" and not _same(getattr(args, k, None), v)}
    if missing:
        logger.warning(
            "grpo-monitor: this relaunch did not apply the restart overrides %s: parse TRL flags "
            "(HfArgumentParser/TrlParser) or call `args = monitor.restart.patched_args(args)` before building the trainer",
            missing,
        )


def attach(
    trainer: Any,
    run_dir: str | os.PathLike[str] | None = None,
    *,
    dashboard: bool = False,
    require_reward_gate: bool = False,
    gate_min_agreement: float = 0.9,
    **options: Any,
) -> MonitorCallback:
    """Attach the monitor to a ``GRPOTrainer`` (or any TRL/transformers trainer) and return its callback.

    ``run_dir`` defaults to ``<output_dir>/grpo-monitor``; under ``grpo-monitor supervise`` the
    supervisor's segment directory wins. Options:
    ``detectors`` (a list replacing the built-in set), ``correctness_reward`` / ``format_reward``
    (reward function names; guessed from the names otherwise), ``correct_threshold`` (a correctness
    reward above it counts as correct; default 0), ``moe_probe_every`` (routing flip-rate probe
    interval in steps), ``router_tap`` (False: no hooks on a MoE model's routers, so no ``moe/*``
    routing metrics), ``max_text_chars`` (characters of prompt/completion text kept per sample: its
    head and its tail), ``sample_text`` (which completions keep text: ``"default"`` keeps, per
    step, 32 completions drawn fairly plus the best and worst of 8 groups and 4 truncated ones,
    all of a step with at most 32; ``"all"``, ``"none"``, or a ``SampleRetention``/dict with
    ``fair``, ``groups``, ``truncated``; every completion keeps its numbers either way),
    ``auto_restart`` (stop on a confirmed finding and write a restart plan; off by default),
    ``max_restarts`` (default 2), ``restart_from`` (``before_onset``, ``latest`` or ``initial``).
    ``alerts`` (a Slack, Discord or other webhook URL, default ``$GRPO_MONITOR_WEBHOOK_URL``; False turns
    every alert off, the trackers' too), ``alerts_format`` (``slack``/``discord``/``generic``, else from the
    URL), ``alerts_min_severity`` (``warning`` or ``critical``), ``alerts_trackers`` (True: the trackers in
    ``args.report_to``; False or a list of names), ``alerts_per_minute``/``alerts_burst`` (rate limit),
    ``alerts_retries``, ``alerts_timeout``, ``alerts_flush_timeout`` — see ``docs/ALERTS.md``.

    ``require_reward_gate=True`` refuses to train (``RewardGateError``, naming the command to run)
    until ``grpo-monitor inspect-rewards`` has saved a passed verdict for these reward functions in
    the run directory, with at least ``gate_min_agreement`` of the judged samples agreed with.
    ``dashboard=True`` prints the ``grpo-monitor watch`` command for this run.

    >>> monitor_cb = attach(trainer)          # doctest: +SKIP
    >>> trainer.train()                       # doctest: +SKIP
    """
    from grpo_monitor.monitor.restart import env_state

    for cb in getattr(trainer.callback_handler, "callbacks", []):
        if isinstance(cb, MonitorCallback):
            return cb  # attaching twice would double-wrap the reward functions
    supervised = env_state()
    directory = Path(supervised["run_dir"] or run_dir or default_run_dir(trainer))
    if supervised["run_dir"]:
        options.setdefault("segment", supervised["segment"])
        options.setdefault("restarts_done", supervised["segment"])
        options.setdefault("lineage_root", directory.parent if supervised["segment"] > 0 else directory)
        options.setdefault("tried", supervised["tried"])
        options.setdefault("applied_overrides", supervised["overrides"])
        if supervised["auto_restart"]:
            options.setdefault("auto_restart", True)
        if supervised["max_restarts"] is not None:
            options.setdefault("max_restarts", supervised["max_restarts"])
        _check_overrides_applied(trainer.args, supervised["overrides"])
    options.setdefault("parent_run", supervised["parent_run"])
    if require_reward_gate:
        from grpo_monitor.monitor.preflight.reward_gate import require_gate

        # Every rank checks, so all of them refuse together.
        logger.info("grpo-monitor: %s", require_gate(trainer, directory, gate_min_agreement))
    if "alerts" in options or any(k.startswith("alerts_") for k in options):
        from grpo_monitor.monitor.alerts import AlertOptions

        # Checked here, so a mistyped option fails at attach time rather than as a warning mid-run.
        options["alerts"] = AlertOptions.of({k: options.pop(k) for k in list(options) if k == "alerts" or k.startswith("alerts_")})
    callback = MonitorCallback(trainer, directory, **options)
    trainer.add_callback(callback)
    if dashboard and getattr(trainer.args, "process_index", 0) == 0:
        print(f"grpo-monitor: watch this run in another terminal with:  grpo-monitor watch {directory}")
    return callback
