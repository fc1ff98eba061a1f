"""Paths to runs: the runs in a folder that holds several, a restarted run's segments, the loose log files
beside them, and this tool's own saved reports (which report on runs and are never read as one).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

from grpo_monitor.readers import folder_run


def expand_lineages(paths: Sequence[str | os.PathLike[str]]) -> list[str]:
    """Each path, and for a run directory that was restarted, each of its segments in order."""
    from grpo_monitor.core.restart import lineage_dirs
    from grpo_monitor.core.runlog import is_run_dir

    out: list[str] = []
    for p in paths:
        out.append(str(p))
        if is_run_dir(p):
            out.extend(str(d) for d in lineage_dirs(p)[1:])
    return out


# -- folders of runs -------------------------------------------------------------------------

_MAX_DEPTH = 6
_MAX_DIRS = 20000


def discover_runs(path: str | os.PathLike[str], skipped: list[tuple[str, str]] | None = None) -> list[Path] | None:
    """The runs in a folder that holds several, each as the path to read; None when ``path`` is
    one run (or a file), which is then read as it is.

    A run is a grpo-monitor run directory (``run.jsonl``; a Trainer output_dir's own
    ``grpo-monitor/`` speaks for it), else a folder with a ``trainer_state.json``, checkpoints,
    TensorBoard event files, a W&B run or a trackio database (read as a whole, as ``analyze
    FOLDER`` reads it). Loose log files beside them count as runs of their own.
    """
    p = Path(path)
    try:
        if not p.is_dir() or (p / "run.jsonl").is_file():
            return None
    except OSError:  # cannot be looked into: reading it as one run says why, in one line
        return None
    budget = [_MAX_DIRS]
    found = _collect(p, _MAX_DEPTH, budget)
    runs = [c for _, c in found]
    if len(runs) == 1 and runs[0] == p:
        return None
    loose = _loose_logs(p, skipped)
    if not runs and not loose:
        return None
    return sorted(set(runs + loose), key=lambda x: str(x))


def _collect(d: Path, depth: int, budget: list[int]) -> list[tuple[str, Path]]:
    try:
        if (d / "run.jsonl").is_file():
            return [("run_dir", d)]
        if not os.access(d, os.R_OK | os.X_OK):
            raise PermissionError(d)
    except OSError:  # a folder that cannot be entered: listed as skipped, with why
        return [("denied", d)]
    budget[0] -= 1
    below: list[tuple[str, Path]] = []
    if depth > 0 and budget[0] > 0:
        try:
            kids = sorted(k for k in d.iterdir() if k.is_dir() and not k.name.startswith((".", "__")) and not k.is_symlink())
        except OSError:
            kids = []
        for k in kids:
            if k.name.startswith("checkpoint-") or k.name.startswith("segment-"):
                continue  # read through their parent (the newest checkpoint; a lineage's segments)
            below.extend(_collect(k, depth - 1, budget))
    marker = folder_run(d)
    if marker is None:
        return below
    run_dirs = [c for c in below if c[0] == "run_dir"]
    if run_dirs:
        return run_dirs  # an output_dir's own monitor log speaks for it
    return [(marker, d)] + [c for c in below if c[0] == "denied"]


# What this tool's own saved outputs begin with: reports of runs, not training logs.
_OWN_REPORTS = (
    (re.compile(r'\A\s*\{\s*"runs"\s*:\s*\[\s*(?:\{\s*"source"|\])'), "grpo-monitor analyze --json report"),
    (re.compile(r"\A\s*# grpo-monitor report\b"), "grpo-monitor analyze --markdown report"),
    (re.compile(r"\A\s*== .*\n(?:read: .*\n|model: .*\n|config: .*\n|names: .*\n)*verdict: "), "grpo-monitor analyze report"),
    (re.compile(r"\A\s*grpo-monitor lint: "), "grpo-monitor lint report"),
    (re.compile(r'\A\s*\{\s*"source"\s*:[^\n]*\n?\s*"device"\s*:\s*\{\s*"judged_for"'), "grpo-monitor lint --json report"),
    (re.compile(r'\A\s*\{\s*"samples"\s*:\s*\['), None),  # inspect-rewards --json: told by its notice below
)


def own_report(path: str | os.PathLike[str]) -> str | None:
    """What kind of this tool's own saved report ``path`` is (``analyze > report.txt``, ``--json``,
    ``--markdown``, ``lint``, ``inspect-rewards --auto --json``), or None for anything else. Such a file
    reports on runs; read as a log it would be a run of its own.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "report.md"
    >>> _ = p.write_text("# grpo-monitor report\\n\\n## `runs/a`\\n")
    >>> own_report(p)
    'grpo-monitor analyze --markdown report'
    """
    try:
        with open(path, "rb") as fh:
            head = fh.read(4096).decode("utf-8", errors="replace")
    except OSError:
        return None
    for pattern, kind in _OWN_REPORTS:
        if pattern.search(head):
            if kind is None:
                return "grpo-monitor inspect-rewards --json report" if '"gate_passed"' in _tail(path) else None
            return kind
    return None


def _tail(path: str | os.PathLike[str], size: int = 65536) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, os.path.getsize(path) - size))
            return fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def _loose_logs(d: Path, skipped: list[tuple[str, str]] | None = None) -> list[Path]:
    """Files directly in ``d`` that read as logs of a known format (README files, and this tool's own
    saved reports, listed in ``skipped``, do not)."""
    from grpo_monitor.readers import SourceError, detect_format

    out = []
    try:
        files = sorted(f for f in d.iterdir() if f.is_file() and not f.name.startswith("."))
    except OSError:
        return out
    for f in files:
        kind = own_report(f)
        if kind is not None:
            if skipped is not None:
                skipped.append((str(f), f"a {kind}, not a training log"))
            continue
        try:
            detect_format(f)
        except (SourceError, OSError, ValueError):
            continue
        out.append(f)
    return out


def is_file(p: Path) -> bool:
    """Whether ``p`` is a file; False for a path that cannot be looked at."""
    try:
        return p.is_file()
    except OSError:
        return False


def expand_paths(paths: Sequence[str | os.PathLike[str]],
                 skipped: list[tuple[str, str]] | None = None) -> list[tuple[str, str]]:
    """Every run to analyse, and how it came: ``given`` (named by the user), ``found`` (a run
    folder or segment found beneath), ``loose`` (a file beside them that looked like a log),
    ``denied`` (a folder or file beneath that the user may not read); the tool's own saved reports in a
    folder go to ``skipped``."""
    out: list[tuple[str, str]] = []
    for p in paths:
        runs = discover_runs(p, skipped)
        if runs is None:
            out.extend((x, "given" if i == 0 else "found") for i, x in enumerate(expand_lineages([p])))
            continue
        for r in runs:
            if not os.access(r, os.R_OK | (0 if is_file(r) else os.X_OK)):
                out.append((str(r), "denied"))
            elif is_file(r):
                out.append((str(r), "loose"))
            else:
                out.extend((x, "found") for x in expand_lineages([r]))
    return out
