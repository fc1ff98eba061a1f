"""The detector contract shared by every detector.

A detector consumes one logged step at a time (its metrics under TRL 1.16 names and, when the
run records them, the per-completion sample records of that step) and returns the findings it
raises at that step. Everything a detector knows is in its own state; ``reset`` rebuilds that
state, so a reset detector behaves exactly like a fresh one.
"""

from __future__ import annotations

import abc
import dataclasses
import math
from collections.abc import Mapping, Sequence
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
)

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


def finite(value: Any) -> float | None:
    """The value as a float when it is a finite number, else None (a gap or a non-finite value)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


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

    def __init__(self) -> None:
        self.context = RunContext()
        self.reset()

    def start(self, context: RunContext) -> None:
        """Bind the run's facts and start from a fresh state."""
        self.context = context
        self.reset()

    def reset(self) -> None:
        self.n_updates = 0
        self._reset()

    def update(self, step: int, metrics: Metrics, samples: Sequence[Sample] | None = None) -> list[Finding]:
        self.n_updates += 1
        return self._update(int(step), metrics, samples or ())

    @abc.abstractmethod
    def _reset(self) -> None: ...

    @abc.abstractmethod
    def _update(self, step: int, metrics: Metrics, samples: Sequence[Sample]) -> list[Finding]: ...

    def params(self) -> dict[str, Any]:
        """The constructor parameters, read back from the attributes they are stored under."""
        import inspect

        sig = inspect.signature(type(self).__init__)
        return {n: getattr(self, n) for n in sig.parameters if n != "self"}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{type(self).__name__}({args})"
