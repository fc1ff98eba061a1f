"""Dashboard redraw latency with a 100k-step run loaded.

Loads a 100k-step recorded run (dense model, every TRL 1.16 metric the overview charts, the
detector map on every step) into the dashboard in a headless Textual app at 160×48 with the
overview on screen (seven charts and the findings list visible), then, about 20 times, posts one
new step record the way the file follower does and measures the time from posting it to the
moment the last visible chart finished redrawing with it. Target: median ≤ 50 ms. Results go to
the ``tui_redraw`` section of benchmarks/RESULTS.md.

    python benchmarks/tui_redraw.py                    # the full measurement
    python benchmarks/tui_redraw.py --steps 5000 --no-results   # a quick look
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.results import stamp, update_section  # noqa: E402
from grpo_monitor.core.runlog_writer import RunWriter  # noqa: E402
from grpo_monitor.fixtures.dashboard_run import FINDINGS, RECOMMENDATION, header, step_record  # noqa: E402

TARGET_MS = 50.0


def write_run(path: Path, steps: int) -> None:
    w = RunWriter(path)
    w.header(**header(moe=False, run_id="bench-100k"))
    chunk = []
    for s in range(1, steps + 1):
        chunk.append(step_record(s, moe=False))
        for f in FINDINGS:
            if f["step"] == s:
                chunk.append({"type": "finding", **f})
        if s == RECOMMENDATION["step"]:
            chunk.append({"type": "recommendation", **RECOMMENDATION})
        if len(chunk) >= 2000:
            w.write(*chunk)
            chunk = []
    w.write(*chunk)
    w.close()


async def measure(run: Path, steps: int, appends: int, size: tuple[int, int]) -> dict:
    from grpo_monitor.app.dashboard.app import WatchApp
    from grpo_monitor.app.dashboard.messages import RecordsArrived
    from grpo_monitor.app.dashboard.widgets.chart import LineChart

    app = WatchApp(run, poll_interval=0.2)
    t_start = time.perf_counter()
    async with app.run_test(size=size) as pilot:
        while not app.caught_up.is_set():
            await asyncio.sleep(0.05)
        visible = list(app.screen.query("#overview-panel LineChart").results(LineChart))

        async def drawn(n: int, timeout: float = 10.0) -> None:
            end = time.perf_counter() + timeout
            while time.perf_counter() < end:
                if all(c.rendered_n == n for c in visible):
                    return
                await asyncio.sleep(0.0005)
            raise TimeoutError(f"charts did not redraw to {n} rows")

        await drawn(app.model.store.n, 60)
        load_s = time.perf_counter() - t_start
        await pilot.pause(0.2)
        times = []
        for i in range(appends):
            n = app.model.store.n
            rec = step_record(steps + i + 1, moe=False)
            t0 = time.perf_counter()
            app.post_message(RecordsArrived([rec]))
            await drawn(n + 1)
            times.append((max(c.rendered_at for c in visible) - t0) * 1000)
            await pilot.pause(0.05)  # let the frame settle, as between two real logging steps
        return {"times": times, "load_s": load_s, "charts": len(visible), "rows": app.model.store.n}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--appends", type=int, default=20)
    ap.add_argument("--no-results", action="store_true", help="print only; leave RESULTS.md alone")
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        t = time.perf_counter()
        write_run(run, args.steps)
        write_s = time.perf_counter() - t
        size_mb = (run / "run.jsonl").stat().st_size / 1e6
        r = asyncio.run(measure(run, args.steps, args.appends, (160, 48)))

    times = sorted(r["times"])
    med = statistics.median(times)
    p90 = times[min(len(times) - 1, int(round(0.9 * (len(times) - 1))))]
    ok = med <= TARGET_MS
    print(f"{args.steps} steps ({size_mb:.0f} MB run.jsonl, written in {write_s:.1f} s); loaded and drawn in "
          f"{r['load_s']:.1f} s; {r['charts']} charts on screen")
    print(f"append → redrawn: median {med:.1f} ms, p90 {p90:.1f} ms, max {times[-1]:.1f} ms over {len(times)} appends "
          f"(target ≤ {TARGET_MS:.0f} ms: {'met' if ok else 'NOT met'})")
    if not args.no_results:
        body = f"""## Dashboard redraw (`benchmarks/tui_redraw.py`)

{stamp()}

A {args.steps:,}-step recorded run ({size_mb:.0f} MB `run.jsonl`, every step with the TRL 1.16 metric set and
the detector map) open in the dashboard, headless at 160×48 on the overview ({r['charts']} charts on screen).
One step record is posted as the file follower posts it; the time runs until the last visible chart has
redrawn with it. {len(times)} appends.

| | |
|---|---|
| **median append → redrawn** | **{med:.1f} ms** (target ≤ {TARGET_MS:.0f} ms: {'met' if ok else 'NOT met'}) |
| p90 / max | {p90:.1f} ms / {times[-1]:.1f} ms |
| initial load and first draw of the whole run | {r['load_s']:.1f} s |

Each chart keeps per-series min/max buckets of a power-of-two width and only updates the last bucket per
append, so a redraw costs O(chart width), not O(history). The figure includes Textual's frame pacing
(at most 60 frames a second).
"""
        update_section("tui_redraw", body)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
