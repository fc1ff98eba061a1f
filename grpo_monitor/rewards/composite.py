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

# Each check is what a regex said (in its docstring), on the stripped text, with str methods: the
# regexes ran a lookahead at every character (1 MB: 50 to 140 ms) and ``\\boxed\s*\{.+\}`` reread the
# rest of the text from every ``\\boxed{`` (n squared).
_BOXED_OPEN = re.compile(r"\\boxed\s*\{")


def _answer_tag(text: str) -> bool:
    """``^(?:(?!<answer>).)*<answer>(?:(?!</?answer>).)+</answer>\\s*$`` (re.S) matches: what follows the
    first ``<answer>`` ends with ``</answer>`` and, before it, holds something and no other tag."""
    if not text.endswith("</answer>"):
        return False
    _, opened, rest = text.partition("<answer>")
    body = rest[:-9]
    return bool(opened and body) and "<answer>" not in body and "</answer>" not in body


def _think_answer(text: str) -> bool:
    """``^\\s*<think>(?:(?!</?think>).)*</think>\\s*<answer>(?:(?!</?answer>).)+</answer>\\s*$`` (re.S) matches
    (``text`` stripped): up to the first ``</think>``, one ``<think>`` at the start; after it, only the answer."""
    head, closed, rest = text.partition("</think>")
    if not closed or not head.startswith("<think>") or head.find("<think>", 7) >= 0:
        return False
    rest = rest.lstrip()
    body = rest[8:-9]
    return (rest.startswith("<answer>") and rest.endswith("</answer>") and bool(body) and "<answer>" not in body
            and "</answer>" not in body)


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
