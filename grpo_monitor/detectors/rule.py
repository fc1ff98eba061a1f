"""A team's own check, declared in a rule file (``core.rules`` reads the file): a detector like any other.

A rule watches one metric and is breached when the metric is

- ``below`` or ``above`` a fixed line, or
- has ``drop``-ped (or ``rise``-n) by a share of its baseline: the median of its values over the first
  ``baseline_steps`` logged steps;

and it raises its finding once the breach has held on every logged point for ``for_steps`` training steps
(a coarse log's point covers several). The finding has the fixed fields, ``severity`` from the rule
(``warning`` or ``critical``), ``variant`` None, the rule's own ``message`` or one said for it, and the
numbers in ``evidence`` (the rule, the value, the line, the baseline, since when), plus the rule's ``advice``.
The episode ends after ``clear_after`` healthy points, as a built-in detector's does.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from grpo_monitor.detectors.base import Assessment, Detector, Metrics, Sample
from grpo_monitor.detectors.numbers import to_number
from grpo_monitor.detectors.signals import get
from grpo_monitor.detectors.stats import median

KINDS = ("below", "above", "drop", "rise")
RULE_ID = re.compile(r"^[a-z][a-z0-9_]{1,63}$")


# The remedy name of a rule's advice: the recommendation says "follow the team rule", with the rule's words.
TEAM_RULE = "team_rule"


class RuleDetector(Detector):
    """One declared rule. Built by ``core.rules.load_rules`` from a file; all arguments are checked here.

    >>> r = RuleDetector("reward_floor", "reward", below=0.2, for_steps=3)
    >>> [(f.detector, f.severity, f.step, f.onset_step) for s in range(1, 11)
    ...  for f in r.update(s, {"reward": 0.5 if s < 5 else 0.1})]
    [('reward_floor', 'warning', 7, 5)]
    >>> r = RuleDetector("eval_slump", "eval_reward", drop=0.3, baseline_steps=20, severity="critical")
    >>> [(f.step, round(f.evidence["baseline"], 2)) for s in range(10, 101, 10)
    ...  for f in r.update(s, {"eval_reward": 0.6 if s < 60 else 0.35})]
    [(60, 0.6)]
    """

    variant = None
    # A team's check: it flags, but a run only it could read is not called judged; a report lists the rules it
    # could not check (their metric not logged) by this role.
    role = "rule"

    def __init__(self, id: str, metric: str, *, below: float | None = None, above: float | None = None,
                 drop: float | None = None, rise: float | None = None, for_steps: int = 1, baseline_steps: int = 10,
                 severity: str = "warning", message: str | None = None, advice: str | None = None) -> None:
        if not isinstance(id, str) or not RULE_ID.match(id):
            raise ValueError(f"rule id {id!r}: use 2-64 lowercase letters, digits and underscores, starting with a letter")
        if not isinstance(metric, str) or not metric.strip():
            raise ValueError(f"rule {id}: 'metric' must name a logged metric")
        given = {k: v for k, v in (("below", below), ("above", above), ("drop", drop), ("rise", rise)) if v is not None}
        if len(given) != 1:
            raise ValueError(f"rule {id}: give exactly one of {', '.join(KINDS)} (got {', '.join(given) or 'none'})")
        (kind, value), = given.items()
        x = to_number(value)
        if x is None or not math.isfinite(x):
            raise ValueError(f"rule {id}: {kind} must be a number, got {value!r}")
        if kind in ("drop", "rise") and not 0 < x < (1 if kind == "drop" else math.inf):
            raise ValueError(f"rule {id}: {kind} is a share of the baseline ({'0 < drop < 1' if kind == 'drop' else 'rise > 0'}), got {value!r}")
        for name, n in (("for_steps", for_steps), ("baseline_steps", baseline_steps)):
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"rule {id}: {name} must be a whole number of steps >= 1, got {n!r}")
        if severity not in ("warning", "critical"):
            raise ValueError(f"rule {id}: severity must be 'warning' or 'critical', got {severity!r}")
        for name, text in (("message", message), ("advice", advice)):
            if text is not None and not isinstance(text, str):
                raise ValueError(f"rule {id}: {name} must be text")
        self.id = id
        self.metric = metric
        self.below, self.above, self.drop, self.rise = below, above, drop, rise
        self.kind, self.value = kind, float(x)
        self.for_steps = for_steps
        self.baseline_steps = baseline_steps
        self.severity = severity
        self.message = message
        self.advice = advice
        self.requires = ((metric,),)
        super().__init__()

    def _reset_state(self) -> None:
        self.first_step: int | None = None
        self.baseline_values: list[float] = []
        self.baseline: float | None = None
        self.since: int | None = None

    def _line(self) -> float | None:
        if self.kind == "below" or self.kind == "above":
            return self.value
        if self.baseline is None:
            return None
        span = abs(self.baseline) * self.value
        return self.baseline - span if self.kind == "drop" else self.baseline + span

    def assess(self, step: int, metrics: Metrics, samples: Sequence[Sample]) -> Assessment | None:
        v = get(metrics, self.metric)
        if v is None:
            return None
        if self.first_step is None:
            self.first_step = step
        if self.kind in ("drop", "rise") and self.baseline is None:
            if step - self.first_step < self.baseline_steps:
                self.baseline_values.append(v)
                return Assessment(warming_up=True, evidence={"value": v, "baseline_points": len(self.baseline_values)})
            self.baseline = median(self.baseline_values or [v])
        line = self._line()
        assert line is not None
        breached = v < line if self.kind in ("below", "drop") else v > line
        if not breached:
            self.since = None
            return Assessment(0, {"value": v, "line": line})
        if self.since is None:
            self.since = step
        held = step - self.since + self.clock.gap
        evidence: dict[str, Any] = {
            "rule": {"metric": self.metric, self.kind: self.value, "for_steps": self.for_steps,
                     **({"baseline_steps": self.baseline_steps} if self.baseline is not None else {})},
            "value": v, "line": line, "since_step": self.since, "held_steps": held,
        }
        if self.baseline is not None:
            evidence["baseline"] = self.baseline
        if self.advice:
            evidence["advice"] = self.advice
            evidence["remedy"] = TEAM_RULE  # the rule's own words are the fix, not "change the code"
        if held < self.for_steps:
            return Assessment(0, evidence)
        return Assessment(2 if self.severity == "critical" else 1, evidence, onset_step=self.since)

    def _message(self, severity: str, evidence: Mapping[str, Any]) -> str:
        said = {"below": "below", "above": "above", "drop": "below", "rise": "above"}[self.kind]
        where = (f"{self.value:g}" if self.baseline is None else
                 f"{evidence.get('line'):.4g} ({100 * self.value:g}% {'under' if self.kind == 'drop' else 'over'} "
                 f"its baseline {self.baseline:.4g})")
        head = (f"Rule {self.id}: {self.metric} has been {said} {where} for {evidence.get('held_steps')} steps "
                f"(since step {evidence.get('since_step')}; now {evidence.get('value'):.4g}).")
        return f"{head} {self.message}" if self.message else head

    def params(self) -> dict[str, Any]:
        return {"id": self.id, "metric": self.metric, self.kind: self.value, "for_steps": self.for_steps,
                "baseline_steps": self.baseline_steps, "severity": self.severity, "message": self.message,
                "advice": self.advice}

    def to_dict(self) -> dict[str, Any]:
        """The rule as the file declares it (what a run header records)."""
        return {k: v for k, v in self.params().items() if v is not None}
