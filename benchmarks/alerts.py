"""The monitor's blocking time per step with alerts to a webhook that never answers, against the
same run without alerts (tiny dense model, real GRPOTrainer).

A probe detector raises a new warning at every step on both sides, so every step of the alerting
side formats a message and hands it to the webhook's queue, whose sender thread is stuck on a
127.0.0.1 server that accepts connections and never answers (the worst case: every try waits for
its time-out, the queue fills, later messages are dropped). Runs alternate (without, with, ...)
so drift in the machine's load hits both sides alike; the monitor's time is timed inside its
callbacks, step by step, and the alerting side also inside the alert dispatcher (all the work the
alerts add to a step). Also timed alone: ``AlertDispatcher.on_step`` with one finding.
Target: the alerts add at most 1 ms to the monitor's blocking time per step.

    python benchmarks/alerts.py [--steps 30] [--pairs 4]
"""

from __future__ import annotations

import argparse
import gc
import socket
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.results import stamp, update_section  # noqa: E402
from benchmarks.timer import Timer, step_clock  # noqa: E402

WARMUP = 3


def silent_server() -> tuple[socket.socket, str]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1024)  # handshakes complete in the kernel; nothing ever reads or answers
    return s, f"http://127.0.0.1:{s.getsockname()[1]}/services/T0/B0/benchmark"


def probe_detector():
    from grpo_monitor.detectors.base import Detector, Finding

    class EveryStep(Detector):
        """A new warning at every step (each its own episode): the most alert traffic a run makes."""

        id = "alert_probe"

        def _reset_state(self):
            self.state = "ok"

        def update(self, step, metrics, samples=None):
            return [Finding(detector=f"alert_probe_{step}", severity="warning", step=step, onset_step=step, variant=None,
                            config_overrides={}, evidence={"step": step}, message="probe finding")]

    return EveryStep()


def one_run(url: str | None, steps: int, seed: int) -> tuple[float, float, float, float, float, int, int]:
    """Per step after warm-up: the median time inside the monitor's callbacks; inside the alert
    dispatcher the median, the mean, the largest, the largest over steps without a garbage
    collection in it, and how many steps had one; and the messages queued."""
    import transformers
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import GRPOConfig, GRPOTrainer

    from grpo_monitor.callbacks import attach
    from grpo_monitor.fixtures.tiny import REWARD_FUNCS, build_dataset, build_model, build_tokenizer
    from grpo_monitor.core.engine import default_detectors

    transformers.logging.set_verbosity_error()
    with tempfile.TemporaryDirectory() as tmp:
        args = GRPOConfig(output_dir=str(Path(tmp) / "out"), bf16=False, use_cpu=True, use_vllm=False, logging_steps=1,
                          max_completion_length=16, num_generations=8, per_device_train_batch_size=8, max_steps=steps,
                          report_to=[], save_strategy="no", seed=seed, disable_tqdm=True, dataloader_num_workers=0)
        trainer = GRPOTrainer(model=build_model(), reward_funcs=list(REWARD_FUNCS), args=args,
                              train_dataset=build_dataset(64), processing_class=build_tokenizer())
        for cb in (PrinterCallback, ProgressCallback):
            trainer.remove_callback(cb)
        options = {"alerts": url, "alerts_burst": 10_000, "alerts_per_minute": 1e6, "alerts_timeout": 5.0,
                   "alerts_flush_timeout": 0.1} if url else {"alerts": False}
        monitor_cb = attach(trainer, Path(tmp) / "run", detectors=[*default_detectors(), probe_detector()], **options)
        timer = Timer()
        timer.wrap_callback(monitor_cb)
        clock = step_clock()
        trainer.add_callback(clock)
        alerts_timer = Timer()
        collected: list[float] = []  # start times of dispatcher calls during which the collector ran
        sender = {}

        class Peek(TrainerCallback):
            """After the monitor's own on_train_begin: time the dispatcher it built, step by step."""

            def on_train_begin(self, args, state, control, **kwargs):
                d = monitor_cb.alerts
                if d is not None:
                    timed = alerts_timer.wrap(d.on_step)

                    def on_step(*a, **k):
                        before = sum(g["collections"] for g in gc.get_stats())
                        t = time.perf_counter()
                        timed(*a, **k)
                        if sum(g["collections"] for g in gc.get_stats()) != before:
                            collected.append(t)

                    d.on_step = on_step
                    sender["s"] = d.webhook

        trainer.add_callback(Peek())
        trainer.train()
    marks = clock.marks
    spans = list(zip(marks, marks[1:]))[WARMUP:]
    per_step = [timer.within(a, b) for a, b in spans]
    in_alerts = [alerts_timer.within(a, b) for a, b in spans]
    # A garbage collection that happens to start inside the dispatcher pauses the step wherever it
    # lands; the largest step is also given without those.
    calm = [alerts_timer.within(a, b) for a, b in spans if not any(a <= t < b for t in collected)]
    gc_steps = len(in_alerts) - len(calm)
    s = sender.get("s")
    queued = (steps - s.dropped_total) if s is not None else 0
    return (statistics.median(per_step), statistics.median(in_alerts), statistics.fmean(in_alerts), max(in_alerts),
            max(calm) if calm else 0.0, gc_steps, queued)


def dispatcher_cost(n: int = 20000) -> float:
    """Seconds per ``on_step`` with one new finding, the webhook sender stuck on a silent server."""
    from grpo_monitor.alerts import AlertDispatcher, WebhookSender

    sock, url = silent_server()
    d = AlertDispatcher([], WebhookSender(url, burst=10 ** 9, per_minute=1e9, timeout=5.0), flush_timeout=0.1)
    t = time.perf_counter()
    for i in range(n):
        d.on_step(i, {}, [{"detector": f"p{i}", "severity": "warning", "step": i, "onset_step": i, "variant": None,
                           "config_overrides": {}, "evidence": {"x": 1.0}, "message": "m"}], [])
    cost = (time.perf_counter() - t) / n
    d.close()
    sock.close()
    return cost


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--pairs", type=int, default=4)
    opts = p.parse_args()
    warnings.filterwarnings("ignore")
    sock, url = silent_server()
    one_run(None, 6, 0)  # import and cache warm-up, not measured
    without, with_, queued, inside, worst = [], [], [], [], []
    means, calm_worst, gc_steps = [], [], []
    for i in range(opts.pairs):
        for flag in ((False, True) if i % 2 == 0 else (True, False)):
            t, a, mean, w, cw, g, q = one_run(url if flag else None, opts.steps, seed=i)
            (with_ if flag else without).append(t)
            if flag:
                inside.append(a)
                worst.append(w)
                means.append(mean)
                calm_worst.append(cw)
                gc_steps.append(g)
                queued.append(q)
        print(f"pair {i + 1}: monitor blocking without alerts {without[-1] * 1e3:.3f} ms/step, with alerts to a silent "
              f"server {with_[-1] * 1e3:.3f} ms/step, of which in the alert dispatcher {inside[-1] * 1e3:.3f} ms "
              f"(largest step {worst[-1] * 1e3:.3f} ms)", flush=True)
    sock.close()
    diffs = [w - wo for w, wo in zip(with_, without)]
    paired = statistics.median(diffs)
    own = statistics.median(inside)
    alone = dispatcher_cost()
    met = own <= 1e-3 and max(means) <= 1e-3  # the per-step cost; single slow steps are shown below it
    body = (
        "## Alerts: blocking time with a webhook that never answers (`benchmarks/alerts.py`)\n\n"
        f"{stamp()}\n\n"
        f"Tiny dense Qwen3 GRPO run (8 completions of ≤ 16 tokens per step), {opts.pairs} interleaved pairs of "
        f"{opts.steps}-step runs (first {WARMUP} steps of each excluded), all detectors plus a probe raising a new "
        "warning at every step, so every step sends an alert. The alerting side posts to a 127.0.0.1 server that "
        "accepts connections and never answers; the other has `alerts=False`. Times are per step, inside the "
        "monitor's callbacks and, on the alerting side, inside the alert dispatcher the callback calls.\n\n"
        "| | per step |\n|---|---|\n"
        f"| monitor's blocking time without alerts (median) | {statistics.median(without) * 1e3:.3f} ms |\n"
        f"| monitor's blocking time with alerts to a silent server (median) | {statistics.median(with_) * 1e3:.3f} ms |\n"
        f"| **time the alerts add: inside the dispatcher, median / mean** | **{own * 1e3:.3f} ms / "
        f"{statistics.fmean(means) * 1e3:.3f} ms** (target within 1 ms: {'met' if met else 'NOT met'}) |\n"
        f"| largest step inside the dispatcher, steps without a garbage collection in it | {max(calm_worst) * 1e3:.3f} ms |\n"
        f"| largest step inside the dispatcher, all steps | {max(worst) * 1e3:.3f} ms "
        f"({sum(gc_steps)} step(s) had a collection start inside it) |\n"
        f"| median of the per-pair differences of the blocking time | {paired * 1e3:+.3f} ms |\n"
        f"| `AlertDispatcher.on_step` alone, one finding, sender stuck | {alone * 1e6:.1f} µs per call |\n\n"
        "The dispatcher's time is the alerts' whole cost to the step: a message is formatted and put on the "
        "sender's queue, and the network waits happen on the sender's own thread. The per-pair differences of the "
        "monitor's total blocking time, which also carry the run-to-run noise of this shared machine: "
        f"{', '.join(f'{d * 1e3:+.3f}' for d in diffs)} ms. Messages handed to "
        f"the queue per alerting run: {', '.join(str(q) for q in queued)} of {opts.steps} (a full queue drops, never "
        "waits). At train end the sender gets `alerts_flush_timeout` (default 5 s) to deliver what is queued; "
        "this run set it to 0.1 s. Single slow steps are shown as measured and not judged: on this shared 2-core "
        "machine the system can deschedule the training thread anywhere, and the sender thread competes for the "
        "interpreter lock while it prepares a request.\n"
    )
    update_section("alerts", body)
    print(f"alerts add {own * 1e3:.3f} ms/step median, {statistics.fmean(means) * 1e3:.3f} ms mean (largest "
          f"{max(calm_worst) * 1e3:.3f} ms without a collection, {max(worst) * 1e3:.3f} ms with); per-pair difference of the "
          f"blocking time {paired * 1e3:+.3f} ms; on_step alone {alone * 1e6:.1f} us")


if __name__ == "__main__":
    main()
