"""A ``Report`` as text (the terminal's) and as Markdown (a PR comment, a wiki page); ``html_report`` draws
the same model as a page, and ``--json`` is ``Report.to_dict``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from grpo_monitor.analysis.run_report import ANNOTATIONS, INTERRUPTED, Report, RunReport, needs_text, shown_recommendations
from grpo_monitor.core.recommend import title as rec_title
from grpo_monitor.detectors.base import Finding

_BARS = "▁▂▃▄▅▆▇█"

VERDICT_TEXT = {
    "healthy": "HEALTHY",
    "warning": "WARNING",
    "critical": "CRITICAL",
    "incomplete": "INCOMPLETE",
    "cannot_judge": "CANNOT JUDGE — the monitor could not see this run: no failure detector had the inputs it needs",
}


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


def coverage_lines(run: RunReport) -> list[str]:
    """``judged by: ...``, one ``could not judge`` line per failure detector that could not, and the sanity
    checks that ran."""
    if not run.coverage:
        return []
    if not run.steps:
        return ["judged by: no detector (no logged step)"]
    out = [f"judged by: {', '.join(run.judged_by) or 'no failure detector'}"]
    for det, why in run.not_judged.items():
        out.append(f"  could not judge {det}: {why}")
    if run.checked_by:
        out.append(f"also checked: {', '.join(run.checked_by)}")
    for rule, why in run.rules_not_checked.items():
        out.append(f"  could not check team rule {rule}: {why}")
    return out


def model_line(model: Mapping[str, Any]) -> str:
    """The model of a run and where it came from, in one line."""
    name = model.get("name_or_path") or model.get("class") or "unknown"
    if model.get("is_moe"):
        layout = f"{model['num_experts']} experts, top-{model.get('top_k')}" if model.get("num_experts") else "by its id"
        name += f" (mixture of experts: {layout})"
    return f"{name}, from {model['source']}" if model.get("source") else name


# The settings that change what a finding says or recommends, in the order a reader looks for them.
_CONFIG_SHOWN = ("max_completion_length", "num_generations", "generation_batch_size", "learning_rate", "beta",
                 "loss_type", "importance_sampling_level", "temperature", "max_grad_norm", "entropy_coef")


def config_line(config: Mapping[str, Any], origin: str) -> str:
    """A foreign log's config in one line: where it came from and the settings the verdict rests on.

    >>> config_line({"num_generations": 2, "max_completion_length": 1024, "seed": 3}, "the config verl printed")
    'max_completion_length=1024, num_generations=2 — from the config verl printed'
    """
    shown = [f"{k}={config[k]!r}" if isinstance(config[k], str) else f"{k}={config[k]}"
             for k in _CONFIG_SHOWN if config.get(k) is not None]
    return f"{', '.join(shown) or 'no setting the detectors read'} — from {origin}"


def names_line(names: Mapping[str, Any]) -> str:
    """The names a log's own words were mapped by, in one line (``--map`` overrides any of them).

    >>> names_line({"mapped": {"rollout_reward_mean": {"to": "reward", "by": "reward + mean"}}, "ambiguous": {}})
    'rollout_reward_mean → reward (reward + mean), mapped by their words and known spellings; --map NAME=METRIC overrides'
    """
    parts = [f"{n} → {m['to']} ({m['by']})" for n, m in (names.get("mapped") or {}).items()]
    parts += [f"{', '.join(ns)}: left unmapped, each could be {t}" for t, ns in (names.get("ambiguous") or {}).items()]
    return "; ".join(parts) + ", mapped by their words and known spellings; --map NAME=METRIC overrides"


def device_lines(run: RunReport) -> list[str]:
    """``device: ...`` and its health lines, for a run that logged device readings."""
    if not run.device:
        return []
    from grpo_monitor.core.device import health_lines

    name = run.device.get("name")
    head = "device" + (f": {name}" if name else "") + (f" (unified memory: {run.device['unified_memory']})"
                                                       if run.device.get("unified_memory") else "")
    return [head] + [f"  {line}" for line in health_lines(run.device)]


def verdict_line(run: RunReport) -> str:
    """The one line a dashboard or a table shows for a run's verdict."""
    text = VERDICT_TEXT.get(run.verdict, run.verdict.upper())
    if run.verdict == "incomplete" and run.status_note:
        text += f" — {run.status} — {run.status_note}" if run.status == INTERRUPTED else f" — {run.status_note}"
    return text


def advised_note(rec: Mapping[str, Any]) -> str:
    """`` (advised from a warning at step N)`` for a recommendation a warning's advice came before."""
    at = rec.get("advised_at")
    return f" (advised from a warning at step {at}, advice only until then)" if at is not None else ""


def render_text(report: Report) -> str:
    out: list[str] = []
    for run in report.runs:
        model = run.model.get("class") or run.model.get("name_or_path") or "model unknown"
        seg = f"segment {run.segment}, " if run.segment is not None else ""
        out.append(f"== {run.source}  ({seg}{run.format}, {run.steps} logged steps, {model})")
        if run.file and run.file != run.source:
            out.append(f"read: {run.file}")
        if run.model.get("source"):  # model facts a reader or --model gave, not a run header's
            out.append(f"model: {model_line(run.model)}")
        if run.config_from:
            out.append(f"config: {config_line(run.config, run.config_from)}")
        if run.names:
            out.append(f"names: {names_line(run.names)}")
        out.append(f"verdict: {verdict_line(run)}")
        if run.verdict == "cannot_judge":
            out.append(f"  {needs_text(run)}")
        elif run.status and run.verdict != "incomplete":
            out.append(f"  status: {run.status} — {run.status_note}")
        for w in run.warnings:
            out.append(f"  note: {w}")
        out.extend(coverage_lines(run))
        out.extend(device_lines(run))
        for title, group in (("findings:", run.training_findings),
                             ("pre-flight (the recipe, checked when training began; not part of the verdict):",
                              run.preflight_findings)):
            if group:
                out.append(title)
            for f in group:
                onset = f" (onset ~{f.onset_step})" if f.onset_step is not None else ""
                variant = f" → {f.variant}" if f.variant else ""
                out.append(f"  step {f.step} [{f.severity}] {f.detector}{onset}{variant}: {f.message}")
                shown = [(k, v) for k, v in f.evidence.items() if k not in ANNOTATIONS]
                if shown:
                    out.append("      evidence: " + ", ".join(f"{k}={_fmt(v)}" for k, v in shown[:8]))
                out.extend(f"      {line}" for line in annotation_lines(run, f))
        if run.recommendations:
            out.append("recommendations:")
        for r in shown_recommendations(run.recommendations):
            out.append(f"  {rec_title(r)} — from {r['detector']} at step {r['step']}{advised_note(r)}")
            out.extend(f"      {r[k]}" for k in ("python", "cli_flags") if r.get(k))
            for reason in r["reasons"][1:]:
                out.append(f"      why: {reason}")
            for key, advice in r.get("extra", {}).items():
                out.append(f"      also: {key} {advice}")
        if run.notes:
            from grpo_monitor.analysis.explain import render_lines

            out.append("Looks odd but is normal:")
            out.extend(render_lines(run.notes))
        if run.series:
            out.append("curves:")
        for name, pts in run.series.items():
            vals = [v for _, v in pts]
            out.append(f"  {name:<26} {sparkline(vals)}  {vals[0]:.4g} → {vals[-1]:.4g}  (steps {pts[0][0]}–{pts[-1][0]})")
        out.append("")
    for path, err in report.errors:
        out.append(f"== {path}\nverdict: UNREADABLE — {err}\n")
    for path, err in report.skipped:
        out.append(f"skipped {path}: {err}")
    if len(report.runs) + len(report.errors) > 1:
        out.append(comparison_table(report))
    lineage = report.lineage_verdict
    if lineage is not None:
        acted = [str(r.segment) for r in report.runs if report.acted_on(r)]
        whose = f"segment{'s' if len(acted) > 1 else ''} {', '.join(acted)}"
        after = {"cured": "the segments after it have no warning or critical finding",
                 "critical": "not cured: the segments after it still have a critical finding",
                 "warning": "not cured: the segments after it still have a warning finding",
                 "cannot_judge": "the segments after it could not be judged",
                 "incomplete": "the segments after it stopped before their end"}[lineage]
        out.append(f"lineage: {lineage} — the findings of {whose} were acted on by the restart that followed; {after} "
                   "(the exit code counts every segment's findings)")
    return "\n".join(out).rstrip() + "\n"


def annotation_lines(run: RunReport, f: Finding) -> list[str]:
    """What the finding has cost (when raised, and to the end of the run) and when its limit will be reached."""
    from grpo_monitor.core.cost import cost_phrase
    from grpo_monitor.core.forecast import forecast_phrase

    out = []
    if f.evidence.get("cost"):
        out.append(f"cost when raised: {cost_phrase(f.evidence['cost'])}")
    to_end = next((c["to_end"] for c in run.cost.get("findings", [])
                   if c["detector"] == f.detector and c["step"] == f.step and c["severity"] == f.severity), None)
    if to_end and to_end.get("to_step") != f.step:
        out.append(f"cost to the end of the run (step {to_end.get('to_step')}): {cost_phrase(to_end)}")
    when = forecast_phrase(f.evidence.get("forecast"))  # "" for a trend the backtest does not trust
    if when:
        out.append(f"time to failure: {when}")
    return out


def _table_rows(report: Report) -> list[tuple[str, ...]]:
    rows = []
    for r in report.runs:
        dets = ", ".join(sorted({f.detector for f in r.training_findings if f.severity != "info"})) or "—"
        variants = ", ".join(sorted({x["variant"] + ("" if x.get("status", "recommended") == "recommended" else f" ({x['status']})")
                                     for x in shown_recommendations(r.recommendations)})) or "—"
        judged = f"{len(r.judged_by)}/{len(r.judged_by) + len(r.not_judged)}" if r.coverage else "—"
        rows.append((r.source, r.format, str(r.steps), r.verdict, judged, dets, variants))
    for path, _ in report.errors:
        rows.append((path, "—", "—", "unreadable", "—", "—", "—"))
    return rows


def comparison_table(report: Report) -> str:
    rows = [("run", "format", "steps", "verdict", "judged", "findings", "variants"), *_table_rows(report)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines) + "\n"


def render_markdown(report: Report) -> str:
    out = ["# grpo-monitor report", ""]
    if len(report.runs) + len(report.errors) > 1:
        out += ["| run | format | steps | verdict | judged | findings | variants |", "|---|---|---|---|---|---|---|"]
        for row in _table_rows(report):
            out.append(f"| `{row[0]}` | " + " | ".join(row[1:]) + " |")
        out.append("")
    for r in report.runs:
        out += [f"## `{r.source}`", "", f"**Verdict: {r.verdict}** — {r.format}, {r.steps} logged steps, read from `{r.file or r.source}`.", ""]
        if r.names:
            out += [f"Names: {names_line(r.names)}.", ""]
        if r.verdict == "cannot_judge":
            out += [f"The monitor could not see this run: no failure detector had the inputs it needs. {needs_text(r)}", ""]
        elif r.status:
            out += [f"Status: {r.status} — {r.status_note}", ""]
        if r.skipped:
            out += [f"Skipped {r.skipped['count']} unreadable record(s), each alone (the rest was read):", ""]
            out += [f"- `{w}`" for w in r.skipped["where"]] + [""]
        if r.coverage:
            out += [f"Judged by: {', '.join(f'`{d}`' for d in r.judged_by) or 'no failure detector'}.", ""]
            for det, why in r.not_judged.items():
                out.append(f"- could not judge `{det}`: {why}")
            if r.checked_by:
                out += ["", f"Also checked: {', '.join(f'`{d}`' for d in r.checked_by)}."]
            for rule, why in r.rules_not_checked.items():
                out.append(f"- could not check team rule `{rule}`: {why}")
            out.append("")
        if r.device:
            lines = device_lines(r)
            out += [f"**{lines[0][:1].upper()}{lines[0][1:]}**", ""] + [f"- {line.strip()}" for line in lines[1:]] + [""]
        if r.findings:
            out += ["| step | severity | detector | onset | variant | message |", "|---|---|---|---|---|---|"]
            for f in r.findings:
                out.append(f"| {f.step} | {f.severity} | `{f.detector}` | {f.onset_step if f.onset_step is not None else '—'} "
                           f"| {f.variant or '—'} | {f.message.replace('|', '/')} |")
            out.append("")
            for f in r.findings:
                out += [f"- `{f.detector}` at step {f.step}: {line}" for line in annotation_lines(r, f)]
            out.append("")
        for rec in shown_recommendations(r.recommendations):
            heading = rec_title(rec) + advised_note(rec)
            out += [f"### {heading[:1].upper()}{heading[1:]}", ""]
            if rec.get("python"):
                out += ["```python", rec["python"], "```", ""]
            if rec.get("cli_flags"):
                out += ["```bash", rec["cli_flags"], "```", ""]
            out += [f"- {reason}" for reason in rec["reasons"]]
            out += [f"- also: **{key}** {advice}" for key, advice in (rec.get("extra") or {}).items()] + [""]
        if r.notes:
            out += ["### Looks odd but is normal", ""]
            for n in r.notes:
                out.append(f"- **{n['id']}**: {n['pattern']}. *Why it is fine:* {n['why']} *Unless:* {n['unless']}")
            out.append("")
        if r.series:
            out += ["| curve | shape | first | last |", "|---|---|---|---|"]
            for name, pts in r.series.items():
                vals = [v for _, v in pts]
                out.append(f"| `{name}` | `{sparkline(vals, 32)}` | {vals[0]:.4g} | {vals[-1]:.4g} |")
            out.append("")
    for path, err in report.errors:
        out += [f"## `{path}`", "", f"**Unreadable** — {err}", ""]
    return "\n".join(out)
