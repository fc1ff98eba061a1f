"""What ``attach`` is told: typed option objects with defaults, checked when they are built, so a
mistake fails at ``attach`` time rather than mid-run, in one line naming the field as the user wrote it.

Each feature parameter of ``attach`` takes True or False, or its options object (which turns it on):
``auto_restart=RestartOptions(max_restarts=3)``, ``device_health=DeviceOptions(device=0)``,
``router_tap=RouterOptions(probe_every=5)``, ``require_reward_gate=RewardGateOptions(min_agreement=0.8)``;
``sample_text=`` takes a ``SampleOptions`` or its ``sample_text`` alone; ``alerts=`` an
``alerts.options.AlertOptions`` or its ``to`` alone.

>>> SampleOptions(correct_threshold=0.5).correct_threshold
0.5
>>> RestartOptions(restart_from="yesterday")
Traceback (most recent call last):
...
grpo_monitor.alerts.options.OptionError: RestartOptions(restart_from=...): must be one of ('before_onset', 'latest', 'initial'), got 'yesterday'
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from grpo_monitor.alerts.options import OptionError, field_error, number_reason
from grpo_monitor.callbacks.reward_tap import SampleRetention
from grpo_monitor.core.restart import RESTART_FROM


def _check_number(owner: Any, name: str, **bounds: Any) -> None:
    reason = number_reason(getattr(owner, name), **bounds)
    if reason:
        raise field_error(owner, name, reason)


@dataclasses.dataclass(frozen=True)
class SampleOptions:
    """How completions are recorded. ``attach(trainer, sample_text=...)`` takes one of these, or its
    ``sample_text`` alone (``"all"``, ``"none"``, a dict). Every completion keeps its numbers (rewards,
    length, truncation) whatever is chosen here; these choose which keep text, how much, and which count
    as right."""

    sample_text: str | Mapping[str, int] | SampleRetention = "default"
    """Which completions keep text: ``"default"`` keeps, per step, 32 (the longest, the most repetitive, a group
    scored all alike and the best among them, the rest drawn fairly) plus the best and worst
    of 8 groups and 4 truncated ones (all of a step with at most 32); ``"all"``; ``"none"``; or a
    ``SampleRetention`` or dict with ``fair``, ``groups``, ``truncated``."""
    max_text_chars: int = 2000
    """Characters kept of each kept text: its head and its tail."""
    correct_threshold: float = 0.0
    """A completion is right when the correctness reward is above this."""

    def __post_init__(self) -> None:
        if isinstance(self.correct_threshold, bool) or not isinstance(self.correct_threshold, (int, float)) \
                or not math.isfinite(self.correct_threshold):
            raise field_error(self, "correct_threshold", f"must be a number, got {self.correct_threshold!r}")
        _check_number(self, "max_text_chars", minimum=0, integer=True)
        value = self.sample_text
        if not (value is None or isinstance(value, (str, Mapping, SampleRetention))) or \
                (isinstance(value, str) and value not in ("default", "all", "none")):
            raise field_error(self, "sample_text", "must be 'default', 'all', 'none', a dict with fair, groups, "
                                                   f"truncated, or a SampleRetention; got {value!r}")
        try:
            retention = SampleRetention.of(value)
        except (TypeError, ValueError) as exc:  # a dict's unknown key or a bound below 0
            raise field_error(self, "sample_text", str(exc)) from None
        object.__setattr__(self, "sample_text", retention)


@dataclasses.dataclass(frozen=True)
class RestartOptions:
    """Auto-restart, on when ``attach(trainer, auto_restart=...)`` gets True or one of these: on a
    confirmed (critical) finding whose change is new to the lineage, stop, checkpoint and write a
    restart plan, and resume from a checkpoint with the change."""

    max_restarts: int = 2
    """Restarts at most, over the whole lineage."""
    restart_from: str = "before_onset"
    """The checkpoint a restart resumes from: ``before_onset`` (the last before the finding's onset),
    ``latest`` or ``initial``."""

    def __post_init__(self) -> None:
        if self.restart_from not in RESTART_FROM:
            raise field_error(self, "restart_from", f"must be one of {RESTART_FROM}, got {self.restart_from!r}")
        _check_number(self, "max_restarts", minimum=0, integer=True)
        object.__setattr__(self, "max_restarts", int(self.max_restarts))


@dataclasses.dataclass(frozen=True)
class SegmentPlace:
    """Where this run stands in a restarted lineage (set by ``run_with_restarts`` and the supervisor, not by
    users): its segment number, the restarts made and the changes tried before it, the overrides it runs
    with, the lineage's root folder and the run it was restarted from."""

    segment: int = 0
    restarts_done: int = 0
    tried: Sequence[str] = ()
    applied_overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    lineage_root: str | os.PathLike[str] | None = None
    parent_run: str | None = None

    def root(self, run_dir: Path) -> Path:
        return Path(self.lineage_root) if self.lineage_root is not None else run_dir


@dataclasses.dataclass(frozen=True)
class RouterOptions:
    """MoE routing statistics (``moe/*`` metrics), on by default: ``attach(trainer, router_tap=False)``
    leaves a mixture-of-experts model's routers unhooked; one of these sets how it is done."""

    probe_every: int = 10
    """Steps between two probes of the routing flip rate."""

    def __post_init__(self) -> None:
        _check_number(self, "probe_every", minimum=1, integer=True)
        object.__setattr__(self, "probe_every", int(self.probe_every))


@dataclasses.dataclass(frozen=True)
class DeviceOptions:
    """The GPU's health through NVML (``pip install 'grpo-monitor[gpu]'``), on by default where NVML and a
    GPU are there (nothing happens otherwise): utilisation, memory, temperature, power, SM clock and
    throttle reasons as ``system/gpu_*`` metrics, read on a thread of its own, plus the share of time
    spent generating. ``attach(trainer, device_health=False)`` turns it off."""

    interval_s: float = 1.0
    """Seconds between two readings."""
    device: int | str | None = None
    """None watches the GPU each rank trains on; an NVML index or a ``GPU-...`` UUID watches that device on
    every rank (a vLLM server's GPU on the same node, say)."""

    def __post_init__(self) -> None:
        _check_number(self, "interval_s", minimum=0, strict=True)
        dev = self.device
        if dev is not None and (isinstance(dev, bool) or not isinstance(dev, (int, str))
                                or (isinstance(dev, int) and dev < 0) or (isinstance(dev, str) and not dev.strip())):
            raise field_error(self, "device", f"must be an NVML device index >= 0 or a device UUID, got {dev!r}")


@dataclasses.dataclass(frozen=True)
class RewardGateOptions:
    """Refuse to train (``RewardGateError``, naming the command to run) until ``grpo-monitor inspect-rewards``
    has saved a passed verdict for these reward functions in the run directory; on when
    ``attach(trainer, require_reward_gate=...)`` gets True or one of these."""

    min_agreement: float = 0.9
    """The share of the judged samples the verdict must have agreed with."""

    def __post_init__(self) -> None:
        value = self.min_agreement
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
            raise field_error(self, "min_agreement", f"must be a number from 0 to 1, got {value!r}")


__all__ = ["DeviceOptions", "OptionError", "RestartOptions", "RewardGateOptions", "RouterOptions", "SampleOptions",
           "SegmentPlace"]
