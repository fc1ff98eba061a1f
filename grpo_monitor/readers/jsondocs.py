"""JSON documents that are not a ``trainer_state.json``: what people save by hand.

* ``log_history``: ``trainer.state.log_history`` dumped as a JSON list of dicts;
* ``columns``: one list per metric, ``{"reward": [...], "loss": [...]}``, with an optional step list;
* ``notebook``: notebook output saved as a JSON list of stream records
  (``{"name": "stdout", "output_type": "stream", "text": [...]}``), or a whole ``.ipynb``: the cells'
  printed text is read as a console log.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from grpo_monitor.core.metrics import SUMMARY_KEYS, normalize
from grpo_monitor.readers._base import Normalizer, Source, SourceError, StepTable, as_step, finish, guess_context


def read_json_document(path: Path, obj: Any, logging_steps: int | None = None) -> Source:
    """Route a parsed JSON document to the reader its content fits."""
    if isinstance(obj, list):
        if is_notebook_outputs(obj):
            return read_notebook(path, obj, logging_steps)
        return read_log_history(path, obj, logging_steps)
    if isinstance(obj, dict):
        if "cells" in obj and isinstance(obj.get("cells"), list):
            return read_notebook(path, obj, logging_steps)
        if obj and all(isinstance(v, list) for v in obj.values()):
            return read_columns(path, obj, logging_steps)
        shown = ", ".join(repr(k) for k in list(obj)[:6]) + (", ..." if len(obj) > 6 else "")
        raise SourceError(path, "a JSON object without 'log_history' (not a trainer_state.json), nor a notebook or "
                                f"per-metric columns (lists); keys: {shown}")
    raise SourceError(path, f"a JSON {type(obj).__name__}, not a known log format")


def json_kind(obj: Any) -> str:
    if isinstance(obj, list):
        return "notebook" if is_notebook_outputs(obj) else "log_history"
    if isinstance(obj, dict):
        if "log_history" in obj:
            return "trainer_state"
        if isinstance(obj.get("cells"), list):
            return "notebook"
        return "columns"
    return "log_history"


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


# --------------------------------------------------------------------------------- notebook


def is_notebook_outputs(obj: list[Any]) -> bool:
    return bool(obj) and all(
        isinstance(r, dict) and ("output_type" in r or ("name" in r and "text" in r)) for r in obj
    )


def _text_of(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(v for v in value if isinstance(v, str))
    return ""


def _outputs_text(outputs: list[Any]) -> str:
    parts = []
    for r in outputs:
        if not isinstance(r, dict):
            continue
        if "text" in r:
            parts.append(_text_of(r["text"]))
        data = r.get("data")
        if isinstance(data, dict) and "text/plain" in data:
            parts.append(_text_of(data["text/plain"]) + "\n")
    return "".join(parts)


def read_notebook(path: Path, obj: Any, logging_steps: int | None = None) -> Source:
    from grpo_monitor.readers.console import read_console

    if isinstance(obj, dict):
        cells = obj.get("cells") or []
        text = "".join(_outputs_text(c.get("outputs") or []) for c in cells if isinstance(c, dict))
    else:
        text = _outputs_text(obj)
    src = read_console(path, text, logging_steps=logging_steps, label="the notebook's output")
    src.meta["console_format"] = src.format
    src.format = "notebook"
    return src
