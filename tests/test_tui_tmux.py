"""The dashboard in a real terminal: tmux runs ``grpo-monitor watch`` on a recorded run, at the
sizes people use (a full window, a tmux pane, the 80x24 default), and the test reads the screen
back with ``capture-pane``."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("textual")

from grpo_monitor.fixtures.dashboard_run import write_synthetic_run  # noqa: E402

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


@contextlib.contextmanager
def _terminal(cmd: str, width: int, height: int) -> Iterator[str]:
    """A detached tmux session of ``width`` x ``height`` running ``cmd``; yields its socket name."""
    sock = f"grpo-monitor-test-{os.getpid()}-{width}x{height}"
    env = {**os.environ, "TERM": "xterm-256color", "TEXTUAL_ANIMATIONS": "none"}
    subprocess.run(
        ["tmux", "-L", sock, "-f", "/dev/null", "new-session", "-d", "-s", "dash", "-x", str(width), "-y", str(height),
         cmd],
        check=True, env=env, cwd=ROOT, timeout=20,
    )
    socket_path = _tmux(sock, "display-message", "-p", "#{socket_path}").strip()
    try:
        yield sock
    finally:
        subprocess.run(["tmux", "-L", sock, "kill-server"], capture_output=True, timeout=20)
        if socket_path:
            Path(socket_path).unlink(missing_ok=True)


def _quits(sock: str) -> bool:
    _tmux(sock, "send-keys", "-t", "dash", "q")
    end = time.monotonic() + 10
    while time.monotonic() < end and "dash" in _tmux(sock, "list-sessions"):
        time.sleep(0.2)
    return "dash" not in _tmux(sock, "list-sessions")


def test_dashboard_in_a_real_terminal(tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_synthetic_run(run, steps=50)
    with _terminal(f"{sys.executable} -m grpo_monitor watch {run}", 120, 40) as sock:
        text = _wait_for(sock, ["entropy", "completion length", "demo-run"])
        for name in ("entropy", "completion length", "┄cap 256", "loss_type dapo", "Qwen3MoeForCausalLM"):
            assert name in text, f"{name!r} not on screen:\n{text}"
        _tmux(sock, "send-keys", "-t", "dash", "2")
        text = _wait_for(sock, ["entropy_collapse", "length_reward_coupling", "critical"])
        for name in ("entropy_collapse", "length_reward_coupling", "critical", "warning", "Findings (2)"):
            assert name in text, f"{name!r} not on the detector board:\n{text}"
        assert _quits(sock), "q did not quit the dashboard"


@pytest.mark.parametrize("width,height", [(160, 48), (80, 24)], ids=["160x48", "80x24"])
def test_watch_screen_fits_the_terminal(tmp_path: Path, width: int, height: int) -> None:
    run = tmp_path / "run"
    write_synthetic_run(run, steps=50)
    with _terminal(f"{sys.executable} -m grpo_monitor watch {run}", width, height) as sock:
        text = _wait_for(sock, ["step 50", "entropy", "q Quit"])
        lines = text.split("\n")[:height]
        assert len(lines) == height and all(len(line) <= width for line in lines), text
        # The header: who, where, and the whole configuration line, uncut.
        assert lines[0].lstrip().startswith("● demo-run  live  step 50  seg 1 · 0 restarts"), text
        assert "Qwen3MoeForCausalLM" in text
        assert "loss_type dapo · G 8 · lr 5e-07 · β 0.01 · max_len 256 · IS token · ε 0.2/0.28" in text
        # Every tab is reachable by its label, and the footer is on the last line.
        tab_bar = next(line for line in lines if "1 Overview" in line)
        for label in ("1 Overview", "2 Detectors (2)", "3 Recommendations (1)", "4 Samples (200)", "5 MoE"):
            assert label in tab_bar, f"{label!r} not on the tab bar:\n{text}"
        assert "q Quit" in lines[-1] and "? Help" in lines[-1], text
        # The first chart is drawn whole: title, y labels, x axis from the first to the last step.
        assert "entropy  0.0" in text and "└1" in text and "50" in text
        if width >= 140:  # two columns of charts side by side
            assert any("entropy" in line and "completion length" in line for line in lines), text
        else:
            assert not any("entropy" in line and "completion length" in line for line in lines), text

        _tmux(sock, "send-keys", "-t", "dash", "4")
        text = _wait_for(sock, ["200 of 200 samples", "completion"])
        assert "200 of 200 samples" in text, text
        _tmux(sock, "send-keys", "-t", "dash", "Enter")
        text = _wait_for(sock, ["Esc closes", "PROMPT", "COMPLETION"])
        for name in ("Esc closes", "length", "truncated", "correct", "rewards", "PROMPT", "COMPLETION"):
            assert name in text, f"{name!r} not on the sample screen:\n{text}"
        _tmux(sock, "send-keys", "-t", "dash", "Escape")
        text = _wait_for(sock, ["200 of 200 samples"])
        assert "Esc closes" not in text, text
        assert _quits(sock), "q did not quit the dashboard"
