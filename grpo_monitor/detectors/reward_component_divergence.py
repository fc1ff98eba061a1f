"""Reward components diverging: one component (say format) saturates while correctness does not move.

A format reward climbing to its ceiling while correctness stays flat or falls means the reward
function or the prompt format is wrong (TRL issue 5298, open-r1 407). The advice is to inspect the
reward function on sampled outputs before tuning anything (recipe step 8); no variant fixes it.
Components named after length are left to the length-reward coupling detector.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from grpo_monitor.detectors.base import Metrics, RunContext, Sample, slow_finite  # noqa: F401  (RunContext: doctest)
from grpo_monitor.detectors.episode import NOTHING, Assessment, EpisodeDetector, check_float, check_int
from grpo_monitor.detectors.signals import (
    CorrectnessSource,
    LevelTrack,
    is_length_name,
    resolve_correctness,
    reward_names_in,
)
from grpo_monitor.detectors.stats import fin, mann_kendall


# A component's recent level at this share of its running maximum counts as at its ceiling.
_CEILING = 0.9


class RewardComponentDivergence(EpisodeDetector):
    """A non-correctness reward component rising far above its baseline while correctness is flat or falling.

    Parameters: ``rise`` (gain of the component, relative to its level, that counts as a large
    rise), ``noise_z`` (the gain must also exceed this many baseline noise sigmas),
    ``persist_points``/``persist_steps`` (the pattern must hold for this many logged points and
    training steps in a row), ``max_components`` (components tracked at most), ``saturated_steps``
    (training steps a shaping or format component must sit at its ceiling, with correctness near zero
    and not trending up, to count without a rise: a reward saturated from the start never rises).

    >>> det = RewardComponentDivergence()
    >>> det.start(RunContext(correctness_reward="correct"))
    >>> found = []
    >>> for step in range(1, 121):
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

    def __init__(self, rise: float = 0.3, noise_z: float = 4.0, persist_points: int = 2, persist_steps: int = 10,
                 max_components: int = 16, saturated_steps: int = 50) -> None:
        self.rise = check_float("rise", rise, 0.0, 100.0, low_open=True)
        self.noise_z = check_float("noise_z", noise_z, 0.0, 1e6)
        self.persist_points = check_int("persist_points", persist_points, 1)
        self.persist_steps = check_int("persist_steps", persist_steps, 0)
        self.max_components = check_int("max_components", max_components, 1)
        self.saturated_steps = check_int("saturated_steps", saturated_steps, 1)
        super().__init__()

    def _reset_state(self) -> None:
        self.correctness = CorrectnessSource(self.context)
        self.correct = LevelTrack(window=32, half=3, tol=10.0, positive=False, min_span=20)
        self.components: dict[str, LevelTrack] = {}
        self._nkeys = -1
        self._age = 0  # steps assessed, for the rescan now and then
        # [name, metric key, its _Component once tracked] of the components besides correctness.
        self._names: list[list[Any]] = []
        self._names_for: str | None = None
        self._comps: dict[str, _Component] = {}
        self._length_named: set[str] = set()
        self._quiet = {"components": "no component near a rise"}
        self._quiet_t = (dict, self._quiet)
        self._any_ready = False
        self.confirm_points, self.confirm_steps = self.persist_points, self.persist_steps
        # A component pinned at its ceiling from the start never "rises": its running maximum and
        # the first step of its current stretch at that ceiling.
        self._max: dict[str, float] = {}
        self._sat_since: dict[str, int] = {}
        self._half_floor: dict[str, float] = {}
        self._half_saturated = self.saturated_steps // 2
        self._live = False
        self._c_steps = self.correct.window.steps
        self._c_values = self.correct.window.values

    def _assess(self, step: int, metrics: Metrics, samples: Sequence[Sample]) -> Assessment | None:
        return RewardComponentDivergence._step(self, step, metrics, samples, False)  # type: ignore[no-any-return]

    def _step(self, step: int, metrics: Metrics, samples: Sequence[Sample] | None, book: bool = True) -> Any:
        # One body for the assessment (``book`` False: ``_assess``, which subclasses build on) and the
        # whole step (True: booked as ``EpisodeDetector._step`` would, in one call, for the engine,
        # ``update`` and replays): this runs at every step of the run.
        # Runs every step: metric reads, window pushes and the ceiling test are written out in place.
        source = self.correctness
        if source.fixed:
            c = metrics.get(source.key)
            if c.__class__ is not float or c - c != 0.0:  # not a finite plain float: the careful way
                c = slow_finite(c)
        else:
            c = source.value(metrics)
        correct = self.correct
        live = self._live
        if c is not None:
            if live:  # past the warm-up: ``LevelTrack.push`` with the baseline set
                self._c_steps.append(step)
                self._c_values.append(c)
            elif correct.baseline.value is None:
                correct.push(step, c)
            else:
                w = correct.window
                w.steps.append(step)
                w.values.append(c)
        # Rescan the keys for components only when their number changes (or now and then).
        correct_name = source.name
        self._age = age = self._age + 1
        if len(metrics) != self._nkeys or age % 64 == 0 or correct_name != self._names_for:
            self._nkeys = len(metrics)
            self._names_for = correct_name
            self._names = [[n, f"rewards/{n}/mean", self._comps.get(n)]
                           for n in reward_names_in(metrics.keys()) if n != correct_name]
        steps = self.clock._steps
        last = steps[-1] if steps else 0
        half = self._half_saturated
        pushed = 0
        worth = False
        mget = metrics.get
        for entry in self._names:
            v = mget(entry[1])
            if v.__class__ is not float or v - v != 0.0:
                v = slow_finite(v)
                if v is None:
                    continue
            comp = entry[2]
            if comp is None:
                comp = entry[2] = self._comps.get(entry[0]) or self._new_component(entry[0])
                if comp is None:
                    continue
            pushed += 1
            track = comp.track
            values = comp.values
            if comp.base is None:
                track.push(step, v)
                if track.baseline.value is not None:
                    comp.settled(self.rise)
            else:  # ``LevelTrack.push`` once the baseline is set
                comp.steps.append(step)
                values.append(v)
            # At the ceiling: the median of the last five points at least 0.9 of the running maximum,
            # that is at least three of those five there (the median of five is one of them), counted
            # as points enter and leave while the maximum holds.
            n = len(values)
            top = comp.top
            if top is None or v > top:
                top = comp.top = self._max[comp.name] = v
                line = comp.line = _CEILING * top
                at_line = comp.at_line = sum(1 for i in range(max(0, n - 5), n) if values[i] >= line)
            elif n > 5:
                line = comp.line
                at_line = comp.at_line = comp.at_line + (v >= line) - (values[-6] >= line)
            else:
                line = comp.line
                at_line = comp.at_line = sum(1 for x in values if x >= line)
            if top > 0:
                if n >= 5:
                    at = at_line >= 3
                else:
                    level = comp.window.recent_median(5)
                    at = level is not None and level >= line
            else:
                at = False
            since = comp.since
            if at:
                if since is None:
                    since = comp.since = self._sat_since[comp.name] = step
            elif since is not None:
                since = comp.since = None
                del self._sat_since[comp.name]
            # ``_worth_judging`` for this component, while its latest value is at hand.
            if not worth and not comp.length_named:
                if since is not None and last - since >= half and (
                        (abs(self._c_values[-1]) if self._c_values else 0.0) <= 0.4 * abs(top)):
                    worth = True
                else:
                    b = comp.base
                    if b is not None and v - b >= comp.half_floor:
                        need = max(comp.noise, self.rise * max(abs(b), abs(v)))
                        worth = v - b >= 0.5 * need
        if c is None and not pushed:
            return NOTHING if book else None
        if not live:
            if correct_name is None:
                a = Assessment(level=0, evidence={"reason": "no correctness component among the rewards"})
                return self._conclude(step, a) if book else a
            if not self._any_ready:
                self._any_ready = any(t.ready for t in self.components.values())
            if correct.baseline.value is None or not self._any_ready:
                a = Assessment(warming_up=True)
                return self._conclude(step, a) if book else a
            # A correctness component, its baseline and a tracked component's: none of these is ever undone.
            self._live = True
        if not self.in_episode:
            if pushed < len(self.components):  # a component absent this step: its latest value counts too
                worth = self._worth_judging()
            if not worth:
                a = self._quiet_t
                if not book:
                    return a
                if not self._pending and self.state == "ok":  # outside any episode here
                    self._evidence = a
                    return NOTHING
                return self._conclude(step, a)
        a = self._judge(step)
        return self._conclude(step, a) if book else a

    def _new_component(self, name: str) -> _Component | None:
        if len(self.components) >= self.max_components:
            return None
        track = self.components[name] = LevelTrack(window=16, half=3, tol=10.0, positive=False, min_span=20)
        length_named = is_length_name(name)
        if length_named:
            self._length_named.add(name)
        comp = self._comps[name] = _Component(name, track, length_named, self.noise_z)
        return comp

    def _worth_judging(self) -> bool:
        """A cheap pre-check on the latest values: is any component at least half-way to a rise,
        or long pinned at its ceiling?"""
        if self._sat_since:
            steps = self.clock._steps
            last = steps[-1] if steps else 0
            cw = self.correct.window.values
            c_now = abs(cw[-1]) if cw else 0.0
            half = self.saturated_steps // 2
            length_named = self._length_named
            for n, s in self._sat_since.items():
                if last - s < half or n in length_named:
                    continue
                # _saturated needs correctness near zero against the component (its window peak at most
                # 0.4 of the component's recent level, which is at most its running maximum): the latest
                # correctness value alone rules most steps out, without the trend test.
                if c_now <= 0.4 * abs(self._max.get(n, 0.0)):
                    return True
        floors = self._half_floor
        for name, track in self.components.items():
            b = track.baseline.value
            if b is None:
                continue
            values = track.window.values
            if not values:
                continue
            half_floor = floors.get(name)
            if half_floor is None:
                if name in self._length_named:
                    continue
                # Half the noise part of the threshold, fixed once the baseline is: a gain below it
                # is below half of any threshold, so most steps end here.
                half_floor = floors[name] = 0.5 * (self.noise_z * max(track.baseline.spread or 0.0, 1e-6))
            v = values[-1]
            if v - b < half_floor:
                continue
            need = max(self.noise_z * max(track.baseline.spread or 0.0, 1e-6), self.rise * max(abs(b), abs(v)))
            if v - b >= 0.5 * need:
                return True
        return False

    def _judge(self, step: int) -> Assessment:
        # Levels over about ten steps: one logged point of a binary reward mean is too noisy.
        k = self.clock.points_for(10, self.clock.points())
        relax = 1.5 if self.in_episode else 1.0
        cb = self.correct.base or 0.0
        cr = self.correct.recent(k) or 0.0
        cn = max(self.correct.baseline.spread or 0.0, 0.02 * max(abs(cb), abs(cr)), 1e-6)
        ev: dict[str, Any] = {
            "correctness": {"metric": self.correctness.key, "recent": fin(cr), "baseline": fin(cb)},
            "persist_points": self.confirm_points,
        }
        best: tuple[float, str, float, float, float] | None = None
        for name, track in self.components.items():
            if not track.baseline.ready or name in self._length_named:
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
            ev[name] = {"recent": fin(r), "baseline": fin(b), "gain": fin(r - b), "threshold": fin(need)}
            c_flat = c_falling = False
            if score >= 1.0 / relax:
                # The trend test only runs once a component has risen: healthy steps stay cheap.
                mk = mann_kendall(self.correct.window.last(24))
                c_flat = (cr - cb) <= max(2 * cn, 0.1 * abs(cb)) * relax and mk.p_up > 0.1 / relax
                c_falling = mk.p_down < 0.05 and cr < cb
                ev["correctness"].update(trend=mk.as_evidence(), flat_or_falling=c_flat or c_falling)
            if score >= 1.0 / relax and (c_flat or c_falling):
                level = 1
                recent = self.components[name].window.last(6)
                saturated = len(recent) >= 4 and mann_kendall(recent).p_up > 0.05
                ev["component_saturated"] = saturated
                if self.episode_len >= self.confirm_points or (c_falling and self.episode_len >= 1):
                    level = 2
        onset = None
        if level == 0:
            level, onset, trend = self._saturated(step, k, cr, ev)
            if trend is not None:
                # Healthy: the correctness trend is evidence only, tested when someone reads it.
                return Assessment(level=0, evidence=(_with_trend, ev, *trend))
        return Assessment(level=level, evidence=ev, onset_step=onset)

    def _saturated(self, step: int, k: int, cr: float, ev: dict[str, Any]) -> tuple[int, int | None, tuple[Any, ...] | None]:
        """A shaping or format component pinned at its ceiling for ``saturated_steps`` while
        correctness stays near zero and does not trend up: the reward pays for everything but the
        task (level 1; level 2 over twice the stretch). When correctness is not near zero, the
        trend test is left to whoever reads the evidence: the third item is what it needs."""
        best: tuple[int, str] | None = None
        for name, since in self._sat_since.items():
            if name in self._length_named or step - since < self.saturated_steps:
                continue
            if best is None or since < best[0]:
                best = (since, name)
        if best is None:
            return 0, None, None
        since, name = best
        track = self.components[name]
        top = self._max.get(name, 0.0)
        recent = track.window.recent_median(k) or 0.0
        history = self.correct.window.last(32)
        if len(history) < 8:
            return 0, None, None
        peak = max(map(abs, history))
        relax = 2.0 if self.in_episode else 1.0
        near_zero = abs(cr) <= 0.05 * relax * abs(recent) and peak <= 0.2 * relax * abs(recent)
        ev["component"] = name
        ev["pattern"] = "saturated"
        ev[name] = {"recent": fin(recent), "ceiling": fin(top), "since_step": since}
        if not near_zero:
            return 0, None, (history[-24:], fin(peak), near_zero)
        mk = mann_kendall(history[-24:])
        ev["correctness"].update(trend=mk.as_evidence(), window_max=fin(peak), near_zero=near_zero)
        if mk.p_up <= 0.05 / (5 * relax - 4):
            return 0, None, None
        return (2 if step - since >= 2 * self.saturated_steps else 1), since, None

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
    """One tracked component's per-step state, kept beside its ``LevelTrack`` so that the step
    reads attributes, not dictionaries."""

    __slots__ = ("at_line", "base", "half_floor", "length_named", "line", "name", "noise", "noise_z", "since", "steps",
                 "top", "track", "values", "window")

    def __init__(self, name: str, track: LevelTrack, length_named: bool, noise_z: float) -> None:
        self.name = name
        self.track = track
        self.window = track.window
        self.steps = track.window.steps
        self.values = track.window.values
        self.length_named = length_named
        self.noise_z = noise_z
        self.base: float | None = None
        self.noise = 0.0
        self.half_floor = 0.0
        self.top: float | None = None
        self.line = 0.0
        self.at_line = 0  # of the last five points, those at or above ``line``
        self.since: int | None = None  # first step of the current stretch at the ceiling

    def settled(self, rise: float) -> None:
        """The baseline froze: keep it, the noise part of the rise threshold, and half the least
        threshold any later value can meet (the one of a value no larger than the baseline): a gain
        below that is below half of every threshold, so most steps need no more."""
        baseline = self.track.baseline
        b = self.base = baseline.value
        self.noise = self.noise_z * max(baseline.spread or 0.0, 1e-6)
        self.half_floor = 0.5 * max(self.noise, rise * abs(b or 0.0))


def _with_trend(ev: dict[str, Any], history: list[float], peak: float | None, near_zero: bool) -> dict[str, Any]:
    """The saturation evidence completed with the correctness trend, tested now."""
    ev["correctness"].update(trend=mann_kendall(history).as_evidence(), window_max=peak, near_zero=near_zero)
    return ev
