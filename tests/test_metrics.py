import math

import pytest

from grpo_monitor.core.metrics import decode, derive_metrics, encode, normalize, normalize_metrics, reward_components


@pytest.mark.parametrize(
    "raw, canonical",
    [
        ("entropy", "entropy"),
        ("completion_length", "completions/mean_length"),
        ("rewards/correctness_reward_func", "rewards/correctness_reward_func/mean"),
        ("rewards/format_reward/std", "rewards/format_reward/std"),
        ("actor/entropy", "entropy"),
        ("response_length/mean", "completions/mean_length"),
        ("response_length/clip_ratio", "completions/clipped_ratio"),
        ("critic/score/mean", "reward"),
        ("actor/pg_clipfrac", "clip_ratio/region_mean"),
        ("actor/grad_norm", "grad_norm"),
        ("train/completions/mean_length", "completions/mean_length"),
        ("train/rewards/f", "rewards/f/mean"),
        ("some/unknown_metric", "some/unknown_metric"),
    ],
)
def test_names_map_onto_trl_1_16(raw, canonical):
    assert normalize(raw) == canonical


def test_normalize_metrics_keeps_gaps_and_non_finite_values_and_drops_text():
    out = normalize_metrics({"entropy": None, "loss": float("nan"), "completion_length": 12, "note": "text", "step": 3})
    assert out["entropy"] is None and math.isnan(out["loss"]) and out["completions/mean_length"] == 12.0
    assert "note" not in out and "step" not in out


def test_canonical_name_wins_over_alias():
    out = normalize_metrics({"completions/mean_length": 10.0, "completion_length": 99.0})
    assert out["completions/mean_length"] == 10.0


def test_reward_components_and_non_finite_codec():
    assert reward_components(["rewards/a/mean", "rewards/a/std", "reward", "rewards/b/mean"]) == ["a", "b"]
    for v in (1.5, None, math.inf, -math.inf):
        assert decode(encode(v)) == v
    assert math.isnan(decode(encode(math.nan)))


@pytest.mark.parametrize(
    "raw, canonical",
    [
        # W&B / Trinity-RFT / verl research-fork CSV exports
        ("score", "reward"),
        ("score_mean", "reward"),
        ("rewards_mean", "reward"),
        ("critic/score/mean", "reward"),
        ("len_mean", "completions/mean_length"),
        ("len_max", "completions/max_length"),
        ("len_clip_ratio", "completions/clipped_ratio"),
        ("response_clip_ratio", "completions/clipped_ratio"),
        ("response_length_mean", "completions/mean_length"),
        ("pg_loss", "loss"),
        # prime-rl
        ("reward/mean", "reward"),
        ("completion_len/mean", "completions/mean_length"),
        ("is_truncated/mean", "completions/clipped_ratio"),
        ("entropy/mean", "entropy"),
        ("optim/grad_norm", "grad_norm"),
        ("optim/lr", "learning_rate"),
        ("metrics/exact_match_reward", "rewards/exact_match_reward/mean"),
        ("metrics/length_penalty_reward", "rewards/length_penalty_reward/mean"),
        # Tinker
        ("env/all/reward/total", "reward"),
        ("env/all/correct", "rewards/correct/mean"),
        ("env/all/ac_tokens_per_turn", "completions/mean_length"),
        ("optim/entropy", "entropy"),
        # hand-written console lines
        ("Reward", "reward"),
        ("Avg Len", "completions/mean_length"),
        ("Correct", "rewards/correct/mean"),
        ("Fmt", "rewards/fmt/mean"),
        ("KL_ref", "kl"),
        ("format_reward", "rewards/format_reward/mean"),
        # left alone: evaluation columns that are not a held-out score, prompt lengths, other statistics, TRL's own names
        ("eval/loss", "eval/loss"),
        ("val-aux/num_turns/mean", "val-aux/num_turns/mean"),
        ("prompt_length/mean", "prompt_length/mean"),
        ("seq_len/mean", "seq_len/mean"),
        ("entropy/max", "entropy/max"),
        ("completions/mean_terminated_length", "completions/mean_terminated_length"),
        ("frac_reward_zero_std", "frac_reward_zero_std"),
        ("rewards/format_reward/std", "rewards/format_reward/std"),
    ],
)
def test_export_spellings_map_by_kind(raw, canonical):
    assert normalize(raw) == canonical


@pytest.mark.parametrize(
    ("raw", "canonical"),
    [
        # TRL's own evaluation names are canonical; TensorBoard's eval/ prefix and old TRL's component names map onto them
        ("eval_reward", "eval_reward"),
        ("eval_rewards/accuracy_reward/mean", "eval_rewards/accuracy_reward/mean"),
        ("eval/reward", "eval_reward"),
        ("eval/rewards/accuracy_reward/mean", "eval_rewards/accuracy_reward/mean"),
        ("eval_rewards/accuracy_reward", "eval_rewards/accuracy_reward/mean"),
        # verl: one score per data source
        ("val/test_score/openai/gsm8k", "eval_reward"),
        ("val-core/openai/gsm8k/acc/mean@1", "eval_accuracy"),
        ("val-aux/openai/gsm8k/reward/mean@1", "eval_reward"),
        # Tinker, Trinity-RFT, custom loops
        ("test/env/all/reward/total", "eval_reward"),
        ("val_acc_mean1", "eval_accuracy"),
        ("val_reward", "eval_reward"),
        ("test_score", "eval_reward"),
        ("val/acc", "eval_accuracy"),
        ("Val Score", "eval_reward"),
    ],
)
def test_held_out_scores_map_onto_two_eval_names(raw, canonical):
    assert normalize(raw) == canonical


def test_tinker_group_outcomes_give_the_share_of_groups_without_spread():
    parts = {"env/all/by_group/frac_all_good": 0.25, "env/all/by_group/frac_all_bad": 0.5}
    assert derive_metrics(parts) == {"frac_reward_zero_std": 0.75}
    assert derive_metrics({**parts, "frac_reward_zero_std": 0.1}) is None
    assert derive_metrics({"reward": 1.0}) is None
