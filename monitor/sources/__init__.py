"""Readers of training logs: every supported format becomes one ``Source``.

``load_source`` tells the format from the content (the file name only breaks ties):

* ``run_dir``: a grpo-monitor run directory, or its ``run.jsonl``;
* ``trainer_state``: any Hugging Face ``trainer_state.json`` (its ``log_history``);
* ``tensorboard``: a TensorBoard event file, or a folder holding event files at any depth;
* ``csv``: a metric export with a step column (W&B history ``_step``, ``step``, ``global_step``);
* ``jsonl``: one JSON object per line with a ``step`` (verl's file logger writes
  ``{"step": n, "data": {...}}``).

Anything unusable raises ``SourceError`` (a ``ValueError``) whose message is one line naming the
file and the fault.

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

import os
from pathlib import Path

from monitor.sources._base import FORMATS, Source, SourceError, one_line

__all__ = ["FORMATS", "Source", "SourceError", "detect_format", "load_source"]

_SNIFF = 64 * 1024


def load_source(path: str | os.PathLike[str]) -> Source:
    """Read any supported training log into a ``Source``; raise ``SourceError`` if it is unusable."""
    try:
        p = Path(path)
    except TypeError:
        raise SourceError(None, f"not a path: {path!r}") from None
    try:
        return _load(p)
    except SourceError:
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
        return _detect(p)[0]
    except SourceError:
        raise
    except OSError as exc:
        raise SourceError(p, f"cannot read ({exc.strerror or exc.__class__.__name__})") from None


def _load(p: Path) -> Source:
    fmt, target = _detect(p)
    if fmt == "run_dir":
        from monitor.sources.run_dir import read_run_dir

        return read_run_dir(target)
    if fmt == "trainer_state":
        from monitor.sources.trainer_state import parse_json, read_trainer_state

        src = read_trainer_state(target, parse_json(target, target.read_bytes()))
        if target != p:
            src.warnings.append(f"{p}: read the newest checkpoint's {target.relative_to(p)}")
        return src
    if fmt == "tensorboard":
        from monitor.sources.tensorboard import read_tensorboard

        return read_tensorboard(p)
    if fmt == "csv":
        from monitor.sources.tabular import read_csv

        return read_csv(target)
    from monitor.sources.tabular import read_jsonl

    return read_jsonl(target)


def _detect(p: Path) -> tuple[str, Path]:
    if not p.exists():
        raise SourceError(p, "no such file or directory")
    if p.is_dir():
        return _detect_dir(p)
    if not p.is_file():
        raise SourceError(p, "not a regular file or directory")
    if p.name == "run.jsonl":
        return "run_dir", p
    with open(p, "rb") as fh:
        head = fh.read(_SNIFF)
    if not head.strip():
        raise SourceError(p, "empty file")
    from monitor.sources.tensorboard import looks_like_event_file

    if looks_like_event_file(head) or ("tfevents" in p.name and head.lstrip()[:1] not in (b"{", b"[")):
        return "tensorboard", p
    return _detect_text(p, head), p


def _detect_text(p: Path, head: bytes) -> str:
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if b"\x00" in head:
        raise SourceError(p, "binary data, not a known log format (run.jsonl, trainer_state.json, TensorBoard, CSV, JSONL)")
    if text[:1] == b"{":
        first = text.split(b"\n", 1)[0]
        from monitor.sources.tabular import first_json_line

        obj = first_json_line(first)
        if obj is None:  # a pretty-printed JSON document
            return "trainer_state"
        if isinstance(obj, dict) and "log_history" in obj:
            return "trainer_state"
        if isinstance(obj, dict) and obj.get("type") == "header" and "schema" in obj:
            raise SourceError(p, "a grpo-monitor run log must be named run.jsonl inside its run directory")
        return "jsonl"
    if text[:1] == b"[":
        raise SourceError(p, "a JSON array, not a known log format (expected a trainer_state.json object or JSON lines)")
    from monitor.sources.tabular import decode_head, looks_like_csv

    if decode_head(head) is None:
        raise SourceError(p, "neither UTF-8 text nor a TensorBoard event file")
    if looks_like_csv(head):
        return "csv"
    raise SourceError(p, "not a known log format (run.jsonl, trainer_state.json, TensorBoard, CSV with a step column, JSONL)")


def _detect_dir(p: Path) -> tuple[str, Path]:
    if (p / "run.jsonl").is_file():
        return "run_dir", p
    if (p / "trainer_state.json").is_file():
        return "trainer_state", p / "trainer_state.json"
    from monitor.sources.tensorboard import find_event_files

    if find_event_files(p):
        return "tensorboard", p
    # A Trainer output_dir without TensorBoard logs: the newest checkpoint has the longest history.
    best: tuple[int, Path] | None = None
    for child in p.glob("checkpoint-*/trainer_state.json"):
        try:
            n = int(child.parent.name.split("-", 1)[1])
        except ValueError:
            continue
        if best is None or n > best[0]:
            best = (n, child)
    if best is not None:
        return "trainer_state", best[1]
    raise SourceError(
        p, "folder holds nothing readable (no run.jsonl, trainer_state.json, checkpoint-*/ or TensorBoard event files)"
    )
