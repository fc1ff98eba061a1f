"""What crashed a run: the commonest ways a GRPO run ends in a traceback, read from the end of its log.

Each entry of ``CATALOGUE`` is one cause, recognised by the exception text the failing library prints
(anchored on that text, never on a path or a frame), with a fix a TRL user can apply and the public thread
its text comes from. ``read_crash`` looks only at the last ``TAIL_CHARS`` of a log (a crash is at its end,
and a log can be gigabytes), tries the entries in order (the specific before the general: vLLM's own
reason before its "engine core initialization failed" that follows it) and returns the first that matches,
with the line it was read from.

>>> m = read_crash("{'loss': 0.1}\\nRuntimeError: DataLoader worker (pid 4024) is killed by signal: Killed.\\n")
>>> m.crash.id, m.line_no
('dataloader_worker_killed', 2)
>>> read_crash("{'loss': 0.1}\\nno error here, the reward's error bars look fine\\n") is None
True
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

TAIL_CHARS = 64 * 1024
# How far before an out-of-memory line its traceback's frames are read for where it happened.
FRAMES_BEFORE = 8 * 1024

_MEMORY_LEVERS = ("lower per_device_train_batch_size and raise gradient_accumulation_steps by the same factor, "
                  "set gradient_checkpointing=True, load the policy in bfloat16 (model_init_kwargs={'dtype': "
                  "'bfloat16'}), use an 8-bit optimizer (optim='paged_adamw_8bit'); `grpo-monitor lint` on the "
                  "recipe sizes these rung by rung for the device")


@dataclass(frozen=True)
class Crash:
    """One cause of a crash: how its exception reads, where (``frames``: text its traceback must show just
    before the exception, for causes told apart by where they happened), what it means and what to change."""

    id: str
    pattern: re.Pattern[str]
    cause: str
    fix: str
    cite: str
    frames: re.Pattern[str] | None = None
    memory: bool = False  # the training side's memory ran out: the run's own memory ladder applies


@dataclass(frozen=True)
class CrashMatch:
    crash: Crash
    line_no: int  # 1-based, in the whole text given
    line: str
    offset: int = 0  # where the match begins in the text

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.crash.id, "cause": self.crash.cause, "fix": self.crash.fix, "cite": self.crash.cite,
                "line_no": self.line_no, "line": self.line}


def _re(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, re.M)


_OOM = r"(?:torch\.(?:cuda\.)?OutOfMemoryError: |RuntimeError: )?CUDA out of memory\. Tried to allocate [^\n]{0,400}"

CATALOGUE: tuple[Crash, ...] = (
    Crash("vllm_kv_cache_too_small",
          _re(r"The model's max seq len \(\d+\) is larger than the maximum number of tokens that can be stored "
              r"in KV cache \(\d+\)"),
          "vLLM could not reserve a KV cache for one sequence of the model's full context length in the memory "
          "share it was given.",
          "set vllm_max_model_length to the prompt plus max_completion_length (TRL otherwise passes the model's own "
          "context length), or raise vllm_gpu_memory_utilization (colocate: lower the training side's memory with "
          "it)",
          "https://github.com/vllm-project/vllm/issues/2418"),
    Crash("vllm_no_cache_memory",
          _re(r"No available memory for the cache blocks\. Try increasing `?gpu_memory_utilization`?"),
          "vLLM's memory share was used up by the weights (and, colocated, by the training process) before any "
          "KV cache could be allocated.",
          "raise vllm_gpu_memory_utilization; colocated, also enable vllm_enable_sleep_mode=True and lower the "
          "training side (" + _MEMORY_LEVERS + "), or run vLLM in server mode on a GPU of its own",
          "https://github.com/gensyn-ai/rl-swarm/issues/118", memory=True),
    Crash("cuda_oom_generation", _re(_OOM),
          "The GPU ran out of memory while generating completions (the rollout's KV cache and logits grow with "
          "num_generations x max_completion_length).",
          "lower max_completion_length or the generation batch (per_device_train_batch_size x "
          "steps_per_generation), or generate with vLLM (use_vllm=True) and size its share "
          "(vllm_gpu_memory_utilization); " + _MEMORY_LEVERS,
          "https://github.com/huggingface/trl/issues/3172",
          frames=_re(r"\bgenerate\b|_generate|/vllm/|sampler\.py|generation/utils\.py"), memory=True),
    Crash("cuda_oom_training", _re(_OOM),
          "The GPU ran out of memory in the training step (the forward/backward pass or the optimizer step).",
          _MEMORY_LEVERS + "; PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True when much memory is reserved "
          "but unallocated",
          "https://github.com/PeterGriffinJin/Search-R1/issues/112", memory=True),
    Crash("nccl_watchdog_timeout",
          _re(r"Watchdog caught collective operation timeout: WorkNCCL\([^\n]{0,300}\) ran for \d+ milliseconds "
              r"before timing out"),
          "A collective (all-reduce, broadcast, ...) waited past NCCL's timeout: one rank stalled or died (often "
          "while generating or scoring far longer than the others, or in a reward function that hangs).",
          "find the rank that stopped (its own log ends first); give slow generation room with ddp_timeout "
          "(seconds, default 1800) in GRPOConfig; make reward functions time-bounded; set "
          "NCCL_DEBUG=INFO to see which collective hung",
          "https://github.com/huggingface/open-r1/issues/620"),
    Crash("dataloader_worker_killed",
          _re(r"DataLoader worker \(pid\(?s?\)? ?[\d, ]+\) is killed by signal: Killed\.?"),
          "The host's out-of-memory killer ended a DataLoader worker: the machine's RAM (not the GPU's) ran out.",
          "set dataloader_num_workers=0 (or fewer), keep datasets memory-mapped instead of materialised in each "
          "worker, and check what else holds host memory (a colocated engine's CPU swap, offloading)",
          "https://github.com/pytorch/pytorch/issues/8976"),
    Crash("disk_full_on_save",
          _re(r"PytorchStreamWriter failed writing file [^\n]{0,200}: file write failed|"
              r"\[Errno 28\] No space left on device"),
          "Writing a checkpoint failed: the disk (or quota) holding output_dir is full.",
          "free space or point output_dir at a larger volume; keep fewer checkpoints (save_total_limit=2) or save "
          "less often (save_steps); the checkpoint being written is incomplete: resume from the one before it",
          "https://github.com/hiyouga/LlamaFactory/issues/1223"),
    Crash("non_finite_sampling",
          _re(r"probability tensor contains either `?inf`?, `?nan`? or element < 0"),
          "Sampling met NaN/inf probabilities: the policy's logits are no longer finite (a diverged update, an "
          "fp16 overflow) or the sampling temperature is 0.",
          "resume from the last checkpoint before the loss or grad_norm went non-finite with a lower "
          "learning_rate and max_grad_norm=1.0; train in bf16 rather than fp16; keep temperature > 0",
          "https://github.com/StarsfieldAI/R1-V/issues/69"),
    Crash("chat_template_missing",
          _re(r"Cannot use (?:chat template functions|apply_chat_template\(\)) because tokenizer\.chat_template is "
              r"not set"),
          "The dataset is conversational but the tokenizer has no chat template (a base model, not its -Instruct "
          "version).",
          "start from the instruct model, set tokenizer.chat_template (or pass chat_template_path), or give the "
          "dataset a plain 'prompt' string column",
          "https://github.com/huggingface/open-r1/issues/85"),
    Crash("hub_unreachable",
          _re(r"We couldn't connect to 'https://huggingface\.co' to load (?:this file|the files)|"
              r"LocalEntryNotFoundError: [^\n]{0,300}"),
          "A model, tokenizer or dataset file was not in the local cache and the Hub could not be reached (offline "
          "node, proxy, HF_HUB_OFFLINE set).",
          "download it first (huggingface-cli download MODEL) on a machine with network and point "
          "model_name_or_path at the local folder, or share the cache (HF_HOME) with the training nodes",
          "https://github.com/yuruotong1/autoMate/issues/104"),
    Crash("fsdp_mixed_dtypes",
          _re(r"Must flatten tensors with uniform dtype but got torch\.\w+ and torch\.\w+|"
              r"Cannot flatten integer dtype tensors"),
          "FSDP could not shard the model: its parameters mix dtypes (a bf16 model with fp32 adapters or "
          "quantised weights).",
          "load the model in one dtype (model_init_kwargs={'dtype': 'bfloat16'} with bf16=True), set "
          "fsdp_use_orig_params / FSDP_CPU_RAM_EFFICIENT_LOADING=1 as the accelerate config allows, or train "
          "adapters with DeepSpeed ZeRO instead",
          "https://github.com/huggingface/trl/issues/1723"),
    Crash("fp16_loss_scale_at_minimum",
          _re(r"Current loss scale already at minimum - cannot decrease scale anymore\. Exiting run\."),
          "DeepSpeed's fp16 loss scaler met overflowing (inf/NaN) gradients step after step until the scale could "
          "not go lower: the loss or its gradients are no longer finite in fp16.",
          "train in bf16 (bf16=True, fp16=False) where the GPU has it; otherwise lower learning_rate, keep "
          "max_grad_norm=1.0, and resume from the checkpoint before the loss or grad_norm went non-finite; "
          "raise_error_at_min_scale=false in the DeepSpeed config only skips the bad steps",
          "https://github.com/modelscope/ms-swift/issues/4374"),
    Crash("non_finite_gradient",
          _re(r"Function '\w+' returned nan values in its \d+(?:st|nd|rd|th) output\.?"),
          "Autograd's anomaly mode stopped the run at the first backward function that produced NaN: the loss or "
          "an activation went non-finite (log of zero probability, an fp16 overflow, a diverged update).",
          "the function named says where: a log-softmax or log-probability points at the policy's logits; lower "
          "learning_rate, keep max_grad_norm=1.0, train in bf16 rather than fp16, and resume from the checkpoint "
          "before grad_norm went non-finite; anomaly mode slows every step: switch it off once found",
          "https://github.com/pytorch/pytorch/issues/51196"),
    Crash("deepspeed_batch_mismatch",
          _re(r"Check batch related parameters\. train_batch_size is not equal to micro_batch_per_gpu \* "
              r"gradient_acc_step \* world_size ?\d+ != \d+ \* \d+ \* \d+"),
          "DeepSpeed refused its config at start-up: the batch sizes in the DeepSpeed JSON disagree with "
          "per_device_train_batch_size x gradient_accumulation_steps x the number of processes the launcher "
          "started.",
          "set train_batch_size, train_micro_batch_size_per_gpu and gradient_accumulation_steps to \"auto\" in the "
          "DeepSpeed config so the Trainer fills them from GRPOConfig, and launch as many processes as the "
          "config was written for (accelerate's num_processes)",
          "https://github.com/deepspeedai/DeepSpeed/issues/6914"),
    Crash("vllm_engine_failed",
          _re(r"Engine core initialization failed\. See root cause above|EngineDeadError[^\n]{0,200}|"
              r"EngineCore failed to start"),
          "The vLLM engine died (at start-up, or mid-run under memory pressure); its own reason is printed above "
          "this line by the engine process.",
          "read the engine's first ERROR line above; most often it is memory: raise vllm_gpu_memory_utilization, "
          "set vllm_max_model_length, or enable vllm_enable_sleep_mode=True when colocated",
          "https://github.com/vllm-project/vllm/issues/23176"),
)

_BY_ID = {c.id: c for c in CATALOGUE}


def crash(crash_id: str) -> Crash:
    return _BY_ID[crash_id]


def read_crash(text: str) -> CrashMatch | None:
    """The catalogued crash the end of ``text`` shows, or None."""
    if not isinstance(text, str) or not text:
        return None
    start = max(0, len(text) - TAIL_CHARS)
    tail = text[start:]
    for entry in CATALOGUE:
        found = None
        for m in entry.pattern.finditer(tail):
            if entry.frames is not None:
                before = tail[max(0, m.start() - FRAMES_BEFORE):m.start()]
                if not entry.frames.search(before):
                    continue
            found = m  # the last occurrence: the one that ended the run
        if found is not None:
            at = start + found.start()
            line_start = text.rfind("\n", 0, at) + 1
            line_end = text.find("\n", at)
            line = text[line_start:line_end if line_end >= 0 else len(text)].strip()
            return CrashMatch(entry, text.count("\n", 0, at) + 1, line[:300], at)
    return None


def recorded_crash(note: Any) -> dict[str, Any] | None:
    """The crash a run log's ``interrupted`` note carries (``MonitorCallback.interrupted`` reads it from the
    exception the run stopped with), or None: a note of another kind, or one whose crash lacks a field."""
    if not isinstance(note, dict) or note.get("event") != "interrupted":
        return None
    crashed = note.get("crash")
    if isinstance(crashed, dict) and all(isinstance(crashed.get(k), str)
                                         for k in ("id", "cause", "fix", "cite", "line", "at")):
        return crashed
    return None


def crash_finding(match: CrashMatch | dict[str, Any], step: int, file: str = "",
                  config: dict[str, Any] | None = None) -> Any:
    """The run's finding for a crash its log ends in: critical (the run stopped), the cause, the line it was
    read from and the fix. Where memory ran out and the run's config is known, the fix goes on with the
    memory ladder for that config (``detectors.memory_pressure.memory_ladder``): the settings to change, in
    order, with the values this run would take."""
    from grpo_monitor.detectors.base import Finding
    from grpo_monitor.detectors.memory_pressure import ladder_text, memory_ladder

    m = match.to_dict() if isinstance(match, CrashMatch) else dict(match)
    where = m.get("at") or (f"{file}:{m['line_no']}" if file else f"line {m['line_no']}")
    evidence = {"cause": m["id"], "line": m["line"], "at": where, "source": m["cite"]}
    fix = m["fix"]
    known = _BY_ID.get(m["id"])
    ladder = memory_ladder(config) if config and known is not None and known.memory else []
    if ladder:
        evidence["ladder"] = ladder
        fix += f"; for this run's settings, one rung at a time: {ladder_text(ladder)}"
    return Finding("crash", "critical", int(step), None, None, {}, evidence,
                   f"The run crashed ({m['id']}): {m['cause']} Read at {where}: {m['line']!r}. Fix: {fix}.")
