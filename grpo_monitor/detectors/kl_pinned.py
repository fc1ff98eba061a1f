"""KL to the reference pinned at zero with ``beta > 0``: the policy is not moving.

With a KL penalty the trainer logs the policy's KL to the reference model. It starts at 0 (the two are the
same model) and grows as the policy learns; at the recipe's learning rate it is a small but growing number
within tens of steps. A KL that stays at zero while gradients flow means the updates never reach the
weights the policy samples with: a LoRA adapter that is not applied or not trainable, a frozen model, a
learning rate of 0, a reference model that is the policy itself. Nothing else in the metrics says so: the
reward drifts, the loss is the usual near-zero GRPO loss.

Judged after ``warmup_steps``: every KL value of the last ``min_steps`` training steps (at least
``min_points`` logged points) at or below ``zero_tol`` in magnitude, with a gradient norm above zero where
it is logged. Raised once per run: a warning, critical once it has held for ``critical_steps``.
Not applicable where the run's config says ``beta`` is 0 (TRL then logs no ``kl``). Where the log does not
say the run's beta (a ``trainer_state.json``, an event file), the zeros may be a placeholder (Unsloth logs
``kl`` as 0 when beta is 0, TRL's default): it is then said once, as ``info``, never as an alarm.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from grpo_monitor.detectors.base import Assessment, Detector, Metrics, Sample, check_float, check_int
from grpo_monitor.detectors.numbers import to_number
from grpo_monitor.detectors.signals import get
from grpo_monitor.detectors.stats import median


class KlPinned(Detector):
    """KL at ~0 for a stretch of training with a KL penalty on and gradients flowing.

    Parameters: ``zero_tol`` (a KL at or below this counts as zero), ``warmup_steps`` (steps before
    judging), ``min_steps`` and ``min_points`` (the stretch it must hold over), ``critical_steps`` (held this
    long, it is critical).

    >>> from grpo_monitor.detectors.base import RunContext
    >>> det = KlPinned()
    >>> det.start(RunContext(config={"beta": 0.04}))
    >>> found = []
    >>> for s in range(1, 101):
    ...     found += det.update(s, {"kl": 0.0, "grad_norm": 0.8, "learning_rate": 1e-6})
    >>> [(f.severity, f.step, f.onset_step) for f in found]
    [('warning', 40, 11), ('critical', 90, 11)]
    >>> det.reset()
    >>> [f for s in range(1, 101) for f in det.update(s, {"kl": 1e-4 * s, "grad_norm": 0.8})]
    []
    >>> det.start(RunContext())  # beta unknown
    >>> [(f.severity, f.step) for s in range(1, 101) for f in det.update(s, {"kl": 0.0, "grad_norm": 0.8})]
    [('info', 40)]
    """

    id = "kl_pinned"
    variant = None
    requires = (("kl",),)
    clear_after = None  # a fact about the run's set-up: said once

    def __init__(self, zero_tol: float = 1e-6, warmup_steps: int = 10, min_steps: int = 30, min_points: int = 5,
                 critical_steps: int = 80) -> None:
        self.zero_tol = check_float("zero_tol", zero_tol, 0.0, 1.0)
        self.warmup_steps = check_int("warmup_steps", warmup_steps, 0)
        self.min_steps = check_int("min_steps", min_steps, 1)
        self.min_points = check_int("min_points", min_points, 2)
        self.critical_steps = check_int("critical_steps", critical_steps, min_steps)
        super().__init__()

    def _reset_state(self) -> None:
        # Without the run's beta a KL of exactly 0 is no evidence of a fault: with beta = 0 (TRL's default)
        # Unsloth still logs ``kl`` and logs it as 0. Said as a fact to check, never as an alarm, then.
        self.severities = ("warning", "critical") if self._beta() is not None else ("info", "info")
        self.since: int | None = None
        self.points = 0
        self.max_abs = 0.0
        self.grads: deque[float] = deque(maxlen=32)
        self.lrs: deque[float] = deque(maxlen=8)

    def _beta(self) -> float | None:
        return to_number((self.context.config or {}).get("beta"))

    def not_applicable(self, names: Collection[str]) -> str | None:
        beta = self._beta()
        return "the run's beta is 0: no KL penalty, nothing to pin" if beta is not None and beta == 0 else None

    def assess(self, step: int, metrics: Metrics, samples: Sequence[Sample]) -> Assessment | None:
        kl = get(metrics, "kl")
        g = get(metrics, "grad_norm")
        if g is not None:
            self.grads.append(g)
        lr = get(metrics, "learning_rate")
        if lr is not None:
            self.lrs.append(lr)
        if kl is None:
            return None
        beta = self._beta()
        if beta is not None and beta == 0:
            return Assessment(0, {"beta": 0.0})
        if step <= self.warmup_steps:
            return Assessment(warming_up=True, evidence={"kl": kl, "warmup_steps": self.warmup_steps})
        if abs(kl) > self.zero_tol:
            self.since, self.points, self.max_abs = None, 0, 0.0
            return Assessment(0, {"kl": kl, "zero_tol": self.zero_tol})
        if self.since is None:
            self.since = step
        self.points += 1
        self.max_abs = max(self.max_abs, abs(kl))
        held = step - self.since + self.clock.gap
        grad = median(list(self.grads)) if self.grads else None
        flowing = grad is None or grad > 0
        evidence: dict[str, Any] = {
            "kl": kl, "max_abs_kl": self.max_abs, "zero_tol": self.zero_tol, "since_step": self.since,
            "steps": held, "points": self.points, "beta": beta, "grad_norm_median": grad,
            "learning_rate": self.lrs[-1] if self.lrs else None,
            "advice": ("check that the policy's trainable weights are the ones it samples with: a LoRA adapter "
                       "applied and trainable (model.print_trainable_parameters()), no frozen base model passed as "
                       "the policy, a learning rate above 0, a reference model that is not the policy itself"),
        }
        if not flowing or self.points < self.min_points or held < self.min_steps:
            return Assessment(0, evidence)
        critical = held >= self.critical_steps and beta is not None  # unknown beta: said once, as a fact
        return Assessment(2 if critical else 1, evidence, onset_step=self.since)

    def _message(self, severity: str, evidence: Mapping[str, Any]) -> str:
        beta = evidence.get("beta")
        lr = evidence.get("learning_rate")
        why = (" The learning rate in effect is 0." if lr == 0 else
               " A LoRA adapter that is not applied or not trainable, a frozen model or a reference model that is "
               "the policy itself does this.")
        held = (f"The KL to the reference has stayed at ~0 (at most {evidence.get('max_abs_kl'):.2g}) for "
                f"{evidence.get('steps')} steps since step {evidence.get('since_step')}")
        if not isinstance(beta, (int, float)):
            return (f"{held}, and the log does not say the run's beta. With beta = 0 (TRL's default; Unsloth then "
                    "logs kl as 0) nothing is wrong; with beta > 0 the updates are not reaching the policy." + why)
        return f"{held} with beta={beta:g} while gradients flow: the updates are not reaching the policy." + why
