"""``attach(trainer)``: the two-line integration."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from callbacks.monitor_callback import MonitorCallback

logger = logging.getLogger("grpo_monitor")
ENV_RUN_DIR = "GRPO_MONITOR_RUN_DIR"
ENV_PARENT_RUN = "GRPO_MONITOR_PARENT_RUN"


def default_run_dir(trainer: Any) -> Path:
    env = os.environ.get(ENV_RUN_DIR)
    if env:
        return Path(env)
    return Path(trainer.args.output_dir) / "grpo-monitor"


def attach(trainer: Any, run_dir: str | os.PathLike[str] | None = None, *, dashboard: bool = False, **options: Any) -> MonitorCallback:
    """Attach the monitor to a ``GRPOTrainer`` (or any TRL/transformers trainer) and return its callback.

    ``run_dir`` defaults to ``$GRPO_MONITOR_RUN_DIR`` or ``<output_dir>/grpo-monitor``. Options:
    ``detectors`` (a list replacing the built-in set), ``correctness_reward`` / ``format_reward``
    (reward function names; guessed from the names otherwise), ``correct_threshold`` (a correctness
    reward above it counts as correct; default 0), ``moe_probe_every`` (routing flip-rate probe
    interval in steps), ``max_text_chars`` (prompt/completion text kept per sample).

    >>> monitor_cb = attach(trainer)          # doctest: +SKIP
    >>> trainer.train()                       # doctest: +SKIP
    """
    for cb in getattr(trainer.callback_handler, "callbacks", []):
        if isinstance(cb, MonitorCallback):
            return cb  # attaching twice would double-wrap the reward functions
    directory = Path(run_dir) if run_dir is not None else default_run_dir(trainer)
    options.setdefault("parent_run", os.environ.get(ENV_PARENT_RUN) or None)
    callback = MonitorCallback(trainer, directory, **options)
    trainer.add_callback(callback)
    if dashboard and getattr(trainer.args, "process_index", 0) == 0:
        print(f"grpo-monitor: watch this run in another terminal with:  grpo-monitor watch {directory}")
    return callback
