"""Kinds of public runs the monitor once misjudged (``fixtures.field.public_kinds``), rebuilt from their
curves and replayed through the real engine with every detector at ``logging_steps`` 1 and 10: the healthy
ones raise nothing, the failures get the right verdict and advice, and no recommended value leaves the
run's own healthy range. The MoE run whose log names no model goes through the real CLI, with and without
``--model``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from grpo_monitor.core.engine import Engine
from grpo_monitor.core.recommend import recommend
from grpo_monitor.detectors import ALL_DETECTORS
from grpo_monitor.detectors.base import Finding
from grpo_monitor.fixtures.field import public_kinds
from grpo_monitor.fixtures.synthetic import generate

SEEDS = (0, 1, 2)
ALARMS = ("warning", "critical")
FAILURES = tuple(n for n in public_kinds.SPECS if n not in public_kinds.HEALTHY)


def replay(run) -> list[Finding]:
    engine = Engine(run.context, [cls() for cls in ALL_DETECTORS])
    for step, metrics in run.steps:
        engine.update(step, metrics, run.samples.get(step, []))
    return engine.findings


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("logging_steps", (1, 10))
@pytest.mark.parametrize("name", public_kinds.HEALTHY)
def test_healthy_kind_raises_nothing(name, logging_steps, seed):
    found = replay(generate(name, seed=seed, logging_steps=logging_steps))
    assert [(f.detector, f.severity, f.step) for f in found if f.severity in ALARMS] == []


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("logging_steps", (1, 10))
@pytest.mark.parametrize("name", FAILURES)
def test_failure_kind_gets_its_verdict_in_time(name, logging_steps, seed):
    run = generate(name, seed=seed, logging_steps=logging_steps)
    labels = run.labels
    alarms = [f for f in replay(run) if f.severity in ALARMS]
    hits = [f for f in alarms if f.detector == labels["expect"][0]]
    assert hits, [(f.detector, f.severity, f.step) for f in alarms]
    assert hits[0].step <= labels["fail"]
    assert hits[0].variant == labels["variant"]
    tolerated = set(labels["expect"]) | set(labels["allow"])
    assert sorted({f.detector for f in alarms} - tolerated) == []


def test_a_noisy_reward_model_score_never_reads_as_a_crash():
    # The running best of a heavy-tailed series is its extreme value: judged against it, every dip is a crash.
    for seed in SEEDS:
        found = replay(generate("rm_noisy_reward", seed=seed))
        assert not [f for f in found if f.detector == "sudden_collapse"]


def run_config(ls, seed):
    return generate("grad_norm_wakes_up", seed=seed, logging_steps=ls).context.config


def test_a_waking_gradient_norm_is_not_a_spike_and_gets_no_clip():
    for seed in SEEDS:
        for ls in (1, 10):
            found = replay(generate("grad_norm_wakes_up", seed=seed, logging_steps=ls))
            assert not [f for f in found if f.detector == "grad_norm_spike"]
            for f in found:
                rec = recommend(f.to_dict(), run_config(ls, seed), require_critical=False) or {}
                assert "max_grad_norm" not in (rec.get("config_overrides") or {}), rec


def test_saturation_says_the_task_is_solved_not_dapo():
    found = replay(generate("saturated_in_11_steps", seed=0))
    nls = [f for f in found if f.detector == "no_learning_signal" and f.severity in ALARMS]
    assert nls and nls[0].variant is None
    assert "solved" in nls[0].message and "harder prompts" in nls[0].message
    assert not [f for f in found if f.detector == "entropy_collapse" and f.severity in ALARMS]


def test_capped_but_learning_is_not_no_learning_signal():
    found = replay(generate("capped_but_learning", seed=0))
    assert not [f for f in found if f.detector in ("no_learning_signal", "truncation") and f.severity in ALARMS]


def test_an_entropy_bonus_runaway_names_the_bonus():
    found = replay(generate("entropy_bonus_runaway", seed=0))
    hit = next(f for f in found if f.detector == "degenerate_long_cot" and f.severity in ALARMS)
    assert hit.evidence["entropy_bonus"] == 0.01
    assert "entropy_coef=0.01" in hit.message
    assert not [f for f in found if f.detector == "length_reward_coupling" and f.severity in ALARMS]


def _trainer_state(run) -> dict:
    history = []
    for step, metrics in run.steps:
        row = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        row["step"] = step
        history.append(row)
    return {"global_step": run.steps[-1][0], "log_history": history}


def _analyze(path, *extra) -> dict:
    out = subprocess.run([sys.executable, "-m", "grpo_monitor", "analyze", str(path), "--json", *extra],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode in (0, 1), out.stderr
    return json.loads(out.stdout)["runs"][0]


def test_moe_named_by_model_gets_gspo_offline(tmp_path):
    run = generate("moe_blowup_unnamed", seed=0)
    path = tmp_path / "trainer_state.json"
    path.write_text(json.dumps(_trainer_state(run)))
    unnamed = _analyze(path)
    assert "moe_instability" not in {f["detector"] for f in unnamed["findings"] if f["severity"] in ALARMS}
    named = _analyze(path, "--model", "Qwen/Qwen3-30B-A3B")
    moe = [f for f in named["findings"] if f["detector"] == "moe_instability" and f["severity"] in ALARMS]
    assert moe and moe[0]["variant"] == "gspo"
    assert moe[0]["step"] <= run.labels["fail"]


def test_no_clip_below_the_runs_own_norm_and_no_lr_cut_beyond_the_evidence():
    from grpo_monitor.core.recommend import Recommender

    r = Recommender({"learning_rate": 1e-5, "max_grad_norm": 1.0})
    rec = r({"detector": "grad_norm_spike", "severity": "critical", "step": 50, "variant": None,
             "evidence": {"remedy": "clip_grad_norm", "recent_median": 0.1},
             "config_overrides": {"max_grad_norm": 5.7e-06, "learning_rate": 5e-6}})
    assert rec is not None
    assert "max_grad_norm" not in rec["config_overrides"] and rec["config_overrides"]["learning_rate"] == 5e-6
    assert any("below the run's typical grad norm" in why for why in rec["extra"]["refused"])
    rec = Recommender({"learning_rate": 1e-5})({
        "detector": "grad_norm_spike", "severity": "critical", "step": 50, "variant": None,
        "evidence": {"remedy": "lower_learning_rate"}, "config_overrides": {"learning_rate": 1e-8}})
    assert rec is None or "learning_rate" not in rec["config_overrides"]


def test_clip_higher_on_a_log_whose_clipping_never_fired_says_it_needs_off_policy_steps():
    from grpo_monitor.core.recommend import Recommender

    finding = {"detector": "entropy_collapse", "severity": "critical", "step": 80, "variant": "dapo"}
    plain = Recommender({})(finding)
    assert "steps_per_generation" not in plain["config_overrides"]
    rec = Recommender({}, clipping_never_fired=True)(finding)
    assert rec["config_overrides"]["steps_per_generation"] == 4
    assert any("clip ratios are 0 at every logged step" in why for why in rec["reasons"])
