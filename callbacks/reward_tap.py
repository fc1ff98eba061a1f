"""The reward tap: records every completion's reward components without touching the rewards.

TRL calls each reward function with the same ``prompts``, ``completions`` and ``completion_ids``
objects for one generation batch. The tap wraps each function, lets it run exactly as before
(its exceptions propagate unchanged, its return value is passed through), and then records one
sample per completion: position in the global batch, group, token length, truncation, and the
reward of each component. Recording failures are reported by the owner's error handler and
never reach the trainer.
"""

from __future__ import annotations

import functools
import inspect
import json
import math
from collections.abc import Callable, Sequence
from typing import Any

from monitor.metrics import to_value

_CORRECT_HINTS = ("correct", "accuracy", "acc_", "exact_match", "_acc")
_FORMAT_HINTS = ("format", "xml", "schema", "tag")


def guess_component(names: Sequence[str], hints: Sequence[str]) -> str | None:
    for name in names:
        low = name.lower()
        if any(h in low for h in hints):
            return name
    return None


def _text(x: Any) -> str:
    """Prompts and completions are strings, or chat messages in conversational datasets."""
    if isinstance(x, str):
        return x
    if isinstance(x, list) and x and isinstance(x[-1], dict) and "content" in x[-1]:
        content = x[-1]["content"]
        return content if isinstance(content, str) else json.dumps(content, default=str)
    return json.dumps(x, default=str)


class _Batch:
    __slots__ = ("ids", "prompts", "completions", "rewards")

    def __init__(self, ids: Any, prompts: Any, completions: Any) -> None:
        self.ids = ids  # held so its id() cannot be reused by a later batch
        self.prompts = prompts
        self.completions = completions
        self.rewards: dict[str, list[float | None]] = {}


class RewardTap:
    def __init__(
        self,
        names: Sequence[str],
        num_generations: int,
        eos_and_pad: Sequence[int],
        process_index: int = 0,
        correctness_reward: str | None = None,
        correct_threshold: float = 0.0,
        max_text_chars: int = 2000,
        on_error: Callable[[str, BaseException], None] | None = None,
    ) -> None:
        self.names = list(names)
        self.num_generations = max(1, int(num_generations))
        self.eos_and_pad = set(int(t) for t in eos_and_pad if t is not None)
        self.process_index = int(process_index)
        self.correctness_reward = correctness_reward
        self.correct_threshold = float(correct_threshold)
        self.max_text_chars = int(max_text_chars)
        self._on_error = on_error
        self._current: _Batch | None = None
        self._done: list[_Batch] = []

    def wrap(self, func: Callable[..., Any], name: str) -> Callable[..., Any]:
        tap = self
        if inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(getattr(func, "__call__", None)):

            @functools.wraps(func)
            async def async_wrapped(*args: Any, **kwargs: Any) -> Any:
                out = await func(*args, **kwargs)
                tap._observe(name, kwargs, out)
                return out

            async_wrapped.__grpo_monitor_tap__ = func  # type: ignore[attr-defined]
            return async_wrapped

        @functools.wraps(func)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            out = func(*args, **kwargs)
            tap._observe(name, kwargs, out)
            return out

        wrapped.__grpo_monitor_tap__ = func  # type: ignore[attr-defined]
        if not hasattr(wrapped, "__name__"):  # functools.partial and callable objects
            wrapped.__name__ = name  # type: ignore[attr-defined]
        return wrapped

    def _observe(self, name: str, kwargs: dict[str, Any], out: Any) -> None:
        try:
            ids = kwargs.get("completion_ids")
            if ids is None:
                return
            if self._current is None or self._current.ids is not ids:
                if self._current is not None:
                    self._done.append(self._current)
                self._current = _Batch(ids, kwargs.get("prompts"), kwargs.get("completions"))
            self._current.rewards[name] = [to_value(v) for v in out]
        except Exception as exc:
            if self._on_error is not None:
                self._on_error("reward tap", exc)

    def drain(self, step: int) -> list[dict[str, Any]]:
        """Every completion scored since the last drain, as sample records of ``step``."""
        batches = self._done + ([self._current] if self._current is not None else [])
        self._done, self._current = [], None
        records: list[dict[str, Any]] = []
        for batch in batches:
            records.extend(self._records(batch, step))
        return records

    def _records(self, batch: _Batch, step: int) -> list[dict[str, Any]]:
        ids = batch.ids
        n = len(ids)
        prompts = batch.prompts or [None] * n
        completions = batch.completions or [None] * n
        base = self.process_index * n
        out = []
        for i in range(n):
            seq = ids[i]
            rewards = {name: (vals[i] if i < len(vals) else None) for name, vals in batch.rewards.items()}
            correct = None
            if self.correctness_reward is not None:
                v = rewards.get(self.correctness_reward)
                if v is not None and not math.isnan(v):
                    correct = v > self.correct_threshold
            index = base + i
            out.append(
                {
                    "step": int(step),
                    "rank": self.process_index,
                    "index": index,
                    "group": index // self.num_generations,
                    "length": len(seq),
                    "truncated": bool(len(seq) and int(seq[-1]) not in self.eos_and_pad),
                    "rewards": rewards,
                    "correct": correct,
                    "prompt": _text(prompts[i])[: self.max_text_chars] if prompts[i] is not None else "",
                    "completion": _text(completions[i])[: self.max_text_chars] if completions[i] is not None else "",
                }
            )
        return out
