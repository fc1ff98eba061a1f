"""Mixture-of-experts layout of a transformers model: config facts and router discovery.

``moe_facts`` reads a config (or its dict form) without touching torch; ``find_routers`` walks a
built model and returns one :class:`RouterSpec` per routing layer.

Routers are recognised by what they are, not by where they sit: a module whose own 2-D ``weight``
maps the hidden size onto the expert count, and which either has a router-like class name
(``Qwen3MoeTopKRouter``, ``DeepseekV3TopkRouter``, ``...Gate``) or sits next to an expert bank with
that many experts (a ``ModuleList`` of experts, or stacked 3-D expert weights). Attribute names
(``mlp.gate``, ``mlp.router``, ``block_sparse_moe.gate``) are never required, so a renamed or
wrapped (PEFT, DDP) model is read the same way.

Example::

    >>> from transformers import Qwen3MoeConfig
    >>> cfg = Qwen3MoeConfig(num_hidden_layers=4, num_experts=8, num_experts_per_tok=2, mlp_only_layers=[0])
    >>> f = moe_facts(cfg)
    >>> (f["is_moe"], f["num_experts"], f["top_k"], f["moe_layers"])
    (True, 8, 2, [1, 2, 3])
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

from grpo_monitor.core.model_config import config_value, first_int, moe_facts, text_config  # noqa: F401  (moe_facts: public here too)

# Routing distributions (what the router's entropy and flip rate are measured on):
#   "softmax"       softmax over all experts (Qwen2/3-MoE, Mixtral, OLMoE and most top-k routers);
#   "topk_softmax"  softmax over the selected top-k logits only (gpt-oss: the other experts get no
#                   probability mass at all, so an all-expert softmax would describe a distribution
#                   the model never forms);
#   "sigmoid"       per-expert sigmoid affinities normalised to sum to one (DeepSeek-V3 and its
#                   descendants; selection is on these affinities plus a balancing bias, within the
#                   best groups, and the mixing weights are the same affinities renormalised over the
#                   chosen experts).
KINDS = ("softmax", "topk_softmax", "sigmoid")
_TOPK_SOFTMAX_MODEL_TYPES = frozenset({"gpt_oss"})
_ROUTER_CLASS = re.compile(r"(router|gate|gating)$", re.IGNORECASE)


@dataclasses.dataclass
class RouterSpec:
    """One router: where it is, its geometry, and how its output is read."""

    name: str
    module: Any
    layer: int
    num_experts: int
    top_k: int
    kind: str

    @property
    def entropy_max(self) -> float:
        """Largest possible entropy of this router's distribution (nats), for normalisation."""
        n = self.top_k if self.kind == "topk_softmax" else self.num_experts
        return math.log(n) if n > 1 else 1.0


def _layer_index(name: str) -> int | None:
    for part in name.split("."):
        if part.isdigit():
            return int(part)
    return None


def _own_weight(module: Any) -> Any:
    params = getattr(module, "_parameters", None) or {}
    w = params.get("weight")
    return w if w is not None and w.dim() == 2 else None


def _next_to_experts(parent: Any, module: Any, num_experts: int) -> bool:
    import torch.nn as nn

    for child in parent.children():
        if child is module:
            continue
        if isinstance(child, nn.ModuleList) and len(child) == num_experts:
            return True
        for p in child.parameters(recurse=True):
            if p.dim() == 3 and p.shape[0] == num_experts:
                return True
    return False


def _kind(module: Any, config: Any) -> str:
    names = set(getattr(module, "_buffers", {}) or {}) | set(getattr(module, "_parameters", {}) or {})
    if any("correction_bias" in n for n in names) or str(config_value(config, "scoring_func") or "").lower() == "sigmoid":
        return "sigmoid"
    model_type = str(config_value(config, "model_type") or "")
    if model_type in _TOPK_SOFTMAX_MODEL_TYPES or type(module).__name__.startswith("GptOss"):
        return "topk_softmax"
    return "softmax"


def find_routers(model: Any) -> tuple[list[RouterSpec], str | None]:
    """Every router of ``model``, one per layer, in layer order, and a problem note (or None).

    The note says why routing cannot be read (no router recognised, unknown top-k) or only partly
    (fewer routers than the config's MoE layers); an empty list with a note means "MoE, unreadable".
    """
    config = getattr(model, "config", None)
    facts = moe_facts(config) if config is not None else moe_facts({})
    text = text_config(config) if config is not None else {}
    hidden = first_int(text, ("hidden_size", "d_model", "n_embd"))
    want_experts = facts["num_experts"]
    modules = dict(model.named_modules())

    by_layer: dict[int, tuple[int, RouterSpec]] = {}
    order = 0
    for name, module in modules.items():
        w = _own_weight(module)
        if w is None:
            continue
        n_exp, in_dim = int(w.shape[0]), int(w.shape[1])
        if n_exp < 2 or (hidden is not None and in_dim != hidden):
            continue
        if want_experts is not None and n_exp != want_experts:
            continue
        cls = type(module).__name__
        typed = bool(_ROUTER_CLASS.search(cls)) and "proj" not in cls.lower()
        parent = modules.get(name.rsplit(".", 1)[0] if "." in name else "")
        placed = parent is not None and _next_to_experts(parent, module, n_exp)
        if not (typed or placed):
            continue
        top_k = getattr(module, "top_k", None)
        if not isinstance(top_k, int):
            top_k = facts["top_k"] if facts["top_k"] is not None else getattr(parent, "top_k", None)
        if not isinstance(top_k, int) or not 0 < top_k <= n_exp:
            return [], (f"MoE router {name} ({cls}) found but its top-k is unknown; MoE routing metrics are off")
        layer = _layer_index(name)
        spec = RouterSpec(name=name, module=module, layer=layer if layer is not None else order, num_experts=n_exp,
                          top_k=top_k, kind=_kind(module, text))
        rank = 0 if typed and placed else (1 if typed else 2)
        prev = by_layer.get(spec.layer)
        if prev is None or rank < prev[0]:
            by_layer[spec.layer] = (rank, spec)
        order += 1

    routers = [spec for _, (_, spec) in sorted(by_layer.items())]
    cls = type(model).__name__
    if not routers:
        if facts["is_moe"]:
            return [], (f"{cls} is a mixture-of-experts model ({facts['num_experts']} experts, top-{facts['top_k']}) "
                        f"but no router module was recognised; MoE routing metrics are off")
        return [], None
    if facts["is_moe"] and facts["moe_layers"] and len(routers) < len(facts["moe_layers"]):
        found = [r.layer for r in routers]
        return routers, (f"{cls}: routers recognised in {len(routers)} of {len(facts['moe_layers'])} MoE layers "
                         f"({found}); MoE routing metrics cover those layers only")
    return routers, None
