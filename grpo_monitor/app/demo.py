"""``grpo-monitor demo``: a real GRPO run on a tiny local model with the monitor attached."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

DEFAULT_STEPS = 60

# Each failure is driven by a mechanism whose outcome does not hang on the trajectory a CPU's
# rounding takes: a sampling temperature (the sampled distribution is sharpened or flattened by
# arithmetic, whatever the weights are), a learning rate so large that one Adam step moves every
# weight by more than its own size, a length the sampler is made to reach (min_new_tokens) under a
# reward that pays per token. A failure starts after a healthy
# phase (``switch``: from that step on, the setting changes), so the run has a baseline of its own
# to be compared with, as a real run does. The switch is part of the scenario's training script, so
# a restarted segment meets it again, as it would in a real script: a restart cures a scenario only
# where the recommended change removes the cause (``restart``: what it cures, or what it cannot).
SCENARIOS: dict[str, dict[str, Any]] = {
    "healthy": {"config": {}, "extra_rewards": [], "steps": 60, "switch": None,
                # The warm-started tiny model already solves most of the toy task: plain GRPO keeps it there.
                "what": "the recipe's plain GRPO on a warm-started model: reward holds near its level (about 1 of "
                        "1.5), entropy stays steady, nothing about the training is flagged (pre-flight advice on "
                        "the recipe, such as GSPO for --moe, is printed as training starts and listed apart: it is "
                        "not a flag on the training)",
                "restart": None},
    "collapse": {"config": {"lr_scheduler_type": "constant", "max_completion_length": 32,
                            "save_strategy": "steps", "save_steps": 5},
                 "extra_rewards": [], "steps": 60, "switch": {"at": 25, "temperature": 0.05, "over": 3},
                 "what": "from step 25 a sampling-temperature schedule anneals to 0.05: completions turn "
                         "identical within each group and entropy collapses",
                 "restart": {"cures": False,
                             "note": "the temperature schedule is in this scenario's training script, so every "
                                     "restarted segment meets it again: DAPO changes the loss (clip-higher, truncated "
                                     "completions masked), not a sampler the script anneals, so its segment collapses "
                                     "too, and the monitor reports DAPO as tried instead of restarting in a loop. A "
                                     "restart cures a cause in the training config (see --scenario sudden_collapse and "
                                     "--scenario length); a cause in the script needs the script changed"}},
    "sudden_collapse": {"config": {"lr_scheduler_type": "constant", "max_completion_length": 32,
                                   "save_strategy": "steps", "save_steps": 5},
                        "extra_rewards": [], "steps": 50, "switch": {"at": 25, "lr_factor": 3000.0},
                        "what": "from step 25 the learning-rate schedule multiplies the rate by 3000 (a warm "
                                "restart given in the wrong units): one Adam step wrecks the weights and "
                                "the reward crashes",
                        "restart": {"cures": True,
                                    "note": "the schedule multiplies learning_rate, so the restart's lower "
                                            "learning_rate, resumed from the checkpoint before the crash, makes its "
                                            "jump land at a rate one Adam step survives"}},
    "length": {"config": {"loss_type": "grpo", "max_completion_length": 64, "lr_scheduler_type": "constant"},
               "extra_rewards": ["length_bonus_reward"], "steps": 70,
               # The curriculum stands for what a reward paying per token teaches a real policy (every
               # extra token pays, so longer completions win each group), which a 76k-parameter model
               # learns too slowly for a demo: it grows only while that reward is weighted into the total.
               "switch": {"at": 20, "min_new_tokens_per_step": 1, "while_paid": "length_bonus_reward"},
               "what": "a reward paying 0.05 per token (length_bonus_reward), and from step 20 a length curriculum "
                       "(min_new_tokens) that grows a token a step while that reward is paid, as a policy learns what "
                       "it is paid for: length and reward rise together, correctness does not move",
               "restart": {"cures": True,
                           "note": "the cause is a reward function: length_bonus_reward pays per token; the restart "
                                   "weighs it out (reward_weights), so nothing pays for length any more. A loss "
                                   "variant (Dr. GRPO) cannot remove a reward that pays per token"}},
    # Four prompts a step and a longer warm start: correctness starts well above its step-to-step
    # noise, so its fall is plain; the slow heat makes it a degeneration, not a crash.
    "degenerate": {"config": {"max_completion_length": 16, "lr_scheduler_type": "constant",
                              "per_device_train_batch_size": 32},
                   "warm_start": 600, "extra_rewards": [], "steps": 100,
                   "switch": {"at": 25, "temperature": 12.0, "over": 80},
                   "what": "from step 25 a sampling-temperature schedule heats up to 12 over 80 steps: "
                           "entropy rises, completions turn to gibberish at the cap, reward falls",
                   "restart": {"cures": False,
                               "note": "the temperature schedule is in this scenario's training script, so a "
                                       "restarted segment meets it again: a variant changes the loss, not a sampler "
                                       "the script heats"}},
}


def temperature_at(switch: dict[str, Any], step: int, start: float = 1.0) -> float:
    """The scheduled sampling temperature at ``step``: geometric from ``start`` to the target over
    ``over`` steps after ``at`` (a schedule in log space, as temperature acts on logits)."""
    over = max(1, int(switch.get("over", 1)))
    done = min(max(step - switch["at"], 0) + 1, over) / over
    return float(start * (switch["temperature"] / start) ** done)


def set_temperature(trainer: Any, temperature: float) -> None:
    """Samples and scores at ``temperature`` from now on, the way TRL does from the config: the
    generation config, and the fused LM head that divides the logits for the log-probabilities
    and the logged entropy (built once in the trainer's __init__, so it is built again here)."""
    from trl.trainer.utils import add_fused_lm_head

    trainer.temperature = temperature
    if getattr(trainer, "generation_config", None) is not None:
        trainer.generation_config.temperature = temperature
    if isinstance(getattr(trainer, "generation_kwargs", None), dict):
        trainer.generation_kwargs["temperature"] = temperature
    model = trainer.accelerator.unwrap_model(trainer.model)
    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    # Patch over TRL's own head each time, never over our last patch: one wrapper deep, whatever the schedule.
    first = model.__dict__.setdefault("_grpo_monitor_trl_forward", model.forward)
    model.forward = first
    add_fused_lm_head(model, temperature=temperature,
                      cast_lm_head_to_fp32=bool(getattr(trainer.args, "cast_lm_head_to_fp32", False)),
                      outputs=("log_probs", "entropy"))


def _scenario_switch(trainer: Any, switch: dict[str, Any]):
    """Changes a training setting mid-run, the way a bad schedule or a config edit would."""
    from transformers import TrainerCallback

    class ScenarioSwitch(TrainerCallback):
        temperature: float | None = None

        def on_step_begin(self, args, state, control, optimizer=None, lr_scheduler=None, **kwargs):
            if state.global_step < switch["at"]:
                return
            lr = None
            if "learning_rate" in switch:
                lr = float(switch["learning_rate"])
            elif "lr_factor" in switch:
                lr = float(args.learning_rate) * float(switch["lr_factor"])
            if lr is not None and optimizer is not None:
                for group in optimizer.param_groups:
                    group["lr"] = lr
                if lr_scheduler is not None and hasattr(lr_scheduler, "base_lrs"):
                    lr_scheduler.base_lrs = [lr] * len(lr_scheduler.base_lrs)
            if "temperature" in switch:
                t = temperature_at(switch, state.global_step, float(args.temperature))
                if t != self.temperature:
                    set_temperature(trainer, t)
                    self.temperature = t
            if "min_new_tokens_per_step" in switch and getattr(trainer, "generation_config", None) is not None:
                cap = int(args.max_completion_length or 0)
                grow = int((state.global_step - switch["at"] + 1) * switch["min_new_tokens_per_step"])
                if switch.get("while_paid") and not _is_paid(trainer, switch["while_paid"]):
                    grow = 0
                trainer.generation_config.min_new_tokens = max(0, min(grow, cap - 1))
            if "entropy_coef" in switch:
                trainer.entropy_coef = switch["entropy_coef"]
            if "reward_weights" in switch:
                import torch

                trainer.reward_weights = torch.tensor(switch["reward_weights"], dtype=torch.float32)

    return ScenarioSwitch()


def _is_paid(trainer: Any, reward_name: str) -> bool:
    """Whether the trainer weighs reward ``reward_name`` into the total it trains on."""
    names = list(getattr(trainer, "reward_func_names", None) or [])
    weights = getattr(trainer, "reward_weights", None)
    if reward_name not in names or weights is None:
        return reward_name in names
    return float(weights[names.index(reward_name)]) != 0.0


def scenario_rewards(name: str) -> list[Any]:
    from grpo_monitor.fixtures import tiny

    return [*tiny.REWARD_FUNCS, *(getattr(tiny, r) for r in SCENARIOS[name]["extra_rewards"])]


# The pre-flight check reports two of the demo's own settings (config_learning_rate, config_beta) as
# info: they are chosen for a 76k-parameter model on a CPU, and the demo says so up front.
DEMO_SETTINGS_NOTE = ("settings for a 76k-parameter model on a CPU (the pre-flight notes on them are expected): "
                      "learning_rate=3e-4, since the recipe's 5e-7 is sized for billion-parameter models and would "
                      "leave this one unmoved; beta=0, no reference model, as DAPO and Dr. GRPO also run")


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

    from grpo_monitor.fixtures.tiny import REWARD_FUNCS, build_dataset, build_model, build_tokenizer

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
    trainer = build_trainer(args, moe=moe, reward_funcs=scenario_rewards(scenario),
                            warm_start=spec.get("warm_start", WARM_START_STEPS))
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

    from grpo_monitor.callbacks import attach

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
        print("  " + DEMO_SETTINGS_NOTE, flush=True)

    def make_trainer(a: Any) -> Any:
        trainer = build_scenario_trainer(a, scenario, moe=moe)
        for cb in (PrinterCallback, ProgressCallback):
            trainer.remove_callback(cb)
        if not quiet:
            trainer.add_callback(_progress_callback(steps))
        return trainer

    t0 = time.time()
    if auto_restart:
        from grpo_monitor.callbacks.restarts import run_with_restarts

        lineage = run_with_restarts(make_trainer, args, run_dir=root, max_restarts=max_restarts)
        if not quiet:
            print_lineage_summary(root, time.time() - t0, outcome=restart_outcome(scenario, lineage, steps))
        return root
    trainer = make_trainer(args)
    attach(trainer, root)
    trainer.train()
    if not quiet:
        print_summary(root, time.time() - t0)
    return root


def lineage_exit_code(root: str | os.PathLike[str]) -> tuple[int, str]:
    """The exit code of a lineage (``demo --auto-restart``, ``supervise``) and the sentence saying why.

    Its last segment decides: 0 when that segment ended with no warning or critical finding on the training,
    the earlier segments' findings having been acted on by the restarts that followed them; 1 when it still
    has one (not cured, or no restart left). Pre-flight advice on the recipe never counts, as in ``analyze``.
    """
    from grpo_monitor.core.exit_codes import ExitCode
    from grpo_monitor.core.lineage import read_lineage
    from grpo_monitor.core.runlog import read_run

    segments = read_lineage(root).segments
    last = segments[-1]
    flagged = [f["detector"] for f in read_run(last.run_dir).findings
               if f.get("severity") in ("warning", "critical") and not str(f.get("detector", "")).startswith("config_")]
    n = last.index + 1
    if flagged:
        return ExitCode.FINDINGS, (f"exit 1: segment {n}, the last, still has {', '.join(dict.fromkeys(flagged))}"
                                   + (" (not cured by the restart)" if n > 1 else ""))
    if n == 1:
        return ExitCode.CLEAN, "exit 0: no warning or critical finding on the training"
    return ExitCode.CLEAN, (f"exit 0: segment {n}, the last, ended with no warning or critical finding; the findings "
                            f"of segment{'s 1-' + str(n - 1) if n > 2 else ' 1'} were acted on by the restart"
                            f"{'s' if n > 2 else ''} (see them above, and in grpo-monitor analyze {root})")


def print_lineage_summary(root: str | os.PathLike[str], seconds: float | None = None, outcome: str | None = None) -> int:
    """Each segment's summary, then the lineage's: how it ended and the exit code that follows
    (``lineage_exit_code``), which it returns. ``outcome``: a sentence on what the restarts did."""
    from grpo_monitor.core.lineage import read_lineage

    segments = read_lineage(root).segments
    for seg in segments:
        # Segments are counted from 1, as the dashboard and analyze show them.
        print_summary(seg.run_dir, title=f"segment {seg.index + 1}"
                      + (f" ({seg.variant}: {seg.overrides})" if seg.variant else " (plain GRPO)"))
    took = f" in {seconds:.1f} s" if seconds is not None else ""
    print(f"-- the whole lineage ({len(segments)} segment{'s' if len(segments) != 1 else ''}){took}")
    if outcome:
        print("  " + outcome)
    code, why = lineage_exit_code(root)
    print("  " + why)
    print(f"  next: grpo-monitor analyze {root}   |   grpo-monitor watch {root}")
    return code


def restart_outcome(scenario: str, lineage: Any, steps: int) -> str:
    """One sentence on what the restarts did: the last segment recovered (ran to its end with no warning or
    critical finding, the rule ``lineage_exit_code`` exits by), or what a restart can and cannot fix here."""
    from grpo_monitor.core.runlog import read_run

    spec = SCENARIOS[scenario].get("restart") or {}
    last = lineage.segments[-1]
    log = read_run(last.run_dir)
    ended = bool(log.steps) and int(log.steps[-1]["step"]) >= steps and not log.restarts
    open_critical = [f["detector"] for f in log.findings if f["severity"] in ("warning", "critical")
                     and not str(f["detector"]).startswith("config_")]
    if len(lineage.segments) == 1:
        head = "no restart: nothing confirmed a failure" if ended else "no restart"
    elif ended and not open_critical:
        head = (f"recovered: segment {last.index + 1} ({last.variant or 'plain GRPO'}) ran to step {steps} "
                "with no warning or critical finding")
    else:
        head = (f"not recovered: segment {last.index + 1} ({last.variant or 'plain GRPO'}) "
                + (f"raised {', '.join(dict.fromkeys(open_critical))} again" if open_critical else "did not reach its end"))
    if not spec.get("note"):
        return head
    return f"{head} — {'what the restart fixes' if spec.get('cures') else 'what a restart cannot fix'}: {spec['note']}"


PROGRESS_KEYS = (("entropy", "entropy"), ("reward", "reward"), ("completions/mean_length", "length"),
                 ("completions/clipped_ratio", "clipped"))


def _progress_callback(total: int):
    # Prints every 5th step; a restarted segment counts its steps again from its resume point. With
    # steps_per_generation above the accumulation, TRL logs the completions' metrics on generation
    # steps only: the line then shows the latest generation's, with the step it came from.
    from transformers import TrainerCallback

    class DemoProgress(TrainerCallback):
        def __init__(self) -> None:
            self.last: dict[str, tuple[float, int]] = {}

        def on_log(self, args, state, control, logs=None, **kwargs):
            if not logs or "train_runtime" in logs:
                return
            step = state.global_step
            for key, _ in PROGRESS_KEYS:
                if isinstance(logs.get(key), (int, float)):
                    self.last[key] = (float(logs[key]), step)
            if step == 1 or step % 5 == 0 or step == total:
                print("  " + progress_line(step, total, self.last), flush=True)

    return DemoProgress()


def progress_line(step: int, total: int, last: dict[str, tuple[float, int]]) -> str:
    """``step  12/60  entropy 0.5  reward 1 (step 9)  ...``: each value as of its latest logged step.

    >>> progress_line(12, 60, {"entropy": (0.5, 12), "reward": (1.0, 9)})
    'step   12/60  entropy 0.5  reward 1 (step 9)  length —  clipped —'
    """
    parts = [f"step {step:>4}/{total}"]
    for key, label in PROGRESS_KEYS:
        if key not in last:
            parts.append(f"{label} —")
            continue
        value, at = last[key]
        parts.append(f"{label} {value:.3g}" + (f" (step {at})" if at != step else ""))
    return "  ".join(parts)


def segment_seconds(log: Any) -> float | None:
    """How long one run log's own training took: its header's start to its last step."""
    start = log.header.get("start_time")
    end = log.steps[-1].get("time") if log.steps else None
    if not isinstance(start, (int, float)) or not isinstance(end, (int, float)):
        return None
    return max(0.0, float(end) - float(start))


def print_summary(run_dir: Path, seconds: float | None = None, title: str | None = None) -> None:
    from grpo_monitor.core.recommend import title as rec_title
    from grpo_monitor.core.restart import child_run_dir
    from grpo_monitor.core.runlog import read_run
    from grpo_monitor.core.runlog_writer import write_losses

    from grpo_monitor.analysis.render import advised_note
    from grpo_monitor.analysis.run_report import shown_recommendations

    log = read_run(run_dir)
    if seconds is None:
        seconds = segment_seconds(log)
    model = log.header.get("model", {})
    loss = write_losses(log.notes)

    def fmt(key: str) -> str:
        # The latest logged value: off-policy steps log no completion metrics (steps_per_generation).
        v = next((s["metrics"][key] for s in reversed(log.steps) if isinstance(s["metrics"].get(key), (int, float))), None)
        return "—" if v is None else f"{v:.3g}"

    kind = f"MoE {model.get('num_experts')} experts top-{model.get('top_k')}" if model.get("is_moe") else "dense"
    if title:
        print(f"-- {title}")
    # Steps the writer could not write (the disk filled) were trained all the same: count them.
    trained = len(log.steps) + (loss.steps if loss is not None else 0)
    print(f"grpo-monitor demo: {trained} steps of GRPO on a tiny {model.get('class')} ({kind}, "
          f"{model.get('num_parameters'):,} parameters)" + (f" in {seconds:.1f} s" if seconds is not None else ""))
    if loss is not None:
        print(f"  not in the run log: {loss.line(len(log.steps))}")
    where = f"last recorded step ({log.steps[-1]['step']})" if loss is not None and log.steps else "last step"
    print(f"  {where}: entropy {fmt('entropy')}, reward {fmt('reward')}, mean length {fmt('completions/mean_length')}, "
          f"clipped {fmt('completions/clipped_ratio')}")
    # Pre-flight findings judge the recipe before the first step: advice, listed apart from the training's.
    preflight = [f for f in log.findings if str(f.get("detector", "")).startswith("config_")]
    training = [f for f in log.findings if not str(f.get("detector", "")).startswith("config_")]
    flags = sum(f.get("severity") in ("warning", "critical") for f in training)
    print(f"  samples recorded: {len(log.samples)}; findings on the training: {len(training)} ({flags} flagged: "
          f"warning or critical)")
    for f in training:
        print(f"  [{f['severity']}] {f['detector']} at step {f['step']}: {f['message']}")
    if preflight:
        print("  pre-flight advice on the recipe (checked as training began; not a flag on the training):")
        for f in preflight:
            print(f"    [{f['severity']}] {f['detector']}: {f['message']}")
    for r in shown_recommendations(log.recommendations):
        change = "  |  ".join(x for x in (r.get("python"), r.get("cli_flags")) if x)
        print(f"  {rec_title(r)}{advised_note(r)}" + (f": {change}" if change else ""))
        for key, advice in (r.get("extra") or {}).items():
            print(f"      also: {key} {advice}")
    for r in log.restarts:
        print(f"  stopped at step {r['step']} to restart with {r['variant']} "
              f"(resume from {r['resume_from'] or 'the initial model'}) → {child_run_dir(run_dir, r['child_run'])}")
    print(f"  run directory: {run_dir}")
    print(f"  next: grpo-monitor analyze {run_dir}   |   grpo-monitor watch {run_dir}")
