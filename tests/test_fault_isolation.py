"""A fault inside the monitor is logged once and the training goes on."""

from __future__ import annotations

import logging

from grpo_monitor.detectors.base import Detector
from grpo_monitor import read_run
from tests.conftest import train_tiny


class Exploding(Detector):
    id = "exploding_test_detector"

    def _reset_state(self):
        pass

    def update(self, step, metrics, samples=None):
        raise RuntimeError("boom")


def _warnings(caplog, needle):
    return [r for r in caplog.records if r.levelno == logging.WARNING and needle in r.getMessage()]


def test_raising_detector_is_logged_once_and_training_completes(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="grpo_monitor")
    trainer, callback = train_tiny(tmp_path, steps=3, attach_options={"detectors": [Exploding()]})
    assert trainer.state.global_step == 3
    assert len(_warnings(caplog, "exploding_test_detector")) == 1
    log = read_run(tmp_path)
    assert [r["step"] for r in log.steps] == [1, 2, 3]
    assert log.steps[-1]["detectors"]["exploding_test_detector"] == "disabled"
    assert any("exploding_test_detector" in n["message"] for n in log.notes)


def test_broken_run_log_does_not_stop_training(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="grpo_monitor")
    from transformers import TrainerCallback

    class DiskFullAtStep2(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 2:
                def full(data):
                    raise OSError(28, "No space left on device")

                monitor_cb.writer._run.append_bytes = full

    import transformers

    from grpo_monitor.callbacks import attach
    from grpo_monitor.app.demo import build_trainer, demo_config

    transformers.logging.set_verbosity_error()
    trainer = build_trainer(demo_config(tmp_path / "trainer", 4))
    monitor_cb = attach(trainer, tmp_path)
    trainer.add_callback(DiskFullAtStep2())
    trainer.train()
    assert trainer.state.global_step == 4
    assert len(_warnings(caplog, "run log failed")) == 1
    log = read_run(tmp_path)
    assert [r["step"] for r in log.steps] == [1]  # what was written before the fault is kept


def test_non_finite_none_and_missing_metrics_are_handled(tmp_path, caplog):
    """Garbage in the logged metrics: recorded as it came, flagged where it is evidence, no crash."""
    caplog.set_level(logging.WARNING, logger="grpo_monitor")
    import math

    import transformers
    from transformers import TrainerCallback

    from grpo_monitor.callbacks import attach
    from grpo_monitor.app.demo import build_trainer, demo_config

    class Corrupt(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs is None or "train_runtime" in logs:
                return
            if state.global_step == 2:
                logs["loss"] = float("nan")
                logs["grad_norm"] = float("inf")
                logs["entropy"] = None
            if state.global_step == 3:
                for key in ("entropy", "reward", "completions/mean_length"):
                    logs.pop(key, None)
                logs["my/unknown_metric"] = 1.5
                logs["a_string"] = "not a number"

    transformers.logging.set_verbosity_error()
    trainer = build_trainer(demo_config(tmp_path / "trainer", 4))
    trainer.callback_handler.callbacks.insert(0, Corrupt())  # runs before the monitor sees the logs
    monitor_cb = attach(trainer, tmp_path)
    trainer.train()
    assert trainer.state.global_step == 4 and monitor_cb.errors == {}
    log = read_run(tmp_path)
    m2, m3 = log.steps[1]["metrics"], log.steps[2]["metrics"]
    assert math.isnan(m2["loss"]) and m2["grad_norm"] == math.inf and m2["entropy"] is None
    assert "entropy" not in m3 and m3["my/unknown_metric"] == 1.5 and "a_string" not in m3
    flagged = [f for f in log.findings if f["detector"] == "non_finite"]
    assert flagged and flagged[0]["step"] == 2


class RewardBug(Exception):
    pass


def broken_reward(completions, **kwargs):
    raise RewardBug("reward function bug at line 3")


def test_a_raising_reward_function_fails_exactly_as_without_the_monitor(tmp_path):
    import pytest
    import transformers

    from grpo_monitor.callbacks import attach
    from grpo_monitor.fixtures.tiny import format_reward
    from grpo_monitor.app.demo import build_trainer, demo_config

    transformers.logging.set_verbosity_error()
    errors = []
    for monitored in (False, True):
        trainer = build_trainer(demo_config(tmp_path / f"t{monitored}", 2), reward_funcs=[format_reward, broken_reward])
        if monitored:
            attach(trainer, tmp_path / "run")
        with pytest.raises(RewardBug) as err:
            trainer.train()
        errors.append(err)
    assert str(errors[0].value) == str(errors[1].value) == "reward function bug at line 3"
    # The user's own frame is where the error points, with or without the tap in between.
    assert errors[1].traceback[-1].name == errors[0].traceback[-1].name == "broken_reward"
