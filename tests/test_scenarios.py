"""The demo's failure scenarios on the real tiny model: the finding, the recommendation, the stop,
the restart with the variant, the run going on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from monitor import read_run
from monitor.lineage import read_lineage

ROOT = Path(__file__).resolve().parents[1]


def run(*args, timeout=900):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_MONITOR_")}
    env["PYTHONWARNINGS"] = "ignore"
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout)


def check_dapo_lineage(root: Path):
    lineage = read_lineage(root)
    assert len(lineage.segments) >= 2
    first, second = read_run(lineage.segments[0].run_dir), read_run(lineage.segments[1].run_dir)
    collapse = [f for f in first.findings if f["detector"] == "entropy_collapse" and f["severity"] == "critical"]
    assert collapse and collapse[0]["variant"] == "dapo"
    assert first.restarts[0]["variant"] == "dapo" and first.steps[-1]["step"] == first.restarts[0]["step"]
    cfg = second.header["config"]
    assert cfg["epsilon_high"] == 0.28 and cfg["mask_truncated_completions"] is True
    assert cfg["steps_per_generation"] > cfg["gradient_accumulation_steps"]  # off-policy, so clip-higher acts
    assert second.header["parent_run"] == first.header["run_id"] and second.header["tried_variants"] == ["dapo"]
    assert len(second.steps) > 0  # the run went on under the variant
    return first, second


def test_demo_collapse_auto_restart_switches_to_dapo(tmp_path):
    out = run("-m", "monitor", "demo", "--scenario", "collapse", "--auto-restart", "--run-dir", str(tmp_path / "D"))
    assert out.returncode == 0, out.stderr[-3000:]
    first, second = check_dapo_lineage(tmp_path / "D")
    assert "stopped at step" in out.stdout and "segment 1 (dapo" in out.stdout


def test_supervise_collapse_relaunches_the_script_with_dapo_flags(tmp_path):
    out = run("-m", "monitor", "supervise", "--run-dir", str(tmp_path / "D"), "--max-restarts", "1", "--",
              sys.executable, "examples/train.py", "--output_dir", str(tmp_path / "out"), "--scenario", "collapse")
    assert out.returncode == 0, out.stderr[-3000:]
    check_dapo_lineage(tmp_path / "D")
    assert "--epsilon_high 0.28" in out.stderr  # the relaunch command line, as logged by the supervisor
