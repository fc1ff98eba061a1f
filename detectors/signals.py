"""Reading the signals detectors share: metric values, the correctness series, tracked levels.

>>> resolve_correctness(RunContext(), ["reward", "rewards/format_reward/mean", "rewards/accuracy_reward/mean"])
('rewards/accuracy_reward/mean', 'accuracy_reward')
>>> resolve_correctness(RunContext(correctness_reward="exact"), [])
('rewards/exact/mean', 'exact')
>>> resolve_correctness(RunContext(), ["reward"])
('reward', None)
"""

from __future__ import annotations

import math
import re
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from detectors.base import RunContext, finite
from detectors.stats import SettledBaseline, Window, log_ratio, mad_sigma, median

_CORRECT_HINT = re.compile(r"correct|accura|(^|[^a-z])acc([^a-z]|$)|exact|match", re.IGNORECASE)
_FORMAT_HINT = re.compile(r"format|xml|tag|schema|struct", re.IGNORECASE)
_LENGTH_HINT = re.compile(r"len|overlong|long|short|token", re.IGNORECASE)


def get(metrics: Mapping[str, Any], key: str) -> float | None:
    """A finite value of one metric, or None (missing key, gap, NaN or inf)."""
    v = metrics.get(key)
    if type(v) is float:  # the common case, checked without a call
        return v if -math.inf < v < math.inf else None
    return finite(v)


def component_key(name: str) -> str:
    return f"rewards/{name}/mean"


def reward_names_in(keys: Iterable[str]) -> list[str]:
    out = []
    for k in keys:
        if isinstance(k, str) and k.startswith("rewards/") and k.endswith("/mean"):
            name = k[len("rewards/"):-len("/mean")]
            if name and "/" not in name:
                out.append(name)
    return out


def resolve_correctness(context: RunContext, keys: Iterable[str]) -> tuple[str, str | None]:
    """The metric that measures correctness: the declared correctness reward, else a reward
    component whose name says so (``correct``, ``accuracy``, ``acc``), else the total ``reward``."""
    if context.correctness_reward:
        return component_key(context.correctness_reward), context.correctness_reward
    names = list(context.reward_names or []) + reward_names_in(keys)
    for name in names:
        if _CORRECT_HINT.search(name) and not _FORMAT_HINT.search(name):
            return component_key(name), name
    return "reward", None


def is_length_name(name: str) -> bool:
    return bool(_LENGTH_HINT.search(name)) and not _CORRECT_HINT.search(name)


class CorrectnessSource:
    """Resolves the correctness metric once a reward component names it, then sticks to it.

    Until a component appears the total reward stands in; the choice only ever moves from the total
    to a component (never back), so replays are deterministic.
    """

    def __init__(self, context: RunContext) -> None:
        self.context = context
        self.key, self.name = resolve_correctness(context, ())
        self.fixed = self.key != "reward"
        self._seen_keys = -1

    def value(self, metrics: Mapping[str, Any]) -> float | None:
        # Re-resolve only when the set of logged keys may have changed (cheap proxy: its size).
        if not self.fixed and len(metrics) != self._seen_keys:
            self._seen_keys = len(metrics)
            key, name = resolve_correctness(self.context, metrics.keys())
            if key != "reward":
                self.key, self.name, self.fixed = key, name, True
        return get(metrics, self.key)

    def sample_value(self, sample: Mapping[str, Any]) -> float | None:
        """Per-completion correctness: the ``correct`` flag, else the correctness component."""
        c = sample.get("correct")
        if isinstance(c, bool):
            return 1.0 if c else 0.0
        rewards = sample.get("rewards")
        if isinstance(rewards, Mapping):
            if self.name is not None:
                return finite(rewards.get(self.name))
            vals = [finite(v) for v in rewards.values()]
            vals = [v for v in vals if v is not None]
            return sum(vals) if vals else None
        return None


def sample_reward(sample: Mapping[str, Any]) -> float | None:
    """Total reward of one completion (sum of its components), None if none is finite."""
    rewards = sample.get("rewards")
    if not isinstance(rewards, Mapping):
        return finite(sample.get("reward"))
    vals = [finite(v) for v in rewards.values()]
    vals = [v for v in vals if v is not None]
    return sum(vals) if vals else None


def sample_length(sample: Mapping[str, Any]) -> float | None:
    v = finite(sample.get("length"))
    return v if v is not None and v >= 0 else None


def groups_of(samples: Sequence[Mapping[str, Any]], max_samples: int = 4096) -> dict[Any, list[Mapping[str, Any]]]:
    """Samples by generation group (bounded: beyond ``max_samples`` the rest is ignored)."""
    out: dict[Any, list[Mapping[str, Any]]] = {}
    for i, s in enumerate(samples):
        if i >= max_samples:
            break
        if type(s) is not dict and not isinstance(s, Mapping):
            continue
        g = s.get("group")
        if g is None or isinstance(g, (float, list, dict)):
            g = ("index", s.get("index", i) if not isinstance(s.get("index"), (list, dict)) else i)
        out.setdefault(g, []).append(s)
    return out


class LevelTrack:
    """One positive-scale metric: a settled early baseline plus its recent window.

    ``ratio(k)`` is the median of the last ``k`` points over the baseline, so a one-step spike
    never moves it.
    """

    def __init__(self, window: int = 64, half: int = 3, tol: float = 0.3, max_points: int = 60, positive: bool = True,
                 min_span: int = 0) -> None:
        self.window = Window(window)
        self.baseline = SettledBaseline(half=half, tol=tol, max_points=max_points, positive=positive, min_span=min_span)
        self.base_step: int | None = None
        # The first few points: the only reference a series has when it fails before it settles.
        self.first: list[float] = []
        self.first_steps: list[int] = []

    def push(self, step: int, v: float) -> None:
        w = self.window
        w.steps.append(step)
        w.values.append(v)
        if self.baseline.value is None:
            # The first points within a few steps of the start: three on fine logs, one on coarse
            # logs (where the third point may already be deep into an early failure).
            if len(self.first) < 3 and (not self.first_steps or step - self.first_steps[0] < 5):
                self.first.append(v)
                self.first_steps.append(step)
            if self.baseline.push(v, step):
                self.base_step = step

    @property
    def early(self) -> float | None:
        """Median of the first (up to three) points."""
        return median(self.first) if self.first else None

    def early_ratio(self, k: int) -> float | None:
        """Recent median over the first points' median, while the baseline has not settled."""
        r, e = self.recent(k), self.early
        if r is None or e is None or self.baseline.value is not None or len(self.window) < len(self.first) + k:
            return None
        return math.exp(log_ratio(r, e))

    def force_if_moved(self, step: int, k: int, low: float | None = None, high: float | None = None) -> bool:
        """Freeze the baseline at the first points' level when, before settling, the recent median
        and the latest point have fallen to ``low`` or risen to ``high`` times that level."""
        if self.baseline.value is not None or not self.window.values:
            return False
        er = self.early_ratio(k)
        e = self.early or 0.0
        last = self.window.values[-1]
        if er is None:
            return False
        if (low is not None and er <= low and last <= low * e) or (high is not None and er >= high and last >= high * e):
            self.force_early(step)
            return True
        return False

    def force_early(self, step: int) -> None:
        """Freeze the baseline at the first points' level: the series moved far before settling."""
        b = self.baseline
        if b.value is None and self.first:
            b.value = median(self.first)
            b.spread = mad_sigma(self.first, b.value)
            self.base_step = step

    @property
    def ready(self) -> bool:
        return self.baseline.ready

    @property
    def base(self) -> float | None:
        return self.baseline.value

    def recent(self, k: int) -> float | None:
        return self.window.recent_median(k)

    def ratio(self, k: int) -> float | None:
        b = self.baseline.value
        if b is None:
            return None
        r = self.window.recent_median(k)
        if r is None:
            return None
        # log_ratio(r, b), inlined: this runs every step.
        return math.exp(math.log(max(r, 1e-12)) - math.log(max(b, 1e-12)))

    def last_step(self) -> int | None:
        return self.window.steps[-1] if len(self.window) else None


class EntropyTrack(LevelTrack):
    """Entropy with the masked-truncation trap handled.

    With ``mask_truncated_completions=True`` and every completion truncated, TRL logs entropy as
    exactly 0.0 (nothing was left to measure); that value is a gap, not a collapse.
    """

    def push_metrics(self, step: int, metrics: Mapping[str, Any]) -> float | None:
        h = metrics.get("entropy")
        if type(h) is not float:
            h = finite(h)
        if h is None or not (0.0 <= h < math.inf):
            return None
        if h == 0.0:
            clipped = get(metrics, "completions/clipped_ratio")
            if clipped is None or clipped >= 0.99:
                return None
        self.push(step, h)
        return h


class StepClock:
    """The typical spacing of logged points, so persistence can be asked for in points that
    mean the same on fine (every step) and coarse (every 5-10 steps) logs.

    >>> c = StepClock()
    >>> for s in (10, 20, 30, 40):
    ...     c.tick(s)
    >>> c.gap, c.points(fine=3, coarse=2)
    (10, 2)
    """

    def __init__(self) -> None:
        # Only the last steps are kept; the spacing is worked out when asked (rarely, on the slow
        # paths), so a tick is a single append.
        self._steps: deque[int] = deque(maxlen=9)
        self._gap: int | None = 1

    def tick(self, step: int) -> None:
        steps = self._steps
        if not steps or step > steps[-1]:
            steps.append(step)
            self._gap = None

    @property
    def gap(self) -> int:
        """Mean steps per logged point over the last few points (a mean, not a median: logs that
        come in bursts with long holes cover training sparsely even if most gaps are 1)."""
        g = self._gap
        if g is None:  # worked out once per new point, however often it is asked
            steps = self._steps
            n = len(steps)
            g = self._gap = 1 if n < 2 else max(1, round((steps[-1] - steps[0]) / (n - 1)))
        return g

    def points_for(self, steps: int, minimum: int = 1) -> int:
        """Logged points covering about ``steps`` training steps, at least ``minimum``."""
        return max(minimum, math.ceil(steps / max(self.gap, 1)))

    def points(self, fine: int = 3, coarse: int = 2) -> int:
        """``fine`` points on logs of every step or two, ``coarse`` on sparser logs (each point
        there already averages several steps, so one-step spikes are diluted)."""
        return fine if self.gap <= 2 else coarse
