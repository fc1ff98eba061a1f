"""Text of a completion as TRL hands it to a reward function, and the pieces references read from it."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any


def completion_text(completion: Any) -> str:
    """Plain text of a completion: a string, or the assistant messages of a conversational one."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Mapping):
        return str(completion.get("content") or "")
    if isinstance(completion, (list, tuple)):
        parts = [str(m.get("content") or "") for m in completion
                 if isinstance(m, Mapping) and m.get("role", "assistant") == "assistant"]
        return "\n".join(parts)
    return "" if completion is None else str(completion)


def row_value(kwargs: Mapping[str, Any], column: str, i: int) -> Any:
    """Row ``i`` of dataset column ``column`` (TRL passes every column as a list), or None."""
    col = kwargs.get(column)
    if isinstance(col, (list, tuple)) and i < len(col):
        return col[i]
    return None


def first_column(kwargs: Mapping[str, Any], names: tuple[str, ...], i: int) -> Any:
    for n in names:
        v = row_value(kwargs, n, i)
        if v is not None:
            return v
    return None


_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.S)


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every closed ``` fence, in order.

    >>> fenced_blocks("```Python run\\nx = 1\\n``` and ```\\ny\\n```")
    [('python', 'x = 1\\n'), ('', 'y\\n')]
    """
    # An opening fence needs a newline after it and a closing fence after that newline, so every
    # opening after the last newline that precedes the last ``` fails, and each failed attempt reads
    # to the end of the text: a line of "``` " * n cost n squared steps, on every completion of every
    # step. Every match ends by the first ``` after that newline, so the search stops there; the
    # openings before it all succeed, and the search is linear with the same matches.
    last = text.rfind("```")
    newline = text.rfind("\n", 0, last) if last > 0 else -1
    if newline < 0:
        return []
    end = text.find("```", newline + 1) + 3
    return [(lang.lower() if lang else lang, body) for lang, body in _FENCE.findall(text, 0, end)]


def extract_code(text: str, languages: tuple[str, ...] = ("python", "py", "python3")) -> str:
    """The last fenced block in one of ``languages`` (else the last untagged one), else the whole text."""
    blocks = fenced_blocks(text)
    for lang in (languages, ("",)):
        chosen = [b for l, b in blocks if l in lang]
        if chosen:
            return chosen[-1]
    return text
