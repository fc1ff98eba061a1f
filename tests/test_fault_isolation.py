"""A fault inside the monitor is logged once and the training goes on."""

from __future__ import annotations

import logging

from detectors.base import Detector
from monitor import read_run
from tests.conftest import train_tiny


class Exploding(Detector):
    id = "exploding_test_detector"

    def _reset(self):
        pass

    def _update(self, step, metrics, samples):
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
                def full(records):
                    raise OSError(28, "No space left on device")

                monitor_cb.writer._run.append = full

    import transformers

    from callbacks import attach
    from monitor.demo import build_trainer, demo_config

    transformers.logging.set_verbosity_error()
    trainer = build_trainer(demo_config(tmp_path / "trainer", 4))
    monitor_cb = attach(trainer, tmp_path)
    trainer.add_callback(DiskFullAtStep2())
    trainer.train()
    assert trainer.state.global_step == 4
    assert len(_warnings(caplog, "step record failed")) == 1
    log = read_run(tmp_path)
    assert [r["step"] for r in log.steps] == [1]  # what was written before the fault is kept
