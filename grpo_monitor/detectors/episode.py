"""Episodes: the warning/critical state machine every failure detector shares.

A subclass assesses each step and returns a level (0 healthy, 1 first evidence, 2 corroborated and
persistent) with its evidence; this class turns levels into findings: one finding per severity per
episode (a warning may later escalate to a critical), an episode ends only after ``clear_after``
healthy assessments in a row (hysteresis), and a new episode may then raise again.
"""

from __future__ import annotations

import math
import types
from collections.abc import Mapping, Sequence
from typing import Any

from grpo_monitor.detectors.base import Detector, Finding, Metrics, Sample
from grpo_monitor.detectors.signals import StepClock
from grpo_monitor.detectors.stats import tidy
from grpo_monitor.detectors.variants import preset

STATES = ("warming_up", "ok", "warning", "critical")
# What an engine entry returns for a step that raises nothing.
NOTHING: tuple[Finding, ...] = ()


class Assessment:
    """What a detector concluded at one step: ``level`` 0 (healthy), 1 (first evidence) or 2
    (corroborated and persistent), its evidence, the estimated onset, or that it is warming up.

    ``evidence`` is a dict, or a tuple ``(build, *args)`` whose dict ``build(*args)`` is made only
    when someone reads it: a healthy step's evidence is read far less often than it is produced.
    ``_assess`` may also return such a tuple alone for a plain healthy verdict (level 0).

    >>> Assessment(1, {"ratio": 0.2}, onset_step=40).level, materialize((dict, {"ratio": 0.9}))
    (1, {'ratio': 0.9})
    """

    __slots__ = ("evidence", "level", "onset_step", "warming_up")

    def __init__(self, level: int = 0, evidence: dict[str, Any] | None = None, onset_step: int | None = None,
                 warming_up: bool = False) -> None:
        self.level = level
        self.evidence = {} if evidence is None else evidence
        self.onset_step = onset_step
        self.warming_up = warming_up


def materialize(evidence: Any) -> dict[str, Any]:
    """The evidence dict of an ``Assessment.evidence`` (built now when it was deferred)."""
    return evidence[0](*evidence[1:]) if type(evidence) is tuple else evidence


def check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def check_float(name: str, value: Any, low: float, high: float, *, low_open: bool = False, high_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, got {value!r}")  # noqa: TRY004  (the contract: ValueError)
    v = float(value)
    bad_low = v <= low if low_open else v < low
    bad_high = v >= high if high_open else v > high
    if math.isnan(v) or bad_low or bad_high:
        lb = "(" if low_open else "["
        hb = ")" if high_open else "]"
        raise ValueError(f"{name} must be in {lb}{low}, {high}{hb}, got {value!r}")
    return v


def _own_copy(fn: Any) -> Any:
    """``fn`` with a code object of its own (same behaviour), marked as a copy of ``fn``."""
    copy = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    copy.__qualname__ = fn.__qualname__
    copy.__doc__ = fn.__doc__
    copy.__kwdefaults__ = fn.__kwdefaults__
    copy.__dict__.update(fn.__dict__)
    copy._copy_of = fn  # type: ignore[attr-defined]
    return copy


def is_fused_update(fn: Any) -> bool:
    """Whether ``fn`` is ``EpisodeDetector.update`` or a class's own copy of it.

    >>> class Quiet(EpisodeDetector):
    ...     id = "quiet"
    >>> is_fused_update(Quiet.update), Quiet.update is EpisodeDetector.update
    (True, False)
    """
    return fn is EpisodeDetector.update or getattr(fn, "_copy_of", None) is EpisodeDetector.update


class EpisodeDetector(Detector):
    """Base of the warning/critical detectors; subclasses implement ``_assess`` and ``_message``."""

    clear_after: int = 3
    # An episode also needs this many training steps of health to end (fine logs clear slower).
    clear_steps: int = 10

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # The fused ``update`` below skips ``_update``: a subclass with its own goes the long way.
        if "_update" in cls.__dict__ and "update" not in cls.__dict__:
            cls.update = Detector.update  # type: ignore[method-assign]
        elif "update" not in cls.__dict__ and is_fused_update(cls.update):
            # Each class gets its own copy of the code: the interpreter specialises attribute
            # access per code object, and one ``update`` shared by a dozen classes, all called at
            # every step, keeps missing those caches (about half its cost).
            cls.update = _own_copy(EpisodeDetector.update)  # type: ignore[method-assign]
        if is_fused_update(cls.update) and "_step" not in cls.__dict__:
            # The same for the step it hands on (a subclass of a class with its own ``_step`` gets
            # this one back: it may assess differently).
            cls._step = _own_copy(EpisodeDetector._step)  # type: ignore[method-assign]

    @property
    def last_evidence(self) -> dict[str, Any]:
        """The latest assessment's evidence, JSON-safe (built and tidied on read: dashboards read
        it far less often than detectors write it)."""
        ev = self._evidence
        if type(ev) is tuple:
            ev = self._evidence = ev[0](*ev[1:])
        return tidy(ev)  # type: ignore[return-value]

    @last_evidence.setter
    def last_evidence(self, value: dict[str, Any]) -> None:
        self._evidence = value

    def _reset(self) -> None:
        self.state = "warming_up"
        self._evidence: dict[str, Any] = {}
        self.in_episode = False
        self.episode_start: int | None = None
        self.episode_len = 0
        self._emitted = 0
        self._healthy_run = 0
        self._healthy_since: int | None = None
        self._pending = 0
        self._pending_onset: int | None = None
        self._pending_first: int | None = None
        self.clock = StepClock()
        # Opening an episode takes ``confirm_points`` consecutive assessments at level >= 1 that
        # also cover ``confirm_steps`` training steps (one point of a coarse log covers several),
        # so fine and coarse logs need the same stretch of training as evidence.
        self.confirm_points = 1
        self.confirm_steps = 0
        self._reset_state()

    def _reset_state(self) -> None:
        """Build the subclass's own mutable state."""

    def _assess(self, step: int, metrics: Metrics, samples: Sequence[Sample]) -> Assessment | None:
        raise NotImplementedError

    def _message(self, severity: str, evidence: Mapping[str, Any]) -> str:
        raise NotImplementedError

    def _overrides(self) -> dict[str, Any]:
        return preset(self.variant, self.context.config)

    def _moe_needs_gspo(self) -> bool:
        cfg = self.context.config or {}
        return (self.context.is_moe and self.variant not in (None, "gspo")
                and cfg.get("importance_sampling_level") != "sequence")

    def update(self, step: int, metrics: Metrics, samples: Sequence[Sample] | None = None) -> list[Finding]:
        # ``Detector.update`` and ``_update`` in one call: the step as ``_step`` takes it.
        if step.__class__ is not int:
            step = int(step)
        if metrics.__class__ is not dict and not isinstance(metrics, Mapping):
            metrics = {}
        clock = self.clock
        cs = clock._steps
        if not cs or step > cs[-1]:  # StepClock.tick
            cs.append(step)
            clock._gap = None
        self._n += 1
        out = self._step(step, metrics, samples)
        return out if out.__class__ is list else [*out]

    def _step(self, step: int, metrics: Metrics, samples: Sequence[Sample] | None) -> Sequence[Finding]:
        """One step, assessed and booked: ``step`` an int, ``metrics`` a mapping, the step already
        counted and the step clock already ticked (by ``update``, ``replay_steps``, or the engine,
        which keeps one count and one clock for its detectors). Returns the findings raised,
        ``NOTHING`` when none (an engine only extends its list with them).

        ``Engine.update`` calls it directly on its common path. A class may write its own that takes
        its commonest step whole, in one call (booking a healthy verdict as below), and hands any other
        step to this one; its subclasses get this one back (they may assess differently)."""
        a = self._assess(step, metrics, samples or ())
        if a.__class__ is tuple and not (self.in_episode or self._pending) and self.state == "ok":
            self._evidence = a  # a healthy verdict on a healthy run: nothing else changes
            return NOTHING
        return self._conclude(step, a)

    def _conclude(self, step: int, a: Assessment | tuple[Any, ...] | None) -> Sequence[Finding]:
        """The bookkeeping of one assessment (``_step`` less the count)."""
        if a.__class__ is tuple:
            self._evidence = a
            if not self.in_episode:
                self.state = "ok"
                if self._pending:  # nothing is pending otherwise (no onset either)
                    self._pending = 0
                    self._pending_onset = None
                return NOTHING
            return self._settle(step, Assessment(0, a))  # type: ignore[arg-type]
        if a is None:
            return NOTHING
        self._evidence = a.evidence  # type: ignore[union-attr]
        if a.level == 0 and not self.in_episode:  # type: ignore[union-attr]
            self.state = "warming_up" if a.warming_up else "ok"  # type: ignore[union-attr]
            self._pending = 0
            self._pending_onset = None
            return NOTHING
        return self._settle(step, a)  # type: ignore[arg-type]

    def _update(self, step: int, metrics: Metrics, samples: Sequence[Sample]) -> list[Finding]:
        if type(metrics) is not dict and not isinstance(metrics, Mapping):
            metrics = {}
        self.clock.tick(step)
        out = self._conclude(step, self._assess(step, metrics, samples))
        return out if out.__class__ is list else [*out]

    def replay_steps(
        self, steps: Sequence[tuple[int, Metrics]], samples: Sequence[Sequence[Sample] | None] | None = None
    ) -> tuple[list[tuple[int, list[Finding]]], tuple[int, Exception] | None]:
        """``update`` over a whole recorded run in one loop: ``(index, findings)`` for every step
        that raised any, and ``(index, exception)`` for the step that failed (the loop stops there).

        Exactly ``update`` step by step (same state, same findings), without its per-step calls.
        """
        found: list[tuple[int, list[Finding]]] = []
        step_fn = self._step
        clock = self.clock
        i = -1
        try:
            for i, (step, metrics) in enumerate(steps):
                self._n += 1
                if type(step) is not int:
                    step = int(step)
                if type(metrics) is not dict and not isinstance(metrics, Mapping):
                    metrics = {}
                # StepClock.tick, inlined
                cs = clock._steps
                if not cs or step > cs[-1]:
                    cs.append(step)
                    clock._gap = None
                out = step_fn(step, metrics, samples[i] if samples is not None else None)
                if out:
                    found.append((i, list(out)))
        except Exception as exc:  # reported to the caller, which disables the detector as ``Engine.update`` does
            return found, (i, exc)
        return found, None

    def _settle(self, step: int, a: Assessment) -> list[Finding]:
        """The episode bookkeeping of a step that is not plainly healthy."""
        if a.warming_up and not self.in_episode:
            self.state = "warming_up"
            return []
        findings: list[Finding] = []
        if a.level >= 1 and not self.in_episode:
            self._pending += 1
            if self._pending == 1:
                self._pending_onset = a.onset_step if a.onset_step is not None else step
                self._pending_first = step
            covered = step - (self._pending_first or step) + self.clock.gap
            if self._pending < max(1, self.confirm_points) or covered < self.confirm_steps:
                self.state = "ok"
                return findings
        if a.level >= 1:
            self._healthy_run = 0
            self._healthy_since = None
            if not self.in_episode:
                self.in_episode = True
                onset = a.onset_step if a.onset_step is not None else step
                if self._pending_onset is not None:
                    onset = min(onset, self._pending_onset)
                self.episode_start = onset
                self.episode_len = 0
                self._pending = 0
                self._pending_onset = None
            self.episode_len += 1
            if a.level > self._emitted:
                severity = "critical" if a.level >= 2 else "warning"
                self._emitted = a.level
                raw = self._evidence = materialize(a.evidence)  # ``_overrides`` may read it
                evidence: dict[str, Any] = tidy(raw)  # type: ignore[assignment]
                variant, overrides, message = self.variant, self._overrides(), self._message(severity, evidence)
                if self._moe_needs_gspo():
                    # The recipe requires GSPO's sequence-level ratio on MoE: any switch there is GSPO.
                    variant, overrides = "gspo", preset("gspo", self.context.config)
                    message += (" This is a mixture-of-experts model: instead, switch to GSPO (sequence-level "
                                "importance ratio), which the recipe requires there.")
                findings.append(
                    Finding(
                        detector=self.id,
                        severity=severity,
                        step=step,
                        onset_step=self.episode_start,
                        variant=variant,
                        config_overrides=overrides,
                        evidence=evidence,
                        message=message,
                    )
                )
            self.state = "critical" if self._emitted >= 2 else "warning"
        elif self.in_episode:
            self._healthy_run += 1
            if self._healthy_since is None:
                self._healthy_since = step
            if self._healthy_run >= self.clear_after and step - self._healthy_since >= self.clear_steps - 1:
                self.in_episode = False
                self.episode_start = None
                self.episode_len = 0
                self._emitted = 0
                self.state = "ok"
        else:
            self._pending = 0
            self._pending_onset = None
            self.state = "ok"
        return findings
