"""The dashboard, driven as a user drives it: a real Textual app through Pilot on recorded runs."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("textual")

from rich.console import Console  # noqa: E402
from textual.widgets import DataTable, Static, TextArea  # noqa: E402

from grpo_monitor.core.runlog_writer import RunWriter
from grpo_monitor.core.runlog import dumps  # noqa: E402
from grpo_monitor.app.dashboard import WatchApp  # noqa: E402
from grpo_monitor.app.dashboard.model import RunModel  # noqa: E402
from grpo_monitor.fixtures.dashboard_run import (  # noqa: E402
    FINDINGS,
    RECOMMENDATION,
    append_steps,
    header,
    step_record,
    write_synthetic_run,
)
from grpo_monitor.app.dashboard.tail import RunTailer  # noqa: E402
from grpo_monitor.app.dashboard.widgets.chart import Buckets, LineChart, braille, bucket_width, column_spans  # noqa: E402

aio = pytest.mark.asyncio
FAST = 0.05  # poll interval for tests: the app under test reacts within a frame or two


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    d = tmp_path / "run"
    write_synthetic_run(d, steps=50)
    return d


def screen_text(app) -> str:
    """What the terminal shows right now, as plain text."""
    console = Console(
        width=app.size.width, height=app.size.height, record=True, file=io.StringIO(),
        color_system=None, legacy_windows=False, force_terminal=True,
    )
    console.print(app.screen._compositor.render_update(full=True))
    return console.export_text()


def header_text(app) -> str:
    """The run header's text on one line, however the terminal wraps it."""
    return app.screen.query_one("#run-header", Static).visual.plain.replace("\n", " ")


async def wait_for(pilot, cond, timeout: float = 5.0) -> bool:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while loop.time() < end:
        if cond():
            return True
        await pilot.pause(0.02)
    return bool(cond())


async def loaded(pilot) -> None:
    assert await wait_for(pilot, pilot.app.caught_up.is_set, 20), "the recorded run never finished loading"
    await pilot.pause()


# -- following a run directory -------------------------------------------------------------


def test_tailer_holds_a_torn_line_until_its_newline(tmp_path: Path) -> None:
    d = tmp_path / "run"
    w = RunWriter(d)
    w.header(**header())
    tailer = RunTailer(d)
    assert [r["type"] for r in tailer.poll().records] == ["header"]
    line = (dumps(step_record(1)) + "\n").encode()
    with open(d / "run.jsonl", "ab") as fh:
        fh.write(line[:40])
    batch = tailer.poll()
    assert batch.records == [] and batch.warnings == []
    with open(d / "run.jsonl", "ab") as fh:
        fh.write(line[40:])
    (rec,) = tailer.poll().records
    assert rec["type"] == "step" and rec["step"] == 1 and rec["metrics"]["entropy"] == pytest.approx(
        step_record(1)["metrics"]["entropy"])


def test_tailer_waits_for_a_directory_that_appears_late(tmp_path: Path) -> None:
    d = tmp_path / "later" / "run"
    tailer = RunTailer(d)
    first = tailer.poll()
    assert first.records == [] and first.waiting_for is not None
    write_synthetic_run(d, steps=3)
    batch = tailer.poll()
    kinds = [r["type"] for r in batch.records]
    assert batch.waiting_for is None
    assert kinds.count("step") == 3 and kinds.count("sample") == 12 and kinds[0] == "header"


def test_tailer_follows_a_restart_into_its_child_run(tmp_path: Path) -> None:
    d = tmp_path / "run"
    w = RunWriter(d)
    w.header(**header())
    append_steps(w, range(1, 6), samples_per_step=0, findings=False)
    tailer = RunTailer(d)
    assert len(tailer.poll().records) == 6
    w.write({"type": "restart", "step": 5, "variant": "gspo", "config_overrides": {"importance_sampling_level": "sequence"},
             "resume_from": "checkpoint-4", "child_run": "segment-1"})
    assert [r["type"] for r in tailer.poll().records] == ["restart"]
    child = RunWriter(d / "segment-1")
    child.header(**header(segment=1, parent_run=str(d)))
    append_steps(child, range(5, 8), samples_per_step=2, findings=False)
    kinds = [r["type"] for r in tailer.poll().records]
    assert kinds.count("header") == 1 and kinds.count("step") == 3 and kinds.count("sample") == 6


def test_tailer_follows_a_lineage_past_its_second_restart(tmp_path: Path) -> None:
    # Segments are siblings under the lineage root: segment-1's restart names segment-2 beside it.
    d = tmp_path / "run"
    w = RunWriter(d)
    w.header(**header())
    append_steps(w, range(1, 4), samples_per_step=0, findings=False)
    w.write({"type": "restart", "step": 3, "variant": "dapo", "config_overrides": {}, "resume_from": None,
             "child_run": "segment-1"})
    first = RunWriter(d / "segment-1")
    first.header(**header(segment=1, parent_run="r0"))
    append_steps(first, range(3, 6), samples_per_step=0, findings=False)
    first.write({"type": "restart", "step": 5, "variant": "lower_learning_rate", "config_overrides": {},
                 "resume_from": None, "child_run": "segment-2"})
    second = RunWriter(d / "segment-2")
    second.header(**header(segment=2, parent_run="r1"))
    append_steps(second, range(5, 9), samples_per_step=0, findings=False)
    tailer = RunTailer(d)
    kinds = []
    for _ in range(4):
        kinds += [r["type"] for r in tailer.poll().records]
    assert tailer.dirs == [d, d / "segment-1", d / "segment-2"]
    assert kinds.count("header") == 3 and kinds.count("step") == 3 + 3 + 4


def test_model_rewinds_when_a_resumed_run_logs_steps_again() -> None:
    m = RunModel()
    m.ingest([{"type": "step", "step": s, "metrics": {"entropy": 1.0}} for s in range(1, 11)])
    m.ingest([{"type": "step", "step": s, "metrics": {"entropy": 2.0}} for s in range(7, 9)])
    assert m.store.steps.tolist() == [1, 2, 3, 4, 5, 6, 7, 8]
    assert m.store.column("entropy").tolist() == [1.0] * 6 + [2.0, 2.0]


def test_min_max_buckets_keep_a_single_spike_of_a_long_run() -> None:
    xs = np.arange(1, 100_001, dtype=float)
    ys = np.sin(xs / 5000.0)
    ys[61_234] = 40.0  # one step in 100k
    w = bucket_width(xs[-1] - xs[0], 140)
    b = Buckets(xs[0], w)
    b.update(xs, ys)
    assert len(b.ids) <= 141 and max(b.hi) == 40.0
    top, bot = column_spans(*b.arrays(), xs[0], xs[-1], -1.0, 40.0, 140, 32)
    assert top.min() == 0  # the spike reaches the top pixel row
    # Every column is lit: a continuous line, no holes.
    assert (top <= bot).all()
    cells = braille(top, bot, 8)
    assert cells.shape == (8, 70) and (cells[0] > 0).sum() >= 1


def test_incremental_buckets_equal_a_rebuild_and_coarsening() -> None:
    rng = np.random.default_rng(0)
    xs = np.arange(0, 5000, dtype=float)
    ys = rng.normal(size=xs.size)
    ys[rng.random(xs.size) < 0.1] = np.nan
    inc = Buckets(0.0, 16.0)
    for end in (1, 7, 500, 2048, 4999, 5000):
        inc.update(xs[:end], ys[:end])
    full = Buckets(0.0, 16.0)
    full.update(xs, ys)
    coarse = Buckets(0.0, 4.0)
    coarse.update(xs, ys)
    coarse = coarse.coarsen(4)
    for other in (full, coarse):
        assert inc.ids == other.ids
        np.testing.assert_allclose(inc.lo, other.lo)
        np.testing.assert_allclose(inc.hi, other.hi)
        np.testing.assert_allclose(inc.first, other.first)
        np.testing.assert_allclose(inc.last, other.last)
        assert inc.fx == other.fx and inc.lx == other.lx


# -- the app -------------------------------------------------------------------------------


@aio
async def test_app_loads_a_recorded_run_and_visits_every_tab(run_dir: Path) -> None:
    app = WatchApp(run_dir, poll_interval=FAST)
    async with app.run_test(size=(160, 48)) as pilot:
        await loaded(pilot)
        text = screen_text(app)
        assert "demo-run" in text and "Qwen3MoeForCausalLM" in text and "loss_type dapo" in text
        for name in ("entropy", "completion length", "reward", "frac_reward_zero_std", "kl", "clip_ratio",
                     "grad_norm", "┄cap 256", "correctness_reward"):
            assert name in text, name
        assert "◆" in text and "▲" in text  # both findings' onsets are marked on the charts
        tabs = app.screen.query_one("TabbedContent")

        await pilot.press("2")
        assert tabs.active == "detectors"
        await pilot.pause()
        board = app.screen.query_one("#board", DataTable)
        states = {str(board.get_row(k)[0]): str(board.get_row(k)[1]) for k in board.rows}
        assert states["entropy_collapse"] == "critical" and states["length_reward_coupling"] == "warning"
        assert states["no_learning_signal"] == "ok"
        findings = app.screen.query_one("#findings", DataTable)
        assert findings.row_count == 2
        shown = []
        for row in range(findings.row_count):
            findings.move_cursor(row=row)
            await pilot.pause()
            shown.append(app.screen.query_one("#finding-detail", Static).visual.plain)
        for f in FINDINGS:
            assert any(f["message"] in s and f["detector"] in s for s in shown)

        await pilot.press("tab")
        assert tabs.active == "recommendations"
        await pilot.pause()
        rec_text = app.screen.query_one("#rec-text", TextArea).text
        assert RECOMMENDATION["python"] in rec_text and RECOMMENDATION["cli_flags"] in rec_text
        assert "- loss_type='dapo'\n+ loss_type='dr_grpo'" in rec_text

        await pilot.press("4")
        assert tabs.active == "samples"
        await pilot.pause()
        assert app.screen.query_one("#samples-table", DataTable).row_count == 200

        await pilot.press("5")
        assert tabs.active == "moe"
        await pilot.pause()
        text = screen_text(app)
        assert "Expert load" in text and "e7" in text and "moe/flip_rate" in text and "aux_loss" in text
        await pilot.press("right_square_bracket")
        await pilot.pause()
        assert "(2/2)" in screen_text(app)

        await pilot.press("tab")  # wraps around to the first panel
        assert tabs.active == "overview"
        await pilot.press("shift+tab")
        assert tabs.active == "moe"


@aio
async def test_appended_records_show_within_a_second(run_dir: Path) -> None:
    app = WatchApp(run_dir, poll_interval=FAST)
    async with app.run_test(size=(120, 40)) as pilot:
        await loaded(pilot)
        chart = app.screen.query_one("#chart-entropy", LineChart)
        assert chart.rendered_n == 50
        w = RunWriter(run_dir)
        append_steps(w, [51], samples_per_step=4, findings=False)
        w.write({"type": "finding", **{**FINDINGS[0], "detector": "grad_spike_test", "step": 51, "onset_step": 51,
                                       "message": "A new finding at step 51."}})
        w.close()
        assert await wait_for(pilot, lambda: chart.rendered_n == 51, timeout=1.0)
        assert await wait_for(pilot, lambda: "step 51" in screen_text(app), timeout=1.0)
        assert "└1" in screen_text(app) and "51 " in screen_text(app)
        summary = app.screen.query_one("#findings-summary", Static)
        assert await wait_for(pilot, lambda: "A new finding at step 51." in summary.visual.plain, timeout=1.0)
        await pilot.press("2")
        await pilot.pause()
        assert app.screen.query_one("#findings", DataTable).row_count == 3
        assert "grad_spike_test" in screen_text(app)


@aio
async def test_a_torn_line_is_held_until_it_is_complete(run_dir: Path) -> None:
    app = WatchApp(run_dir, poll_interval=FAST)
    async with app.run_test(size=(120, 40)) as pilot:
        await loaded(pilot)
        line = (dumps(step_record(51)) + "\n").encode()
        with open(run_dir / "run.jsonl", "ab") as fh:
            fh.write(line[: len(line) // 2])
        await pilot.pause(0.3)  # several polls see the half line
        assert app.model.store.n == 50 and app.model.warnings == []
        with open(run_dir / "run.jsonl", "ab") as fh:
            fh.write(line[len(line) // 2 :])
        assert await wait_for(pilot, lambda: app.model.store.n == 51, timeout=1.0)
        assert app.model.warnings == [] and app.is_running


@aio
async def test_a_run_directory_that_appears_late_is_picked_up(tmp_path: Path) -> None:
    d = tmp_path / "not-yet"
    app = WatchApp(d, poll_interval=FAST)
    async with app.run_test(size=(100, 30)) as pilot:
        assert await wait_for(pilot, lambda: "waiting for" in screen_text(app), timeout=2.0)
        write_synthetic_run(d, steps=5)
        assert await wait_for(pilot, lambda: app.model.store.n == 5, timeout=2.0)
        assert await wait_for(pilot, lambda: "live" in screen_text(app), timeout=1.0)


@aio
async def test_a_restart_shows_the_new_segment(tmp_path: Path) -> None:
    d = tmp_path / "run"
    w = RunWriter(d)
    w.header(**header())
    append_steps(w, range(1, 11), samples_per_step=0, findings=False)
    app = WatchApp(d, poll_interval=FAST)
    async with app.run_test(size=(120, 30)) as pilot:
        await loaded(pilot)
        assert "seg 1 · 0 restarts" in screen_text(app)
        w.write({"type": "restart", "step": 10, "variant": "gspo", "config_overrides": {"loss_type": "grpo"},
                 "resume_from": None, "child_run": "segment-1"})
        child = RunWriter(d / "segment-1")
        h = header(segment=1, parent_run=str(d))  # the callback records the first restart as segment 1
        h["config"] = {**h["config"], "loss_type": "grpo", "importance_sampling_level": "sequence"}
        child.header(**h)
        append_steps(child, range(8, 14), samples_per_step=0, findings=False)  # resumed from step 7
        assert await wait_for(pilot, lambda: "seg 2 · 1 restart " in screen_text(app), timeout=2.0)
        text = screen_text(app)
        assert "loss_type grpo" in text and "IS sequence" in text and "step 13" in text
        assert app.model.store.steps.tolist() == list(range(1, 14))


@aio
async def test_segments_count_from_one_for_run_directories_and_replayed_logs(tmp_path: Path) -> None:
    # A run directory as the callback writes it: the root records segment 0, its first restart
    # segment-1/ records segment 1.
    d = tmp_path / "run"
    w = RunWriter(d)
    w.header(**header(moe=False))
    append_steps(w, range(1, 6), moe=False, samples_per_step=0, findings=False)
    w.write({"type": "restart", "step": 5, "variant": "dapo", "config_overrides": {}, "resume_from": None,
             "child_run": "segment-1"})
    w.close()
    app = WatchApp(d, poll_interval=FAST)
    async with app.run_test(size=(120, 30)) as pilot:
        # Until the child writes its log the dashboard waits for it, on the parent's segment.
        assert await wait_for(pilot, lambda: app.model.store.n == 5 and "seg 1 · 1 restart " in header_text(app))
        child = RunWriter(d / "segment-1")
        child.header(**header(moe=False, segment=1, parent_run="demo-run"))
        append_steps(child, range(5, 9), moe=False, samples_per_step=0, findings=False)
        child.close()
        assert await wait_for(pilot, lambda: "seg 2 · 1 restart " in header_text(app), timeout=3.0)
        assert "seg 0" not in header_text(app) and "seg 3" not in header_text(app)
    # A replayed log is one segment: the first.
    state = tmp_path / "trainer_state.json"
    state.write_text(json.dumps({"log_history": [{"step": s, "loss": 0.1, "reward": 0.5} for s in range(1, 6)]}))
    app = WatchApp(state, poll_interval=FAST)
    async with app.run_test(size=(120, 30)) as pilot:
        await loaded(pilot)
        assert "replayed" in header_text(app) and "seg 1 · 0 restarts" in header_text(app)
    # analyze's report numbers the same lineage the same way.
    from grpo_monitor.analysis.analyze import analyze
    from grpo_monitor.analysis.render import render_text

    text = render_text(analyze(d))
    heads = [line for line in text.splitlines() if line.startswith("== ")]
    assert len(heads) == 2, text
    assert heads[0].startswith(f"== {d}  (segment 1, run_dir") and heads[1].startswith(
        f"== {d / 'segment-1'}  (segment 2, run_dir"), heads
    single = tmp_path / "single"
    write_synthetic_run(single, steps=5, moe=False, samples_per_step=0, findings=False)
    assert render_text(analyze(single)).splitlines()[0] == f"== {single}  (run_dir, 5 logged steps, Qwen3ForCausalLM)"


@aio
async def test_kl_chart_says_it_is_not_logged_when_beta_is_zero(tmp_path: Path) -> None:
    def write(d: Path, beta: float) -> None:
        w = RunWriter(d)
        h = header(moe=False)
        h["config"] = {**h["config"], "beta": beta}
        w.header(**h)
        for s in range(1, 11):  # TRL logs no kl at all when beta is 0
            rec = step_record(s, moe=False)
            del rec["metrics"]["kl"]
            w.write(rec)
        w.close()

    write(tmp_path / "beta0", 0.0)
    write(tmp_path / "beta", 0.04)
    app = WatchApp(tmp_path / "beta0", poll_interval=FAST)
    async with app.run_test(size=(160, 48)) as pilot:
        await loaded(pilot)
        kl = app.screen.query_one("#chart-kl", LineChart)
        entropy = app.screen.query_one("#chart-entropy", LineChart)
        assert await wait_for(pilot, lambda: kl.rendered_n == 10 and entropy.rendered_n == 10)
        text = screen_text(app)
        assert "not logged (beta=0)" in text and "waiting for data" not in text
    # A live run with a KL penalty that has not logged kl yet is still waiting for it.
    app = WatchApp(tmp_path / "beta", poll_interval=FAST)
    async with app.run_test(size=(160, 48)) as pilot:
        await loaded(pilot)
        kl = app.screen.query_one("#chart-kl", LineChart)
        assert await wait_for(pilot, lambda: kl.rendered_n == 10)
        text = screen_text(app)
        assert "waiting for data…" in text and "not logged" not in text


@aio
async def test_enter_opens_the_selected_sample_in_full(tmp_path: Path) -> None:
    d = tmp_path / "run"
    long_completion = "<think>" + "\n".join(f"line {i}: counting on from three." for i in range(120)) + "</think>"
    write_synthetic_run(d, steps=3, moe=False, samples_per_step=2, findings=False,
                        completions=[long_completion, "<answer>7</answer>"])
    app = WatchApp(d, poll_interval=FAST)
    async with app.run_test(size=(100, 30)) as pilot:
        await loaded(pilot)
        await pilot.press("4")
        await pilot.pause()
        table = app.screen.query_one("#samples-table", DataTable)
        await pilot.press("down")
        await pilot.pause()
        row = table.cursor_row
        step, index = int(str(table.get_row_at(row)[0])), int(str(table.get_row_at(row)[1]))
        sample = next(s for s in app.model.samples if s["step"] == step and s["index"] == index)
        await pilot.press("enter")
        await pilot.pause()
        assert type(app.screen).__name__ == "SampleScreen"
        full = app.screen.query_one("#sample-full", Static).visual.plain
        assert sample["prompt"] in full and sample["completion"] in full
        numbers = (("length", f"{sample['length']} tokens"), ("truncated", "yes" if sample["truncated"] else "no"),
                   ("correct", "yes" if sample["correct"] else "no"))
        for name, value in numbers:
            assert any(line.split() == [name, *value.split()] for line in full.splitlines()), (name, full)
        for comp, value in sample["rewards"].items():
            assert any(line.split() == [comp, f"{value:.4g}"] for line in full.splitlines()), (comp, full)
        # The long one scrolls: its last line is below the fold until the user scrolls down.
        assert sample["completion"] == long_completion
        scroll = app.screen.query_one("#sample-full-scroll")
        assert "line 119" not in screen_text(app)
        await pilot.press("end")
        await pilot.pause()
        assert scroll.scroll_y > 0 and "line 119" in screen_text(app)
        await pilot.press("escape")
        await pilot.pause()
        assert type(app.screen).__name__ == "DashboardScreen"
        assert app.screen.query_one("TabbedContent").active == "samples"
        # Every row opens its own sample.
        await pilot.press("up", "enter")
        await pilot.pause()
        other = table.get_row_at(table.cursor_row)
        assert type(app.screen).__name__ == "SampleScreen"
        assert f"step      {other[0]}" in app.screen.query_one("#sample-full", Static).visual.plain
        await pilot.press("escape")


INJECTIONS = [
    "[bold red]x[/]",
    "[link=http://x]y[/link]",
    "\x1b[31mred\x1b[0m",
    "\x1b[2J\x1b[H",
    "[$accent]z[/]",
    "[@click=app.quit]q[/]",
]


@aio
async def test_markup_and_escape_sequences_in_completions_are_shown_verbatim(tmp_path: Path) -> None:
    d = tmp_path / "run"
    completion = " ".join(INJECTIONS)
    write_synthetic_run(d, steps=3, samples_per_step=1, completions=[completion], findings=False)
    shown = completion.replace("\x1b", "␛")
    app = WatchApp(d, poll_interval=FAST)
    async with app.run_test(size=(160, 40)) as pilot:
        await loaded(pilot)
        await pilot.press("4")
        await pilot.pause()
        detail = app.screen.query_one("#sample-detail", Static)
        assert shown in detail.visual.plain
        text = screen_text(app)
        for piece in ["[bold red]x[/]", "[link=http://x]y[/link]", "␛[31mred␛[0m", "␛[2J␛[H", "[$accent]z[/]",
                      "[@click=app.quit]q[/]"]:
            assert piece in text, piece
        assert "\x1b" not in text
        # The table cell shows the same characters (cut to the column width).
        table = app.screen.query_one("#samples-table", DataTable)
        cell = table.get_row_at(0)[7]
        assert str(cell).startswith("[bold red]x[/] [link=http://x]")
        # Clicking right on the text (where a live @click would quit the app) does nothing.
        lines = text.splitlines()
        y = next(i for i, line in enumerate(lines) if "[@click=app.quit]q[/]" in line)
        x = lines[y].index("[@click=app.quit]q[/]") + 1
        await pilot.click(offset=(x, y))
        await pilot.click(offset=(x + 17, y))
        await pilot.click("#samples-table", offset=(60, 1))
        await pilot.pause()
        assert app.is_running
        while type(app.screen).__name__ == "SampleScreen":  # a click on the highlighted row opens it
            await pilot.press("escape")
            await pilot.pause()
        await pilot.press("enter")
        await pilot.pause()
        assert app.is_running and type(app.screen).__name__ == "SampleScreen"
        full = screen_text(app)
        for piece in ["[bold red]x[/]", "␛[31mred␛[0m", "[@click=app.quit]q[/]"]:
            assert piece in full, piece
        assert "\x1b" not in full and shown in app.screen.query_one("#sample-full", Static).visual.plain


@aio
async def test_recommendation_copies_to_the_clipboard(run_dir: Path) -> None:
    app = WatchApp(run_dir, poll_interval=FAST)
    async with app.run_test(size=(100, 30)) as pilot:
        await loaded(pilot)
        await pilot.press("3", "c")
        assert app.clipboard == RECOMMENDATION["python"]
        await pilot.press("y")
        assert app.clipboard == RECOMMENDATION["cli_flags"]
        await pilot.click("#copy-python")
        assert app.clipboard == RECOMMENDATION["python"]
        assert "copied" in screen_text(app)


@aio
async def test_samples_filter_by_step_and_correctness(run_dir: Path) -> None:
    app = WatchApp(run_dir, poll_interval=FAST)
    async with app.run_test(size=(100, 30)) as pilot:
        await loaded(pilot)
        await pilot.press("4", "slash")
        await pilot.press(*"12 incorrect", "enter")
        await pilot.pause()
        table = app.screen.query_one("#samples-table", DataTable)
        expected = [s for s in app.model.samples if s["step"] == 12 and s["correct"] is False]
        assert 0 < len(expected) < 4 and table.row_count == len(expected)
        assert all(str(table.get_row_at(r)[0]) == "12" and str(table.get_row_at(r)[2]) == "✗"
                   for r in range(table.row_count))
        assert "filter: step 12, incorrect" in screen_text(app)
        await pilot.press("slash", *"\b" * 0)
        inp = app.screen.query_one("#sample-filter")
        inp.value = ""
        await pilot.press("enter")
        await pilot.pause()
        assert table.row_count == 200


@aio
async def test_theme_toggle_and_help_screen(run_dir: Path) -> None:
    app = WatchApp(run_dir, poll_interval=FAST)
    async with app.run_test(size=(80, 24)) as pilot:
        await loaded(pilot)
        start = app.theme
        await pilot.press("t")
        assert app.theme != start and "light" in app.theme
        await pilot.press("question_mark")
        await pilot.pause()
        assert type(app.screen).__name__ == "HelpScreen"
        assert "filter samples" in screen_text(app)
        await pilot.press("escape")
        await pilot.pause()
        assert type(app.screen).__name__ == "DashboardScreen"
        await pilot.press("q")
        await pilot.pause()
    assert not app.is_running


@aio
async def test_dense_run_has_no_moe_panel(tmp_path: Path) -> None:
    d = tmp_path / "dense"
    write_synthetic_run(d, steps=12, moe=False)
    app = WatchApp(d, poll_interval=FAST)
    async with app.run_test(size=(100, 30)) as pilot:
        await loaded(pilot)
        assert "MoE" not in screen_text(app)
        await pilot.press("5")
        assert app.screen.query_one("TabbedContent").active == "overview"


@aio
async def test_foreign_log_is_replayed_through_the_detectors(tmp_path: Path) -> None:
    sources = pytest.importorskip("grpo_monitor.readers")
    state = tmp_path / "trainer_state.json"
    history = [{"step": s, "loss": 0.1, "entropy": 0.5 - 0.004 * s, "completion_length": 20.0 + s,
                "rewards/format_reward": 0.5, "reward": 0.5, "grad_norm": 1.0} for s in range(1, 41)]
    state.write_text(json.dumps({"log_history": history, "global_step": 40}))
    assert sources.load_source(state).format == "trainer_state"
    app = WatchApp(state, poll_interval=FAST)
    async with app.run_test(size=(120, 30)) as pilot:
        await loaded(pilot)
        text = screen_text(app)
        assert app.model.store.n == 40 and "trainer_state" in text and "replayed" in text
        assert "format_reward" in text and "step 40" in text


@aio
async def test_unreadable_path_closes_the_app_with_one_line(tmp_path: Path) -> None:
    pytest.importorskip("grpo_monitor.readers")
    bad = tmp_path / "notes.txt"
    bad.write_text("hello\n")
    app = WatchApp(bad, poll_interval=FAST)
    async with app.run_test(size=(120, 30)) as pilot:
        assert await wait_for(pilot, lambda: not app.is_running, timeout=5.0)
    assert app.error is not None and "\n" not in app.error and "notes.txt" in app.error
    assert app.return_code == 2


@aio
async def test_unreadable_path_with_wait_is_reported_on_screen(tmp_path: Path) -> None:
    pytest.importorskip("grpo_monitor.readers")
    bad = tmp_path / "notes.txt"
    bad.write_text("hello\n")
    app = WatchApp(bad, poll_interval=FAST, wait=True)
    async with app.run_test(size=(120, 30)) as pilot:
        assert await wait_for(pilot, lambda: app.error is not None, timeout=5.0)
        assert "\n" not in app.error and "notes.txt" in app.error
        assert await wait_for(pilot, lambda: "cannot read" in screen_text(app), timeout=2.0)
        assert app.is_running


@aio
async def test_watch_on_an_output_dir_opens_the_run_directory_in_it(tmp_path: Path) -> None:
    # A Trainer output_dir: a checkpoint's trainer_state.json beside the live grpo-monitor run directory.
    import json

    from grpo_monitor.app.dashboard import run_path

    out = tmp_path / "outputs-grpo"
    (out / "checkpoint-2").mkdir(parents=True)
    (out / "checkpoint-2" / "trainer_state.json").write_text(
        json.dumps({"log_history": [{"step": s, "loss": 0.1, "reward": 0.5} for s in (1, 2)]}))
    w = RunWriter(out / "grpo-monitor")
    w.header(**header())
    append_steps(w, range(1, 8), samples_per_step=0, findings=False)
    assert run_path(out) == out / "grpo-monitor"
    assert run_path(out / "grpo-monitor") == out / "grpo-monitor" and run_path(tmp_path / "nope") == tmp_path / "nope"
    app = WatchApp(run_path(out), poll_interval=FAST)
    async with app.run_test(size=(120, 30)) as pilot:
        await loaded(pilot)
        assert app.model.store.steps.tolist() == list(range(1, 8)) and "replayed" not in header_text(app)


@aio
async def test_detectors_that_cannot_apply_to_a_run_read_not_applicable(tmp_path: Path) -> None:
    # A dense model without vLLM: MoE instability records "ok" and the rollout mismatch "warming_up" for good.
    d = tmp_path / "run"
    w = RunWriter(d)
    w.header(**header(moe=False))
    for s in range(1, 6):
        w.write({"type": "step", "step": s, "time": 1.0 + s,
                 "metrics": {"reward": 0.5, "entropy": 0.4, "completions/mean_length": 20.0},
                 "detectors": {"moe_instability": "ok", "rollout_mismatch": "warming_up", "entropy_collapse": "ok"}})
    w.close()
    app = WatchApp(d, poll_interval=FAST)
    async with app.run_test(size=(140, 40)) as pilot:
        await loaded(pilot)
        await pilot.press("2")
        await pilot.pause()
        board = app.screen.query_one("#board", DataTable)
        states = {str(board.get_row(k)[0]): str(board.get_row(k)[1]) for k in board.rows}
        assert states["moe_instability"] == "not applicable" and states["rollout_mismatch"] == "not applicable"
        assert states["entropy_collapse"] != "not applicable"


def test_check_path_names_the_path_and_the_fault(tmp_path: Path) -> None:
    from grpo_monitor.app.dashboard import check_path

    missing = tmp_path / "typo"
    assert "no such file or directory" in check_path(missing) and str(missing) in check_path(missing)
    assert check_path(missing, wait=True) is None
    garbage = tmp_path / "x.bin"
    garbage.write_bytes(b"\x00\x01\x02" * 100)
    assert check_path(garbage).startswith(f"{garbage}: not a run this tool reads")
    fake = tmp_path / "fake"
    (fake / "run.jsonl").mkdir(parents=True)
    assert "not a run this tool reads" in check_path(fake / "run.jsonl")
    starting = tmp_path / "starting"
    starting.mkdir()
    assert "folder holds nothing readable" in check_path(starting) and check_path(starting, wait=True) is None
    (starting / "samples.rank0.jsonl").write_text("")
    assert check_path(starting) is None  # a run whose log has no header yet
    (starting / "run.jsonl").write_text("")
    assert check_path(starting) is None
    (starting / "run.jsonl").write_text('{"type": "header", "schema": 1')  # the header being written
    assert check_path(starting) is None
    project = tmp_path / "project"
    project.mkdir()
    (project / "README.md").write_text("# my project\n")
    assert "not a run this tool reads" in check_path(project)
