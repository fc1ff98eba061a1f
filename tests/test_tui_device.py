"""The dashboard's device panel: hidden on runs without NVML readings, drawn (per rank too) on runs with them.

The readings come from ``fixtures.nvml``, an NVML-shaped stand-in built from NVML's documented structures
(no GPU here), summed up per step by the monitor's own sampler window (``core.device``), as a live run logs them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("textual")

from grpo_monitor.app.dashboard import WatchApp  # noqa: E402
from grpo_monitor.app.dashboard.widgets.chart import LineChart  # noqa: E402
from grpo_monitor.core.device import DeviceSampler, NvmlDevice  # noqa: E402
from grpo_monitor.core.runlog_writer import RunWriter  # noqa: E402
from grpo_monitor.fixtures.dashboard_run import header, step_record, write_synthetic_run  # noqa: E402
from grpo_monitor.fixtures.nvml import FakeNVML, throttling_episode  # noqa: E402
from tests.test_tui import screen_text  # noqa: E402

WIDE = (160, 48)
NARROW = (80, 24)


def write_device_run(run_dir: Path, steps: int = 40, ranks: int = 1) -> None:
    """The dashboard's synthetic run with each step's device window: four readings a step, the GPU
    overheating from step 20 (readings 80 on)."""
    fakes = [FakeNVML(readings=throttling_episode(80, 10_000)) for _ in range(ranks)]
    samplers = [DeviceSampler(NvmlDevice.open(f, 0)) for f in fakes]
    w = RunWriter(run_dir)
    try:
        h = header(False, run_id="demo-run")
        h["device"] = samplers[0].facts
        w.header(**h)
        for s in range(1, steps + 1):
            rec = step_record(s, moe=False)
            windows = []
            for sampler in samplers:
                for _ in range(4):
                    sampler.sample_now()
                windows.append({**sampler.drain(), "system/generation_share": 0.42})
            rec["metrics"].update(windows[-1])
            if ranks > 1:
                rec["devices"] = [{"rank": r, **win} for r, win in enumerate(windows)]
            w.write(rec)
    finally:
        w.close()
        for sampler in samplers:
            sampler.stop()


async def _loaded(pilot) -> None:
    app = pilot.app
    for _ in range(400):
        if app.caught_up.is_set():
            break
        await pilot.pause(0.05)
    assert app.caught_up.is_set()
    await pilot.pause()


async def test_device_panel_appears_only_when_the_run_logs_nvml_readings(tmp_path):
    plain, gpu = tmp_path / "plain", tmp_path / "gpu"
    write_synthetic_run(plain, steps=20, moe=False)
    write_device_run(gpu)
    for run_dir, shown in ((plain, False), (gpu, True)):
        app = WatchApp(run_dir, poll_interval=0.05)
        async with app.run_test(size=WIDE) as pilot:
            await _loaded(pilot)
            screen = app.screen
            assert ("device" in screen.visible_tabs()) is shown
            await pilot.press("6")
            await pilot.pause()
            tabs = screen.query_one("#tabs")
            assert (tabs.active == "device") is shown
            if not shown:
                assert "Device" not in screen_text(app)
                continue
            text = screen_text(app)
            assert "NVIDIA H100 80GB HBM3" in text
            # The latest step is inside the throttling episode: the slowing reasons are named.
            assert "sw_thermal_slowdown, hw_thermal_slowdown" in text and "SM 1185 of 1980 MHz" in text
            charts = {c.id: c for c in screen.query(LineChart) if c.id and c.id.startswith("chart-device")}
            assert [s.metric for s in charts["chart-device-clock"].series()] == ["system/gpu_sm_clock_mhz"]
            assert charts["chart-device-clock"]._refs(app.model) == [("max", 1980.0)]
            assert charts["chart-device-power"]._refs(app.model) == [("limit", 700.0)]
            clock = app.model.store.column("system/gpu_sm_clock_mhz")
            assert clock[0] == 1980.0 and clock[-1] == 1185.0


async def test_device_panel_lists_each_rank(tmp_path):
    d = tmp_path / "run"
    write_device_run(d, steps=12, ranks=2)
    app = WatchApp(d, poll_interval=0.05)
    async with app.run_test(size=WIDE) as pilot:
        await _loaded(pilot)
        await pilot.press("6")
        await pilot.pause()
        text = screen_text(app)
        assert "rank 0: util 92% · 68 °C · SM 1980 MHz · no throttle reason" in text
        assert "rank 1: util 92%" in text


@pytest.mark.parametrize("size", [NARROW, WIDE], ids=["80x24", "160x48"])
def test_device(snap_compare, tmp_path, size) -> None:
    pytest.importorskip("pytest_textual_snapshot")
    d = tmp_path / "run"
    write_device_run(d)
    assert snap_compare(WatchApp(d, poll_interval=0.05), terminal_size=size, press=["6"], run_before=_loaded)
