import math

import pytest

from monitor.metrics import decode, encode, normalize, normalize_metrics, reward_components


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
