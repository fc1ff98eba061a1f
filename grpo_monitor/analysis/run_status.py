"""How a run ended, as its log tells: finished, stopped by the monitor, restarted, interrupted, or
incomplete (no final summary, or steps its writer could not write), with the sentence that says so.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from collections.abc import Mapping
from typing import Any

from grpo_monitor.analysis.run_report import INTERRUPTED

def write_loss(src: Any) -> Any:
    """What a run directory's writer could not write (``core.runlog_writer.WriteLoss``), or None."""
    run = getattr(src, "run", None)
    if run is None or src.format != "run_dir":
        return None
    from grpo_monitor.core.runlog_writer import write_losses

    return write_losses(getattr(run, "notes", None) or [])


def reached_max_steps(config: Mapping[str, Any] | None, last_step: Any) -> bool:
    """The run logged its ``max_steps``-th step: it trained to its end whether or not its final summary was
    written whole. ``analyze`` and the dashboard both call such a run finished.

    >>> reached_max_steps({"max_steps": 200}, 200), reached_max_steps({"max_steps": 200}, 199), reached_max_steps({}, 5)
    (True, False, False)
    """
    max_steps = (config or {}).get("max_steps")
    return (type(max_steps) is int and max_steps > 0 and type(last_step) is int and last_step >= max_steps)


def run_status(src: Any) -> tuple[str | None, str]:
    """Whether a run finished: a run directory's final summary, a restart the monitor asked for, an
    interruption its log records (Ctrl-C, a crash), or none of them; a log that ends in a traceback
    (a console log's ``KeyboardInterrupt``) is an interrupted run. A run whose writer could not write some
    of its steps is ``incomplete`` whatever else it did: its findings cover only the steps in the log."""
    run = getattr(src, "run", None)
    last = src.steps[-1][0] if src.steps else None
    at = f" after step {last}, the last it logged," if last is not None else " before its first logged step,"
    ended_by = (getattr(src, "meta", None) or {}).get("ended_by")
    if ended_by and (run is None or src.format != "run_dir"):
        how = "interrupted (Ctrl-C)" if "KeyboardInterrupt" in ended_by else f"stopped by {ended_by}"
        return INTERRUPTED, (f"the log ends in a traceback: the run was {how}{at} before its end; the findings "
                             "cover the steps logged so far")
    if run is None or src.format != "run_dir":
        return None, ""
    loss = write_loss(src)
    if loss is not None and (loss.steps or loss.records.get("summary") or loss.uncounted):
        return "incomplete", loss.line(len(src.steps)) + "; the findings cover the steps in the log"
    halt = next((n for n in reversed(getattr(run, "notes", None) or []) if n.get("event") == "stopped"), None)
    if halt is not None:  # auto-restart stopped it on a finding no configuration change cures
        return "stopped", f"{halt.get('message')}; next: {halt.get('advice')}"
    if getattr(run, "restarts", None):  # its summary is written as it stops: the restart says more
        return "restarted", "stopped by the monitor to restart with a variant (see its segments)"
    if getattr(run, "summary", None) is not None:
        return None, ""
    stop = next((n for n in reversed(getattr(run, "notes", None) or []) if n.get("event") == INTERRUPTED), None)
    if stop is not None:
        return INTERRUPTED, f"{stop.get('message') or 'the run was interrupted'}; the findings cover the steps logged so far"
    if not src.steps:
        return "incomplete", "no logged step: the run stopped before its first log, or has not logged yet"
    last = src.steps[-1][0]
    config = src.context.config or {}
    max_steps = config.get("max_steps")
    of = f" of max_steps {max_steps}" if isinstance(max_steps, int) and max_steps > 0 else ""
    if reached_max_steps(config, last):  # its summary is missing or torn, its training is not
        return None, ""
    age = ""
    with contextlib.suppress(OSError):
        import time

        seconds = time.time() - (Path(run.path) / "run.jsonl").stat().st_mtime
        age = f", last written {_ago(seconds)} ago"
    return "incomplete", (f"no final summary: the run stopped at step {last}{of}, or is still running{age}; "
                          "the findings cover the steps logged so far")


def _ago(seconds: float) -> str:
    if seconds < 120:
        return f"{int(seconds)} s"
    if seconds < 7200:
        return f"{int(seconds // 60)} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.0f} days"
