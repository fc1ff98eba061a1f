"""Notes on normal-but-alarming patterns: present where a run shows the pattern, absent where it does not.

Runs are labelled synthetic runs written as real run directories (the callback's ``RunWriter``) and the
public runs in ``../shared/real-runs``; the command line runs as a subprocess, the dashboard through Pilot.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from grpo_monitor import load_run
from grpo_monitor.detectors import DETECTOR_IDS
from grpo_monitor.fixtures.synthetic import generate
from grpo_monitor.analysis.analyze import analyze
from grpo_monitor.analysis.explain import LOSS_NEAR_ZERO, NOTE_IDS, explain
from grpo_monitor.core.runlog_writer import RunWriter
from grpo_monitor.core.runlog import read_run
from grpo_monitor.readers import load_source

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "real-runs"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/real-runs is not available")
ON_POLICY = {"num_iterations": 1, "gradient_accumulation_steps": 1, "steps_per_generation": 1, "beta": 0.0}


def write_run(run_dir: Path, case: str = "healthy_slow", config: dict | None = None, touch=None) -> Path:
    """A labelled synthetic run as the callback writes it; ``touch(step, metrics)`` edits a step first."""
    run = generate(case, seed=1, with_samples=False)
    w = RunWriter(run_dir)
    w.header(run_id="run-x", start_time=time.time(), config={**run.context.config, **(config or {})},
             model={"class": "Qwen3ForCausalLM", "is_moe": False}, world_size=1, parent_run=None,
             reward_funcs=run.context.reward_names, correctness_reward=run.context.correctness_reward,
             format_reward=run.context.format_reward, resumed_from_step=0)
    for step, metrics in run.steps:
        m = dict(metrics)
        if touch is not None:
            touch(step, m)
        w.step(step, m, time.time())
    w.write({"type": "summary", "step": run.steps[-1][0], "metrics": {"train_runtime": 1.0}})
    w.close()
    return run_dir


def notes_of(path) -> dict[str, dict]:
    (run,) = analyze(path).runs
    return {n["id"]: n for n in run.notes}


def real(name: str) -> dict[str, dict]:
    src = load_source(next(p for p in SHARED.rglob(f"{name}*") if p.is_file()))
    return {n["id"]: n for n in explain(src.steps, src.context)}


# -- synthetic runs written as run directories --------------------------------------------------


def test_loss_near_zero_is_explained_with_the_runs_own_numbers(tmp_path):
    d = write_run(tmp_path / "run", config=ON_POLICY)
    frame = load_run(d)
    notes = notes_of(d)
    note = notes["loss_near_zero"]
    loss = frame["loss"].dropna().to_numpy()
    near = int((np.abs(loss) <= LOSS_NEAR_ZERO).sum())
    assert note["evidence"]["near_zero_steps"] == near and note["evidence"]["steps"] == len(loss)
    assert f"{near} of {len(loss)} logged steps" in note["pattern"]
    assert "num_iterations=1 and beta=0" in note["why"] and "grad_norm (median" in note["why"]
    assert "no_learning_signal" in note["unless"] and note["watched_by"] == ["no_learning_signal"]
    assert {"id", "pattern", "why", "unless"} <= set(note)
    assert "loss_negative" in notes  # the simulated loss is centred on 0, so about half the steps are negative


def test_a_loss_of_zero_next_to_no_signal_gets_no_note(tmp_path):
    notes = notes_of(write_run(tmp_path / "run", "no_learning_signal", config=ON_POLICY))
    assert "loss_near_zero" not in notes and "loss_negative" not in notes
    # The clipping note still holds: on-policy, nothing is clipped whatever the reward does.
    assert "clip_ratio_zero" in notes


def test_clip_ratio_zero_only_when_the_run_is_on_policy(tmp_path):
    on = notes_of(write_run(tmp_path / "on", config=ON_POLICY))
    assert "steps_per_generation (1) equal to gradient_accumulation_steps (1)" in on["clip_ratio_zero"]["why"]
    # Two passes over each batch: the ratio moves, so a clip ratio of exactly 0 is not explained away.
    off = notes_of(write_run(tmp_path / "off", config={**ON_POLICY, "num_iterations": 2}))
    assert "clip_ratio_zero" not in off
    # Off-policy steps that do clip: the pattern is not there at all.
    moe = notes_of(write_run(tmp_path / "moe", "healthy_moe"))
    assert "clip_ratio_zero" not in moe


def test_grad_norm_above_max_grad_norm_is_the_pre_clip_norm(tmp_path):
    d = write_run(tmp_path / "low", config={"max_grad_norm": 0.2})
    g = load_run(d)["grad_norm"].dropna().to_numpy()
    note = notes_of(d)["grad_norm_above_max"]
    assert note["evidence"]["steps_above"] == int((g > 0.2).sum()) and not note["evidence"]["assumed_default"]
    assert "before clipping" in note["why"] and "grad_norm_spike" in note["unless"]
    assert "grad_norm_above_max" not in notes_of(write_run(tmp_path / "high", config={"max_grad_norm": 100.0}))
    # Gradient-norm spikes far above the run's own level are not explained away as clipping.
    assert "grad_norm_above_max" not in notes_of(write_run(tmp_path / "crash", "sudden_collapse", config={"max_grad_norm": 0.2}))


def test_importance_ratio_noise_is_explained_but_a_growing_mismatch_is_not(tmp_path):
    assert "is_ratio_not_one" in notes_of(write_run(tmp_path / "small", "healthy_small_mismatch"))
    for case in ("rollout_mismatch_kl", "moe_instability"):
        assert "is_ratio_not_one" not in notes_of(write_run(tmp_path / case, case)), case


def test_cold_start_reward_of_zero_then_learning(tmp_path):
    def cold(step, m):
        if step <= 12:
            for k in list(m):
                if k.startswith("rewards/") or k in ("reward", "reward_std"):
                    m[k] = 0.0
            m["frac_reward_zero_std"] = 1.0

    note = notes_of(write_run(tmp_path / "cold", touch=cold))["reward_zero_at_start"]
    assert note["evidence"]["zero_steps"] == 12 and "first 12 logged steps" in note["pattern"]
    assert "reward_zero_at_start" not in notes_of(write_run(tmp_path / "warm"))
    # A reward that never leaves 0 is no cold start.
    assert "reward_zero_at_start" not in notes_of(write_run(tmp_path / "dead", "no_learning_signal"))


def test_batch_spread_above_zero_with_group_spread_zero(tmp_path):
    def alike(step, m):
        if step in (40, 41, 90):
            m["reward_std"] = 0.0

    note = notes_of(write_run(tmp_path / "run", touch=alike))["component_std_vs_group_std"]
    assert note["evidence"]["steps"] == 3 and note["evidence"]["first_step"] == 40
    assert "within each group" in note["why"]
    # Where groups stay alike for good it is a run without signal: the detector's finding speaks.
    assert "component_std_vs_group_std" not in notes_of(write_run(tmp_path / "collapse", "entropy_collapse"))


def test_a_saturated_format_reward_is_explained_and_a_dead_one_is_not(tmp_path):
    run_dir = write_run(tmp_path / "run", "healthy_format_from_start")
    (report,) = analyze(run_dir).runs
    note = {n["id"]: n for n in report.notes}["format_reward_saturated"]
    assert note["evidence"]["component"] == "format_reward" and note["evidence"]["value"] == 1.0
    assert "saturated" in note["why"] and "reward_function_bug" in note["watched_by"]
    assert report.verdict == "healthy"  # saturation is not a bug
    assert "format_reward_saturated" not in notes_of(write_run(tmp_path / "dead", "reward_bug_dead_format"))


def test_every_input_form_gives_the_same_notes(tmp_path):
    d = write_run(tmp_path / "run", config={**ON_POLICY, "max_grad_norm": 0.2})
    config = read_run(d).header["config"]
    from_frame = explain(load_run(d), config)
    from_records = explain(read_run(d).steps, config)
    src = load_source(d)
    from_source = explain(src.steps, src.context)
    ids = [n["id"] for n in from_frame]
    assert ids and ids == [n["id"] for n in from_records] == [n["id"] for n in from_source]
    assert [n["pattern"] for n in from_frame] == [n["pattern"] for n in from_source]


def test_unusable_values_never_raise():
    steps = [{"step": s, "loss": "n/a", "grad_norm": None, "reward": [1], "kl": float("inf")} for s in range(1, 30)]
    assert explain(steps, None) == []
    assert explain([], {}) == []


def test_every_watching_detector_exists():
    from grpo_monitor.analysis.explain import WATCHED_BY

    named = {d for ids in WATCHED_BY.values() for d in ids}
    assert set(WATCHED_BY) == set(NOTE_IDS) and all(WATCHED_BY.values())
    assert named <= set(DETECTOR_IDS), f"named but not a detector: {sorted(named - set(DETECTOR_IDS))}"


# -- public runs ---------------------------------------------------------------------------------


@needs_shared
def test_real_run_with_steady_kl_and_shrinking_answers():
    notes = real("abdo_gemma3_grpo")
    assert {"loss_near_zero", "loss_rising", "kl_rising", "length_falling"} <= set(notes)
    kl = notes["kl_rising"]["evidence"]
    assert kl["kl_max"] <= 1.0 and kl["kl_last"] > kl["kl_first"]


@needs_shared
def test_real_run_with_falling_reward_spread_while_reward_rises():
    notes = real("AmitChowdary122_cybersoc")
    assert {"reward_std_falling", "clip_ratio_zero", "reward_negative", "kl_rising"} <= set(notes)
    assert "does not record" in notes["clip_ratio_zero"]["why"]  # a foreign log: the defaults are named as such
    ev = notes["reward_std_falling"]["evidence"]
    assert ev["reward_std_last"] < ev["reward_std_first"] and ev["reward_last"] > ev["reward_first"]


@needs_shared
def test_real_runs_whose_alarming_pattern_is_real_get_no_reassurance():
    assert "kl_rising" not in real("Ning-Guo_hotpotqa")  # KL above 2 for most of the run
    assert "kl_rising" not in real("dumbkin31_verl")  # KL to 1.05 as length runs away
    koi = real("koivualeksi_sanitizer")  # every group alike, and a first gradient norm of 421,404
    assert "loss_near_zero" not in koi and "grad_norm_above_max" not in koi
    assert "loss_near_zero" not in real("sunshine_grpo")  # grad_norm exactly 0 on most steps
    gspo = real("toolanzyhhh1234_gspo")
    assert "advantage_mean_zero" in gspo and "loss_near_zero" not in gspo  # a quarter of the steps had no gradient
    assert "length_falling" not in real("HarleyCoops_dakota_qwen3_06b_primerl_orchestrator")  # exact match never moves


# -- the command line and the dashboard ------------------------------------------------------------


def cli(*args):
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, "-m", "grpo_monitor", "analyze", *map(str, args)], capture_output=True,
                          text=True, env=env)


def test_analyze_cli_reports_notes_without_changing_the_exit_code(tmp_path):
    healthy = write_run(tmp_path / "healthy", config={**ON_POLICY, "max_grad_norm": 0.2})
    out = cli(healthy, "--json")
    assert out.returncode == 0, out.stderr
    run = json.loads(out.stdout)["runs"][0]
    assert run["verdict"] == "healthy"
    assert {"loss_near_zero", "clip_ratio_zero", "grad_norm_above_max"} <= {n["id"] for n in run["normal"]}
    assert all(n["id"] in NOTE_IDS and n["pattern"] and n["why"] and n["unless"] for n in run["normal"])

    md = tmp_path / "report.md"
    text = cli(healthy, "--markdown", md)
    assert text.returncode == 0
    assert "Looks odd but is normal:" in text.stdout and "  loss_near_zero: loss is within" in text.stdout
    assert "### Looks odd but is normal" in md.read_text() and "**clip_ratio_zero**" in md.read_text()

    failing = write_run(tmp_path / "failing", "entropy_collapse", config=ON_POLICY)
    out = cli(failing, "--json")
    run = json.loads(out.stdout)["runs"][0]
    assert out.returncode == 1 and run["verdict"] in ("warning", "critical")
    assert "clip_ratio_zero" in {n["id"] for n in run["normal"]}


async def test_dashboard_shows_the_notes(tmp_path):
    pytest.importorskip("textual")
    from textual.widgets import Static

    from grpo_monitor.app.dashboard import WatchApp
    from grpo_monitor.fixtures.dashboard_run import write_synthetic_run

    d = tmp_path / "run"
    write_synthetic_run(d, steps=50)
    expected = [n["id"] for n in explain(load_run(d), read_run(d).header["config"])]
    assert "kl_rising" in expected
    app = WatchApp(d, poll_interval=0.05)
    async with app.run_test(size=(160, 48)) as pilot:
        loop_end = time.monotonic() + 20
        while not app.caught_up.is_set() and time.monotonic() < loop_end:
            await pilot.pause(0.02)
        await pilot.press("2")
        await pilot.pause()
        panel = app.screen.query_one("#notes-panel")
        text = panel.query_one("#notes-text", Static).visual.plain
        assert panel.display and [n["id"] for n in panel.notes] == expected
        for note_id in expected:
            assert note_id in text
        assert "why: " in text and "unless: " in text
