"""grpo-monitor: training-time diagnostics and variant recommendations for GRPO runs.

``import monitor`` stays light (numpy, pandas on demand): the TRL integration and the dashboard
load only when used.

>>> import monitor
>>> sorted(monitor.__all__)[:3]
['Engine', 'Finding', 'RunContext']
"""

from __future__ import annotations

from typing import Any

from detectors.base import Finding, RunContext
from monitor.engine import Engine
from monitor.runlog import RunLog, RunLogError, read_run

__version__ = "0.1.0"

__all__ = [
    "Engine",
    "Finding",
    "RunContext",
    "RunLog",
    "RunLogError",
    "__version__",
    "analyze",
    "attach",
    "load_run",
    "read_run",
    "run_with_restarts",
]


def attach(trainer: Any, run_dir: Any = None, **options: Any) -> Any:
    """Attach the monitor to a TRL ``GRPOTrainer``; see ``callbacks.attach``."""
    from callbacks import attach as _attach

    return _attach(trainer, run_dir, **options)


def load_run(path: Any):
    """Any supported run (run directory, trainer_state.json, TensorBoard, CSV, JSONL) as a DataFrame.

    A run directory that was restarted gives all its segments, one after the other, with a
    ``segment`` column (0 for the first).
    """
    from monitor.restart import lineage_dirs
    from monitor.runlog import is_run_dir
    from monitor.runlog import load_run as _load_run_dir

    if is_run_dir(path):
        dirs = lineage_dirs(path)
        if len(dirs) == 1:
            return _load_run_dir(path)
        import pandas as pd

        frames = [_load_run_dir(d).assign(segment=i) for i, d in enumerate(dirs)]
        return pd.concat(frames)
    from monitor.sources import load_source

    return load_source(path).frame()


def analyze(path: Any, **options: Any) -> Any:
    """Replay the detectors over a finished run and return its report."""
    from monitor.analysis import analyze as _analyze

    return _analyze(path, **options)


def run_with_restarts(make_trainer: Any, args: Any, **options: Any) -> Any:
    """Train with auto-restart into the recommended variant; see ``monitor.lineage.run_with_restarts``."""
    from monitor.lineage import run_with_restarts as _run

    return _run(make_trainer, args, **options)
