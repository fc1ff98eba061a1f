"""The Textual dashboard: ``grpo-monitor watch RUN`` (or ``python -m grpo_monitor.app.dashboard RUN``).

Importing this package does not import Textual; ``run_watch`` and ``WatchApp`` load it on use,
so ``import grpo_monitor`` stays light for offline analysis. ``check_path`` is what ``watch`` tells
the user before any screen is drawn:

>>> import tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> check_path(d / "typo").endswith("no such file or directory (--wait waits for a run that has not started yet)")
True
>>> check_path(d / "typo", wait=True) is None, check_path(d, wait=True) is None  # --wait: a run about to start
(True, True)
>>> check_path(d).endswith("folder holds nothing readable (--wait waits for a run to start in it)")
True
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from grpo_monitor.app.dashboard.app import WatchApp

__all__ = ["WatchApp", "check_path", "run_path", "run_watch"]

RUN_FILE = "run.jsonl"
# What a run directory holds before its log has a header: the sample files, a restart plan, the
# reward gate's verdict and the prompts it samples, a supervisor's lock (hidden files).
_STARTING_FILES = re.compile(
    r"^(samples\.rank\d+\.jsonl|restart_plan\.json|reward_gate\.json|gate_prompts\.jsonl|segment-\d+|\..*)$")
_SNIFF = 64 * 1024


def is_starting_run(path: Path) -> bool:
    """``path`` is a folder with nothing in it yet but what a starting run writes first."""
    try:
        names = os.listdir(path)
    except OSError:
        return False
    return all(_STARTING_FILES.match(n) for n in names)


def run_path(path: str | os.PathLike[str]) -> Path:
    """The path ``watch`` shows for ``path``, as ``analyze`` reads it: a Trainer output_dir holding a
    grpo-monitor run directory (``<output_dir>/grpo-monitor/``) is that run, not its checkpoints'
    ``trainer_state.json``; anything else is itself."""
    p = Path(path)
    if not p.is_dir() or (p / RUN_FILE).is_file():
        return p
    from grpo_monitor.analysis.discovery import discover_runs

    try:
        runs = discover_runs(p)
    except OSError:
        return p
    if runs and len(runs) == 1 and (runs[0] / RUN_FILE).is_file():
        return runs[0]
    return p


def check_path(path: str | os.PathLike[str], wait: bool = False) -> str | None:
    """Why ``watch`` cannot show ``path``, in one line naming it; None when it can.

    Only cheap checks (existence, permissions, the first record of a run log, the format a foreign
    log is detected as): a log that passes them and still does not parse is reported by the app.
    With ``wait`` a path that does not exist yet is fine: the dashboard waits for the run.
    """
    p = Path(path)
    try:
        return _check(p, wait)
    except OSError as exc:  # a folder on the way that the user cannot enter, say
        return f"{p}: unreadable ({(exc.strerror or type(exc).__name__).lower()})"


def _check(p: Path, wait: bool) -> str | None:
    target = p / RUN_FILE if p.is_dir() and (p / RUN_FILE).is_file() else p
    if not p.exists():
        from grpo_monitor.readers import missing_reason

        if not p.is_symlink():
            return None if wait else f"{p}: no such file or directory (--wait waits for a run that has not started yet)"
        return f"{p}: {missing_reason(p)}"  # a link that leads nowhere never starts a run
    if target.name == RUN_FILE:
        return _check_run_log(target)
    if p.is_dir() and is_starting_run(p):
        if not wait and not _entries(p):
            # Nothing at all, as analyze says: only --wait opens it to wait for a run to start there.
            return f"{p}: folder holds nothing readable (--wait waits for a run to start in it)"
        return None  # a run directory whose log is not written yet: open it and wait
    if not os.access(p, os.R_OK | (os.X_OK if p.is_dir() else 0)):
        return f"{p}: unreadable (permission denied)"
    from grpo_monitor.readers import SourceError, detect_format

    try:
        detect_format(p)
    except SourceError as exc:
        return f"{p}: not a run this tool reads ({exc.what})"
    except OSError as exc:
        return f"{p}: unreadable ({exc.strerror or type(exc).__name__})"
    return None


def _entries(p: Path) -> list[str]:
    try:
        return os.listdir(p)
    except OSError:
        return []


def _check_run_log(run_file: Path) -> str | None:
    """A ``run.jsonl`` the dashboard can follow: readable, and its first complete line a record
    (read up to its newline, however long: a run log's first line is its header)."""
    from grpo_monitor.core.runlog import LineSplitter

    lines = LineSplitter()
    try:
        with open(run_file, "rb") as fh:
            while True:
                chunk = fh.read(_SNIFF)
                if not chunk:
                    break
                for lineno, line, why in lines.feed(chunk):
                    if line is None:
                        return f"{run_file}: not a run this tool reads (line {lineno}: {why})"
                    if line.strip(b"\r"):
                        return _not_a_run_log(run_file, line, lineno)
                if lines.discarding:  # NUL bytes or a line beyond any record: not a run log
                    return f"{run_file}: not a run this tool reads (line {lines.lineno}: {lines.why})"
    except IsADirectoryError:
        return f"{run_file}: not a run this tool reads (a folder named {RUN_FILE})"
    except OSError as exc:
        return f"{run_file}: unreadable ({(exc.strerror or type(exc).__name__).lower()})"
    tail = lines.tail()
    if tail is None or tail[1] is None or tail[1].lstrip()[:1] in (b"", b"{"):
        return None  # empty, or a first line still being written: a run that is starting
    return _not_a_run_log(run_file, tail[1], tail[0])


def _not_a_run_log(run_file: Path, first: bytes, lineno: int = 1) -> str | None:
    from grpo_monitor.core.runlog import RunLogError, no_header, parse_line

    try:
        record = parse_line(first, f"{run_file}:{lineno}")
    except RunLogError as exc:
        what = str(exc).split(": ", 1)[-1]
        return f"{run_file}: not a run this tool reads (line {lineno}: {what})"
    return no_header(run_file, record)  # as analyze says it: a log without its header cannot be judged


def run_watch(path: str | os.PathLike[str], wait: bool = False) -> None:
    """Open the dashboard on ``path`` and block until the user quits.

    ``path`` is a run directory (followed live as it grows), its ``run.jsonl``, a Trainer output_dir
    holding one (``run_path``), or any log ``grpo-monitor analyze`` reads (replayed through the detectors). A path that cannot be shown
    raises ``grpo_monitor.readers.SourceError`` with one line naming it and the fault, before the screen
    opens where that can be known, else as the app closes. With ``wait`` a path that does not exist
    yet is waited for, and a log that cannot be read is reported on screen while the path is watched.
    """
    from grpo_monitor.readers import SourceError

    path = run_path(path)
    problem = check_path(path, wait=wait)
    if problem is not None and not wait:
        raise SourceError(None, problem)
    from grpo_monitor.app.dashboard.app import WatchApp, is_run_path, replay_source

    records = None
    warnings: list[str] = []
    if not wait and not is_run_path(Path(path)):
        # Read before the screen opens, so a log that fails deep inside leaves one line, not a
        # dashboard that opened and closed.
        try:
            records = replay_source(path, warnings)
        except SourceError:
            raise
        except Exception as exc:
            raise SourceError(None, f"{path}: unreadable ({type(exc).__name__}: {exc})") from None
    app = WatchApp(path, wait=wait, records=records, warnings=warnings)
    app.run()
    if app.error is not None and not wait:
        raise SourceError(None, app.error)


def __getattr__(name: str) -> Any:
    if name == "WatchApp":
        from grpo_monitor.app.dashboard.app import WatchApp

        return WatchApp
    raise AttributeError(f"module 'grpo_monitor.app.dashboard' has no attribute {name!r}")
