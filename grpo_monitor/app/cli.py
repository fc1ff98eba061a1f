"""The ``grpo-monitor`` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

EXIT_CLEAN, EXIT_FINDINGS, EXIT_BAD_INPUT = 0, 1, 2

# What each optional extra (pyproject.toml) installs, by the module names the verbs import. A verb checks
# for its extras before it starts, so a bare install gets one line naming them rather than a traceback.
EXTRA_MODULES = {
    "train": ("torch", "transformers", "trl", "accelerate", "datasets"),
    "tui": ("textual",),
    "preflight": ("yaml",),
    "tensorboard": ("tensorboard",),
    "trackers": ("wandb", "trackio"),
}
REPORT_TO_EXTRAS = {"tensorboard": "tensorboard", "wandb": "trackers", "trackio": "trackers"}


def missing_extras(*extras: str) -> list[str]:
    """The extras among ``extras`` with a module this environment cannot find (looked up, not imported)."""
    import importlib.util

    missing = []
    for extra in dict.fromkeys(extras):
        for name in EXTRA_MODULES[extra]:
            try:
                found = importlib.util.find_spec(name) is not None
            except (ImportError, ValueError):
                found = False
            if not found:
                missing.append(extra)
                break
    return missing


def _lacks_extras(verb: str, *extras: str) -> bool:
    missing = missing_extras(*extras)
    if missing:
        names = " and ".join(f"'{e}'" for e in missing)
        print(f"grpo-monitor {verb} needs the {names} extra{'s' if len(missing) > 1 else ''}: "
              f"pip install 'grpo-monitor[{','.join(missing)}]'", file=sys.stderr)
    return bool(missing)


def _parser() -> argparse.ArgumentParser:
    from grpo_monitor.core import __version__

    p = argparse.ArgumentParser(
        prog="grpo-monitor",
        description="Training-time diagnostics and GRPO-variant recommendations for TRL GRPOTrainer runs.",
    )
    p.add_argument("--version", action="version", version=f"grpo-monitor {__version__}")
    sub = p.add_subparsers(dest="verb", required=True, metavar="VERB")

    d = sub.add_parser("demo", help="run a real GRPO training on a tiny local model with the monitor attached")
    d.add_argument("--steps", type=int, default=None, help="training steps (default: the scenario's, 60 for healthy)")
    d.add_argument("--run-dir", default=None, help="run directory to write (default runs/demo-<time>)")
    d.add_argument("--moe", action="store_true", help="train the tiny 8-expert top-2 Qwen3-MoE instead of the dense model")
    d.add_argument("--report-to", default="none", help="passed to GRPOConfig(report_to=...), e.g. tensorboard")
    d.add_argument("--scenario", default="healthy", choices=("healthy", "collapse", "sudden_collapse", "length", "degenerate"),
                   help="drive the tiny model into a behaviour with real training settings")
    d.add_argument("--auto-restart", action="store_true", help="stop on a confirmed finding and restart with the recommended variant")
    d.add_argument("--max-restarts", type=int, default=2)

    a = sub.add_parser("analyze", help="diagnose finished runs: run directories, trainer_state.json, TensorBoard, CSV/JSONL")
    a.add_argument("paths", nargs="+", metavar="PATH")
    a.add_argument("--json", action="store_true", help="print one JSON document (fixed shape) instead of the report")
    a.add_argument("--logging-steps", type=_positive_int, default=None, metavar="N",
                   help="for a console log whose printed dicts carry no step and that does not say its logging_steps: "
                        "the k-th dict is step k*N")
    a.add_argument("--markdown", metavar="FILE", default=None, help="also write a shareable Markdown report")
    a.add_argument("--map", action="append", default=None, metavar="COLUMN=METRIC", dest="mapping",
                   help="read the log's COLUMN as METRIC (reward, entropy, length, clipped_ratio, correctness, "
                        "rewards/<name>/mean, ...); repeatable, e.g. --map score_mean=reward")
    a.add_argument("--model", metavar="MODEL", default=None,
                   help="the model the run trained, where the log does not name it: a hub id (Qwen/Qwen3-30B-A3B) or a "
                        "local model folder; a mixture-of-experts model gets GSPO as it does live")
    a.add_argument("--alerts", metavar="URL", default=None,
                   help="also post each run's verdict to a Slack, Discord or generic JSON webhook (see docs/ALERTS.md)")
    a.add_argument("--alerts-format", choices=("slack", "discord", "generic"), default=None,
                   help="the webhook's payload format (default: recognised from the URL)")
    a.add_argument("--alerts-min-severity", choices=("info", "warning", "critical"), default="warning",
                   help="post runs whose verdict reaches this (info: every run, healthy ones too; default warning)")

    s = sub.add_parser("supervise", help="run a training command; relaunch it with the recommended variant when the monitor stops it")
    s.add_argument("--max-restarts", type=int, default=2, help="restarts allowed (default 2)")
    s.add_argument("--run-dir", default=None, help="lineage run directory (default $GRPO_MONITOR_RUN_DIR or runs/supervised)")
    s.add_argument("--apply", choices=("both", "flags", "env"), default="both",
                   help="how the relaunch gets the overrides: appended TRL flags, GRPO_MONITOR_OVERRIDES, or both")
    s.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ...")

    w = sub.add_parser("watch", help="live dashboard of a run directory (or any run analyze reads)",
                       description="Live dashboard of a run directory (followed as it grows; a Trainer output_dir "
                                   "opens the grpo-monitor run directory in it) or of any log analyze reads (replayed). "
                                   "A path that does not exist, an empty folder or a path that cannot be read is "
                                   "reported in one line (exit 2); a run directory with no steps yet opens and waits.")
    w.add_argument("path", metavar="RUN", help="run directory, its run.jsonl, or any log analyze reads")
    w.add_argument("--wait", action="store_true",
                   help="wait for a run that has not started yet: open even if RUN does not exist yet, and show "
                        "a log that cannot be read on screen instead of exiting")

    from grpo_monitor.preflight.lint import add_lint_arguments
    from grpo_monitor.preflight.reward_gate import add_inspect_arguments

    lp = sub.add_parser("lint", help="pre-flight recipe checks and memory estimate of a TRL YAML/JSON config or a run directory")
    add_lint_arguments(lp)
    ip = sub.add_parser("inspect-rewards", help="reward-inspection gate: judge reward scores on 50-100 sampled completions")
    add_inspect_arguments(ip)
    return p


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of steps >= 1, got {text!r}")
    return n


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.verb == "demo":
        trackers = [REPORT_TO_EXTRAS[t] for t in str(args.report_to).replace(",", " ").split() if t in REPORT_TO_EXTRAS]
        if _lacks_extras("demo", "train", *trackers):
            return EXIT_BAD_INPUT
        from grpo_monitor.app.demo import run_demo

        run_demo(args.run_dir, steps=args.steps, moe=args.moe, report_to=args.report_to, scenario=args.scenario,
                 auto_restart=args.auto_restart, max_restarts=args.max_restarts)
        return EXIT_CLEAN
    if args.verb == "analyze":
        from grpo_monitor.analysis.report import run_cli

        code = run_cli(args.paths, as_json=args.json, markdown=args.markdown, logging_steps=args.logging_steps,
                       mapping=args.mapping, model=args.model)
        if args.alerts and code != EXIT_BAD_INPUT:
            from grpo_monitor.alerts import analyze_cli_post

            analyze_cli_post(args.paths, args.alerts, args.alerts_format, args.alerts_min_severity,
                             logging_steps=args.logging_steps, mapping=args.mapping, model=args.model)
        return code
    if args.verb == "supervise":
        from grpo_monitor.app.supervise import run_cli as supervise_cli

        return supervise_cli(args.command, args.run_dir, args.max_restarts, args.apply)
    if args.verb == "watch":
        if _lacks_extras("watch", "tui"):
            return EXIT_BAD_INPUT
        from grpo_monitor.readers import SourceError

        try:
            from grpo_monitor.app.dashboard import run_watch
        except ImportError as exc:
            print(f"grpo-monitor: the dashboard needs the 'tui' extra: pip install 'grpo-monitor[tui]' ({exc})", file=sys.stderr)
            return EXIT_BAD_INPUT
        try:
            run_watch(args.path, wait=args.wait)
        except SourceError as exc:
            print(f"grpo-monitor: {exc}", file=sys.stderr)
            return EXIT_BAD_INPUT
        return EXIT_CLEAN
    if args.verb == "lint":
        from grpo_monitor.preflight.lint import run_lint_cli

        return run_lint_cli(args)
    if args.verb == "inspect-rewards":
        # sampling from a model needs the training stack; the interactive gate needs the dashboard's
        if _lacks_extras("inspect-rewards", *(["train"] if args.demo or args.model else []),
                         *([] if args.auto else ["tui"])):
            return EXIT_BAD_INPUT
        from grpo_monitor.preflight.reward_gate import run_inspect_cli

        def open_screen(session, run_dir, funcs, source):  # type: ignore[no-untyped-def]
            from grpo_monitor.app.gate_screen import run_gate

            return run_gate(session, run_dir, funcs, source)

        try:
            return run_inspect_cli(args, open_screen)
        except ImportError as exc:
            print(f"grpo-monitor: inspect-rewards needs the 'train' and 'tui' extras ({exc})", file=sys.stderr)
            return EXIT_BAD_INPUT
    return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
