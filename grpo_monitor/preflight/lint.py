"""Pre-flight recipe lint: the configuration checks that can be made before the first step.

``lint(config, ...)`` returns ``config_*`` findings (the same records the detectors raise, at
step 0): each names the rule it breaks, the fix as a config diff and the numbers behind it.
It runs at train start (``lint_trainer``) and on a saved configuration
(``grpo-monitor lint config.yaml | run_dir | output_dir``: a Trainer output_dir is linted from the config its
grpo-monitor run recorded, as ``analyze`` and ``watch`` read it).

Rules (severity): ``config_num_generations`` (warning: fewer than 8 completions per prompt make a noisier
baseline; a deviation from the recipe that does not break the run),
``config_reward_count`` / ``config_format_reward`` (warning: fewer than two reward functions, no
format reward), ``config_dataset_prompt`` / ``config_dataset_completions`` (warning: the dataset
must hold prompts only), ``config_learning_rate`` / ``config_beta`` (info, first run only: more
than 10x away from 5e-7 / 0.01, or beta 0), ``config_vllm_mode`` (warning: colocate on one GPU,
server on several), ``config_vllm_cpu`` (critical: vLLM on a run judged for CPU), ``config_on_policy_trap`` (warning: clip-higher
or sequence-level ratio that cannot act on-policy), ``config_moe_gspo`` (warning: an MoE model
not on GSPO), ``config_vlm`` (warning: out of the recipe's scope), ``config_logging_steps`` (info:
coarser detection), ``config_max_completion_length`` (warning: most completions truncated),
``config_bf16`` (critical: bf16 where the device has none), ``config_unknown_key`` (critical: a key TRL's
parser refuses, with the nearest field; ``trl_fields``), ``config_memory`` (from the memory
estimate: critical when it will not fit, warning within 10%; its diff is ``memory.fit_plan``'s, the ladder
climbed on the whole estimate until 10% of the device is free, so applying it and linting again leaves no
memory finding; no diff, and one critical, where no setting fits one device;
``config_memory_unchecked``, info, when a GPU run's memory could not be sized: no model shape, or no device
memory), ``config_unified_memory`` (info: decode-heavy rollouts on a device sharing its memory with the CPU,
DGX Spark / GB10 or Grace-Hopper, with the least decode time its bandwidth allows). The vLLM pre-flight: ``config_vllm_off``
(warning: no vLLM on a multi-GPU CUDA run), ``config_vllm_is_correction`` (warning: the
importance-sampling correction turned off), ``config_vllm_server_host`` (warning: server mode with
no address to connect to), ``config_vllm_memory`` (critical: vLLM's colocated share cannot hold the
model; its fix is the memory plan's share, so the two never disagree; a share that leaves training too little
is ``config_memory``'s to resolve). No two findings carry different values for one flag. ``config_moe_gspo`` also knows well-known MoE
hub ids when no local model config is at hand.

A recipe is judged for the device it is written for (``recipe_device``): one that sets bf16, vLLM,
DeepSpeed and the like is judged for a CUDA GPU even on a laptop, and never told to become a CPU run;
only a config that names no GPU setting (or an explicit ``device_kind='cpu'``) is judged for this machine.

>>> ids = [f.detector for f in lint({"num_generations": 4, "learning_rate": 5e-7, "beta": 0.01,
...     "logging_steps": 1}, reward_names=["format_reward", "correctness_reward"], device_kind="cuda")]
>>> ids  # no model: its memory could not be sized, and lint says so
['config_num_generations', 'config_memory_unchecked']
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from grpo_monitor.core.exit_codes import ExitCode
from grpo_monitor.core.model_config import config_from_model_id, moe_from_model_id
from grpo_monitor.detectors.base import Finding
from grpo_monitor.detectors.numbers import finite
from grpo_monitor.detectors.variants import checkpointing
from grpo_monitor.preflight.memory import (
    GRPO_DEFAULTS,
    config_dict,
    estimate,
    model_shape,
    vllm_needs,
    with_grpo_defaults,
)

RECIPE_LEARNING_RATE = 5e-7
RECIPE_BETA = 0.01
MIN_GENERATIONS = 8
FAR_FACTOR = 10.0
COMPLETION_COLUMNS = ("completion", "completions", "response", "responses", "output", "outputs", "chosen", "rejected")
FORMAT_HINTS = ("format", "xml", "schema", "tag")
CLIPPED_MAJORITY = 0.5

# GRPOConfig's defaults for the fields the rules read (a saved YAML may omit any of them): the same
# table the memory estimate fills a config from, replaced by the installed TRL's values when it imports.
DEFAULTS = GRPO_DEFAULTS

# Settings that only make sense on a CUDA GPU: a recipe naming one is judged for a GPU wherever it is linted.
GPU_FLAGS = ("bf16", "fp16", "tf32", "use_vllm", "use_liger_kernel")
GPU_OPTIMIZER_HINTS = ("bnb", "8bit", "4bit", "paged")  # bitsandbytes / torchao low-bit states
# A model this large (about 2 GB in bf16) with gradient checkpointing asked for is a GPU run.
LARGE_MODEL_PARAMETERS = 1_000_000_000

# The recipe's learning rate is sized for billion-parameter policies; a model this small (the demo's, a
# test fixture) takes far larger steps, so lint never advises it the recipe's rate.
SMALL_MODEL_PARAMETERS = 100_000_000
# Completions this long make a rollout decode-heavy: decode, bound by memory bandwidth, dominates it.
DECODE_HEAVY_TOKENS = 1024


def _finding(rule: str, severity: str, message: str, evidence: dict[str, Any],
             overrides: dict[str, Any] | None = None, variant: str | None = None) -> Finding:
    evidence = dict(evidence)
    if overrides and variant is None and severity != "info":
        # The fix as a named remedy, so the recommendation (report, dashboard, JSON) carries its diff.
        evidence.setdefault("remedy", f"config_{rule}")
    return Finding(detector=f"config_{rule}", severity=severity, step=0, onset_step=None, variant=variant,
                   config_overrides=dict(overrides or {}), evidence=evidence, message=message)


def _ratio(value: float, target: float) -> float | None:
    """How many times ``value`` is away from ``target`` (None for 0 or below: no finite ratio)."""
    return round(max(value / target, target / value), 3) if value > 0 else None


def _far(value: float, target: float) -> bool:
    return value <= 0 or max(value / target, target / value) > FAR_FACTOR


def _reward_name(func: Any) -> str:
    if isinstance(func, str):
        return func.rsplit(":", 1)[-1].rsplit(".", 1)[-1]
    name = getattr(func, "__name__", None)
    if name is None and hasattr(func, "config"):  # a reward model
        name = str(getattr(func.config, "_name_or_path", "") or type(func).__name__).split("/")[-1]
    return str(name or type(func).__name__)


def _dataset_columns(dataset: Any) -> list[str] | None:
    if dataset is None:
        return None
    cols = getattr(dataset, "column_names", None)
    if isinstance(cols, Mapping):  # DatasetDict: the train split, else the first
        cols = cols.get("train") or next(iter(cols.values()), None)
    if cols is None and isinstance(dataset, Mapping):
        cols = list(dataset.keys())
    if cols is None and isinstance(dataset, Sequence) and dataset and isinstance(dataset[0], Mapping):
        cols = list(dataset[0].keys())
    return [str(c) for c in cols] if cols is not None else None


def _local_bf16() -> tuple[str | None, bool | None]:
    """(device kind, bf16 supported) of this machine, from torch when it is installed."""
    try:
        import torch
    except ImportError:
        return None, None
    try:
        if torch.cuda.is_available():
            return "cuda", bool(torch.cuda.is_bf16_supported())
    except Exception:
        return None, None
    return "cpu", False


def _truthy(v: Any) -> bool:
    if isinstance(v, str):
        return v.strip().lower() in ("true", "1", "yes", "on")
    return bool(v)


def recipe_device(config: Any, model: Any = None) -> tuple[str | None, list[str]]:
    """The device a recipe is written for, from what its config says: ``("cuda", reasons)`` when it
    sets something only a GPU runs (bf16/fp16, vLLM, DeepSpeed/FSDP, NCCL, bitsandbytes optimizers,
    flash attention, gradient checkpointing of a multi-GB model), ``("cpu", reasons)`` when it asks
    for the CPU (``use_cpu``), ``(None, [])`` when it says neither. Fields it leaves out say nothing:
    TRL's own defaults are not a statement about the hardware.

    >>> recipe_device({"bf16": True, "use_vllm": True, "vllm_mode": "colocate"})
    ('cuda', ['bf16=True', 'use_vllm=True', "vllm_mode='colocate'"])
    >>> recipe_device({"num_generations": 8}), recipe_device({"bf16": True, "use_cpu": True})
    ((None, []), ('cpu', ['use_cpu=True']))
    """
    raw = config_dict(config)
    for key in ("use_cpu", "no_cuda"):
        if _truthy(raw.get(key)):
            return "cpu", [f"{key}=True"]
    reasons = [f"{k}=True" for k in GPU_FLAGS if _truthy(raw.get(k))]
    if isinstance(raw.get("vllm_mode"), str) and raw["vllm_mode"]:
        reasons.append(f"vllm_mode={raw['vllm_mode']!r}")
    for key in ("deepspeed", "fsdp"):
        if raw.get(key) not in (None, "", [], {}, False):
            reasons.append(f"{key} set")
    if str(raw.get("ddp_backend") or "").lower() == "nccl":
        reasons.append("ddp_backend='nccl'")
    optim = str(raw.get("optim") or "").lower()
    if any(h in optim for h in GPU_OPTIMIZER_HINTS):
        reasons.append(f"optim={optim!r}")
    init = raw.get("model_init_kwargs") if isinstance(raw.get("model_init_kwargs"), Mapping) else {}
    attn = str(raw.get("attn_implementation") or init.get("attn_implementation") or "")
    if "flash" in attn.lower():
        reasons.append(f"attn_implementation={attn!r}")
    if str(init.get("device_map") or "").startswith("cuda"):
        reasons.append(f"device_map={init['device_map']!r}")
    _, ckpt = checkpointing(raw)
    if ckpt is not None and _truthy(ckpt):
        params = finite(_safe_shape(model).get("num_parameters")) if model is not None else None
        if params is not None and params >= LARGE_MODEL_PARAMETERS:
            reasons.append(f"gradient_checkpointing=True on a {params / 1e9:.1f}B-parameter model")
    return ("cuda", reasons) if reasons else (None, [])


def lint(
    config: Any,
    *,
    model: Any = None,
    reward_funcs: Sequence[Any] | None = None,
    reward_names: Sequence[str] | None = None,
    dataset: Any = None,
    num_devices: int | None = None,
    device_kind: str | None = None,
    first_run: bool = True,
    completion_lengths: Sequence[int] | None = None,
    bf16_supported: bool | None = None,
    device_memory_gib: float | None = None,
    clipped_ratio: float | None = None,
    prompt_length: int | None = None,
    details: dict[str, Any] | None = None,
    device_facts: Mapping[str, Any] | None = None,
    model_note: str | None = None,
    check_keys: bool = True,
) -> list[Finding]:
    """Check a GRPO configuration against the recipe; returns ``config_*`` findings at step 0.

    ``config`` is a GRPOConfig or a dict of its fields (missing fields take TRL 1.16's defaults).
    ``model`` is a model, a config/``config.json`` or run-header model facts. ``device_kind`` is
    ``"cuda"`` or ``"cpu"``; None judges the recipe for the device its config is written for
    (``recipe_device``: a GPU recipe for a CUDA GPU wherever it is linted) and, when the config says
    neither, for this machine (torch, imported here lazily).
    ``bf16_supported`` overrides the device's bf16 capability. ``completion_lengths`` are token
    lengths observed in the first steps; ``clipped_ratio`` is their truncated fraction when only
    that is known. ``device_memory_gib`` enables the ``config_memory`` check. ``details``, when
    given, receives what the judgement rested on: ``device`` (judged for), ``device_from``
    (``"given"``, ``"config"``, ``"this machine"``), ``device_reasons``, ``local_device`` and the
    memory ``estimate`` (one ``MemoryEstimate``, the one ``config_memory`` quotes; None without a model).
    ``device_facts`` is what the GPU reports of itself (``preflight.memory.detect_device_facts``, a run
    header's ``device``): on a unified-memory machine it enables ``config_unified_memory``.
    A run judged for a GPU whose memory cannot be checked (no model shape, or no device memory) gets
    ``config_memory_unchecked`` (info, with ``model_note`` saying why there is no shape): a lint never
    passes a recipe as fitting without having sized it.
    A config given as a mapping has its keys read as TRL reads a recipe (``trl_fields.read_keys``, with
    ``check_keys``; a run header's config was a real GRPOConfig of the TRL that ran it, so it is not): a
    key TRL refuses is a ``config_unknown_key`` critical naming the nearest field, and it is left out of
    every other check, the memory estimate included.
    """
    raw = config_dict(config)
    out: list[Finding] = []
    if check_keys and isinstance(config, Mapping):
        raw, key_findings, keys = _read_keys(raw)
        out.extend(key_findings)
        if details is not None:
            details["keys"] = keys
    cfg = with_grpo_defaults(raw)
    shape = _safe_shape(model)

    # the group baseline needs at least 8 samples
    ng = int(finite(cfg["num_generations"]) or 0)
    if ng < MIN_GENERATIONS:
        # A noisier baseline, not a broken run: a deviation from the recipe, so a warning.
        out.append(_finding(
            "num_generations", "warning",
            f"num_generations={ng} is below the recipe's floor of {MIN_GENERATIONS}: the advantage is relative to the "
            f"group mean, and fewer samples make that baseline too noisy. Use num_generations={MIN_GENERATIONS} (the "
            f"generation batch, per_device_train_batch_size x steps_per_generation x devices, must stay divisible by it).",
            {"num_generations": ng, "floor": MIN_GENERATIONS}, {"num_generations": MIN_GENERATIONS}))

    # composite reward: format + correctness
    names = list(reward_names) if reward_names is not None else (
        [_reward_name(f) for f in reward_funcs] if reward_funcs is not None else None)
    if names is None and isinstance(raw.get("reward_funcs"), list):
        names = [_reward_name(f) for f in raw["reward_funcs"]]
    if names is not None:
        if len(names) < 2:
            out.append(_finding(
                "reward_count", "warning",
                f"{len(names)} reward function(s) ({', '.join(names) or 'none'}): the recipe uses a composite reward, "
                "format plus correctness, so a well-formatted wrong answer and a malformed one do not score the same.",
                {"reward_funcs": names, "expected_at_least": 2}))
        if not any(any(h in n.lower() for h in FORMAT_HINTS) for n in names):
            out.append(_finding(
                "format_reward", "warning",
                f"No format reward among {names}: correctness alone loses the format signal. Add a format reward "
                "(its name containing 'format', 'xml', 'schema' or 'tag' lets the monitor recognise it).",
                {"reward_funcs": names, "hints": list(FORMAT_HINTS)}))

    # the dataset holds prompts only
    cols = _dataset_columns(dataset)
    if cols is not None:
        if "prompt" not in cols:
            out.append(_finding(
                "dataset_prompt", "warning",
                f"The training dataset has no 'prompt' column (columns: {cols}); GRPOTrainer reads prompts from it.",
                {"columns": cols}))
        leaked = [c for c in cols if c.lower() in COMPLETION_COLUMNS]
        if leaked:
            out.append(_finding(
                "dataset_completions", "warning",
                f"The training dataset carries completion-like columns {leaked}: GRPO generates the completions "
                "itself, so the dataset should hold prompts (and answer targets for the reward) only. These columns "
                "are passed to every reward function; make sure none scores against a reference completion by mistake.",
                {"columns": cols, "completion_like": leaked}))

    # learning rate and beta: start from the recipe on a first run
    if first_run:
        lr = finite(cfg["learning_rate"])
        params = finite(shape.get("num_parameters"))
        # For a small model the recipe's rate is a floor at most: never advise it a rate below its own.
        small = params is not None and params < SMALL_MODEL_PARAMETERS
        if lr is not None and _far(lr, RECIPE_LEARNING_RATE) and not (small and lr > RECIPE_LEARNING_RATE):
            out.append(_finding(
                "learning_rate", "info",
                f"learning_rate={lr:g} is more than {FAR_FACTOR:g}x away from the recipe's {RECIPE_LEARNING_RATE:g}; "
                "start there and move only once a base run is stable and the rewards are inspected.",
                {"learning_rate": lr, "recipe": RECIPE_LEARNING_RATE, "ratio": _ratio(lr, RECIPE_LEARNING_RATE),
                 "far_factor": FAR_FACTOR},
                {"learning_rate": RECIPE_LEARNING_RATE}))
        beta = finite(cfg["beta"])
        if beta is not None and _far(beta, RECIPE_BETA):
            why = "beta=0 drops the KL term (and the reference model)" if beta <= 0 else \
                f"beta={beta:g} is more than {FAR_FACTOR:g}x away from the recipe's {RECIPE_BETA:g}"
            out.append(_finding(
                "beta", "info",
                f"{why}; the recipe starts from beta={RECIPE_BETA:g} and moves only once a base run is stable.",
                {"beta": beta, "recipe": RECIPE_BETA, "ratio": _ratio(beta, RECIPE_BETA), "far_factor": FAR_FACTOR},
                {"beta": RECIPE_BETA}))

    # device facts: a recipe is judged for the device it is written for, not for the machine linting it
    kind, source = device_kind, "given"
    local_kind = local_bf16 = None
    wanted, reasons = recipe_device(raw, shape)
    if kind is None:
        local_kind, local_bf16 = _local_bf16()
        kind, source = (wanted, "config") if wanted else (local_kind, "this machine")
    if _truthy(cfg.get("use_cpu")):
        kind, source, reasons = "cpu", "config", ["use_cpu=True"]
    if bf16_supported is None:
        bf16_supported = False if kind == "cpu" else (local_bf16 if local_kind == kind else None)
    est = None
    if shape.get("num_parameters"):
        try:
            # the config as given: the estimate fills the same defaults and says which it assumed
            est = estimate(raw, shape, num_devices=num_devices or 1, device_memory_gib=device_memory_gib,
                           prompt_length=prompt_length, device_kind=kind)
        except Exception:  # sizing is advice; a shape it cannot read must not hide the other findings
            est = None
    if details is not None:
        details.update(device=kind, device_from=source, device_reasons=list(reasons), local_device=local_kind,
                       estimate=est)

    # vLLM placement
    if cfg.get("use_vllm"):
        mode = str(cfg.get("vllm_mode") or "colocate")
        if kind == "cpu":
            out.append(_finding(
                "vllm_cpu", "critical",
                "use_vllm=True needs CUDA GPUs and this run is judged for CPU"
                + (f" ({', '.join(reasons)})" if source == "config" else "")
                + ": to train it on CPU set use_vllm=False (generation then runs through transformers).",
                {"use_vllm": True, "device": "cpu", "device_from": source}, {"use_vllm": False}))
        elif num_devices is not None:
            n = int(num_devices)
            if n <= 1 and mode != "colocate":
                out.append(_finding(
                    "vllm_mode", "warning",
                    f"vllm_mode='{mode}' on one GPU: a separate vLLM server would compete with training for the same "
                    "device. The recipe uses vllm_mode='colocate' on a single GPU.",
                    {"vllm_mode": mode, "num_devices": n}, {"vllm_mode": "colocate"}))
            elif n > 1 and mode == "colocate":
                out.append(_finding(
                    "vllm_mode", "warning",
                    f"vllm_mode='colocate' on {n} GPUs: generation and training share every device. The recipe runs "
                    "vllm_mode='server' on several GPUs (`trl vllm-serve` on its own GPU(s), training on the rest).",
                    {"vllm_mode": mode, "num_devices": n}, {"vllm_mode": "server"}))

    out.extend(_vllm_checks(cfg, raw, shape, kind, num_devices, device_memory_gib, prompt_length, est))

    # on-policy trap: clip-higher and GSPO's sequence ratio do nothing when the ratio is identically 1
    from grpo_monitor.core.recommend import is_on_policy

    eps, eps_high = finite(cfg.get("epsilon")), finite(cfg.get("epsilon_high"))
    clip_higher = eps_high is not None and (eps is None or not math.isclose(eps_high, eps))
    sequence = str(cfg.get("importance_sampling_level")) == "sequence"
    ga = int(finite(cfg.get("gradient_accumulation_steps")) or 1)
    if (clip_higher or sequence) and is_on_policy({**cfg, "steps_per_generation": cfg.get("steps_per_generation") or ga}):
        what = " and ".join(x for x in (
            f"epsilon_high={eps_high:g}" if clip_higher else "",
            "importance_sampling_level='sequence'" if sequence else "") if x)
        out.append(_finding(
            "on_policy_trap", "warning",
            f"{what} changes nothing here: with num_iterations=1 and steps_per_generation == "
            f"gradient_accumulation_steps ({ga}) the run is on-policy, the importance ratio is identically 1 and "
            f"clipping never fires. Go off-policy (steps_per_generation={4 * ga}) or drop the setting.",
            {"epsilon": eps, "epsilon_high": eps_high, "importance_sampling_level": cfg.get("importance_sampling_level"),
             "num_iterations": cfg.get("num_iterations"), "steps_per_generation": cfg.get("steps_per_generation"),
             "gradient_accumulation_steps": ga},
            {"steps_per_generation": 4 * ga}, variant="gspo" if sequence else "dapo"))

    # model family
    moe = shape if shape.get("is_moe") else ({} if shape else moe_from_model_id(raw.get("model_name_or_path")))
    vllm_token_is = bool(cfg.get("use_vllm")) and str(cfg.get("vllm_importance_sampling_mode")).startswith("token")
    if moe.get("is_moe") and (str(cfg.get("importance_sampling_level")) != "sequence" or vllm_token_is):
        from grpo_monitor.detectors.variants import preset
        from grpo_monitor.core.recommend import config_diff

        overrides = config_diff(preset("gspo", cfg), cfg)
        if vllm_token_is:
            overrides["vllm_importance_sampling_mode"] = "sequence_mask"
        layout = (f"{moe.get('num_experts')} experts, top-{moe.get('top_k')}" if moe.get("num_experts")
                  else "by its model id")
        seen = f" ({moe['source']}: no local config)" if moe.get("source") else ""
        out.append(_finding(
            "moe_gspo", "warning",
            f"Mixture-of-experts model ({layout}){seen} trained with token-level importance ratios: under MoE "
            "routing they are high-variance noise, and the rollout engine routes differently from the trainer. "
            "For MoE, GSPO (importance_sampling_level='sequence', off-policy steps) is required, not optional"
            + ("; with vLLM, correct at sequence level too (vllm_importance_sampling_mode='sequence_mask')."
               if vllm_token_is else "."),
            {"num_experts": moe.get("num_experts"), "top_k": moe.get("top_k"), "source": moe.get("source", "model config"),
             "importance_sampling_level": cfg.get("importance_sampling_level"),
             "vllm_importance_sampling_mode": cfg.get("vllm_importance_sampling_mode") if cfg.get("use_vllm") else None},
            overrides, variant="gspo"))
    if shape.get("is_vlm"):
        out.append(_finding(
            "vlm", "warning",
            "This is a vision-language model: vision-language RL is out of scope of the recipe (tooling is fragmented, and "
            "text-only GRPO on a VLM reward-hacks the text trace and ignores the image). The monitor's checks "
            "assume text-only RL; treat its advice for this run with care.",
            {"model_type": shape.get("model_type")}))

    # detection granularity
    ls = int(finite(cfg["logging_steps"]) or 1)
    if ls > 1:
        out.append(_finding(
            "logging_steps", "info",
            f"logging_steps={ls}: TRL averages metrics over {ls} steps, so the monitor sees (and detects) at that "
            "granularity; logging_steps=1 gives per-step detection.",
            {"logging_steps": ls}, {"logging_steps": 1}))

    # truncation in the first steps
    cap = int(finite(cfg.get("max_completion_length")) or 0)
    frac = None
    if completion_lengths:
        lengths = [int(x) for x in completion_lengths]
        frac = sum(1 for x in lengths if cap and x >= cap) / len(lengths)
    elif clipped_ratio is not None:
        frac = float(clipped_ratio)
    if frac is not None and frac > CLIPPED_MAJORITY:
        out.append(_finding(
            "max_completion_length", "warning",
            f"{100 * frac:.0f}% of the first completions hit max_completion_length={cap}: truncated completions "
            "often score 0 on every reward, leaving no learning signal. Raise max_completion_length.",
            {"truncated_fraction": frac, "max_completion_length": cap, "threshold": CLIPPED_MAJORITY},
            {"max_completion_length": max(2 * cap, 1)} if cap else {}))

    # bf16 where the device has none
    if cfg.get("bf16") and bf16_supported is False:
        where = "on CPU" if kind == "cpu" else "on a GPU without bf16 support"
        said = "" if raw.get("bf16") is not None else " (GRPOConfig's default when fp16 is not set)"
        out.append(_finding(
            "bf16", "critical",
            f"bf16=True{said} {where}: transformers refuses to start. Set bf16=False"
            + (" (the GPU may support fp16=True)." if kind != "cpu" else "."),
            {"bf16": True, "device": kind, "bf16_supported": False}, {"bf16": False}))

    # memory: checked, or said not to be
    if kind != "cpu" and device_memory_gib and est is not None:
        f = est.finding()
        if f is not None:
            out.append(f)
    elif kind != "cpu":
        out.append(_memory_unchecked(est, device_memory_gib, model_note))
    if kind != "cpu" and device_facts:
        f = unified_memory_finding(cfg, shape, device_facts, est)
        if f is not None:
            out.append(f)
    return _one_value_per_flag(_one_memory_verdict(out))


def unified_memory_finding(cfg: Mapping[str, Any], shape: Mapping[str, Any], device_facts: Mapping[str, Any],
                           est: Any = None) -> Finding | None:
    """``config_unified_memory`` (info): a decode-heavy rollout (``max_completion_length`` of
    ``DECODE_HEAVY_TOKENS`` or more) on a device that shares its memory with the CPU, recognised by what it
    reports (``core.device.unified_memory``), with the least decode time the memory's bandwidth allows."""
    from grpo_monitor.core.device import decode_floor, unified_memory

    um = unified_memory(device_facts)
    cap = int(finite(cfg.get("max_completion_length")) or 0)
    if um is None or cap < DECODE_HEAVY_TOKENS:
        return None
    params = finite(shape.get("num_parameters"))
    # The rollout engine's copy of the weights: vLLM serves 16-bit weights; transformers generate the trained ones.
    weights = (2.0 * params if cfg.get("use_vllm") else float(est.terms["weights"]) if est is not None
               else 2.0 * params) if params else None
    ev: dict[str, Any] = {"device": um["name"], "kind": um["kind"], "recognised_by": um["evidence"],
                          "bandwidth_gbs": um["bandwidth_gbs"], "max_completion_length": cap,
                          "decode_heavy_tokens": DECODE_HEAVY_TOKENS}
    floor = decode_floor(weights, um["bandwidth_gbs"], cap) if weights else None
    cost = ""
    if floor is not None:
        ev.update(weights_gb=round(weights / 1e9, 2), decode_step_ms=round(floor["decode_step_ms"], 2),
                  rollout_s=round(floor["rollout_s"], 1))
        cost = (f": with {weights / 1e9:.1f} GB of weights read once per generated token, a {cap}-token rollout takes "
                f"at least {floor['rollout_s']:.0f} s ({floor['decode_step_ms']:.1f} ms per token), KV-cache reads on top")
    if um["kind"] == "grace_hopper":
        spill = decode_floor(weights, um["spill_bandwidth_gbs"], cap) if weights else None
        if spill is not None:
            ev["rollout_s_from_cpu_memory"] = round(spill["rollout_s"], 1)
        message = (f"{um['label']}: the GPU decodes from its HBM at about {um['bandwidth_gbs']:,.0f} GB/s{cost}, but "
                   f"weights or KV cache placed in the Grace CPU's memory (managed-memory oversubscription, CPU "
                   f"offload, vLLM's cpu_offload_gb or swap space) are read over NVLink-C2C at about "
                   f"{um['spill_bandwidth_gbs']:,.0f} GB/s"
                   + (f", {spill['rollout_s']:.0f} s per rollout" if spill is not None else "")
                   + ". Keep the rollout engine's weights and KV cache in HBM for these decode-heavy rollouts.")
    else:
        bw = f"about {um['bandwidth_gbs']:,.0f} GB/s" if um["bandwidth_gbs"] else "the host memory's bandwidth"
        message = (f"{um['label']}: rollouts of up to {cap} tokens are decode-heavy, and decoding is bound by the "
                   f"memory bandwidth, {bw} here against about 3,350 GB/s on an H100's HBM{cost}. Expect generation "
                   "to dominate each step: a shorter max_completion_length, a smaller model, or num_iterations > 1 "
                   "(each rollout reused for several updates, off-policy) cut it; what the CPU side holds (the "
                   "dataloader, the Python process) comes out of the same memory.")
    return _finding("unified_memory", "info", message, ev)


def _memory_unchecked(est: Any, device_memory_gib: float | None, model_note: str | None) -> Finding:
    """Why the memory check could not run: no model shape, or no device memory to hold the estimate against."""
    if est is None:
        why = model_note or "no model shape (pass --model DIR with its config.json, or a model_name_or_path lint knows)"
        return _finding("memory_unchecked", "info",
                        f"Memory was not checked: {why}.", {"checked": False, "reason": "no model shape"})
    peak = est.peak / 1024**3
    return _finding("memory_unchecked", "info",
                    f"Memory was not checked against a device: the estimate is {peak:.1f} GiB per device, and the "
                    "device's memory is not known here (no GPU on this machine): pass --device-memory-gib "
                    "(80 for an 80 GiB GPU).",
                    {"checked": False, "reason": "device memory unknown", "peak_gib": round(peak, 2)})


def _vllm_checks(cfg: Mapping[str, Any], raw: Mapping[str, Any], shape: Mapping[str, Any], kind: str | None,
                 num_devices: int | None, device_memory_gib: float | None, prompt_length: int | None,
                 est: Any = None) -> list[Finding]:
    """The vLLM pre-flight: generation engine, importance-sampling correction, server address, memory share."""
    out: list[Finding] = []
    n = int(num_devices) if num_devices is not None else None
    if not cfg.get("use_vllm"):
        if kind == "cuda" and n is not None and n > 1:
            out.append(_finding(
                "vllm_off", "warning",
                f"use_vllm=False on {n} GPUs: generation runs through transformers' generate, which dominates a GRPO "
                "step. The recipe generates with vLLM: vllm_mode='server' (`trl vllm-serve` on its own GPU(s)).",
                {"use_vllm": False, "num_devices": n, "device": kind}, {"use_vllm": True, "vllm_mode": "server"}))
        return out
    if cfg.get("vllm_importance_sampling_correction") is False:
        out.append(_finding(
            "vllm_is_correction", "warning",
            "vllm_importance_sampling_correction=False: vLLM's log-probs differ from the trainer's (kernels, "
            "precision, MoE routing), so every step trains on off-policy samples as if they were on-policy, and the "
            "mismatch metrics (sampling/*) are not logged. Turn the correction back on.",
            {"vllm_importance_sampling_correction": False},
            {"vllm_importance_sampling_correction": True}))
    mode = str(cfg.get("vllm_mode") or "colocate")
    if mode == "server" and not raw.get("vllm_server_base_url"):
        host = str(cfg.get("vllm_server_host") or "")
        if host in ("", "0.0.0.0", "::"):
            out.append(_finding(
                "vllm_server_host", "warning",
                f"vllm_mode='server' with vllm_server_host='{host}' and no vllm_server_base_url: {host or 'an empty host'}"
                " is a listen address, not one to connect to, and reaches a server only on this machine. Set "
                "--vllm_server_host <the server's address> (or --vllm_server_base_url http://HOST:PORT), and start "
                "`trl vllm-serve` there first.",
                {"vllm_mode": mode, "vllm_server_host": host, "vllm_server_base_url": None,
                 "vllm_server_port": raw.get("vllm_server_port", 8000)}))
    if mode == "colocate" and kind == "cuda" and device_memory_gib and shape.get("num_parameters"):
        f = _vllm_memory(cfg, shape, float(device_memory_gib), prompt_length, est)
        if f is not None:
            out.append(f)
    return out


def _vllm_memory(cfg: Mapping[str, Any], shape: Mapping[str, Any], mem_gib: float, prompt_length: int | None,
                 est: Any) -> Finding | None:
    """vLLM's colocated share against what the engine needs to start (``memory.vllm_needs``). Its fix is the
    memory plan's share (``memory.fit_plan``, solved against the whole estimate), so it and ``config_memory``
    never name two values for it; where the plan needs more than the share to fit, the fix carries that too."""
    gib = 1024**3
    util = finite(cfg.get("vllm_gpu_memory_utilization")) or 0.3
    need = vllm_needs(cfg, shape, mem_gib, prompt_length)
    if need is None or util >= need["floor_util"]:
        return None
    share = util * mem_gib * gib
    ev: dict[str, Any] = {"vllm_gpu_memory_utilization": util, "vllm_share_gib": round(share / gib, 2),
                          "engine_weights_gib": round(need["weights"] / gib, 2),
                          "kv_cache_per_sequence_gib": round(need["kv_per_sequence"] / gib, 3),
                          "generation_batch": need["generation_batch"], "device_memory_gib": mem_gib,
                          "needed_gib": round(need["need_min"] / gib, 2), "least_share": need["floor_util"]}
    plan = getattr(est, "plan", None) or {}
    message = (f"vllm_gpu_memory_utilization={util:g} gives vLLM {share / gib:.1f} GiB of the {mem_gib:g} GiB device, "
               f"less than the model's weights ({need['weights'] / gib:.1f} GiB) plus one sequence's KV cache and its "
               f"workspace ({need['need_min'] / gib:.1f} GiB): vLLM will not start.")
    if not need["possible"] or plan.get("status") == "none":
        ev["plan"] = "none"
        return _finding("vllm_memory", "critical", message + " No share of this device holds it beside training "
                        "(config_memory says what it needs).", ev)
    overrides = dict(plan.get("overrides") or {})
    fix = overrides.get("vllm_gpu_memory_utilization", need["floor_util"])
    overrides.setdefault("vllm_gpu_memory_utilization", fix)
    extra = [k for k in overrides if k != "vllm_gpu_memory_utilization"]
    message += f" Raise it to {fix:g}" + (
        f", with what the run then needs to fit the device ({', '.join(extra)}; config_memory sizes it)" if extra else "") + "."
    return _finding("vllm_memory", "critical", message, ev, overrides)


def _one_memory_verdict(findings: list[Finding]) -> list[Finding]:
    """One memory verdict per recipe: where ``config_memory`` carries the fix, ``config_vllm_memory`` keeps
    only its share (the same value), and where nothing fits, the one critical saying so is config_memory's."""
    mem = next((f for f in findings if f.detector == "config_memory"), None)
    vllm = next((f for f in findings if f.detector == "config_vllm_memory"), None)
    if mem is None or vllm is None:
        return findings
    if mem.evidence.get("plan") == "none":
        return [f for f in findings if f is not vllm]
    share = mem.config_overrides.get("vllm_gpu_memory_utilization")
    if share is not None:
        vllm.config_overrides = {"vllm_gpu_memory_utilization": share}
    return findings


# Which finding's value stands when two name one flag: the memory plan (solved on the whole estimate), then
# by severity.
_SEVERITY_RANK = {"critical": 0, "warning": 1, "info": 2}


def _one_value_per_flag(findings: list[Finding]) -> list[Finding]:
    """Never two findings with different values for one flag: the value of the finding ranked first
    (``config_memory``, then the most severe) stands, and the others are told so in their fix."""
    ranked = sorted(findings, key=lambda f: (f.detector != "config_memory", _SEVERITY_RANK.get(f.severity, 3)))
    chosen: dict[str, tuple[Any, str]] = {}
    for f in ranked:
        for key, value in list(f.config_overrides.items()):
            if key not in chosen:
                chosen[key] = (value, f.detector)
            elif chosen[key][0] != value:
                f.config_overrides[key] = chosen[key][0]
                f.evidence.setdefault("resolved", {})[key] = {"wanted": value, "set_by": chosen[key][1]}
    return findings


def _read_keys(raw: dict[str, Any]) -> tuple[dict[str, Any], list[Finding], dict[str, Any]]:
    """The config's keys as TRL reads them: refused keys as criticals (and left out), values as TRL parses them."""
    from grpo_monitor.preflight.trl_fields import read_keys

    keys = read_keys(raw)
    out = []
    drop = set()
    for r in keys["refused"]:
        key, near = r["key"], r.get("nearest")
        drop.add(key)
        if "choices" in r:
            hint = f"; did you mean {near}?" if near else f"; it takes one of {', '.join(r['choices'])}"
            message = f"{key}={r['value']!r}: {r['why']}{hint} TRL does not run the recipe with it."
        elif r["why"].startswith("TRL's parser cannot read"):
            message = f"{key}={r['value']!r}: {r['why']}; TRL refuses the recipe before it starts."
        else:
            if r.get("typo"):
                hint, todo = f"; did you mean {near}?", f"Rename it to {near}."
            elif r.get("removed"):
                hint = f": {r['removed']}"
                todo = "Remove it."
            else:
                hint = f"; the nearest field is {near}" if near else ""
                todo = "Remove it, or name the field you meant."
            first = f"{key}: {r['why']}{hint}"
            message = (first + ("" if first.endswith("?") else ".") + " TRL's parser stops on it (Unknown arguments "
                       f"from config file: ['--{key}', ...]), so the recipe does not run. {todo}")
        out.append(_finding("unknown_key", "critical", message,
                            {"key": key, "value": r.get("value"), "nearest": near, "read_by": keys["how"],
                             "trl_version": keys["trl_version"], **({"choices": r["choices"]} if "choices" in r else {})}))
    cleaned = {k: keys["values"].get(k, v) for k, v in raw.items() if k not in drop and k != "env"}
    return cleaned, out, {k: v for k, v in keys.items() if k not in ("values",)}


def _safe_shape(model: Any) -> dict[str, Any]:
    if model is None:
        return {}
    try:
        return model_shape(model)
    except Exception:
        return {}


# -- from a trainer ------------------------------------------------------------------------------


def trainer_facts(trainer: Any) -> dict[str, Any]:
    """The keyword arguments ``lint`` takes, read from a TRL ``GRPOTrainer``."""
    args = trainer.args
    acc = getattr(trainer, "accelerator", None)
    num_devices = int(getattr(acc, "num_processes", None) or getattr(args, "world_size", 1) or 1)
    device = getattr(acc, "device", None) or getattr(args, "device", None)
    kind = getattr(device, "type", None) or (str(device).split(":")[0] if device is not None else None)
    memory = None
    bf16_ok = None
    facts = None
    if kind == "cuda":
        try:
            import torch

            memory = torch.cuda.get_device_properties(device).total_memory / 1024**3
            bf16_ok = bool(torch.cuda.is_bf16_supported())
        except Exception:
            pass
        from grpo_monitor.preflight.memory import detect_device_facts

        facts = detect_device_facts()
    elif kind is not None and kind != "cuda":
        bf16_ok = None if kind not in ("cpu",) else False
    return {
        "model": getattr(trainer, "model", None),
        "reward_funcs": list(getattr(trainer, "reward_funcs", None) or []),
        "reward_names": list(getattr(trainer, "reward_func_names", None) or []) or None,
        "dataset": getattr(trainer, "train_dataset", None),
        "num_devices": num_devices,
        "device_kind": kind if kind in ("cuda", "cpu") else None,
        "bf16_supported": bf16_ok,
        "device_memory_gib": memory,
        "device_facts": facts,
    }


def lint_trainer(trainer: Any, *, first_run: bool = True) -> list[Finding]:
    """``lint`` with everything read from the trainer: args, model, reward functions, training
    dataset and the accelerator's devices. A bf16 check is moot once the trainer exists (the
    config could not have been built), so it reads what the run actually uses."""
    facts = trainer_facts(trainer)
    return lint(trainer.args, first_run=first_run, **facts)


# -- from files ----------------------------------------------------------------------------------


class LintInputError(ValueError):
    """An unusable config file or run directory; the message names it."""


def _coerce(v: Any) -> Any:
    # YAML 1.1 reads 5e-7 (no dot) as a string; TRL's parser would convert it by the field's type.
    if isinstance(v, str):
        s = v.strip()
        try:
            return int(s)
        except ValueError:
            pass
        try:
            f = float(s)
            return f
        except ValueError:
            return v
    return v


def load_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A TRL-style YAML (``trl grpo --config``: flat GRPOConfig keys plus script arguments) or JSON file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise LintInputError(f"{p}: cannot read ({getattr(exc, 'strerror', None) or exc})") from None
    data: Any
    if p.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise LintInputError(f"{p}: not valid JSON ({exc})") from None
    else:
        try:
            import yaml
        except ImportError:
            raise LintInputError(f"{p}: reading YAML needs the 'preflight' extra: pip install 'grpo-monitor[preflight]' "
                                 "(or give the config as JSON)") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise LintInputError(f"{p}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if isinstance(data, Mapping) and isinstance(data.get("config"), Mapping) and data.get("type") == "header":
        data = data["config"]
    if not isinstance(data, Mapping) or not data:
        raise LintInputError(f"{p}: expected a mapping of GRPOConfig fields")
    return {str(k): _coerce(v) for k, v in data.items()}


def _first_steps_clipped(steps: list[dict[str, Any]], n: int = 5) -> float | None:
    vals = []
    for rec in steps[:n]:
        v = (rec.get("metrics") or {}).get("completions/clipped_ratio")
        if isinstance(v, (int, float)) and math.isfinite(v):
            vals.append(float(v))
    if not vals:
        return None
    vals.sort()
    return vals[len(vals) // 2]


def lint_path(path: str | os.PathLike[str], **kwargs: Any) -> tuple[list[Finding], dict[str, Any]]:
    """Lint a config file or a run directory; returns (findings, context used: ``source``, ``config``,
    ``model``, and ``lint``'s ``details``: the device judged for and the memory ``estimate``)."""
    from grpo_monitor.core.runlog import RunLogError, read_run

    p = Path(path)
    model = kwargs.pop("model", None)
    ctx: dict[str, Any] = {"source": str(p)}
    if p.is_dir() or p.name == "run.jsonl":
        run = _run_dir_of(p.parent if p.name == "run.jsonl" else p)
        if run is None:
            raise LintInputError(f"{p}: not a config file, a grpo-monitor run directory (no run.jsonl) or a Trainer "
                                 "output_dir holding one (<output_dir>/grpo-monitor/run.jsonl)")
        if run != p and run != p.parent:
            ctx["run_dir"] = str(run)
            p = run
        try:
            log = read_run(p)
        except RunLogError as exc:
            raise LintInputError(str(exc)) from None
        header = log.header
        cfg = dict(header.get("config") or {})
        if not cfg:
            raise LintInputError(f"{p}: run header holds no config")
        facts = dict(header.get("model") or {})
        kwargs.setdefault("reward_names", header.get("reward_funcs"))
        kwargs.setdefault("num_devices", header.get("world_size"))
        kwargs.setdefault("first_run", not header.get("parent_run"))
        # A real GRPOConfig of the TRL that ran it: its keys are that TRL's fields, whatever is installed here.
        kwargs.setdefault("check_keys", False)
        if isinstance(header.get("device"), Mapping):  # the GPU the run trained on, as NVML reported it
            kwargs["device_facts"] = header["device"]
        if kwargs.get("completion_lengths") is None and kwargs.get("clipped_ratio") is None:
            kwargs["clipped_ratio"] = _first_steps_clipped(log.steps)
        if model is None and facts:
            model = facts
            path_hint = facts.get("name_or_path")
            if path_hint and (Path(path_hint) / "config.json").is_file():
                try:
                    model = {**model_shape(path_hint), **{k: v for k, v in facts.items() if v is not None}}
                except Exception:
                    pass
    else:
        if not p.is_file():
            raise LintInputError(f"{p}: no such file or directory")
        cfg = load_config_file(p)
        mp = cfg.get("model_name_or_path")
        if model is None and isinstance(mp, str) and (Path(mp) / "config.json").is_file():
            model = mp
        elif model is None and isinstance(mp, str):
            model = mp  # a hub id: its architecture's shape from the table, below
        ds = cfg.get("dataset_name")
        if kwargs.get("dataset") is None and isinstance(ds, str) and Path(ds).is_file():
            kwargs["dataset"] = _local_columns(Path(ds))
    if isinstance(model, (str, os.PathLike)):
        model, ctx["model_source"] = _model_of(model)
    ctx["config"] = cfg
    ctx["model"] = model
    details: dict[str, Any] = {}
    note = None if model is not None else ctx.get("model_source")
    findings = lint(cfg, model=model, details=details, model_note=note, **kwargs)
    ctx.update(details)
    return findings, ctx


def _run_dir_of(p: Path) -> Path | None:
    """The grpo-monitor run directory ``p`` names, as ``analyze`` and ``watch`` read it: ``p`` itself, or the one
    run a Trainer output_dir holds (``<output_dir>/grpo-monitor/``, or the only run found under it)."""
    from grpo_monitor.core.runlog import is_run_dir

    if is_run_dir(p):
        return p
    if not p.is_dir():
        return None
    if is_run_dir(p / "grpo-monitor"):
        return p / "grpo-monitor"
    from grpo_monitor.analysis.discovery import discover_runs

    try:
        runs = discover_runs(p)
    except OSError:
        return None
    found = [r for r in runs or [] if is_run_dir(r)]
    return found[0] if len(found) == 1 else None


def _model_of(name: str | os.PathLike[str]) -> tuple[dict[str, Any] | None, str]:
    """The shape of a model named by a local folder or ``config.json``, else by a hub id the table of
    common architectures knows (``core.model_config.config_from_model_id``); None when neither, with
    where the shape came from (or why there is none)."""
    path = Path(name)
    if path.exists():
        try:
            return model_shape(path), f"{path / 'config.json' if path.is_dir() else path}"
        except (OSError, ValueError) as exc:
            raise LintInputError(f"{name}: cannot read the model config ({exc})") from None
    known = config_from_model_id(str(name))
    if known is not None:
        shape = model_shape(known)
        shape["source"] = f"model id {name}"  # said where a finding rests on it (MoE by its id)
        return shape, f"{name}: the table of common architectures (no local config.json)"
    return None, (f"{name} is neither a local model folder nor an architecture lint knows by its hub id: "
                  "pass --model DIR with its config.json")


def _local_columns(path: Path) -> dict[str, Any] | None:
    """The column names of a local JSON-lines / JSON dataset file (first record), without loading it."""
    try:
        with open(path, encoding="utf-8") as fh:
            if path.suffix.lower() in (".jsonl", ".ndjson"):
                first = json.loads(fh.readline())
            elif path.suffix.lower() == ".json":
                data = json.load(fh)
                first = data[0] if isinstance(data, list) and data else data
            else:
                return None
    except (OSError, ValueError):
        return None
    return dict.fromkeys(first) if isinstance(first, Mapping) else None


# -- the CLI verb --------------------------------------------------------------------------------


def add_lint_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("path", metavar="CONFIG_OR_RUN",
                        help="a TRL-style YAML/JSON config (trl grpo --config), a grpo-monitor run directory, or a "
                             "Trainer output_dir holding one")
    parser.add_argument("--model", default=None,
                        help="model directory or config.json for the memory estimate (default: model_name_or_path)")
    parser.add_argument("--num-devices", type=int, default=None, help="training GPUs (default: 1, or the run's world size)")
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                        help="device the run trains on (default: the one the config is written for: a recipe with "
                             "bf16, vLLM, DeepSpeed/FSDP, ... is judged for a CUDA GPU; otherwise this machine)")
    parser.add_argument("--device-memory-gib", type=float, default=None,
                        help="memory per device in GiB (default: this machine's first GPU)")
    parser.add_argument("--device-name", default=None,
                        help="the GPU the run trains on as it names itself (e.g. 'NVIDIA GB10', 'NVIDIA GH200 480GB'), "
                             "for the unified-memory check (default: this machine's GPU, or the run's)")
    parser.add_argument("--prompt-length", type=int, default=None, help="prompt tokens for the activation estimate")
    parser.add_argument("--not-first-run", action="store_true",
                        help="skip the first-run advice on learning_rate and beta")
    parser.add_argument("--json", action="store_true", help="print one JSON document: findings and memory estimate")
    return parser


def run_lint_cli(args: argparse.Namespace) -> int:
    """Exit 0 when no critical finding (warnings and notes are advice), 1 when one, 2 on unusable input."""
    from grpo_monitor.preflight.memory import detect_device_facts, detect_device_memory_gib

    device = None if args.device == "auto" else args.device
    memory_gib = args.device_memory_gib
    facts = None
    if memory_gib is None and device != "cpu":  # judged for this machine's GPU: its memory and what it is
        memory_gib = detect_device_memory_gib()
        facts = detect_device_facts() if memory_gib else None
    if args.device_name:
        facts = {"name": args.device_name}
    kwargs: dict[str, Any] = {"device_kind": device, "device_memory_gib": memory_gib,
                              "prompt_length": args.prompt_length, "device_facts": facts}
    if args.num_devices is not None:
        kwargs["num_devices"] = args.num_devices
    if args.not_first_run:
        kwargs["first_run"] = False
    try:
        findings, ctx = lint_path(args.path, model=args.model, **kwargs)
    except LintInputError as exc:
        print(f"grpo-monitor: {exc}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    est = ctx.get("estimate")
    note = device_note(ctx)
    # A recipe that will not run (a critical finding) fails the check; warnings are advice.
    critical = any(f.severity == "critical" for f in findings)
    if args.json:
        doc = {"source": ctx["source"],
               "device": {"judged_for": ctx.get("device"), "from": ctx.get("device_from"),
                          "reasons": ctx.get("device_reasons") or [], "this_machine": ctx.get("local_device"),
                          "note": note},
               "model": {"shape_from": ctx.get("model_source")} if ctx.get("model_source") else None,
               "findings": [f.to_dict() for f in findings],
               "keys": {"read_by": (ctx.get("keys") or {}).get("how")} if ctx.get("keys") else None,
               "run_dir": ctx.get("run_dir"),
               "fix": fix_flags(_all_overrides(findings)) or None,
               "memory": est.to_dict() if est is not None else None}
        print(json.dumps(doc, indent=2, default=str))
    else:
        print(format_report(ctx["source"], findings, est, note=note, model_source=ctx.get("model_source"),
                            keys_how=(ctx.get("keys") or {}).get("how"), run_dir=ctx.get("run_dir")))
    return ExitCode.FINDINGS if critical else ExitCode.CLEAN


def device_note(details: Mapping[str, Any]) -> str | None:
    """One sentence when a recipe is judged for a GPU this machine does not have (None otherwise)."""
    if details.get("device_from") != "config" or details.get("device") != "cuda" or details.get("local_device") == "cuda":
        return None
    here = "this machine has none" if details.get("local_device") == "cpu" else "this machine was not checked"
    return (f"judged for a CUDA GPU, which the recipe is written for ({', '.join(details.get('device_reasons') or [])}); "
            f"{here}: `--device cpu` judges it for this machine")


def _all_overrides(findings: Sequence[Finding]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in findings:
        out.update(f.config_overrides)
    return out


def fix_flags(overrides: Mapping[str, Any]) -> str:
    """A fix as TRL command-line flags; a dict field (``model_init_kwargs``) as the JSON string GRPOConfig parses,
    quoted for the shell."""
    import shlex

    from grpo_monitor.core.recommend import cli_flags

    words = []
    for key, value in overrides.items():
        if isinstance(value, Mapping):
            words.append(f"--{key} {shlex.quote(json.dumps(dict(value)))}")
        else:
            words.append(cli_flags({key: value}))
    return " ".join(words)


def format_report(source: str, findings: Sequence[Finding], est: Any = None, note: str | None = None,
                  model_source: str | None = None, keys_how: str | None = None, run_dir: str | None = None) -> str:
    from grpo_monitor.preflight.trl_fields import FALLBACK_VERSION

    lines = [f"grpo-monitor lint: {source}"]
    if note:
        lines.append(f"  {note}")
    if model_source and est is not None:
        lines.append(f"  model shape from {model_source}")
    if run_dir:
        lines.append(f"  the run's recorded config, from {run_dir}")
    if not findings:
        # Only a run whose memory was checked gets here without a finding (config_memory_unchecked otherwise).
        fits = " and fits its device's memory (the estimate below)" if est is not None and est.fits else ""
        lines.append(f"  no findings: the configuration follows the recipe{fits}")
    if keys_how and keys_how.startswith(f"TRL {FALLBACK_VERSION}'s field names"):
        lines.append(f"  keys checked against {keys_how}")
    for f in findings:
        lines.append(f"  [{f.severity}] {f.detector}: {f.message}")
        if f.config_overrides:
            lines.append(f"      fix: {fix_flags(f.config_overrides)}")
    if est is not None:
        lines.append("")
        lines.append("memory per device (estimate):")
        lines.extend("  " + line for line in est.table().splitlines())
    else:
        lines.append("")
        lines.append("memory: no estimate (pass --model DIR with a config.json, or a model_name_or_path lint knows: a local model or a common hub id)")
    return "\n".join(lines)
