"""What attach() says when it starts: where the run log goes, which reward functions count as
correctness and as format, and a warning naming the option when no correctness reward is recognised."""

from __future__ import annotations

import logging
import warnings

import pytest

from grpo_monitor.fixtures import tiny
from grpo_monitor import read_run


def has_answer_tag(completions, **kwargs):
    return tiny.format_reward(completions, **kwargs)


def subtraction_is_right(completions, target, **kwargs):
    return tiny.correctness_reward(completions, target, **kwargs)


UNRECOGNISED = [has_answer_tag, subtraction_is_right]


def _trainer(tmp_path, reward_funcs=None, steps=2):
    import transformers

    from grpo_monitor.app.demo import build_trainer, demo_config

    transformers.logging.set_verbosity_error()
    warnings.filterwarnings("ignore", category=FutureWarning)
    return build_trainer(demo_config(tmp_path / "trainer", steps, disable_tqdm=True), reward_funcs=reward_funcs)


@pytest.fixture
def said(capsys, caplog):
    """Everything attach() told the user: stderr and the ``grpo_monitor`` log records."""
    caplog.set_level(logging.NOTSET)

    def read() -> str:
        text = capsys.readouterr().err + "\n" + "\n".join(r.getMessage() for r in caplog.records
                                                          if r.name.startswith("grpo_monitor"))
        caplog.clear()
        return text

    return read


def test_attach_names_the_run_log_and_the_reward_roles(tmp_path, said):
    from grpo_monitor import attach

    trainer = _trainer(tmp_path)
    attach(trainer, tmp_path / "run")
    out = said()
    assert str(tmp_path / "run" / "run.jsonl") in out
    assert "correctness reward: correctness_reward (guessed from its name)" in out
    assert "format reward: format_reward (guessed from its name)" in out
    assert "correctness_reward=" not in out  # recognised: nothing to warn about
    attach(trainer, tmp_path / "run")  # attaching again returns the same callback and says nothing more
    assert "run log" not in said()


def test_unrecognised_reward_names_warn_with_the_option_to_pass(tmp_path, said, caplog):
    from grpo_monitor import attach

    trainer = _trainer(tmp_path, reward_funcs=UNRECOGNISED)
    attach(trainer, tmp_path / "run")
    warned = [r for r in caplog.records if r.name == "grpo_monitor" and r.levelno == logging.WARNING]
    out = said()
    assert "correctness reward: none recognised" in out and "format reward: has_answer_tag" in out
    assert len(warned) == 1
    text = warned[0].getMessage()
    assert "has_answer_tag, subtraction_is_right" in text
    # The format reward is not offered as the correctness one.
    assert "attach(trainer, correctness_reward='subtraction_is_right')" in text


def test_a_reward_name_the_trainer_does_not_have_is_refused(tmp_path):
    from grpo_monitor import attach

    trainer = _trainer(tmp_path, reward_funcs=UNRECOGNISED)
    with pytest.raises(ValueError, match=r"correctness_reward='subtraction_is_rigth' is not one of .*"
                                         r"has_answer_tag, subtraction_is_right"):
        attach(trainer, tmp_path / "run", correctness_reward="subtraction_is_rigth")
    with pytest.raises(ValueError, match="format_reward='tag'"):
        attach(trainer, tmp_path / "run", format_reward="tag")


@pytest.mark.parametrize("named", [False, True], ids=["guessed", "named"])
def test_naming_the_correctness_reward_marks_every_sample(tmp_path, said, named):
    from grpo_monitor import attach

    trainer = _trainer(tmp_path, reward_funcs=UNRECOGNISED, steps=2)
    options = {"correctness_reward": "subtraction_is_right", "format_reward": "has_answer_tag"} if named else {}
    attach(trainer, tmp_path / "run", **options)
    trainer.train()
    log = read_run(tmp_path / "run")
    assert log.samples
    if named:
        assert "correctness reward: subtraction_is_right (given)" in said()
        assert log.header["correctness_reward"] == "subtraction_is_right"
        assert log.header["format_reward"] == "has_answer_tag"
        assert all(isinstance(s["correct"], bool) for s in log.samples)
        # correct is the correctness reward above 0, as the tap scores it.
        assert all(s["correct"] == (s["rewards"]["subtraction_is_right"] > 0) for s in log.samples)
    else:
        assert log.header["correctness_reward"] is None
        assert all(s["correct"] is None for s in log.samples)


SCRIPT = """
import sys, warnings
import transformers
from grpo_monitor import attach
from grpo_monitor.app.demo import build_trainer, demo_config
from tests.test_attach_messages import UNRECOGNISED
transformers.logging.set_verbosity_error()
warnings.filterwarnings("ignore")
trainer = build_trainer(demo_config(sys.argv[1] + "/trainer", 2, disable_tqdm=True), reward_funcs=UNRECOGNISED)
attach(trainer, sys.argv[1] + "/run")
"""


def test_a_plain_script_shows_both_messages_on_stderr(tmp_path):
    """Python's logging is left as a script leaves it (no handler, INFO dropped): both lines still show."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_MONITOR_")}
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True,
                         cwd=root, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"run log in {tmp_path / 'run' / 'run.jsonl'}" in out.stderr
    assert "correctness_reward='subtraction_is_right'" in out.stderr
    assert out.stderr.count("grpo-monitor: run log in") == 1


def test_a_mistyped_keyword_names_grpo_monitor_attach_and_the_nearest_option(tmp_path):
    from grpo_monitor import attach

    trainer = _trainer(tmp_path)
    with pytest.raises(TypeError) as err:
        attach(trainer, correctnes_reward="correctness_reward")
    text = str(err.value)
    assert text.startswith("grpo_monitor.attach() got an unexpected keyword argument 'correctnes_reward'")
    assert "did you mean correctness_reward?" in text and "MonitorCallback" not in text
