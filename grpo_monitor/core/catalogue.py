"""The variant catalogue, validated against the GRPOConfig that is actually installed.

TRL's config accepts any ``loss_type``, ``importance_sampling_level`` or ``vllm_importance_sampling_mode``
string and fails only at the first training step (or the first vLLM generation), so the accepted
values are read from the installed trainer's own source (every ``loss_type == "..."`` /
``loss_type in [...]`` it branches on) and checked here, before a restart spends GPU time on a typo. Field names and value types come from ``GRPOConfig``'s
dataclass fields.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Mapping
from typing import Any

from grpo_monitor.detectors.variants import VARIANT_PRESETS, preset

# Fields whose accepted values TRL does not enforce in the config itself.
CHOICE_FIELDS = ("loss_type", "importance_sampling_level", "scale_rewards", "vllm_importance_sampling_mode", "vllm_mode")


class CatalogueError(ValueError):
    """An override the installed TRL would not accept; the message names the TRL version."""


@functools.lru_cache(maxsize=1)
def installed() -> tuple[str, dict[str, dataclasses.Field], dict[str, frozenset[str]]]:
    import inspect

    import trl
    from trl import GRPOConfig
    from trl.trainer import grpo_trainer

    fields = {f.name: f for f in dataclasses.fields(GRPOConfig)}
    source = inspect.getsource(grpo_trainer) + inspect.getsource(inspect.getmodule(GRPOConfig))
    choices: dict[str, frozenset[str]] = {}
    for name in CHOICE_FIELDS:
        found: set[str] = set()
        for m in re.finditer(rf"(?:self|args)\.{name}\s*(?:==|!=)\s*[\"'](\w+)[\"']", source):
            found.add(m.group(1))
        for m in re.finditer(rf"(?:self|args)\.{name}\s+(?:not\s+)?in\s+[\[\(\{{]([^\]\)\}}]*)[\]\)\}}]", source):
            found.update(re.findall(r"[\"'](\w+)[\"']", m.group(1)))
        default = fields[name].default if name in fields else None
        if isinstance(default, str):
            found.add(default)
        if found:
            choices[name] = frozenset(found)
    return trl.__version__, fields, choices


def _type_ok(field: dataclasses.Field, value: Any) -> bool:
    hint = field.type
    if isinstance(hint, str):
        text = hint
    else:
        text = str(hint)
    if value is None:
        return "None" in text or "Optional" in text
    if isinstance(value, bool):
        return "bool" in text
    if isinstance(value, int):
        return any(t in text for t in ("int", "float"))
    if isinstance(value, float):
        return "float" in text
    if isinstance(value, str):
        return "str" in text or "Literal" in text or "enum" in text.lower() or "Union" in text
    return True


def validate(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Check every override against the installed ``GRPOConfig``; return them unchanged or raise."""
    version, fields, choices = installed()
    for key, value in overrides.items():
        if key not in fields:
            raise CatalogueError(f"GRPOConfig of TRL {version} has no field {key!r}")
        if key in choices and value not in choices[key]:
            raise CatalogueError(
                f"TRL {version} does not accept {key}={value!r} (accepted: {', '.join(sorted(choices[key]))})"
            )
        if not _type_ok(fields[key], value):
            raise CatalogueError(f"TRL {version}: {key}={value!r} has the wrong type for {fields[key].type}")
    return dict(overrides)


def catalogue(config: Mapping[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """Every variant's overrides for ``config``, each validated against the installed TRL."""
    return {name: validate(preset(name, config)) for name in VARIANT_PRESETS}


def apply_overrides(args: Any, overrides: Mapping[str, Any]) -> Any:
    """A copy of a ``GRPOConfig`` with ``overrides`` applied (validated first); derived fields are recomputed."""
    validate(overrides)
    if "generation_batch_size" not in overrides:
        # TRL fills both fields in __post_init__ and refuses both set on input: keep steps_per_generation
        # (the one the overrides speak of) and let generation_batch_size be derived again.
        overrides = {**overrides, "generation_batch_size": None}
    kwargs = {f.name: getattr(args, f.name) for f in dataclasses.fields(args) if f.init}
    kwargs.update(overrides)
    return type(args)(**kwargs)

