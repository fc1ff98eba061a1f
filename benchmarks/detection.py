"""Detection quality and per-step cost of the detector suite, side by side with rlwatch 0.5.1.

The labelled set is every synthetic case (``fixtures.synthetic``) at ``logging_steps`` 1 and 10
over several seeds, plus the public runs in ``../shared/real-runs`` (with ``labels.json``). Each
run is replayed through the session every driver uses (``core.session``: every detector and the diagnosis), and
through rlwatch's
manual API (``rlwatch.attach(framework="manual").log_step``) with its default configuration and
the metric mapping of its own TRL callback.

Scores, by the one judge (``fixtures.judge``, the semantics of ``../shared/tools/evaluate.py``): detection (an
expected detector raised a warning/critical), variant correct, false-alarm runs (a warning/critical outside the
label's ``allow`` on a healthy run); and beside them in time (first raised at or before the labelled failure step),
unexpected alarms on failure runs, delay (first flag minus failure step, in steps and in logged points). rlwatch has no detector ids of ours, so any of its alerts on a failure run
counts as a detection (lenient), and its variant counts as correct only when its advice names
the expected variant.

Cost: the median time of one full-suite update with 1k and with 100k steps of history (metrics
only, and with a 32-completion sample batch), next to rlwatch's ``log_step`` measured in the same
process on the same stream, interleaved step by step.

rlwatch is looked up in the current interpreter, then in ``.venv-bench`` (a venv made with
``python -m venv --system-site-packages .venv-bench`` and ``pip install rlwatch==0.5.1``). Without
it the comparison columns read "n/a".

    python benchmarks/detection.py [--seeds 5] [--history 100000] [--cost-only] [--forecast-only]

``--cost-only`` measures the cost alone and rewrites only the cost part of the section (with the
per-detector breakdown of ``benchmarks/detector_cost.py``). ``--forecast-only`` writes the section
``forecast`` alone: how many findings carry their cost and a time-to-failure forecast, the lead time the
forecasts give before the labelled failure step and their hit rate (the failure, and the limit itself,
came within the stated range).
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import io
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.detector_cost import stationary_stream
from benchmarks.results import RESULTS, stamp, update_section
from grpo_monitor.detectors import ALL_DETECTORS
from grpo_monitor.fixtures.synthetic import CASES, FAILURES, HEALTHY, generate
from grpo_monitor.core.engine import Engine
from grpo_monitor.core.session import open_session
from grpo_monitor.fixtures.judge import judge

# ../shared beside the checkout; GRPO_MONITOR_SHARED points elsewhere (as for the tests).
REAL = Path(os.environ.get("GRPO_MONITOR_SHARED") or ROOT.parent / "shared") / "real-runs"
ALARM = ("warning", "critical")
# rlwatch's TRL callback mapping (rlwatch/core.py, _build_trl_callback): first name present wins.
RLWATCH_MAP = {
    "entropy": ["entropy", "policy_entropy", "approx_entropy"],
    "kl_divergence": ["kl", "kl_divergence", "kl_penalty", "approx_kl"],
    "reward_mean": ["reward", "reward_mean", "rewards/mean", "env/reward_mean"],
    "reward_std": ["reward_std", "rewards/std", "env/reward_std"],
    "advantage_std": ["advantage_std", "advantages_std"],
    "loss": ["loss", "train_loss", "policy_loss"],
    "learning_rate": ["learning_rate", "lr"],
    "clip_fraction": ["clip_fraction", "clipfrac", "policy/clip_fraction"],
    "grad_norm": ["grad_norm", "gradient_norm", "grads/norm"],
}
VARIANT_WORDS = {"dapo": ("dapo",), "dr_grpo": ("dr. grpo", "dr_grpo", "dr grpo"), "gspo": ("gspo",)}


def import_rlwatch():
    try:
        import rlwatch

        return rlwatch, "current interpreter"
    except ImportError:
        pass
    for site in sorted(glob.glob(str(ROOT / ".venv-bench" / "lib" / "python*" / "site-packages"))):
        sys.path.append(site)
        try:
            import rlwatch

            return rlwatch, ".venv-bench"
        except ImportError:
            sys.path.remove(site)
    return None, None


@dataclass
class Case:
    name: str
    kind: str  # "synthetic" or "real"
    context: Any
    steps: list
    samples: dict
    labels: dict
    logging_gap: float


@dataclass
class Outcome:
    alarms: list = field(default_factory=list)  # (detector, severity, step, variant, advice)
    findings: list = field(default_factory=list)  # ours: the alarming findings themselves, for the one judge


def load_cases(seeds: int) -> list[Case]:
    cases = []
    for seed in range(seeds):
        for ls in (1, 10):
            for name in CASES:
                run = generate(name, seed=seed, logging_steps=ls)
                cases.append(Case(f"{name}/ls{ls}/s{seed}", "synthetic", run.context, run.steps, run.samples, run.labels, ls))
    labels_path = REAL / "labels.json"
    if labels_path.exists():
        from grpo_monitor.readers import load_source

        for name, labels in sorted(json.loads(labels_path.read_text()).items()):
            src = load_source(REAL / f"{name}.trainer_state.json")
            steps = [s for s, _ in src.steps]
            gap = (steps[-1] - steps[0]) / max(len(steps) - 1, 1) if len(steps) > 1 else 1.0
            cases.append(Case(name, "real", src.context, src.steps, src.samples, dict(labels), gap))
    return cases


def run_ours(case: Case) -> Outcome:
    session = open_session(case.context)
    for step, metrics in case.steps:
        session.update(step, metrics, case.samples.get(step, []))
    alarming = [f for f in session.findings if f.severity in ALARM]
    return Outcome([(f.detector, f.severity, f.step, f.variant, f.message) for f in alarming], alarming)


def rlwatch_kwargs(metrics: dict) -> dict:
    out = {}
    for name, candidates in RLWATCH_MAP.items():
        for c in candidates:
            if c in metrics:
                out[name] = metrics[c]
                break
    return out


def new_rlwatch(rlwatch, log_dir: str, run_id: str):
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        return rlwatch.attach(framework="manual", run_id=run_id, storage={"log_dir": log_dir})


def run_rlwatch(rlwatch, case: Case, log_dir: str, idx: int) -> Outcome:
    mon = new_rlwatch(rlwatch, log_dir, f"bench{idx}")
    out = Outcome()
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        for step, metrics in case.steps:
            kw = rlwatch_kwargs(metrics)
            if not kw:
                continue
            for a in mon.log_step(step, **kw) or []:
                out.alarms.append((a.detector, a.severity, a.step, None, f"{a.message} {a.recommendation}"))
        mon.stop()
    return out


def advice_variant(text: str) -> str | None:
    low = text.lower()
    for v, words in VARIANT_WORDS.items():
        if any(w in low for w in words):
            return v
    return None


def score(case: Case, out: Outcome, ours: bool) -> dict:
    labels = case.labels
    expect = labels.get("expect") or []
    res: dict[str, Any] = {"healthy": not expect}
    if ours:
        # The one judge: any expected detector counts, the variant on any of them; allowed alarms are no false alarm.
        v = judge(labels, out.findings)
        if not expect:
            res["false_alarm"] = v.kind == "false"
            return res
        res["variant_named"] = labels.get("variant") is not None
        res["detected"] = v.kind == "hit"
        res["in_time"] = v.kind == "hit" and v.in_time
        res["variant_ok"] = v.kind == "hit" and v.variant_ok
        res["unexpected"] = v.others
        if v.kind == "hit" and v.delay is not None:
            res["delay_steps"] = v.delay
            res["delay_points"] = v.delay / max(case.logging_gap, 1.0)
        return res
    if not expect:
        res["false_alarm"] = bool(out.alarms)
        return res
    # rlwatch has no detector ids of ours: any of its alerts counts, its variant only when its advice names it.
    res["variant_named"] = labels.get("variant") is not None
    hits = list(out.alarms)
    res["detected"] = bool(hits)
    if hits:
        first = hits[0]
        res["delay_steps"] = first[2] - labels["fail"]
        res["delay_points"] = res["delay_steps"] / max(case.logging_gap, 1.0)
        res["in_time"] = first[2] <= labels["fail"]
        res["variant_ok"] = advice_variant(first[4]) == labels.get("variant")
    else:
        res.update(in_time=False, variant_ok=False)
    return res


def summarise(rows: list[dict]) -> dict:
    fail = [r for r in rows if not r["healthy"]]
    healthy = [r for r in rows if r["healthy"]]
    delays = [r["delay_steps"] for r in fail if "delay_steps" in r]
    delay_pts = [r["delay_points"] for r in fail if "delay_points" in r]
    return {
        "failure_runs": len(fail),
        "detected": sum(r["detected"] for r in fail),
        "in_time": sum(r["in_time"] for r in fail),
        "variant_ok": sum(r["variant_ok"] for r in fail if r["variant_named"]),
        "variant_runs": sum(r["variant_named"] for r in fail),
        "healthy_runs": len(healthy),
        "false_alarm_runs": sum(r["false_alarm"] for r in healthy),
        "median_delay_steps": statistics.median(delays) if delays else None,
        "median_delay_points": statistics.median(delay_pts) if delay_pts else None,
        "max_delay_steps": max(delays) if delays else None,
        "unexpected_alarm_runs": sum(bool(r.get("unexpected")) for r in fail),
    }


# --- cost ---------------------------------------------------------------------------------------

def measure_cost(history: int, rlwatch, log_dir: str, window: int = 1000) -> dict:
    ctx = generate("healthy_fast_drop", seed=0, logging_steps=1, with_samples=False).context
    # The session's update: every detector, the cost and forecast annotators, the diagnosis and the recommender.
    engine = open_session(ctx)
    mon = new_rlwatch(rlwatch, log_dir, "cost") if rlwatch else None
    early = (1000, 1000 + window)
    late = (history - window, history)
    ours_t: dict[str, list[float]] = {"early": [], "late": []}
    rlw_t: dict[str, list[float]] = {"early": [], "late": []}
    pc = time.perf_counter
    sink = io.StringIO()
    with contextlib.redirect_stderr(sink), contextlib.redirect_stdout(sink):
        for step, metrics, _ in stationary_stream(history):
            t0 = pc()
            engine.update(step, metrics, ())
            t1 = pc()
            if mon is not None:
                mon.log_step(step, **rlwatch_kwargs(metrics))
            t2 = pc()
            for name, (a, b) in (("early", early), ("late", late)):
                if a <= step < b:
                    ours_t[name].append(t1 - t0)
                    rlw_t[name].append(t2 - t1)
        if mon is not None:
            mon.stop()
    # The same history followed by sample batches (32 completions per step, as the reward tap sends).
    samples_t: dict[str, list[float]] = {}
    for name, warm in (("early", 1000), ("late", history - window)):
        eng = open_session(ctx)
        stream = stationary_stream(warm + window)
        for step, metrics, batch in stream:
            if step <= warm:
                eng.update(step, metrics, ())
                continue
            t0 = pc()
            eng.update(step, metrics, batch)
            samples_t.setdefault(name, []).append(pc() - t0)
    med = lambda xs: statistics.median(xs) * 1e6 if xs else None
    return {
        "ours_early_us": med(ours_t["early"]),
        "ours_late_us": med(ours_t["late"]),
        "rlwatch_early_us": med(rlw_t["early"]) if mon is not None else None,
        "rlwatch_late_us": med(rlw_t["late"]) if mon is not None else None,
        "ours_samples_early_us": med(samples_t.get("early", [])),
        "ours_samples_late_us": med(samples_t.get("late", [])),
        "history": history,
    }


# --- report -------------------------------------------------------------------------------------

def fmt(x, digits=1):
    if x is None:
        return "n/a"
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return f"{float(x):.{digits}f}"
    return str(x)


def render(ours: dict, rlw: dict | None, per_case: list[tuple[Case, dict, dict | None]], cost: dict, seeds: int,
           rl_where: str | None, elapsed: float, per_detector: str | None = None) -> str:
    def frac(a, b):
        return f"{a}/{b}"

    lines = [
        "## Detection quality and detector cost (`benchmarks/detection.py`)",
        "",
        (f"_{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} · {platform.system()} {platform.machine()} "
         f"(`uname -m` {os.uname().machine}), {os.cpu_count()} CPUs, Python {platform.python_version()} · "
         f"rlwatch 0.5.1 from {rl_where or 'nowhere (not installed)'} · {elapsed:.0f} s_"),
        "",
        (f"Labelled set: {len(CASES)} synthetic cases ({len(HEALTHY)} healthy, {len(FAILURES)} failing) × logging_steps 1 and 10 "
         f"× {seeds} seeds, plus {sum(1 for c, _, _ in per_case if c.kind == 'real')} public runs. Ours: the expected detector "
         "must raise a warning/critical; rlwatch (default config, its TRL callback's metric mapping): any alert counts. "
         "Variant correct is counted over the failure runs whose label names a variant."),
        "",
        "| | grpo-monitor | rlwatch 0.5.1 |",
        "|---|---|---|",
        f"| failure runs detected | {frac(ours['detected'], ours['failure_runs'])} | {frac(rlw['detected'], rlw['failure_runs']) if rlw else 'n/a'} |",
        f"| detected in time (≤ labelled failure step) | {frac(ours['in_time'], ours['failure_runs'])} | {frac(rlw['in_time'], rlw['failure_runs']) if rlw else 'n/a'} |",
        f"| variant correct | {frac(ours['variant_ok'], ours['variant_runs'])} | {frac(rlw['variant_ok'], rlw['variant_runs']) if rlw else 'n/a'} |",
        f"| false-alarm runs (healthy) | {frac(ours['false_alarm_runs'], ours['healthy_runs'])} | {frac(rlw['false_alarm_runs'], rlw['healthy_runs']) if rlw else 'n/a'} |",
        (f"| median delay, steps (logged points) | {fmt(ours['median_delay_steps'])} ({fmt(ours['median_delay_points'])}) | "
         f"{fmt(rlw['median_delay_steps']) if rlw else 'n/a'} ({fmt(rlw['median_delay_points']) if rlw else 'n/a'}) |"),
        f"| worst delay, steps | {fmt(ours['max_delay_steps'])} | {fmt(rlw['max_delay_steps']) if rlw else 'n/a'} |",
        f"| failure runs with an unexpected extra alarm | {frac(ours['unexpected_alarm_runs'], ours['failure_runs'])} | n/a |",
        "",
        render_cost(cost, per_detector),
    ]
    targets = []
    all_variants = all(r.get("variant_ok") for _, r, _ in per_case if not r["healthy"])
    targets.append(("every labelled failure found with its variant (fixtures.judge)",
                    ours["detected"] == ours["failure_runs"] and all_variants))
    targets.append(("every failure in time with no unexpected alarm",
                    ours["in_time"] == ours["failure_runs"] and ours["unexpected_alarm_runs"] == 0))
    targets.append(("no false alarm on healthy runs", ours["false_alarm_runs"] == 0))
    targets.append(("median delay ≤ 0", ours["median_delay_steps"] is not None and ours["median_delay_steps"] <= 0))
    if rlw:
        targets.append(("fewer false alarms than rlwatch", ours["false_alarm_runs"] < rlw["false_alarm_runs"]))
        targets.append(("more correct variants than rlwatch", ours["variant_ok"] > rlw["variant_ok"]))
    lines += ["Targets: " + "; ".join(f"{t}: {'met' if ok else 'NOT met'}" for t, ok in targets) + ".", ""]
    # Per-case detail for the public runs and any miss.
    lines += ["| run | expected | grpo-monitor: first alarm(s) | rlwatch: first alert(s) |", "|---|---|---|---|"]
    for case, r_ours_case, r_rl_case in per_case:
        show = case.kind == "real" or (not r_ours_case["healthy"] and not r_ours_case.get("in_time")) or r_ours_case.get("false_alarm") \
            or r_ours_case.get("unexpected")
        if not show:
            continue
        exp = ", ".join(case.labels.get("expect") or []) or "nothing (healthy)"
        if case.labels.get("fail") is not None:
            exp += f" by step {case.labels['fail']}"
        lines.append(f"| {case.name} | {exp} | {r_ours_case.get('_first', '—')} | {r_rl_case.get('_first', '—') if r_rl_case else 'n/a'} |")
    return "\n".join(lines) + "\n"


COST_BLOCK = "detection_cost"


def render_cost(cost: dict, per_detector: str | None = None) -> str:
    """The cost part of the section, in its own marked block so ``--cost-only`` can rewrite it alone."""
    r_ours = cost["ours_late_us"] / cost["ours_early_us"] if cost["ours_early_us"] else None
    r_s = (cost["ours_samples_late_us"] / cost["ours_samples_early_us"]) if cost["ours_samples_early_us"] else None
    r_rl = (cost["rlwatch_late_us"] / cost["rlwatch_early_us"]) if cost.get("rlwatch_early_us") else None
    lines = [
        f"<!-- {COST_BLOCK}:begin -->",
        "Per-update cost (median µs, same process, interleaved step by step on one stationary healthy stream; "
        f"cost measured {stamp().strip('_')}):",
        "",
        "| | at 1k steps of history | at {:,} steps | ratio |".format(cost["history"]),
        "|---|---|---|---|",
        f"| grpo-monitor, all {len(ALL_DETECTORS)} detectors, metrics only | {fmt(cost['ours_early_us'])} | {fmt(cost['ours_late_us'])} | {fmt(r_ours, 2)} |",
        f"| grpo-monitor, plus a 32-completion sample batch per step | {fmt(cost['ours_samples_early_us'])} | {fmt(cost['ours_samples_late_us'])} | {fmt(r_s, 2)} |",
        f"| rlwatch `log_step` (7 detectors + SQLite write) | {fmt(cost.get('rlwatch_early_us'))} | {fmt(cost.get('rlwatch_late_us'))} | {fmt(r_rl, 2)} |",
        "",
    ]
    targets = [("cost ratio 100k/1k ≤ 1.5", r_ours is not None and r_ours <= 1.5)]
    if cost.get("rlwatch_late_us"):
        targets.append(("our metrics-only update not above rlwatch's log_step (at 1k and at the long history)",
                        cost["ours_early_us"] <= cost["rlwatch_early_us"] and cost["ours_late_us"] <= cost["rlwatch_late_us"]))
    lines += ["Cost targets: " + "; ".join(f"{t}: {'met' if ok else 'NOT met'}" for t, ok in targets) + ".", ""]
    if per_detector:
        lines += ["Per detector (`benchmarks/detector_cost.py`, same stream; µs, median (trimmed mean)):", "", per_detector.rstrip(), ""]
    lines.append(f"<!-- {COST_BLOCK}:end -->")
    return "\n".join(lines) + "\n"


def _mark_cost_block(path: Path = RESULTS) -> None:
    """Put the cost lines of a section written before the cost had its own block into one."""
    if not path.exists():
        return
    text = path.read_text()
    if f"<!-- {COST_BLOCK}:begin -->" in text or "<!-- detection:begin -->" not in text:
        return
    head, rest = text.split("<!-- detection:begin -->", 1)
    section, tail = rest.split("<!-- detection:end -->", 1)
    i = section.find("Per-update cost")
    j = section.find("Targets:", i)
    if i < 0 or j < 0:
        return
    targets_end = section.find("\n", j)
    targets = section[j:targets_end]
    for pat in (r"; cost ratio 100k/1k ≤ 1\.5: (?:met|NOT met)",
                r"; our metrics-only update not above rlwatch's log_step \(at 1k and at the long history\): (?:met|NOT met)"):
        targets = re.sub(pat, "", targets)
    section = (section[:i] + f"<!-- {COST_BLOCK}:begin -->\n<!-- {COST_BLOCK}:end -->\n\n" + targets
               + section[targets_end:])
    path.write_text(head + "<!-- detection:begin -->" + section + "<!-- detection:end -->" + tail)


def cost_only(history: int, no_write: bool) -> int:
    from benchmarks.detector_cost import measure, render as render_table

    rlwatch, _ = import_rlwatch()
    with tempfile.TemporaryDirectory() as tmp:
        cost = measure_cost(history, rlwatch, os.path.join(tmp, "cost"))
    per = {"metrics": measure(history), "samples": measure(history, with_samples=True)}
    body = render_cost(cost, render_table(history, per))
    print(body)
    if not no_write:
        _mark_cost_block()
        if f"<!-- {COST_BLOCK}:begin -->" not in (RESULTS.read_text() if RESULTS.exists() else ""):
            print(f"detection: {RESULTS} has no detection section to put the cost into; run without --cost-only first",
                  file=sys.stderr)
            return 2
        inner = body.split(f"<!-- {COST_BLOCK}:begin -->\n", 1)[1].rsplit(f"<!-- {COST_BLOCK}:end -->", 1)[0]
        update_section(COST_BLOCK, inner)
    return 0


def first_alarms(out: Outcome, k: int = 3) -> str:
    seen, parts = set(), []
    for det, sev, step, variant, _ in out.alarms:
        if (det, sev) in seen:
            continue
        seen.add((det, sev))
        parts.append(f"{det} {sev} @{step}" + (f" ({variant})" if variant else ""))
        if len(parts) >= k:
            break
    return "; ".join(parts) or "none"


# --- cost and time to failure (their own section, `forecast`) ----------------------------------------

WILD = REAL / "wild"


def first_crossing(steps: list, metric: str, limit: float, direction: str, after: int) -> int | None:
    """The first logged step after ``after`` where the median of the point and its two neighbours in ``metric``
    is past ``limit`` (one noisy point does not count as reaching it)."""
    pts = [(s, m.get(metric)) for s, m in steps if s >= after and isinstance(m.get(metric), (int, float))]
    for i in range(1, len(pts) - 1):
        v = statistics.median(x for _, x in pts[i - 1:i + 2])
        if pts[i][0] > after and ((v >= limit) if direction == "up" else (v <= limit)):
            return pts[i][0]
    return None


def forecast_rows(case: Case) -> tuple[list[dict], dict]:
    """Every forecast on a case's warning/critical findings (with the step its limit was in fact reached),
    and how many of those findings carry a cost and a forecast."""
    from grpo_monitor.core.forecast import TARGETS

    engine = Engine(case.context, [cls() for cls in ALL_DETECTORS])
    for step, metrics in case.steps:
        engine.update(step, metrics, case.samples.get(step, []))
    alarms = [f for f in engine.findings if f.severity in ALARM]
    counts = {"findings": len(alarms), "with_cost": sum("cost" in f.evidence for f in alarms),
              "with_wall": sum((f.evidence.get("cost") or {}).get("wall_seconds") is not None for f in alarms),
              "with_gpu_hours": sum((f.evidence.get("cost") or {}).get("gpu_hours") is not None for f in alarms),
              "with_forecast": sum("forecast" in f.evidence for f in alarms)}
    rows = []
    direction = {t.metric: t.direction for t in TARGETS}
    for f in alarms:
        fc = f.evidence.get("forecast")
        if not fc:
            continue
        lo, hi = fc["at_steps"]
        crossed = first_crossing(case.steps, fc["metric"], fc["limit"], direction[fc["metric"]], f.step)
        fail = case.labels.get("fail")
        rows.append({"case": case.name, "detector": f.detector, "step": f.step, "metric": fc["metric"],
                     "at": fc["at_step"], "lo": lo, "hi": hi, "crossed": crossed, "fail": fail,
                     # The crossing is seen at the first logged point past it: a log every k steps sees it up
                     # to k steps late.
                     "hit_limit": crossed is not None and lo <= crossed < hi + case.logging_gap,
                     "before_fail": fail is not None and f.step <= fail,
                     "hit_fail": fail is not None and f.step <= fail and lo <= fail <= hi,
                     "expected": f.detector in (case.labels.get("expect") or [])})
    return rows, counts


def wild_runs() -> list[tuple[str, Any, dict]]:
    """The public runs of ``real-runs/wild`` through ``analyze`` as a user runs it: (name, report, labels)."""
    labels_path = WILD / "labels.json"
    if not labels_path.exists():
        return []
    from grpo_monitor.analysis.analyze import analyze

    out = []
    for name, labels in sorted(json.loads(labels_path.read_text()).items()):
        out.append((name, analyze(WILD / labels["file"]).runs[0], labels))
    return out


def render_forecast(rows: list[dict], counts: dict, real_counts: dict, seeds: int, elapsed: float) -> str:
    made = [r for r in rows if r["expected"]]
    first: dict[str, dict] = {}
    for r in made:
        first.setdefault(r["case"], r)
    before = [r for r in first.values() if r["before_fail"]]
    leads = [r["fail"] - r["step"] for r in before]
    fail_cases = sum(1 for c in counts["cases"] if c)
    pct = lambda a, b: f"{a}/{b}" + (f" ({100 * a / b:.0f}%)" if b else "")
    lines = [
        "## Cost and time to failure (`benchmarks/detection.py --forecast-only`)", "", stamp(), "",
        (f"Every labelled synthetic case × logging_steps 1 and 10 × {seeds} seeds, plus the public runs (the three of "
         f"`real-runs` through the engine, the {real_counts['runs']} of `real-runs/wild` through `analyze`), {elapsed:.0f} s. "
         "Cost and forecast are put on each warning/critical finding by the engine's annotators (`core.cost`, "
         "`core.forecast`)."), "",
        "| | labelled synthetic cases | public runs |", "|---|---|---|",
        f"| warning/critical findings | {counts['findings']} | {real_counts['findings']} |",
        f"| with `evidence.cost` | {pct(counts['with_cost'], counts['findings'])} | {pct(real_counts['with_cost'], real_counts['findings'])} |",
        f"| with wall time (a clock, `step_time` or `train_runtime` in the log) | {pct(counts['with_wall'], counts['findings'])} | {pct(real_counts['with_wall'], real_counts['findings'])} |",
        f"| with GPU-hours (the device count too: a run header's world size, or `--devices`; none here) | {pct(counts['with_gpu_hours'], counts['findings'])} | {pct(real_counts['with_gpu_hours'], real_counts['findings'])} |",
        f"| with `evidence.forecast` (a trend heading for its limit, interval tight enough, trend and horizon trusted by the backtest: `forecast_backtest` below) | {pct(counts['with_forecast'], counts['findings'])} | {pct(real_counts['with_forecast'], real_counts['findings'])} |",
        "",
        "Forecasts on the expected detector's findings of the failure cases:", "",
        "| | |", "|---|---|",
        f"| failure runs whose expected finding carried a forecast | {len(first)} of {fail_cases} |",
        f"| ... made at or before the labelled `fail` step | {len(before)} |",
        f"| median lead time of those forecasts (steps before `fail`) | {fmt(statistics.median(leads)) if leads else 'n/a'} |",
        f"| hit rate: the labelled failure came within the stated range | {pct(sum(r['hit_fail'] for r in before), len(before))} |",
        f"| hit rate: the series reached its limit within the stated range (every forecast) | {pct(sum(r['hit_limit'] for r in made), len(made))} |",
        f"| ... the limit was never reached in the logged run (censored) | {sum(r['crossed'] is None for r in made)} |",
        "",
        "| case | finding at | series | stated range (steps) | limit reached at | labelled fail |", "|---|---|---|---|---|---|",
    ]
    for r in list(first.values())[:24]:
        lines.append(f"| {r['case']} | {r['detector']} @{r['step']} | `{r['metric']}` | {r['lo']}–{r['hi']} | "
                     f"{r['crossed'] if r['crossed'] is not None else 'not reached'} | {r['fail']} |")
    lines.append("")
    return "\n".join(lines)


def forecast_only(seeds: int, no_write: bool) -> int:
    t0 = time.time()
    rows: list[dict] = []
    counts = {"findings": 0, "with_cost": 0, "with_wall": 0, "with_gpu_hours": 0, "with_forecast": 0, "cases": []}
    real = {"findings": 0, "with_cost": 0, "with_wall": 0, "with_gpu_hours": 0, "with_forecast": 0, "runs": 0}
    for case in load_cases(seeds):
        r, c = forecast_rows(case)
        target = real if case.kind == "real" else counts
        for k in ("findings", "with_cost", "with_wall", "with_gpu_hours", "with_forecast"):
            target[k] += c[k]
        if case.kind != "real":
            counts["cases"].append(bool(case.labels.get("expect")))
            rows += r
    for _, report, _ in wild_runs():
        real["runs"] += 1
        alarms = [f for f in report.findings if f.severity in ALARM]
        real["findings"] += len(alarms)
        real["with_cost"] += sum("cost" in f.evidence for f in alarms)
        real["with_wall"] += sum((f.evidence.get("cost") or {}).get("wall_seconds") is not None for f in alarms)
        real["with_gpu_hours"] += sum((f.evidence.get("cost") or {}).get("gpu_hours") is not None for f in alarms)
        real["with_forecast"] += sum("forecast" in f.evidence for f in alarms)
    body = render_forecast(rows, counts, real, seeds, time.time() - t0)
    print(body)
    if not no_write:
        update_section("forecast", body)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--history", type=int, default=100_000)
    ap.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    ap.add_argument("--cost-only", action="store_true", help="measure the per-step cost only and rewrite only its lines")
    ap.add_argument("--forecast-only", action="store_true",
                    help="only the findings' cost and time-to-failure figures (their own section)")
    args = ap.parse_args(argv)
    if args.cost_only:
        return cost_only(args.history, args.no_write)
    if args.forecast_only:
        return forecast_only(args.seeds, args.no_write)
    t0 = time.time()
    rlwatch, where = import_rlwatch()
    cases = load_cases(args.seeds)
    rows_ours, rows_rl, per_case = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i, case in enumerate(cases):
            o = run_ours(case)
            so = score(case, o, ours=True)
            so["_first"] = first_alarms(o)
            rows_ours.append(so)
            sr = None
            if rlwatch is not None:
                r = run_rlwatch(rlwatch, case, os.path.join(tmp, f"r{i}"), i)
                sr = score(case, r, ours=False)
                sr["_first"] = first_alarms(r)
                rows_rl.append(sr)
            per_case.append((case, so, sr))
        cost = measure_cost(args.history, rlwatch, os.path.join(tmp, "cost"))
    from benchmarks.detector_cost import measure, render as render_table

    per = render_table(args.history, {"metrics": measure(args.history), "samples": measure(args.history, with_samples=True)})
    ours = summarise(rows_ours)
    rlw = summarise(rows_rl) if rows_rl else None
    body = render(ours, rlw, per_case, cost, args.seeds, where, time.time() - t0, per)
    print(body)
    if not args.no_write:
        update_section("detection", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
