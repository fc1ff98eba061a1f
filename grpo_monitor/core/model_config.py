"""Reading a transformers model config without torch: the decoder's part of a composite config,
and its mixture-of-experts layout. Shared by the run header (``callbacks``), the router tap, the
memory estimate and the offline readers (a checkpoint's ``config.json``, ``analyze --model``), so all
of them agree on which layers route; and, for a model known only by its name (lint's recipe check and
memory estimate, ``analyze --model Qwen/Qwen3-30B-A3B``), the table of common architectures' config
shapes by hub id (``config_from_model_id``) and of well-known MoE families (``moe_from_model_id``).

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
    known = config_from_model_id(model_id)
    if known is not None:
        facts = moe_facts(known)
        if not facts["is_moe"]:
            return {}
        return {"is_moe": True, "num_experts": facts["num_experts"], "top_k": facts["top_k"],
                "source": f"model id {model_id}"}
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


# -- common architectures by hub id -----------------------------------------------------------------

def _arch(model_type: str, vocab: int, hidden: int, inter: int, layers: int, heads: int, kv: int,
          head_dim: int | None = None, tied: bool = False, **extra: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {"model_type": model_type, "vocab_size": vocab, "hidden_size": hidden,
                           "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": heads,
                           "num_key_value_heads": kv, "tie_word_embeddings": tied, "torch_dtype": "bfloat16"}
    if head_dim is not None:
        cfg["head_dim"] = head_dim
    cfg.update(extra)
    return cfg


_QWEN25 = {  # Qwen2.5 (and Qwen2, Math, Coder, R1-Distill-Qwen): attention biases, tied below 7B
    "0.5b": _arch("qwen2", 151936, 896, 4864, 24, 14, 2, tied=True),
    "1.5b": _arch("qwen2", 151936, 1536, 8960, 28, 12, 2, tied=True),
    "3b": _arch("qwen2", 151936, 2048, 11008, 36, 16, 2, tied=True),
    "7b": _arch("qwen2", 152064, 3584, 18944, 28, 28, 4),
    "14b": _arch("qwen2", 152064, 5120, 13824, 48, 40, 8),
    "32b": _arch("qwen2", 152064, 5120, 27648, 64, 40, 8),
    "72b": _arch("qwen2", 152064, 8192, 29568, 80, 64, 8),
}
_LLAMA3_8B = _arch("llama", 128256, 4096, 14336, 32, 32, 8)
_LLAMA3_70B = _arch("llama", 128256, 8192, 28672, 80, 64, 8)
_VISION = {"vision_config": {"model_type": "siglip_vision_model"}}
_MLA_V3 = dict(q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128)
_NOT_SIZE = r"(?![\d.])"  # "qwen3-8b" is not the start of "qwen3-8.5b" or "qwen3-80b"

# Config shapes of common open models, keyed by a pattern of their hub ids (lowercased, owner
# included), as their config.json files give them: what the memory estimate and the MoE check need
# for a model named by id with no local config. Most specific patterns first.
ARCHITECTURES: tuple[tuple[str, dict[str, Any]], ...] = (
    # Qwen3 (per-head q/k norms, head_dim 128); its MoE models
    (r"qwen3-30b-a3b", _arch("qwen3_moe", 151936, 2048, 6144, 48, 32, 4, 128, moe_intermediate_size=768,
                              num_experts=128, num_experts_per_tok=8)),
    (r"qwen3-235b-a22b", _arch("qwen3_moe", 151936, 4096, 12288, 94, 64, 4, 128, moe_intermediate_size=1536,
                                num_experts=128, num_experts_per_tok=8)),
    (r"qwen3-0\.6b" + _NOT_SIZE, _arch("qwen3", 151936, 1024, 3072, 28, 16, 8, 128, tied=True)),
    (r"qwen3-1\.7b" + _NOT_SIZE, _arch("qwen3", 151936, 2048, 6144, 28, 16, 8, 128, tied=True)),
    (r"qwen3-4b" + _NOT_SIZE, _arch("qwen3", 151936, 2560, 9728, 36, 32, 8, 128, tied=True)),
    (r"qwen3-8b" + _NOT_SIZE, _arch("qwen3", 151936, 4096, 12288, 36, 32, 8, 128)),
    (r"qwen3-14b" + _NOT_SIZE, _arch("qwen3", 151936, 5120, 17408, 40, 40, 8, 128)),
    (r"qwen3-32b" + _NOT_SIZE, _arch("qwen3", 151936, 5120, 25600, 64, 64, 8, 128)),
    # DeepSeek's distillations onto Qwen2.5 and Llama 3 bases (the 1.5B unties its embeddings)
    (r"deepseek-r1-distill-qwen-1\.5b", {**_QWEN25["1.5b"], "tie_word_embeddings": False}),
    *((r"deepseek-r1-distill-qwen-" + re.escape(size) + _NOT_SIZE, _QWEN25[size]) for size in ("7b", "14b", "32b")),
    (r"deepseek-r1-distill-llama-8b", _LLAMA3_8B),
    (r"deepseek-r1-distill-llama-70b", _LLAMA3_70B),
    # Qwen2 / Qwen2.5 and their Math, Coder and Instruct releases
    *((r"qwen2(?:\.5)?-(?:math-|coder-)?" + re.escape(size) + _NOT_SIZE, cfg) for size, cfg in _QWEN25.items()),
    # Llama 2, 3, 3.1, 3.2, 3.3
    (r"llama-3\.2-1b" + _NOT_SIZE, _arch("llama", 128256, 2048, 8192, 16, 32, 8, 64, tied=True)),
    (r"llama-3\.2-3b" + _NOT_SIZE, _arch("llama", 128256, 3072, 8192, 28, 24, 8, 128, tied=True)),
    (r"llama-3(?:\.1)?-8b" + _NOT_SIZE, _LLAMA3_8B),
    (r"llama-3(?:\.[13])?-70b" + _NOT_SIZE, _LLAMA3_70B),
    (r"llama-2-7b" + _NOT_SIZE, _arch("llama", 32000, 4096, 11008, 32, 32, 32)),
    (r"llama-2-13b" + _NOT_SIZE, _arch("llama", 32000, 5120, 13824, 40, 40, 40)),
    (r"llama-2-70b" + _NOT_SIZE, _arch("llama", 32000, 8192, 28672, 80, 64, 8)),
    # Mistral and Mixtral
    (r"mixtral-8x7b", _arch("mixtral", 32000, 4096, 14336, 32, 32, 8, num_local_experts=8, num_experts_per_tok=2)),
    (r"mixtral-8x22b", _arch("mixtral", 32768, 6144, 16384, 56, 48, 8, num_local_experts=8, num_experts_per_tok=2)),
    (r"mistral-7b.*v0\.3", _arch("mistral", 32768, 4096, 14336, 32, 32, 8)),
    (r"mistral-7b", _arch("mistral", 32000, 4096, 14336, 32, 32, 8)),
    (r"mistral-nemo", _arch("mistral", 131072, 5120, 14336, 40, 32, 8, 128)),
    (r"mistral-small-24b", _arch("mistral", 131072, 5120, 32768, 40, 32, 8, 128)),
    (r"mistral-small-3\.[12]-24b", _arch("mistral", 131072, 5120, 32768, 40, 32, 8, 128, **_VISION)),
    # Gemma 1, 2, 3 (tied embeddings; Gemma 3 from 4B up is a vision-language model)
    (r"gemma-3-1b", _arch("gemma3_text", 262144, 1152, 6912, 26, 4, 1, 256, tied=True)),
    (r"gemma-3-4b", _arch("gemma3", 262208, 2560, 10240, 34, 8, 4, 256, tied=True, **_VISION)),
    (r"gemma-3-12b", _arch("gemma3", 262208, 3840, 15360, 48, 16, 8, 256, tied=True, **_VISION)),
    (r"gemma-3-27b", _arch("gemma3", 262208, 5376, 21504, 62, 32, 16, 128, tied=True, **_VISION)),
    (r"gemma-2-2b", _arch("gemma2", 256000, 2304, 9216, 26, 8, 4, 256, tied=True)),
    (r"gemma-2-9b", _arch("gemma2", 256000, 3584, 14336, 42, 16, 8, 256, tied=True)),
    (r"gemma-2-27b", _arch("gemma2", 256000, 4608, 36864, 46, 32, 16, 128, tied=True)),
    (r"gemma-2b", _arch("gemma", 256000, 2048, 16384, 18, 8, 1, 256, tied=True)),
    (r"gemma-7b", _arch("gemma", 256000, 3072, 24576, 28, 16, 16, 256, tied=True)),
    # Phi-3, 3.5 and 4
    (r"phi-4-mini", _arch("phi3", 200064, 3072, 8192, 32, 24, 8, 128, tied=True)),
    (r"phi-4" + _NOT_SIZE, _arch("phi3", 100352, 5120, 17920, 40, 40, 10)),
    (r"phi-3(?:\.5)?-mini", _arch("phi3", 32064, 3072, 8192, 32, 32, 32)),
    (r"phi-3-medium", _arch("phi3", 32064, 5120, 17920, 40, 40, 10)),
    # DeepSeek's own models: V3 and R1 (multi-head latent attention, 3 dense layers then 256 routed experts
    # plus a shared one), V2-Lite, and the Llama-shaped 7B models GRPO was introduced on
    (r"deepseek-(?:v3|r1)(?!-distill)", _arch("deepseek_v3", 129280, 7168, 18432, 61, 128, 128,
                                             moe_intermediate_size=2048, n_routed_experts=256, num_experts_per_tok=8,
                                             n_shared_experts=1, first_k_dense_replace=3, **_MLA_V3)),
    (r"deepseek-v2-lite", _arch("deepseek_v2", 102400, 2048, 10944, 27, 16, 16, moe_intermediate_size=1408,
                                n_routed_experts=64, num_experts_per_tok=6, n_shared_experts=2,
                                first_k_dense_replace=1, q_lora_rank=None, kv_lora_rank=512, qk_nope_head_dim=128,
                                qk_rope_head_dim=64, v_head_dim=128)),
    (r"deepseek-(?:math|llm)-7b", _arch("llama", 102400, 4096, 11008, 30, 32, 32)),
    (r"deepseek-coder-6\.7b", _arch("llama", 32256, 4096, 11008, 32, 32, 32)),
    # gpt-oss (attention biases; every layer routes, experts stored as MXFP4 and trained in bf16)
    (r"gpt-oss-20b", _arch("gpt_oss", 201088, 2880, 2880, 24, 64, 8, 64, attention_bias=True,
                           num_local_experts=32, num_experts_per_tok=4)),
    (r"gpt-oss-120b", _arch("gpt_oss", 201088, 2880, 2880, 36, 64, 8, 64, attention_bias=True,
                            num_local_experts=128, num_experts_per_tok=4)),
)


# One published hub id per entry of ARCHITECTURES, in its order: what the table is checked against (each id
# is found by its own entry, first), and the models lint's memory plan is tried on.
ARCHITECTURE_EXAMPLES: tuple[str, ...] = (
    "Qwen/Qwen3-30B-A3B", "Qwen/Qwen3-235B-A22B", "Qwen/Qwen3-0.6B", "Qwen/Qwen3-1.7B", "Qwen/Qwen3-4B", "Qwen/Qwen3-8B",
    "Qwen/Qwen3-14B", "Qwen/Qwen3-32B",
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B",
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-14B", "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B",
    "deepseek-ai/DeepSeek-R1-Distill-Llama-8B", "deepseek-ai/DeepSeek-R1-Distill-Llama-70B",
    "Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-1.5B-Instruct", "Qwen/Qwen2.5-3B-Instruct", "Qwen/Qwen2.5-7B-Instruct",
    "Qwen/Qwen2.5-14B-Instruct", "Qwen/Qwen2.5-32B-Instruct", "Qwen/Qwen2.5-72B-Instruct",
    "meta-llama/Llama-3.2-1B-Instruct", "meta-llama/Llama-3.2-3B-Instruct", "meta-llama/Llama-3.1-8B-Instruct",
    "meta-llama/Llama-3.3-70B-Instruct", "meta-llama/Llama-2-7b-hf", "meta-llama/Llama-2-13b-hf",
    "meta-llama/Llama-2-70b-hf",
    "mistralai/Mixtral-8x7B-Instruct-v0.1", "mistralai/Mixtral-8x22B-Instruct-v0.1", "mistralai/Mistral-7B-Instruct-v0.3",
    "mistralai/Mistral-7B-v0.1", "mistralai/Mistral-Nemo-Instruct-2407", "mistralai/Mistral-Small-24B-Instruct-2501",
    "mistralai/Mistral-Small-3.1-24B-Instruct-2503",
    "google/gemma-3-1b-it", "google/gemma-3-4b-it", "google/gemma-3-12b-it", "google/gemma-3-27b-it",
    "google/gemma-2-2b-it", "google/gemma-2-9b-it", "google/gemma-2-27b-it", "google/gemma-2b", "google/gemma-7b",
    "microsoft/Phi-4-mini-instruct", "microsoft/phi-4", "microsoft/Phi-3.5-mini-instruct",
    "microsoft/Phi-3-medium-4k-instruct",
    "deepseek-ai/DeepSeek-V3", "deepseek-ai/DeepSeek-V2-Lite", "deepseek-ai/deepseek-math-7b-instruct",
    "deepseek-ai/deepseek-coder-6.7b-instruct",
    "openai/gpt-oss-20b", "openai/gpt-oss-120b",
)


def config_from_model_id(model_id: Any) -> dict[str, Any] | None:
    """The config shape of a common architecture named by its hub id (``Qwen/Qwen2.5-7B-Instruct``), as
    a ``config.json`` dict naming it in ``_name_or_path``; None for an id the table does not know.

    >>> cfg = config_from_model_id("Qwen/Qwen2.5-7B-Instruct")
    >>> cfg["model_type"], cfg["hidden_size"], cfg["num_hidden_layers"], cfg["_name_or_path"]
    ('qwen2', 3584, 28, 'Qwen/Qwen2.5-7B-Instruct')
    >>> config_from_model_id("Qwen/Qwen2.5-72B")["hidden_size"], config_from_model_id("my-org/my-model")
    (8192, None)
    """
    if not isinstance(model_id, str) or not model_id.strip():
        return None
    name = model_id.strip().lower().rstrip("/")
    for pattern, cfg in ARCHITECTURES:
        if re.search(pattern, name):
            return {**cfg, "_name_or_path": model_id.strip()}
    return None
