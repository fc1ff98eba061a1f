"""Non-finite values: NaN or inf in the loss, the gradient norm, entropy or the rewards.

A ``None`` is a gap (nothing was measured, or TRL's nan-aware mean had nothing to average), not a
NaN. One non-finite gradient norm can be a skipped fp16 step (a warning); non-finite values on
consecutive points, or a non-finite loss together with another key, mean the run is broken.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from grpo_monitor.detectors.base import Assessment, Detector, Metrics, Sample, check_int, to_number
from grpo_monitor.detectors.signals import names_like

WATCHED = ("loss", "grad_norm", "entropy", "reward", "reward_std", "kl", "policy_loss", "aux_loss")


def non_finite_keys(metrics: Mapping[str, Any]) -> tuple[list[str], bool]:
    """The watched keys holding NaN/inf, and whether any watched key held a number at all."""
    bad, seen = [], False
    for k in (*(k for k in WATCHED if k in metrics), *names_like(metrics, "rewards/")):
        v = metrics[k]
        if isinstance(v, float) and not math.isfinite(v):
            bad.append(k)
        seen = seen or to_number(v) is not None
    return sorted(bad), seen


class NonFinite(Detector):
    """NaN or inf in a watched metric; critical when it persists or hits the loss with another key.

    Parameters: ``persist_points`` (consecutive points with a non-finite value that make it critical).

    >>> det = NonFinite()
    >>> det.update(1, {"loss": 0.1, "grad_norm": None})
    []
    >>> [(f.severity, f.evidence["keys"]) for f in det.update(2, {"loss": float("nan"), "grad_norm": float("inf")})]
    [('critical', ['grad_norm', 'loss'])]
    """

    id = "non_finite"
    variant = None
    role = "guard"  # a sanity check: a run it alone could read is not judged
    clear_after = 3
    warms_up = False

    def __init__(self, persist_points: int = 2) -> None:
        self.persist_points = check_int("persist_points", persist_points, 1)
        super().__init__()

    def _reset_state(self) -> None:
        self.run = 0
        self.first_step: int | None = None

    def assess(self, step: int, metrics: Metrics, samples: Sequence[Sample]) -> Assessment | None:
        bad, seen = non_finite_keys(metrics)
        if not seen:
            return None
        if not bad:
            self.run = 0
            return Assessment(0, {"keys": []})
        self.run += 1
        if self.run == 1:
            self.first_step = step
        ev = {"keys": bad, "points_in_a_row": self.run, "persist_points": self.persist_points,
              "values": {k: str(metrics.get(k)) for k in bad[:16]}}
        level = 2 if (self.run >= self.persist_points or ("loss" in bad and len(bad) >= 2)) else 1
        return Assessment(level=level, evidence=ev, onset_step=self.first_step)

    def _message(self, severity: str, evidence: Mapping[str, Any]) -> str:
        keys = ", ".join(evidence.get("keys", []))
        if severity == "critical":
            return (f"Non-finite values in {keys}: training has diverged. Stop, resume from the last finite checkpoint "
                    "with a lower learning rate, and check the reward functions for NaN outputs.")
        return f"A non-finite value appeared in {keys}; one bad step can be a skipped mixed-precision update, more will not be."
