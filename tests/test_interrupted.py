"""A run stopped by Ctrl-C: the monitor says so at the console and in the run log, and ``analyze``
reports it as interrupted (``incomplete``, exit 3, unless a finding says more) whichever log it reads:
the run directory, or the console log that ends in the ``KeyboardInterrupt`` traceback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from grpo_monitor.analysis.analyze import analyze
from grpo_monitor.core.runlog import read_run

ROOT = Path(__file__).resolve().parents[1]

# A real SIGINT, sent by the test as a terminal's Ctrl-C would be, while the run waits at step 30: the run cannot
# finish first however fast or slow the machine is.
SCRIPT = """
import pathlib, sys, time
import transformers
from transformers import TrainerCallback
from grpo_monitor import attach
from grpo_monitor.app.demo import build_trainer, demo_config

transformers.logging.set_verbosity_error()

class WaitAt30(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 30:
            pathlib.Path(sys.argv[1], "at-step-30").touch()
            time.sleep(600)

args = demo_config(sys.argv[1] + "/trainer", 200, disable_tqdm=True)
trainer = build_trainer(args)
trainer.add_callback(WaitAt30())
attach(trainer, sys.argv[1] + "/grpo-monitor")
trainer.train()
"""


def _cli(*args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_MONITOR_")}
    return subprocess.run([sys.executable, "-m", "grpo_monitor", *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=600)


def test_ctrl_c_is_said_at_the_console_in_the_run_log_and_by_analyze(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    log = tmp_path / "train.log"
    with open(log, "w") as fh:  # python train.py > train.log 2>&1
        # Started as a shell starts it: SIGINT at its default (Python ignores Ctrl-C for good in a child that
        # inherits an ignored SIGINT), no monitor settings from the environment.
        env = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_MONITOR_")}
        proc = subprocess.Popen([sys.executable, str(script), str(tmp_path)], stdout=fh, stderr=subprocess.STDOUT,
                                cwd=ROOT, env={**env, "PYTHONUNBUFFERED": "1"},
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        try:
            deadline = time.monotonic() + 900
            while not (tmp_path / "at-step-30").exists():
                assert proc.poll() is None, log.read_text()[-2000:]
                assert time.monotonic() < deadline, "the run never reached step 30"
                time.sleep(0.2)
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=300)
            except subprocess.TimeoutExpired:
                raise AssertionError("the run did not stop within 300 s of Ctrl-C (this process's SIGINT: "
                                     f"{signal.getsignal(signal.SIGINT)!r}); its log ends:\n"
                                     + log.read_text()[-3000:]) from None
        finally:
            if proc.poll() is None:
                proc.kill()
    text = log.read_text()
    assert proc.returncode != 0 and text.rstrip().endswith("KeyboardInterrupt"), text[-2000:]
    # The console: one line saying what happened and where the steps are.
    said = [line for line in text.splitlines() if "interrupted (Ctrl-C)" in line]
    assert len(said) == 1 and "after step 29, the last it logged" in said[0] and "grpo-monitor analyze" in said[0]
    # The run log: every step up to the interruption, and a note saying it was interrupted.
    run_dir = tmp_path / "grpo-monitor"
    log_ = read_run(run_dir)
    assert log_.steps[-1]["step"] == 29 and log_.summary is None  # Ctrl-C came before step 30's log
    [note] = [n for n in log_.notes if n.get("event") == "interrupted"]
    assert note["step"] == 30 and note["exception"] == "KeyboardInterrupt"
    # analyze, from the run directory and from the console log: the same status, never healthy.
    for path in (run_dir, log):
        out = _cli("analyze", path, "--json")
        run = json.loads(out.stdout)["runs"][0]
        assert run["status"] == "interrupted" and "interrupted (Ctrl-C) after step 29, the last it logged" in run["status_note"], run
        assert run["verdict"] != "healthy"
        if run["verdict"] == "incomplete":
            assert out.returncode == 3
        else:  # a finding wins over the interruption: its verdict, exit 1, the status line still says it
            assert run["verdict"] in ("warning", "critical") and out.returncode == 1
        assert "interrupted" in _cli("analyze", path).stdout


def test_a_console_log_whose_traceback_is_followed_by_more_steps_was_not_interrupted(tmp_path):
    lines = [f"{{'loss': 0.0, 'grad_norm': 0.3, 'reward': {0.5 + 0.001 * s}, 'reward_std': 0.3, 'entropy': 0.5, "
             f"'completions/mean_length': 40.0, 'epoch': {s / 100}}}" for s in range(1, 80)]
    middle = "Traceback (most recent call last):\n  File \"rewards.py\", line 3, in f\nValueError: bad answer\n"
    path = tmp_path / "train.log"
    path.write_text("\n".join(lines[:40]) + "\n" + middle + "\n".join(lines[40:]) + "\n")
    (run,) = analyze(path).runs
    assert run.status is None
    path.write_text("\n".join(lines) + "\n" + middle.replace("ValueError: bad answer", "KeyboardInterrupt") + "\n")
    (run,) = analyze(path).runs
    assert run.status == "interrupted" and run.verdict == "incomplete"
