"""An extreme first logged point: the gradient norm or the KL at the first log far above everything after it.

A first update that moves the policy by orders of magnitude more than any later one (a loss of 1,083, a gradient
norm of 421,404 and a KL of 10,832 at the first log of a run that settles to a gradient norm of 0.1) is a warm-up
missing, a reference model that is not the policy's starting point (another checkpoint, an adapter merged twice),
or a resume that loaded the wrong weights. What follows may be a run that recovered, or one that never did: the
finding says what the first point was, so a later finding is read with it. Said once, as information; the
baselines elsewhere already leave such a start out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from grpo_monitor.detectors.base import Assessment, Detector, Metrics, Sample, check_float, check_int, finite
from grpo_monitor.detectors.signals import get
from grpo_monitor.detectors.stats import Thinned, median

ADVICE = ("Check the learning-rate warm-up (warmup_ratio or warmup_steps), that the reference model is the policy's "
          "starting point (the same checkpoint, an adapter merged once) and, after a resume, that the checkpoint's "
          "weights were loaded.")
# Scale quantities only: the GRPO loss is centred on 0 (a settled loss near 0 makes any first value look extreme).
WATCHED = ("grad_norm", "kl")
# Where a first value is out of the ordinary by itself: a gradient norm ten times TRL's default clip
# (max_grad_norm=1.0), a KL of a nat per token against the reference the policy starts from. A run whose norm falls
# to nothing once its groups lose their spread makes an ordinary first point look large against what follows;
# these floors keep that from being called extreme.
FLOOR = {"grad_norm": 10.0, "kl": 1.0}


class ExtremeStart(Detector):
    """The first logged value of the gradient norm or the KL ``factor`` times the run's settled level or more, and
    out of the ordinary by itself (``FLOOR``).

    Parameters: ``factor`` (how far above the settled level counts as extreme), ``settle_points`` (points after
    the first, at least this many before judging; the settled level is the median of all of them).

    >>> det = ExtremeStart()
    >>> found = []
    >>> for step in range(1, 30):
    ...     found += det.update(step, {"grad_norm": 421404.0 if step == 1 else 0.1 + 0.01 * (step % 3), "kl": 0.01})
    >>> [(f.severity, f.step, sorted(f.evidence["metrics"])) for f in found]
    [('info', 9, ['grad_norm'])]
    """

    id = "extreme_start"
    variant = None
    role = "info"
    severities = ("info", "info")
    clear_after = None  # a fact about the run's start, said once

    def __init__(self, factor: float = 100.0, settle_points: int = 8) -> None:
        self.factor = check_float("factor", factor, 2.0, 1e12)
        self.settle_points = check_int("settle_points", settle_points, 3)
        super().__init__()

    def _reset_state(self) -> None:
        self.first: dict[str, tuple[int, float]] = {}
        # Every value after the first, thinned past 256: the level the run spends its time at (a run whose norm
        # later falls to nothing does not make an ordinary first point look extreme).
        self.after = {k: Thinned(256) for k in WATCHED}
        self.said = False

    def assess(self, step: int, metrics: Metrics, samples: Sequence[Sample]) -> Assessment | None:
        if self.said:
            return None
        seen = False
        for k in WATCHED:
            v = get(metrics, k)
            if v is None:
                continue
            seen = True
            if k not in self.first:
                self.first[k] = (step, v)
                continue
            self.after[k].push(step, v)
        if not seen:
            return None
        extreme: dict[str, Any] = {}
        for k, (s0, v0) in self.first.items():
            vals = self.after[k].values
            if len(vals) < self.settle_points:
                continue
            settled = abs(median(vals))
            if settled > 0 and abs(v0) >= self.factor * settled and abs(v0) >= FLOOR[k]:
                extreme[k] = {"first": finite(v0), "at_step": s0, "settled": finite(settled)}
        if not extreme:
            return Assessment(0, {})
        self.said = True
        return Assessment(1, {"metrics": extreme, "factor": self.factor, "advice": ADVICE},
                          onset_step=min(e["at_step"] for e in extreme.values()))

    def _message(self, severity: str, evidence: Mapping[str, Any]) -> str:
        parts = ", ".join(f"{k} {v['first']:,.4g} at step {v['at_step']} (settled at {v['settled']:.3g})"
                          for k, v in (evidence.get("metrics") or {}).items())
        return (f"The first logged point is extreme: {parts}. A first update that large is a missing warm-up, a "
                "reference model that is not the policy's starting point, or a resume that loaded the wrong weights; "
                "read what follows with it in mind (baselines here leave that start out).")
