"""What the run header says about the model: class, size, and mixture-of-experts layout."""

from __future__ import annotations

from typing import Any

_EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")
_TOPK_KEYS = ("num_experts_per_tok", "experts_per_token", "moe_topk", "top_k")
_VLM_HINTS = ("vision_config", "vision_tower", "image_token_id", "image_token_index")


def _first(config: Any, keys: tuple[str, ...]) -> Any:
    for k in keys:
        v = getattr(config, k, None)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None


def moe_facts(config: Any) -> dict[str, Any]:
    """MoE layout from a transformers config: experts, top-k, layers, and which layers route.

    Handles dense-first layers (DeepSeek-V3 ``first_k_dense_replace``), sparse steps and
    ``mlp_only_layers`` (Qwen-MoE). A composite config (vision-language) is read through its text config.
    """
    text = getattr(config, "text_config", None) or config
    if callable(getattr(text, "get_text_config", None)):
        text = text.get_text_config() or text
    layers = int(getattr(text, "num_hidden_layers", 0) or 0)
    experts = _first(text, _EXPERT_KEYS)
    top_k = _first(text, _TOPK_KEYS)
    is_moe = bool(experts and experts > 1)
    moe_layers: list[int] = []
    if is_moe:
        first_dense = int(getattr(text, "first_k_dense_replace", 0) or 0)
        step = int(getattr(text, "decoder_sparse_step", 1) or 1)
        mlp_only = set(getattr(text, "mlp_only_layers", None) or [])
        for i in range(layers):
            if i < first_dense or i in mlp_only or (step > 1 and (i + 1) % step != 0):
                continue
            moe_layers.append(i)
    return {
        "is_moe": is_moe,
        "num_experts": experts if is_moe else None,
        "top_k": top_k if is_moe else None,
        "num_layers": layers,
        "moe_layers": moe_layers,
    }


def model_facts(model: Any) -> dict[str, Any]:
    config = getattr(model, "config", None)
    base = getattr(model, "base_model", model)  # PEFT wraps the model; report what is trained
    facts: dict[str, Any] = {
        "class": type(getattr(base, "model", base)).__name__ if hasattr(model, "peft_config") else type(model).__name__,
        "model_type": getattr(config, "model_type", None),
        "name_or_path": getattr(config, "_name_or_path", None) or None,
        "is_vlm": bool(config is not None and any(hasattr(config, k) for k in _VLM_HINTS)),
    }
    try:
        facts["num_parameters"] = int(sum(p.numel() for p in model.parameters()))
        facts["trainable_parameters"] = int(sum(p.numel() for p in model.parameters() if p.requires_grad))
    except Exception:
        facts["num_parameters"] = None
    facts.update(moe_facts(config) if config is not None else moe_facts(object()))
    return facts
