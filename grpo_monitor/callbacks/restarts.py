"""In-process restarts: train, and on a confirmed finding rebuild the trainer with the recommended change."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grpo_monitor.callbacks.attach import attach
from grpo_monitor.callbacks.options import RestartOptions, SegmentPlace
from grpo_monitor.core.catalogue import apply_overrides
from grpo_monitor.core.lineage import Lineage, Segment
from grpo_monitor.core.restart import RestartPlan, segment_dir


def run_with_restarts(
    make_trainer: Callable[[Any], Any],
    args: Any,
    *,
    run_dir: str | os.PathLike[str] | None = None,
    max_restarts: int = 2,
    restart_from: str = "before_onset",
    **attach_options: Any,
) -> Lineage:
    """Train, and on a confirmed finding restart with the recommended variant, up to ``max_restarts`` times.

    ``make_trainer(args)`` builds a ``GRPOTrainer`` from a ``GRPOConfig``; it is called once per
    segment with the patched config (validated against the installed TRL). Each segment writes its
    run log under ``run_dir`` (``segment-<n>/`` from the first restart on) and its checkpoints under
    ``<output_dir>/segment-<n>``. ``attach_options`` go to each segment's ``attach`` (``alerts=``,
    ``detectors=``, ...). Returns the lineage.

    >>> lineage = run_with_restarts(lambda a: GRPOTrainer(model, rewards, args=a, train_dataset=ds), args)  # doctest: +SKIP
    >>> [s.variant for s in lineage.segments]                                                              # doctest: +SKIP
    [None, 'dapo']
    """
    root = Path(run_dir) if run_dir is not None else Path(args.output_dir) / "grpo-monitor"
    restarts = RestartOptions(max_restarts=max_restarts, restart_from=restart_from)
    plan: RestartPlan | None = None
    segments: list[Segment] = []
    for n in range(max_restarts + 1):
        if plan is None:
            seg_args = args
        else:
            extra = {"output_dir": plan.next_output_dir} if plan.next_output_dir else {}
            seg_args = apply_overrides(args, {**plan.cumulative_overrides, **extra})
        trainer = make_trainer(seg_args)
        place = SegmentPlace(segment=n, restarts_done=n, lineage_root=root, tried=plan.tried if plan else [],
                             applied_overrides=plan.cumulative_overrides if plan else {},
                             parent_run=plan.parent_run if plan else None)
        callback = attach(trainer, segment_dir(root, n), auto_restart=restarts, place=place, **attach_options)
        trainer.train(resume_from_checkpoint=plan.resume_from if plan else None)
        segments.append(
            Segment(n, segment_dir(root, n), callback.restart_plan, plan.variant if plan else None,
                    dict(plan.cumulative_overrides) if plan else {}, int(trainer.state.global_step), seg_args)
        )
        plan = callback.restart_plan
        del trainer, callback
        if plan is None:
            break
    return Lineage(root, segments)
