"""Truncation before it is total: a share of completions cut at ``max_completion_length`` that hurts.

Every completion cut at the cap is ``no_learning_signal``'s case (reward 0, no spread, from step 1). The
forms it misses are partial: a cap that cuts a third to four fifths of the completions from the start
(TRL's short default cut 50-80 % of GSM8K chains of thought), and the creeping form, where completions
grow into the cap and one reward component (usually format) falls as the truncated share rises (open-r1
363: the format reward reached 0 about 50 steps in). A cut completion loses its closing tags and its
answer, so the reward pays it nothing whatever the reasoning was worth.

Everything is relative to the run: the truncated share's own early level, and each reward component's
level over the stretch when little was truncated. Truncation that comes with entropy exploding or
collapsing, or with nearly every group scoring alike, is a symptom of that failure and is left to its
detector. With ``mask_truncated_completions=True`` the cut completions drop out of the loss, so only a
large share (half the batch wasted) or a falling reward is raised.

The fix is a setting: a larger ``max_completion_length`` (twice the cap), or DAPO's overlong filtering
(``mask_truncated_completions=True``) when the cap cannot grow.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from grpo_monitor.detectors.base import Assessment, Detector, Metrics, Sample, check_float, check_int, finite
from grpo_monitor.detectors.signals import completions_per_step, fair_sample, get, reward_names_in, sample_reward
from grpo_monitor.detectors.stats import mad_sigma, median

RAISE_CAP = "raise_max_completion_length"
MASK = "mask_truncated_completions"
_KEY = "completions/clipped_ratio"
_WINDOW = 16


def _int_setting(config: Mapping[str, Any] | None, name: str) -> int | None:
    v = (config or {}).get(name)
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


class Truncation(Detector):
    """A rising or large share of completions cut at the length cap, with a reward component falling.

    Parameters: ``level`` (a truncated share at or above it counts when it has risen ``rise`` above
    the run's early level and a reward component fell meanwhile), ``high`` (a share at or above it
    counts on its own; between ``level`` and it, a share counts when the cut completions of the recent
    sample batches scored clearly less than the completed ones), ``total`` (at or above it every completion is cut: ``no_learning_signal``'s
    case), ``rise``, ``masked_high`` (with ``mask_truncated_completions=True``, the share that counts
    without a falling reward), ``persist_points``/``persist_steps`` (logged points and training steps
    the pattern must hold), ``defer_high``/``defer_low`` (entropy ratios to its early level beyond
    which truncation is a symptom of degeneration or collapse).

    >>> det = Truncation()
    >>> found = []
    >>> for step in range(1, 121):
    ...     cut = 0.0 if step < 40 else min(0.6, 0.01 * (step - 40))
    ...     fmt = 0.9 - cut + 0.02 * (step % 3)
    ...     found += det.update(step, {_KEY: cut, "rewards/format_reward/mean": fmt, "reward": 0.5 + fmt})
    >>> [(f.severity, f.evidence["remedy"], f.config_overrides) for f in found][:1]
    [('warning', 'mask_truncated_completions', {'mask_truncated_completions': True})]
    >>> found[0].evidence["fell"][0]["component"]
    'format_reward'
    """

    id = "truncation"
    variant = None
    requires = ((_KEY,),)

    def __init__(self, level: float = 0.15, high: float = 0.5, total: float = 0.98, rise: float = 0.1,
                 masked_high: float = 0.7, persist_points: int = 3, persist_steps: int = 10, defer_high: float = 2.0,
                 defer_low: float = 0.4) -> None:
        self.level = check_float("level", level, 0.0, 1.0, low_open=True, high_open=True)
        self.high = check_float("high", high, 0.0, 1.0, low_open=True, high_open=True)
        self.total = check_float("total", total, 0.0, 1.0, low_open=True)
        self.rise = check_float("rise", rise, 0.0, 1.0)
        self.masked_high = check_float("masked_high", masked_high, 0.0, 1.0, low_open=True)
        self.persist_points = check_int("persist_points", persist_points, 1)
        self.persist_steps = check_int("persist_steps", persist_steps, 0)
        self.defer_high = check_float("defer_high", defer_high, 1.0, 1e6, low_open=True)
        self.defer_low = check_float("defer_low", defer_low, 0.0, 1.0, low_open=True, high_open=True)
        self.confirm_points, self.confirm_steps = self.persist_points, self.persist_steps
        super().__init__()

    def _reset_state(self) -> None:
        cfg = self.context.config or {}
        self.cap = _int_setting(cfg, "max_completion_length")
        self.masked = cfg.get("mask_truncated_completions") is True
        # The truncated share of the last points.
        self.cuts: deque[float] = deque(maxlen=_WINDOW)
        self.cut_steps: deque[int] = deque(maxlen=_WINDOW)
        self.early: list[float] = []
        # Each logged point's metrics: the recent ones, and those where little was truncated (the level
        # each reward component stood at before the cap started to bite).
        self.recent: deque[Mapping[str, Any]] = deque(maxlen=_WINDOW)
        self.low: deque[Mapping[str, Any]] = deque(maxlen=24)
        self.first_step: int | None = None
        # Per recent sample batch: mean total reward of completed minus cut completions, and the
        # completed ones' mean (the scale the gap is read against).
        self.gaps: deque[tuple[float, float]] = deque(maxlen=4)
        self.fix: dict[str, Any] = {}

    # -- per step ---------------------------------------------------------------------------------

    def assess(self, step: int, metrics: Metrics, samples: Sequence[Sample]) -> Assessment | None:
        cr = get(metrics, _KEY)
        if cr is None or not 0.0 <= cr <= 1.0:
            return None
        self.cuts.append(cr)
        self.cut_steps.append(step)
        self.recent.append(metrics)
        if self.first_step is None:
            self.first_step = step
        if len(self.early) < 8 and (not self.early or step - self.first_step < 20):
            # The first points within twenty steps of the start: eight on fine logs, two on coarse ones.
            self.early.append(cr)
        if cr < 0.5 * self.level:
            self.low.append(metrics)
        if sum(1 for c in self.cuts if c >= self.level) < 2 and not self.episode.open:
            return Assessment(0, {"truncation": "low"})  # no median over the last points can reach the level
        # A coarse point already averages several steps: fewer points cover the same stretch of training.
        confirm = min(self.persist_points, max(2, -(-self.persist_steps // self.clock.gap) + 1))
        if samples and cr >= self.level:
            self._measure_gap(samples)
        return self._judge(step, confirm)

    def _measure_gap(self, samples: Sequence[Sample]) -> None:
        """How much less the cut completions of this batch scored than the completed ones."""
        cut = done = 0
        s_cut = s_done = 0.0
        for row in fair_sample(samples, 512):
            t = row.get("truncated") if isinstance(row, Mapping) else None
            if type(t) is not bool:
                continue
            v = sample_reward(row)
            if v is None:
                continue
            if t:
                cut += 1
                s_cut += v
            else:
                done += 1
                s_done += v
        if cut >= 3 and done >= 3:
            self.gaps.append((s_done / done - s_cut / cut, s_done / done))

    def _judge(self, step: int, confirm: int) -> Assessment:
        k = min(_WINDOW, self.clock.points_for(10, 3))
        cuts = list(self.cuts)[-k:]
        r = median(cuts)
        e = median(self.early)
        ev: dict[str, Any] = {"clipped_ratio": {"recent": finite(r), "early": finite(e), "points": len(cuts)},
                              "level": self.level, "high": self.high, "masked": self.masked}
        # At the cap from the first points on (not a creep), or cut entirely now.
        total = r >= self.total or (r >= 0.9 and e >= 0.9)
        if total and (self.masked or not self._groups_carry_spread(k)):
            # Everything cut and nothing left to learn from: no_learning_signal's finding.
            ev["deferred_to"] = "no_learning_signal"
            return Assessment(level=0, evidence=ev)
        deferred = self._deferred(k, ev)
        if deferred:
            ev["deferred_to"] = deferred
            return Assessment(level=0, evidence=ev)
        rising = r >= self.level and r - e >= self.rise
        fell = self._fallen(k) if r >= self.level else []
        if fell:
            ev["fell"] = fell
        costly = r >= self.level and self._cut_scores_less(ev)
        large = r >= (self.masked_high if self.masked else self.high)
        level = 0
        if (rising and fell) or costly or large:
            level = 1
            long = self.episode.points >= self.persist_points
            batch = completions_per_step(self.context.config, self.cuts)
            if batch is not None and batch <= 4:
                # A handful of completions a point: one cut completion is a quarter or more, and a component's
                # fall is as noisy; only a long stretch of it confirms.
                ev["completions_per_point"] = batch
                fell, costly = [], False
                long = self.episode.points >= 3 * self.persist_points
            # Critical needs the harm itself (a component fell, or cut completions scored less): a large share
            # alone wastes compute, and the cap may be where the task's answers end anyway.
            if not self.masked and (fell or costly) and (r >= self.high or long):
                level = 2
        if total:
            # Cut at the cap throughout, yet the groups still carry a reward spread: the run learns within the
            # budget it has (analyze explains it as a normal pattern); nothing to alarm about.
            ev["still_learning"] = True
            level = 0
        if level:
            self._remedy(ev, r)
        onset = None
        if level:
            # The first point of the trailing stretch at or above ``level``.
            onset = step
            for s, v in zip(reversed(self.cut_steps), reversed(self.cuts)):
                if v < self.level:
                    break
                onset = s
        return Assessment(level=level, evidence=ev, onset_step=onset, confirm_points=confirm)

    def _groups_carry_spread(self, k: int) -> bool:
        """Most groups of the last points still score their completions differently."""
        rows = list(self.recent)[-k:]
        fz = self._series(rows, "frac_reward_zero_std")
        if fz:
            return median(fz) < 0.5
        rs = self._series(rows, "reward_std")
        return bool(rs) and median(rs) > 1e-6

    def _series(self, rows: Sequence[Mapping[str, Any]], key: str) -> list[float]:
        out = []
        for m in rows:
            v = get(m, key)
            if v is not None:
                out.append(v)
        return out

    def _cut_scores_less(self, ev: dict[str, Any]) -> bool:
        """Cut completions scored clearly less than completed ones in most recent sample batches."""
        if len(self.gaps) < 2:
            return False
        gap = median([g for g, _ in self.gaps])
        scale = median([abs(d) for _, d in self.gaps])
        ev["cut_vs_completed"] = {"reward_gap": finite(gap), "completed_reward": finite(scale), "batches": len(self.gaps)}
        return gap >= max(0.2, 0.3 * scale)

    def _deferred(self, k: int, ev: dict[str, Any]) -> str | None:
        recent = list(self.recent)[-k:]
        zs = self._series(recent, "frac_reward_zero_std")
        if zs and median(zs) >= 0.9:
            ev["frac_reward_zero_std"] = finite(median(zs))
            return "no_learning_signal"
        # Entropy against its level while little was truncated (else the first points): truncation
        # that comes with entropy exploding or vanishing is that failure's symptom.
        ref = [h for h in self._series(self.low, "entropy") if h > 0]
        if len(ref) < 3:
            ref = [h for h in self._series(list(self.low)[:3] or recent[:1], "entropy") if h > 0]
        if ref:
            hs = [h for h in self._series(recent, "entropy") if h > 0]
            if hs:
                ratio = median(hs) / max(median(ref), 1e-12)
                ev["entropy_ratio_to_early"] = finite(ratio)
                if ratio >= self.defer_high:
                    return "degenerate_long_cot"
                if ratio <= self.defer_low:
                    return "entropy_collapse"
        return None

    def _fallen(self, k: int) -> list[dict[str, Any]]:
        """Reward components (or the total) whose recent level lies below their level while little was
        truncated by more than their own noise allows."""
        if len(self.low) < 4:
            return []
        recent = list(self.recent)[-k:]
        names = [f"rewards/{n}/mean" for n in reward_names_in(recent[-1].keys())] or ["reward"]
        out = []
        for key in names:
            before = self._series(self.low, key)
            now = self._series(recent, key)
            if len(before) < 4 or len(now) < max(1, k // 2):
                continue
            pre, cur = median(before), median(now)
            noise = mad_sigma(before, pre)
            need = max(3.0 * noise, 0.15 * abs(pre), 0.05)
            if pre - cur >= need:
                name = key[len("rewards/"):-len("/mean")] if key != "reward" else "reward"
                out.append({"component": name, "before": finite(pre), "recent": finite(cur), "drop": finite(pre - cur),
                            "threshold": finite(need)})
        out.sort(key=lambda d: -(d["drop"] or 0.0))
        return out[:4]

    def _remedy(self, ev: dict[str, Any], r: float) -> None:
        cap = self.cap
        source = "config"
        if cap is None:
            seen = self._series(list(self.recent), "completions/max_length")
            if seen:
                cap, source = int(max(seen)), "largest logged completion length"
        if cap:
            new = 2 * cap
            self.fix = {"max_completion_length": new}
            ev["remedy"] = RAISE_CAP
            ev["max_completion_length"] = {"current": cap, "from": source, "recommended": new}
            if not self.masked:
                ev["alternative"] = {"mask_truncated_completions": True}
        elif not self.masked:
            self.fix = {"mask_truncated_completions": True}
            ev["remedy"] = MASK
        else:
            self.fix = {}
            ev["remedy"] = RAISE_CAP

    def _overrides(self) -> dict[str, Any]:
        return dict(self.fix)

    def _message(self, severity: str, evidence: Mapping[str, Any]) -> str:
        cr = evidence.get("clipped_ratio", {})
        share = cr.get("recent")
        pct = f"{100 * share:.0f}%" if isinstance(share, (int, float)) else "a large share"
        early = cr.get("early")
        lead = f"{pct} of completions are cut at the length cap"
        if isinstance(early, (int, float)) and isinstance(share, (int, float)) and share - early >= self.rise:
            lead += f" (up from {100 * early:.0f}% early in the run)"
        fell = evidence.get("fell") or []
        if fell:
            f = fell[0]
            lead += (f", and {f['component']} fell from {f['before']} to {f['recent']} as they were: a cut completion "
                     "loses its closing tags and answer")
        cap = (evidence.get("max_completion_length") or {})
        if evidence.get("remedy") == RAISE_CAP and cap.get("recommended"):
            fix = f"Raise max_completion_length from {cap.get('current')} to {cap.get('recommended')}"
            if evidence.get("alternative"):
                fix += " (or, if memory forbids it, set mask_truncated_completions=True so cut completions leave the loss)"
        elif evidence.get("remedy") == MASK:
            fix = ("Raise max_completion_length (about twice the current cap), or set mask_truncated_completions=True "
                   "so cut completions leave the loss")
        else:
            fix = "Raise max_completion_length: masked completions are compute spent for nothing"
        return f"{lead}. {fix}; no GRPO variant fixes this."
