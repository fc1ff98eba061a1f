"""Shared test helpers: real GRPO runs on tiny local models, and the location of ../shared."""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The public runs beside the checkout; GRPO_MONITOR_SHARED points elsewhere (a checkout in another folder).
SHARED = Path(os.environ.get("GRPO_MONITOR_SHARED") or ROOT.parent / "shared")

# Deterministic and quiet CPU runs; the tiny models live in a cache the tests share.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")


def train_tiny(run_dir: Path, steps: int = 4, moe: bool = False, attach_options: dict | None = None,
               reward_funcs=None, **config):
    """Train the tiny model for ``steps`` GRPO steps with the monitor attached; returns (trainer, callback)."""
    import transformers

    from grpo_monitor.callbacks import attach
    from grpo_monitor.app.demo import build_trainer, demo_config

    transformers.logging.set_verbosity_error()
    warnings.filterwarnings("ignore", category=FutureWarning)
    args = demo_config(run_dir / "trainer", steps, disable_tqdm=True, **config)
    trainer = build_trainer(args, moe=moe, reward_funcs=reward_funcs)
    callback = attach(trainer, run_dir, **(attach_options or {}))
    trainer.train()
    return trainer, callback


@pytest.fixture
def quiet_monitor_logs(caplog):
    caplog.set_level(logging.WARNING, logger="grpo_monitor")
    return caplog
