"""From a finding to a concrete change: the variant's overrides as a diff against the run's config.

The recipe's rules live here: plain GRPO first and a switch only on a confirmed (critical)
finding; GSPO for mixture-of-experts models; never a variant already tried in the lineage; and
no advice that would be a no-op: settings the run already has are dropped, and clip-higher or
GSPO's sequence-level ratio come with the off-policy change without which they do nothing.
What a restart would act on is ``recommend``; ``Recommender`` also keeps, for the reports, what
the user should still see: a warning's variant as advice, a variant tried earlier in the lineage,
a fix outside the config (``evidence["advice"]``).

A finding that names no variant can name a remedy: ``variant`` None, non-empty
``config_overrides`` and ``evidence["remedy"]`` (a short name such as ``lower_learning_rate`` or
``raise_max_completion_length``); the recommendation then carries that name in place of a variant.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from grpo_monitor.detectors.numbers import finite
from grpo_monitor.detectors.rule import TEAM_RULE
from grpo_monitor.detectors.variants import VARIANT_PRESETS, extra_advice, preset

VARIANT_NAMES = frozenset(VARIANT_PRESETS)


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
    return " ".join(" ".join([f"--{k}", *flag_values(v)]) for k, v in overrides.items())


def flag_values(v: Any) -> list[str]:
    """One setting's value as the command-line words after its flag.

    A list field (``reward_weights``) is one flag with one word per element, as ``HfArgumentParser`` reads
    ``nargs="+"``.

    >>> flag_values(True), flag_values([1.0, 0.0]), flag_values(0.28)
    (['True'], ['1.0', '0.0'], ['0.28'])
    """
    if isinstance(v, (list, tuple)):
        return [w for x in v for w in flag_values(x)]
    if isinstance(v, bool):
        return ["True" if v else "False"]
    return [str(v)]


def python_kwargs(overrides: Mapping[str, Any]) -> str:
    return "GRPOConfig(..., " + ", ".join(f"{k}={v!r}" for k, v in overrides.items()) + ")"


def _record(finding: Mapping[str, Any], variant: str, diff: dict[str, Any], extra: dict[str, Any],
            reasons: list[str], settings: Mapping[str, Any] | None = None,
            config: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A recommendation record: the diff as overrides, CLI flags and Python keywords, and why.

    ``settings`` are the change's own values before the diff; where the run already has them all
    (a variant tried earlier in the lineage), the flags and keywords spell them out instead of
    an empty change, and ``config_overrides`` stays the (empty) diff. ``current`` keeps the run's
    values of the changed settings, so the diff reads the same beside a later segment's config.
    """
    settings = dict(settings if settings is not None else diff)
    shown = diff or settings
    advice = (finding.get("evidence") or {}).get("advice")
    if isinstance(advice, str) and advice.strip():
        extra = {**extra, "advice": advice.strip()}
    return {
        "type": "recommendation",
        "step": finding.get("step"),
        "variant": variant,
        "detector": finding.get("detector"),
        "severity": finding.get("severity"),
        "config_overrides": diff,
        "current": {k: (config or {})[k] for k in diff if k in (config or {})},
        "settings": settings,
        "cli_flags": cli_flags(shown),
        "python": python_kwargs(shown) if shown else "",
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
    """The change a restart would make for ``finding`` (a finding dict), or None when there is
    nothing to change: a new variant or remedy with a non-empty diff, from a critical finding
    unless ``require_critical`` is False. ``Recommender`` also keeps what this leaves out (a
    warning's advice, a variant tried earlier) for the reports."""
    tried = set(tried)
    rec = _candidate(finding, dict(config or {}), is_moe=is_moe, tried=tried)
    if rec is None or (require_critical and finding.get("severity") != "critical"):
        return None
    if rec["variant"] in tried or not rec["config_overrides"]:
        return None
    rec["status"] = RECOMMENDED if finding.get("severity") == "critical" else ADVICE
    return rec


def _candidate(finding: Mapping[str, Any], config: dict[str, Any], *, is_moe: bool, tried: set[str],
               clipping_never_fired: bool = False) -> dict[str, Any] | None:
    """What ``finding`` names, as a record, whatever its severity and whether or not it was tried:
    None only when it names neither a variant, nor a remedy with its overrides, nor advice.
    ``clipping_never_fired``: the log's clip ratios are 0 at every step, so a run whose config is unknown
    is on-policy all the same."""
    if finding.get("detector") == MISMATCH_DETECTOR:
        return _mismatch_recommendation(finding, config, is_moe=is_moe, tried=tried)
    variant = finding.get("variant")
    if variant is None:
        remedy = remedy_of(finding)
        if remedy is not None and finding.get("config_overrides"):
            return _remedy_recommendation(finding, config, remedy, is_moe=is_moe, tried=tried)
        if advice_of(finding) is not None:
            reasons = [f"{finding.get('detector')} ({finding.get('severity')}) at step {finding.get('step')}: "
                       "the fix is a change outside the training config"]
            return _record(finding, remedy or CODE_CHANGE, {}, {}, reasons, settings={})
        return None
    reasons = [f"{finding.get('detector')} ({finding.get('severity')}) at step {finding.get('step')}"]
    if is_moe and variant != "gspo" and config.get("importance_sampling_level") != "sequence":
        reasons.append(f"mixture-of-experts model: the recipe requires GSPO, which replaces {variant}")
        variant = "gspo"
    overrides = dict(finding.get("config_overrides") or {}) if finding.get("variant") == variant else {}
    overrides = {**preset(variant, config), **overrides}
    diff = config_diff(overrides, config)
    if diff and config.get("loss_type") == "dapo" and variant == "dapo" and "loss_type" not in diff:
        reasons.append("the run already uses TRL's token-level 'dapo' loss; what DAPO still adds is below")
    needs_off_policy = ("epsilon_high" in diff) or diff.get("importance_sampling_level") == "sequence"
    on_policy = is_on_policy(config) or (clipping_never_fired and not config.get("num_iterations")
                                          and not config.get("steps_per_generation"))
    if needs_off_policy and on_policy and "steps_per_generation" not in diff:
        ga = int(config.get("gradient_accumulation_steps") or 1)
        diff["steps_per_generation"] = 4 * ga
        overrides["steps_per_generation"] = 4 * ga
        why = ("its clip ratios are 0 at every logged step" if not is_on_policy(config)
               else "importance ratio is 1, clipping never fires")
        reasons.append(
            f"the run is on-policy ({why}), so clip bounds only act "
            f"with off-policy steps: steps_per_generation={4 * ga}"
        )
    # The finding's own numbers first (its evidence holds the cap the run used), then the run's config.
    known = (finding.get("evidence") or {}).get("extra_advice")
    advice = extra_advice(variant, config.get("max_completion_length"))
    if isinstance(known, Mapping) and variant == "dapo":
        advice.update({k: v for k, v in known.items() if isinstance(v, str) and "<" not in v})
    return _record(finding, variant, diff, advice, reasons, settings=overrides, config=config)


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
    finding: Mapping[str, Any], config: dict[str, Any], *, is_moe: bool, tried: set[str]
) -> dict[str, Any] | None:
    """Importance-sampling correction for a drifting rollout engine; on MoE, with GSPO's sequence-level ratio."""
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
    if config.get("vllm_importance_sampling_correction") is False:
        reasons.append("the run has vLLM's importance-sampling correction turned off")
    diff = config_diff(overrides, config)
    extra = dict(MISMATCH_ADVICE)
    if is_moe:
        extra["routing"] = MISMATCH_MOE_ADVICE
    return _record(finding, variant, diff, extra, reasons, settings=overrides, config=config)


# --- a remedy that is not a variant: the run's own settings with the finding's overrides -------------

# What the lineage records for the lower-rate remedy (a name beside the variants, as a restart tries each once).
LOWER_LR = "lower_learning_rate"
# Remedies that answer a collapse or an instability: on a mixture-of-experts model they come with
# GSPO, whose sequence-level ratio the recipe requires there. Other remedies (a longer completion
# budget, say) leave the loss alone.
GSPO_ON_MOE_REMEDIES = frozenset({LOWER_LR, "lower_max_grad_norm"})
# Detectors whose lower-rate remedy answers a policy that collapsed.
COLLAPSE_DETECTORS = frozenset({"sudden_collapse", "no_learning_signal", "entropy_collapse"})
# The name of a fix outside the config (evidence["advice"] without overrides or a remedy name).
CODE_CHANGE = "code_change"


def remedy_of(finding: Mapping[str, Any]) -> str | None:
    """The remedy a finding names in ``evidence["remedy"]`` (a short name such as
    ``lower_learning_rate``), or None.

    >>> remedy_of({"evidence": {"remedy": "raise_max_completion_length"}})
    'raise_max_completion_length'
    >>> remedy_of({"evidence": {"remedy": ""}}) is None
    True
    """
    remedy = (finding.get("evidence") or {}).get("remedy")
    return remedy.strip() if isinstance(remedy, str) and remedy.strip() else None


def advice_of(finding: Mapping[str, Any]) -> str | None:
    advice = (finding.get("evidence") or {}).get("advice")
    return advice.strip() if isinstance(advice, str) and advice.strip() else None


def within_evidence(overrides: dict[str, Any], finding: Mapping[str, Any],
                    config: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The overrides a finding's evidence supports, and why any other was refused: no ``max_grad_norm``
    below the run's own typical norm (clipping there would clip most steps and freeze training), no
    ``learning_rate`` cut deeper than ten times (or ten times the schedule's logged jump).

    >>> within_evidence({"max_grad_norm": 5.7e-06}, {"evidence": {"recent_median": 0.1}}, {})[0]
    {}
    >>> within_evidence({"learning_rate": 1e-7}, {"evidence": {}}, {"learning_rate": 1e-5})[0]
    {}
    """
    ev = finding.get("evidence") or {}
    kept, refused = dict(overrides), []
    mgn = finite(kept.get("max_grad_norm"))
    typical = finite(ev.get("recent_median"))
    if mgn is not None and typical is not None and mgn < typical:
        kept.pop("max_grad_norm")
        refused.append(f"max_grad_norm={mgn:g} is below the run's typical grad norm ({typical:g}): it would clip "
                       "most steps and freeze training")
    lr, lr0 = finite(kept.get("learning_rate")), finite(config.get("learning_rate"))
    jump = finite(((ev.get("learning_rate_jump") or {}) if isinstance(ev.get("learning_rate_jump"), Mapping) else {}).get("ratio"))
    if lr is not None and lr0 is not None and lr0 > 0 and lr < 0.999 * lr0 / (10.0 * max(jump or 1.0, 1.0)):
        kept.pop("learning_rate")
        refused.append(f"learning_rate={lr:g} cuts the configured {lr0:g} by more than the evidence supports")
    return kept, refused


def _remedy_recommendation(
    finding: Mapping[str, Any], config: dict[str, Any], remedy: str, *, is_moe: bool, tried: set[str]
) -> dict[str, Any]:
    """The finding's own overrides under the remedy's name. A policy that collapsed under its
    learning rate gets the same recipe at a lower one, from a checkpoint before the onset (the
    restart's checkpoint choice reads the finding's onset); on MoE, collapse remedies come with GSPO."""
    overrides, refused = within_evidence(dict(finding.get("config_overrides") or {}), finding, config)
    variant = remedy
    head = f"{finding.get('detector')} ({finding.get('severity')}) at step {finding.get('step')}"
    extra: dict[str, Any] = {"refused": refused} if refused else {}
    changes = ", ".join(f"{k} {config[k]!r} -> {v!r}" if k in config else f"{k}={v!r}" for k, v in overrides.items())
    if remedy == LOWER_LR and finding.get("detector") in COLLAPSE_DETECTORS:
        reasons = [f"{head}: the policy collapsed; resume before step {finding.get('onset_step')} with a lower learning rate"]
    elif remedy == LOWER_LR:
        reasons = [f"{head}: resume before step {finding.get('onset_step')} with a lower learning rate ({changes})"]
    else:
        reasons = [f"{head} names the remedy {remedy}: {changes}"]
    if remedy == LOWER_LR:
        extra["resume"] = f"from the newest checkpoint saved before step {finding.get('onset_step')}"
    if (is_moe and remedy in GSPO_ON_MOE_REMEDIES and config.get("importance_sampling_level") != "sequence"
            and "gspo" not in tried):
        variant = "gspo"
        overrides = {**preset("gspo", config), **overrides}
        reasons.append("mixture-of-experts model: the recipe requires GSPO's sequence-level importance ratio")
    return _record(finding, variant, config_diff(overrides, config), extra, reasons, settings=overrides, config=config)


# --- what each record is to the user --------------------------------------------------------------

# A confirmed (critical) finding's new change: what auto-restart acts on when it is on.
RECOMMENDED = "recommended"
# A warning's (or info's) variant or remedy, or a fix outside the config: shown, never a restart.
ADVICE = "advice"
# A variant or remedy an earlier segment of this lineage already switched to.
TRIED = "tried"
# The run's config already has every setting of it (a variant the user chose by hand).
IN_CONFIG = "in_config"


def tried_segments(tried: Iterable[str] | Mapping[str, int | None], segment: int | None = None) -> dict[str, int | None]:
    """Each variant tried in the lineage with the segment that first ran with it, counted from 1 as
    every screen shows segments (the first launch is 1, ``segment-<n>/`` is n + 1). ``tried`` is in
    the order the restarts chose them, one per restart, and ``segment`` the current segment as
    headers record it (from 0); without it the segments are unknown (None).

    >>> tried_segments(["dapo", "lower_learning_rate"], segment=2)
    {'dapo': 2, 'lower_learning_rate': 3}
    >>> tried_segments(["dapo"])
    {'dapo': None}
    """
    if isinstance(tried, Mapping):
        return dict(tried)
    names = [t for t in tried if isinstance(t, str) and t]
    known = isinstance(segment, int) and not isinstance(segment, bool) and segment >= len(names)
    return {name: (segment - len(names) + i + 2 if known else None) for i, name in enumerate(names)}


def lineage_options(header: Mapping[str, Any] | None) -> dict[str, Any]:
    """``Recommender`` keywords from a run header: the variants its lineage tried, and its segment."""
    header = header or {}
    tried = header.get("tried_variants")
    segment = header.get("segment")
    return {"tried": list(tried) if isinstance(tried, list) else [],
            "segment": segment if isinstance(segment, int) and not isinstance(segment, bool) else None}


def title(rec: Mapping[str, Any]) -> str:
    """One line naming a recommendation record and what it is: a switch, advice (never a restart),
    a variant tried earlier in the lineage, or settings the run already has.

    >>> title({"variant": "dapo", "status": "advice", "severity": "warning"})
    'advice: switch to dapo (from a warning finding; advice only, never triggers a restart)'
    >>> title({"variant": "dapo", "status": "tried", "tried_in_segment": 2})
    'dapo: tried in segment 2 of this lineage; already in this run'
    >>> title({"variant": "lower_learning_rate"})
    'apply lower_learning_rate'
    """
    name = str(rec.get("variant") or "change")
    status = rec.get("status") or RECOMMENDED
    if name == CODE_CHANGE:
        change = "change the code"
    elif name == TEAM_RULE:
        change = "follow the team rule's advice"
    else:
        change = f"switch to {name}" if name in VARIANT_NAMES else f"apply {name}"
    if status == TRIED:
        seg = rec.get("tried_in_segment")
        where = f"in segment {seg}" if seg is not None else "earlier"
        return f"{name}: tried {where} of this lineage; already in this run" if not rec.get("config_overrides") \
            else f"{name}: tried {where} of this lineage, not retried"
    if status == IN_CONFIG:
        return f"{name}: already in this run's config"
    if status == ADVICE:
        return f"advice: {change} (from a{'n' if str(rec.get('severity', '')).startswith('i') else ''} " \
               f"{rec.get('severity') or 'non-critical'} finding; advice only, never triggers a restart)"
    return change


class Recommender:
    """The recommendations of one run's findings, in the order they are raised, each with its
    ``status``: a confirmed finding's new change (``recommended``: each once per run, the one an
    auto-restart acts on), a warning's ``advice`` (never a restart), a change ``tried`` in an earlier
    segment of the lineage (with ``tried_in_segment``), or one the run's config already has
    (``in_config``). Every finding that names a variant, a remedy or advice gets a record once per
    kind. Used alike by the live callback, ``analyze`` and the dashboard's replay.

    >>> r = Recommender({"loss_type": "grpo", "gradient_accumulation_steps": 1}, tried=["dapo"], segment=1)
    >>> rec = r({"detector": "entropy_collapse", "severity": "critical", "step": 40, "variant": "dapo"})
    >>> rec["status"], rec["tried_in_segment"]
    ('tried', 2)
    >>> r({"detector": "length_reward_coupling", "severity": "warning", "step": 41, "variant": "dr_grpo"})["status"]
    'advice'
    """

    def __init__(self, config: Mapping[str, Any] | None = None, *, is_moe: bool = False,
                 tried: Iterable[str] | Mapping[str, int | None] = (), segment: int | None = None,
                 clipping_never_fired: bool = False) -> None:
        self.config = dict(config or {})
        self.is_moe = is_moe
        # Offline logs without the config: clip ratios logged as 0 at every step say the run is on-policy.
        self.clipping_never_fired = clipping_never_fired
        self.lineage = tried_segments(tried, segment)
        # Tried in the lineage or recommended in this run: neither is recommended again.
        self.tried = set(self.lineage)
        self._shown: set[tuple[Any, ...]] = set()

    def __call__(self, finding: Mapping[str, Any]) -> dict[str, Any] | None:
        if finding.get("detector") == "moe_model_detected":
            # Foreign logs have no model facts: the run's own routing metrics say it is MoE.
            self.is_moe = True
        rec = _candidate(finding, self.config, is_moe=self.is_moe, tried=self.tried,
                         clipping_never_fired=self.clipping_never_fired)
        if rec is None:
            return None
        variant = rec["variant"]
        if not rec["settings"]:
            rec["status"] = ADVICE
            key: tuple[Any, ...] = (variant, ADVICE, finding.get("detector"), rec["extra"].get("advice"))
        elif variant in self.lineage:
            rec["status"], rec["tried_in_segment"] = TRIED, self.lineage[variant]
            key = (variant, TRIED)
        elif variant in self.tried:
            return None
        elif not rec["config_overrides"]:
            rec["status"] = IN_CONFIG
            key = (variant, IN_CONFIG)
        elif finding.get("severity") == "critical":
            rec["status"] = RECOMMENDED
            self.tried.add(variant)
            key = (variant, RECOMMENDED)
        else:
            rec["status"] = ADVICE
            key = (variant, ADVICE)
        if key in self._shown:
            return None
        self._shown.add(key)
        return rec
