"""Screenshots of the dashboard's main screens, compared with the accepted ones.

Update after an intended change with ``pytest tests/test_tui_snapshots.py --snapshot-update``
and review the SVGs under ``tests/__snapshots__/``. The run is synthetic and fixed, and nothing
shown depends on the clock or the temporary path, so the screenshots are deterministic.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pytest_textual_snapshot")

from grpo_monitor.app.dashboard import WatchApp  # noqa: E402
from grpo_monitor.fixtures.dashboard_run import write_synthetic_run  # noqa: E402

NARROW = (80, 24)
WIDE = (160, 48)


@pytest.fixture
def app(tmp_path: Path) -> WatchApp:
    d = tmp_path / "run"
    write_synthetic_run(d, steps=50)
    return WatchApp(d, poll_interval=0.05)


async def _loaded(pilot) -> None:
    app = pilot.app
    for _ in range(400):
        if app.caught_up.is_set():
            break
        await pilot.pause(0.05)
    assert app.caught_up.is_set()
    await pilot.pause()


@pytest.mark.parametrize("size", [NARROW, WIDE], ids=["80x24", "160x48"])
def test_overview(snap_compare, app, size) -> None:
    assert snap_compare(app, terminal_size=size, run_before=_loaded)


@pytest.mark.parametrize("size", [NARROW, WIDE], ids=["80x24", "160x48"])
def test_detectors(snap_compare, app, size) -> None:
    assert snap_compare(app, terminal_size=size, press=["2"], run_before=_loaded)


@pytest.mark.parametrize("size", [NARROW, WIDE], ids=["80x24", "160x48"])
def test_recommendations(snap_compare, app, size) -> None:
    assert snap_compare(app, terminal_size=size, press=["3"], run_before=_loaded)


@pytest.mark.parametrize("size", [NARROW, WIDE], ids=["80x24", "160x48"])
def test_samples(snap_compare, app, size) -> None:
    assert snap_compare(app, terminal_size=size, press=["4", "down", "down"], run_before=_loaded)


def test_sample_in_full(snap_compare, app) -> None:
    assert snap_compare(app, terminal_size=NARROW, press=["4", "down", "enter"], run_before=_loaded)


def test_samples_filtered(snap_compare, app) -> None:
    assert snap_compare(app, terminal_size=NARROW, press=["4", "slash", *"7 correct", "enter"], run_before=_loaded)


@pytest.mark.parametrize("size", [NARROW, WIDE], ids=["80x24", "160x48"])
def test_moe(snap_compare, app, size) -> None:
    assert snap_compare(app, terminal_size=size, press=["5"], run_before=_loaded)


def test_help(snap_compare, app) -> None:
    assert snap_compare(app, terminal_size=NARROW, press=["question_mark"], run_before=_loaded)


def test_overview_light_theme(snap_compare, app) -> None:
    assert snap_compare(app, terminal_size=WIDE, press=["t"], run_before=_loaded)
