"""The detector contract: a finding, what a run tells its detectors, and the base class every detector extends.

A detector sees one logged step at a time: its metrics under TRL 1.16 names and, when the run records them,
the per-completion sample records of that step. It implements one method, ``assess``, which says what this
step shows: healthy (level 0), first evidence of its failure (level 1) or corroborated, persistent evidence
(level 2), still warming up, or nothing to judge (None). The base class's ``update`` turns assessments into
findings (an *episode*): one finding per severity per episode, a warning may later escalate to a critical,
the episode ends only after a stretch of healthy steps, and a new episode may then raise again.

A detector, whole (``detectors/non_finite.py`` is the smallest real one):

>>> class LossIsNegative(Detector):
...     id = "loss_is_negative"
...     requires = (("loss",),)
...
...     def __init__(self, points: int = 3) -> None:
...         self.points = check_int("points", points, 1)   # parameters validated, kept under their names
...         super().__init__()
...
...     def _reset_state(self) -> None:
...         self.run = 0                                     # all mutable state, rebuilt by ``reset``
...
...     def assess(self, step, metrics, samples):
...         loss = finite(metrics.get("loss"))
...         if loss is None:
...             return None                                  # nothing measured at this step
...         self.run = self.run + 1 if loss < 0 else 0
...         level = 2 if self.run >= self.points else 1 if self.run else 0
...         return Assessment(level, {"loss": loss, "points_in_a_row": self.run})
...
...     def _message(self, severity, evidence):
...         return f"The loss has been negative for {evidence['points_in_a_row']} logged steps."
>>> det = LossIsNegative()
>>> [(f.severity, f.step) for s in range(1, 6) for f in det.update(s, {"loss": -0.1 if s > 1 else 0.2})]
[('warning', 2), ('critical', 4)]
"""

from __future__ import annotations

import dataclasses
import fnmatch
import inspect
import math
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from grpo_monitor.detectors.numbers import finite, to_number
from grpo_monitor.detectors.stats import StepClock, tidy
from grpo_monitor.detectors.variants import preset

SEVERITIES = ("info", "warning", "critical")
VARIANTS = ("dapo", "dr_grpo", "gspo")
STATES = ("warming_up", "ok", "warning", "critical")

__all__ = ["Assessment", "Detector", "Episode", "Finding", "RunContext", "check_float", "check_int", "finite",
           "to_number", "unmet"]

Metrics = Mapping[str, "float | None"]
Sample = Mapping[str, Any]


@dataclasses.dataclass
class Finding:
    """One diagnosis, with the numbers behind it. The field set is a fixed contract."""

    detector: str
    severity: str
    step: int
    onset_step: int | None
    variant: str | None
    config_overrides: dict[str, Any]
    evidence: dict[str, Any]
    message: str

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, got {self.severity!r}")
        if self.variant is not None and self.variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS} or None, got {self.variant!r}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Finding:
        names = [f.name for f in dataclasses.fields(cls)]
        missing = [n for n in names if n not in data]
        if missing:
            raise ValueError(f"finding record lacks {', '.join(missing)}")
        return cls(**{n: data[n] for n in names})


@dataclasses.dataclass
class RunContext:
    """What is known about a run before its first step (empty for foreign logs)."""

    config: dict[str, Any] = dataclasses.field(default_factory=dict)
    model: dict[str, Any] = dataclasses.field(default_factory=dict)
    reward_names: list[str] = dataclasses.field(default_factory=list)
    correctness_reward: str | None = None
    format_reward: str | None = None
    logging_steps: int = 1

    @property
    def is_moe(self) -> bool:
        return bool(self.model.get("is_moe"))


# -- what a detector judges from -------------------------------------------------------------------

def _has_input(spec: str, names: Collection[str], has_samples: bool) -> bool:
    for alt in spec.split("|"):
        if alt == "samples":
            if has_samples:
                return True
        elif "*" in alt:
            if any(fnmatch.fnmatchcase(n, alt) for n in names):
                return True
        elif alt in names:
            return True
    return False


def describe_input(spec: str) -> str:
    """``a|b|samples`` as ``a or b or per-completion samples``."""
    return " or ".join("per-completion samples" if a == "samples" else a for a in spec.split("|"))


def unmet(requires: Sequence[Sequence[str]] | None, names: Collection[str], has_samples: bool = False) -> str | None:
    """What is missing for any alternative of ``requires`` (None when one is met or none is declared).

    >>> unmet((("entropy", "reward|rewards/*/mean"),), {"grad_norm", "rewards/acc/mean"})
    'needs entropy'
    >>> unmet((("entropy",), ("completions/mean_length", "reward")), {"reward"}) is None, unmet(None, set())
    (False, None)
    """
    if not requires:
        return None
    if not isinstance(names, (set, frozenset, dict)):
        names = set(names)
    best: list[str] | None = None
    for alternative in requires:
        missing = [spec for spec in alternative if not _has_input(spec, names, has_samples)]
        if not missing:
            return None
        if best is None or len(missing) < len(best):
            best = missing

    def grouped(spec: str, among: int) -> str:
        text = describe_input(spec)
        return f"({text})" if among > 1 and "|" in spec else text

    text = "needs " + " and ".join(grouped(s, len(best or [])) for s in best or [])
    if len(requires) > 1:
        text += " (it reads one of: " + "; ".join(" + ".join(grouped(s, len(alt)) for s in alt) for alt in requires) + ")"
    return text


# -- assessments and parameters ----------------------------------------------------------------------

@dataclasses.dataclass(slots=True)  # one per detector per step: slots make it cheaper to build
class Assessment:
    """What a detector concluded at one step: ``level`` 0 (healthy), 1 (first evidence) or 2 (corroborated
    and persistent), the numbers behind it, the estimated onset of the change, or that it is warming up.

    >>> Assessment(1, {"ratio": 0.2}, onset_step=40).level
    1
    >>> Assessment(1, {"ratio": 0.2}, confirm_points=3).confirm_points   # this evidence needs 3 points in a row
    3
    """

    level: int = 0
    evidence: dict[str, Any] = dataclasses.field(default_factory=dict)
    onset_step: int | None = None
    warming_up: bool = False
    # The confirmation this evidence needs before it opens an episode, when it differs from the detector's
    # ``confirm_points`` / ``confirm_steps`` (None: those). Read only while no episode is open.
    confirm_points: int | None = None
    confirm_steps: int | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Episode:
    """Where a detector's episode stands before the step being assessed: what ``assess`` may read of the
    bookkeeping (``self.episode``). The base rebuilds it after each step; it cannot be written.

    ``open``: an episode was raised and has not cleared; ``since``: its onset step; ``points``: the
    assessments at level >= 1 booked in it; ``pending``: those in a row still awaiting confirmation
    (``confirm_points`` / ``confirm_steps``) before one opens.

    >>> ep = Episode(open=True, since=40, points=2)
    >>> ep.points >= 1 and not ep.pending
    True
    >>> ep.points = 0
    Traceback (most recent call last):
    dataclasses.FrozenInstanceError: cannot assign to field 'points'
    """

    open: bool = False
    since: int | None = None
    points: int = 0
    pending: int = 0


_QUIET = Episode()


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


# -- the detector ------------------------------------------------------------------------------------

class Detector:
    """Base of every detector: ``update`` one step at a time, ``reset`` to start over.

    A subclass sets ``id`` (a fixed detector id), ``variant`` (the GRPO variant that cures what it detects,
    or None) and ``requires``; validates its parameters in ``__init__`` and keeps them under their own
    names; builds its mutable state in ``_reset_state``; and implements ``assess`` and ``_message``.
    ``_overrides`` (the ``GRPOConfig`` diff, by default the variant's preset) and ``_variant`` may be
    overridden when the cure depends on the evidence.

    The episode bookkeeping is the base's alone: ``assess`` reads it through ``self.episode`` (a frozen
    ``Episode``) and asks for more or less confirmation than ``confirm_points`` / ``confirm_steps`` in its
    ``Assessment``; ``tests/test_detector_private_state.py`` fails on a detector touching the rest.
    """

    id: str = ""
    variant: str | None = None
    # The inputs it judges from, so a report can say which detectors could judge a run and why the others
    # could not: alternatives, each a tuple of inputs that must all be logged. An input is a metric name,
    # ``a|b`` (either), a name with ``*`` (any matching one) or ``samples`` (per-completion records). None
    # leaves it undeclared: the detector then counts as judging once it has left its warm-up.
    requires: tuple[tuple[str, ...], ...] | None = None
    # "failure": judges whether training works (a run no failure detector could judge is never called
    # healthy); "guard": sanity checks (non-finite values); "info": facts about the run.
    role: str = "failure"
    # What assessments at level 1 and level 2 raise.
    severities: tuple[str, str] = ("warning", "critical")
    # An episode ends after this many healthy assessments in a row that also cover ``clear_steps`` training
    # steps (fine logs clear slower). None: it never ends, so each severity is raised at most once per run
    # (a fact about the run rather than a state it can leave); the state still follows each assessment.
    clear_after: int | None = 3
    clear_steps: int = 10
    # Heavy modules it imports only to fit something (scipy): live, ``Engine.warm_up`` imports them at train
    # begin, so the step that raises the first finding does not pay for them.
    fit_imports: tuple[str, ...] = ()
    # Opening an episode takes ``confirm_points`` consecutive assessments at level >= 1 that also cover
    # ``confirm_steps`` training steps (one point of a coarse log covers several), so fine and coarse logs need
    # the same stretch of training as evidence. Fixed in ``__init__``; a need that depends on the evidence or
    # on the log's spacing is said in each ``Assessment`` instead.
    confirm_points: int = 1
    confirm_steps: int = 0
    # False for a check with nothing to learn first (non-finite values): a fresh one is "ok", not "warming_up".
    warms_up: bool = True

    def __init__(self) -> None:
        self.context = RunContext()
        self.reset()

    def start(self, context: RunContext) -> None:
        """Bind the run's facts and start from a fresh state."""
        self.context = context
        self.reset()

    def reset(self) -> None:
        """Back to the state of a fresh detector."""
        self.n_updates = 0
        self.state = "warming_up" if self.warms_up else "ok"
        self._evidence: dict[str, Any] = {}
        self._in_episode = False
        self._episode_start: int | None = None
        self._episode_len = 0
        self._emitted = 0
        self._healthy_run = 0
        self._healthy_since: int | None = None
        self._pending = 0
        self._pending_onset: int | None = None
        self._pending_first: int | None = None
        self._episode = _QUIET
        self.clock = StepClock()
        self._reset_state()

    def _reset_state(self) -> None:
        """Build the subclass's own mutable state."""

    def assess(self, step: int, metrics: Metrics, samples: Sequence[Sample]) -> Assessment | None:
        """What this step shows; None when it shows nothing this detector reads (nothing changes then)."""
        raise NotImplementedError

    def _message(self, severity: str, evidence: Mapping[str, Any]) -> str:
        raise NotImplementedError

    def _variant(self) -> str | None:
        return self.variant

    def _overrides(self) -> dict[str, Any]:
        return preset(self._variant(), self.context.config)

    @property
    def episode(self) -> Episode:
        """The episode as it stood before the step being assessed (read-only)."""
        return self._episode

    @property
    def in_episode(self) -> bool:
        """Whether an episode is open (``episode.open``)."""
        return self._in_episode

    @property
    def evidence(self) -> Mapping[str, Any]:
        """The latest assessment's evidence as the detector built it (``_overrides`` reads its remedy)."""
        return self._evidence

    @property
    def last_evidence(self) -> dict[str, Any]:
        """The latest assessment's evidence, JSON-safe."""
        return tidy(self._evidence)  # type: ignore[return-value]

    def update(self, step: int, metrics: Metrics, samples: Sequence[Sample] | None = None) -> list[Finding]:
        """Assess one logged step and return the findings it raises (empty when none)."""
        step = int(step)
        if type(metrics) is not dict and not isinstance(metrics, Mapping):  # a dict skips the ABC check
            metrics = {}
        self.n_updates += 1
        self.clock.tick(step)
        a = self.assess(step, metrics, samples or ())
        if a is None:
            return []
        self._evidence = a.evidence
        if a.level == 0 and not self._in_episode:
            self.state = "warming_up" if a.warming_up else "ok"
            if self._pending:
                self._episode = _QUIET
            self._pending = 0
            self._pending_onset = None
            return []
        findings = self._book(step, a)
        self._episode = Episode(self._in_episode, self._episode_start, self._episode_len, self._pending)
        return findings

    def _book(self, step: int, a: Assessment) -> list[Finding]:
        """The episode bookkeeping of a step that is not plainly healthy."""
        if a.warming_up and not self._in_episode:
            self.state = "warming_up"
            return []
        if a.level >= 1 and not self._in_episode:
            self._pending += 1
            if self._pending == 1:
                self._pending_onset = a.onset_step if a.onset_step is not None else step
                self._pending_first = step
            covered = step - (self._pending_first or step) + self.clock.gap
            points = self.confirm_points if a.confirm_points is None else a.confirm_points
            steps = self.confirm_steps if a.confirm_steps is None else a.confirm_steps
            if self._pending < max(1, points) or covered < steps:
                self.state = "ok"
                return []
        findings: list[Finding] = []
        if a.level >= 1:
            self._healthy_run = 0
            self._healthy_since = None
            if not self._in_episode:
                self._in_episode = True
                onset = a.onset_step if a.onset_step is not None else step
                if self._pending_onset is not None:
                    onset = min(onset, self._pending_onset)
                self._episode_start = onset
                self._episode_len = 0
                self._pending = 0
                self._pending_onset = None
            self._episode_len += 1
            if a.level > self._emitted:
                self._emitted = a.level
                findings.append(self._finding(step, self.severities[min(a.level, 2) - 1]))
            self.state = self._state_after(self._emitted)
        elif self._in_episode:
            self._healthy_run += 1
            if self._healthy_since is None:
                self._healthy_since = step
            if self.clear_after is None:
                self.state = "ok"
            elif self._healthy_run >= self.clear_after and step - self._healthy_since >= self.clear_steps - 1:
                self._in_episode = False
                self._episode_start = None
                self._episode_len = 0
                self._emitted = 0
                self.state = "ok"
        else:
            self._pending = 0
            self._pending_onset = None
            self.state = "ok"
        return findings

    def _state_after(self, level: int) -> str:
        severity = self.severities[min(level, 2) - 1]
        return severity if severity in ("warning", "critical") else "ok"

    def _finding(self, step: int, severity: str) -> Finding:
        evidence: dict[str, Any] = tidy(self._evidence)  # type: ignore[assignment]
        variant, overrides, message = self._variant(), self._overrides(), self._message(severity, evidence)
        cfg = self.context.config or {}
        if (self.context.is_moe and variant not in (None, "gspo")
                and cfg.get("importance_sampling_level") != "sequence"):
            # The recipe requires GSPO's sequence-level ratio on MoE: any switch there is GSPO.
            variant, overrides = "gspo", preset("gspo", cfg)
            message += (" This is a mixture-of-experts model: instead, switch to GSPO (sequence-level "
                        "importance ratio), which the recipe requires there.")
        return Finding(detector=self.id, severity=severity, step=step, onset_step=self._episode_start,
                       variant=variant, config_overrides=overrides, evidence=evidence, message=message)

    # -- what a report says of it ----------------------------------------------------------------

    def missing_inputs(self, names: Collection[str], has_samples: bool = False) -> str | None:
        """Why a run logging ``names`` gives this detector nothing to judge (None: it has what it needs)."""
        return unmet(self.requires, names, has_samples)

    def not_applicable(self, names: Collection[str]) -> str | None:
        """Why this detector does not apply to the run at all (None: it applies)."""
        return None

    def params(self) -> dict[str, Any]:
        """The constructor parameters, read back from the attributes they are stored under."""
        sig = inspect.signature(type(self).__init__)
        return {n: getattr(self, n) for n in sig.parameters if n not in ("self", "args", "kwargs")}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{type(self).__name__}({args})"
