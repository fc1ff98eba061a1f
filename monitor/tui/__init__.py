"""The Textual dashboard: ``grpo-monitor watch RUN`` (or ``python -m grpo_monitor.monitor.tui RUN``).

Importing this package does not import Textual; ``run_watch`` and ``WatchApp`` load it on use,
so ``import grpo_monitor`` stays light for offline analysis.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from grpo_monitor.monitor.tui.app import WatchApp

__all__ = ["WatchApp", "run_watch"]


def run_watch(path: str | os.PathLike[str]) -> None:
    """Open the dashboard on ``path`` and block until the user quits.

    ``path`` is a run directory (followed live as it grows, even before it exists), its
    ``run.jsonl``, or any log ``grpo-monitor analyze`` reads (replayed through the detectors).
    """
    from grpo_monitor.monitor.tui.app import WatchApp

    WatchApp(path).run()


def __getattr__(name: str) -> Any:
    if name == "WatchApp":
        from grpo_monitor.monitor.tui.app import WatchApp

        return WatchApp
    raise AttributeError(f"module 'grpo_monitor.monitor.tui' has no attribute {name!r}")
