"""Sudden collapse: the reward's level crashes within a few steps and stays down.

The commonest failure users report (runs that die between step 60 and 650, often reproducibly): the
crash itself takes one to five steps, completions turn to gibberish or one repeated token at the
length cap, groups score all alike. What came before it is the evidence a user needs: a learning
rate that jumped, gradient-norm spikes, KL growing, entropy moving away from its level.

Everything is relative to the run itself, and to its level, not to an extreme value: the level is the
median of the last ``level_points`` healthy points (the running best of a noisy series is its luckiest
batch, not a level). A point more than ``point_z`` times the reward's own step-to-step noise (a robust
scale of its differences while healthy) and ``drop_frac`` of the reward's scale (its gain over the run,
or its level) below that level starts a fall; the fall is a crash once the median of its points lies
below the level by ``z`` standard errors of the two medians' difference, so one wild batch of a noisy
reward never is, and a sustained fall of a quieter one soon is. A slow decline is not a crash: within
``max_crash_steps`` before it the reward must still have stood near its level.

The finding names the last healthy step. The update made at that step may already be the one that
broke the policy (its completions were sampled before it), so the checkpoint to resume from is the
newest saved *before* it; the onset is that step, which is what the restart's checkpoint choice reads.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from grpo_monitor.detectors.base import Assessment, Detector, Metrics, Sample, check_float, check_int, finite
from grpo_monitor.detectors.signals import completions_per_step, fair_sample, get, sample_top_word_share
from grpo_monitor.detectors.stats import Window, mad_sigma, median

# What the recommendation calls the change (not a GRPO variant: the run's own settings, resumed earlier).
REMEDY = "lower_learning_rate"

# The precursor metrics watched beside the reward.
_SERIES = ("kl", "entropy", "grad_norm", "completions/clipped_ratio", "frac_reward_zero_std", "learning_rate",
           "completions/mean_length")


def lowered_learning_rate(config: Mapping[str, Any] | None, factor: float = 10.0, jump: float = 1.0) -> float | None:
    """The run's configured learning rate divided by ``factor`` (three significant digits), or None.

    ``jump``: how far the schedule had raised the rate in effect above its healthy level when the run
    crashed. The schedule multiplies ``learning_rate``, so dividing by the jump too keeps the rate in
    effect at a ``factor``-th of the healthy one where the schedule peaks."""
    lr = (config or {}).get("learning_rate")
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not math.isfinite(lr) or lr <= 0:
        return None
    return float(f"{lr / factor / max(jump, 1.0):.3g}")


def single_token_share(samples: Sequence[Sample], max_samples: int = 256) -> float | None:
    """Share of completions (of at least four words) made mostly of one repeated word: ``!!!!`` and its kin."""
    n = hits = 0
    for s in fair_sample(samples, max_samples):
        if isinstance(s, Mapping) and "tail_rep" in s:  # the tap's measure of the whole completion
            share = sample_top_word_share(s)
            if share is not None:
                n += 1
                hits += share >= 0.8
            continue
        text = s.get("completion") if isinstance(s, Mapping) else None
        if not isinstance(text, str):
            continue
        words = text.split()
        if len(words) < 4:
            n += 1
            continue
        n += 1
        top = max(words.count(w) for w in set(words[:64]))
        if top >= 0.8 * len(words):
            hits += 1
    return hits / n if n else None


class _Series:
    """One precursor metric: its healthy points (bounded) and its latest values."""

    __slots__ = ("healthy", "recent")

    def __init__(self, size: int) -> None:
        self.healthy = Window(size)
        self.recent = Window(12)

    def push(self, step: int, v: float | None, healthy: bool) -> None:
        if v is None:
            return
        self.recent.push(step, v)
        if healthy:
            self.healthy.push(step, v)

    def base(self) -> float | None:
        return median(list(self.healthy.values)) if len(self.healthy) >= 3 else None

    def last_healthy(self) -> float | None:
        return self.healthy.values[-1] if len(self.healthy) else None

    def at_or_before(self, step: int) -> float | None:
        out = None
        for s, v in zip(self.healthy.steps, self.healthy.values):
            if s > step:
                break
            out = v
        return out


class SuddenCollapse(Detector):
    """The reward's level falling sharply, fast, and staying there.

    Parameters: ``z`` (the fall's median lies this many standard errors below the level), ``point_z`` (a
    point this many noise units below the level starts a fall), ``drop_frac`` (and a fall is at least this
    share of the reward's scale), ``level_points`` (healthy points whose median is the level),
    ``max_crash_steps`` (within this many training steps before the first point of the fall, the reward
    stood near its level: the fall came at once; slower declines are left to other detectors),
    ``min_points`` (healthy logged points before judging), ``window`` (healthy points kept for the noise
    estimate and the precursors' baselines), ``lr_factor`` (the recommended learning rate is the
    configured one divided by this).

    >>> det = SuddenCollapse()
    >>> found = []
    >>> for step in range(1, 61):
    ...     crashed = step > 40
    ...     r = 0.0 if crashed else 0.6 + 0.05 * ((step * 7) % 5 - 2) / 2
    ...     found += det.update(step, {"reward": r, "completions/clipped_ratio": 1.0 if crashed else 0.0})
    >>> [(f.severity, f.step, f.evidence["last_healthy_step"]) for f in found]
    [('critical', 42, 40)]
    """

    id = "sudden_collapse"
    variant = None
    requires = (("reward",),)

    def __init__(self, z: float = 5.0, point_z: float = 3.0, drop_frac: float = 0.5, level_points: int = 16,
                 max_crash_steps: int = 5, min_points: int = 8, window: int = 64, lr_factor: float = 10.0) -> None:
        self.z = check_float("z", z, 0.0, 1e3, low_open=True)
        self.point_z = check_float("point_z", point_z, 0.0, 1e3, low_open=True)
        self.drop_frac = check_float("drop_frac", drop_frac, 0.0, 1.0, low_open=True)
        self.level_points = check_int("level_points", level_points, 3)
        self.max_crash_steps = check_int("max_crash_steps", max_crash_steps, 1)
        self.min_points = check_int("min_points", min_points, 4)
        self.window = check_int("window", window, 8)
        self.lr_factor = check_float("lr_factor", lr_factor, 1.0, 1e6, low_open=True)
        super().__init__()

    def _reset_state(self) -> None:
        self.rewards = Window(self.window)  # healthy points only
        # Every point before the current fall, low ones included: what the reward's own distribution produces
        # (long enough to hold its tails).
        self.seen: deque[float] = deque(maxlen=8 * self.window)
        self.judged = 0  # points tested so far: the family a false crash would come from
        self.first: list[float] = []
        # The best level the run reached (the running maximum of the level): the reward's scale.
        self.best: float | None = None
        self.best_step: int | None = None
        self.healthy_step: int | None = None  # last step above the line
        # The trailing run of points below the line: its length, first step, its points, and the level and
        # noise it fell from (the healthy window does not move while it lasts).
        self.crash_n = 0
        self.crash_first: int | None = None
        self.crash: deque[tuple[int, float]] = deque(maxlen=8)
        self.fell_from: tuple[float, float] | None = None
        self.sudden = False
        self.pre_level: float | None = None
        self.degenerating = False
        # The noise estimate, worked out again every four healthy points (``_sigma_at``: healthy points then).
        self._sigma = 0.0
        self._sigma_at = -1
        self._pushes = 0
        self.series = {k: _Series(self.window) for k in _SERIES}
        self.rep_recent: float | None = None
        self.lr_jump = 1.0

    # -- statistics -------------------------------------------------------------------------------

    def _noise(self) -> float:
        """Robust noise of the healthy reward window: the larger of its step-to-step noise and its spread
        around its median (a reward that wanders, or has heavy tails, is judged by how far it strays)."""
        v = list(self.rewards.values)
        diffs = sorted(abs(b - a) for a, b in zip(v, v[1:]))
        if not diffs:
            return 0.0
        # The mean absolute difference of two independent normal draws is 2 sigma / sqrt(pi). Its top
        # tenth is trimmed (spikes); unlike a median it does not jump on coarse rewards (k/8).
        k = max(1, math.ceil(0.9 * len(diffs)))
        step_noise = sum(diffs[:k]) / k * math.sqrt(math.pi) / 2
        return max(step_noise, mad_sigma(v))

    def _level(self) -> float:
        return median(self.rewards.last(self.level_points))

    def _scale(self) -> float:
        best = self.best if self.best is not None else self._level()
        start = median(self.first) if self.first else best
        return max(best - start, abs(best))

    def _chance(self, points: list[float]) -> float:
        """How likely the run's own recent rewards give a fall this deep: the probability that more than half of
        ``len(points)`` draws from them lie at or below the fall's median (the binomial tail of their empirical
        share there, counted with half a point more below, so a value never seen yet is rare, not impossible).
        A small batch's discrete reward (two completions: 0, 1 or 2) falls to its floor now and then; this says
        how often."""
        x = median(points)
        n = len(self.seen)
        p = (sum(1 for v in self.seen if v <= x) + 0.5) / (n + 1)
        m = len(points)
        need = m // 2 + 1  # more than half of them (both of two)
        return sum(math.comb(m, j) * p**j * (1 - p) ** (m - j) for j in range(need, m + 1))

    def _floor_chance(self, m: int) -> float:
        """The smallest ``_chance`` the history can give ``m`` points: all of them below every value seen."""
        p = 0.5 / (len(self.seen) + 1)
        need = m // 2 + 1
        return sum(math.comb(m, j) * p**j * (1 - p) ** (m - j) for j in range(need, m + 1))

    def _fall_needed(self, m: int, sigma: float, scale: float) -> float:
        """How far the median of a fall of ``m`` points must lie below the level: ``z`` standard errors of
        the difference of the two medians (1.2533 sigma / sqrt(n) each), and ``drop_frac`` of the scale."""
        n = min(len(self.rewards), self.level_points)
        se = 1.2533 * sigma * math.sqrt(1.0 / m + 1.0 / n)
        return max(self.z * se, self.drop_frac * scale, 1e-9)

    # -- per step ---------------------------------------------------------------------------------

    def assess(self, step: int, metrics: Metrics, samples: Sequence[Sample]) -> Assessment | None:
        r = get(metrics, "reward")
        if r is None:
            return None
        if len(self.first) < 3:
            self.first.append(r)
        ready = len(self.rewards) >= self.min_points
        if ready:
            self.judged += 1
            if self._pushes - self._sigma_at >= 4:
                self._sigma, self._sigma_at = self._noise(), self._pushes
            level, sigma = self.fell_from if self.crash_n else (self._level(), self._sigma)
            scale = self._scale()
            line = level - max(self.point_z * sigma, self.drop_frac * scale, 1e-9)
        else:
            level = sigma = scale = 0.0
            line = -math.inf
        below = r < line
        if below:
            if not self.crash_n:
                self.crash_first = step
                self.fell_from = (level, sigma)
                # Sudden: within ``max_crash_steps`` before the first point below the line, the reward
                # still stood near its level (within a quarter of the gap to the line): the fall came at once.
                limit = max(self.max_crash_steps, self.clock.gap)
                pre = [v for s, v in zip(self.rewards.steps, self.rewards.values) if s >= step - limit]
                if not pre and len(self.rewards):
                    pre = [self.rewards.values[-1]]
                self.pre_level = max(pre) if pre else None
                self.sudden = self.pre_level is not None and self.pre_level >= line + 0.75 * (level - line)
                self.degenerating = self._degenerating(step - limit)
            self.crash.append((step, r))
            self.crash_n += 1
        else:
            if self.crash_n:
                self.seen.extend(v for _, v in self.crash)  # a fall that did not last is part of the distribution
                self.crash.clear()
                self.crash_n = 0
                self.crash_first = None
                self.fell_from = None
                self.sudden = False  # set only on a point below the line
            self.healthy_step = step
            self.seen.append(r)
            self.rewards.push(step, r)
            self._pushes += 1
            if len(self.rewards) >= self.min_points:
                now = self._level()
                if self.best is None or now > self.best:
                    self.best, self.best_step = now, step
        for key, series in self.series.items():
            series.push(step, get(metrics, key), healthy=not below)
        if below and samples:
            # Read the text only while the reward is down: healthy steps stay cheap.
            self.rep_recent = single_token_share(samples)
        if not ready:
            return Assessment(warming_up=True, evidence={"reward": r, "points": len(self.rewards)})
        ev = self._evidence_of(r, level, line, sigma, scale)
        if not self.crash_n:
            return Assessment(0, ev)
        if not self.sudden or self.degenerating:
            ev["decline"] = "after_degeneration" if self.sudden else "gradual"
            return Assessment(0, ev)
        last = self.healthy_step
        points = [v for _, v in self.crash]
        fall = level - median(points)
        needed = self._fall_needed(len(points), sigma, scale)
        ev["last_healthy_step"] = last
        ev["crash_points"] = self.crash_n
        ev["crash_steps"] = [s for s, _ in self.crash]
        ev["crash_rewards"] = points
        ev["fall"] = fall
        ev["fall_needed"] = needed
        ev["best_just_before_crash"] = finite(self.pre_level)
        precursors = self._precursors(ev, last)
        ev["precursors"] = precursors
        new_lr = lowered_learning_rate(self.context.config, self.lr_factor, self.lr_jump)
        if new_lr is not None:
            ev["remedy"] = REMEDY
            ev["learning_rate"] = {"configured": finite(self.context.config.get("learning_rate")), "recommended": new_lr}
        # One point below the line is first evidence only when the text changed with the score (the
        # cap, entropy far off its level, one repeated token), with all-alike groups or two such signs:
        # a batch of hard prompts scores low with ordinary text. Two points in a row confirm. Either way
        # the fall's median must lie beyond what the run's own noise explains.
        text_signs = {"completions_to_cap", "entropy_moved", "one_repeated_token"} & set(precursors)
        chance = self._chance(points)
        ev["chance_of_such_a_fall"] = chance
        # Beyond the noise, and rare under the run's own distribution: rare enough that a run of this length
        # would show one by chance with odds of at most 1 in 100 (Bonferroni over every point tested); a single
        # point, which needs changed text to back it, at 1 in 20 on its own.
        alpha = 0.01 / max(self.judged, 20) if len(points) > 1 else 0.05
        ev["rare_below"] = alpha
        rare = chance < alpha
        if not rare and len(points) > 1 and self._floor_chance(len(points)) >= alpha and self.seen:
            # Too short a history to resolve odds that small (a coarse log's first dozens of points): a fall
            # below every reward the run has shown is as rare as this history can tell.
            rare = max(points) < min(self.seen)
            ev["below_every_reward_seen"] = rare
        n = self.crash_n if fall >= needed and rare else 0
        batch = completions_per_step(self.context.config, self.series["completions/clipped_ratio"].recent.values)
        if batch is not None and batch <= 4:
            # A mean over a handful of completions reaches its floor by chance now and then (two completions
            # both cut at the cap): only a fall that lasts counts, and changed text no longer shortens it.
            ev["completions_per_point"] = batch
            n = n - 2 if n >= 3 else 0
            text_signs = set()
        if n >= 3 or (n == 2 and text_signs):
            level_ = 2
        elif n == 2 or (n == 1 and text_signs and ("all_groups_alike" in precursors or len(text_signs) >= 2)):
            level_ = 1
        else:
            level_ = 0
        onset = last if last is not None else self.crash_first
        return Assessment(level=level_, evidence=ev, onset_step=onset if level_ else None)

    def _evidence_of(self, r: float, level: float, line: float, sigma: float, scale: float) -> dict[str, Any]:
        return {
            "reward": finite(r),
            "level": finite(level),
            "level_points": self.level_points,
            "best_level": finite(self.best),
            "best_level_step": self.best_step,
            "line": finite(line),
            "noise_sigma": finite(sigma),
            "z": self.z,
            "drop_frac": self.drop_frac,
            "reward_scale": finite(scale),
        }

    def _degenerating(self, step: int) -> bool:
        """Entropy and length were already well up before the fall began: the end of a degeneration
        (long, high-entropy text at the cap), which its own detector diagnoses, not a crash."""
        e, L, c = self.series["entropy"], self.series["completions/mean_length"], self.series["completions/clipped_ratio"]
        eb, ev_ = e.base(), e.at_or_before(step)
        if eb is None or ev_ is None or eb <= 0 or ev_ < 1.5 * eb:
            return False
        lb, lv = L.base(), L.at_or_before(step)
        cb, cv = c.base(), c.at_or_before(step)
        longer = lb is not None and lv is not None and lb > 0 and lv >= 1.2 * lb
        clipped = cb is not None and cv is not None and cv >= cb + 0.15
        return longer or clipped

    def _precursors(self, ev: dict[str, Any], last: int | None) -> list[str]:
        """The crash's company and what led up to it, each with its numbers."""
        out: list[str] = []
        s = self.series
        lr = s["learning_rate"]
        base = lr.base()
        if base and base > 0 and len(lr.recent):
            peak = max(lr.recent.values)
            self.lr_jump = peak / base if peak >= 5 * base else 1.0
            if peak >= 5 * base:
                out.append("learning_rate_jump")
                ev["learning_rate_jump"] = {"healthy": finite(base), "peak": finite(peak), "ratio": finite(peak / base)}
        g = s["grad_norm"]
        base = g.base()
        if base and base > 0 and len(g.recent):
            peak = max(g.recent.values)
            if peak >= 10 * base:
                out.append("grad_norm_spike")
                ev["grad_norm"] = {"healthy_median": finite(base), "recent_max": finite(peak), "ratio": finite(peak / base)}
        k = s["kl"]
        base = k.base()
        if base is not None and len(k.recent) >= 3:
            vals = k.recent.last(6)
            growing = all(b >= a for a, b in zip(vals, vals[1:])) and vals[-1] > 0
            jump = vals[-1] >= 10 * max(base, 1e-12)
            if jump or (growing and len(vals) >= 4 and (vals[-1] - vals[-2]) > (vals[1] - vals[0]) > 0):
                out.append("kl_growing")
                ev["kl"] = {"healthy_median": finite(base), "recent": [finite(v) for v in vals]}
        e = s["entropy"]
        base = e.base()
        before = e.last_healthy()
        if base is not None and base > 0 and len(e.recent) and before is not None and before > 0:
            now = e.recent.values[-1]
            ratio, step_ratio = now / base, now / before
            ev["entropy"] = {"healthy_median": finite(base), "last_healthy": finite(before), "latest": finite(now),
                             "ratio": finite(ratio)}
            # Moved against its level and at the crash itself (a long-collapsed entropy is not news).
            if (ratio >= 2.0 or ratio <= 0.5) and (step_ratio >= 1.5 or step_ratio <= 1 / 1.5):
                out.append("entropy_moved")
        c = s["completions/clipped_ratio"]
        base = c.base()
        before = c.last_healthy()
        if base is not None and len(c.recent) and before is not None:
            now = c.recent.values[-1]
            ev["clipped_ratio"] = {"healthy_median": finite(base), "last_healthy": finite(before), "latest": finite(now)}
            rise = max(0.3, 0.5 * (1.0 - base))
            if now >= base + rise and now >= before + 0.5 * rise:
                out.append("completions_to_cap")
        z = s["frac_reward_zero_std"]
        before = z.last_healthy()
        if len(z.recent):
            now = z.recent.values[-1]
            ev["frac_reward_zero_std"] = finite(now)
            if now >= 0.9 and (before is None or before < 0.9):
                out.append("all_groups_alike")
        if self.rep_recent is not None:
            ev["one_repeated_token_share"] = finite(self.rep_recent)
            if self.rep_recent >= 0.5:
                out.append("one_repeated_token")
        return out

    def _overrides(self) -> dict[str, Any]:
        lr = lowered_learning_rate(self.context.config, self.lr_factor, self.lr_jump)
        return {"learning_rate": lr} if lr is not None else {}

    def _message(self, severity: str, evidence: Mapping[str, Any]) -> str:
        lead = "The reward has collapsed" if severity == "critical" else "The reward is crashing"
        last = evidence.get("last_healthy_step")
        rewards = evidence.get("crash_rewards") or [evidence.get("reward")]
        text = (f"{lead}: from its level {evidence.get('level')} (the median of its last healthy points) to "
                f"{rewards[-1]}, a fall of {evidence.get('fall')} where the run's own noise ({evidence.get('noise_sigma')}) "
                f"explains at most {evidence.get('fall_needed')}; the last healthy step is {last}.")
        words = [_PHRASES.get(p, p) for p in evidence.get("precursors") or []]
        if words:
            text += " With it: " + ", ".join(words) + "."
        jump = evidence.get("learning_rate_jump")
        lr = (evidence.get("learning_rate") or {}).get("recommended")
        if jump:
            text += (f" The learning rate rose {jump.get('ratio')}x: check the schedule; the rate below also divides"
                     " by that jump, so its peak is a tenth of the healthy rate.")
        where = f"the newest checkpoint saved before step {last}" if last is not None else "the newest healthy checkpoint"
        change = f" with a lower learning rate (learning_rate={lr})" if lr is not None else " with a lower learning rate"
        return text + f" Resume from {where}{change}."


_PHRASES = {
    "learning_rate_jump": "a jump in the learning rate",
    "grad_norm_spike": "a gradient-norm spike",
    "kl_growing": "KL growing fast",
    "entropy_moved": "entropy far off its level",
    "completions_to_cap": "completions running to the length cap",
    "all_groups_alike": "every group scoring alike",
    "one_repeated_token": "completions of one repeated token",
}
