"""Which reward function is correctness and which is format: one guess, made alike live (the callback on a
real trainer) and offline (the readers of a log, and the detectors reading its metrics)."""

from __future__ import annotations

import json

import pytest

from grpo_monitor.detectors.base import RunContext
from grpo_monitor.detectors.signals import resolve_correctness, reward_roles
from grpo_monitor.readers import load_source
from grpo_monitor.readers._base import guess_context

PAIRS = [
    (["format_correct", "answer_match"], ("answer_match", "format_correct")),
    (["math_match", "fmt"], ("math_match", "fmt")),
    (["format_reward", "correctness_reward"], ("correctness_reward", "format_reward")),
    (["accuracy_reward", "think_format_reward"], ("accuracy_reward", "think_format_reward")),
    (["xml_count", "int_reward", "correctness"], ("correctness", "xml_count")),
    (["match_format_exactly", "match_format_approximately", "check_answer"], ("check_answer", "match_format_exactly")),
    (["has_answer_tag", "subtraction_is_right"], (None, "has_answer_tag")),
    (["exact_match", "schema_valid"], ("exact_match", "schema_valid")),
    (["acc", "len_penalty"], ("acc", None)),
    (["rm_score"], (None, None)),
    (["correct_format", "gsm8k_exact"], ("gsm8k_exact", "correct_format")),
    (["struct_ok", "answer_reward"], ("answer_reward", "struct_ok")),
]


def _reward(name: str):
    def fn(prompts, completions, **kwargs):
        return [0.0] * len(completions)

    fn.__name__ = name
    return fn


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    import transformers

    from grpo_monitor.app.demo import build_trainer, demo_config

    transformers.logging.set_verbosity_error()
    args = demo_config(tmp_path_factory.mktemp("roles") / "out", 2, disable_tqdm=True)
    return build_trainer(args, reward_funcs=[_reward("a"), _reward("b")])


@pytest.mark.parametrize("names,want", PAIRS, ids=["+".join(n) for n, _ in PAIRS])
def test_live_and_offline_name_the_same_rewards(names, want, trainer, tmp_path):
    from grpo_monitor.callbacks.monitor_callback import MonitorCallback

    trainer.reward_func_names = list(names)
    trainer.reward_funcs = [_reward(n) for n in names]
    live = MonitorCallback(trainer, tmp_path / "run")
    keys = [f"rewards/{n}/mean" for n in names] + ["reward"]
    offline = guess_context(keys, 1, [1, 2])
    assert (live.correctness_reward, live.format_reward) == want
    assert (offline.correctness_reward, offline.format_reward) == want
    assert resolve_correctness(RunContext(), keys)[1] == want[0]
    assert resolve_correctness(RunContext(reward_names=list(names)), [])[1] == want[0]
    assert reward_roles(names) == want


def test_a_real_run_and_its_logs_agree_on_the_rewards(tmp_path):
    """The issue's two disagreeing pairs, trained for real: the run log's header and every log of the same run
    read offline (its trainer_state.json) name the same rewards."""
    import transformers

    from grpo_monitor.app.demo import build_trainer, demo_config
    from grpo_monitor.callbacks import attach

    transformers.logging.set_verbosity_error()
    for names in (["format_correct", "answer_match"], ["math_match", "fmt"]):
        out = tmp_path / names[0]
        args = demo_config(out / "trainer", 2, disable_tqdm=True, save_strategy="steps", save_steps=2)
        trainer = build_trainer(args, reward_funcs=[_reward(n) for n in names])
        attach(trainer, out / "run")
        trainer.train()
        header = json.loads((out / "run" / "run.jsonl").read_text().splitlines()[0])
        state = load_source(out / "trainer" / "checkpoint-2" / "trainer_state.json")
        want = reward_roles(names)
        assert (header["correctness_reward"], header["format_reward"]) == want
        assert (state.context.correctness_reward, state.context.format_reward) == want
        assert want[0] == names[1] if names[0] == "format_correct" else want == ("math_match", "fmt")
