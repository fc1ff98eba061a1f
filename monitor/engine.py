"""The engine: one place that drives every detector, live and in replay.

The live callback and ``analyze`` both feed steps through ``Engine.update``, so a finding
replayed offline is raised at the same step it was raised live. A detector that raises is
reported once and switched off; the others keep running.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from detectors.base import Detector, Finding, RunContext

logger = logging.getLogger("grpo_monitor")


def default_detectors() -> list[Detector]:
    """A fresh instance of every built-in detector, with default parameters."""
    import detectors

    return [cls() for cls in detectors.ALL_DETECTORS]


class Engine:
    def __init__(
        self,
        context: RunContext | None = None,
        detectors: Sequence[Detector] | None = None,
        on_error: Callable[[str, BaseException], None] | None = None,
    ) -> None:
        self.context = context or RunContext()
        self.detectors = list(default_detectors() if detectors is None else detectors)
        self.findings: list[Finding] = []
        self.disabled: dict[str, str] = {}
        self._on_error = on_error
        for d in self.detectors:
            d.start(self.context)

    def update(
        self, step: int, metrics: Mapping[str, float | None], samples: Sequence[Mapping[str, Any]] | None = None
    ) -> list[Finding]:
        raised: list[Finding] = []
        for d in self.detectors:
            if d.id in self.disabled:
                continue
            try:
                raised.extend(d.update(step, metrics, samples))
            except Exception as exc:  # a broken detector must not take the others, or the run, down
                self.disabled[d.id] = f"{type(exc).__name__}: {exc}"
                if self._on_error is not None:
                    self._on_error(f"detector {d.id}", exc)
                else:
                    logger.warning("grpo-monitor: detector %s failed and is disabled: %s", d.id, exc)
        self.findings.extend(raised)
        return raised

    def states(self) -> dict[str, dict[str, Any]]:
        """Each detector's current state for dashboards: ``state`` and the latest evidence."""
        out = {}
        for d in self.detectors:
            state = "disabled" if d.id in self.disabled else getattr(d, "state", "ok")
            out[d.id] = {"state": state, "evidence": getattr(d, "last_evidence", {})}
        return out
