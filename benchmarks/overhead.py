"""Step time of a real GRPO run with and without the monitor attached (tiny dense model).

Runs alternate (without, with, without, with, ...) in one process so drift in machine load hits
both sides alike; each run trains ``--steps`` steps and its mean step time excludes the first
steps (warm-up). The ratio of the medians goes into benchmarks/RESULTS.md. Target: ≤ 1.02.

    python benchmarks/overhead.py [--steps 40] [--pairs 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.results import stamp, update_section  # noqa: E402

WARMUP = 5


def one_run(with_monitor: bool, steps: int, seed: int) -> float:
    import transformers
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from callbacks import attach
    from monitor.demo import build_trainer, demo_config

    class StepClock(TrainerCallback):
        def __init__(self):
            self.marks = []

        def on_step_end(self, args, state, control, **kwargs):
            self.marks.append(time.perf_counter())

    transformers.logging.set_verbosity_error()
    with tempfile.TemporaryDirectory() as tmp:
        # REFERENCE's measured shape: 16 completions of <= 24 tokens per step on the random-init model.
        args = demo_config(Path(tmp) / "trainer", steps, seed=seed, disable_tqdm=True,
                           per_device_train_batch_size=16, max_completion_length=24)
        trainer = build_trainer(args, warm_start=0)
        for cb in (PrinterCallback, ProgressCallback):
            trainer.remove_callback(cb)
        if with_monitor:
            attach(trainer, Path(tmp) / "run")
        clock = StepClock()
        trainer.add_callback(clock)  # after the monitor, so each mark includes the monitor's own work
        trainer.train()
    gaps = [b - a for a, b in zip(clock.marks, clock.marks[1:])][WARMUP:]
    return statistics.fmean(gaps)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--pairs", type=int, default=5)
    opts = p.parse_args()
    warnings.filterwarnings("ignore")
    one_run(False, 8, 0)  # import and cache warm-up, not measured
    base, mon = [], []
    for i in range(opts.pairs):
        order = (False, True) if i % 2 == 0 else (True, False)
        for flag in order:
            (mon if flag else base).append(one_run(flag, opts.steps, seed=i))
        print(f"pair {i + 1}: without {base[-1] * 1e3:.2f} ms/step, with {mon[-1] * 1e3:.2f} ms/step", flush=True)
    b, m = statistics.median(base), statistics.median(mon)
    ratio = m / b
    body = (
        "## Monitor overhead (`benchmarks/overhead.py`)\n\n"
        f"{stamp()}\n\n"
        f"Tiny dense Qwen3 GRPO run (random init, 16 completions of ≤ 24 tokens per step), "
        f"{opts.pairs} interleaved pairs of {opts.steps}-step runs "
        f"(first {WARMUP} steps of each excluded), logging every step, reward tap and all detectors on.\n\n"
        "| | median step time |\n|---|---|\n"
        f"| without monitor | {b * 1e3:.2f} ms |\n| with monitor | {m * 1e3:.2f} ms |\n"
        f"| **ratio** | **{ratio:.3f}** (target ≤ 1.02: {'met' if ratio <= 1.02 else 'NOT met'}) |\n\n"
        f"Per-run figures — without: {', '.join(f'{x * 1e3:.1f}' for x in base)} ms; "
        f"with: {', '.join(f'{x * 1e3:.1f}' for x in mon)} ms.\n"
    )
    update_section("overhead", body)
    print(f"ratio with/without = {ratio:.3f}")


if __name__ == "__main__":
    main()
