"""Sudden collapse (a reward crash against the run's running best) and the learning signal lost
versus never had: findings, evidence, the lower-learning-rate recommendation and its restart."""

from __future__ import annotations

import pytest

from grpo_monitor.detectors import NoLearningSignal, RunContext, SuddenCollapse
from grpo_monitor.fixtures.synthetic import generate
from grpo_monitor.core.recommend import LOWER_LR, Recommender, recommend
from grpo_monitor.core.restart import choose_checkpoint, reapply_learning_rate


def _findings(det, run):
    det.start(run.context)
    out = []
    for step, metrics in run.steps:
        out += det.update(step, metrics, run.samples.get(step, []))
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("ls", [1, 10])
def test_the_crash_is_found_with_the_last_healthy_step_and_its_precursors(seed, ls):
    run = generate("sudden_collapse", seed=seed, logging_steps=ls)
    found = [f for f in _findings(SuddenCollapse(), run) if f.severity == "critical"]
    assert found, "no critical finding"
    f = found[0]
    last = f.evidence["last_healthy_step"]
    assert 190 <= last <= 202 and f.onset_step == last  # the crash runs from step 201 to 203
    assert f.step <= run.labels["fail"] + 10 and f.variant is None
    assert f"last healthy step is {last}" in f.message
    assert {"kl_growing", "completions_to_cap"} & set(f.evidence["precursors"])
    assert f.config_overrides == {"learning_rate": pytest.approx(run.context.config["learning_rate"] / 10)}


@pytest.mark.parametrize("name", ["healthy_lr_warm_restart", "healthy_reward_dips", "healthy_noisy", "healthy_slow",
                                  "degenerate_long_cot", "entropy_collapse", "moe_instability_early"])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("ls", [1, 10])
def test_no_crash_in_look_alikes(name, seed, ls):
    """A planned warm restart, single bad batches, noise, and slower failures that other detectors own."""
    run = generate(name, seed=seed, logging_steps=ls)
    assert _findings(SuddenCollapse(), run) == []


def _crash_run(lr_jump: float = 1.0, steps: int = 40, at: int = 30):
    base = [1.0, 1.25, 1.125, 1.375, 1.0, 1.125, 1.25, 0.875]
    out = []
    for t in range(1, steps + 1):
        crashed = t > at
        out.append((t, {
            "reward": 0.0 if crashed else base[t % len(base)],
            "frac_reward_zero_std": 1.0 if crashed else 0.1,
            "completions/clipped_ratio": 1.0 if crashed else 0.0,
            "entropy": 0.01 if crashed else 0.55 + 0.01 * (t % 3),
            "learning_rate": 3e-4 * (lr_jump if t >= at else 1.0),
            "grad_norm": 1.0,
        }))
    return out


def test_a_learning_rate_jump_is_named_and_divided_out_of_the_recommended_rate():
    det = SuddenCollapse()
    det.start(RunContext(config={"learning_rate": 3e-4}))
    found = [f for t, m in _crash_run(lr_jump=1000.0) for f in det.update(t, m)]
    crit = [f for f in found if f.severity == "critical"][0]
    assert crit.evidence["last_healthy_step"] == 30 and crit.onset_step == 30
    assert "learning_rate_jump" in crit.evidence["precursors"]
    assert crit.config_overrides == {"learning_rate": pytest.approx(3e-8)}  # /10, and /1000 for the jump
    assert "rose 1000" in crit.message


def test_the_recommendation_is_the_lower_rate_once_per_lineage_and_gspo_on_moe():
    det = SuddenCollapse()
    config = {"learning_rate": 3e-4, "gradient_accumulation_steps": 1}
    det.start(RunContext(config=config))
    crit = [f for t, m in _crash_run() for f in det.update(t, m) if f.severity == "critical"][0].to_dict()
    rec = recommend(crit, config)
    assert rec["variant"] == LOWER_LR and rec["config_overrides"] == {"learning_rate": 3e-5}
    assert rec["cli_flags"] == "--learning_rate 3e-05" and "checkpoint saved before step 30" in rec["extra"]["resume"]
    assert recommend(crit, config, tried=[LOWER_LR]) is None
    assert recommend({**crit, "severity": "warning"}, config) is None
    moe = recommend(crit, config, is_moe=True)
    assert moe["variant"] == "gspo" and moe["config_overrides"]["importance_sampling_level"] == "sequence"
    assert moe["config_overrides"]["learning_rate"] == 3e-5
    rec_ = Recommender(config)
    assert rec_(crit)["variant"] == LOWER_LR and rec_(crit) is None


def test_the_restart_resumes_from_the_checkpoint_saved_before_the_last_healthy_step(tmp_path):
    for s in (5, 10, 15, 20, 25, 30):
        (tmp_path / f"checkpoint-{s}").mkdir()
    # The update made at the last healthy step may be the one that broke the policy.
    assert choose_checkpoint(tmp_path, onset_step=26, step=28).endswith("checkpoint-25")
    assert choose_checkpoint(tmp_path, onset_step=25, step=28).endswith("checkpoint-20")


def test_a_resumed_run_trains_at_the_overridden_rate():
    torch = pytest.importorskip("torch")
    p = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.AdamW([p], lr=3e-4)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    assert reapply_learning_rate(opt, sched, 3e-5)
    opt.step()
    sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(3e-5) and sched.get_last_lr()[0] == pytest.approx(3e-5)
    assert not reapply_learning_rate(opt, sched, 3e-5)  # already there


def _stall(steps_with_signal: int, reward_then: float, reward_after: float = 0.0):
    out = []
    for t in range(1, steps_with_signal + 31):
        had = t <= steps_with_signal
        out.append((t, {"frac_reward_zero_std": 0.2 if had else 1.0, "reward": reward_then if had else reward_after,
                        "reward_std": 0.4 if had else 0.0, "grad_norm": 1.0 if had else 0.0,
                        "completions/clipped_ratio": 0.0 if had else 1.0}))
    return out


def test_a_signal_lost_is_told_from_a_signal_never_had():
    config = {"learning_rate": 1e-6, "max_completion_length": 32}
    lost = NoLearningSignal()
    lost.start(RunContext(config=config))
    crit = [f for t, m in _stall(20, 1.2) for f in lost.update(t, m) if f.severity == "critical"][0]
    assert crit.evidence["signal"] == "lost" and crit.evidence["had_signal_until"] == 20
    assert crit.variant is None and crit.config_overrides == {"learning_rate": 1e-7}
    assert "task is learnable" in crit.message and "too hard" not in crit.message
    assert recommend(crit.to_dict(), config)["variant"] == LOWER_LR

    never = NoLearningSignal()
    never.start(RunContext(config=config))
    crit = [f for t, m in _stall(0, 0.0) for f in never.update(t, m) if f.severity == "critical"][0]
    assert crit.evidence["signal"] == "never_had" and crit.config_overrides == {}
    assert recommend(crit.to_dict(), config) is None

    # Every group alike at the best reward: a solved task, not a collapse.
    solved = NoLearningSignal()
    solved.start(RunContext(config=config))
    found = [f for t, m in _stall(20, 1.0, reward_after=1.0) for f in solved.update(t, m)]
    assert found and all(f.evidence["signal"] == "saturated" and f.config_overrides == {} for f in found)
