"""Degenerate long chain-of-thought: entropy explodes while completions run into the length cap.

DAPO §3.3/§4.3: with a sample-level loss, long samples fill with gibberish and repetition; entropy
and length rise together, completions pile up at ``max_completion_length``
(``completions/clipped_ratio`` -> 1) and the reward falls. Everything is measured against the
run's own baseline: a run that sits at the cap from step 1 (a random-init model) is not degenerating.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from grpo_monitor.detectors.base import (  # noqa: F401  (RunContext: doctest)
    Assessment,
    Detector,
    Metrics,
    RunContext,
    Sample,
    check_float,
    check_int,
    finite,
)
from grpo_monitor.detectors.signals import (
    CorrectnessSource,
    EntropyTrack,
    LevelTrack,
    completions_per_step,
    fair_sample,
    get,
    has_text_signals,
    repeated_ngram_share,  # noqa: F401  (re-exported: its home before the tap measured it)
    sample_length,
    sample_tail_repetition,
)
from grpo_monitor.detectors.stats import mann_kendall, median
from grpo_monitor.detectors.variants import EXTRA_ADVICE


_INF = math.inf


def long_completion_repetition(samples: Sequence[Sample], max_samples: int = 256, max_long: int = 8) -> float | None:
    """Mean repeated-n-gram share over the longer half (or the truncated) completions of a batch
    (at most ``max_long`` of them, the longest first; beyond ``max_samples``, of a fair sample of
    the groups). Each share is the tap's measure on the whole completion where recorded."""
    rows = [s for s in fair_sample(samples, max_samples) if (type(s) is dict or isinstance(s, Mapping)) and has_text_signals(s)]
    if len(rows) < 2:
        return None
    lengths = [sample_length(s) or 0.0 for s in rows]
    cut = median(lengths)
    long_rows = [s for s, L in zip(rows, lengths) if L >= cut or s.get("truncated") is True]
    long_rows = sorted(long_rows, key=lambda s: -(sample_length(s) or 0.0))[:max_long]
    shares = [sample_tail_repetition(s) for s in long_rows]
    shares = [x for x in shares if x is not None]
    return sum(shares) / len(shares) if shares else None


class DegenerateLongCot(Detector):
    """Entropy well above its baseline with length and truncation rising and reward falling.

    Parameters: ``entropy_ratio`` (entropy at or above this multiple of the baseline counts as
    exploding), ``clip_rise`` (rise of the truncated share over its baseline: a fifth of the completions newly
    cut), ``cap_fraction`` (share of the distance from the baseline length to ``max_completion_length`` that
    counts as running to the cap; with the entropy up, a length doubled counts too),
    ``reward_drop`` (relative fall of correctness below its baseline), ``settle_half``/``settle_tol``.

    >>> det = DegenerateLongCot()
    >>> det.start(RunContext(config={"max_completion_length": 512}))
    >>> found = []
    >>> for step in range(1, 121):
    ...     bad = step > 80
    ...     found += det.update(step, {"entropy": 2.5 if bad else 0.3, "completions/mean_length": 500 if bad else 200,
    ...                                "completions/clipped_ratio": 0.9 if bad else 0.02, "reward": 0.05 if bad else 0.6})
    >>> [(f.severity, f.step, f.variant) for f in found]
    [('warning', 82, 'dapo'), ('critical', 83, 'dapo')]
    """

    id = "degenerate_long_cot"
    variant = "dapo"
    # With entropy, its rise and a growing length or truncation; without, completions pinned at
    # the cap while the reward falls.
    requires = (
        ("entropy", "completions/mean_length|completions/clipped_ratio"),
        ("completions/clipped_ratio", "reward|rewards/*/mean"),
    )

    def __init__(
        self,
        entropy_ratio: float = 2.0,
        clip_rise: float = 0.2,
        cap_fraction: float = 0.5,
        reward_drop: float = 0.3,
        settle_half: int = 3,
        settle_tol: float = 0.3,
    ) -> None:
        self.entropy_ratio = check_float("entropy_ratio", entropy_ratio, 1.0, 1e6, low_open=True)
        self.clip_rise = check_float("clip_rise", clip_rise, 0.0, 1.0, low_open=True)
        self.cap_fraction = check_float("cap_fraction", cap_fraction, 0.0, 1.0, low_open=True)
        self.reward_drop = check_float("reward_drop", reward_drop, 0.0, 1.0, low_open=True, high_open=True)
        self.settle_half = check_int("settle_half", settle_half, 1)
        self.settle_tol = check_float("settle_tol", settle_tol, 0.0, 5.0, low_open=True)
        super().__init__()

    def _reset_state(self) -> None:
        h = self.settle_half
        self.entropy = EntropyTrack(window=16, half=h, tol=self.settle_tol, min_span=20)
        self.length = LevelTrack(window=16, half=h, tol=self.settle_tol, min_span=20)
        self.clipped = LevelTrack(window=16, half=h, tol=10.0, positive=False, min_span=20)
        self.correct = LevelTrack(window=16, half=h, tol=10.0, positive=False, min_span=20)
        self.repetition = LevelTrack(window=16, half=h, tol=10.0, positive=False, min_span=20)
        self.correctness = CorrectnessSource(self.context)
        # The total reward, apart from correctness: rising with length, it pays for length
        # (length-reward coupling), which is not degeneration.
        self.total = LevelTrack(window=16, half=h, tol=10.0, positive=False, min_span=20)
        self._total_best: float | None = None
        self._saw_entropy = False
        cap = (self.context.config or {}).get("max_completion_length")
        ok = isinstance(cap, (int, float)) and not isinstance(cap, bool) and 0 < cap < math.inf
        self.cap = float(cap) if ok else None
        # Logs without the config: the cap is the longest completion length, once several batches hit it.
        self._longest = 0.0
        self._longest_hits = 0
        # An entropy bonus the run pays (TRL's entropy regularisation logs ``entropy_coef``): the likely cause.
        bonus = (self.context.config or {}).get("entropy_coef")
        self.entropy_bonus = bonus if isinstance(bonus, (int, float)) and not isinstance(bonus, bool) and bonus > 0 else None
        # The entropy a single point must reach before a recent median could show the rise.
        self._far_factor = 1.0 + 0.5 * (self.entropy_ratio - 1.0)

    def assess(self, step: int, metrics: Metrics, samples: Sequence[Sample]) -> Assessment | None:
        entropy = self.entropy
        h = entropy.push_metrics(step, metrics)
        if h is not None:
            self._saw_entropy = True
            # Entropy exploded before it ever settled: the first points are the healthy reference.
            if entropy.baseline.value is None and entropy.force_if_moved(step, self.clock.points(),
                                                                           high=1.5 * self.entropy_ratio):
                for track in (self.length, self.clipped, self.correct):
                    track.force_early(step)
        L = get(metrics, "completions/mean_length")
        if L is not None and L > 0:
            self.length.push(step, L)
        c = get(metrics, "completions/clipped_ratio")
        if c is not None:
            self.clipped.push(step, c)
        r = self.correctness.value(metrics)
        if r is not None:
            self.correct.push(step, r)
        t = get(metrics, "reward")
        if t is not None:
            self.total.push(step, t)
        self._cap_and_repetition(step, metrics, samples, c)
        coef = get(metrics, "entropy_coef")
        if coef is not None:
            self.entropy_bonus = coef if coef > 0 else None
        if h is None and L is None and c is None:
            return None
        e_base = entropy.baseline.value
        if self._saw_entropy and e_base is None:
            return Assessment(warming_up=True)
        if self.length.baseline.value is None and self.clipped.baseline.value is None:
            return Assessment(warming_up=True)
        if not self.episode.open and h is not None and e_base is not None and h < self._far_factor * e_base:
            # This point is far below the rise a median of recent points would need.
            return Assessment(0, {"entropy": {"latest": h, "baseline": e_base, "threshold_ratio": self.entropy_ratio}})
        return self._judge(step)

    def _cap_and_repetition(self, step: int, metrics: Metrics, samples: Sequence[Sample], clipped: float | None) -> None:
        # A batch whose longest completion was cut hit the cap; one that logs none cut (clipped_ratio 0) only
        # shows the longest answer, however often it recurs (short fixed-format outputs repeat their length).
        if self.cap is None and (clipped is None or clipped > 0):
            m = get(metrics, "completions/max_length")
            if m is not None and m > 0:
                if m > self._longest:
                    self._longest, self._longest_hits = m, 1
                elif m == self._longest:
                    self._longest_hits += 1
        if samples:
            rep = long_completion_repetition(samples)
            if rep is not None:
                self.repetition.push(step, rep)

    @property
    def length_cap(self) -> float | None:
        """``max_completion_length`` from the config, else the longest length several batches were cut at."""
        if self.cap is not None:
            return self.cap
        return self._longest if self._longest_hits >= 3 else None

    def _clip_rise_needed(self, base: float) -> float:
        """How far the truncated share must rise over its baseline: ``clip_rise``, or half the room left above a
        high baseline, but never less than 5 points. A share already at 1 at its baseline (a cap every completion
        reaches from the start) cannot rise: its truncation is not growth, and the truncation detector tells it."""
        return max(0.05, min(self.clip_rise, 0.5 * (1.0 - base)))

    def _reward_falling(self, relax: float, ev: dict[str, Any]) -> bool:
        """The task reward well below its baseline over about 30 steps and trending down (noisy
        logs without entropy need the longer stretch and the trend test)."""
        if not self.correct.ready:
            return False
        kk = self.clock.points_for(30, 4)
        rr, rb = self.correct.recent(kk), self.correct.base
        vals = self.correct.window.last(16)
        if rr is None or rb is None or len(vals) < 6:
            return False
        mk = mann_kendall(vals)
        ev["correctness_trend"] = {"recent": finite(rr), "baseline": finite(rb), "points": kk, "p_down": finite(mk.p_down)}
        return rb - rr > self.reward_drop * abs(rb) * relax and mk.p_down < 0.05 / relax

    def _reward_rising(self, k: int) -> bool:
        """The total reward clearly above its baseline and at its best level so far, with the length logged: the
        reward is paying for the growth (``length_reward_coupling``, which reads the length, judges that). A reward
        that has fallen from its peak while the truncation rose is not paying for length."""
        if not self.total.ready or not self.length.ready:
            return False
        tr, tb = self.total.recent(max(k, self.clock.points_for(10, 3))), self.total.base
        if tr is None or tb is None:
            return False
        spread = max(self.total.baseline.spread or 0.0, 1e-6)
        self._total_best = tr if self._total_best is None else max(self._total_best, tr)
        below_peak = self._total_best - tr > max(self.reward_drop * abs(self._total_best - tb), 2 * spread)
        return tr - tb > max(self.reward_drop * abs(tb), 2 * spread) and not below_peak

    def _judge(self, step: int) -> Assessment:
        k = self.clock.points()
        relax = 0.75 if self.episode.open else 1.0
        ev: dict[str, Any] = {"persist_points": k}
        batch = completions_per_step(self.context.config, self.clipped.window.values)
        confirm = 1
        if not self.entropy.ready and batch is not None and batch <= 4:
            # A handful of completions a point and no entropy to corroborate: one completion moves the
            # truncated share by a quarter or more, so levels are medians over three times the points,
            # and the pattern must hold at three points in a row.
            k = min(len(self.clipped.window.values), 3 * k)
            confirm = 3
            ev["persist_points"] = k
            ev["completions_per_point"] = batch
        if self.entropy_bonus:
            ev["entropy_bonus"] = self.entropy_bonus
        cap = self.length_cap
        signals: list[str] = []
        entropy_up = False
        if self.entropy.ready:
            ratio = self.entropy.ratio(k) or 0.0
            ev["entropy"] = {"recent": finite(self.entropy.recent(k)), "baseline": finite(self.entropy.base),
                             "ratio": finite(ratio), "threshold_ratio": self.entropy_ratio}
            entropy_up = ratio >= 1.0 + (self.entropy_ratio - 1.0) * relax
            if entropy_up:
                signals.append("entropy_up")
            elif not self.episode.open:
                # Nothing can fire without the entropy rise: skip the rest on healthy steps.
                return Assessment(level=0, evidence=ev)
        length_up = False
        if self.length.ready:
            Lr = self.length.recent(k) or 0.0
            Lb = self.length.base or 0.0
            ev["mean_length"] = {"recent": finite(Lr), "baseline": finite(Lb), "max_completion_length": cap}
            if cap:
                # Closed at least ``cap_fraction`` of the distance from the baseline to the cap, or, with the entropy
                # risen beside it, doubled on the way there (DAPO's signature: entropy and length rise together).
                length_up = (Lr >= Lb + self.cap_fraction * max(cap - Lb, 1.0) * relax
                             or (entropy_up and Lr >= (1.0 + relax) * Lb))
            else:
                length_up = Lr >= (1.0 + 0.5 * relax) * Lb
            if length_up:
                signals.append("length_to_cap")
        clip_up = False
        if self.clipped.ready:
            cr = self.clipped.recent(k) or 0.0
            cb = self.clipped.base or 0.0
            need = cb + self._clip_rise_needed(cb) * relax
            ev["clipped_ratio"] = {"recent": finite(cr), "baseline": finite(cb), "threshold": finite(need)}
            clip_up = cr >= need
            if clip_up:
                signals.append("truncation_up")
        reward_down = False
        if self.correct.ready:
            rr = self.correct.recent(k)
            rb = self.correct.base
            spread = max(self.correct.baseline.spread or 0.0, 1e-6)
            if rr is not None and rb is not None:
                drop = rb - rr
                ev["correctness"] = {"metric": self.correctness.key, "recent": finite(rr), "baseline": finite(rb)}
                reward_down = drop > max(self.reward_drop * abs(rb), 2 * spread) * relax
                if reward_down:
                    signals.append("reward_down")
        if self.repetition.ready:
            pr, pb = self.repetition.recent(k), self.repetition.base
            ev["repeated_ngram_share"] = {"recent": finite(pr), "baseline": finite(pb)}
            if pr is not None and pb is not None and pr >= pb + 0.2:
                signals.append("repetition")
        growth = length_up or clip_up
        if self.entropy.ready:
            warn = entropy_up and growth
            crit = entropy_up and growth and (reward_down or "repetition" in signals) and (length_up or clip_up)
            if warn and not reward_down and self._reward_rising(k):
                # Reward rising with the length is the reward paying for length, even with entropy up.
                warn = crit = False
                ev["deferred_to"] = "length_reward_coupling"
        else:
            # Without entropy (older TRL, Unsloth) every other symptom must agree: completions
            # pinned at the length cap, having risen there, while the task reward falls.
            warn = length_up and clip_up and reward_down
            if not warn and self.clipped.ready:
                cr, cb = self.clipped.recent(k) or 0.0, self.clipped.base or 0.0
                Lr = (self.length.recent(k) or 0.0) if self.length.ready else 0.0
                rose = cr - cb >= self._clip_rise_needed(cb) * relax
                pinned = cr >= 0.9 * relax or bool(cap and Lr >= 0.95 * cap)
                if rose and pinned and self._reward_falling(1.0 / relax, ev):
                    warn = True
                    signals.append("pinned_at_cap")
                    if "reward_down" not in signals:
                        signals.append("reward_down")
            crit = warn and "repetition" in signals
        ev["signals"] = signals
        ev["extra_advice"] = dict(EXTRA_ADVICE["dapo"])
        if cap:
            ev["extra_advice"]["reward_funcs"] = (
                f"+trl.rewards.get_soft_overlong_punishment(max_completion_len={int(cap)}, "
                f"soft_punish_cache={max(1, int(cap) // 4)})"
            )
        level = 2 if (crit and self.episode.points >= 1) else (1 if warn or crit else 0)
        onset = None
        if level:
            onset = self._onset()
        return Assessment(level=level, evidence=ev, onset_step=onset, confirm_points=confirm)

    def _onset(self) -> int | None:
        track = self.entropy if self.entropy.ready else self.clipped
        base = track.base or 0.0
        onset = None
        for s, v in zip(reversed(track.window.steps), reversed(track.window.values)):
            if track is self.entropy and v < 1.5 * base:
                break
            if track is self.clipped and v < base + 0.15:
                break
            onset = s
        return onset

    def _message(self, severity: str, evidence: Mapping[str, Any]) -> str:
        sig = ", ".join(s.replace("_", " ") for s in evidence.get("signals", []))
        lead = "Completions have degenerated" if severity == "critical" else "Completions are degenerating"
        bonus = evidence.get("entropy_bonus")
        first = (f" The run pays an entropy bonus (entropy_coef={bonus}), which is what pushes entropy up: lower it "
                 "or turn it off first." if bonus else "")
        kind = "long, high-entropy text" if "entropy_up" in evidence.get("signals", []) else "long text at the length cap"
        return (
            f"{lead} into {kind} ({sig}).{first} Switch to DAPO with token-level loss and "
            "mask_truncated_completions=True, and add the soft overlong punishment reward "
            "(trl.rewards.get_soft_overlong_punishment)."
        )

