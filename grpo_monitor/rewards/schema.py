"""Schema validation: the JSON in a completion (fenced or bare) validated against a JSON Schema.

Scores: 1.0 when the JSON validates; ``partial`` (default 0.5) when JSON parses but does not
validate; 0.0 when the completion holds no parseable JSON; None when the example has no usable
schema. The validator is ``jsonschema`` (the draft the schema's ``$schema`` names, else the latest),
imported on first use; each distinct schema is checked and compiled once.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from grpo_monitor.rewards._text import completion_text, fenced_blocks, row_value

logger = logging.getLogger(__name__)
_NOTHING = object()


# Bounds on the work per completion, which the policy writes. Fenced JSON is read whole, whatever
# its size, from the last ``FENCE_TRIES`` json/untagged blocks back (a completion has a few; "```\n"
# repeated has a block every 8 characters). Bare JSON is looked for in the last ``BARE_JSON_WINDOW``
# characters (32 Ki, some 8k tokens: an answer is at the end, and a longer one is fenced), and
# parses that fail may read ``BARE_JSON_WORK`` characters in all: a truncated answer costs its
# nesting depth times its length, "[" * n (or "[1," * n) would cost up to the interpreter's
# recursion limit times n.
FENCE_TRIES = 64
BARE_JSON_WINDOW = 32 * 1024
BARE_JSON_WORK = 16 * BARE_JSON_WINDOW
# Where a JSON object or array can begin: "{" must be followed by a key or "}", "[" by a value or "]"
# (JSON whitespace between). Any other "{" or "[" fails to parse, so skipping it changes nothing.
_JSON_START = re.compile(r'\{[ \t\n\r]*["}]|\[[ \t\n\r]*[\]\[{"ntfNI0-9-]')
# A failed parse formats its error with the line number: counting newlines from the start of the
# string it was given. Parses run on a copy that starts at most this far before them.
_RESLICE = 256


def extract_json(text: str) -> Any:
    """The JSON value in ``text``: the last ```json (or untagged) fenced block that parses, else the
    last object or array that parses anywhere in the text; ``None`` is returned as a value only when
    the JSON is ``null``, so absence is the sentinel ``extract_json.NOTHING``."""
    tries = 0
    for lang, body in reversed(fenced_blocks(text)):
        if lang in ("json", "jsonc", ""):
            try:
                return json.loads(body)
            except (ValueError, RecursionError):
                tries += 1
                if tries >= FENCE_TRIES:
                    break
    dec = json.JSONDecoder()
    found: Any = _NOTHING
    off = i = max(0, len(text) - BARE_JSON_WINDOW)
    doc = text[off:]
    work = BARE_JSON_WORK
    while work > 0:
        if i - off > _RESLICE:
            doc, off = text[i:], i
        m = _JSON_START.search(doc, i - off)
        if m is None:
            break
        start = m.start()
        try:
            value, end = dec.raw_decode(doc, start)
            found, i = value, off + end
        except RecursionError:
            work -= len(doc) - start
            i = off + start + 1
        except ValueError as exc:
            work -= max(1, getattr(exc, "pos", start) - start)
            i = off + start + 1
    return found


extract_json.NOTHING = _NOTHING  # type: ignore[attr-defined]


class SchemaReward:
    """TRL reward function: does the completion's JSON satisfy the schema?

    ``schema``: one JSON Schema for every example, or None to read it per example from
    ``schema_column`` (a dict or a JSON string; default column ``schema``).
    """

    def __init__(self, schema: Mapping[str, Any] | None = None, schema_column: str = "schema", partial: float = 0.5,
                 name: str = "json_schema") -> None:
        self.schema = dict(schema) if schema is not None else None
        self.schema_column = schema_column
        self.partial = float(partial)
        self.__name__ = name
        self._validators: dict[str, Any] = {}
        self._lock = threading.Lock()
        if self.schema is not None:
            self._validator(self.schema)  # a broken fixed schema is the caller's error: say so now

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_validators", "_lock")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._validators, self._lock = {}, threading.Lock()

    def _validator(self, schema: Mapping[str, Any]) -> Any:
        import jsonschema

        key = json.dumps(schema, sort_keys=True, default=str)
        with self._lock:
            v = self._validators.get(key)
            if v is None:
                cls = jsonschema.validators.validator_for(schema)
                cls.check_schema(schema)
                v = self._validators[key] = cls(schema)
            return v

    def score_one(self, completion: Any, schema: Any) -> float | None:
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError:
                return None
        if not isinstance(schema, (Mapping, bool)):
            return None
        try:
            validator = self._validator(schema)  # type: ignore[arg-type]
        except Exception:
            return None
        value = extract_json(completion_text(completion))
        if value is _NOTHING:
            return 0.0
        return 1.0 if validator.is_valid(value) else self.partial

    def __call__(self, prompts: Sequence[Any] | None = None, completions: Sequence[Any] | None = None,
                 **kwargs: Any) -> list[float | None]:
        out: list[float | None] = []
        for i, c in enumerate(completions or []):
            schema = self.schema if self.schema is not None else row_value(kwargs, self.schema_column, i)
            try:
                out.append(self.score_one(c, schema))
            except Exception:
                out.append(None)
        return out


json_schema = SchemaReward()
