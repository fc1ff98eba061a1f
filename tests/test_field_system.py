"""System-side failures from the field catalogue (K10 broken generator, K16 advantage/mask bugs, K17
memory pressure, K18 stalls, K19 language mixing): labelled cases replayed through the engine with
every detector, the reward tap's new per-completion numbers on a real GRPOTrainer, the stall line of
the dashboard header through Pilot, and replays of logs recorded before those numbers existed."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from grpo_monitor.detectors import ALL_DETECTORS
from grpo_monitor.detectors.broken_generation import BrokenGeneration, garbage_completion
from grpo_monitor.detectors.language_mixing import LanguageMixing, other_script_share, sample_other_script
from grpo_monitor.detectors.stall import stall_status
from grpo_monitor.fixtures.field.system import HEALTHY, SPECS
from grpo_monitor.fixtures.synthetic import generate
from grpo_monitor.core.engine import Engine

SEEDS = (0, 1, 2)
FAILURES = [n for n in SPECS if n not in HEALTHY]
ALARMS = ("warning", "critical")


def replay(run):
    engine = Engine(run.context, [cls() for cls in ALL_DETECTORS])
    for step, metrics in run.steps:
        engine.update(step, metrics, run.samples.get(step, []))
    assert engine.disabled == {}
    return [f for f in engine.findings if f.severity in ALARMS]


def first_of(found, detector):
    hits = [f for f in found if f.detector == detector]
    assert hits, f"{detector} not raised: {[(f.detector, f.step) for f in found]}"
    return hits[0]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("logging_steps", (1, 10))
@pytest.mark.parametrize("name", FAILURES)
def test_failure_case_is_found_in_time_and_nothing_else_is_raised(name, logging_steps, seed):
    run = generate(name, seed=seed, logging_steps=logging_steps)
    found = replay(run)
    labels = run.labels
    for expected in labels["expect"]:
        first = first_of(found, expected)
        assert first.step <= labels["fail"], f"{expected} at {first.step}, the failure was plain at {labels['fail']}"
        assert first.onset_step is not None and first.onset_step <= first.step
        assert first.variant is None
        assert first.evidence.get("advice") or first.evidence.get("remedy")
    tolerated = set(labels["expect"]) | set(labels["allow"])
    assert [(f.detector, f.step) for f in found if f.detector not in tolerated] == []


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("logging_steps", (1, 10))
@pytest.mark.parametrize("name", HEALTHY)
def test_healthy_look_alike_raises_no_alarm(name, logging_steps, seed):
    run = generate(name, seed=seed, logging_steps=logging_steps)
    assert [(f.detector, f.severity, f.step) for f in replay(run)] == []


# -- what each finding says --------------------------------------------------------------------------


def test_garbage_after_the_first_update_is_critical_at_once_and_points_at_the_generator():
    run = generate("k10_garbage_after_first_update", seed=0)
    f = first_of(replay(run), "broken_generation")
    assert (f.severity, f.step, f.onset_step) == ("critical", 2, 1)
    assert f.evidence["mode"] == "garbage_after_first_update" and f.evidence["garbage_share"] == 1.0
    assert {"garbage_completions", "completions_at_cap"} <= set(f.evidence["signs"])
    assert "weight sync" in f.evidence["advice"] and f.config_overrides == {}


def test_garbage_from_the_first_step_is_read_from_the_text_when_no_token_counts_were_recorded():
    run = generate("k10_garbage_from_the_start", seed=0)
    assert all("distinct_tokens" not in s for rows in run.samples.values() for s in rows)
    f = first_of(replay(run), "broken_generation")
    assert f.step == 1 and f.severity == "critical" and f.evidence["garbage_share"] == 1.0


def test_stale_generator_weights_name_the_sleep_mode_flag_as_the_remedy():
    run = generate("k10_stale_generator_weights", seed=0)
    f = first_of(replay(run), "broken_generation")
    assert f.evidence["mode"] == "stale_generator_weights" and f.onset_step == 1
    assert f.evidence["logp_gap_recent"] >= 2 * f.evidence["logp_gap_first"]
    assert f.config_overrides == {"vllm_enable_sleep_mode": False}
    assert f.evidence["remedy"] == "disable_vllm_sleep_mode"
    # The same run without sleep mode: the same diagnosis, advice only.
    run.context.config["vllm_enable_sleep_mode"] = False
    g = first_of(replay(run), "broken_generation")
    assert g.config_overrides == {} and "remedy" not in g.evidence and "LoRA" in g.evidence["advice"]


def test_a_late_drift_of_the_engine_is_left_to_rollout_mismatch():
    run = generate("rollout_mismatch", seed=0)
    found = replay(run)
    assert not [f for f in found if f.detector == "broken_generation"]
    assert first_of(found, "rollout_mismatch")


@pytest.mark.parametrize("name,invariant", [("k16_equal_lengths_mask_bug", "equal_lengths"),
                                            ("k16_vanished_advantages", "vanished_advantages")])
def test_impossible_invariants_are_critical_with_advice_only(name, invariant):
    run = generate(name, seed=1)
    f = first_of(replay(run), "advantage_mask_bug")
    assert f.severity == "critical" and f.evidence["invariant"] == invariant
    assert f.config_overrides == {} and f.onset_step == 1 and len(f.evidence["advice"]) > 40


def test_memory_pressure_warns_before_the_peak_reaches_the_capacity_with_the_ladders_first_rung():
    run = generate("k17_memory_grows_to_capacity", seed=0)
    f = first_of(replay(run), "memory_pressure")
    assert f.severity == "warning" and f.evidence["peak_frac"] < 1.0 and f.evidence["rose_with_length"]
    # No vLLM in this run, and gradient checkpointing off: the ladder starts there.
    assert f.evidence["remedy"] == "gradient_checkpointing" and f.config_overrides == {"gradient_checkpointing": True}
    assert f.evidence["ladder"] == ["gradient_checkpointing", "low_bit_optimizer", "smaller_micro_batch",
                                    "shorter_completions"]
    assert "per_device_train_batch_size=16, gradient_accumulation_steps=2" in f.evidence["advice"]
    crash = next(s for s, m in run.steps if m["system/gpu_peak_reserved_gib"] >= m["system/gpu_total_gib"])
    assert f.step < crash


@pytest.mark.parametrize("logging_steps", (1, 10))
def test_a_stall_is_measured_in_seconds_against_the_runs_own_pace(logging_steps):
    run = generate("k18_stall_at_weight_sync", seed=2, logging_steps=logging_steps)
    f = first_of(replay(run), "stall")
    assert f.step == 120 and f.evidence["from_step"] < 120
    assert 700 < f.evidence["stall_s"] < 1100 and f.evidence["ratio"] >= 5
    assert "NCCL" in f.evidence["advice"]


def test_checkpoint_saves_are_not_stalls_but_the_same_pause_without_a_save_is():
    run = generate("healthy_slow_steady_with_saves", seed=0)
    assert not [f for f in replay(run) if f.detector == "stall"]
    del run.context.config["save_steps"]
    assert first_of(replay(run), "stall").evidence["from_step"] % 50 == 0


def test_language_mixing_is_judged_against_the_runs_early_share():
    run = generate("k19_language_mixing", seed=0)
    f = first_of(replay(run), "language_mixing")
    assert f.evidence["recent_mixed_share"] >= f.evidence["early_mixed_share"] + 0.15
    assert f.onset_step >= 100 and "language-consistency reward" in f.evidence["advice"]


# -- the signals themselves ----------------------------------------------------------------------------


def test_script_share_and_garbage_read_from_text():
    assert other_script_share("Сначала сложим: 3 + 4 = 7", "cyrillic") == 0.0
    assert other_script_share("First we add. 然后 结果是 7", "latin") > 0.2
    assert other_script_share("7", "latin") is None and other_script_share("anything", None) is None
    assert sample_other_script({"prompt": "Combien font 3+4 ?", "completion": "Ça fait sept, évidemment."}) == 0.0
    assert garbage_completion({"completion": "!" * 300, "length": 256}) is True
    assert garbage_completion({"completion": "! " * 150, "length": 256}) is True
    assert garbage_completion({"distinct_tokens": 1, "length": 256, "completion": "x y z w v"}) is True
    assert garbage_completion({"distinct_tokens": 90, "length": 256}) is False
    assert garbage_completion({"completion": "The answer is 42 because 6 times 7 is 42."}) is False


def test_stall_status_of_a_live_run():
    times = [(s, 5000.0 + 30.0 * s) for s in range(10, 210, 10)]  # logged every 10 steps, 30 s per step
    last = times[-1][1]
    assert stall_status(times, now=last + 600) is None  # two intervals: still in pace
    st = stall_status(times, now=last + 3600)
    assert st is not None and st.median_interval_s == 300.0 and st.last_step == 200
    assert st.text() == "stalled: no step for 60min (median step 5min)"
    assert stall_status(times, now=last + 3600, ended=True) is None
    # A dashboard that saw only every third log still gets the pace right.
    assert stall_status(times[::3], now=last + 1200) is None
    assert stall_status(times[:2], now=last + 1e5) is None  # too little to know the pace


def test_logs_recorded_before_the_script_field_still_replay(tmp_path):
    from grpo_monitor.analysis.analyze import analyze
    from grpo_monitor.core.runlog_writer import RunWriter

    w = RunWriter(tmp_path)
    w.header(run_id="old", start_time=1.0, config={"max_completion_length": 256, "num_generations": 8}, model={},
             reward_funcs=["accuracy_reward"])
    for step in range(1, 31):
        w.step(step, {"reward": 0.4 + 0.01 * (step % 3), "completions/mean_length": 120.0,
                      "completions/clipped_ratio": 0.05, "entropy": 0.5, "frac_reward_zero_std": 0.1}, 1000.0 + step)
        w.samples([{"type": "sample", "step": step, "rank": 0, "index": i, "group": i // 8, "length": 100 + i,
                    "truncated": False, "rewards": {"accuracy_reward": float(i % 2)}, "correct": i % 2 == 1,
                    "chars": 400, "tail_rep": 0.0, "text_hash": i} for i in range(32)])
    w.close()
    report = analyze(tmp_path).runs[0]
    assert report.steps == 30 and not [f for f in report.findings if f.detector == "language_mixing"]
    assert report.coverage["language_mixing"]["status"] in ("too_few_points", "missing_inputs")
    det = LanguageMixing()
    rows = [{"group": i // 8, "tail_rep": 0.0} for i in range(32)]
    assert [det.update(s, {"reward": 0.5}, rows) for s in range(1, 20)] == [[]] * 19 and det.state == "warming_up"
    assert BrokenGeneration().update(1, {"reward": 0.5}, rows) == []


# -- the tap on a real GRPOTrainer ------------------------------------------------------------------------


def test_the_tap_records_token_and_script_numbers_on_a_real_run(tmp_path):
    from grpo_monitor import read_run
    from tests.conftest import train_tiny

    trainer, callback = train_tiny(tmp_path, steps=2)
    assert callback.errors == {}
    log = read_run(tmp_path)
    samples = [s for rows in log.samples_by_step().values() for s in rows]
    assert samples
    for s in samples:
        assert type(s["distinct_tokens"]) is int and 1 <= s["distinct_tokens"] <= max(1, s["length"])
        if "other_script" in s:
            assert 0.0 <= s["other_script"] <= 1.0
    texts = [s for s in samples if "completion" in s and "other_script" in s]
    for s in texts:  # the excerpt of a short completion is the whole text: the same number from it
        if "omitted" not in s["completion"]:
            assert sample_other_script({"prompt": s["prompt"], "completion": s["completion"]}) == s["other_script"]
    metrics = log.steps[-1]["metrics"]
    assert metrics["system/wall_time"] == pytest.approx(log.steps[-1]["time"])
    assert metrics["system/ram_total_gib"] > 0
    states = log.steps[-1]["detectors"]
    assert {"broken_generation", "advantage_mask_bug", "language_mixing", "memory_pressure", "stall"} <= set(states)
    assert not [f for f in log.findings if f["detector"] in ("advantage_mask_bug", "memory_pressure", "stall")]


# -- the dashboard header ---------------------------------------------------------------------------------


def _write_run(d: Path, last_age_s: float, summary: bool) -> None:
    from grpo_monitor.core.runlog_writer import RunWriter
    from grpo_monitor.fixtures.dashboard_run import header, step_record

    w = RunWriter(d)
    w.header(**header())
    t0 = time.time() - last_age_s - 20 * 12.0
    for s in range(1, 21):
        rec = step_record(s)
        rec["time"] = t0 + 12.0 * s
        rec["metrics"]["system/wall_time"] = rec["time"]
        w.write(rec)
    if summary:
        w.write({"type": "summary", "step": 20, "metrics": {"train_runtime": 240.0}})
    w.close()


@pytest.mark.asyncio
@pytest.mark.parametrize("age,summary,stalled", [(3600.0, False, True), (3600.0, True, False), (5.0, False, False)],
                         ids=["stalled", "finished", "in-pace"])
async def test_header_says_when_a_live_run_has_stalled(tmp_path, age, summary, stalled):
    pytest.importorskip("textual")
    from textual.widgets import Static

    from grpo_monitor.app.dashboard import WatchApp

    _write_run(tmp_path / "run", age, summary)
    app = WatchApp(tmp_path / "run", poll_interval=0.05)
    async with app.run_test(size=(160, 40)) as pilot:
        for _ in range(200):
            if app.caught_up.is_set():
                break
            await pilot.pause(0.02)
        await pilot.pause()
        text = app.screen.query_one("#run-header", Static).visual.plain.replace("\n", " ")
        assert "step 20" in text
        assert ("stalled: no step for 60min (median step 12s)" in text) == stalled, text
