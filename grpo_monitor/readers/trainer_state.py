"""Hugging Face ``trainer_state.json``: the ``log_history`` every Trainer checkpoint carries."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from grpo_monitor.core.jsonparse import loads
from grpo_monitor.core.metrics import SUMMARY_KEYS
from grpo_monitor.readers._base import Normalizer, Source, SourceError, StepTable, as_step, finish, guess_context


def parse_json(path: Path, data: bytes) -> Any:
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise SourceError(path, f"not UTF-8 text (bad byte at offset {exc.start})") from None
    try:
        return loads(text)
    except json.JSONDecodeError as exc:
        what = "truncated JSON" if exc.pos >= len(text.rstrip()) else "invalid JSON"
        raise SourceError(path, f"{what} at line {exc.lineno} column {exc.colno} ({exc.msg})") from None
    except RecursionError:
        raise SourceError(path, "JSON nested too deeply") from None


def is_trainer_state(obj: Any) -> bool:
    return isinstance(obj, dict) and "log_history" in obj


def read_trainer_state(path: Path, obj: Any) -> Source:
    """Build a Source from a parsed ``trainer_state.json`` object.

    Every ``log_history`` entry is one logged step; entries sharing a step (a train entry and
    an eval entry) are merged. The end-of-training summary (``train_runtime``, ``train_loss``,
    ...) is not a step and is skipped.
    """
    if not isinstance(obj, dict):
        raise SourceError(path, f"expected a JSON object with 'log_history', got {type(obj).__name__}")
    if "log_history" not in obj:
        raise SourceError(path, "a JSON object without 'log_history' (not a trainer_state.json)")
    history = obj["log_history"]
    if not isinstance(history, list):
        raise SourceError(path, f"'log_history' is {type(history).__name__}, expected a list")
    src = Source(path=path, format="trainer_state")
    table = StepTable()
    norm = Normalizer()
    summaries = 0
    for i, entry in enumerate(history):
        if not isinstance(entry, dict):
            raise SourceError(path, f"log_history[{i}] is {type(entry).__name__}, expected an object")
        if "train_runtime" in entry or (SUMMARY_KEYS & entry.keys() and "loss" not in entry and "train_loss" in entry):
            summaries += 1
            continue
        if "step" not in entry:
            raise SourceError(path, f"log_history[{i}] has no 'step'")
        step = as_step(entry["step"])
        if step is None:
            raise SourceError(path, f"log_history[{i}] has step {_short(entry['step'])}, expected an integer")
        table.add(step, norm(entry))
    if not len(table):
        raise SourceError(path, "log_history holds no logged steps")
    finish(src, table, "entries")
    logging_steps = as_step(obj.get("logging_steps"))
    src.context = guess_context(src.metric_names(), logging_steps, [s for s, _ in src.steps])
    return src


def _short(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
