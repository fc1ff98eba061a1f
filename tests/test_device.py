"""The GPU under the run: NVML device health (sampler, callback part, ranks), the ``device_throttled``
detector, the memory remediation ladder against the installed TRL, and lint on unified-memory machines.

No GPU is available to these tests. The NVML readings come from ``fixtures.nvml``, a stand-in for the
``pynvml`` module built from NVML's documented structures and units (nvmlUtilization_t, nvmlMemory_t,
temperature in °C, power and its limit in mW, clocks in MHz, the nvmlClocksThrottleReasons bit masks),
not captured from a device; it is put in ``sys.modules["pynvml"]``, the one import the monitor makes, so
everything above that boundary is the monitor's own code on a real GRPOTrainer. Without the package
(``sys.modules["pynvml"] = None`` makes Python's import fail as it does when it is not installed) the
tests check that nothing is sampled, logged or reported.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from grpo_monitor import analyze, read_run
from grpo_monitor.core.device import (
    GENERATION_SHARE,
    HW_SLOWDOWN,
    HW_THERMAL_SLOWDOWN,
    SW_POWER_CAP,
    SW_THERMAL_SLOWDOWN,
    WINDOW_METRICS,
    DeviceSampler,
    NvmlDevice,
    combine_ranks,
    load_nvml,
    start_sampler,
    unified_memory,
)
from grpo_monitor.core.engine import Engine
from grpo_monitor.detectors import ALL_DETECTORS
from grpo_monitor.detectors.device_throttled import DeviceThrottled
from grpo_monitor.detectors.memory_pressure import MemoryPressure, memory_ladder
from grpo_monitor.fixtures.field.device import HEALTHY, SPECS
from grpo_monitor.fixtures.nvml import (
    AT_POWER_CAP,
    GB10,
    HEALTHY as HEALTHY_READING,
    STARVED,
    THERMAL,
    DeviceSpec,
    FakeNVML,
    NVMLError,
    throttling_episode,
)
from grpo_monitor.fixtures.synthetic import generate
from grpo_monitor.preflight.lint import lint, lint_path
from tests.conftest import train_tiny


def _watch_device_0(interval_s: float = 1.0):
    """NVML device 0, the fake NVML's: the CPU runs here train on no GPU of their own to watch."""
    from grpo_monitor.callbacks.options import DeviceOptions

    return DeviceOptions(device=0, interval_s=interval_s)

GIB = 1024**3
START_UP = {"nvmlInit", "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetName", "nvmlDeviceGetUUID",
            "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetMaxClockInfo"}
ALARMS = ("warning", "critical")
ROOT = Path(__file__).resolve().parents[1]


# -- the sampler against NVML's structures ---------------------------------------------------------------


def _sampler(fake: FakeNVML, index: int = 0) -> DeviceSampler:
    dev = NvmlDevice.open(fake, index)
    assert dev is not None
    return DeviceSampler(dev)


def test_a_window_sums_up_its_readings_in_the_units_nvml_documents():
    fake = FakeNVML(readings=[HEALTHY_READING, AT_POWER_CAP, THERMAL, THERMAL])
    s = _sampler(fake)
    for _ in range(4):
        s.sample_now()
    m = s.drain()
    assert m["system/gpu_samples"] == 4
    assert m["system/gpu_util"] == pytest.approx((92 + 97 + 96 + 96) / 4)
    assert m["system/gpu_mem_busy"] == pytest.approx(55)
    # mW -> W; the mean draw, the enforced limit
    assert m["system/gpu_power_w"] == pytest.approx((612_000 + 699_000 + 455_000 * 2) / 4 / 1000)
    assert m["system/gpu_power_limit_w"] == 700.0
    assert m["system/gpu_sm_clock_mhz"] == pytest.approx((1980 + 1755 + 1185 * 2) / 4)
    assert m["system/gpu_sm_clock_max_mhz"] == 1980.0
    assert m["system/gpu_temp_c"] == 89.0  # the hottest reading
    assert m["system/gpu_used_peak_gib"] == pytest.approx(61e9 / GIB)  # bytes -> GiB
    assert m["system/gpu_total_gib"] == pytest.approx(85_520_809_984 / GIB)
    assert m["system/gpu_throttle_thermal"] == 0.5 and m["system/gpu_throttle_hw"] == 0.5
    assert m["system/gpu_throttle_power"] == 0.25
    assert int(m["system/gpu_throttle_reasons"]) == SW_POWER_CAP | SW_THERMAL_SLOWDOWN | HW_THERMAL_SLOWDOWN | HW_SLOWDOWN
    assert set(m) == set(WINDOW_METRICS)
    assert s.drain() == {}  # a window with no reading carries nothing: not measured


def test_a_throttling_episode_shows_in_the_windows_it_falls_in():
    s = _sampler(FakeNVML(readings=throttling_episode(start=4, length=6)))
    windows = []
    for _ in range(5):
        for _ in range(3):
            s.sample_now()
        windows.append(s.drain())
    assert [w["system/gpu_throttle_thermal"] for w in windows] == pytest.approx([0.0, 2 / 3, 1.0, 1 / 3, 0.0])
    assert windows[0]["system/gpu_sm_clock_mhz"] == 1980 and windows[2]["system/gpu_sm_clock_mhz"] == 1185
    assert windows[2]["system/gpu_temp_c"] == 89 and windows[4]["system/gpu_temp_c"] == 68


def test_a_query_the_device_does_not_support_is_left_out_and_not_asked_again():
    fake = FakeNVML(devices=[GB10], unsupported=["nvmlDeviceGetPowerUsage"])
    s = _sampler(fake)
    assert s.facts["memory_info"] is False and s.facts["total_gib"] is None
    for _ in range(5):
        s.sample_now()
    m = s.drain()
    assert "system/gpu_used_peak_gib" not in m and "system/gpu_power_w" not in m
    assert m["system/gpu_util"] == 92 and m["system/gpu_power_limit_w"] == 140.0
    asked = [name for name, _ in fake.calls]
    assert asked.count("nvmlDeviceGetMemoryInfo") == 1 and asked.count("nvmlDeviceGetPowerUsage") == 1


def test_a_device_that_stops_answering_gives_no_readings_rather_than_empty_ones():
    def readings(n):
        if n >= 2:
            raise NVMLError(15)  # NVML_ERROR_GPU_IS_LOST
        return HEALTHY_READING

    s = _sampler(FakeNVML(readings=readings))
    for _ in range(5):
        s.sample_now()
    assert s.drain()["system/gpu_samples"] == 2
    s.sample_now()
    assert s.drain() == {}


def test_the_sampling_thread_reads_the_device_and_drain_never_calls_nvml():
    fake = FakeNVML()
    sampler = start_sampler(0, interval_s=0.005, nvml=fake)
    assert sampler is not None
    try:
        deadline = time.monotonic() + 10
        while fake.samples[0] < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        before = len(fake.calls_on(threading.current_thread().name))
        m = sampler.drain()
        assert len(fake.calls_on(threading.current_thread().name)) == before
        assert m["system/gpu_samples"] >= 3
        assert set(fake.calls_on("grpo-monitor-nvml")) >= {"nvmlDeviceGetUtilizationRates",
                                                           "nvmlDeviceGetCurrentClocksEventReasons"}
    finally:
        sampler.stop()
    assert fake.initialised == 0  # shut down


def test_without_nvml_its_driver_or_the_device_nothing_starts(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # what `import pynvml` meets when it is not installed
    assert load_nvml() is None and start_sampler(0) is None
    assert start_sampler(0, nvml=FakeNVML(driver=False)) is None
    missing = FakeNVML()
    assert start_sampler(3, nvml=missing) is None and missing.initialised == 0
    assert start_sampler("GPU-no-such-device", nvml=missing) is None


def test_ranks_combine_into_the_worst_device():
    cool = {"system/gpu_util": 90.0, "system/gpu_temp_c": 66.0, "system/gpu_sm_clock_mhz": 1980.0,
            "system/gpu_throttle_thermal": 0.0, "system/gpu_throttle_reasons": float(SW_POWER_CAP),
            GENERATION_SHARE: 0.4}
    hot = {"system/gpu_util": 95.0, "system/gpu_temp_c": 89.0, "system/gpu_sm_clock_mhz": 1185.0,
           "system/gpu_throttle_thermal": 1.0, "system/gpu_throttle_reasons": float(HW_THERMAL_SLOWDOWN),
           GENERATION_SHARE: 0.45}
    both = combine_ranks([cool, hot, None])
    assert both == {"system/gpu_util": 90.0, "system/gpu_temp_c": 89.0, "system/gpu_sm_clock_mhz": 1185.0,
                    "system/gpu_throttle_thermal": 1.0,
                    "system/gpu_throttle_reasons": float(SW_POWER_CAP | HW_THERMAL_SLOWDOWN), GENERATION_SHARE: 0.45}


# -- on a real GRPOTrainer ----------------------------------------------------------------------------------

DEVICE_KEYS = set(WINDOW_METRICS) | {GENERATION_SHARE}


def _device_metrics(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in r["metrics"].items() if k in DEVICE_KEYS} for r in read_run(run_dir).steps]


def test_a_throttling_gpu_is_recorded_per_step_and_the_training_thread_never_asks_nvml(tmp_path, monkeypatch):
    fake = FakeNVML(readings=throttling_episode(start=2, length=4))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    trainer, cb = train_tiny(tmp_path, steps=8, attach_options={"device_health": _watch_device_0(0.005)})
    log = read_run(tmp_path)
    assert log.header["device"]["name"] == "NVIDIA H100 80GB HBM3" and log.header["device"]["unified_memory"] is None
    windows = [m for m in _device_metrics(tmp_path) if m.get("system/gpu_samples")]
    assert len(windows) >= 4, windows
    for m in windows:
        # Every value is a mean, peak or share of the documented readings the device gave.
        assert 92 <= m["system/gpu_util"] <= 96 and 68 <= m["system/gpu_temp_c"] <= 89
        assert 1185 <= m["system/gpu_sm_clock_mhz"] <= 1980 and 455 <= m["system/gpu_power_w"] <= 612
        assert int(m["system/gpu_throttle_reasons"]) & ~(SW_THERMAL_SLOWDOWN | HW_THERMAL_SLOWDOWN | HW_SLOWDOWN) == 0
        assert 0 < m[GENERATION_SHARE] <= 1  # the tiny model's generate, timed around TRL's _generate
    assert sum(m["system/gpu_samples"] for m in windows) <= fake.samples[0]
    assert max(m["system/gpu_throttle_thermal"] for m in windows) > 0  # the episode's readings are in the log
    assert max(m["system/gpu_temp_c"] for m in windows) == 89
    # The training thread opened NVML once at train begin and shut it down at the end: no per-step call.
    main = fake.calls_on(threading.current_thread().name)
    assert set(main) == START_UP | {"nvmlShutdown"} and len(main) == len(START_UP) + 1
    assert "_generate" not in vars(trainer) and cb.errors == {} and fake.initialised == 0


def _no_device_trace(run_dir: Path, cb, caplog) -> None:
    log = read_run(run_dir)
    assert "device" not in log.header
    assert all(not (set(r["metrics"]) & DEVICE_KEYS) for r in log.steps)
    assert not [n for n in log.notes if "device" in n.get("message", "")]
    assert cb.errors == {} and not [r for r in caplog.records if "device" in r.getMessage()]
    assert "device" not in analyze(run_dir).runs[0].to_dict()


def test_without_the_nvml_package_a_run_records_nothing_of_its_device(tmp_path, monkeypatch, quiet_monitor_logs):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    trainer, cb = train_tiny(tmp_path, steps=3, attach_options={"device_health": _watch_device_0()})
    _no_device_trace(tmp_path, cb, quiet_monitor_logs)
    assert "_generate" not in vars(trainer)


def test_a_run_that_trains_on_no_gpu_does_not_watch_one(tmp_path, monkeypatch, quiet_monitor_logs):
    fake = FakeNVML()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    _, cb = train_tiny(tmp_path, steps=3)  # the CPU run: by default the monitor watches the GPU each rank trains on
    _no_device_trace(tmp_path, cb, quiet_monitor_logs)
    assert fake.calls == []


def test_device_options_are_checked_at_attach():
    from grpo_monitor.callbacks.options import DeviceOptions

    for bad in ({"interval_s": 0}, {"interval_s": True}, {"device": -1}, {"device": ""}, {"device": True}):
        with pytest.raises(ValueError, match=rf"^DeviceOptions\({next(iter(bad))}=\.\.\.\): "):
            DeviceOptions(**bad)


RANK_SCRIPT = '''
import sys, warnings
sys.path.insert(0, {root!r})
from grpo_monitor.fixtures.nvml import FakeNVML, HEALTHY, THERMAL
import os
sys.modules["pynvml"] = FakeNVML(readings=[THERMAL if os.environ["RANK"] == "1" else HEALTHY])
import transformers
from grpo_monitor import DeviceOptions, attach
from grpo_monitor.app.demo import build_trainer, demo_config
warnings.filterwarnings("ignore")
transformers.logging.set_verbosity_error()
trainer = build_trainer(demo_config({out!r}, 3))
attach(trainer, {run!r}, device_health=DeviceOptions(device=0, interval_s=0.005))
trainer.train()
'''


def test_each_ranks_device_reaches_rank_zeros_log_and_the_worst_one_is_the_steps(tmp_path):
    script = tmp_path / "train_ranks.py"
    run_dir = tmp_path / "run"
    script.write_text(RANK_SCRIPT.format(root=str(ROOT), out=str(tmp_path / "out"), run=str(run_dir)))
    from tests.test_multiprocess import TORCHRUN, env

    out = subprocess.run([*TORCHRUN, str(script)], capture_output=True, text=True, env=env(), cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    steps = [r for r in read_run(run_dir).steps if r.get("devices")]
    assert steps, "no step carried both ranks' devices"
    for rec in steps:
        ranks = {d["rank"]: d for d in rec["devices"]}
        assert set(ranks) == {0, 1}
        if ranks[0].get("system/gpu_samples") and ranks[1].get("system/gpu_samples"):
            assert ranks[0]["system/gpu_temp_c"] == 68 and ranks[1]["system/gpu_temp_c"] == 89
            assert rec["metrics"]["system/gpu_temp_c"] == 89 and rec["metrics"]["system/gpu_sm_clock_mhz"] == 1185


# -- the detector -----------------------------------------------------------------------------------------------

SEEDS = (0, 1, 2)
FAILURES = [n for n in SPECS if n not in HEALTHY]


def replay(run):
    engine = Engine(run.context, [cls() for cls in ALL_DETECTORS])
    for step, metrics in run.steps:
        engine.update(step, metrics, run.samples.get(step, []))
    assert engine.disabled == {}
    return engine.findings


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("logging_steps", (1, 10))
@pytest.mark.parametrize("name", FAILURES)
def test_a_run_slowed_by_its_device_is_found_in_time_and_nothing_else_is_raised(name, logging_steps, seed):
    run = generate(name, seed=seed, logging_steps=logging_steps)
    alarms = [f for f in replay(run) if f.severity in ALARMS]
    first = next(f for f in alarms if f.detector == "device_throttled")
    assert first.step <= run.labels["fail"] and first.onset_step <= first.step
    assert first.evidence["advice"]
    assert [(f.detector, f.step) for f in alarms if f.detector != "device_throttled"] == []


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("logging_steps", (1, 10))
@pytest.mark.parametrize("name", HEALTHY)
def test_a_healthy_gpu_raises_nothing(name, logging_steps, seed):
    run = generate(name, seed=seed, logging_steps=logging_steps)
    assert [(f.detector, f.severity, f.step) for f in replay(run)] == []


def test_a_thermal_throttle_names_its_reasons_the_clock_and_the_cooling():
    run = generate("device_thermal_throttling", seed=0)
    f = next(f for f in replay(run) if f.detector == "device_throttled" and f.severity == "warning")
    ev = f.evidence
    assert ev["mode"] == "throttled" and ev["kind"] == "thermal_or_hw" and 118 <= f.onset_step <= 122
    assert {"sw_thermal_slowdown", "hw_thermal_slowdown"} <= set(ev["reasons"])
    assert ev["slowdown"] > 1.3 and ev["clock_ratio"] < 0.7 and ev["temp_c"] > 85
    assert "cooling" in ev["advice"] and f.config_overrides == {} and f.variant is None


def test_a_steady_power_cap_is_the_runs_normal_but_a_cap_that_engages_later_slows_it():
    det = DeviceThrottled()
    found = []
    for step in range(1, 80):
        later = step >= 40
        found += det.update(step, {"step_time": 5.0 * (1.3 if later else 1.0), "system/gpu_util": 97.0,
                                   "system/gpu_sm_clock_mhz": 1500.0 if later else 1980.0,
                                   "system/gpu_throttle_power": 1.0 if later else 0.0,
                                   "system/gpu_throttle_thermal": 0.0, "system/gpu_throttle_hw": 0.0})
    assert [(f.severity, f.evidence["kind"]) for f in found] == [("info", "power"), ("warning", "power")]
    assert "power limit" in found[0].message


@pytest.mark.parametrize("config,overrides,words", [
    ({"use_vllm": True, "vllm_mode": "server"}, {}, "server"),
    ({"use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.3},
     {"vllm_enable_sleep_mode": True, "vllm_gpu_memory_utilization": 0.5}, "KV cache"),
    ({"use_vllm": False}, {"use_vllm": True}, "transformers `generate`"),
])
def test_a_rollout_bound_run_is_told_what_its_generation_engine_needs(config, overrides, words):
    from grpo_monitor.core.catalogue import validate

    run = generate("device_rollout_bound", seed=0)
    run.context.config.update(config)
    f = next(f for f in replay(run) if f.detector == "device_throttled" and f.severity == "warning")
    assert f.evidence["mode"] == "rollout_bound" and f.evidence["generation_share"] > 0.7 and f.evidence["util"] < 30
    assert f.config_overrides == overrides and words in f.evidence["advice"]
    assert (f.evidence.get("remedy") == "faster_rollouts") is bool(overrides)
    validate(f.config_overrides)  # every diff is one the installed TRL accepts


# -- the memory ladder ------------------------------------------------------------------------------------------

LADDER_CONFIGS = {
    "colocated vLLM": dict(use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=0.5,
                           gradient_checkpointing=False, per_device_train_batch_size=8, gradient_accumulation_steps=2,
                           max_completion_length=1024),
    "server vLLM, steps_per_generation": dict(use_vllm=True, vllm_mode="server", per_device_train_batch_size=16,
                                              gradient_accumulation_steps=1, steps_per_generation=4,
                                              max_completion_length=512, optim="lion_32bit"),
    "transformers generate": dict(per_device_train_batch_size=8, gradient_accumulation_steps=4,
                                  max_completion_length=256),
}


@pytest.mark.parametrize("name", list(LADDER_CONFIGS))
def test_every_rung_of_the_ladder_builds_a_grpo_config_of_the_installed_trl(name, tmp_path):
    from trl import GRPOConfig

    from grpo_monitor.core.catalogue import apply_overrides, validate

    args = GRPOConfig(output_dir=str(tmp_path), bf16=False, use_cpu=True, num_generations=8, report_to="none",
                      **LADDER_CONFIGS[name])
    ladder = memory_ladder(args.to_dict())
    assert ladder, name
    climbed = args
    for rung in ladder:
        validate(rung["overrides"])
        built = apply_overrides(args, rung["overrides"])  # each rung alone ...
        climbed = apply_overrides(climbed, rung["overrides"])  # ... and climbed in order
        for key, value in rung["overrides"].items():
            assert getattr(getattr(built, key), "value", getattr(built, key)) == value
        # The generation batch stays whole: a smaller micro-batch keeps the completions per step.
        assert climbed.generation_batch_size % climbed.num_generations == 0
    assert climbed.generation_batch_size == args.generation_batch_size or "shorter_completions" not in ladder


def test_the_ladder_goes_in_the_recipes_order_and_skips_what_the_config_has():
    full = LADDER_CONFIGS["colocated vLLM"]
    assert [r["remedy"] for r in memory_ladder(full)] == [
        "vllm_sleep_mode", "lower_vllm_gpu_memory_utilization", "gradient_checkpointing", "low_bit_optimizer",
        "smaller_micro_batch", "shorter_completions"]
    done = dict(full, vllm_enable_sleep_mode=True, gradient_checkpointing=True, optim="paged_adamw_8bit")
    assert [r["remedy"] for r in memory_ladder(done)] == [
        "lower_vllm_gpu_memory_utilization", "smaller_micro_batch", "shorter_completions"]
    lion = memory_ladder(LADDER_CONFIGS["server vLLM, steps_per_generation"])
    assert [r["overrides"] for r in lion if r["remedy"] in ("low_bit_optimizer", "smaller_micro_batch")] == [
        {"optim": "paged_lion_8bit"},
        {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 2, "steps_per_generation": 8}]


def test_memory_pressure_offers_the_next_rung_on_each_restarted_segment():
    run = generate("k17_memory_grows_to_capacity", seed=0)
    config = dict(run.context.config, use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=0.3)
    offered = []
    for _ in range(4):
        run.context.config = dict(config)
        det = MemoryPressure()
        det.start(run.context)
        f = next(f for step, m in run.steps for f in det.update(step, m) if f.severity == "warning")
        offered.append(f.evidence["remedy"])
        assert f.evidence["ladder"][0] == f.evidence["remedy"] and "Try, in order" in f.evidence["advice"]
        config.update(f.config_overrides)  # what the restarted segment runs with
    assert offered == ["vllm_sleep_mode", "lower_vllm_gpu_memory_utilization", "gradient_checkpointing",
                       "low_bit_optimizer"]


def test_lint_sizes_the_ladder_and_climbs_it_until_the_run_fits():
    from tests.test_memory import QWEN25_7B, RECIPE

    cfg = dict(RECIPE, model_init_kwargs={"dtype": "bfloat16"}, use_vllm=True, vllm_mode="colocate",
               vllm_gpu_memory_utilization=0.5, gradient_checkpointing=False, max_completion_length=2048)
    details: dict = {}
    [f] = [f for f in lint(cfg, model=QWEN25_7B, num_devices=1, device_kind="cuda", device_memory_gib=80,
                           details=details) if f.detector == "config_memory"]
    ladder = details["estimate"].ladder
    assert [r["remedy"] for r in ladder][:4] == ["vllm_sleep_mode", "lower_vllm_gpu_memory_utilization",
                                                "gradient_checkpointing", "low_bit_optimizer"]
    peaks = [r["peak_bytes"] for r in ladder]
    assert peaks == sorted(peaks, reverse=True) and peaks[0] < details["estimate"].peak
    climbed = next(i for i, r in enumerate(ladder) if r["fits"])
    expected = {}
    for r in ladder[: climbed + 1]:
        expected.update(r["overrides"])
    assert f.config_overrides == expected and f.evidence["ladder"][0]["remedy"] == "vllm_sleep_mode"
    fixed = [g for g in lint(dict(cfg, **f.config_overrides), model=QWEN25_7B, num_devices=1, device_kind="cuda",
                             device_memory_gib=80) if g.detector == "config_memory" and g.severity == "critical"]
    assert fixed == []


# -- unified memory ----------------------------------------------------------------------------------------------

DECODE_HEAVY = {"use_vllm": True, "vllm_mode": "colocate", "max_completion_length": 2048, "bf16": True}


def _unified(facts, config=DECODE_HEAVY, **kwargs):
    from tests.test_memory import QWEN25_7B

    return [f for f in lint(config, model=QWEN25_7B, num_devices=1, device_kind="cuda", device_facts=facts, **kwargs)
            if f.detector == "config_unified_memory"]


def test_a_dgx_spark_is_known_by_what_its_device_reports_and_told_the_decode_bandwidth_caveat():
    # NVML reports no memory of its own on a GB10; torch reports the device as integrated.
    for facts in ({"name": "NVIDIA GB10", "memory_info": False}, {"name": "NVIDIA GB10"},
                  {"name": "GPU", "integrated": True, "memory_info": False}):
        [f] = _unified(facts)
        assert f.severity == "info" and f.config_overrides == {}
    [f] = _unified({"name": "NVIDIA GB10", "memory_info": False, "integrated": True})
    ev = f.evidence
    assert ev["kind"] == "gb10" and ev["bandwidth_gbs"] == 273.0
    assert set(ev["recognised_by"]) == {"device name 'NVIDIA GB10'", "torch reports an integrated device",
                                        "NVML reports no device memory of its own"}
    # 2 bytes per parameter of the served weights, read once per decoded token at 273 GB/s
    assert ev["decode_step_ms"] == pytest.approx(ev["weights_gb"] / 273.0 * 1e3, rel=1e-3)
    assert ev["rollout_s"] == pytest.approx(ev["decode_step_ms"] * 2048 / 1e3, rel=1e-3)
    assert "273 GB/s" in f.message and "decode" in f.message


def test_a_grace_hopper_is_told_where_its_slow_memory_is():
    [f] = _unified({"name": "NVIDIA GH200 480GB", "memory_info": True})
    assert f.evidence["kind"] == "grace_hopper" and f.evidence["rollout_s_from_cpu_memory"] > 5 * f.evidence["rollout_s"]
    assert "NVLink-C2C" in f.message and "HBM" in f.message


def test_no_caveat_for_a_discrete_gpu_short_rollouts_or_a_cpu_run():
    assert _unified({"name": "NVIDIA H100 80GB HBM3", "memory_info": True, "integrated": False}) == []
    assert _unified({"name": "NVIDIA GB10", "memory_info": False}, dict(DECODE_HEAVY, max_completion_length=512)) == []
    assert unified_memory({"name": "NVIDIA H200"}) is None and unified_memory(None) is None


def test_lint_of_a_run_directory_knows_the_gpu_its_header_recorded(tmp_path, monkeypatch):
    fake = FakeNVML(devices=[dataclasses.replace(GB10)], readings=[STARVED])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    train_tiny(tmp_path, steps=2, attach_options={"device_health": _watch_device_0(0.005)},
               max_completion_length=1024)
    header = read_run(tmp_path).header
    assert header["device"]["unified_memory"] == "gb10" and header["device"]["memory_info"] is False
    # The same header on the GPU recipe the run would have on the Spark (this one trained on the CPU).
    from grpo_monitor.core.runlog_writer import RunWriter
    from tests.test_memory import QWEN25_7B

    gpu_run = tmp_path / "spark"
    w = RunWriter(gpu_run)
    w.header(**{**header, "config": dict(DECODE_HEAVY, num_generations=8), "model": QWEN25_7B})
    w.close()
    findings, _ = lint_path(gpu_run)
    [f] = [f for f in findings if f.detector == "config_unified_memory"]
    assert f.evidence["kind"] == "gb10" and "NVML reports no device memory of its own" in f.evidence["recognised_by"]


def test_the_lint_cli_takes_the_device_by_name(tmp_path, capsys):
    from grpo_monitor.app.cli import main

    path = tmp_path / "recipe.json"
    path.write_text(json.dumps(dict(DECODE_HEAVY, num_generations=8)))
    code = main(["lint", str(path), "--device", "cuda", "--num-devices", "1", "--device-name", "NVIDIA GB10", "--json"])
    doc = json.loads(capsys.readouterr().out)
    [f] = [f for f in doc["findings"] if f["detector"] == "config_unified_memory"]
    assert f["evidence"]["kind"] == "gb10" and code in (0, 1)


# -- analyze --------------------------------------------------------------------------------------------------


def test_analyze_reports_the_devices_health_when_the_run_logged_it(tmp_path, monkeypatch):
    fake = FakeNVML(devices=[DeviceSpec()], readings=[THERMAL])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    train_tiny(tmp_path, steps=3, attach_options={"device_health": _watch_device_0(0.005)})
    report = analyze(tmp_path)
    device = report.runs[0].to_dict()["device"]
    assert device["name"] == "NVIDIA H100 80GB HBM3" and device["temp_max_c"] == 89
    assert device["throttle_steps"]["thermal"] == 1.0 and "hw_thermal_slowdown" in device["reasons_seen"]
    from grpo_monitor.analysis.render import render_markdown, render_text

    text = render_text(report)
    assert "device: NVIDIA H100 80GB HBM3" in text and "SM clock median 1185 MHz of 1980" in text
    assert "throttling: thermal on 100% of steps, hw on 100% of steps" in text
    assert "**Device: NVIDIA H100 80GB HBM3**" in render_markdown(report)
