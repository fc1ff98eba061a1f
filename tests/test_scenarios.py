"""The demo's failure scenarios on the real tiny model: the finding, the recommendation, the stop,
the restart with the variant or the lower learning rate, the run going on.

Each scenario fails by mechanism (a sampling temperature, a learning rate that one Adam step cannot
survive, a length the sampler is made to reach while a reward pays per token), not by the trajectory
a CPU's rounding happens to take, so these tests check properties that hold on any machine: which
detector confirmed, what the restart changed, where it resumed, and that where the change removes
the cause, the restarted segment runs to its end (and where it cannot, the demo says so)."""

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
    # Not cured (the schedule is in the script): the lineage exits by its last segment's finding.
    assert out.returncode == 1, out.stderr[-3000:]
    first, second = check_dapo_lineage(tmp_path / "D")
    assert "exit 1: segment 2, the last, still has entropy_collapse (not cured by the restart)" in out.stdout
    analysed = run("-m", "grpo_monitor", "analyze", str(tmp_path / "D"))
    assert analysed.returncode == 1 and "not cured: the segments after it still have a" in analysed.stdout
    assert "stopped at step" in out.stdout and "segment 2 (dapo" in out.stdout and "segment 1 (plain GRPO)" in out.stdout
    # The schedule is in the script: DAPO cannot undo it, and the demo says what a restart can and cannot fix.
    outcome = next(line for line in out.stdout.splitlines() if "covered" in line or "recovered" in line)
    assert "temperature schedule is in this scenario's training script" in outcome and "DAPO" in outcome
    assert "what a restart cannot fix" in outcome
    # Off-policy steps (steps_per_generation 4) log no completion metrics: progress lines and summaries
    # show the latest generation's values with their step, not dashes.
    progress = [line for line in out.stdout.splitlines() if line.lstrip().startswith("step ")]
    assert progress and not [line for line in progress if "reward —" in line or "length —" in line]
    assert "(step " in "\n".join(progress) and "reward —" not in out.stdout.split("-- segment 2", 1)[1]


def test_supervise_collapse_relaunches_the_script_with_dapo_flags(tmp_path):
    out = run("-m", "grpo_monitor", "supervise", "--run-dir", str(tmp_path / "D"), "--max-restarts", "1", "--",
              sys.executable, "examples/train.py", "--output_dir", str(tmp_path / "out"), "--scenario", "collapse")
    # The script exits 0 each time; the lineage is not cured (its last segment still collapses): exit 1.
    assert out.returncode == 1, out.stderr[-3000:]
    check_dapo_lineage(tmp_path / "D")
    assert "--epsilon_high 0.28" in out.stderr  # the relaunch command line, as logged by the supervisor
    assert "-- the whole lineage (2 segments)" in out.stdout and "exit 1: segment 2, the last" in out.stdout


def test_supervise_ends_a_cured_lineage_with_the_demos_summary_and_exit_0(tmp_path):
    out = run("-m", "grpo_monitor", "supervise", "--run-dir", str(tmp_path / "D"), "--max-restarts", "1", "--",
              sys.executable, "examples/train.py", "--output_dir", str(tmp_path / "out"), "--scenario", "sudden_collapse")
    assert out.returncode == 0, out.stderr[-3000:]
    assert len(read_lineage(tmp_path / "D").segments) == 2
    summary = out.stdout.split("-- segment 1 (plain GRPO)", 1)[1]
    assert "[critical] sudden_collapse" in summary.split("-- segment 2 (lower_learning_rate", 1)[0]
    assert "-- the whole lineage (2 segments)" in summary
    assert ("exit 0: segment 2, the last, ended with no warning or critical finding; the findings of segment 1 were "
            "acted on by the restart") in summary


def test_the_moe_demo_says_nothing_about_the_training_is_flagged_and_lists_the_preflight_advice_apart(tmp_path):
    out = run("-m", "grpo_monitor", "demo", "--moe", "--steps", "8", "--run-dir", str(tmp_path / "D"))
    assert out.returncode == 0, out.stderr[-3000:]
    intro = out.stdout.splitlines()[0]
    assert "nothing about the training is flagged" in intro and "not a flag on the training" in intro
    training, _, preflight = out.stdout.partition("\n  pre-flight advice on the recipe (checked as training began")
    # What the scenario says holds: no warning or critical among the training's findings; GSPO's is pre-flight.
    assert "findings on the training:" in training and "(0 flagged: warning or critical)" in training
    assert not re.search(r"^\s+\[(warning|critical)\]", training, re.M), training
    assert "[warning] config_moe_gspo" in preflight


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
    assert "recovered: segment 2 (lower_learning_rate) ran to step 50 with no warning or critical finding" in out.stdout
    # Cured: the lineage exits 0 (above), and its summary says the first segment's findings were acted on.
    assert "exit 0: segment 2, the last, ended with no warning or critical finding; the findings of segment 1 were " \
           "acted on by the restart" in out.stdout
    assert not [f for f in second.findings if f["severity"] == "critical"]
    # One change, said once: the warning's advice is folded into the recommendation it became.
    first_summary = out.stdout.split("-- segment 1", 1)[1].split("-- segment 2", 1)[0]
    assert "advice: apply lower_learning_rate" not in first_summary
    assert first_summary.count("apply lower_learning_rate") == 1
    if any(f["detector"] == "sudden_collapse" and f["severity"] == "warning" for f in first.findings):
        assert "apply lower_learning_rate (advised from a warning at step" in first_summary
    # analyze of the lineage's root says it is cured, as the demo does; its exit code counts every segment's
    # findings (the CLI contract: 1 when a warning or critical finding was raised).
    analysed = run("-m", "grpo_monitor", "analyze", str(tmp_path / "D"))
    assert analysed.returncode == 1, analysed.stdout[-3000:] + analysed.stderr[-2000:]
    assert "sudden_collapse" in analysed.stdout and "status: restarted" in analysed.stdout
    assert ("lineage: cured — the findings of segment 1 were acted on by the restart that followed; the segments "
            "after it have no warning or critical finding" in analysed.stdout)
    # compare reads the lineage's segments side by side: the setting the restart changed, and the curve it saved.
    compared = run("-m", "grpo_monitor", "compare", str(tmp_path / "D"))
    assert compared.returncode == 0, compared.stderr[-2000:]
    said = next(line for line in compared.stdout.splitlines() if line.lstrip().startswith("- sudden_collapse in segment 1"))
    assert "not in segment 2" in said and "segment 1's reward falls to 0 % of its early level" in said, said
    assert re.search(r"segment 2's reward stays at or above \d+ % of its early level through step 50", said), said
    assert f"segment 2 sets learning_rate={second.header['config']['learning_rate']:g}" in said, said


def test_length_names_the_per_token_reward_and_recovers_once_it_is_weighted_out(tmp_path):
    """The growth is the per-token reward's doing: the reward_function_bug finding names
    length_bonus_reward, the restart gives it the weight 0 (reward_weights), and with nothing paying
    for length the restarted segment runs to its end without a critical finding."""
    out = run("-m", "grpo_monitor", "demo", "--scenario", "length", "--auto-restart", "--run-dir", str(tmp_path / "D"))
    assert out.returncode == 0, out.stderr[-3000:]
    lineage = read_lineage(tmp_path / "D")
    assert len(lineage.segments) == 2
    first, second = read_run(lineage.segments[0].run_dir), read_run(lineage.segments[1].run_dir)
    named = [f for f in first.findings if f["detector"] == "reward_function_bug" and f["severity"] == "critical"]
    assert named, [(f["detector"], f["severity"], f["step"]) for f in first.findings]
    comp = named[0]["evidence"]["components"][0]
    assert comp["component"] == "length_bonus_reward" and comp["kind"] == "per_token"
    assert abs(comp["per_token"] - 0.05) < 1e-9 and "length_bonus_reward" in named[0]["message"]
    restart = first.restarts[0]
    assert restart["variant"] == "drop_length_reward" and restart["config_overrides"] == {"reward_weights": [1.0, 1.0, 0.0]}
    assert second.header["config"]["reward_weights"] == [1.0, 1.0, 0.0]
    # Nothing pays for length: the curriculum that stands for learning it stops, and the run goes to its end.
    assert second.steps[-1]["step"] == first.header["config"]["max_steps"] and not second.restarts
    assert not [f for f in second.findings if f["severity"] == "critical"]
    assert max(s["metrics"]["completions/mean_length"] for s in second.steps) < 16
    assert "recovered: segment 2 (drop_length_reward)" in out.stdout
