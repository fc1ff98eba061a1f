"""What a failure costs and when it will hit: ``core.cost`` and ``core.forecast`` on their own, through the
engine on labelled cases (live and replayed alike), and in the reports (text, JSON, the CLI's price)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from grpo_monitor.core.cost import CostMeter, cost_phrase
from grpo_monitor.core.engine import Engine
from grpo_monitor.core.forecast import Forecaster, TARGETS
from grpo_monitor.detectors import ALL_DETECTORS
from grpo_monitor.fixtures.synthetic import generate
from tests.conftest import ROOT, SHARED


def test_the_share_without_signal_comes_from_the_completions_where_they_are_recorded():
    meter = CostMeter()
    # Two groups: one scored all alike (no signal), one with spread but one completion cut at the cap.
    rows = ([{"group": 0, "rewards": {"r": 1.0}, "truncated": False}] * 4
            + [{"group": 1, "rewards": {"r": float(i % 2)}, "truncated": i == 0} for i in range(4)])
    meter.observe(1, {"frac_reward_zero_std": 0.0, "completions/clipped_ratio": 0.0}, rows)
    c = meter.between(1, 1)
    assert (c["wasted_share"], c["no_signal_share"], c["truncated_share"]) == (0.625, 0.5, 0.125)


def test_the_logged_shares_combine_once_where_they_overlap():
    meter = CostMeter()
    meter.observe(1, {"frac_reward_zero_std": 0.5, "completions/clipped_ratio": 0.5})
    assert meter.between(1, 1)["wasted_share"] == 0.75


def test_wall_time_from_a_clock_else_step_time_else_the_runtime_and_gpu_hours_need_the_device_count():
    clock = CostMeter(devices=4, gpu_hour_price=2.0)
    for s in range(10, 101, 10):
        clock.observe(s, {"system/wall_time": 1000.0 + 9.0 * s})
    c = clock.between(20, 100)
    # Steps 20 to 100: 81 of them (the point at 20 also stands for steps 11-19, which come before).
    assert c["steps"] == 81 and c["wall_seconds"] == 729.0 and c["wall_from"] == "system/wall_time"
    assert c["gpu_hours"] == pytest.approx(0.81) and c["money"] == pytest.approx(1.62)
    timed = CostMeter()
    for s in range(10, 101, 10):
        timed.observe(s, {"step_time": 2.0})
    c = timed.between(20, 100)
    assert c["wall_seconds"] == 162.0 and c["wall_from"] == "step_time" and c["gpu_hours"] is None
    assert "money" not in c
    runtime = CostMeter(devices=1, runtime=(500.0, 100))
    for s in range(1, 101):
        runtime.observe(s, {"reward": 0.5})
    assert runtime.between(51, 100)["wall_seconds"] == 250.0 and runtime.between(51, 100)["wall_from"] == "train_runtime"


def test_a_step_logged_twice_is_counted_once():
    meter = CostMeter()
    for s in (1, 2, 2, 3):
        meter.observe(s, {"step_time": 1.0})
    assert meter.between(1, 3)["steps"] == 3 and meter.between(1, 3)["wall_seconds"] == 3.0


def test_memory_stays_bounded_and_late_lookups_still_hold():
    meter = CostMeter(max_points=64)
    for s in range(1, 10_001):
        meter.observe(s, {"step_time": 1.0, "frac_reward_zero_std": 1.0 if s > 5000 else 0.0})
    assert len(meter.steps) <= 65
    c = meter.between(5001, 10_000)
    # An onset between kept points takes its share of the stretch they span: no rounding back to the earlier one.
    assert c["steps"] == 5000 and c["wasted_share"] > 0.9


def test_a_cost_on_a_sparse_log_counts_from_its_onset_never_the_interval_before_it_nor_before_the_log():
    # A sparse log with a hole (23 to 37): the point at 37 stands for 14 steps, 23 of them before step 37.
    meter = CostMeter()
    for s in (9, 23, 37, 51, 65, 79):
        meter.observe(s, {"step_time": 2.0, "frac_reward_zero_std": 0.5})
    c = meter.between(37, 71)
    assert (c["since_step"], c["steps"], c["wall_seconds"], c["wasted_share"]) == (37, 35, 70.0, 0.5)
    assert meter.between(40, 44)["steps"] == 5 and meter.between(37, 37)["steps"] == 1
    # An onset before the first logged step is costed from it: the log says nothing of the steps before.
    early = meter.between(-29, 23)
    assert (early["since_step"], early["steps"]) == (9, 15)


@pytest.mark.parametrize("case", ["solved_from_start", "length_coupling", "healthy_plateau", "entropy_bonus_runaway"])
def test_on_a_run_logged_every_10_steps_no_finding_costs_or_looks_back_before_its_onset_or_the_first_step(case):
    from grpo_monitor.analysis.replay import cost_summary

    run = generate(case, seed=0, logging_steps=10)
    first, last = run.steps[0][0], run.steps[-1][0]
    engine = Engine(run.context, [cls() for cls in ALL_DETECTORS])
    findings = engine.replay(run.steps, run.samples)
    assert findings
    for f in findings:
        assert f.onset_step is None or f.onset_step >= first, f.to_dict()
        window = f.evidence.get("window")
        if isinstance(window, dict) and window.get("from_step") is not None:
            assert first <= window["from_step"] <= f.step, f.to_dict()
        cost = f.evidence.get("cost")
        if cost:
            assert first <= cost["since_step"] and cost["steps"] <= f.step - cost["since_step"] + 1, f.to_dict()
    summary = cost_summary(engine, findings)
    assert summary["run"]["steps"] == last - first + 1
    for row in summary["findings"]:
        to_end = row["to_end"]
        assert first <= to_end["since_step"] and to_end["steps"] == last - to_end["since_step"] + 1, row


@pytest.mark.parametrize("every", [2, 5])
def test_the_length_trend_window_of_an_early_finding_starts_where_the_log_does(every):
    from grpo_monitor.detectors.length_reward_coupling import LengthRewardCoupling

    det, found = LengthRewardCoupling(), []
    for step in range(every, 201, every):
        length = 200 if step < 20 else 200 + 8 * (step - 20)
        acc = 0.4 + 0.002 * (step % 7)
        found += det.update(step, {"completions/mean_length": length, "rewards/accuracy/mean": acc, "reward": acc})
    assert found and found[0].step < det.span_steps
    assert [f.evidence["window"]["from_step"] for f in found if f.step < det.span_steps + every] == [every] * 2


def test_bad_prices_and_device_counts_are_refused():
    for kwargs in ({"gpu_hour_price": -1}, {"gpu_hour_price": float("nan")}, {"devices": 0}, {"devices": True}):
        with pytest.raises(ValueError):
            CostMeter(**kwargs)


def _linear(fc, start, stop, value, slope, noise=0.0, seed=0):
    rng = np.random.default_rng(seed)
    for s in range(start, stop):
        fc.observe(s, {"completions/clipped_ratio": value + slope * (s - start) + rng.normal(0, noise)})


def test_a_clear_trend_toward_the_cap_is_forecast_with_an_interval_holding_the_truth():
    fc = Forecaster()
    rng = np.random.default_rng(0)
    for s in range(30, 61):
        # A share saturating the way shares do: logistic, reaching 0.95 at t = 70 + 10 ln 19 = 99.4.
        fc.observe(s, {"completions/clipped_ratio": 1 / (1 + math.exp(-(s - 70) / 10)) * math.exp(rng.normal(0, 0.02))})
    out = fc.forecast(TARGETS[1])
    lo, hi = out["at_steps"]
    assert lo <= 99 <= hi and out["fit"] == "theil-sen" and out["confidence"] == 0.9 and out["limit"] == 0.95


def test_no_forecast_when_the_trend_is_lost_in_noise_flat_or_already_past():
    noisy = Forecaster()
    _linear(noisy, 1, 61, 0.3, 0.0005, noise=0.1)
    assert noisy.forecast(TARGETS[1]) is None
    flat = Forecaster()
    _linear(flat, 1, 61, 0.3, 0.0)
    assert flat.forecast(TARGETS[1]) is None
    past = Forecaster()
    _linear(past, 1, 61, 0.96, 0.0001)
    assert past.forecast(TARGETS[1]) is None


def test_entropy_is_forecast_only_against_the_baseline_its_detector_set():
    fc = Forecaster()
    for s in range(1, 61):
        fc.observe(s, {"entropy": 0.4 * math.exp(-(s - 1) / 30)})
    assert fc.forecast(TARGETS[0], {}) is None
    out = fc.forecast(TARGETS[0], {"baseline": 0.4})
    # 0.4 exp(-(t-1)/30) reaches 0.04 at t = 1 + 30 ln 10 = 70.1
    assert out["at_steps"][0] <= 70 <= out["at_steps"][1]


def test_findings_of_a_labelled_case_carry_their_cost_and_the_replay_carries_the_same():
    run = generate("no_learning_signal", seed=0)
    live = Engine(run.context, [cls() for cls in ALL_DETECTORS])
    for step, m in run.steps:
        live.update(step, m, run.samples.get(step, []))
    found = [f for f in live.findings if f.detector == "no_learning_signal"]
    assert found and all(f.evidence["cost"]["wasted_share"] > 0.8 for f in found)
    replayed = Engine(run.context, [cls() for cls in ALL_DETECTORS]).replay(run.steps, run.samples)
    assert [f.to_dict() for f in replayed] == [f.to_dict() for f in live.findings]


def test_a_finding_whose_trend_heads_for_a_limit_says_when():
    # The fit itself, ungated: the clipped share's forecasts are made (and then hidden by the backtest's gate,
    # tests/test_forecast_gate.py).
    run = generate("truncation_creeping_format", seed=0, logging_steps=10)
    findings = Engine(run.context, [cls() for cls in ALL_DETECTORS],
                      annotators=[CostMeter(), Forecaster(gated=False)]).replay(run.steps, run.samples)
    fc = [f.evidence["forecast"] for f in findings if f.detector == "truncation" and "forecast" in f.evidence]
    assert fc and fc[0]["metric"] == "completions/clipped_ratio" and fc[0]["interval"][0] <= fc[0]["steps_to_limit"]


def test_a_finding_whose_trusted_trend_heads_for_its_limit_says_when_through_the_default_engine():
    run = generate("entropy_collapse", seed=0, logging_steps=1)
    findings = Engine(run.context, [cls() for cls in ALL_DETECTORS]).replay(run.steps, run.samples)
    fc = [f.evidence["forecast"] for f in findings if f.detector == "entropy_collapse" and "forecast" in f.evidence]
    assert fc and fc[0]["metric"] == "entropy" and fc[0]["interval"][0] <= fc[0]["steps_to_limit"] <= fc[0]["interval"][1]


def test_a_failing_annotator_is_switched_off_and_the_findings_still_go_out():
    class Broken:
        def start(self, context):
            pass

        def observe(self, *a):
            raise RuntimeError("boom")

        def annotate(self, f):
            raise RuntimeError("boom")

    errors = []
    run = generate("non_finite", seed=0)
    engine = Engine(run.context, [cls() for cls in ALL_DETECTORS], on_error=lambda c, e: errors.append(c),
                    annotators=[Broken(), CostMeter()])
    engine.replay(run.steps, run.samples)
    assert errors == ["annotator Broken"] and any("cost" in f.evidence for f in engine.findings)


@pytest.mark.skipif(not (SHARED / "real-runs").is_dir(), reason="../shared/real-runs is not here")
def test_the_cli_puts_money_on_a_real_runs_findings_and_the_cost_to_the_end_in_the_report():
    path = SHARED / "real-runs" / "wild" / "koivualeksi_sanitizer-qwen25-0p5b.log"
    out = subprocess.run([sys.executable, "-m", "grpo_monitor", "analyze", str(path), "--json", "--gpu-hour-price", "3",
                          "--devices", "8"], capture_output=True, text=True, cwd=ROOT, check=False)
    assert out.returncode == 1, out.stderr
    run = json.loads(out.stdout)["runs"][0]
    f = next(f for f in run["findings"] if f["detector"] == "no_learning_signal")
    cost = f["evidence"]["cost"]
    # The console log's summary gives train_runtime (9,199.6 s over 400 steps): the clock of last resort.
    assert cost["wall_from"] == "train_runtime" and cost["devices"] == 8
    assert cost["money"] == pytest.approx(cost["gpu_hours"] * 3, abs=0.01) and cost["wasted_share"] > 0.9
    to_end = run["cost"]["findings"][0]["to_end"]
    assert to_end["to_step"] == 400 and to_end["steps"] >= cost["steps"]
    text = subprocess.run([sys.executable, "-m", "grpo_monitor", "analyze", str(path), "--gpu-hour-price", "3",
                           "--devices", "8"], capture_output=True, text=True, cwd=ROOT, check=False).stdout
    assert "cost to the end of the run (step 400)" in text and "GPU-h ($" in text


def test_the_phrase_of_a_cost_without_a_clock_says_only_what_is_known():
    assert cost_phrase({"since_step": 3, "steps": 5, "wall_seconds": None, "gpu_hours": None, "wasted_share": None}) \
        == "since step 3: 5 steps"
