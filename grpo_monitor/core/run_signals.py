"""What the whole run shows so far, for the diagnosis to check a finding's cause against.

A detector watches its own failure. The diagnosis (``core.diagnosis``) asks questions across them: is the
correctness at the ceiling this run has shown, has the entropy fallen against its early level, did the
learning rate jump just before the reward fell, does any reward component carry the learning, does the run
use an inference engine. ``RunSignals`` follows each logged step and answers them from bounded state: per
series an early level, a recent window, the best level a recent window reached, and a history thinned by
halving (so a trend test spans the whole run at a bounded cost).

>>> sig = RunSignals()
>>> for s in range(1, 61):
...     sig.observe(s, {"reward": min(1.0, 0.02 * s), "entropy": 0.5 if s < 30 else 0.01, "learning_rate": 1e-5})
>>> sig.series["reward"].at_ceiling(), round(sig.entropy_ratio(), 3), sig.improving("reward")
(True, 0.02, True)
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from grpo_monitor.detectors.base import RunContext
from grpo_monitor.detectors.no_learning_signal import NEAR_GREEDY
from grpo_monitor.detectors.numbers import finite
from grpo_monitor.detectors.signals import CorrectnessSource, is_length_name, reward_names_in, reward_roles
from grpo_monitor.detectors.stats import Thinned, mad_sigma, mann_kendall, median

# Names of format checks (tags, templates, the validity of structured output): a component that says so is
# never the task's signal.
_FORMAT_WORDS = ("format", "xml", "tag", "think", "strict", "soft", "struct", "schema", "json", "fmt")
# A point whose value is this many times the median of the next ones is an extreme start (a loss of 1,083
# before the model settles): it is left out of the early level.
EXTREME = 100.0


class Series:
    """One metric's levels: ``early`` (median of its first ``early_points`` points, an extreme first point left
    out), ``recent`` (median of the last ``window``), ``best`` (the highest recent median so far: the ceiling the
    run has shown) and a thinned history for trend tests."""

    __slots__ = ("best", "best_step", "early_vals", "early_points", "lowest", "max", "min", "recent_vals", "seen",
                 "thinned", "window")

    def __init__(self, window: int = 8, early_points: int = 8, history: int = 128) -> None:
        self.window = window
        self.early_points = early_points
        self.recent_vals: deque[float] = deque(maxlen=window)
        self.early_vals: list[float] = []
        self.best: float | None = None
        self.best_step: int | None = None
        self.lowest: float | None = None
        self.thinned = Thinned(history)
        self.seen = 0
        # Every value's extremes, however brief (a sparse reward that paid once in the middle of the run has moved).
        self.min: float | None = None
        self.max: float | None = None

    def push(self, step: int, v: float) -> None:
        self.recent_vals.append(v)
        self.min = v if self.min is None or v < self.min else self.min
        self.max = v if self.max is None or v > self.max else self.max
        if len(self.early_vals) < self.early_points + 1:
            self.early_vals.append(v)
        self.seen += 1
        self.thinned.push(step, v)
        if len(self.recent_vals) >= min(self.window, 3):
            m = median(list(self.recent_vals))
            if self.best is None or m > self.best:
                self.best, self.best_step = m, step
            if self.lowest is None or m < self.lowest:
                self.lowest = m

    @property
    def history(self) -> list[float]:
        return self.thinned.values

    @property
    def history_steps(self) -> list[int]:
        return self.thinned.steps

    @property
    def early(self) -> float | None:
        vals = self.early_vals
        if len(vals) < 3:
            return None
        rest = vals[1:]
        ref = abs(median(rest))
        # A broken first point (a loss or entropy far from everything after it) is not the run's early level.
        if ref > 0 and abs(vals[0]) > EXTREME * ref:
            return median(rest[: self.early_points])
        return median(vals[: self.early_points])

    @property
    def recent(self) -> float | None:
        return median(list(self.recent_vals)) if len(self.recent_vals) >= min(self.window, 3) else None

    def first_level(self, k: int = 3) -> float | None:
        """The median of the first ``k`` points: where the series stood when the run began (a fall that happens
        within the early window would sink the early median into it)."""
        vals = self.early_vals[:k]
        return median(vals) if len(vals) >= k else None

    def latest(self, k: int = 3) -> float | None:
        """The median of the last ``k`` points: where the series stands now (a coarse log's recent window spans long)."""
        vals = list(self.recent_vals)[-k:]
        return median(vals) if vals else None

    @property
    def spread(self) -> float:
        """The series' noise: the MAD-sigma of its early and recent points, whichever is larger."""
        out = 0.0
        for vals in (self.early_vals[1:], list(self.recent_vals)):
            if len(vals) >= 3:
                out = max(out, mad_sigma(vals))
        return out

    def at_ceiling(self, rel: float = 0.05) -> bool:
        """The recent level at the best level a recent window reached, within its noise (or ``rel`` of its range)."""
        now, best = self.recent, self.best
        if now is None or best is None:
            return False
        span = max(abs(best - (self.lowest if self.lowest is not None else best)), abs(best), 1e-12)
        return best - now <= max(2.0 * self.spread, rel * span)

    def rising(self) -> bool:
        """Clearly higher now than early in the run: the latest points' median above the early points' median by
        three times the point-to-point noise (the MAD of first differences, which a trend does not inflate), with
        the run's history trending up (Mann-Kendall with the autocorrelation correction, p < 0.05)."""
        return self._moved(up=True)

    def falling(self) -> bool:
        """Clearly lower now than early in the run, by the same test as ``rising``."""
        return self._moved(up=False)

    def _moved(self, up: bool) -> bool:
        hist = self.history
        if len(hist) < 8:
            return False
        k = max(3, len(hist) // 4)
        early, late = median(hist[:k]), median(hist[-k:])
        diffs = [b - a for a, b in zip(hist, hist[1:])]
        noise = mad_sigma(diffs) / math.sqrt(2.0) if diffs else 0.0
        effect = (late - early) if up else (early - late)
        if effect <= max(3.0 * noise / math.sqrt(k), 1e-9) or effect <= 0.5 * noise:
            return False
        mk = mann_kendall(hist)
        return (mk.p_up if up else mk.p_down) < 0.05


def _is_format(name: str) -> bool:
    low = name.lower()
    return any(w in low for w in _FORMAT_WORDS)


class RunSignals:
    """The run's own record of the signals a diagnosis checks causes against; ``observe`` once per logged step."""

    TRACKED = ("reward", "entropy", "completions/clipped_ratio", "completions/mean_length", "grad_norm", "kl", "loss")

    def __init__(self, context: RunContext | None = None) -> None:
        self.context = context or RunContext()
        self.series: dict[str, Series] = {k: Series() for k in self.TRACKED}
        self.components: dict[str, Series] = {}
        self.correctness = CorrectnessSource(self.context)
        self.correct = Series()
        self.zero_share: deque[tuple[int, float]] = deque(maxlen=64)
        self.first_step: int | None = None
        self.last_step: int | None = None
        self.points = 0
        # Learning-rate and gradient-norm jumps: (step, factor, the learning rate before the jump).
        self.lr_prev: float | None = None
        self.lr_jumps: list[tuple[int, float, float | None]] = []
        self.lr_healthy: float | None = None  # the learning rate of the last point before a jump
        self.grad_jumps: list[tuple[int, float]] = []
        self.engine = bool((self.context.config or {}).get("use_vllm"))
        self._names = -1
        self._component_keys: list[tuple[str, str]] = []

    # -- following the run -------------------------------------------------------------------------

    def observe(self, step: int, metrics: Mapping[str, Any]) -> None:
        self.points += 1
        if self.first_step is None:
            self.first_step = step
        self.last_step = step
        for key, series in self.series.items():
            v = finite(metrics.get(key))
            if v is not None:
                if key == "grad_norm":
                    self._grad(step, v, series)
                series.push(step, v)
        if len(metrics) != self._names:
            self._names = len(metrics)
            self._component_keys = [(n, f"rewards/{n}/mean") for n in reward_names_in(metrics)]
            if not self.engine and any(isinstance(k, str) and k.startswith(("sampling/", "mismatch/")) for k in metrics):
                self.engine = True
        for name, key in self._component_keys:
            v = finite(metrics.get(key))
            if v is not None:
                self.components.setdefault(name, Series()).push(step, v)
        c = self.correctness.value(metrics)
        if c is not None and self.correctness.name is not None:
            self.correct.push(step, c)
        self._zero(step, metrics)
        self._lr(step, finite(metrics.get("learning_rate")))

    def _zero(self, step: int, metrics: Mapping[str, Any]) -> None:
        fz = finite(metrics.get("frac_reward_zero_std"))
        if fz is None:
            rs = finite(metrics.get("reward_std"))
            if rs is None:
                return
            # Without the share: a batch whose rewards have no spread at all has every group alike; one with
            # spread says nothing about how many groups had none (counted as having signal).
            fz = 1.0 if rs <= 1e-6 else 0.0
        self.zero_share.append((step, fz))

    def _lr(self, step: int, lr: float | None) -> None:
        if lr is None or lr <= 0:
            return
        prev = self.lr_prev
        if prev is not None and lr >= 5.0 * prev:
            self.lr_jumps.append((step, lr / prev, prev))
            self.lr_healthy = prev
        self.lr_prev = lr

    def _grad(self, step: int, g: float, series: Series) -> None:
        vals = list(series.recent_vals)
        if len(vals) >= 4:
            ref = median(vals)
            if ref > 0 and g >= 10.0 * ref:
                self.grad_jumps.append((step, g / ref))
                del self.grad_jumps[:-8]

    # -- questions ---------------------------------------------------------------------------------

    @property
    def correct_key(self) -> str | None:
        """The correctness metric (a correctness reward component, or the monitor's ``samples/correct_frac``)."""
        return self.correctness.key if self.correctness.name is not None and self.correct.seen else None

    def task(self) -> tuple[str, Series] | None:
        """The task's own signal: correctness where the run has one, else the total reward."""
        if self.correct_key is not None:
            return self.correct_key, self.correct
        if self.series["reward"].seen:
            return "reward", self.series["reward"]
        return None

    def improving(self, key: str) -> bool:
        """The series ``key`` (``reward``, a ``rewards/<f>/mean`` component or the correctness) rising over the run."""
        s = self._series(key)
        return s is not None and s.rising()

    def _series(self, key: str) -> Series | None:
        if key in self.series:
            return self.series[key]
        if key == self.correct_key:
            return self.correct
        if key.startswith("rewards/") and key.endswith("/mean"):
            return self.components.get(key[len("rewards/"):-len("/mean")])
        return None

    def carriers(self, besides: Sequence[str] = (), lengths: bool = False) -> list[str]:
        """The reward components that rise over the run (other than ``besides``), format checks and (unless
        ``lengths``) length shaping left out: those carrying the learning."""
        _, fmt = reward_roles(self.components)
        fmt = self.context.format_reward or fmt
        if self.correct_key is not None and self.correct.falling():
            return []  # a component rising while the correctness falls is not the task being learned
        return [n for n, s in self.components.items()
                if n not in besides and n != fmt and not _is_format(n) and (lengths or not is_length_name(n)) and s.rising()]

    def varying_components(self) -> list[str]:
        """The reward components whose logged mean has moved at all."""
        return [n for n, s in self.components.items()
                if s.max is not None and s.min is not None and s.max - s.min > 1e-9 * max(1.0, abs(s.early_vals[0]))]

    def zero_variance_share(self, points: int = 16) -> float | None:
        """The mean share of groups without reward spread over the last ``points`` logged points."""
        if not self.zero_share:
            return None
        vals = [v for _, v in list(self.zero_share)[-points:]]
        return sum(vals) / len(vals)

    def entropy_ratio(self) -> float | None:
        """The entropy's latest level over the level of its first points (None where the run logs no entropy)."""
        e = self.series["entropy"]
        early, now = e.first_level(), e.latest()
        if early is None or now is None or early <= 0 or len(e.recent_vals) < 3:
            return None
        return now / early

    def grew_into_cap(self) -> bool:
        """Every completion cut at the cap now, after the run had completions that finished: the outputs grew
        into the cap (a cap every completion hit from the first step is a cap too short, not growth)."""
        c = self.series["completions/clipped_ratio"]
        now, low = c.recent, c.lowest
        return now is not None and low is not None and now >= 0.9 and low <= 0.7

    def fell_at_start(self) -> dict[str, Any] | None:
        """The reward (or the correctness) fell from its first logged level within the first few updates and never
        came back: the first updates broke the policy. ``{"metric", "first", "now", "by_step"}``, else None."""
        first = [v for _, v in list(self.zero_share)[:3]]
        if not first or min(first) > 0.9:
            return None  # every group alike at the first points already: there was no working signal to break
        now_alike = self.zero_variance_share(points=4)
        if now_alike is None or now_alike < 0.8:
            return None  # a broken policy scores every completion of a group alike; a noisy first point does not
        keys = ["reward"] + ([self.correct_key] if self.correct_key else [])
        for key in keys:
            s = self._series(key)
            if s is None or len(s.early_vals) < 4 or s.recent is None:
                continue
            first, now = s.early_vals[0], s.recent
            # Down by the second to fourth points, at the level it holds now, and never back near where it began
            # (a sparse reward's lucky first point comes back; a broken policy's does not).
            soon = median(s.early_vals[1:4])
            drop = max(2.0 * s.spread, 0.25 * abs(first), 1e-6)
            later = s.history[4:] if len(s.history) > 4 else s.early_vals[4:]
            if (first - now > drop and first - soon > drop and abs(soon - now) <= max(2.0 * s.spread, 0.5 * (first - now))
                    and (not later or max(later) < first - 0.5 * drop)):
                return {"metric": key, "first": first, "now": now,
                        "by_step": s.history_steps[min(3, len(s.history_steps) - 1)] if s.history_steps else None}
        return None

    def fell_right_away(self, at: int, within: int = 10) -> dict[str, Any] | None:
        """The reward (or the correctness) well below its first logged level at step ``at``, itself within ``within``
        steps of the run's first: the policy broke before any healthy baseline formed (the groups may not be all
        alike yet). ``{"metric", "first", "now", "by_step", "stayed": False}``, else None."""
        if self.first_step is None or at - self.first_step > within:
            return None
        for key in ["reward"] + ([self.correct_key] if self.correct_key else []):
            s = self._series(key)
            if s is None or len(s.early_vals) < 4:
                continue
            # No noise estimate yet (the early points hold the fall itself): lost half its first level, the median of
            # the latest three points against that of the first three.
            first, now = s.first_level(), s.latest()
            if now is not None and first is not None and first > 0 and now < 0.5 * first:
                return {"metric": key, "first": first, "now": now, "by_step": at, "stayed": False}
        return None

    def all_at_zero_after_paying(self) -> bool:
        """Every reward component pays nothing now and every group scores alike, though the reward paid at the first
        logged point: the policy, not one function, stopped earning (a function reading a missing column leaves the
        others paying)."""
        r = self.series["reward"]
        if not r.early_vals or r.early_vals[0] <= 1e-9 or not self.components:
            return False
        alike = self.zero_variance_share(points=4)
        return (alike is not None and alike >= 0.8 and (r.latest() or 0.0) <= 1e-9
                and all((c.latest() or 0.0) <= 1e-9 for c in self.components.values()))

    def fell(self, key: str = "reward") -> bool:
        """The series fell clearly below the best level it reached (by a quarter of that level, and its noise)."""
        s = self._series(key)
        if s is None or s.best is None or s.recent is None:
            return False
        return s.best - s.recent > max(2.0 * s.spread, 0.25 * abs(s.best), 1e-6)

    def capped_from_start(self) -> bool:
        """Nearly every completion cut at the cap from the first logged point on: a cap too short for the task."""
        c = self.series["completions/clipped_ratio"]
        return c.lowest is not None and c.lowest >= 0.9 and min(c.early_vals or [0.0]) >= 0.9

    def extreme_start(self) -> dict[str, dict[str, float]]:
        """The metrics whose first logged value is ``EXTREME`` times the median of the next ones or more (a loss of
        1,083, a grad norm of 421,404 before the run settles): ``{metric: {"first", "then"}}``."""
        out = {}
        for key in ("grad_norm", "kl", "loss"):
            vals = self.series[key].early_vals
            if len(vals) >= 4:
                then = abs(median(vals[1:]))
                if then > 0 and abs(vals[0]) > EXTREME * then:
                    out[key] = {"first": vals[0], "then": then}
        return out

    def entropy_low_from_start(self) -> bool:
        """The entropy was all but greedy at the first logged points already (``NEAR_GREEDY`` nats a token or less,
        the top token's probability about 0.99): it had no room to fall (a cold sampler, a model made deterministic
        before GRPO), so a low entropy later is not a collapse."""
        e = self.series["entropy"]
        if len(e.early_vals) < 3:
            return False
        return median(e.early_vals[:3]) <= NEAR_GREEDY

    def grew(self, key: str = "completions/mean_length", factor: float = 2.0) -> bool:
        """The series' recent level at least ``factor`` times its early one, and rising over the run."""
        s = self._series(key)
        if s is None or s.early is None or s.recent is None or s.early <= 0:
            return False
        return s.recent >= factor * s.early and s.rising()

    def jump_before(self, step: int, within: int) -> dict[str, Any] | None:
        """A learning-rate jump (x5 or more between logged points) or a gradient-norm jump (x10 its trailing
        median) at most ``within`` steps before ``step`` (or at it)."""
        for s, factor, before in reversed(self.lr_jumps):
            if step - within <= s <= step:
                return {"what": "learning_rate", "step": s, "factor": round(factor, 1), "learning_rate_before": before}
        for s, factor in reversed(self.grad_jumps):
            if step - within <= s <= step:
                return {"what": "grad_norm", "step": s, "factor": round(factor, 1)}
        return None

    def steps_per_point(self) -> int:
        if self.first_step is None or self.last_step is None or self.points < 2:
            return max(1, int(self.context.logging_steps or 1))
        return max(1, round((self.last_step - self.first_step) / (self.points - 1)))


def is_format_name(name: str) -> bool:
    """A reward component named for a format check (tags, a template, structured output)."""
    return _is_format(name)


def finite_or_none(v: Any) -> float | None:
    x = finite(v)
    return None if x is None or math.isnan(x) else x
