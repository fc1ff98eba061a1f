"""``grpo-monitor watch --wait OUTPUT_DIR`` started before training: the dashboard finds the run directory
``attach(trainer)`` writes inside the output_dir (``<output_dir>/grpo-monitor/``) and follows it to the end."""

from __future__ import annotations

import asyncio
import warnings
from pathlib import Path

import pytest

pytest.importorskip("textual")
pytest.importorskip("trl")

from textual.widgets import Static  # noqa: E402

from grpo_monitor.app.dashboard import WatchApp  # noqa: E402
from grpo_monitor.app.dashboard.tail import RunTailer  # noqa: E402
from grpo_monitor.core.runlog_writer import RunWriter  # noqa: E402

STEPS = 4


def _train_as_the_readme_does(output_dir: Path) -> None:
    import transformers

    from grpo_monitor.app.demo import build_trainer, demo_config
    from grpo_monitor.callbacks import attach

    transformers.logging.set_verbosity_error()
    warnings.filterwarnings("ignore", category=FutureWarning)
    trainer = build_trainer(demo_config(output_dir, STEPS, disable_tqdm=True))
    attach(trainer)  # the README's snippet: the run log goes to <output_dir>/grpo-monitor
    trainer.train()


def _header(app: WatchApp) -> str:
    return app.screen.query_one("#run-header", Static).visual.plain.replace("\n", " ")


def test_a_tailer_on_an_output_dir_follows_the_run_directory_that_appears_in_it(tmp_path: Path) -> None:
    out = tmp_path / "outputs-grpo"
    tailer = RunTailer(out, find_run=True)
    assert tailer.poll().waiting_for == str(out)
    RunWriter(out / "grpo-monitor").header(run_id="r", config={})
    (out / "checkpoint-1").mkdir()
    tailer._looked = float("-inf")  # no need to wait out the search's pace here
    batch = tailer.poll()
    assert tailer.root == out / "grpo-monitor" and [r["type"] for r in batch.records] == ["header"]


@pytest.mark.asyncio
async def test_watch_wait_on_an_output_dir_follows_the_real_run_attach_writes_inside_it(tmp_path: Path) -> None:
    out = tmp_path / "outputs-grpo"
    app = WatchApp(out, poll_interval=0.05, wait=True)
    async with app.run_test(size=(140, 40)) as pilot:
        loop = asyncio.get_running_loop()
        end = loop.time() + 10
        while "waiting for" not in app.status and loop.time() < end:
            await pilot.pause(0.05)
        assert "waiting for" in app.status
        await asyncio.to_thread(_train_as_the_readme_does, out)
        end = loop.time() + 30
        while not (app.status == "finished" and app.model.store.n >= STEPS) and loop.time() < end:
            await pilot.pause(0.05)
        assert app.model.store.n == STEPS and app.status == "finished", (app.status, app.model.store.n)
        assert "waiting for" not in _header(app) and app.path == out / "grpo-monitor"
