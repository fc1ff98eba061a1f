"""Robust, bounded-cost statistics shared by the detectors.

Everything here works on small bounded windows (tens of points), so a detector that calls these
once per update stays O(1) per update however long the run gets. Small windows are handled in
plain Python because numpy's per-call overhead dominates below a few dozen values.

>>> median([3.0, 1.0, 2.0, 100.0])
2.5
>>> r = mann_kendall([1.0, 2.0, 2.5, 3.1, 4.0, 4.2, 5.5, 6.0])
>>> r.tau, r.p_up < 0.01
(1.0, True)
>>> theil_sen([0, 10, 20, 30, 40], [1.0, 2.0, 3.0, 4.0, 50.0])
0.1
"""

from __future__ import annotations

import functools
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# Consistency constant: MAD * 1.4826 estimates the standard deviation of a normal sample.
MAD_SCALE = 1.4826


def median(values: Sequence[float]) -> float:
    """Median of a non-empty sequence (plain Python: faster than numpy for short windows)."""
    s = sorted(values)
    n = len(s)
    if n == 0:
        raise ValueError("median of an empty sequence")
    mid = n // 2
    return s[mid] if n % 2 else 0.5 * (s[mid - 1] + s[mid])


def mad_sigma(values: Sequence[float], center: float | None = None) -> float:
    """Robust standard deviation: 1.4826 x the median absolute deviation."""
    c = median(values) if center is None else center
    return MAD_SCALE * median([abs(v - c) for v in values])


def quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile of a non-empty sequence, q in [0, 1]."""
    s = sorted(values)
    if not s:
        raise ValueError("quantile of an empty sequence")
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def log_ratio(a: float, b: float, floor: float = 1e-12) -> float:
    """log(a / b) with both sides floored, so zeros give a large but finite ratio."""
    return math.log(max(a, floor)) - math.log(max(b, floor))


def _norm_sf(z: float) -> float:
    return 0.5 * math.erfc(z / math.sqrt(2.0))


@dataclass(frozen=True)
class TrendResult:
    """Mann-Kendall trend test result; ``p_up``/``p_down`` are one-sided p-values."""

    n: int
    s: float
    tau: float
    z: float
    p_up: float
    p_down: float
    variance_inflation: float

    def as_evidence(self) -> dict[str, float]:
        return {
            "n": self.n,
            "kendall_tau": round(self.tau, 4),
            "z": round(self.z, 3),
            "p_up": float(f"{self.p_up:.3g}"),
            "p_down": float(f"{self.p_down:.3g}"),
            "variance_inflation": round(self.variance_inflation, 3),
        }


@functools.lru_cache(maxsize=64)
def _pairs(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Index pairs ``i < j`` of ``n`` points (the trend tests ask for the same few ``n`` every step)."""
    i, j = np.triu_indices(n, 1)
    i.setflags(write=False)
    j.setflags(write=False)
    return i, j


def theil_sen(x: Sequence[float], y: Sequence[float]) -> float:
    """Theil-Sen slope (median of pairwise slopes) of y against x; pairs with equal x are skipped.

    Uses the step numbers as x, so unevenly logged series (gaps, coarse logging) get the right slope.
    """
    n = len(x)
    if n != len(y):
        raise ValueError("x and y differ in length")
    if n < 2:
        return 0.0
    xa = np.asarray(x, dtype=float)
    ya = np.asarray(y, dtype=float)
    i, j = _pairs(n)
    dx = xa[j] - xa[i]
    keep = dx != 0
    if not keep.any():
        return 0.0
    return float(np.median((ya[j] - ya[i])[keep] / dx[keep]))


def ols_slope(x: Sequence[float], y: Sequence[float]) -> float:
    """Least-squares slope of y against x (0 when x does not vary).

    >>> ols_slope([0, 1, 2, 3], [1.0, 3.0, 5.0, 7.0])
    2.0
    """
    n = len(x)
    if n < 2 or n != len(y):
        return 0.0
    mx = sum(x) / n
    my = sum(y) / n
    sxx = sum((a - mx) ** 2 for a in x)
    if sxx <= 0:
        return 0.0
    return sum((a - mx) * (b - my) for a, b in zip(x, y)) / sxx


def ols_slope_se(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """Least-squares slope and its standard error (residual-based; inf with fewer than 3 points).

    >>> ols_slope_se([0, 1, 2, 3], [1.0, 3.0, 5.0, 7.0])
    (2.0, 0.0)
    """
    n = len(x)
    slope = ols_slope(x, y)
    if n < 3:
        return slope, math.inf
    mx = sum(x) / n
    my = sum(y) / n
    sxx = sum((a - mx) ** 2 for a in x)
    if sxx <= 0:
        return slope, math.inf
    rss = sum((b - my - slope * (a - mx)) ** 2 for a, b in zip(x, y))
    return slope, math.sqrt(rss / (n - 2) / sxx)


def mann_kendall(y: Sequence[float], x: Sequence[float] | None = None) -> TrendResult:
    """Mann-Kendall trend test with an autocorrelation correction of the variance.

    Training curves are autocorrelated, which makes the plain test far too eager. The variance of
    S is inflated by the effective-sample-size factor of an AR(1) process fitted to the residuals
    of the Theil-Sen trend (Bayley-Hammersley / Yue-Wang style), computed from the lag-1
    autocorrelation and clipped to a sane range.
    """
    n = len(y)
    if n < 3:
        return TrendResult(n, 0.0, 0.0, 0.0, 0.5, 0.5, 1.0)
    ya = np.asarray(y, dtype=float)
    i, j = _pairs(n)
    d = np.sign(ya[j] - ya[i])
    s = float(d.sum())
    # Tie correction.
    _, counts = np.unique(ya, return_counts=True)
    ties = counts[counts > 1]
    var_s = (n * (n - 1) * (2 * n + 5) - float((ties * (ties - 1) * (2 * ties + 5)).sum())) / 18.0
    inflation = 1.0
    if n >= 8:
        xa = np.arange(n, dtype=float) if x is None else np.asarray(x, dtype=float)
        dx = xa[j] - xa[i]
        keep = dx != 0
        slope = float(np.median((ya[j] - ya[i])[keep] / dx[keep])) if keep.any() else 0.0
        resid = ya - slope * xa
        resid = resid - resid.mean()
        denom = float((resid * resid).sum())
        if denom > 0:
            r1 = float((resid[1:] * resid[:-1]).sum()) / denom
            # Correct only for autocorrelation that is itself significant (one-sided 5%): on short
            # windows a curved trend leaves correlated residuals that are not noise persistence.
            if r1 > 1.645 / math.sqrt(n):
                r1 = min(r1, 0.9)
                k = np.arange(1, n)
                inflation = 1.0 + 2.0 * float(((1.0 - k / n) * r1**k).sum())
    var_s *= inflation
    pairs = n * (n - 1) / 2.0
    tau = s / pairs if pairs else 0.0
    if var_s <= 0:
        return TrendResult(n, s, tau, 0.0, 0.5, 0.5, inflation)
    if s > 0:
        z = (s - 1.0) / math.sqrt(var_s)
    elif s < 0:
        z = (s + 1.0) / math.sqrt(var_s)
    else:
        z = 0.0
    return TrendResult(n, s, tau, z, _norm_sf(z), _norm_sf(-z), inflation)


class SettledBaseline:
    """A robust baseline taken once a series' early transient has settled.

    Healthy GRPO runs spend most of their entropy early (a fast initial drop), so a baseline from
    the first few points would make every healthy run look collapsed later. The baseline (median
    and MAD of the last two half-windows) freezes when the medians of the two halves agree within
    ``tol`` (in log space for positive series), or after ``max_points`` points whatever happens, so
    an immediate failure is still measured against the early level. Each half holds at least
    ``half`` points and, when steps are given, spans at least ``min_span / 2`` training steps (up to
    ``max_half`` points), so fine and coarse logs settle over the same stretch of training.

    >>> b = SettledBaseline(half=3, tol=0.2)
    >>> for v in [2.0, 1.2, 0.8, 0.6, 0.52, 0.5, 0.49, 0.5, 0.51]:
    ...     _ = b.push(v)
    >>> round(b.value, 2), b.n
    (0.51, 8)
    """

    def __init__(self, half: int = 3, tol: float = 0.3, max_points: int = 60, positive: bool = True,
                 min_span: int = 0, max_half: int = 10) -> None:
        if half < 1:
            raise ValueError("half must be >= 1")
        self.half = half
        self.max_half = max(half, max_half)
        self.min_span = min_span
        self.tol = tol
        self.max_points = max_points
        self.positive = positive
        self.buf: deque[float] = deque(maxlen=2 * self.max_half)
        self.steps: deque[int] = deque(maxlen=2 * self.max_half)
        self.n = 0
        self.value: float | None = None
        self.spread: float | None = None

    @property
    def ready(self) -> bool:
        return self.value is not None

    def _half(self) -> int:
        if self.min_span <= 0 or len(self.steps) < 2:
            return self.half
        gap = max((self.steps[-1] - self.steps[0]) / (len(self.steps) - 1), 1e-9)
        want = math.ceil(self.min_span / (2.0 * gap))
        return min(max(want, self.half), self.max_half)

    def push(self, v: float, step: int | None = None) -> bool:
        """Add a point; returns True on the update that freezes the baseline."""
        if self.value is not None:
            return False
        self.buf.append(v)
        self.steps.append(self.n if step is None else step)
        self.n += 1
        h = self._half()
        if len(self.buf) < 2 * h:
            return False
        vals = list(self.buf)[-2 * h:]
        m0 = median(vals[:h])
        m1 = median(vals[h:])
        if self.positive:
            settled = abs(log_ratio(m1, m0)) <= self.tol
        else:
            settled = abs(m1 - m0) <= self.tol * max(abs(m0), abs(m1), 1e-12)
        if settled or self.n >= self.max_points:
            self.value = median(vals)
            self.spread = mad_sigma(vals, self.value)
            return True
        return False


class Thinned:
    """Every (step, value) point of one series, thinned by halving once more than ``size`` are held: a bounded
    history that spans the whole run (the level a run spends its time at, a trend over all of it).

    >>> h = Thinned(4)
    >>> for i in range(10):
    ...     h.push(i, float(i))
    >>> h.steps, h.values
    ([0, 4, 7], [0.0, 4.0, 7.0])
    """

    __slots__ = ("keep_every", "seen", "size", "steps", "values")

    def __init__(self, size: int) -> None:
        self.size = size
        self.steps: list[int] = []
        self.values: list[float] = []
        self.keep_every = 1
        self.seen = 0

    def push(self, step: int, value: float) -> None:
        self.seen += 1
        if self.seen % self.keep_every:
            return
        self.steps.append(step)
        self.values.append(value)
        if len(self.values) > self.size:
            self.steps = self.steps[::2]
            self.values = self.values[::2]
            self.keep_every *= 2

    def __len__(self) -> int:
        return len(self.values)


class Window:
    """The last ``size`` (step, value) points of one series."""

    __slots__ = ("steps", "values")

    def __init__(self, size: int) -> None:
        self.steps: deque[int] = deque(maxlen=size)
        self.values: deque[float] = deque(maxlen=size)

    def push(self, step: int, value: float) -> None:
        self.steps.append(step)
        self.values.append(value)

    def __len__(self) -> int:
        return len(self.values)

    def last(self, k: int) -> list[float]:
        """The last ``k`` values, oldest first."""
        return list(self.values)[-k:] if k > 0 else []

    def recent_median(self, k: int) -> float | None:
        """Median of the last ``k`` values (None when there are none)."""
        if k <= 0 or not self.values:
            return None
        return median(self.last(k))

    @property
    def maxlen(self) -> int:
        return self.values.maxlen or 0


def pearson(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Pearson correlation, None when either side is constant or too short."""
    n = len(x)
    if n < 3 or n != len(y):
        return None
    mx = sum(x) / n
    my = sum(y) / n
    sxx = sum((a - mx) ** 2 for a in x)
    syy = sum((b - my) ** 2 for b in y)
    if sxx <= 0 or syy <= 0:
        return None
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
    return sxy / math.sqrt(sxx * syy)


def rounded(x: float | None, digits: int = 4) -> float | None:
    """A JSON-friendly rounding that keeps small numbers significant."""
    if x is None or not math.isfinite(x):
        return None
    if x == 0:
        return 0.0
    r = float(f"{x:.{digits}g}")
    return r if math.isfinite(r) else x  # rounding up near the float maximum would overflow


def tidy(obj: object, digits: int = 4) -> object:
    """Evidence made JSON-safe and readable: floats to ``digits`` significant digits, non-finite
    floats to None, tuples to lists, recursively.

    >>> tidy({"a": 0.123456, "b": [float("nan"), 2], "c": (1e300 * 1e10,)})
    {'a': 0.1235, 'b': [None, 2], 'c': [None]}
    """
    if isinstance(obj, float):
        return rounded(obj, digits)
    if isinstance(obj, dict):
        return {str(k): tidy(v, digits) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [tidy(v, digits) for v in obj]
    return obj


class StepClock:
    """The typical spacing of logged points, so persistence can be asked for in points that mean the same
    on fine (every step) and coarse (every 5-10 steps) logs.

    >>> c = StepClock()
    >>> for s in (10, 20, 30, 40):
    ...     c.tick(s)
    >>> c.gap, c.points(fine=3, coarse=2)
    (10, 2)
    """

    def __init__(self) -> None:
        self.steps: deque[int] = deque(maxlen=9)
        # Mean steps per logged point over the last few points (a mean, not a median: logs that come in
        # bursts with long holes cover training sparsely even if most gaps are 1). Kept up to date by
        # ``tick``: detectors ask for it several times a step.
        self.gap = 1

    def tick(self, step: int) -> None:
        s = self.steps
        if not s or step > s[-1]:
            s.append(step)
            if len(s) >= 2:
                self.gap = max(1, round((s[-1] - s[0]) / (len(s) - 1)))

    def points_for(self, steps: int, minimum: int = 1) -> int:
        """Logged points covering about ``steps`` training steps, at least ``minimum``."""
        return max(minimum, math.ceil(steps / max(self.gap, 1)))

    def points(self, fine: int = 3, coarse: int = 2) -> int:
        """``fine`` points on logs of every step or two, ``coarse`` on sparser logs (each point there
        already averages several steps, so one-step spikes are diluted)."""
        return fine if self.gap <= 2 else coarse
