"""Readers of training logs: every supported format becomes one ``Source``.

Each format is a ``Reader`` (``readers/_base.py``): a name, a cheap sniff of the content and a read.
``load_source`` tries them in the order ``READERS`` declares, and the first whose sniff fits reads
the path; the file name never decides (a ``run.jsonl`` aside). Adding a format is adding its reader
module and one line here. The formats, in that order:

* ``run_dir``: a grpo-monitor run directory, or its ``run.jsonl``;
* ``trainer_state``: any Hugging Face ``trainer_state.json`` (its ``log_history``), a checkpoint
  folder, or a Trainer output_dir (its newest checkpoint); a ``config.json`` beside it names the model;
* ``tensorboard``: a TensorBoard event file, or a folder holding event files at any depth;
* ``wandb``, ``trackio``: a W&B run directory (offline or synced) and trackio's local database;
* ``notebook``: a Jupyter/Colab notebook (``.ipynb``) or its outputs saved as a JSON list: the
  training cell's progress table (an HTML table with a Step column), else its printed text;
* ``kaggle``: a Kaggle kernel log, a JSON array of ``{"stream_name", "time", "data"}`` records;
* ``log_history``, ``columns``: a JSON list of ``log_history`` dicts; per-metric arrays
  (``{"reward": [...], "loss": [...]}``) at the top of a JSON object or anywhere inside it (one run
  per object holding them: ``{"arms": [{"arm": "a", "acc": [...]}, ...]}``);
* ``jsonl``: one JSON object per line with a step (verl's file logger writes ``{"step": n, "data": {...}}``);
* ``csv``: a metric export with a step-like column (``step``, ``global_step``, ``iteration``, ``_step``, ...);
* ``trl_console``, ``verl_console``, ``console``: console output kept with ``nohup``/``tee``: the
  dicts transformers/TRL print, verl's ``step:N - key:value`` lines, or a hand-written loop's lines
  (``readers/console.py``);
* ``table``: a table of numbers anywhere in a text file (HTML, pipe/markdown, whitespace-aligned
  columns) with a step-like index column.

Where a log's records carry no step (printed dicts, per-metric lists), the k-th is step
k x logging_steps; ``logging_steps`` comes from the log where it says, else from the caller, and the
source's ``meta`` and a warning say which.

Anything unusable raises ``SourceError`` (a ``ValueError``) whose message is one line naming the
file and the fault; a file no reader takes says what it lacks to be of the nearest kind.

>>> import json, tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> _ = (d / "state.txt").write_text(json.dumps({"log_history": [
...     {"step": 1, "completion_length": 12.0, "rewards/correct_func": 0.5},
...     {"step": 2, "completion_length": 14.0, "rewards/correct_func": 0.75}]}))
>>> src = load_source(d / "state.txt")
>>> src.format, src.steps[1], src.context.correctness_reward
('trainer_state', (2, {'completions/mean_length': 14.0, 'rewards/correct_func/mean': 0.75}), 'correct_func')
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import os
from pathlib import Path
from typing import Any

from grpo_monitor.readers._base import Probe, Reader, Source, SourceError, one_line

__all__ = ["FORMATS", "READERS", "Probe", "Reader", "Source", "SourceError", "detect_format", "folder_run", "load_source", "missing_reason", "readers"]

# The order formats are tried in, as ``module:Reader`` of this package. Folders: our run directory
# first, a Trainer's own state before the TensorBoard logs beside it, checkpoints after them. Files:
# the binary formats, then JSON documents by what they hold, JSON lines, CSV, console output, and
# last any table of numbers found in the text.
READERS: tuple[str, ...] = (
    "run_dir:RunDirReader",
    "trainer_state:TrainerStateReader",
    "tensorboard:TensorBoardReader",
    "trainer_state:CheckpointsReader",
    "trackers:WandbReader",
    "trackers:TrackioReader",
    "notebook:NotebookReader",
    "kaggle:KaggleReader",
    "jsondocs:LogHistoryReader",
    "jsondocs:ColumnsReader",
    "tabular:JsonlReader",
    "tabular:CsvReader",
    "console:ConsoleReader",
    "tables:TableReader",
)

_LOADED: list[Reader] = []


def readers() -> list[Reader]:
    """The readers, in ``READERS`` order (their modules are imported on first use)."""
    if not _LOADED:
        loaded = []
        for spec in READERS:
            module, _, name = spec.partition(":")
            loaded.append(getattr(importlib.import_module(f"{__name__}.{module}"), name)())
        _LOADED[:] = loaded  # whole, at once: a second thread asking meanwhile never sees half a list
    return _LOADED


def __getattr__(name: str) -> Any:
    if name == "FORMATS":  # every format some reader can return, in reader order
        return tuple(dict.fromkeys(f for r in readers() for f in r.formats))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def load_source(path: str | os.PathLike[str], *, logging_steps: int | None = None) -> Source:
    """Read any supported training log into a ``Source``; raise ``SourceError`` if it is unusable.

    ``logging_steps`` numbers the records of a log that carries no step (a console log's printed
    dicts) where the log itself does not tell.
    """
    try:
        p = Path(path)
    except TypeError:
        raise SourceError(None, f"not a path: {path!r}") from None
    try:
        probe = _probe(p, logging_steps if isinstance(logging_steps, int) and logging_steps > 0 else None)
        reader, fmt = _choose(probe)
        return reader.read(probe, fmt)
    except SourceError as exc:
        if exc.path is None and str(exc).startswith("reading a "):
            raise SourceError(p, exc.what) from None
        raise
    except MemoryError:
        raise SourceError(p, "too large to read into memory") from None
    except RecursionError:
        raise SourceError(p, "nested too deeply to read") from None
    except OSError as exc:
        raise SourceError(p, f"cannot read ({exc.strerror or exc.__class__.__name__})") from None
    except Exception as exc:  # a reader bug must still come out as one line naming the file
        raise SourceError(p, f"unreadable ({exc.__class__.__name__}: {one_line(str(exc), 200)})") from None


def detect_format(path: str | os.PathLike[str]) -> str:
    """The format ``load_source`` would read ``path`` as (raises ``SourceError`` when none fits)."""
    p = Path(path)
    try:
        return _choose(_probe(p))[1]
    except SourceError:
        raise
    except OSError as exc:
        raise SourceError(p, f"cannot read ({exc.strerror or exc.__class__.__name__})") from None


def folder_run(folder: Path) -> str | None:
    """The format of the one run ``folder`` itself is, by the first reader that says so (``Reader.one_run``),
    else None; a folder that cannot be looked into is not one."""
    for reader in readers():
        try:
            if reader.one_run(folder):
                return reader.formats[0]
        except Exception:  # a reader that cannot look (a missing optional package, a permission): not one
            continue
    return None


def missing_reason(path: str | os.PathLike[str]) -> str:
    """Why a path that does not resolve is not there, as ``analyze`` and ``watch`` both say it: a symbolic link
    that leads back to itself, a broken link (and where it points), or nothing at all.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp()); (d / "loop").symlink_to(d / "loop")
    >>> missing_reason(d / "loop"), missing_reason(d / "absent")
    ('a symbolic link loop (it leads back to itself)', 'no such file or directory')
    """
    p = Path(path)
    if p.is_symlink():
        try:
            os.stat(p)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return "a symbolic link loop (it leads back to itself)"
            with contextlib.suppress(OSError):
                return f"a broken symbolic link (to {os.readlink(p)}, which does not exist)"
    return "no such file or directory"


def _probe(p: Path, logging_steps: int | None = None) -> Probe:
    if not p.exists():
        raise SourceError(p, missing_reason(p))
    if not p.is_dir() and not p.is_file():
        raise SourceError(p, "not a regular file or directory")
    return Probe(p, logging_steps)


def _choose(probe: Probe) -> tuple[Reader, str]:
    """The first reader whose sniff fits, and the format it names; else why nothing fits."""
    for reader in readers():
        fmt = reader.sniff(probe)
        if fmt is not None:
            return reader, fmt
    raise SourceError(probe.path, _why_none(probe))


def _why_none(probe: Probe) -> str:
    if probe.layout == "dir":
        holds = [r.folder_holds for r in readers() if r.folder_holds]
        return f"folder holds nothing readable (no {', '.join(holds[:-1])} or {holds[-1]})"
    if probe.layout == "empty":
        return "empty file"
    if probe.layout == "undecodable":
        return "neither UTF-8 text nor a TensorBoard event file"
    for reader in readers():
        why = reader.near_miss(probe)
        if why:
            return why
    known = ", ".join(r.describes for r in readers() if r.describes)
    if probe.layout == "binary":
        return f"binary data, not a known log format ({known})"
    return f"not a known log format ({known})"
