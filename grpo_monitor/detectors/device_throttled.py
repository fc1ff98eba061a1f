"""A run slowed by its device: a GPU throttling its clocks for heat or power while the steps grow slower,
or a GPU left idle while generation takes the step (rollout-bound).

Both read what the callback's NVML sampler logs (``core.device``: ``system/gpu_*``, and the share of the
wall time spent in the trainer's generation, ``system/generation_share``) next to TRL's ``step_time``.

* **Throttled**: against the run's own early level (the median of ``baseline_points`` points after the
  first ``skip_points``, which carry compilation and allocator warm-up), the step time has grown by
  ``min_slowdown`` or more while a thermal, hardware or power slowdown reason is active on at least half
  the readings and, where the SM clock is logged, the clock has fallen by ``min_clock_drop`` or more. A
  GPU that sits at its power cap from the start (normal under load: the driver holds the clock just below
  its maximum) is its own baseline and raises nothing; neither do steps that grow slower because
  completions grow longer, since the clock does not fall with them.
* **Rollout-bound**: generation takes ``generation_high`` or more of the wall time while the GPU is busy
  ``util_low`` percent of the time or less (NVML's utilisation: the share of time a kernel ran, a scale the
  device defines, not the model), so the step waits on rollouts, not on the GPU.

Level 1 is the first evidence (info); level 2 (warning) the same held for ``persist_steps`` training steps
over at least three logged points (two on logs of every few steps). The finding says what to do: cooling or the power limit for a
throttle, the generation engine's settings for a rollout-bound run (``vllm_gpu_memory_utilization`` with
sleep mode, a server with more GPUs, vLLM instead of transformers ``generate``, the batch shape).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from grpo_monitor.detectors.base import Assessment, Detector, Metrics, Sample, check_float, check_int, finite
from grpo_monitor.detectors.signals import get
from grpo_monitor.detectors.stats import Window, median

STEP_TIME = "step_time"
CLOCK = "system/gpu_sm_clock_mhz"
CLOCK_MAX = "system/gpu_sm_clock_max_mhz"
THERMAL = "system/gpu_throttle_thermal"
POWER = "system/gpu_throttle_power"
HW = "system/gpu_throttle_hw"
REASONS = "system/gpu_throttle_reasons"
UTIL = "system/gpu_util"
GENERATION = "system/generation_share"
TEMP = "system/gpu_temp_c"
POWER_W = "system/gpu_power_w"
POWER_LIMIT = "system/gpu_power_limit_w"
REMEDY = "faster_rollouts"
# nvmlClocksThrottleReasons names, by bit (core.device holds the same table; detectors import no wing above them).
_REASONS = {0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
            0x80: "hw_power_brake_slowdown"}


class DeviceThrottled(Detector):
    """Steps slowed by a throttling GPU, or a GPU idle while rollouts take the step.

    Parameters: ``min_slowdown`` (step time over its early level, minus one), ``min_clock_drop`` (SM clock
    below its early level, as a share), ``throttle_share`` (share of readings with a slowdown reason that
    counts as active), ``generation_high`` (generation's share of the wall time that counts as dominating),
    ``util_low`` (GPU utilisation, percent, that counts as idle), ``skip_points`` and ``baseline_points``
    (the early level), ``persist_steps`` (training steps a level-1 state must hold to escalate).

    >>> det = DeviceThrottled()
    >>> found = []
    >>> for step in range(1, 61):
    ...     hot = step >= 30
    ...     found += det.update(step, {"step_time": 4.0 * (1.45 if hot else 1.0), "system/gpu_sm_clock_mhz":
    ...         1185.0 if hot else 1980.0, "system/gpu_throttle_thermal": 1.0 if hot else 0.0,
    ...         "system/gpu_throttle_power": 0.0, "system/gpu_throttle_hw": 0.0, "system/gpu_util": 95.0})
    >>> [(f.severity, f.step, f.onset_step, f.evidence["mode"]) for f in found]
    [('info', 32, 30, 'throttled'), ('warning', 49, 30, 'throttled')]
    """

    id = "device_throttled"
    variant = None
    role = "guard"  # a resource check, not a judgement of learning
    requires = ((STEP_TIME, "system/gpu_throttle_*"), (UTIL, GENERATION))
    severities = ("info", "warning")

    def __init__(self, min_slowdown: float = 0.15, min_clock_drop: float = 0.1, throttle_share: float = 0.5,
                 generation_high: float = 0.6, util_low: float = 40.0, skip_points: int = 2,
                 baseline_points: int = 5, persist_steps: int = 20) -> None:
        self.min_slowdown = check_float("min_slowdown", min_slowdown, 0.0, 10.0, low_open=True)
        self.min_clock_drop = check_float("min_clock_drop", min_clock_drop, 0.0, 1.0, high_open=True)
        self.throttle_share = check_float("throttle_share", throttle_share, 0.0, 1.0, low_open=True)
        self.generation_high = check_float("generation_high", generation_high, 0.0, 1.0, low_open=True)
        self.util_low = check_float("util_low", util_low, 0.0, 100.0, low_open=True)
        self.skip_points = check_int("skip_points", skip_points, 0)
        self.baseline_points = check_int("baseline_points", baseline_points, 2)
        self.persist_steps = check_int("persist_steps", persist_steps, 1)
        super().__init__()

    def _reset_state(self) -> None:
        self.seen = 0
        self.first: dict[str, list[float]] = {"time": [], "clock": [], "util": [], "power": []}
        self.base: dict[str, float] | None = None
        self.times = Window(16)
        self.clocks = Window(16)
        self.throttles = Window(16)  # max(thermal, hw) per point
        self.powers = Window(16)
        self.utils = Window(16)
        self.gens = Window(16)
        self.since: dict[str, int] = {}
        self.held: dict[str, int] = {}
        self.streak: dict[str, int] = {}  # first step of the current run of points that each show the mode

    def assess(self, step: int, metrics: Metrics, samples: Sequence[Sample]) -> Assessment | None:
        t, clock, util, gen = get(metrics, STEP_TIME), get(metrics, CLOCK), get(metrics, UTIL), get(metrics, GENERATION)
        thermal, power, hw = get(metrics, THERMAL), get(metrics, POWER), get(metrics, HW)
        device = any(v is not None for v in (clock, util, thermal, power, hw))
        if not device:
            return None  # no device readings at this step: not measured
        self.seen += 1
        if t is not None and t > 0:
            self.times.push(step, t)
        if clock is not None and clock > 0:
            self.clocks.push(step, clock)
        if thermal is not None or hw is not None:
            self.throttles.push(step, max(thermal or 0.0, hw or 0.0))
        if power is not None:
            self.powers.push(step, power)
        if util is not None:
            self.utils.push(step, util)
        if gen is not None:
            self.gens.push(step, gen)
        if self.seen <= self.skip_points:
            return Assessment(warming_up=True, evidence={"points": self.seen})
        if self.base is None:
            # The early level the throttle check compares with; the rollout check needs none.
            for key, value in (("time", t), ("clock", clock), ("util", util), ("power", power)):
                if value is not None and len(self.first[key]) < self.baseline_points:
                    self.first[key].append(value)
            if max(len(self.first["time"]), len(self.first["util"])) >= self.baseline_points:
                self.base = {key: median(vals) for key, vals in self.first.items() if vals}
                self.first = {}
        self._track_points(step, thermal, power, hw, util, gen)
        k = self.clock.points(5, 3)
        ev: dict[str, Any] = {"temp_c": finite(get(metrics, TEMP)), "power_w": finite(get(metrics, POWER_W)),
                              "power_limit_w": finite(get(metrics, POWER_LIMIT)),
                              "sm_clock_max_mhz": finite(get(metrics, CLOCK_MAX))}
        reasons = get(metrics, REASONS)
        if reasons is not None:
            ev["reasons"] = [name for bit, name in _REASONS.items() if int(reasons) & bit]
        throttled = self._throttled(k, ev)
        bound = self._rollout_bound(k, ev) if not throttled else False
        mode = "throttled" if throttled else "rollout_bound" if bound else None
        for m in ("throttled", "rollout_bound"):
            if m != mode:
                self.since.pop(m, None)
                self.held.pop(m, None)
        if mode is None:
            ev["mode"] = None
            return Assessment(level=0, evidence=ev, warming_up=self.base is None)
        start = self.since.setdefault(mode, min(step, self.streak.get(mode, step)))
        self.held[mode] = self.held.get(mode, 0) + 1
        ev["mode"] = mode
        level = 2 if (step - start + self.clock.gap >= self.persist_steps
                      and self.held[mode] >= self.clock.points(3, 2)) else 1
        ev["advice"] = self._advice(mode, ev)
        if mode == "rollout_bound" and self._rollout_overrides():
            ev["remedy"] = REMEDY
        return Assessment(level=level, evidence=ev, onset_step=start)

    def _track_points(self, step: int, thermal: float | None, power: float | None, hw: float | None,
                      util: float | None, gen: float | None) -> None:
        """Where the point-by-point evidence of each mode began (the onset: the recent medians lag it)."""
        base = self.base or {}
        heat = max(thermal or 0.0, hw or 0.0) >= self.throttle_share
        capped = power is not None and power >= self.throttle_share and power - base.get("power", 0.0) >= 0.3
        shows = {"throttled": heat or capped,
                 "rollout_bound": util is not None and gen is not None and gen >= self.generation_high
                 and util <= self.util_low}
        for mode, on in shows.items():
            if on:
                self.streak.setdefault(mode, step)
            else:
                self.streak.pop(mode, None)

    def _throttled(self, k: int, ev: dict[str, Any]) -> bool:
        base = self.base or {}
        recent_t = self.times.recent_median(k)
        if "time" not in base or recent_t is None or len(self.times) < k:
            return False
        ratio = recent_t / base["time"]
        thr = self.throttles.recent_median(k)
        pwr = self.powers.recent_median(k)
        heat = thr is not None and thr >= self.throttle_share
        # At the power cap from the start is the run's normal state; a cap that engaged later is not.
        capped = pwr is not None and pwr >= self.throttle_share and pwr - base.get("power", 0.0) >= 0.3
        clock = self.clocks.recent_median(k)
        clock_ratio = clock / base["clock"] if clock is not None and base.get("clock") else None
        ev.update(step_time_s=finite(recent_t), early_step_time_s=finite(base["time"]), slowdown=finite(ratio),
                  sm_clock_mhz=finite(clock), early_sm_clock_mhz=finite(base.get("clock")),
                  clock_ratio=finite(clock_ratio), throttle_heat_share=finite(thr), throttle_power_share=finite(pwr),
                  kind="thermal_or_hw" if heat else "power" if capped else None)
        clock_fell = clock_ratio is None or clock_ratio <= 1.0 - self.min_clock_drop
        return ratio >= 1.0 + self.min_slowdown and clock_fell and (heat or capped)

    def _rollout_bound(self, k: int, ev: dict[str, Any]) -> bool:
        util, gen = self.utils.recent_median(k), self.gens.recent_median(k)
        ev.update(util=finite(util), early_util=finite((self.base or {}).get("util")), generation_share=finite(gen))
        if util is None or gen is None or len(self.utils) < k or len(self.gens) < k:
            return False
        return gen >= self.generation_high and util <= self.util_low

    def _rollout_overrides(self) -> dict[str, Any]:
        cfg = self.context.config or {}
        if not cfg.get("use_vllm"):
            return {} if cfg.get("use_cpu") else {"use_vllm": True}
        if str(cfg.get("vllm_mode") or "colocate") != "colocate":
            return {}  # a server's GPUs are set where it is launched, not in GRPOConfig
        out: dict[str, Any] = {}
        if cfg.get("vllm_enable_sleep_mode") is not True:
            out["vllm_enable_sleep_mode"] = True
        util = cfg.get("vllm_gpu_memory_utilization")
        util = float(util) if isinstance(util, (int, float)) and not isinstance(util, bool) else 0.3
        if util < 0.9:
            out["vllm_gpu_memory_utilization"] = round(min(0.9, util + 0.2), 2)
        return out

    def _overrides(self) -> dict[str, Any]:
        return self._rollout_overrides() if self.evidence.get("mode") == "rollout_bound" else {}

    def _advice(self, mode: str, ev: Mapping[str, Any]) -> str:
        if mode == "throttled":
            if ev.get("kind") == "power":
                return ("The GPU is held at its power limit and slower than earlier in the run: compare the enforced "
                        "limit with the board's default (`nvidia-smi -q -d POWER`); a lowered cap or a power brake "
                        "from the chassis costs this speed. Raise the limit (`nvidia-smi -pl`) where the facility "
                        "allows, or look for another load on the same power budget.")
            return ("The GPU is slowing its clocks for heat (thermal or hardware slowdown): check its cooling — "
                    "airflow and fans, a blocked or hot neighbouring card, the room's inlet temperature; "
                    "`nvidia-smi -q -d PERFORMANCE,TEMPERATURE` shows the reasons live. Until it is fixed, a "
                    "slightly lower power limit (`nvidia-smi -pl`) trades peak speed for steady clocks.")
        cfg = self.context.config or {}
        if not cfg.get("use_vllm"):
            return ("Generation takes most of each step and the GPU is idle through it: transformers `generate` is "
                    "bound by kernel launches. Generate with vLLM (use_vllm=True; vllm_mode='colocate' on one GPU, "
                    "'server' on several).")
        if str(cfg.get("vllm_mode") or "colocate") != "colocate":
            return ("The training GPUs wait for the vLLM server most of each step: give the server more GPUs "
                    "(`trl vllm-serve --tensor_parallel_size` / `--data_parallel_size`), check its own GPU "
                    "utilisation, and keep it on the same node as training.")
        return ("Generation takes most of each step while the GPU is mostly idle: vLLM has too little KV cache to "
                "batch every completion at once. Raise vllm_gpu_memory_utilization, with vllm_enable_sleep_mode=True "
                "so training gets the memory back; generating for more steps at once (steps_per_generation) "
                "amortises each rollout.")

    def _message(self, severity: str, evidence: Mapping[str, Any]) -> str:
        if evidence.get("mode") == "throttled":
            why = "for power" if evidence.get("kind") == "power" else "for heat"
            reasons = ", ".join(evidence.get("reasons") or []) or "a slowdown reason"
            clock = ""
            if evidence.get("sm_clock_mhz") is not None and evidence.get("early_sm_clock_mhz") is not None:
                clock = f", SM clock {evidence['sm_clock_mhz']:.0f} MHz against {evidence['early_sm_clock_mhz']:.0f} early"
            temp = f" at {evidence['temp_c']:.0f} °C" if evidence.get("temp_c") is not None else ""
            return (f"The GPU is throttling {why}{temp} ({reasons}{clock}) and steps take {evidence.get('slowdown'):.2f}x "
                    f"their early time ({evidence.get('step_time_s')} s against {evidence.get('early_step_time_s')} s). "
                    + str(evidence.get("advice", "")))
        return (f"Rollout-bound: generation takes {evidence.get('generation_share'):.0%} of the wall time while the GPU "
                f"is busy {evidence.get('util'):.0f}% of it. " + str(evidence.get("advice", "")))
