"""The dashboard in a real terminal: tmux runs ``python -m grpo_monitor.monitor.tui`` on a recorded run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("textual")

from grpo_monitor.monitor.tui.synthetic import write_synthetic_run  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")


def _tmux(sock: str, *args: str) -> str:
    out = subprocess.run(["tmux", "-L", sock, *args], capture_output=True, text=True, timeout=20)
    return out.stdout


def _wait_for(sock: str, needles: list[str], timeout: float = 30.0) -> str:
    end = time.monotonic() + timeout
    text = ""
    while time.monotonic() < end:
        text = _tmux(sock, "capture-pane", "-p", "-t", "dash")
        if all(n in text for n in needles):
            return text
        time.sleep(0.2)
    return text


def test_dashboard_in_a_real_terminal(tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_synthetic_run(run, steps=50)
    sock = f"grpo-monitor-test-{os.getpid()}"
    env = {**os.environ, "TERM": "xterm-256color", "PYTHONPATH": str(ROOT), "TEXTUAL_ANIMATIONS": "none"}
    cmd = f"{sys.executable} -m grpo_monitor.monitor.tui {run}"
    subprocess.run(
        ["tmux", "-L", sock, "-f", "/dev/null", "new-session", "-d", "-s", "dash", "-x", "120", "-y", "40", cmd],
        check=True, env=env, cwd=ROOT, timeout=20,
    )
    socket_path = _tmux(sock, "display-message", "-p", "#{socket_path}").strip()
    try:
        text = _wait_for(sock, ["entropy", "completion length", "demo-run"])
        for name in ("entropy", "completion length", "┄cap 256", "loss_type dapo", "Qwen3MoeForCausalLM"):
            assert name in text, f"{name!r} not on screen:\n{text}"
        _tmux(sock, "send-keys", "-t", "dash", "2")
        text = _wait_for(sock, ["entropy_collapse", "length_reward_coupling", "critical"])
        for name in ("entropy_collapse", "length_reward_coupling", "no_learning_signal", "critical", "warning",
                     "Findings (2)"):
            assert name in text, f"{name!r} not on the detector board:\n{text}"
        _tmux(sock, "send-keys", "-t", "dash", "q")
        end = time.monotonic() + 10
        while time.monotonic() < end and "dash" in _tmux(sock, "list-sessions"):
            time.sleep(0.2)
        assert "dash" not in _tmux(sock, "list-sessions"), "q did not quit the dashboard"
    finally:
        subprocess.run(["tmux", "-L", sock, "kill-server"], capture_output=True, timeout=20)
        if socket_path:
            Path(socket_path).unlink(missing_ok=True)
