"""The ``grpo-monitor`` command line."""

from __future__ import annotations

from grpo_monitor.core.exit_codes import ExitCode

import argparse
import sys
from collections.abc import Sequence


# What each optional extra (pyproject.toml) installs, by the module names the verbs import. A verb checks
# for its extras before it starts, so a bare install gets one line naming them rather than a traceback.
EXTRA_MODULES = {
    "train": ("torch", "transformers", "trl", "accelerate", "datasets"),
    "tui": ("textual",),
    "preflight": ("yaml",),
    "tensorboard": ("tensorboard",),
    "trackers": ("wandb", "trackio"),
    "report": ("matplotlib",),
    "mcp": ("mcp",),
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
    a.add_argument("--html", metavar="FILE", default=None,
                   help="also write one self-contained HTML page (curves with the findings marked, verdict, evidence, "
                        "recommended diff, notes); needs the 'report' extra")
    a.add_argument("--gpu-hour-price", type=_price, default=None, metavar="PRICE",
                   help="the price of one GPU-hour: the cost of each finding gets money figures too")
    a.add_argument("--devices", type=_positive_int, default=None, metavar="N",
                   help="the number of GPUs the run trained on, where the log does not record it (GPU-hours)")
    a.add_argument("--rules", metavar="FILE", default=None,
                   help="a team's rule file (JSON, YAML or TOML): extra checks that raise findings like the built-in "
                        "detectors (see the README)")
    a.add_argument("--map", action="append", default=None, metavar="COLUMN=METRIC", dest="mapping",
                   help="read the log's COLUMN as METRIC (reward, entropy, length, clipped_ratio, correctness, "
                        "rewards/<name>/mean, ...); repeatable, e.g. --map score_mean=reward")
    a.add_argument("--model", metavar="MODEL", default=None,
                   help="the model the run trained, where the log does not name it: a hub id (Qwen/Qwen3-30B-A3B) or a "
                        "local model folder; a mixture-of-experts model gets GSPO as it does live")
    a.add_argument("--alerts", metavar="URL", default=None,
                   help="also send each run's verdict to a Slack, Discord, Teams, PagerDuty or generic JSON webhook, "
                        "or mailto:ADDRESS (SMTP server from $GRPO_MONITOR_SMTP_URL); exit 4 when a message was not "
                        "confirmed delivered (see docs/ALERTS.md)")
    a.add_argument("--alerts-format", choices=("slack", "discord", "teams", "pagerduty", "generic"), default=None,
                   help="the webhook's payload format (default: recognised from the URL)")
    a.add_argument("--alerts-min-severity", choices=("info", "warning", "critical"), default="warning",
                   help="send runs whose verdict reaches this (warning, the default, includes runs that could not be "
                        "judged; info: every run, healthy ones too)")

    c = sub.add_parser("compare", help="compare runs side by side (an ablation, a sweep, a restarted run's segments): "
                                       "curves, verdicts, findings, the config that differs")
    c.add_argument("paths", nargs="+", metavar="RUN", help="two or more runs analyze reads, or one path holding several "
                                                           "(a restarted run's lineage, a folder of runs)")
    c.add_argument("--json", action="store_true", help="print one JSON document (fixed shape) instead of the text")
    c.add_argument("--html", metavar="FILE", default=None,
                   help="also write one self-contained HTML page (curves overlaid per metric); needs the 'report' extra")
    c.add_argument("--map", action="append", default=None, metavar="COLUMN=METRIC", dest="mapping",
                   help="read the logs' COLUMN as METRIC, as analyze --map does")
    c.add_argument("--logging-steps", type=_positive_int, default=None, metavar="N",
                   help="for console logs whose printed dicts carry no step: the k-th dict is step k*N")

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
    sub.add_parser("mcp", help="serve analyze, run status, findings, recommendations and compare as MCP tools "
                              "over stdio (for coding agents)")
    return p


def _price(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        x = -1.0
    if not x >= 0 or x == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a price >= 0, e.g. 2.5, got {text!r}")
    return x


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of steps >= 1, got {text!r}")
    return n


def _demo(args: argparse.Namespace) -> int:
    trackers = [REPORT_TO_EXTRAS[t] for t in str(args.report_to).replace(",", " ").split() if t in REPORT_TO_EXTRAS]
    if _lacks_extras("demo", "train", *trackers):
        return ExitCode.BAD_INPUT
    from grpo_monitor.app.demo import lineage_exit_code, run_demo

    root = run_demo(args.run_dir, steps=args.steps, moe=args.moe, report_to=args.report_to, scenario=args.scenario,
                    auto_restart=args.auto_restart, max_restarts=args.max_restarts)
    # A plain demo's findings are what it demonstrates; a restarted lineage answers whether the restart cured it.
    return lineage_exit_code(root)[0] if args.auto_restart else ExitCode.CLEAN


def _analyze(args: argparse.Namespace) -> int:
    """``analyze``, and with ``--alerts`` each run's verdict sent on: the destination is checked before
    anything is read, the runs are analysed once, and a message that was not confirmed delivered is one
    stderr line each and ``ExitCode.ALERTS_NOT_SENT`` (the report's own code is said in the last line)."""
    if args.html and _lacks_extras("analyze --html", "report"):
        return ExitCode.BAD_INPUT
    from grpo_monitor.analysis.analyze import AnalyzeOptions
    from grpo_monitor.app.analyze_cmd import run_cli

    destination, errors = None, []
    if args.alerts:
        from grpo_monitor.alerts import cli_destination, post_report

        try:
            destination = cli_destination(args.alerts, args.alerts_format)
        except ValueError as exc:
            print(f"grpo-monitor: --alerts: {exc}", file=sys.stderr)
            return ExitCode.BAD_INPUT

        def send(report):  # type: ignore[no-untyped-def]
            errors.extend(post_report(report, destination, args.alerts_min_severity))

    options = AnalyzeOptions(rules=args.rules, mapping=args.mapping, model=args.model, logging_steps=args.logging_steps,
                             gpu_hour_price=args.gpu_hour_price, devices=args.devices)
    code = run_cli(args.paths, options, as_json=args.json, markdown=args.markdown, html=args.html,
                   on_report=send if destination is not None else None)
    if not errors:
        return code
    for e in errors:
        print(f"grpo-monitor: alerts not sent: {e}", file=sys.stderr)
    print(f"grpo-monitor: {len(errors)} verdict message(s) not confirmed delivered (the report alone exits {int(code)})",
          file=sys.stderr)
    return ExitCode.ALERTS_NOT_SENT


def _compare(args: argparse.Namespace) -> int:
    if args.html and _lacks_extras("compare --html", "report"):
        return ExitCode.BAD_INPUT
    from grpo_monitor.analysis.analyze import AnalyzeOptions
    from grpo_monitor.app.compare_cmd import run_cli

    options = AnalyzeOptions(mapping=args.mapping, logging_steps=args.logging_steps)
    return run_cli(args.paths, options, as_json=args.json, html=args.html)


def _supervise(args: argparse.Namespace) -> int:
    from grpo_monitor.app.supervise import run_cli as supervise_cli

    return supervise_cli(args.command, args.run_dir, args.max_restarts, args.apply)


def _watch(args: argparse.Namespace) -> int:
    if _lacks_extras("watch", "tui"):
        return ExitCode.BAD_INPUT
    from grpo_monitor.readers import SourceError

    try:
        from grpo_monitor.app.dashboard import run_watch
    except ImportError as exc:
        print(f"grpo-monitor: the dashboard needs the 'tui' extra: pip install 'grpo-monitor[tui]' ({exc})", file=sys.stderr)
        return ExitCode.BAD_INPUT
    try:
        run_watch(args.path, wait=args.wait)
    except SourceError as exc:
        print(f"grpo-monitor: {exc}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    return ExitCode.CLEAN


def _lint(args: argparse.Namespace) -> int:
    from grpo_monitor.preflight.lint import run_lint_cli

    return run_lint_cli(args)


def _inspect_rewards(args: argparse.Namespace) -> int:
    # sampling from a model needs the training stack; the interactive gate needs the dashboard's
    if _lacks_extras("inspect-rewards", *(["train"] if args.demo or args.model else []),
                     *([] if args.auto else ["tui"])):
        return ExitCode.BAD_INPUT
    from grpo_monitor.preflight.reward_gate import run_inspect_cli

    def open_screen(session, run_dir, funcs, source):  # type: ignore[no-untyped-def]
        from grpo_monitor.app.gate_screen import run_gate

        return run_gate(session, run_dir, funcs, source)

    try:
        return run_inspect_cli(args, open_screen)
    except ImportError as exc:
        print(f"grpo-monitor: inspect-rewards needs the 'train' and 'tui' extras ({exc})", file=sys.stderr)
        return ExitCode.BAD_INPUT


def _mcp(args: argparse.Namespace) -> int:
    if _lacks_extras("mcp", "mcp"):
        return ExitCode.BAD_INPUT
    from grpo_monitor.app.mcp_server import serve

    serve()
    return ExitCode.CLEAN


# Every verb the parser defines, and what runs it: the one list of the command's verbs.
VERBS = {"demo": _demo, "analyze": _analyze, "compare": _compare, "supervise": _supervise, "watch": _watch, "lint": _lint,
         "inspect-rewards": _inspect_rewards, "mcp": _mcp}


def main(argv: Sequence[str] | None = None) -> int:
    """Run one verb. Input it cannot use (a path it may not read or write, a log nested too deeply,
    a run log without a header) is one line on stderr and exit 2 in every verb: exit 1 means
    findings, so a crash must never read as one."""
    args = _parser().parse_args(argv)
    from grpo_monitor.core.runlog import RunLogError
    from grpo_monitor.readers import SourceError

    # Input that cannot be used at all is one line and exit 2 in every verb, never a traceback.
    try:
        return VERBS[args.verb](args)
    except (SourceError, RunLogError) as exc:
        print(f"grpo-monitor: {' '.join(str(exc).split())}", file=sys.stderr)
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"grpo-monitor: {where}{exc.strerror or exc}", file=sys.stderr)
    except RecursionError:
        print("grpo-monitor: input nested too deeply to read", file=sys.stderr)
    return ExitCode.BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
