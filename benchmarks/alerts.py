"""The training thread's blocking time at finding steps with alerts on: the four trackers (W&B
offline, trackio, TensorBoard, a local MLflow store) and a webhook that never answers, against the
same run reporting to the same trackers with ``alerts=False`` (tiny dense model, real GRPOTrainer).

A probe detector raises a new warning at every step on both sides, so every step is a finding step:
the alerting side formats the episode's message, hands it to each tracker sink and to the webhook's
queue, and hands the trackers a new findings table and verdict (the most alert traffic a run makes).
The webhook's sender is stuck on a 127.0.0.1 server that accepts connections and never answers.
Runs alternate (without, with, ...) so drift in the machine's load hits both sides alike. Timed on
the training thread: the monitor's callbacks and, inside them, the alert dispatcher (all the work
the alerts add to a step); timed on the trackers' worker thread: each sink call (what the step
would wait for if the sinks were called on it). Target: the dispatcher blocks a finding step for
at most 5 ms.

    python benchmarks/alerts.py [--steps 30] [--pairs 3]
"""

from __future__ import annotations

import argparse
import gc
import os
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
TRACKERS = ["wandb", "trackio", "tensorboard", "mlflow"]
TARGET = 5e-3


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


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def one_run(url: str | None, steps: int, seed: int, root: Path) -> dict:
    """Per step after warm-up: the time inside the monitor's callbacks; inside the alert dispatcher
    (and whether a garbage collection started inside it); the sinks' own calls on their thread."""
    import transformers
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import GRPOConfig, GRPOTrainer

    from grpo_monitor.alerts import AlertOptions
    from grpo_monitor.callbacks import attach
    from grpo_monitor.core.engine import default_detectors
    from grpo_monitor.fixtures.tiny import REWARD_FUNCS, build_dataset, build_model, build_tokenizer

    transformers.logging.set_verbosity_error()
    out = root / f"run-{seed}-{'alerts' if url else 'quiet'}"
    args = GRPOConfig(output_dir=str(out), bf16=False, use_cpu=True, use_vllm=False, logging_steps=1,
                      max_completion_length=16, num_generations=8, per_device_train_batch_size=8, max_steps=steps,
                      report_to=TRACKERS, save_strategy="no", seed=seed, disable_tqdm=True, dataloader_num_workers=0,
                      run_name=out.name, project="alerts-benchmark")
    trainer = GRPOTrainer(model=build_model(), reward_funcs=list(REWARD_FUNCS), args=args,
                          train_dataset=build_dataset(64), processing_class=build_tokenizer())
    for cb in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(cb)
    options = {"alerts": AlertOptions(to=url, burst=10_000, per_minute=1e6, timeout=5.0, flush_timeout=0.5)
               if url else False}
    monitor_cb = attach(trainer, out / "grpo-monitor", detectors=[*default_detectors(), probe_detector()], **options)
    timer, tb_timer = Timer(), Timer()
    timer.wrap_callback(monitor_cb)
    # The callback's own per-step TensorBoard scalars (not the alerts): shown beside them.
    monitor_cb.tensorboard.write = tb_timer.wrap(monitor_cb.tensorboard.write)
    clock = step_clock()
    trainer.add_callback(clock)
    alerts_timer, sink_timer = Timer(), Timer()
    collected: list[float] = []  # start times of dispatcher calls during which the collector ran
    found: dict = {}

    class Peek(TrainerCallback):
        """After the monitor's own on_train_begin: time the dispatcher it built and its sinks."""

        def on_train_begin(self, args, state, control, **kwargs):
            d = monitor_cb.alerts
            if d is None:
                return
            timed = alerts_timer.wrap(d.on_step)

            def on_step(*a, **k):
                before = sum(g["collections"] for g in gc.get_stats())
                t = time.perf_counter()
                timed(*a, **k)
                if sum(g["collections"] for g in gc.get_stats()) != before:
                    collected.append(t)

            d.on_step = on_step
            for sink in d.sinks:
                for method in ("event", "summary"):
                    setattr(sink, method, sink_timer.wrap(getattr(sink, method)))
            found["dispatcher"] = d
            found["sinks"] = [s.name for s in d.sinks]

    trainer.add_callback(Peek())
    trainer.train()
    import wandb

    wandb.finish()  # the next run opens its own
    marks = clock.marks
    spans = list(zip(marks, marks[1:]))[WARMUP:]
    result = {"monitor": [timer.within(a, b) for a, b in spans], "tensorboard": [tb_timer.within(a, b) for a, b in spans]}
    d = found.get("dispatcher")
    if d is not None:
        result["dispatcher"] = [alerts_timer.within(a, b) for a, b in spans]
        result["calm"] = [alerts_timer.within(a, b) for a, b in spans if not any(a <= t < b for t in collected)]
        result["sink_calls"] = [dur for _, dur in sink_timer.calls]
        result["sinks"] = found["sinks"]
        report = d.delivery_report or d.delivery()
        result["webhook"] = report["destinations"][0]
    return result


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--pairs", type=int, default=3)
    opts = p.parse_args()
    warnings.filterwarnings("ignore")
    root = Path(tempfile.mkdtemp(prefix="alerts-bench-"))
    os.environ.update(WANDB_MODE="offline", WANDB_DIR=str(root), WANDB_SILENT="true", TRACKIO_DIR=str(root / "trackio"),
                      MLFLOW_TRACKING_URI=f"file:{root / 'mlruns'}", MLFLOW_ALLOW_FILE_STORE="true",
                      TENSORBOARD_LOGGING_DIR=str(root / "tb"), HF_HUB_OFFLINE="1")
    for k in [k for k in os.environ if k.startswith("GRPO_MONITOR_")]:
        del os.environ[k]
    sock, url = silent_server()
    one_run(None, 6, 0, root)  # import and cache warm-up, not measured
    without, with_ = [], []
    for i in range(opts.pairs):
        for flag in ((False, True) if i % 2 == 0 else (True, False)):
            r = one_run(url if flag else None, opts.steps, seed=i, root=root)
            (with_ if flag else without).append(r)
        w = with_[-1]
        print(f"pair {i + 1}: monitor blocking without alerts {statistics.median(without[-1]['monitor']) * 1e3:.3f} ms/step, "
              f"with {statistics.median(w['monitor']) * 1e3:.3f} ms/step, of which in the alert dispatcher "
              f"{statistics.median(w['dispatcher']) * 1e3:.3f} ms (largest {max(w['dispatcher']) * 1e3:.3f} ms); "
              f"sink calls on their thread: median {statistics.median(w['sink_calls']) * 1e3:.1f} ms, "
              f"largest {max(w['sink_calls']) * 1e3:.1f} ms", flush=True)
    sock.close()
    inside = [x for r in with_ for x in r["dispatcher"]]
    calm = [x for r in with_ for x in r["calm"]]
    sinks = [x for r in with_ for x in r["sink_calls"]]
    mon_without = statistics.median([x for r in without for x in r["monitor"]])
    mon_with = statistics.median([x for r in with_ for x in r["monitor"]])
    tb_own = statistics.median([x for r in without + with_ for x in r["tensorboard"]])
    med, p95, worst, calm_worst = statistics.median(inside), percentile(inside, 0.95), max(inside), max(calm)
    met = med <= TARGET and p95 <= TARGET
    gc_steps = len(inside) - len(calm)
    webhooks = [r["webhook"] for r in with_]
    body = (
        "## Alerts: blocking at finding steps, four trackers and a webhook that never answers (`benchmarks/alerts.py`)\n\n"
        f"{stamp()}\n\n"
        f"Tiny dense Qwen3 GRPO run (8 completions of ≤ 16 tokens per step) reporting to {', '.join(TRACKERS)} (W&B "
        f"offline, a local MLflow store), {opts.pairs} interleaved pairs of {opts.steps}-step runs (first {WARMUP} steps "
        "of each excluded), all detectors plus a probe raising a new warning at every step, so every step is a finding "
        "step: the alerting side sends each tracker an alert and a new findings table and verdict, and a webhook "
        "message to a 127.0.0.1 server that accepts connections and never answers; the other side has `alerts=False` "
        f"(the trackers' own integrations run on both). {len(inside)} finding steps measured.\n\n"
        "| | per finding step |\n|---|---|\n"
        f"| **time the alerts block the training thread: inside the dispatcher, median / p95** | **{med * 1e3:.3f} ms / "
        f"{p95 * 1e3:.3f} ms** (target within {TARGET * 1e3:.0f} ms: {'met' if met else 'NOT met'}) |\n"
        f"| largest step inside the dispatcher, steps without a garbage collection in it | {calm_worst * 1e3:.3f} ms |\n"
        f"| largest step inside the dispatcher, all steps | {worst * 1e3:.3f} ms ({gc_steps} step(s) had a collection "
        "start inside it) |\n"
        f"| the sinks' own calls, on their worker thread: median / p95 / largest | {statistics.median(sinks) * 1e3:.1f} ms / "
        f"{percentile(sinks, 0.95) * 1e3:.1f} ms / {max(sinks) * 1e3:.1f} ms ({len(sinks)} calls) |\n"
        f"| monitor's blocking time per step, without alerts / with (median) | {mon_without * 1e3:.3f} ms / "
        f"{mon_with * 1e3:.3f} ms |\n"
        f"| of which the callback's own TensorBoard scalars, on both sides (median) | {tb_own * 1e3:.3f} ms |\n\n"
        "The sinks' calls are what a finding step waited for when the sinks were called on the training thread (W&B "
        "building and logging a table, MLflow writing tags and artifacts); they now run on the trackers' worker thread, "
        "which writes only the latest findings table when several are pending. The dispatcher's time is what is left on "
        "the step: the message formatted, handed to the worker and put on the webhook's queue. The monitor's blocking "
        "time beside it is about the same on both sides: with four trackers it is mostly the trackers' own threads "
        "competing for the interpreter lock (without trackers the callbacks take under 1 ms a step: 'Monitor overhead' "
        "above), the callback's "
        "own TensorBoard scalars for every detector's state, and the run-to-run noise of this shared 2-core machine. "
        "Webhook messages per alerting run: "
        + ", ".join(f"{w['messages']} ({w['unconfirmed']} sent without an answer, {w['unsent']} unsent at the flush)"
                    for w in webhooks)
        + " — every one counted, none waited for; the flush at the end was given 0.5 s "
        "(`alerts_flush_timeout`, default 5 s).\n"
    )
    update_section("alerts", body)
    print(f"dispatcher at finding steps: median {med * 1e3:.3f} ms, p95 {p95 * 1e3:.3f} ms, largest {worst * 1e3:.3f} ms "
          f"({calm_worst * 1e3:.3f} ms without a collection); sink calls on their thread median "
          f"{statistics.median(sinks) * 1e3:.1f} ms, largest {max(sinks) * 1e3:.1f} ms; target {'met' if met else 'NOT met'}")


if __name__ == "__main__":
    main()
