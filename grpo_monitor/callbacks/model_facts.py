"""What the run header says about the model: class, size, and mixture-of-experts layout."""

from __future__ import annotations

from typing import Any

from grpo_monitor.core.model_config import VLM_HINTS, moe_facts


def model_facts(model: Any) -> dict[str, Any]:
    config = getattr(model, "config", None)
    base = getattr(model, "base_model", model)  # PEFT wraps the model; report what is trained
    facts: dict[str, Any] = {
        "class": type(getattr(base, "model", base)).__name__ if hasattr(model, "peft_config") else type(model).__name__,
        "model_type": getattr(config, "model_type", None),
        "name_or_path": getattr(config, "_name_or_path", None) or None,
        "is_vlm": bool(config is not None and any(hasattr(config, k) for k in VLM_HINTS)),
    }
    try:
        facts["num_parameters"] = int(sum(p.numel() for p in model.parameters()))
        facts["trainable_parameters"] = int(sum(p.numel() for p in model.parameters() if p.requires_grad))
    except Exception:
        facts["num_parameters"] = None
    facts.update(moe_facts(config) if config is not None else {"is_moe": False, "num_experts": None, "top_k": None, "num_layers": 0, "moe_layers": []})
    return facts
