"""Reference rewards by name, for ``inspect-rewards --reference NAME=REFERENCE``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _exact() -> Any:
    from grpo_monitor.monitor.rewards.correctness import ExactMatchReward

    return ExactMatchReward()


def _exact_string() -> Any:
    from grpo_monitor.monitor.rewards.correctness import ExactMatchReward

    return ExactMatchReward(mode="string", name="exact_match_string")


def _schema() -> Any:
    from grpo_monitor.monitor.rewards.schema import SchemaReward

    return SchemaReward()


def _unit() -> Any:
    from grpo_monitor.monitor.rewards.unit_tests import UnitTestReward

    return UnitTestReward()


def _format(fmt: str) -> Callable[[], Any]:
    def make() -> Any:
        from grpo_monitor.monitor.rewards.composite import FormatReward

        return FormatReward(fmt, name=f"{fmt}_format")

    return make


REFERENCES: dict[str, Callable[[], Any]] = {
    "exact_match": _exact,
    "exact_match_string": _exact_string,
    "json_schema": _schema,
    "unit_tests": _unit,
    "answer_format": _format("answer_tag"),
    "think_answer_format": _format("think_answer"),
    "boxed_format": _format("boxed"),
}


def resolve_reference(ref: str) -> Any:
    """A reference reward by registry name, or any ``module:function`` import string."""
    if ref in REFERENCES:
        return REFERENCES[ref]()
    if ":" in ref:
        from grpo_monitor.monitor.preflight.reward_gate import load_reward_func

        return load_reward_func(ref)
    raise ValueError(f"unknown reference {ref!r}: use one of {', '.join(sorted(REFERENCES))} or module:function")
