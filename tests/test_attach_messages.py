"""What attach() takes and says: its option objects and their shorthands, a wrong value as one line naming
the parameter as written, the one wrapper around ``trainer.train`` (a crash said once), and, when it starts,
where the run log goes, which reward functions count as correctness and as format, and a warning naming the
option when no correctness reward is recognised."""

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


def test_the_start_up_line_says_where_alerts_go(tmp_path, said, monkeypatch):
    from grpo_monitor import AlertOptions, attach

    monkeypatch.delenv("GRPO_MONITOR_WEBHOOK_URL", raising=False)
    attach(_trainer(tmp_path / "a"), tmp_path / "a" / "run",
           alerts=AlertOptions(to=["https://hooks.slack.com/services/T0/B0/SECRET", "mailto:oncall@example.org"],
                               min_severity="critical"))
    out = said()
    assert ("alerts (critical and above) go to webhook https://hooks.slack.com/***; email to oncall@example.org"
            in out), out
    assert "SECRET" not in out
    attach(_trainer(tmp_path / "b"), tmp_path / "b" / "run")
    assert "no webhook or mail destination (attach(trainer, alerts=URL) or GRPO_MONITOR_WEBHOOK_URL)" in said()
    attach(_trainer(tmp_path / "c"), tmp_path / "c" / "run", alerts=False)
    assert "grpo-monitor: alerts off (alerts=False)" in said()


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
    with pytest.raises(ValueError, match=r"^attach\(correctness_reward=\.\.\.\): 'subtraction_is_rigth' is not one of .*"
                                         r"has_answer_tag, subtraction_is_right"):
        attach(trainer, tmp_path / "run", correctness_reward="subtraction_is_rigth")
    with pytest.raises(ValueError, match=r"^attach\(format_reward=\.\.\.\): 'tag'"):
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


def test_an_old_keyword_says_which_option_object_took_it(tmp_path):
    from grpo_monitor import attach

    trainer = _trainer(tmp_path)
    with pytest.raises(TypeError, match=r"'max_restarts' \(write auto_restart=RestartOptions\(max_restarts=\.\.\.\)\)"):
        attach(trainer, auto_restart=True, max_restarts=3)
    with pytest.raises(TypeError, match=r"alerts=AlertOptions\(to=\.\.\., min_severity=\.\.\.\)"):
        attach(trainer, alerts="https://x.org/h", alerts_min_severity="critical")


# -- the option objects and their shorthands ---------------------------------------------------------------


def test_option_objects_are_attachs_parameters(tmp_path):
    """Each option object as its parameter reaches the part it sets; the run trains with them."""
    from grpo_monitor import RestartOptions, RouterOptions, SampleOptions, attach

    trainer = _trainer(tmp_path, steps=2)
    samples = SampleOptions(sample_text="all", max_text_chars=40, correct_threshold=0.5)
    restarts = RestartOptions(max_restarts=1, restart_from="latest")
    cb = attach(trainer, run_dir=tmp_path / "run", sample_text=samples, auto_restart=restarts, device_health=False,
                router_tap=RouterOptions(probe_every=3), alerts=False)
    assert cb.samples is samples and cb.restarts.options is restarts and cb.restarts.active
    assert cb.device.options is None and cb.router_options.probe_every == 3 and not cb.alert_options.enabled
    trainer.train()
    log = read_run(tmp_path / "run")
    assert log.header["auto_restart"] is True
    texts = [s["completion"] for s in log.samples if s.get("completion")]
    # "all" keeps every completion's text, each an excerpt of at most 40 characters (and the marker)
    assert len(texts) == len(log.samples) and all(len(x) <= 40 + 40 for x in texts)
    assert all(s["correct"] == (s["rewards"]["correctness_reward"] > 0.5) for s in log.samples)


def test_each_shorthand_is_its_option_object(tmp_path):
    from grpo_monitor import AlertOptions, DeviceOptions, RestartOptions, RouterOptions, SampleOptions, attach

    cb = attach(_trainer(tmp_path), tmp_path / "run", sample_text="none", auto_restart=True,
                alerts="https://hooks.slack.com/services/T0/B0/xyz")
    assert cb.samples == SampleOptions(sample_text="none")
    assert cb.restarts.options == RestartOptions() and cb.device.options == DeviceOptions()
    assert cb.router_options == RouterOptions()
    assert isinstance(cb.alert_options, AlertOptions) and cb.alert_options.url.endswith("/xyz")
    assert cb.alert_options.routes[0].destination.format == "slack"
    cb = attach(_trainer(tmp_path), tmp_path / "run2", sample_text={"fair": 2, "groups": 0, "truncated": 0},
                router_tap=False, alerts=["https://x.org/a", {"email": "oncall@example.org", "smtp": "smtp://127.0.0.1:1"}])
    assert (cb.samples.sample_text.fair, cb.samples.sample_text.groups) == (2, 0) and cb.router_options is None
    assert [r.destination.kind for r in cb.alert_options.routes] == ["webhook", "email"]
    assert cb.restarts.options is None  # off by default


@pytest.mark.parametrize("given,said", [
    ({"alerts": 7}, "attach(alerts=...): must be a webhook URL"),
    ({"alerts": "hooks.slack.com/services/T/B/x"}, "attach(alerts=...): the alerts webhook must be an http(s) URL, "
                                                   "got 'hooks.slack.com/***' (no scheme: write https://...)"),
    ({"alerts": "not a url"}, "attach(alerts=...): the alerts webhook must be an http(s) URL, got 'not a url' (no scheme"),
    ({"alerts": "ftp://example.org/T/B/x"}, "attach(alerts=...): the alerts webhook must be an http(s) URL, "
                                            "got ftp://example.org/*** (scheme 'ftp')"),
    ({"sample_text": "al"}, "attach(sample_text=...): must be 'default', 'all', 'none'"),
    ({"sample_text": {"fiar": 3}}, "attach(sample_text=...): "),
    ({"auto_restart": "yes"}, "attach(auto_restart=...): must be True, False or a RestartOptions, got 'yes'"),
    ({"device_health": 0}, "attach(device_health=...): must be True, False or a DeviceOptions, got 0"),
    ({"router_tap": None}, "attach(router_tap=...): must be True, False or a RouterOptions"),
    ({"require_reward_gate": 0.8}, "attach(require_reward_gate=...): must be True, False or a RewardGateOptions"),
    ({"gpu_hour_price": -1}, "attach(gpu_hour_price=...): must be a number >= 0"),
    ({"rules": [{"id": "mine"}]}, "attach(rules=...): "),
    ({"detectors": ["entropy_collapse"]}, "attach(detectors=...): must be a list of Detector instances"),
    ({"correctness_reward": 3}, "attach(correctness_reward=...): must be a reward function's name"),
    ({"dashboard": "yes"}, "attach(dashboard=...): must be True or False"),
])
def test_a_wrong_value_is_one_line_naming_the_parameter_as_written(tmp_path, given, said):
    """Before the trainer is touched: no callback added, ``train`` not wrapped, no run directory."""
    from grpo_monitor import attach

    trainer = _trainer(tmp_path)
    before = list(trainer.callback_handler.callbacks)
    with pytest.raises(ValueError) as info:
        attach(trainer, tmp_path / "run", **given)
    assert str(info.value).startswith(said) and "\n" not in str(info.value), str(info.value)
    assert trainer.callback_handler.callbacks == before and not hasattr(trainer.train, "__wrapped__")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("build,said", [
    (lambda o: o.RestartOptions(max_restarts=-1), "RestartOptions(max_restarts=...): must be a whole number >= 0"),
    (lambda o: o.RestartOptions(restart_from="yesterday"), "RestartOptions(restart_from=...): must be one of"),
    (lambda o: o.SampleOptions(max_text_chars="a lot"), "SampleOptions(max_text_chars=...): "),
    (lambda o: o.SampleOptions(correct_threshold=None), "SampleOptions(correct_threshold=...): must be a number"),
    (lambda o: o.RouterOptions(probe_every=0), "RouterOptions(probe_every=...): "),
    (lambda o: o.DeviceOptions(device=-1), "DeviceOptions(device=...): "),
    (lambda o: o.RewardGateOptions(min_agreement=2), "RewardGateOptions(min_agreement=...): must be a number from 0 to 1"),
    (lambda o: o.AlertOptions(to="https://x.org/h", min_severity="info"), "AlertOptions(min_severity=...): "),
    (lambda o: o.AlertOptions(to="https://x.org/h", burst=0), "AlertOptions(burst=...): must be a whole number >= 1"),
])
def test_a_wrong_field_names_the_option_object_and_field(build, said):
    import grpo_monitor

    with pytest.raises(ValueError) as info:
        build(grpo_monitor)
    assert str(info.value).startswith(said) and "\n" not in str(info.value), str(info.value)


# -- the one wrapper around trainer.train ------------------------------------------------------------------


def _raises_at_second_call(exc: BaseException):
    calls = []

    def correctness_reward(completions, target, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise exc
        return tiny.correctness_reward(completions, target, **kwargs)

    return [tiny.format_reward, correctness_reward]


@pytest.mark.parametrize("exc", [ValueError("reward server down"), SystemExit(3)], ids=["crash", "exit"])
def test_train_is_wrapped_once_and_a_crash_is_said_once(tmp_path, exc, caplog):
    """One wrapper, however often attach is called: a crash is one crash alert, flushed before the
    exception goes on unchanged; a deliberate exit is no crash, yet the run log says the run stopped."""
    from test_alerts import Hook

    from grpo_monitor import attach

    hook = Hook()
    try:
        trainer = _trainer(tmp_path, reward_funcs=_raises_at_second_call(exc), steps=4)
        cb = attach(trainer, tmp_path / "run", alerts=hook.url())
        assert attach(trainer, tmp_path / "run", alerts=hook.url()) is cb
        assert trainer.train.__wrapped__.__func__ is type(trainer).train  # the trainer's own, wrapped once
        with pytest.raises(type(exc)) as info:
            trainer.train()
        assert info.value is exc
        crashes = [b for _, b in hook.received if b["event"] == "crash"]
    finally:
        hook.close()
    if isinstance(exc, SystemExit):
        assert crashes == []
    else:
        (crash,) = crashes
        assert crash["error"] == "ValueError: reward server down" and crash["step"] == 1
    log = read_run(tmp_path / "run")
    (note,) = [n for n in log.notes if n.get("event") == "interrupted"]
    assert note["exception"] == type(exc).__name__
    assert [s["step"] for s in log.steps] == [1]
    assert not cb.errors  # nothing in the monitor went wrong on the way out


def test_a_monitor_fault_on_the_way_out_never_hides_the_training_error(tmp_path, monkeypatch, caplog):
    """The crash alert itself fails: one warning line, the run log still says the run stopped, and the
    caller gets the training's own exception."""
    from grpo_monitor import attach
    from grpo_monitor.alerts import AlertDispatcher

    def broken(self, exc, step=None):
        raise RuntimeError("alerts broke")

    monkeypatch.setattr(AlertDispatcher, "crash", broken)
    caplog.set_level(logging.WARNING, logger="grpo_monitor")
    crash = ValueError("reward server down")
    trainer = _trainer(tmp_path, reward_funcs=_raises_at_second_call(crash), steps=4)
    cb = attach(trainer, tmp_path / "run", alerts="http://127.0.0.1:9/hook")
    with pytest.raises(ValueError) as info:
        trainer.train()
    assert info.value is crash
    said = [r.getMessage() for r in caplog.records if "alerts broke" in r.getMessage()]
    assert len(said) == 1 and "training continues" in said[0] and cb.errors == {"alerts": "RuntimeError: alerts broke"}
    assert [n["exception"] for n in read_run(tmp_path / "run").notes if n.get("event") == "interrupted"] == ["ValueError"]
