"""Memory sizing of a GRPO run, term by term, before it starts (recipe step 11).

``estimate(config, model)`` returns the bytes one training device holds: weights, gradients,
optimizer states, the reference model, the vLLM colocate share, activations and the LM-head
logits, and the peak over the two phases of a GRPO step (generation, then the training
forward/backward). docs/MEMORY.md states every formula with worked figures.

``model`` may be a loaded model (exact bytes from its tensors), a transformers config object, a
``config.json`` dict or path, or the model facts of a run header (parameter count only). Nothing
here imports torch, transformers or TRL at module import.

>>> shape = shape_from_config({"model_type": "qwen2", "vocab_size": 152064, "hidden_size": 3584,
...     "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
...     "num_key_value_heads": 4, "tie_word_embeddings": False})
>>> round(shape["num_parameters"] / 1e9, 2)
7.62
>>> est = estimate({"beta": 0.01, "bf16": True}, shape, num_devices=1, device_memory_gib=80)
>>> est.fits
False
"""

from __future__ import annotations

import functools
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo_monitor.core.model_config import VLM_HINTS, moe_facts
from grpo_monitor.detectors.memory_pressure import ladder_text, memory_ladder
from grpo_monitor.detectors.variants import checkpointing

GIB = 1024**3
DTYPE_BYTES = {"float32": 4, "float": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2,
               "float64": 8, "double": 8, "int8": 1, "uint8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1}
# TRL 1.16's fused LM head projects at most this many tokens x vocabulary columns at a time.
FUSED_TOKEN_TILE = 4096
FUSED_VOCAB_TILE = 32768
# TRL 1.16 has no max_prompt_length (it no longer truncates prompts): the length a config cannot say.
DEFAULT_PROMPT_LENGTH = 512
RUNTIME_OVERHEAD_GIB = 1.0  # CUDA context, cuBLAS workspaces, allocator fragmentation
TIGHT_FRACTION = 0.9
# How the config_memory finding names each rung of the memory ladder.
LADDER_TITLES = {
    "vllm_sleep_mode": "vLLM sleep mode frees the vLLM share during training",
    "raise_vllm_gpu_memory_utilization": "a vLLM share that holds the model",
    "lower_vllm_gpu_memory_utilization": "a smaller vLLM share",
    "bf16_weights": "load the weights in bfloat16",
    "gradient_checkpointing": "gradient checkpointing",
    "low_bit_optimizer": "8-bit paged AdamW states",
    "smaller_micro_batch": "fewer completions per micro-batch, the same batch",
    "shorter_completions": "shorter completions (the last resort)",
}

# GRPOConfig's defaults in TRL 1.16 for every field the lint and the estimate read. A saved config may
# omit any of them; grpo_defaults() replaces these with the installed TRL's own values when TRL imports,
# so a field left out is judged and sized as the installed trainer would run it.
GRPO_DEFAULTS: dict[str, Any] = {
    "num_generations": 8,
    "learning_rate": 1e-6,
    "beta": 0.0,
    "epsilon": 0.2,
    "epsilon_high": None,
    "importance_sampling_level": "token",
    "loss_type": "dapo",
    "num_iterations": 1,
    "steps_per_generation": None,
    "gradient_accumulation_steps": 1,
    "per_device_train_batch_size": 8,
    "logging_steps": 10,
    "use_vllm": False,
    "vllm_mode": "colocate",
    "max_completion_length": 512,
    "bf16": True,  # None in the dataclass, resolved to `not fp16` (with_grpo_defaults does the same)
    "fp16": False,
    "use_cpu": False,
    "gradient_checkpointing": True,
    "optim": "adamw_torch_fused",
    "vllm_enable_sleep_mode": False,
    "vllm_importance_sampling_correction": True,
    "vllm_importance_sampling_mode": "sequence_mask",
    "vllm_gpu_memory_utilization": 0.3,
    "vllm_tensor_parallel_size": 1,
    "vllm_server_host": "0.0.0.0",
    "vllm_server_base_url": None,
}

# optimizer name (transformers OptimizerNames) -> (states per parameter, bytes per state or None =
# the parameter's dtype, step counter tensor per parameter tensor)
_OPTIMIZERS: dict[str, tuple[float, float | None, bool]] = {
    "adamw_torch": (2, None, True),
    "adamw_torch_fused": (2, None, True),
    "adamw_torch_xla": (2, None, True),
    "adamw_torch_npu_fused": (2, None, True),
    "adamw_hf": (2, None, False),
    "adamw_apex_fused": (2, 4, False),
    "adamw_anyprecision": (2, None, False),
    "stable_adamw": (2, None, False),
    "grokadamw": (2, None, False),
    "schedule_free_adamw": (2, None, False),
    "schedule_free_radam": (2, None, False),
    "paged_adamw_32bit": (2, 4, False),
    # bitsandbytes block-wise 8-bit states: 1 byte plus one fp32 absmax per 256 values
    "adamw_bnb_8bit": (2, 1 + 4 / 256, False),
    "adamw_8bit": (2, 1 + 4 / 256, False),
    "paged_adamw_8bit": (2, 1 + 4 / 256, False),
    "adamw_torch_8bit": (2, 1 + 4 / 256, False),
    "adamw_torch_4bit": (2, 0.5 + 4 / 128, False),
    "ademamix": (3, None, True),
    "paged_ademamix_32bit": (3, 4, False),
    "ademamix_8bit": (3, 1 + 4 / 256, False),
    "paged_ademamix_8bit": (3, 1 + 4 / 256, False),
    "lion_32bit": (1, 4, False),
    "paged_lion_32bit": (1, 4, False),
    "lion_8bit": (1, 1 + 4 / 256, False),
    "paged_lion_8bit": (1, 1 + 4 / 256, False),
    "rmsprop": (1, None, True),
    "rmsprop_bnb": (1, 4, False),
    "rmsprop_bnb_32bit": (1, 4, False),
    "rmsprop_bnb_8bit": (1, 1 + 4 / 256, False),
    "adagrad": (1, None, True),
    "sgd": (0, None, False),
    "lomo": (0, None, False),
}
_FACTORED = ("adafactor", "adalomo", "galore_adafactor")


def _get(obj: Any, key: str, default: Any = None) -> Any:
    if isinstance(obj, Mapping):
        v = obj.get(key, default)
    else:
        v = getattr(obj, key, default)
    return default if v is None else v


def dtype_bytes(dtype: Any, default: int = 4) -> int:
    """Bytes per element of a dtype given as a string (``"bfloat16"``), a torch dtype or None."""
    if dtype is None:
        return default
    name = str(dtype).replace("torch.", "").lower()
    return DTYPE_BYTES.get(name, default)


# -- model shape ---------------------------------------------------------------------------------

def _config_dict(cfg: Any) -> dict[str, Any]:
    if isinstance(cfg, Mapping):
        return dict(cfg)
    if callable(getattr(cfg, "to_dict", None)):
        return cfg.to_dict()
    return dict(vars(cfg))


def shape_from_config(cfg: Any) -> dict[str, Any]:
    """The shape of a decoder-only transformer from its config (object, dict or ``config.json``).

    Parameter counts follow the Llama/Qwen family layout (attention q/k/v/o with optional biases
    and q/k norms, SwiGLU MLP or routed SwiGLU experts with an optional shared expert, RMSNorms,
    embeddings, an untied or tied LM head). Vision-language configs are read through their text
    config and flagged ``is_vlm``.
    """
    full = _config_dict(cfg)
    text = full.get("text_config") or full
    if not isinstance(text, Mapping):
        text = _config_dict(text)
    is_vlm = any(k in full and full[k] is not None for k in VLM_HINTS)
    h = int(text.get("hidden_size") or 0)
    layers = int(text.get("num_hidden_layers") or 0)
    vocab = int(text.get("vocab_size") or 0)
    heads = int(text.get("num_attention_heads") or 0)
    kv_heads = int(text.get("num_key_value_heads") or heads or 0)
    head_dim = int(text.get("head_dim") or (h // heads if heads else 0))
    inter = int(text.get("intermediate_size") or 0)
    moe = moe_facts(text)  # the same layout the run header and the router tap read
    experts, top_k = moe["num_experts"], moe["top_k"]
    moe_inter = int(text.get("moe_intermediate_size") or inter)
    shared_inter = int(text.get("shared_expert_intermediate_size") or 0)
    n_shared = int(text.get("n_shared_experts") or 0)
    if n_shared and not shared_inter:
        shared_inter = n_shared * moe_inter
    model_type = str(text.get("model_type") or full.get("model_type") or "")
    tied = bool(full.get("tie_word_embeddings", text.get("tie_word_embeddings", False)))
    q_dim, kv_dim = heads * head_dim, kv_heads * head_dim
    attn_bias = bool(text.get("attention_bias")) or model_type in ("qwen2", "qwen2_moe")
    qk_norm = model_type.startswith(("qwen3", "olmoe"))
    attn = h * q_dim + 2 * h * kv_dim + q_dim * h
    kv_lora = int(text.get("kv_lora_rank") or 0)
    if kv_lora:  # multi-head latent attention (DeepSeek-V2/V3): low-rank q and kv projections
        q_lora = int(text.get("q_lora_rank") or 0)
        nope, rope = int(text.get("qk_nope_head_dim") or 0), int(text.get("qk_rope_head_dim") or 0)
        v_dim = int(text.get("v_head_dim") or nope)
        q_head = nope + rope
        attn = (h * q_lora + q_lora + q_lora * heads * q_head) if q_lora else h * heads * q_head
        attn += h * (kv_lora + rope) + kv_lora + kv_lora * heads * (nope + v_dim) + heads * v_dim * h
    if attn_bias:
        attn += q_dim + 2 * kv_dim
    if qk_norm:  # Qwen3 normalises per head (head_dim); OLMoE over the full q / kv width
        attn += 2 * head_dim if model_type.startswith("qwen3") else q_dim + kv_dim
    routed = set(moe["moe_layers"])
    moe_flags = [i in routed for i in range(layers)]
    dense_mlp = 3 * h * inter
    expert_mlp = 3 * h * moe_inter
    shared = (3 * h * shared_inter + (h if model_type == "qwen2_moe" else 0)) if shared_inter else 0
    total = active = 0
    for is_moe_layer in moe_flags:
        base = attn + 2 * h
        if is_moe_layer:
            router = h * experts
            total += base + experts * expert_mlp + router + shared
            active += base + (top_k or experts) * expert_mlp + router + shared
        else:
            total += base + dense_mlp
            active += base + dense_mlp
    embed = vocab * h
    head = 0 if tied else vocab * h
    total += embed + head + h
    active += embed + head + h
    is_moe = any(moe_flags)
    return {
        "model_type": model_type or None,
        "num_parameters": total,
        "trainable_parameters": total,
        "active_parameters": active,
        "hidden_size": h,
        "num_layers": layers,
        "vocab_size": vocab,
        "num_heads": heads,
        "num_kv_heads": kv_heads,
        "head_dim": head_dim,
        "intermediate_size": inter,
        "moe_intermediate_size": moe_inter if is_moe else None,
        "shared_expert_intermediate_size": shared_inter or None,
        "num_experts": experts if is_moe else None,
        "top_k": top_k if is_moe else None,
        "moe_layers": [i for i, f in enumerate(moe_flags) if f],
        "is_moe": is_moe,
        "is_vlm": is_vlm,
        "tie_word_embeddings": tied,
        "dtype": text.get("torch_dtype") or text.get("dtype") or full.get("torch_dtype") or full.get("dtype"),
        # step counters: one per parameter tensor (transformers 5 fuses each layer's experts into two)
        "num_param_tensors": _tensor_count(layers, moe_flags, attn_bias, qk_norm, bool(shared_inter), model_type, tied),
        "measured": False,
    }


def _tensor_count(layers: int, moe_flags: list[bool], bias: bool, qk_norm: bool, shared: bool, model_type: str,
                  tied: bool) -> int:
    per_layer = 4 + (3 if bias else 0) + (2 if qk_norm else 0) + 2
    n = 0
    for is_moe_layer in moe_flags:
        n += per_layer + 3
        if is_moe_layer and shared:
            n += 3 + (1 if model_type == "qwen2_moe" else 0)
    return n + 2 + (0 if tied else 1)


def _shape_from_module(model: Any) -> dict[str, Any]:
    cfg = getattr(model, "config", None)
    shape = shape_from_config(cfg) if cfg is not None else {}
    params = list(model.parameters())
    trainable = [p for p in params if p.requires_grad]
    shape.update(
        num_parameters=int(sum(p.numel() for p in params)),
        trainable_parameters=int(sum(p.numel() for p in trainable)),
        param_bytes=int(sum(p.numel() * p.element_size() for p in params)),
        trainable_bytes=int(sum(p.numel() * p.element_size() for p in trainable)),
        num_param_tensors=len(trainable),
        dtype=str(params[0].dtype).replace("torch.", "") if params else shape.get("dtype"),
        is_peft=hasattr(model, "peft_config"),
        measured=True,
    )
    if not shape.get("active_parameters") or not shape.get("is_moe"):
        shape["active_parameters"] = shape["num_parameters"]
    return shape


def model_shape(source: Any) -> dict[str, Any]:
    """A uniform shape dict from a model, a config (object, dict, ``config.json`` path or model
    directory), or the ``model`` facts of a run header (which give the parameter count only)."""
    if source is None:
        return {}
    if hasattr(source, "parameters") and callable(source.parameters):
        return _shape_from_module(source)
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if path.is_dir():
            path = path / "config.json"
        with open(path, encoding="utf-8") as fh:
            return shape_from_config(json.load(fh))
    if isinstance(source, Mapping):
        if "num_parameters" in source:  # a config.json never has it: these are facts or a shape dict
            shape = dict(source)  # run-header facts or an earlier shape dict
            if isinstance(source.get("config"), Mapping):
                shape = {**shape_from_config(source["config"]), **shape}
            shape.setdefault("trainable_parameters", shape.get("trainable_parameters") or shape.get("num_parameters"))
            shape.setdefault("active_parameters", shape.get("num_parameters"))
            shape.setdefault("measured", False)
            return shape
        return shape_from_config(source)
    return shape_from_config(source)


# -- the estimate --------------------------------------------------------------------------------


@dataclass
class MemoryEstimate:
    """Bytes per training device, term by term, and the peak over a GRPO step's two phases."""

    terms: dict[str, int | None]
    formulas: dict[str, str]
    train_phase: int
    generation_phase: int
    num_devices: int
    device_memory: int | None
    assumptions: list[str] = field(default_factory=list)
    levers: list[str] = field(default_factory=list)
    # The memory remediation ladder sized rung by rung (``estimate``): diff, why, and the peak with it.
    ladder: list[dict[str, Any]] = field(default_factory=list)
    # ``fit_plan``'s answer: the rungs that make the run fit with headroom, or why none does.
    plan: dict[str, Any] | None = None
    # What no GRPOConfig flag of a one-device recipe does: sharding, more devices, dropping the reference model.
    beyond: list[str] = field(default_factory=list)

    @property
    def peak(self) -> int:
        return max(self.train_phase, self.generation_phase)

    @property
    def fits(self) -> bool | None:
        if self.device_memory is None:
            return None
        return self.peak <= self.device_memory

    @property
    def tight(self) -> bool:
        return bool(self.device_memory) and self.peak > TIGHT_FRACTION * self.device_memory

    def to_dict(self) -> dict[str, Any]:
        return {
            "terms": dict(self.terms),
            "formulas": dict(self.formulas),
            "train_phase": self.train_phase,
            "generation_phase": self.generation_phase,
            "peak": self.peak,
            "num_devices": self.num_devices,
            "device_memory": self.device_memory,
            "fits": self.fits,
            "assumptions": list(self.assumptions),
            "levers": list(self.levers),
            "ladder": [dict(r) for r in self.ladder],
            "plan": ({k: v for k, v in self.plan.items() if k != "rungs"} if self.plan is not None else None),
        }

    def table(self) -> str:
        """A plain-text table: one line per term, then the two phases, the peak and the verdict."""
        rows = [(name, _gib(v), self.formulas.get(name, "")) for name, v in self.terms.items()]
        rows.append(("generation phase", _gib(self.generation_phase), "weights + optimizer + reference + vLLM share + overhead"))
        rows.append(("training phase", _gib(self.train_phase), "every term but the vLLM share when sleep mode frees it"))
        rows.append(("peak per device", _gib(self.peak), f"{self.num_devices} device(s)"))
        width = max(len(r[0]) for r in rows)
        lines = [f"{'term':<{width}}  {'GiB':>9}  formula", "-" * (width + 30)]
        for name, value, formula in rows:
            lines.append(f"{name:<{width}}  {value:>9}  {formula}")
        if self.device_memory is not None:
            verdict = "fits" if self.fits else "DOES NOT FIT"
            lines.append(f"device memory {_gib(self.device_memory)} GiB: {verdict} "
                         f"({100 * self.peak / self.device_memory:.0f}% of the device)")
        for a in self.assumptions:
            lines.append(f"assumed: {a}")
        if self.plan is not None and self.device_memory:
            lines.extend(self._plan_lines())
        return "\n".join(lines)

    def _plan_lines(self) -> list[str]:
        plan, mem = self.plan or {}, self.device_memory or 1
        status = plan.get("status")
        if status == "as_written":
            return []
        lines = []
        if self.ladder:
            lines.append("memory ladder, in order (peak with each rung and the ones above it):")
            before = self.peak
            for i, r in enumerate(self.ladder, 1):
                lines.append(f"  {i}. {ladder_text([r])[3:]}: {_gib(before)} -> {_gib(r['peak_bytes'])} GiB "
                             f"({100 * r['peak_bytes'] / mem:.0f}%): {r['why']}")
                before = r["peak_bytes"]
        if status == "fits":
            lines.append(f"with the fix: {_gib(plan['peak_bytes'])} GiB, {100 * plan['peak_bytes'] / mem:.0f}% of the "
                         f"device ({100 * (1 - plan['headroom']):.0f}% or more left free)")
        elif status == "tight":
            lines.append(f"with every rung: {_gib(plan['peak_bytes'])} GiB, {100 * plan['peak_bytes'] / mem:.0f}% of "
                         f"the device: it fits, with less than {100 * (1 - plan['headroom']):.0f}% free")
        elif status == "none":
            lines.append(f"nothing in the ladder makes it fit one device: {plan.get('reason')}")
        return lines

    def finding(self, step: int = 0) -> Any:
        """A ``config_memory`` Finding when the run will not fit (critical) or is within 10% (warning).

        Its diff is ``fit_plan``'s: the rungs that bring the peak under 90% of the device, in the ladder's
        order, each sized on the whole estimate, so applying it and sizing again needs nothing more. Where no
        rung makes the run fit one device it says so and carries no diff."""
        from grpo_monitor.detectors.base import Finding

        if self.device_memory is None or not (self.tight or self.fits is False):
            return None
        over = self.fits is False
        plan = self.plan or {"status": "none", "overrides": {}, "reason": "not sized", "peak_bytes": self.peak}
        status = plan["status"]
        mem = self.device_memory
        msg = (f"Estimated peak {_gib(self.peak)} GiB per device "
               f"{'exceeds' if over else 'is within 10% of'} the {_gib(mem)} GiB available.")
        steps = "; ".join(f"{LADDER_TITLES.get(r['remedy'], r['remedy'])} ({ladder_text([r])[3:]}) -> "
                          f"{_gib(r['peak_bytes'])} GiB" for r in self.ladder)
        beyond = self.beyond or ["a larger device"]
        if status == "fits":
            msg += (f" The fix, rung by rung: {steps}: {_gib(plan['peak_bytes'])} GiB, "
                    f"{100 * plan['peak_bytes'] / mem:.0f}% of the device, leaving at least "
                    f"{100 * (1 - plan['headroom']):.0f}% free.")
        elif status == "tight":
            msg += ((f" Every rung that helps ({steps}) brings it to " if steps else " Nothing in the ladder is left: ")
                    + f"{_gib(plan['peak_bytes'])} GiB, {100 * plan['peak_bytes'] / mem:.0f}% of the device: it fits "
                    f"with less than {100 * (1 - plan['headroom']):.0f}% free. More room needs: {'; '.join(beyond)}.")
        else:
            msg = (f"Estimated peak {_gib(self.peak)} GiB per device: it does not fit one {_gib(mem)} GiB device, "
                   f"and no setting of this recipe makes it fit: {plan.get('reason')}. It needs: {'; '.join(beyond)}.")
        overrides = dict(plan.get("overrides") or {}) if status in ("fits", "tight") else {}
        return Finding(
            detector="config_memory",
            severity="critical" if over else "warning",
            step=step,
            onset_step=None,
            variant=None,
            config_overrides=overrides,
            evidence={"peak_bytes": self.peak, "device_memory_bytes": mem,
                      "terms": dict(self.terms), "train_phase": self.train_phase,
                      "generation_phase": self.generation_phase, "plan": status,
                      "plan_peak_bytes": plan.get("peak_bytes"), "headroom": plan.get("headroom"),
                      "ladder": [{"remedy": r["remedy"], "overrides": dict(r["overrides"]), "peak_bytes": r["peak_bytes"]}
                                 for r in self.ladder],
                      **({"remedy": "config_memory"} if overrides else {})},
            message=msg,
        )


def _gib(v: int | None) -> str:
    return "?" if v is None else f"{v / GIB:.2f}"


def _deepspeed_settings(ds: Any) -> dict[str, Any]:
    """ZeRO stage and offload targets from a DeepSpeed config (dict, JSON text or file path)."""
    if not ds:
        return {}
    if isinstance(ds, str):
        try:
            ds = json.loads(ds) if ds.lstrip().startswith("{") else json.loads(Path(ds).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {"stage": None, "unreadable": str(ds)}
    if not isinstance(ds, Mapping):
        return {}
    zero = ds.get("zero_optimization") or {}
    stage = zero.get("stage")
    off_opt = (zero.get("offload_optimizer") or {}).get("device")
    off_par = (zero.get("offload_param") or {}).get("device")
    return {
        "stage": int(stage) if isinstance(stage, (int, float)) else None,
        "offload_optimizer": off_opt not in (None, "none"),
        "offload_param": off_par not in (None, "none"),
    }


def _checkpointing(cfg: Mapping[str, Any]) -> bool:
    _, on = checkpointing(cfg)
    return True if on is None else bool(on)  # unset: GRPOConfig's default


def _trl_fused_lm_head() -> bool:
    """TRL 1.16 scores completions through a tiled LM head that never holds the full logits."""
    try:
        from importlib import metadata

        parts = metadata.version("trl").split(".")[:2]
        return (int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)) >= (1, 16)
    except Exception:
        return False


def detect_device_memory_gib() -> float | None:
    """Total memory of the first CUDA device, when torch is importable and sees one."""
    try:
        import torch
    except ImportError:
        return None
    try:
        if torch.cuda.is_available():
            return torch.cuda.get_device_properties(0).total_memory / GIB
    except Exception:
        return None
    return None


def cuda_device(initialised_only: bool = False) -> dict[str, Any] | None:
    """This process's current CUDA device as torch reports it: ``index``, ``uuid`` (as NVML names it,
    ``GPU-…``), ``name``, ``total_gib`` and ``integrated`` (torch's ``is_integrated``). None without
    torch or a CUDA device; with ``initialised_only``, None too where this process has not initialised
    CUDA (asking would create a CUDA context on a run that trains elsewhere)."""
    try:
        import torch
    except ImportError:
        return None
    try:
        if not torch.cuda.is_available() or (initialised_only and not torch.cuda.is_initialized()):
            return None
        index = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
    except Exception:
        return None
    uuid = getattr(props, "uuid", None)
    uuid = str(uuid) if uuid is not None else None
    if uuid and not uuid.startswith(("GPU-", "MIG-")):
        uuid = "GPU-" + uuid  # torch prints the bare UUID; NVML names devices by "GPU-<uuid>"
    return {"index": int(index), "uuid": uuid, "name": getattr(props, "name", None),
            "total_gib": getattr(props, "total_memory", 0) / GIB or None,
            "integrated": bool(getattr(props, "is_integrated", False))}


def detect_device_facts() -> dict[str, Any] | None:
    """What this machine's CUDA device reports of itself, for the unified-memory check: ``cuda_device``
    and whether NVML reports memory of its own (``memory_info``; False on a GB10). NVML is opened only
    when ``nvidia-ml-py`` is installed, and closed again. None without a CUDA device."""
    facts = cuda_device()
    if facts is None:
        return None
    from grpo_monitor.core.device import NvmlDevice, load_nvml

    nvml = load_nvml()
    handle = NvmlDevice.open(nvml, facts["uuid"] or facts["index"]) if nvml is not None else None
    if handle is not None:
        facts["memory_info"] = handle.facts["memory_info"]
        facts["name"] = handle.facts["name"] or facts["name"]
        handle.close()
    return facts


def estimate(
    config: Any,
    model_facts_or_model: Any,
    num_devices: int | None = 1,
    device_memory_gib: float | None = None,
    *,
    prompt_length: int | None = None,
    attn_implementation: str | None = None,
    fused_lm_head: bool | None = None,
    device_kind: str | None = None,
) -> MemoryEstimate:
    """Per-device memory of a GRPO run under ``config`` (a GRPOConfig or a dict of its fields; the
    fields it leaves out take GRPOConfig's defaults, ``with_grpo_defaults``).

    ``prompt_length`` defaults to ``config['max_prompt_length']`` when the config has one, else
    512 tokens (TRL 1.16 no longer truncates prompts). ``fused_lm_head`` defaults to whether the
    installed TRL scores through its tiled LM head (1.16+). ``device_kind='cpu'`` drops the CUDA
    runtime overhead.

    With the device memory known, ``plan`` is ``fit_plan``'s answer and ``ladder`` its rungs: each rung's
    diff and the peak with it and every rung before it applied.
    """
    raw = config_dict(config)
    shape = model_shape(model_facts_or_model)
    options = dict(num_devices=num_devices, device_memory_gib=device_memory_gib, prompt_length=prompt_length,
                   attn_implementation=attn_implementation, fused_lm_head=fused_lm_head, device_kind=device_kind)
    est = _size(raw, shape, **options)
    if est.device_memory is not None:
        plan = fit_plan(raw, shape, **options)
        est.ladder = plan["rungs"]
        est.plan = plan
    return est


def _size(raw: dict[str, Any], shape: dict[str, Any], *, num_devices: int | None, device_memory_gib: float | None,
          prompt_length: int | None, attn_implementation: str | None, fused_lm_head: bool | None,
          device_kind: str | None) -> MemoryEstimate:
    cfg = with_grpo_defaults(raw)
    n_dev = max(1, int(num_devices or 1))
    assumptions: list[str] = []
    formulas: dict[str, str] = {}
    terms: dict[str, int | None] = {}

    P = int(shape.get("num_parameters") or 0)
    P_train = int(shape.get("trainable_parameters") or P)
    # TRL loads a model given by name in float32 unless model_init_kwargs names a dtype.
    init_dtype = weights_dtype(cfg)
    if shape.get("measured"):
        w_bytes = dtype_bytes(shape.get("dtype"))
    elif init_dtype and str(init_dtype) != "auto":
        w_bytes = dtype_bytes(init_dtype)
    elif init_dtype == "auto":
        w_bytes = dtype_bytes(shape.get("dtype"), 4)
    else:
        w_bytes = 4
        assumptions.append("weights in float32 (TRL's default when model_init_kwargs sets no dtype)")
    mixed = bool(cfg.get("bf16") or cfg.get("fp16"))
    act_bytes = 2 if (mixed or w_bytes == 2) else 4

    ds = _deepspeed_settings(cfg.get("deepspeed"))
    stage = ds.get("stage") or 0
    fsdp = cfg.get("fsdp") or ""
    fsdp = " ".join(fsdp) if isinstance(fsdp, (list, tuple)) else str(fsdp)
    shard_w = n_dev if (stage >= 3 or "full_shard" in fsdp or "hybrid_shard" in fsdp) else 1
    shard_g = n_dev if (stage >= 2 or "shard" in fsdp) else 1
    shard_o = n_dev if (stage >= 1 or "shard" in fsdp) else 1
    offload = "offload" in fsdp

    # weights
    param_bytes = shape.get("param_bytes") if shape.get("measured") else P * w_bytes
    weights = 0 if (ds.get("offload_param") or offload) else math.ceil(param_bytes / shard_w)
    terms["weights"] = weights
    formulas["weights"] = (f"{'sum(numel*element_size)' if shape.get('measured') else f'{P:,} params x {w_bytes} B'}"
                           + (f" / {shard_w} (sharded)" if shard_w > 1 else ""))

    # gradients: same dtype as the parameters
    train_bytes = shape.get("trainable_bytes") if shape.get("measured") else P_train * w_bytes
    grads = 0 if offload else math.ceil(train_bytes / shard_g)
    terms["gradients"] = grads
    formulas["gradients"] = f"{P_train:,} trainable x {w_bytes} B" + (f" / {shard_g}" if shard_g > 1 else "")

    # optimizer states
    optim = str(cfg.get("optim") or "adamw_torch_fused").lower()
    n_tensors = int(shape.get("num_param_tensors") or 0)
    if optim.startswith(_FACTORED):
        h = max(1, int(shape.get("hidden_size") or 1024))
        opt = int(4 * 2 * P_train / h)  # row + column statistics of each matrix, fp32
        formulas["optimizer_states"] = f"factored ({optim}): ~2/hidden x 4 B per param"
        master = 0
    else:
        if optim not in _OPTIMIZERS:
            assumptions.append(f"optimizer {optim!r} sized as AdamW (two states per parameter)")
        n_states, s_bytes, step_counter = _OPTIMIZERS.get(optim, (2, None, False))
        # DeepSpeed keeps fp32 states and an fp32 master copy of 16-bit weights; torch optimizers keep
        # their states in the parameter's dtype and the parameter is its own master copy.
        master = 0
        if ds:  # DeepSpeed runs its own optimizer: no per-tensor step counters
            step_counter = False
        if ds and w_bytes < 4:
            s_bytes = 4 if s_bytes is None else s_bytes
            master = 4 * P_train
        per_state = (train_bytes / P_train * 1.0) if (s_bytes is None and P_train) else (s_bytes or w_bytes)
        opt_exact = n_states * (train_bytes if s_bytes is None else P_train * s_bytes)
        opt = math.ceil(opt_exact) + (4 * n_tensors if step_counter else 0)
        formulas["optimizer_states"] = (f"{n_states:g} states x {P_train:,} x {per_state:g} B"
                                        + (f" + 4 B step x {n_tensors} tensors" if step_counter else "")
                                        + (" + fp32 master copy" if master else ""))
        opt += master
    if ds.get("offload_optimizer") or offload:
        opt = 0
        formulas["optimizer_states"] += " (offloaded to CPU)"
    elif shard_o > 1:
        opt = math.ceil(opt / shard_o)
        formulas["optimizer_states"] += f" / {shard_o}"
    terms["optimizer_states"] = opt

    # reference model: TRL loads one only when beta > 0 (PEFT disables the adapter instead)
    beta = float(cfg.get("beta") or 0.0)
    ref = 0
    if beta > 0 and not shape.get("is_peft"):
        ref = 0 if (ds.get("offload_param") or offload) else math.ceil(param_bytes / shard_w)
    terms["reference_model"] = ref
    formulas["reference_model"] = "weights again (beta > 0)" if ref else "none (beta == 0 or PEFT)"

    # vLLM colocate share
    device_memory = int(device_memory_gib * GIB) if device_memory_gib else None
    use_vllm = bool(cfg.get("use_vllm"))
    colocate = use_vllm and str(cfg.get("vllm_mode") or "colocate") == "colocate"
    sleep = bool(cfg.get("vllm_enable_sleep_mode"))
    util = float(cfg.get("vllm_gpu_memory_utilization") or 0.3)
    if colocate:
        vllm = int(util * device_memory) if device_memory is not None else None
        formulas["vllm_colocate"] = (f"{util:g} x device memory" + (" (released during training: sleep mode)" if sleep else ""))
        if vllm is None:
            assumptions.append("device memory unknown: the vLLM colocate share is not counted")
    else:
        vllm = 0
        formulas["vllm_colocate"] = "none (no vLLM or server mode)" if not use_vllm else "none (server mode: separate GPUs)"
    terms["vllm_colocate"] = vllm

    # activations of one micro-batch: per_device_train_batch_size sequences of prompt + completion
    b = int(cfg["per_device_train_batch_size"])
    c_len = int(cfg["max_completion_length"])
    if raw.get("max_completion_length") is None:
        assumptions.append(f"max_completion_length {c_len} tokens (GRPOConfig's default)")
    if prompt_length is None:
        prompt_length = cfg.get("max_prompt_length")
        if not prompt_length:
            prompt_length = DEFAULT_PROMPT_LENGTH
            assumptions.append(f"prompt length {DEFAULT_PROMPT_LENGTH} tokens (pass prompt_length for your data)")
    s = int(prompt_length) + c_len
    tokens = b * s
    h = int(shape.get("hidden_size") or 0)
    L = int(shape.get("num_layers") or 0)
    ckpt = _checkpointing(cfg)
    attn_impl = attn_implementation or "sdpa"
    if h and L:
        per_layer = layer_activation_elements(shape, s, attn_impl)
        moe_layers = set(shape.get("moe_layers") or [])
        total_elems = sum(per_layer[i in moe_layers] for i in range(L))
        if ckpt:
            acts = tokens * act_bytes * (L * h + max(per_layer))
            formulas["activations"] = (f"checkpointed: {b} seq x {s} tok x {act_bytes} B x "
                                       f"({L} layers x {h} + one layer's {max(per_layer):,})")
        else:
            acts = tokens * act_bytes * total_elems
            formulas["activations"] = f"{b} seq x {s} tok x {act_bytes} B x {total_elems // max(L, 1):,} elems/layer x {L}"
        terms["activations"] = int(acts)
    else:
        terms["activations"] = None
        formulas["activations"] = "unknown (model shape needed)"

    # logits of the completion tokens
    V = int(shape.get("vocab_size") or 0)
    fused = _trl_fused_lm_head() if fused_lm_head is None else fused_lm_head
    n_c = b * c_len
    if V:
        if fused:
            logits = min(n_c, FUSED_TOKEN_TILE) * min(V, FUSED_VOCAB_TILE) * 4 + n_c * 4 * 7
            formulas["logits"] = (f"fused LM head tile: min({n_c}, {FUSED_TOKEN_TILE}) x min({V}, {FUSED_VOCAB_TILE}) x 4 B")
        else:
            logits = 2 * n_c * V * 4
            formulas["logits"] = f"2 copies x {b} x {c_len} completion tok x {V} vocab x 4 B"
        terms["logits"] = int(logits)
    else:
        terms["logits"] = None
        formulas["logits"] = "unknown (vocabulary size needed)"

    overhead = 0 if (device_kind == "cpu" or cfg.get("use_cpu")) else int(RUNTIME_OVERHEAD_GIB * GIB)
    terms["runtime_overhead"] = overhead
    formulas["runtime_overhead"] = "CUDA context, workspaces, fragmentation" if overhead else "none (CPU)"

    known = {k: (v or 0) for k, v in terms.items()}
    vllm_b = known["vllm_colocate"]
    resident = known["weights"] + known["optimizer_states"] + known["reference_model"] + known["runtime_overhead"]
    generation = resident + vllm_b
    train = resident + known["gradients"] + known["activations"] + known["logits"] + (0 if sleep else vllm_b)

    # The ladder's rungs first, in its order (each a GRPOConfig diff), then what no single flag does.
    levers = [f"{LADDER_TITLES.get(r['remedy'], r['remedy'])} ({ladder_text([r])[3:]})" for r in memory_ladder(cfg)]
    if w_bytes == 4 and not shape.get("measured"):
        levers.append(f"{LADDER_TITLES['bf16_weights']} (model_init_kwargs={{'dtype': 'bfloat16'}})")
    beyond: list[str] = []
    if n_dev > 1 and stage < 3 and "full_shard" not in fsdp:
        beyond.append(f"ZeRO-2/3 or FSDP full_shard across the {n_dev} devices (deepspeed=... / fsdp='full_shard')")
    elif n_dev == 1:
        beyond.append("more devices with ZeRO-3 / FSDP full_shard, or ZeRO offload of optimizer states")
    if beta > 0:
        beyond.append("beta=0.0 drops the reference model")
    if use_vllm and colocate:
        beyond.append("vLLM in server mode on a GPU of its own")
    levers += beyond

    return MemoryEstimate(terms=terms, formulas=formulas, train_phase=int(train), generation_phase=int(generation),
                          num_devices=n_dev, device_memory=device_memory, assumptions=assumptions, levers=levers,
                          beyond=beyond)


def weights_dtype(cfg: Mapping[str, Any]) -> str | None:
    """The dtype TRL loads a policy named by id in, as the recipe says it: ``model_init_kwargs``' ``dtype``
    (or its older name ``torch_dtype``; a JSON string as the command line gives it), else the ``dtype`` of
    ``trl grpo``'s ModelConfig; None when the recipe names none (TRL then loads float32)."""
    init = cfg.get("model_init_kwargs")
    if isinstance(init, str):
        try:
            init = json.loads(init)
        except ValueError:
            init = None
    if isinstance(init, Mapping):
        d = init.get("dtype") or init.get("torch_dtype")
        if d:
            return str(d).replace("torch.", "")
    d = cfg.get("dtype")
    return d if isinstance(d, str) and d else None


# vLLM's colocated engine needs room for a CUDA graph / activation workspace beside weights and KV cache.
VLLM_WORKSPACE_GIB = 1.0
# The largest vllm_gpu_memory_utilization the plan sets: the rest is the CUDA context's and the trainer's.
MAX_VLLM_UTILIZATION = 0.95
# The fix leaves this fraction of the device free: the same line the warning draws.
HEADROOM = TIGHT_FRACTION
# Shorter completions, the last rung, stop at half the recipe's cap and never go under this many tokens.
SHORTEST_COMPLETION = 128


def vllm_needs(config: Mapping[str, Any], shape: Mapping[str, Any], device_memory_gib: float,
               prompt_length: int | None = None) -> dict[str, Any] | None:
    """What a colocated vLLM engine needs of one device: its 16-bit weights, the KV cache of one sequence
    (the least it starts with) or of the whole generation batch at once, and a workspace; as bytes and as
    the ``vllm_gpu_memory_utilization`` that holds them (``floor_util``, ``want_util``). None without a
    parameter count."""
    cfg = with_grpo_defaults(config)
    params = shape.get("num_parameters")
    if not params or not device_memory_gib:
        return None
    mem = float(device_memory_gib) * GIB
    tp = max(1, int(cfg.get("vllm_tensor_parallel_size") or 1))
    weights = 2.0 * float(params) / tp  # the engine serves bf16/fp16 weights
    layers, kv_heads, head_dim = (int(shape.get(k) or 0) for k in ("num_layers", "num_kv_heads", "head_dim"))
    seq = (int(prompt_length or cfg.get("max_prompt_length") or DEFAULT_PROMPT_LENGTH)
           + int(cfg.get("max_completion_length") or 0))
    kv_token = 2 * layers * kv_heads * head_dim * 2 / tp
    batch = int(cfg.get("per_device_train_batch_size") or 8) * int(
        cfg.get("steps_per_generation") or cfg.get("gradient_accumulation_steps") or 1)
    need_min = weights + kv_token * seq + VLLM_WORKSPACE_GIB * GIB
    need_batch = weights + kv_token * seq * batch + VLLM_WORKSPACE_GIB * GIB
    floor = math.ceil(100 * need_min / mem) / 100
    want = max(floor, min(MAX_VLLM_UTILIZATION, math.ceil(100 * need_batch / mem) / 100))
    return {"weights": weights, "kv_per_sequence": kv_token * seq, "generation_batch": batch, "need_min": need_min,
            "need_batch": need_batch, "floor_util": floor, "want_util": want,
            "possible": floor <= MAX_VLLM_UTILIZATION}


def _bf16_weights_rung(cfg: Mapping[str, Any], shape: Mapping[str, Any]) -> dict[str, Any] | None:
    """Load the policy in bfloat16 where TRL would load it in float32 and the run trains in bf16 anyway."""
    if shape.get("measured") or not cfg.get("bf16"):
        return None
    d = weights_dtype(cfg)
    if d not in (None, "float32", "float", "fp32") and not (d == "auto" and dtype_bytes(shape.get("dtype"), 4) == 4):
        return None
    init = cfg.get("model_init_kwargs")
    if isinstance(init, str):
        try:
            init = json.loads(init)
        except ValueError:
            init = None
    kept = {k: v for k, v in (init or {}).items() if k != "torch_dtype"} if isinstance(init, Mapping) else {}
    return {"remedy": "bf16_weights", "overrides": {"model_init_kwargs": {**kept, "dtype": "bfloat16"}},
            "why": "weights, gradients, optimizer states and the reference model in 2 bytes instead of 4 (TRL loads "
                   "float32 unless model_init_kwargs names a dtype)"}


def fit_plan(raw: Mapping[str, Any], shape: Mapping[str, Any], *, num_devices: int | None,
             device_memory_gib: float | None, prompt_length: int | None = None,
             attn_implementation: str | None = None, fused_lm_head: bool | None = None,
             device_kind: str | None = None) -> dict[str, Any]:
    """The memory ladder climbed on the whole estimate until the peak leaves ``HEADROOM`` of the device free.

    Rungs, in the ladder's order (``detectors.memory_pressure.memory_ladder``, with the policy's dtype as a
    rung of its own): vLLM sleep mode, the vLLM share, gradient checkpointing, bfloat16 weights, 8-bit
    optimizer states, half the micro-batch with twice the accumulation (as often as it helps), shorter
    completions (down to half the recipe's cap). The vLLM share is one value solved against everything else:
    the largest share that keeps the run within the headroom and never below what vLLM needs to start
    (``vllm_needs``), raised to that first where the recipe's share is smaller. A rung that does not lower the
    peak where it stands, or that the rest of the fix makes unnecessary, is left out.

    Returns ``status`` (``as_written``: fits with headroom already; ``fits``: the fix does; ``tight``: every
    rung leaves it fitting with less than the headroom; ``none``: it does not fit one device), ``overrides``
    (the fix, one value per flag), ``rungs`` (each with its ``peak_bytes`` and ``fits``), ``peak_bytes``,
    ``headroom``, ``share`` and ``vllm`` (``vllm_needs``) and, for ``none``, ``reason``.
    """
    options = dict(num_devices=num_devices, device_memory_gib=device_memory_gib, prompt_length=prompt_length,
                   attn_implementation=attn_implementation, fused_lm_head=fused_lm_head, device_kind=device_kind)
    mem = int(float(device_memory_gib or 0) * GIB)
    base = dict(raw)
    cfg0 = with_grpo_defaults(base)
    colocate = bool(cfg0.get("use_vllm")) and str(cfg0.get("vllm_mode") or "colocate") == "colocate"
    need = vllm_needs(cfg0, shape, float(device_memory_gib or 0), prompt_length) if colocate else None
    cur_u = float(cfg0.get("vllm_gpu_memory_utilization") or 0.3)
    plan: dict[str, Any] = {"status": "none", "overrides": {}, "rungs": [], "peak_bytes": None, "headroom": HEADROOM,
                            "share": None, "vllm": need}

    def size(c: Mapping[str, Any]) -> MemoryEstimate:
        return _size(dict(c), dict(shape), **options)

    if not mem:
        plan["reason"] = "no device memory"
        return plan
    if need is not None and not need["possible"]:
        plan["peak_bytes"] = size(base).peak
        plan["reason"] = (f"the colocated vLLM engine alone needs {need['need_min'] / GIB:.1f} GiB (its 16-bit weights, "
                          f"one sequence's KV cache and a workspace), more than {MAX_VLLM_UTILIZATION:g} of the device")
        return plan
    lo = need["floor_util"] if need is not None else None
    hi = (cur_u if cur_u >= lo else need["want_util"]) if need is not None and lo is not None else None

    def share(c: Mapping[str, Any], limit: float) -> float | None:
        """The largest vLLM share in [lo, hi] that keeps ``c``'s peak within ``limit`` (None: none does)."""
        e = size({**c, "vllm_gpu_memory_utilization": hi})
        v = e.terms.get("vllm_colocate") or 0
        sleep = bool(with_grpo_defaults(c).get("vllm_enable_sleep_mode"))
        gen0, train0 = e.generation_phase - v, e.train_phase - (0 if sleep else v)
        if sleep and train0 > limit:
            return None
        room = limit - (gen0 if sleep else max(gen0, train0))
        u = min(float(hi), math.floor(100 * room / mem) / 100)
        while u >= lo - 1e-9:
            if size({**c, "vllm_gpu_memory_utilization": round(u, 2)}).peak <= limit:
                return round(u, 2)
            u -= 0.01
        return None

    def fits(c: Mapping[str, Any], limit: float) -> tuple[bool, float | None]:
        if need is None:
            return size(c).peak <= limit, None
        u = share(c, limit)
        return u is not None, u

    def rung_for(remedy: str, c: Mapping[str, Any]) -> dict[str, Any] | None:
        full = with_grpo_defaults(c)
        if remedy == "bf16_weights":
            return _bf16_weights_rung(full, shape)
        for r in memory_ladder(full):
            if r["remedy"] == remedy:
                if remedy == "shorter_completions":
                    cap = int(r["overrides"]["max_completion_length"])
                    first = int(cfg0.get("max_completion_length") or 0)
                    if cap < max(SHORTEST_COMPLETION, first // 2):
                        return None
                return dict(r)
        return None

    order = ("vllm_sleep_mode", "gradient_checkpointing", "bf16_weights", "low_bit_optimizer", "smaller_micro_batch",
             "shorter_completions")
    repeatable = ("smaller_micro_batch", "shorter_completions")
    chosen: list[dict[str, Any]] = []
    c = dict(base)
    ok, u = fits(c, HEADROOM * mem)
    for remedy in order:
        while not ok:
            r = rung_for(remedy, c)
            if r is None:
                break
            c = _apply(c, r["overrides"])
            chosen.append(r)
            ok, u = fits(c, HEADROOM * mem)
            if remedy not in repeatable:
                break
        if ok:
            break
    status = "fits" if ok else "none"
    if not ok:
        ok, u = fits(c, mem)
        status = "tight" if ok else "none"
    if status == "none":
        plan["peak_bytes"] = size({**c, **({"vllm_gpu_memory_utilization": lo} if need is not None else {})}).peak
        plan["reason"] = (f"every rung of the ladder together still needs {plan['peak_bytes'] / GIB:.1f} GiB"
                          + (f", with vLLM's share at the {lo:g} it needs to start" if need is not None else ""))
        return plan
    limit = HEADROOM * mem if status == "fits" else mem
    # Drop a rung the rest of the fix makes unnecessary, as long as vLLM keeps at least the share it had.
    for r in list(reversed(chosen)):
        rest = [x for x in chosen if x is not r]
        c2 = dict(base)
        for x in rest:
            c2 = _apply(c2, x["overrides"])
        ok2, u2 = fits(c2, limit)
        if ok2 and (u is None or (u2 is not None and u2 >= u)):
            chosen, c, u = rest, c2, u2
    if not chosen and (u is None or math.isclose(u, cur_u)):
        plan.update(status="as_written" if status == "fits" else "tight", peak_bytes=size(base).peak,
                    share=u)
        return plan
    rungs = list(chosen)
    if u is not None and not math.isclose(u, cur_u):
        raised = u > cur_u
        share_rung = {
            "remedy": "raise_vllm_gpu_memory_utilization" if raised else "lower_vllm_gpu_memory_utilization",
            "overrides": {"vllm_gpu_memory_utilization": u},
            "why": (f"vLLM needs {need['need_min'] / GIB:.1f} GiB to start (16-bit weights, one sequence's KV cache, "
                    f"a workspace): {cur_u:g} of the device is less" if raised else
                    f"vLLM reserves less for its KV cache, and batches fewer sequences at once (it still holds its "
                    f"weights and one sequence's KV cache, {lo:g} of the device)")}
        at = 0 if raised else (1 if rungs and rungs[0]["remedy"] == "vllm_sleep_mode" else 0)
        rungs.insert(at, share_rung)
    applied: dict[str, Any] = {}
    c = dict(base)
    for r in rungs:
        c = _apply(c, r["overrides"])
        applied.update(r["overrides"])
        e = size(c)
        plan["rungs"].append({**r, "overrides": dict(r["overrides"]), "peak_bytes": e.peak, "fits": bool(e.fits)})
    plan.update(status=status, overrides=applied, peak_bytes=size(c).peak, share=u)
    return plan


def _apply(config: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    return {**config, **overrides}


def layer_activation_elements(shape: Mapping[str, Any], seq_len: int, attn_impl: str = "sdpa") -> tuple[int, int]:
    """Activation elements one token keeps for backward in a dense layer and in an MoE layer.

    Counted from what autograd saves in a Qwen3 layer (measured with saved-tensor hooks on the
    tiny models): 7h for the residual stream, the two RMSNorms and the projections' inputs;
    4 x q_dim and 4 x kv_dim for q and k before and after their norms and rotary embedding, v and
    the attention output; 4I for the SwiGLU (gate and up outputs, the activation, the product).
    An MoE layer keeps, per routed copy of a token (top-k), the expert input and output (2h) and
    the expert's SwiGLU (4 x moe_intermediate), plus the router logits (E). Eager attention also
    keeps the softmax probabilities (heads x seq_len); SDPA and flash attention do not.
    """
    h = int(shape.get("hidden_size") or 0)
    heads = int(shape.get("num_heads") or 0)
    head_dim = int(shape.get("head_dim") or (h // heads if heads else 0))
    kv = int(shape.get("num_kv_heads") or heads)
    q_dim, kv_dim = heads * head_dim, kv * head_dim
    common = 7 * h + 4 * q_dim + 4 * kv_dim
    if attn_impl == "eager":
        common += heads * seq_len
    dense = common + 4 * int(shape.get("intermediate_size") or 0)
    moe = dense
    if shape.get("is_moe"):
        k = int(shape.get("top_k") or 1)
        e = int(shape.get("num_experts") or 0)
        shared = int(shape.get("shared_expert_intermediate_size") or 0)
        moe = common + k * (4 * int(shape.get("moe_intermediate_size") or 0) + 2 * h) + e + (4 * shared + h if shared else 0)
    return dense, moe


@functools.lru_cache(maxsize=1)
def grpo_defaults() -> dict[str, Any]:
    """``GRPO_DEFAULTS`` with the values of the installed TRL's ``GRPOConfig`` (the TRL 1.16 constants
    when TRL does not import). TRL is imported here, on first use, never at module import."""
    out = dict(GRPO_DEFAULTS)
    try:
        import dataclasses

        from trl import GRPOConfig

        fields = {f.name: f for f in dataclasses.fields(GRPOConfig)}
    except Exception:  # TRL absent or broken: the documented constants stand
        return out
    for key in out:
        f = fields.get(key)
        if f is None or f.default is dataclasses.MISSING or (key == "bf16" and f.default is None):
            continue
        out[key] = getattr(f.default, "value", f.default)  # enums (optim) as their names
    return out


def with_grpo_defaults(config: Any) -> dict[str, Any]:
    """The config's fields over GRPOConfig's defaults (``grpo_defaults``): what the trainer would run.

    A field given as None takes the default too; ``bf16`` left out follows ``fp16`` as in TRL.

    >>> cfg = with_grpo_defaults({"fp16": True, "max_completion_length": None})
    >>> cfg["bf16"], cfg["max_completion_length"] == grpo_defaults()["max_completion_length"]
    (False, True)
    """
    raw = config_dict(config)
    given = {k: v for k, v in raw.items() if v is not None}
    # a full GRPOConfig names every field: TRL is imported only for a config that leaves some out
    missing = any(k not in given for k, v in GRPO_DEFAULTS.items() if v is not None)
    cfg = {**(grpo_defaults() if missing else GRPO_DEFAULTS), **given}
    if "bf16" not in given:
        cfg["bf16"] = not cfg.get("fp16")
    return cfg


def config_dict(config: Any) -> dict[str, Any]:
    """A GRPOConfig (or TrainingArguments) or a mapping as a plain dict of its fields."""
    if config is None:
        return {}
    if isinstance(config, Mapping):
        return dict(config)
    if callable(getattr(config, "to_dict", None)):
        out = config.to_dict()
        # to_dict() renders some fields (deepspeed dicts, enums) as text; keep the live values that matter
        for key in ("deepspeed", "fsdp", "optim", "model_init_kwargs"):
            if hasattr(config, key):
                v = getattr(config, key)
                out[key] = getattr(v, "value", v)
        return out
    return dict(vars(config))


# -- per-step system metrics ---------------------------------------------------------------------
