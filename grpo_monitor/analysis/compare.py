"""Several runs side by side (``grpo-monitor compare``): how an ablation reads — GRPO against DAPO or Dr. GRPO,
a learning-rate sweep, a restarted run's segments.

The runs are ``analyze``'s (``analysis.analyze``: the same replay, the same findings and verdicts); a
``Comparison`` adds what sets them apart:

- ``config_diff``: the settings that differ between the runs that record a config (a run directory's header,
  the few settings a ``trainer_state.json`` keeps, the config a notebook or a verl log printed), where-to-write
  settings (``output_dir``, ``run_name``, ...) left out;
- ``differences``: for each finding kind raised in some runs and not others, or at different steps, the metric
  behind it in every run as a share of that run's own early level (``EarlyLevel``), and the differing settings
  that bear on that kind (the variant preset the detector recommends, ``detectors.variants``, and the
  settings its findings and recommendations change, ``core.recommend``), said in one sentence.

``Comparison.to_dict()`` is ``compare --json``, a stable shape::

    {"runs": [{"label", "source", "file", "format", "steps", "verdict", "segment", "config_recorded",
               "findings": [Finding.to_dict(), ...]}],
     "config_diff": [{"key", "values": {label: value}}],        # only runs that record the key
     "curves": {metric: {label: [[step, value], ...]}},         # analyze's key curves, finite values
     "differences": [{"detector", "metric", "config_keys": [...], "sentence",
                      "runs": [{"label", "raised", "severity", "worst", "step", "onset_step",
                                "early", "level", "share", "at_step"}]}],
     "errors": [{"source", "error"}]}

``level`` is the metric at ``at_step`` (for a run that did not raise the kind, its lowest — or highest, as the
raising runs moved — three-point median up to there), ``share`` that over the run's ``early`` level (None
where the run does not log the metric, or its early level is 0).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo_monitor.analysis.run_report import SEVERITY_RANK, Report, RunReport

# Where a run wrote, not how it trained: two arms of one ablation always differ there.
PLACE_KEYS = frozenset({"output_dir", "logging_dir", "run_name", "resume_from_checkpoint", "hub_model_id", "hub_token",
                        "push_to_hub_token", "push_to_hub_model_id", "push_to_hub_organization", "trackio_space_id"})
# The settings a trainer_state.json keeps at its top level.
TRAINER_STATE_KEYS = ("train_batch_size", "logging_steps", "max_steps", "num_train_epochs", "eval_steps", "save_steps")
# The curve a finding kind is judged on, where its detector's first input is not the one to show.
METRIC_OF = {
    "entropy_collapse": "entropy", "entropy_rise": "entropy", "degenerate_long_cot": "completions/mean_length",
    "length_reward_coupling": "completions/mean_length", "length_collapse": "completions/mean_length",
    "sudden_collapse": "reward", "no_improvement": "reward", "no_learning_signal": "frac_reward_zero_std",
    "truncation": "completions/clipped_ratio", "grad_norm_spike": "grad_norm", "kl_pinned": "kl",
    "train_eval_divergence": "eval_reward", "eval_drop": "eval_reward",
}
# Settings a kind's remedy changes that no variant preset names (``core.recommend``: a policy that collapsed
# resumes at a lower learning rate; truncation raises the completion budget).
REMEDY_KEYS = {
    "truncation": ("max_completion_length",), "degenerate_long_cot": ("max_completion_length",),
    "grad_norm_spike": ("max_grad_norm", "learning_rate"), "kl_pinned": ("beta",),
}
# Points of a curve that make its early level (at least 3, at most 20, about its first tenth).
EARLY_MIN, EARLY_MAX = 3, 20


@dataclass
class RunDifference:
    """One run's side of a finding kind: whether it raised it, and the metric behind it against its early level."""

    label: str
    raised: bool
    severity: str | None = None  # the first finding's
    worst: str | None = None  # the worst severity the kind reached in the run
    step: int | None = None
    onset_step: int | None = None
    early: float | None = None
    level: float | None = None  # the metric at ``at_step`` (a run that did not raise the kind: its extreme)
    share: float | None = None  # ``level`` over ``early``
    at_step: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class FindingDifference:
    detector: str
    metric: str | None
    runs: list[RunDifference]
    config_keys: list[str]
    sentence: str

    def to_dict(self) -> dict[str, Any]:
        return {"detector": self.detector, "metric": self.metric, "config_keys": list(self.config_keys),
                "sentence": self.sentence, "runs": [r.to_dict() for r in self.runs]}


@dataclass
class Comparison:
    runs: list[RunReport]
    labels: list[str]
    # Each run's recorded settings, None for a run whose log records none.
    configs: list[dict[str, Any] | None]
    config_diff: dict[str, dict[str, Any]] = field(default_factory=dict)
    differences: list[FindingDifference] = field(default_factory=list)
    errors: list[tuple[str, str]] = field(default_factory=list)

    @property
    def metrics(self) -> list[str]:
        """The curves at least one run logged, in analyze's order."""
        return list(dict.fromkeys(name for r in self.runs for name in r.series))

    def to_dict(self) -> dict[str, Any]:
        return {
            "runs": [{"label": label, "source": r.source, "file": r.file, "format": r.format, "steps": r.steps,
                      "verdict": r.verdict, "segment": r.segment, "config_recorded": cfg is not None,
                      "findings": [f.to_dict() for f in r.findings]}
                     for label, r, cfg in zip(self.labels, self.runs, self.configs)],
            "config_diff": [{"key": k, "values": dict(v)} for k, v in self.config_diff.items()],
            "curves": {m: {label: [[s, v] for s, v in r.series[m]] for label, r in zip(self.labels, self.runs)
                           if m in r.series} for m in self.metrics},
            "differences": [d.to_dict() for d in self.differences],
            "errors": [{"source": p, "error": e} for p, e in self.errors],
        }


class CompareError(ValueError):
    """Fewer than two runs to compare; ``str()`` is the one line the CLI prints."""


def compare(report: Report) -> Comparison:
    """The comparison of every run ``report`` holds (``analyze``'s answer for the paths given).

    >>> try:
    ...     compare(Report([]))
    ... except CompareError as exc:
    ...     print(exc)
    compare needs at least two runs; found 0
    """
    runs = list(report.runs)
    if len(runs) < 2:
        found = f"found {len(runs)}" + (f" ({runs[0].source})" if runs else "")
        raise CompareError(f"compare needs at least two runs; {found}")
    labels = run_labels(runs)
    configs = [recorded_config(r) for r in runs]
    diff = config_diff(labels, configs)
    out = Comparison(runs, labels, configs, diff, errors=list(report.errors))
    out.differences = finding_differences(runs, labels, configs, diff)
    return out


def run_labels(runs: Sequence[RunReport]) -> list[str]:
    """Short names: ``segment N`` in a lineage, else the shortest path tail that tells the runs apart.

    >>> run_labels([RunReport("a/lr1e-6", "csv", 1, [], []), RunReport("a/lr1e-5", "csv", 1, [], [])])
    ['lr1e-6', 'lr1e-5']
    >>> run_labels([RunReport("x/run", "csv", 1, [], []), RunReport("y/run", "csv", 1, [], [])])
    ['x/run', 'y/run']
    """
    if all(r.segment is not None for r in runs) and len({r.segment for r in runs}) == len(runs):
        return [f"segment {r.segment}" for r in runs]
    for depth in (1, 2, 3):
        names = [_short("/".join(Path(r.source).parts[-depth:])) for r in runs]
        if len(set(names)) == len(names):
            return names
    return [f"{chr(65 + i % 26)}{i // 26 or ''} {r.source}" for i, r in enumerate(runs)]


def _short(name: str) -> str:
    """A log's name without its file extension: ``a.trainer_state.json`` -> ``a``, ``x.csv`` -> ``x``."""
    for ext in (".trainer_state.json", ".csv", ".jsonl", ".json", ".log", ".txt", ".ipynb"):
        if name.endswith(ext) and len(name) > len(ext):
            return name[:-len(ext)]
    return name


def recorded_config(run: RunReport) -> dict[str, Any] | None:
    """The settings the run's log records, None where it records none."""
    config: dict[str, Any] = {}
    if run.format == "run_dir":
        config = _header_config(Path(run.file))
    elif run.format in ("trainer_state", "checkpoints"):
        config = _trainer_state_config(Path(run.file))
    if run.config_from and run.config:
        config = {**config, **run.config}
    return {k: v for k, v in config.items() if k not in PLACE_KEYS} or None


def _header_config(run_file: Path) -> dict[str, Any]:
    from grpo_monitor.core.runlog import RunLogError, iter_records

    try:
        for record in iter_records(run_file):
            if record.get("type") == "header":
                config = record.get("config")
                return dict(config) if isinstance(config, Mapping) else {}
            break
    except (RunLogError, OSError):
        pass
    return {}


def _trainer_state_config(path: Path) -> dict[str, Any]:
    if path.is_dir():
        path = path / "trainer_state.json"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(doc, Mapping):
        return {}
    return {k: doc[k] for k in TRAINER_STATE_KEYS if k in doc and doc[k] is not None}


_MISSING = object()


def config_diff(labels: Sequence[str], configs: Sequence[dict[str, Any] | None]) -> dict[str, dict[str, Any]]:
    """The settings that differ between the runs that record a config: key -> {label: value} (a run that
    does not record the key is left out of its values).

    >>> config_diff(["a", "b", "c"], [{"lr": 1, "beta": 0}, {"lr": 2, "beta": 0}, None])
    {'lr': {'a': 1, 'b': 2}}
    """
    known = [(label, c) for label, c in zip(labels, configs) if c is not None]
    if len(known) < 2:
        return {}
    keys = sorted({k for _, c in known for k in c})
    out = {}
    for k in keys:
        values = [c.get(k, _MISSING) for _, c in known]
        if any(not _same(values[0], v) for v in values[1:]):
            out[k] = {label: c[k] for label, c in known if k in c}
    return out


def _same(a: Any, b: Any) -> bool:
    if a is _MISSING or b is _MISSING:
        return a is b
    if isinstance(a, bool) or isinstance(b, bool):  # True is not the 1 of another setting
        return a is b
    try:
        return bool(a == b)
    except Exception:
        return repr(a) == repr(b)


def relevant_keys(detector: str, runs: Sequence[RunReport]) -> list[str]:
    """The settings that bear on a finding kind: its detector's variant preset, what its findings and their
    recommendations change in any of the runs, and its remedy's settings.

    >>> relevant_keys("entropy_collapse", [])
    ['beta', 'epsilon', 'epsilon_high', 'learning_rate', 'loss_type', 'mask_truncated_completions']
    """
    from grpo_monitor.core.recommend import COLLAPSE_DETECTORS, LOWER_LR
    from grpo_monitor.detectors import ALL_DETECTORS
    from grpo_monitor.detectors.variants import VARIANT_PRESETS, preset

    keys: set[str] = set(REMEDY_KEYS.get(detector, ()))
    variants = {c.variant for c in ALL_DETECTORS if c.id == detector and c.variant}
    for r in runs:
        for f in r.findings:
            if f.detector == detector:
                keys.update(f.config_overrides or {})
                if f.variant in VARIANT_PRESETS:
                    variants.add(f.variant)
        for rec in r.recommendations:
            if rec.get("detector") == detector:
                keys.update(rec.get("settings") or {})
                keys.update(rec.get("config_overrides") or {})
                if rec.get("variant") == LOWER_LR:
                    keys.add("learning_rate")
    for v in variants:
        keys.update(preset(v))
    if detector in COLLAPSE_DETECTORS:
        keys.add("learning_rate")
    return sorted(keys)


@dataclass(frozen=True)
class EarlyLevel:
    """A curve against its own start: ``early`` is the median of its first points (about a tenth, 3 to 20),
    ``at(step)`` the median of the last three points up to ``step``, ``extreme(down, until)`` the lowest
    (or highest) three-point median after the early points.

    >>> c = EarlyLevel.of([(s, 10.0 if s <= 10 else 1.0) for s in range(1, 101)])
    >>> c.early, c.at(50), c.extreme(True, 100)
    (10.0, 1.0, 1.0)
    """

    points: tuple[tuple[int, float], ...]
    early: float
    n_early: int

    @classmethod
    def of(cls, points: Sequence[tuple[int, float]]) -> EarlyLevel:
        n = max(EARLY_MIN, min(EARLY_MAX, len(points) // 10))
        return cls(tuple(points), statistics.median(v for _, v in points[:n]), min(n, len(points)))

    def at(self, step: int) -> float | None:
        upto = [v for s, v in self.points if s <= step][-3:]
        return statistics.median(upto) if upto else None

    def extreme(self, down: bool, until: int | None) -> float | None:
        vals = [v for s, v in self.points[self.n_early:] if until is None or s <= until]
        smooth = [statistics.median(vals[max(0, i - 2):i + 1]) for i in range(len(vals))]
        if not smooth:
            return None
        return min(smooth) if down else max(smooth)

    def share(self, value: float | None) -> float | None:
        if value is None or self.early == 0:
            return None
        return value / self.early


def _first(run: RunReport, detector: str) -> Any:
    """The run's earliest warning/critical finding of a kind, with the worst severity it reached."""
    found = [f for f in run.training_findings if f.detector == detector and f.severity in ("warning", "critical")]
    if not found:
        return None
    first = min(found, key=lambda f: (f.onset_step if f.onset_step is not None else f.step, f.step))
    worst = max(found, key=lambda f: SEVERITY_RANK.get(f.severity, 0))
    return first, worst.severity


def metric_of(detector: str, runs: Sequence[RunReport]) -> str | None:
    """The curve behind a finding kind that the runs logged: ``METRIC_OF``, else its detector's first input."""
    logged = {m for r in runs for m in r.series}
    if METRIC_OF.get(detector) in logged:
        return METRIC_OF[detector]
    from grpo_monitor.detectors import ALL_DETECTORS

    for c in ALL_DETECTORS:
        if c.id == detector:
            for group in c.requires or ():
                for spec in group:
                    for name in spec.split("|"):
                        if name in logged:
                            return name
    return None


def finding_differences(runs: Sequence[RunReport], labels: Sequence[str], configs: Sequence[dict[str, Any] | None],
                        diff: Mapping[str, Mapping[str, Any]]) -> list[FindingDifference]:
    """A ``FindingDifference`` per finding kind raised in some runs and not others, or at different steps."""
    kinds = list(dict.fromkeys(f.detector for r in runs for f in r.training_findings
                               if f.severity in ("warning", "critical")))
    out = []
    for kind in kinds:
        firsts = [_first(r, kind) for r in runs]
        at = {None if x is None else (x[0].onset_step, x[0].step) for x in firsts}
        if len(at) < 2:  # every run raised it at the same step: nothing sets them apart
            continue
        metric = metric_of(kind, runs)
        sides = []
        for label, run, first in zip(labels, runs, firsts):
            side = RunDifference(label, first is not None)
            if first is not None:
                f, side.worst = first
                side.severity = f.severity
                side.step, side.onset_step = f.step, f.onset_step
            sides.append(side)
        _measure(sides, runs, metric)
        keys = [k for k in relevant_keys(kind, runs) if k in diff]
        out.append(FindingDifference(kind, metric, sides, keys,
                                     _sentence(kind, metric, sides, keys, diff, configs, labels)))
    return out


def _measure(sides: list[RunDifference], runs: Sequence[RunReport], metric: str | None) -> None:
    """Each side's metric against its early level: a run that raised the kind at its finding's step; one that
    did not, its extreme (in the direction the raising runs moved) up to the last step one of them raised it."""
    if metric is None:
        return
    curves = {s.label: EarlyLevel.of(r.series[metric]) for s, r in zip(sides, runs) if r.series.get(metric)}
    raised_shares = []
    for s in sides:
        c = curves.get(s.label)
        if c is None or not s.raised:
            continue
        s.early, s.at_step = c.early, s.step
        s.level = c.at(s.step)
        s.share = c.share(s.level)
        if s.share is not None:
            raised_shares.append(s.share)
    down = not raised_shares or statistics.median(raised_shares) < 1
    until = max((s.step for s in sides if s.raised and s.step is not None), default=None)
    for s in sides:
        c = curves.get(s.label)
        if c is None or s.raised:
            continue
        s.early = c.early
        s.level = c.extreme(down, until)
        s.at_step = min(until, c.points[-1][0]) if until is not None else c.points[-1][0]
        if s.level is None:  # it starts after that step (a restarted segment) or has too few points before it
            s.level, s.at_step = c.extreme(down, None), c.points[-1][0]
        s.share = c.share(s.level)


def pct(share: float) -> str:
    """A share of the early level as a percentage: ``pct(0.031) == '3 %'``, ``pct(0.004) == '0.4 %'``."""
    p = 100 * share
    return f"{p:.0f} %" if abs(p) >= 1 else f"{p:.1g} %"


def _value(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def _sentence(kind: str, metric: str | None, sides: list[RunDifference], keys: list[str],
              diff: Mapping[str, Mapping[str, Any]], configs: Sequence[dict[str, Any] | None],
              labels: Sequence[str]) -> str:
    raised = [s for s in sides if s.raised]
    clear = [s for s in sides if not s.raised]
    head = f"{kind} in " + ", ".join(
        f"{s.label} ({s.severity} at step {s.step}" + (f", {s.worst} later" if s.worst != s.severity else "")
        + (f", onset {s.onset_step}" if s.onset_step is not None else "")
        + ")" for s in raised) + (f", not in {', '.join(s.label for s in clear)}" if clear else "")
    parts = [head]
    if metric is not None:
        shares = [s.share for s in raised if s.share is not None]
        down = not shares or statistics.median(shares) < 1
        said = []
        for s in raised:
            if s.level is None:
                said.append(f"{s.label} logs no {metric}")
            elif s.share is None:
                said.append(f"{s.label}'s {metric} is {s.level:.3g} at step {s.step} (0 early)")
            elif abs(s.share - 1) < 0.05:
                said.append(f"{s.label}'s {metric} is at {pct(s.share)} of its early level at step {s.step}")
            else:
                said.append(f"{s.label}'s {metric} {'falls' if s.share < 1 else 'rises'} to {pct(s.share)} of its "
                            f"early level by step {s.step}")
        for s in clear:
            side = "at or above" if down else "at or below"
            if s.level is None:
                said.append(f"{s.label} logs no {metric}")
            elif s.share is None:
                said.append(f"{s.label}'s {metric} stays {side} {s.level:.3g} (0 early) through step {s.at_step}")
            else:
                said.append(f"{s.label}'s {metric} stays {side} {pct(s.share)} of its early level "
                            f"through step {s.at_step}")
        parts.append(" while ".join([", ".join(said[:len(raised)])] + ([", ".join(said[len(raised):])] if clear else [])))
    parts.append(_config_clause(kind, sides, keys, diff, configs, labels))
    return "; ".join(p for p in parts if p) + "."


def _config_clause(kind: str, sides: list[RunDifference], keys: list[str], diff: Mapping[str, Mapping[str, Any]],
                   configs: Sequence[dict[str, Any] | None], labels: Sequence[str]) -> str:
    recorded = [label for label, c in zip(labels, configs) if c is not None]
    if len(recorded) < 2:
        return "the logs record no config to set against it"
    if not keys:
        others = ", ".join(list(diff)[:6])
        return (f"no setting tied to {kind} differs" + (f" (other differences: {others})" if others else "")
                if diff else "their recorded configs are the same")
    raised = [s.label for s in sides if s.raised]
    clear = [s.label for s in sides if not s.raised and s.label in recorded]
    if len(raised) == 1 and len(clear) == 1 and all(raised[0] in diff[k] and clear[0] in diff[k] for k in keys):
        mine = ", ".join(f"{k}={_value(diff[k][clear[0]])}" for k in keys)
        theirs = ", ".join(f"{k}={_value(diff[k][raised[0]])}" for k in keys)
        return f"{clear[0]} sets {mine} ({raised[0]}: {theirs})"
    return "settings that bear on it differ: " + ", ".join(
        f"{k} (" + ", ".join(f"{label} {_value(v)}" for label, v in diff[k].items()) + ")" for k in keys)
