"""What ``attach`` is told: typed option objects, validated when they are built, so a mistake fails at
``attach`` time rather than mid-run.

>>> SampleOptions(correct_threshold=0.5).correct_threshold
0.5
>>> RestartOptions(restart_from="yesterday")
Traceback (most recent call last):
...
ValueError: restart_from must be one of ('before_onset', 'latest', 'initial'), got 'yesterday'
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from grpo_monitor.callbacks.reward_tap import SampleRetention
from grpo_monitor.core.restart import RESTART_FROM


@dataclasses.dataclass(frozen=True)
class SampleOptions:
    """How completions are recorded: which reward functions are correctness and format (guessed from their
    names when None), the correctness reward above which a completion counts as right, and how much text
    is kept (``max_text_chars`` of each kept completion, head and tail; ``sample_text``: ``"default"``,
    ``"all"``, ``"none"``, or a ``SampleRetention`` / dict with ``fair``, ``groups``, ``truncated``)."""

    correctness_reward: str | None = None
    format_reward: str | None = None
    correct_threshold: float = 0.0
    max_text_chars: int = 2000
    sample_text: Any = "default"

    def __post_init__(self) -> None:
        if isinstance(self.correct_threshold, bool) or not isinstance(self.correct_threshold, (int, float)):
            raise ValueError(f"correct_threshold must be a number, got {self.correct_threshold!r}")
        if isinstance(self.max_text_chars, bool) or not isinstance(self.max_text_chars, int) or self.max_text_chars < 0:
            raise ValueError(f"max_text_chars must be an integer >= 0, got {self.max_text_chars!r}")
        object.__setattr__(self, "sample_text", SampleRetention.of(self.sample_text))


@dataclasses.dataclass(frozen=True)
class RestartOptions:
    """Auto-restart: off by default; on a confirmed (critical) finding whose change is new to the lineage,
    stop, checkpoint and write a restart plan, at most ``max_restarts`` times, resuming from the checkpoint
    ``restart_from`` names (``before_onset``, ``latest`` or ``initial``)."""

    auto_restart: bool = False
    max_restarts: int = 2
    restart_from: str = "before_onset"

    def __post_init__(self) -> None:
        if self.restart_from not in RESTART_FROM:
            raise ValueError(f"restart_from must be one of {RESTART_FROM}, got {self.restart_from!r}")
        if isinstance(self.max_restarts, bool) or not isinstance(self.max_restarts, int) or self.max_restarts < 0:
            raise ValueError(f"max_restarts must be an integer >= 0, got {self.max_restarts!r}")


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
    """MoE routing statistics: hook the routers of a mixture-of-experts model (``router_tap``), and probe
    the routing flip rate every ``probe_every`` steps."""

    router_tap: bool = True
    probe_every: int = 10

    def __post_init__(self) -> None:
        if isinstance(self.probe_every, bool) or not isinstance(self.probe_every, int) or self.probe_every < 1:
            raise ValueError(f"moe_probe_every must be an integer >= 1, got {self.probe_every!r}")


@dataclasses.dataclass(frozen=True)
class DeviceOptions:
    """Device health through NVML: on by default where ``nvidia-ml-py`` and a GPU are there (nothing happens
    otherwise), read every ``interval_s`` seconds on a thread of its own. ``device`` None watches the GPU
    each rank trains on; an NVML index or a ``GPU-…`` UUID watches that device on every rank (a vLLM
    server's GPU on the same node, say)."""

    enabled: bool = True
    interval_s: float = 1.0
    device: int | str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise ValueError(f"device_health must be True or False, got {self.enabled!r}")
        if isinstance(self.interval_s, bool) or not isinstance(self.interval_s, (int, float)) or not self.interval_s > 0:
            raise ValueError(f"device_interval_s must be a number > 0, got {self.interval_s!r}")
        dev = self.device
        if dev is not None and (isinstance(dev, bool) or not isinstance(dev, (int, str))
                                or (isinstance(dev, int) and dev < 0) or (isinstance(dev, str) and not dev.strip())):
            raise ValueError(f"nvml_device must be an NVML device index >= 0 or a device UUID, got {dev!r}")
