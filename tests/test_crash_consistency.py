"""SIGKILL the run-log writer at random points: every run stays readable, every complete record is kept."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from grpo_monitor.core.runlog import read_run

ROOT = Path(__file__).resolve().parents[1]
KILLS = 200
KILLS_PER_RUN = 5

# Appends records as fast as it can, each carrying values derived from its step, so a record that
# survives can be checked whole. It resumes after the last step on disk, like a resumed run.
WRITER = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    from grpo_monitor.core.runlog_writer import RunWriter
    from grpo_monitor.core.runlog import read_run, RUN_FILE
    import os
    run_dir = sys.argv[1]
    start = 0
    if os.path.exists(os.path.join(run_dir, RUN_FILE)):
        start = max([r["step"] for r in read_run(run_dir).steps], default=0)
    w = RunWriter(run_dir)
    if start == 0:
        w.header(run_id="crash", config={{}}, model={{}})
    sys.stdout.write("ready\\n"); sys.stdout.flush()
    step = start
    while True:
        step += 1
        w.step(step, {{"entropy": step * 0.5, "reward": -step, "note_" + "x" * (step % 50): 1.0}}, time=float(step))
        w.samples([{{"step": step, "rank": 0, "index": i, "group": 0, "length": step + i, "truncated": False,
                     "rewards": {{"f": float(i)}}, "correct": None, "prompt": "p" * (i * 37 % 400),
                     "completion": "c" * (step % 97)}} for i in range(8)])
""")


def check(run_dir: Path) -> int:
    log = read_run(run_dir)
    steps = [r["step"] for r in log.steps]
    assert steps == list(range(1, len(steps) + 1)), "a complete step record was lost"
    for r in log.steps:
        assert r["metrics"]["entropy"] == r["step"] * 0.5 and r["metrics"]["reward"] == -r["step"]
    by_step = log.samples_by_step()
    for s, batch in by_step.items():
        assert len(batch) <= 8 and all(x["length"] == s + x["index"] for x in batch)
    return len(steps)


def test_sigkill_at_random_points_never_loses_a_complete_record(tmp_path):
    script = tmp_path / "writer.py"
    script.write_text(WRITER.format(root=str(ROOT)))
    rng = random.Random(1234)
    done = 0
    deadline = time.time() + 600
    progress = 0
    # Several runs, each killed and resumed a few times: every resume starts from a torn tail.
    for run in range(KILLS // KILLS_PER_RUN):
        run_dir = tmp_path / f"run{run}"
        last = 0
        for _ in range(KILLS_PER_RUN):
            assert time.time() < deadline, f"only {done} kills in the time bound"
            proc = subprocess.Popen([sys.executable, str(script), str(run_dir)], stdout=subprocess.PIPE)
            assert proc.stdout.readline() == b"ready\n"
            time.sleep(rng.uniform(0, 0.02))
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            n = check(run_dir)
            assert n >= last  # what was kept stays kept
            last = n
            done += 1
        progress += last
    assert done == KILLS
    assert progress > 0  # the writer did make progress between kills


@pytest.mark.asyncio
async def test_dashboard_opens_a_run_killed_mid_write(tmp_path):
    textual = pytest.importorskip("textual")  # noqa: F841
    script = tmp_path / "writer.py"
    script.write_text(WRITER.format(root=str(ROOT)))
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, str(script), str(run_dir)], stdout=subprocess.PIPE)
    proc.stdout.readline()
    time.sleep(0.3)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    n = check(run_dir)
    from grpo_monitor.app.dashboard import WatchApp

    app = WatchApp(str(run_dir))
    async with app.run_test(size=(120, 40)) as pilot:
        for _ in range(100):
            await pilot.pause(0.05)
            if app.caught_up.is_set() and len(app.model.store.steps) >= n:
                break
        assert list(app.model.store.steps) == list(range(1, n + 1))
        assert app.error is None
