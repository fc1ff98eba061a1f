"""One answer everywhere to "is this value a number": a bool is not one, a numeric string is (transformers
prints values as strings), a NaN or an infinity is a number that is not finite. Readers, detectors, reports,
the dashboard and the pre-flight all coerce through these functions.
"""

from __future__ import annotations

import math
from typing import Any



def to_number(value: Any, bools: bool = False) -> float | None:
    """A logged value as a float, NaN and infinities kept (they are evidence); None for a gap, a bool or
    anything that is not a number. ``bools=True`` reads a bool as 1.0 or 0.0, as TRL's tensor conversion
    reads a reward function's ``True``/``False`` (and as a run log keeps a logged flag).

    >>> to_number("0.55"), to_number(" NaN "), to_number(True), to_number(None), to_number("n/a")
    (0.55, nan, None, None, None)
    >>> to_number(True, bools=True), to_number(10**400)
    (1.0, inf)
    """
    if type(value) is float:  # nearly every value a reader or a detector meets
        return value
    if value is None:
        return None
    if isinstance(value, bool):
        return float(value) if bools else None
    if isinstance(value, str):
        text = value.strip()
        if not text or text.lower() in ("none", "null"):
            return None
    try:  # ints, strings, numpy scalars, 0-d tensors
        return float(value)
    except (TypeError, ValueError):
        return None
    except OverflowError:  # an integer beyond float range (JSON allows it)
        return math.inf if value > 0 else -math.inf


def number_or_nan(value: Any) -> float:
    """``to_number`` with a gap as NaN: a cell of a numeric column.

    >>> number_or_nan(None), number_or_nan("3")
    (nan, 3.0)
    """
    x = to_number(value)
    return math.nan if x is None else x


def finite(value: Any) -> float | None:
    """The value as a float when it is a finite number, else None (a gap, a non-finite value, a bool).

    >>> finite(3), finite("2.5"), finite(float("inf")), finite(False)
    (3.0, 2.5, None, None)
    """
    if type(value) is float:  # nearly every logged value, and every detector reads every step through here
        return value if math.isfinite(value) else None
    x = to_number(value)
    return x if x is not None and math.isfinite(x) else None
