"""Reward components diverging: one component (say format) saturates while correctness does not move.

A format reward climbing to its ceiling while correctness stays flat or falls means the reward
function or the prompt format is wrong (TRL issue 5298, open-r1 407). The advice is to inspect the
reward function on sampled outputs before tuning anything (recipe step 8); no variant fixes it.
Components named after length are left to the length-reward coupling detector.

Real runs learn their format first: while a component still climbs, a correctness reward that pays
only for a strictly formatted answer cannot move yet (the Unsloth notebooks' rewards are built that
way), so a rise is judged once the components have stopped climbing. Correctness is judged on its
median and on its mean: a sparse reward (one correct completion in a batch now and then) has a
median of 0 while its mean climbs.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Collection, Mapping, Sequence
from statistics import fmean, variance
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
    LevelTrack,
    get,
    is_length_name,
    resolve_correctness,
    reward_names_in,
)
from grpo_monitor.detectors.stats import mann_kendall, median


# A component's recent level at this share of its running maximum counts as at its ceiling.
_CEILING = 0.9
# Points of correctness whose means are compared: its first ones and its latest ones.
_MEAN_POINTS = 24


class RewardComponentDivergence(Detector):
    """A non-correctness reward component rising far above its baseline while correctness is flat or falling.

    Parameters: ``rise`` (gain of the component, relative to its level, that counts as a large
    rise), ``noise_z`` (the gain must also exceed this many baseline noise sigmas),
    ``persist_points``/``persist_steps`` (the pattern must hold for this many logged points and
    training steps in a row; critical once correctness has stayed put ``saturated_steps`` after it began), ``max_components`` (components tracked at most), ``saturated_steps``
    (training steps a shaping or format component must sit at its ceiling, with correctness near zero
    and not trending up, to count without a rise: a reward saturated from the start never rises).

    >>> det = RewardComponentDivergence()
    >>> det.start(RunContext(correctness_reward="correct"))
    >>> found = []
    >>> for step in range(1, 161):
    ...     fmt = 0.1 if step < 40 else min(0.98, 0.1 + 0.03 * (step - 40))
    ...     found += det.update(step, {"rewards/correct/mean": 0.3 + 0.01 * (step % 3), "rewards/format/mean": fmt})
    >>> [(f.severity, f.evidence["component"]) for f in found]
    [('warning', 'format'), ('critical', 'format')]
    """

    id = "reward_component_divergence"
    variant = None

    def missing_inputs(self, names: Collection[str], has_samples: bool = False) -> str | None:
        components = reward_names_in(names)
        key, correct = resolve_correctness(self.context, names)
        if correct is None or key not in names:
            return "needs a correctness reward component (rewards/<correct|accuracy|exact_match...>/mean)"
        if not [c for c in components if c != correct and not is_length_name(c)]:
            return f"needs another reward component besides {correct}"
        return None

    def __init__(self, rise: float = 0.3, noise_z: float = 4.0, persist_points: int = 2, persist_steps: int = 20,
                 max_components: int = 16, saturated_steps: int = 50) -> None:
        self.rise = check_float("rise", rise, 0.0, 100.0, low_open=True)
        self.noise_z = check_float("noise_z", noise_z, 0.0, 1e6)
        self.persist_points = check_int("persist_points", persist_points, 1)
        self.persist_steps = check_int("persist_steps", persist_steps, 0)
        self.max_components = check_int("max_components", max_components, 1)
        self.saturated_steps = check_int("saturated_steps", saturated_steps, 1)
        self.confirm_points, self.confirm_steps = self.persist_points, self.persist_steps
        super().__init__()

    def _reset_state(self) -> None:
        self.correctness = CorrectnessSource(self.context)
        self.correct = LevelTrack(window=32, half=3, tol=10.0, positive=False, min_span=20)
        # Correctness's first points (the level its mean is judged against) and its latest ones.
        self.c_first: list[float] = []
        self.c_last: deque[float] = deque(maxlen=_MEAN_POINTS)
        self.components: dict[str, _Component] = {}
        self._live = False

    def assess(self, step: int, metrics: Metrics, samples: Sequence[Sample]) -> Assessment | None:
        c = self.correctness.value(metrics)
        if c is not None:
            self.correct.push(step, c)
            if len(self.c_first) < _MEAN_POINTS:
                self.c_first.append(c)
            self.c_last.append(c)
        correct_name = self.correctness.name
        pushed = 0
        for name in reward_names_in(metrics.keys()):
            if name == correct_name:
                continue
            v = get(metrics, f"rewards/{name}/mean")
            if v is None:
                continue
            comp = self.components.get(name)
            if comp is None:
                if len(self.components) >= self.max_components:
                    continue
                comp = self.components[name] = _Component(is_length_name(name))
            pushed += 1
            comp.push(step, v)
        if c is None and not pushed:
            return None
        if not self._live:
            if correct_name is None:
                return Assessment(level=0, evidence={"reason": "no correctness component among the rewards"})
            if self.correct.baseline.value is None or not any(t.track.ready for t in self.components.values()):
                return Assessment(warming_up=True)
            # A correctness component, its baseline and a tracked component's: none of these is ever undone.
            self._live = True
        if not self.episode.open and not self._worth_judging(step):
            return Assessment(0, {"components": "no component near a rise"})
        return self._judge(step)

    def _worth_judging(self, step: int) -> bool:
        """A first look at the latest values: is any component at least half-way to a rise, or long
        pinned at its ceiling while correctness sits near zero against it? Only then is it judged."""
        cw = self.correct.window.values
        c_now = abs(cw[-1]) if cw else 0.0
        for comp in self.components.values():
            if comp.length_named or not comp.track.window.values:
                continue
            if comp.since is not None and step - comp.since >= self.saturated_steps // 2 and c_now <= 0.4 * abs(comp.top):
                return True
            b = comp.track.base
            if b is None:
                continue
            v = comp.track.window.values[-1]
            need = max(self.noise_z * max(comp.track.baseline.spread or 0.0, 1e-6), self.rise * max(abs(b), abs(v)))
            if v - b >= 0.5 * need:
                return True
        return False

    def _judge(self, step: int) -> Assessment:
        # Levels over about ten steps: one logged point of a binary reward mean is too noisy.
        k = self.clock.points_for(10, self.clock.points())
        relax = 1.5 if self.episode.open else 1.0
        cb = self.correct.base or 0.0
        cr = self.correct.recent(k) or 0.0
        cn = max(self.correct.baseline.spread or 0.0, 0.02 * max(abs(cb), abs(cr)), 1e-6)
        ev: dict[str, Any] = {
            "correctness": {"metric": self.correctness.key, "recent": cr, "baseline": cb},
            "persist_points": self.persist_points,
        }
        best: tuple[float, str, float, float, float] | None = None
        for name, comp in self.components.items():
            track = comp.track
            if not track.baseline.ready or comp.length_named:
                continue
            b = track.baseline.value or 0.0
            r = track.window.recent_median(k) or 0.0
            need = max(self.noise_z * max(track.baseline.spread or 0.0, 1e-6), self.rise * max(abs(b), abs(r)))
            score = (r - b) / need
            if best is None or score > best[0]:
                best = (score, name, b, r, need)
        level = 0
        if best is not None:
            score, name, b, r, need = best
            ev["component"] = name
            ev[name] = {"recent": r, "baseline": b, "gain": r - b, "threshold": need}
            c_flat = c_falling = False
            climbing: list[str] = []
            if score >= 1.0 / relax:
                # The trend test only runs once a component has risen: healthy steps stay cheap.
                mk = mann_kendall(self.correct.window.last(24))
                mean_gain = self._mean_gain(ev["correctness"])
                c_flat = ((cr - cb) <= max(2 * cn, 0.1 * abs(cb)) * relax and mk.p_up > 0.1 / relax
                          and mean_gain < 2.0 * relax)
                c_falling = mk.p_down < 0.05 and cr < cb
                ev["correctness"].update(trend=mk.as_evidence(), flat_or_falling=c_flat or c_falling)
                climbing = self._climbing()
                if climbing:
                    ev["still_climbing"] = climbing
            if score >= 1.0 / relax and (c_flat or c_falling) and not (climbing and not c_falling):
                level = 1
                if self.episode.points >= self.persist_points and (
                        c_falling or step - (self.episode.since or step) >= self.saturated_steps):
                    # Critical once correctness has stayed put for a stretch after the climb ended.
                    level = 2
        onset = None
        if level == 0:
            level, onset = self._saturated(step, k, cr, ev)
        return Assessment(level=level, evidence=ev, onset_step=onset)

    def _mean_gain(self, ev: dict[str, Any]) -> float:
        """Correctness's latest mean over its first points' mean, in standard errors of the difference."""
        first, last = self.c_first, list(self.c_last)
        if len(first) < 4 or len(last) < 4:
            return 0.0
        m0, m1 = fmean(first), fmean(last)
        se = math.sqrt(variance(first) / len(first) + variance(last) / len(last))
        z = (m1 - m0) / se if se > 0 else (math.inf if m1 > m0 else 0.0)
        ev["mean"] = {"first": finite(m0), "recent": finite(m1), "z": finite(z)}
        return z

    def _climbing(self) -> list[str]:
        """Components still climbing over the last stretch (about 24 steps, at least 4 points): a significant
        up-trend that gained at least a quarter of the component's whole range over it (a plateau's last creep
        does not count)."""
        n = max(4, self.clock.points_for(24, 4))
        out = []
        for name, comp in self.components.items():
            pts = comp.track.window.last(n)
            if comp.length_named or len(pts) < 4 or comp.top is None or comp.low is None:
                continue
            third = max(1, len(pts) // 3)
            climb = median(pts[-third:]) - median(pts[:third])
            if climb >= 0.25 * (comp.top - comp.low) and climb > 0 and mann_kendall(pts).p_up < 0.05:
                out.append(name)
        return out

    def _saturated(self, step: int, k: int, cr: float, ev: dict[str, Any]) -> tuple[int, int | None]:
        """A shaping or format component pinned at its ceiling for ``saturated_steps`` while correctness
        stays near zero and does not trend up: the reward pays for everything but the task (level 1;
        level 2 over twice the stretch)."""
        best: tuple[int, str] | None = None
        for name, comp in self.components.items():
            since = comp.since
            if since is None or comp.length_named or step - since < self.saturated_steps:
                continue
            if best is None or since < best[0]:
                best = (since, name)
        if best is None:
            return 0, None
        since, name = best
        comp = self.components[name]
        recent = comp.track.window.recent_median(k) or 0.0
        history = self.correct.window.last(32)
        if len(history) < 8:
            return 0, None
        peak = max(map(abs, history))
        relax = 2.0 if self.episode.open else 1.0
        near_zero = abs(cr) <= 0.05 * relax * abs(recent) and peak <= 0.2 * relax * abs(recent)
        ev["component"] = name
        ev["pattern"] = "saturated"
        ev[name] = {"recent": recent, "ceiling": comp.top, "since_step": since}
        mk = mann_kendall(history[-24:])
        ev["correctness"].update(trend=mk.as_evidence(), window_max=peak, near_zero=near_zero)
        if not near_zero or mk.p_up <= 0.05 / (5 * relax - 4):
            return 0, None
        return (2 if step - since >= 2 * self.saturated_steps else 1), since

    def _message(self, severity: str, evidence: Mapping[str, Any]) -> str:
        name = evidence.get("component", "a component")
        info = evidence.get(name, {}) if isinstance(evidence.get(name), Mapping) else {}
        corr = evidence.get("correctness", {})
        if evidence.get("pattern") == "saturated":
            return (
                f"Reward component {name} has sat at its ceiling ({info.get('recent')}) since step {info.get('since_step')} "
                f"while {corr.get('metric')} stays near zero ({corr.get('recent')}): the reward pays for everything but the "
                "task. Inspect the reward function on 50-100 sampled outputs, and check the task is within the model's "
                "reach (easier prompts, partial credit) before tuning anything."
            )
        return (
            f"Reward component {name} rose from {info.get('baseline')} to {info.get('recent')} while {corr.get('metric')} "
            f"stayed at {corr.get('recent')} (baseline {corr.get('baseline')}). Inspect the reward function on 50-100 "
            "sampled outputs before tuning anything: the model may be optimising the wrong objective."
        )


class _Component:
    """One tracked reward component: its level, its running maximum, and since when it sits at its ceiling
    (the median of its last five points at least ``_CEILING`` of that maximum)."""

    def __init__(self, length_named: bool) -> None:
        self.track = LevelTrack(window=48, half=3, tol=10.0, positive=False, min_span=20)
        self.length_named = length_named
        self.top: float | None = None
        self.low: float | None = None
        self.since: int | None = None  # first step of the current stretch at the ceiling

    def push(self, step: int, v: float) -> None:
        self.track.push(step, v)
        if self.top is None or v > self.top:
            self.top = v
        if self.low is None or v < self.low:
            self.low = v
        level = self.track.recent(5)
        if self.top > 0 and level is not None and level >= _CEILING * self.top:
            if self.since is None:
                self.since = step
        else:
            self.since = None


