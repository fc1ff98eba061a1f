"""Failures only an evaluation shows (field reports #32-34, #59), a KL penalty that never moves, and their
healthy look-alikes, replayed through the real engine with every detector at ``logging_steps`` 1 and 10; the
held-out scores of real logs read under their canonical names; the public runs with evaluations stay quiet."""

from __future__ import annotations

import pytest

from grpo_monitor.analysis.analyze import analyze
from grpo_monitor.core.engine import Engine
from grpo_monitor.detectors import ALL_DETECTORS, EvalDrop, KlPinned, TrainEvalDivergence
from grpo_monitor.detectors.base import RunContext
from grpo_monitor.fixtures.field import evaluation
from grpo_monitor.fixtures.synthetic import generate
from tests.conftest import SHARED

SEEDS = (0, 1, 2)
FAILURES = tuple(n for n in evaluation.SPECS if n not in evaluation.HEALTHY)
ALARMS = ("warning", "critical")
WILD = SHARED / "real-runs" / "wild"


def replay(run):
    engine = Engine(run.context, [cls() for cls in ALL_DETECTORS])
    for step, metrics in run.steps:
        engine.update(step, metrics, run.samples.get(step, []))
    return engine.findings


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("logging_steps", (1, 10))
@pytest.mark.parametrize("name", FAILURES)
def test_each_failure_is_found_in_time_and_nothing_else(name, logging_steps, seed):
    run = generate(name, seed=seed, logging_steps=logging_steps)
    alarms = [f for f in replay(run) if f.severity in ALARMS]
    expected = run.labels["expect"][0]
    hits = [f for f in alarms if f.detector == expected]
    assert hits and hits[0].step <= run.labels["fail"], [(f.detector, f.severity, f.step) for f in alarms]
    tolerated = {expected, *run.labels["allow"]}
    assert [(f.detector, f.step) for f in alarms if f.detector not in tolerated] == []


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("logging_steps", (1, 10))
@pytest.mark.parametrize("name", evaluation.HEALTHY)
def test_a_held_out_score_that_tracks_training_raises_nothing(name, logging_steps, seed):
    run = generate(name, seed=seed, logging_steps=logging_steps)
    assert [(f.detector, f.step) for f in replay(run) if f.severity in ALARMS] == []


def _feed(det, series, context=None):
    det.start(context or RunContext())
    return [f for step, m in series for f in det.update(step, m, [])]


def test_a_reward_and_score_rising_together_then_levelling_off_is_not_a_divergence():
    series = [(s, {"reward": min(s, 150) / 150, **({"eval_reward": 0.2 + 0.3 * min(s, 150) / 150} if s % 10 == 0 else {})})
              for s in range(1, 301)]
    assert _feed(TrainEvalDivergence(), series) == []


def test_the_divergence_names_the_step_the_held_out_score_peaked():
    def score(s):
        return 0.2 + 0.3 * min(s, 100) / 100 - max(0, s - 100) / 500

    series = [(s, {"reward": s / 300, **({"eval_reward": score(s)} if s % 20 == 0 else {})}) for s in range(1, 301)]
    found = _feed(TrainEvalDivergence(), series)
    assert found and found[0].evidence["shape"] == "fall" and found[0].onset_step == 100
    assert "checkpoint nearest step 100" in found[0].evidence["advice"]


def test_a_validation_drop_with_a_crashed_training_reward_is_left_to_sudden_collapse():
    series = [(s, {"reward": 0.6 if s <= 60 else 0.05, **({"eval_reward": 0.45 if s <= 60 else 0.1} if s % 10 == 0 else {})})
              for s in range(1, 121)]
    assert _feed(EvalDrop(), series) == []


def test_an_evaluation_logged_separately_gives_the_same_finding_as_one_merged_onto_its_step():
    # Live the Trainer logs an evaluation after the training log of the same step; readers merge the two.
    run = generate("k9_validation_drop", seed=0)
    merged = _feed(EvalDrop(), run.steps)
    split = []
    for step, m in run.steps:
        train = {k: v for k, v in m.items() if not k.startswith("eval_")}
        evals = {k: v for k, v in m.items() if k.startswith("eval_")}
        split.append((step, train))
        if evals:
            split.append((step, evals))
    assert [(f.severity, f.step) for f in _feed(EvalDrop(), split)] == [(f.severity, f.step) for f in merged] != []


def test_kl_pinned_needs_gradients_and_is_not_applicable_without_a_penalty():
    flat = [(s, {"kl": 0.0, "grad_norm": 0.0}) for s in range(1, 101)]
    assert _feed(KlPinned(), flat) == []  # no gradient at all: no_learning_signal's, not this
    det = KlPinned()
    assert det.not_applicable({"kl"}) is None
    det.start(RunContext(config={"beta": 0.0}))
    assert det.not_applicable({"kl"}) is not None
    moving = [(s, {"kl": 2e-5 * s, "grad_norm": 0.5}) for s in range(1, 101)]
    assert _feed(KlPinned(), moving, RunContext(config={"beta": 0.04})) == []


@pytest.mark.skipif(not WILD.is_dir(), reason="../shared/real-runs/wild is not here")
@pytest.mark.parametrize(("name", "metric", "steps"), [
    ("toolanzyhhh1234_gspo-qwen25-3b-gsm8k.log", "eval_accuracy", 10),     # verl: val-core/openai/gsm8k/acc/mean@1
    ("shamanez_exp27-dense-5e2jpho9.csv", "eval_accuracy", 6),             # Trinity/W&B export: val_acc_mean1
    ("sushantmehta-code_rlvr_qwen3_4b_v2p3.jsonl", "eval_reward", 12),     # Tinker: test/env/all/reward/total
])
def test_public_runs_with_evaluations_are_read_and_stay_quiet(name, metric, steps):
    report = analyze(WILD / name).runs[0]
    assert sum(1 for pts in [report.series.get(metric, [])] for _ in pts) == steps
    assert "train_eval_divergence" in report.judged_by and "eval_drop" in report.judged_by
    assert [f.detector for f in report.findings if f.detector in ("train_eval_divergence", "eval_drop")] == []


def test_the_field_map_names_these_detectors_for_reports_32_to_34_and_59():
    import sys

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
    from benchmarks import field_coverage as fc

    assert {n: fc.REPORTS[n][2] for n in (32, 33, 34, 59)} == {
        32: ("train_eval_divergence",), 33: ("train_eval_divergence",), 34: ("train_eval_divergence",),
        59: ("eval_drop",)}
    # Each is one of the labelled cases above, found by that detector.
    cases = {n: generate(name).labels["expect"] for n, name in ((32, "k4_proxy_hack_after_plateau"),
             (33, "k4_repetition_scored_high"), (34, "k4_keyword_overlap_proxy"), (59, "k9_validation_drop"))}
    assert {n: tuple(v) for n, v in cases.items()} == {n: fc.REPORTS[n][2] for n in cases}
