"""Reading a transformers model config without torch: the decoder's part of a composite config,
and its mixture-of-experts layout. Shared by the run header (``callbacks``), the router tap, the
memory estimate and the offline readers (a checkpoint's ``config.json``, ``analyze --model``), so all
of them agree on which layers route; and the one table of well-known MoE hub ids, for a model known
only by its name (lint's recipe check, ``analyze --model Qwen/Qwen3-30B-A3B``).

Example::

    >>> facts = moe_facts({"num_hidden_layers": 4, "num_experts": 8, "num_experts_per_tok": 2, "mlp_only_layers": [0]})
    >>> (facts["is_moe"], facts["num_experts"], facts["top_k"], facts["moe_layers"])
    (True, 8, 2, [1, 2, 3])
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
_TOPK_KEYS = ("num_experts_per_tok", "experts_per_token", "num_experts_per_token", "moe_topk", "moe_k")
_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers")
_TEXT_KEYS = ("text_config", "language_config", "llm_config")
VLM_HINTS = ("vision_config", "vision_tower", "image_token_id", "image_token_index")


def config_value(config: Any, key: str) -> Any:
    """``config.key`` for a config object, ``config[key]`` for its dict form; None when absent."""
    if isinstance(config, Mapping):
        return config.get(key)
    try:
        return getattr(config, key, None)
    except Exception:  # some configs raise other errors for unknown attributes
        return None


def first_int(config: Any, keys: tuple[str, ...]) -> int | None:
    for key in keys:
        value = config_value(config, key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def text_config(config: Any) -> Any:
    """The part of a (possibly composite, vision-language) config that describes the decoder."""
    if config is None:
        return None
    if first_int(config, _EXPERT_KEYS) is not None:
        return config
    for key in _TEXT_KEYS:
        sub = config_value(config, key)
        if sub is not None:
            return sub
    return config


def moe_facts(config: Any) -> dict[str, Any]:
    """``{"is_moe", "num_experts", "top_k", "num_layers", "moe_layers"}`` from a transformers config.

    Accepts a ``PretrainedConfig`` or its ``to_dict()`` form. Dense-first layers
    (``first_k_dense_replace``, with ``moe_layer_freq``), sparse steps and ``mlp_only_layers``
    (Qwen-MoE) and explicit ``mlp_layer_types`` lists are honoured. A dense model gives
    ``is_moe=False``, ``num_experts=None`` and no MoE layers.
    """
    text = text_config(config)
    num_layers = first_int(text, _LAYER_KEYS) or 0
    experts = first_int(text, _EXPERT_KEYS)
    top_k = first_int(text, _TOPK_KEYS)
    is_moe = bool(experts and experts > 1)
    moe_layers: list[int] = []
    if is_moe:
        layer_types = config_value(text, "mlp_layer_types")
        if isinstance(layer_types, (list, tuple)) and len(layer_types) == num_layers:
            moe_layers = [i for i, t in enumerate(layer_types) if str(t).lower() in ("sparse", "moe", "experts")]
        else:
            first_dense = int(config_value(text, "first_k_dense_replace") or 0)
            freq = int(config_value(text, "moe_layer_freq") or 1) if first_dense else 1
            step = int(config_value(text, "decoder_sparse_step") or 1)
            mlp_only = set(config_value(text, "mlp_only_layers") or [])
            for i in range(num_layers):
                if i < first_dense or i in mlp_only:
                    continue
                if freq > 1 and i % freq != 0:
                    continue
                if step > 1 and (i + 1) % step != 0:
                    continue
                moe_layers.append(i)
    else:
        experts = None
        top_k = None
    return {"is_moe": is_moe, "num_experts": experts, "top_k": top_k, "num_layers": num_layers, "moe_layers": moe_layers}


# Mixture-of-experts families known by their hub ids, for a model with no local config:
# (pattern, experts, top-k). Qwen's "-A<n>B" names give the active size of an MoE.
MOE_MODEL_IDS: tuple[tuple[str, int | None, int | None], ...] = (
    (r"qwen3-30b-a3b", 128, 8),
    (r"qwen3-235b-a22b", 128, 8),
    (r"qwen3-next-80b-a3b", 512, 10),
    (r"qwen1\.5-moe-a2\.7b", 60, 4),
    (r"qwen2-57b-a14b", 64, 8),
    (r"mixtral-8x7b", 8, 2),
    (r"mixtral-8x22b", 8, 2),
    (r"deepseek-v3", 256, 8),
    (r"deepseek-r1(?!-distill)", 256, 8),
    (r"deepseek-v2", 160, 6),
    (r"olmoe-", 64, 8),
    (r"gpt-oss-20b", 32, 4),
    (r"gpt-oss-120b", 128, 4),
    (r"-a\d+(?:\.\d+)?b(?:$|[-_])", None, None),
)


def moe_from_model_id(model_id: Any) -> dict[str, Any]:
    """Model facts for a well-known MoE hub id (``{}`` when the id says nothing).

    >>> moe_from_model_id("Qwen/Qwen3-30B-A3B")["num_experts"], moe_from_model_id("Qwen/Qwen3-4B")
    (128, {})
    """
    if not isinstance(model_id, str) or not model_id:
        return {}
    name = model_id.lower().rstrip("/")
    for pattern, experts, top_k in MOE_MODEL_IDS:
        if re.search(pattern, name):
            return {"is_moe": True, "num_experts": experts, "top_k": top_k, "source": f"model id {model_id}"}
    return {}


def config_model_facts(config: Mapping[str, Any], name: str | None = None) -> dict[str, Any]:
    """The run header's model facts from a ``config.json`` as a dict (no torch, no parameter count):
    class, type, name, whether it is a vision-language model, and the MoE layout.

    >>> f = config_model_facts({"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
    ...                         "num_hidden_layers": 2, "num_experts": 8, "num_experts_per_tok": 2})
    >>> f["class"], f["is_moe"], f["num_experts"], f["top_k"], f["moe_layers"]
    ('Qwen3MoeForCausalLM', True, 8, 2, [0, 1])
    """
    arch = config.get("architectures")
    facts: dict[str, Any] = {
        "class": arch[0] if isinstance(arch, list) and arch and isinstance(arch[0], str) else None,
        "model_type": config.get("model_type") if isinstance(config.get("model_type"), str) else None,
        "name_or_path": name or (config.get("_name_or_path") if isinstance(config.get("_name_or_path"), str) else None),
        "is_vlm": any(k in config for k in VLM_HINTS),
    }
    facts.update(moe_facts(config))
    return facts
