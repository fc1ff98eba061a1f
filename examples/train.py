"""A GRPO training script as users write them: TRL flags in, the monitor attached in two lines.

    python examples/train.py --output_dir outputs/ex --max_steps 60 [--scenario collapse] [--moe]
    grpo-monitor supervise --run-dir runs/ex -- python examples/train.py --output_dir outputs/ex --scenario collapse

Every ``GRPOConfig`` field is a flag (``--loss_type dr_grpo``), so the supervisor's appended
restart flags reach the config; ``--resume_from_checkpoint`` is honoured like TRL's own script.
The tiny local model and toy task stand in for a real model and dataset.
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing


@dataclass
class ScriptArguments:
    scenario: str = field(default="healthy", metadata={"help": "healthy, collapse, sudden_collapse, length or degenerate"})
    moe: bool = field(default=False, metadata={"help": "train the tiny 8-expert Qwen3-MoE"})


def main() -> None:
    import transformers
    from transformers import HfArgumentParser
    from trl import GRPOConfig

    from grpo_monitor import attach
    from grpo_monitor.app.demo import SCENARIOS, build_scenario_trainer, demo_settings
    from grpo_monitor.core.restart import patched_args

    warnings.filterwarnings("ignore", category=FutureWarning)
    transformers.logging.set_verbosity_error()
    parser = HfArgumentParser((ScriptArguments, GRPOConfig))
    script, _ = parser.parse_known_args()
    # The scenario's settings and the CPU-safe demo settings are defaults: any flag given wins.
    scenario = SCENARIOS[script.scenario]
    parser.set_defaults(output_dir="outputs/example", **demo_settings(scenario["steps"], **scenario["config"]))
    script, args = parser.parse_args_into_dataclasses()
    args = patched_args(args)  # no-op unless relaunched with GRPO_MONITOR_OVERRIDES and no flags applied

    trainer = build_scenario_trainer(args, script.scenario, moe=script.moe)
    attach(trainer)
    trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
    print(f"rank {args.process_index}: trained to step {trainer.state.global_step}", flush=True)


if __name__ == "__main__":
    main()
