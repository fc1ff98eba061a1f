"""Metric names: every reader and the live callback pass names through ``normalize``.

The canonical names are the ones TRL 1.16's ``GRPOTrainer`` logs (``entropy``,
``completions/mean_length``, ``rewards/<func>/mean``, ...). Older TRL releases, verl and
TensorBoard's ``train/`` prefix are mapped onto them here and nowhere else; a name this module
does not know is carried along unchanged.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping
from typing import Any

from grpo_monitor.detectors.numbers import to_number

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
    "critic/advantages/mean": "advantages/mean",
    "critic/advantages/max": "advantages/max",
    "critic/advantages/min": "advantages/min",
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
    # a trainer counting its iterations or updates (case and spaces aside, see ``export_name``)
    "step": "step",
    "iteration": "step",
    "iter": "step",
    "update": "step",
    # the transformers notebook progress table: "Training Loss", "Validation Loss"
    "training_loss": "loss",
    "validation_loss": "eval_loss",
}

# Train-inference mismatch (rollouts from an inference engine scored again by the trainer). TRL's
# ``sampling/*`` names are canonical; the quantities TRL does not log get ``mismatch/*`` names.
MISMATCH_ALIASES: dict[str, str] = {
    # prime-rl
    "mismatch_kl/mean": "mismatch/kl",
    "mismatch_kl/max": "mismatch/kl_max",
    "masked_mismatch_kl/mean": "mismatch/masked_kl",
    "is_masked/mean": "mismatch/masked_fraction",
    "is_masked": "mismatch/masked_fraction",
    # verl
    "rollout_corr/kl": "mismatch/kl",
    "rollout_corr/k3_kl": "mismatch/k3_kl",
    "rollout_corr/log_ppl_diff": "mismatch/log_ppl_diff",
    "rollout_corr/ppl_ratio": "mismatch/ppl_ratio",
    "rollout_corr/rollout_is_mean": "sampling/importance_sampling_ratio/mean",
    "rollout_corr/rollout_is_min": "sampling/importance_sampling_ratio/min",
    "rollout_corr/rollout_is_max": "sampling/importance_sampling_ratio/max",
    "rollout_corr/rollout_is_eff_sample_size": "mismatch/ess",
    "training/rollout_probs_diff_mean": "mismatch/probs_diff/mean",
    "training/rollout_probs_diff_max": "mismatch/probs_diff/max",
    "training/rollout_probs_diff_std": "mismatch/probs_diff/std",
    "training/rollout_actor_probs_pearson_corr": "mismatch/probs_corr",
    # Tinker
    "optim/kl_sample_train_v1": "mismatch/kl",
    "optim/kl_sample_train_v2": "mismatch/k2_kl",
    # hand-written loops
    "kl_k3": "mismatch/k3_kl",
    "ess": "mismatch/ess",
}
for _k, _v in MISMATCH_ALIASES.items():
    ALIASES.setdefault(_k, _v)
# verl's rejection-sampling masks: ``rollout_corr/rollout_rs_<mode>_masked_fraction``.
_MISMATCH_MASKED = re.compile(r"^rollout_corr/rollout_rs_(?:\w+_)?masked_fraction$")

# -- Export spellings -------------------------------------------------------------------------
# W&B/Trinity-RFT/verl CSV exports, prime-rl, Tinker and hand-written trainers spell the same few
# quantities in families of names. Each family maps onto one TRL name. The patterns are anchored
# and never match a name TRL itself logs, so a canonical name is never rewritten; evaluation
# columns (``val_*``, ``test/*``, ``eval_*``) stay as they are.
EXPORT_ALIASES: dict[str, str] = {
    "rewards/mean": "reward",
    "rewards/total": "reward",
    "env/all/reward/total": "reward",
    "env/all/ac_tokens_per_turn": "completions/mean_length",
    "is_truncated/mean": "completions/clipped_ratio",
    "response_clip_ratio": "completions/clipped_ratio",
}
for _k, _v in EXPORT_ALIASES.items():
    ALIASES.setdefault(_k, _v)
_STAT_SUFFIX = {"mean": "mean_length", "avg": "mean_length", "max": "max_length", "min": "min_length"}
_EXPORT_FAMILIES: tuple[tuple[re.Pattern[str], Any], ...] = (
    # total reward: score, score_mean, critic/score/mean, reward/mean, rewards_mean, mean_reward, Reward
    (re.compile(r"^(?:critic/|env/all/)?(?:score|scores|reward|rewards)(?:[/_](?:mean|avg|total))?$"), "reward"),
    (re.compile(r"^(?:mean|avg|average|total)_(?:reward|score)s?$"), "reward"),
    (re.compile(r"^(?:critic/)?(?:score|scores|reward|rewards)[/_]std$"), "reward_std"),
    # completion length: len_mean, completion_len/mean, response_length_mean, Avg Len
    (re.compile(r"^(?:actor/|rollout/)?(?:len|length|completion_len|completion_length|completions_length|response_len|"
                r"response_length|resp_len|gen_len|generation_length|output_len|output_length)[/_](mean|avg|max|min)$"),
     lambda m: "completions/" + _STAT_SUFFIX[m.group(1)]),
    (re.compile(r"^(?:mean|avg|average)_(?:len|length|completion_len|completion_length|response_length)$"),
     "completions/mean_length"),
    # share of completions cut at the cap: len_clip_ratio, response_length_clip_ratio, truncated_ratio
    (re.compile(r"^(?:len|length|completion_len|completion_length|response_len|response_length|response|completion)"
                r"[/_](?:clip_ratio|clipped_ratio|clip_frac|truncated|truncated_ratio|truncation_rate)$"),
     "completions/clipped_ratio"),
    (re.compile(r"^(?:frac|fraction|share)_truncated$|^truncat(?:ed|ion)_(?:ratio|rate|frac)$"), "completions/clipped_ratio"),
    # entropy: entropy/mean (prime-rl), optim/entropy (Tinker), policy_entropy
    (re.compile(r"^(?:actor/|optim/|policy/)?entropy(?:[/_](?:mean|avg))?$|^(?:mean|avg|policy)_entropy$"), "entropy"),
    (re.compile(r"^(?:actor/|optim/|policy/)?(?:grad_norm|gradient_norm|grad_norm_mean)$"), "grad_norm"),
    (re.compile(r"^(?:actor/|optim/)?(?:lr|learning_rate)$"), "learning_rate"),
    (re.compile(r"^(?:actor/)?(?:kl|kl_ref|ref_kl|kl_div|kl_divergence|kl_mean)(?:/mean)?$"), "kl"),
    (re.compile(r"^(?:loss/mean|actor_loss|policy_loss|pg_loss)$"), "loss"),
    # reward components: metrics/<x>_reward (prime-rl), env/all/correct (Tinker), Correct/Fmt columns
    (re.compile(r"^metrics/([^/]+_reward)$"), lambda m: f"rewards/{m.group(1)}/mean"),
    (re.compile(r"^env/all/(correct|correctness|accuracy|format|format_\w+)$"), lambda m: f"rewards/{m.group(1)}/mean"),
    (re.compile(r"^(correct|correctness|accuracy|acc|fmt|format)$"), lambda m: f"rewards/{m.group(1)}/mean"),
    (re.compile(r"^(?!(?:mean|avg|average|total|train|eval|val|valid|validation|test)_)(\w+_reward)$"),
     lambda m: f"rewards/{m.group(1)}/mean"),
)
_CANONICAL_FOLDED = frozenset({"reward", "reward_std", "entropy", "grad_norm", "loss", "learning_rate", "kl",
                               "frac_reward_zero_std", "epoch"})


@functools.lru_cache(maxsize=8192)
def export_name(name: str) -> str | None:
    """The TRL name of an export spelling (case, spaces and hyphens aside), or None.

    >>> export_name("score_mean"), export_name("Avg Len"), export_name("metrics/exact_match_reward")
    ('reward', 'completions/mean_length', 'rewards/exact_match_reward/mean')
    >>> export_name("val_acc_mean1") is None, export_name("test/env/all/reward/total") is None
    (True, True)
    """
    folded = name.strip().lower().replace(" ", "_").replace("-", "_")
    if folded in _CANONICAL_FOLDED:
        return folded
    if folded != name and folded in ALIASES:
        return ALIASES[folded]
    for pattern, target in _EXPORT_FAMILIES:
        m = pattern.match(folded)
        if m:
            return target if isinstance(target, str) else target(m)
    return None


# -- Evaluation metrics ----------------------------------------------------------------------
# A held-out score logged beside training: TRL prefixes its evaluation metrics with ``eval_`` (``eval_reward``,
# ``eval_rewards/<func>/mean``) and those names are canonical. The others' held-out *scores* map onto two
# of them: ``eval_reward`` (a reward or score) and ``eval_accuracy`` (a share correct). verl logs one per data
# source (``val/test_score/<source>``, ``val-core/<source>/reward/mean@N``, ``val-core/<source>/acc/mean@N``):
# where a log holds several, the first one logged is read. Other evaluation columns keep their names.
EVAL_REWARD = "eval_reward"
EVAL_ACCURACY = "eval_accuracy"
_EVAL_HEAD = r"(?:val|valid|validation|test|eval|evaluation|heldout|held_out|dev)"
_EVAL_FAMILIES: tuple[tuple[re.Pattern[str], Any], ...] = (
    # TensorBoard's and W&B's ``eval/<TRL name>``: TRL's own ``eval_<TRL name>``
    (re.compile(r"^eval/(rewards/[^/]+/(?:mean|std))$"), lambda m: f"eval_{m.group(1)}"),
    (re.compile(r"^eval[/_]rewards/([^/]+)$"), lambda m: f"eval_rewards/{m.group(1)}/mean"),
    # verl
    (re.compile(r"^val/test_score(?:/.+)?$"), EVAL_REWARD),
    (re.compile(r"^val-(?:core|aux)/.+/(?:reward|score)/mean@\d+$"), EVAL_REWARD),
    (re.compile(r"^val-(?:core|aux)/.+/(?:acc|accuracy)/mean@\d+$"), EVAL_ACCURACY),
    # Tinker's test environment
    (re.compile(r"^test/env/all/reward/total$"), EVAL_REWARD),
    (re.compile(r"^test/env/all/(?:correct|correctness|accuracy)$"), EVAL_ACCURACY),
    # custom loops and exports: test_score, val_reward, eval/score, val/reward/mean, val_acc, val_acc_mean1
    (re.compile(rf"^{_EVAL_HEAD}[/_](?:score|scores|reward|rewards|return|returns)(?:[/_](?:mean|avg|total))?$"), EVAL_REWARD),
    (re.compile(rf"^(?:mean|avg)_{_EVAL_HEAD}_(?:score|reward)$"), EVAL_REWARD),
    (re.compile(rf"^{_EVAL_HEAD}[/_](?:acc|accuracy|correct|correctness|exact_match|em|pass@1|success_rate|solve_rate)"
                r"(?:[/_]?(?:mean|avg)\d*)?$"), EVAL_ACCURACY),
)


@functools.lru_cache(maxsize=4096)
def eval_name(name: str) -> str | None:
    """The canonical name of a held-out score (``eval_reward``, ``eval_accuracy``, ``eval_rewards/<f>/mean``),
    or None for a name that is not one.

    >>> eval_name("val/test_score/openai/gsm8k"), eval_name("val_acc_mean1"), eval_name("test_score")
    ('eval_reward', 'eval_accuracy', 'eval_reward')
    >>> eval_name("eval/rewards/accuracy_reward/mean"), eval_name("eval/loss"), eval_name("reward")
    ('eval_rewards/accuracy_reward/mean', None, None)
    """
    folded = name.strip().lower().replace(" ", "_").replace("-", "_") if not name.startswith("val-") else name
    for pattern, target in _EVAL_FAMILIES:
        m = pattern.match(folded)
        if m:
            return target if isinstance(target, str) else target(m)
    return None


# Derived where a logger reports the parts: Tinker counts groups whose completions all passed or
# all failed; together they are the groups without reward spread.
_ZERO_STD_PARTS = ("env/all/by_group/frac_all_good", "env/all/by_group/frac_all_bad")


def derive_metrics(metrics: Mapping[str, float | None]) -> dict[str, float | None] | None:
    """The canonical metrics a step's logged parts imply, or None when there are none to add."""
    if "frac_reward_zero_std" in metrics:
        return None
    good, bad = metrics.get(_ZERO_STD_PARTS[0]), metrics.get(_ZERO_STD_PARTS[1])
    if good is None or bad is None:
        return None
    return {"frac_reward_zero_std": float(good) + float(bad)}


# Prefixes stripped before lookup: TensorBoard's (TRL writes ``train/<key>``) and verl's.
_PREFIXES = ("train/",)
# The transformers notebook progress table humanises TRL's names with spaces around the slashes
# ("completions / mean_length", "rewards / check_answer / mean"): the name is TRL's without them.
_SPACED_SLASH = re.compile(r"\s*/\s*")
_REWARD_COMPONENT = re.compile(r"^rewards/([^/]+)$")
# Keys the Trainer adds only to its end-of-training summary.
SUMMARY_KEYS = frozenset({"train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss", "total_flos"})


def normalize(name: str) -> str:
    """Map a metric name from any supported logger onto its TRL 1.16 name.

    >>> normalize("completion_length"), normalize("rewards/format_reward"), normalize("actor/entropy")
    ('completions/mean_length', 'rewards/format_reward/mean', 'entropy')
    >>> normalize("train/rewards/format_reward/std"), normalize("my_custom_metric")
    ('rewards/format_reward/std', 'my_custom_metric')
    >>> normalize("completions / mean_length"), normalize("rewards / check_answer"), normalize("Training Loss")
    ('completions/mean_length', 'rewards/check_answer/mean', 'loss')
    """
    if "/ " in name or " /" in name:
        name = _SPACED_SLASH.sub("/", name.strip())
    for prefix in _PREFIXES:
        if name.startswith(prefix) and name != "train/global_step":
            name = name[len(prefix):]
            break
    if name in ALIASES:
        return ALIASES[name]
    if _MISMATCH_MASKED.match(name):
        return "mismatch/masked_fraction"
    m = _REWARD_COMPONENT.match(name)
    if m:
        return f"rewards/{m.group(1)}/mean"
    return eval_name(name) or export_name(name) or name


def normalize_metrics(logs: Mapping[str, Any]) -> dict[str, float | None]:
    """Normalise every name of one logged step and coerce its values; non-numeric values are dropped."""
    out: dict[str, float | None] = {}
    for key, value in logs.items():
        if not isinstance(key, str):
            continue
        if value is not None and not isinstance(value, (int, float)) and to_number(value) is None:
            continue
        name = normalize(key)
        if name == "step":
            continue
        # When a run logs both an alias and the canonical name, the canonical one wins.
        if name in out and key != name:
            continue
        out[name] = to_number(value, bools=True)  # a logged flag is kept as 1.0/0.0
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
    return to_number(value) if isinstance(value, (int, float)) else None
