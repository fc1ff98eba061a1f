"""The engine: one place that drives every detector, live and in replay.

The live callback and ``analyze`` both feed steps through ``Engine.update``, so a finding replayed
offline is raised at the same step it was raised live. A detector that raises is reported once and
switched off; the others keep running.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

from grpo_monitor.detectors.base import Detector, Finding, RunContext

logger = logging.getLogger("grpo_monitor")


def default_annotators() -> list[Any]:
    """What every finding is annotated with, from the run's own metrics: its cost (``core.cost``) and, where a
    trend heads for a limit, the time left until it (``core.forecast``)."""
    from grpo_monitor.core.cost import CostMeter
    from grpo_monitor.core.forecast import Forecaster

    return [CostMeter(), Forecaster()]


def default_detectors() -> list[Detector]:
    """A fresh instance of every built-in detector, with default parameters."""
    from grpo_monitor import detectors

    return [cls() for cls in detectors.ALL_DETECTORS]


class Engine:
    """Every detector over one run: ``update`` one logged step at a time, ``replay`` a recorded run.

    >>> from grpo_monitor.detectors import NonFinite
    >>> engine = Engine(RunContext(), [NonFinite()])
    >>> [f.severity for s in (1, 2) for f in engine.update(s, {"loss": float("nan") if s == 2 else 0.1})]
    ['warning']
    """

    def __init__(
        self,
        context: RunContext | None = None,
        detectors: Sequence[Detector] | None = None,
        on_error: Callable[[str, BaseException], None] | None = None,
        annotators: Sequence[Any] | None = None,
    ) -> None:
        self.context = context or RunContext()
        self.detectors = list(default_detectors() if detectors is None else detectors)
        # Each sees every step before the detectors (``observe``) and adds to the evidence of each finding
        # raised (``annotate``), so live and replayed findings carry the same figures.
        self.annotators = list(default_annotators() if annotators is None else annotators)
        self.findings: list[Finding] = []
        self.disabled: dict[str, str] = {}
        self._on_error = on_error
        for d in self.detectors:
            d.start(self.context)
        self.annotators_failed: list[Any] = []
        for a in self.annotators:
            a.start(self.context)

    def update(
        self, step: int, metrics: Mapping[str, float | None], samples: Sequence[Mapping[str, Any]] | None = None
    ) -> list[Finding]:
        """Every running detector over one step; the findings raised."""
        for a in self.annotators:
            self._annotator(a, "observe", step, metrics, samples)
        raised: list[Finding] = []
        for d in self.detectors:
            if d.id in self.disabled:
                continue
            try:
                raised.extend(d.update(step, metrics, samples))
            except Exception as exc:  # a broken detector must not take the others, or the run, down
                self._disable(d.id, exc)
        for f in raised:
            for a in self.annotators:
                self._annotator(a, "annotate", f)
        self.findings.extend(raised)
        return raised

    def warm_up(self) -> None:
        """Import now the modules a detector or annotator imports only when it has something to fit (scipy's,
        ~1-2 s): live, they are paid before the first step rather than inside the step that raises the first
        finding. Offline, nothing needs it."""
        # An annotator, or a detector object that predates the attribute, may not declare any.
        for name in sorted({m for part in (*self.detectors, *self.annotators) for m in getattr(part, "fit_imports", ())}):
            importlib.import_module(name)

    def annotator(self, kind: type) -> Any:
        """The running annotator of a kind (``CostMeter``, ``Forecaster``), or None."""
        return next((a for a in self.annotators if isinstance(a, kind)), None)

    def _annotator(self, a: Any, method: str, *args: Any) -> None:
        if a in self.annotators_failed:
            return
        try:
            getattr(a, method)(*args)
        except Exception as exc:  # an annotation is extra: the findings go out without it
            self.annotators_failed.append(a)
            name = f"annotator {type(a).__name__}"
            if self._on_error is not None:
                self._on_error(name, exc)
            else:
                logger.warning("grpo-monitor: %s failed and is disabled: %s", name, exc)

    def _disable(self, det_id: str, exc: BaseException) -> None:
        self.disabled[det_id] = f"{type(exc).__name__}: {exc}"
        if self._on_error is not None:
            self._on_error(f"detector {det_id}", exc)
        else:
            logger.warning("grpo-monitor: detector %s failed and is disabled: %s", det_id, exc)

    def replay(
        self, steps: Iterable[tuple[int, Mapping[str, float | None]]],
        samples: Mapping[int, Sequence[Mapping[str, Any]]] | None = None,
    ) -> list[Finding]:
        """Feed a whole recorded run, step by step as it was logged: the same findings ``update`` raised live.
        ``samples`` maps a step to its sample records (it may read them from disk as asked)."""
        raised: list[Finding] = []
        for step, metrics in steps:
            raised += self.update(step, metrics, samples.get(step) if samples is not None else None)
        return raised

    def coverage(self, names: Collection[str], has_samples: bool = False) -> dict[str, dict[str, Any]]:
        """Which detectors could judge the steps fed so far, and why the others could not.

        ``names`` are the metrics the run logged with a value. Each detector gets ``role``,
        ``status`` (``judged``, ``missing_inputs``, ``too_few_points``, ``not_applicable`` or
        ``failed``) and ``reason`` (None when judged). A detector with its inputs that never left
        its warm-up had too few logged points to set its baseline.
        """
        names = names if isinstance(names, (set, frozenset, dict)) else set(names)
        out: dict[str, dict[str, Any]] = {}
        for d in self.detectors:
            role = getattr(d, "role", "failure")
            status, reason = "judged", None
            try:
                if d.id in self.disabled:
                    status, reason = "failed", f"failed and was switched off ({self.disabled[d.id]})"
                elif (why := _hook(d, "not_applicable", names)) is not None:
                    status, reason = "not_applicable", why
                elif (why := _hook(d, "missing_inputs", names, has_samples)) is not None:
                    status, reason = "missing_inputs", why
                elif getattr(d, "state", "ok") == "warming_up":
                    n = getattr(d, "n_updates", 0)
                    status = "too_few_points"
                    reason = f"still warming up after {n} logged point{'s' if n != 1 else ''}: too few to set its baseline"
            except Exception as exc:  # a broken hook must not hide the other detectors' coverage
                status, reason = "failed", f"could not tell ({type(exc).__name__}: {exc})"
            out[d.id] = {"role": role, "status": status, "reason": reason}
        return out

    def state_names(self) -> dict[str, str]:
        """Each detector's state alone (what a step record keeps), without building evidence."""
        return {d.id: "disabled" if d.id in self.disabled else getattr(d, "state", "ok") for d in self.detectors}

    def states(self) -> dict[str, dict[str, Any]]:
        """Each detector's current state for dashboards: ``state`` and the latest evidence."""
        out = {}
        for d in self.detectors:
            state = "disabled" if d.id in self.disabled else getattr(d, "state", "ok")
            out[d.id] = {"state": state, "evidence": getattr(d, "last_evidence", {})}
        return out


def _hook(d: Detector, name: str, *args: Any) -> str | None:
    """A coverage hook of a detector that may predate it (an object without the method answers None)."""
    fn = getattr(d, name, None)
    return fn(*args) if callable(fn) else None


