"""A real GRPOTrainer on the tiny model with a KL penalty whose policy never moves (learning rate 0, as when a
LoRA adapter is not applied), an evaluation every 10 steps and a team rule: the callback's findings carry
their cost and the rule's finding reaches a real webhook on 127.0.0.1; the held-out score is logged under its
canonical name; ``analyze`` of the run directory replays the same findings, the recorded rule included."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from test_alerts import Hook

pytest.importorskip("trl")

STEPS = 42
RULE = {"id": "kl_stuck_at_zero", "metric": "kl", "below": 1e-6, "for_steps": 5, "severity": "warning",
        "message": "Our adapters must move the policy.", "advice": "check peft_config"}


def _train(tmp_path: Path, hook: Hook) -> Path:
    import transformers
    from trl import GRPOTrainer

    from grpo_monitor.app.demo import WARM_START_STEPS, demo_config
    from grpo_monitor.callbacks import AlertOptions, attach
    from grpo_monitor.fixtures.tiny import REWARD_FUNCS, build_dataset, build_model, build_tokenizer

    transformers.logging.set_verbosity_error()
    warnings.filterwarnings("ignore")
    args = demo_config(tmp_path / "out", STEPS, beta=0.04, learning_rate=0.0, eval_strategy="steps", eval_steps=10,
                       per_device_eval_batch_size=8)
    trainer = GRPOTrainer(model=build_model(warm_start=WARM_START_STEPS), reward_funcs=list(REWARD_FUNCS), args=args,
                          train_dataset=build_dataset(), eval_dataset=build_dataset().select(range(16)),
                          processing_class=build_tokenizer())
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps({"rules": [RULE]}))
    run_dir = tmp_path / "run"
    attach(trainer, run_dir, gpu_hour_price=4.0, rules=str(rules), alerts=AlertOptions(to=hook.url(), min_severity="warning"))
    trainer.train()
    return run_dir


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    hook = Hook()
    tmp = tmp_path_factory.mktemp("live")
    run_dir = _train(tmp, hook)
    records = [json.loads(line) for line in (run_dir / "run.jsonl").read_text().splitlines()]
    return run_dir, records, hook


def test_pinned_kl_and_the_rule_are_found_live_with_their_cost(trained):
    run_dir, records, _ = trained
    found = {(r["detector"], r["severity"]): r for r in records if r["type"] == "finding"}
    assert ("kl_pinned", "warning") in found, sorted(found)
    assert ("kl_stuck_at_zero", "warning") in found, sorted(found)
    pinned = found[("kl_pinned", "warning")]
    assert pinned["evidence"]["beta"] == 0.04 and pinned["evidence"]["max_abs_kl"] == 0.0
    cost = pinned["evidence"]["cost"]
    # One process on the CPU: one device; the monitor's own clock measured the wall time.
    assert cost["devices"] == 1 and cost["wall_from"] == "system/wall_time" and cost["wall_seconds"] > 0
    assert cost["since_step"] == pinned["onset_step"] and cost["to_step"] == pinned["step"]
    assert cost["money"] == pytest.approx(cost["gpu_hours"] * 4.0, abs=0.011)
    rule = found[("kl_stuck_at_zero", "warning")]
    assert rule["message"].endswith("Our adapters must move the policy.")
    assert rule["evidence"]["advice"] == "check peft_config" and "cost" in rule["evidence"]
    header = records[0]
    assert header["type"] == "header" and header["rules"][0]["id"] == "kl_stuck_at_zero"


def test_the_rule_finding_reaches_the_webhook(trained):
    _, _, hook = trained
    hook.wait(1)
    assert any("kl_stuck_at_zero" in json.dumps(body) for _, body in hook.received), hook.received


def test_evaluations_are_logged_under_their_canonical_name(trained):
    _, records, _ = trained
    evals = [r for r in records if r["type"] == "step" and "eval_reward" in r["metrics"]]
    # every eval_steps, and once more at the end of training
    assert [r["step"] for r in evals] == [10, 20, 30, 40, STEPS]


def test_evaluation_completions_are_not_taken_for_training_samples(trained):
    """TRL scores an evaluation's 16 completions with the same reward functions: the samples of a step are
    the training batch's alone, evaluation or not (the held-out prompts would pass for the step's batch)."""
    from collections import Counter

    run_dir, _, _ = trained
    rows = [json.loads(line) for f in sorted(run_dir.glob("samples.rank*.jsonl")) for line in f.read_text().splitlines()]
    per_step = Counter(r["step"] for r in rows if r["type"] == "sample")
    batch = Counter(per_step.values()).most_common(1)[0][0]
    assert set(per_step) == set(range(1, STEPS + 1)), sorted(set(range(1, STEPS + 1)) - set(per_step))
    assert all(n == batch for n in per_step.values()), {s: n for s, n in per_step.items() if n != batch}


def test_the_replay_gives_the_same_findings_rule_included(trained):
    from grpo_monitor.analysis.analyze import analyze

    run_dir, records, _ = trained
    live = [(r["detector"], r["severity"], r["step"]) for r in records
            if r["type"] == "finding" and not r["detector"].startswith("config_")]
    report = analyze(run_dir).runs[0]
    replayed = [(f.detector, f.severity, f.step) for f in report.findings if not f.detector.startswith("config_")]
    assert replayed == live
    live_cost = next(r["evidence"]["cost"] for r in records if r["type"] == "finding" and r["detector"] == "kl_pinned")
    offline = next(f.evidence["cost"] for f in report.findings if f.detector == "kl_pinned")
    assert offline["steps"] == live_cost["steps"] and offline["devices"] == live_cost["devices"]
