"""``grpo-monitor demo``: a real GRPO run on a tiny local model with the monitor attached."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

DEFAULT_STEPS = 60

# Real training settings that drive the tiny model into each behaviour (measured on this model).
# A failure starts after a healthy phase (``switch``: from that step on, the setting changes), so
# the run has a baseline of its own to be compared with, as a real run does.
SCENARIOS: dict[str, dict[str, Any]] = {
    "healthy": {"config": {}, "extra_rewards": [], "steps": 60, "switch": None,
                "what": "the recipe's plain GRPO: correctness improves, entropy settles"},
    "collapse": {"config": {"lr_scheduler_type": "constant", "max_completion_length": 32}, "extra_rewards": [],
                 "steps": 70, "switch": {"at": 25, "learning_rate": 5e-3},
                 "what": "from step 25 the learning rate jumps to 5e-3: completions turn identical and entropy collapses"},
    "length": {"config": {"loss_type": "grpo", "max_completion_length": 64, "learning_rate": 1e-3},
               "extra_rewards": ["length_bonus_reward"], "steps": 150, "switch": None,
               "what": "a reward paying 0.05 per token under loss_type='grpo': length runs to the cap, correctness does not move"},
    "degenerate": {"config": {"entropy_coef": 1e-4, "max_completion_length": 16, "learning_rate": 3e-4,
                              "lr_scheduler_type": "constant"},
                   "extra_rewards": [], "steps": 120, "switch": {"at": 25, "entropy_coef": 1.0},
                   "what": "from step 25 an entropy bonus of 1.0: entropy rises, completions grow to the cap, reward falls"},
}


def _scenario_switch(trainer: Any, switch: dict[str, Any]):
    """Changes a training setting mid-run, the way a bad schedule or a config edit would."""
    from transformers import TrainerCallback

    class ScenarioSwitch(TrainerCallback):
        def on_step_begin(self, args, state, control, optimizer=None, lr_scheduler=None, **kwargs):
            if state.global_step < switch["at"]:
                return
            if "learning_rate" in switch and optimizer is not None:
                for group in optimizer.param_groups:
                    group["lr"] = switch["learning_rate"]
                if lr_scheduler is not None and hasattr(lr_scheduler, "base_lrs"):
                    lr_scheduler.base_lrs = [switch["learning_rate"]] * len(lr_scheduler.base_lrs)
            if "entropy_coef" in switch:
                trainer.entropy_coef = switch["entropy_coef"]
            if "reward_weights" in switch:
                import torch

                trainer.reward_weights = torch.tensor(switch["reward_weights"], dtype=torch.float32)

    return ScenarioSwitch()


def scenario_rewards(name: str) -> list[Any]:
    from fixtures import tiny

    return [*tiny.REWARD_FUNCS, *(getattr(tiny, r) for r in SCENARIOS[name]["extra_rewards"])]


def demo_settings(steps: int, report_to: str = "none", **overrides: Any) -> dict[str, Any]:
    """The demo's GRPOConfig keywords: CPU-safe, per-step logging, the recipe's 8 generations."""
    kwargs: dict[str, Any] = dict(
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
    return kwargs


def demo_config(output_dir: str | os.PathLike[str], steps: int, report_to: str = "none", **overrides: Any):
    from trl import GRPOConfig

    return GRPOConfig(output_dir=str(output_dir), **demo_settings(steps, report_to, **overrides))


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


def build_scenario_trainer(args: Any, scenario: str = "healthy", moe: bool = False):
    """The tiny-model trainer of a scenario: its reward functions and its mid-run switch."""
    spec = SCENARIOS[scenario]
    trainer = build_trainer(args, moe=moe, reward_funcs=scenario_rewards(scenario))
    if spec["switch"]:
        trainer.add_callback(_scenario_switch(trainer, spec["switch"]))
    return trainer


def run_demo(
    run_dir: str | os.PathLike[str] | None = None,
    steps: int | None = None,
    moe: bool = False,
    report_to: str = "none",
    quiet: bool = False,
    scenario: str = "healthy",
    auto_restart: bool = False,
    max_restarts: int = 2,
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
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; choose from {', '.join(SCENARIOS)}")
    spec = SCENARIOS[scenario]
    steps = steps or spec["steps"]
    root = Path(run_dir) if run_dir else Path("runs") / time.strftime(f"demo-{scenario}-%Y%m%d-%H%M%S")
    args = demo_config(root / "trainer", steps, report_to=report_to, **spec["config"])
    if not quiet:
        print(f"grpo-monitor demo: scenario '{scenario}' — {spec['what']}"
              + (f"; auto-restart on (max {max_restarts})" if auto_restart else ""), flush=True)

    def make_trainer(a: Any) -> Any:
        trainer = build_scenario_trainer(a, scenario, moe=moe)
        for cb in (PrinterCallback, ProgressCallback):
            trainer.remove_callback(cb)
        if not quiet:
            trainer.add_callback(_progress_callback(steps))
        return trainer

    t0 = time.time()
    if auto_restart:
        from monitor.lineage import run_with_restarts

        lineage = run_with_restarts(make_trainer, args, run_dir=root, max_restarts=max_restarts)
        if not quiet:
            for seg in lineage.segments:
                print_summary(seg.run_dir, time.time() - t0, title=f"segment {seg.index}"
                              + (f" ({seg.variant}: {seg.overrides})" if seg.variant else " (plain GRPO)"))
        return root
    trainer = make_trainer(args)
    attach(trainer, root)
    trainer.train()
    if not quiet:
        print_summary(root, time.time() - t0)
    return root


def _progress_callback(total: int):
    # Prints every 5th step; a restarted segment counts its steps again from its resume point.
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


def print_summary(run_dir: Path, seconds: float, title: str | None = None) -> None:
    from monitor.runlog import read_run

    log = read_run(run_dir)
    model = log.header.get("model", {})
    last = log.steps[-1]["metrics"] if log.steps else {}

    def fmt(key: str) -> str:
        v = last.get(key)
        return "—" if v is None else f"{v:.3g}"

    kind = f"MoE {model.get('num_experts')} experts top-{model.get('top_k')}" if model.get("is_moe") else "dense"
    if title:
        print(f"-- {title}")
    print(f"grpo-monitor demo: {len(log.steps)} steps of GRPO on a tiny {model.get('class')} ({kind}, "
          f"{model.get('num_parameters'):,} parameters) in {seconds:.1f} s")
    print(f"  last step: entropy {fmt('entropy')}, reward {fmt('reward')}, mean length {fmt('completions/mean_length')}, "
          f"clipped {fmt('completions/clipped_ratio')}")
    print(f"  samples recorded: {len(log.samples)}; findings: {len(log.findings)}")
    for f in log.findings:
        print(f"  [{f['severity']}] {f['detector']} at step {f['step']}: {f['message']}")
    for r in log.recommendations:
        print(f"  recommended {r['variant']}: {r['python']}  |  {r['cli_flags']}")
    for r in log.restarts:
        print(f"  stopped at step {r['step']} to restart with {r['variant']} "
              f"(resume from {r['resume_from'] or 'the initial model'}) → {run_dir / r['child_run']}")
    print(f"  run directory: {run_dir}")
    print(f"  next: grpo-monitor analyze {run_dir}   |   grpo-monitor watch {run_dir}")
