"""The recipe's composite reward: a format reward plus a correctness reward, in one line.

``reward_funcs=format_and_correctness()`` gives TRL two functions, logged separately
(``rewards/answer_format/mean``, ``rewards/exact_match/mean``), so a well-formatted wrong answer
(1 + 0) and a malformed one (0 + 0, or 0 + 1 if its last number happens to be right) do not score
the same.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from grpo_monitor.rewards._text import completion_text
from grpo_monitor.rewards.correctness import ExactMatchReward

_FORMATS = {
    "answer_tag": re.compile(r"^(?:(?!<answer>).)*<answer>(?:(?!</?answer>).)+</answer>\s*$", re.S),
    "think_answer": re.compile(r"^\s*<think>(?:(?!</?think>).)*</think>\s*<answer>(?:(?!</?answer>).)+</answer>\s*$", re.S),
    "boxed": re.compile(r"\\boxed\s*\{.+\}", re.S),
}


class FormatReward:
    """1.0 when the completion has the answer format, else 0.0.

    ``answer_tag``: exactly one non-empty ``<answer>...</answer>``, nothing after it;
    ``think_answer``: ``<think>...</think>`` then that; ``boxed``: a ``\\boxed{...}`` anywhere.
    """

    def __init__(self, fmt: str = "answer_tag", name: str = "answer_format") -> None:
        if fmt not in _FORMATS:
            raise ValueError(f"format must be one of {sorted(_FORMATS)}, got {fmt!r}")
        self.fmt = fmt
        self.__name__ = name

    def __call__(self, prompts: Sequence[Any] | None = None, completions: Sequence[Any] | None = None,
                 **kwargs: Any) -> list[float]:
        pat = _FORMATS[self.fmt]
        return [1.0 if pat.search(completion_text(c).strip()) else 0.0 for c in completions or []]


answer_format = FormatReward()


def format_and_correctness(fmt: str = "answer_tag", answer_column: str | None = None,
                           mode: str = "math") -> list[Any]:
    """``[FormatReward(fmt), ExactMatchReward(answer_column, mode)]`` for ``GRPOTrainer(reward_funcs=...)``."""
    return [FormatReward(fmt), ExactMatchReward(answer_column, mode)]
