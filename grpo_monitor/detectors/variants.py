"""The GRPO variants the detectors can recommend, as plain ``GRPOConfig`` presets.

These are the variant's own settings, not a diff: the recommender compares them with the run's
actual configuration and keeps what differs. Reward advice that is not a config field (DAPO's
soft overlong punishment) lives in ``EXTRA_ADVICE``.

>>> sorted(VARIANT_PRESETS)
['dapo', 'dr_grpo', 'gspo']
>>> preset("dr_grpo")
{'loss_type': 'dr_grpo', 'scale_rewards': 'none', 'beta': 0.0}
>>> preset("gspo", {"gradient_accumulation_steps": 4})["steps_per_generation"]
16
>>> preset(None)
{}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

VARIANT_PRESETS: dict[str, dict[str, Any]] = {
    "dapo": {
        "loss_type": "dapo",
        "epsilon": 0.2,
        "epsilon_high": 0.28,
        "mask_truncated_completions": True,
        "beta": 0.0,
    },
    "dr_grpo": {"loss_type": "dr_grpo", "scale_rewards": "none", "beta": 0.0},
    "gspo": {
        "importance_sampling_level": "sequence",
        "loss_type": "grpo",
        "epsilon": 3e-4,
        "epsilon_high": 4e-4,
        "beta": 0.0,
        # steps_per_generation = 4 x gradient_accumulation_steps, filled in by ``preset``:
        # GSPO's sequence-level ratio only acts when the run goes off-policy.
    },
}

EXTRA_ADVICE: dict[str, dict[str, str]] = {
    "dapo": {
        "reward_funcs": "+trl.rewards.get_soft_overlong_punishment(max_completion_len=<max_completion_length>, "
        "soft_punish_cache=<about max_completion_length // 4>)",
    },
}


def extra_advice(variant: str | None, max_completion_length: Any = None) -> dict[str, str]:
    """What ``variant`` asks beyond ``GRPOConfig`` (``EXTRA_ADVICE``), its numbers filled in from the run's
    ``max_completion_length`` where it is known; placeholders only where it is not.

    >>> extra_advice("dapo", 1024)["reward_funcs"]
    '+trl.rewards.get_soft_overlong_punishment(max_completion_len=1024, soft_punish_cache=256)'
    """
    advice = dict(EXTRA_ADVICE.get(variant or "", {}))
    cap = max_completion_length
    if "reward_funcs" in advice and type(cap) is int and cap > 0:
        advice["reward_funcs"] = (f"+trl.rewards.get_soft_overlong_punishment(max_completion_len={cap}, "
                                  f"soft_punish_cache={max(1, cap // 4)})")
    return advice


def preset(variant: str | None, config: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The plain preset of ``variant`` (a fresh dict), completed from the run's config where it
    depends on it. ``None`` gives ``{}``."""
    if variant is None:
        return {}
    if variant not in VARIANT_PRESETS:
        raise ValueError(f"unknown variant {variant!r}; expected one of {sorted(VARIANT_PRESETS)}")
    out = dict(VARIANT_PRESETS[variant])
    if variant == "gspo":
        ga = (config or {}).get("gradient_accumulation_steps") or 1
        try:
            ga = max(1, int(ga))
        except (TypeError, ValueError):
            ga = 1
        out["steps_per_generation"] = 4 * ga
    return out


def checkpointing(config: Mapping[str, Any]) -> tuple[str, Any]:
    """The setting that decides activation checkpointing in a config, and its value: transformers 5 renamed
    ``gradient_checkpointing`` to ``activation_checkpointing`` and reads the old name only while the new one is
    unset. ``("gradient_checkpointing", None)`` when neither is set (GRPOConfig then turns it on).

    >>> checkpointing({"activation_checkpointing": False, "gradient_checkpointing": True})
    ('activation_checkpointing', False)
    >>> checkpointing({"gradient_checkpointing": True}), checkpointing({})
    (('gradient_checkpointing', True), ('gradient_checkpointing', None))
    """
    for name in ("activation_checkpointing", "gradient_checkpointing"):
        if config.get(name) is not None:
            return name, config[name]
    return "gradient_checkpointing", None
