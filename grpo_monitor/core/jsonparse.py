"""JSON parsing for the log readers: orjson's speed with the standard library's leniency.

A 100k-step log is over a hundred megabytes of JSON, and the standard library's parser is most of
the time it takes to read one. orjson parses the same documents about four times faster, but it
refuses what ``json`` accepts and what real logs hold: ``NaN``/``Infinity`` literals (transformers
writes them into ``trainer_state.json``), integers beyond 64 bits, text in other encodings. So
every document goes to orjson first and, when orjson refuses it, to ``json``, whose answer
(value or error) is the one that counts. Both give identical values where both accept, but for
integer literals beyond 64 bits, which orjson reads as the nearest float (a metric becomes that
float either way; a step that large is refused either way).

>>> loads(b'{"loss": 0.5, "grad_norm": NaN}')["grad_norm"]
nan
>>> loads(b'{"step": 1}')
{'step': 1}
"""

from __future__ import annotations

import json
from typing import Any

try:
    from orjson import loads as _fast_loads
except ImportError:  # orjson is a dependency, but the readers must work without its wheel
    _fast_loads = None


def _loads(data: bytes | str) -> Any:
    try:
        return _fast_loads(data)  # type: ignore[misc]
    except ValueError:  # orjson.JSONDecodeError is a ValueError; the standard parser decides
        return json.loads(data)


loads = json.loads if _fast_loads is None else _loads
# orjson alone (None without its wheel), for a caller that relies on its refusals: it parses no
# document nested deeper than 1024 levels, whatever Python's recursion limit is.
fast_loads = _fast_loads
