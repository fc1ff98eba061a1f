"""``analyze --html FILE``: one self-contained page to share, per analysed run its verdict, curves with the
findings marked at their steps, each finding's evidence, cost and time to failure, the recommended
``GRPOConfig`` diff and the "looks odd but is normal" notes.

The curves are drawn by matplotlib (the ``report`` extra) into inline SVG with its text as paths, and the
styles are inline too: the page fetches nothing (no script, font, stylesheet or image from anywhere), so it
opens the same from a mail attachment, a CI artifact or a laptop offline. matplotlib is used through its
object API (``matplotlib.figure.Figure``), never pyplot, so no global backend state is touched.
"""

from __future__ import annotations

import html
import io
import json
import re
from typing import Any

from grpo_monitor.analysis.render import advised_note, annotation_lines, coverage_lines, model_line, verdict_line
from grpo_monitor.analysis.run_report import ANNOTATIONS, Report, RunReport, needs_text, shown_recommendations
from grpo_monitor.core.recommend import title as rec_title

SEVERITY_COLOURS = {"info": "#6b7280", "warning": "#d97706", "critical": "#dc2626"}
VERDICT_COLOURS = {"healthy": "#15803d", "warning": "#d97706", "critical": "#dc2626", "incomplete": "#6b7280",
                   "cannot_judge": "#6b7280"}
# The curves drawn, in this order, when the run logged them (at most this many panels).
MAX_PANELS = 9
CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px auto;max-width:1180px;
color:#111827;background:#fff;line-height:1.45}
h1{font-size:22px;margin:0 0 4px} h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #e5e7eb;padding-bottom:4px}
h3{font-size:15px;margin:18px 0 6px} .meta{color:#4b5563;font-size:13px}
.verdict{display:inline-block;color:#fff;font-weight:700;padding:4px 12px;border-radius:6px;margin:8px 0;font-size:15px}
table{border-collapse:collapse;width:100%;font-size:13px;margin:6px 0}
th,td{border:1px solid #e5e7eb;padding:4px 8px;text-align:left;vertical-align:top} th{background:#f9fafb}
.sev{font-weight:700} pre{background:#f3f4f6;padding:8px 10px;border-radius:6px;overflow-x:auto;font-size:12.5px}
.curves svg{width:100%;height:auto} .note{color:#374151;font-size:13px} .muted{color:#6b7280;font-size:12.5px}
ul{font-size:13.5px} details summary{cursor:pointer;color:#1f2937} .ann{font-size:12.5px;color:#1f2937;margin:2px 0}
"""


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (dict, list)):
        text = json.dumps(v, default=str)
        return text if len(text) <= 300 else text[:297] + "..."
    return str(v)


def curves_svg(run: RunReport, width: float = 11.0) -> str:
    """The run's curves as one inline SVG: a panel per curve, every warning/critical finding a vertical line
    at its step (its onset to its step shaded), coloured by severity and named in the legend."""
    from matplotlib.figure import Figure

    names = list(run.series)[:MAX_PANELS]
    if not names:
        return ""
    cols = 3 if len(names) > 4 else 2 if len(names) > 1 else 1
    rows = (len(names) + cols - 1) // cols
    fig = Figure(figsize=(width, 2.6 * rows + 0.6), dpi=96)
    axes = fig.subplots(rows, cols, squeeze=False)
    marked = [f for f in run.findings if f.severity in ("warning", "critical")]
    for ax in axes.flat[len(names):]:
        ax.set_visible(False)
    handles: dict[str, Any] = {}
    for ax, name in zip(axes.flat, names):
        pts = run.series[name]
        ax.plot([s for s, _ in pts], [v for _, v in pts], color="#2563eb", linewidth=1.2)
        ax.set_title(name, fontsize=10)
        ax.tick_params(labelsize=8)
        ax.grid(True, color="#e5e7eb", linewidth=0.6)
        for f in marked:
            colour = SEVERITY_COLOURS[f.severity]
            if f.onset_step is not None and f.onset_step < f.step:
                ax.axvspan(f.onset_step, f.step, color=colour, alpha=0.08, linewidth=0)
            line = ax.axvline(f.step, color=colour, linewidth=1.1, linestyle="--")
            handles.setdefault(f"{f.detector} ({f.severity}) @ {f.step}", line)
    if handles:
        fig.legend(list(handles.values())[:8], list(handles)[:8], loc="lower center", ncol=min(4, len(handles)),
                   fontsize=8, frameon=False)
        fig.subplots_adjust(bottom=0.6 / (2.6 * rows + 0.6) + 0.08)
    fig.tight_layout(rect=(0, 0.07 if handles else 0, 1, 1))
    return svg_text(fig)


def svg_text(fig: Any) -> str:
    """A matplotlib figure as inline SVG (the ``<svg>`` element alone)."""
    buf = io.StringIO()
    # No date, fixed ids: the same run gives the same page.
    fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    svg = buf.getvalue()
    return svg[svg.index("<svg"):]


def _finding_rows(run: RunReport) -> list[str]:
    out = ["<table><tr><th>step</th><th>severity</th><th>detector</th><th>onset</th><th>variant</th>"
           "<th>what it means</th></tr>"]
    for i, f in enumerate(run.findings):
        colour = SEVERITY_COLOURS.get(f.severity, "#111827")
        evidence = [(k, v) for k, v in f.evidence.items() if k not in ANNOTATIONS]
        ev = "".join(f"<tr><td>{_e(k)}</td><td>{_e(_fmt(v))}</td></tr>" for k, v in evidence)
        ann = "".join(f'<div class="ann">{_e(line)}</div>' for line in annotation_lines(run, f))
        out.append(
            f"<tr><td>{f.step}</td><td class=\"sev\" style=\"color:{colour}\">{_e(f.severity)}</td>"
            f"<td><code>{_e(f.detector)}</code></td><td>{'' if f.onset_step is None else f.onset_step}</td>"
            f"<td>{_e(f.variant or '—')}</td><td>{_e(f.message)}{ann}"
            + (f"<details><summary>evidence</summary><table>{ev}</table></details>" if ev else "")
            + _samples_block(run.samples_of(i)) + "</td></tr>")
    out.append("</table>")
    return out


def _samples_block(picks: list[dict[str, Any]]) -> str:
    """A finding's samples (``core.finding_samples``), collapsed: where each is in the run, its numbers, its excerpt."""
    if not picks:
        return ""
    rows = "".join(
        f"<tr><td>{_e(p.get('step'))}</td><td>{_e(p.get('index'))}</td><td>{_e(_fmt(p.get('reward')))}</td>"
        f"<td>{_e(_fmt(p.get('length')))}</td><td>{'yes' if p.get('truncated') else ''}</td>"
        f"<td><code>{_e(p.get('excerpt') or '')}</code></td></tr>" for p in picks)
    why = picks[0].get("why") or ""
    return (f'<details class="samples"><summary>samples ({len(picks)}: {_e(why)})</summary><table><tr><th>step</th>'
            f"<th>index</th><th>reward</th><th>length</th><th>truncated</th><th>excerpt</th></tr>{rows}</table></details>")


def _recommendations(run: RunReport) -> list[str]:
    out: list[str] = []
    for r in shown_recommendations(run.recommendations):
        heading = rec_title(r) + advised_note(r)
        out.append(f"<h3>{_e(heading[:1].upper() + heading[1:])}</h3>")
        out.append(f'<div class="muted">from <code>{_e(r.get("detector"))}</code> at step {_e(r.get("step"))}'
                   f' · status: {_e(r.get("status", "recommended"))}</div>')
        for key in ("python", "cli_flags"):
            if r.get(key):
                out.append(f"<pre><code>{_e(r[key])}</code></pre>")
        reasons = list(r.get("reasons") or []) + [f"also: {k} {v}" for k, v in (r.get("extra") or {}).items()]
        if reasons:
            out.append("<ul>" + "".join(f"<li>{_e(x)}</li>" for x in reasons) + "</ul>")
    return out


def render_run(run: RunReport) -> str:
    colour = VERDICT_COLOURS.get(run.verdict, "#111827")
    parts = [f"<section><h2>{_e(run.source)}</h2>",
             f'<div class="meta">{_e(run.format)}, {run.steps} logged steps · read from {_e(run.file or run.source)}'
             + (f" · model: {_e(model_line(run.model))}" if run.model else "") + "</div>",
             f'<div class="verdict" style="background:{colour}">verdict: {_e(verdict_line(run))}</div>']
    if run.verdict == "cannot_judge":
        parts.append(f'<p class="note">{_e(needs_text(run))}</p>')
    parts += [f'<div class="muted">{_e(line)}</div>' for line in coverage_lines(run)]
    parts += [f'<div class="muted">note: {_e(w)}</div>' for w in run.warnings]
    spent = (run.cost or {}).get("run")
    if spent:
        from grpo_monitor.core.cost import cost_phrase

        parts.append(f'<p class="note">run as logged: {_e(cost_phrase(spent))}</p>')
    svg = curves_svg(run)
    if svg:
        parts += ["<h3>Curves</h3>", f'<div class="curves">{svg}</div>']
    parts.append("<h3>Findings</h3>")
    parts += _finding_rows(run) if run.findings else ['<p class="note">none</p>']
    if run.recommendations:
        parts.append("<h3>Recommended changes</h3>")
        parts += _recommendations(run)
    if run.notes:
        parts.append("<h3>Looks odd but is normal</h3><ul>")
        for n in run.notes:
            parts.append(f"<li><b>{_e(n.get('id'))}</b>: {_e(n.get('pattern'))}. <i>Why it is fine:</i> "
                         f"{_e(n.get('why'))} <i>Unless:</i> {_e(n.get('unless'))}</li>")
        parts.append("</ul>")
    parts.append("</section>")
    return "\n".join(parts)


def render_html(report: Report, title: str = "grpo-monitor report") -> str:
    """The whole page as one string."""
    body = [render_run(r) for r in report.runs]
    for path, err in report.errors:
        body.append(f"<section><h2>{_e(path)}</h2><p class=\"note\">unreadable — {_e(err)}</p></section>")
    page = ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{_e(title)}</title><style>{CSS}</style></head><body>"
            f"<h1>{_e(title)}</h1><div class=\"meta\">{len(report.runs)} run{'s' if len(report.runs) != 1 else ''}"
            "</div>\n" + "\n".join(body) + "\n</body></html>\n")
    return page


# What a page may hold that would make a browser fetch something: none of it is written, and a test keeps it so.
# (``url(#id)``, the SVG's clip paths, points into the page itself.)
FETCHING = re.compile(r"<script|<link|<img|<iframe|@import|url\(\s*[\"']?(?!#)|(?:src|href)\s*=\s*[\"']?(?:https?:)?//",
                      re.I)
