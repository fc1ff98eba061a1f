"""DAPO's soft overlong punishment (Eq. 13) as a wrapper around any reward.

``SoftOverlong(reward, max_completion_len, soft_punish_cache)`` returns ``reward + penalty`` where
the penalty is 0 up to ``max_completion_len - soft_punish_cache`` tokens, falls linearly to -1 at
``max_completion_len`` and is -1 beyond: the same numbers as TRL's ``get_soft_overlong_punishment``.
A None from the wrapped reward stays None. Without a wrapped reward it is the penalty alone.
Lengths are token counts from ``completion_ids`` (TRL passes them); without them, ``length_fn``
(e.g. a tokenizer's ``len(tok(text).input_ids)``) or, failing that, whitespace-separated words.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from grpo_monitor.rewards._text import completion_text


def soft_overlong_penalty(length: int, max_completion_len: int, soft_punish_cache: int) -> float:
    if length <= max_completion_len - soft_punish_cache:
        return 0.0
    if length <= max_completion_len:
        return (max_completion_len - soft_punish_cache - length) / soft_punish_cache
    return -1.0


class SoftOverlong:
    def __init__(self, reward: Callable[..., Any] | None, max_completion_len: int, soft_punish_cache: int,
                 length_fn: Callable[[Any], int] | None = None, name: str | None = None) -> None:
        if soft_punish_cache < 0 or max_completion_len <= 0 or soft_punish_cache > max_completion_len:
            raise ValueError("need 0 <= soft_punish_cache <= max_completion_len and max_completion_len > 0")
        self.reward = reward
        self.max_completion_len = int(max_completion_len)
        self.soft_punish_cache = int(soft_punish_cache)
        self.length_fn = length_fn
        inner = getattr(reward, "__name__", None) if reward is not None else None
        self.__name__ = name or (f"{inner}_overlong" if inner else "soft_overlong_punishment")
        if reward is not None:
            self.__wrapped__ = reward

    def _length(self, completion: Any, ids: Any) -> int:
        if ids is not None:
            return len(ids)
        if self.length_fn is not None:
            return int(self.length_fn(completion))
        return len(completion_text(completion).split())

    def __call__(self, prompts: Sequence[Any] | None = None, completions: Sequence[Any] | None = None,
                 completion_ids: Sequence[Any] | None = None, **kwargs: Any) -> list[float | None]:
        completions = list(completions or [])
        if self.reward is None:
            base: list[Any] = [0.0] * len(completions)
        else:
            base = list(self.reward(prompts=prompts, completions=completions, completion_ids=completion_ids, **kwargs))
        out: list[float | None] = []
        for i, c in enumerate(completions):
            ids = completion_ids[i] if completion_ids is not None and i < len(completion_ids) else None
            if base[i] is None:
                out.append(None)
                continue
            out.append(float(base[i]) + soft_overlong_penalty(self._length(c, ids), self.max_completion_len,
                                                              self.soft_punish_cache))
        return out
