"""Per-step cost of the detector suite, detector by detector.

On the stationary healthy stream of ``benchmarks/detection.py`` (``measure_cost``), the median time of
one ``Engine.update`` with every detector, and of each detector's ``update`` alone, at 1k steps of
history and at ``--history`` steps, with metrics only and with a 32-completion sample batch. Inside
each measured stretch a seeded coin sends each step either through ``Engine.update`` (timed whole) or
through each detector in turn (each timed alone), so every detector still sees every step (a coin, not
odd and even steps: detectors that do extra work every 4th or 64th point would land on one side). A
detector timed alone goes through its own ``update``, exactly what ``Engine.update`` calls for it. The
engine's own share (its loop, fault isolation, the annotators, findings bookkeeping) is the whole update's
mean less the detectors' means (means add up, medians do not: a detector that does extra work every few
steps moves the whole update's median more than its own). Means drop the slowest 1% of steps (the
machine's other work). The cost of reading the clock is measured and taken
off every figure.

    python benchmarks/detector_cost.py [--history 100000] [--only id,id] [--window 1000]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from grpo_monitor.detectors import ALL_DETECTORS
from grpo_monitor.fixtures.synthetic import generate
from grpo_monitor.core.engine import Engine


def _timer_floor(n: int = 20_000) -> float:
    pc = time.perf_counter
    xs = []
    for _ in range(n):
        t0 = pc()
        xs.append(pc() - t0)
    return statistics.median(xs)


def _trimmed_mean(xs: list[float]) -> float:
    s = sorted(xs)
    s = s[: max(1, len(s) - len(s) // 100)]
    return sum(s) / len(s)


def stationary_stream(n: int):
    """A long healthy stream: the settled part of a healthy run, tiled, with fresh step numbers."""
    run = generate("healthy_fast_drop", seed=0, logging_steps=1)
    body = [m for s, m in run.steps if s > 100]
    batch = run.samples[run.steps[-1][0]]
    for i in range(n):
        yield i + 1, body[i % len(body)], batch


def measure(history: int, only: set[str] | None = None, window: int = 1000, with_samples: bool = False) -> dict[str, Any]:
    """Medians (µs) over ``window`` steps starting at step 1000 and ending at ``history``:
    ``{"early"|"late": {"engine": µs, "detectors": {id: µs}, "means": {id: µs}, "engine_mean": µs, "overhead": µs}}``."""
    ctx = generate("healthy_fast_drop", seed=0, logging_steps=1, with_samples=False).context
    classes = [c for c in ALL_DETECTORS if only is None or c.id in only]
    floor = _timer_floor()
    stretches = {"early": (1000, 1000 + window), "late": (max(history - window, 1000 + window), max(history, 1000 + 2 * window))}
    out: dict[str, Any] = {}
    for name, (lo, hi) in stretches.items():
        engine = Engine(ctx, [c() for c in classes])
        update = engine.update
        total: list[float] = []
        per: dict[str, list[float]] = {d.id: [] for d in engine.detectors}
        pc = time.perf_counter
        coin = random.Random(0).random
        for step, metrics, batch in stationary_stream(hi):
            if step < lo:
                update(step, metrics, ())
                continue
            samples = batch if with_samples else ()
            if coin() < 0.5:
                t0 = pc()
                update(step, metrics, samples)
                total.append(pc() - t0)
            else:
                for d in engine.detectors:
                    if d.id in engine.disabled:
                        continue
                    t0 = pc()
                    d.update(step, metrics, samples)
                    per[d.id].append(pc() - t0)
        med = {k: max(statistics.median(v) - floor, 0.0) * 1e6 for k, v in per.items() if v}
        means = {k: max(_trimmed_mean(v) - floor, 0.0) * 1e6 for k, v in per.items() if v}
        whole = max(statistics.median(total) - floor, 0.0) * 1e6
        whole_mean = max(_trimmed_mean(total) - floor, 0.0) * 1e6
        out[name] = {"engine": whole, "detectors": med, "means": means, "engine_mean": whole_mean,
                     "overhead": whole_mean - sum(means.values()), "from_step": lo, "to_step": hi}
    return out


def render(history: int, results: dict[str, dict[str, Any]]) -> str:
    cols = [(mode, name) for mode in ("metrics", "samples") for name in ("early", "late")]
    late_at = results["metrics"]["late"]["to_step"]
    head = ["metrics only, 1k", f"metrics only, {late_at:,}", "+ 32 samples, 1k", f"+ 32 samples, {late_at:,}"]
    lines = ["| detector | " + " | ".join(head) + " |", "|---|" + "---|" * len(head)]
    ids = list(results["metrics"]["early"]["detectors"])
    order = sorted(ids, key=lambda i: -results["metrics"]["late"]["detectors"].get(i, 0.0))
    for i in order:
        cells = [f"{results[m][n]['detectors'].get(i, 0.0):.2f} ({results[m][n]['means'].get(i, 0.0):.2f})" for m, n in cols]
        lines.append(f"| {i} | " + " | ".join(cells) + " |")
    lines.append("| sum of detectors | " + " | ".join(
        f"{sum(results[m][n]['detectors'].values()):.2f} ({sum(results[m][n]['means'].values()):.2f})" for m, n in cols) + " |")
    lines.append("| engine's own share (from the means) | " + " | ".join(f"({results[m][n]['overhead']:.2f})" for m, n in cols) + " |")
    lines.append("| **Engine.update, whole** | " + " | ".join(
        f"**{results[m][n]['engine']:.2f}** ({results[m][n]['engine_mean']:.2f})" for m, n in cols) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--history", type=int, default=100_000, help="steps of history at the late measurement")
    ap.add_argument("--only", default="", help="comma-separated detector ids (default: every detector)")
    ap.add_argument("--window", type=int, default=1000, help="steps timed at each point")
    args = ap.parse_args(argv)
    only = {s.strip() for s in args.only.split(",") if s.strip()} or None
    known = {c.id for c in ALL_DETECTORS}
    if only and only - known:
        print(f"detector_cost: unknown detector id(s): {', '.join(sorted(only - known))} (known: {', '.join(sorted(known))})",
              file=sys.stderr)
        return 2
    if args.history < 1 or args.window < 2:
        print("detector_cost: --history must be >= 1 and --window >= 2", file=sys.stderr)
        return 2
    t0 = time.time()
    results = {"metrics": measure(args.history, only, args.window), "samples": measure(args.history, only, args.window, True)}
    print(f"µs per step, median (trimmed mean), clock cost taken off; {args.window} steps timed at each point "
          f"on the stationary stream of benchmarks/detection.py:\n")
    print(render(args.history, results))
    print(f"({time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
