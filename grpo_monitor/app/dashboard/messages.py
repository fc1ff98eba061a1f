"""Every message the dashboard posts, in one place."""

from __future__ import annotations

from typing import Any

from textual.message import Message


class RecordsArrived(Message):
    """One poll's worth of new run-log records (possibly empty when only the status changed)."""

    def __init__(
        self,
        records: list[dict[str, Any]],
        *,
        warnings: list[str] | None = None,
        waiting_for: str | None = None,
        caught_up: bool = False,
        sample_indexes: list[Any] | None = None,
        skipped: int | None = None,
    ) -> None:
        super().__init__()
        self.records = records
        self.warnings = warnings or []
        self.skipped = skipped  # lines left out as not records so far, in every file followed
        self.waiting_for = waiting_for
        self.caught_up = caught_up  # everything on disk so far has been delivered
        self.sample_indexes = sample_indexes  # the samples files' step indexes (a run directory)


class RunFound(Message):
    """The folder watched turned out to hold the run directory now followed (``run_dir``)."""

    def __init__(self, run_dir: Any) -> None:
        super().__init__()
        self.run_dir = run_dir


class SourceFailed(Message):
    """The path could not be read as any supported log; ``error`` is one line."""

    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error


class LayerChanged(Message):
    """The MoE heatmap switched to another layer."""
