"""From a finding to a concrete change: the variant's overrides as a diff against the run's config.

The recipe's rules live here: plain GRPO first and a switch only on a confirmed (critical)
finding; GSPO for mixture-of-experts models; never a variant already tried in the lineage; and
no advice that would be a no-op: settings the run already has are dropped, and clip-higher or
GSPO's sequence-level ratio come with the off-policy change without which they do nothing.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from grpo_monitor.detectors.variants import EXTRA_ADVICE, preset


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool) and not isinstance(b, bool):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)
    return a == b


def is_on_policy(config: Mapping[str, Any]) -> bool:
    """True when the importance ratio is identically 1 (TRL: one iteration, one generation per optimizer step)."""
    if not config:
        return False  # unknown (foreign logs): do not guess
    ga = int(config.get("gradient_accumulation_steps") or 1)
    spg = config.get("steps_per_generation") or ga
    return int(config.get("num_iterations") or 1) <= 1 and int(spg) <= ga


def config_diff(overrides: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in overrides.items() if not (k in config and _same(config[k], v))}


def cli_flags(overrides: Mapping[str, Any]) -> str:
    """The same change as TRL command-line flags (``trl grpo``, ``HfArgumentParser`` scripts)."""
    return " ".join(f"--{k} {_flag_value(v)}" for k, v in overrides.items())


def _flag_value(v: Any) -> str:
    if isinstance(v, bool):
        return "True" if v else "False"
    return str(v)


def python_kwargs(overrides: Mapping[str, Any]) -> str:
    return "GRPOConfig(..., " + ", ".join(f"{k}={v!r}" for k, v in overrides.items()) + ")"


def _record(finding: Mapping[str, Any], variant: str, diff: dict[str, Any], extra: dict[str, Any],
            reasons: list[str]) -> dict[str, Any]:
    """A recommendation record: the diff as overrides, CLI flags and Python keywords, and why."""
    return {
        "type": "recommendation",
        "step": finding.get("step"),
        "variant": variant,
        "detector": finding.get("detector"),
        "config_overrides": diff,
        "cli_flags": cli_flags(diff),
        "python": python_kwargs(diff),
        "extra": extra,
        "reasons": reasons,
    }


def recommend(
    finding: Mapping[str, Any],
    config: Mapping[str, Any] | None = None,
    *,
    is_moe: bool = False,
    tried: Iterable[str] = (),
    require_critical: bool = True,
) -> dict[str, Any] | None:
    """The recommendation record for ``finding`` (a finding dict), or None when there is nothing to change."""
    config = dict(config or {})
    if finding.get("detector") == MISMATCH_DETECTOR:
        return _mismatch_recommendation(finding, config, is_moe=is_moe, tried=tried, require_critical=require_critical)
    if finding.get("variant") is None and (finding.get("evidence") or {}).get("remedy") == LOWER_LR:
        return _lower_lr_recommendation(finding, config, is_moe=is_moe, tried=tried, require_critical=require_critical)
    variant = finding.get("variant")
    if variant is None or (require_critical and finding.get("severity") != "critical"):
        return None
    reasons = [f"{finding.get('detector')} ({finding.get('severity')}) at step {finding.get('step')}"]
    if is_moe and variant != "gspo" and config.get("importance_sampling_level") != "sequence":
        reasons.append(f"mixture-of-experts model: the recipe requires GSPO, which replaces {variant}")
        variant = "gspo"
    if variant in set(tried):
        return None
    overrides = dict(finding.get("config_overrides") or {}) if finding.get("variant") == variant else {}
    overrides = {**preset(variant, config), **overrides}
    diff = config_diff(overrides, config)
    if not diff:
        return None
    if config.get("loss_type") == "dapo" and variant == "dapo" and "loss_type" not in diff:
        reasons.append("the run already uses TRL's token-level 'dapo' loss; what DAPO still adds is below")
    needs_off_policy = ("epsilon_high" in diff) or diff.get("importance_sampling_level") == "sequence"
    if needs_off_policy and is_on_policy(config) and "steps_per_generation" not in diff:
        ga = int(config.get("gradient_accumulation_steps") or 1)
        diff["steps_per_generation"] = 4 * ga
        reasons.append(
            "the run is on-policy (importance ratio is 1, clipping never fires), so clip bounds only act "
            f"with off-policy steps: steps_per_generation={4 * ga}"
        )
    advice = EXTRA_ADVICE.get(variant, {})
    return _record(finding, variant, diff, dict(advice), reasons)


# --- train-inference mismatch ---------------------------------------------------------------------

MISMATCH_DETECTOR = "rollout_mismatch"
# What the lineage records for the mismatch fix on a dense model (the variants are GRPO's own).
IS_CORRECTION = "is_correction"
# TRL's vLLM importance-sampling correction set to sequence-level masked IS in the band practitioners
# alarm outside (0.5-2): sequences the engine sampled off the trainer's policy drop out of the loss.
IS_CORRECTION_OVERRIDES: dict[str, Any] = {
    "vllm_importance_sampling_correction": True,
    "vllm_importance_sampling_mode": "sequence_mask",
    "vllm_importance_sampling_clip_min": 0.5,
    "vllm_importance_sampling_clip_max": 2.0,
}
MISMATCH_ADVICE: dict[str, str] = {
    "precision": "run the inference engine in the trainer's precision: vLLM's dtype equal to the trainer's "
    "(bf16=True with a bfloat16 engine, or fp16 on both sides); fp32 logits (lm_head) on both sides where the "
    "engine allows it",
    "weights": "check that the engine receives every weight update (sleep mode, LoRA and resumed runs have "
    "lost syncs); a mismatch that grows while the learning rate is 0 is an engine-side drift",
}
MISMATCH_MOE_ADVICE = ("mixture-of-experts routing differs between the engine and the trainer: replay the "
                       "rollout's routing in training where the framework supports it (routing replay)")


def _mismatch_recommendation(
    finding: Mapping[str, Any], config: dict[str, Any], *, is_moe: bool, tried: Iterable[str], require_critical: bool
) -> dict[str, Any] | None:
    """Importance-sampling correction for a drifting rollout engine; on MoE, with GSPO's sequence-level ratio."""
    if require_critical and finding.get("severity") != "critical":
        return None
    tried = set(tried)
    reasons = [f"{finding.get('detector')} ({finding.get('severity')}) at step {finding.get('step')}: rollouts are "
               "off the trainer's policy; sequence-level masked importance sampling drops the sequences the engine "
               "sampled off-policy"]
    overrides = dict(IS_CORRECTION_OVERRIDES)
    variant = IS_CORRECTION
    if is_moe and config.get("importance_sampling_level") != "sequence" and "gspo" not in tried:
        variant = "gspo"
        overrides = {**preset("gspo", config), **overrides}
        reasons.append("mixture-of-experts model: the recipe requires GSPO's sequence-level importance ratio, "
                       "with the vLLM correction at sequence level too")
    if variant in tried:
        return None
    if config.get("vllm_importance_sampling_correction") is False:
        reasons.append("the run has vLLM's importance-sampling correction turned off")
    diff = config_diff(overrides, config)
    if not diff:
        return None
    extra = dict(MISMATCH_ADVICE)
    if is_moe:
        extra["routing"] = MISMATCH_MOE_ADVICE
    return _record(finding, variant, diff, extra, reasons)


# --- a collapse: the run's own settings, resumed before the onset with a lower learning rate ----------

# What the lineage records for this change (a name beside the variants, as a restart tries each once).
LOWER_LR = "lower_learning_rate"


def _lower_lr_recommendation(
    finding: Mapping[str, Any], config: dict[str, Any], *, is_moe: bool, tried: Iterable[str], require_critical: bool
) -> dict[str, Any] | None:
    """A policy that collapsed under its learning rate: the same recipe at a lower one, from a checkpoint
    before the onset (the restart's checkpoint choice reads the finding's onset). On MoE, with GSPO."""
    if require_critical and finding.get("severity") != "critical":
        return None
    tried = set(tried)
    overrides = dict(finding.get("config_overrides") or {})
    if not overrides:
        return None
    variant = LOWER_LR
    reasons = [f"{finding.get('detector')} ({finding.get('severity')}) at step {finding.get('step')}: the policy "
               f"collapsed; resume before step {finding.get('onset_step')} with a lower learning rate"]
    if is_moe and config.get("importance_sampling_level") != "sequence" and "gspo" not in tried:
        variant = "gspo"
        overrides = {**preset("gspo", config), **overrides}
        reasons.append("mixture-of-experts model: the recipe requires GSPO's sequence-level importance ratio")
    if variant in tried:
        return None
    diff = config_diff(overrides, config)
    if not diff:
        return None
    return _record(finding, variant, diff,
                   {"resume": f"from the newest checkpoint saved before step {finding.get('onset_step')}"}, reasons)


class Recommender:
    """The recommendations of one run's findings, in the order they are raised: each variant once,
    and never one already tried in the lineage. Used alike by the live callback, ``analyze`` and
    the dashboard's replay."""

    def __init__(self, config: Mapping[str, Any] | None = None, *, is_moe: bool = False, tried: Iterable[str] = ()) -> None:
        self.config = dict(config or {})
        self.is_moe = is_moe
        self.tried = set(tried)

    def __call__(self, finding: Mapping[str, Any]) -> dict[str, Any] | None:
        if finding.get("detector") == "moe_model_detected":
            # Foreign logs have no model facts: the run's own routing metrics say it is MoE.
            self.is_moe = True
        rec = recommend(finding, self.config, is_moe=self.is_moe, tried=self.tried)
        if rec is not None:
            self.tried.add(rec["variant"])
        return rec
