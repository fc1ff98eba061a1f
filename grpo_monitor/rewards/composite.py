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

# Each check is what a regex said (in its docstring), on the stripped text, with ``str.find``: the
# regexes ran a lookahead at every character (1 MB: 50 to 140 ms) and ``\\boxed\s*\{.+\}`` reread the
# rest of the text from every ``\\boxed{`` (n squared).
_SPACE = re.compile(r"\s*")
_BOXED_OPEN = re.compile(r"\\boxed\s*\{")


def _answer_at(text: str, i: int) -> bool:
    """``<answer>(?:(?!</?answer>).)+</answer>\\s*$`` matches at ``i`` (``text`` stripped)."""
    if i < 0 or not text.startswith("<answer>", i):
        return False
    close = text.find("</answer>", i + 8)
    return close > i + 8 and close + 9 == len(text) and text.find("<answer>", i + 8, close) < 0


def _answer_tag(text: str) -> bool:
    """``^(?:(?!<answer>).)*<answer>(?:(?!</?answer>).)+</answer>\\s*$`` (re.S) matches."""
    i = text.find("<answer>")  # _answer_at inlined: this runs on every completion
    if i < 0:
        return False
    close = text.find("</answer>", i + 8)
    return close > i + 8 and close + 9 == len(text) and text.find("<answer>", i + 8, close) < 0


def _think_answer(text: str) -> bool:
    """``^\\s*<think>(?:(?!</?think>).)*</think>\\s*<answer>(?:(?!</?answer>).)+</answer>\\s*$`` (re.S) matches."""
    i = _SPACE.match(text).end()  # type: ignore[union-attr]
    if not text.startswith("<think>", i):
        return False
    close = text.find("</think>", i + 7)
    if close < 0 or text.find("<think>", i + 7, close) >= 0:
        return False
    return _answer_at(text, _SPACE.match(text, close + 8).end())  # type: ignore[union-attr]


def _boxed(text: str) -> bool:
    """``\\\\boxed\\s*\\{.+\\}`` (re.S) is found: the first opening has a ``}`` after its next character."""
    m = _BOXED_OPEN.search(text)
    return m is not None and text.rfind("}") > m.end()


_FORMATS = {"answer_tag": _answer_tag, "think_answer": _think_answer, "boxed": _boxed}


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
        check, text = _FORMATS[self.fmt], completion_text
        return [1.0 if check(text(c).strip()) else 0.0 for c in completions or []]


answer_format = FormatReward()


def format_and_correctness(fmt: str = "answer_tag", answer_column: str | None = None,
                           mode: str = "math") -> list[Any]:
    """``[FormatReward(fmt), ExactMatchReward(answer_column, mode)]`` for ``GRPOTrainer(reward_funcs=...)``."""
    return [FormatReward(fmt), ExactMatchReward(answer_column, mode)]
