"""Length-reward coupling: completions keep growing while correctness does not (Dr. GRPO).

GRPO's length normalisation (and the std scaling of advantages) lets a run keep producing longer
responses after the reward improvement has slowed; incorrect responses grow longest (Dr. GRPO,
arXiv 2503.20783). Singhal et al. (arXiv 2310.03716) measure how much of the "progress" is length:
the within-group correlation of length and reward, and the reward gain left once length is
accounted for. Length and correctness rising together is learning, not coupling.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from grpo_monitor.detectors.base import Assessment, Detector, Metrics, Sample, check_float, check_int, finite
from grpo_monitor.detectors.signals import (
    CorrectnessSource,
    EntropyTrack,
    LevelTrack,
    fair_sample,
    get,
    groups_of,
    sample_length,
    sample_reward,
)
from grpo_monitor.detectors.stats import (
    Window,
    mann_kendall,
    median,
    ols_slope_se,
    pearson,
    theil_sen,
)

_INF = math.inf


def within_group_length_reward_corr(samples: Sequence[Sample], max_samples: int = 1024) -> float | None:
    """Mean Pearson correlation of completion length and total reward within each group."""
    cors = []
    for rows in groups_of(samples, max_samples).values():
        pairs = [(sample_length(r), sample_reward(r)) for r in rows]
        pairs = [(a, b) for a, b in pairs if a is not None and b is not None]
        if len(pairs) < 3:
            continue
        c = pearson([a for a, _ in pairs], [b for _, b in pairs])
        if c is not None:
            cors.append(c)
    return sum(cors) / len(cors) if cors else None


class LengthRewardCoupling(Detector):
    """Mean completion length trending up significantly while correctness stalls.

    Parameters: ``alpha`` (one-sided significance of the length trend), ``stall_elasticity``
    (correctness counts as stalled when its relative gain across the window, plus one standard
    error, is below this share of the length's relative growth: learning moves both, coupling
    only length),
    ``min_growth`` (relative length growth across the trend window), ``level_ratio`` (recent
    length over the settled baseline), ``span_steps`` (trend window in training steps, so coarse
    and fine logs agree), ``min_points``/``max_points`` (bounds of that window in logged points),
    ``corr_threshold`` (within-group length-reward correlation that counts as length-driven reward),
    ``min_rise_tokens`` (the least rise over the baseline, in tokens, that counts: the length bias Dr. GRPO
    corrects grows responses by hundreds of tokens, while a few tokens more on very short answers, a choice
    letter or a label, is a change of format).

    >>> det = LengthRewardCoupling()
    >>> found = []
    >>> for step in range(1, 201):
    ...     L = 200 if step < 60 else 200 + 5 * (step - 60)
    ...     acc = 0.4 + 0.002 * (step % 7)
    ...     found += det.update(step, {"completions/mean_length": L, "rewards/accuracy/mean": acc, "reward": acc})
    >>> [(f.severity, f.variant) for f in found]
    [('warning', 'dr_grpo'), ('critical', 'dr_grpo')]
    >>> found[0].config_overrides
    {'loss_type': 'dr_grpo', 'scale_rewards': 'none', 'beta': 0.0}
    """

    id = "length_reward_coupling"
    variant = "dr_grpo"
    requires = (("completions/mean_length", "reward|rewards/*/mean"),)
    confirm_points = 2

    def __init__(
        self,
        alpha: float = 0.05,
        stall_elasticity: float = 0.25,
        min_growth: float = 0.3,
        level_ratio: float = 1.3,
        span_steps: int = 100,
        min_points: int = 6,
        max_points: int = 100,
        corr_threshold: float = 0.3,
        min_rise_tokens: float = 32.0,
    ) -> None:
        self.alpha = check_float("alpha", alpha, 0.0, 0.5, low_open=True)
        self.stall_elasticity = check_float("stall_elasticity", stall_elasticity, 0.0, 10.0, low_open=True)
        self.min_growth = check_float("min_growth", min_growth, 0.0, 100.0, low_open=True)
        self.level_ratio = check_float("level_ratio", level_ratio, 1.0, 100.0, low_open=True)
        self.span_steps = check_int("span_steps", span_steps, 1)
        self.min_points = check_int("min_points", min_points, 4)
        self.max_points = check_int("max_points", max_points, min_points)
        self.corr_threshold = check_float("corr_threshold", corr_threshold, -1.0, 1.0)
        self.min_rise_tokens = check_float("min_rise_tokens", min_rise_tokens, 0.0, 1e6)
        super().__init__()

    def _reset_state(self) -> None:
        self.length = LevelTrack(window=self.max_points, half=3, tol=0.3, min_span=20)
        self.correct = Window(self.max_points)
        self.reward = Window(self.max_points)
        self.correctness = CorrectnessSource(self.context)
        self.entropy = EntropyTrack(window=8, half=3, tol=0.3, min_span=20)
        self.clipped = Window(8)
        self.corr = Window(self.max_points)
        self.len_correct = Window(self.max_points)
        self.len_incorrect = Window(self.max_points)

    def _push_samples(self, step: int, samples: Sequence[Sample]) -> None:
        c = within_group_length_reward_corr(samples)
        if c is not None:
            self.corr.push(step, c)
        good, bad = [], []
        for s in fair_sample(samples, 1024):
            if type(s) is not dict and not isinstance(s, Mapping):
                continue
            L = sample_length(s)
            ok = self.correctness.sample_value(s)
            if L is None or ok is None:
                continue
            (good if ok > 0.5 else bad).append(L)
        if good:
            self.len_correct.push(step, sum(good) / len(good))
        if bad:
            self.len_incorrect.push(step, sum(bad) / len(bad))

    def assess(self, step: int, metrics: Metrics, samples: Sequence[Sample]) -> Assessment | None:
        entropy = self.entropy
        if entropy.push_metrics(step, metrics) is not None and entropy.baseline.value is None:
            entropy.force_if_moved(step, 2, high=2.5)
        c = get(metrics, "completions/clipped_ratio")
        if c is not None:
            self.clipped.push(step, c)
        r = self.correctness.value(metrics)
        if r is not None:
            self.correct.push(step, r)
        tot = get(metrics, "reward")
        if tot is not None:
            self.reward.push(step, tot)
        if samples:
            self._push_samples(step, samples)
        L = get(metrics, "completions/mean_length")
        if L is None or L <= 0:
            return None
        self.length.push(step, L)
        base = self.length.baseline.value or 0.0
        ready = base and len(self.correct) >= self.min_points
        if ready and not self.episode.open and L < 0.8 * self.level_ratio * base:
            # This point is far below the level a median of recent points would need.
            return Assessment(0, {"mean_length": {"latest": L, "baseline": base, "threshold_ratio": self.level_ratio}})
        if not ready:
            return Assessment(warming_up=True, evidence={"points": len(self.length.window)})
        return self._judge(step)

    def _window(self, w: Window, start: int) -> tuple[list[int], list[float]]:
        steps, vals = [], []
        for s, v in zip(w.steps, w.values):
            if s >= start:
                steps.append(s)
                vals.append(v)
        return steps, vals

    def _level_evidence(self, recent: float, base: float, ratio: float) -> dict[str, Any]:
        return {
            "mean_length": {"recent": finite(recent), "baseline": finite(base), "ratio": finite(ratio),
                            "threshold_ratio": self.level_ratio},
        }

    def _judge(self, step: int) -> Assessment:
        k = 3 if self.clock.gap <= 2 else 2  # self.clock.points()
        base = self.length.baseline.value or 0.0
        recent = self.length.window.recent_median(k) or 0.0
        ratio = recent / base if base > 0 else 0.0
        need = self.level_ratio * (0.9 if self.episode.open else 1.0)
        ev: dict[str, Any] = self._level_evidence(recent, base, ratio)
        if ratio < need:
            return Assessment(0, ev)
        if recent - base < self.min_rise_tokens:
            ev["mean_length"]["min_rise_tokens"] = self.min_rise_tokens
            return Assessment(0, ev)
        # Trend window: the last span_steps steps, widened to min_points points.
        wsteps = list(self.length.window.steps)
        # Early in a run the span reaches back before the first point: the window starts where the log does.
        start = max(step - self.span_steps, wsteps[0])
        if sum(1 for s in wsteps if s >= start) < self.min_points:
            start = wsteps[-self.min_points] if len(wsteps) >= self.min_points else wsteps[0]
        ls, lv = self._window(self.length.window, start)
        cs, cv = self._window(self.correct, start)
        ev["window"] = {"from_step": start, "to_step": step, "points": len(lv)}
        if len(lv) < self.min_points or len(cv) < max(4, self.min_points - 2):
            return Assessment(level=0, evidence=ev)
        span = max(ls[-1] - ls[0], 1)
        growth = theil_sen(ls, lv) * span / max(median(lv), 1e-9)
        if growth < self.min_growth:  # no coupling without length growth: nothing below could raise the level
            ev["length_trend"] = {"relative_growth": finite(growth), "threshold_growth": self.min_growth}
            return Assessment(level=0, evidence=ev)
        mk_len = mann_kendall([math.log(v) for v in lv], ls)
        ev["length_trend"] = dict(mk_len.as_evidence(), relative_growth=finite(growth))
        length_rising = mk_len.p_up < self.alpha
        if not length_rising:  # nor without a significant trend
            return Assessment(level=0, evidence=ev)
        mk_c = mann_kendall(cv, cs)
        # Least squares, not Theil-Sen: a binary-reward mean is quantised and its pairwise slopes
        # tie at 0. One standard error is added, so a noisy correctness must be clearly flat.
        c_slope, c_se = ols_slope_se(cs, cv)
        c_gain = c_slope * span
        c_level = max(abs(median(cv)), 1e-3)
        c_rel = c_gain / c_level
        c_rel_upper = (c_gain + (c_se * span if math.isfinite(c_se) else abs(c_gain))) / c_level
        elasticity = c_rel_upper / growth if growth > 0 else 0.0
        ev["correctness"] = {"metric": self.correctness.key, "p_up": finite(mk_c.p_up), "p_down": finite(mk_c.p_down),
                             "gain_over_window": finite(c_gain), "relative_gain": finite(c_rel),
                             "relative_gain_upper": finite(c_rel_upper),
                             "elasticity_to_length": finite(elasticity), "threshold_elasticity": self.stall_elasticity,
                             "recent": finite(median(cv[-k:]))}
        stalled = elasticity <= self.stall_elasticity * (1.5 if self.episode.open else 1.0)
        falling = mk_c.p_down < 0.05
        # Entropy rising with the length, or truncation jumping, is degeneration (DAPO 3.3: entropy and length
        # rise together), not a length trend: leave it to that detector, unless the total reward rises with the
        # length (the reward pays for length, which is coupling whatever entropy does).
        degenerate = False
        if self.entropy.ready and (self.entropy.ratio(k) or 0.0) >= 1.5:
            degenerate = True
        if len(self.clipped) and median(self.clipped.last(k)) >= 0.5:
            degenerate = True
        corroborators = self._corroborators(start, ev)
        rs, rv = self._window(self.reward, start)
        pays = False
        if len(rv) == len(lv) and len(rv) >= 4:
            corr = pearson(lv, rv)
            ev["reward_length_correlation"] = finite(corr)
            pays = corr is not None and corr >= 0.5 and theil_sen(rs, rv) > 0 and self.correctness.key != "reward"
        if pays:
            degenerate = False
            corroborators.append("reward_tracks_length")
        ev["degenerate_regime"] = degenerate
        level = 0
        if length_rising and not degenerate and (stalled or "length_explains_reward" in corroborators):
            level = 1
            if self.episode.points >= 1 and (falling or corroborators or ratio >= 2 * self.level_ratio):
                level = 2
        ev["corroborated_by"] = corroborators
        onset = None
        if level:
            onset = self._onset(base)
        # Fine logs: each point is one noisy step, so ask for twice the stretch of training.
        confirm = 20 if self.clock.gap <= 2 else 10
        return Assessment(level=level, evidence=ev, onset_step=onset, confirm_steps=confirm)

    def _corroborators(self, start: int, ev: dict[str, Any]) -> list[str]:
        out = []
        _, cv = self._window(self.corr, start)
        if len(cv) >= 3:
            m = median(cv)
            ev["within_group_length_reward_corr"] = finite(m)
            if m >= self.corr_threshold:
                out.append("length_explains_reward")
        gs, gv = self._window(self.len_correct, start)
        bs, bv = self._window(self.len_incorrect, start)
        if len(gv) >= 4 and len(bv) >= 4:
            g_slope, b_slope = theil_sen(gs, gv), theil_sen(bs, bv)
            ev["length_slope_per_step"] = {"correct": finite(g_slope), "incorrect": finite(b_slope)}
            if b_slope > 0 and b_slope > 1.25 * max(g_slope, 0.0):
                out.append("incorrect_grow_longer")
        return out

    def _onset(self, base: float) -> int | None:
        onset = None
        for s, v in zip(reversed(self.length.window.steps), reversed(self.length.window.values)):
            if v <= 1.1 * base:
                break
            onset = s
        return onset

    def _message(self, severity: str, evidence: Mapping[str, Any]) -> str:
        ml = evidence.get("mean_length", {})
        corr = evidence.get("correctness", {})
        lead = "Completion length is running away" if severity == "critical" else "Completion length keeps rising"
        return (
            f"{lead} ({ml.get('baseline')} -> {ml.get('recent')} tokens) while {corr.get('metric')} is not improving:"
            " the reward tracks length, not quality. Switch to Dr. GRPO (loss_type='dr_grpo', scale_rewards='none')."
        )
