"""Two CPU processes (torchrun, gloo): rank 0 writes the shared log, every rank its samples,
every rank's detectors see the whole batch (so all agree, and with the offline replay), and an
auto-restart stops every rank at the same step."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from grpo_monitor.detectors import ALL_DETECTORS
from grpo_monitor import analyze, read_run
from grpo_monitor.core.restart import read_plan

ROOT = Path(__file__).resolve().parents[1]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]



def env():
    e = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    for k in list(e):
        if k.startswith("GRPO_MONITOR_"):
            del e[k]
    return e


def test_two_ranks_write_their_own_samples_and_one_shared_log(tmp_path):
    out = subprocess.run([*TORCHRUN, str(ROOT / "examples" / "train.py"), "--output_dir", str(tmp_path / "out"),
                          "--max_steps", "3"], capture_output=True, text=True, env=env(), cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    run_dir = tmp_path / "out" / "grpo-monitor"
    assert sorted(p.name for p in run_dir.iterdir()) == ["run.jsonl", "samples.rank0.jsonl", "samples.rank1.jsonl"]
    log = read_run(run_dir)
    assert len([r for r in (run_dir / "run.jsonl").read_text().splitlines() if '"type":"header"' in r]) == 1
    assert log.header["world_size"] == 2 and [r["step"] for r in log.steps] == [1, 2, 3]
    for rec in log.steps:
        samples = log.samples_by_step()[rec["step"]]
        assert sorted({s["rank"] for s in samples}) == [0, 1] and len(samples) == 16
        assert sorted(s["index"] for s in samples) == list(range(16))  # global positions, no overlap
        for comp in ("format_reward", "correctness_reward"):
            merged = np.mean([s["rewards"][comp] for s in samples])
            assert merged == pytest.approx(rec["metrics"][f"rewards/{comp}/mean"], abs=1e-6)
        assert np.mean([s["length"] for s in samples]) == pytest.approx(rec["metrics"]["completions/mean_length"], abs=1e-6)
        assert rec["metrics"]["samples/count"] == 16  # the detectors saw both ranks' completions


def test_auto_restart_stops_every_rank_at_the_same_step(tmp_path):
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "grpo_monitor", "supervise", "--run-dir", str(run_dir), "--max-restarts", "1", "--",
           *TORCHRUN, str(ROOT / "examples" / "train.py"), "--output_dir", str(tmp_path / "out"), "--scenario", "collapse"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env(), cwd=ROOT, timeout=1200)
    assert out.returncode == 0, out.stderr[-3000:]
    plan = read_plan(run_dir)
    assert plan is not None and plan.variant == "dapo"
    stops = re.findall(r"rank (\d): trained to step (\d+)", out.stdout)
    first = stops[:2]
    assert sorted(r for r, _ in first) == ["0", "1"] and {s for _, s in first} == {str(plan.step)}
    assert (tmp_path / "out" / f"checkpoint-{plan.step}").is_dir()
    # Findings: every rank computed the same ones (else a note says where they differ), and the
    # offline replay of the merged per-rank samples raises them at the same steps.
    first_segment = read_run(run_dir)
    ids = {cls.id for cls in ALL_DETECTORS}  # the pre-flight lint's config_* findings are not replayed
    live = [(f["detector"], f["severity"], f["step"], f["onset_step"]) for f in first_segment.findings if f["detector"] in ids]
    assert any(d == "entropy_collapse" for d, *_ in live)
    assert not [n for n in first_segment.notes if "differ across ranks" in n.get("message", "")]
    replayed = [f for f in analyze(run_dir).runs[0].findings if f.detector in ids]  # config_* are reported, not replayed
    assert [(f.detector, f.severity, f.step, f.onset_step) for f in replayed] == live
    child = read_run(run_dir / "segment-1")
    assert child.header["config"]["epsilon_high"] == 0.28 and child.header["parent_run"] == plan.parent_run
    assert child.header["world_size"] == 2 and child.header["config"]["output_dir"].endswith("segment-1")
    assert not list((run_dir / "segment-1").glob("run.jsonl.*"))
    assert sorted(p.name for p in (run_dir / "segment-1").glob("samples.rank*.jsonl")) == ["samples.rank0.jsonl", "samples.rank1.jsonl"]
