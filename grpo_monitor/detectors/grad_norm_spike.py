"""Gradient-norm spikes: repeated updates whose gradient is an order of magnitude above the run's norm.

Users report grad_norm turning spiky late in a run (clip ratios spiking with it), and spikes coming
before a collapse. One large spike is common and harmless; what matters is that they repeat, and
worse, that the reward falls while they do.

The logged ``grad_norm`` is measured *before* clipping, so a value above ``max_grad_norm`` is normal
and says nothing by itself. A spike is a point above ``ratio`` times the trailing median *and* beyond
``z`` robust spreads of log grad_norm: a run whose gradient norm always swings over orders of
magnitude sets its own, wider line. The trailing median and spread are recomputed every few points
from a bounded window, so a step costs a few comparisons. On a coarse log each point samples one
step of several, so fewer seen spikes stand for the same rate.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from grpo_monitor.detectors.base import Assessment, Detector, Metrics, Sample, check_float, check_int, finite
from grpo_monitor.detectors.signals import get
from grpo_monitor.detectors.stats import MAD_SCALE, mad_sigma, median
from grpo_monitor.detectors.sudden_collapse import lowered_learning_rate


class GradNormSpike(Detector):
    """Repeated grad_norm spikes far above the trailing median; critical when the reward falls with them.

    Parameters: ``ratio`` (a spike is at least this many times the trailing median), ``z`` (and at
    least this many robust spreads of log grad_norm above it), ``min_spikes`` (spikes within
    ``span_steps`` training steps that make a warning on a fine log; a coarse log needs two),
    ``span_steps``, ``window`` (points of the trailing median), ``min_points`` (points before judging),
    ``lr_factor`` (the learning rate recommended when clipping is already tight is the configured one
    divided by this).

    >>> det = GradNormSpike()
    >>> found = []
    >>> for step in range(1, 201):
    ...     g = 0.3 * (1 + 0.1 * ((step * 7) % 5 - 2))
    ...     if step > 100 and step % 9 == 0:
    ...         g *= 30
    ...     found += det.update(step, {"grad_norm": g, "reward": 0.5})
    >>> [(f.severity, f.step, f.evidence["spikes"]) for f in found]
    [('warning', 126, 3)]
    >>> found[0].config_overrides, found[0].evidence["remedy"], found[0].evidence["grad_norm_is_pre_clip"]
    ({'max_grad_norm': 0.6}, 'lower_max_grad_norm', True)
    """

    id = "grad_norm_spike"
    variant = None
    # Spikes alone say nothing of whether the run learns (they can run for thousands of steps unharmed):
    # a run only this detector could read is not judged.
    role = "guard"
    requires = (("grad_norm",),)

    def __init__(self, ratio: float = 10.0, z: float = 4.5, min_spikes: int = 3, span_steps: int = 150,
                 window: int = 64, min_points: int = 12, lr_factor: float = 4.0) -> None:
        self.ratio = check_float("ratio", ratio, 1.0, 1e6, low_open=True)
        self.z = check_float("z", z, 0.0, 100.0)
        self.min_spikes = check_int("min_spikes", min_spikes, 2)
        self.span_steps = check_int("span_steps", span_steps, 1)
        self.window = check_int("window", window, 8)
        self.min_points = check_int("min_points", min_points, 4)
        self.lr_factor = check_float("lr_factor", lr_factor, 1.0, 1e6, low_open=True)
        super().__init__()

    def _reset_state(self) -> None:
        self.logs: deque[float] = deque(maxlen=self.window)  # log grad_norm of the points that were not spikes
        self.n = 0
        self._med: float | None = None
        self._sigma = 0.0
        self._line = math.inf  # log grad_norm above which a point is a spike
        self._since = 0
        self._last_spike = False
        self._last_step = 0
        self.spikes: deque[tuple[int, float, bool]] = deque(maxlen=16)  # (step, ratio to median, clip spiked)
        self.recent: deque[float] = deque(maxlen=16)  # every measured norm, spikes too: the run's level now
        self.clip: deque[float] = deque(maxlen=self.window)
        self.rewards: deque[float] = deque(maxlen=self.window)
        self.reward_before: float | None = None  # reward level before the current cluster of spikes
        self.reward_sigma = 0.0

    def _refresh(self) -> None:
        self._since = 0
        self._med = med = median(self.logs)
        self._sigma = mad_sigma(self.logs, med)
        self._line = med + max(math.log(self.ratio), self.z * self._sigma)

    def assess(self, step: int, metrics: Metrics, samples: Sequence[Sample]) -> Assessment | None:
        g = get(metrics, "grad_norm")
        r = get(metrics, "reward")
        if r is not None:
            self.rewards.append(r)
        c = get(metrics, "clip_ratio/region_mean")
        if c is not None:
            self.clip.append(c)
        if g is None or g <= 0.0:
            return None  # a gap; a zero gradient is no_learning_signal's finding
        fz, rs = get(metrics, "frac_reward_zero_std"), get(metrics, "reward_std")
        if (fz is not None and fz >= 0.99) or (rs is not None and rs <= 1e-6):
            # Every group scored alike: no advantage, so the norm is rounding noise of the other terms, not
            # the learning gradient. It neither sets the trailing level nor counts as one.
            return None
        lg = math.log(g)
        self.recent.append(g)
        self.n += 1
        # A coarse log's points each stand for several steps: fewer of them make the trailing median.
        warm = self.min_points if self.clock.gap <= 2 else max(4, self.min_points // 2)
        if self.n <= warm:
            self.logs.append(lg)
            if self.n == warm:
                self._refresh()
            return Assessment(warming_up=True, evidence={"grad_norm": g, "points": self.n})
        if lg <= self._line:
            self._last_spike = False
            self.logs.append(lg)
            self._since += 1
            if self._since >= 8:
                self._refresh()
            if not self.episode.open and not self.episode.pending:
                return Assessment(0, {"grad_norm": g, "spike_line": math.exp(self._line)})
            return self._judge(step, g)
        # A spike: kept out of the trailing statistics, so a burst does not raise its own line.
        if not self._recent_spikes(step):
            vals = list(self.rewards)[-16:]
            self.reward_before = median(vals) if len(self.rewards) >= 3 else None
            self.reward_sigma = (MAD_SCALE * median([abs(v - self.reward_before) for v in vals])
                                 if self.reward_before is not None else 0.0)
        clip = self._clip_spiked(c)
        ratio = math.exp(lg - (self._med or 0.0))
        if self._last_spike and self.spikes and step - self._last_step <= 2:
            # Spikes on neighbouring steps are one excursion (or a level shift), not repeated spikes.
            st, r0, c0 = self.spikes[-1]
            self.spikes[-1] = (st, max(r0, ratio), c0 or clip)
        else:
            self.spikes.append((step, ratio, clip))
        self._last_spike = True
        self._last_step = step
        return self._judge(step, g)

    def _clip_spiked(self, c: float | None) -> bool:
        """The clip ratio well above its own recent level at the spike (clipping bursting with the gradient)."""
        if c is None or len(self.clip) < 8:
            return False
        base = median(list(self.clip)[:-1])
        return c >= max(2.0 * base, base + 0.05)

    def _recent_spikes(self, step: int) -> list[tuple[int, float, bool]]:
        span = max(self.span_steps, 20 * self.clock.gap)
        return [s for s in self.spikes if s[0] > step - span]

    def _judge(self, step: int, g: float) -> Assessment:
        recent = self._recent_spikes(step)
        gap = self.clock.gap
        need = self.min_spikes if gap <= 2 else 2
        clipped_with = sum(1 for s in recent if s[2])
        if clipped_with >= 2:
            need = max(2, need - 1)  # clipping bursting with the gradient corroborates the spikes
        med = math.exp(self._med or 0.0)
        ev: dict[str, Any] = {
            "grad_norm": finite(g),
            "trailing_median": finite(med),
            "log_spread": finite(self._sigma),
            "spike_line": finite(math.exp(self._line)),
            "ratio": self.ratio,
            "spikes": len(recent),
            "spikes_needed": need,
            "span_steps": max(self.span_steps, 20 * gap),
            "spike_steps": [s[0] for s in recent],
            "spike_ratios": [finite(s[1]) for s in recent],
            "with_clip_ratio_spikes": clipped_with,
            "grad_norm_is_pre_clip": True,
        }
        if len(recent) < need:
            return Assessment(level=0, evidence=ev)
        level = 1
        falling = self._reward_falling(ev)
        if falling and self.episode.points >= 1:
            level = 2
        self._remedy(ev, med)
        return Assessment(level=level, evidence=ev, onset_step=recent[0][0])

    def _reward_falling(self, ev: dict[str, Any]) -> bool:
        before = self.reward_before
        if before is None or len(self.rewards) < 3:
            return False
        k = self.clock.points_for(10, minimum=3 if self.clock.gap <= 2 else 2)
        now = median(list(self.rewards)[-k:])
        drop = max(3.0 * self.reward_sigma, 0.1 * abs(before), 1e-9)
        ev["reward"] = {"before_spikes": finite(before), "recent": finite(now), "drop_needed": finite(drop)}
        return now < before - drop

    def _remedy(self, ev: dict[str, Any], med: float) -> None:
        cfg = self.context.config or {}
        mgn = finite(cfg.get("max_grad_norm"))
        if mgn is not None:
            ev["max_grad_norm"] = mgn
        target = float(f"{2.0 * med:.2g}")
        typical = median(self.recent) if self.recent else med
        if target < typical:
            # Clipping there would clip most of the latest steps: the norm's level itself moved (a run waking
            # up, a new phase), and a bound below it would freeze training. No flag is the right advice.
            ev["recent_median"] = finite(typical)
            ev["max_grad_norm_refused"] = target
        elif mgn is None or mgn <= 0 or mgn > 1.5 * target:
            ev["remedy"] = "lower_max_grad_norm"
            ev["recommended_max_grad_norm"] = target
        else:
            lr = lowered_learning_rate(cfg, self.lr_factor)
            if lr is not None:
                ev["remedy"] = "lower_learning_rate"
                ev["learning_rate"] = {"configured": finite(cfg.get("learning_rate")), "recommended": lr}
        ev["advice"] = ("grad_norm is logged before clipping, so values above max_grad_norm alone are normal; "
                        "repeated spikes of 10x the median are not. Clip near twice the healthy norm or lower the "
                        "learning rate; with DeepSpeed, check that gradient_clipping is set (otherwise max_grad_norm "
                        "is ignored).")

    def _overrides(self) -> dict[str, Any]:
        ev = self.evidence
        if ev.get("remedy") == "lower_max_grad_norm":
            return {"max_grad_norm": ev["recommended_max_grad_norm"]}
        if ev.get("remedy") == "lower_learning_rate":
            return {"learning_rate": ev["learning_rate"]["recommended"]}
        return {}

    def _message(self, severity: str, evidence: Mapping[str, Any]) -> str:
        n, span = evidence.get("spikes"), evidence.get("span_steps")
        ratios = [r for r in evidence.get("spike_ratios") or [] if r is not None]
        top = f" (up to {max(ratios):.0f}x)" if ratios else ""
        text = (f"grad_norm spiked {n} times within {span} steps to over {evidence.get('ratio'):.0f}x its trailing "
                f"median of {evidence.get('trailing_median')}{top}")
        if evidence.get("with_clip_ratio_spikes"):
            text += ", with the clip ratio bursting too"
        text += "."
        if severity == "critical":
            rw = evidence.get("reward") or {}
            text += f" The reward fell with them ({rw.get('before_spikes')} -> {rw.get('recent')}): a collapse may follow."
        if evidence.get("remedy") == "lower_max_grad_norm":
            text += f" Clip tighter: max_grad_norm={evidence.get('recommended_max_grad_norm')}."
        elif evidence.get("remedy") == "lower_learning_rate":
            lr = (evidence.get("learning_rate") or {}).get("recommended")
            text += f" Clipping is already tight: lower the learning rate (learning_rate={lr})."
        return text
