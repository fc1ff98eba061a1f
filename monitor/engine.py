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
from detectors.episode import EpisodeDetector

logger = logging.getLogger("grpo_monitor")
_EPISODE_UPDATE = EpisodeDetector._update


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

    def replay(
        self, steps: Sequence[tuple[int, Mapping[str, float | None]]],
        samples: Mapping[int, Sequence[Mapping[str, Any]]] | None = None,
    ) -> list[Finding]:
        """Feed a whole recorded run; the same findings, in the same order, as ``update`` per step.

        Detectors share no state, so each one runs over every step before the next starts: a
        tight loop per detector is much faster than cycling through all of them at each step.
        Findings are then merged back into step order (detectors in their order within a step),
        and a detector that raises is disabled from that step on, exactly as ``update`` does.
        """
        if len({d.id for d in self.detectors}) != len(self.detectors):
            # Disabling goes by id: with shared ids one failure silences several detectors
            # mid-step, which only the step-by-step loop reproduces.
            raised: list[Finding] = []
            for step, metrics in steps:
                raised.extend(self.update(step, metrics, samples.get(step) if samples else None))
            return raised
        steps = steps if isinstance(steps, list) else list(steps)
        per_step = [samples.get(step) for step, _ in steps] if samples else None
        found: list[tuple[int, int, list[Finding]]] = []
        errors: list[tuple[int, int, str, BaseException]] = []
        for j, d in enumerate(self.detectors):
            if d.id in self.disabled:
                continue
            fast = getattr(d, "replay_steps", None)
            if fast is not None and type(d).update is Detector.update and getattr(type(d), "_update", None) is _EPISODE_UPDATE:
                fs, err = fast(steps, per_step)
                found.extend((i, j, out) for i, out in fs)
                if err is not None:
                    errors.append((err[0], j, d.id, err[1]))
                continue
            update = d.update
            i = 0
            try:
                if per_step is None:
                    for i, (step, metrics) in enumerate(steps):
                        out = update(step, metrics, None)
                        if out:
                            found.append((i, j, out if type(out) is list else list(out)))
                        elif out.__class__ is not list:
                            list(out)  # what ``extend`` would make of it: raises for a non-iterable
                else:
                    for i, (step, metrics) in enumerate(steps):
                        out = update(step, metrics, per_step[i])
                        if out:
                            found.append((i, j, out if type(out) is list else list(out)))
                        elif out.__class__ is not list:
                            list(out)
            except Exception as exc:  # a broken detector must not take the others down
                errors.append((i, j, d.id, exc))
        found.sort(key=lambda t: (t[0], t[1]))
        errors.sort(key=lambda t: (t[0], t[1]))
        for _, _, det_id, exc in errors:
            self.disabled[det_id] = f"{type(exc).__name__}: {exc}"
            if self._on_error is not None:
                self._on_error(f"detector {det_id}", exc)
            else:
                logger.warning("grpo-monitor: detector %s failed and is disabled: %s", det_id, exc)
        raised = [f for _, _, fs in found for f in fs]
        self.findings.extend(raised)
        return raised

    def states(self) -> dict[str, dict[str, Any]]:
        """Each detector's current state for dashboards: ``state`` and the latest evidence."""
        out = {}
        for d in self.detectors:
            state = "disabled" if d.id in self.disabled else getattr(d, "state", "ok")
            out[d.id] = {"state": state, "evidence": getattr(d, "last_evidence", {})}
        return out
