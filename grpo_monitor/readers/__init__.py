"""Readers of training logs: every supported format becomes one ``Source``.

``load_source`` tells the format from the content (the file name only breaks ties):

* ``run_dir``: a grpo-monitor run directory, or its ``run.jsonl``;
* ``trainer_state``: any Hugging Face ``trainer_state.json`` (its ``log_history``);
* ``tensorboard``: a TensorBoard event file, or a folder holding event files at any depth;
* ``csv``: a metric export with a step column (W&B history ``_step``, ``step``, ``global_step``);
* ``jsonl``: one JSON object per line with a ``step`` (verl's file logger writes
  ``{"step": n, "data": {...}}``);
* ``log_history``, ``columns``, ``notebook``: a JSON list of ``log_history`` dicts, a JSON object of
  per-metric lists, notebook output (a JSON list of stream records, or an ``.ipynb``);
* ``trl_console``, ``verl_console``, ``console``: console output kept with ``nohup``/``tee``: the
  dicts transformers/TRL print, verl's ``step:N - key:value`` lines, or a hand-written loop's lines
  with a step counter and ``name: value`` pairs (``monitor/sources/console.py``);
* ``wandb``, ``trackio``: a W&B run directory (offline or synced) and trackio's local database.

Where a log's records carry no step (printed dicts, per-metric lists), the k-th is step
k x logging_steps; ``logging_steps`` comes from the log where it says, else from the caller, and the
source's ``meta`` and a warning say which.

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

from grpo_monitor.readers._base import FORMATS, Source, SourceError, one_line

__all__ = ["FORMATS", "Source", "SourceError", "detect_format", "load_source"]

_SNIFF = 64 * 1024


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
        return _load(p, logging_steps if isinstance(logging_steps, int) and logging_steps > 0 else None)
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
        return _detect(p)[0]
    except SourceError:
        raise
    except OSError as exc:
        raise SourceError(p, f"cannot read ({exc.strerror or exc.__class__.__name__})") from None


def _load(p: Path, logging_steps: int | None = None) -> Source:
    fmt, target = _detect(p)
    if fmt == "run_dir":
        from grpo_monitor.readers.run_dir import read_run_dir

        return read_run_dir(target)
    if fmt in ("trainer_state", "log_history", "columns", "notebook"):
        return _load_json_document(p, target, logging_steps)
    if fmt == "tensorboard":
        from grpo_monitor.readers.tensorboard import read_tensorboard

        return read_tensorboard(p)
    if fmt == "csv":
        from grpo_monitor.readers.tabular import read_csv

        return read_csv(target)
    if fmt in ("trl_console", "verl_console", "console"):
        from grpo_monitor.readers.console import read_console, read_text

        return read_console(target, read_text(target), fmt, logging_steps)
    if fmt == "wandb":
        from grpo_monitor.readers.trackers import read_wandb

        return read_wandb(target)
    if fmt == "trackio":
        from grpo_monitor.readers.trackers import read_trackio

        return read_trackio(target)
    from grpo_monitor.readers.tabular import read_jsonl

    return read_jsonl(target)


def _load_json_document(p: Path, target: Path, logging_steps: int | None) -> Source:
    """One JSON document, routed by what it holds once parsed (it is parsed once)."""
    from grpo_monitor.readers.trainer_state import is_trainer_state, parse_json, read_trainer_state

    obj = parse_json(target, target.read_bytes())
    if is_trainer_state(obj):
        src = read_trainer_state(target, obj)
        if target != p:
            src.warnings.append(f"{p}: read the newest checkpoint's {target.relative_to(p)}")
        return src
    from grpo_monitor.readers.jsondocs import read_json_document

    return read_json_document(target, obj, logging_steps)


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
    from grpo_monitor.readers.tensorboard import looks_like_event_file

    if looks_like_event_file(head) or ("tfevents" in p.name and head.lstrip()[:1] not in (b"{", b"[")):
        return "tensorboard", p
    from grpo_monitor.readers.trackers import SQLITE_MAGIC, WANDB_MAGIC

    if head.startswith(WANDB_MAGIC):
        return "wandb", p
    if head.startswith(SQLITE_MAGIC):
        return "trackio", p
    return _detect_text(p, head), p


def _detect_text(p: Path, head: bytes) -> str:
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if b"\x00" in head:
        raise SourceError(p, "binary data, not a known log format (run.jsonl, trainer_state.json, TensorBoard, CSV, JSONL)")
    if text[:1] == b"{":
        first = text.split(b"\n", 1)[0]
        from grpo_monitor.readers.tabular import first_json_line

        obj = first_json_line(first)
        if obj is None:
            if first[:2] == b"{'":  # a printed Python dict: console output
                return _detect_console(p, head)
            # A pretty-printed JSON document: its content decides once it is parsed.
            return "notebook" if b'"cells"' in head and b'"nbformat' in head else "trainer_state"
        if isinstance(obj, dict) and "log_history" in obj:
            return "trainer_state"
        if isinstance(obj, dict) and obj.get("type") == "header" and "schema" in obj:
            raise SourceError(p, "a grpo-monitor run log must be named run.jsonl inside its run directory")
        if isinstance(obj, dict) and obj and (all(isinstance(v, list) for v in obj.values()) or isinstance(obj.get("cells"), list)):
            from grpo_monitor.readers.jsondocs import json_kind

            return json_kind(obj)
        return "jsonl"
    if text[:1] == b"[" and not _json_array_start(text):
        return _detect_console(p, head)  # "[INFO] ...", "[12/500] loss=...": a console log, not JSON
    if text[:1] == b"[":
        head_text = text[:4096]
        return "notebook" if b'"output_type"' in head_text or b'"name": "stdout"' in head_text else "log_history"
    from grpo_monitor.readers.tabular import decode_head, looks_like_csv

    if decode_head(head) is None:
        raise SourceError(p, "neither UTF-8 text nor a TensorBoard event file")
    if looks_like_csv(head) and _csv_has_step(head):
        return "csv"
    try:
        return _detect_console(p, head)
    except SourceError:
        if looks_like_csv(head):
            return "csv"  # the CSV reader names the columns it found
        raise


def _json_array_start(text: bytes) -> bool:
    first = text.split(b"\n", 1)[0].strip()
    if first == b"[" or first[:2] in (b"[{", b"[[", b'["', b"[]") or first[:3] in (b"[ {", b"[ [", b'[ "'):
        return True
    from grpo_monitor.readers.tabular import first_json_line

    return first_json_line(first) is not None


def _csv_has_step(head: bytes) -> bool:
    from grpo_monitor.readers.tabular import _header, _is_step, decode_head

    found = _header(decode_head(head) or "")
    return found is not None and any(_is_step(h.strip().split(" - ", 1)[-1]) for h in found[0])


def _detect_console(p: Path, head: bytes) -> str:
    from grpo_monitor.readers.console import decode_text, remember_text, sniff

    text = decode_text(head if len(head) < _SNIFF else p.read_bytes())
    fmt = sniff(text)
    if fmt is not None:
        remember_text(p, text)
    if fmt is None:
        raise SourceError(
            p,
            "not a known log format (run.jsonl, trainer_state.json, TensorBoard, CSV with a step column, JSONL, "
            "a console log with printed metrics dicts or step lines, W&B run, trackio database)",
        )
    return fmt


def _detect_dir(p: Path) -> tuple[str, Path]:
    if (p / "run.jsonl").is_file():
        return "run_dir", p
    if (p / "trainer_state.json").is_file():
        return "trainer_state", p / "trainer_state.json"
    from grpo_monitor.readers.tensorboard import find_event_files

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
    from grpo_monitor.readers.trackers import looks_like_wandb_dir, trackio_databases

    if looks_like_wandb_dir(p):
        return "wandb", p
    if trackio_databases(p):
        return "trackio", p
    raise SourceError(
        p, "folder holds nothing readable (no run.jsonl, trainer_state.json, checkpoint-*/, TensorBoard event files, "
        "W&B run or trackio database)"
    )
