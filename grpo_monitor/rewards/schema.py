"""Schema validation: the JSON in a completion (fenced or bare) validated against a JSON Schema.

Scores: 1.0 when the JSON validates; ``partial`` (default 0.5) when JSON parses but does not
validate; 0.0 when the completion holds no parseable JSON; None when the example has no usable
schema. The validator is ``jsonschema`` (the draft the schema's ``$schema`` names, else the latest),
imported on first use; each distinct schema is checked and compiled once.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from grpo_monitor.rewards._text import completion_text, fenced_blocks, row_value

logger = logging.getLogger(__name__)
_NOTHING = object()


def extract_json(text: str) -> Any:
    """The JSON value in ``text``: the last ```json (or untagged) fenced block that parses, else the
    last object or array that parses anywhere in the text; ``None`` is returned as a value only when
    the JSON is ``null``, so absence is the sentinel ``extract_json.NOTHING``."""
    for lang, body in reversed(fenced_blocks(text)):
        if lang in ("json", "jsonc", ""):
            try:
                return json.loads(body)
            except ValueError:
                continue
    dec = json.JSONDecoder()
    found: Any = _NOTHING
    i = 0
    while True:
        starts = [p for p in (text.find("{", i), text.find("[", i)) if p >= 0]
        if not starts:
            break
        start = min(starts)
        try:
            value, end = dec.raw_decode(text, start)
            found, i = value, end
        except ValueError:
            i = start + 1
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
