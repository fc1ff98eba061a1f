"""JSON documents that are not a ``trainer_state.json`` nor a notebook: what people save by hand.

* ``log_history``: ``trainer.state.log_history`` dumped as a JSON list of dicts;
* ``columns``: one list per metric, ``{"reward": [...], "loss": [...]}``, with an optional step
  list, at the top of the document or anywhere inside it: a results file keeping one object of
  per-metric arrays per run (``{"arms": [{"arm": "a", "acc": [...], "entropy": [...]}, ...]}``) holds
  one run per such object (``Source.parts``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from grpo_monitor.core.metrics import SUMMARY_KEYS, normalize
from grpo_monitor.readers._base import (
    Normalizer,
    Probe,
    Reader,
    Source,
    SourceError,
    StepTable,
    as_step,
    finish,
    guess_context,
)


# ------------------------------------------------------------------------------ log_history


def read_log_history(path: Path, history: list[Any], logging_steps: int | None = None) -> Source:
    if not history:
        raise SourceError(path, "an empty JSON array")
    for i, entry in enumerate(history):
        if not isinstance(entry, dict):
            raise SourceError(path, f"a JSON array whose item [{i}] is {type(entry).__name__}; "
                                    "expected log_history dicts or notebook stream records")
    if all("step" in e for e in history):
        from grpo_monitor.readers.trainer_state import read_trainer_state

        src = read_trainer_state(path, {"log_history": history})
        src.format = "log_history"
        return src
    from grpo_monitor.readers.console import _classify, steps_from_dicts

    found = [(0, e, kind) for e in history if (kind := _classify(e)) is not None]
    if not found:
        raise SourceError(path, "a JSON list of dicts without metrics (no loss, reward, epoch, ... keys)")
    return steps_from_dicts(path, "log_history", found, "", logging_steps)


# ---------------------------------------------------------------------------------- columns


def read_columns(path: Path, obj: dict[str, Any], logging_steps: int | None = None) -> Source:
    """One list per metric (every value of ``obj`` a list), the k-th entries making one step."""
    lengths = {len(v) for v in obj.values()}
    n = max(lengths)
    if n == 0:
        raise SourceError(path, "per-metric columns that are all empty")
    src = Source(path=path, format="columns")
    step_key = next((k for k in obj if isinstance(k, str) and normalize(k) == "step"), None)
    if step_key is not None:
        raw = obj[step_key]
        steps = []
        for i, v in enumerate(raw):
            s = as_step(v)
            if s is None:
                raise SourceError(path, f"'{step_key}'[{i}] is {v!r:.40}, expected an integer step")
            steps.append(s)
        src.meta["steps_from"] = f"the '{step_key}' column"
    else:
        L = logging_steps if logging_steps and logging_steps > 0 else 1
        steps = [(k + 1) * L for k in range(n)]
        if as_step(steps[-1]) is None:
            raise SourceError(path, f"logging_steps={L} puts the rows beyond the 64-bit step range")
        how = "as given by --logging-steps" if logging_steps else "assumed: pass --logging-steps N"
        src.meta.update(logging_steps=L, steps_from=how)
        src.warnings.append(f"{path}: the columns carry no step; step = k x logging_steps with logging_steps={L} ({how})")
    if len(lengths) > 1:
        src.warnings.append(f"{path}: columns of different lengths ({min(lengths)} to {n}); the short ones end early")
    table = StepTable()
    norm = Normalizer(drop=SUMMARY_KEYS)
    names = [k for k in obj if k != step_key]
    for i, step in enumerate(steps):
        row = {k: obj[k][i] for k in names if i < len(obj[k])}
        table.add(step, norm({k: (v if isinstance(v, (int, float, str)) or v is None else None) for k, v in row.items()}))
    if not len(table):
        raise SourceError(path, "per-metric columns without a single row")
    finish(src, table, "rows")
    src.context = guess_context(src.metric_names(), src.meta.get("logging_steps"), [s for s, _ in src.steps])
    return src


# ------------------------------------------------------------------- arrays further down


def flat_columns(obj: dict[str, Any]) -> bool:
    """Every value a list of plain values: the per-metric columns sit at the top."""
    return all(isinstance(v, list) for v in obj.values()) and not any(
        isinstance(x, (dict, list)) for v in obj.values() for x in v[:100])

# Where a results file keeps a run's name.
_LABEL_KEYS = ("arm", "name", "run", "run_name", "label", "id", "variant", "method", "config", "model", "seed")
_MAX_NODES = 200_000


def metric_arrays(obj: Any) -> list[tuple[str, dict[str, list[Any]]]]:
    """Every object inside ``obj`` that holds per-metric arrays (two or more numbers each), as
    ``(label, {metric: array})``, in document order; what lies below such an object is its own."""
    found: list[tuple[str, dict[str, list[Any]]]] = []
    budget = [_MAX_NODES]

    def walk(node: Any, where: str, depth: int) -> None:
        budget[0] -= 1
        if budget[0] < 0 or depth > 8:
            return
        if isinstance(node, dict):
            arrays = {k: v for k, v in node.items() if isinstance(k, str) and _numbers(v)}
            if arrays:
                found.append((_label(node, where), arrays))
                return
            for k, v in node.items():
                if isinstance(v, (dict, list)):
                    walk(v, f"{where}.{k}" if where else str(k), depth + 1)
        elif isinstance(node, list):
            for i, v in enumerate(node):
                if isinstance(v, (dict, list)):
                    walk(v, f"{where}[{i}]", depth + 1)

    walk(obj, "", 0)
    return found


def _numbers(v: Any) -> bool:
    """A list of at least two entries, numbers or gaps, at least two of them numbers."""
    if not isinstance(v, list) or len(v) < 2:
        return False
    n = 0
    for x in v:
        if x is None:
            continue
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            if not (isinstance(x, str) and x.strip().lower() in ("nan", "inf", "-inf")):
                return False
        n += 1
    return n >= 2


def _label(node: dict[str, Any], where: str) -> str:
    for key in _LABEL_KEYS:
        v = node.get(key)
        if isinstance(v, (str, int)) and not isinstance(v, bool) and str(v).strip():
            return f"{key}={str(v).strip()[:60]}"
    return where or "the document"


def read_nested_columns(path: Path, runs: list[tuple[str, dict[str, list[Any]]]],
                        logging_steps: int | None = None) -> Source:
    """One Source per object of per-metric arrays; several make a source of several runs."""
    labels = [label for label, _ in runs]
    parts = []
    for i, (label, arrays) in enumerate(runs):
        if labels.count(label) > 1:
            label = f"{label} #{labels[:i].count(label) + 1}"
        src = read_columns(path, arrays, logging_steps)
        src.meta["read_from"] = label
        parts.append((label, src))
    first = parts[0][1]
    if len(parts) == 1:
        first.warnings.append(f"{path}: read the per-metric arrays of {parts[0][0]}")
        return first
    note = (f"{path}: holds {len(parts)} runs of per-metric arrays ({', '.join(lb for lb, _ in parts[:6])}"
            f"{', ...' if len(parts) > 6 else ''}); each is a run of its own")
    for _, part in parts:
        part.warnings.append(note)
        part.meta["runs_in_file"] = len(parts)
    # The file's source is its first run, holding all of them (a copy: no run holds itself).
    return dataclasses.replace(first, warnings=list(first.warnings), meta=dict(first.meta), parts=parts)


# ---------------------------------------------------------------------------------- readers


class LogHistoryReader(Reader):
    name = "log_history"
    formats = ("log_history",)
    describes = "log_history JSON"

    def sniff(self, probe: Probe) -> str | None:
        return "log_history" if probe.layout == "document" and isinstance(probe.document(), list) else None

    def read(self, probe: Probe, fmt: str) -> Source:
        return read_log_history(probe.path, probe.document(), probe.logging_steps)


class ColumnsReader(Reader):
    name = "columns"
    formats = ("columns",)
    describes = "per-metric JSON arrays"

    def sniff(self, probe: Probe) -> str | None:
        if probe.layout != "document":
            return None
        obj = probe.document()
        if not isinstance(obj, dict) or not obj:
            return None
        if flat_columns(obj):
            return "columns"
        runs = metric_arrays(obj)
        if not runs:
            return None
        probe.cache["metric_arrays"] = runs
        return "columns"

    def read(self, probe: Probe, fmt: str) -> Source:
        obj = probe.document()
        if flat_columns(obj):
            return read_columns(probe.path, obj, probe.logging_steps)
        runs = probe.cache.get("metric_arrays") or metric_arrays(obj)
        return read_nested_columns(probe.path, runs, probe.logging_steps)

    def near_miss(self, probe: Probe) -> str | None:
        if probe.layout != "document":
            return None
        obj = probe.document()
        if isinstance(obj, dict):
            shown = ", ".join(repr(k) for k in list(obj)[:6]) + (", ..." if len(obj) > 6 else "")
            return ("a JSON object without 'log_history' (not a trainer_state.json), nor a notebook, nor per-metric "
                    f"arrays of numbers anywhere in it; keys: {shown}")
        if not isinstance(obj, list):
            return f"a JSON {type(obj).__name__}, not a known log format"
        return None
