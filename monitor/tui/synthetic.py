"""A deterministic recorded run for the dashboard's tests, benchmark and screenshots.

The run tells a familiar story: entropy collapses from step 24 (a critical
``entropy_collapse`` finding at step 30), then completion length starts tracking reward (a
``length_reward_coupling`` warning and a Dr. GRPO recommendation at step 42). Values are pure
functions of the step, so two builds are byte-identical.

>>> import tempfile, pathlib
>>> from grpo_monitor.monitor.runlog import read_run
>>> d = pathlib.Path(tempfile.mkdtemp()) / "run"
>>> write_synthetic_run(d, steps=50)
>>> log = read_run(d)
>>> len(log.steps), len(log.findings), len(log.recommendations), len(log.samples)
(50, 2, 1, 200)
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from typing import Any

from grpo_monitor.detectors.base import DETECTOR_IDS
from grpo_monitor.monitor.runlog import RunWriter

T0 = 1_700_000_000.0
REWARD_FUNCS = ["correctness_reward", "format_reward"]
CONFIG: dict[str, Any] = {
    "output_dir": "outputs-grpo",
    "loss_type": "dapo",
    "num_generations": 8,
    "learning_rate": 5e-07,
    "beta": 0.01,
    "max_completion_length": 256,
    "importance_sampling_level": "token",
    "epsilon": 0.2,
    "epsilon_high": 0.28,
    "scale_rewards": "group",
    "per_device_train_batch_size": 8,
    "gradient_accumulation_steps": 4,
    "steps_per_generation": 4,
    "num_iterations": 1,
    "mask_truncated_completions": False,
    "logging_steps": 1,
    "seed": 3407,
    "use_vllm": True,
    "vllm_mode": "colocate",
}
FINDINGS = [
    {
        "detector": "entropy_collapse", "severity": "critical", "step": 30, "onset_step": 24, "variant": "dapo",
        "config_overrides": {"epsilon_high": 0.28, "beta": 0.0, "mask_truncated_completions": True},
        "evidence": {"statistic": "entropy / baseline", "baseline": 0.43, "current": 0.081, "ratio": 0.19,
                     "threshold": 0.35, "window": 20},
        "message": "Entropy fell to 19% of its baseline since step 24: the policy is collapsing. "
                   "Switch to DAPO (clip-higher, no KL penalty).",
    },
    {
        "detector": "length_reward_coupling", "severity": "warning", "step": 42, "onset_step": 36,
        "variant": "dr_grpo", "config_overrides": {"loss_type": "dr_grpo", "scale_rewards": "none", "beta": 0.0},
        "evidence": {"statistic": "spearman(length, reward)", "rho": 0.91, "p_value": 2.1e-05,
                     "baseline_rho": 0.12, "window": 12},
        "message": "Completion length rises with reward regardless of correctness since step 36. "
                   "Dr. GRPO removes the length bias.",
    },
]
RECOMMENDATION = {
    "step": 42, "variant": "dr_grpo", "detector": "length_reward_coupling",
    "config_overrides": {"loss_type": "dr_grpo", "scale_rewards": "none", "beta": 0.0},
    "cli_flags": "--loss_type dr_grpo --scale_rewards none --beta 0.0",
    "python": "GRPOConfig(..., loss_type='dr_grpo', scale_rewards='none', beta=0.0)",
    "reasons": ["length_reward_coupling: length tracks reward (rho 0.91) while correctness is flat",
                "scale_rewards='none' removes the per-group std division that amplified it"],
}


def header(moe: bool = True, run_id: str = "demo-run", segment: int = 0, **extra: Any) -> dict[str, Any]:
    """A header record's fields; ``segment`` counts from 0 as the callback records it."""
    model = (
        {"class": "Qwen3MoeForCausalLM", "num_parameters": 1_234_567, "is_moe": True, "num_experts": 8,
         "top_k": 2, "num_layers": 2, "moe_layers": [0, 1]}
        if moe
        else {"class": "Qwen3ForCausalLM", "num_parameters": 96_128, "is_moe": False, "num_experts": None,
              "top_k": None, "num_layers": 2, "moe_layers": []}
    )
    return {
        "run_id": run_id, "start_time": T0, "versions": {"trl": "1.16.0", "transformers": "5.24.0"},
        "config": dict(CONFIG), "model": model, "world_size": 1, "parent_run": None,
        "reward_funcs": list(REWARD_FUNCS), "correctness_reward": "correctness_reward",
        "format_reward": "format_reward", "segment": segment, **extra,
    }


def _h(step: int, k: int) -> float:
    """A deterministic pseudo-random number in [0, 1) per (step, k)."""
    x = math.sin(step * 12.9898 + k * 78.233) * 43758.5453
    return x - math.floor(x)


def step_record(step: int, moe: bool = True) -> dict[str, Any]:
    s = step
    collapse = max(0.0, s - 24.0)
    entropy = 0.43 * math.exp(-collapse / 6.0) + 0.02 + 0.02 * _h(s, 1)
    growth = max(0.0, s - 36.0)
    mean_len = 60 + 0.3 * s + 9.0 * growth + 6 * _h(s, 2)
    max_len = min(256.0, mean_len * 1.8 + 10 * _h(s, 3))
    clipped = 0.0 if max_len < 256 else 0.05 + 0.05 * _h(s, 4)
    correct = 0.3 + 0.25 * (1 - math.exp(-s / 20)) + 0.05 * _h(s, 5)
    fmt_r = 0.6 + 0.3 * (1 - math.exp(-s / 10)) + 0.03 * _h(s, 6)
    off_policy = s % 4 != 0  # steps_per_generation=4: three in four steps are off-policy
    metrics: dict[str, Any] = {
        "loss": 0.01 * _h(s, 7) - 0.005,
        "grad_norm": 0.8 + 0.4 * _h(s, 8) + (6.0 if s in (31, 32) else 0.0),
        "learning_rate": 5e-07,
        "num_tokens": float(s * 8 * 8 * (mean_len + 40)),
        "completions/mean_length": mean_len,
        "completions/min_length": mean_len * 0.4,
        "completions/max_length": max_len,
        "completions/clipped_ratio": clipped,
        "completions/mean_terminated_length": mean_len * (0.95 if clipped else 1.0),
        "completions/min_terminated_length": mean_len * 0.4,
        "completions/max_terminated_length": max_len * 0.97,
        "rewards/correctness_reward/mean": correct,
        "rewards/correctness_reward/std": 0.4,
        "rewards/format_reward/mean": fmt_r,
        "rewards/format_reward/std": 0.2,
        "reward": correct + fmt_r,
        "reward_std": 0.45,
        "frac_reward_zero_std": min(1.0, 0.05 + 0.02 * collapse + 0.05 * _h(s, 9)),
        "entropy": entropy,
        "kl": 0.002 * s * (1 + 0.2 * _h(s, 10)),
        "clip_ratio/low_mean": (0.01 + 0.01 * _h(s, 11)) if off_policy else 0.0,
        "clip_ratio/high_mean": (0.02 + 0.02 * _h(s, 12)) if off_policy else 0.0,
        "clip_ratio/region_mean": (0.03 + 0.03 * _h(s, 13)) if off_policy else 0.0,
        "clip_ratio/low_min": 0.0,
        "clip_ratio/high_max": (0.05 + 0.05 * _h(s, 14)) if off_policy else 0.0,
        "step_time": 12.5 + _h(s, 15),
        "epoch": s / 1000.0,
        "samples/correct_rate": correct,
    }
    rec: dict[str, Any] = {"type": "step", "step": s, "time": T0 + 10.0 * s, "metrics": metrics}
    if moe:
        hot = max(0.0, min(1.0, (s - 28) / 10.0))
        load = []
        for layer in range(2):
            raw = [1.0 + 0.3 * _h(s, 20 + layer * 8 + e) for e in range(8)]
            raw[3 + layer] += 6.0 * hot  # one expert takes over after the collapse
            tot = sum(raw)
            load.append([round(v / tot, 5) for v in raw])
        rec["moe_load"] = load
        metrics["aux_loss"] = 2.0 + 1.5 * hot + 0.05 * _h(s, 30)
        metrics["moe/flip_rate"] = 0.04 + 0.1 * hot + 0.01 * _h(s, 31)
        metrics["moe/load_cv"] = 0.1 + 0.9 * hot
    states = {}
    for d in DETECTOR_IDS:
        if d == "moe_model_detected":
            states[d] = "ok" if moe else "disabled"
        elif d == "moe_instability" and not moe:
            states[d] = "disabled"
        elif s < 10:
            states[d] = "warming_up"
        elif d == "entropy_collapse" and s >= 30:
            states[d] = "critical"
        elif d == "length_reward_coupling" and s >= 42:
            states[d] = "warning"
        else:
            states[d] = "ok"
    rec["detectors"] = states
    return rec


COMPLETIONS = [
    "<think>3 + 4 is 7.</think><answer>7</answer>",
    "<think>Add the numbers: 3 and 4 make 7, so the answer is 7.</think><answer>7</answer>",
    "<answer>12</answer>",
    "<think>Counting up from three: four, five, six, seven, eight.</think><answer>8</answer>",
]


def sample_records(step: int, n: int, completions: list[str] | None = None) -> list[dict[str, Any]]:
    out = []
    texts = completions or COMPLETIONS
    for i in range(n):
        text = texts[(step + i) % len(texts)]
        correct = "<answer>7</answer>" in text
        length = 12 + len(text) // 3 + int(_h(step, 40 + i) * 20)
        out.append({
            "step": step, "rank": 0, "index": i, "group": i // 8, "length": length, "truncated": length >= 256,
            "rewards": {"correctness_reward": 1.0 if correct else 0.0,
                        "format_reward": 1.0 if text.startswith("<think>") else 0.5},
            "correct": correct, "prompt": f"What is 3 + 4? (problem {step})", "completion": text,
        })
    return out


def append_steps(
    writer: RunWriter, steps: Iterable[int], moe: bool = True, samples_per_step: int = 4,
    findings: bool = True, completions: list[str] | None = None,
) -> None:
    """Append step records (and their samples, findings and recommendation) to an open writer."""
    for s in steps:
        writer.write(step_record(s, moe))
        if samples_per_step:
            writer.samples(sample_records(s, samples_per_step, completions))
        if findings:
            for f in FINDINGS:
                if f["step"] == s:
                    writer.write({"type": "finding", **f})
            if RECOMMENDATION["step"] == s:
                writer.write({"type": "recommendation", **RECOMMENDATION})


def write_synthetic_run(
    run_dir: str | os.PathLike[str], steps: int = 50, *, moe: bool = True, samples_per_step: int = 4,
    findings: bool = True, summary: bool = False, completions: list[str] | None = None, run_id: str = "demo-run",
) -> None:
    """Write a complete recorded run (header, ``steps`` steps, samples, findings, recommendation)."""
    w = RunWriter(run_dir)
    try:
        w.header(**header(moe, run_id=run_id))
        append_steps(w, range(1, steps + 1), moe, samples_per_step, findings, completions)
        if summary:
            w.write({"type": "summary", "step": steps, "metrics": {"train_runtime": 10.0 * steps}})
    finally:
        w.close()
