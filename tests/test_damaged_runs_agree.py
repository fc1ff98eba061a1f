"""``watch`` and ``analyze`` on the same damaged run reach the same status, each from one code path: a final
summary line torn by a crash (``analysis.run_status.reached_max_steps``), a run log without its header
(``core.runlog.no_header``), an export with NaN and inf cells (one session, ``core.session``), a path that is a
symbolic link loop (``readers.missing_reason``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_monitor.analysis.analyze import analyze
from grpo_monitor.app.dashboard import check_path
from grpo_monitor.app.dashboard.app import replay_source
from grpo_monitor.app.dashboard.model import RunModel
from grpo_monitor.fixtures.dashboard_run import write_synthetic_run

ROOT = Path(__file__).resolve().parents[1]


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_MONITOR_")}
    return subprocess.run([sys.executable, "-m", "grpo_monitor", *args], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=300, stdin=subprocess.DEVNULL)


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().rstrip(b"\n").split(b"\n")


def test_a_torn_final_summary_after_the_last_step_is_a_finished_run_to_both(tmp_path):
    run = tmp_path / "run"
    write_synthetic_run(run, steps=30, moe=False, summary=True, findings=False)
    lines = _lines(run / "run.jsonl")
    head = json.loads(lines[0])
    head["config"]["max_steps"] = 30
    assert json.loads(lines[-1])["type"] == "summary"
    (run / "run.jsonl").write_bytes(b"\n".join([json.dumps(head).encode(), *lines[1:-1], lines[-1][:20]]))

    [report] = analyze(run).runs
    assert report.status is None and report.verdict != "incomplete"
    assert any("half-written last line" in w for w in report.warnings)  # said, not silently dropped
    model = RunModel()
    model.ingest(replay_source(run))
    assert model.summary is None and model.finished  # the header then shows "finished", never "live ... stalled"

    short = tmp_path / "short"  # the same log stopped before max_steps: unfinished to both
    write_synthetic_run(short, steps=20, moe=False, findings=False)
    lines = _lines(short / "run.jsonl")
    (short / "run.jsonl").write_bytes(b"\n".join([json.dumps(head).encode(), *lines[1:]]) + b"\n")
    [cut] = analyze(short).runs
    model = RunModel()
    model.ingest(replay_source(short))
    assert cut.status == "incomplete" and not model.finished


def test_a_run_log_without_its_header_is_refused_by_both_in_the_same_words(tmp_path):
    run = tmp_path / "run"
    write_synthetic_run(run, steps=10, moe=False)
    lines = _lines(run / "run.jsonl")
    (run / "run.jsonl").write_bytes(b"\n".join(x for x in lines if b'"type":"header"' not in x) + b"\n")
    said = f"{run / 'run.jsonl'}: no header record (its first record is a step record)"
    analysed, watched = _cli("analyze", str(run)), _cli("watch", str(run))
    assert analysed.returncode == watched.returncode == 2
    assert said in analysed.stderr and said in watched.stderr
    assert check_path(run) == said


def test_an_export_with_nan_and_inf_cells_gets_the_same_findings_and_coverage_from_both(tmp_path):
    rows = ["step,reward,entropy,completions/mean_length"]
    rows += [f"{s},{0.5 + s * 0.001},0.6,{100 + s}" if s < 50 else f"{s},nan,inf,nan" for s in range(1, 60)]
    path = tmp_path / "metrics.csv"
    path.write_text("\n".join(rows) + "\n")
    [report] = analyze(path).runs
    model = RunModel()
    model.ingest(replay_source(path))
    assert report.verdict in ("warning", "critical")
    assert [(f.detector, f.severity, f.step) for f in report.findings] == \
        [(f["detector"], f["severity"], f["step"]) for f in model.findings]
    coverage, found = model.coverage()
    assert {d: c["status"] for d, c in coverage.items()} == {d: c["status"] for d, c in report.coverage.items()}
    assert sorted(found) == sorted(report.metrics_found)


@pytest.mark.skipif(sys.platform == "win32", reason="symbolic links")
def test_a_symbolic_link_loop_is_called_one_by_both(tmp_path):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    analysed, watched = _cli("analyze", str(loop)), _cli("watch", str(loop))
    assert analysed.returncode == watched.returncode == 2
    for out in (analysed, watched):
        assert f"{loop}: a symbolic link loop (it leads back to itself)" in out.stderr, out.stderr
    broken = tmp_path / "broken"
    broken.symlink_to(tmp_path / "gone")
    assert "a broken symbolic link" in _cli("analyze", str(broken)).stderr
