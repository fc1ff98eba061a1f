"""The GPU under the run, through NVML: utilisation, memory, temperature, power, SM clock and the clock
throttle reasons, sampled on a thread of its own and summed up per logged step as ``system/gpu_*`` metrics.

NVML comes from ``nvidia-ml-py`` (the ``gpu`` extra; import name ``pynvml``), imported lazily: without
the package, without a driver, or without the device, ``start_sampler`` returns None and nothing is
sampled or logged. Nothing here imports torch. The training thread never calls NVML: the sampler thread
reads the device every ``interval_s`` seconds into a running window, and ``DeviceSampler.drain`` (called
once per logged step) swaps the window under a lock and turns it into a dozen numbers.

A step's window holds the readings taken since the previous log; a logging step shorter than the
sampling interval may have none, and then carries no ``system/gpu_*`` metric (not measured, as a missing
key always reads).

The metrics of one window (``WINDOW_METRICS``): ``system/gpu_util`` and ``system/gpu_mem_busy`` (mean
percent of time a kernel ran / device memory was read or written, ``nvmlUtilization_t``),
``system/gpu_used_peak_gib`` (the most the whole device held, every process, ``nvmlMemory_t.used``),
``system/gpu_total_gib``, ``system/gpu_temp_c`` (hottest reading), ``system/gpu_power_w`` (mean draw) and
``system/gpu_power_limit_w`` (the enforced limit), ``system/gpu_sm_clock_mhz`` (mean) and
``system/gpu_sm_clock_max_mhz``, ``system/gpu_throttle_thermal`` / ``_power`` / ``_hw`` (share of the
readings with a thermal, a power or a hardware slowdown reason active), ``system/gpu_throttle_reasons``
(every reason bit seen, OR-ed) and ``system/gpu_samples`` (readings in the window).
"""

from __future__ import annotations

import importlib
import re
import statistics
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from grpo_monitor.detectors.numbers import finite

GIB = 1024**3

# nvmlClocksThrottleReasons (nvml.h; nvmlClocksEventReasons since driver 535, same bits).
GPU_IDLE = 0x1
APPLICATIONS_CLOCKS_SETTING = 0x2
SW_POWER_CAP = 0x4
HW_SLOWDOWN = 0x8
SYNC_BOOST = 0x10
SW_THERMAL_SLOWDOWN = 0x20
HW_THERMAL_SLOWDOWN = 0x40
HW_POWER_BRAKE_SLOWDOWN = 0x80
DISPLAY_CLOCK_SETTING = 0x100
THERMAL = SW_THERMAL_SLOWDOWN | HW_THERMAL_SLOWDOWN
POWER = SW_POWER_CAP | HW_POWER_BRAKE_SLOWDOWN
REASON_NAMES = {
    GPU_IDLE: "gpu_idle",
    APPLICATIONS_CLOCKS_SETTING: "applications_clocks_setting",
    SW_POWER_CAP: "sw_power_cap",
    HW_SLOWDOWN: "hw_slowdown",
    SYNC_BOOST: "sync_boost",
    SW_THERMAL_SLOWDOWN: "sw_thermal_slowdown",
    HW_THERMAL_SLOWDOWN: "hw_thermal_slowdown",
    HW_POWER_BRAKE_SLOWDOWN: "hw_power_brake_slowdown",
    DISPLAY_CLOCK_SETTING: "display_clock_setting",
}
# pynvml's enum values for the queries below (nvml.h: NVML_TEMPERATURE_GPU, NVML_CLOCK_SM).
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_ERROR_NOT_SUPPORTED = 3

PREFIX = "system/gpu_"
WINDOW_METRICS = tuple(PREFIX + n for n in (
    "util", "mem_busy", "used_peak_gib", "total_gib", "temp_c", "power_w", "power_limit_w", "sm_clock_mhz",
    "sm_clock_max_mhz", "throttle_thermal", "throttle_power", "throttle_hw", "throttle_reasons", "samples"))
GENERATION_SHARE = "system/generation_share"
# How consecutive windows of one metric combine into one (a log coarser than its readings): the mean,
# except for these.
OVER_TIME = {PREFIX + "throttle_reasons": "or", PREFIX + "temp_c": "max", PREFIX + "used_peak_gib": "max",
             PREFIX + "samples": "sum"}
# What the run log's metrics carry of the device and of the rollouts: what the dashboard's device
# panel and analyze's device lines look for.
DEVICE_METRICS = WINDOW_METRICS + (GENERATION_SHARE,)


def reason_names(mask: Any) -> list[str]:
    """The throttle reasons a bit mask names, lowest bit first.

    >>> reason_names(SW_POWER_CAP | HW_THERMAL_SLOWDOWN)
    ['sw_power_cap', 'hw_thermal_slowdown']
    >>> reason_names(None), reason_names(0)
    ([], [])
    """
    try:
        m = int(mask)
    except (TypeError, ValueError, OverflowError):
        return []
    return [name for bit, name in REASON_NAMES.items() if m & bit]


def load_nvml() -> Any:
    """``pynvml`` (from ``nvidia-ml-py``), or None when it is not installed."""
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        return None


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class NvmlDevice:
    """One device's NVML handle: its static facts and one reading of its state at a time. A query the
    device does not support (NVML_ERROR_NOT_SUPPORTED: a GB10 has no separate memory to report) is
    left out, and not asked again."""

    def __init__(self, nvml: Any, handle: Any, index: int | None) -> None:
        self.nvml = nvml
        self.handle = handle
        self.index = index
        self.unsupported: set[str] = set()
        self._reasons_fn = (getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
                            or getattr(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None))
        self.facts = self._facts()

    @classmethod
    def open(cls, nvml: Any, device: int | str | None = None) -> NvmlDevice | None:
        """NVML initialised and the device's handle (an index, a ``GPU-…`` UUID; None is device 0), or
        None when there is no driver or no such device."""
        try:
            nvml.nvmlInit()
        except Exception:
            return None
        try:
            if isinstance(device, str) and not device.isdigit():
                handle = nvml.nvmlDeviceGetHandleByUUID(device)
                index = None
            else:
                index = int(device or 0)
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
            return cls(nvml, handle, index)
        except Exception:
            try:
                nvml.nvmlShutdown()
            except Exception:
                pass
            return None

    def _ask(self, name: str, fn: Callable[[], Any]) -> Any:
        if name in self.unsupported:
            return None
        try:
            return fn()
        except Exception as exc:
            # Not supported on this device: never asked again. Any other error: this reading goes without it.
            if getattr(exc, "value", None) == NVML_ERROR_NOT_SUPPORTED:
                self.unsupported.add(name)
            return None

    def _facts(self) -> dict[str, Any]:
        n, h = self.nvml, self.handle
        name = self._ask("name", lambda: n.nvmlDeviceGetName(h))
        uuid = self._ask("uuid", lambda: n.nvmlDeviceGetUUID(h))
        mem = self._ask("memory", lambda: n.nvmlDeviceGetMemoryInfo(h))
        clock = self._ask("max_clock", lambda: n.nvmlDeviceGetMaxClockInfo(h, NVML_CLOCK_SM))
        facts: dict[str, Any] = {
            "name": _text(name) if name is not None else None,
            "uuid": _text(uuid) if uuid is not None else None,
            "nvml_index": self.index,
            # A unified-memory device (GB10) has no memory of its own for NVML to report.
            "memory_info": "memory" not in self.unsupported,
            "total_gib": mem.total / GIB if mem is not None else None,
            "sm_clock_max_mhz": float(clock) if clock else None,
        }
        return facts

    def read(self) -> dict[str, float | None]:
        """One reading: utilisation and memory busy (%), memory used and total (bytes), temperature (°C),
        power and its limit (mW), SM clock (MHz), throttle reasons (bit mask)."""
        n, h = self.nvml, self.handle
        util = self._ask("utilization", lambda: n.nvmlDeviceGetUtilizationRates(h))
        mem = self._ask("memory", lambda: n.nvmlDeviceGetMemoryInfo(h))
        reasons = self._ask("reasons", lambda: self._reasons_fn(h)) if self._reasons_fn is not None else None
        return {
            "util": float(util.gpu) if util is not None else None,
            "mem_busy": float(util.memory) if util is not None else None,
            "used": float(mem.used) if mem is not None else None,
            "total": float(mem.total) if mem is not None else None,
            "temp": finite(self._ask("temperature", lambda: n.nvmlDeviceGetTemperature(h, NVML_TEMPERATURE_GPU))),
            "power_mw": finite(self._ask("power", lambda: n.nvmlDeviceGetPowerUsage(h))),
            "limit_mw": finite(self._ask("power_limit", lambda: n.nvmlDeviceGetEnforcedPowerLimit(h))),
            "sm_mhz": finite(self._ask("clock", lambda: n.nvmlDeviceGetClockInfo(h, NVML_CLOCK_SM))),
            "reasons": finite(reasons),
        }

    def close(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except Exception:
            pass


class Window:
    """Readings since the last log, kept as running sums (a few numbers, however long the window)."""

    def __init__(self) -> None:
        self.n = 0
        self.sums: dict[str, float] = {}
        self.counts: dict[str, int] = {}
        self.peak_used: float | None = None
        self.hottest: float | None = None
        self.total: float | None = None
        self.limit: float | None = None
        self.reasons_seen = 0
        self.reason_readings = 0
        self.thermal = self.power = self.hw = 0

    def add(self, r: Mapping[str, float | None]) -> None:
        self.n += 1
        for key in ("util", "mem_busy", "power_mw", "sm_mhz"):
            v = r.get(key)
            if v is not None:
                self.sums[key] = self.sums.get(key, 0.0) + v
                self.counts[key] = self.counts.get(key, 0) + 1
        used, temp = r.get("used"), r.get("temp")
        if used is not None:
            self.peak_used = used if self.peak_used is None else max(self.peak_used, used)
        if temp is not None:
            self.hottest = temp if self.hottest is None else max(self.hottest, temp)
        if r.get("total") is not None:
            self.total = r["total"]
        if r.get("limit_mw") is not None:
            self.limit = r["limit_mw"]
        mask = r.get("reasons")
        if mask is not None:
            m = int(mask)
            self.reason_readings += 1
            self.reasons_seen |= m
            self.thermal += bool(m & THERMAL)
            self.power += bool(m & POWER)
            self.hw += bool(m & HW_SLOWDOWN)

    def metrics(self, max_clock_mhz: float | None) -> dict[str, float]:
        if not self.n:
            return {}
        out: dict[str, float] = {PREFIX + "samples": float(self.n)}

        def mean(key: str) -> float | None:
            c = self.counts.get(key)
            return self.sums[key] / c if c else None

        for key, name, scale in (("util", "util", 1.0), ("mem_busy", "mem_busy", 1.0), ("power_mw", "power_w", 1e-3),
                                 ("sm_mhz", "sm_clock_mhz", 1.0)):
            v = mean(key)
            if v is not None:
                out[PREFIX + name] = v * scale
        if self.peak_used is not None:
            out[PREFIX + "used_peak_gib"] = self.peak_used / GIB
        if self.total is not None:
            out[PREFIX + "total_gib"] = self.total / GIB
        if self.hottest is not None:
            out[PREFIX + "temp_c"] = self.hottest
        if self.limit is not None:
            out[PREFIX + "power_limit_w"] = self.limit * 1e-3
        if max_clock_mhz:
            out[PREFIX + "sm_clock_max_mhz"] = float(max_clock_mhz)
        if self.reason_readings:
            k = self.reason_readings
            out[PREFIX + "throttle_thermal"] = self.thermal / k
            out[PREFIX + "throttle_power"] = self.power / k
            out[PREFIX + "throttle_hw"] = self.hw / k
            out[PREFIX + "throttle_reasons"] = float(self.reasons_seen)
        return out


class DeviceSampler:
    """Reads one device every ``interval_s`` seconds on a daemon thread; ``drain`` hands over the window."""

    def __init__(self, device: NvmlDevice, interval_s: float = 1.0) -> None:
        if isinstance(interval_s, bool) or not isinstance(interval_s, (int, float)) or not interval_s > 0:
            raise ValueError(f"interval_s must be a number > 0, got {interval_s!r}")
        self.device = device
        self.interval_s = float(interval_s)
        self.error: BaseException | None = None  # what stopped the thread, for the caller to report once
        self._lock = threading.Lock()
        self._window = Window()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def facts(self) -> dict[str, Any]:
        return dict(self.device.facts)

    def start(self) -> DeviceSampler:
        self._thread = threading.Thread(target=self._run, name="grpo-monitor-nvml", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._add(self.device.read())
                self._stop.wait(self.interval_s)
        except BaseException as exc:  # the sampler stops; the run goes on
            self.error = exc

    def sample_now(self) -> None:
        """One reading into the window from the calling thread (tests, benchmarks; the run never calls it)."""
        self._add(self.device.read())

    def _add(self, reading: Mapping[str, float | None]) -> None:
        if all(v is None for k, v in reading.items() if k not in ("total", "limit_mw")):
            return  # the device reported nothing of its state (lost, reset): no reading, rather than an empty one
        with self._lock:
            self._window.add(reading)

    def drain(self) -> dict[str, float]:
        """The window since the last drain as ``system/gpu_*`` metrics (empty when no reading fell in it)."""
        with self._lock:
            window, self._window = self._window, Window()
        return window.metrics(self.device.facts.get("sm_clock_max_mhz"))

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        self.device.close()


def start_sampler(device: int | str | None = None, interval_s: float = 1.0, nvml: Any = None) -> DeviceSampler | None:
    """A running sampler of ``device`` (NVML index or UUID), or None when NVML, its driver or the device
    is not there: then nothing happens at all."""
    nvml = nvml if nvml is not None else load_nvml()
    if nvml is None:
        return None
    dev = NvmlDevice.open(nvml, device)
    if dev is None:
        return None
    return DeviceSampler(dev, interval_s).start()


# -- across ranks -------------------------------------------------------------------------------

# How the ranks' windows combine into the step's metrics: the worst rank's value (a synchronous step
# goes at the pace of its slowest device).
_WORST: dict[str, Callable[[Sequence[float]], float]] = {
    PREFIX + "util": min, PREFIX + "mem_busy": max, PREFIX + "used_peak_gib": max, PREFIX + "total_gib": min,
    PREFIX + "temp_c": max, PREFIX + "power_w": max, PREFIX + "power_limit_w": min, PREFIX + "sm_clock_mhz": min,
    PREFIX + "sm_clock_max_mhz": max, PREFIX + "throttle_thermal": max, PREFIX + "throttle_power": max,
    PREFIX + "throttle_hw": max, PREFIX + "samples": min, GENERATION_SHARE: max,
}


def combine_ranks(parts: Sequence[Mapping[str, float] | None]) -> dict[str, float]:
    """Every rank's window (None: a rank without a device) as one set of metrics, the worst rank's value
    of each (the coolest throttle-free rank does not hide a hot one); throttle reason bits are OR-ed.

    >>> combine_ranks([{"system/gpu_util": 90.0, "system/gpu_temp_c": 70.0},
    ...                {"system/gpu_util": 40.0, "system/gpu_temp_c": 88.0}, None])
    {'system/gpu_util': 40.0, 'system/gpu_temp_c': 88.0}
    """
    given = [p for p in parts if p]
    if len(given) == 1:
        return dict(given[0])
    out: dict[str, float] = {}
    names: dict[str, None] = {}
    for p in given:
        names.update(dict.fromkeys(p))
    for name in names:
        vals = [float(p[name]) for p in given if p.get(name) is not None]
        if not vals:
            continue
        if name == PREFIX + "throttle_reasons":
            mask = 0
            for v in vals:
                mask |= int(v)
            out[name] = float(mask)
        else:
            out[name] = _WORST.get(name, max)(vals)
    return out


# -- what a recorded run says of its device ------------------------------------------------------

def device_health(steps: Sequence[tuple[int, Mapping[str, Any]]]) -> dict[str, Any] | None:
    """A run's device health from its logged ``system/gpu_*`` metrics (None when it logged none): median
    utilisation and memory busy, the hottest reading, median power against the limit, median SM clock
    against its maximum, the share of logged steps with each throttle kind active, the reasons seen,
    median generation share.

    >>> h = device_health([(1, {"system/gpu_util": 80.0, "system/gpu_temp_c": 70.0, "system/gpu_throttle_thermal": 0.0}),
    ...                    (2, {"system/gpu_util": 60.0, "system/gpu_temp_c": 84.0,
    ...                         "system/gpu_throttle_thermal": 1.0, "system/gpu_throttle_reasons": 64.0})])
    >>> h["util_median"], h["temp_max_c"], h["throttle_steps"]["thermal"], h["reasons_seen"]
    (70.0, 84.0, 0.5, ['hw_thermal_slowdown'])
    """
    cols: dict[str, list[float]] = {}
    logged = 0
    mask = 0
    for _, m in steps:
        hit = False
        for name in DEVICE_METRICS:
            v = finite(m.get(name))
            if v is not None:
                cols.setdefault(name, []).append(v)
                hit = True
        if hit:
            logged += 1
        r = finite(m.get(PREFIX + "throttle_reasons"))
        if r is not None:
            mask |= int(r)
    if not logged:
        return None

    def med(name: str) -> float | None:
        vals = cols.get(PREFIX + name) if name != "generation_share" else cols.get(GENERATION_SHARE)
        return float(statistics.median(vals)) if vals else None

    out: dict[str, Any] = {"steps_with_device_metrics": logged}
    util, busy = med("util"), med("mem_busy")
    if util is not None:
        out["util_median"] = util
        out["util_min"] = min(cols[PREFIX + "util"])
    if busy is not None:
        out["mem_busy_median"] = busy
    if cols.get(PREFIX + "temp_c"):
        out["temp_max_c"] = max(cols[PREFIX + "temp_c"])
    power, limit = med("power_w"), med("power_limit_w")
    if power is not None:
        out["power_median_w"] = power
    if limit is not None:
        out["power_limit_w"] = limit
    clock, top = med("sm_clock_mhz"), med("sm_clock_max_mhz")
    if clock is not None:
        out["sm_clock_median_mhz"] = clock
        out["sm_clock_min_mhz"] = min(cols[PREFIX + "sm_clock_mhz"])
    if top is not None:
        out["sm_clock_max_mhz"] = top
    if cols.get(PREFIX + "used_peak_gib"):
        out["used_peak_gib"] = max(cols[PREFIX + "used_peak_gib"])
    if cols.get(PREFIX + "total_gib"):
        out["total_gib"] = min(cols[PREFIX + "total_gib"])
    kinds = {k: cols.get(PREFIX + f"throttle_{k}") for k in ("thermal", "power", "hw")}
    if any(kinds.values()):
        # The share of logged steps on which the reason was active in at least half the readings.
        out["throttle_steps"] = {k: (sum(1 for v in vals if v >= 0.5) / len(vals)) if vals else None
                                 for k, vals in kinds.items()}
        out["reasons_seen"] = reason_names(mask)
    share = med("generation_share")
    if share is not None:
        out["generation_share_median"] = share
    return out


def health_lines(health: Mapping[str, Any]) -> list[str]:
    """``device_health`` in a few plain lines (analyze's text and Markdown reports).

    >>> health_lines({"util_median": 71.0, "temp_max_c": 84.0, "steps_with_device_metrics": 3})
    ['utilisation median 71%; hottest 84 °C (3 logged steps with device readings)']
    """
    parts: list[str] = []
    if health.get("util_median") is not None:
        parts.append(f"utilisation median {health['util_median']:.0f}%"
                     + (f" (lowest {health['util_min']:.0f}%)" if health.get("util_min") is not None
                        and health["util_min"] < health["util_median"] - 10 else ""))
    if health.get("mem_busy_median") is not None:
        parts.append(f"memory busy median {health['mem_busy_median']:.0f}%")
    if health.get("temp_max_c") is not None:
        parts.append(f"hottest {health['temp_max_c']:.0f} °C")
    line = "; ".join(parts)
    lines = [line + f" ({health.get('steps_with_device_metrics')} logged steps with device readings)"] if line else []
    second: list[str] = []
    if health.get("power_median_w") is not None:
        limit = health.get("power_limit_w")
        second.append(f"power median {health['power_median_w']:.0f} W" + (f" of {limit:.0f} W" if limit else ""))
    if health.get("sm_clock_median_mhz") is not None:
        top = health.get("sm_clock_max_mhz")
        second.append(f"SM clock median {health['sm_clock_median_mhz']:.0f} MHz" + (f" of {top:.0f}" if top else "")
                      + f" (lowest {health['sm_clock_min_mhz']:.0f})")
    if health.get("used_peak_gib") is not None:
        total = health.get("total_gib")
        second.append(f"memory peak {health['used_peak_gib']:.1f}" + (f" of {total:.1f}" if total else "") + " GiB")
    if second:
        lines.append("; ".join(second))
    thr = health.get("throttle_steps")
    if thr:
        active = [f"{k} on {v:.0%} of steps" for k, v in thr.items() if v]
        lines.append("throttling: " + (", ".join(active) if active else "none")
                     + (f" (reasons seen: {', '.join(health.get('reasons_seen') or [])})"
                        if health.get("reasons_seen") else ""))
    if health.get("generation_share_median") is not None:
        lines.append(f"generation takes a median {health['generation_share_median']:.0%} of the wall time")
    return lines


# -- unified memory ---------------------------------------------------------------------------

# Decode reads the model's weights once per generated token (batched): what the memory gives per second
# bounds the tokens per second. Figures are the vendors' published peak bandwidths.
UNIFIED_MEMORY = {
    # DGX Spark's GB10: one 128 GB LPDDR5x pool for CPU and GPU at 273 GB/s (an H100's HBM3 gives 3,350).
    "gb10": {"label": "DGX Spark / GB10 (CPU and GPU share one LPDDR5x pool)", "bandwidth_gbs": 273.0},
    # GH200: the Hopper GPU decodes from its own HBM (about 4,000 GB/s); the Grace CPU's LPDDR5X is
    # one address space with it, reached over NVLink-C2C (900 GB/s both ways together), so whatever
    # lands there (managed-memory oversubscription, offloaded weights or KV cache) decodes at that rate.
    "grace_hopper": {"label": "Grace-Hopper GH200 (GPU HBM and CPU LPDDR5X in one address space over NVLink-C2C)",
                     "bandwidth_gbs": 4000.0, "spill_bandwidth_gbs": 450.0},
    "integrated": {"label": "an integrated GPU sharing the host's memory", "bandwidth_gbs": None},
}


def unified_memory(facts: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Whether the device shares its memory with the CPU, from what it reports: its name (``GB10``,
    ``GH200``), torch's ``is_integrated`` flag, or NVML having no device memory to report
    (``memory_info`` False). None for a discrete GPU or when nothing is known.

    >>> unified_memory({"name": "NVIDIA GB10", "memory_info": False})["kind"]
    'gb10'
    >>> unified_memory({"name": "NVIDIA GH200 480GB", "memory_info": True})["kind"]
    'grace_hopper'
    >>> unified_memory({"name": "NVIDIA H100 80GB HBM3", "integrated": False, "memory_info": True}) is None
    True
    """
    if not facts:
        return None
    name = str(facts.get("name") or "")
    upper = name.upper()
    reasons: list[str] = []
    if re.search(r"\bGB10\b", upper):
        kind = "gb10"
        reasons.append(f"device name {name!r}")
    elif "GH200" in upper or "GRACE HOPPER" in upper:
        kind = "grace_hopper"
        reasons.append(f"device name {name!r}")
    else:
        kind = "integrated"
    if facts.get("integrated") is True:
        reasons.append("torch reports an integrated device")
    if facts.get("memory_info") is False:
        reasons.append("NVML reports no device memory of its own")
    if kind == "integrated" and not reasons:
        return None
    return {"kind": kind, **UNIFIED_MEMORY[kind], "name": name or None, "evidence": reasons}


def decode_floor(weight_bytes: float, bandwidth_gbs: float | None, tokens: int) -> dict[str, float] | None:
    """The least time decoding ``tokens`` tokens takes when every step reads ``weight_bytes`` once at
    ``bandwidth_gbs`` (KV-cache reads come on top).

    >>> decode_floor(16e9, 273.0, 1024)["rollout_s"] > 60
    True
    """
    if not bandwidth_gbs or weight_bytes <= 0 or tokens <= 0:
        return None
    per_token = weight_bytes / (bandwidth_gbs * 1e9)
    return {"decode_step_ms": per_token * 1e3, "rollout_s": per_token * tokens}

