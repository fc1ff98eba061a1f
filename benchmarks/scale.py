"""The monitor at production scale, without a model: what it costs per step at 256-8,192 completions.

A real ``MonitorCallback`` is built on a stand-in trainer (no model, no generation): its
``RewardTap``-wrapped reward functions are called the way TRL 1.16's ``_calculate_rewards`` calls
them (keyword arguments ``prompts``, ``completions``, ``completion_ids`` for the whole generation
batch of the rank, plus ``trainer_state``, ``log_extra``, ``log_metric``), then ``on_log`` gets
TRL's metric dict for the step. Completions are synthetic text (about 4 characters per token)
with log-normal token lengths, a few percent truncated at the cap, and a share that loops in its
last 3k tokens; 16 completions per group.

Shapes (completions per step x typical tokens):  S = 256 x ~1k,  M = 1,024 x ~4k,  L = 8,192 x ~8k.
Each shape runs in one process (the whole step batch on one rank) and in two (torchrun, gloo:
each rank generates half of the step's completions and the ranks exchange their numbers).

Reported per shape and variant: the monitor's blocking time per step (time inside the wrapped
reward functions beyond the functions themselves, plus ``on_log``), p50 and p99; bytes written to
the run directory per step; bytes each rank sends in the exchange per step (and per completion);
RSS growth from the end of the first step to the last. Results go into benchmarks/RESULTS.md.

    python benchmarks/scale.py                       # S, M, L; 300 steps; 1 and 2 processes
    python benchmarks/scale.py --shapes S --steps 20 --ranks 1      # a smoke run
    python benchmarks/scale.py --shapes L --ranks 1 --keep-run /tmp/L-run   # keep the run for scale_readers.py
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.results import stamp, update_section  # noqa: E402

SHAPES = {  # completions per step, median tokens, token cap
    "S": (256, 1024, 2048),
    "M": (1024, 4096, 8192),
    "L": (8192, 8192, 16384),
}
NUM_GENERATIONS = 16
LOOP_SHARE = 0.05  # completions that loop in their last 3k tokens
CHARS_PER_TOKEN = 4
WARMUP = 3  # first steps left out of the timings (imports on first use, the ranks meeting)
# The model's own work between scoring a batch and logging the step (forward, backward, optimizer:
# GPU work that releases the interpreter), simulated by sleeping. Real steps at these shapes take
# tens of seconds to minutes; these are far shorter, so the overlap they allow is a lower bound.
MODEL_STEP_S = {"S": 0.1, "M": 0.3, "L": 1.0}
EOS, PAD = 2, 0
TARGETS = {"S": 25.0, "M": 100.0, "L": 500.0}  # p50 blocking ms
WRITE_TARGETS = {"M": 0.5e6, "L": 2e6}  # bytes per step, default retention


def rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Corpus:
    """Text and token ids to cut completions from: slices of one long random text, so every
    completion is distinct and making one costs a copy."""

    def __init__(self, seed: int, chars: int = 8 << 20) -> None:
        rng = random.Random(seed)
        words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 7))) for _ in range(5000)]
        out, n = [], 0
        while n < chars:
            w = rng.choice(words)
            out.append(w)
            n += len(w) + 1
        self.text = " ".join(out)
        self.ids = [rng.randrange(10, 150_000) for _ in range(1 << 16)]
        self.loop = " ".join(rng.choice(words) for _ in range(40)) + " "

    def completion(self, rng: random.Random, tokens: int, loops: bool) -> str:
        chars = tokens * CHARS_PER_TOKEN
        start = rng.randrange(0, len(self.text) - chars - 1)
        if not loops:
            return self.text[start:start + chars]
        loop_chars = min(3000, tokens // 2) * CHARS_PER_TOKEN  # the last 3k tokens (half of a short one)
        body = self.text[start:start + chars - loop_chars]
        return body + (self.loop * (loop_chars // len(self.loop) + 1))[:loop_chars]

    def token_ids(self, rng: random.Random, tokens: int, truncated: bool) -> list[int]:
        start = rng.randrange(0, len(self.ids) - min(tokens, len(self.ids) - 1))
        ids = self.ids[start:start + tokens]
        while len(ids) < tokens:
            ids += self.ids[: tokens - len(ids)]
        if not truncated:
            ids[-1] = EOS
        return ids


class IdPool:
    """Token-id lists for the batches, made once: the tap reads a completion's ids for their length
    and last token only, so drawing them from a pool changes nothing it does, and making 8,192 lists
    of 8k ints every step would cost the harness more than the monitor."""

    def __init__(self, corpus: Corpus, rng: random.Random, median: int, cap: int, size: int = 1024) -> None:
        self.lists = []
        for _ in range(size):
            tokens = int(min(cap, max(16, rng.lognormvariate(math.log(median), 0.45))))
            self.lists.append(corpus.token_ids(rng, tokens, truncated=tokens >= cap))

    def draw(self, rng: random.Random) -> list[int]:
        return self.lists[rng.randrange(len(self.lists))]


def make_batch(corpus: Corpus, pool: IdPool, rng: random.Random, n: int, step: int) -> dict[str, Any]:
    """One rank's generation batch: prompts, completions, completion_ids and the rewards to return."""
    prompts, completions, ids, acc, fmt = [], [], [], [], []
    for g in range(n // NUM_GENERATIONS):
        prompt = f"Problem {step}-{g}: " + corpus.text[g * 97 % 100000:g * 97 % 100000 + 400]
        for _ in range(NUM_GENERATIONS):
            seq = pool.draw(rng)
            tokens = len(seq)
            truncated = seq[-1] != EOS
            loops = rng.random() < LOOP_SHARE
            prompts.append(prompt)
            completions.append(corpus.completion(rng, tokens, loops))
            ids.append(seq)
            acc.append(0.0 if truncated or loops else float(rng.random() < 0.45))
            fmt.append(round(rng.random(), 3))
    return {"prompts": prompts, "completions": completions, "completion_ids": ids, "accuracy": acc, "format": fmt}


def trl_logs(step: int, lengths: list[int], clipped: list[bool], acc: list[float], fmt: list[float]) -> dict[str, float]:
    """The metric dict TRL 1.16 passes to ``on_log`` for one step (values of a healthy run)."""
    n = len(lengths)
    rewards = [a + f for a, f in zip(acc, fmt)]
    mean_r = sum(rewards) / n
    term = [L for L, c in zip(lengths, clipped) if not c] or [0]
    return {
        "loss": 0.01 * math.sin(step), "grad_norm": 0.3 + 0.01 * (step % 7), "learning_rate": 1e-6,
        "num_tokens": float(step * sum(lengths)), "completions/mean_length": sum(lengths) / n,
        "completions/min_length": float(min(lengths)), "completions/max_length": float(max(lengths)),
        "completions/clipped_ratio": sum(clipped) / n, "completions/mean_terminated_length": sum(term) / len(term),
        "completions/min_terminated_length": float(min(term)), "completions/max_terminated_length": float(max(term)),
        "rewards/accuracy_reward/mean": sum(acc) / n, "rewards/accuracy_reward/std": statistics.pstdev(acc),
        "rewards/format_reward/mean": sum(fmt) / n, "rewards/format_reward/std": statistics.pstdev(fmt),
        "reward": mean_r, "reward_std": statistics.pstdev(rewards), "frac_reward_zero_std": 0.05,
        "entropy": 0.6 + 0.02 * math.sin(step / 5), "kl": 0.0, "clip_ratio/region_mean": 0.001,
        "clip_ratio/low_mean": 0.0005, "clip_ratio/high_mean": 0.0005, "epoch": step / 1000,
    }


# -- one process (or one rank) ------------------------------------------------------------------


def worker(shape: str, steps: int, run_dir: Path, out: Path, sample_text: str, model_step: float) -> None:
    import torch.nn as nn

    import grpo_monitor.callbacks.reward_tap as reward_tap

    rank, world = 0, 1
    if "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
    from grpo_monitor.callbacks.monitor_callback import MonitorCallback
    from grpo_monitor.callbacks.options import SampleOptions

    measured = reward_tap.text_signals
    background: list[float] = []

    def timed_signals(completions):  # the tap's worker-thread work, timed
        t = time.perf_counter()
        try:
            return measured(completions)
        finally:
            background.append(time.perf_counter() - t)

    reward_tap.text_signals = timed_signals

    total, median, cap = SHAPES[shape]
    local_n = total // world
    holder: dict[str, Any] = {}

    def accuracy_reward(prompts, completions, completion_ids, **kwargs):
        return holder["accuracy"]

    def format_reward(prompts, completions, completion_ids, **kwargs):
        return holder["format"]

    config = {"output_dir": str(run_dir.parent / "out"), "num_generations": NUM_GENERATIONS,
              "max_completion_length": cap, "logging_steps": 1, "per_device_train_batch_size": local_n,
              "gradient_accumulation_steps": 1, "loss_type": "dapo", "beta": 0.0, "learning_rate": 1e-6,
              "temperature": 1.0, "mask_truncated_completions": True, "epsilon": 0.2, "epsilon_high": 0.28,
              "max_steps": steps, "report_to": [], "bf16": False, "fp16": False}
    args = SimpleNamespace(**config, process_index=rank, world_size=world, to_dict=lambda: dict(config))
    trainer = SimpleNamespace(
        args=args, reward_funcs=[accuracy_reward, format_reward], reward_func_names=["accuracy_reward", "format_reward"],
        num_generations=NUM_GENERATIONS, processing_class=SimpleNamespace(eos_token_id=EOS, pad_token_id=PAD),
        eos_token_ids=[EOS], model=nn.Linear(4, 4), callback_handler=SimpleNamespace(callbacks=[]),
    )
    cb = MonitorCallback(trainer, run_dir, samples=SampleOptions(sample_text=sample_text))
    state = SimpleNamespace(global_step=0, is_world_process_zero=rank == 0, log_history=[])
    control = SimpleNamespace(should_training_stop=False, should_save=False)
    cb.on_train_begin(args, state, control, model=trainer.model)
    corpus = Corpus(seed=1234)
    rng = random.Random(1000 + rank)
    pool = IdPool(corpus, random.Random(99), median, cap)
    files = lambda: sum(p.stat().st_size for p in run_dir.iterdir() if p.is_file() and (  # noqa: E731
        p.name == f"samples.rank{rank}.jsonl" or (rank == 0 and p.name == "run.jsonl")))
    blocking, tap_s, log_s, written, sent, rss = [], [], [], [], [], []
    kwargs_extra = {"trainer_state": state, "log_extra": lambda *a, **k: None, "log_metric": lambda *a, **k: None}
    for step in range(1, steps + 1):
        state.global_step = step
        batch = make_batch(corpus, pool, rng, local_n, step)
        holder.update(accuracy=batch["accuracy"], format=batch["format"])
        before = files()
        tap = raw = 0.0
        for wrapped, bare in zip(trainer.reward_funcs, (accuracy_reward, format_reward)):
            t = time.perf_counter()
            wrapped(prompts=batch["prompts"], completions=batch["completions"], completion_ids=batch["completion_ids"],
                    **kwargs_extra)
            tap += time.perf_counter() - t
            t = time.perf_counter()
            bare(prompts=batch["prompts"], completions=batch["completions"], completion_ids=batch["completion_ids"],
                 **kwargs_extra)
            raw += time.perf_counter() - t
        if model_step:
            time.sleep(model_step)
        lengths = [len(x) for x in batch["completion_ids"]]
        clipped = [L >= cap and x[-1] != EOS for L, x in zip(lengths, batch["completion_ids"])]
        logs = trl_logs(step, lengths, clipped, batch["accuracy"], batch["format"])
        del batch
        t = time.perf_counter()
        cb.on_log(args, state, control, logs=logs)
        dt_log = time.perf_counter() - t
        tap_s.append(max(0.0, tap - raw))
        log_s.append(dt_log)
        blocking.append(tap_s[-1] + dt_log)
        written.append(files() - before)
        sent.append(cb.exchange_bytes)
        rss.append(rss_bytes())
    cb.on_train_end(args, state, control)
    out.write_text(json.dumps({
        "shape": shape, "rank": rank, "world": world, "steps": steps, "per_rank": local_n, "total": total,
        "blocking": blocking, "tap": tap_s, "on_log": log_s, "written": written, "sent": sent, "rss": rss,
        "background": background, "model_step": model_step, "errors": cb.errors,
    }))


# -- driving ------------------------------------------------------------------------------------


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def run_variant(shape: str, steps: int, world: int, run_dir: Path, sample_text: str,
                model_step: float) -> list[dict[str, Any]]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    with tempfile.TemporaryDirectory() as tmp:
        outs = [Path(tmp) / f"rank{r}.json" for r in range(world)]
        script = [str(Path(__file__).resolve()), "--worker", "--shapes", shape, "--steps", str(steps),
                  "--run-dir", str(run_dir), "--out", str(Path(tmp) / "rank{rank}.json"), "--sample-text", sample_text,
                  "--model-step", str(model_step)]
        if world == 1:
            cmd = [sys.executable, *script]
        else:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(world), *script]
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"scale.py: {shape} x{world} failed:\n{proc.stderr[-3000:]}")
        return [json.loads(p.read_text()) for p in outs]


def summarize(parts: list[dict[str, Any]]) -> dict[str, Any]:
    skip = WARMUP if parts[0]["steps"] > WARMUP + 1 else 0
    blocking = [max(vals) for vals in zip(*(p["blocking"] for p in parts))][skip:]  # the slowest rank holds the step
    tap = [max(vals) for vals in zip(*(p["tap"] for p in parts))][skip:]
    written = [sum(vals) for vals in zip(*(p["written"] for p in parts))][skip:]
    sent = [max(vals) for vals in zip(*(p["sent"] for p in parts))][skip:]
    growth = max(p["rss"][-1] - p["rss"][0] for p in parts)
    bg = [max(vals) for vals in zip(*(p["background"] for p in parts))][skip:] or [0.0]
    return {
        "shape": parts[0]["shape"], "world": parts[0]["world"], "per_rank": parts[0]["per_rank"], "total": parts[0]["total"],
        "steps": parts[0]["steps"], "p50_ms": 1e3 * statistics.median(blocking), "p99_ms": 1e3 * pct(blocking, 0.99),
        "tap_p50_ms": 1e3 * statistics.median(tap), "background_p50_ms": 1e3 * statistics.median(bg),
        "cpu_p50_ms": 1e3 * statistics.median([b + g for b, g in zip(blocking, bg)]),
        "model_step_s": parts[0]["model_step"], "written": statistics.mean(written),
        "sent": statistics.mean(sent), "sent_per_completion": statistics.mean(sent) / parts[0]["per_rank"],
        "rss_growth_mb": growth / 2**20, "rss_end_mb": max(p["rss"][-1] for p in parts) / 2**20,
        "errors": {k: v for p in parts for k, v in p["errors"].items()},
    }


def render(rows: list[dict[str, Any]], steps: int) -> str:
    lines = [
        "## Production scale (`benchmarks/scale.py`)",
        "",
        stamp(),
        "",
        "A real `MonitorCallback` on a stand-in trainer (steps per row in the table): the tapped reward functions called "
        "as TRL 1.16 calls them with the rank's whole generation batch, then `on_log` with TRL's metric dict. "
        "Synthetic completions, 4 characters per token, log-normal lengths (a few percent truncated at the cap, "
        f"{LOOP_SHARE:.0%} looping in their last 3k tokens, or last half when shorter), {NUM_GENERATIONS} per group, default sample retention. "
        "Blocking = time inside the wrapped reward functions beyond the functions themselves plus `on_log` "
        f"(the slowest rank), first {WARMUP} steps excluded; written = bytes appended to the run directory per step "
        "(all ranks); sent = bytes of the rank's pickled exchange payload per step (`all_gather_object` pads "
        "each to the largest); RSS growth from the end of the first step to the last (largest rank).",
        "",
        "The step batch is the whole step's completions, split evenly over the ranks. A real L run spreads its "
        "8,192 completions over 8-64 ranks (128-1,024 per rank, the per-rank work of M or less); the 1-process "
        "L row puts all of them on one rank (an upper bound), the 2-process row 4,096 on each. `load` is the "
        "machine's 1-minute load average when the row finished: this machine has 2 cores shared with other "
        "work, so the times are inflated where it is above 2.",
        "",
        "`background` is the text-signal work the tap does on its worker thread while the model steps "
        "(simulated as a sleep of `model step`); `work` = blocking + background, what the monitor would "
        "block if nothing overlapped it.",
        "",
        "| shape | ranks | steps | completions per rank | blocking p50 | p99 | background p50 | work p50 | model step | written / step | sent / rank / step | sent / completion | RSS growth | load | target p50 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['shape']} ({r['total']:,} x ~{SHAPES[r['shape']][1] // 1024}k tok) | {r['world']} | {r['steps']} | {r['per_rank']:,} | "
            f"{r['p50_ms']:.1f} ms | {r['p99_ms']:.1f} ms | {r['background_p50_ms']:.0f} ms | {r['cpu_p50_ms']:.0f} ms | "
            f"{r['model_step_s']:g} s | {r['written'] / 1e6:.3f} MB | "
            f"{r['sent'] / 1e3:.1f} kB | {r['sent_per_completion']:.0f} B | {r['rss_growth_mb']:.1f} MB | {r.get('load', float('nan')):.1f} | "
            f"≤ {TARGETS[r['shape']]:.0f} ms{' · ERRORS ' + str(r['errors']) if r['errors'] else ''} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="S,M,L")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--ranks", default="1,2", help="process counts to run, e.g. 1,2")
    ap.add_argument("--sample-text", default="default", help="retention policy: default, all, none")
    ap.add_argument("--keep-run", default=None, help="write the last shape's 1-process run here and keep it")
    ap.add_argument("--no-results", action="store_true", help="print, do not update RESULTS.md")
    ap.add_argument("--model-step", type=float, default=None,
                    help="seconds of simulated model work per step (default per shape: S 0.1, M 0.3, L 1.0)")
    ap.add_argument("--rows", default=None, help="JSON file of earlier rows to merge with (rows of the same shape and ranks are replaced)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--run-dir", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        rank = int(os.environ.get("RANK", "0"))
        worker(a.shapes, a.steps, Path(a.run_dir), Path(a.out.format(rank=rank)), a.sample_text, a.model_step or 0.0)
        return
    rows: list[dict[str, Any]] = []
    if a.rows and Path(a.rows).exists():
        rows = json.loads(Path(a.rows).read_text())
    shapes = [s.strip().upper() for s in a.shapes.split(",") if s.strip()]
    for shape in shapes:
        for world in [int(x) for x in a.ranks.split(",")]:
            with tempfile.TemporaryDirectory() as tmp:
                keep = a.keep_run and world == 1 and shape == shapes[-1]
                run_dir = Path(a.keep_run) if keep else Path(tmp) / "run"
                if keep and run_dir.exists():
                    raise SystemExit(f"scale.py: {run_dir} exists; choose a new --keep-run directory")
                t = time.time()
                step_s = MODEL_STEP_S[shape] if a.model_step is None else a.model_step
                row = summarize(run_variant(shape, a.steps, world, run_dir, a.sample_text, step_s))
                row["wall_s"] = time.time() - t
                row["load"] = os.getloadavg()[0]
                rows = [r for r in rows if (r["shape"], r["world"]) != (shape, world)] + [row]
                print(json.dumps(row), flush=True)
                if a.rows:
                    Path(a.rows).write_text(json.dumps(rows))
    order = {k: i for i, k in enumerate(SHAPES)}
    rows.sort(key=lambda r: (order[r["shape"]], r["world"]))
    text = render(rows, a.steps)
    print(text)
    if not a.no_results:
        update_section("scale", text)


if __name__ == "__main__":
    main()
