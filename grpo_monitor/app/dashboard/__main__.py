"""``python -m grpo_monitor.app.dashboard RUN``: the dashboard without the CLI wrapper."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grpo_monitor.app.dashboard", description="Live dashboard of a GRPO run.")
    parser.add_argument("path", help="run directory (followed live), run.jsonl, or any log analyze reads")
    parser.add_argument("--wait", action="store_true", help="wait for a run that has not started yet")
    args = parser.parse_args(argv)
    from grpo_monitor.readers import SourceError
    from grpo_monitor.app.dashboard import run_watch

    try:
        run_watch(args.path, wait=args.wait)
    except SourceError as exc:
        print(f"grpo-monitor: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
