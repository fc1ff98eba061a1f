"""``grpo-monitor compare RUN RUN ...``: the runs ``analyze`` reads, side by side (``analysis.compare``), as
text, ``--json`` or an ``--html`` page. One path holding several runs (a restarted run's lineage, a folder
of runs) compares them. Fewer than two runs, or a path that cannot be read, is one line on stderr and exit 2;
a comparison made exits 0 (the findings are what it shows, as ``analyze`` reports them).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from grpo_monitor.analysis.analyze import AnalyzeOptions, analyze
from grpo_monitor.analysis.compare import Comparison, CompareError, compare
from grpo_monitor.app.analyze_cmd import _json_default, write_page
from grpo_monitor.core.exit_codes import ExitCode


def comparison_of(paths: Sequence[str], options: AnalyzeOptions | None = None) -> Comparison:
    """The comparison of the runs under ``paths``; a ``ValueError`` whose text is one line otherwise (a path
    that cannot be read: ``readers.SourceError``; fewer than two runs: ``CompareError``)."""
    unreadable: list[str] = []
    report = analyze(list(paths), options, on_unreadable=unreadable.append)
    if not report.runs and unreadable:
        raise CompareError(unreadable[0])
    return compare(report)


def json_text(cmp: Comparison) -> str:
    return json.dumps(cmp.to_dict(), default=_json_default, allow_nan=False)


def compare_json(paths: Sequence[str]) -> dict[str, Any]:
    """``compare --json``'s document (``grpo-monitor mcp`` returns it)."""
    return json.loads(json_text(comparison_of(paths)))


def run_cli(paths: Sequence[str], options: AnalyzeOptions, *, as_json: bool = False, html: str | None = None) -> int:
    try:
        cmp = comparison_of(paths, options)
    except ValueError as exc:
        print(f"grpo-monitor: {' '.join(str(exc).split())}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    from grpo_monitor.analysis.compare_render import render_compare_text

    if as_json:
        print(json_text(cmp))
    else:
        sys.stdout.write(render_compare_text(cmp))
    if html:
        from grpo_monitor.analysis.compare_render import render_compare_html

        if not write_page(html, render_compare_html(cmp), "HTML comparison"):
            return ExitCode.BAD_INPUT
    return ExitCode.CLEAN
