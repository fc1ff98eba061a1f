"""Offline analysis: replay the detectors over a finished run, exactly as the live monitor would.

The replay feeds each logged step (and its samples, for our run directories) through the same
``Engine`` the callback uses, in step order, so a finding's ``step`` is the step at which the
live monitor raised or would have raised it.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from detectors.base import Finding
from monitor.engine import Engine
from monitor.recommend import Recommender

SEVERITY_RANK = {"info": 0, "warning": 1, "critical": 2}
CURVES = ("entropy", "reward", "completions/mean_length", "completions/clipped_ratio", "frac_reward_zero_std", "grad_norm")
_BARS = "▁▂▃▄▅▆▇█"


@dataclass
class RunReport:
    source: str
    format: str
    steps: int
    findings: list[Finding]
    recommendations: list[dict[str, Any]]
    series: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        worst = max((SEVERITY_RANK[f.severity] for f in self.findings), default=-1)
        return {-1: "healthy", 0: "healthy", 1: "warning", 2: "critical"}[worst]

    @property
    def flagged(self) -> bool:
        return any(f.severity in ("warning", "critical") for f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "steps": self.steps,
            "findings": [f.to_dict() for f in self.findings],
            "recommendations": self.recommendations,
        }


@dataclass
class Report:
    runs: list[RunReport]

    @property
    def exit_code(self) -> int:
        return 1 if any(r.flagged for r in self.runs) else 0

    def to_dict(self) -> dict[str, Any]:
        return {"runs": [r.to_dict() for r in self.runs]}


def replay(src: Any, detectors: Sequence[Any] | None = None) -> tuple[list[Finding], list[dict[str, Any]]]:
    engine = Engine(src.context, detectors)
    engine.replay(src.steps, src.samples, processes=None)
    recommender = Recommender(src.context.config, is_moe=src.context.is_moe)
    recs = [r for r in (recommender(f.to_dict()) for f in engine.findings) if r is not None]
    return engine.findings, recs


def analyze_one(path: str | os.PathLike[str], detectors: Sequence[Any] | None = None) -> RunReport:
    from monitor.sources import load_source

    with _collector_paused():
        src = load_source(path)
        findings, recs = replay(src, detectors)
        series = key_curves(src.steps)
    return RunReport(
        source=str(path),
        format=src.format,
        steps=len(src.steps),
        findings=findings,
        recommendations=recs,
        series=series,
        model=dict(src.context.model),
        warnings=list(src.warnings),
    )


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
def _collector_paused() -> Iterator[None]:
    """No cyclic garbage collection while a log is read and replayed: millions of young objects
    that all stay alive would otherwise trigger full collections over an ever larger heap."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def expand_lineages(paths: Sequence[str | os.PathLike[str]]) -> list[str]:
    """Each path, and for a run directory that was restarted, each of its segments in order."""
    from monitor.restart import lineage_dirs
    from monitor.runlog import is_run_dir

    out: list[str] = []
    for p in paths:
        out.append(str(p))
        if is_run_dir(p):
            out.extend(str(d) for d in lineage_dirs(p)[1:])
    return out


def analyze(paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], detectors: Sequence[Any] | None = None) -> Report:
    """Analyse one path or several (a restarted run: every segment); raises ``monitor.sources.SourceError``."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    return Report([analyze_one(p, detectors) for p in expand_lineages(paths)])


# -- rendering -----------------------------------------------------------------------------


def sparkline(values: Sequence[float], width: int = 48) -> str:
    if not values:
        return ""
    if len(values) > width:  # bucket means, so a long run still fits one line
        n = len(values)
        values = [sum(values[i * n // width:(i + 1) * n // width]) / max(1, (i + 1) * n // width - i * n // width)
                  for i in range(width)]
    lo, hi = min(values), max(values)
    span = hi - lo
    return "".join(_BARS[0 if span == 0 else min(7, int((v - lo) / span * 7.999))] for v in values)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_fmt(x)}" for k, x in list(v.items())[:6]) + "}"
    if isinstance(v, list):
        return "[" + ", ".join(_fmt(x) for x in v[:6]) + (", …]" if len(v) > 6 else "]")
    return str(v)


def render_text(report: Report) -> str:
    out: list[str] = []
    for run in report.runs:
        model = run.model.get("class") or "model unknown"
        out.append(f"== {run.source}  ({run.format}, {run.steps} logged steps, {model})")
        out.append(f"verdict: {run.verdict.upper()}")
        for w in run.warnings:
            out.append(f"  note: {w}")
        if run.findings:
            out.append("findings:")
        for f in run.findings:
            onset = f" (onset ~{f.onset_step})" if f.onset_step is not None else ""
            variant = f" → {f.variant}" if f.variant else ""
            out.append(f"  step {f.step} [{f.severity}] {f.detector}{onset}{variant}: {f.message}")
            if f.evidence:
                out.append("      evidence: " + ", ".join(f"{k}={_fmt(v)}" for k, v in list(f.evidence.items())[:8]))
        if run.recommendations:
            out.append("recommendations:")
        for r in run.recommendations:
            out.append(f"  switch to {r['variant']} (from {r['detector']} at step {r['step']})")
            out.append(f"      {r['python']}")
            out.append(f"      {r['cli_flags']}")
            for reason in r["reasons"][1:]:
                out.append(f"      why: {reason}")
            for key, advice in r.get("extra", {}).items():
                out.append(f"      also: {key} {advice}")
        if run.series:
            out.append("curves:")
        for name, pts in run.series.items():
            vals = [v for _, v in pts]
            out.append(f"  {name:<26} {sparkline(vals)}  {vals[0]:.4g} → {vals[-1]:.4g}  (steps {pts[0][0]}–{pts[-1][0]})")
        out.append("")
    if len(report.runs) > 1:
        out.append(comparison_table(report))
    return "\n".join(out).rstrip() + "\n"


def comparison_table(report: Report) -> str:
    rows = [("run", "format", "steps", "verdict", "findings", "variants")]
    for r in report.runs:
        dets = ", ".join(sorted({f.detector for f in r.findings if f.severity != "info"})) or "—"
        variants = ", ".join(sorted({x["variant"] for x in r.recommendations})) or "—"
        rows.append((r.source, r.format, str(r.steps), r.verdict, dets, variants))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines) + "\n"


def render_markdown(report: Report) -> str:
    out = ["# grpo-monitor report", ""]
    if len(report.runs) > 1:
        out += ["| run | format | steps | verdict | findings | variants |", "|---|---|---|---|---|---|"]
        for r in report.runs:
            dets = ", ".join(sorted({f.detector for f in r.findings if f.severity != "info"})) or "—"
            variants = ", ".join(sorted({x["variant"] for x in r.recommendations})) or "—"
            out.append(f"| `{r.source}` | {r.format} | {r.steps} | {r.verdict} | {dets} | {variants} |")
        out.append("")
    for r in report.runs:
        out += [f"## `{r.source}`", "", f"**Verdict: {r.verdict}** — {r.format}, {r.steps} logged steps.", ""]
        if r.findings:
            out += ["| step | severity | detector | onset | variant | message |", "|---|---|---|---|---|---|"]
            for f in r.findings:
                out.append(f"| {f.step} | {f.severity} | `{f.detector}` | {f.onset_step if f.onset_step is not None else '—'} "
                           f"| {f.variant or '—'} | {f.message.replace('|', '/')} |")
            out.append("")
        for rec in r.recommendations:
            out += [f"### Switch to {rec['variant']}", "", "```python", rec["python"], "```", "", "```bash",
                    rec["cli_flags"], "```", ""]
            out += [f"- {reason}" for reason in rec["reasons"]] + [""]
        if r.series:
            out += ["| curve | shape | first | last |", "|---|---|---|---|"]
            for name, pts in r.series.items():
                vals = [v for _, v in pts]
                out.append(f"| `{name}` | `{sparkline(vals, 32)}` | {vals[0]:.4g} | {vals[-1]:.4g} |")
            out.append("")
    return "\n".join(out)


def run_cli(paths: Sequence[str], as_json: bool = False, markdown: str | None = None) -> int:
    from monitor.sources import SourceError

    runs = []
    for p in expand_lineages(paths):
        try:
            runs.append(analyze_one(p))
        except SourceError as exc:
            print(f"grpo-monitor: {exc}", file=sys.stderr)
            return 2
        except Exception as exc:  # never a traceback for input we could not handle
            print(f"grpo-monitor: {p}: cannot analyse ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})",
                  file=sys.stderr)
            return 2
    report = Report(runs)
    if as_json:
        print(json.dumps(report.to_dict(), default=_json_default, allow_nan=False))
    else:
        sys.stdout.write(render_text(report))
    if markdown:
        with open(markdown, "w", encoding="utf-8") as fh:
            fh.write(render_markdown(report))
    return report.exit_code


def _json_default(obj: Any) -> Any:
    try:
        return obj.item()
    except Exception:
        return str(obj)
