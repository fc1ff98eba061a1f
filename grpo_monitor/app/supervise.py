"""``grpo-monitor supervise -- CMD ...``: run a training command, relaunch it with the recommended
variant after a monitor-requested stop.

The child runs in its own process group; SIGINT and SIGTERM sent to the supervisor are forwarded
to that group. After the child exits, a restart plan written by the child's monitor during this
launch means "restart": the command is relaunched with the plan's overrides, appended as TRL-style
flags (``--loss_type dr_grpo ...``; parsed last, so they win in ``HfArgumentParser``/``TrlParser``
scripts and ``trl grpo``) and passed in ``GRPO_MONITOR_OVERRIDES`` for scripts that call
``grpo_monitor.core.restart.patched_args(args)`` instead. Any other exit ends supervision with the child's
exit code: a crash the monitor did not ask for is never restarted. One supervisor per run
directory (a lock file).

When the command ends well (exit 0, or a stop for a restart with no restart left) the supervisor prints
the lineage's summary, as ``demo --auto-restart`` does, and exits by its last segment
(``grpo_monitor.app.demo.lineage_exit_code``): 0 when it ended with no warning or critical finding, the
earlier segments' findings having been acted on by the restarts; 1 when it still has one.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from grpo_monitor.core.restart import PLAN_FILE, child_env, child_flags, read_plan, segment_dir
from grpo_monitor.core.exit_codes import ExitCode

APPLY_MODES = ("both", "flags", "env")
LOCK_FILE = ".supervisor.lock"


class SupervisorBusy(RuntimeError):
    pass


def _lock(root: Path):
    root.mkdir(parents=True, exist_ok=True)
    fh = open(root / LOCK_FILE, "a+")
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        fh.close()
        raise SupervisorBusy(f"{root}: another grpo-monitor supervise is already running on this run directory") from None
    fh.seek(0)
    fh.truncate()
    fh.write(str(os.getpid()))
    fh.flush()
    return fh


def supervise(
    command: Sequence[str],
    run_dir: str | os.PathLike[str],
    max_restarts: int = 2,
    apply: str = "both",
    log=print,
) -> int:
    """Run ``command`` with the monitor's restart protocol; return the exit code to leave with."""
    if not command:
        raise ValueError("no command to supervise: grpo-monitor supervise [opts] -- CMD ...")
    if apply not in APPLY_MODES:
        raise ValueError(f"--apply must be one of {APPLY_MODES}")
    root = Path(run_dir)
    lock = _lock(root)
    began = time.time()
    try:
        plan = None
        for segment in range(max_restarts + 1):
            seg_dir = segment_dir(root, segment)
            seg_dir.mkdir(parents=True, exist_ok=True)
            plan_path = seg_dir / PLAN_FILE
            started = time.time()
            cmd = list(command) + (child_flags(plan) if apply in ("both", "flags") else [])
            env = child_env(plan if apply in ("both", "env") else None, segment, root, max_restarts, os.environ)
            if apply == "flags" and plan is not None:
                env["GRPO_MONITOR_PARENT_RUN"] = plan.parent_run or ""
                env["GRPO_MONITOR_TRIED"] = ",".join(plan.tried)
            log(f"grpo-monitor supervise: segment {segment + 1}: {' '.join(cmd)}")  # counted from 1, as screens show it
            rc = _run(cmd, env)
            new_plan = read_plan(seg_dir) if plan_path.is_file() and plan_path.stat().st_mtime >= started - 1 else None
            if new_plan is None or new_plan.segment != segment:
                if rc != 0:
                    log(f"grpo-monitor supervise: the command exited with {rc} without a restart request; not restarting")
                return _lineage_end(root, rc, time.time() - began, log)
            if segment >= max_restarts:
                log(f"grpo-monitor supervise: restart to {new_plan.variant} requested but max_restarts={max_restarts} reached")
                return _lineage_end(root, rc, time.time() - began, log)
            log(f"grpo-monitor supervise: the monitor stopped segment {segment + 1} at step {new_plan.step}; "
                f"restarting with {new_plan.variant}: {new_plan.config_overrides}")
            plan = new_plan
        return 0
    finally:
        lock.close()


def _lineage_end(root: Path, rc: int, seconds: float, log) -> int:
    """The lineage's summary and exit code where the command ended well; a failed command's own code,
    untouched, otherwise (a crash never reads as findings, nor as a cure)."""
    if rc != 0:
        return rc
    from grpo_monitor.core.runlog import is_run_dir

    if not is_run_dir(root):
        return rc  # the command never attached the monitor here: nothing to sum up
    from grpo_monitor.app.demo import print_lineage_summary

    try:
        return print_lineage_summary(root, seconds)
    except Exception as exc:  # the summary is a reading of the logs: a damaged one must not change the exit
        log(f"grpo-monitor supervise: no lineage summary ({type(exc).__name__}: {exc})")
        return rc


def _run(cmd: Sequence[str], env: dict[str, str]) -> int:
    try:
        child = subprocess.Popen(list(cmd), env=env, start_new_session=True)
    except OSError as exc:
        print(f"grpo-monitor supervise: cannot start {cmd[0]}: {exc.strerror or exc}", file=sys.stderr)
        return 127

    def forward(signum, frame):
        try:
            os.killpg(child.pid, signum)
        except ProcessLookupError:
            pass

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while True:
            try:
                rc = child.wait()
                break
            except KeyboardInterrupt:  # pragma: no cover - the handler above replaces the default
                forward(signal.SIGINT, None)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    # A child killed by a signal: report it like a shell does.
    return 128 - rc if rc < 0 else rc


def run_cli(argv_command: Sequence[str], run_dir: str | None, max_restarts: int, apply: str) -> int:
    command = list(argv_command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print("grpo-monitor supervise: no command given (usage: grpo-monitor supervise [opts] -- CMD ...)", file=sys.stderr)
        return ExitCode.BAD_INPUT
    directory = run_dir or os.environ.get("GRPO_MONITOR_RUN_DIR") or "runs/supervised"
    try:
        return supervise(command, directory, max_restarts=max_restarts, apply=apply,
                         log=lambda m: print(m, file=sys.stderr, flush=True))
    except SupervisorBusy as exc:
        print(f"grpo-monitor supervise: {exc}", file=sys.stderr)
        return ExitCode.BAD_INPUT
