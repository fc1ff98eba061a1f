"""`grpo-monitor supervise` around real child processes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from grpo_monitor.core.restart import read_plan

ROOT = Path(__file__).resolve().parents[1]

# A stand-in training command: it behaves like a monitored run (writes the restart plan the
# callback would write on a confirmed finding) without paying for a model, so the supervisor's
# own logic is what is exercised. The end-to-end test with real training is below.
CHILD = textwrap.dedent("""
    import json, os, sys, time
    sys.path.insert(0, {root!r})
    from grpo_monitor.core.restart import RestartPlan, env_state, write_plan
    state = env_state()
    seg = state["segment"]
    with open(os.path.join({log!r}), "a") as fh:
        fh.write(json.dumps({{"segment": seg, "argv": sys.argv[1:], "overrides": state["overrides"],
                              "tried": state["tried"], "resume": state["resume_from"]}}) + "\\n")
    mode = sys.argv[1]
    if mode == "crash":
        sys.exit(3)
    if mode == "sleep":
        import signal
        def bye(signum, frame):
            open({log!r} + ".signal", "w").write(str(signum)); sys.exit(130)
        signal.signal(signal.SIGINT, bye)
        signal.signal(signal.SIGTERM, bye)
        open({log!r} + ".ready", "w").write("1")
        time.sleep(60)
        sys.exit(0)
    variants = ["dapo", "dr_grpo", "gspo"]
    if mode == "restart" and seg < 3:
        v = variants[seg]
        write_plan(state["run_dir"], RestartPlan(
            segment=seg, step=10 + seg, variant=v, config_overrides={{"x": seg}},
            cumulative_overrides={{**state["overrides"], "loss_type": v}}, resume_from=None, onset_step=5,
            findings=[], reasons=[], tried=state["tried"] + [v], parent_run="run%d" % seg, output_dir="out",
            next_run_dir=os.path.join({run!r}, "segment-%d" % (seg + 1)), next_output_dir="out/segment-%d" % (seg + 1)))
    sys.exit(0)
""")


def setup_child(tmp_path):
    run = tmp_path / "run"
    log = tmp_path / "child.log"
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(root=str(ROOT), log=str(log), run=str(run)))
    return script, run, log


def supervise(*args, **kw):
    return subprocess.run([sys.executable, "-m", "grpo_monitor", "supervise", *args], capture_output=True, text=True, **kw)


def lines(log):
    return [json.loads(x) for x in log.read_text().splitlines()]


def test_relaunches_with_the_plan_as_flags_and_environment(tmp_path):
    script, run, log = setup_child(tmp_path)
    out = supervise("--run-dir", str(run), "--max-restarts", "5", "--", sys.executable, str(script), "restart")
    assert out.returncode == 0, out.stderr
    launches = lines(log)
    assert [x["segment"] for x in launches] == [0, 1, 2, 3]
    assert launches[0]["argv"] == ["restart"] and launches[0]["overrides"] == {}
    assert launches[1]["argv"] == ["restart", "--loss_type", "dapo", "--output_dir", "out/segment-1"]
    assert launches[1]["overrides"] == {"loss_type": "dapo", "output_dir": "out/segment-1"}
    assert launches[2]["tried"] == ["dapo", "dr_grpo"]
    assert read_plan(run).variant == "dapo" and read_plan(run / "segment-1").variant == "dr_grpo"


def test_max_restarts_is_respected(tmp_path):
    script, run, log = setup_child(tmp_path)
    out = supervise("--run-dir", str(run), "--max-restarts", "1", "--", sys.executable, str(script), "restart")
    assert out.returncode == 0
    assert [x["segment"] for x in lines(log)] == [0, 1]
    assert "max_restarts=1 reached" in out.stderr


def test_a_crash_the_monitor_did_not_request_is_not_restarted(tmp_path):
    script, run, log = setup_child(tmp_path)
    out = supervise("--run-dir", str(run), "--", sys.executable, str(script), "crash")
    assert out.returncode == 3
    assert len(lines(log)) == 1 and "not restarting" in out.stderr


def test_env_only_mode_appends_no_flags(tmp_path):
    script, run, log = setup_child(tmp_path)
    out = supervise("--run-dir", str(run), "--max-restarts", "1", "--apply", "env", "--", sys.executable, str(script), "restart")
    assert out.returncode == 0
    second = lines(log)[1]
    assert second["argv"] == ["restart"] and second["overrides"]["loss_type"] == "dapo"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signals_are_forwarded_to_the_child_group_and_exit_code_propagates(tmp_path, signum):
    script, run, log = setup_child(tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "grpo_monitor", "supervise", "--run-dir", str(run), "--",
                             sys.executable, str(script), "sleep"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ready = Path(str(log) + ".ready")
    deadline = time.time() + 60
    while not ready.exists() and time.time() < deadline:
        time.sleep(0.05)
    assert ready.exists()
    proc.send_signal(signum)
    rc = proc.wait(timeout=30)
    assert Path(str(log) + ".signal").read_text() == str(int(signum))
    assert rc == 130


def test_second_supervisor_on_the_same_run_directory_is_refused(tmp_path):
    script, run, log = setup_child(tmp_path)
    first = subprocess.Popen([sys.executable, "-m", "grpo_monitor", "supervise", "--run-dir", str(run), "--",
                              sys.executable, str(script), "sleep"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    ready = Path(str(log) + ".ready")
    deadline = time.time() + 60
    while not ready.exists() and time.time() < deadline:
        time.sleep(0.05)
    second = supervise("--run-dir", str(run), "--", sys.executable, "-c", "print('never')")
    first.send_signal(signal.SIGTERM)
    first.wait(timeout=30)
    assert second.returncode == 2 and "already running" in second.stderr and "never" not in second.stdout


def test_no_command_is_a_usage_error(tmp_path):
    out = supervise("--run-dir", str(tmp_path))
    assert out.returncode == 2 and "no command" in out.stderr


def test_a_list_override_is_relaunched_as_one_flag_with_its_values(tmp_path):
    # The per-token reward weighed out (reward_weights) reaches a relaunched TRL script as it parses lists.
    from transformers import HfArgumentParser
    from trl import GRPOConfig

    from grpo_monitor.core.restart import RestartPlan, child_flags

    plan = RestartPlan(segment=0, step=27, variant="drop_length_reward", config_overrides={"reward_weights": [1.0, 1.0, 0.0]},
                       cumulative_overrides={"reward_weights": [1.0, 1.0, 0.0]}, resume_from=None, onset_step=14,
                       findings=[], reasons=[], tried=["drop_length_reward"], parent_run="r0", output_dir=str(tmp_path),
                       next_run_dir=str(tmp_path / "segment-1"), next_output_dir=str(tmp_path / "out" / "segment-1"))
    flags = child_flags(plan)
    assert flags[:4] == ["--reward_weights", "1.0", "1.0", "0.0"]
    (args,) = HfArgumentParser(GRPOConfig).parse_args_into_dataclasses(
        [*flags, "--use_cpu", "True", "--bf16", "False", "--report_to", "none"])
    assert args.reward_weights == [1.0, 1.0, 0.0] and args.output_dir == str(tmp_path / "out" / "segment-1")
