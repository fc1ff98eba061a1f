"""Make REAL GRPO training runs on the tiny local model, each with one failure a user causes, plus healthy twins.

The runs are labelled later by someone else (calibration logs for the monitor's detectors): this script only
trains them, keeps what a user would have on disk, and writes down what was done (``AUTHOR.md``). It never
labels a run and never runs ``grpo-monitor analyze``.

Every run is an ordinary TRL ``GRPOTrainer`` run on the project's tiny warm-started Qwen3
(``grpo_monitor.fixtures.tiny``), with the demo's CPU-safe ``GRPOConfig`` keywords
(``grpo_monitor.app.demo.demo_settings``: lr 3e-4, 8 generations, 8 prompts' completions per device,
max_completion_length 16, use_cpu, seed 3407) and the monitor attached the way users attach it::

    attach(trainer, RUN_DIR, sample_text={"fair": 8, "groups": 2, "truncated": 2})
    trainer.train()
    trainer.save_state()

Scenarios (``SCENARIOS`` below): ``healthy`` and six user mistakes, each from step 1. Each scenario runs at
logging_steps 1, 5 and 10, on 1 process and on 2 processes (``torchrun --standalone --nproc_per_node 2``,
gloo on the CPU): 7 x 3 x 2 = 42 runs, one at a time. A run is named ``<scenario>_log<k>_rank<n>``.

What is kept per run, under ``<out>/made/``:
  ``<case>/``                     the monitor's run directory (run.jsonl, samples.rank*.jsonl)
  ``<case>.trainer_state.json``   the trainer_state.json TRL saved in output_dir
Everything else a run writes (output_dir, checkpoints, weights) is deleted. ``<out>/made_runs.json`` records
each run's command, settings and wall time (the source of AUTHOR.md).

When all 42 runs exist, 14 are held out, drawn by ``random.Random(2027).sample(sorted(run_names), 14)`` and
nothing else, and moved (both files) to ``<out>/made_held_out/``. Each folder gets README.md and AUTHOR.md.

Usage (from the repository root, with the project's venv)::

    .venv/bin/python benchmarks/make_runs.py --out benchmarks/real_runs                    # all 42, split, docs
    .venv/bin/python benchmarks/make_runs.py --out benchmarks/real_runs --only lr_100x     # one scenario's 6 runs
    .venv/bin/python benchmarks/make_runs.py --out benchmarks/real_runs --only lr_100x_log5_rank2   # one run
    .venv/bin/python benchmarks/make_runs.py --out benchmarks/real_runs --only healthy --logging-steps 1 --ranks 1
    .venv/bin/python benchmarks/make_runs.py --out benchmarks/real_runs --docs             # split + docs only

Existing runs are skipped unless ``--force``. ``--worker`` is internal: one training in this process (the
script calls itself through ``python`` for 1 process and through ``torchrun`` for 2).

Reproducibility: seed 3407 for GRPO, fixed seeds for the models and datasets below; same CPU and thread count
reproduce a run bit for bit, another CPU may take another trajectory (REFERENCE.md §2).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve()

LOGGING_STEPS = (1, 5, 10)
RANKS = (1, 2)
SAMPLE_TEXT = {"fair": 8, "groups": 2, "truncated": 2}
HELD_OUT_SEED = 2027
HELD_OUT_N = 14
HELD_OUT_LINE = "random.Random(2027).sample(sorted(run_names), 14)"

# Each scenario: steps, the GRPOConfig keywords that differ from the demo's (healthy) settings, the reward
# functions by name (resolved in reward_funcs), the model and dataset it trains on, and the mistake in a
# user's words (AUTHOR.md). Nothing here says what the curves will show.
SCENARIOS: dict[str, dict[str, Any]] = {
    "healthy": {
        "steps": 100, "config": {}, "rewards": ["format_reward", "correctness_reward"],
        "model": "warm150", "dataset": "default",
        "user": "no mistake: the tiny model's recommended setup as the demo runs it",
        "about": "The demo's settings unchanged: the tiny Qwen3 warm-started for 150 supervised steps, the 64-prompt "
                 "addition task, format_reward + correctness_reward (which reads the `target` column), "
                 "learning_rate 3e-4 (linear decay), 8 generations, 8 completions per device, "
                 "max_completion_length 16, temperature 1.0, beta 0, loss_type TRL's default (dapo). It is the "
                 "twin every other scenario differs from.",
    },
    "missing_column": {
        "steps": 60, "config": {}, "rewards": ["format_reward", "correctness_reward_reads_answer"],
        "model": "warm150", "dataset": "default",
        "user": "my correctness reward reads an `answer` column, but my dataset calls it `target`",
        "about": "The user wrote their own `correctness_reward` that looks up the reference answer in the dataset "
                 "column `answer` (`kwargs.get(\"answer\") or [None] * len(completions)`), while the dataset's column "
                 "is `target`. TRL passes every dataset column to reward functions as keyword arguments and does "
                 "not complain about a missing one, so the lookup silently yields None and the function pays 0.0 "
                 "to every completion, right or wrong. format_reward is the usual one. The function keeps the name "
                 "`correctness_reward`, so the logged key is `rewards/correctness_reward/mean` as in a healthy run.",
    },
    "lr_100x": {
        "steps": 60, "config": {"learning_rate": 3e-2}, "rewards": ["format_reward", "correctness_reward"],
        "model": "warm150", "dataset": "default",
        "user": "I set learning_rate=3e-2 instead of 3e-4 (a slipped exponent, 100x)",
        "about": "learning_rate 3e-2, 100 times the healthy 3e-4 (the linear decay schedule is unchanged, so it "
                 "decays from 3e-2). Everything else is healthy.",
    },
    "per_word_bonus": {
        "steps": 150, "config": {"max_completion_length": 64},
        "rewards": ["format_reward", "correctness_reward", "verbosity_bonus"],
        "model": "warm150", "dataset": "default",
        "user": "I added a `verbosity_bonus` reward, 0.1 per word, to encourage the model to show its work",
        "about": "An extra reward function `verbosity_bonus` pays 0.1 per whitespace-separated word of the "
                 "completion (so 10 words are worth as much as a correct answer), summed with format_reward and "
                 "correctness_reward at equal weights. max_completion_length is raised from 16 to 64 so that "
                 "longer completions are possible. 150 steps.",
    },
    "solved_task": {
        "steps": 60, "config": {}, "rewards": ["format_reward", "correctness_reward"],
        "model": "solved", "dataset": "easiest",
        "user": "I fine-tuned on these prompts first, then ran GRPO on the easy ones the model already gets right",
        "about": "The user first fine-tuned the model (supervised, 600 more steps of lr 3e-3 on the task with the "
                 "right answer every time, on top of the 150-step warm start) and then ran GRPO on a dataset filtered "
                 "to the easiest prompts: those this fine-tuned model answered right in every one of 64 samples at "
                 "temperature 1 (the selected prompts cycled to 64 rows). GRPO settings are the healthy ones.",
    },
    "cold_temperature": {
        "steps": 60, "config": {"temperature": 0.01}, "rewards": ["format_reward", "correctness_reward"],
        "model": "warm150", "dataset": "default",
        "user": "I set temperature=0.01 to make the generations 'less random'",
        "about": "GRPOConfig(temperature=0.01) instead of the default 1.0: the sampler draws the 8 completions of "
                 "each prompt from a nearly greedy distribution. TRL applies the same temperature to the "
                 "log-probabilities and the logged entropy of the training forward. Everything else is healthy.",
    },
    "short_cap": {
        "steps": 60, "config": {"max_completion_length": 2}, "rewards": ["format_reward", "correctness_reward"],
        "model": "warm150", "dataset": "default",
        "user": "I set max_completion_length=2 to make steps fast (the answer needs 3 tokens plus EOS)",
        "about": "max_completion_length 2 instead of 16. A correct completion is `<answer> 7 </answer>` (three "
                 "word tokens, then EOS), so no well-formed answer fits in 2 tokens. Everything else is healthy.",
    },
}


# ----------------------------------------------------------------------------------------- reward functions
def correctness_reward_reads_answer(completions: list[str], **kwargs: Any) -> list[float]:
    """The user's correctness reward: it looks up the reference in an ``answer`` column the dataset lacks."""
    from grpo_monitor.fixtures.tiny import _ANSWER

    answers = kwargs.get("answer") or [None] * len(completions)
    out = []
    for c, a in zip(completions, answers):
        m = _ANSWER.search(c)
        out.append(1.0 if a is not None and m and m.group(1) == str(a) else 0.0)
    return out


# The user named it correctness_reward; TRL logs reward functions under __name__.
correctness_reward_reads_answer.__name__ = "correctness_reward"


def verbosity_bonus(completions: list[str], **kwargs: Any) -> list[float]:
    """0.1 per word of the completion."""
    return [0.1 * len(c.split()) for c in completions]


def reward_funcs(names: list[str]) -> list[Any]:
    from grpo_monitor.fixtures import tiny

    local = {"correctness_reward_reads_answer": correctness_reward_reads_answer, "verbosity_bonus": verbosity_bonus}
    return [local[n] if n in local else getattr(tiny, n) for n in names]


# ------------------------------------------------------------------------------------- models and datasets
SOLVED_SFT_STEPS = 600
SOLVED_MIN_ACC = 1.0  # every one of 64 samples right


def cache_root() -> Path:
    from grpo_monitor.fixtures.tiny import cache_dir

    return cache_dir() / "make_runs"


def solved_model_dir() -> Path:
    return cache_root() / f"solved-sft{SOLVED_SFT_STEPS}"


def prompt_accuracy(model: Any, tok: Any, samples: int = 64, seed: int = 0) -> dict[tuple[int, int], float]:
    """Share of ``samples`` completions (temperature 1, 16 new tokens) that are right, per distinct prompt."""
    import itertools

    import torch

    from grpo_monitor.fixtures.tiny import _ANSWER

    torch.manual_seed(seed)
    model.eval()
    acc = {}
    for a, b in itertools.product(range(5), range(6)):  # every prompt tiny.task_rows can draw
        enc = tok([f"What is {a} + {b} ? Answer :"] * samples, return_tensors="pt")
        with torch.no_grad():
            out = model.generate(**enc, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=16)
        texts = tok.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        acc[(a, b)] = sum(1 for t in texts if (m := _ANSWER.search(t)) and m.group(1) == str(a + b)) / samples
    return acc


def prepare_solved_model() -> Path:
    """The ``solved_task`` model: the 150-step warm start, then SFT with the right answer every time; also
    writes the per-prompt accuracy it reaches (used to pick the easiest prompts). Cached, built once."""
    target = solved_model_dir()
    if (target / "config.json").is_file() and (target / "accuracy.json").is_file():
        return target
    import torch

    from grpo_monitor.fixtures.tiny import EOS, build_model, build_tokenizer

    model, tok = build_model(warm_start=150), build_tokenizer()
    rng = random.Random(7)
    torch.manual_seed(7)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(SOLVED_SFT_STEPS):
        texts = []
        for _ in range(16):
            a, b = rng.randint(0, 4), rng.randint(0, 5)
            texts.append(f"What is {a} + {b} ? Answer : <answer> {a + b} </answer> {EOS}")
        batch = tok(texts, return_tensors="pt", padding=True)
        labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
        model(**batch, labels=labels).loss.backward()
        opt.step()
        opt.zero_grad()
    acc = prompt_accuracy(model, tok)
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    model.save_pretrained(str(tmp))
    (tmp / "accuracy.json").write_text(json.dumps({f"{a}+{b}": v for (a, b), v in sorted(acc.items())}, indent=1))
    if target.exists():
        shutil.rmtree(target)
    os.replace(tmp, target)
    return target


def easiest_dataset(n: int = 64):
    """The prompts the solved model answers right at least SOLVED_MIN_ACC of the time, cycled to ``n`` rows
    in a fixed shuffled order."""
    from datasets import Dataset

    acc = json.loads((solved_model_dir() / "accuracy.json").read_text())
    easy = sorted(k for k, v in acc.items() if v >= SOLVED_MIN_ACC)
    if not easy:
        raise RuntimeError("no prompt reaches the accuracy threshold: the solved model is not solved")
    rng = random.Random(11)
    rows = []
    while len(rows) < n:
        batch = easy[:]
        rng.shuffle(batch)
        rows.extend(batch)
    rows = rows[:n]
    prompts = [f"What is {k.split('+')[0]} + {k.split('+')[1]} ? Answer :" for k in rows]
    targets = [str(int(k.split("+")[0]) + int(k.split("+")[1])) for k in rows]
    return Dataset.from_dict({"prompt": prompts, "target": targets})


# ---------------------------------------------------------------------------------------- one training run
def worker(args: argparse.Namespace) -> None:
    """One GRPO training in this process (or this torchrun rank), the way a user's script does it."""
    from trl import GRPOConfig, GRPOTrainer

    from grpo_monitor import attach
    from grpo_monitor.app.demo import demo_settings
    from grpo_monitor.fixtures.tiny import build_dataset, build_model, build_tokenizer

    spec = SCENARIOS[args.scenario]
    # --logging-steps parses as a list (the batch filter); a worker is given exactly one value.
    config = GRPOConfig(output_dir=args.output_dir,
                        **demo_settings(spec["steps"], **{**spec["config"], "logging_steps": args.logging_steps[0]}))
    if spec["model"] == "solved":
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(str(solved_model_dir()))
    else:
        model = build_model(warm_start=150)
    dataset = easiest_dataset() if spec["dataset"] == "easiest" else build_dataset()
    trainer = GRPOTrainer(model=model, processing_class=build_tokenizer(), reward_funcs=reward_funcs(spec["rewards"]),
                          args=config, train_dataset=dataset)
    attach(trainer, args.run_dir, sample_text=dict(SAMPLE_TEXT))
    trainer.train()
    trainer.save_state()


# ---------------------------------------------------------------------------------------------- the batch
def case_name(scenario: str, logging_steps: int, ranks: int) -> str:
    return f"{scenario}_log{logging_steps}_rank{ranks}"


def all_cases() -> list[tuple[str, int, int]]:
    return [(s, k, n) for s in SCENARIOS for k in LOGGING_STEPS for n in RANKS]


_CASE = re.compile(r"^(?P<s>[a-z0-9_]+)_log(?P<k>\d+)_rank(?P<n>\d+)$")


def select(only: str | None, logging_steps: list[int] | None, ranks: list[int] | None) -> list[tuple[str, int, int]]:
    cases = all_cases()
    if only:
        m = _CASE.match(only)
        if m and m["s"] in SCENARIOS:
            cases = [c for c in cases if c == (m["s"], int(m["k"]), int(m["n"]))]
        elif only in SCENARIOS:
            cases = [c for c in cases if c[0] == only]
        else:
            raise SystemExit(f"--only {only!r}: not a scenario ({', '.join(SCENARIOS)}) nor a run name")
        if not cases:
            raise SystemExit(f"--only {only!r}: no such run")
    if logging_steps:
        cases = [c for c in cases if c[1] in logging_steps]
    if ranks:
        cases = [c for c in cases if c[2] in ranks]
    return cases


def where(out: Path, case: str) -> Path:
    """The folder a run lives in: made_held_out/ once it was held out, made/ otherwise."""
    held = out / "made_held_out"
    return held if (held / case).is_dir() else out / "made"


def manifest_path(out: Path) -> Path:
    return out / "made_runs.json"


def load_manifest(out: Path) -> dict[str, Any]:
    p = manifest_path(out)
    return json.loads(p.read_text()) if p.is_file() else {}


def save_manifest(out: Path, manifest: dict[str, Any]) -> None:
    manifest_path(out).write_text(json.dumps(dict(sorted(manifest.items())), indent=1) + "\n")


def run_case(out: Path, scenario: str, logging_steps: int, ranks: int) -> dict[str, Any]:
    """Train one run in a child process (python, or torchrun for 2 ranks), keep its two artefacts, delete the rest."""
    case = case_name(scenario, logging_steps, ranks)
    folder = where(out, case)
    folder.mkdir(parents=True, exist_ok=True)
    run_dir, state_copy = folder / case, folder / f"{case}.trainer_state.json"
    scratch = out / "_scratch" / case
    for p in (run_dir, scratch):
        shutil.rmtree(p, ignore_errors=True)
    state_copy.unlink(missing_ok=True)
    scratch.mkdir(parents=True)
    output_dir = scratch / "output_dir"
    worker_args = ["--worker", "--scenario", scenario, "--logging-steps", str(logging_steps),
                   "--run-dir", str(run_dir), "--output-dir", str(output_dir)]
    if ranks == 1:
        cmd = [sys.executable, str(HERE), *worker_args]
    else:
        torchrun = Path(sys.executable).with_name("torchrun")
        launcher = [str(torchrun)] if torchrun.is_file() else [sys.executable, "-m", "torch.distributed.run"]
        cmd = [*launcher, "--standalone", "--nproc_per_node", str(ranks), str(HERE), *worker_args]
    env = dict(os.environ, PYTHONUNBUFFERED="1", TRANSFORMERS_VERBOSITY="error", GRPO_MONITOR_WEBHOOK_URL="")
    print(f"[{time.strftime('%H:%M:%S')}] {case}: {' '.join(Path(c).name if i == 0 else c for i, c in enumerate(cmd))}",
          flush=True)
    t0 = time.time()
    with open(scratch / "console.log", "w") as log:
        rc = subprocess.call(cmd, cwd=str(ROOT), env=env, stdout=log, stderr=subprocess.STDOUT)
    wall = time.time() - t0
    record: dict[str, Any] = {"scenario": scenario, "logging_steps": logging_steps, "ranks": ranks,
                              "steps": SCENARIOS[scenario]["steps"], "config": SCENARIOS[scenario]["config"],
                              "rewards": SCENARIOS[scenario]["rewards"], "rc": rc, "wall_s": round(wall, 1),
                              "command": " ".join(["torchrun --standalone --nproc_per_node 2" if ranks > 1 else "python",
                                                   "benchmarks/make_runs.py", *worker_args[:5]])}
    state = output_dir / "trainer_state.json"
    if rc == 0 and state.is_file():
        shutil.copyfile(state, state_copy)
        st = json.loads(state.read_text())
        summary = next((h for h in st["log_history"] if "train_runtime" in h), {})
        record["train_runtime_s"] = summary.get("train_runtime")
        record["global_step"] = st.get("global_step")
        record["ok"] = True
        shutil.rmtree(scratch, ignore_errors=True)
    else:
        record["ok"] = False
        tail = (scratch / "console.log").read_text(errors="replace")[-3000:]
        record["error_tail"] = tail[-1500:]
        print(tail, flush=True)
        # keep the scratch console log for inspection; drop the weights
        shutil.rmtree(output_dir, ignore_errors=True)
    print(f"    rc {rc}, wall {wall:.1f} s" + (f", train_runtime {record.get('train_runtime_s')} s" if record["ok"] else
                                                "  FAILED"), flush=True)
    return record


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


# ------------------------------------------------------------------------------------------ held out, docs
def split_held_out(out: Path) -> list[str] | None:
    """Moves the 14 held-out runs (both files) to made_held_out/ once all 42 exist in either folder."""
    run_names = [case_name(*c) for c in all_cases()]
    have = [n for n in run_names if (where(out, n) / n).is_dir() and (where(out, n) / f"{n}.trainer_state.json").is_file()]
    if len(have) != len(run_names):
        print(f"held-out split waits: {len(have)}/{len(run_names)} runs exist", flush=True)
        return None
    held = random.Random(HELD_OUT_SEED).sample(sorted(run_names), HELD_OUT_N)
    dst = out / "made_held_out"
    dst.mkdir(parents=True, exist_ok=True)
    for n in run_names:
        target = dst if n in held else out / "made"
        target.mkdir(parents=True, exist_ok=True)
        src = where(out, n)
        if src != target:
            shutil.move(str(src / n), str(target / n))
            shutil.move(str(src / f"{n}.trainer_state.json"), str(target / f"{n}.trainer_state.json"))
    return sorted(held)


def _settings(rec: dict[str, Any]) -> str:
    cfg = rec["config"]
    diff = ", ".join(f"{k}={v!r}" for k, v in cfg.items())
    spec = SCENARIOS[rec["scenario"]]
    extra = []
    if "verbosity_bonus" in spec["rewards"]:
        extra.append("extra reward verbosity_bonus (0.1/word)")
    if "correctness_reward_reads_answer" in spec["rewards"]:
        extra.append("correctness_reward reads kwargs['answer'] (column absent)")
    if spec["model"] == "solved":
        extra.append(f"model: warm start + {SOLVED_SFT_STEPS}-step SFT")
    if spec["dataset"] == "easiest":
        extra.append("dataset: only the prompts the SFT model got right in 64/64 samples, 64 rows")
    return "; ".join(x for x in [diff, *extra] if x) or "none (healthy settings)"


def write_docs(out: Path, held: list[str]) -> None:
    manifest = load_manifest(out)
    easy = ""
    acc_file = solved_model_dir() / "accuracy.json"
    if acc_file.is_file():
        acc = json.loads(acc_file.read_text())
        easy = ", ".join(k for k, v in sorted(acc.items()) if v >= SOLVED_MIN_ACC)
    for folder_name in ("made", "made_held_out"):
        folder = out / folder_name
        names = sorted(p.name for p in folder.iterdir() if p.is_dir())
        held_here = folder_name == "made_held_out"
        readme = [
            f"# {folder_name}: real GRPO runs on the tiny local model " + ("(held out)" if held_here else ""),
            "",
            "Made by `benchmarks/make_runs.py` (see its docstring; `AUTHOR.md` here says what each run did).",
            "Each run `<scenario>_log<k>_rank<n>` is kept as two things:",
            "",
            "- `<case>/`: the grpo-monitor run directory (`run.jsonl`, `samples.rank*.jsonl`), written by "
            f"`attach(trainer, RUN_DIR, sample_text={SAMPLE_TEXT})`;",
            "- `<case>.trainer_state.json`: the `trainer_state.json` TRL saved (`trainer.save_state()`).",
            "",
            f"Held out: of the 42 runs, {HELD_OUT_N} were moved to `made_held_out/`, drawn with",
            "",
            "```python",
            "run_names = [f'{s}_log{k}_rank{n}' for s in SCENARIOS for k in (1, 5, 10) for n in (1, 2)]",
            f"held_out = {HELD_OUT_LINE}   # seed {HELD_OUT_SEED}",
            "```",
            "",
            "and by nothing else. " + ("This folder holds those 14." if held_here else "This folder holds the other 28."),
            "",
            f"Runs here ({len(names)}): " + ", ".join(f"`{n}`" for n in names),
            "",
        ]
        (folder / "README.md").write_text("\n".join(readme))

        author = [
            f"# AUTHOR.md — what was done in each run ({folder_name})",
            "",
            "Written by the person who made the runs. It says what was set up, never what the curves show.",
            "",
            "## Common to every run",
            "",
            "- Model: the project's tiny Qwen3 (2 layers, hidden 64, ~76k parameters), `build_model(warm_start=150)` "
            "(150 supervised steps teaching the `<answer> x </answer>` format, right answer 70% of the time); "
            "word-level tokenizer `build_tokenizer()`.",
            "- Task: `build_dataset()` — 64 prompts `What is a + b ? Answer :` (a 0–4, b 0–5), column `target`.",
            "- Rewards: `format_reward` (1 for exactly one well-formed `<answer> x </answer>`) and "
            "`correctness_reward` (1 when the answer equals `target`), unless the scenario says otherwise.",
            "- GRPOConfig: `grpo_monitor.app.demo.demo_settings(steps, **overrides)` — learning_rate 3e-4 (linear "
            "decay to 0), num_generations 8, per_device_train_batch_size 8, gradient_accumulation_steps 1, "
            "max_completion_length 16, beta 0, temperature 1.0, loss_type dapo (TRL default), use_cpu, bf16 False, "
            "seed 3407; logging_steps set per run (1, 5 or 10).",
            "- Monitor: `attach(trainer, RUN_DIR, sample_text={\"fair\": 8, \"groups\": 2, \"truncated\": 2})`, then "
            "`trainer.train()`, then `trainer.save_state()`.",
            "- 1 process: `python benchmarks/make_runs.py --worker ...` (torch uses the machine's 2 CPU threads). "
            "2 processes: `torchrun --standalone --nproc_per_node 2 benchmarks/make_runs.py --worker ...` (gloo, "
            "`use_cpu=True`, 1 thread each); 8 completions per device, so 16 completions = 2 groups of 8 per step.",
            "- Machine: 2 shared CPU cores (torch 2.13 CPU, trl 1.16.0, transformers 5.24.0); runs made one at a time. "
            "Wall time is the whole process (imports, model load, training, save); `train_runtime` is TRL's.",
            "- The three logging_steps variants of one scenario on the same number of processes are the same "
            "training (same seed, same machine), logged at different intervals; TRL logs each metric averaged over "
            "the interval. The 1-process and 2-process runs of a scenario differ (2 groups per step instead of 1).",
            "- `../made_runs.json` holds each run's command, settings and wall time (the source of the table below).",
            "",
            "## Scenarios (the mistake, in the user's words, then what exactly was set)",
            "",
        ]
        for s, spec in SCENARIOS.items():
            about = spec["about"]
            if s == "solved_task" and easy:
                about += f" Prompts kept (a+b): {easy}."
            author += [f"### {s}", "", f"*\"{spec['user'][0].upper() + spec['user'][1:]}.\"* {about}", ""]
        author += ["## Runs", "",
                   "| run | mistake (user's words) | settings that differ from healthy | steps | logging_steps | "
                   "ranks | wall s | train_runtime s |", "|---|---|---|---|---|---|---|---|"]
        odd = []
        for n in names:
            rec = manifest.get(n)
            if rec is None:
                author.append(f"| `{n}` | (no record) | | | | | | |")
                continue
            author.append(f"| `{n}` | {SCENARIOS[rec['scenario']]['user']} | {_settings(rec)} | {rec['steps']} | "
                          f"{rec['logging_steps']} | {rec['ranks']} | {rec['wall_s']} | {rec.get('train_runtime_s', '')} |")
            if not rec.get("ok"):
                odd.append(f"- `{n}` crashed (rc {rec['rc']}).")
            for note in rec.get("notes", []):
                odd.append(f"- `{n}`: {note}")
        for n in names:  # wall times stretched by other work on the 2 shared cores
            rec = manifest.get(n)
            if not rec or not rec.get("train_runtime_s"):
                continue
            sib = sorted(r["train_runtime_s"] for r in manifest.values() if r.get("train_runtime_s")
                         and r["scenario"] == rec["scenario"] and r["ranks"] == rec["ranks"])
            med = sib[len(sib) // 2]
            if rec["train_runtime_s"] > 2.5 * med:
                odd.append(f"- `{n}`: train_runtime {rec['train_runtime_s']:.1f} s against a median of {med:.1f} s "
                           "for its siblings (same scenario, same process count): the shared CPU cores were busy "
                           "with other work; the training itself is the same.")
        failed = [n for n, r in manifest.items() if not r.get("ok") and not (folder / n).is_dir()]
        author += ["", "## Crashes and oddities", ""]
        author += ["- No crash: every run in this folder trained to its last step and saved its state."
                   if all(manifest.get(n, {}).get("ok") for n in names) else "- Some runs crashed (below)."]
        author += odd
        author += ["- Order of making: the seven `*_log1_rank1` runs (the quick checks that each mistake takes "
                   "effect) and `healthy_log10_rank2` (a check of the 2-process launch) were made first by this same "
                   "script; the full batch then made the other 34. `cold_temperature_log1_rank1` and "
                   "`solved_task_log1_rank1` were re-made after the adjustments below; their first versions were "
                   "discarded."]
        if failed and not held_here:
            author += [f"- Not made (TRL raised): {', '.join(failed)}"]
        author += ["", "## Adjustments made while building the set", ""] + ADJUSTMENTS + [""]
        (folder / "AUTHOR.md").write_text("\n".join(author))


# Written after the quick per-scenario check runs (logging_steps 1, 1 process); see main's report.
ADJUSTMENTS = [
    "- `solved_task`: the 150-step warm-started model answers only ~10–35% of samples right on any prompt (its "
    "warm start uses a wrong answer 30% of the time), so no prompt is 'already solved' for it. The scenario "
    f"therefore starts from that model fine-tuned {SOLVED_SFT_STEPS} more supervised steps with the right answer "
    "every time (the user's SFT stage before GRPO), and keeps only the prompts that model answered right in all "
    "64 of 64 samples at temperature 1 (18 of the 30 prompts; a first threshold of 98% kept 29, nearly the whole "
    "task, so it was raised to keep only the easiest).",
    "- `cold_temperature`: the brief's temperature 0.05 was tried first (quick run, logging_steps 1, 1 process): "
    "over its first ~15 steps about half of the groups still held differing completions (the warm-started model "
    "has near-tied answer digits on some prompts, which a 20x sharpening does not separate). Lowered to 0.01, "
    "which makes the 8 completions of a group identical from step 1 on nearly every step.",
]


# --------------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "real_runs"), help="root folder (made/, made_held_out/)")
    ap.add_argument("--only", help="a scenario name or one run name (<scenario>_log<k>_rank<n>)")
    ap.add_argument("--logging-steps", type=int, nargs="*", help="only these logging_steps (1 5 10)")
    ap.add_argument("--ranks", type=int, nargs="*", help="only these process counts (1 2)")
    ap.add_argument("--force", action="store_true", help="re-make runs that exist")
    ap.add_argument("--docs", action="store_true", help="only split held-out runs (if all exist) and write the docs")
    # internal: one training in this process
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--scenario", help=argparse.SUPPRESS)
    ap.add_argument("--run-dir", help=argparse.SUPPRESS)
    ap.add_argument("--output-dir", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if not args.docs:
        cases = select(args.only, args.logging_steps, args.ranks)
        if any(SCENARIOS[s]["model"] == "solved" for s, _, _ in cases):
            print(f"solved_task model: {prepare_solved_model()}", flush=True)
        manifest = load_manifest(out)
        for s, k, n in cases:
            name = case_name(s, k, n)
            folder = where(out, name)
            if not args.force and (folder / name).is_dir() and (folder / f"{name}.trainer_state.json").is_file():
                print(f"{name}: exists, skipped", flush=True)
                continue
            manifest[name] = run_case(out, s, k, n)
            save_manifest(out, manifest)
        shutil.rmtree(out / "_scratch", ignore_errors=True) if not any(
            not r.get("ok") for r in manifest.values()) else None
    held = split_held_out(out)
    if held is not None:
        write_docs(out, held)
    for name in ("made", "made_held_out"):
        if (out / name).exists():
            print(f"{name}: {du(out / name) / 1e6:.2f} MB", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
