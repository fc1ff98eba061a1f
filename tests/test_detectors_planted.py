"""Each detector on runs with a planted failure (it must fire, with its variant, by the labelled
step) and on healthy runs of many shapes (nothing may fire), replayed through the real engine at
``logging_steps`` 1 and 10; plus the traps real logs set for metric-based detectors."""

from __future__ import annotations

import math

import pytest

from grpo_monitor.detectors import (
    ALL_DETECTORS,
    DegenerateLongCot,
    EntropyCollapse,
    LengthRewardCoupling,
    MoeInstability,
    NoLearningSignal,
    NonFinite,
)
from grpo_monitor.detectors.advantage_mask_bug import AdvantageMaskBug
from grpo_monitor.detectors.base import RunContext
from grpo_monitor.detectors.entropy_rise import EntropyRise
from grpo_monitor.detectors.kl_pinned import KlPinned
from grpo_monitor.detectors.length_collapse import LengthCollapse
from grpo_monitor.detectors.moe_model_detected import MoeModelDetected
from grpo_monitor.detectors.reward_component_divergence import RewardComponentDivergence
from grpo_monitor.detectors.variants import VARIANT_PRESETS
from grpo_monitor.fixtures.synthetic import FAILURES, HEALTHY, generate
from grpo_monitor.core.engine import Engine
from grpo_monitor.core.session import open_session
from grpo_monitor.fixtures.judge import judge

SEEDS = (0, 1, 2)


def replay(run):
    """The run through the one session every driver uses: the detectors, then the diagnosis."""
    session = open_session(run.context)
    for step, metrics in run.steps:
        session.update(step, metrics, run.samples.get(step, []))
    return session.findings


def alarms(findings):
    return [f for f in findings if f.severity in ("warning", "critical")]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("logging_steps", (1, 10))
@pytest.mark.parametrize("name", FAILURES)
def test_planted_failure_is_found_in_time_with_its_variant(name, logging_steps, seed):
    run = generate(name, seed=seed, logging_steps=logging_steps)
    found = replay(run)
    verdict = judge(run.labels, found)
    summary = [(f.detector, f.severity, f.step, f.variant) for f in alarms(found)]
    # The one judge (evaluate.py's semantics), and beyond it: in time, and nothing outside the label.
    assert verdict.kind == "hit" and verdict.variant_ok, (verdict, summary)
    assert verdict.in_time, f"raised at {verdict.step}, after the failure was plain at {run.labels['fail']}: {summary}"
    assert verdict.others == [], summary
    first = min((f for f in alarms(found) if f.detector in run.labels["expect"]), key=lambda f: f.step)
    if first.variant:
        assert set(VARIANT_PRESETS[first.variant]) <= set(first.config_overrides)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("logging_steps", (1, 10))
@pytest.mark.parametrize("name", HEALTHY)
def test_healthy_run_raises_no_alarm(name, logging_steps, seed):
    run = generate(name, seed=seed, logging_steps=logging_steps)
    found = replay(run)
    assert [(f.detector, f.severity, f.step) for f in alarms(found)] == []
    if run.context.is_moe:
        assert [f.detector for f in found if f.detector != "extreme_start"] == ["moe_model_detected"]


# --- traps -----------------------------------------------------------------------------------------

def _feed(det, series, context=None, samples=None):
    det.start(context or RunContext())
    out = []
    for step, m in series:
        out += det.update(step, m, (samples or {}).get(step, []))
    return out


def _healthy_metrics(step: int, h: float) -> dict:
    return {"entropy": h, "frac_reward_zero_std": 0.05, "reward_std": 0.4, "reward": 0.5 + 0.001 * (step % 5),
            "completions/mean_length": 200.0, "completions/clipped_ratio": 0.02}


def test_normal_early_entropy_drop_is_not_a_collapse():
    # 73% of the entropy spent in the first 1/12 of training, as in healthy runs, with the
    # diversity signals that a rising accuracy brings.
    series = []
    for step in range(1, 601):
        h = 0.3 + 2.7 * math.exp(-step / 12)
        m = _healthy_metrics(step, h)
        m["frac_reward_zero_std"] = 0.05 + 0.4 * step / 600
        series.append((step, m))
    assert _feed(EntropyCollapse(), series) == []


@pytest.mark.parametrize("direction", (0.05, 20.0))
def test_one_step_entropy_spikes_do_not_fire(direction):
    series = []
    for step in range(1, 301):
        h = 0.4 * (direction if step % 37 == 0 else 1.0)
        m = _healthy_metrics(step, h)
        if step % 37 == 0:
            m.update({"frac_reward_zero_std": 1.0, "reward_std": 0.0, "completions/clipped_ratio": 1.0,
                      "completions/mean_length": 1024.0, "reward": 0.0})
        series.append((step, m))
    ctx = RunContext(config={"max_completion_length": 1024})
    for det in (EntropyCollapse(), DegenerateLongCot(), NoLearningSignal()):
        assert _feed(det, series, ctx) == [], det.id


def test_masked_truncation_zero_entropy_is_a_gap_not_a_collapse():
    # mask_truncated_completions=True with every completion truncated logs entropy exactly 0.0.
    series = []
    for step in range(1, 201):
        m = _healthy_metrics(step, 0.4)
        if 100 <= step < 106:
            m.update({"entropy": 0.0, "grad_norm": 0.0, "completions/clipped_ratio": 1.0, "clip_ratio/low_min": None})
        series.append((step, m))
    assert _feed(EntropyCollapse(), series, RunContext(config={"mask_truncated_completions": True})) == []


def test_random_init_model_at_the_length_cap_from_the_start_is_not_degenerating():
    series = [(s, {"entropy": 5.8 + 0.01 * (s % 3), "completions/mean_length": 64.0, "completions/clipped_ratio": 1.0,
                   "reward": 0.0}) for s in range(1, 201)]
    assert _feed(DegenerateLongCot(), series, RunContext(config={"max_completion_length": 64})) == []


def test_continuous_reward_zero_std_share_stays_silent():
    run = generate("healthy_continuous", seed=0)
    assert all(m.get("frac_reward_zero_std") in (0.0, None) for _, m in run.steps)
    assert _feed(NoLearningSignal(), run.steps, run.context) == []


def test_moe_instability_never_fires_on_a_dense_run_with_the_same_symptoms():
    run = generate("moe_instability", seed=0)
    dense = [(s, {k: v for k, v in m.items() if k != "aux_loss" and not k.startswith("moe/")}) for s, m in run.steps]
    ctx = RunContext(config=run.context.config, model={"is_moe": False})
    assert _feed(MoeInstability(), dense, ctx) == []
    assert _feed(MoeModelDetected(), dense, ctx) == []
    # The same run with its MoE facts is caught.
    assert _feed(MoeInstability(), run.steps, run.context)


def test_moe_is_recognised_from_logged_metrics_alone():
    run = generate("moe_instability_no_routing", seed=0)
    found = _feed(MoeInstability(), run.steps, RunContext())
    assert found and found[0].variant == "gspo"
    [info] = _feed(MoeModelDetected(), run.steps, RunContext())
    assert info.severity == "info" and info.variant == "gspo" and info.evidence["source"] == "logged MoE metrics"


def test_moe_model_detected_says_whether_the_run_already_uses_gspo():
    ctx = RunContext(model={"is_moe": True, "num_experts": 8, "top_k": 2},
                     config={"importance_sampling_level": "sequence", "gradient_accumulation_steps": 1})
    [f] = _feed(MoeModelDetected(), [(1, {"loss": 0.1}), (2, {"loss": 0.1})], ctx)
    assert f.severity == "info" and f.variant is None and f.config_overrides == {} and "already uses GSPO" in f.message
    ctx.config["importance_sampling_level"] = "token"
    [f] = _feed(MoeModelDetected(), [(1, {"loss": 0.1})], ctx)
    assert f.variant == "gspo" and f.config_overrides["importance_sampling_level"] == "sequence"


def test_entropy_collapse_reports_the_entropy_performance_ceiling():
    run = generate("entropy_collapse", seed=0)
    found = _feed(EntropyCollapse(), run.steps, run.context, run.samples)
    fit = found[0].evidence["entropy_performance_fit"]
    assert fit["a"] > 0 and math.isfinite(fit["predicted_ceiling"])
    assert "frac_reward_zero_std_up" in found[-1].evidence["corroborated_by"]


def test_entropy_collapse_sees_identical_completions_in_samples():
    run = generate("entropy_collapse", seed=0)
    found = _feed(EntropyCollapse(), run.steps, run.context, run.samples)
    assert any("identical_completions" in f.evidence["corroborated_by"] for f in found)


@pytest.mark.parametrize("seed", SEEDS)
def test_one_collapse_is_one_episode_while_correctness_holds_at_its_floor(seed):
    # Correctness rose before the entropy fell and then stood still at the collapsed floor: that earlier gain
    # was weighed when the collapse was raised, so it must not end the episode and raise it a second time.
    run = generate("entropy_collapse", seed=seed)
    found = _feed(EntropyCollapse(), run.steps, run.context, run.samples)
    assert [f.severity for f in found] == ["warning", "critical"], [(f.severity, f.step) for f in found]


def _coarse_collapse(recover_at=None):
    """Logged every 10 steps: entropy settles near 0.9, falls to 0.05 from step 150 (back at ``recover_at``),
    correctness flat, and after the fall the groups' spread flickers: five points where a few groups regain
    it, five where none do."""
    out = []
    for i, s in enumerate(range(10, 601, 10)):
        if s <= 150 or (recover_at is not None and s >= recover_at):
            h, fz, rs = 0.9 + 0.03 * (i % 3), 0.3 + 0.05 * (i % 2), 0.8
        else:
            h = max(0.05, 0.9 * math.exp(-(s - 150) / 30)) * (1 + 0.1 * (i % 2))
            fz, rs = (0.5, 0.8) if (i // 5) % 2 == 0 else (1.0, 0.0)
        out.append((s, {"entropy": h, "frac_reward_zero_std": fz, "reward_std": rs,
                        "rewards/accuracy/mean": 0.5 + 0.01 * (i % 4), "reward": 0.5 + 0.01 * (i % 4)}))
    return out


def test_a_raised_collapse_lasts_while_entropy_stays_down_though_the_spread_flickers():
    # The corroborating loss of spread opens the episode; its flicker on a coarse log must not end it and
    # raise the same collapse again every fifty steps.
    found = _feed(EntropyCollapse(), _coarse_collapse())
    assert [f.severity for f in found] == ["warning", "critical"], [(f.severity, f.step) for f in found]


def test_a_raised_collapse_ends_when_entropy_comes_back():
    det = EntropyCollapse()
    found = _feed(det, _coarse_collapse(recover_at=400))
    assert [f.severity for f in found] == ["warning", "critical"] and det.state == "ok" and not det.in_episode


@pytest.mark.parametrize("tokens, raised", [(3.0, False), (300.0, True)])
def test_length_coupling_needs_a_rise_in_tokens_not_only_a_ratio(tokens, raised):
    # The same doubling while correctness stalls: from 300 tokens it is the length bias Dr. GRPO cures; from
    # 3 tokens (a choice letter, a label) it is a change of format.
    series = [(s, {"completions/mean_length": tokens * (1.0 if s < 60 else 1.0 + (s - 60) / 60),
                   "rewards/accuracy/mean": 0.4 + 0.002 * (s % 7), "reward": 0.4 + 0.002 * (s % 7)})
              for s in range(1, 201)]
    found = _feed(LengthRewardCoupling(), series)
    assert bool(found) is raised, [(f.severity, f.step, f.evidence["mean_length"]) for f in found]


def _short_structured(step, entropy):
    """A short fixed-format answer (a JSON action of 17-20 tokens): its longest length recurs at every
    step, nothing is ever cut, and a 2-completion batch often comes out all alike."""
    lo = 17.0 + (step * 7) % 3 if step % 11 else 19.0
    hi = 20.0 if step % 11 else 19.0
    return {"entropy": entropy, "completions/mean_length": (lo + hi) / 2, "completions/min_length": lo,
            "completions/max_length": hi, "completions/clipped_ratio": 0.0, "reward": 0.1 + 0.001 * (step % 5)}


@pytest.mark.parametrize("cut, raised", [(0.0, False), (0.3, True)])
def test_degenerate_long_cot_takes_the_longest_length_for_the_cap_only_where_completions_were_cut(cut, raised):
    # Entropy doubles and the mean length creeps from 17.5 to 20 tokens, up to the longest length seen. With
    # nothing cut that longest length is the answer's own, not a cap; with a third of the batch cut it is.
    series = []
    for s in range(1, 301):
        m = _short_structured(s, 0.12 * (1.0 if s < 100 else 2.2))
        if s >= 100:
            m.update({"completions/mean_length": 20.0, "completions/min_length": 20.0})
        m["completions/clipped_ratio"] = cut if s >= 100 else 0.0
        series.append((s, m))
    det = DegenerateLongCot()
    found = _feed(det, series)
    assert bool(found) is raised, [(f.severity, f.step, f.evidence.get("signals")) for f in found]
    assert (det.length_cap is None) is (not raised)


@pytest.mark.parametrize("base_cut, raised", [(1.0, False), (0.1, True)])
def test_degenerate_long_cot_needs_the_truncated_share_to_rise_not_to_sit_at_one(base_cut, raised):
    # A tiny cap (16 tokens) and entropy that jumps 2.5x for a few steps while the reward falls. Where every
    # completion was cut from the start, truncation has not grown and nothing is degenerating into long text;
    # where a tenth was cut and then all are, it has.
    series = []
    for s in range(1, 121):
        spike = 60 <= s < 68
        m = {"entropy": 0.5 + 0.05 * ((s * 7) % 5) / 4 + (0.8 if spike else 0.0),
             "completions/mean_length": 16.0 if (s >= 60 or base_cut == 1.0) else 14.0,
             "completions/max_length": 16.0, "completions/clipped_ratio": 1.0 if s >= 60 else base_cut,
             "reward": -1.0 - (0.8 if s >= 60 else 0.1 * ((s * 3) % 4) / 3)}
        series.append((s, m))
    found = _feed(DegenerateLongCot(), series, RunContext(config={"max_completion_length": 16}))
    assert bool(found) is raised, [(f.severity, f.step, f.evidence.get("signals")) for f in found]
    if raised:
        assert "truncation_up" in found[0].evidence["signals"]


@pytest.mark.parametrize("config, severities", [({"beta": 0.04}, ["warning", "critical"]), ({}, ["info"]),
                                                ({"beta": 0.0}, [])])
def test_kl_logged_as_zero_is_an_alarm_only_where_the_run_says_beta_is_above_zero(config, severities):
    # 200 steps of kl = 0.0 with gradients flowing. With beta > 0 the updates miss the policy; with the beta
    # unknown (a trainer_state.json) the zeros may be the placeholder Unsloth logs when beta is 0.
    series = [(s, {"kl": 0.0, "grad_norm": 0.08, "learning_rate": 1e-6, "reward": 1.8 + 0.1 * (s % 3)})
              for s in range(1, 201)]
    found = _feed(KlPinned(), series, RunContext(config=config))
    assert [f.severity for f in found] == severities
    if severities == ["info"]:
        assert "does not say the run's beta" in found[0].message


@pytest.mark.parametrize("learns, raised", [(True, False), (False, True)])
def test_shorter_answers_while_a_sparse_correctness_rises_are_concise_not_a_collapse(learns, raised):
    # One prompt, six completions a step: correctness is k/6 of a 2.0 score, mostly 0, so its median stays 0
    # at every level below one half. Length halves from 170 to 80 tokens; where one step in three from step 120
    # gets one or two of its six right (mean ~0.17), the model is learning concise answers.
    series = []
    for s in range(1, 251):
        right = (1 + (s * 5) % 2) if (learns and s >= 120 and s % 3 == 0) else (1 if s % 37 == 0 else 0)
        length = 170.0 - 90.0 * min(1.0, max(0, s - 100) / 100) + (s * 7) % 9
        series.append((s, {"completions/mean_length": length, "rewards/correctness_reward_func/mean": 2.0 * right / 6,
                           "reward": 0.5 + 2.0 * right / 6}))
    found = _feed(LengthCollapse(), series, RunContext(correctness_reward="correctness_reward_func"))
    assert bool(found) is raised, [(f.severity, f.step, f.evidence.get("correctness_means")) for f in found]


def test_equal_lengths_by_chance_after_the_mask_measured_different_ones_are_not_a_mask_bug():
    # Now and then the two completions of a fixed-format answer come out alike, for four steps in a row at
    # 19, 18, 19 and 20 tokens; the steps between show the mask ends completions where they end.
    def alike(s, length):
        return {**_short_structured(s, 0.3), "completions/min_length": length, "completions/max_length": length,
                "completions/mean_length": length}

    series = [(s, alike(s, (19.0, 18.0, 19.0, 20.0)[s % 50 - 10]) if 10 <= s % 50 < 14 else _short_structured(s, 0.3))
              for s in range(1, 200)]
    found = _feed(AdvantageMaskBug(), series)
    assert found == [], [(f.severity, f.step) for f in found]
    # Alike from the first step on: the mask has never shown a difference, and the invariant stands.
    bug = [(s, alike(s, 19.0 + (s % 2))) for s in range(1, 10)]
    assert [f.severity for f in _feed(AdvantageMaskBug(), bug)] == ["critical"]


@pytest.mark.parametrize("reward_gain, severities", [(0.0, ["warning", "critical"]), (0.2, ["warning"])])
def test_an_entropy_rise_while_the_task_reward_improves_stays_a_warning(reward_gain, severities):
    # Entropy settles near 0.12 nats and doubles from step 100; the reward is noisy (a tiny batch) and either
    # stays level or climbs by 0.2 over the same stretch.
    series = []
    for s in range(1, 401):
        h = 0.12 * (1 + 0.05 * ((s * 7) % 5 - 2)) * (1.0 + min(1.2, max(0.0, s - 100) / 60))
        r = 0.05 + 0.1 * ((s * 13) % 7 - 3) / 3 + reward_gain * min(1.0, max(0.0, s - 80) / 40)
        series.append((s, {"entropy": h, "reward": r}))
    found = _feed(EntropyRise(), series)
    assert [f.severity for f in found] == severities, [(f.severity, f.step, f.evidence.get("correctness")) for f in found]
    assert all(f.evidence.get("correctness_improving", False) is bool(reward_gain) for f in found)


def test_degenerate_long_cot_advice_and_repetition_evidence():
    run = generate("degenerate_long_cot", seed=0)
    found = _feed(DegenerateLongCot(), run.steps, run.context, run.samples)
    crit = next(f for f in found if f.severity == "critical")
    assert "repetition" in crit.evidence["signals"]
    assert "get_soft_overlong_punishment(max_completion_len=1024" in crit.evidence["extra_advice"]["reward_funcs"]
    assert crit.config_overrides["mask_truncated_completions"] is True
    assert "reward_funcs" not in crit.config_overrides


def test_length_coupling_uses_samples_as_corroboration():
    run = generate("length_coupling", seed=0)
    found = [f for f in replay(run) if f.detector == "length_reward_coupling"]
    assert "incorrect_grow_longer" in found[-1].evidence["corroborated_by"]


def test_format_rising_with_correctness_is_not_divergence():
    series = [(s, {"rewards/correctness_reward/mean": 0.2 + 0.6 * min(1, s / 150), "rewards/format_reward/mean": 0.1 + 0.85 * min(1, s / 100)})
              for s in range(1, 301)]
    ctx = RunContext(correctness_reward="correctness_reward")
    assert _feed(RewardComponentDivergence(), series, ctx) == []


def test_non_finite_none_is_a_gap_and_nan_is_evidence():
    series = [(s, {"loss": None, "grad_norm": None, "entropy": None}) for s in range(1, 20)]
    assert _feed(NonFinite(), series) == []
    found = _feed(NonFinite(), [(1, {"loss": 0.1}), (2, {"grad_norm": math.inf, "loss": 0.1}), (3, {"loss": 0.2}),
                                (4, {"loss": 0.1})])
    assert [(f.severity, f.step) for f in found] == [("warning", 2)]
