"""The monitor attached to a real GRPOTrainer on the tiny dense and MoE models."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from grpo_monitor import load_run, read_run
from tests.conftest import train_tiny

UNCONDITIONAL = [
    "loss", "grad_norm", "learning_rate", "num_tokens",
    "completions/mean_length", "completions/min_length", "completions/max_length", "completions/clipped_ratio",
    "completions/mean_terminated_length", "completions/min_terminated_length", "completions/max_terminated_length",
    "reward", "reward_std", "frac_reward_zero_std", "entropy",
    "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean", "clip_ratio/low_min", "clip_ratio/high_max",
    "step_time", "epoch",
]
COMPONENTS = ["format_reward", "correctness_reward"]
STEPS = 4


@pytest.fixture(scope="module", params=[False, True], ids=["dense", "moe"])
def trained(request, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("moe" if request.param else "dense")
    trainer, callback = train_tiny(run_dir, steps=STEPS, moe=request.param)
    return request.param, run_dir, trainer, callback


def test_run_log_has_every_logged_metric_finite(trained):
    moe, run_dir, trainer, _ = trained
    frame = load_run(run_dir)
    assert len(frame) >= STEPS and list(frame.index[:STEPS]) == list(range(1, STEPS + 1))
    expected = UNCONDITIONAL + [f"rewards/{c}/{s}" for c in COMPONENTS for s in ("mean", "std")]
    if moe:
        expected.append("aux_loss")
    for key in expected:
        assert key in frame.columns, key
        assert np.isfinite(frame[key].to_numpy()).all(), key


def test_steps_match_trainer_log_history(trained):
    _, run_dir, trainer, _ = trained
    logged = {h["step"]: h for h in trainer.state.log_history if "train_runtime" not in h}
    log = read_run(run_dir)
    for rec in log.steps:
        assert rec["metrics"]["entropy"] == pytest.approx(logged[rec["step"]]["entropy"], abs=0)
    assert log.summary is not None and "train_runtime" in log.summary["metrics"]


def test_recorded_samples_reproduce_trl_reward_and_length_means(trained):
    _, run_dir, trainer, _ = trained
    log = read_run(run_dir)
    by_step = log.samples_by_step()
    args = trainer.args
    for rec in log.steps:
        samples = by_step[rec["step"]]
        assert len(samples) == args.per_device_train_batch_size * args.gradient_accumulation_steps
        for c in COMPONENTS:
            mean = np.mean([s["rewards"][c] for s in samples])
            assert mean == pytest.approx(rec["metrics"][f"rewards/{c}/mean"], abs=1e-6)
        assert np.mean([s["length"] for s in samples]) == pytest.approx(rec["metrics"]["completions/mean_length"], abs=1e-6)
        assert np.mean([s["truncated"] for s in samples]) == pytest.approx(rec["metrics"]["completions/clipped_ratio"], abs=1e-6)
        groups = {}
        for s in samples:
            groups.setdefault(s["group"], []).append(s["prompt"])
        assert all(len(g) == args.num_generations and len(set(g)) == 1 for g in groups.values())


def test_reward_functions_keep_names_and_values(trained):
    _, _, trainer, _ = trained
    assert trainer.reward_func_names == COMPONENTS
    assert [f.__name__ for f in trainer.reward_funcs] == COMPONENTS
    from grpo_monitor.fixtures.tiny import correctness_reward

    wrapped = trainer.reward_funcs[1]
    assert wrapped(completions=["<answer> 3 </answer>", "x"], target=["3", "3"]) == correctness_reward(
        completions=["<answer> 3 </answer>", "x"], target=["3", "3"])


def test_header_describes_config_model_and_versions(trained):
    moe, run_dir, trainer, _ = trained
    header = read_run(run_dir).header
    assert header["config"]["num_generations"] == trainer.args.num_generations
    assert header["config"]["loss_type"] == trainer.args.loss_type
    assert header["versions"]["trl"] and header["versions"]["torch"]
    assert header["world_size"] == 1 and header["parent_run"] is None
    assert header["reward_funcs"] == COMPONENTS and header["correctness_reward"] == "correctness_reward"
    assert header["format_reward"] == "format_reward"
    model = header["model"]
    assert model["num_parameters"] == sum(p.numel() for p in trainer.model.parameters())
    if moe:
        assert model["is_moe"] and model["num_experts"] == 8 and model["top_k"] == 2
        assert model["moe_layers"] == [0, 1] and model["num_layers"] == 2
    else:
        assert not model["is_moe"] and model["num_experts"] is None


def test_no_monitor_errors(trained):
    _, _, _, callback = trained
    assert callback.errors == {}


def test_coarse_logging_is_said_once_and_changes_nothing(tmp_path, caplog):
    import logging

    caplog.set_level(logging.INFO, logger="grpo_monitor")
    trainer, _ = train_tiny(tmp_path, steps=4, logging_steps=2)
    said = [r for r in caplog.records if "logging_steps" in r.getMessage() and r.levelno >= logging.WARNING]
    assert len(said) == 1 and "\n" not in said[0].getMessage()
    assert trainer.args.logging_steps == 2
    log = read_run(tmp_path)
    assert [r["step"] for r in log.steps] == [2, 4]
    assert any(f["detector"] == "config_logging_steps" for f in log.findings)
    # Samples of both steps in each logging window are attached to the logged step.
    assert len(log.samples_by_step()[2]) == 2 * trainer.args.per_device_train_batch_size


def test_system_metrics_are_recorded(trained):
    _, run_dir, _, _ = trained
    frame = load_run(run_dir)
    assert (frame["system/rss_peak_gib"] > 0).all()


def test_router_tap_can_be_left_off(tmp_path):
    """``router_tap=False``: no tap on the MoE routers, so no routing metrics (with the tap on, the
    same model logs them: test_router_tap.py); everything else is recorded."""
    trainer, callback = train_tiny(tmp_path, steps=2, moe=True, attach_options={"router_tap": False})
    assert callback.router_tap is None and not callback.errors
    frame = load_run(tmp_path)
    assert len(frame) == 2 and "entropy" in frame.columns
    assert not [c for c in frame.columns if c.startswith("moe/") and c != "moe/aux_loss"]


def test_the_fits_imports_are_paid_at_train_begin_not_at_the_first_finding(tmp_path):
    # scipy's fits (the forecast on a finding, the entropy-performance fit) cost ~1-2 s to import: paid inside
    # the step that raises the first finding, they would stall that training step. A fresh interpreter, so
    # only what the training stack itself imports is there before (scipy.optimize, not scipy.stats).
    import json
    import subprocess
    import sys

    code = f"""
import json, sys, warnings
import transformers
transformers.logging.set_verbosity_error()
warnings.filterwarnings("ignore")
from grpo_monitor.app.demo import build_trainer, demo_config
from grpo_monitor.callbacks import attach
from pathlib import Path
run = Path({str(tmp_path)!r})
trainer = build_trainer(demo_config(run / "trainer", 1, disable_tqdm=True))
attach(trainer, run / "run")
before = [m for m in ("scipy.stats", "scipy.optimize") if m in sys.modules]
trainer.callback_handler.on_train_begin(trainer.args, trainer.state, trainer.control)
after = [m for m in ("scipy.stats", "scipy.optimize") if m in sys.modules]
print(json.dumps([before, after]))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=str(Path(__file__).resolve().parents[1])).stdout.strip().splitlines()[-1]
    before, after = json.loads(out)
    assert "scipy.stats" not in before and after == ["scipy.stats", "scipy.optimize"], out
