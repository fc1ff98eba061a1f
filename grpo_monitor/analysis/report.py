"""Offline analysis: replay the detectors over a finished run, exactly as the live monitor would.

The replay feeds each logged step (and its samples, for our run directories) through the same
``Engine`` the callback uses, in step order, so a finding's ``step`` is the step at which the
live monitor raised or would have raised it. A run directory's ``config_*`` findings (the
pre-flight checks the callback wrote at the start) are part of its report, as they were live, with
their recommendations; they are advice on the recipe and never set the verdict, so one run gets one
verdict whichever of its logs (run directory, console log, checkpoint) is read.

Every report says which detectors could judge the run and why the others could not. A run no
failure detector could judge is never called healthy: its verdict is ``cannot_judge``, with the
metrics found and the ones needed, and ``analyze`` exits 3. A run directory that ended without
its final summary is ``incomplete``; one ``run.jsonl`` holding two runs is reported as two runs; a
folder of runs is analysed run by run.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo_monitor.detectors.base import Finding
from grpo_monitor.detectors.numbers import finite
from grpo_monitor.core.engine import Engine
from grpo_monitor.core.recommend import title as rec_title
from grpo_monitor.core.exit_codes import ExitCode
from grpo_monitor.analysis.explain import clipping_never_fired

SEVERITY_RANK = {"info": 0, "warning": 1, "critical": 2}
CURVES = ("entropy", "reward", "completions/mean_length", "completions/clipped_ratio", "frac_reward_zero_std", "grad_norm",
          "kl", "eval_reward", "eval_accuracy")
VERDICTS = ("healthy", "incomplete", "cannot_judge", "warning", "critical")
# The status of a run that stopped before its end (Ctrl-C, a crash): its verdict is ``incomplete``
# unless a finding says more.
INTERRUPTED = "interrupted"
_BARS = "▁▂▃▄▅▆▇█"
# The inputs the failure detectors read, in the order a user would map them.
KEY_INPUTS = ("reward", "completions/mean_length", "completions/clipped_ratio", "entropy", "frac_reward_zero_std",
              "reward_std", "rewards/<name>/mean")
# ``--map`` targets a user may write short.
MAP_TARGETS = {
    "length": "completions/mean_length",
    "mean_length": "completions/mean_length",
    "completion_length": "completions/mean_length",
    "max_length": "completions/max_length",
    "clipped_ratio": "completions/clipped_ratio",
    "clipped": "completions/clipped_ratio",
    "truncated": "completions/clipped_ratio",
    "correctness": "rewards/correctness/mean",
    "correct": "rewards/correct/mean",
    "accuracy": "rewards/accuracy/mean",
    "format": "rewards/format/mean",
    "zero_std": "frac_reward_zero_std",
}


@dataclass
class Costing:
    """What the cost figures need beyond the log: the price of a GPU-hour and, where the log does not say
    it, the device count."""

    gpu_hour_price: float | None = None
    devices: int | None = None


ANNOTATIONS = ("cost", "forecast")


@dataclass
class RunReport:
    source: str
    format: str
    steps: int
    findings: list[Finding]
    recommendations: list[dict[str, Any]]
    series: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    # The file (or folder) actually read, which detectors could judge, the metrics with a value.
    file: str = ""
    coverage: dict[str, dict[str, Any]] = field(default_factory=dict)
    metrics_found: list[str] = field(default_factory=list)
    # None (finished, or nothing says otherwise), "incomplete" (no final summary), "restarted"
    # (stopped by the monitor for a restart), with a sentence saying so.
    status: str | None = None
    status_note: str = ""
    # The run's segment in a restarted lineage, counted from 1 as every screen shows it (headers
    # record it from 0); None for a run that was never restarted.
    segment: int | None = None
    # Patterns in the run that look wrong but are normal GRPO behaviour (``grpo_monitor.analysis.explain``); they
    # never change the verdict.
    notes: list[dict[str, Any]] = field(default_factory=list)
    # Lines of the run's files that were not records, each left out alone: how many, and where.
    skipped: dict[str, Any] | None = None
    # What the run's writer could not write (the disk filled, an I/O error), from its notes, and
    # the steps the run logged, those missing from the log included.
    not_written: dict[str, Any] | None = None
    steps_logged: int | None = None
    # What the run spent (``run``) and what each warning/critical finding cost from its onset to the end of
    # the run (``findings``, in the order of ``findings``; ``core.cost``).
    cost: dict[str, Any] = field(default_factory=dict)
    # The GPU's health over the run (``core.device.device_health``, with the device the run header names),
    # None when the run logged no device readings.
    device: dict[str, Any] | None = None
    # Where a foreign log's training config came from (a notebook's GRPOConfig cell, the config verl printed)
    # and the settings read there that the detectors and recommendations use; None when the log gave none.
    config_from: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    # Each detector's state at the end of the replay, as the session shows it (the dashboard's board).
    states: dict[str, str] = field(default_factory=dict)
    # The log's own names mapped onto the canonical ones by their words (``core.names``): ``mapped`` (name ->
    # {to, by}) and ``ambiguous`` (canonical name -> the names left unmapped for it); empty when none was.
    names: dict[str, Any] = field(default_factory=dict)

    @property
    def judged_by(self) -> list[str]:
        return [d for d, c in self.coverage.items() if c.get("role") == "failure" and c.get("status") == "judged"]

    @property
    def checked_by(self) -> list[str]:
        """The sanity checks (``role = "guard"``: non-finite values, grad-norm spikes, stalls, ...) that had their
        inputs: they raise findings, but a run only they could read is not called judged."""
        return [d for d, c in self.coverage.items() if c.get("role") == "guard" and c.get("status") == "judged"]

    @property
    def not_judged(self) -> dict[str, str]:
        return {d: str(c.get("reason")) for d, c in self.coverage.items()
                if c.get("role") == "failure" and c.get("status") != "judged" and c.get("status") != "not_applicable"}

    @property
    def training_findings(self) -> list[Finding]:
        """The detectors' findings about the training, without the pre-flight ``config_*`` ones."""
        return [f for f in self.findings if not is_preflight(f)]

    @property
    def preflight_findings(self) -> list[Finding]:
        """The pre-flight ``config_*`` findings a run directory records: advice on the recipe."""
        return [f for f in self.findings if is_preflight(f)]

    @property
    def worst_severity(self) -> int:
        # The verdict is about the training: the recipe's pre-flight findings are shown with their
        # recommendations but a run directory, its console log and its checkpoint get one verdict.
        return max((SEVERITY_RANK.get(f.severity, 0) for f in self.training_findings), default=-1)

    @property
    def verdict(self) -> str:
        worst = self.worst_severity
        if worst >= 2:
            return "critical"
        if worst == 1:
            return "warning"
        if self.coverage and not self.judged_by:
            return "cannot_judge"
        if self.status in ("incomplete", INTERRUPTED):
            # A run that stopped before its end is never called healthy; a finding, above, wins over it.
            return "incomplete"
        return "healthy"

    @property
    def flagged(self) -> bool:
        return any(f.severity in ("warning", "critical") for f in self.training_findings)

    @property
    def exit_code(self) -> int:
        v = self.verdict
        if v in ("critical", "warning"):
            return ExitCode.FINDINGS
        return ExitCode.NOT_JUDGED if v in ("cannot_judge", "incomplete") else ExitCode.CLEAN

    def to_dict(self) -> dict[str, Any]:
        out = {
            "source": self.source,
            "steps": self.steps,
            "findings": [f.to_dict() for f in self.findings],
            "recommendations": self.recommendations,
            "file": self.file,
            "format": self.format,
            "verdict": self.verdict,
            "judged_by": self.judged_by,
            "checked_by": self.checked_by,
            "not_judged": self.not_judged,
            "metrics_found": self.metrics_found,
            "model": dict(self.model),
        }
        if self.status:
            out["status"] = self.status
            out["status_note"] = self.status_note
        if self.verdict == "cannot_judge":
            out["needs"] = needs_text(self)
        if self.warnings:
            out["notes"] = list(self.warnings)
        if self.skipped:
            out["skipped_records"] = dict(self.skipped)
        if self.not_written:
            out["not_written"] = dict(self.not_written)
            out["steps_logged"] = self.steps_logged
        # Explanations of normal behaviour under their own key: "notes" has carried the read warnings.
        out["normal"] = list(self.notes)
        if self.config_from:
            out["config_from"] = self.config_from
            out["config"] = dict(self.config)
        if self.cost:
            out["cost"] = dict(self.cost)
        if self.device:
            out["device"] = dict(self.device)
        if self.names:
            out["names"] = dict(self.names)
        return out


def is_preflight(finding: Finding | Mapping[str, Any]) -> bool:
    """A pre-flight ``config_*`` finding (the recipe lint's), not a detector's finding about the training."""
    det = finding.get("detector") if isinstance(finding, Mapping) else getattr(finding, "detector", "")
    return str(det or "").startswith("config_")


@dataclass
class Report:
    runs: list[RunReport]
    # Paths inside an analysed folder that could not be read: (path, one-line reason).
    errors: list[tuple[str, str]] = field(default_factory=list)
    # Loose files beside the runs of a folder that looked like logs but did not read as one.
    skipped: list[tuple[str, str]] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        """The verdict over every run, worst first as the exit code ranks them: ``critical``, ``warning``,
        ``unreadable`` (a run found could not be read), ``cannot_judge``, ``incomplete``, ``healthy``;
        a single run's own verdict when one was analysed."""
        verdicts = {r.verdict for r in self.runs}
        for v in ("critical", "warning"):
            if v in verdicts:
                return v
        if self.errors or not self.runs:
            return "unreadable"
        for v in ("cannot_judge", "incomplete"):
            if v in verdicts:
                return v
        return "healthy"

    @property
    def exit_code(self) -> int:
        """1 when a run has a warning or critical finding; else 2 when a run could not be read;
        else 3 when a run could not be judged or is incomplete; else 0."""
        codes = {r.exit_code for r in self.runs}
        if ExitCode.FINDINGS in codes:
            return ExitCode.FINDINGS
        if self.errors:
            return ExitCode.BAD_INPUT
        if ExitCode.NOT_JUDGED in codes:
            return ExitCode.NOT_JUDGED
        return ExitCode.CLEAN

    def to_dict(self) -> dict[str, Any]:
        # A run of the folder that could not be read keeps the fixed shape, with its error.
        unreadable = [{"source": p, "steps": 0, "findings": [], "recommendations": [], "verdict": "unreadable", "error": e}
                      for p, e in self.errors]
        return {"runs": [r.to_dict() for r in self.runs] + unreadable}


# -- preparing a source ----------------------------------------------------------------------


def parse_mapping(items: Sequence[str] | Mapping[str, str] | None) -> dict[str, str]:
    """``["score_mean=reward", ...]`` (or a dict) as ``{column: metric}``; raises ValueError on a bad item.

    The metric may be a TRL name (``reward``, ``entropy``, ``completions/mean_length``,
    ``rewards/<name>/mean``), a short form (``length``, ``clipped_ratio``, ``correctness``) or any
    spelling the normaliser knows.

    >>> parse_mapping(["score_mean=reward", "acc = correctness", "len=length"])
    {'score_mean': 'reward', 'acc': 'rewards/correctness/mean', 'len': 'completions/mean_length'}
    """
    from grpo_monitor.core.metrics import normalize

    if items is None:
        return {}
    pairs: list[tuple[str, str]] = []
    if isinstance(items, Mapping):
        pairs = [(str(k), str(v)) for k, v in items.items()]
    else:
        for item in items:
            column, sep, metric = str(item).partition("=")
            if not sep or not column.strip() or not metric.strip():
                raise ValueError(f"--map {item!r}: expected COLUMN=METRIC, e.g. --map score_mean=reward")
            pairs.append((column, metric))
    out: dict[str, str] = {}
    for column, metric in pairs:
        column, metric = column.strip(), metric.strip()
        out[column] = normalize(MAP_TARGETS.get(metric, metric))
    return out


def prepare(src: Any, mapping: Mapping[str, str] | None = None) -> Any:
    return prepare_names(src, mapping)[0]


def prepare_names(src: Any, mapping: Mapping[str, str] | None = None) -> tuple[Any, list[str]]:
    """Apply a user's column mapping, then the names the log's own words resolve to (``core.names``), and
    derive the metrics a log reports in parts, in place; the source and its metric names afterwards. What the
    words mapped (and what they could not tell apart) is kept in ``src.meta["names"]``.

    A mapped column is found under its name as logged or as normalised; the mapped metric wins
    over one of the same name the log already had.
    """
    from grpo_monitor.core.metrics import derive_metrics, normalize
    from grpo_monitor.core.names import resolve
    from grpo_monitor.detectors.signals import reward_names_in, reward_roles

    names = src.metric_names()
    renames: dict[str, str] = {}
    for column, metric in (mapping or {}).items():
        for key in (column, normalize(column)):
            if key in names and key != metric:
                renames[key] = metric
                break
        else:
            if metric not in names:
                src.warnings.append(f"--map {column}={metric}: the run logs no column {column!r}")
    if src.format != "run_dir":  # our own run log holds TRL's names already
        mapped = set(renames)
        left = [n for n in names if n not in mapped]
        values: dict[str, list[Any]] = {n: [] for n in left}
        for _, metrics in src.steps[:64]:
            for n in left:
                v = metrics.get(n)
                if v is not None:
                    values[n].append(v)
        words = resolve(left, values, known=[n for n in names if n not in mapped] + list(renames.values()))
        renames.update(words.mapping)
        spelled = {n: {"to": t, "by": "a known spelling"} for n, t in (src.meta.get("spellings") or {}).items()}
        if words.mapping or words.ambiguous or spelled:
            src.meta["names"] = {"mapped": {**spelled, **{n: {"to": t, "by": words.how[n]}
                                                         for n, t in words.mapping.items()}},
                                 "ambiguous": words.ambiguous}
    probe = dict.fromkeys(names, 0.0)
    derives = derive_metrics(probe) is not None
    if renames or derives:
        steps = []
        for step, metrics in src.steps:
            m = dict(metrics)
            for key, metric in renames.items():
                if key in m:
                    v = m.pop(key)
                    if v is not None or metric not in m:
                        m[metric] = v
            if derives:
                extra = derive_metrics(m)
                if extra:
                    m.update(extra)
            steps.append((step, m))
        src.steps = steps
    if renames:
        known = list(src.context.reward_names or [])
        for name in reward_names_in(renames.values()):
            if name not in known:
                known.append(name)
        src.context.reward_names = known
        correct, fmt = reward_roles(known)  # the one guess, live and offline
        src.context.correctness_reward = src.context.correctness_reward or correct
        src.context.format_reward = src.context.format_reward or fmt
    if renames or derives:
        names = list(dict.fromkeys([renames.get(n, n) for n in names] + (["frac_reward_zero_std"] if derives else [])))
    return src, names


def names_with_values(steps: Sequence[tuple[int, Mapping[str, Any]]], names: Sequence[str] | None = None) -> list[str]:
    """The metric names (all of ``names``, by default every name logged) holding a finite value at
    some step, in their order. Steps are walked only until every name has shown one."""
    if names is None:
        names = list(dict.fromkeys(k for _, m in steps for k in m))
    pending = dict.fromkeys(names)
    found: set[str] = set()
    for _, metrics in steps:
        if not pending:
            break
        done = [k for k in pending if finite(metrics.get(k)) is not None]
        for k in done:
            del pending[k]
            found.add(k)
    return [n for n in names if n in found]


def _has_samples(src: Any) -> bool:
    try:
        return len(src.samples) > 0
    except Exception:
        return bool(src.samples)


def replay(src: Any, detectors: Sequence[Any] | None = None) -> tuple[list[Finding], list[dict[str, Any]]]:
    findings, recs, _ = replay_with_coverage(src, detectors)
    return findings, recs


def replay_with_coverage(
    src: Any, detectors: Sequence[Any] | None = None, names: Sequence[str] | None = None,
    costing: Costing | None = None, engine_out: list[Any] | None = None,
) -> tuple[list[Finding], list[dict[str, Any]], dict[str, dict[str, Any]]]:
    session = replay_session(src, detectors, costing)
    if engine_out is not None:
        engine_out.append(session.engine)
    if names is None:
        names = names_with_values(src.steps, src.metric_names())
    coverage = session_coverage(session, src, names)
    return session.findings, session.recommendations, coverage


def replay_session(src: Any, detectors: Sequence[Any] | None = None, costing: Costing | None = None,
                   each: Any = None) -> Any:
    """A recorded run replayed through the one session ``analyze``, the dashboard and the live callback share
    (``core.session``): its pre-flight findings first, as the live callback met them, then every logged step."""
    from grpo_monitor.core.recommend import lineage_options
    from grpo_monitor.core.session import SessionOptions, open_session

    costing = costing or Costing()
    header = getattr(getattr(src, "run", None), "header", None)
    session = open_session(src.context, SessionOptions(
        detectors=detectors, devices=costing.devices or run_devices(src), gpu_hour_price=costing.gpu_hour_price,
        runtime=run_runtime(src), clipping_never_fired=clipping_never_fired(src.steps), **lineage_options(header)))
    session.preflight(config_findings(src))
    session.replay(src.steps, src.samples, each)
    return session


def session_coverage(session: Any, src: Any, names: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Which detectors could judge the replayed run, and why the others could not."""
    coverage = session.coverage(set(names), _has_samples(src))
    if not src.steps:
        for c in coverage.values():
            if c["status"] in ("judged", "too_few_points", "missing_inputs"):
                c["status"], c["reason"] = "missing_inputs", "no logged step"
    return coverage


def run_devices(src: Any) -> int | None:
    """The device count a run directory's header records (``world_size``), else None."""
    header = getattr(getattr(src, "run", None), "header", None) or {}
    n = header.get("world_size")
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 1 else None


def run_runtime(src: Any) -> tuple[float, int] | None:
    """``train_runtime`` of the run's final summary and the steps it covered, where the log kept it."""
    summary = getattr(getattr(src, "run", None), "summary", None)
    metrics = (summary or {}).get("metrics") if isinstance(summary, Mapping) else None
    metrics = metrics or (src.meta.get("summary") if isinstance(getattr(src, "meta", None), Mapping) else None) or {}
    runtime = metrics.get("train_runtime") if isinstance(metrics, Mapping) else None
    if isinstance(runtime, (int, float)) and not isinstance(runtime, bool) and runtime > 0 and src.steps:
        return float(runtime), int(src.steps[-1][0])
    return None


def cost_summary(engine: Any, findings: Sequence[Finding]) -> dict[str, Any]:
    """The run's spend and each warning/critical finding's cost from its onset to the run's last step."""
    from grpo_monitor.core.cost import CostMeter

    meter = engine.annotator(CostMeter) if engine is not None else None
    if meter is None or meter.last_step is None or not len(meter.steps):
        return {}
    last = meter.last_step
    out: dict[str, Any] = {"run": meter.between(int(meter.steps[0]), last), "findings": []}
    for f in findings:
        if f.severity == "info":
            continue
        since = f.onset_step if f.onset_step is not None else f.step
        out["findings"].append({"detector": f.detector, "severity": f.severity, "step": f.step,
                                "to_end": meter.between(min(int(since), f.step), last)})
    return out


def config_findings(src: Any) -> list[Finding]:
    """The pre-flight ``config_*`` findings a run directory's callback wrote at the start."""
    run = getattr(src, "run", None)
    out = []
    for rec in getattr(run, "findings", None) or []:
        if not str(rec.get("detector", "")).startswith("config_"):
            continue
        try:
            out.append(Finding.from_dict(rec))
        except (TypeError, ValueError):
            continue
    return out


def write_loss(src: Any) -> Any:
    """What a run directory's writer could not write (``core.runlog.WriteLoss``), or None."""
    run = getattr(src, "run", None)
    if run is None or src.format != "run_dir":
        return None
    from grpo_monitor.core.runlog import write_losses

    return write_losses(getattr(run, "notes", None) or [])


def run_status(src: Any) -> tuple[str | None, str]:
    """Whether a run finished: a run directory's final summary, a restart the monitor asked for, an
    interruption its log records (Ctrl-C, a crash), or none of them; a log that ends in a traceback
    (a console log's ``KeyboardInterrupt``) is an interrupted run. A run whose writer could not write some
    of its steps is ``incomplete`` whatever else it did: its findings cover only the steps in the log."""
    run = getattr(src, "run", None)
    last = src.steps[-1][0] if src.steps else None
    at = f" after step {last}, the last it logged," if last is not None else " before its first logged step,"
    ended_by = (getattr(src, "meta", None) or {}).get("ended_by")
    if ended_by and (run is None or src.format != "run_dir"):
        how = "interrupted (Ctrl-C)" if "KeyboardInterrupt" in ended_by else f"stopped by {ended_by}"
        return INTERRUPTED, (f"the log ends in a traceback: the run was {how}{at} before its end; the findings "
                             "cover the steps logged so far")
    if run is None or src.format != "run_dir":
        return None, ""
    loss = write_loss(src)
    if loss is not None and (loss.steps or loss.records.get("summary") or loss.uncounted):
        return "incomplete", loss.line(len(src.steps)) + "; the findings cover the steps in the log"
    halt = next((n for n in reversed(getattr(run, "notes", None) or []) if n.get("event") == "stopped"), None)
    if halt is not None:  # auto-restart stopped it on a finding no configuration change cures
        return "stopped", f"{halt.get('message')}; next: {halt.get('advice')}"
    if getattr(run, "summary", None) is not None:
        return None, ""
    if getattr(run, "restarts", None):
        return "restarted", "stopped by the monitor to restart with a variant (see its segments)"
    stop = next((n for n in reversed(getattr(run, "notes", None) or []) if n.get("event") == INTERRUPTED), None)
    if stop is not None:
        return INTERRUPTED, f"{stop.get('message') or 'the run was interrupted'}; the findings cover the steps logged so far"
    if not src.steps:
        return "incomplete", "no logged step: the run stopped before its first log, or has not logged yet"
    last = src.steps[-1][0]
    config = src.context.config or {}
    max_steps = config.get("max_steps")
    of = f" of max_steps {max_steps}" if isinstance(max_steps, int) and max_steps > 0 else ""
    if of and last >= max_steps:
        return None, ""
    age = ""
    with contextlib.suppress(OSError):
        import time

        seconds = time.time() - (Path(run.path) / "run.jsonl").stat().st_mtime
        age = f", last written {_ago(seconds)} ago"
    return "incomplete", (f"no final summary: the run stopped at step {last}{of}, or is still running{age}; "
                          "the findings cover the steps logged so far")


def _ago(seconds: float) -> str:
    if seconds < 120:
        return f"{int(seconds)} s"
    if seconds < 7200:
        return f"{int(seconds // 60)} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.0f} days"


def _read_target(src: Any, path: Any) -> str:
    p = Path(getattr(src, "path", path))
    if src.format == "run_dir" and p.is_dir():
        return str(p / "run.jsonl")
    return str(p)


def analyze_one(path: str | os.PathLike[str], detectors: Sequence[Any] | None = None,
                logging_steps: int | None = None, mapping: Mapping[str, str] | None = None,
                model: str | Mapping[str, Any] | None = None, costing: Costing | None = None) -> RunReport:
    return analyze_run(path, detectors, logging_steps, mapping, model, costing)[0]


def analyze_run(path: str | os.PathLike[str], detectors: Sequence[Any] | None = None,
                logging_steps: int | None = None, mapping: Mapping[str, str] | None = None,
                model: str | Mapping[str, Any] | None = None, costing: Costing | None = None) -> list[RunReport]:
    """The reports of one path: one run, or each run of a file that holds several (a ``run.jsonl``
    written twice, a results file with one run per arm). ``model`` (a hub id, a local model folder, or
    model facts as ``model_facts`` gives them) is the model the run trained, in place of what the log says."""
    from grpo_monitor.readers import load_source
    from grpo_monitor.readers.model import set_model

    facts = model_facts_of(model)
    kind = own_report(path) if _is_file(Path(path)) else None
    if kind is not None:
        from grpo_monitor.readers import SourceError

        raise SourceError(Path(path), f"a {kind}, not a training log: analyze the run it reports on")
    with _collector_paused():
        src = load_source(path, logging_steps=logging_steps)
        parts = split_runs(src) or [(str(path), src)]
        reports = []
        for label, part in parts:
            set_model(part, facts, override=True)
            reports.append(_report(label, *prepare_names(part, mapping), detectors, path, costing))
    return reports


def model_facts_of(model: str | Mapping[str, Any] | None) -> dict[str, Any] | None:
    """What ``--model`` / ``model=`` names, as the model facts of a run header; raises
    ``SourceError`` for a local path that holds no model config."""
    if model is None:
        return None
    if isinstance(model, Mapping):
        return dict(model)
    from grpo_monitor.readers.model import model_from_spec

    return model_from_spec(str(model))


def _report(label: str, src: Any, logged: list[str], detectors: Sequence[Any] | None, path: Any,
            costing: Costing | None = None) -> RunReport:
    names = names_with_values(src.steps, logged)
    session = replay_session(src, with_recorded_rules(src, detectors), costing)
    findings, recs, coverage = session.findings, session.recommendations, session_coverage(session, src, names)
    status, note = run_status(src)
    warnings = list(src.warnings)
    skipped = None
    if src.format == "run_dir":
        from grpo_monitor.readers.run_dir import skipped_records

        # After the replay: a step's samples are parsed (and a bad one found) when it is reached.
        found = skipped_records(src)
        index = getattr(getattr(src, "samples", None), "index", None)
        if index is not None and index.skipped.count:
            warnings.append(index.skipped.line())
        skipped = found.to_dict() if found.count else None
    loss = write_loss(src)
    if loss is not None and status != "incomplete":  # else the status says it
        warnings.insert(0, loss.line(len(src.steps)))
    config_from = _config_from(src)
    return RunReport(
        source=label,
        format=src.format,
        steps=len(src.steps),
        findings=config_findings(src) + findings,
        recommendations=recs,
        series=key_curves(src.steps),
        model=dict(src.context.model),
        warnings=warnings,
        file=_read_target(src, path),
        coverage=coverage,
        metrics_found=names,
        status=status,
        status_note=note,
        segment=_segment_of(src),
        notes=_notes(src),
        skipped=skipped,
        not_written=loss.to_dict() if loss is not None else None,
        steps_logged=len(src.steps) + loss.steps if loss is not None else None,
        cost=cost_summary(session.engine, findings),
        states=session.state_names(),
        names=dict(src.meta.get("names") or {}),
        device=_device(src),
        config_from=config_from,
        config=dict(src.context.config or {}) if config_from else {},
    )


def _config_from(src: Any) -> str | None:
    """What a reader says a foreign log's config came from (``Source.meta["config_from"]``), else None."""
    meta = getattr(src, "meta", None)
    origin = meta.get("config_from") if isinstance(meta, Mapping) else None
    return origin if isinstance(origin, str) and origin else None


def with_recorded_rules(src: Any, detectors: Sequence[Any] | None) -> Sequence[Any] | None:
    """The detectors to replay, with the team rules a run directory's header recorded (the live run judged
    by them, so its replay does too) where ``detectors`` does not already hold a rule of that id."""
    header = getattr(getattr(src, "run", None), "header", None) or {}
    recorded = header.get("rules")
    if not recorded:
        return detectors
    from grpo_monitor.core.rules import rules_from_data

    try:
        rules = rules_from_data(recorded, "the run header's rules")
    except ValueError as exc:
        src.warnings.append(f"not replayed: {exc}")
        return detectors
    base = list(detectors) if detectors is not None else [cls() for cls in _all_detectors()]
    have = {d.id for d in base}
    return base + [r for r in rules if r.id not in have]


def _all_detectors() -> list[Any]:
    from grpo_monitor.detectors import ALL_DETECTORS

    return list(ALL_DETECTORS)


def _device(src: Any) -> dict[str, Any] | None:
    from grpo_monitor.core.device import device_health

    health = device_health(src.steps)
    if health is None:
        return None
    header = getattr(getattr(src, "run", None), "header", None) or {}
    facts = header.get("device") if isinstance(header.get("device"), Mapping) else {}
    if facts.get("name"):
        health = {"name": facts["name"], **({"unified_memory": facts["unified_memory"]}
                                             if facts.get("unified_memory") else {}), **health}
    return health


def _notes(src: Any) -> list[dict[str, Any]]:
    from grpo_monitor.analysis.explain import explain

    try:
        return explain(src.steps, src.context)
    except Exception:  # advice only: a report without its notes beats no report
        return []


def _segment_of(src: Any) -> int | None:
    run = getattr(src, "run", None)
    if run is None or src.format != "run_dir":
        return None
    seg = (getattr(run, "header", None) or {}).get("segment")
    if not isinstance(seg, int) or isinstance(seg, bool) or seg < 0:
        return None
    return seg + 1 if seg > 0 or getattr(run, "restarts", None) else None


def split_runs(src: Any) -> list[tuple[str, Any]] | None:
    """A file holding several runs as one source per run; None when it holds one run: the runs a
    reader found (``Source.parts``: a results JSON with one run per arm), or a ``run.jsonl`` into
    which a second run was written (a header that starts over, not a resume).

    A resumed run appends a header with ``resumed_from_step`` > 0 and continues the same run; a
    header that starts from step 0 under another run id after steps were logged is a new run.
    """
    parts = getattr(src, "parts", None)
    if parts:
        return [(f"{src.path} [{label}]", part) for label, part in parts]
    run = getattr(src, "run", None)
    if src.format != "run_dir" or run is None:
        return None
    if getattr(run, "header_count", 0) < 2:
        return None
    run_file = Path(run.path) / "run.jsonl"
    from grpo_monitor.core.runlog import RunLog, RunLogError, iter_records

    logs: list[RunLog] = []
    current: RunLog | None = None
    try:
        records = list(iter_records(run_file))
    except RunLogError:
        return None
    for rec in records:
        if rec["type"] == "header":
            starts_over = not rec.get("resumed_from_step")
            other = current is not None and rec.get("run_id") != current.header.get("run_id")
            if current is None or (starts_over and other and (current.steps or current.summary is not None)):
                current = RunLog(path=Path(run.path), header=rec)
                logs.append(current)
                continue
        if current is not None:
            current.add(rec)
    if len(logs) < 2:
        return None
    from grpo_monitor.readers._base import Normalizer, Source, StepTable, as_step, finish
    from grpo_monitor.readers.run_dir import context_from_header

    out = []
    for i, log in enumerate(logs, 1):
        part = Source(path=Path(run.path), format="run_dir", run=log)
        table = StepTable()
        norm = Normalizer()
        for rec in log.steps:
            step = as_step(rec["step"])
            metrics = rec.get("metrics")
            if step is not None:
                table.add(step, norm(metrics) if isinstance(metrics, dict) else {})
        finish(part, table)
        part.context = context_from_header(log.header)
        part.warnings = list(src.warnings) + [
            f"{run_file} holds {len(logs)} runs (run ids {', '.join(str(x.header.get('run_id')) for x in logs)}): "
            f"this is run {i}, replayed without its samples (the runs' samples cannot be told apart)"
        ]
        out.append((f"{run.path} [run {i} of {len(logs)}: {log.header.get('run_id')}]", part))
    return out


def coverage_from_states(header: Mapping[str, Any], names: Sequence[str], states: Mapping[str, str],
                         has_samples: bool = False) -> dict[str, dict[str, Any]]:
    """Coverage without a replay, from a run log's header, its logged names and the detectors'
    recorded states (what a dashboard following a live run has)."""
    from grpo_monitor.readers.run_dir import context_from_header

    engine = Engine(context_from_header(dict(header)))
    for d in engine.detectors:
        state = states.get(d.id)
        if state == "disabled":
            engine.disabled[d.id] = "failed"
        elif state is not None:
            d.state = state
        else:
            d.state = "warming_up"
    return engine.coverage(set(names), has_samples)


def judgement_line(coverage: Mapping[str, Mapping[str, Any]], names: Sequence[str]) -> tuple[str, str]:
    """The dashboard's verdict on what it can see: text and role (``muted`` or ``warning``)."""
    failure = {d: c for d, c in coverage.items() if c.get("role") == "failure" and c.get("status") != "not_applicable"}
    judged = [d for d, c in failure.items() if c.get("status") == "judged"]
    if judged:
        return f"judged by {len(judged)}/{len(failure)} detectors", "muted"
    if not names:
        return "cannot judge yet: no metric logged", "warning"
    waiting = [d for d, c in failure.items() if c.get("status") == "too_few_points"]
    if waiting:
        return f"warming up: {len(waiting)} detector{'s' if len(waiting) != 1 else ''} setting baselines", "muted"
    shown = ", ".join(list(names)[:6]) + (", …" if len(names) > 6 else "")
    return (f"CANNOT JUDGE: no failure detector has its inputs (found {shown}; needs reward, completions/mean_length, "
            "entropy ...; map columns with analyze --map)", "warning")


def key_curves(steps: Sequence[tuple[int, Any]]) -> dict[str, list[tuple[int, float]]]:
    """``(step, value)`` of each curve in ``CURVES`` the run logged, finite values only."""
    import numpy as np

    at = np.fromiter((s for s, _ in steps), dtype=np.int64, count=len(steps))
    series: dict[str, list[tuple[int, float]]] = {}
    for name in CURVES:
        # A source's values are floats or None (a gap); None becomes NaN here, dropped with inf.
        values = np.array([m.get(name) for _, m in steps], dtype=np.float64)
        keep = np.isfinite(values)
        if keep.any():
            series[name] = list(zip(at[keep].tolist(), values[keep].tolist()))
    return series


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """No cyclic garbage collection while a log is read and replayed: millions of young objects
    that all stay alive would otherwise trigger full collections over an ever larger heap."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def expand_lineages(paths: Sequence[str | os.PathLike[str]]) -> list[str]:
    """Each path, and for a run directory that was restarted, each of its segments in order."""
    from grpo_monitor.core.restart import lineage_dirs
    from grpo_monitor.core.runlog import is_run_dir

    out: list[str] = []
    for p in paths:
        out.append(str(p))
        if is_run_dir(p):
            out.extend(str(d) for d in lineage_dirs(p)[1:])
    return out


# -- folders of runs -------------------------------------------------------------------------

_MAX_DEPTH = 6
_MAX_DIRS = 20000


def discover_runs(path: str | os.PathLike[str], skipped: list[tuple[str, str]] | None = None) -> list[Path] | None:
    """The runs in a folder that holds several, each as the path to read; None when ``path`` is
    one run (or a file), which is then read as it is.

    A run is a grpo-monitor run directory (``run.jsonl``; a Trainer output_dir's own
    ``grpo-monitor/`` speaks for it), else a folder with a ``trainer_state.json``, checkpoints,
    TensorBoard event files, a W&B run or a trackio database (read as a whole, as ``analyze
    FOLDER`` reads it). Loose log files beside them count as runs of their own.
    """
    p = Path(path)
    try:
        if not p.is_dir() or (p / "run.jsonl").is_file():
            return None
    except OSError:  # cannot be looked into: reading it as one run says why, in one line
        return None
    budget = [_MAX_DIRS]
    found = _collect(p, _MAX_DEPTH, budget)
    runs = [c for _, c in found]
    if len(runs) == 1 and runs[0] == p:
        return None
    loose = _loose_logs(p, skipped)
    if not runs and not loose:
        return None
    return sorted(set(runs + loose), key=lambda x: str(x))


def _collect(d: Path, depth: int, budget: list[int]) -> list[tuple[str, Path]]:
    try:
        if (d / "run.jsonl").is_file():
            return [("run_dir", d)]
        if not os.access(d, os.R_OK | os.X_OK):
            raise PermissionError(d)
    except OSError:  # a folder that cannot be entered: listed as skipped, with why
        return [("denied", d)]
    budget[0] -= 1
    below: list[tuple[str, Path]] = []
    if depth > 0 and budget[0] > 0:
        try:
            kids = sorted(k for k in d.iterdir() if k.is_dir() and not k.name.startswith((".", "__")) and not k.is_symlink())
        except OSError:
            kids = []
        for k in kids:
            if k.name.startswith("checkpoint-") or k.name.startswith("segment-"):
                continue  # read through their parent (the newest checkpoint; a lineage's segments)
            below.extend(_collect(k, depth - 1, budget))
    marker = _marker(d)
    if marker is None:
        return below
    run_dirs = [c for c in below if c[0] == "run_dir"]
    if run_dirs:
        return run_dirs  # an output_dir's own monitor log speaks for it
    return [(marker, d)] + [c for c in below if c[0] == "denied"]


def _marker(d: Path) -> str | None:
    """What makes ``d`` itself readable as one run (other than ``run.jsonl``)."""
    try:
        if (d / "trainer_state.json").is_file() or any(d.glob("checkpoint-*/trainer_state.json")):
            return "trainer_state"
        if any("tfevents" in f.name for f in d.iterdir() if f.is_file()):
            return "tensorboard"
    except OSError:
        return None
    try:
        from grpo_monitor.readers.trackers import looks_like_wandb_dir, trackio_databases, wandb_runs

        if looks_like_wandb_dir(d) and len(wandb_runs(d)) < 2:  # a wandb/ folder of several runs: each one
            return "wandb"
        if trackio_databases(d):
            return "trackio"
    except Exception:  # a tracker reader that is missing or changed: the folder is simply not one
        return None
    return None


# What this tool's own saved outputs begin with: reports of runs, not training logs.
_OWN_REPORTS = (
    (re.compile(r'\A\s*\{\s*"runs"\s*:\s*\[\s*(?:\{\s*"source"|\])'), "grpo-monitor analyze --json report"),
    (re.compile(r"\A\s*# grpo-monitor report\b"), "grpo-monitor analyze --markdown report"),
    (re.compile(r"\A\s*== .*\n(?:read: .*\n|model: .*\n|config: .*\n|names: .*\n)*verdict: "), "grpo-monitor analyze report"),
    (re.compile(r"\A\s*grpo-monitor lint: "), "grpo-monitor lint report"),
    (re.compile(r'\A\s*\{\s*"source"\s*:[^\n]*\n?\s*"device"\s*:\s*\{\s*"judged_for"'), "grpo-monitor lint --json report"),
    (re.compile(r'\A\s*\{\s*"samples"\s*:\s*\['), None),  # inspect-rewards --json: told by its notice below
)


def own_report(path: str | os.PathLike[str]) -> str | None:
    """What kind of this tool's own saved report ``path`` is (``analyze > report.txt``, ``--json``,
    ``--markdown``, ``lint``, ``inspect-rewards --auto --json``), or None for anything else. Such a file
    reports on runs; read as a log it would be a run of its own.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "report.md"
    >>> _ = p.write_text("# grpo-monitor report\\n\\n## `runs/a`\\n")
    >>> own_report(p)
    'grpo-monitor analyze --markdown report'
    """
    try:
        with open(path, "rb") as fh:
            head = fh.read(4096).decode("utf-8", errors="replace")
    except OSError:
        return None
    for pattern, kind in _OWN_REPORTS:
        if pattern.search(head):
            if kind is None:
                return "grpo-monitor inspect-rewards --json report" if '"gate_passed"' in _tail(path) else None
            return kind
    return None


def _tail(path: str | os.PathLike[str], size: int = 65536) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, os.path.getsize(path) - size))
            return fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def _loose_logs(d: Path, skipped: list[tuple[str, str]] | None = None) -> list[Path]:
    """Files directly in ``d`` that read as logs of a known format (README files, and this tool's own
    saved reports, listed in ``skipped``, do not)."""
    from grpo_monitor.readers import SourceError, detect_format

    out = []
    try:
        files = sorted(f for f in d.iterdir() if f.is_file() and not f.name.startswith("."))
    except OSError:
        return out
    for f in files:
        kind = own_report(f)
        if kind is not None:
            if skipped is not None:
                skipped.append((str(f), f"a {kind}, not a training log"))
            continue
        try:
            detect_format(f)
        except (SourceError, OSError, ValueError):
            continue
        out.append(f)
    return out


def analyze(paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], detectors: Sequence[Any] | None = None,
            logging_steps: int | None = None, mapping: Mapping[str, str] | Sequence[str] | None = None,
            model: str | Mapping[str, Any] | None = None, gpu_hour_price: float | None = None,
            devices: int | None = None, rules: Any = None) -> Report:
    """Analyse one path or several (a restarted run: every segment; a folder of runs: each run);
    raises ``readers.SourceError`` for a path given that cannot be read (a run inside a
    folder that cannot be read is listed in ``Report.errors``). ``mapping`` maps the log's column
    names onto the monitor's (``{"score_mean": "reward"}``). ``model`` names the model the runs
    trained (``"Qwen/Qwen3-30B-A3B"``, a local model folder) where the log does not say it or says
    it wrong: an MoE model gets GSPO offline as it does live. ``gpu_hour_price`` puts money on the cost
    figures, ``devices`` the device count where the log does not record it; ``rules`` (a rule file's path, or
    its rules as dicts) adds a team's checks to the detectors (``core.rules``)."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    return _analyze_all(paths, with_rules(detectors, rules), logging_steps, parse_mapping(mapping),
                        model=model_facts_of(model), costing=Costing(gpu_hour_price, devices))


def with_rules(detectors: Sequence[Any] | None, rules: Any) -> Sequence[Any] | None:
    """``detectors`` (the built-in set when None) plus the rule detectors ``rules`` names; raises ValueError
    for a rule file that cannot be used."""
    if rules is None:
        return detectors
    from grpo_monitor.core.rules import load_rules

    built = load_rules(rules)
    base = list(detectors) if detectors is not None else [cls() for cls in _all_detectors()]
    return base + built


def _analyze_all(paths: Sequence[str | os.PathLike[str]], detectors: Sequence[Any] | None, logging_steps: int | None,
                 mapping: Any, say: Any = None, model: dict[str, Any] | None = None,
                 costing: Costing | None = None) -> Report:
    """Every run under ``paths``: a loose file that does not read is skipped, a run found beneath that
    does not read is listed in ``Report.errors``, a path given that does not read raises SourceError.
    With ``say`` (the CLI), each unreadable run's line goes to it first, and any other exception
    counts as unreadable input too: never a traceback."""
    from grpo_monitor.readers import SourceError

    report = Report([])
    for p, how in expand_paths(paths, report.skipped):
        if how == "denied":  # inside a folder of runs: maybe not a run at all, so not an error
            report.skipped.append((p, "cannot be entered or read (permission denied)"))
            continue
        try:
            report.runs.extend(_runs_of(p, how, report, detectors, logging_steps, mapping, model, costing))
        except SourceError as exc:
            if how == "loose":
                report.skipped.append((p, str(exc)))
                continue
            if say is not None:
                say(str(exc))
            if how == "given":
                raise
            report.errors.append((p, str(exc)))
        except Exception as exc:
            if say is None:
                raise
            line = f"{p}: cannot analyse ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
            say(line)
            if how == "given":
                raise SourceError(None, line) from exc
            report.errors.append((p, f"cannot analyse ({type(exc).__name__})"))
    return report


def _runs_of(p: str, how: str, report: Report, detectors: Sequence[Any] | None, logging_steps: int | None,
             mapping: Any, model: dict[str, Any] | None = None, costing: Costing | None = None) -> list[RunReport]:
    """The runs of one path; a loose file in a folder that holds fewer than two logged steps (a README
    whose table happens to parse) is listed as skipped, not as a run nobody could judge."""
    runs = analyze_run(p, detectors, logging_steps, mapping, model, costing)
    if how == "loose" and all(r.steps < 2 for r in runs):
        report.skipped.append((p, "fewer than two logged steps: not a training log"))
        return []
    return runs


def _is_file(p: Path) -> bool:
    try:
        return p.is_file()
    except OSError:
        return False


def expand_paths(paths: Sequence[str | os.PathLike[str]],
                 skipped: list[tuple[str, str]] | None = None) -> list[tuple[str, str]]:
    """Every run to analyse, and how it came: ``given`` (named by the user), ``found`` (a run
    folder or segment found beneath), ``loose`` (a file beside them that looked like a log),
    ``denied`` (a folder or file beneath that the user may not read); the tool's own saved reports in a
    folder go to ``skipped``."""
    out: list[tuple[str, str]] = []
    for p in paths:
        runs = discover_runs(p, skipped)
        if runs is None:
            out.extend((x, "given" if i == 0 else "found") for i, x in enumerate(expand_lineages([p])))
            continue
        for r in runs:
            if not os.access(r, os.R_OK | (0 if _is_file(r) else os.X_OK)):
                out.append((str(r), "denied"))
            elif _is_file(r):
                out.append((str(r), "loose"))
            else:
                out.extend((x, "found") for x in expand_lineages([r]))
    return out


def needs_text(run: RunReport) -> str:
    """For a run nothing could judge: what it logged, what the monitor reads, how to map a column."""
    if not run.steps:
        return "no logged step: nothing to judge"
    found = ", ".join(run.metrics_found[:24]) + (f", … ({len(run.metrics_found)} in all)" if len(run.metrics_found) > 24 else "")
    hints = map_hints(run.metrics_found)
    example = " ".join(f"--map {c}={m}" for c, m in hints[:3]) or "--map COLUMN=reward --map COLUMN=length"
    return (f"found {found or 'no metric with a value'}; the detectors read {', '.join(KEY_INPUTS)}; "
            f"map the log's own names onto them: grpo-monitor analyze {run.file or run.source} {example}")


_KNOWN = frozenset({"reward", "reward_std", "entropy", "grad_norm", "loss", "learning_rate", "kl", "frac_reward_zero_std",
                    "epoch", "num_tokens", "ppo_kl", "step_time", "aux_loss"})


def map_hints(names: Sequence[str]) -> list[tuple[str, str]]:
    """Likely ``--map`` items for names the normaliser does not know."""
    from grpo_monitor.core.metrics import normalize

    out = []
    for n in names:
        low = n.lower()
        if normalize(n) != n or n in _KNOWN or "/" in n and low.split("/")[0] in ("rewards", "completions", "sampling", "mismatch", "moe"):
            continue
        if any(x in low for x in ("val", "test", "eval", "time", "lr", "learning_rate", "std", "min", "max", "step")):
            continue
        if "entropy" in low:
            out.append((n, "entropy"))
        elif "clip" in low or "trunc" in low:
            out.append((n, "clipped_ratio"))
        elif "correct" in low or "acc" in low or "exact" in low:
            out.append((n, "correctness"))
        elif "reward" in low or "score" in low or "return" in low:
            out.append((n, "reward"))
        elif "len" in low or "token" in low:
            out.append((n, "length"))
    return out


# -- rendering -----------------------------------------------------------------------------

VERDICT_TEXT = {
    "healthy": "HEALTHY",
    "warning": "WARNING",
    "critical": "CRITICAL",
    "incomplete": "INCOMPLETE",
    "cannot_judge": "CANNOT JUDGE — the monitor could not see this run: no failure detector had the inputs it needs",
}


def sparkline(values: Sequence[float], width: int = 48) -> str:
    if not values:
        return ""
    if len(values) > width:  # bucket means, so a long run still fits one line
        n = len(values)
        values = [sum(values[i * n // width:(i + 1) * n // width]) / max(1, (i + 1) * n // width - i * n // width)
                  for i in range(width)]
    lo, hi = min(values), max(values)
    span = hi - lo
    return "".join(_BARS[0 if span == 0 else min(7, int((v - lo) / span * 7.999))] for v in values)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_fmt(x)}" for k, x in list(v.items())[:6]) + "}"
    if isinstance(v, list):
        return "[" + ", ".join(_fmt(x) for x in v[:6]) + (", …]" if len(v) > 6 else "]")
    return str(v)


def coverage_lines(run: RunReport) -> list[str]:
    """``judged by: ...``, one ``could not judge`` line per failure detector that could not, and the sanity
    checks that ran."""
    if not run.coverage:
        return []
    if not run.steps:
        return ["judged by: no detector (no logged step)"]
    out = [f"judged by: {', '.join(run.judged_by) or 'no failure detector'}"]
    for det, why in run.not_judged.items():
        out.append(f"  could not judge {det}: {why}")
    if run.checked_by:
        out.append(f"also checked: {', '.join(run.checked_by)}")
    return out


def model_line(model: Mapping[str, Any]) -> str:
    """The model of a run and where it came from, in one line."""
    name = model.get("name_or_path") or model.get("class") or "unknown"
    if model.get("is_moe"):
        layout = f"{model['num_experts']} experts, top-{model.get('top_k')}" if model.get("num_experts") else "by its id"
        name += f" (mixture of experts: {layout})"
    return f"{name}, from {model['source']}" if model.get("source") else name


# The settings that change what a finding says or recommends, in the order a reader looks for them.
_CONFIG_SHOWN = ("max_completion_length", "num_generations", "generation_batch_size", "learning_rate", "beta",
                 "loss_type", "importance_sampling_level", "temperature", "max_grad_norm", "entropy_coef")


def config_line(config: Mapping[str, Any], origin: str) -> str:
    """A foreign log's config in one line: where it came from and the settings the verdict rests on.

    >>> config_line({"num_generations": 2, "max_completion_length": 1024, "seed": 3}, "the config verl printed")
    'max_completion_length=1024, num_generations=2 — from the config verl printed'
    """
    shown = [f"{k}={config[k]!r}" if isinstance(config[k], str) else f"{k}={config[k]}"
             for k in _CONFIG_SHOWN if config.get(k) is not None]
    return f"{', '.join(shown) or 'no setting the detectors read'} — from {origin}"


def names_line(names: Mapping[str, Any]) -> str:
    """The names a log's own words were mapped by, in one line (``--map`` overrides any of them).

    >>> names_line({"mapped": {"rollout_reward_mean": {"to": "reward", "by": "reward + mean"}}, "ambiguous": {}})
    'rollout_reward_mean → reward (reward + mean), mapped by their words and known spellings; --map NAME=METRIC overrides'
    """
    parts = [f"{n} → {m['to']} ({m['by']})" for n, m in (names.get("mapped") or {}).items()]
    parts += [f"{', '.join(ns)}: left unmapped, each could be {t}" for t, ns in (names.get("ambiguous") or {}).items()]
    return "; ".join(parts) + ", mapped by their words and known spellings; --map NAME=METRIC overrides"


def device_lines(run: RunReport) -> list[str]:
    """``device: ...`` and its health lines, for a run that logged device readings."""
    if not run.device:
        return []
    from grpo_monitor.core.device import health_lines

    name = run.device.get("name")
    head = "device" + (f": {name}" if name else "") + (f" (unified memory: {run.device['unified_memory']})"
                                                       if run.device.get("unified_memory") else "")
    return [head] + [f"  {line}" for line in health_lines(run.device)]


def verdict_line(run: RunReport) -> str:
    """The one line a dashboard or a table shows for a run's verdict."""
    text = VERDICT_TEXT.get(run.verdict, run.verdict.upper())
    if run.verdict == "incomplete" and run.status_note:
        text += f" — {run.status} — {run.status_note}" if run.status == INTERRUPTED else f" — {run.status_note}"
    return text


def shown_recommendations(recs: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The records as a report shows them: a warning's advice that a later critical finding turned into a
    recommendation (of the same change, or of the same detector) is shown once, as the recommendation,
    with the step it was first advised at (``advised_at``; ``--json`` keeps both records).

    >>> recs = [{"variant": "lower_learning_rate", "status": "advice", "detector": "sudden_collapse", "step": 27},
    ...         {"variant": "lower_learning_rate", "status": "recommended", "detector": "sudden_collapse", "step": 28},
    ...         {"variant": "dapo", "status": "advice", "detector": "entropy_collapse", "step": 28}]
    >>> [(r["variant"], r["status"], r.get("advised_at")) for r in shown_recommendations(recs)]
    [('lower_learning_rate', 'recommended', 27), ('dapo', 'advice', None)]
    """
    from grpo_monitor.core.recommend import ADVICE, CODE_CHANGE, RECOMMENDED

    confirmed = [r for r in recs if (r.get("status") or RECOMMENDED) == RECOMMENDED]
    switched = {r.get("variant") for r in confirmed} - {CODE_CHANGE}
    by = {r.get("detector") for r in confirmed}
    folded = [r for r in recs if r.get("status") == ADVICE and (r.get("variant") in switched or r.get("detector") in by)]
    out: list[Mapping[str, Any]] = []
    for r in recs:
        if any(r is f for f in folded):
            continue
        if r in confirmed:
            first = next((f for f in folded if f.get("variant") == r.get("variant") or f.get("detector") == r.get("detector")),
                         None)
            if first is not None:
                r = {**r, "advised_at": first.get("step")}
        out.append(r)
    return out


def advised_note(rec: Mapping[str, Any]) -> str:
    """`` (advised from a warning at step N)`` for a recommendation a warning's advice came before."""
    at = rec.get("advised_at")
    return f" (advised from a warning at step {at}, advice only until then)" if at is not None else ""


def render_text(report: Report) -> str:
    out: list[str] = []
    for run in report.runs:
        model = run.model.get("class") or run.model.get("name_or_path") or "model unknown"
        seg = f"segment {run.segment}, " if run.segment is not None else ""
        out.append(f"== {run.source}  ({seg}{run.format}, {run.steps} logged steps, {model})")
        if run.file and run.file != run.source:
            out.append(f"read: {run.file}")
        if run.model.get("source"):  # model facts a reader or --model gave, not a run header's
            out.append(f"model: {model_line(run.model)}")
        if run.config_from:
            out.append(f"config: {config_line(run.config, run.config_from)}")
        if run.names:
            out.append(f"names: {names_line(run.names)}")
        out.append(f"verdict: {verdict_line(run)}")
        if run.verdict == "cannot_judge":
            out.append(f"  {needs_text(run)}")
        elif run.status and run.verdict != "incomplete":
            out.append(f"  status: {run.status} — {run.status_note}")
        for w in run.warnings:
            out.append(f"  note: {w}")
        out.extend(coverage_lines(run))
        out.extend(device_lines(run))
        for title, group in (("findings:", run.training_findings),
                             ("pre-flight (the recipe, checked when training began; not part of the verdict):",
                              run.preflight_findings)):
            if group:
                out.append(title)
            for f in group:
                onset = f" (onset ~{f.onset_step})" if f.onset_step is not None else ""
                variant = f" → {f.variant}" if f.variant else ""
                out.append(f"  step {f.step} [{f.severity}] {f.detector}{onset}{variant}: {f.message}")
                shown = [(k, v) for k, v in f.evidence.items() if k not in ANNOTATIONS]
                if shown:
                    out.append("      evidence: " + ", ".join(f"{k}={_fmt(v)}" for k, v in shown[:8]))
                out.extend(f"      {line}" for line in annotation_lines(run, f))
        if run.recommendations:
            out.append("recommendations:")
        for r in shown_recommendations(run.recommendations):
            out.append(f"  {rec_title(r)} — from {r['detector']} at step {r['step']}{advised_note(r)}")
            out.extend(f"      {r[k]}" for k in ("python", "cli_flags") if r.get(k))
            for reason in r["reasons"][1:]:
                out.append(f"      why: {reason}")
            for key, advice in r.get("extra", {}).items():
                out.append(f"      also: {key} {advice}")
        if run.notes:
            from grpo_monitor.analysis.explain import render_lines

            out.append("Looks odd but is normal:")
            out.extend(render_lines(run.notes))
        if run.series:
            out.append("curves:")
        for name, pts in run.series.items():
            vals = [v for _, v in pts]
            out.append(f"  {name:<26} {sparkline(vals)}  {vals[0]:.4g} → {vals[-1]:.4g}  (steps {pts[0][0]}–{pts[-1][0]})")
        out.append("")
    for path, err in report.errors:
        out.append(f"== {path}\nverdict: UNREADABLE — {err}\n")
    for path, err in report.skipped:
        out.append(f"skipped {path}: {err}")
    if len(report.runs) + len(report.errors) > 1:
        out.append(comparison_table(report))
    return "\n".join(out).rstrip() + "\n"


def annotation_lines(run: RunReport, f: Finding) -> list[str]:
    """What the finding has cost (when raised, and to the end of the run) and when its limit will be reached."""
    from grpo_monitor.core.cost import cost_phrase
    from grpo_monitor.core.forecast import forecast_phrase

    out = []
    if f.evidence.get("cost"):
        out.append(f"cost when raised: {cost_phrase(f.evidence['cost'])}")
    to_end = next((c["to_end"] for c in run.cost.get("findings", [])
                   if c["detector"] == f.detector and c["step"] == f.step and c["severity"] == f.severity), None)
    if to_end and to_end.get("to_step") != f.step:
        out.append(f"cost to the end of the run (step {to_end.get('to_step')}): {cost_phrase(to_end)}")
    if f.evidence.get("forecast"):
        out.append(f"time to failure: {forecast_phrase(f.evidence['forecast'])}")
    return out


def _table_rows(report: Report) -> list[tuple[str, ...]]:
    rows = []
    for r in report.runs:
        dets = ", ".join(sorted({f.detector for f in r.training_findings if f.severity != "info"})) or "—"
        variants = ", ".join(sorted({x["variant"] + ("" if x.get("status", "recommended") == "recommended" else f" ({x['status']})")
                                     for x in shown_recommendations(r.recommendations)})) or "—"
        judged = f"{len(r.judged_by)}/{len(r.judged_by) + len(r.not_judged)}" if r.coverage else "—"
        rows.append((r.source, r.format, str(r.steps), r.verdict, judged, dets, variants))
    for path, _ in report.errors:
        rows.append((path, "—", "—", "unreadable", "—", "—", "—"))
    return rows


def comparison_table(report: Report) -> str:
    rows = [("run", "format", "steps", "verdict", "judged", "findings", "variants"), *_table_rows(report)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines) + "\n"


def render_markdown(report: Report) -> str:
    out = ["# grpo-monitor report", ""]
    if len(report.runs) + len(report.errors) > 1:
        out += ["| run | format | steps | verdict | judged | findings | variants |", "|---|---|---|---|---|---|---|"]
        for row in _table_rows(report):
            out.append(f"| `{row[0]}` | " + " | ".join(row[1:]) + " |")
        out.append("")
    for r in report.runs:
        out += [f"## `{r.source}`", "", f"**Verdict: {r.verdict}** — {r.format}, {r.steps} logged steps, read from `{r.file or r.source}`.", ""]
        if r.names:
            out += [f"Names: {names_line(r.names)}.", ""]
        if r.verdict == "cannot_judge":
            out += [f"The monitor could not see this run: no failure detector had the inputs it needs. {needs_text(r)}", ""]
        elif r.status:
            out += [f"Status: {r.status} — {r.status_note}", ""]
        if r.skipped:
            out += [f"Skipped {r.skipped['count']} unreadable record(s), each alone (the rest was read):", ""]
            out += [f"- `{w}`" for w in r.skipped["where"]] + [""]
        if r.coverage:
            out += [f"Judged by: {', '.join(f'`{d}`' for d in r.judged_by) or 'no failure detector'}.", ""]
            for det, why in r.not_judged.items():
                out.append(f"- could not judge `{det}`: {why}")
            if r.checked_by:
                out += ["", f"Also checked: {', '.join(f'`{d}`' for d in r.checked_by)}."]
            out.append("")
        if r.device:
            lines = device_lines(r)
            out += [f"**{lines[0][:1].upper()}{lines[0][1:]}**", ""] + [f"- {line.strip()}" for line in lines[1:]] + [""]
        if r.findings:
            out += ["| step | severity | detector | onset | variant | message |", "|---|---|---|---|---|---|"]
            for f in r.findings:
                out.append(f"| {f.step} | {f.severity} | `{f.detector}` | {f.onset_step if f.onset_step is not None else '—'} "
                           f"| {f.variant or '—'} | {f.message.replace('|', '/')} |")
            out.append("")
            for f in r.findings:
                out += [f"- `{f.detector}` at step {f.step}: {line}" for line in annotation_lines(r, f)]
            out.append("")
        for rec in shown_recommendations(r.recommendations):
            heading = rec_title(rec) + advised_note(rec)
            out += [f"### {heading[:1].upper()}{heading[1:]}", ""]
            if rec.get("python"):
                out += ["```python", rec["python"], "```", ""]
            if rec.get("cli_flags"):
                out += ["```bash", rec["cli_flags"], "```", ""]
            out += [f"- {reason}" for reason in rec["reasons"]]
            out += [f"- also: **{key}** {advice}" for key, advice in (rec.get("extra") or {}).items()] + [""]
        if r.notes:
            out += ["### Looks odd but is normal", ""]
            for n in r.notes:
                out.append(f"- **{n['id']}**: {n['pattern']}. *Why it is fine:* {n['why']} *Unless:* {n['unless']}")
            out.append("")
        if r.series:
            out += ["| curve | shape | first | last |", "|---|---|---|---|"]
            for name, pts in r.series.items():
                vals = [v for _, v in pts]
                out.append(f"| `{name}` | `{sparkline(vals, 32)}` | {vals[0]:.4g} | {vals[-1]:.4g} |")
            out.append("")
    for path, err in report.errors:
        out += [f"## `{path}`", "", f"**Unreadable** — {err}", ""]
    return "\n".join(out)


def run_cli(paths: Sequence[str], as_json: bool = False, markdown: str | None = None,
            logging_steps: int | None = None, mapping: Sequence[str] | None = None, model: str | None = None,
            html: str | None = None, gpu_hour_price: float | None = None, devices: int | None = None,
            rules: str | None = None, on_report: Any = None) -> int:
    """``grpo-monitor analyze``: the report on stdout, the exit code; ``on_report(report)`` is called
    with the report once it is out (the CLI's ``--alerts`` sends it on)."""
    from grpo_monitor.readers import SourceError

    try:
        columns = parse_mapping(mapping)
        facts = model_facts_of(model)
        detectors = with_rules(None, rules)
        costing = Costing(gpu_hour_price, devices)
    except ValueError as exc:  # SourceError is one too: a --model folder without a config
        print(f"grpo-monitor: {exc}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    try:
        report = _analyze_all(paths, detectors, logging_steps, columns,
                              say=lambda line: print(f"grpo-monitor: {line}", file=sys.stderr), model=facts,
                              costing=costing)
    except SourceError:  # a path given that cannot be read: its line is out already
        return ExitCode.BAD_INPUT
    if not report.runs and not report.errors:
        why = "; ".join(f"{p}: {e}" for p, e in report.skipped[:3])
        print(f"grpo-monitor: {', '.join(map(str, paths))}: no run could be read" + (f" (skipped {why})" if why else ""),
              file=sys.stderr)
        return ExitCode.BAD_INPUT
    if as_json:
        print(json.dumps(report.to_dict(), default=_json_default, allow_nan=False))
    else:
        sys.stdout.write(render_text(report))
    if markdown:
        with open(markdown, "w", encoding="utf-8") as fh:
            fh.write(render_markdown(report))
    if html:
        from grpo_monitor.analysis.html_report import write_html

        try:
            write_html(report, html)
        except OSError as exc:
            print(f"grpo-monitor: {html}: cannot write the HTML report ({exc.strerror or exc})", file=sys.stderr)
            return ExitCode.BAD_INPUT
    if on_report is not None:
        on_report(report)
    return report.exit_code


def _json_default(obj: Any) -> Any:
    try:
        return obj.item()
    except Exception:
        return str(obj)
