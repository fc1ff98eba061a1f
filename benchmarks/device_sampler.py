"""The NVML sampler's blocking time on the training thread (``callbacks.device_health``, ``core.device``).

What the device part does on the training thread at each log is ``DeviceHealth.collect``: take the sampler's
window under a lock and turn it into a dozen numbers, plus the generation share; NVML itself is only called
from the sampler's own thread. Two measurements:

* **A real tiny GRPO run** (dense Qwen3, 8 completions of <= 16 tokens per step, CPU) with
  ``attach(trainer, device_health=DeviceOptions(device=0))``: every call of the part on the training thread (``start`` at train
  begin, ``collect`` at each log, ``stop`` at the end) is timed, against the step time. The sampler reads
  every 10 ms here (a hundred times its default rate), so every logged step has a full window to sum up.
* **``collect`` alone**, ``--calls`` times, while the sampler thread reads every 1 ms: the window's cost
  with the lock contended, and one reading's cost on the sampler thread.

No GPU is at hand where this was written: NVML is ``fixtures.nvml`` (a ``pynvml`` stand-in built from
NVML's documented structures), put in ``sys.modules["pynvml"]``. The stand-in answers in Python, so a
reading here costs what its Python does, not what the driver does; the training thread's share does not
depend on it (it never calls NVML). On a GPU, run ``python benchmarks/device_sampler.py --real-nvml`` to
use the installed ``nvidia-ml-py`` and the first GPU instead.

    python benchmarks/device_sampler.py [--steps 40] [--calls 20000] [--real-nvml] [--no-results]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import types
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.results import stamp, update_section  # noqa: E402
from benchmarks.timer import Timer, step_clock  # noqa: E402

WARMUP = 3


def install_nvml(real: bool) -> str:
    if real:
        import pynvml  # noqa: F401  (nvidia-ml-py, the `gpu` extra)

        return "nvidia-ml-py on this machine's GPU 0"
    from grpo_monitor.fixtures.nvml import FakeNVML, throttling_episode

    sys.modules["pynvml"] = FakeNVML(readings=throttling_episode(start=50, length=50))
    return "the NVML stand-in (fixtures.nvml)"


def run_tiny(steps: int, interval: float) -> dict[str, float]:
    import transformers

    from grpo_monitor import DeviceOptions, attach
    from grpo_monitor.app.demo import build_trainer, demo_config

    transformers.logging.set_verbosity_error()
    with tempfile.TemporaryDirectory() as tmp:
        trainer = build_trainer(demo_config(Path(tmp) / "out", steps))
        trainer.remove_callback(transformers.trainer_callback.PrinterCallback)  # no log dict printed per step
        cb = attach(trainer, Path(tmp) / "run", device_health=DeviceOptions(device=0, interval_s=interval))
        timer = Timer()
        for name in ("start", "collect", "stop"):
            setattr(cb.device, name, timer.wrap(getattr(cb.device, name)))
        marks = step_clock()
        trainer.add_callback(marks)
        trainer.train()
        logged = _steps(Path(tmp) / "run")
    ends = marks.marks  # each step's end; the step's log (and its collect) falls in the gap after it
    gaps = [(ends[i - 1], ends[i]) for i in range(WARMUP + 1, len(ends))]
    per_step = [timer.within(a, b) for a, b in gaps]
    step_s = [b - a for a, b in gaps]
    start_s = timer.calls[0][1] if timer.calls else 0.0
    windows = [m.get("system/gpu_samples") for m in logged if m.get("system/gpu_samples")]
    return {"step_s": statistics.median(step_s), "collect_s": statistics.median(per_step), "collect_max_s": max(per_step),
            "share": statistics.median(c / s for c, s in zip(per_step, step_s)), "start_s": start_s,
            "readings_per_step": statistics.median(windows) if windows else 0.0, "steps": len(step_s)}


def _steps(run_dir: Path) -> list[dict]:
    from grpo_monitor import read_run

    return [r["metrics"] for r in read_run(run_dir).steps]


def collect_alone(calls: int) -> dict[str, float]:
    from grpo_monitor.callbacks.device_health import DeviceHealth
    from grpo_monitor.callbacks.options import DeviceOptions

    trainer = types.SimpleNamespace(_generate=lambda prompts: prompts)
    part = DeviceHealth(trainer, DeviceOptions(interval_s=0.001, device=0))
    assert part.start() is not None, "no NVML device to sample"
    try:
        times = []
        for _ in range(calls):
            trainer._generate([])
            t = time.perf_counter()
            part.collect()
            times.append(time.perf_counter() - t)
            time.sleep(0.0002)  # let the sampler thread add readings between logs
        device = part.sampler.device
        reads = []
        for _ in range(200):
            t = time.perf_counter()
            device.read()
            reads.append(time.perf_counter() - t)
    finally:
        part.stop()
    times.sort()
    return {"median_s": statistics.median(times), "p99_s": times[int(0.99 * len(times))], "max_s": times[-1],
            "read_s": statistics.median(reads)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--interval", type=float, default=0.01, help="sampling interval in the tiny run, seconds")
    p.add_argument("--real-nvml", action="store_true", help="the installed nvidia-ml-py and GPU 0, not the stand-in")
    p.add_argument("--no-results", action="store_true", help="print only; leave benchmarks/RESULTS.md as it is")
    opts = p.parse_args()
    warnings.filterwarnings("ignore")
    nvml = install_nvml(opts.real_nvml)
    run = run_tiny(opts.steps, opts.interval)
    alone = collect_alone(opts.calls)
    us = 1e6
    body = (
        "## NVML sampler: blocking time on the training thread (`benchmarks/device_sampler.py`)\n\n"
        f"{stamp()}\n\n"
        f"NVML: {nvml}. **No GPU was available for this measurement**: the stand-in answers NVML's queries from "
        "NVML's documented structures in Python, so the sampler thread's cost per reading below is the stand-in's, "
        "not the driver's; what the training thread pays does not involve NVML at all (it only takes the window "
        "the sampler thread filled). Rerun with `--real-nvml` on a GPU for the driver's figures.\n\n"
        f"Tiny dense Qwen3 GRPO run on the CPU ({run['steps']} timed steps, first {WARMUP} excluded), "
        f"`attach(trainer, device_health=DeviceOptions(device=0, interval_s={opts.interval:g}))`: the sampler reads every "
        f"{opts.interval * 1e3:g} ms (the default is 1 s), {run['readings_per_step']:.0f} readings per logged step.\n\n"
        "| on the training thread | time | share of the tiny CPU step | of a 1 s GPU step | of the H200's 2.3 s step |\n"
        "|---|---|---|---|---|\n"
        f"| `collect` per logged step (median) | {run['collect_s'] * us:.1f} µs | {100 * run['share']:.3f} % of "
        f"{run['step_s'] * 1e3:.1f} ms | **{100 * run['collect_s']:.4f} %** | {100 * run['collect_s'] / 2.3:.4f} % |\n"
        f"| `collect`, largest step | {run['collect_max_s'] * us:.1f} µs | | {100 * run['collect_max_s']:.4f} % | |\n"
        f"| `start` at train begin, once (NVML init, the device's facts) | {run['start_s'] * 1e3:.2f} ms | | | |\n\n"
        "Target: within 0.1 % of a step. A GRPO step on a GPU takes seconds (`gpu_overhead`: 2.3–5 s on an H200 for "
        "0.6B-class models); the tiny CPU model's step is a few tens of milliseconds, so its share is shown for scale, "
        "not as the target's step.\n\n"
        f"`collect` alone, {opts.calls} calls with the sampler thread reading every 1 ms (the lock contended): "
        f"median {alone['median_s'] * us:.1f} µs, 99th percentile {alone['p99_s'] * us:.1f} µs, largest "
        f"{alone['max_s'] * us:.1f} µs. One reading on the sampler thread (ten NVML queries to the stand-in) takes "
        f"{alone['read_s'] * us:.1f} µs, once a second by default.\n"
    )
    print(body)
    if not opts.no_results:
        update_section("device_sampler", body)


if __name__ == "__main__":
    main()
