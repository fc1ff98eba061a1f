"""Ingest speed of every log reader on a 100k-step, 30-metric run, and TensorBoard against its peers.

Writes one run in each supported format (our run directory, ``trainer_state.json``, a TensorBoard
event file written by ``torch.utils.tensorboard.SummaryWriter`` the way transformers'
TensorBoard callback writes it, a W&B-style CSV, a verl-style JSONL, and the console output of
``python train.py > train.log 2>&1`` with tqdm on, as transformers 5 prints it), times ``load_source`` on
each, times TensorBoard's own ``EventAccumulator`` and ``tbparse.SummaryReader`` on the same event
file, and times the end-to-end offline analysis per format: ``analysis.analyze.analyze`` (read +
replay of every detector + key curves) in this process, and ``grpo-monitor analyze PATH`` in a
fresh one (interpreter start, imports and the printed report included). The target (≤ 30 s for a 100k-step
run) is judged on the slower of the two. Results go to the ``ingest`` section of benchmarks/RESULTS.md.

    python benchmarks/ingest.py                 # the full run: ~10 minutes on 2 busy cores, most of it
                                                # EventAccumulator, tbparse and the detectors' replay
    python benchmarks/ingest.py --steps 5000 --no-results    # a quick look
    python benchmarks/ingest.py --workdir /tmp/ingest        # keep the logs; later runs reuse them
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.results import stamp, update_section  # noqa: E402
from grpo_monitor.core.runlog_writer import RunWriter  # noqa: E402
from grpo_monitor.readers import load_source  # noqa: E402

METRICS = [
    "loss", "grad_norm", "learning_rate", "num_tokens",
    "completions/mean_length", "completions/min_length", "completions/max_length", "completions/clipped_ratio",
    "completions/mean_terminated_length", "completions/min_terminated_length", "completions/max_terminated_length",
    "rewards/format_reward/mean", "rewards/format_reward/std", "rewards/correctness_reward/mean",
    "rewards/correctness_reward/std", "reward", "reward_std", "frac_reward_zero_std", "entropy",
    "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean", "clip_ratio/low_min", "clip_ratio/high_max",
    "kl", "step_time", "epoch",
    "sampling/importance_sampling_ratio/min", "sampling/importance_sampling_ratio/mean",
    "sampling/importance_sampling_ratio/max",
]
# verl's names for the metrics it has, as its file logger would write them
VERL = {"entropy": "actor/entropy", "completions/mean_length": "response_length/mean",
        "completions/max_length": "response_length/max", "completions/min_length": "response_length/min",
        "completions/clipped_ratio": "response_length/clip_ratio", "reward": "critic/score/mean",
        "grad_norm": "actor/grad_norm", "clip_ratio/region_mean": "actor/pg_clipfrac", "learning_rate": "actor/lr"}


def values(steps: int, n: int, seed: int = 0) -> np.ndarray:
    """Plausible curves: slow random walks around per-metric levels, positive, float64."""
    rng = np.random.default_rng(seed)
    walk = np.cumsum(rng.normal(0, 0.01, size=(steps, n)), axis=0)
    return np.abs(rng.uniform(0.1, 10, size=n) * np.exp(walk * 0.1) + rng.normal(0, 0.01, size=(steps, n)))


def write_all(d: Path, data: np.ndarray, summarywriter: bool = False, log=print) -> dict[str, Path]:
    steps = np.arange(1, len(data) + 1)
    rows = data.tolist()
    paths = {}

    t = time.perf_counter()
    run = d / "run"
    w = RunWriter(run)
    w.header(run_id="bench", start_time=time.time(), config={"logging_steps": 1}, model={"class": "Qwen3ForCausalLM"},
             world_size=1, parent_run=None, reward_funcs=["format_reward", "correctness_reward"],
             correctness_reward="correctness_reward", format_reward="format_reward", segment=0)
    for s, row in zip(steps.tolist(), rows):
        w.step(s, dict(zip(METRICS, row)), time=1.7e9 + s)
    w.close()
    paths["run_dir"] = run
    log(f"  run_dir written in {time.perf_counter() - t:.1f} s")

    t = time.perf_counter()
    history = [{**dict(zip(METRICS, row)), "step": s} for s, row in zip(steps.tolist(), rows)]
    history.append({"train_runtime": 1.0, "train_loss": 0.1, "total_flos": 0.0, "epoch": 1.0, "step": int(steps[-1])})
    state = {"global_step": int(steps[-1]), "logging_steps": 1, "max_steps": int(steps[-1]), "log_history": history}
    paths["trainer_state"] = d / "trainer_state.json"
    paths["trainer_state"].write_text(json.dumps(state, indent=2, sort_keys=True))  # as transformers saves it
    log(f"  trainer_state.json written in {time.perf_counter() - t:.1f} s")

    t = time.perf_counter()
    tb = d / "tb"
    tags = ["train/" + m for m in METRICS]
    if summarywriter:
        summary_writer_file(tb, steps.tolist(), rows, tags)
        how = "torch.utils.tensorboard.SummaryWriter"
    else:
        check_replica(d / "replica-check")
        replica_file(tb / "events.out.tfevents.1700000000.bench.1.0", steps.tolist(), rows, tags, 1.7e9)
        how = "SummaryWriter's exact records (checked byte for byte against SummaryWriter on a 200-step run), fast CRCs"
    (d / "tb-writer.txt").write_text(how)
    paths["tensorboard"] = tb
    log(f"  TensorBoard event file written in {time.perf_counter() - t:.1f} s ({how})")

    t = time.perf_counter()
    with open(d / "wandb_history.csv", "w") as fh:
        fh.write(",".join(["_step", "_runtime", "_timestamp", *["train/" + m for m in METRICS], "train/global_step"]) + "\n")
        for i, (s, row) in enumerate(zip(steps.tolist(), rows)):
            fh.write(f"{i},{s * 0.1!r},{1.7e9 + s!r}," + ",".join(map(repr, row)) + f",{s}\n")
    paths["csv"] = d / "wandb_history.csv"
    log(f"  CSV written in {time.perf_counter() - t:.1f} s")

    t = time.perf_counter()
    names = [VERL.get(m, m) for m in METRICS]
    with open(d / "metrics.jsonl", "w") as fh:
        for s, row in zip(steps.tolist(), rows):
            fh.write(json.dumps({"step": s, "data": dict(zip(names, row))}) + "\n")
    paths["jsonl"] = d / "metrics.jsonl"
    log(f"  JSONL written in {time.perf_counter() - t:.1f} s")

    t = time.perf_counter()
    paths["trl_console"] = d / "train.log"
    write_console(paths["trl_console"], steps.tolist(), rows)
    log(f"  console log written in {time.perf_counter() - t:.1f} s")
    return paths


def write_console(path: Path, steps: list[int], rows: list[list[float]]) -> None:
    """``python train.py > train.log 2>&1`` under transformers 5: tqdm's bar redrawn with ``\r`` at
    every step, and at every log the bar cleared and the metrics dict printed, floats as ``'%.4g'``."""
    total = steps[-1]
    with open(path, "w") as fh:
        fh.write("Loading checkpoint shards: 100%|##########| 2/2 [00:01<00:00,  1.20it/s]\n")
        fh.write("\x1b[33mUserWarning: the tokenizer has no padding token\x1b[0m\n")
        fh.write(f"\r  0%|          | 0/{total} [00:00<?, ?it/s]")
        for s, row in zip(steps, rows):
            pct = 100 * s // total
            fh.write(f"\r {pct:2d}%|####      | {s}/{total} [00:{s % 60:02d}<01:00,  3.10it/s]")
            fh.write("\r" + " " * 50 + "\r" + str({m: f"{v:.4g}" for m, v in zip(METRICS, row)}) + "\n")
        fh.write(str({"train_runtime": "3600", "train_samples_per_second": "2.5", "train_steps_per_second": "27.7",
                      "train_loss": "0.01", "epoch": "1"}) + "\n")


def summary_writer_file(folder: Path, steps: list[int], rows: list[list[float]], tags: list[str]) -> None:
    """The event file as transformers' TensorBoard callback writes it: one add_scalar per metric."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(str(folder))
        for s, row in zip(steps, rows):
            for tag, v in zip(tags, row):
                writer.add_scalar(tag, v, s)
        writer.close()


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def replica_file(path: Path, steps: list[int], rows: list[list[float]], tags: list[str], wall0: float) -> None:
    """The records SummaryWriter writes, built without its pure-Python CRC (which takes ~4 minutes
    for three million scalars here): CRCs are computed vectorised, per record length."""
    from grpo_monitor.readers.tensorboard import _masked_crc32c_rows

    pack_d, pack_f = struct.Struct("<d").pack, struct.Struct("<f").pack
    heads = [b"\x0a" + bytes([len(t)]) + t.encode() + b"\x15" for t in tags]
    writer = b"tensorboard.summary.writer.event_file_writer"
    source = b"\x0a" + bytes([len(writer)]) + writer
    events = [b"\x09" + pack_d(wall0) + b"\x1a\x0dbrain.Event:2" + b"\x52" + bytes([len(source)]) + source]
    for s, row in zip(steps, rows):
        stamp = b"\x09" + pack_d(wall0 + s * 1e-3) + b"\x10" + _varint(s)
        for head, v in zip(heads, row):
            value = head + pack_f(v)
            summary = b"\x0a" + bytes([len(value)]) + value
            events.append(stamp + b"\x2a" + bytes([len(summary)]) + summary)
    lengths = np.array([len(e) for e in events])
    crcs = np.empty(len(events), dtype=np.uint32)
    for n in np.unique(lengths):
        idx = np.flatnonzero(lengths == n)
        block = np.frombuffer(b"".join(events[i] for i in idx), dtype=np.uint8).reshape(len(idx), n)
        crcs[idx] = _masked_crc32c_rows(block)
    head_crcs = _masked_crc32c_rows(np.frombuffer(lengths.astype("<u8").tobytes(), dtype=np.uint8).reshape(-1, 8))
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(b"".join(
            struct.pack("<QI", len(e), int(hc)) + e + struct.pack("<I", int(c)) for e, hc, c in zip(events, head_crcs, crcs)
        ))


def check_replica(folder: Path, steps: int = 200) -> None:
    """The replica must equal SummaryWriter's file record for record, but for the wall times."""
    from tensorboard.summary.writer.record_writer import masked_crc32c

    data = values(steps, len(METRICS), seed=1).tolist()
    tags = ["train/" + m for m in METRICS]
    summary_writer_file(folder / "sw", list(range(1, steps + 1)), data, tags)
    replica_file(folder / "replica" / "events.out.tfevents.0", list(range(1, steps + 1)), data, tags, 1.7e9)

    def records(path: Path) -> list[bytes]:
        buf, pos, out = path.read_bytes(), 0, []
        while pos < len(buf):
            (n,) = struct.unpack_from("<Q", buf, pos)
            assert struct.unpack_from("<I", buf, pos + 8)[0] == masked_crc32c(buf[pos : pos + 8])
            rec = buf[pos + 12 : pos + 12 + n]
            assert struct.unpack_from("<I", buf, pos + 12 + n)[0] == masked_crc32c(rec), path
            out.append(rec[:1] + rec[9:])  # drop the wall time
            pos += n + 16
        return out

    ours = records(next((folder / "replica").glob("*tfevents*")))
    theirs = records(next((folder / "sw").glob("*tfevents*")))
    assert ours == theirs, "replica event file differs from SummaryWriter's"
    shutil.rmtree(folder)


def timed(fn, repeat: int = 1, every: list | None = None):
    best, out = math.inf, None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        secs = time.perf_counter() - t
        best = min(best, secs)
        if every is not None:
            every.append(secs)
    return best, out


def check(src, data: np.ndarray, fmt: str) -> None:
    """The benchmark only counts if every reader returns the run it was given."""
    assert len(src.steps) == len(data), (fmt, len(src.steps))
    for i in (0, len(data) // 2, len(data) - 1):
        step, metrics = src.steps[i]
        assert step == i + 1, (fmt, step)
        for m, v in zip(METRICS, data[i]):
            got = metrics[m]
            want = float(np.float32(v)) if fmt == "tensorboard" else float(f"{v:.4g}") if fmt == "trl_console" else v
            assert got == want, (fmt, step, m, got, want)


def event_accumulator(path: Path) -> int:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    guidance = {k: 0 for k in ("scalars", "tensors", "histograms", "images", "audio", "compressedHistograms")}
    acc = EventAccumulator(str(path), size_guidance=guidance)
    acc.Reload()
    return sum(len(acc.Scalars(tag)) for tag in acc.Tags()["scalars"])


def tbparse_scalars(path: Path) -> int:
    from tbparse import SummaryReader

    return len(SummaryReader(str(path)).scalars)


LOAD: list[str] = ["?"]
TARGET_S = 30.0  # a 100k-step run analysed end to end


def main(argv: list[str] | None = None) -> int:
    LOAD[0] = f"{os.getloadavg()[0]:.1f}"
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--workdir", help="keep the generated logs here (reused when already there)")
    ap.add_argument("--no-results", action="store_true", help="print only; leave RESULTS.md alone")
    ap.add_argument("--no-peers", action="store_true", help="skip EventAccumulator and tbparse")
    ap.add_argument("--repeat", type=int, default=3, help="end-to-end runs per format; the best counts (default 3)")
    ap.add_argument("--summarywriter", action="store_true",
                    help="write the whole event file with SummaryWriter (about 4 minutes more on 2 cores)")
    args = ap.parse_args(argv)

    data = values(args.steps, len(METRICS))
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="grpo-ingest-"))
    marker = work / f"complete-{args.steps}"
    try:
        if args.workdir and marker.exists():
            print(f"reusing logs in {work}")
            paths = {"run_dir": work / "run", "trainer_state": work / "trainer_state.json", "tensorboard": work / "tb",
                     "csv": work / "wandb_history.csv", "jsonl": work / "metrics.jsonl", "trl_console": work / "train.log"}
        else:
            if args.workdir and work.exists():
                shutil.rmtree(work)
            work.mkdir(parents=True, exist_ok=True)
            print(f"writing a {args.steps}-step, {len(METRICS)}-metric run in 6 formats to {work}")
            paths = write_all(work, data, summarywriter=args.summarywriter)
            marker.touch()

        how_file = work / "tb-writer.txt"
        tb_how = how_file.read_text() if how_file.exists() else "torch.utils.tensorboard.SummaryWriter"
        sizes = {f: sum(x.stat().st_size for x in ([p] if p.is_file() else p.rglob("*")) if x.is_file())
                 for f, p in paths.items()}
        load: dict[str, float] = {}
        for fmt, p in paths.items():
            secs, src = timed(lambda p=p: load_source(p), repeat=2)
            check(src, data, fmt)
            load[fmt] = secs
            print(f"load_source {fmt:14s} {secs:7.2f} s  ({sizes[fmt] / 1e6:.0f} MB)")

        peers: dict[str, float] = {}
        if not args.no_peers:
            events = len(METRICS) * args.steps
            secs, n = timed(lambda: event_accumulator(paths["tensorboard"]))
            assert n == events, n
            peers["EventAccumulator"] = secs
            print(f"EventAccumulator          {secs:7.2f} s")
            secs, n = timed(lambda: tbparse_scalars(paths["tensorboard"]))
            assert n == events, n
            peers["tbparse"] = secs
            print(f"tbparse.SummaryReader     {secs:7.2f} s")

        e2e: dict[str, float] = {}
        e2e_all: dict[str, list[float]] = {}
        cli: dict[str, float] = {}
        cli_all: dict[str, list[float]] = {}
        try:
            from grpo_monitor.analysis.analyze import analyze
        except ImportError:
            analyze = None
        for fmt, p in paths.items():
            if analyze is not None:
                e2e_all[fmt] = []
                secs, report = timed(lambda p=p: analyze(p), repeat=args.repeat, every=e2e_all[fmt])
                assert report.runs[0].steps == args.steps
            else:  # fall back to what analyze does: read, then replay every step through the engine
                from grpo_monitor.core.engine import Engine

                def replay(p=p):
                    src = load_source(p)
                    engine = Engine(src.context)
                    for step, metrics in src.steps:
                        engine.update(step, metrics, src.samples.get(step))

                secs, _ = timed(replay)
            e2e[fmt] = secs
            cli_all[fmt] = []
            cli[fmt], _ = timed(lambda p=p: subprocess.run([sys.executable, "-m", "grpo_monitor", "analyze", str(p)],
                                                            stdout=subprocess.DEVNULL, cwd=ROOT), repeat=2,
                                every=cli_all[fmt])
            runs = ", ".join(f"{x:.2f}" for x in e2e_all.get(fmt, []))
            print(f"end to end {fmt:14s}  {secs:7.2f} s  (runs: {runs}); CLI {cli[fmt]:.2f} s")
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)

    if not args.no_results:
        update_section("ingest", render(args.steps, load, peers, e2e, sizes, analyze is not None, tb_how, e2e_all, cli))
        print("updated benchmarks/RESULTS.md (ingest)")
    return 0


def render(steps: int, load: dict, peers: dict, e2e: dict, sizes: dict, have_analyze: bool, tb_how: str,
           e2e_all: dict | None = None, cli: dict | None = None) -> str:
    e2e_all, cli = e2e_all or {}, cli or {}
    uname = f"`uname -m`: {os.uname().machine}, `nproc`: {os.cpu_count()}"
    lines = [
        "## Log ingest (`benchmarks/ingest.py`)",
        "",
        f"{stamp()} · {uname} · load average {LOAD[0]} at the start, {os.getloadavg()[0]:.1f} at the end "
        f"(other work on the machine slows every row alike)",
        "",
        f"One run of {steps:,} logged steps × {len(METRICS)} metrics in each format; `load_source` best of 2, "
        f"end to end best of {max((len(v) for v in e2e_all.values()), default=1)} (every run listed: the machine's "
        f"other work moves single runs by up to half), peers timed once. TensorBoard file: `train/<key>` tags, one "
        f"event per scalar, as transformers writes it; written by {tb_how}. `analyze` replays every detector over every "
        f"step in one process (`Engine.replay`, the loop the live monitor runs).",
        "",
        "| format | size | `load_source` | end to end" + (" (`grpo_monitor.analyze`)" if have_analyze else " (read + `Engine` replay)")
        + " | every end-to-end run | of which after reading | `grpo-monitor analyze PATH` (a fresh process, best of 2) |",
        "|---|---|---|---|---|---|---|",
    ]
    for fmt in load:
        worst = max(e2e[fmt], cli.get(fmt, 0.0))
        ok = f" (target ≤ {TARGET_S:g} s: met)" if worst <= TARGET_S else f" (target ≤ {TARGET_S:g} s: NOT met)"
        replay = max(e2e[fmt] - load[fmt], 0.0)
        runs = ", ".join(f"{x:.2f}" for x in e2e_all.get(fmt, [])) or "—"
        shown = f"{cli[fmt]:.2f} s{ok}" if fmt in cli else "—"
        lines.append(f"| {fmt} | {sizes[fmt] / 1e6:.0f} MB | {load[fmt]:.2f} s | {e2e[fmt]:.2f} s | {runs} s "
                     f"| ≈ {replay:.1f} s | {shown} |")
    if peers:
        tb = load["tensorboard"]
        lines += ["", "TensorBoard ingest of the same event file:", "", "| reader | time | ours is faster by |", "|---|---|---|",
                  f"| `readers.load_source` | {tb:.2f} s | — |"]
        for name, secs in peers.items():
            target = " (target ≥ 3×)" if name == "tbparse" else ""
            met = "" if name != "tbparse" or secs / tb >= 3 else ": NOT met"
            lines.append(f"| {name} | {secs:.2f} s | **{secs / tb:.1f}×**{target}{met} |")
    if not have_analyze:
        lines += ["", "`analysis.analyze.analyze` was not available: end to end is `load_source` plus an `Engine` replay "
                  "of every step."]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
