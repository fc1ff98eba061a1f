"""Length collapse: completions shrink to a fraction of their early length while correctness does not improve.

Users report mean completion length falling steadily (387 -> 190 tokens within three logs, down to
one-token answers under a shaped reward) while accuracy stays flat or falls. A shrink while
correctness rises is usually healthy (early format learning trims rambling; concise answers), so
correctness decides; the rise has to be significant, judged against a noise estimate that rests on
the whole recent window and not only on the few early points of a coarse log. Where a reward
component pays for shortness and rises as length falls, the run is doing what its reward asks:
whether that reward is a proxy is ``reward_component_divergence``'s question. Length falling under a
high truncation share is the cap's doing (short answers are the only ones that finish), and the cure
there is a larger ``max_completion_length``.

The early level is the median over a stretch of training after a short warm-up; the recent level is a
median of the last points (a one-step dip never counts), held over ``hold_steps`` of training.

The published cure for GRPO's length bias is Dr. GRPO (no per-sequence length normalisation, no std
scaling of advantages): recommended unless the run already trains that way.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from grpo_monitor.detectors.base import Assessment, Detector, Metrics, Sample, check_float, check_int, finite
from grpo_monitor.detectors.signals import CorrectnessSource, get, is_length_name, reward_names_in
from grpo_monitor.detectors.stats import Window, mad_sigma, median

_DR_GRPO = {"loss_type": "dr_grpo", "scale_rewards": "none"}


class LengthCollapse(Detector):
    """Mean completion length at a fraction of its early level, correctness flat or falling.

    Parameters: ``ratio`` (recent length over the early level that counts as collapsed),
    ``critical_ratio`` (at or below this share, with correctness falling, it is critical),
    ``min_tokens`` (a mean length at or below this many tokens is critical whatever the early level),
    ``warmup_steps`` (training steps skipped before the early level is taken), ``base_steps``
    (training steps the early level spans), ``hold_steps`` (training steps the shrink must hold),
    ``recent_steps`` (training steps the recent medians cover).

    >>> from grpo_monitor.detectors.base import RunContext
    >>> det = LengthCollapse()
    >>> det.start(RunContext(config={"loss_type": "grpo"}, correctness_reward="acc"))
    >>> found = []
    >>> for step in range(1, 201):
    ...     L = 400.0 if step < 60 else max(400.0 * 0.98 ** (step - 60), 20.0)
    ...     acc = 0.4 + 0.01 * ((step * 7) % 5 - 2) - (0.001 * (step - 60) if step > 60 else 0)
    ...     found += det.update(step, {"completions/mean_length": L, "rewards/acc/mean": acc})
    >>> [(f.severity, f.variant) for f in found]
    [('warning', 'dr_grpo'), ('critical', 'dr_grpo')]
    >>> 95 < found[0].step < 140, found[0].config_overrides
    (True, {'loss_type': 'dr_grpo', 'scale_rewards': 'none', 'beta': 0.0})
    """

    id = "length_collapse"
    variant = "dr_grpo"
    requires = (("completions/mean_length", "reward|rewards/*/mean"),)

    def __init__(self, ratio: float = 0.5, critical_ratio: float = 0.3, min_tokens: float = 5.0, warmup_steps: int = 5,
                 base_steps: int = 20, hold_steps: int = 15, recent_steps: int = 10) -> None:
        self.ratio = check_float("ratio", ratio, 0.0, 1.0, low_open=True, high_open=True)
        self.critical_ratio = check_float("critical_ratio", critical_ratio, 0.0, 1.0, low_open=True, high_open=True)
        if self.critical_ratio > self.ratio:
            raise ValueError("critical_ratio must be <= ratio")
        self.min_tokens = check_float("min_tokens", min_tokens, 0.0, 1e6)
        self.warmup_steps = check_int("warmup_steps", warmup_steps, 0)
        self.base_steps = check_int("base_steps", base_steps, 1)
        self.hold_steps = check_int("hold_steps", hold_steps, 1)
        self.recent_steps = check_int("recent_steps", recent_steps, 1)
        self.confirm_steps = self.hold_steps
        super().__init__()

    def _reset_state(self) -> None:
        self.length = Window(32)
        self.correct = Window(32)
        self.clipped = Window(16)
        self.correctness = CorrectnessSource(self.context)
        self._first_step: int | None = None
        self._base_len: list[float] = []
        self._base_cor: list[float] = []
        self.base: float | None = None
        self.base_step: int | None = None
        self.cor_base: float | None = None
        self.cor_sigma = 0.0
        self._n_base_cor = 0
        self.shaping: dict[str, float] = {}  # length-paying reward components at the early level
        self.shaping_now: dict[str, Window] = {}
        self._line = 0.0
        cfg = self.context.config or {}
        # Already on Dr. GRPO's loss and unscaled advantages: the variant would change nothing.
        self._cure = None if all(cfg.get(k) == v for k, v in _DR_GRPO.items()) else type(self).variant
        self.variant = self._cure

    def assess(self, step: int, metrics: Metrics, samples: Sequence[Sample]) -> Assessment | None:
        L = get(metrics, "completions/mean_length")
        r = self.correctness.value(metrics)
        if r is not None:
            self.correct.push(step, r)
        if L is None:
            return None
        self.length.push(step, L)
        c = get(metrics, "completions/clipped_ratio")
        if c is not None:
            self.clipped.push(step, c)
        if self.base is None:
            return self._warm(step, L, r, metrics)
        for name, w in self.shaping_now.items():
            v = get(metrics, f"rewards/{name}/mean")
            if v is not None:
                w.push(step, v)
        if L > self._line and not self.episode.open and not self.episode.pending:
            return Assessment(0, {"mean_length": L, "early_length": self.base})
        return self._judge(step, L)

    def _warm(self, step: int, L: float, r: float | None, metrics: Metrics) -> Assessment:
        if self._first_step is None:
            self._first_step = step
        start = self._first_step + self.warmup_steps
        if step > start:
            self._base_len.append(L)
            if r is not None:
                self._base_cor.append(r)
            if step >= start + self.base_steps and len(self._base_len) >= 3 or len(self._base_len) >= 24:
                self.base = median(self._base_len)
                self.base_step = step
                self._line = self.ratio * self.base
                if len(self._base_cor) >= 3:
                    self.cor_base = median(self._base_cor)
                    self._n_base_cor = len(self._base_cor)
                    self.cor_sigma = mad_sigma(self._base_cor, self.cor_base)
                for name in reward_names_in(metrics.keys()):
                    if is_length_name(name):
                        v = get(metrics, f"rewards/{name}/mean")
                        if v is not None:
                            self.shaping[name] = v
                            self.shaping_now[name] = Window(8)
        return Assessment(warming_up=True, evidence={"mean_length": L, "points": len(self._base_len)})

    def _judge(self, step: int, L: float) -> Assessment:
        gap = self.clock.gap
        k = self.clock.points_for(self.recent_steps, minimum=3 if gap <= 2 else 2)
        confirm = self.clock.points_for(self.hold_steps, minimum=2)
        base = self.base or 0.0
        recent = self.length.recent_median(k) or L
        ratio = recent / base if base > 0 else 1.0
        ev: dict[str, Any] = {
            "mean_length": finite(L),
            "recent_length": finite(recent),
            "early_length": finite(base),
            "early_step": self.base_step,
            "ratio_to_early": finite(ratio),
            "ratio": self.ratio,
            "recent_points": k,
        }
        tiny = recent <= self.min_tokens
        if recent > self._line and not tiny:
            return Assessment(level=0, evidence=ev)
        cor = self._correctness(ev, k)
        if cor == "rising":
            ev["verdict"] = "shorter and more correct: concise answers"
            return Assessment(level=0, evidence=ev)
        if cor == "flat" and self._correct_high(ev):
            # A task the model already answers right 80% of the time or more, still as often: it stopped padding.
            ev["verdict"] = "shorter at a high, unchanged correctness: concise answers"
            return Assessment(level=0, evidence=ev)
        paying = self._length_reward_rising(ev)
        if paying:
            ev["deferred_to"] = "reward_component_divergence"
            return Assessment(level=0, evidence=ev)
        clipped = self.clipped.recent_median(k) if len(self.clipped) else None
        ev["clipped_ratio"] = finite(clipped)
        truncation = clipped is not None and clipped >= 0.2
        level = 1
        if tiny or (ratio <= self.critical_ratio and cor == "falling"):
            level = 2 if self.episode.points >= 1 else 1
        # Under heavy truncation the cap is the cause, not the loss: no variant then.
        self.variant = None if truncation else self._cure
        self._advice(ev, truncation)
        return Assessment(level=level, evidence=ev, onset_step=self._onset(), confirm_points=confirm)

    def _correctness(self, ev: dict[str, Any], k: int) -> str:
        """'rising', 'flat' or 'falling' against the early level, beyond the noise.

        Called only once a shrink is judged, never on the common step.
        """
        if self.cor_base is None or len(self.correct) < 3:
            ev["correctness"] = None
            return "flat"
        n = min(len(self.correct), self.clock.points_for(30, minimum=3))
        now = self.correct.recent_median(n) or 0.0
        base = self.cor_base
        # Both medians carry noise (a median's standard error is about 1.25 sigma / sqrt(n)): a change
        # within 2.5 standard errors of their difference, or 5% of the level, is flat.
        scale = 1.25 * (1.0 / max(self._n_base_cor, 1) + 1.0 / n) ** 0.5
        floor = 0.05 * max(abs(base), 0.1)
        tol = max(2.5 * self.cor_sigma * scale, floor)
        # "Rising" excuses the shrink, so it must be significant against a sigma that can bear the
        # weight. The early spread alone can't: on a coarse log the early level is the median of as
        # few as three points, whose MAD comes out anywhere from near zero (one noisy point then
        # reads as a rise) to twice the truth. The window's point-to-point noise adds up to 31 more
        # degrees of freedom; the two robust estimates are pooled by their degrees of freedom. A
        # fine log's early spread already rests on ~20 points and keeps most of its weight.
        # Falling keeps the early tolerance: it only escalates an alarm already raised.
        noise, df = self._point_noise()
        df0 = max(self._n_base_cor - 1, 1)
        sigma = ((df0 * self.cor_sigma**2 + df * noise**2) / (df0 + df)) ** 0.5
        tol_up = max(2.5 * sigma * scale, floor)
        ev["correctness"] = {"metric": self.correctness.key, "recent": finite(now), "early": finite(base), "tolerance": finite(tol),
                             "rising_tolerance": finite(tol_up), "sigma": finite(sigma)}
        if now > base + tol_up or self._mean_rise(n, floor, ev):
            return "rising"
        return "falling" if now < base - tol else "flat"

    def _mean_rise(self, n: int, floor: float, ev: dict[str, Any]) -> bool:
        """Correctness clearly above its early level by its means, where medians cannot tell: a sparse score
        (a few completions a step, mostly wrong: 0, 1/6, 2/6, ...) has a median of 0 at every level below one
        half, and its MAD is 0. The recent mean must stand 2.5 standard errors above the early one (as the
        medians must), the recent window's error inflated for its lag-1 autocorrelation (an AR(1) effective
        sample size)."""
        early, recent = self._base_cor, self.correct.last(n)
        if len(early) < 3 or len(recent) < 6:
            return False
        m0, m1 = statistics.fmean(early), statistics.fmean(recent)
        v0, v1 = statistics.variance(early), statistics.variance(recent)
        rho = 0.0
        if v1 > 0:
            d = [x - m1 for x in recent]
            rho = max(0.0, min(0.9, sum(a * b for a, b in zip(d, d[1:])) / (v1 * (len(d) - 1))))
        n_eff = len(recent) * (1.0 - rho) / (1.0 + rho)
        se = math.sqrt(v0 / len(early) + v1 / max(n_eff, 2.0))
        rise = m1 - m0
        ev["correctness_means"] = {"recent": finite(m1), "early": finite(m0), "standard_error": finite(se),
                                   "lag1_autocorrelation": finite(rho)}
        return rise > max(2.5 * se, floor)

    def _correct_high(self, ev: dict[str, Any]) -> bool:
        """Correctness is a share (every value in [0, 1]) and its recent level is at least 0.8."""
        vals = list(self.correct.values)
        cor = ev.get("correctness") or {}
        now = cor.get("recent")
        return bool(vals) and 0.0 <= min(vals) and max(vals) <= 1.0 and now is not None and now >= 0.8

    def _point_noise(self) -> tuple[float, int]:
        """Robust sigma of correctness from successive differences across the window, and its
        degrees of freedom: the MAD of the differences about their median (a steady trend shifts
        every difference alike and drops out) over sqrt(2) (a difference of two independent points
        has twice the variance of one).

        >>> noisy = [0.40, 0.44, 0.36, 0.42, 0.38, 0.41, 0.37, 0.43]
        >>> flat, climbing = LengthCollapse(), LengthCollapse()
        >>> for i, v in enumerate(noisy):
        ...     flat.correct.push(i, v)
        ...     climbing.correct.push(i, v + 0.02 * i)
        >>> [(round(s, 3), df) for s, df in (flat._point_noise(), climbing._point_noise())]
        [(0.031, 6), (0.031, 6)]
        """
        vals = list(self.correct.values)
        if len(vals) < 3:
            return 0.0, 0
        diffs = [b - a for a, b in zip(vals, vals[1:])]
        return mad_sigma(diffs) / math.sqrt(2.0), len(diffs) - 1

    def _length_reward_rising(self, ev: dict[str, Any]) -> bool:
        if not self.shaping:
            return False
        rising = []
        for name, early in self.shaping.items():
            w = self.shaping_now.get(name)
            now = w.recent_median(5) if w is not None and len(w) else None
            if now is not None and now > early + 0.05 * max(abs(early), 0.1):
                rising.append(name)
        ev["length_rewards_rising"] = rising
        return bool(rising)

    def _advice(self, ev: dict[str, Any], truncation: bool) -> None:
        if truncation:
            cap = (self.context.config or {}).get("max_completion_length")
            ev["remedy"] = "raise_max_completion_length"
            if isinstance(cap, int) and not isinstance(cap, bool) and cap > 0:
                ev["recommended_max_completion_length"] = 2 * cap
            ev["advice"] = ("Many completions are cut at the length cap, so only short answers finish and score: "
                            "raise max_completion_length.")
            return
        if self._cure is None:
            ev["advice"] = ("The run already uses Dr. GRPO's unnormalised loss: check for a reward term that pays for "
                            "shortness or gives all-wrong groups a spread (gate shaping terms on correctness), and read "
                            "sampled completions.")
        else:
            ev["advice"] = ("GRPO's per-sequence length normalisation and std-scaled advantages favour short "
                            "completions; Dr. GRPO removes both. Also check for a reward term that pays for shortness.")

    def _overrides(self) -> dict[str, Any]:
        if self.evidence.get("remedy") == "raise_max_completion_length":
            cap = self.evidence.get("recommended_max_completion_length")
            return {"max_completion_length": cap} if cap else {}
        return super()._overrides()

    def _onset(self) -> int | None:
        onset = None
        line = 0.75 * (self.base or 0.0)
        for s, v in zip(reversed(self.length.steps), reversed(self.length.values)):
            if v > line:
                break
            onset = s
        return onset

    def _message(self, severity: str, evidence: Mapping[str, Any]) -> str:
        ratio = evidence.get("ratio_to_early") or 0.0
        lead = "Completions have collapsed in length" if severity == "critical" else "Completions are shrinking"
        cor = evidence.get("correctness") or {}
        how = (f"while correctness went {cor.get('early')} -> {cor.get('recent')}" if cor
               else "with no sign of better answers")
        text = (f"{lead}: the mean length is {evidence.get('recent_length')} tokens, {ratio:.0%} of its early "
                f"{evidence.get('early_length')}, {how}.")
        if evidence.get("remedy") == "raise_max_completion_length":
            return text + " Most completions hit the cap, so only short ones finish: raise max_completion_length."
        if self._cure is None:
            return text + " Check the reward for a term that pays for shortness."
        return text + " Switch to Dr. GRPO (loss_type='dr_grpo', scale_rewards='none') to remove the length bias."
