"""grpo-monitor: training-time diagnostics and GRPO-variant recommendations for TRL ``GRPOTrainer`` runs.

The one import path users need, which no module of a training script (its own ``callbacks.py``,
``monitor.py`` or ``detectors.py``) can shadow::

    from grpo_monitor import attach
    attach(trainer)                     # or attach(trainer, alerts="https://hooks.slack.com/...")

    import grpo_monitor
    report = grpo_monitor.analyze("runs/my-run")

Importing this package stays light: numpy, never torch, transformers or textual (the TRL integration
and the dashboard load when used).

>>> import grpo_monitor
>>> [name for name in sorted(grpo_monitor.__all__) if name.endswith("Options")][:3]
['AlertOptions', 'AnalyzeOptions', 'DeviceOptions']
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from grpo_monitor.core import __version__
from grpo_monitor.core.engine import Engine
from grpo_monitor.core.runlog import RunLog, RunLogError, read_run
from grpo_monitor.detectors.base import Finding, RunContext

if TYPE_CHECKING:  # the real functions, for editors and type checkers; loaded when first used
    from grpo_monitor.alerts.options import AlertOptions
    from grpo_monitor.analysis.analyze import AnalyzeOptions, analyze
    from grpo_monitor.callbacks.attach import attach
    from grpo_monitor.callbacks.options import (
        DeviceOptions,
        RestartOptions,
        RewardGateOptions,
        RouterOptions,
        SampleOptions,
    )
    from grpo_monitor.callbacks.restarts import run_with_restarts

__all__ = [
    "AlertOptions",
    "AnalyzeOptions",
    "DeviceOptions",
    "Engine",
    "Finding",
    "RestartOptions",
    "RewardGateOptions",
    "RouterOptions",
    "RunContext",
    "RunLog",
    "RunLogError",
    "SampleOptions",
    "__version__",
    "analyze",
    "attach",
    "load_run",
    "read_run",
    "run_with_restarts",
]

# Public functions whose modules load only when used: the training side imports transformers and torch.
_LAZY = {
    "AlertOptions": "grpo_monitor.alerts.options",
    "AnalyzeOptions": "grpo_monitor.analysis.analyze",
    "DeviceOptions": "grpo_monitor.callbacks.options",
    "RestartOptions": "grpo_monitor.callbacks.options",
    "RewardGateOptions": "grpo_monitor.callbacks.options",
    "RouterOptions": "grpo_monitor.callbacks.options",
    "SampleOptions": "grpo_monitor.callbacks.options",
    "analyze": "grpo_monitor.analysis.analyze",
    "attach": "grpo_monitor.callbacks.attach",
    "run_with_restarts": "grpo_monitor.callbacks.restarts",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'grpo_monitor' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def load_run(path: str | os.PathLike[str], logging_steps: int | None = None,
             mapping: Mapping[str, str] | Sequence[str] | None = None) -> Any:
    """Any supported run (run directory, trainer_state.json, TensorBoard, CSV, JSONL, console log, W&B or
    trackio run) as a DataFrame. ``logging_steps`` numbers a console log's dicts where the log does not say;
    ``mapping`` reads a column as a metric (``{"score_mean": "reward"}``), as ``analyze(..., AnalyzeOptions(mapping=...))`` does.

    A file holding several runs (a results JSON with one run per arm) gives them one after the other,
    with a ``run`` column naming each. A run directory that was restarted gives all its segments, one
    after the other, with a ``segment`` column (0 for the first, as run headers and the ``segment-<n>/`` folders number
    them; the dashboard and ``analyze``'s report count segments from 1, so column value n is
    "segment n+1" there).
    """
    from grpo_monitor.core.restart import lineage_dirs
    from grpo_monitor.core.runlog import is_run_dir
    from grpo_monitor.core.runlog import run_frame

    if is_run_dir(path):
        dirs = lineage_dirs(path)
        if len(dirs) == 1:
            frame = run_frame(path)
        else:
            import pandas as pd

            frame = pd.concat([run_frame(d).assign(segment=i) for i, d in enumerate(dirs)])
        if mapping:
            from grpo_monitor.analysis.prepare import parse_mapping

            frame = frame.rename(columns=parse_mapping(mapping))
        return frame
    from grpo_monitor.analysis.prepare import parse_mapping, prepare
    from grpo_monitor.readers import load_source

    src = load_source(path, logging_steps=logging_steps)
    columns = parse_mapping(mapping)
    if src.parts:  # one run per arm of a results file: one frame, a ``run`` column naming each
        import pandas as pd

        return pd.concat([prepare(part, columns).frame().assign(run=label) for label, part in src.parts])
    return prepare(src, columns).frame()
