"""Metric names: every reader and the live callback pass names through ``normalize``.

The canonical names are the ones TRL 1.16's ``GRPOTrainer`` logs (``entropy``,
``completions/mean_length``, ``rewards/<func>/mean``, ...). Older TRL releases, verl and
TensorBoard's ``train/`` prefix are mapped onto them here and nowhere else; a name this module
does not know is carried along unchanged.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

# Exact aliases: foreign name -> TRL 1.16 name.
ALIASES: dict[str, str] = {
    # older TRL
    "completion_length": "completions/mean_length",
    "clip_ratio": "clip_ratio/region_mean",
    # verl
    "actor/entropy": "entropy",
    "actor/entropy_loss": "entropy",
    "actor/grad_norm": "grad_norm",
    "actor/pg_clipfrac": "clip_ratio/region_mean",
    "actor/pg_clipfrac_lower": "clip_ratio/low_mean",
    "actor/ppo_kl": "ppo_kl",
    "actor/kl_loss": "kl",
    "actor/pg_loss": "loss",
    "actor/lr": "learning_rate",
    "response_length/mean": "completions/mean_length",
    "response_length/max": "completions/max_length",
    "response_length/min": "completions/min_length",
    "response_length/clip_ratio": "completions/clipped_ratio",
    "critic/score/mean": "reward",
    "critic/rewards/mean": "reward",
    "critic/score/max": "reward/max",
    "critic/score/min": "reward/min",
    "training/global_step": "step",
    "training/epoch": "epoch",
    "timing_s/step": "step_time",
    # common export spellings
    "completion_length_mean": "completions/mean_length",
    "clipped_ratio": "completions/clipped_ratio",
    "is_ratio_mean": "sampling/importance_sampling_ratio/mean",
    "rewards/std": "reward_std",
    "train/global_step": "step",
    "global_step": "step",
    "_step": "step",
}

# Prefixes stripped before lookup: TensorBoard's (TRL writes ``train/<key>``) and verl's.
_PREFIXES = ("train/",)
_REWARD_COMPONENT = re.compile(r"^rewards/([^/]+)$")
# Keys the Trainer adds only to its end-of-training summary.
SUMMARY_KEYS = frozenset({"train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss", "total_flos"})


def normalize(name: str) -> str:
    """Map a metric name from any supported logger onto its TRL 1.16 name.

    >>> normalize("completion_length"), normalize("rewards/format_reward"), normalize("actor/entropy")
    ('completions/mean_length', 'rewards/format_reward/mean', 'entropy')
    >>> normalize("train/rewards/format_reward/std"), normalize("my_custom_metric")
    ('rewards/format_reward/std', 'my_custom_metric')
    """
    for prefix in _PREFIXES:
        if name.startswith(prefix) and name != "train/global_step":
            name = name[len(prefix):]
            break
    if name in ALIASES:
        return ALIASES[name]
    m = _REWARD_COMPONENT.match(name)
    if m:
        return f"rewards/{m.group(1)}/mean"
    return name


def to_value(value: Any) -> float | None:
    """A logged value as a float; None for a gap. NaN and inf are kept: they are evidence."""
    if value is None or isinstance(value, bool):
        return None if value is None else float(value)
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("", "none", "null"):
            return None
        try:
            return float(text)
        except ValueError:
            return None
    try:  # numpy scalars, 0-d tensors
        return float(value)
    except (TypeError, ValueError):
        return None


def normalize_metrics(logs: Mapping[str, Any]) -> dict[str, float | None]:
    """Normalise every name of one logged step and coerce its values; non-numeric values are dropped."""
    out: dict[str, float | None] = {}
    for key, value in logs.items():
        if not isinstance(key, str):
            continue
        if value is not None and not isinstance(value, (int, float)) and to_value(value) is None:
            continue
        name = normalize(key)
        if name == "step":
            continue
        # When a run logs both an alias and the canonical name, the canonical one wins.
        if name in out and key != name:
            continue
        out[name] = to_value(value)
    return out


def reward_components(names: Mapping[str, Any] | list[str]) -> list[str]:
    """Reward function names found among canonical metric names (``rewards/<f>/mean``)."""
    found = []
    for name in names:
        parts = name.split("/")
        if len(parts) == 3 and parts[0] == "rewards" and parts[2] == "mean":
            found.append(parts[1])
    return found


def encode(value: float | None) -> float | str | None:
    """JSON has no NaN or inf: they are written as strings and decoded back by ``decode``."""
    if value is None or math.isfinite(value):
        return value
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def decode(value: Any) -> float | None:
    if isinstance(value, str):
        return {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}.get(value)
    if value is None or isinstance(value, bool):
        return None
    return float(value) if isinstance(value, (int, float)) else None
