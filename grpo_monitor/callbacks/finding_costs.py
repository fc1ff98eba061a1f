"""The callback's part that puts cost and time to failure on each finding, and brings a team's rules.

It builds the annotators the callback's engine runs (``core.cost.CostMeter`` with the run's device count,
``trainer.args.world_size``, and the user's ``gpu_hour_price``; ``core.forecast.Forecaster``), so a finding
raised live carries the same ``evidence["cost"]`` and ``evidence["forecast"]`` that ``analyze`` gives it
offline; and the rule detectors ``attach(..., rules=...)`` loaded, which join the engine's detectors and are
recorded in the run header, so a later ``analyze`` of the run directory replays them too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from grpo_monitor.core.cost import cost_phrase
from grpo_monitor.core.forecast import forecast_phrase
from grpo_monitor.detectors.base import Detector, Finding
from grpo_monitor.detectors.rule import RuleDetector


class FindingCosts:
    """``gpu_hour_price`` (None: no money figures) and the team rules to run beside the detectors."""

    def __init__(self, gpu_hour_price: float | None = None, rules: Sequence[RuleDetector] = ()) -> None:
        if gpu_hour_price is not None and (isinstance(gpu_hour_price, bool) or not isinstance(gpu_hour_price, (int, float))
                                           or not math.isfinite(gpu_hour_price) or gpu_hour_price < 0):
            raise ValueError(f"gpu_hour_price must be a number >= 0 (the price of one GPU-hour), got {gpu_hour_price!r}")
        self.gpu_hour_price = None if gpu_hour_price is None else float(gpu_hour_price)
        self.rules = list(rules)

    @staticmethod
    def devices(args: Any) -> int | None:
        """The run's device count for the GPU-hours (``args.world_size``), None when it does not say."""
        world = getattr(args, "world_size", None)
        return world if isinstance(world, int) and not isinstance(world, bool) and world >= 1 else None

    def detectors(self, given: Sequence[Detector] | None) -> list[Detector] | None:
        """The engine's detectors: those given (the built-in set when None) and the rules."""
        if not self.rules:
            return None if given is None else list(given)
        from grpo_monitor.detectors import ALL_DETECTORS

        base = list(given) if given is not None else [cls() for cls in ALL_DETECTORS]
        return base + self.rules

    def header_fields(self) -> dict[str, Any]:
        return {"rules": [r.to_dict() for r in self.rules]} if self.rules else {}

    @staticmethod
    def suffix(finding: Finding) -> str:
        """What a log line adds after a finding's message: its cost so far and its time to failure."""
        ev: Mapping[str, Any] = finding.evidence or {}
        parts = [p for p in (cost_phrase(ev.get("cost")), forecast_phrase(ev.get("forecast"))) if p]
        return f" [cost {parts[0]}" + (f"; {parts[1]}" if len(parts) > 1 else "") + "]" if parts else ""
