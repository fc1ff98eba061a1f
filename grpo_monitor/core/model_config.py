"""Reading a transformers model config without torch: the decoder's part of a composite config,
and its mixture-of-experts layout. Shared by the run header (``callbacks``), the router tap and
the memory estimate, so all of them agree on which layers route.

Example::

    >>> facts = moe_facts({"num_hidden_layers": 4, "num_experts": 8, "num_experts_per_tok": 2, "mlp_only_layers": [0]})
    >>> (facts["is_moe"], facts["num_experts"], facts["top_k"], facts["moe_layers"])
    (True, 8, 2, [1, 2, 3])
"""

from __future__ import annotations

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
