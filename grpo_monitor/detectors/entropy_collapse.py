"""Entropy collapse: the policy turns deterministic and stops exploring (DAPO §3.1).

Entropy is compared with the run's own baseline, taken once the normal early drop has settled
(healthy runs spend most of their entropy early), never with an absolute threshold. A collapse is
entropy far below that baseline for several logged points, or still falling significantly,
corroborated by a loss of diversity: more groups with identical rewards, a shrinking within-group
reward spread, near-identical completions within groups, or stalled correctness.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from grpo_monitor.detectors.base import Assessment, Detector, Metrics, Sample, check_float, check_int, finite
from grpo_monitor.detectors.signals import CorrectnessSource, EntropyTrack, duplicate_key, get, groups_of
from grpo_monitor.detectors.stats import Window, mad_sigma, mann_kendall, median


def duplicate_share(samples: Sequence[Sample], max_samples: int = 1024) -> float | None:
    """Mean over groups of the share of completions that repeat another one in their group (the
    whole completion: the tap's fingerprint where recorded, else the recorded text)."""
    groups = groups_of(samples, max_samples)
    shares = []
    for rows in groups.values():
        texts = [k for k in map(duplicate_key, rows) if k is not None]
        if len(texts) < 2:
            continue
        shares.append(1.0 - len(set(texts)) / len(texts))
    return sum(shares) / len(shares) if shares else None


class _Corroborator:
    """A metric compared with its own value while the entropy baseline was being set."""

    def __init__(self, half: int) -> None:
        self.recent = Window(2 * half)
        self.base: float | None = None
        self.half = half
        self.first: list[float] = []

    def push(self, step: int, v: float, freeze_from: int | None) -> None:
        recent = self.recent.values
        self.recent.steps.append(step)
        recent.append(v)
        if len(self.first) < 3:
            self.first.append(v)
        if self.base is None and freeze_from is not None and len(recent) >= self.half:
            self.base = median(list(recent))

    def freeze(self, first_step: int) -> None:
        vals = [v for s, v in zip(self.recent.steps, self.recent.values) if s >= first_step]
        if vals and self.base is None:
            self.base = median(vals)

    def freeze_early(self) -> None:
        if self.first and self.base is None:
            self.base = median(self.first)

    def level(self, k: int) -> float | None:
        return self.recent.recent_median(k) if len(self.recent) else None


class EntropyCollapse(Detector):
    """Entropy far below the run's settled baseline, corroborated by a loss of diversity.

    Parameters: ``drop_ratio`` (entropy at or below this share of the baseline counts as far
    below), ``trend_ratio`` with ``alpha`` (a significant downward trend below this share also
    counts when diversity is lost), ``settle_half``/``settle_tol``/``max_settle_points``/``settle_span``
    (how the post-transient baseline is found: two half-windows of at least ``settle_half`` points
    spanning ``settle_span`` steps whose medians agree within ``settle_tol`` in log space),
    ``early_ratio`` (entropy that falls to this share of its first points before settling at all
    is measured against those first points: a collapse from the start), ``window`` (trend window, points).

    >>> det = EntropyCollapse()
    >>> found = []
    >>> for step in range(1, 201):
    ...     collapsed = step > 100
    ...     m = {"entropy": 0.4 if not collapsed else 0.4 * 0.9 ** (step - 100),
    ...          "frac_reward_zero_std": 0.05 if not collapsed else 0.9, "reward_std": 0.4,
    ...          "reward": 0.5}
    ...     found += det.update(step, m)
    >>> [(f.severity, f.variant) for f in found]
    [('warning', 'dapo'), ('critical', 'dapo')]
    >>> 100 < found[0].step < 120
    True
    """

    id = "entropy_collapse"
    variant = "dapo"
    # Entropy, and something to corroborate a fall with (a fall alone is also what learning looks like).
    requires = (("entropy", "frac_reward_zero_std|reward_std|reward|rewards/*/mean|samples"),)
    fit_imports = ("scipy.optimize",)  # the entropy-performance fit of a raised collapse

    def __init__(
        self,
        drop_ratio: float = 0.25,
        trend_ratio: float = 0.5,
        alpha: float = 0.01,
        settle_half: int = 3,
        settle_tol: float = 0.3,
        max_settle_points: int = 60,
        settle_span: int = 20,
        window: int = 48,
        early_ratio: float = 0.1,
    ) -> None:
        self.drop_ratio = check_float("drop_ratio", drop_ratio, 0.0, 1.0, low_open=True, high_open=True)
        self.trend_ratio = check_float("trend_ratio", trend_ratio, 0.0, 1.0, low_open=True, high_open=True)
        if self.trend_ratio < self.drop_ratio:
            raise ValueError("trend_ratio must be >= drop_ratio")
        self.alpha = check_float("alpha", alpha, 0.0, 0.5, low_open=True)
        self.settle_half = check_int("settle_half", settle_half, 1)
        self.settle_tol = check_float("settle_tol", settle_tol, 0.0, 5.0, low_open=True)
        self.max_settle_points = check_int("max_settle_points", max_settle_points, 2 * settle_half)
        self.settle_span = check_int("settle_span", settle_span, 0)
        self.window = check_int("window", window, 8)
        self.early_ratio = check_float("early_ratio", early_ratio, 0.0, 1.0, low_open=True, high_open=True)
        super().__init__()

    def _reset_state(self) -> None:
        h = self.settle_half
        self.entropy = EntropyTrack(window=self.window, half=h, tol=self.settle_tol, max_points=self.max_settle_points,
                                    min_span=self.settle_span)
        self.zero_std = _Corroborator(h)
        self.reward_std = _Corroborator(h)
        self.dup = _Corroborator(h)
        self.correct = Window(self.window)
        self.correct_base: float | None = None
        self.correct_first: list[float] = []
        self.correctness = CorrectnessSource(self.context)
        self.fall_from: tuple[int, float] | None = None
        # Correctness (a 16-point median) where the current episode opened: what a gain must then beat.
        self.raised_from: tuple[int, float] | None = None
        # (entropy, correctness) pairs for the R = -a exp(H) + b fit; thinned by halving when full.
        self.pairs: list[tuple[float, float]] = []
        self._pair_stride = 1
        self._pair_count = 0

    def _add_pair(self, h: float, r: float) -> None:
        self._pair_count += 1
        if self._pair_count % self._pair_stride:
            return
        self.pairs.append((h, r))
        if len(self.pairs) >= 256:
            self.pairs = self.pairs[::2]
            self._pair_stride *= 2

    def assess(self, step: int, metrics: Metrics, samples: Sequence[Sample]) -> Assessment | None:
        freeze_from = self.entropy.base_step
        h = self.entropy.push_metrics(step, metrics)
        early = False
        if h is not None and freeze_from is None and self.entropy.base_step is None:
            # Entropy fell by an order of magnitude before it ever settled: a collapse from the
            # start. The first points are the only healthy reference there is.
            early = self.entropy.force_if_moved(step, self.clock.points(), low=self.early_ratio)
        if self.entropy.base_step is not None and freeze_from is None:
            if early:
                for c in (self.zero_std, self.reward_std, self.dup):
                    c.freeze_early()
                if self.correct_first:
                    self.correct_base = median(self.correct_first)
            else:
                first = self.entropy.baseline.steps[0] if self.entropy.baseline.steps else step
                for c in (self.zero_std, self.reward_std, self.dup):
                    c.freeze(first)
                vals = [v for s, v in zip(self.correct.steps, self.correct.values) if s >= first]
                if vals:
                    self.correct_base = median(vals)
        frozen = self.entropy.base_step
        fz = get(metrics, "frac_reward_zero_std")
        if fz is not None:
            self.zero_std.push(step, fz, frozen)
        rs = get(metrics, "reward_std")
        if rs is not None:
            self.reward_std.push(step, rs, frozen)
        dup = duplicate_share(samples) if samples else None
        if dup is not None:
            self.dup.push(step, dup, frozen)
        r = self.correctness.value(metrics)
        if r is not None:
            correct = self.correct
            correct.push(step, r)
            if len(self.correct_first) < 3:
                self.correct_first.append(r)
            if self.correct_base is None and frozen is not None and len(correct) >= self.settle_half:
                self.correct_base = median(correct.last(2 * self.settle_half))
            if h is not None:
                self._add_pair(h, r)
        if h is None:
            return None
        base = self.entropy.baseline.value
        if base is None:
            return Assessment(warming_up=True, evidence={"entropy": finite(h), "points": self.entropy.baseline.n})
        # Correctness where the entropy left its settled band (reset when it comes back, a median of three
        # points, so one spike does not): what the fall is judged against.
        if (self.entropy.recent(3) or h) >= 0.9 * base:
            self.fall_from = None
        elif self.fall_from is None and len(self.correct):
            self.fall_from = (step, median(self.correct.last(16)))
        return self._judge(step, h)

    def _judge(self, step: int, h: float) -> Assessment:
        base = self.entropy.base or 0.0
        if not self.episode.open and h > 1.5 * self.trend_ratio * base:
            # Far from any threshold (a median of recent points cannot be below it while this point is
            # this high on a healthy run).
            return Assessment(0, {"entropy": h, "baseline": base, "ratio_to_baseline": h / base if base else None,
                                  "threshold_ratio": self.drop_ratio})
        k = self.clock.points()
        ratio = self.entropy.ratio(k) or 1.0
        last = h / base if base > 0 else 1.0
        threshold = self.drop_ratio * (1.4 if self.episode.open else 1.0)
        strong_drop = ratio <= threshold and last <= threshold * 1.5
        ev: dict[str, Any] = {
            "entropy": finite(h),
            "entropy_recent_median": finite(self.entropy.recent(k)),
            "baseline": finite(base),
            "baseline_step": self.entropy.base_step,
            "ratio_to_baseline": finite(ratio),
            "threshold_ratio": self.drop_ratio,
            "persist_points": k,
        }
        falling = False
        if ratio <= self.trend_ratio:
            vals = [math.log(max(v, 1e-9)) for s, v in zip(self.entropy.window.steps, self.entropy.window.values)
                    if s > (self.entropy.base_step or 0)]
            if len(vals) >= 6:
                mk = mann_kendall(vals[-self.window:])
                ev["trend"] = mk.as_evidence()
                falling = mk.p_down < self.alpha
        # Corroborators only matter once entropy is low; skipping them otherwise keeps healthy steps cheap.
        corroborators = self._corroborators(k, ev, base) if ratio <= self.trend_ratio else []
        diversity = [c for c in corroborators if c != "correctness_stalled"]
        stalled = "correctness_stalled" in corroborators
        level = 0
        # Once raised, a collapse lasts while the entropy stays down: the groups' spread flickers on a coarse
        # log (a few groups regain it for a point or two), and ending the episode on each flicker would raise
        # the same collapse again. Only correctness (solved, or rising since) or the entropy itself ends it.
        holding = self.episode.open and strong_drop
        excuse = self._learning(ev, base) if corroborators or holding else None
        if excuse:
            # Entropy spent on answers that are right: the groups lost their spread because they are solved.
            ev["excused_by"] = excuse
            corroborators = diversity = []
        # A collapse costs diversity (groups turning alike), so either path needs a sign of it; a falling entropy
        # with fewer distinct rewards is also what success looks like (groups solved by every completion), so the
        # trend path needs correctness to have stalled too.
        if (strong_drop and diversity) or (falling and diversity and stalled):
            level = 1
            if strong_drop and len(corroborators) >= 2 and diversity and self.episode.points >= 1:
                level = 2
        elif holding and not excuse:
            level = 1
        if level and not self.episode.open and len(self.correct):
            self.raised_from = (step, median(self.correct.last(16)))  # this assessment opens the episode
        ev["corroborated_by"] = corroborators
        ev["window_points"] = len(self.entropy.window)
        onset = None
        if level:
            onset = self._onset(base)
            fit = self._fit()
            if fit:
                ev["entropy_performance_fit"] = fit
        return Assessment(level=level, evidence=ev, onset_step=onset)

    def _corroborators(self, k: int, ev: dict[str, Any], base: float) -> list[str]:
        out = []
        zb, zr = self.zero_std.base, self.zero_std.level(k)
        if zb is not None and zr is not None:
            need = zb + max(0.2, 0.5 * (1.0 - zb))
            ev["frac_reward_zero_std"] = {"recent": finite(zr), "baseline": finite(zb), "threshold": finite(need)}
            if zr >= need:
                out.append("frac_reward_zero_std_up")
        sb, sr = self.reward_std.base, self.reward_std.level(k)
        if sb is not None and sr is not None and sb > 0:
            ev["reward_std"] = {"recent": finite(sr), "baseline": finite(sb), "threshold": finite(0.5 * sb)}
            if sr <= 0.5 * sb:
                out.append("reward_std_down")
        db, dr = self.dup.base, self.dup.level(k)
        if db is not None and dr is not None:
            ev["identical_completions_share"] = {"recent": finite(dr), "baseline": finite(db)}
            if dr >= db + 0.3:
                out.append("identical_completions")
        during = self._since_the_fall(base)
        if self.correct_base is not None and len(during) >= 8:
            # Judged over the fall itself: a correctness that rose before the entropy fell says nothing of now.
            mk = mann_kendall(during)
            half = len(during) // 2
            gain = median(during[half:]) - median(during[:half])
            ev["correctness"] = {"metric": self.correctness.key, "recent": finite(median(during[-k:])),
                                 "baseline": finite(self.correct_base), "p_up": finite(mk.p_up), "points": len(during),
                                 "gain_over_the_fall": finite(gain)}
            # Stalled: no upward trend over the fall, and no better than where the fall began.
            if mk.p_up > 0.1 and gain <= max(0.05 * abs(self.correct_base), 0.02) and not self._gain_since_the_fall(ev):
                out.append("correctness_stalled")
        return out

    def _since_the_fall(self, base: float) -> list[float]:
        """Correctness since the entropy left its settled band."""
        if self.fall_from is None:
            return []
        return [v for s, v in zip(self.correct.steps, self.correct.values) if s >= self.fall_from[0]]

    def _gain_since_the_fall(self, ev: dict[str, Any]) -> bool:
        """Correctness now well above where it stood when the entropy began to fall: beyond three standard
        errors of the difference of the two sixteen-point medians, and a twentieth of its level. Once the collapse
        has been raised, the gain counts from where correctness stood then: one made before was already weighed."""
        if self.fall_from is None or len(self.correct) < 16 or self.correct_base is None:
            return False
        since = self.raised_from if self.episode.open and self.raised_from is not None else self.fall_from
        recent = list(self.correct.values)[-16:]
        now = median(recent)
        se = 1.2533 * mad_sigma(recent) * math.sqrt(2.0 / 16.0)
        gain = now - since[1]
        ev["correctness_since_the_fall"] = {"from_step": since[0], "then": finite(since[1]),
                                            "now": finite(now), "gain": finite(gain), "noise": finite(se)}
        return gain > max(3.0 * se, 0.05 * abs(self.correct_base), 0.02)

    def _learning(self, ev: dict[str, Any], base: float) -> str | None:
        """Whether correctness says the run is learning while its entropy falls: saturated (a correctness share
        near 1 with every group alike), or clearly higher than where it stood when the entropy began to fall.
        None otherwise."""
        if self.correct_base is None or len(self.correct) < 6:
            return None
        vals = list(self.correct.values)
        zr = self.zero_std.level(3)
        if zr is not None and zr >= 0.9 and 0.0 <= min(vals) and max(vals) <= 1.0 and median(vals[-3:]) >= 0.9:
            return "saturated"  # the task is solved: no_learning_signal says so
        return "correctness_rising" if self._gain_since_the_fall(ev) else None

    def _onset(self, base: float) -> int | None:
        # The change began at the first point of the trailing run below half the baseline.
        onset = None
        for s, v in zip(reversed(self.entropy.window.steps), reversed(self.entropy.window.values)):
            if v > 0.5 * base:
                break
            onset = s
        return onset

    def _fit(self) -> dict[str, Any] | None:
        """Fit R = -a exp(H) + b on (entropy, correctness) pairs; None where it is not meaningful."""
        if len(self.pairs) < 8:
            return None
        hs = [p[0] for p in self.pairs]
        rs = [p[1] for p in self.pairs]
        if max(hs) - min(hs) < 0.05 or max(rs) - min(rs) <= 0:
            return None
        import numpy as np
        from scipy.optimize import curve_fit

        try:

            H = np.asarray(hs)
            R = np.asarray(rs)
            # Center exp(H) to keep the fit well conditioned across entropy scales (0.05 to 6+ nats).
            h0 = float(H.max())
            (a, b), _ = curve_fit(lambda x, a, b: -a * np.exp(x - h0) + b, H, R, p0=(0.1, float(R.mean())), maxfev=2000)
            a_eff = float(a) * math.exp(-h0)
            ceiling = float(b) - a_eff
            if not (math.isfinite(a_eff) and math.isfinite(ceiling)) or a_eff <= 0:
                return None
            return {"a": finite(a_eff), "b": finite(float(b)), "predicted_ceiling": finite(ceiling),
                    "pairs": len(self.pairs), "model": "R = -a*exp(H) + b"}
        except (RuntimeError, ValueError, TypeError, ArithmeticError, np.linalg.LinAlgError):  # the fit is optional evidence
            return None

    def _message(self, severity: str, evidence: Mapping[str, Any]) -> str:
        ratio = evidence.get("ratio_to_baseline") or 0.0
        why = ", ".join(_PHRASES.get(str(c), str(c)) for c in evidence.get("corroborated_by", [])) or "a steady fall"
        lead = "Entropy has collapsed" if severity == "critical" else "Entropy is collapsing"
        cfg = self.context.config or {}
        spg = cfg.get("steps_per_generation")
        on_policy = bool(cfg) and (cfg.get("num_iterations") or 1) <= 1 and spg in (None, cfg.get("gradient_accumulation_steps"))
        note = "; clip-higher only acts off-policy, so also set steps_per_generation above gradient_accumulation_steps" if on_policy else ""
        fit = evidence.get("entropy_performance_fit")
        ceiling = f"; the fit R = -a*exp(H) + b puts the correctness ceiling, once entropy is spent, at {fit['predicted_ceiling']}" if fit else ""
        return (
            f"{lead}: it is at {ratio:.0%} of the run's settled baseline ({evidence.get('baseline')} nats), with {why}{ceiling}."
            f" Switch to DAPO (clip-higher epsilon_high=0.28, no KL) to keep exploring{note}."
        )


_PHRASES = {
    "frac_reward_zero_std_up": "more groups scoring every completion alike",
    "reward_std_down": "a shrinking reward spread",
    "identical_completions": "near-identical completions within groups",
    "correctness_stalled": "stalled correctness",
}
