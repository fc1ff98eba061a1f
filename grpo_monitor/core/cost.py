"""What a failure has cost: the run's own accounting, put on every finding.

``CostMeter`` follows each logged step (the engine feeds it before the detectors, live and in replay alike)
and keeps running totals: training steps, wall time, and the rollouts that carried no learning signal
or were cut. A finding raised at step ``s`` with onset ``o`` gets ``evidence["cost"]``: what the steps from
``o`` to ``s`` cost. The same totals give a report the cost from the onset to the end of the run.

- **Rollouts without signal or cut.** From the step's completions where the run records them (a completion
  whose group scored all alike carries no advantage; one cut at the cap is truncated), else from the logged
  shares: ``frac_reward_zero_std`` (groups without spread) and ``completions/clipped_ratio`` (completions cut),
  combined as ``1 - (1 - zero_std) * (1 - clipped)`` (counted once where they overlap, assumed independent).
- **Wall time.** Measured between logged steps where the log has a clock (``system/wall_time``, the monitor's
  own; a tracker's ``_timestamp``), else the logged ``step_time`` (TRL, verl's ``timing_s/step``) times the
  steps a point covers, else the run's ``train_runtime`` spread over its steps (offline, from the summary).
- **GPU-hours** = wall time x devices, where the device count is known (the run header's ``world_size``,
  or given); **money** = GPU-hours x the price per GPU-hour the user gives (``gpu_hour_price``).

Totals are kept per logged point as cumulative sums in flat arrays, thinned by halving past ``max_points``,
so memory stays bounded on any run. A point covers the steps since the point before it; a cost from a step
inside that stretch (a sparse log's interval, or a stretch between points kept after thinning) takes its
share of it, so the steps counted from ``o`` to ``s`` are never more than ``s - o + 1`` and never begin
before the first logged step.
"""

from __future__ import annotations

import array
import bisect
import math
from collections.abc import Mapping, Sequence
from typing import Any

from grpo_monitor.detectors.base import Finding, RunContext
from grpo_monitor.detectors.numbers import finite

CLOCKS = ("system/wall_time", "_timestamp")
# The columns of the cumulative table: training steps covered; wall seconds, and the steps they cover;
# wasted step-equivalents, and the steps whose share is known; the same for the two shares alone.
_COLS = ("steps", "wall", "wall_steps", "wasted", "wasted_steps", "zero", "zero_steps", "cut", "cut_steps")


def _wasted_from_samples(samples: Sequence[Mapping[str, Any]]) -> tuple[float, float, float] | None:
    """(wasted share, zero-spread share, cut share) of a step's completions; None without usable records."""
    rows = [s for s in samples if isinstance(s, Mapping)]
    if not rows:
        return None
    groups: dict[Any, list[float]] = {}
    for i, s in enumerate(rows):
        rewards = s.get("rewards")
        total = sum(v for v in rewards.values() if finite(v) is not None) if isinstance(rewards, Mapping) else math.nan
        groups.setdefault(s.get("group", i), []).append(total)
    flat = {g: len(v) > 1 and all(x == v[0] for x in v) for g, v in groups.items()}
    no_signal = [flat[s.get("group", i)] for i, s in enumerate(rows)]
    cut = [bool(s.get("truncated")) for s in rows]
    n = len(rows)
    return sum(a or b for a, b in zip(no_signal, cut)) / n, sum(no_signal) / n, sum(cut) / n


class CostMeter:
    """Running cost totals of one run; ``annotate`` puts ``evidence["cost"]`` on a finding.

    ``devices``: the device count (the run header's ``world_size``), None when unknown;
    ``gpu_hour_price``: the price of one GPU-hour, None for no money figures; ``runtime``: seconds of
    the whole run and the steps it covered (``train_runtime`` of the summary), the clock of last resort.

    >>> meter = CostMeter(devices=2, gpu_hour_price=3.0)
    >>> for s in range(1, 101):
    ...     meter.observe(s, {"system/wall_time": 36.0 * s, "frac_reward_zero_std": 1.0 if s > 40 else 0.1})
    >>> c = meter.between(41, 100)
    >>> c["steps"], c["wall_seconds"], c["gpu_hours"], c["money"], c["wasted_share"]
    (60, 2160.0, 1.2, 3.6, 1.0)
    """

    def __init__(self, devices: int | None = None, gpu_hour_price: float | None = None,
                 runtime: tuple[float, int] | None = None, max_points: int = 65536) -> None:
        if devices is not None and (isinstance(devices, bool) or not isinstance(devices, int) or devices < 1):
            raise ValueError(f"devices must be a whole number >= 1, got {devices!r}")
        if gpu_hour_price is not None and (isinstance(gpu_hour_price, bool) or not isinstance(gpu_hour_price, (int, float))
                                           or not math.isfinite(gpu_hour_price) or gpu_hour_price < 0):
            raise ValueError(f"gpu_hour_price must be a number >= 0, got {gpu_hour_price!r}")
        self.devices = devices
        self.gpu_hour_price = None if gpu_hour_price is None else float(gpu_hour_price)
        self.runtime = runtime
        self.max_points = max(64, int(max_points))
        self.start(RunContext())

    def start(self, context: RunContext) -> None:
        self.steps = array.array("q")
        self.cum = {c: array.array("d") for c in _COLS}
        self._totals = dict.fromkeys(_COLS, 0.0)
        self._last_step: int | None = None
        self._last_clock: tuple[str, float] | None = None
        self.wall_from: str | None = None
        self._stride = 1
        self._seen = 0

    # -- per step -----------------------------------------------------------------------------

    def observe(self, step: int, metrics: Mapping[str, Any], samples: Sequence[Mapping[str, Any]] | None = None) -> None:
        step = int(step)
        if self._last_step is not None and step <= self._last_step:
            return  # the same step logged again (an evaluation's own log): already counted
        gap = 1 if self._last_step is None else step - self._last_step
        t = self._totals
        t["steps"] += gap
        wall = self._wall(metrics, gap)
        if wall is not None:
            t["wall"] += wall
            t["wall_steps"] += gap
        shares = _wasted_from_samples(samples) if samples else None
        if shares is not None:
            wasted, zero, cut = shares
        else:
            zero = finite(metrics.get("frac_reward_zero_std"))
            cut = finite(metrics.get("completions/clipped_ratio"))
            zero = None if zero is None else min(max(zero, 0.0), 1.0)
            cut = None if cut is None else min(max(cut, 0.0), 1.0)
            wasted = None if zero is None and cut is None else 1.0 - (1.0 - (zero or 0.0)) * (1.0 - (cut or 0.0))
        for name, v in (("wasted", wasted), ("zero", zero), ("cut", cut)):
            if v is not None:
                t[name] += v * gap
                t[f"{name}_steps"] += gap
        self._last_step = step
        self._keep(step)

    def _wall(self, metrics: Mapping[str, Any], gap: int) -> float | None:
        for key in CLOCKS:
            now = finite(metrics.get(key))
            if now is None:
                continue
            last, self._last_clock = self._last_clock, (key, now)
            if last is not None and last[0] == key and now >= last[1]:
                self.wall_from = key
                return now - last[1]
            return None  # the first reading of a clock starts it
        step_time = finite(metrics.get("step_time"))
        if step_time is not None and step_time >= 0:
            self.wall_from = self.wall_from or "step_time"
            return step_time * gap
        return None

    def _keep(self, step: int) -> None:
        self._seen += 1
        if self._seen % self._stride and len(self.steps):
            # Between kept points: the newest totals replace the last kept ones' place at the end.
            self.steps[-1] = step
            for c in _COLS:
                self.cum[c][-1] = self._totals[c]
            return
        self.steps.append(step)
        for c in _COLS:
            self.cum[c].append(self._totals[c])
        if len(self.steps) > self.max_points:
            self.steps = self.steps[::2]
            for c in _COLS:
                self.cum[c] = self.cum[c][::2]
            self._stride *= 2

    # -- what it cost ----------------------------------------------------------------------------

    def _at(self, step: int) -> dict[str, float]:
        """The totals up to and including ``step``: zero before the first point, the last point's past the end.

        A point stands for the steps since the point before it, evenly, so a step between two points takes
        its share of the later one: a cost from a step inside a sparse log's interval (or from a point
        itself, which covers the steps before it) counts only the steps from there, never the whole
        interval, and a lookup between points kept after thinning does not round back to the earlier one.
        """
        i = bisect.bisect_right(self.steps, step) - 1
        if i < 0:
            return dict.fromkeys(_COLS, 0.0)
        if i + 1 == len(self.steps) or self.steps[i] == step:
            return {c: self.cum[c][i] for c in _COLS}
        share = (step - self.steps[i]) / (self.steps[i + 1] - self.steps[i])
        return {c: self.cum[c][i] + share * (self.cum[c][i + 1] - self.cum[c][i]) for c in _COLS}

    def between(self, since: int, until: int) -> dict[str, Any] | None:
        """The cost of the logged steps from ``since`` to ``until`` (both included); None before any step.

        Never more than ``until - since + 1`` steps, and none before the first logged step: an onset
        estimated before the log began is costed from its first point.
        """
        if not len(self.steps) or until < since:
            return None
        since = max(int(since), int(self.steps[0]))
        if until < since:
            return None
        end, begin = self._at(until), self._at(since - 1)
        d = {c: end[c] - begin[c] for c in _COLS}
        steps = int(round(d["steps"]))
        out: dict[str, Any] = {"since_step": int(since), "to_step": int(until), "steps": steps}
        for name, key in (("wasted_share", "wasted"), ("no_signal_share", "zero"), ("truncated_share", "cut")):
            out[name] = round(d[key] / d[f"{key}_steps"], 4) if d[f"{key}_steps"] > 0 else None
        wall = None
        if d["wall_steps"] > 0:
            # Steps without a reading are costed at the measured rate of the others.
            wall = d["wall"] * steps / d["wall_steps"]
            out["wall_from"] = self.wall_from
        elif self.runtime is not None and self.runtime[1] > 0:
            wall = self.runtime[0] / self.runtime[1] * steps
            out["wall_from"] = "train_runtime"
        out["wall_seconds"] = None if wall is None else round(wall, 1)
        out["devices"] = self.devices
        gpu_hours = None if wall is None or self.devices is None else wall * self.devices / 3600.0
        out["gpu_hours"] = None if gpu_hours is None else round(gpu_hours, 4)
        if gpu_hours is not None and out["wasted_share"] is not None:
            out["gpu_hours_wasted"] = round(gpu_hours * out["wasted_share"], 4)
        if self.gpu_hour_price is not None:
            out["gpu_hour_price"] = self.gpu_hour_price
            out["money"] = None if gpu_hours is None else round(gpu_hours * self.gpu_hour_price, 2)
            if out.get("gpu_hours_wasted") is not None:
                out["money_wasted"] = round(out["gpu_hours_wasted"] * self.gpu_hour_price, 2)
        return out

    @property
    def last_step(self) -> int | None:
        return self._last_step

    def annotate(self, finding: Finding) -> None:
        """``evidence["cost"]``: what the steps from the finding's onset to its step cost."""
        if finding.severity == "info":
            return
        since = finding.onset_step if finding.onset_step is not None else finding.step
        cost = self.between(min(int(since), finding.step), finding.step)
        if cost is not None:
            finding.evidence["cost"] = cost


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def cost_phrase(cost: Mapping[str, Any] | None) -> str:
    """One line for a cost block: ``since step 41: 60 steps, 36 min, 1.2 GPU-h ($3.60); 100% of rollouts without
    learning signal or cut``.

    >>> cost_phrase({"since_step": 41, "steps": 60, "wall_seconds": 2160.0, "gpu_hours": 1.2, "money": 3.6,
    ...              "wasted_share": 1.0})
    'since step 41: 60 steps, 36 min, 1.2 GPU-h ($3.60); 100% of rollouts without learning signal or cut'
    """
    if not cost:
        return ""
    parts = [f"{cost.get('steps')} steps"]
    if cost.get("wall_seconds") is not None:
        parts.append(_duration(float(cost["wall_seconds"])))
    if cost.get("gpu_hours") is not None:
        money = f" (${cost['money']:.2f})" if cost.get("money") is not None else ""
        parts.append(f"{cost['gpu_hours']:.3g} GPU-h{money}")
    text = f"since step {cost.get('since_step')}: " + ", ".join(parts)
    if cost.get("wasted_share") is not None:
        text += f"; {100 * cost['wasted_share']:.0f}% of rollouts without learning signal or cut"
    return text
