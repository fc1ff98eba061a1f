"""Backtest of the time-to-failure forecast: how often each trend's stated interval held.

Every labelled case is replayed causally through the session every driver uses (``core.session``), with the
forecast's gate off so that every forecast the fit would make is kept: each warning/critical finding's forecast
is made from the points up to the finding's step only. For each one the backtest records its trend (the series
and its limit: ``core.forecast.TARGETS``) and horizon (the steps to the limit it states, bucketed as
``core.forecast.horizon_bucket``), and whether the interval held: the series reached its limit (the median of
a point and its two neighbours past it) within the stated steps (a log every k steps sees the crossing up to k
steps late). A forecast whose range runs past the end of the logged run with the limit not reached is
*censored*: it counts as not held (the run gives no evidence that it held).

The cases: every synthetic case (``fixtures.synthetic``) at ``logging_steps`` 1 and 10 over ``--seeds``
seeds; the labelled runs in ``../shared/labelled-runs`` (``logs`` and ``notebooks``) and ``../shared/real-runs``
(with ``wild``); and ``benchmarks/real_runs/collected`` and ``made``. These are the calibration set the gate
(``core.forecast.GATE``) is read from. ``collected_held_out`` and ``made_held_out`` are reported apart and
never feed the gate.

    python benchmarks/forecast_backtest.py [--seeds 3] [--no-write]

writes the section ``forecast_backtest`` of RESULTS.md and prints the ``GATE`` table to paste into ``core.forecast``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from multiprocessing import Pool
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.results import stamp, update_section
from grpo_monitor.core.forecast import BUCKETS, GATE, MIN_CASES, MIN_HELD, TARGETS, Forecaster, horizon_bucket
from grpo_monitor.core.session import open_session
from grpo_monitor.fixtures.judge import case_path

SHARED = Path(os.environ.get("GRPO_MONITOR_SHARED") or ROOT.parent / "shared")
CALIBRATION = (SHARED / "labelled-runs" / "logs", SHARED / "labelled-runs" / "notebooks", SHARED / "real-runs",
               SHARED / "real-runs" / "wild", ROOT / "benchmarks" / "real_runs" / "collected",
               ROOT / "benchmarks" / "real_runs" / "made")
HELD_OUT = (ROOT / "benchmarks" / "real_runs" / "collected_held_out", ROOT / "benchmarks" / "real_runs" / "made_held_out")
ALARM = ("warning", "critical")
DIRECTION = {t.metric: t.direction for t in TARGETS}


def first_crossing(steps: list, metric: str, limit: float, direction: str, after: int) -> int | None:
    """The first logged step after ``after`` where the median of the point and its two neighbours is past ``limit``."""
    pts = [(s, m.get(metric)) for s, m in steps if s >= after and isinstance(m.get(metric), (int, float))]
    for i in range(1, len(pts) - 1):
        v = sorted(x for _, x in pts[i - 1:i + 2])[1]
        if pts[i][0] > after and ((v >= limit) if direction == "up" else (v <= limit)):
            return pts[i][0]
    return None


def replay(name: str, context: Any, steps: list, samples: dict, gap: float, band: bool = True) -> list[dict]:
    """Every forecast the ungated fit puts on the session's warning/critical findings, each judged; ``band``:
    the interval as shipped (the slope's and the points' scatter), else the slope's alone."""
    session = open_session(context)
    eng = session.engine
    eng.annotators = [Forecaster(gated=False, noise_band=band) if isinstance(a, Forecaster) else a for a in eng.annotators]
    for a in eng.annotators:
        a.start(context)
    for step, metrics in steps:
        session.update(step, metrics, samples.get(step, []))
    last = steps[-1][0] if steps else 0
    rows = []
    for f in session.findings:
        fc = f.evidence.get("forecast")
        if f.severity not in ALARM or not fc:
            continue
        lo, hi = fc["at_steps"]
        crossed = first_crossing(steps, fc["metric"], fc["limit"], DIRECTION[fc["metric"]], f.step)
        held = crossed is not None and lo <= crossed < hi + max(gap, 1.0)
        rows.append({"case": name, "detector": f.detector, "step": f.step, "metric": fc["metric"],
                     "bucket": horizon_bucket(fc["steps_to_limit"]), "lo": lo, "hi": hi, "crossed": crossed,
                     "held": held, "censored": crossed is None and last < hi})
    return rows


def synthetic_case(args: tuple[str, int, int, bool]) -> list[dict]:
    from grpo_monitor.fixtures.synthetic import generate

    name, seed, ls, band = args
    run = generate(name, seed=seed, logging_steps=ls)
    return replay(f"{name}/ls{ls}/s{seed}", run.context, run.steps, run.samples, ls, band)


def real_case(args: tuple[str, str, bool]) -> list[dict] | str:
    from grpo_monitor.readers import load_source

    name, path, band = args
    try:
        src = load_source(path)
    except Exception as exc:  # an unreadable run is counted, not fatal to the backtest
        return f"{name}: {str(exc).splitlines()[0][:120]}"
    steps = list(src.steps)
    if not steps:
        return f"{name}: no steps"
    xs = [s for s, _ in steps]
    gap = (xs[-1] - xs[0]) / max(len(xs) - 1, 1) if len(xs) > 1 else 1.0
    return replay(name, src.context, steps, src.samples or {}, gap, band)


def real_jobs(folders: tuple[Path, ...]) -> list[tuple[str, str]]:
    jobs = []
    for root in folders:
        labels = root / "labels.json"
        if not labels.exists():
            continue
        for case, lab in sorted(json.loads(labels.read_text()).items()):
            jobs.append((f"{root.name}/{case}", str(case_path(root, case, lab))))
    return jobs


def tally(rows: list[dict]) -> dict[tuple[str, str], list[int]]:
    """(metric, bucket) -> [held, made, censored]."""
    out: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0])
    for r in rows:
        t = out[(r["metric"], r["bucket"])]
        t[0] += r["held"]
        t[1] += 1
        t[2] += r["censored"]
    return dict(out)


def gate_of(table: dict[tuple[str, str], list[int]]) -> dict[tuple[str, str], tuple[int, int]]:
    return {k: (v[0], v[1]) for k, v in sorted(table.items())}


def render(cal: list[dict], held_out: list[dict], counts: dict, seeds: int, elapsed: float, unread: list[str],
           slope_only: tuple[list[dict], list[dict]]) -> str:
    pct = lambda a, b: f"{a}/{b} ({100 * a / b:.0f}%)" if b else "0/0"
    ct, ht = tally(cal), tally(held_out)
    st, sh = tally(slope_only[0]), tally(slope_only[1])
    lines = [
        "## Time to failure: backtest and gate (`benchmarks/forecast_backtest.py`)", "", stamp(), "",
        (f"Every forecast the fit makes on a warning/critical finding, replayed causally (the forecast uses only the "
         f"points up to the finding's step) through the session, with the gate off. Calibration set: the synthetic "
         f"cases × logging_steps 1 and 10 × {seeds} seeds ({counts['synthetic']} runs) and {counts['real']} labelled real "
         f"runs (`labelled-runs`, `real-runs`, `real-runs/wild`, `benchmarks/real_runs/collected` and `made`); "
         f"{counts['held_out']} held-out runs (`collected_held_out`, `made_held_out`) reported apart, never tuned on. "
         f"{elapsed:.0f} s. Held: the series reached its limit within the stated steps; censored (the run ended "
         f"inside the range, limit not reached) counts as not held."), "",
        (f"The gate (`core.forecast.GATE`, `forecast_shown`): a forecast is shown only for a trend and horizon whose "
         f"interval held in at least {100 * MIN_HELD:.0f}% of at least {MIN_CASES} backtested forecasts; otherwise "
         f"the finding says nothing of when."), "",
        ("The interval shipped is the slope's interval widened by the band the points scatter in around the fit "
         "(`Forecaster._band`: the residuals' MAD, autocorrelation counted); the last two columns are the slope's "
         "interval alone, as it was before."), "",
        "| trend (series to its limit) | horizon (steps) | calibration: held | from runs (scenarios) | censored | shown "
        "| held-out: held | slope only: calibration | slope only: held-out |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for t in TARGETS:
        for b in BUCKETS:
            c = ct.get((t.metric, b))
            h = ht.get((t.metric, b))
            if not c and not h and (t.metric, b) not in st:
                continue
            held, made, cens = c or [0, 0, 0]
            shown = "yes" if made >= MIN_CASES and held >= MIN_HELD * made else "no"
            so, sho = st.get((t.metric, b)), sh.get((t.metric, b))
            mine = [r for r in cal if (r["metric"], r["bucket"]) == (t.metric, b)]
            runs = len({r["case"] for r in mine})
            scen = len({r["case"].split("/ls")[0] for r in mine})
            lines.append(f"| `{t.metric}` | {b} | {pct(held, made)} | {runs} ({scen}) | {cens} | {shown} | {pct(h[0], h[1]) if h else '—'} "
                         f"| {pct(so[0], so[1]) if so else '—'} | {pct(sho[0], sho[1]) if sho else '—'} |")
    shown_rows = [r for r in cal if (r["metric"], r["bucket"]) in GATE and _passes(GATE[(r["metric"], r["bucket"])])]
    shown_ho = [r for r in held_out if (r["metric"], r["bucket"]) in GATE and _passes(GATE[(r["metric"], r["bucket"])])]
    lines += [
        "",
        "| | calibration | held-out |", "|---|---|---|",
        f"| every forecast the fit makes (ungated) | {pct(sum(r['held'] for r in cal), len(cal))} | {pct(sum(r['held'] for r in held_out), len(held_out))} |",
        f"| ... with the slope's interval alone | {pct(sum(r['held'] for r in slope_only[0]), len(slope_only[0]))} | {pct(sum(r['held'] for r in slope_only[1]), len(slope_only[1]))} |",
        f"| the forecasts shown (through the frozen gate in the code) | {pct(sum(r['held'] for r in shown_rows), len(shown_rows))} | {pct(sum(r['held'] for r in shown_ho), len(shown_ho))} |",
        f"| of which on real runs | {pct(sum(r['held'] for r in shown_rows if '/ls' not in r['case']), sum('/ls' not in r['case'] for r in shown_rows))} | |",
        "",
    ]
    lines += [("Forecasts of one run are not independent (a run raises several findings, each forecast), and a "
               "synthetic scenario's seeds are alike: the runs and scenarios behind each cell say how broad its "
               "evidence is."), ""]
    if unread:
        lines += [f"Runs that could not be read ({len(unread)}): " + "; ".join(unread), ""]
    return "\n".join(lines)


def _passes(cell: tuple[int, int]) -> bool:
    held, made = cell
    return made >= MIN_CASES and held >= MIN_HELD * made


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args(argv)
    from grpo_monitor.fixtures.synthetic import CASES

    t0 = time.time()
    syn = [(name, seed, ls) for seed in range(args.seeds) for ls in (1, 10) for name in CASES]
    cal_real, ho_real = real_jobs(CALIBRATION), real_jobs(HELD_OUT)
    sets = {}
    with Pool(args.jobs) as pool:
        for band in (True, False):
            syn_rows = pool.map(synthetic_case, [j + (band,) for j in syn], chunksize=4)
            cal_out = pool.map(real_case, [j + (band,) for j in cal_real])
            ho_out = pool.map(real_case, [j + (band,) for j in ho_real])
            unread = sorted({o for o in cal_out + ho_out if isinstance(o, str)})
            sets[band] = ([r for rows in syn_rows + [o for o in cal_out if not isinstance(o, str)] for r in rows],
                          [r for rows in ho_out if not isinstance(rows, str) for r in rows])
    cal, held_out = sets[True]
    counts = {"synthetic": len(syn), "real": len(cal_real), "held_out": len(ho_real)}
    body = render(cal, held_out, counts, args.seeds, time.time() - t0, unread, sets[False])
    print(body)
    print("# core.forecast.GATE, from this calibration set:")
    print("GATE = {")
    for k, v in gate_of(tally(cal)).items():
        print(f"    {k!r}: {v!r},")
    print("}")
    if not args.no_write:
        update_section("forecast_backtest", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
