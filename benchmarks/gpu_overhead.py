"""Monitor overhead on a GPU: GRPO step time with and without the monitor, dense Qwen3 and Qwen3-MoE.

Trains random-init models built here from a config (nothing is downloaded) with TRL's GRPOTrainer
in bf16 on CUDA, in rounds of one run per *arm* (like ``overhead.py``, with more than two sides):

* ``without``: no monitor;
* ``with``: ``callbacks.attach(trainer, run_dir)``, router tap included on an MoE model;
* ``with-no-router``: ``attach(trainer, run_dir, router_tap=False)``: everything but the router
  hooks, so ``with`` minus ``with-no-router`` is what the router tap costs.

The models:

* dense: a Qwen3 of the Qwen3-0.6B shape (hidden 1024, 28 layers, 16 heads / 8 kv heads, MLP 3072);
* MoE: a Qwen3-MoE of 16 layers, hidden 1024, 64 experts, top-8, expert MLP 256, so the router tap
  records every training forward (and probes every 10 steps, its default).

The vocabulary is the task tokenizer's (``fixtures.tiny``: "What is 3 + 4 ? Answer :"), so the LM
head is tiny; a real 150k-token head adds device time per step and makes the ratio smaller.
Completions are held at ``max_completion_length`` (``min_new_tokens``): a random-init model stops at
random, and a fixed length gives every arm the same work. Every run builds its model from the same
seed, and the runs of one round share the training seed, so the arms of a round do identical work.
The arm order rotates every round (``A B C``, ``B C A``, ``C A B``, ...), so no arm always runs first
after a model build. Step time is the gap between consecutive ``on_step_end`` marks (the monitor's
``on_log`` for the previous step falls inside it); the first steps of each run are excluded, and an
arm's figure is the median over all its timed steps. Besides the difference of medians, the time
spent inside the monitor's callbacks and reward-function wrappers is timed directly: the part of
the cost that blocks the training loop, free of the run-to-run noise. Between runs the trainer and
model are deleted and the CUDA cache emptied; each run records what stayed allocated.

With ``--warm-run`` (the default on CUDA) each model first trains a short untimed run with the
monitor on, which pays the allocator, cuBLAS and lazy-import warm-up (its first step takes several
times a later one's) and gives the step time from which the steps per run are cut when even one
round of full runs would not fit in the model's share of ``--budget-s`` (counted from the start of
the script). A further round, up to ``--rounds``, starts only while the mean of the rounds so far
says it ends within that share; the first always runs. Generation with transformers
``generate`` is bound by kernel launches, not by the GPU, so a step of the dense model takes a few
seconds on any GPU; the default budget keeps the whole script near 4 minutes. The JSON (every timed
step of every run) is rewritten after every run, so a run cut short still leaves its figures.

    python benchmarks/gpu_overhead.py                        # CUDA; rewrites its RESULTS.md section
    python benchmarks/gpu_overhead.py --models moe --arms without,with,with-no-router --max-completion-length 64
    python benchmarks/gpu_overhead.py --out DIR --no-results # figures to DIR/gpu_overhead.{json,md} only
    python benchmarks/gpu_overhead.py --from-json OLD.json NEW.json  # into RESULTS.md; a later file's model wins
    python benchmarks/gpu_overhead.py --device cpu --quick --models moe --arms without,with,with-no-router \
        --pairs 2 --steps 4 --no-results                      # smoke test
"""

from __future__ import annotations

import time

T0 = time.perf_counter()  # the budget counts the imports too

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.results import stamp, update_section  # noqa: E402
from benchmarks.timer import Timer  # noqa: E402

SECTION = "gpu_overhead"
WARMUP = 3  # steps excluded at the start of every run
WARM_RUN_STEPS = 3  # the untimed run before a model's rounds: two step gaps for the plan
SEED = 3407
ARMS: dict[str, str] = {  # arm -> label, in the order the tables list them
    "without": "without monitor",
    "with": "with monitor",
    "with-no-router": "with monitor, router tap off",
}

MODELS: dict[str, dict[str, Any]] = {
    "dense": {"kind": "qwen3", "label": "dense Qwen3, Qwen3-0.6B shape",
              "config": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                             num_key_value_heads=8, head_dim=128)},
    "moe": {"kind": "qwen3_moe", "label": "Qwen3-MoE, 64 experts top-8",
            "config": dict(hidden_size=1024, intermediate_size=3072, moe_intermediate_size=256, num_hidden_layers=16,
                           num_attention_heads=16, num_key_value_heads=8, head_dim=128, num_experts=64,
                           num_experts_per_tok=8, norm_topk_prob=True)},
}
QUICK_MODELS: dict[str, dict[str, Any]] = {
    "dense": {"kind": "qwen3", "label": "tiny dense Qwen3",
              "config": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, head_dim=16)},
    "moe": {"kind": "qwen3_moe", "label": "tiny Qwen3-MoE, 8 experts top-2",
            "config": dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=8,
                           num_experts_per_tok=2, norm_topk_prob=True)},
}
STEP_SHAPE = dict(per_device_train_batch_size=32, num_generations=8, max_completion_length=128)
QUICK_STEP_SHAPE = dict(per_device_train_batch_size=8, num_generations=4, max_completion_length=16)


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:6.1f}s] {msg}", flush=True)


def distinct_words_reward(completions: list[str], **kwargs: Any) -> list[float]:
    """Share of distinct words: it varies within a group, so advantages (and gradients) are not all zero."""
    out = []
    for c in completions:
        words = c.split()
        out.append(len(set(words)) / len(words) if words else 0.0)
    return out


# -- one training run -------------------------------------------------------------------------------


def build_model(spec: dict[str, Any], tok: Any, device: str, dtype: Any, max_len: int) -> Any:
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3MoeConfig

    cls = Qwen3MoeConfig if spec["kind"] == "qwen3_moe" else Qwen3Config
    config = cls(**spec["config"], vocab_size=len(tok), max_position_embeddings=max_len, tie_word_embeddings=True,
                 pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None)
    torch.manual_seed(SEED)  # every run starts from the same weights
    try:
        with torch.device(device):  # initialised in place: seconds less per run than on the CPU
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    except Exception as exc:  # noqa: BLE001 - any failure of the in-place build: build on the CPU instead
        log(f"building on {device} failed ({type(exc).__name__}: {exc}); building on the CPU")
        torch.manual_seed(SEED)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype).to(device)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    return model


def task_dataset(n: int, seed: int) -> Any:
    """``fixtures.tiny``'s task as a Dataset with a fixed fingerprint.

    ``Dataset.from_dict`` fingerprints the table by pickling it with dill, which fails with older
    pyarrow releases that trl 1.16 accepts (pyarrow 21 with datasets 5.0 and 5.2): the benchmark
    must not depend on which pyarrow the GPU machine has.
    """
    from datasets import Dataset
    from datasets.table import InMemoryTable

    from grpo_monitor.fixtures.tiny import task_rows

    rows = task_rows(n, seed)
    table = InMemoryTable.from_pydict({k: [r[k] for r in rows] for k in rows[0]})
    return Dataset(table, fingerprint=f"gpu-overhead-task-{n}-{seed}")


def one_run(name: str, spec: dict[str, Any], shape: dict[str, Any], arm: str, steps: int, seed: int,
            device: str, workdir: Path, skip: int = WARMUP) -> dict[str, Any]:
    """One training run of one arm; its step times exclude the first ``skip`` steps."""
    import torch
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import GRPOConfig, GRPOTrainer

    from grpo_monitor.callbacks import attach
    from grpo_monitor.fixtures.tiny import REWARD_FUNCS, build_tokenizer
    from grpo_monitor.app.demo import demo_settings

    cuda = device.startswith("cuda")
    with_monitor = arm != "without"
    t_start = time.perf_counter()
    tok = build_tokenizer()
    model = build_model(spec, tok, device, torch.bfloat16 if cuda else torch.float32,
                        max_len=64 + shape["max_completion_length"])
    kwargs = demo_settings(
        steps, **shape, learning_rate=1e-6, seed=seed, data_seed=seed, bf16=cuda, use_cpu=not cuda,
        generation_kwargs={"min_new_tokens": shape["max_completion_length"]},
    )
    if "activation_checkpointing" not in GRPOConfig.__dataclass_fields__:  # transformers before 5.24's rename
        kwargs["gradient_checkpointing"] = kwargs.pop("activation_checkpointing")
    args = GRPOConfig(output_dir=str(workdir / "trainer"), **kwargs)
    trainer = GRPOTrainer(model=model, reward_funcs=[*REWARD_FUNCS, distinct_words_reward], args=args,
                          train_dataset=task_dataset(256, seed), processing_class=tok)
    for cb in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(cb)
    callback_timer, reward_timer = Timer(), Timer()
    if with_monitor:
        options = {"router_tap": False} if arm == "with-no-router" else {}
        monitor_cb = attach(trainer, workdir / "run", **options)
        callback_timer.wrap_callback(monitor_cb)
    # Both sides get the same outer wrapper, so its own cost cancels in the difference.
    trainer.reward_funcs = [reward_timer.wrap(f) for f in trainer.reward_funcs]

    marks: list[float] = []
    tapped: list[bool] = []  # the monitor removes its router tap when training ends: look while it runs

    class StepClock(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if cuda:
                torch.cuda.synchronize()  # the step's queued kernels belong to this step
            marks.append(time.perf_counter())
            if with_monitor:
                tapped.append(getattr(monitor_cb, "router_tap", None) is not None)

    trainer.add_callback(StepClock())  # after the monitor, so each mark includes the monitor's own work
    t_train = time.perf_counter()
    trainer.train()
    t_end = time.perf_counter()
    gaps = [b - a for a, b in zip(marks, marks[1:])][skip - 1:]
    start, end = (marks[skip - 1], marks[-1]) if len(marks) > skip else (t_end, t_end)
    n = max(len(gaps), 1)
    out = {
        "model": name, "arm": arm, "with_monitor": with_monitor, "seed": seed, "steps": steps,
        "step_s": gaps,
        "callback_s_per_step": callback_timer.within(start, end) / n,
        "reward_s_per_step": reward_timer.within(start, end) / n,
        "setup_s": t_train - t_start,
        "wall_s": t_end - t_start,
        "first_steps_s": marks[skip - 1] - t_train if len(marks) >= skip else t_end - t_train,
    }
    if with_monitor:
        out["monitor"] = monitor_facts(monitor_cb, workdir / "run", any(tapped))
        del monitor_cb  # it holds the trainer, which holds the model and optimizer state
    del trainer, model
    gc.collect()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        # What a finished run left behind: a leak would make every later run slower than the first.
        out["cuda_allocated_after_mib"] = torch.cuda.memory_allocated() / 2**20
        out["cuda_reserved_after_mib"] = torch.cuda.memory_reserved() / 2**20
    return out


def monitor_facts(monitor_cb: Any, run_dir: Path, router_tap: bool) -> dict[str, Any]:
    """What the monitor recorded: proof that it did its work (router tap included) and caught no fault."""
    from grpo_monitor.core.runlog import read_run

    run = read_run(run_dir)
    last = run.steps[-1]["metrics"] if run.steps else {}
    lengths = [s["length"] for s in run.samples]
    return {
        "errors": dict(monitor_cb.errors),
        "router_tap": router_tap,
        "step_records": len(run.steps),
        "samples": len(run.samples),
        "mean_completion_length": statistics.fmean(lengths) if lengths else None,
        "findings": len(run.findings),
        "moe_metrics": sorted(k for k in last if k.startswith("moe/")),
        "flip_rate_measured": any("moe/flip_rate" in s["metrics"] for s in run.steps),
    }


# -- the benchmark ----------------------------------------------------------------------------------


def rotated(arms: list[str], round_index: int) -> list[str]:
    """The arm order of one round: ``A B C``, then ``B C A``, ``C A B``, ..."""
    k = round_index % len(arms)
    return arms[k:] + arms[:k]


def arm_of(run: dict[str, Any]) -> str:
    # Runs saved before there were arms say only whether the monitor was on.
    return run.get("arm") or ("with" if run["with_monitor"] else "without")


def with_rounds(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The runs with their round; runs saved without one went in consecutive rounds of one run per arm."""
    if all("round" in r for r in runs):
        return runs
    n = len({arm_of(r) for r in runs}) or 1
    return [{**r, "round": i // n} for i, r in enumerate(runs)]


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per arm: median over all its timed steps, ratio to ``without``, ratio per round (of run medians)."""
    runs = with_rounds(runs)
    rounds = sorted({r["round"] for r in runs})
    by_round = {k: {arm_of(r): r for r in runs if r["round"] == k} for k in rounds}
    present = [a for a in ARMS if any(arm_of(r) == a for r in runs)]
    timed = {a: [g for r in runs if arm_of(r) == a for g in r["step_s"]] for a in present}
    base_runs = [r for r in runs if arm_of(r) == "without"]
    base = statistics.median(timed["without"]) if timed.get("without") else None
    base_reward = statistics.median([r["reward_s_per_step"] for r in base_runs]) if base_runs else None

    def run_median(r: dict[str, Any]) -> float | None:
        return statistics.median(r["step_s"]) if r and r["step_s"] else None

    arms: dict[str, Any] = {}
    for a in present:
        if not timed[a]:
            continue
        mine = [r for r in runs if arm_of(r) == a]
        m = statistics.median(timed[a])
        per_round = []
        for k in rounds:
            x, b = run_median(by_round[k].get(a)), run_median(by_round[k].get("without"))
            if x is not None and b:
                per_round.append(x / b)
        facts = [r["monitor"] for r in mine if r.get("monitor")]
        lengths = [f["mean_completion_length"] for f in facts if f.get("mean_completion_length") is not None]
        arms[a] = {
            "median_ms": m * 1e3,
            "ratio": m / base if base else None,
            "diff_ms": (m - base) * 1e3 if base else None,
            "round_ratios": per_round,
            "runs": len(mine),
            "timed_steps": len(timed[a]),
            "runs_ms": [run_median(r) * 1e3 for r in mine if r["step_s"]],
            "callback_ms": statistics.median([r["callback_s_per_step"] for r in mine]) * 1e3,
            "reward_tap_ms": ((statistics.median([r["reward_s_per_step"] for r in mine]) - base_reward) * 1e3
                              if base_reward is not None else None),
            "monitor_faults": sorted({f"{k}: {v}" for f in facts for k, v in f["errors"].items()}),
            "moe_metrics": max((len(f["moe_metrics"]) for f in facts), default=0),
            # Saved before the tap was reported: it was on exactly when moe/* metrics were logged.
            "router_tap": any(f.get("router_tap", bool(f["moe_metrics"])) for f in facts),
            "mean_completion_length": statistics.fmean(lengths) if lengths else None,
            "cuda_allocated_after_mib": max((r.get("cuda_allocated_after_mib", 0.0) for r in mine), default=0.0),
        }
    out: dict[str, Any] = {
        "steps": runs[0]["steps"],
        "rounds": len(rounds),
        "orders": [[arm_of(r) for r in runs if r["round"] == k] for k in rounds],
        "timed_steps_per_run": len(runs[0]["step_s"]),
        "arms": arms,
    }
    if "with" in arms and "with-no-router" in arms:
        out["router_tap_ms"] = arms["with"]["median_ms"] - arms["with-no-router"]["median_ms"]
        out["router_tap_round_ms"] = [
            (run_median(by_round[k]["with"]) - run_median(by_round[k]["with-no-router"])) * 1e3
            for k in rounds if run_median(by_round[k].get("with")) and run_median(by_round[k].get("with-no-router"))]
    return out


def model_views(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each model of one saved benchmark with its setting and summary (recomputed from the saved runs)."""
    views: dict[str, dict[str, Any]] = {}
    for name, label in data.get("labels", {}).items():
        runs = [r for r in data.get("runs", []) if r["model"] == name]
        warm = [w for w in data.get("warmups", []) if w["model"] == name]
        views[name] = {
            "label": label, "env": data["env"], "shape": data["shape"], "steps": data["steps"],
            "is_moe": bool(data.get("models", {}).get(name, {}).get("num_experts")),
            "rounds_requested": data.get("rounds_requested", data.get("pairs_requested")),
            "warm_run": {"arm": arm_of(warm[0]), "steps": warm[0]["steps"]} if warm else None,
            "failure": data.get("failures", {}).get(name),
            "summary": summarise(runs) if any(r["step_s"] for r in runs) else None,
        }
    return views


def environment(device: str) -> dict[str, Any]:
    from importlib import metadata

    import torch

    env: dict[str, Any] = {"stamp": stamp(), "device": device, "torch": torch.__version__,
                           "cuda": torch.version.cuda, "gpu": None}
    for dist in ("trl", "transformers", "accelerate", "datasets", "pyarrow", "fsspec", "huggingface_hub"):
        try:
            env[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            env[dist] = None
    if device.startswith("cuda"):
        env["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return env


def _where(env: dict[str, Any]) -> str:
    where = f"{env['gpu']}, CUDA {env['cuda']}, bf16" if env.get("gpu") else f"{env['device']}, fp32"
    return (f"{where}; torch {env['torch']}, trl {env['trl']}, transformers {env['transformers']}, "
            f"accelerate {env['accelerate']}, datasets {env['datasets']}")


def _ms(x: float | None, sign: bool = False, digits: int = 1) -> str:
    return "—" if x is None else f"{x:{'+' if sign else ''}.{digits}f} ms"


def render(views: dict[str, dict[str, Any]], env: dict[str, Any]) -> str:
    """The RESULTS.md section: one table row per model and arm, then each model's setting and details."""
    lines = [
        "## Monitor overhead on a GPU (`benchmarks/gpu_overhead.py`)",
        "",
        env["stamp"],
        "",
        _where(env) + ".",
        "",
        "GRPOTrainer on random-init models built from a config (every run from the same seed), completions of "
        "exactly the stated length (transformers `generate`, no vLLM), logging every step, no gradient "
        "checkpointing. Arms: *without monitor*; *with monitor* (`attach(trainer, run_dir)`: reward tap, all "
        "detectors, and on the MoE the router tap); *with monitor, router tap off* (`attach(..., "
        "router_tap=False)`). Runs go in rounds of one run per arm, the arm order rotated every round (round 0 "
        "A B C, round 1 B C A, round 2 C A B, ...), the runs of a round with the same training seed; the first "
        f"{WARMUP} steps of every run are excluded. **Each arm's step time is the median over all its timed steps "
        "(all rounds)**; *ratio*: that median over the *without* median; *per round*: the arm's run median over "
        "the *without* run median of the same round. *In callbacks*: wall time inside the monitor's callbacks per "
        "step; *reward tap*: extra time of the wrapped reward functions per step (both block the training loop; "
        "the router hooks' kernels run inside the model's forward and show only in the step time). The MoE's "
        "routing probe runs every 10 steps; step 10's is timed in runs of 11 steps or more.",
        "",
        "| model | arm | tokens | timed steps (runs) | median step | ratio | difference | per round | in callbacks "
        "| reward tap |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for view in views.values():
        s = view["summary"]
        if not s:
            continue
        for arm, a in s["arms"].items():
            ratio = "—" if a["ratio"] is None else (f"**{a['ratio']:.3f}**" if arm != "without" else "1")
            rounds = ", ".join(f"{x:.3f}" for x in a["round_ratios"]) if arm != "without" else "—"
            lines.append(
                f"| {view['label']} | {ARMS[arm]} | {view['shape']['max_completion_length']} | "
                f"{a['timed_steps']} ({a['runs']}) | {a['median_ms']:.1f} ms | {ratio} | "
                f"{_ms(a['diff_ms'], True) if arm != 'without' else '—'} | {rounds or '—'} | "
                f"{_ms(a['callback_ms'], digits=2) if arm != 'without' else '—'} | "
                f"{_ms(a['reward_tap_ms'], True, 2) if arm != 'without' else '—'} |")
    lines.append("")
    for view in views.values():
        label, s, shape = view["label"], view["summary"], view["shape"]
        if view["failure"]:
            lines.append(f"{label}: **failed**, {view['failure']}." + (" Figures above: the runs that finished."
                                                                       if s else ""))
        if not s:
            continue
        cut = ""
        if s["rounds"] < (view["rounds_requested"] or 0) or s["steps"] < view["steps"]:
            cut = f" (cut from {view['rounds_requested']} rounds of {view['steps']} steps to fit the time budget)"
        orders = "; ".join(" → ".join(o) for o in s["orders"])
        warm = (f"an untimed {view['warm_run']['steps']}-step warm run ({ARMS[view['warm_run']['arm']]}) first"
                if view["warm_run"] else "no warm run")
        text = (f"{label}: {shape['per_device_train_batch_size']} completions per step ({shape['num_generations']} "
                f"per prompt) of {shape['max_completion_length']} tokens; {s['rounds']} round(s) of {s['steps']}-step "
                f"runs{cut}, {s['timed_steps_per_run']} timed steps each; {warm}; order per round: {orders}. "
                "Run medians: " + "; ".join(
                    f"{arm} {', '.join(f'{x:.0f}' for x in a['runs_ms'])} ms" for arm, a in s["arms"].items()) + ".")
        if "router_tap_ms" in s and view["is_moe"]:
            rest = s["arms"]["with-no-router"].get("diff_ms")
            text += (f" **Router tap** (*{ARMS['with']}* − *{ARMS['with-no-router']}*): "
                     f"{s['router_tap_ms']:+.1f} ms/step on the "
                     "medians, per round " + ", ".join(f"{x:+.0f}" for x in s["router_tap_round_ms"]) + " ms"
                     + (f"; the rest of the monitor (*{ARMS['with-no-router']}* − *{ARMS['without']}*): "
                        f"{rest:+.1f} ms/step." if rest is not None
                        else "."))
        monitored = {arm: a for arm, a in s["arms"].items() if arm != "without"}
        if monitored:
            faults = sorted({f for a in monitored.values() for f in a["monitor_faults"]})
            tapped = ", ".join(f"{a['moe_metrics']} ({arm}, router tap {'on' if a['router_tap'] else 'off'})"
                               for arm, a in monitored.items())
            text += (f" `moe/*` metrics logged per step: {tapped if view['is_moe'] else 0}; "
                     f"monitor faults: {'; '.join(faults) or 'none'}.")
        spreads = [max(a["runs_ms"]) / min(a["runs_ms"]) - 1 for a in s["arms"].values() if len(a["runs_ms"]) > 1]
        if spreads:
            text += (f" One arm's run medians (runs of the same shape) differ by up to {max(spreads):.0%}, so arm "
                     "differences of that size are within the run-to-run noise.")
        left = max(a["cuda_allocated_after_mib"] for a in s["arms"].values())
        if left:
            text += f" At most {left:.0f} MiB stayed allocated after a run."
        if view["env"]["stamp"] != env["stamp"]:
            text += f" These rows are from an earlier run, {view['env']['stamp'].strip('_')}"
            text += (f" ({_where(view['env'])})." if _where(view["env"]) != _where(env) else ", same software.")
        lines += [text, ""]
    return "\n".join(lines)


def plan(warm: dict[str, Any], steps: int, allotted_s: float, n_arms: int) -> tuple[float, int]:
    """Seconds per round and steps per run, fewer when even one round of full runs would not fit.

    The warm run's first step carries the one-time warm-up, so the estimate errs long: it only cuts
    steps; how many rounds run is decided by the rounds already measured.
    """
    step_s = statistics.median(warm["step_s"])
    setup_s = max(warm["wall_s"] - warm["steps"] * step_s, 0.0)
    if n_arms * (setup_s + steps * step_s) > allotted_s:
        steps = max(WARMUP + 2, min(steps, math.floor((allotted_s / n_arms - setup_s) / step_s)))
    return n_arms * (setup_s + steps * step_s), steps


def measure(name: str, spec: dict[str, Any], shape: dict[str, Any], steps: int, rounds: int, arms: list[str],
            opts: Any, workdir: Path, data: dict[str, Any], models_left: int) -> None:
    """Warm run and plan (optional), then rounds of one run per arm, order rotated; figures go into ``data``."""
    deadline = time.perf_counter() + (opts.budget_s - (time.perf_counter() - T0)) / models_left
    n_steps = steps
    if opts.warm_run:
        # Allocator, cuBLAS and the monitor's lazy imports, paid outside the timed runs; and the plan's step time.
        warm_arm = "with" if "with" in arms else arms[0]
        warm = one_run(name, spec, shape, warm_arm, WARM_RUN_STEPS, SEED, opts.device, workdir / "warm-run", skip=1)
        data["warmups"].append(warm)
        write_out(opts.out, data)
        allotted = deadline - time.perf_counter()
        round_s, n_steps = plan(warm, steps, allotted, len(arms))
        log(f"{name}: warm run ({warm_arm}) {warm['wall_s']:.1f} s (set-up {warm['setup_s']:.1f} s, "
            f"step ~{statistics.median(warm['step_s']) * 1e3:.0f} ms); {n_steps}-step runs, at most ~{round_s:.0f} s "
            f"a round, up to {rounds} round(s) in ~{allotted:.0f} s")
    runs: list[dict[str, Any]] = []
    round_walls: list[float] = []
    for k in range(rounds):
        if round_walls and time.perf_counter() + statistics.fmean(round_walls) > deadline:
            log(f"{name}: stopping after {k} round(s): another would end past the time budget")
            break
        t_round = time.perf_counter()
        for arm in rotated(arms, k):
            r = one_run(name, spec, shape, arm, n_steps, SEED + k, opts.device, workdir / f"round{k}-{arm}")
            r["round"] = k
            runs.append(r)
            data["runs"].append(r)
            write_out(opts.out, data)  # what finished survives a run cut short
            log(f"{name} round {k + 1} {arm:<14}: median step {statistics.median(r['step_s']) * 1e3:.1f} ms over "
                f"{len(r['step_s'])} steps, in callbacks {r['callback_s_per_step'] * 1e3:.2f} ms/step, "
                f"reward fns {r['reward_s_per_step'] * 1e3:.2f} ms/step, wall {r['wall_s']:.1f} s"
                + (f", {r['cuda_allocated_after_mib']:.0f} MiB left allocated" if "cuda_allocated_after_mib" in r
                   else ""))
            if r.get("monitor"):
                log(f"  monitor: {json.dumps(r['monitor'])}")
        round_walls.append(time.perf_counter() - t_round)
    s = data["summary"][name] = summarise(runs)
    write_out(opts.out, data)
    for arm, a in s["arms"].items():
        log(f"{name} {arm:<14}: median {a['median_ms']:.1f} ms over {a['timed_steps']} steps"
            + (f", ratio {a['ratio']:.3f} ({a['diff_ms']:+.1f} ms), per round "
               f"{', '.join(f'{x:.3f}' for x in a['round_ratios'])}" if a["ratio"] is not None and arm != "without"
               else "")
            + (f", in callbacks {a['callback_ms']:.2f} ms/step" if arm != "without" else ""))
    if "router_tap_ms" in s:
        log(f"{name}: router tap (with - with-no-router) {s['router_tap_ms']:+.1f} ms/step, per round "
            + ", ".join(f"{x:+.1f}" for x in s["router_tap_round_ms"]))


def write_out(out: Path | None, data: dict[str, Any]) -> None:
    if out is None:
        return
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_overhead.json").write_text(json.dumps(data, indent=1))
    if data.get("runs") or data.get("failures"):
        (out / "gpu_overhead.md").write_text(render(model_views(data), data["env"]))


def merged(paths: list[Path]) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """The models of several saved benchmarks (a later file's model replaces an earlier one's) and the
    latest file's environment."""
    views: dict[str, dict[str, Any]] = {}
    env: dict[str, Any] = {}
    for path in paths:
        data = json.loads(path.read_text())
        views.update(model_views(data))
        env = data["env"]
    return views, env


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--arms", default="without,with",
                   help=f"comma-separated arms, run in this order in round 0 and rotated after: {', '.join(ARMS)} "
                        "(default without,with)")
    p.add_argument("--rounds", "--pairs", dest="rounds", type=int, default=None,
                   help="rounds of one run per arm, per model, at most (default 3; quick 1); --pairs is the old name")
    p.add_argument("--steps", type=int, default=None,
                   help=f"steps per run, the first {WARMUP} untimed (default 11; quick 5)")
    p.add_argument("--max-completion-length", type=int, default=None,
                   help="completion tokens per sample, all generated (default 128; quick 16)")
    p.add_argument("--warm-run", action=argparse.BooleanOptionalAction, default=None,
                   help=f"train an untimed {WARM_RUN_STEPS}-step run with the monitor before each model's rounds and "
                        "plan the rounds from it (default: on for CUDA, off on the CPU)")
    p.add_argument("--models", default="dense,moe", help="comma-separated: dense, moe")
    p.add_argument("--budget-s", type=float, default=240.0,
                   help="seconds from the start of the script within which the rounds are planned (default 240)")
    p.add_argument("--quick", action="store_true", help="tiny shapes, for a smoke test on the CPU")
    p.add_argument("--out", type=Path, default=None, help="also write gpu_overhead.json and gpu_overhead.md here")
    p.add_argument("--no-results", action="store_true", help="do not rewrite benchmarks/RESULTS.md")
    p.add_argument("--from-json", type=Path, nargs="+", default=None,
                   help="render saved gpu_overhead.json files into RESULTS.md (a model in a later file replaces "
                        "the same model of an earlier one)")
    opts = p.parse_args()

    if opts.from_json:
        views, env = merged(opts.from_json)
        body = render(views, env)
        print(body)
        if not opts.no_results:
            update_section(SECTION, body)
            print(f"updated the {SECTION} section of benchmarks/RESULTS.md")
        return 0

    arms = list(dict.fromkeys(a.strip() for a in opts.arms.split(",") if a.strip()))
    if not arms or set(arms) - set(ARMS):
        p.error(f"unknown arm {sorted(set(arms) - set(ARMS))}; choose from {', '.join(ARMS)}")

    import torch

    if opts.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"gpu_overhead: no CUDA device visible to torch {torch.__version__}; pass --device cpu for a smoke test",
              flush=True)
        return 2
    rounds = opts.rounds or (1 if opts.quick else 3)
    steps = opts.steps or (5 if opts.quick else 11)
    if steps <= WARMUP:
        p.error(f"--steps must exceed the {WARMUP} untimed warm-up steps")
    if opts.warm_run is None:
        opts.warm_run = opts.device.startswith("cuda")
    models = QUICK_MODELS if opts.quick else MODELS
    names = [n.strip() for n in opts.models.split(",") if n.strip()]
    unknown = sorted(set(names) - set(models))
    if unknown:
        p.error(f"unknown model {unknown}; choose from {', '.join(models)}")
    shape = dict(QUICK_STEP_SHAPE if opts.quick else STEP_SHAPE)
    if opts.max_completion_length:
        shape["max_completion_length"] = opts.max_completion_length

    warnings.filterwarnings("ignore")
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    logging.getLogger("grpo_monitor").setLevel(logging.ERROR)  # findings on random weights are expected
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if opts.device == "cpu":
        torch.set_num_threads(1)
    else:  # CUDA context and cuBLAS, so that the first run's set-up time is that of a run
        x = torch.ones(256, 256, device=opts.device, dtype=torch.bfloat16)
        (x @ x).sum().item()
    import trl  # noqa: F401  - imported here, not inside the first run's set-up time

    from grpo_monitor import callbacks  # noqa: F401
    from grpo_monitor import detectors  # noqa: F401

    env = environment(opts.device)
    log("env: " + ", ".join(f"{k} {v}" for k, v in env.items() if k != "stamp"))
    log(f"arms {', '.join(arms)} (rotated every round); up to {rounds} round(s) of {steps}-step runs; "
        f"{shape['max_completion_length']} completion tokens; warm run {'on' if opts.warm_run else 'off'}")
    data: dict[str, Any] = {"env": env, "shape": shape, "steps": steps, "warmup": WARMUP, "arms": arms,
                            "rounds_requested": rounds, "warm_run": opts.warm_run, "budget_s": opts.budget_s,
                            "labels": {n: models[n]["label"] for n in names},
                            "models": {n: models[n]["config"] for n in names}, "runs": [], "warmups": [],
                            "summary": {}, "failures": {}}
    write_out(opts.out, data)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("GRPO_MONITOR_CACHE", str(Path(tmp) / "cache"))  # the task tokenizer's files
        for i, name in enumerate(names):
            try:
                measure(name, models[name], shape, steps, rounds, arms, opts, Path(tmp) / name, data, len(names) - i)
            except Exception as exc:  # noqa: BLE001 - the other model's figures are still worth having
                import traceback

                traceback.print_exc()
                data["failures"][name] = f"{type(exc).__name__}: {exc}"
                write_out(opts.out, data)
                log(f"{name}: FAILED ({type(exc).__name__}: {exc})")
    body = render(model_views(data), env)
    print(body, flush=True)
    if opts.out:
        print(f"wrote {opts.out / 'gpu_overhead.json'} and {opts.out / 'gpu_overhead.md'}")
    if not opts.no_results and data["summary"]:
        update_section(SECTION, body)
        print(f"updated the {SECTION} section of benchmarks/RESULTS.md")
    log("done" + (f"; failed: {', '.join(data['failures'])}" if data["failures"] else ""))
    return 1 if data["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
