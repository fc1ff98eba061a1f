"""The readers on a production-scale run: `grpo-monitor watch` and `grpo-monitor analyze` on 300 steps
x 8,192 completions written through `benchmarks/scale.py` (the L shape, default sample retention).

Each measurement runs in its own process, so its peak RSS is its own:

- watch: the real dashboard (`WatchApp`) driven headless through Textual's `run_test`/Pilot. Times
  from process start (imports included) to the first screen (the overview chart drawn with every
  step), to everything on disk indexed, and then, for several steps across the run, from asking
  for a step's samples (the samples panel filtered to that step) to its rows on screen.
- analyze: `python -m grpo_monitor analyze RUN`, wall time and peak RSS.

    python benchmarks/scale.py --shapes L --ranks 1 --steps 300 --keep-run /tmp/scale-L-run
    python benchmarks/scale_readers.py /tmp/scale-L-run
"""

from __future__ import annotations

import time

T0 = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TARGETS = {"first_screen_s": 3.0, "step_samples_s": 1.0, "watch_rss_mb": 1024, "analyze_s": 60.0, "analyze_rss_mb": 2048}


def peak_rss_mb(who: int = resource.RUSAGE_SELF) -> float:
    return resource.getrusage(who).ru_maxrss / 1024  # kB on Linux


def watch_child(run: str) -> None:
    import asyncio

    from textual.widgets import DataTable

    from grpo_monitor.core.runlog import read_run
    from grpo_monitor.app.dashboard import WatchApp
    from grpo_monitor.app.dashboard.widgets.chart import LineChart

    n_steps = len(read_run(run, samples=False).steps)
    out: dict[str, float | list[float]] = {}

    async def main() -> None:
        app = WatchApp(run, poll_interval=0.2)
        async with app.run_test(size=(160, 48)) as pilot:
            while True:
                try:
                    chart = app.screen.query_one("#chart-entropy", LineChart)
                except Exception:
                    chart = None
                if chart is not None and chart.rendered_n >= n_steps:
                    break
                await pilot.pause(0.01)
            out["first_screen_s"] = time.perf_counter() - T0
            while not app.caught_up.is_set():
                await pilot.pause(0.02)
            out["caught_up_s"] = time.perf_counter() - T0
            await pilot.press("4")
            await pilot.pause()
            table = app.screen.query_one("#samples-table", DataTable)
            times = []
            steps = app.model.sample_steps()
            picks = [steps[0], steps[len(steps) // 3], steps[len(steps) // 2], steps[-2], steps[7], steps[-1]]
            for step in picks:
                t = time.perf_counter()
                app.screen.query_one("#samples-panel").set_filter(str(step))
                while not (table.row_count and str(table.get_row_at(0)[0]) == str(step)):
                    await pilot.pause(0.005)
                times.append(time.perf_counter() - t)
            out["step_samples_s"] = times
            out["steps_picked"] = picks
            out["rows_shown"] = table.row_count
            out["samples_indexed"] = app.model.sample_count

    asyncio.run(main())
    out["rss_mb"] = peak_rss_mb()
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", nargs="?", default="/tmp/scale-L-run")
    ap.add_argument("--no-results", action="store_true")
    ap.add_argument("--watch-child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.watch_child:
        watch_child(a.run)
        return
    run = Path(a.run)
    size = sum(p.stat().st_size for p in run.iterdir() if p.is_file())
    n_samples = sum(1 for p in run.glob("samples.rank*.jsonl") for _ in open(p, "rb"))
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "grpo_monitor", "analyze", str(run)], capture_output=True, text=True, cwd=ROOT)
    analyze_s = time.perf_counter() - t
    analyze_rss = peak_rss_mb(resource.RUSAGE_CHILDREN)  # the only child so far: analyze
    if proc.returncode not in (0, 1):
        raise SystemExit(f"analyze failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    analyze_out = proc.stdout
    proc = subprocess.run([sys.executable, __file__, str(run), "--watch-child"], capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"watch failed:\n{proc.stderr[-3000:]}")
    watch = json.loads(proc.stdout.strip().splitlines()[-1])
    res = {"run_bytes": size, "samples": n_samples, **watch, "analyze_s": analyze_s, "analyze_rss_mb": analyze_rss,
           "analyze_head": analyze_out.splitlines()[:12]}
    print(json.dumps(res, indent=1))
    from benchmarks.results import stamp, update_section

    worst = max(watch["step_samples_s"])
    body = "\n".join([
        "## Readers at production scale (`benchmarks/scale_readers.py`)",
        "",
        stamp(),
        "",
        f"The run `benchmarks/scale.py` writes for the L shape: {len(watch['steps_picked'])} steps probed, "
        f"{n_samples:,} sample records, {size / 1e6:.0f} MB on disk. Each reader in its own process; times "
        "from process start, imports included.",
        "",
        "| measure | value | target |",
        "|---|---|---|",
        f"| `watch`: first screen (overview with every step) | {watch['first_screen_s']:.2f} s | ≤ {TARGETS['first_screen_s']:.0f} s |",
        f"| `watch`: every samples file indexed | {watch['caught_up_s']:.2f} s | — |",
        f"| `watch`: a step's samples on screen (worst of steps {', '.join(map(str, watch['steps_picked']))}) | "
        f"{worst:.2f} s (each: {', '.join(f'{x:.2f}' for x in watch['step_samples_s'])}) | ≤ {TARGETS['step_samples_s']:.0f} s |",
        f"| `watch`: peak RSS | {watch['rss_mb']:.0f} MB | ≤ {TARGETS['watch_rss_mb']} MB |",
        f"| `analyze`: wall time | {analyze_s:.1f} s | ≤ {TARGETS['analyze_s']:.0f} s |",
        f"| `analyze`: peak RSS | {analyze_rss:.0f} MB | ≤ {TARGETS['analyze_rss_mb']} MB |",
    ])
    print(body)
    if not a.no_results:
        update_section("scale_readers", body)


if __name__ == "__main__":
    main()
