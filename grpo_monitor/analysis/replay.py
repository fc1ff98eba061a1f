"""A read log replayed through the one session the live callback and the dashboard share
(``core.session``), and what the replay gives a report: coverage, costs, the pre-flight findings recorded,
the device's health, the key curves.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from grpo_monitor.analysis.explain import clipping_never_fired
from grpo_monitor.core.engine import Engine
from grpo_monitor.detectors import ALL_DETECTORS
from grpo_monitor.detectors.base import Finding

# The curves a report shows, in this order, where the run logged them.
CURVES = ("entropy", "reward", "completions/mean_length", "completions/clipped_ratio", "frac_reward_zero_std", "grad_norm",
          "kl", "eval_reward", "eval_accuracy")


@dataclass
class Costing:
    """What the cost figures need beyond the log: the price of a GPU-hour and, where the log does not say
    it, the device count."""

    gpu_hour_price: float | None = None
    devices: int | None = None


def _has_samples(src: Any) -> bool:
    try:
        return len(src.samples) > 0
    except Exception:
        return bool(src.samples)


def replay_session(src: Any, detectors: Sequence[Any] | None = None, costing: Costing | None = None,
                   each: Any = None) -> Any:
    """A recorded run replayed through the one session ``analyze``, the dashboard and the live callback share
    (``core.session``): its pre-flight findings first, as the live callback met them, then every logged step."""
    from grpo_monitor.core.recommend import lineage_options
    from grpo_monitor.core.session import SessionOptions, open_session

    costing = costing or Costing()
    header = getattr(getattr(src, "run", None), "header", None)
    session = open_session(src.context, SessionOptions(
        detectors=detectors, devices=costing.devices or run_devices(src), gpu_hour_price=costing.gpu_hour_price,
        runtime=run_runtime(src), clipping_never_fired=clipping_never_fired(src.steps), **lineage_options(header)))
    session.preflight(config_findings(src))
    session.replay(src.steps, src.samples, each)
    return session


def session_coverage(session: Any, src: Any, names: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Which detectors could judge the replayed run, and why the others could not."""
    coverage = session.coverage(set(names), _has_samples(src))
    if not src.steps:
        for c in coverage.values():
            if c["status"] in ("judged", "too_few_points", "missing_inputs"):
                c["status"], c["reason"] = "missing_inputs", "no logged step"
    return coverage


def run_devices(src: Any) -> int | None:
    """The device count a run directory's header records (``world_size``), else None."""
    header = getattr(getattr(src, "run", None), "header", None) or {}
    n = header.get("world_size")
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 1 else None


def run_runtime(src: Any) -> tuple[float, int] | None:
    """``train_runtime`` of the run's final summary and the steps it covered, where the log kept it."""
    summary = getattr(getattr(src, "run", None), "summary", None)
    metrics = (summary or {}).get("metrics") if isinstance(summary, Mapping) else None
    metrics = metrics or (src.meta.get("summary") if isinstance(getattr(src, "meta", None), Mapping) else None) or {}
    runtime = metrics.get("train_runtime") if isinstance(metrics, Mapping) else None
    if isinstance(runtime, (int, float)) and not isinstance(runtime, bool) and runtime > 0 and src.steps:
        return float(runtime), int(src.steps[-1][0])
    return None


def cost_summary(engine: Any, findings: Sequence[Finding]) -> dict[str, Any]:
    """The run's spend and each warning/critical finding's cost from its onset to the run's last step."""
    from grpo_monitor.core.cost import CostMeter

    meter = engine.annotator(CostMeter) if engine is not None else None
    if meter is None or meter.last_step is None or not len(meter.steps):
        return {}
    last = meter.last_step
    out: dict[str, Any] = {"run": meter.between(int(meter.steps[0]), last), "findings": []}
    for f in findings:
        if f.severity == "info":
            continue
        since = f.onset_step if f.onset_step is not None else f.step
        out["findings"].append({"detector": f.detector, "severity": f.severity, "step": f.step,
                                "to_end": meter.between(min(int(since), f.step), last)})
    return out


def config_findings(src: Any) -> list[Finding]:
    """The pre-flight ``config_*`` findings a run directory's callback wrote at the start."""
    run = getattr(src, "run", None)
    out = []
    for rec in getattr(run, "findings", None) or []:
        if not str(rec.get("detector", "")).startswith("config_"):
            continue
        try:
            out.append(Finding.from_dict(rec))
        except (TypeError, ValueError):
            continue
    return out


def config_from(src: Any) -> str | None:
    """What a reader says a foreign log's config came from (``Source.meta["config_from"]``), else None."""
    meta = getattr(src, "meta", None)
    origin = meta.get("config_from") if isinstance(meta, Mapping) else None
    return origin if isinstance(origin, str) and origin else None


def with_recorded_rules(src: Any, detectors: Sequence[Any] | None) -> Sequence[Any] | None:
    """The detectors to replay, with the team rules a run directory's header recorded (the live run judged
    by them, so its replay does too) where ``detectors`` does not already hold a rule of that id."""
    header = getattr(getattr(src, "run", None), "header", None) or {}
    recorded = header.get("rules")
    if not recorded:
        return detectors
    from grpo_monitor.core.rules import rules_from_data

    try:
        rules = rules_from_data(recorded, "the run header's rules")
    except ValueError as exc:
        src.warnings.append(f"not replayed: {exc}")
        return detectors
    base = list(detectors) if detectors is not None else [cls() for cls in ALL_DETECTORS]
    have = {d.id for d in base}
    return base + [r for r in rules if r.id not in have]


def device_of(src: Any) -> dict[str, Any] | None:
    from grpo_monitor.core.device import device_health

    health = device_health(src.steps)
    if health is None:
        return None
    header = getattr(getattr(src, "run", None), "header", None) or {}
    facts = header.get("device") if isinstance(header.get("device"), Mapping) else {}
    if facts.get("name"):
        health = {"name": facts["name"], **({"unified_memory": facts["unified_memory"]}
                                             if facts.get("unified_memory") else {}), **health}
    return health


def normal_notes(src: Any) -> list[dict[str, Any]]:
    from grpo_monitor.analysis.explain import explain

    try:
        return explain(src.steps, src.context)
    except Exception:  # advice only: a report without its notes beats no report
        return []


def segment_of(src: Any) -> int | None:
    run = getattr(src, "run", None)
    if run is None or src.format != "run_dir":
        return None
    seg = (getattr(run, "header", None) or {}).get("segment")
    if not isinstance(seg, int) or isinstance(seg, bool) or seg < 0:
        return None
    return seg + 1 if seg > 0 or getattr(run, "restarts", None) else None


def coverage_from_states(header: Mapping[str, Any], names: Sequence[str], states: Mapping[str, str],
                         has_samples: bool = False) -> dict[str, dict[str, Any]]:
    """Coverage without a replay, from a run log's header, its logged names and the detectors'
    recorded states (what a dashboard following a live run has)."""
    from grpo_monitor.readers.run_dir import context_from_header

    engine = Engine(context_from_header(dict(header)))
    for d in engine.detectors:
        state = states.get(d.id)
        if state == "disabled":
            engine.disabled[d.id] = "failed"
        elif state is not None:
            d.state = state
        else:
            d.state = "warming_up"
    return engine.coverage(set(names), has_samples)


def judgement_line(coverage: Mapping[str, Mapping[str, Any]], names: Sequence[str]) -> tuple[str, str]:
    """The dashboard's verdict on what it can see: text and role (``muted`` or ``warning``)."""
    failure = {d: c for d, c in coverage.items() if c.get("role") == "failure" and c.get("status") != "not_applicable"}
    judged = [d for d, c in failure.items() if c.get("status") == "judged"]
    if judged:
        return f"judged by {len(judged)}/{len(failure)} detectors", "muted"
    if not names:
        return "cannot judge yet: no metric logged", "warning"
    waiting = [d for d, c in failure.items() if c.get("status") == "too_few_points"]
    if waiting:
        return f"warming up: {len(waiting)} detector{'s' if len(waiting) != 1 else ''} setting baselines", "muted"
    shown = ", ".join(list(names)[:6]) + (", …" if len(names) > 6 else "")
    return (f"CANNOT JUDGE: no failure detector has its inputs (found {shown}; needs reward, completions/mean_length, "
            "entropy ...; map columns with analyze --map)", "warning")


def key_curves(steps: Sequence[tuple[int, Any]]) -> dict[str, list[tuple[int, float]]]:
    """``(step, value)`` of each curve in ``CURVES`` the run logged, finite values only."""
    import numpy as np

    at = np.fromiter((s for s, _ in steps), dtype=np.int64, count=len(steps))
    series: dict[str, list[tuple[int, float]]] = {}
    for name in CURVES:
        # A source's values are floats or None (a gap); None becomes NaN here, dropped with inf.
        values = np.array([m.get(name) for _, m in steps], dtype=np.float64)
        keep = np.isfinite(values)
        if keep.any():
            series[name] = list(zip(at[keep].tolist(), values[keep].tolist()))
    return series


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic garbage collection while a log is read and replayed: millions of young objects
    that all stay alive would otherwise trigger full collections over an ever larger heap."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
