"""The overview's mismatch charts: hidden on runs that do not log the mismatch, drawn on runs that do."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

pytest.importorskip("textual")

from grpo_monitor.core.runlog_writer import RunWriter  # noqa: E402
from grpo_monitor.app.dashboard import WatchApp  # noqa: E402
from grpo_monitor.fixtures.dashboard_run import header, step_record, write_synthetic_run  # noqa: E402
from grpo_monitor.app.dashboard.widgets.chart import LineChart  # noqa: E402

WIDE = (160, 48)


def write_mismatch_run(run_dir: Path, steps: int = 50) -> None:
    """The dashboard's synthetic run, logged with vLLM's mismatch metrics: the gap grows from step 20."""
    w = RunWriter(run_dir)
    try:
        w.header(**header(False, run_id="demo-run"))
        for s in range(1, steps + 1):
            rec = step_record(s, moe=False)
            d = 0.012 * math.exp(max(0.0, s - 20.0) / 8.0) * (1 + 0.05 * math.sin(s))
            masked = min(0.6, max(0.0, 1.5 * (d - 0.03)))
            rec["metrics"].update({
                "sampling/sampling_logp_difference/mean": d,
                "sampling/sampling_logp_difference/max": 30 * d,
                "sampling/importance_sampling_ratio/min": 0.0 if masked else 0.8,
                "sampling/importance_sampling_ratio/mean": (1.0 - masked) * (1 + 0.02 * math.cos(s)),
                "sampling/importance_sampling_ratio/max": 1.9,
            })
            w.write(rec)
    finally:
        w.close()


async def _loaded(pilot) -> None:
    app = pilot.app
    for _ in range(400):
        if app.caught_up.is_set():
            break
        await pilot.pause(0.05)
    assert app.caught_up.is_set()
    await pilot.pause()


def _charts(app):
    return {c.id: c for c in app.screen.query(LineChart)}


async def test_mismatch_charts_appear_only_when_the_run_logs_the_mismatch(tmp_path):
    plain, vllm = tmp_path / "plain", tmp_path / "vllm"
    write_synthetic_run(plain, steps=30)
    write_mismatch_run(vllm, steps=30)
    for run_dir, shown in ((plain, False), (vllm, True)):
        app = WatchApp(run_dir, poll_interval=0.05)
        async with app.run_test(size=WIDE) as pilot:
            await _loaded(pilot)
            charts = _charts(app)
            assert ("chart-mismatch" in charts) is shown and ("chart-is-weights" in charts) is shown
            if shown:
                assert [s.metric for s in charts["chart-mismatch"].series()] == ["sampling/sampling_logp_difference/mean"]
                assert [s.label for s in charts["chart-is-weights"].series()] == ["IS mean"]


def test_overview_with_mismatch(snap_compare, tmp_path) -> None:
    pytest.importorskip("pytest_textual_snapshot")
    d = tmp_path / "run"
    write_mismatch_run(d)
    assert snap_compare(WatchApp(d, poll_interval=0.05), terminal_size=WIDE, run_before=_loaded)
