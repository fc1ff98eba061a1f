"""Reference reward functions with TRL's reward-function signature.

Each is a callable ``f(prompts=..., completions=..., **dataset_columns) -> list[float | None]``,
usable as it is in ``GRPOTrainer(reward_funcs=[...])`` with plain-text or conversational
completions, and as a ``--reference`` in ``grpo-monitor inspect-rewards``. Light to import:
``math-verify``, ``jsonschema`` and the sandbox load on first use.

* ``exact_match`` / ``ExactMatchReward``: final-answer correctness (``\\boxed{}``, ``<answer>``,
  ``####``, last number; math-verify equivalence); ``exact_match_string``, its plain-string mode.
* ``json_schema`` / ``SchemaReward``: JSON in the completion validated against a JSON Schema.
* ``unit_test_reward`` / ``UnitTestReward``: share of the example's tests passed, in a sandbox.
* ``SoftOverlong``: DAPO's soft overlong punishment around any reward.
* ``JudgeReward``: rubric-as-reward through an OpenAI-compatible endpoint or a local model.
* ``format_and_correctness()``: the recipe's format + correctness pair.

See docs/REWARDS.md.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "exact_match": "correctness", "exact_match_string": "correctness", "ExactMatchReward": "correctness",
    "extract_answer": "correctness",
    "json_schema": "schema", "SchemaReward": "schema", "extract_json": "schema",
    "unit_test_reward": "unit_tests", "UnitTestReward": "unit_tests", "SplitTest": "unit_tests",
    "Sandbox": "sandbox", "Limits": "sandbox", "SandboxRefused": "sandbox",
    "SoftOverlong": "length", "soft_overlong_penalty": "length",
    "JudgeReward": "judge", "local_judge": "judge", "parse_score": "judge",
    "FormatReward": "composite", "answer_format": "composite", "format_and_correctness": "composite",
    "REFERENCES": "registry", "resolve_reference": "registry",
}

__all__ = sorted(_EXPORTS)


def __dir__() -> list[str]:
    # The names load on first use; dir() and tab completion list them all the same.
    return sorted(set(__all__) | {k for k in globals() if k.startswith("__")})


def __getattr__(name: str) -> Any:
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module 'grpo_monitor.rewards' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"grpo_monitor.rewards.{mod}"), name)
    globals()[name] = value
    return value
