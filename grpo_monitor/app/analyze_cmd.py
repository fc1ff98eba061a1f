"""``grpo-monitor analyze``: the report on stdout (text or ``--json``), ``--markdown``/``--html`` files, the
exit code; and, on a terminal, one progress line on stderr for an analysis that runs past a couple of seconds.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from grpo_monitor.analysis.analyze import AnalyzeOptions, OptionsError, analyze
from grpo_monitor.analysis.render import render_markdown, render_text
from grpo_monitor.core.exit_codes import ExitCode


class Progress:
    """One line on stderr, rewritten in place, once an analysis has run past ``after`` seconds: which run,
    and how far its replay is. Only on a terminal: a pipe or a CI log gets nothing, and stdout (the report,
    ``--json``) is never touched.

    >>> import io
    >>> p = Progress(io.StringIO(), after=0.0, tty=True)
    >>> p.step("runs/a", 500, 1000)
    >>> p.stream.getvalue().split("\x1b[2K")[-1]
    'grpo-monitor: runs/a: replayed 500 of 1000 steps (50%)'
    """

    def __init__(self, stream: TextIO | None = None, after: float = 2.0, tty: bool | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.after = after
        self.tty = self.stream.isatty() if tty is None else tty
        self.started = time.monotonic()
        self._next = 0.0
        self._shown = False

    def step(self, label: str, done: int, total: int) -> None:
        now = time.monotonic()
        if not self.tty or now - self.started < self.after or (now < self._next and done < total):
            return
        self._next = now + 0.2  # a few redraws a second are enough to read
        share = f" ({100 * done // total}%)" if total else ""
        self.stream.write(f"\r\x1b[2Kgrpo-monitor: {label}: replayed {done} of {total} steps{share}")
        self.stream.flush()
        self._shown = True

    def done(self) -> None:
        if self._shown:
            self.stream.write("\r\x1b[2K")
            self.stream.flush()
            self._shown = False


def run_cli(paths: Sequence[str], options: AnalyzeOptions, *, as_json: bool = False, markdown: str | None = None,
            html: str | None = None, on_report: Callable[[Any], None] | None = None,
            progress: Progress | None = None) -> int:
    """The ``analyze`` verb: the report out, the exit code; ``on_report(report)`` is called with the report
    once it is out (``--alerts`` sends it on)."""
    from grpo_monitor.readers import SourceError

    progress = progress if progress is not None else Progress()
    try:
        report = analyze(paths, options, on_unreadable=lambda line: _say(line, progress), progress=progress.step)
    except OptionsError as exc:  # a --map, --model or --rules that cannot be used
        progress.done()
        print(f"grpo-monitor: {exc}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    except SourceError:  # a path given that cannot be read: its line is out already
        progress.done()
        return ExitCode.BAD_INPUT
    progress.done()
    if not report.runs and not report.errors:
        why = "; ".join(f"{p}: {e}" for p, e in report.skipped[:3])
        print(f"grpo-monitor: {', '.join(map(str, paths))}: no run could be read" + (f" (skipped {why})" if why else ""),
              file=sys.stderr)
        return ExitCode.BAD_INPUT
    if as_json:
        print(json_text(report))
    else:
        sys.stdout.write(render_text(report))
    if markdown and not write_page(markdown, render_markdown(report), "Markdown report"):
        return ExitCode.BAD_INPUT
    if html:
        from grpo_monitor.analysis.html_report import render_html

        if not write_page(html, render_html(report), "HTML report"):
            return ExitCode.BAD_INPUT
    if on_report is not None:
        on_report(report)
    return report.exit_code


def write_page(path: str, text: str, what: str) -> bool:
    """Write a report file the verb was asked for; where it cannot be, one line on stderr naming the file
    and why, and False (the report already printed stays as it is)."""
    try:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
    except OSError as exc:
        print(f"grpo-monitor: {path}: cannot write the {what} ({exc.strerror or exc})", file=sys.stderr)
        return False
    return True


def _say(line: str, progress: Progress) -> None:
    progress.done()
    print(f"grpo-monitor: {line}", file=sys.stderr)


def json_text(report: Any) -> str:
    """The report as ``--json`` prints it (and ``grpo-monitor mcp`` returns it)."""
    return json.dumps(report.to_dict(), default=_json_default, allow_nan=False)


def _json_default(obj: Any) -> Any:
    try:
        return obj.item()
    except Exception:
        return str(obj)
