"""The held-out score beside the training reward, as the evaluation-aware detectors read it.

A run evaluates every so often (TRL's ``eval_steps``, verl's ``test_freq``), far less often than it logs
training steps. ``EvalTrack`` keeps, per evaluation, the held-out score and the training reward's level
over the steps since the previous evaluation (their median: one noisy training point must not stand for a
stretch), so the two series can be compared point for point. The score is read under the names
``core.metrics`` gives every logger's held-out score: ``eval_reward``, else ``eval_accuracy``, else TRL's
``eval_rewards/<correctness>/mean`` (the first one the run logs is kept for the whole run). Live, the
Trainer logs an evaluation as its own log after the training log of the same step; offline, readers merge
the two: either way the training point is taken before the evaluation, so both give the same pairs.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from typing import Any

from grpo_monitor.detectors.signals import get, names_like, reward_roles
from grpo_monitor.detectors.stats import MAD_SCALE, median

EVAL_KEYS = ("eval_reward", "eval_accuracy")
# What the evaluation-aware detectors read, for ``requires``.
EVAL_INPUT = "eval_reward|eval_accuracy|eval_rewards/*/mean"
TRAIN_INPUT = "reward|rewards/*/mean"


class EvalTrack:
    """Pairs of (step, held-out score, training level), at most ``size`` of them.

    >>> t = EvalTrack()
    >>> for s in range(1, 21):
    ...     _ = t.push(s, {"reward": s / 20, **({"eval_reward": 0.5} if s % 10 == 0 else {})})
    >>> [(p[0], p[1], round(p[2], 3)) for p in t.points]
    [(10, 0.5, 0.275), (20, 0.5, 0.775)]
    """

    def __init__(self, size: int = 64, train_points: int = 256) -> None:
        self.points: deque[tuple[int, float, float | None]] = deque(maxlen=size)
        self._train: deque[float] = deque(maxlen=train_points)
        self._last_train: float | None = None
        self.key: str | None = None
        self.train_key: str | None = None
        self.first: float | None = None

    def _eval_key(self, metrics: Mapping[str, Any]) -> str | None:
        if self.key is not None:
            return self.key
        for k in EVAL_KEYS:
            if get(metrics, k) is not None:
                return k
        comps = [k for k in names_like(metrics, "eval_rewards/", "/mean") if get(metrics, k) is not None]
        if not comps:
            return None
        right, _ = reward_roles(k[len("eval_rewards/"):-len("/mean")] for k in comps)
        return f"eval_rewards/{right}/mean" if right is not None else sorted(comps)[0]

    def _train_value(self, metrics: Mapping[str, Any]) -> float | None:
        if self.train_key is None:
            if get(metrics, "reward") is not None:
                self.train_key = "reward"
            else:
                comps = sorted(k for k in names_like(metrics, "rewards/", "/mean") if get(metrics, k) is not None)
                if not comps:
                    return None
                self.train_key = comps[0]
        return get(metrics, self.train_key)

    def push(self, step: int, metrics: Mapping[str, Any]) -> bool:
        """Take a step's training reward, then its held-out score; True when the step held a new evaluation."""
        r = self._train_value(metrics)
        if r is not None:
            self._train.append(r)
            self._last_train = r
        key = self._eval_key(metrics)
        e = get(metrics, key) if key is not None else None
        if e is None:
            return False
        self.key = key
        if self.points and self.points[-1][0] == step:
            return False  # the same evaluation, logged again (a merged record, a repeated log)
        level = median(list(self._train)) if self._train else self._last_train
        self._train.clear()
        if self.first is None:
            self.first = e
        self.points.append((step, e, level))
        return True

    def paired(self) -> list[tuple[int, float, float]]:
        """The points that have a training level (an evaluation before the first training step has none)."""
        return [(s, e, t) for s, e, t in self.points if t is not None]


def diff_sigma(values: list[float]) -> float:
    """A robust per-point noise scale: the MAD of successive differences over sqrt(2) (a trend does not
    inflate it, as it would a plain spread)."""
    if len(values) < 3:
        return 0.0
    d = [b - a for a, b in zip(values, values[1:])]
    c = median(d)
    return MAD_SCALE * median([abs(x - c) for x in d]) / math.sqrt(2)
