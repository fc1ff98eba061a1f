"""Offline analysis: replay the detectors over a finished run, exactly as the live monitor would.

The replay feeds each logged step (and its samples, for our run directories) through the same session
(``core.session``) the callback uses, in step order, so a finding's ``step`` is the step at which the live
monitor raised or would have raised it. A run directory's ``config_*`` findings (the pre-flight checks the
callback wrote at the start) are part of its report, as they were live, with their recommendations; they are
advice on the recipe and never set the verdict.

Every report says which detectors could judge the run and why the others could not. A run no failure
detector could judge is never called healthy: its verdict is ``cannot_judge``, with the metrics found and
the ones needed, and ``analyze`` exits 3. A run directory that ended without its final summary is
``incomplete``; a file holding several runs is reported run by run (``Source.parts``); a folder of runs is
analysed run by run (``analysis.discovery``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from grpo_monitor.analysis.discovery import expand_paths, is_file, own_report
from grpo_monitor.analysis.prepare import names_with_values, parse_mapping, prepare_names
from grpo_monitor.analysis.replay import (
    Costing, collector_paused, config_findings, config_from, cost_summary, device_of, key_curves, normal_notes,
    replay_session, segment_of, session_coverage, with_recorded_rules,
)
from grpo_monitor.analysis.run_report import Report, RunReport
from grpo_monitor.analysis.run_status import run_status, write_loss
from grpo_monitor.detectors.base import Detector


@dataclasses.dataclass(frozen=True)
class AnalyzeOptions:
    """How ``analyze`` reads and judges the runs beyond what their logs say.

    >>> AnalyzeOptions(mapping={"score_mean": "reward"}, logging_steps=10).logging_steps
    10
    >>> AnalyzeOptions(logging_steps=0)
    Traceback (most recent call last):
    ...
    ValueError: AnalyzeOptions(logging_steps=0): a positive number of steps between logs
    """

    #: The detectors to replay; None: every built-in one.
    detectors: Sequence[Detector] | None = None
    #: A team's checks (``core.rules``): a rule file's path, or its rules as dicts.
    rules: str | os.PathLike[str] | Sequence[Mapping[str, Any]] | None = None
    #: The log's own column names read as the monitor's: ``{"score_mean": "reward"}`` or ``["score_mean=reward"]``.
    mapping: Mapping[str, str] | Sequence[str] | None = None
    #: The model the runs trained where the log does not say it or says it wrong: a hub id, a local model
    #: folder, or model facts. An MoE model gets GSPO offline as it does live.
    model: str | Mapping[str, Any] | None = None
    #: The steps between two logged records, for a log whose records carry no step and that does not say.
    logging_steps: int | None = None
    #: The price of one GPU-hour, to put money on the cost figures.
    gpu_hour_price: float | None = None
    #: The device count, where the log does not record it.
    devices: int | None = None

    def __post_init__(self) -> None:
        def bad(name: str, what: str) -> ValueError:
            return ValueError(f"AnalyzeOptions({name}={getattr(self, name)!r}): {what}")

        if self.logging_steps is not None and (not _is_int(self.logging_steps) or self.logging_steps < 1):
            raise bad("logging_steps", "a positive number of steps between logs")
        if self.devices is not None and (not _is_int(self.devices) or self.devices < 1):
            raise bad("devices", "a positive device count")
        if self.gpu_hour_price is not None and (isinstance(self.gpu_hour_price, bool)
                                                or not isinstance(self.gpu_hour_price, (int, float))
                                                or not self.gpu_hour_price >= 0):
            raise bad("gpu_hour_price", "a price of zero or more per GPU-hour")
        if self.model is not None and not isinstance(self.model, (str, os.PathLike, Mapping)):
            raise bad("model", "a hub id, a local model folder or model facts")
        if isinstance(self.mapping, str):
            raise bad("mapping", 'a mapping {"column": "metric"} or a list of "COLUMN=METRIC"')

    @property
    def costing(self) -> Costing:
        return Costing(self.gpu_hour_price, self.devices)


class OptionsError(ValueError):
    """An option ``analyze`` cannot use (a ``mapping`` item, a ``model`` folder without a config, a rule file),
    said before any run is read."""


def analyze(paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], options: AnalyzeOptions | None = None,
            *, on_unreadable: Callable[[str], None] | None = None,
            progress: Callable[[str, int, int], None] | None = None) -> Report:
    """Analyse one path or several (a restarted run: every segment; a folder of runs: each run).

    A path given that cannot be read raises ``readers.SourceError``; a run found inside a folder that cannot
    be read is listed in ``Report.errors``; a loose file beside the runs that does not read is skipped. With
    ``on_unreadable`` (the CLI), each unreadable run's one-line reason goes to it first, and any other
    exception counts as unreadable input too: never a traceback. A ``mapping``, ``model`` or ``rules`` that
    cannot be used raises ``OptionsError`` before any run is read. ``progress(run, steps_replayed, steps)`` is
    called as each run's replay goes on.
    """
    from grpo_monitor.readers import SourceError

    options = options or AnalyzeOptions()
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    try:
        plan = _Plan.of(options)
    except ValueError as exc:  # SourceError too: a model folder without a config
        raise OptionsError(str(exc)) from None
    report = Report([])
    for p, how in expand_paths(paths, report.skipped):
        if how == "denied":  # inside a folder of runs: maybe not a run at all, so not an error
            report.skipped.append((p, "cannot be entered or read (permission denied)"))
            continue
        try:
            runs = _runs_of(p, plan, progress)
        except SourceError as exc:
            if how == "loose":
                report.skipped.append((p, str(exc)))
                continue
            if on_unreadable is not None:
                on_unreadable(str(exc))
            if how == "given":
                raise
            report.errors.append((p, str(exc)))
            continue
        except Exception as exc:
            if on_unreadable is None:
                raise
            line = f"{p}: cannot analyse ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
            on_unreadable(line)
            if how == "given":
                raise SourceError(None, line) from exc
            report.errors.append((p, f"cannot analyse ({type(exc).__name__})"))
            continue
        if how == "loose" and all(r.steps < 2 for r in runs):
            # A loose file with fewer than two logged steps (a README whose table happens to parse) is not
            # a run nobody could judge.
            report.skipped.append((p, "fewer than two logged steps: not a training log"))
            continue
        report.runs.extend(runs)
    return report


@dataclasses.dataclass
class _Plan:
    """The options resolved once for every run: the detectors with the team's rules, the column mapping, the
    model facts, the costing."""

    detectors: Sequence[Detector] | None
    columns: dict[str, str]
    model: dict[str, Any] | None
    costing: Costing
    logging_steps: int | None

    @classmethod
    def of(cls, options: AnalyzeOptions) -> _Plan:
        return cls(with_rules(options.detectors, options.rules), parse_mapping(options.mapping),
                   model_facts_of(options.model), options.costing, options.logging_steps)


def _runs_of(path: str | os.PathLike[str], plan: _Plan,
             progress: Callable[[str, int, int], None] | None = None) -> list[RunReport]:
    """The reports of one path: one run, or each run of a file that holds several."""
    from grpo_monitor.readers import SourceError, load_source
    from grpo_monitor.readers.model import set_model

    kind = own_report(path) if is_file(Path(path)) else None
    if kind is not None:
        raise SourceError(Path(path), f"a {kind}, not a training log: analyze the run it reports on")
    with collector_paused():
        src = load_source(path, logging_steps=plan.logging_steps)
        parts = [(f"{src.path} [{label}]", part) for label, part in src.parts] or [(str(path), src)]
        reports = []
        for label, part in parts:
            set_model(part, plan.model, override=True)
            reports.append(_report(label, *prepare_names(part, plan.columns), plan, path, progress))
    return reports


def model_facts_of(model: str | os.PathLike[str] | Mapping[str, Any] | None) -> dict[str, Any] | None:
    """What ``--model`` / ``model=`` names, as the model facts of a run header; raises
    ``SourceError`` for a local path that holds no model config."""
    if model is None:
        return None
    if isinstance(model, Mapping):
        return dict(model)
    from grpo_monitor.readers.model import model_from_spec

    return model_from_spec(str(model))


def with_rules(detectors: Sequence[Detector] | None, rules: Any) -> Sequence[Detector] | None:
    """``detectors`` (the built-in set when None) plus the rule detectors ``rules`` names; raises ValueError
    for a rule file that cannot be used."""
    if rules is None:
        return detectors
    from grpo_monitor.core.rules import load_rules
    from grpo_monitor.detectors import ALL_DETECTORS

    built = load_rules(rules)
    base = list(detectors) if detectors is not None else [cls() for cls in ALL_DETECTORS]
    return base + built


def _report(label: str, src: Any, logged: list[str], plan: _Plan, path: Any,
            progress: Callable[[str, int, int], None] | None = None) -> RunReport:
    names = names_with_values(src.steps, logged)
    each = _counting(progress, label, len(src.steps)) if progress is not None else None
    session = replay_session(src, with_recorded_rules(src, plan.detectors), plan.costing, each)
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
    origin = config_from(src)
    shown = config_findings(src) + findings + crash_findings(src, path)
    return RunReport(
        source=label,
        format=src.format,
        steps=len(src.steps),
        findings=shown,
        recommendations=recs,
        series=key_curves(src.steps),
        model=dict(src.context.model),
        warnings=warnings,
        file=_read_target(src, path),
        coverage=coverage,
        metrics_found=names,
        status=status,
        status_note=note,
        segment=segment_of(src),
        notes=normal_notes(src),
        skipped=skipped,
        not_written=loss.to_dict() if loss is not None else None,
        steps_logged=len(src.steps) + loss.steps if loss is not None else None,
        cost=cost_summary(session.engine, findings),
        states=session.state_names(),
        names=dict(src.meta.get("names") or {}),
        device=device_of(src),
        config_from=origin,
        config=dict(src.context.config or {}) if origin else {},
        finding_samples=_finding_samples(shown, src),
    )


def crash_findings(src: Any, path: Any) -> list[Any]:
    """The crash a log ends in (``core.crashes``), as a critical finding at its last logged step, its
    memory fix sized from the run's config where a reader found one."""
    from grpo_monitor.core.crashes import crash_finding

    crashed = (getattr(src, "meta", None) or {}).get("crash")
    if not crashed:
        return []
    last = src.steps[-1][0] if src.steps else 0
    config = getattr(getattr(src, "context", None), "config", None)
    return [crash_finding(crashed, last, str(getattr(src, "path", "") or path or ""),
                          dict(config) if isinstance(config, Mapping) else None)]


def _finding_samples(findings: list[Any], src: Any) -> list[list[dict[str, Any]]] | None:
    """The samples behind each finding, for a log that records samples (a run directory); None otherwise."""
    from grpo_monitor.core.finding_samples import samples_of_findings

    samples = getattr(src, "samples", None)
    if not isinstance(samples, Mapping) or not len(samples):
        return None
    return samples_of_findings(findings, samples)


def _counting(progress: Callable[[str, int, int], None], label: str, total: int) -> Callable[..., None]:
    """The replay's per-step callback that tells ``progress`` how many of the run's steps are done."""
    done = iter(range(1, total + 1))

    def each(*_: Any) -> None:
        progress(label, next(done, total), total)

    return each


def _read_target(src: Any, path: Any) -> str:
    p = Path(getattr(src, "path", path))
    if src.format == "run_dir" and p.is_dir():
        return str(p / "run.jsonl")
    return str(p)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
