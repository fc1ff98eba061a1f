"""Memory pressure: peak memory climbing toward the device's capacity as completions grow.

Out-of-memory crashes in GRPO come a few steps in or late, when completions reach lengths the run
had not generated before: the logits alone are batch x length x vocabulary. The callback records
the peak per logging window (``system/gpu_peak_reserved_gib``, or what the whole device holds,
``system/gpu_device_used_gib``, or NVML's peak over the window, ``system/gpu_used_peak_gib``) and the
capacity (``system/gpu_total_gib``); on the host, the
process's peak resident memory against the machine's. Memory that is high but flat (an engine that
reserves most of the device up front) is not pressure, and neither is memory that grows with
lengths while it stays well below the capacity. Pressure is a peak above ``high`` of the capacity
that has risen from the run's early level together with the longest completion, or a peak whose
trend against that length, carried to the length cap, passes the capacity while lengths still grow.

The cure is the memory remediation ladder (``memory_ladder``, which ``lint`` sizes too): the finding's
diff is its first rung the config does not have yet, its evidence names every rung in order, so a
restarted segment, which runs with that rung, is offered the next one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from grpo_monitor.detectors.base import Assessment, Detector, Metrics, Sample, check_float, check_int, finite
from grpo_monitor.detectors.signals import get
from grpo_monitor.detectors.stats import Window, median, theil_sen
from grpo_monitor.detectors.variants import checkpointing

# (peak, capacity) pairs, best first: the device's own allocator, the whole device, the host.
SOURCES: tuple[tuple[str, str, str], ...] = (
    ("system/gpu_peak_reserved_gib", "system/gpu_total_gib", "gpu"),
    ("system/gpu_device_used_gib", "system/gpu_total_gib", "gpu"),
    ("system/gpu_used_peak_gib", "system/gpu_total_gib", "gpu"),  # NVML's peak over the window, every process
    ("system/gpu_peak_allocated_gib", "system/gpu_total_gib", "gpu"),
    ("system/rss_peak_gib", "system/ram_total_gib", "host"),
)
MAX_LEN = "completions/max_length"

# The remedies for memory, in the order to try them: what costs nothing in what is learned first, what
# changes the run last. Each rung names its GRPOConfig diff (``memory_ladder``).
LADDER = ("vllm_sleep_mode", "lower_vllm_gpu_memory_utilization", "gradient_checkpointing", "low_bit_optimizer",
          "smaller_micro_batch", "shorter_completions")
# Optimizers whose states are already small (8/4-bit, paged, factored) or absent.
_LEAN_OPTIMIZERS = ("8bit", "4bit", "paged", "adafactor", "lomo", "sgd")
_LOW_BIT = {"lion": "paged_lion_8bit", "ademamix": "paged_ademamix_8bit", "rmsprop": "rmsprop_bnb_8bit"}


def _int(v: Any) -> int | None:
    return v if type(v) is int else None


def memory_ladder(config: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The memory remediation ladder for a run's config: each rung that applies, in order, as
    ``{"remedy", "overrides", "why"}`` — vLLM sleep mode (colocated vLLM gives its share back while
    training), a lower ``vllm_gpu_memory_utilization``, gradient checkpointing, 8-bit paged AdamW states,
    half the per-device batch with twice the accumulation (the same batch; ``steps_per_generation`` doubled
    too when set, so the generation batch stays), and, last, a shorter ``max_completion_length`` (it
    changes what the policy may write). A field the config leaves out counts as not set.

    >>> [r["remedy"] for r in memory_ladder({"use_vllm": True, "vllm_mode": "colocate",
    ...     "vllm_gpu_memory_utilization": 0.5, "per_device_train_batch_size": 8,
    ...     "gradient_accumulation_steps": 2, "max_completion_length": 1024})]  # doctest: +NORMALIZE_WHITESPACE
    ['vllm_sleep_mode', 'lower_vllm_gpu_memory_utilization', 'gradient_checkpointing', 'low_bit_optimizer',
     'smaller_micro_batch', 'shorter_completions']
    >>> [r["overrides"] for r in memory_ladder({"per_device_train_batch_size": 8, "gradient_accumulation_steps": 2,
    ...     "gradient_checkpointing": True, "optim": "paged_adamw_8bit"})]
    [{'per_device_train_batch_size': 4, 'gradient_accumulation_steps': 4}]
    """
    cfg = config or {}
    out: list[dict[str, Any]] = []

    def rung(remedy: str, overrides: dict[str, Any], why: str) -> None:
        out.append({"remedy": remedy, "overrides": overrides, "why": why})

    colocated = bool(cfg.get("use_vllm")) and str(cfg.get("vllm_mode") or "colocate") == "colocate"
    if colocated and cfg.get("vllm_enable_sleep_mode") is not True:
        rung("vllm_sleep_mode", {"vllm_enable_sleep_mode": True},
             "the colocated vLLM engine gives its share of the GPU back while training runs")
    util = cfg.get("vllm_gpu_memory_utilization")
    util = float(util) if isinstance(util, (int, float)) and not isinstance(util, bool) else 0.3
    if colocated and util >= 0.25:
        # One decisive cut (TRL's default 0.3 goes to 0.18): a restart tries each rung once.
        rung("lower_vllm_gpu_memory_utilization", {"vllm_gpu_memory_utilization": round(max(0.15, util * 0.6), 2)},
             "vLLM reserves less for its KV cache, and batches fewer sequences at once")
    # The diff sets the name the config itself carries (transformers 5 renamed it).
    name, on = checkpointing(cfg)
    if on is not True:
        rung("gradient_checkpointing", {name: True},
             "activations are recomputed in the backward pass instead of kept, for about a third more compute")
    optim = str(getattr(cfg.get("optim"), "value", cfg.get("optim")) or "adamw_torch_fused").lower()
    if not any(h in optim for h in _LEAN_OPTIMIZERS):
        # The same optimizer family in 8 bits (bitsandbytes), paged where bitsandbytes pages it.
        low = next((v for k, v in _LOW_BIT.items() if optim.startswith(k)), "paged_adamw_8bit")
        rung("low_bit_optimizer", {"optim": low},
             "the optimizer states in 8 bits, paged to host memory under pressure; needs bitsandbytes")
    bs, ga, spg = (_int(cfg.get(k)) for k in ("per_device_train_batch_size", "gradient_accumulation_steps",
                                                "steps_per_generation"))
    ga = ga if ga is not None else 1
    if bs is not None and bs >= 2 and bs % 2 == 0 and ga >= 1:
        diff = {"per_device_train_batch_size": bs // 2, "gradient_accumulation_steps": ga * 2}
        if spg is not None and spg >= 1:
            diff["steps_per_generation"] = spg * 2
        rung("smaller_micro_batch", diff,
             "half the completions per forward pass with twice the accumulation: the same batch, half the "
             "activations and logits")
    cap = _int(cfg.get("max_completion_length"))
    if cap is not None and cap >= 128:
        rung("shorter_completions", {"max_completion_length": cap * 3 // 4},
             "the last resort: logits and activations scale with length, but it caps what the policy may write")
    return out


def ladder_text(ladder: Sequence[Mapping[str, Any]]) -> str:
    """The ladder as one sentence, in order.

    >>> ladder_text(memory_ladder({"gradient_checkpointing": True, "optim": "adamw_8bit"}))
    ''
    >>> ladder_text(memory_ladder({"optim": "adamw_8bit", "max_completion_length": 512}))
    '1. gradient_checkpointing=True; 2. max_completion_length=384'
    """
    return "; ".join(f"{i}. " + ", ".join(f"{k}={v!r}" for k, v in r["overrides"].items())
                     for i, r in enumerate(ladder, 1))


class MemoryPressure(Detector):
    """Peak memory near the capacity and rising with completion length.

    Parameters: ``high`` (peak over capacity that counts as near it), ``critical`` (and as critical),
    ``min_rise`` (the share of the capacity the peak must have gained over its early level),
    ``baseline_points`` (points whose median is the early level), ``window`` (points kept for the
    trend against length).

    >>> det = MemoryPressure()
    >>> found = []
    >>> for step in range(1, 61):
    ...     length = 200.0 + 30.0 * step
    ...     peak = 40.0 + 0.02 * length
    ...     found += det.update(step, {"system/gpu_peak_reserved_gib": peak, "system/gpu_total_gib": 80.0,
    ...                                "completions/max_length": length})
    >>> [(f.severity, f.step, f.evidence["remedy"]) for f in found]
    [('warning', 48, 'gradient_checkpointing'), ('critical', 57, 'gradient_checkpointing')]
    """

    id = "memory_pressure"
    variant = None
    role = "guard"  # a resource check, not a judgement of learning
    requires = (("system/gpu_total_gib|system/ram_total_gib",),)

    def __init__(self, high: float = 0.9, critical: float = 0.97, min_rise: float = 0.05, baseline_points: int = 5,
                 window: int = 32) -> None:
        self.high = check_float("high", high, 0.0, 1.0, low_open=True)
        self.critical = check_float("critical", critical, 0.0, 1.5, low_open=True)
        self.min_rise = check_float("min_rise", min_rise, 0.0, 1.0)
        self.baseline_points = check_int("baseline_points", baseline_points, 2)
        self.window = check_int("window", window, 8)
        super().__init__()

    def _reset_state(self) -> None:
        self.source: tuple[str, str, str] | None = None
        self.first: list[float] = []
        self.first_len: list[float] = []
        self.base: float | None = None
        self.base_len: float | None = None
        self.fracs = Window(self.window)
        self.lens = Window(self.window)
        self.above_since: int | None = None
        cap = (self.context.config or {}).get("max_completion_length")
        self.cap = float(cap) if isinstance(cap, (int, float)) and not isinstance(cap, bool) and cap > 0 else None

    def _read(self, metrics: Metrics) -> tuple[float, float] | None:
        if "system/gpu_total_gib" not in metrics and "system/ram_total_gib" not in metrics:
            return None
        if self.source is not None:
            peak, total = get(metrics, self.source[0]), get(metrics, self.source[1])
            return (peak, total) if peak is not None and total is not None and total > 0 else None
        for src in SOURCES:
            peak, total = get(metrics, src[0]), get(metrics, src[1])
            if peak is not None and total is not None and total > 0:
                self.source = src  # one series for the whole run: a switch would look like a jump
                return peak, total
        return None

    def assess(self, step: int, metrics: Metrics, samples: Sequence[Sample]) -> Assessment | None:
        got = self._read(metrics)
        if got is None:
            return None
        peak, total = got
        frac = peak / total
        length = get(metrics, MAX_LEN)
        self.fracs.push(step, frac)
        if length is not None:
            self.lens.push(step, length)
        if self.base is None:
            self.first.append(frac)
            if length is not None:
                self.first_len.append(length)
            if len(self.first) >= self.baseline_points:
                self.base = median(self.first)
                self.base_len = median(self.first_len) if self.first_len else None
                self.first, self.first_len = [], []
            return Assessment(warming_up=True, evidence={"peak_frac": finite(frac), "points": len(self.first)})
        k = self.clock.points(3, 2)
        recent = self.fracs.recent_median(k) or frac
        if recent < min(0.75, self.high) and not self.episode.open:
            # Far from the capacity: nothing to project (the trend fit is left for when it matters).
            self.above_since = None
            return Assessment(level=0, evidence={"peak_frac": finite(frac), "recent_peak_frac": finite(recent),
                                                 "early_peak_frac": finite(self.base)})
        recent_len = self.lens.recent_median(k)
        assert self.source is not None
        ev: dict[str, Any] = {
            "device": self.source[2],
            "peak_metric": self.source[0],
            "peak_gib": finite(peak),
            "capacity_gib": finite(total),
            "peak_frac": finite(frac),
            "recent_peak_frac": finite(recent),
            "early_peak_frac": finite(self.base),
            "max_length": finite(length),
            "early_max_length": finite(self.base_len),
            "high": self.high,
        }
        rose = recent >= self.base + self.min_rise
        longer = recent_len is not None and self.base_len is not None and recent_len > self.base_len * 1.05
        ev["rose_with_length"] = bool(rose and longer)
        projected = self._projected(total)
        if projected is not None:
            ev["projected_peak_frac_at_cap"] = finite(projected)
            ev["length_cap"] = finite(self.cap)
        near = recent >= self.high and rose and longer
        heading = (projected is not None and projected >= 1.0 and recent >= 0.75 and rose and longer
                   and self._lengths_rising())
        if near or heading:
            if self.above_since is None:
                self.above_since = step
        else:
            self.above_since = None
        level = 0
        if near or heading:
            level = 2 if recent >= self.critical else 1
            ladder = memory_ladder(self.context.config)
            if ladder:
                ev["remedy"] = ladder[0]["remedy"]
                ev["ladder"] = [r["remedy"] for r in ladder]
            ev["advice"] = ("Peak memory is near the device's capacity and grows with completion length. Try, in order: "
                            + (ladder_text(ladder) or "nothing left in GRPOConfig (every rung is in the config)")
                            + ". Against fragmentation, PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.")
        return Assessment(level=level, evidence=ev, onset_step=self.above_since if level else None)

    def _lengths_rising(self) -> bool:
        vals = self.lens.last(8)
        return len(vals) >= 4 and median(vals[len(vals) // 2:]) > median(vals[: len(vals) // 2])

    def _projected(self, total: float) -> float | None:
        """Peak over capacity carried along its trend against length to the length cap."""
        if self.cap is None or len(self.lens) < 6 or len(self.fracs) < 6:
            return None
        pairs = {s: v for s, v in zip(self.lens.steps, self.lens.values)}
        xs, ys = [], []
        for s, f in zip(self.fracs.steps, self.fracs.values):
            if s in pairs:
                xs.append(pairs[s])
                ys.append(f)
        if len(xs) < 6 or max(xs) - min(xs) <= 0:
            return None
        slope = theil_sen(xs, ys)
        if not math.isfinite(slope) or slope <= 0:
            return None
        return ys[-1] + slope * max(0.0, self.cap - xs[-1])

    def _overrides(self) -> dict[str, Any]:
        # The ladder's first rung: a restart tries it, and the next segment's config moves on to the next.
        ladder = memory_ladder(self.context.config)
        return dict(ladder[0]["overrides"]) if ladder else {}

    def _message(self, severity: str, evidence: Mapping[str, Any]) -> str:
        lead = "Out of memory is imminent" if severity == "critical" else "Memory pressure"
        text = (f"{lead}: peak {evidence.get('device')} memory is {evidence.get('recent_peak_frac')} of the "
                f"{evidence.get('capacity_gib')} GiB capacity (early in the run {evidence.get('early_peak_frac')}) and "
                f"rose with the longest completion ({evidence.get('early_max_length')} to {evidence.get('max_length')} tokens).")
        if evidence.get("projected_peak_frac_at_cap") is not None:
            text += f" At the length cap it would reach {evidence.get('projected_peak_frac_at_cap')} of it."
        ladder = memory_ladder(self.context.config)
        if ladder:
            return text + f" First: {ladder_text(ladder[:1])[3:]} ({ladder[0]['why']}); then the rest of the ladder."
        return text + " Every memory setting of GRPOConfig is already in use: a larger device or sharding (ZeRO-3/FSDP)."
