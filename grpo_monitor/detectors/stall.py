"""Stalls: training that stops advancing (NCCL or socket timeouts at weight sync, a rollout that
never returns, a hang after hours with the GPUs idle).

A hang that never ends leaves no logged step behind it, so it is seen live: ``stall_status`` says
whether the newest logged step is older than ``k`` times the run's median time per logging
interval (the dashboard shows it in its header). A stall the run came back from (a timeout that
retried, a straggler rank) shows in the log: a step that took ``k`` times the median. Two clocks
are read, each against its own median: the wall time between logged steps (the callback records
it as ``system/wall_time``), per training step, with the intervals that hold a checkpoint save or
an evaluation set aside, and TRL's ``step_time`` (seconds of one optimiser step, averaged over the
logging window). A stall also has to last ``min_stall_s`` seconds: a tiny run's one-second
hiccup is not one.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from grpo_monitor.detectors.base import Assessment, Detector, Metrics, Sample, check_float, check_int, finite
from grpo_monitor.detectors.signals import get
from grpo_monitor.detectors.stats import median

WALL = "system/wall_time"
STEP_TIME = "step_time"


@dataclasses.dataclass(frozen=True)
class StallStatus:
    """A live run that has stopped logging: how long since its newest step, against its median."""

    age_s: float
    median_interval_s: float
    last_step: int
    k: float

    def text(self) -> str:
        return f"stalled: no step for {_dur(self.age_s)} (median step {_dur(self.median_interval_s)})"


def _dur(s: float) -> str:
    if s < 120:
        return f"{s:.0f}s" if s >= 10 else f"{s:.1f}s"
    if s < 7200:
        return f"{s / 60:.0f}min"
    return f"{s / 3600:.1f}h"


def stall_status(step_times: Sequence[tuple[int, float]], now: float, k: float = 5.0, min_stall_s: float = 60.0,
                 ended: bool = False, max_age_s: float | None = 2 * 86400.0) -> StallStatus | None:
    """Whether a live run has stalled: ``step_times`` are ``(step, wall time)`` of its logged steps,
    oldest first (any subset of them, in order), ``now`` the wall clock. Stalled when the newest step
    is older than ``k`` times the median interval between logged steps (measured per training step,
    so steps seen only now and then still give the right rate) and older than ``min_stall_s``. A log
    untouched for more than ``max_age_s`` belongs to a run that is gone, not stalled.

    >>> times = [(s, 1000.0 + 10.0 * s) for s in range(1, 21)]
    >>> stall_status(times, now=1215.0) is None
    True
    >>> stall_status(times, now=1900.0).text()
    'stalled: no step for 12min (median step 10s)'
    >>> stall_status(times, now=1900.0, ended=True) is None
    True
    """
    if ended or len(step_times) < 3:
        return None
    rates: list[float] = []
    gaps: list[int] = []
    prev: tuple[int, float] | None = None
    for step, t in list(step_times)[-64:]:
        if prev is not None and step > prev[0] and t >= prev[1] and math.isfinite(t):
            rates.append((t - prev[1]) / (step - prev[0]))
            gaps.append(step - prev[0])
        prev = (step, t)
    if len(rates) < 2 or prev is None:
        return None
    # The interval between logged steps: the time per training step, times the logging stride
    # (the smallest gap seen: a dashboard that polls now and then sees wider ones).
    interval = median(rates) * min(gaps)
    age = now - prev[1]
    if interval <= 0 or age < k * interval or age < min_stall_s or (max_age_s is not None and age > max_age_s):
        return None
    return StallStatus(age_s=age, median_interval_s=interval, last_step=prev[0], k=k)


class Stall(Detector):
    """A logged step that took ``k`` times the run's median (a stall the run came back from).

    Parameters: ``k`` (the multiple of the median time per step that counts as a stall),
    ``min_stall_s`` (and the extra time must be at least this many seconds), ``min_points``
    (intervals measured before judging), ``window`` (healthy intervals whose median is the reference).

    >>> det = Stall()
    >>> found = []
    >>> for step in range(1, 41):
    ...     wall = 1000.0 + 3.0 * step + (600.0 if step >= 30 else 0.0)
    ...     found += det.update(step, {"system/wall_time": wall, "step_time": 3.0})
    >>> [(f.severity, f.step, f.onset_step, f.evidence["stall_s"]) for f in found]
    [('warning', 30, 29, 600.0)]
    """

    id = "stall"
    variant = None
    role = "guard"  # says the run stopped advancing, not whether it learns
    requires = (("system/wall_time|step_time",),)

    def __init__(self, k: float = 5.0, min_stall_s: float = 60.0, min_points: int = 5, window: int = 32) -> None:
        self.k = check_float("k", k, 1.0, 1e6, low_open=True)
        self.min_stall_s = check_float("min_stall_s", min_stall_s, 0.0, 1e9)
        self.min_points = check_int("min_points", min_points, 2)
        self.window = check_int("window", window, 4)
        super().__init__()

    def _reset_state(self) -> None:
        self.prev_step: int | None = None
        self.prev_wall: float | None = None
        # Seconds per step of the healthy points, and their medians, refreshed every eight points.
        self.wall: deque[float] = deque(maxlen=self.window)
        self.steps: deque[float] = deque(maxlen=self.window)
        self._wall_med: float | None = None
        self._step_med: float | None = None
        self._wall_age = 0
        self._step_age = 0
        cfg = self.context.config or {}
        self.save_every = _every(cfg, "save_strategy", "save_steps")
        self.eval_every = _every(cfg, "eval_strategy", "eval_steps") or _every(cfg, "evaluation_strategy", "eval_steps")

    def _excused(self, lo: int, hi: int) -> str | None:
        """A checkpoint save or an evaluation ran between the logs of steps ``lo`` and ``hi``: its time
        is not a stall. The Trainer saves and evaluates after logging a step, so the save at step s
        delays the next log: s in ``[lo, hi)``."""
        for what, every in (("checkpoint save", self.save_every), ("evaluation", self.eval_every)):
            if every and (hi - 1) // every > (lo - 1) // every:
                return what
        return None

    def assess(self, step: int, metrics: Metrics, samples: Sequence[Sample]) -> Assessment | None:
        w = get(metrics, WALL)
        st = get(metrics, STEP_TIME)
        if w is None and st is None:
            return None
        prev, self.prev_step = self.prev_step, step
        if prev is None or step <= prev:
            # The first point, or the log went back (a resumed segment): start the clocks over.
            self.prev_wall = w
            return Assessment(warming_up=True, evidence={"points": 0})
        ds = step - prev
        ev: dict[str, Any] | None = None
        found: list[tuple[str, float, float, float]] = []  # (clock, value per step, median, extra seconds)
        pw, self.prev_wall = self.prev_wall, w
        if w is not None and pw is not None and w >= pw:
            per = (w - pw) / ds
            med = self._wall_med
            excuse = self._excused(prev, step) if self.save_every or self.eval_every else None
            if med is not None and med > 0 and excuse is None:
                extra = (w - pw) - med * ds
                if per >= self.k * med and extra >= self.min_stall_s:
                    found.append(("wall_time", per, med, extra))
            if excuse is None and not (med and per >= self.k * med):
                self.wall.append(per)
                self._wall_age += 1
                if (self._wall_med is None and len(self.wall) >= self.min_points) or self._wall_age >= 8:
                    self._wall_med, self._wall_age = median(self.wall), 0
            elif excuse is not None:
                ev = {"excused": {"step": step, "why": excuse, "seconds": finite(w - pw)}}
        if st is not None and st >= 0:
            med = self._step_med
            if med is not None and med > 0:
                # ``step_time`` is a mean over the logging window: the extra time is spread over its steps.
                extra = (st - med) * ds
                if st >= self.k * med and extra >= self.min_stall_s:
                    found.append(("step_time", st, med, extra))
            if not (med and st >= self.k * med):
                self.steps.append(st)
                self._step_age += 1
                if (self._step_med is None and len(self.steps) >= self.min_points) or self._step_age >= 8:
                    self._step_med, self._step_age = median(self.steps), 0
        if self._wall_med is None and self._step_med is None:
            return Assessment(warming_up=True, evidence={"points": max(len(self.wall), len(self.steps))})
        ev = ev or {}
        ev.update({"median_step_s": finite(self._wall_med if self._wall_med is not None else self._step_med), "k": self.k,
                   "min_stall_s": self.min_stall_s})
        if not found:
            return Assessment(level=0, evidence=ev)
        clock, per, med, extra = max(found, key=lambda f: f[3])
        ev.update({"clock": clock, "seconds_per_step": finite(per), "median_step_s": finite(med), "ratio": finite(per / med),
                   "stall_s": finite(round(extra, 1)), "from_step": prev, "to_step": step,
                   "advice": ("A step took far longer than the run's usual: look for NCCL or socket timeouts at the "
                              "weight sync, a vLLM server that stopped answering (completions past max_model_len), "
                              "or one rank waiting on another; NCCL_DEBUG=INFO and py-spy dump show where it waits.")})
        return Assessment(level=1, evidence=ev, onset_step=prev)

    def _message(self, severity: str, evidence: Mapping[str, Any]) -> str:
        return (f"Training stalled between steps {evidence.get('from_step')} and {evidence.get('to_step')}: about "
                f"{evidence.get('stall_s')} s more than the run's median of {evidence.get('median_step_s')} s per step "
                f"({evidence.get('clock')}). Check the weight sync, the generation server and the other ranks.")


def _every(cfg: Mapping[str, Any], strategy: str, steps: str) -> int | None:
    s = cfg.get(strategy)
    if s is not None and str(s).lower().rsplit(".", 1)[-1] != "steps":
        return None
    v = finite(cfg.get(steps))
    if v is None or v <= 0:
        return None
    return max(1, int(v)) if v >= 1 else None
