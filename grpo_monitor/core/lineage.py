"""Lineages: a run and the segments it was restarted into, read back from disk (``callbacks.restarts``
writes them in process)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo_monitor.core.restart import RestartPlan, lineage_dirs, read_plan


@dataclass
class Segment:
    index: int
    run_dir: Path
    plan: RestartPlan | None  # why this segment stopped for a restart; None if it ran to its end
    variant: str | None = None  # the variant this segment trained with (None: the original config)
    overrides: dict[str, Any] = field(default_factory=dict)
    global_step: int | None = None
    args: Any = None


@dataclass
class Lineage:
    root: Path
    segments: list[Segment]

    @property
    def variants(self) -> list[str]:
        return [s.variant for s in self.segments if s.variant]

    def __len__(self) -> int:
        return len(self.segments)


def read_lineage(root: str | os.PathLike[str]) -> Lineage:
    """The segments found under a lineage root, each with the plan that ended it."""
    segments = []
    variant: str | None = None
    overrides: dict[str, Any] = {}
    for i, d in enumerate(lineage_dirs(root)):
        plan = read_plan(d)
        segments.append(Segment(i, d, plan, variant, dict(overrides)))
        if plan is None:
            break
        variant, overrides = plan.variant, dict(plan.cumulative_overrides)
    return Lineage(Path(root), segments)
