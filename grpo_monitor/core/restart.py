"""The restart protocol: plans, checkpoints to resume from, lineages of run segments.

A restart stops the run cleanly (checkpoint saved), writes a plan atomically into the stopping
segment's run directory, and relaunches with the variant's overrides applied into the next
segment, whose header names its parent. Segments of one lineage live under the lineage's root:
``<root>/`` is segment 0, ``<root>/segment-<n>/`` segment n.

The relaunch is told what to do through environment variables, which ``attach`` reads:

- ``GRPO_MONITOR_RUN_DIR``: the segment's run directory;
- ``GRPO_MONITOR_SEGMENT``: its number; ``GRPO_MONITOR_PARENT_RUN``: the parent's run id;
- ``GRPO_MONITOR_AUTO_RESTART=1`` and ``GRPO_MONITOR_MAX_RESTARTS``: the restart policy;
- ``GRPO_MONITOR_TRIED``: variants already tried in the lineage (comma-separated);
- ``GRPO_MONITOR_OVERRIDES``: the cumulative ``GRPOConfig`` overrides (JSON), applied by
  ``patched_args(args)`` before the trainer is built;
- ``GRPO_MONITOR_RESUME``: the checkpoint to resume from (empty: the initial model).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from grpo_monitor.core.runlog import is_run_dir

PLAN_FILE = "restart_plan.json"
RESTART_FROM = ("before_onset", "latest", "initial")

ENV_RUN_DIR = "GRPO_MONITOR_RUN_DIR"
ENV_SEGMENT = "GRPO_MONITOR_SEGMENT"
ENV_PARENT_RUN = "GRPO_MONITOR_PARENT_RUN"
ENV_AUTO_RESTART = "GRPO_MONITOR_AUTO_RESTART"
ENV_MAX_RESTARTS = "GRPO_MONITOR_MAX_RESTARTS"
ENV_TRIED = "GRPO_MONITOR_TRIED"
ENV_OVERRIDES = "GRPO_MONITOR_OVERRIDES"
ENV_RESUME = "GRPO_MONITOR_RESUME"

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


@dataclass
class RestartPlan:
    segment: int  # the segment that stopped
    step: int  # the step it stopped at
    variant: str
    config_overrides: dict[str, Any]  # this restart's change, as a diff against the stopped segment's config
    cumulative_overrides: dict[str, Any]  # everything the next segment applies to the original config
    resume_from: str | None  # checkpoint path, or None for the initial model
    onset_step: int | None
    findings: list[dict[str, Any]]
    reasons: list[str]
    tried: list[str]
    parent_run: str | None  # run id of the stopped segment
    output_dir: str | None  # the stopped segment's output_dir
    next_run_dir: str
    next_output_dir: str | None = None
    restarts_done: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def write_plan(run_dir: str | os.PathLike[str], plan: RestartPlan) -> Path:
    """Write the plan atomically: readers see the old file or the whole new one, never a part."""
    target = Path(run_dir) / PLAN_FILE
    tmp = target.with_name(f".{PLAN_FILE}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(plan.to_dict(), fh, indent=2, default=str)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, target)
    return target


def read_plan(run_dir: str | os.PathLike[str]) -> RestartPlan | None:
    path = Path(run_dir) / PLAN_FILE
    if not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    return RestartPlan(**{k: v for k, v in data.items() if k in RestartPlan.__dataclass_fields__})


def segment_dir(root: str | os.PathLike[str], n: int) -> Path:
    return Path(root) if n == 0 else Path(root) / f"segment-{n}"


_SEGMENT = re.compile(r"^segment-(\d+)$")


def child_run_dir(run_dir: str | os.PathLike[str], child_run: Any) -> Path | None:
    """Where the segment a ``restart`` record names (``child_run``) lives: every segment of a lineage
    is a sibling under its root (``<root>/segment-<n>``), so a restart written by ``segment-1`` names
    ``segment-2`` beside it, not inside it. An absolute path is taken as it is.

    >>> str(child_run_dir("/runs/exp", "segment-1")), str(child_run_dir("/runs/exp/segment-1", "segment-2"))
    ('/runs/exp/segment-1', '/runs/exp/segment-2')
    """
    if not isinstance(child_run, str) or not child_run:
        return None
    child = Path(child_run)
    if child.is_absolute():
        return child
    run_dir = Path(run_dir)
    root = run_dir.parent if _SEGMENT.match(run_dir.name) and _SEGMENT.match(child.name) else run_dir
    return root / child


def lineage_dirs(root: str | os.PathLike[str]) -> list[Path]:
    """The run directories of a lineage in order: the root, then segment-1, segment-2, ..."""
    root = Path(root)
    out = [root]
    n = 1
    while is_run_dir(root / f"segment-{n}"):
        out.append(root / f"segment-{n}")
        n += 1
    return out


def checkpoints(output_dir: str | os.PathLike[str] | None) -> list[tuple[int, Path]]:
    if not output_dir or not Path(output_dir).is_dir():
        return []
    found = []
    for child in Path(output_dir).iterdir():
        m = _CHECKPOINT.match(child.name)
        if m and child.is_dir():
            found.append((int(m.group(1)), child))
    return sorted(found)


def choose_checkpoint(
    output_dir: str | os.PathLike[str] | None, onset_step: int | None, step: int, policy: str = "before_onset"
) -> str | None:
    """The checkpoint to resume from. ``before_onset``: the newest saved before the change began (a
    collapsed policy resumed under a new loss is often still collapsed), else the initial model;
    ``latest``: the newest one, including the one saved at the stop; ``initial``: always the initial model."""
    if policy not in RESTART_FROM:
        raise ValueError(f"restart_from must be one of {RESTART_FROM}, got {policy!r}")
    if policy == "initial":
        return None
    found = checkpoints(output_dir)
    if policy == "latest":
        stop_ckpt = Path(output_dir) / f"checkpoint-{step}" if output_dir else None
        latest = found[-1][1] if found else None
        if stop_ckpt is not None and (latest is None or step > found[-1][0]):
            return str(stop_ckpt)  # saved right after the stop, when the callback returns
        return str(latest) if latest else None
    limit = onset_step if onset_step is not None else step
    before = [p for s, p in found if s < limit]
    return str(before[-1]) if before else None


def env_state() -> dict[str, Any]:
    """What a supervised relaunch was told (empty values when not supervised)."""
    tried = [t for t in os.environ.get(ENV_TRIED, "").split(",") if t]
    overrides = os.environ.get(ENV_OVERRIDES)
    return {
        "run_dir": os.environ.get(ENV_RUN_DIR) or None,
        "segment": int(os.environ.get(ENV_SEGMENT) or 0),
        "parent_run": os.environ.get(ENV_PARENT_RUN) or None,
        "auto_restart": os.environ.get(ENV_AUTO_RESTART) == "1",
        "max_restarts": int(os.environ[ENV_MAX_RESTARTS]) if os.environ.get(ENV_MAX_RESTARTS) else None,
        "tried": tried,
        "overrides": json.loads(overrides) if overrides else {},
        "resume_from": os.environ.get(ENV_RESUME) or None,
    }


def patched_args(args: Any) -> Any:
    """``args`` with the overrides of a supervised restart applied (unchanged when not restarting).

    Call it on your ``GRPOConfig`` before building the trainer in a script run under
    ``grpo-monitor supervise`` when the script does not parse TRL command-line flags.
    """
    state = env_state()
    overrides = dict(state["overrides"])
    if not overrides:
        return args
    from grpo_monitor.core.catalogue import apply_overrides

    return apply_overrides(args, overrides)


def reapply_learning_rate(optimizer: Any, lr_scheduler: Any, learning_rate: float) -> bool:
    """Make a resumed run train at ``learning_rate``: the Trainer restores the optimizer's and the
    scheduler's saved rates from the checkpoint, which would silently undo a restart's lower
    ``learning_rate``. The schedule keeps its shape, scaled to the new rate. True when it changed."""
    base = list(getattr(lr_scheduler, "base_lrs", None) or [])
    groups = getattr(optimizer, "param_groups", None)
    if not groups:
        return False
    ref = base[0] if base else groups[0].get("initial_lr", groups[0].get("lr"))
    if not ref or ref <= 0 or abs(ref - learning_rate) <= 1e-12 * max(ref, learning_rate):
        return False
    ratio = float(learning_rate) / float(ref)
    if base:
        lr_scheduler.base_lrs = [b * ratio for b in base]
        if hasattr(lr_scheduler, "_last_lr"):
            lr_scheduler._last_lr = [v * ratio for v in lr_scheduler._last_lr]
    for group in groups:
        group["lr"] = group["lr"] * ratio
        if "initial_lr" in group:
            group["initial_lr"] = group["initial_lr"] * ratio
    return True


def child_env(plan: RestartPlan | None, segment: int, root: Path, max_restarts: int, base: Mapping[str, str]) -> dict[str, str]:
    env = dict(base)
    env[ENV_RUN_DIR] = str(segment_dir(root, segment))
    env[ENV_SEGMENT] = str(segment)
    env[ENV_AUTO_RESTART] = "1"
    env[ENV_MAX_RESTARTS] = str(max_restarts)
    if plan is None:
        for k in (ENV_PARENT_RUN, ENV_TRIED, ENV_OVERRIDES, ENV_RESUME):
            env.pop(k, None)
        return env
    env[ENV_PARENT_RUN] = plan.parent_run or ""
    env[ENV_TRIED] = ",".join(plan.tried)
    env[ENV_OVERRIDES] = json.dumps(
        {**plan.cumulative_overrides, **({"output_dir": plan.next_output_dir} if plan.next_output_dir else {})}
    )
    env[ENV_RESUME] = plan.resume_from or ""
    return env


def child_flags(plan: RestartPlan | None) -> list[str]:
    """The same overrides as TRL-style flags appended to the command (parsed last, so they win)."""
    if plan is None:
        return []
    from grpo_monitor.core.recommend import flag_values

    flags: list[str] = []
    items = dict(plan.cumulative_overrides)
    if plan.next_output_dir:
        items["output_dir"] = plan.next_output_dir
    for k, v in items.items():
        flags += [f"--{k}", *flag_values(v)]
    if plan.resume_from:
        flags += ["--resume_from_checkpoint", plan.resume_from]
    return flags

