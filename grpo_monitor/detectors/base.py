"""The detector contract shared by every detector.

A detector consumes one logged step at a time (its metrics under TRL 1.16 names and, when the
run records them, the per-completion sample records of that step) and returns the findings it
raises at that step. Everything a detector knows is in its own state; ``reset`` rebuilds that
state, so a reset detector behaves exactly like a fresh one.
"""

from __future__ import annotations

import abc
import dataclasses
import fnmatch
import math
from collections.abc import Collection, Mapping, Sequence
from typing import Any

SEVERITIES = ("info", "warning", "critical")
VARIANTS = ("dapo", "dr_grpo", "gspo")
DETECTOR_IDS = (
    "entropy_collapse",
    "degenerate_long_cot",
    "length_reward_coupling",
    "moe_instability",
    "no_learning_signal",
    "reward_component_divergence",
    "non_finite",
    "moe_model_detected",
    "rollout_mismatch",
    "sudden_collapse",
    "broken_generation",
    "advantage_mask_bug",
    "language_mixing",
    "memory_pressure",
    "stall",
    "entropy_rise",
    "grad_norm_spike",
    "length_collapse",
    "no_improvement",
    "reward_function_bug",
    "truncation",
)

Metrics = Mapping[str, "float | None"]
# How many detector resets this process has seen.
RESETS = [0]
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


def finite(value: Any) -> float | None:
    """The value as a float when it is a finite number, else None (a gap or a non-finite value)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def slow_finite(value: Any) -> float | None:
    """``finite`` for a value a hot path has already found not to be a finite plain float (a plain
    float here is NaN or infinite): such paths test ``v.__class__ is float and v - v == 0.0`` inline
    and call this for the rest.

    >>> slow_finite(float("nan")), slow_finite(3), slow_finite(None)
    (None, 3.0, None)
    """
    return None if value.__class__ is float else finite(value)


# Inputs of built-in detectors whose modules leave ``requires`` undeclared.
KNOWN_REQUIRES: dict[str, tuple[tuple[str, ...], ...]] = {
    "no_learning_signal": (("frac_reward_zero_std",), ("completions/clipped_ratio",), ("reward_std", "grad_norm")),
    "rollout_mismatch": (("mismatch/*|sampling/*",),),
}


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


class StepCount:
    """Steps an engine counted for its detectors (those it leaves idle, and those it calls through
    ``_step``): one count for all of them, which each one's ``n_updates`` reads from the point it
    was handed over."""

    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 0


class Detector(abc.ABC):
    """Base class: ``update`` one step at a time, ``reset`` to start over.

    Subclasses set ``id`` (a fixed detector id) and ``variant`` (the GRPO variant that cures
    what they detect, or None), validate their parameters in ``__init__`` and keep them under
    their own names, build all mutable state in ``_reset`` and implement ``_update``.
    """

    id: str = ""
    variant: str | None = None
    # For dashboards: "warming_up", "ok", "warning" or "critical", and the numbers behind it.
    state: str = "ok"
    last_evidence: dict[str, Any] = {}
    # The inputs it judges from, so a report can say which detectors could judge a run and why
    # the others could not: alternatives, each a tuple of inputs that must all be logged. An input
    # is a metric name, ``a|b`` (either), a name with ``*`` (any matching one) or ``samples``
    # (per-completion records). None leaves it undeclared: the detector then counts as judging
    # once it has left its warm-up.
    requires: tuple[tuple[str, ...], ...] | None = None
    # "failure": judges whether training works (a run no failure detector could judge is never
    # called healthy); "guard": sanity checks (non-finite values); "info": facts about the run.
    role: str = "failure"
    # Metric names (and ``samples``, a non-empty batch) without any of which a step is one that
    # ``update`` only counts: ``n_updates`` and, for an episode detector, its step clock, nothing
    # else. The engine then counts such a step itself rather than calling ``update``. Honoured only
    # on an episode detector using the shared ``update``, declared by the class itself (a subclass
    # that changes what a step does must declare it again); None: called at every step.
    inert_without: tuple[str, ...] | None = None
    # A class may also define ``inert_now(metrics, has_samples)``: True when its state is settled so
    # that every step with exactly these metric names (and sample presence) only counts, as above,
    # and leaves that state as it is. The engine asks it when the names change and now and then
    # until it says so (it must be cheap and must not change anything); defined by the class
    # itself, like ``inert_without``.

    # Steps this detector counted itself (``_n``), and, while an engine counts its steps for it, the
    # engine's count and where that count stood when it took over (``_count``, ``_count_base``):
    # ``n_updates`` adds the two up.
    _n: int = 0
    _count: StepCount | None = None
    _count_base: int = 0

    def __init__(self) -> None:
        self.context = RunContext()
        self.reset()

    @property
    def n_updates(self) -> int:
        """Steps fed so far, whether it counted them itself or an engine counted them for it."""
        c = self._count
        return self._n if c is None else self._n + c.n - self._count_base

    @n_updates.setter
    def n_updates(self, value: int) -> None:
        c = self._count
        self._n = value if c is None else value - (c.n - self._count_base)

    def start(self, context: RunContext) -> None:
        """Bind the run's facts and start from a fresh state."""
        self.context = context
        self.reset()

    def reset(self) -> None:
        RESETS[0] += 1  # an engine that leaves settled detectors out asks them again
        self._n = 0
        self._count = None
        self._reset()

    def update(self, step: int, metrics: Metrics, samples: Sequence[Sample] | None = None) -> list[Finding]:
        self._n += 1
        return self._update(int(step), metrics, samples or ())

    @abc.abstractmethod
    def _reset(self) -> None: ...

    @abc.abstractmethod
    def _update(self, step: int, metrics: Metrics, samples: Sequence[Sample]) -> list[Finding]: ...

    def missing_inputs(self, names: Collection[str], has_samples: bool = False) -> str | None:
        """Why a run logging ``names`` gives this detector nothing to judge (None: it has what it needs)."""
        requires = self.requires if self.requires is not None else KNOWN_REQUIRES.get(self.id)
        return unmet(requires, names, has_samples)

    def not_applicable(self, names: Collection[str]) -> str | None:
        """Why this detector does not apply to the run at all (None: it applies)."""
        return None

    def params(self) -> dict[str, Any]:
        """The constructor parameters, read back from the attributes they are stored under."""
        import inspect

        sig = inspect.signature(type(self).__init__)
        return {n: getattr(self, n) for n in sig.parameters if n != "self"}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{type(self).__name__}({args})"
