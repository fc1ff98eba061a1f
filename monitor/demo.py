"""``grpo-monitor demo``: a real GRPO run on a tiny local model with the monitor attached."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

DEFAULT_STEPS = 60


def demo_config(output_dir: str | os.PathLike[str], steps: int, report_to: str = "none", **overrides: Any):
    """The GRPOConfig the demo trains with: CPU-safe, per-step logging, the recipe's 8 generations."""
    from trl import GRPOConfig

    kwargs: dict[str, Any] = dict(
        output_dir=str(output_dir),
        max_steps=steps,
        per_device_train_batch_size=8,
        gradient_accumulation_steps=1,
        num_generations=8,
        max_completion_length=16,
        learning_rate=3e-4,
        beta=0.0,
        logging_steps=1,
        save_strategy="no",
        report_to=report_to,
        bf16=False,
        use_cpu=True,
        use_vllm=False,
        seed=3407,
        data_seed=3407,
        activation_checkpointing=False,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    kwargs.update(overrides)
    return GRPOConfig(**kwargs)


WARM_START_STEPS = 150


def build_trainer(args: Any, moe: bool = False, reward_funcs: Any = None, warm_start: int = WARM_START_STEPS):
    from trl import GRPOTrainer

    from fixtures.tiny import REWARD_FUNCS, build_dataset, build_model, build_tokenizer

    return GRPOTrainer(
        model=build_model(moe=moe, warm_start=warm_start),
        reward_funcs=list(reward_funcs or REWARD_FUNCS),
        args=args,
        train_dataset=build_dataset(),
        processing_class=build_tokenizer(),
    )


def run_demo(
    run_dir: str | os.PathLike[str] | None = None,
    steps: int = DEFAULT_STEPS,
    moe: bool = False,
    report_to: str = "none",
    quiet: bool = False,
) -> Path:
    import logging
    import warnings

    import transformers
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from callbacks import attach

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning)
    logging.getLogger("grpo_monitor").setLevel(logging.WARNING)
    root = Path(run_dir) if run_dir else Path("runs") / time.strftime("demo-%Y%m%d-%H%M%S")
    trainer_dir = root / "trainer"
    args = demo_config(trainer_dir, steps, report_to=report_to)
    trainer = build_trainer(args, moe=moe)
    for cb in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(cb)
    if not quiet:
        trainer.add_callback(_progress_callback(steps))
    attach(trainer, root)
    t0 = time.time()
    trainer.train()
    if not quiet:
        print_summary(root, time.time() - t0)
    return root


def _progress_callback(total: int):
    from transformers import TrainerCallback

    class DemoProgress(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if not logs or "train_runtime" in logs:
                return
            step = state.global_step
            if step == 1 or step % 5 == 0 or step == total:
                parts = [f"step {step:>4}/{total}"]
                for key, label in (("entropy", "entropy"), ("reward", "reward"),
                                   ("completions/mean_length", "length"), ("completions/clipped_ratio", "clipped")):
                    v = logs.get(key)
                    parts.append(f"{label} {v:.3g}" if isinstance(v, (int, float)) else f"{label} —")
                print("  " + "  ".join(parts), flush=True)

    return DemoProgress()


def print_summary(run_dir: Path, seconds: float) -> None:
    from monitor.runlog import read_run

    log = read_run(run_dir)
    model = log.header.get("model", {})
    last = log.steps[-1]["metrics"] if log.steps else {}

    def fmt(key: str) -> str:
        v = last.get(key)
        return "—" if v is None else f"{v:.3g}"

    kind = f"MoE {model.get('num_experts')} experts top-{model.get('top_k')}" if model.get("is_moe") else "dense"
    print(f"grpo-monitor demo: {len(log.steps)} steps of GRPO on a tiny {model.get('class')} ({kind}, "
          f"{model.get('num_parameters'):,} parameters) in {seconds:.1f} s")
    print(f"  last step: entropy {fmt('entropy')}, reward {fmt('reward')}, mean length {fmt('completions/mean_length')}, "
          f"clipped {fmt('completions/clipped_ratio')}")
    print(f"  samples recorded: {len(log.samples)}; findings: {len(log.findings)}")
    for f in log.findings:
        print(f"  [{f['severity']}] {f['detector']} at step {f['step']}: {f['message']}")
    print(f"  run directory: {run_dir}")
    print(f"  next: grpo-monitor analyze {run_dir}   |   grpo-monitor watch {run_dir}")
