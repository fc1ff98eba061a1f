"""A ``Comparison`` (``analysis.compare``) as text and as one self-contained HTML page.

Text: the runs, the settings that differ as a table, each curve's sparklines one under the other on one step
axis and one scale (a run that logged fewer steps leaves its columns blank), the findings, and a sentence per
finding kind that sets the runs apart. HTML: the same, the curves overlaid per metric (matplotlib, as
``analyze --html`` draws them), each run's findings marked at their onset in that run's colour.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from grpo_monitor.analysis.compare import Comparison
from grpo_monitor.analysis.render import sparkline, verdict_line

WIDTH = 48
# One colour per run (matplotlib's tab10 without its red and orange, which mark severities elsewhere).
RUN_COLOURS = ("#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22")


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (dict, list)):
        text = json.dumps(v, default=str)
        return text if len(text) <= 60 else text[:57] + "..."
    return str(v)


def _table(rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [indent + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, indent + "  ".join("-" * w for w in widths))
    return lines


def step_span(cmp: Comparison, metric: str) -> tuple[int, int] | None:
    steps = [s for r in cmp.runs for s, _ in r.series.get(metric, ())]
    return (min(steps), max(steps)) if steps else None


def aligned_columns(points: Sequence[tuple[int, float]], span: tuple[int, int], width: int = WIDTH) -> list[float | None]:
    """A curve on the shared step axis: the mean of its points in each column, a column between two logged
    points carrying the one before, None outside the steps the run logged.

    >>> aligned_columns([(1, 1.0), (3, 3.0)], (1, 6), width=6)
    [1.0, 1.0, 3.0, None, None, None]
    """
    lo, hi = span
    n = min(width, hi - lo + 1)
    sums, counts = [0.0] * n, [0] * n
    for s, v in points:
        i = min(n - 1, (s - lo) * n // (hi - lo + 1))
        sums[i] += v
        counts[i] += 1
    out: list[float | None] = [sums[i] / counts[i] if counts[i] else None for i in range(n)]
    filled = [i for i in range(n) if counts[i]]
    if filled:
        for i in range(filled[0] + 1, filled[-1] + 1):
            if out[i] is None:
                out[i] = out[i - 1]
    return out


def aligned_sparklines(cmp: Comparison, metric: str, width: int = WIDTH) -> list[tuple[str, str]]:
    """Each run's sparkline of ``metric`` on the shared step axis and one scale: (label, line)."""
    span = step_span(cmp, metric)
    if span is None:
        return []
    cols = {label: aligned_columns(r.series.get(metric, ()), span, width) for label, r in zip(cmp.labels, cmp.runs)}
    values = [v for c in cols.values() for v in c if v is not None]
    lo, hi = min(values), max(values)
    out = []
    for label, c in cols.items():
        shown = [i for i, v in enumerate(c) if v is not None]
        if not shown:
            out.append((label, " " * len(c)))
            continue
        a, b = shown[0], shown[-1] + 1
        # ``lo`` and ``hi`` go first so every run is drawn on the metric's one scale, then are dropped.
        bars = sparkline([lo, hi, *c[a:b]], width=b - a + 2)[2:]  # type: ignore[list-item]
        out.append((label, " " * a + bars + " " * (len(c) - b)))
    return out


def render_compare_text(cmp: Comparison) -> str:
    out = [f"grpo-monitor compare: {len(cmp.runs)} runs"]
    out += _table([("run", "source", "format", "steps", "verdict")]
                  + [(label, r.source, r.format, str(r.steps), verdict_line(r)) for label, r in zip(cmp.labels, cmp.runs)])
    for path, err in cmp.errors:
        out.append(f"  unreadable: {path}: {err}")
    out.append("")
    none = [label for label, c in zip(cmp.labels, cmp.configs) if c is None]
    if cmp.config_diff:
        shown = [label for label, c in zip(cmp.labels, cmp.configs) if c is not None]
        out.append("config (settings that differ):")
        out += _table([("setting", *shown)]
                      + [(k, *(_cell(v[label]) if label in v else "—" for label in shown)) for k, v in cmp.config_diff.items()])
    elif len(cmp.configs) - len(none) >= 2:
        out.append("config: the recorded settings are the same")
    if none:
        out.append(f"  no config recorded: {', '.join(none)}")
    out.append("")
    name_w = max(len(label) for label in cmp.labels)
    for metric in cmp.metrics:
        span = step_span(cmp, metric)
        out.append(f"{metric}  (steps {span[0]}–{span[1]}, one scale)" if span else metric)
        for label, line in aligned_sparklines(cmp, metric):
            pts = cmp.runs[cmp.labels.index(label)].series.get(metric)
            ends = f"{pts[0][1]:.4g} → {pts[-1][1]:.4g}" if pts else "not logged"
            out.append(f"  {label.ljust(name_w)}  {line}  {ends}")
    out.append("")
    out.append("findings:")
    for label, r in zip(cmp.labels, cmp.runs):
        shown = [f for f in r.training_findings if f.severity in ("warning", "critical")]
        out.append(f"  {label}: {verdict_line(r)}" + ("" if shown else " — no warning or critical finding"))
        for f in shown:
            onset = f" (onset ~{f.onset_step})" if f.onset_step is not None else ""
            out.append(f"    step {f.step} [{f.severity}] {f.detector}{onset}: {f.message}")
    if cmp.differences:
        out += ["", "what differs:"]
        out += [f"  - {d.sentence}" for d in cmp.differences]
    return "\n".join(out).rstrip() + "\n"


def overlay_svg(cmp: Comparison, width: float = 11.0) -> str:
    """One panel per metric, every run's curve in its colour, each run's warning/critical findings a dashed
    line at their onset (their step where no onset is known) in the same colour."""
    from matplotlib.figure import Figure

    from grpo_monitor.analysis.html_report import MAX_PANELS, svg_text

    names = cmp.metrics[:MAX_PANELS]
    if not names:
        return ""
    cols = 3 if len(names) > 4 else 2 if len(names) > 1 else 1
    rows = (len(names) + cols - 1) // cols
    fig = Figure(figsize=(width, 2.6 * rows + 0.8), dpi=96)
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax in axes.flat[len(names):]:
        ax.set_visible(False)
    handles: dict[str, Any] = {}
    for ax, name in zip(axes.flat, names):
        ax.set_title(name, fontsize=10)
        ax.tick_params(labelsize=8)
        ax.grid(True, color="#e5e7eb", linewidth=0.6)
        for i, (label, run) in enumerate(zip(cmp.labels, cmp.runs)):
            colour = RUN_COLOURS[i % len(RUN_COLOURS)]
            pts = run.series.get(name)
            if pts:
                line, = ax.plot([s for s, _ in pts], [v for _, v in pts], color=colour, linewidth=1.2)
                handles.setdefault(label, line)
            marked = dict.fromkeys((f.detector, f.onset_step if f.onset_step is not None else f.step)
                                   for f in run.training_findings if f.severity in ("warning", "critical"))
            for detector, at in marked:  # a warning and the critical of one episode share their onset: one line
                mark = ax.axvline(at, color=colour, linewidth=1.0, linestyle="--")
                handles.setdefault(f"{label}: {detector} from step {at}", mark)
    fig.legend(list(handles.values())[:12], list(handles)[:12], loc="lower center", ncol=min(3, len(handles)),
               fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.1 + 0.02 * min(4, len(handles) // 3), 1, 1))
    return svg_text(fig)


def render_compare_html(cmp: Comparison, title: str = "grpo-monitor compare") -> str:
    from grpo_monitor.analysis.html_report import CSS, VERDICT_COLOURS, _e, _finding_rows

    body = ['<section><h2>Runs</h2><table><tr><th></th><th>run</th><th>source</th><th>format</th><th>steps</th>'
            '<th>verdict</th></tr>']
    for i, (label, r) in enumerate(zip(cmp.labels, cmp.runs)):
        colour = RUN_COLOURS[i % len(RUN_COLOURS)]
        body.append(f'<tr class="run"><td><span style="color:{colour}">■</span></td><td>{_e(label)}</td>'
                    f"<td>{_e(r.source)}</td><td>{_e(r.format)}</td><td>{r.steps}</td>"
                    f'<td><span class="verdict" style="background:{VERDICT_COLOURS.get(r.verdict, "#111827")}">'
                    f"{_e(r.verdict)}</span></td></tr>")
    body.append("</table>")
    body += [f'<div class="muted">unreadable: {_e(p)} — {_e(e)}</div>' for p, e in cmp.errors]
    body.append("</section>")
    shown = [label for label, c in zip(cmp.labels, cmp.configs) if c is not None]
    body.append('<section><h2>Config: the settings that differ</h2>')
    if cmp.config_diff:
        body.append('<table class="config"><tr><th>setting</th>' + "".join(f"<th>{_e(x)}</th>" for x in shown) + "</tr>")
        for k, v in cmp.config_diff.items():
            body.append(f"<tr><td><code>{_e(k)}</code></td>"
                        + "".join(f"<td>{_e(_cell(v[x])) if x in v else '—'}</td>" for x in shown) + "</tr>")
        body.append("</table>")
    else:
        body.append('<p class="note">' + ("the recorded settings are the same" if len(shown) >= 2
                                          else "the logs record too little config to compare") + "</p>")
    missing = [label for label, c in zip(cmp.labels, cmp.configs) if c is None]
    if missing:
        body.append(f'<div class="muted">no config recorded: {_e(", ".join(missing))}</div>')
    body.append("</section>")
    if cmp.differences:
        body.append('<section><h2>What differs</h2><ul class="differences">')
        body += [f"<li>{_e(d.sentence)}</li>" for d in cmp.differences]
        body.append("</ul></section>")
    svg = overlay_svg(cmp)
    if svg:
        body += ['<section><h2>Curves</h2>', f'<div class="curves">{svg}</div></section>']
    for label, r in zip(cmp.labels, cmp.runs):
        body.append(f"<section><h2>{_e(label)}: findings</h2>")
        body.append(f'<div class="verdict" style="background:{VERDICT_COLOURS.get(r.verdict, "#111827")}">'
                    f"verdict: {_e(verdict_line(r))}</div>")
        body += _finding_rows(r) if r.findings else ['<p class="note">none</p>']
        body.append("</section>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{_e(title)}</title><style>{CSS}</style></head><body>"
            f"<h1>{_e(title)}</h1><div class=\"meta\">{len(cmp.runs)} runs: {_e(', '.join(cmp.labels))}</div>\n"
            + "\n".join(body) + "\n</body></html>\n")
