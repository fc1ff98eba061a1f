"""Reward functions by name: the reference rewards (``inspect-rewards --reference NAME=REFERENCE``) and any
``module:function`` a user names."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from typing import Any


class RewardSpecError(ValueError):
    """A reward function named by ``module:function`` that cannot be loaded."""


def load_reward_func(spec: str) -> Callable[..., Any]:
    """``module:function`` (or TRL's dotted ``module.function``) as a callable; the current
    directory is importable, as in ``trl grpo``."""
    if ":" in spec:
        module_name, _, attr = spec.partition(":")
    elif "." in spec:
        module_name, _, attr = spec.rpartition(".")
    else:
        raise RewardSpecError(f"{spec}: expected module:function (e.g. fixtures.tiny:format_reward)")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise RewardSpecError(f"{spec}: cannot import {module_name} ({type(exc).__name__}: {exc})") from None
    obj: Any = module
    for part in attr.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise RewardSpecError(f"{spec}: {module_name} has no {attr}")
    if not callable(obj):
        raise RewardSpecError(f"{spec}: {attr} is not callable")
    return obj


def _exact(column: str | None = None) -> Any:
    from grpo_monitor.rewards.correctness import ExactMatchReward

    return ExactMatchReward(answer_column=column)


def _exact_string(column: str | None = None) -> Any:
    from grpo_monitor.rewards.correctness import ExactMatchReward

    return ExactMatchReward(answer_column=column, mode="string", name="exact_match_string")


def _schema(column: str | None = None) -> Any:
    from grpo_monitor.rewards.schema import SchemaReward

    return SchemaReward(schema_column=column) if column else SchemaReward()


def _unit(column: str | None = None) -> Any:
    from grpo_monitor.rewards.unit_tests import UnitTestReward

    return UnitTestReward(tests_column=column)


def _format(fmt: str) -> Callable[[], Any]:
    def make() -> Any:
        from grpo_monitor.rewards.composite import FormatReward

        return FormatReward(fmt, name=f"{fmt}_format")

    return make


# Reference name -> factory; those that read a dataset column take its name (``exact_match:gold``).
REFERENCES: dict[str, Callable[..., Any]] = {
    "exact_match": _exact,
    "exact_match_string": _exact_string,
    "json_schema": _schema,
    "unit_tests": _unit,
    "answer_format": _format("answer_tag"),
    "think_answer_format": _format("think_answer"),
    "boxed_format": _format("boxed"),
}
COLUMN_REFERENCES = {"exact_match": "gold answer", "exact_match_string": "gold answer", "json_schema": "schema",
                     "unit_tests": "tests"}


def resolve_reference(ref: str) -> Any:
    """A reference reward by registry name, ``NAME:COLUMN`` for one that reads a dataset column under
    another name (``exact_match:gold``: the gold answer is in column ``gold``), or any
    ``module:function`` import string (a registry name before the colon wins).

    >>> resolve_reference("exact_match:gold").answer_column, resolve_reference("exact_match").answer_column
    ('gold', None)
    """
    if ref in REFERENCES:
        return REFERENCES[ref]()
    name, sep, column = ref.partition(":")
    if sep and name in REFERENCES:
        if name not in COLUMN_REFERENCES:
            raise ValueError(f"{name} reads no dataset column (references that do: {', '.join(COLUMN_REFERENCES)})")
        if not column.strip():
            raise ValueError(f"{ref}: name the column after the colon, e.g. {name}:gold")
        return REFERENCES[name](column.strip())
    if sep:
        return load_reward_func(ref)
    raise ValueError(f"unknown reference {ref!r}: use one of {', '.join(sorted(REFERENCES))}, NAME:COLUMN "
                     "(exact_match:gold) or module:function")
