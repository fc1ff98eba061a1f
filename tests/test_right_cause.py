"""The right cause for the failures a new user makes on purpose, on real GRPOTrainer runs and logs of their shape.

- a correctness reward reading a dataset column that is not there: 0.0 on every completion while the format reward
  sits at its full score (a live run on the tiny model, and the recorded runs under ``benchmarks/real_runs/made``);
- a learning rate a hundred times too high: the policy breaks in its first updates (recorded runs, one and two ranks);
- a reward paying 0.1 per word: the same cause on one rank and on two (recorded runs);
- a ``trainer_state.json`` whose two format rewards are exactly 0.0 at all 25 logged points.

None is "the task is solved", none advises an inference engine's weight sync on a run without one.
"""

from __future__ import annotations

import json

import pytest

from grpo_monitor.analysis.analyze import analyze
from tests.conftest import ROOT

MADE = ROOT / "benchmarks" / "real_runs" / "made"
ALARMS = ("warning", "critical")


def _findings(path):
    report = analyze(path)
    return [f for r in report.runs for f in r.findings if not f.detector.startswith("config_")]


def _never_solved_nor_engine(findings):
    for f in findings:
        assert "task is solved" not in f.message, f.message
        assert "vLLM" not in f.message and "weight sync" not in f.message, f.message


@pytest.mark.parametrize("case", ["missing_column_log10_rank1", "missing_column_log10_rank2", "missing_column_log5_rank2",
                                  "missing_column_log10_rank1.trainer_state.json"])
def test_a_correctness_reward_reading_a_missing_column_is_named(case):
    findings = _findings(MADE / case)
    bugs = [f for f in findings if f.detector == "reward_function_bug" and f.severity in ALARMS]
    assert bugs, [(f.detector, f.severity, f.message[:80]) for f in findings]
    assert "correctness_reward" in bugs[0].message
    assert all(f.severity == "critical" for f in bugs[-1:])
    _never_solved_nor_engine(findings)


def test_a_live_run_whose_correctness_reads_a_missing_column(tmp_path):
    """A real GRPOTrainer on the tiny model with the user's mistake (the column is "answer", the dataset has "target"),
    40 steps of 8 completions: 320 completions at 0.0, as the trial had."""
    from trl import GRPOTrainer

    from grpo_monitor import attach
    from grpo_monitor.app.demo import demo_config
    from grpo_monitor.fixtures.tiny import build_dataset, build_model, build_tokenizer, format_reward

    def correctness_reward(completions, **kwargs):
        answers = kwargs.get("answer") or [None] * len(completions)
        return [1.0 if a is not None and a in c else 0.0 for c, a in zip(completions, answers)]

    trainer = GRPOTrainer(model=build_model(warm_start=150), processing_class=build_tokenizer(),
                          reward_funcs=[format_reward, correctness_reward], train_dataset=build_dataset(),
                          args=demo_config(tmp_path / "out", 40))
    attach(trainer, tmp_path / "run")
    trainer.train()
    findings = _findings(tmp_path / "run")
    bugs = [f for f in findings if f.detector == "reward_function_bug" and f.severity == "critical"]
    assert bugs and "correctness_reward" in bugs[0].message, [(f.detector, f.severity, f.message[:90]) for f in findings]
    _never_solved_nor_engine(findings)


@pytest.mark.parametrize("case", ["lr_100x_log1_rank1", "lr_100x_log1_rank2", "lr_100x_log1_rank1.trainer_state.json",
                                  "lr_100x_log1_rank2.trainer_state.json"])
def test_a_learning_rate_a_hundred_times_too_high_is_a_learning_rate_finding(case):
    findings = _findings(MADE / case)
    header = json.loads((MADE / "lr_100x_log1_rank1" / "run.jsonl").read_text().splitlines()[0])
    configured = header["config"]["learning_rate"]
    collapse = [f for f in findings if f.detector == "sudden_collapse" and f.severity in ALARMS]
    assert collapse, [(f.detector, f.severity, f.message[:80]) for f in findings]
    lr = collapse[0].config_overrides.get("learning_rate")
    # A hundred times lower where the config is known (a tenth rarely saves a policy that broke in its first updates).
    assert lr is None and case.endswith(".json") or lr == pytest.approx(configured / 100)
    # No variant cures a policy its updates broke: under auto-restart a DAPO alarm would restart at the same rate.
    assert not [f for f in findings if f.severity in ALARMS and f.variant], [(f.detector, f.variant) for f in findings]
    _never_solved_nor_engine(findings)


@pytest.mark.parametrize("logging_steps", [1, 10])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_text_gone_to_the_cap_in_the_first_updates_is_the_learning_rate_not_dapo(logging_steps, seed):
    """The synthetic kind of the same failure, falling over five updates rather than two: the completions reach the
    cap with the entropy up before every group scores alike, which reads like degeneration but is no drift."""
    from grpo_monitor.core.session import open_session
    from grpo_monitor.fixtures.synthetic import generate

    run = generate("broken_by_first_updates", seed=seed, logging_steps=logging_steps)
    session = open_session(run.context)
    session.replay(run.steps, run.samples)
    alarms = [f for f in session.findings if f.severity in ALARMS]
    assert alarms and alarms[0].detector in ("sudden_collapse", "broken_generation"), [(f.detector, f.step) for f in alarms]
    assert "learning_rate" in alarms[0].config_overrides
    assert not [f for f in alarms if f.variant], [(f.detector, f.variant) for f in alarms]


@pytest.mark.parametrize("case", ["per_word_bonus_log1_rank1", "per_word_bonus_log1_rank2"])
def test_a_reward_paying_per_word_is_the_cause_on_one_rank_and_on_two(case):
    findings = _findings(MADE / case)
    assert not [f for f in findings if f.detector == "broken_generation"]
    bugs = [f for f in findings if f.detector == "reward_function_bug" and f.severity in ALARMS]
    assert bugs and bugs[0].evidence["components"][0]["component"] == "verbosity_bonus"
    assert bugs[0].evidence["components"][0]["kind"] == "per_token"
    _never_solved_nor_engine(findings)


def test_two_format_rewards_at_zero_in_a_trainer_state_json_are_named(tmp_path):
    """25 logged points, older TRL's key names (no per-function std): the strict and soft format rewards are 0.0 at
    every one while the correctness varies and rises."""
    history = []
    for k in range(1, 26):
        correct = 0.2 + 0.02 * k + (0.05 if k % 3 == 0 else 0.0)
        history.append({"step": k, "loss": 0.0, "reward": correct + 0.1, "reward_std": 0.4,
                        "rewards/strict_format_reward_func": 0.0, "rewards/soft_format_reward_func": 0.0,
                        "rewards/xmlcount_reward_func": 0.1 + 0.001 * k, "rewards/correctness_reward_func": correct,
                        "completion_length": 150.0 - k, "kl": 0.001 * k})
    path = tmp_path / "trainer_state.json"
    path.write_text(json.dumps({"global_step": 25, "log_history": history}))
    report = analyze(path)
    run = report.runs[0]
    assert "reward_function_bug" not in run.not_judged
    (bug,) = [f for f in run.findings if f.detector == "reward_function_bug"]
    assert {c["component"] for c in bug.evidence["components"]} == {"strict_format_reward_func", "soft_format_reward_func"}
    # The correctness pays and rises: the dead checks add nothing to any advantage, said as information.
    assert bug.severity == "info"
    _never_solved_nor_engine(run.findings)


HAND_WRITTEN = {"rollout_reward_mean": "reward", "rollout_reward_std": "reward_std",
                "mean_response_length": "completions/mean_length", "gradient_norm": "grad_norm",
                "answer_accuracy": "rewards/answer_accuracy/mean", "format_accuracy": "rewards/format_accuracy/mean",
                "val_accuracy": "eval_accuracy"}
EVAL_ONLY = {"train_eval_divergence", "eval_drop"}


def _hand_written(state: dict, path):
    """The recorded run as a hand-written trainer logs it: ``type: rollout`` records counted by ``grpo_step`` under
    its own names, and a ``type: eval`` record with ``val_accuracy`` every tenth step."""
    lines = []
    for rec in state["log_history"]:
        if "reward" not in rec:
            continue
        own = {"type": "rollout", "grpo_step": rec["step"], "rollout_reward_mean": rec["reward"],
               "rollout_reward_std": rec["reward_std"], "mean_response_length": rec["completions/mean_length"],
               "gradient_norm": rec["grad_norm"],
               "answer_accuracy": rec["rewards/correctness_reward/mean"],
               "format_accuracy": rec["rewards/format_reward/mean"]}
        lines.append(own)
        if rec["step"] % 10 == 0:
            lines.append({"type": "eval", "grpo_step": rec["step"], "val_accuracy": own["answer_accuracy"]})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def _alarms(findings):
    return {f.detector for f in findings if f.severity in ALARMS and f.detector not in EVAL_ONLY}


@pytest.mark.parametrize("case", ["lr_100x_log1_rank1", "lr_100x_log5_rank2", "healthy_log5_rank1"])
def test_a_hand_written_trainers_jsonl_is_judged_by_its_names_without_map(case, tmp_path):
    """Its names say reward, length, accuracy: they are mapped, the mapping is shown, and the run gets the
    diagnosis the same run gets under TRL's names."""
    from grpo_monitor.analysis.render import render_text

    state_path = MADE / f"{case}.trainer_state.json"
    path = _hand_written(json.loads(state_path.read_text()), tmp_path / "train_log.jsonl")
    report = analyze(path)
    (run,) = report.runs
    mapped = {n: m["to"] for n, m in run.names["mapped"].items()}
    assert mapped == HAND_WRITTEN
    text = render_text(report)
    assert "names: " in text and "rollout_reward_mean → reward" in text and "--map" not in text.split("names: ")[0]
    assert not any("--map" in why for why in run.not_judged.values()), run.not_judged
    for judged in ("no_learning_signal", "reward_function_bug", "sudden_collapse", "train_eval_divergence"):
        assert judged not in run.not_judged, (judged, run.not_judged.get(judged))
    assert report.to_dict()["runs"][0]["names"]["mapped"]["answer_accuracy"]["to"] == HAND_WRITTEN["answer_accuracy"]
    original = analyze(state_path).runs[0]
    assert run.verdict == original.verdict
    assert _alarms(run.findings) == _alarms(original.findings)
