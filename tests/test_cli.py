"""The grpo-monitor command line, run as a real subprocess."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from grpo_monitor import load_run, read_run
from tests.test_callback import COMPONENTS, UNCONDITIONAL


def cli(*args, check=False):
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, "-m", "grpo_monitor", *args], capture_output=True, text=True, env=env, check=check)


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_demo_leaves_a_complete_run_directory(tmp_path, moe):
    run_dir = tmp_path / "demo"
    steps = 12 if moe else 5
    out = cli("demo", "--steps", str(steps), "--run-dir", str(run_dir), *(["--moe"] if moe else []))
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"run directory: {run_dir}" in out.stdout
    frame = load_run(run_dir)
    assert len(frame) >= steps
    keys = UNCONDITIONAL + [f"rewards/{c}/{s}" for c in COMPONENTS for s in ("mean", "std")] + (["aux_loss"] if moe else [])
    for key in keys:
        assert key in frame.columns and all(math.isfinite(v) for v in frame[key]), key
    if moe:
        for key in ("moe/load_cv", "moe/load_max_over_mean", "moe/router_entropy"):
            assert frame[key].notna().all(), key  # every logged step
        flips = frame["moe/flip_rate"].dropna()
        assert list(flips.index) == [10]  # every probe_every=10 steps
        log = read_run(run_dir)
        assert all(len(r["moe_load"]) == 2 and len(r["moe_load"][0]) == 8 for r in log.steps)


def test_demo_reports_to_tensorboard_when_asked(tmp_path):
    run_dir = tmp_path / "tb"
    out = cli("demo", "--steps", "3", "--run-dir", str(run_dir), "--report-to", "tensorboard")
    assert out.returncode == 0, out.stderr[-2000:]
    assert list((run_dir / "trainer").rglob("events.out.tfevents.*"))


def test_analyze_json_shape_and_exit_codes(tmp_path):
    run_dir = tmp_path / "demo"
    cli("demo", "--steps", "4", "--run-dir", str(run_dir), check=True)
    out = cli("analyze", str(run_dir), "--json")
    doc = json.loads(out.stdout)
    assert set(doc) == {"runs"} and len(doc["runs"]) == 1
    run = doc["runs"][0]
    assert {"source", "steps", "findings", "recommendations"} <= set(run)
    assert run["source"] == str(run_dir) and run["steps"] == 4 and run["file"] == str(run_dir / "run.jsonl")
    flagged = any(f["severity"] in ("warning", "critical") for f in run["findings"])
    unseen = run["verdict"] in ("cannot_judge", "incomplete")
    assert out.returncode == (1 if flagged else 3 if unseen else 0)
    assert run["verdict"] != "healthy" or run["judged_by"]  # healthy only where a failure detector judged


@pytest.mark.parametrize("content", [b"", b"\x00\x01garbage\xff", b'{"log_history": [{"step": 1, "loss"'])
def test_analyze_bad_input_is_one_line_and_exit_2(tmp_path, content):
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    out = cli("analyze", str(bad))
    assert out.returncode == 2
    assert out.stdout == "" and len(out.stderr.strip().splitlines()) == 1 and str(bad) in out.stderr
    assert "Traceback" not in out.stderr


def test_analyze_missing_path(tmp_path):
    out = cli("analyze", str(tmp_path / "missing"))
    assert out.returncode == 2 and "missing" in out.stderr and "Traceback" not in out.stderr


def test_markdown_report(tmp_path):
    run_dir = tmp_path / "demo"
    cli("demo", "--steps", "3", "--run-dir", str(run_dir), check=True)
    md = tmp_path / "report.md"
    out = cli("analyze", str(run_dir), "--markdown", str(md))
    assert out.returncode in (0, 1, 3)
    text = md.read_text()
    assert text.startswith("# grpo-monitor report") and "Verdict:" in text and "entropy" in text


def test_lint_verb_on_a_config_file(tmp_path):
    cfg = tmp_path / "grpo.yaml"
    cfg.write_text("output_dir: out\nnum_generations: 4\nlearning_rate: 5.0e-7\nbeta: 0.01\nbf16: false\nuse_cpu: true\n")
    out = cli("lint", str(cfg), "--device", "cpu", "--json")
    # num_generations=4 is a warning, advice with its fix: lint fails a recipe on a critical finding only.
    assert out.returncode == 0, out.stderr
    [f] = [f for f in json.loads(out.stdout)["findings"] if f["detector"] == "config_num_generations"]
    assert f["severity"] == "warning" and f["config_overrides"] == {"num_generations": 8}


def test_inspect_rewards_auto_on_the_demo_model(tmp_path):
    out = cli("inspect-rewards", "--demo", "--auto", "--num-samples", "50", "--run-dir", str(tmp_path / "gate"))
    assert out.returncode == 0, out.stderr[-2000:]
    assert "format_reward" in out.stdout and "correctness_reward" in out.stdout
    assert "no one judged these samples" in out.stdout  # --auto never passes the gate
    assert not (tmp_path / "gate" / "reward_gate.json").exists()


def test_every_verb_the_parser_knows_has_its_runner_and_nothing_else():
    import argparse

    from grpo_monitor.app.cli import VERBS, _parser

    sub = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert list(sub.choices) == list(VERBS)


def test_every_command_exits_with_the_shared_codes():
    from grpo_monitor.core.exit_codes import ExitCode

    assert [int(c) for c in ExitCode] == [0, 1, 2, 3, 4]
    from grpo_monitor.app.cli import main

    assert main(["supervise"]) == ExitCode.BAD_INPUT
