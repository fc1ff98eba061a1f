"""Entropy rise: the policy's entropy climbs and stays well above its own settled level.

Users report entropy that trends up over hundreds of steps (to 2 nats from well below 1), with
garbled text and a reward that stops improving later, often followed by a collapse. A rise that ends
with completions piling up at the length cap is ``degenerate_long_cot``'s diagnosis; this detector
covers the stretch before it, and stays silent while completions run to the cap.

Everything is relative to the run: the baseline is taken once the normal early drop has settled
(healthy runs spend most of their entropy early), a rise is the median of recent points against it
(a one-step spike never moves a median), it must stand beyond the baseline's own spread and hold
for a stretch of training (``hold_steps``, the same on fine and coarse logs). A brief rise that
settles again ends before it is confirmed. A rise stays a warning while the task reward is clearly
better than at the baseline: then it is not (yet) hurting, whatever its ratio.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from grpo_monitor.detectors.base import Assessment, Detector, Metrics, Sample, check_float, check_int, finite
from grpo_monitor.detectors.signals import CorrectnessSource, EntropyTrack, get
from grpo_monitor.detectors.stats import mad_sigma, mann_kendall, median
from grpo_monitor.detectors.sudden_collapse import lowered_learning_rate


class EntropyRise(Detector):
    """Entropy's recent median well above its settled baseline, held over a stretch of training.

    Parameters: ``rise_ratio`` (recent median over the baseline that counts as risen),
    ``critical_ratio`` (the level at which a confirmed rise is critical), ``z`` (the rise must also
    exceed this many baseline spreads), ``hold_steps`` (training steps the rise must hold),
    ``recent_steps`` (training steps the recent median covers), ``settle_half``/``settle_tol``/
    ``settle_span``/``max_settle_points`` (how the post-transient baseline is found, as in
    ``entropy_collapse``), ``lr_factor`` (the recommended learning rate is the configured one divided
    by this).

    >>> from grpo_monitor.detectors.base import RunContext
    >>> det = EntropyRise()
    >>> det.start(RunContext(config={"learning_rate": 1e-5}))
    >>> found = []
    >>> for step in range(1, 301):
    ...     h = 0.4 + 0.3 * math.exp(-step / 10) + 0.01 * ((step * 7) % 5 - 2)
    ...     if step > 150:
    ...         h *= 1 + 0.02 * (step - 150)
    ...     found += det.update(step, {"entropy": h})
    >>> [(f.severity, f.evidence["remedy"], f.config_overrides) for f in found]
    [('warning', 'lower_learning_rate', {'learning_rate': 2.5e-06}), ('critical', 'lower_learning_rate', {'learning_rate': 2.5e-06})]
    >>> 150 < found[0].onset_step < found[0].step < 230
    True
    """

    id = "entropy_rise"
    variant = None
    # Entropy alone cannot tell a rise that hurts from exploration that pays (as for entropy_collapse).
    requires = (("entropy", "frac_reward_zero_std|reward_std|reward|rewards/*/mean|completions/mean_length"),)

    def __init__(self, rise_ratio: float = 1.5, critical_ratio: float = 2.0, z: float = 4.0, hold_steps: int = 30,
                 recent_steps: int = 10, settle_half: int = 3, settle_tol: float = 0.3, settle_span: int = 20,
                 max_settle_points: int = 60, lr_factor: float = 4.0) -> None:
        self.rise_ratio = check_float("rise_ratio", rise_ratio, 1.0, 100.0, low_open=True)
        self.critical_ratio = check_float("critical_ratio", critical_ratio, 1.0, 100.0, low_open=True)
        if self.critical_ratio < self.rise_ratio:
            raise ValueError("critical_ratio must be >= rise_ratio")
        self.z = check_float("z", z, 0.0, 100.0)
        self.hold_steps = check_int("hold_steps", hold_steps, 1)
        self.recent_steps = check_int("recent_steps", recent_steps, 1)
        self.settle_half = check_int("settle_half", settle_half, 1)
        self.settle_tol = check_float("settle_tol", settle_tol, 0.0, 5.0, low_open=True)
        self.settle_span = check_int("settle_span", settle_span, 0)
        self.max_settle_points = check_int("max_settle_points", max_settle_points, 2 * settle_half)
        self.lr_factor = check_float("lr_factor", lr_factor, 1.0, 1e6, low_open=True)
        self.confirm_steps = self.hold_steps
        super().__init__()

    def _reset_state(self) -> None:
        self.entropy = EntropyTrack(window=48, half=self.settle_half, tol=self.settle_tol,
                                    max_points=self.max_settle_points, min_span=self.settle_span)
        # Truncation and length, to step aside when completions run to the cap (a degeneration).
        self.clipped: deque[float] = deque(maxlen=32)
        self.clipped_base: float | None = None
        self.length: deque[float] = deque(maxlen=32)
        self.length_base: float | None = None
        self.correct: deque[float] = deque(maxlen=48)
        self.correct_base: float | None = None
        self.correct_spread = 0.0
        self.correct_n = 0
        self.correctness = CorrectnessSource(self.context)
        self._line: float | None = None  # the entropy level below which a point is plainly healthy
        self._base: float | None = None
        self._spread = 0.0
        self._since_rebase = 0

    def assess(self, step: int, metrics: Metrics, samples: Sequence[Sample]) -> Assessment | None:
        tr = self.entropy
        h = tr.push_metrics(step, metrics)
        if h is None:
            return None
        c = get(metrics, "completions/clipped_ratio")
        if c is not None:
            self.clipped.append(c)
        L = get(metrics, "completions/mean_length")
        if L is not None:
            self.length.append(L)
        r = self.correctness.value(metrics)
        if r is not None:
            self.correct.append(r)
        if tr.baseline.value is None:
            # Risen far above its first points before it ever settled (a rise from the first step): those first
            # points are the run's level, as a settled baseline would have been.
            if not tr.force_if_moved(step, self.clock.points_for(self.recent_steps, minimum=3), high=self.critical_ratio):
                return Assessment(warming_up=True, evidence={"entropy": h, "points": tr.baseline.n})
        line = self._line
        if line is None:
            line = self._freeze(tr.baseline.value)
        self._since_rebase += 1
        if self._since_rebase >= self.clock.points_for(16) and not self.episode.open and not self.episode.pending:
            line = self._rebase()
        base = self._base or 0.0
        if h < line and not self.episode.open and not self.episode.pending:
            # This point is below the rise line, so no median can confirm a rise.
            return Assessment(0, {"entropy": h, "baseline": base, "rise_line": line})
        return self._judge(step, h, base, line)

    def _freeze(self, base: float) -> float:
        """Fix the rise line and the companions' levels once the entropy baseline is known."""
        self._base = base
        self._spread = self.entropy.baseline.spread or 0.0
        self._line = max(self.rise_ratio * base, base + self.z * self._spread)
        if len(self.clipped):
            self.clipped_base = median(list(self.clipped)[-8:])
        if len(self.length):
            self.length_base = median(list(self.length)[-8:])
        if len(self.correct):
            vals = list(self.correct)[-8:]
            self.correct_base = median(vals)
            self.correct_spread = mad_sigma(vals, self.correct_base)
            self.correct_n = len(vals)
        return self._line

    def _correctness_improving(self) -> bool:
        """The task reward's median over the hold stretch above its median at the baseline by two standard
        errors of that difference (a median's is 1.2533 sigma / sqrt(n)), sigma the reward's spread there."""
        if self.correct_base is None or len(self.correct) < 3:
            return False
        recent = list(self.correct)[-self.clock.points_for(self.hold_steps, minimum=6):]
        se = 1.2533 * self.correct_spread * math.sqrt(1.0 / self.correct_n + 1.0 / len(recent))
        return median(recent) - self.correct_base > max(2.0 * se, 0.05 * abs(self.correct_base), 1e-6)

    def _rebase(self) -> float:
        """Lower the baseline to the median of the last ``hold_steps`` when entropy kept settling below
        it: a baseline caught at the tail of the early drop would hide a later rise. It never moves up,
        so a slow rise is still measured from the lowest level the run held."""
        self._since_rebase = 0
        k = min(self.clock.points_for(self.hold_steps, minimum=8), len(self.entropy.window))
        vals = self.entropy.window.last(k)
        m = median(vals)
        if self._base is not None and m < self._base:
            self._base = m
            self._spread = min(self._spread, mad_sigma(vals, m))
            self._line = max(self.rise_ratio * m, m + self.z * self._spread)
        return self._line or 0.0

    def _judge(self, step: int, h: float, base: float, line: float) -> Assessment:
        gap = self.clock.gap
        k = self.clock.points_for(self.recent_steps, minimum=3 if gap <= 2 else 2)
        recent = self.entropy.recent(k) or h
        ratio = recent / base if base > 0 else math.inf
        # Held over ``hold_steps`` of training: fewer, coarser points on a sparse log.
        confirm = self.clock.points_for(self.hold_steps, minimum=2)
        ev: dict[str, Any] = {
            "entropy": finite(h),
            "entropy_recent_median": finite(recent),
            "baseline": finite(base),
            "baseline_step": self.entropy.base_step,
            "baseline_spread": finite(self._spread),
            "ratio_to_baseline": finite(ratio),
            "rise_line": finite(line),
            "rise_ratio": self.rise_ratio,
            "critical_ratio": self.critical_ratio,
            "recent_points": k,
        }
        to_cap = self._to_cap(ev)
        if to_cap:
            ev["deferred_to"] = "degenerate_long_cot"
            return Assessment(level=0, evidence=ev)
        if recent < line:
            return Assessment(level=0, evidence=ev)
        vals = [v for s, v in zip(self.entropy.window.steps, self.entropy.window.values)
                if s > (self.entropy.base_step or 0)]
        if len(vals) >= 6:
            mk = mann_kendall([math.log(max(v, 1e-9)) for v in vals[-32:]])
            ev["trend"] = mk.as_evidence()
        level = 1
        self._companions(ev)
        # Critical is for a rise that hurts: with the task reward still clearly above where it stood at the
        # baseline, the extra entropy is exploration that pays (or the entropy bonus doing its job), so far.
        improving = self._correctness_improving()
        if improving:
            ev["correctness_improving"] = True
        if ratio >= self.critical_ratio and self.episode.points >= 1 and not improving:
            level = 2
        self._remedy(ev)
        return Assessment(level=level, evidence=ev, onset_step=self._onset(line), confirm_points=confirm)

    def _to_cap(self, ev: dict[str, Any]) -> bool:
        """Completions running to the length cap: the rise is a degeneration, judged elsewhere."""
        c = median(list(self.clipped)[-3:]) if len(self.clipped) else None
        if c is not None:
            cb = self.clipped_base or 0.0
            ev["clipped_ratio"] = {"recent": finite(c), "baseline": finite(cb)}
            if c >= cb + max(0.15, 0.5 * (1.0 - cb)) or c >= 0.5:
                return True
        cap = (self.context.config or {}).get("max_completion_length")
        L = median(list(self.length)[-3:]) if len(self.length) else None
        if L is not None and self.length_base and L >= 1.5 * self.length_base:
            # Entropy and length rising together is the degeneration's signature, on its way to the cap.
            ev["mean_length"] = {"recent": finite(L), "baseline": finite(self.length_base)}
            return True
        if L is not None and isinstance(cap, (int, float)) and not isinstance(cap, bool) and cap > 0:
            return L >= 0.9 * cap
        return False

    def _companions(self, ev: dict[str, Any]) -> None:
        """What the rise comes with: correctness and length against their levels at the baseline."""
        if self.correct_base is not None and len(self.correct) >= 3:
            now = median(list(self.correct)[-6:])
            ev["correctness"] = {"metric": self.correctness.key, "recent": finite(now), "baseline": finite(self.correct_base)}
        if self.length_base is not None and len(self.length) >= 3:
            ev["mean_length"] = {"recent": finite(median(list(self.length)[-6:])), "baseline": finite(self.length_base)}

    def _remedy(self, ev: dict[str, Any]) -> None:
        cfg = self.context.config or {}
        coef = cfg.get("entropy_coef")
        if isinstance(coef, (int, float)) and not isinstance(coef, bool) and coef > 0:
            ev["remedy"] = "remove_entropy_bonus"
            ev["entropy_coef"] = coef
            ev["advice"] = ("An entropy bonus pushes entropy up: set entropy_coef=0 (GRPO does not need one). "
                            "A rising entropy often comes before a collapse.")
            return
        lr = lowered_learning_rate(cfg, self.lr_factor)
        if lr is not None:
            ev["remedy"] = "lower_learning_rate"
            ev["learning_rate"] = {"configured": finite(cfg.get("learning_rate")), "recommended": lr}
        temp = cfg.get("temperature")
        hot = isinstance(temp, (int, float)) and not isinstance(temp, bool) and temp > 1.0
        ev["advice"] = ("Lower the learning rate" + (f" and the sampling temperature ({temp})" if hot else "")
                        + "; read sampled completions for garbled text. A rising entropy often comes before a collapse"
                        " (reward crashing): keep a checkpoint from before the rise.")

    def _overrides(self) -> dict[str, Any]:
        cfg = self.context.config or {}
        coef = cfg.get("entropy_coef")
        if isinstance(coef, (int, float)) and not isinstance(coef, bool) and coef > 0:
            return {"entropy_coef": 0.0}
        lr = lowered_learning_rate(cfg, self.lr_factor)
        return {"learning_rate": lr} if lr is not None else {}

    def _onset(self, line: float) -> int | None:
        # The first point of the trailing run at or above the line (an isolated dip does not end it).
        onset = None
        below = 0
        for s, v in zip(reversed(self.entropy.window.steps), reversed(self.entropy.window.values)):
            if v < line:
                below += 1
                if below >= 2:
                    break
                continue
            below = 0
            onset = s
        return onset

    def _message(self, severity: str, evidence: Mapping[str, Any]) -> str:
        ratio = evidence.get("ratio_to_baseline") or 0.0
        lead = "Entropy has risen far above its level" if severity == "critical" else "Entropy is rising"
        text = (f"{lead}: its recent median is {ratio:.1f}x the run's settled baseline ({evidence.get('baseline')} nats)"
                " and has stayed there.")
        if evidence.get("correctness_improving"):
            text += " The task reward is still better than at the baseline, so the rise has not hurt yet."
        if evidence.get("remedy") == "remove_entropy_bonus":
            return text + f" The run adds an entropy bonus (entropy_coef={evidence.get('entropy_coef')}): set it to 0."
        lr = (evidence.get("learning_rate") or {}).get("recommended")
        change = f" (learning_rate={lr})" if lr is not None else ""
        return text + (f" Lower the learning rate{change} or the sampling temperature; a rising entropy often comes"
                       " before a collapse.")
