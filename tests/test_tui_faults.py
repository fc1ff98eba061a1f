"""The dashboard on a run log with bad records: each costs its own line, the screen says so, and
nothing in the files can end the app with a worker traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("textual")

from textual.widgets import DataTable  # noqa: E402

from grpo_monitor.app.dashboard import WatchApp  # noqa: E402
from grpo_monitor.core.runlog_writer import RunWriter
from grpo_monitor.core.runlog import dumps  # noqa: E402
from grpo_monitor.fixtures.dashboard_run import append_steps, write_synthetic_run  # noqa: E402
from tests.test_tui import FAST, header_text, loaded, screen_text, wait_for  # noqa: E402

aio = pytest.mark.asyncio
DEPTH = 1100  # beyond what either JSON parser takes, and beyond Python's recursion limit


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def deep_step(step: int) -> bytes:
    return f'{{"type":"step","step":{step},"time":1.0,"metrics":{{"entropy":0.5}},"detectors":{nested(DEPTH)}}}\n'.encode()


def put_line(path: Path, lineno: int, line: bytes) -> None:
    """Replace line ``lineno`` (1-based) of ``path``."""
    lines = path.read_bytes().split(b"\n")
    lines[lineno - 1] = line.rstrip(b"\n")
    path.write_bytes(b"\n".join(lines))


def run_line_of_step(run_dir: Path, step: int) -> int:
    for i, line in enumerate((run_dir / "run.jsonl").read_bytes().split(b"\n"), 1):
        if line.startswith(b'{"type":"step","step":%d,' % step):
            return i
    raise AssertionError(f"no step {step}")


async def still_running(pilot) -> None:
    await pilot.pause(0.3)  # several polls after the bad record
    assert pilot.app.is_running and pilot.app.error is None


@aio
async def test_a_deeply_nested_step_line_at_start_costs_that_line(tmp_path: Path) -> None:
    d = tmp_path / "run"
    write_synthetic_run(d, steps=20, moe=False)
    lineno = run_line_of_step(d, 7)
    put_line(d / "run.jsonl", lineno, deep_step(7))
    app = WatchApp(d, poll_interval=FAST)
    async with app.run_test(size=(160, 40)) as pilot:
        await loaded(pilot)
        await still_running(pilot)
        assert app.model.store.n == 19 and 7 not in app.model.store.steps
        head = header_text(app)
        assert "1 unreadable record skipped" in head and f"run.jsonl:{lineno}" in head and "nested too deeply" in head


@aio
async def test_a_deeply_nested_step_line_appended_live_costs_that_line(tmp_path: Path) -> None:
    d = tmp_path / "run"
    write_synthetic_run(d, steps=10, moe=False)
    app = WatchApp(d, poll_interval=FAST)
    async with app.run_test(size=(160, 40)) as pilot:
        await loaded(pilot)
        with open(d / "run.jsonl", "ab") as fh:
            fh.write(deep_step(11))
        w = RunWriter(d)
        append_steps(w, [12], moe=False, samples_per_step=0, findings=False)
        w.close()
        assert await wait_for(pilot, lambda: app.model.store.n == 11, timeout=2.0)
        await still_running(pilot)
        assert list(app.model.store.steps[-2:]) == [10, 12]
        assert await wait_for(pilot, lambda: "1 unreadable record skipped" in header_text(app), timeout=2.0)
        assert "run.jsonl:" in header_text(app) and "nested too deeply" in header_text(app)


@aio
async def test_a_deeply_nested_sample_is_skipped_when_its_tab_opens(tmp_path: Path) -> None:
    d = tmp_path / "run"
    write_synthetic_run(d, steps=5, moe=False, samples_per_step=4)
    samples = d / "samples.rank0.jsonl"
    lines = samples.read_bytes().split(b"\n")
    bad = next(i for i, line in enumerate(lines, 1) if line.startswith(b'{"type":"sample","step":3,'))
    # Indexed as a sample of step 3 by its head; what makes it unreadable is deep inside.
    put_line(samples, bad, f'{{"type":"sample","step":3,"index":0,"rewards":{{"f":{nested(DEPTH)}}}}}'.encode())
    app = WatchApp(d, poll_interval=FAST)
    async with app.run_test(size=(160, 40)) as pilot:
        await loaded(pilot)
        await pilot.press("4")
        await pilot.pause()
        table = app.screen.query_one("#samples-table", DataTable)
        assert await wait_for(pilot, lambda: table.row_count == 19, timeout=2.0)
        await still_running(pilot)
        assert await wait_for(pilot, lambda: "1 unreadable record skipped" in header_text(app), timeout=2.0)
        assert f"samples.rank0.jsonl:{bad}" in header_text(app)


@aio
async def test_a_torn_line_in_the_middle_is_shown_with_its_place(tmp_path: Path) -> None:
    d = tmp_path / "run"
    write_synthetic_run(d, steps=20, moe=False)
    lineno = run_line_of_step(d, 9)
    line = (d / "run.jsonl").read_bytes().split(b"\n")[lineno - 1]
    put_line(d / "run.jsonl", lineno, line[: len(line) // 2])  # what a writer killed mid-line, then resumed, left
    app = WatchApp(d, poll_interval=FAST)
    async with app.run_test(size=(160, 40)) as pilot:
        await loaded(pilot)
        assert app.model.store.n == 19 and 9 not in app.model.store.steps
        head = header_text(app)
        assert "1 unreadable record skipped" in head and f"run.jsonl:{lineno}: corrupt record" in head
        assert f"run.jsonl:{lineno}" in screen_text(app)


@aio
async def test_a_write_failure_noted_in_the_log_is_shown(tmp_path: Path) -> None:
    d = tmp_path / "run"
    write_synthetic_run(d, steps=5, moe=False)
    note = {"type": "note", "step": 6, "level": "warning", "kind": "write_failed", "file": "run.jsonl",
            "error": "No space left on device", "disk_full": True, "lost": {"step": 4}, "first_step": 6,
            "last_step": 9, "ongoing": False, "final": False,
            "message": "the disk filled: 4 step records (steps 6-9) could not be written to run.jsonl"}
    with open(d / "run.jsonl", "a") as fh:
        fh.write(dumps(note) + "\n")
    app = WatchApp(d, poll_interval=FAST)
    async with app.run_test(size=(160, 40)) as pilot:
        await loaded(pilot)
        head = header_text(app)
        assert "1 warning" in head and "the disk filled: 4 step records (steps 6-9)" in head
