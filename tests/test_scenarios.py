"""The demo's failure scenarios on the real tiny model: the finding, the recommendation, the stop,
the restart with the variant or the lower learning rate, the run going on.

Each scenario fails by mechanism (a sampling temperature, a learning rate that one Adam step cannot
survive), not by the trajectory a CPU's rounding happens to take, so these tests check properties
that hold on any machine: which detector confirmed, what the restart changed, where it resumed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from grpo_monitor import read_run
from grpo_monitor.core.lineage import read_lineage

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
    # The collapse is a collapse: entropy far below where it stood, and no reward crash behind it.
    assert not [f for f in first.findings if f["detector"] == "sudden_collapse"]
    cfg = second.header["config"]
    assert cfg["epsilon_high"] == 0.28 and cfg["mask_truncated_completions"] is True
    assert cfg["steps_per_generation"] > cfg["gradient_accumulation_steps"]  # off-policy, so clip-higher acts
    assert second.header["parent_run"] == first.header["run_id"] and second.header["tried_variants"] == ["dapo"]
    assert len(second.steps) > 0  # the run went on under the variant
    return first, second


def test_demo_collapse_auto_restart_switches_to_dapo(tmp_path):
    out = run("-m", "grpo_monitor", "demo", "--scenario", "collapse", "--auto-restart", "--max-restarts", "1",
              "--run-dir", str(tmp_path / "D"))
    assert out.returncode == 0, out.stderr[-3000:]
    first, second = check_dapo_lineage(tmp_path / "D")
    assert "stopped at step" in out.stdout and "segment 2 (dapo" in out.stdout and "segment 1 (plain GRPO)" in out.stdout


def test_supervise_collapse_relaunches_the_script_with_dapo_flags(tmp_path):
    out = run("-m", "grpo_monitor", "supervise", "--run-dir", str(tmp_path / "D"), "--max-restarts", "1", "--",
              sys.executable, "examples/train.py", "--output_dir", str(tmp_path / "out"), "--scenario", "collapse")
    assert out.returncode == 0, out.stderr[-3000:]
    check_dapo_lineage(tmp_path / "D")
    assert "--epsilon_high 0.28" in out.stderr  # the relaunch command line, as logged by the supervisor


def test_sudden_collapse_names_the_last_healthy_step_and_resumes_before_it(tmp_path):
    """From step 25 the schedule multiplies the rate by 3000: the first update at that rate wrecks the
    weights, whatever the rounding. The finding names the last step sampled before it, the restart
    resumes from the newest checkpoint saved before that step at a rate whose peak is a tenth of the
    healthy one, and the run goes on."""
    out = run("-m", "grpo_monitor", "demo", "--scenario", "sudden_collapse", "--auto-restart", "--max-restarts", "1",
              "--run-dir", str(tmp_path / "D"))
    assert out.returncode == 0, out.stderr[-3000:]
    lineage = read_lineage(tmp_path / "D")
    assert len(lineage.segments) == 2
    first, second = read_run(lineage.segments[0].run_dir), read_run(lineage.segments[1].run_dir)
    crit = [f for f in first.findings if f["detector"] == "sudden_collapse" and f["severity"] == "critical"]
    assert crit, [(f["detector"], f["severity"], f["step"]) for f in first.findings]
    finding = crit[0]
    last = finding["evidence"]["last_healthy_step"]
    # The switch acts from the 26th update on; completions of step 26 were sampled before it.
    assert 10 <= last <= 26 and finding["onset_step"] == last and f"last healthy step is {last}" in finding["message"]
    assert "learning_rate_jump" in finding["evidence"]["precursors"]
    restart = first.restarts[0]
    assert restart["variant"] == "lower_learning_rate" and restart["step"] == first.steps[-1]["step"]
    saved = int(re.search(r"checkpoint-(\d+)$", restart["resume_from"]).group(1))
    assert saved < last and saved % 5 == 0 and saved >= last - 5  # the newest checkpoint before it
    assert second.header["resumed_from_step"] == saved
    lr = second.header["config"]["learning_rate"]
    assert lr < first.header["config"]["learning_rate"] / 10
    # The restarted segment trains at that rate: the schedule's jump now peaks at a tenth of the healthy rate.
    rates = [s["metrics"].get("learning_rate") for s in second.steps if s["metrics"].get("learning_rate")]
    assert rates and max(rates) <= first.header["config"]["learning_rate"] / 10 * 1.01
    assert len(second.steps) > 0 and second.steps[-1]["step"] == first.header["config"]["max_steps"]
    assert "lower_learning_rate" in out.stdout and "stopped at step" in out.stdout
