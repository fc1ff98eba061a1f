"""Wall time spent inside wrapped calls: the monitor's callbacks, the (tapped) reward functions."""

from __future__ import annotations

import functools
import time
from typing import Any

# The TrainerCallback events the monitor implements and that block the training loop.
EVENTS = ("on_train_begin", "on_step_begin", "on_step_end", "on_log", "on_train_end")


class Timer:
    """Wall time of wrapped calls, as (start, duration) pairs."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, float]] = []

    def wrap(self, fn: Any) -> Any:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.calls.append((t, time.perf_counter() - t))

        return timed

    def wrap_callback(self, callback: Any) -> None:
        """Time every event ``callback``'s class implements itself."""
        for event in EVENTS:
            if event in type(callback).__dict__:
                setattr(callback, event, self.wrap(getattr(callback, event)))

    def within(self, start: float, end: float) -> float:
        return sum(d for t, d in self.calls if start <= t < end)


def step_clock() -> Any:
    """A TrainerCallback marking the end of every optimizer step in ``.marks`` (perf_counter); the
    gaps between marks are step times. Added after the monitor, each mark includes its work."""
    from transformers import TrainerCallback

    class StepClock(TrainerCallback):
        def __init__(self) -> None:
            self.marks: list[float] = []

        def on_step_end(self, args, state, control, **kwargs):
            self.marks.append(time.perf_counter())

    return StepClock()
