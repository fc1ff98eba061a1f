"""Reward-function bugs (K3) and truncation before it is total (K1): the labelled field cases replayed
through the session (every detector, then the diagnosis), at ``logging_steps`` 1 and 10, plus the traps each detector
must step around."""

from __future__ import annotations

import pytest

from grpo_monitor.detectors.base import RunContext
from grpo_monitor.detectors.reward_function_bug import RewardFunctionBug
from grpo_monitor.detectors.truncation import Truncation
from grpo_monitor.fixtures.field.reward_bugs import HEALTHY, SPECS
from grpo_monitor.fixtures.synthetic import generate
from grpo_monitor.core.session import open_session

SEEDS = (0, 1, 2)
FAILURES = [n for n in SPECS if n not in HEALTHY]


def replay(run):
    """The run through the one session every driver uses: the detectors, then the diagnosis."""
    session = open_session(run.context)
    for step, metrics in run.steps:
        session.update(step, metrics, run.samples.get(step, []))
    return [f for f in session.findings if f.severity in ("warning", "critical")]


def _feed(det, series, context=None, samples=None):
    det.start(context or RunContext())
    out = []
    for step, m in series:
        out += det.update(step, m, (samples or {}).get(step, []))
    return out


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("logging_steps", (1, 10))
@pytest.mark.parametrize("name", FAILURES)
def test_planted_bug_is_found_in_time_with_its_advice(name, logging_steps, seed):
    run = generate(name, seed=seed, logging_steps=logging_steps)
    found = replay(run)
    [expected] = run.labels["expect"]
    hits = [f for f in found if f.detector == expected]
    assert hits, f"{expected} not raised on {name}: {[(f.detector, f.step) for f in found]}"
    first = hits[0]
    assert first.step <= run.labels["fail"] and first.variant is None
    assert first.onset_step is not None and first.onset_step <= first.step
    tolerated = {expected, *run.labels["allow"]}
    assert [f.detector for f in found if f.detector not in tolerated] == []
    ev = first.evidence
    if expected == "reward_function_bug":
        # A broken function is fixed in code: advice, never a config change.
        assert first.config_overrides == {} and ev["advice"]
        comp = ev["components"][0]
        want = {"reward_bug_dead_format": ("format_reward", "dead_format", 0.0),
                "reward_bug_free_correctness": ("correctness_reward", "free", 1.0),
                "reward_bug_per_prompt": ("correctness_reward", "per_prompt", None),
                "reward_bug_per_batch": ("judge_score", "per_batch", None)}[name]
        assert (comp["component"], comp["kind"], comp.get("value")) == want
        assert comp["component"] in first.message
        if comp["kind"] == "dead_format":
            assert "DOTALL" in ev["advice"] and "chat template" in ev["advice"]
    else:
        cap = run.context.config["max_completion_length"]
        assert ev["remedy"] == "raise_max_completion_length"
        assert first.config_overrides == {"max_completion_length": 2 * cap}
        assert ev["alternative"] == {"mask_truncated_completions": True}
        assert f"max_completion_length from {cap} to {2 * cap}" in first.message
        if name == "truncation_creeping_format":
            assert ev["clipped_ratio"]["early"] < 0.05 <= ev["level"] <= ev["clipped_ratio"]["recent"]
            # The harm: format fell as the share rose, or the cut completions scored less than the rest.
            assert ("format_reward" in [f["component"] for f in ev.get("fell", [])]
                    or ev["cut_vs_completed"]["reward_gap"] >= 0.2)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("logging_steps", (1, 10))
@pytest.mark.parametrize("name", HEALTHY)
def test_look_alike_raises_no_alarm(name, logging_steps, seed):
    run = generate(name, seed=seed, logging_steps=logging_steps)
    assert [(f.detector, f.severity, f.step) for f in replay(run)] == []


def test_saturated_format_is_constant_but_not_from_the_start():
    run = generate("healthy_format_saturating", seed=0)
    late = [m for s, m in run.steps if s > 150]
    # The look-alike really is pinned: std exactly 0 at 1.0 for the second half of the run.
    assert all(m["rewards/format_reward/std"] == 0.0 and m["rewards/format_reward/mean"] == 1.0 for m in late)
    assert _feed(RewardFunctionBug(), run.steps, run.context, run.samples) == []


def test_idle_penalty_at_zero_is_not_a_dead_function_but_a_long_dead_one_is():
    run = generate("healthy_penalty_idle", seed=0)
    assert run.steps[20][1]["rewards/safety_penalty/std"] == 0.0
    assert _feed(RewardFunctionBug(), run.steps, run.context) == []
    # The same component never firing over 150 steps is raised, as a warning only.
    series = [(s, {"rewards/safety_penalty/mean": 0.0, "rewards/safety_penalty/std": 0.0,
                   "rewards/correct/mean": 0.3 + 0.01 * (s % 5), "rewards/correct/std": 0.4, "reward_std": 0.4})
              for s in range(1, 151)]
    found = _feed(RewardFunctionBug(), series)
    assert [(f.severity, f.evidence["components"][0]["kind"]) for f in found] == [("warning", "dead")]
    assert found[0].step >= 100


def test_no_std_logged_or_nothing_else_moving_is_not_judged():
    # Older TRL logs only the means: a signed reward can average to 0, so nothing is claimed.
    means_only = [(s, {"rewards/format/mean": 0.0, "rewards/acc/mean": 0.1 * (s % 4)}) for s in range(1, 80)]
    assert _feed(RewardFunctionBug(), means_only) == []
    # A cold start: every component at 0, nothing varies yet. That is no_learning_signal's, not a bug.
    cold = [(s, {"rewards/format/mean": 0.0, "rewards/format/std": 0.0, "rewards/acc/mean": 0.0,
                 "rewards/acc/std": 0.0, "reward_std": 0.0}) for s in range(1, 80)]
    assert _feed(RewardFunctionBug(), cold) == []


def test_sparse_penalty_on_coarse_logs_is_not_one_value_per_batch():
    # Logged every 5 steps: a penalty that hit a whole small batch once averages to -0.2 with std 0.
    series = []
    for i, s in enumerate(range(5, 205, 5)):
        series.append((s, {"rewards/risk/mean": -0.2 if i % 9 == 8 else 0.0, "rewards/risk/std": 0.0,
                           "rewards/pnl/mean": 0.1 * (i % 3), "rewards/pnl/std": 0.2, "reward_std": 0.3}))
    assert _feed(RewardFunctionBug(), series) == []


def test_truncation_defers_total_truncation_and_respects_masking():
    total = [(s, {"completions/clipped_ratio": 1.0, "reward": 0.0, "frac_reward_zero_std": 1.0}) for s in range(1, 60)]
    assert _feed(Truncation(), total) == []
    # Masked: a third of the batch cut while the reward rises is compute spent, not a broken run.
    masked = RunContext(config={"mask_truncated_completions": True, "max_completion_length": 512})
    series = [(s, {"completions/clipped_ratio": 0.35, "reward": 0.2 + 0.002 * s, "rewards/format_reward/mean": 0.9})
              for s in range(1, 150)]
    assert _feed(Truncation(), series, masked) == []
    # Unmasked, the same share with the reward falling as it rose is raised.
    series = [(s, {"completions/clipped_ratio": 0.02 if s < 50 else min(0.4, 0.02 + 0.01 * (s - 50)),
                   "rewards/format_reward/mean": 0.9 if s < 50 else max(0.3, 0.9 - 0.015 * (s - 50))})
              for s in range(1, 150)]
    found = _feed(Truncation(), series, RunContext(config={"max_completion_length": 512}))
    assert found and found[0].config_overrides == {"max_completion_length": 1024}
    assert found[0].evidence["fell"][0]["component"] == "format_reward"


def test_truncation_with_exploding_entropy_is_left_to_degeneration():
    series = []
    for s in range(1, 150):
        bad = s >= 60
        series.append((s, {"completions/clipped_ratio": 0.6 if bad else 0.02, "entropy": 2.5 if bad else 0.4,
                           "rewards/format_reward/mean": 0.2 if bad else 0.9}))
    found = _feed(Truncation(), series)
    assert found == []


def test_a_format_reward_paying_every_completion_from_the_start_is_saturated_not_broken():
    # An instruct model formats from its first completion: format_reward is 1.0 with std 0 from step 1.
    run = generate("healthy_format_from_start", seed=0)
    assert all(m["rewards/format_reward/std"] == 0.0 and m["rewards/format_reward/mean"] == 1.0
               for _, m in run.steps if "rewards/format_reward/std" in m)
    det = RewardFunctionBug()
    assert _feed(det, run.steps, run.context, run.samples) == []
    assert det.last_evidence.get("saturated_components") == {"format_reward": 1.0}
    # A correctness reward pinned at 1.0 from the start is still a free reward (a fallback that pays).
    series = [(s, {"rewards/correctness_reward/mean": 1.0, "rewards/correctness_reward/std": 0.0,
                   "rewards/format_reward/mean": 0.6 + 0.05 * (s % 3), "rewards/format_reward/std": 0.4,
                   "reward_std": 0.4}) for s in range(1, 40)]
    assert [f.evidence["components"][0]["kind"] for f in _feed(RewardFunctionBug(), series)] == ["free", "free"]


@pytest.mark.parametrize("name, kind", [("valid_json_reward", None), ("json_schema_check", None),
                                        ("bonus_reward", "free")])
def test_a_structured_output_validity_reward_saturated_from_the_start_is_not_a_free_reward(name, kind):
    # A JSON action forced by the prompt (or learnt in SFT before GRPO): the validity check pays every
    # completion its 3.0 from step 1 while the task reward tells completions apart.
    series = [(s, {f"rewards/{name}/mean": 3.0, f"rewards/{name}/std": 0.0,
                   "rewards/game_score/mean": 3.0 + (s * 7) % 5, "rewards/game_score/std": 12.0 + s % 4,
                   "reward_std": 12.0}) for s in range(1, 60)]
    found = _feed(RewardFunctionBug(), series)
    assert [c["kind"] for f in found[:1] for c in f.evidence["components"]] == ([kind] if kind else [])


def _length_paid_batches(steps, rate=0.05, grow_from=20, cap=64):
    """Sample batches of a reward paying ``rate`` per token beside format and correctness rewards; from
    ``grow_from`` on the completions grow a token a step while correctness stays where it was."""
    out = {}
    for s in steps:
        rows = []
        for g in range(4):
            for k in range(8):
                length = min(cap, 3 + (k % 3) + max(0, s - grow_from))
                correct = float((g + k) % 2)
                rows.append({"step": s, "group": g, "index": 8 * g + k, "length": length,
                             "rewards": {"format_reward": 1.0, "correctness_reward": correct,
                                         "length_bonus_reward": rate * (length + 1)}})
        out[s] = rows
    return out


def test_a_reward_paying_per_token_is_named_and_weighted_out_once_length_grows_under_it():
    steps = list(range(1, 41))
    samples = _length_paid_batches(steps)
    names = ["format_reward", "correctness_reward", "length_bonus_reward"]
    context = RunContext(config={"reward_weights": None}, reward_names=names, correctness_reward="correctness_reward",
                         format_reward="format_reward")
    found = _feed(RewardFunctionBug(), [(s, {}) for s in steps], context, samples)
    assert [f.severity for f in found] == ["warning", "critical"]
    warn, crit = found
    assert warn.step == 3 and warn.config_overrides == {} and "length_bonus_reward pays 0.05 per completion token" in warn.message
    comp = crit.evidence["components"][0]
    assert comp["component"] == "length_bonus_reward" and comp["kind"] == "per_token"
    assert comp["per_token"] == pytest.approx(0.05) and comp["mean_length_now"] >= 1.5 * comp["mean_length_first_batches"]
    assert crit.evidence["remedy"] == "drop_length_reward" and crit.variant is None
    assert crit.config_overrides == {"reward_weights": [1.0, 1.0, 0.0]}
    assert "this reward is the cause of the length growth" in crit.message
    # A run that weighs the component out of the total is not paid per token: nothing to raise.
    weighted_out = RunContext(config={"reward_weights": [1.0, 1.0, 0.0]}, reward_names=names,
                              correctness_reward="correctness_reward")
    assert _feed(RewardFunctionBug(), [(s, {}) for s in steps], weighted_out, samples) == []
    # Length growing with correctness rising (a reasoning model paid to think longer) stays a warning.
    for s in steps:
        for r in samples[s]:
            if s > 20:
                r["rewards"]["correctness_reward"] = 1.0
    assert [f.severity for f in _feed(RewardFunctionBug(), [(s, {}) for s in steps], context, samples)] == ["warning"]
