"""Diagnoses that logs without entropy, length-paying rewards and saturated shaping terms need.

Each case is a small labelled stream replayed through the whole engine (every detector), the way
``analyze`` sees a log.
"""

from __future__ import annotations

import math

from grpo_monitor.detectors.base import RunContext
from grpo_monitor.core.engine import Engine


def alarms(steps, context=None):
    engine = Engine(context or RunContext())
    for step, metrics in steps:
        engine.update(step, metrics)
    return [f for f in engine.findings if f.severity in ("warning", "critical")]


def wobble(step: int, scale: float) -> float:
    """Deterministic noise (no RNG: the same on every machine)."""
    return scale * math.sin(1.7 * step) * math.cos(0.3 * step)


def test_pinned_at_the_cap_while_the_task_reward_falls_is_degenerate_long_cot_without_entropy():
    # Older TRL/Unsloth logs: no entropy, no config. Completions climb onto the 512 cap from step 80
    # while the reward falls; the cap is read off completions/max_length.
    steps = []
    for step in range(5, 205, 5):
        late = max(0.0, min(1.0, (step - 80) / 40))
        steps.append((step, {
            "completions/mean_length": 440 + 68 * late + wobble(step, 6),
            "completions/max_length": 512.0,
            "completions/clipped_ratio": min(1.0, 0.75 + 0.24 * late + wobble(step, 0.03)),
            "reward": 0.55 - 0.45 * late + wobble(step, 0.15),
            "reward_std": 0.4,
            "frac_reward_zero_std": 0.05,
        }))
    found = [f for f in alarms(steps) if f.detector == "degenerate_long_cot"]
    assert found and found[0].step <= 150 and found[0].variant == "dapo"
    assert found[0].evidence["mean_length"]["max_completion_length"] == 512.0  # the cap, read off the log
    assert {"length_to_cap", "pinned_at_cap"} & set(found[0].evidence["signals"])


def test_a_run_at_the_cap_from_the_start_whose_reward_rises_is_not_degenerating():
    steps = [(step, {"completions/mean_length": 192.0, "completions/max_length": 192.0, "completions/clipped_ratio": 1.0,
                     "reward": -0.1 + 0.3 * step / 720 + wobble(step, 0.1), "reward_std": 0.4, "frac_reward_zero_std": 0.05})
             for step in range(2, 722, 2)]
    assert [f.detector for f in alarms(steps) if f.detector == "degenerate_long_cot"] == []


def test_reward_paying_for_length_is_coupling_even_when_entropy_rises_and_completions_hit_the_cap():
    # A length bonus: total reward climbs with length, correctness flat, entropy doubles, truncation high.
    context = RunContext(config={"max_completion_length": 64}, reward_names=["correctness_reward", "length_bonus"],
                         correctness_reward="correctness_reward")
    steps = []
    for step in range(1, 151):
        grow = max(0.0, min(1.0, (step - 30) / 40))
        length = 12 + 50 * grow + wobble(step, 1.0)
        steps.append((step, {
            "entropy": 0.4 * (1 + 1.6 * grow) + wobble(step, 0.02),
            "completions/mean_length": length,
            "completions/clipped_ratio": min(1.0, 0.9 * grow + abs(wobble(step, 0.03))),
            "rewards/correctness_reward/mean": 0.3 + wobble(step, 0.05),
            "rewards/length_bonus/mean": 0.05 * length,
            "reward": 0.3 + 0.05 * length + wobble(step, 0.05),
            "reward_std": 0.5,
            "frac_reward_zero_std": 0.1,
        }))
    found = alarms(steps, context)
    detectors = {f.detector for f in found}
    assert "length_reward_coupling" in detectors and "degenerate_long_cot" not in detectors
    assert next(f for f in found if f.detector == "length_reward_coupling").variant == "dr_grpo"


def test_format_saturated_from_the_start_while_exact_match_never_moves_is_divergence():
    # Shaping terms at their ceiling from step 1, the correctness component at ~1 % throughout.
    context = RunContext(reward_names=["fmt", "affix_reward", "exact_match_reward"], correctness_reward="exact_match_reward")
    steps = [(step, {"rewards/fmt/mean": 1.0 if step % 9 else 0.9, "rewards/affix_reward/mean": 0.96 + wobble(step, 0.01),
                     "rewards/exact_match_reward/mean": max(0.0, 0.01 + wobble(step, 0.01)), "reward": 0.4})
             for step in range(1, 301)]
    found = [f for f in alarms(steps, context) if f.detector == "reward_component_divergence"]
    assert found and found[0].step <= 100 and found[0].evidence["pattern"] == "saturated"
    assert "near zero" in found[0].message


def test_saturated_format_with_correctness_learning_stays_quiet():
    context = RunContext(reward_names=["format_reward", "correctness_reward"], correctness_reward="correctness_reward")
    steps = [(step, {"rewards/format_reward/mean": 1.0, "rewards/correctness_reward/mean": 0.05 + 0.5 * step / 300 + wobble(step, 0.02),
                     "reward": 1.0}) for step in range(1, 301)]
    assert [f for f in alarms(steps, context) if f.detector == "reward_component_divergence"] == []


def test_truncation_onto_the_cap_with_falling_reward_counts_without_a_length_column():
    # Exports that keep only the truncated share (Trinity-RFT's response_clip_ratio) and the score.
    steps = []
    for step in range(1, 201):
        late = max(0.0, min(1.0, (step - 80) / 30))
        steps.append((step, {"completions/clipped_ratio": min(1.0, 0.3 + 0.68 * late + abs(wobble(step, 0.02))),
                             "reward": 0.6 - 0.4 * late + wobble(step, 0.05)}))
    found = [f for f in alarms(steps) if f.detector == "degenerate_long_cot"]
    assert found and found[0].variant == "dapo" and "pinned_at_cap" in found[0].evidence["signals"]
