"""``grpo-monitor watch`` as a user starts it: a real subprocess on paths that are wrong, and on
paths that are right but not ready yet."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("textual")

from grpo_monitor.core.runlog_writer import RunWriter  # noqa: E402
from grpo_monitor.fixtures.dashboard_run import header  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "TERM": "xterm-256color", "TEXTUAL_ANIMATIONS": "none", "COLUMNS": "100", "LINES": "30"}


def _watch(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "grpo_monitor", "watch", *args],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=ENV,
        start_new_session=True,
    )


def _fails_in_one_line(path: Path, *extra: str) -> str:
    proc = _watch(str(path), *extra)
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        _stop(proc)
        pytest.fail(f"watch {path} kept running instead of failing")
    assert proc.returncode == 2, (proc.returncode, err)
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert "\x1b" not in err, "the dashboard drew a screen before failing"
    assert str(path) in lines[0]
    return lines[0]


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=20)


def _keeps_running(path: Path, *extra: str, seconds: float = 2.5) -> None:
    proc = _watch(str(path), *extra)
    try:
        time.sleep(seconds)
        if proc.poll() is not None:
            _, err = proc.communicate(timeout=5)
            pytest.fail(f"watch {path} exited with {proc.returncode}: {err[-500:]}")
    finally:
        _stop(proc)


def test_a_mistyped_path_fails_in_one_line(tmp_path: Path) -> None:
    line = _fails_in_one_line(tmp_path / "runs" / "my-rnu")
    assert "no such file or directory" in line and "--wait" in line


def test_a_garbage_file_fails_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "notes.bin"
    bad.write_bytes(bytes(range(256)) * 8)
    assert "not a run this tool reads" in _fails_in_one_line(bad)


def test_a_run_directory_with_a_corrupt_log_fails_in_one_line(tmp_path: Path) -> None:
    d = tmp_path / "run"
    d.mkdir()
    (d / "run.jsonl").write_text("this is not JSON\n")
    line = _fails_in_one_line(d)
    assert "run.jsonl" in line and "not a run this tool reads" in line and "line 1" in line


def test_a_log_that_fails_deep_inside_fails_in_one_line(tmp_path: Path) -> None:
    # Recognised as a trainer_state.json by its first bytes; broken further down.
    state = tmp_path / "trainer_state.json"
    state.write_text('{\n  "log_history": [\n    {"step": 1, "loss": 0.5},\n    {"step": 2,, "loss"\n')
    line = _fails_in_one_line(state)
    assert "JSON" in line


def test_wait_keeps_watching_a_path_that_does_not_exist_yet(tmp_path: Path) -> None:
    _keeps_running(tmp_path / "not-started", "--wait")


def test_an_empty_folder_fails_in_one_line_like_analyze_unless_waited_for(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "folder holds nothing readable" in _fails_in_one_line(empty)
    _keeps_running(empty, "--wait")


def test_a_run_directory_without_steps_yet_opens_and_waits(tmp_path: Path) -> None:
    starting = tmp_path / "starting"
    starting.mkdir()
    (starting / "samples.rank0.jsonl").write_text("")  # what a starting run writes first
    _keeps_running(starting)
    only_header = tmp_path / "header-only"
    w = RunWriter(only_header)
    w.header(**header())
    w.close()
    _keeps_running(only_header)


def test_watch_help_documents_wait() -> None:
    out = subprocess.run([sys.executable, "-m", "grpo_monitor", "watch", "--help"], capture_output=True, text=True,
                         cwd=ROOT, env=ENV, timeout=60)
    assert out.returncode == 0 and "--wait" in out.stdout and "has not started yet" in out.stdout
