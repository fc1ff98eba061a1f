"""One monitoring session: the engine, its annotators, the diagnosis and the recommender, built one way.

The live callback, ``analyze`` and the dashboard each watch a run through a ``Session`` opened by
``open_session``, so the three cannot disagree: the same detectors see the same steps, the same diagnosis
names the cause of each finding against the rest of the run's signals, and the same recommender turns the
diagnosed findings into changes. Offline, ``Session.replay`` is the one loop over a recorded run.

>>> from grpo_monitor.detectors.base import RunContext
>>> session = open_session(RunContext())
>>> out = session.update(1, {"reward": 0.5, "loss": float("nan")})
>>> [(f.detector, f.severity) for f in out.findings]
[('non_finite', 'warning')]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

from grpo_monitor.core.diagnosis import Diagnosis
from grpo_monitor.core.engine import Engine
from grpo_monitor.core.recommend import Recommender
from grpo_monitor.detectors.base import Detector, Finding, RunContext


@dataclasses.dataclass(frozen=True)
class SessionOptions:
    """How a session is built beyond the run's own facts (``RunContext``).

    ``detectors``: the detectors to run (None: every built-in one), team rules included;
    ``devices``: the device count the cost figures use, where the log does not record it;
    ``gpu_hour_price``: the price of one GPU-hour (None: no money figures);
    ``runtime``: the run's ``train_runtime`` and the steps it covered, the cost's clock of last resort offline;
    ``tried``/``segment``: the variants a restarted lineage tried before this segment, and its segment;
    ``clipping_never_fired``: the log's clip ratios were 0 on every step (offline: the run trained on-policy);
    ``on_error``: called once with (component, exception) when a part fails (live: logged, training goes on).
    """

    detectors: Sequence[Detector] | None = None
    devices: int | None = None
    gpu_hour_price: float | None = None
    runtime: tuple[float, int] | None = None
    tried: Sequence[str] | Mapping[str, int | None] = ()
    segment: int | None = None
    clipping_never_fired: bool = False
    on_error: Callable[[str, BaseException], None] | None = None


@dataclasses.dataclass
class StepOutcome:
    """What one step gave: the diagnosed findings, their recommendation records and every detector's state."""

    findings: list[Finding]
    recommendations: list[dict[str, Any]]
    states: dict[str, str]


class Session:
    """The engine, its annotators, the diagnosis and the recommender of one run (``open_session`` builds it)."""

    def __init__(self, context: RunContext, options: SessionOptions) -> None:
        from grpo_monitor.core.cost import CostMeter
        from grpo_monitor.core.forecast import Forecaster

        self.context = context
        self.options = options
        self.engine = Engine(context, options.detectors, on_error=options.on_error, annotators=[
            CostMeter(devices=options.devices, gpu_hour_price=options.gpu_hour_price, runtime=options.runtime),
            Forecaster()])
        self.diagnosis = Diagnosis(context)
        self.recommender = Recommender(context.config, is_moe=context.is_moe, tried=options.tried,
                                       segment=options.segment, clipping_never_fired=options.clipping_never_fired)
        self.findings: list[Finding] = []
        self.recommendations: list[dict[str, Any]] = []
        self._failed: set[str] = set()

    def preflight(self, findings: Iterable[Finding]) -> list[dict[str, Any]]:
        """The recipe's pre-flight findings, met when training begins: their recommendation records (they are
        advice on the recipe and never part of the verdict, so they are not diagnosed)."""
        recs = [r for r in (self.recommender(f.to_dict()) for f in findings) if r is not None]
        self.recommendations.extend(recs)
        return recs

    def update(self, step: int, metrics: Mapping[str, float | None],
               samples: Sequence[Mapping[str, Any]] | None = None) -> StepOutcome:
        """One logged step through the detectors, the diagnosis and the recommender."""
        raised = self.engine.update(step, metrics, samples)
        findings = self._guarded("diagnosis", self.diagnosis.review, raised, step, metrics, self.engine)
        if findings is None:  # a failed diagnosis leaves the detectors' own findings, as they were
            findings = raised
        recs = [r for r in (self.recommender(f.to_dict()) for f in findings) if r is not None]
        self.findings.extend(findings)
        self.recommendations.extend(recs)
        return StepOutcome(findings, recs, self.state_names())

    def replay(self, steps: Iterable[tuple[int, Mapping[str, float | None]]],
               samples: Mapping[int, Sequence[Mapping[str, Any]]] | None = None,
               each: Callable[[int, Mapping[str, float | None], Sequence[Mapping[str, Any]] | None, StepOutcome], None]
               | None = None) -> list[Finding]:
        """A whole recorded run, step by step as it was logged: the findings the live session raised.
        ``samples`` maps a step to its sample records (it may read them from disk as asked); ``each`` is
        called after every step with what it gave (the dashboard builds its records from it)."""
        raised: list[Finding] = []
        for step, metrics in steps:
            batch = samples.get(step) if samples is not None else None
            out = self.update(step, metrics, batch)
            raised += out.findings
            if each is not None:
                each(step, metrics, batch, out)
        return raised

    def coverage(self, names: Collection[str], has_samples: bool = False) -> dict[str, dict[str, Any]]:
        """Which detectors could judge the steps fed so far, and why the others could not (``Engine.coverage``)."""
        return self.engine.coverage(names, has_samples)

    def state_names(self) -> dict[str, str]:
        """Each detector's state, as the diagnosis leaves it: a finding it set aside does not show as an alarm."""
        states = self.engine.state_names()
        return self.diagnosis.shown_states(states)

    def _guarded(self, part: str, fn: Callable[..., Any], *args: Any) -> Any:
        if part in self._failed:
            return None
        try:
            return fn(*args)
        except Exception as exc:  # a broken part must not take the findings, or the run, down
            self._failed.add(part)
            if self.options.on_error is not None:
                self.options.on_error(part, exc)
            else:
                import logging

                logging.getLogger("grpo_monitor").warning("grpo-monitor: %s failed and is disabled: %s", part, exc)
            return None


def open_session(context: RunContext | None = None, options: SessionOptions | None = None) -> Session:
    """The one way a run is watched, live or offline: see ``Session``."""
    return Session(context or RunContext(), options or SessionOptions())
