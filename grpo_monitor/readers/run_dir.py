"""Our own run directory (``run.jsonl`` and the per-rank sample files)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from grpo_monitor.core.runlog import Skipped
from grpo_monitor.detectors.base import RunContext
from grpo_monitor.readers._base import Normalizer, Probe, Reader, Source, SourceError, StepTable, as_step, finish


def read_run_dir(path: Path) -> Source:
    """Read a run directory (or its ``run.jsonl``) through ``core.runlog.read_run``.

    Segments of a restarted lineage live in subdirectories and are not read here: the source
    is the top-level run. Samples are indexed by step and read a step at a time when the replay
    reaches it (``StepSamples``), so a long run's samples are never all in memory. A line that is
    not a record is left out and counted (``skipped_records``); the rest of the run is read.
    """
    from grpo_monitor.core.crashes import recorded_crash
    from grpo_monitor.core.runlog import RunLogError, read_run
    from grpo_monitor.core.sample_index import SampleIndex, StepSamples

    try:
        log = read_run(path, samples=False)
    except RunLogError as exc:
        raise SourceError(None, str(exc)) from None
    index = SampleIndex(log.path)
    index.scan(final=True)
    src = Source(path=log.path, format="run_dir", run=log, warnings=list(log.warnings) + list(index.warnings))
    if index.skipped.count:
        src.warnings.append(index.skipped.line())  # type: ignore[arg-type]
    table = StepTable()
    norm = Normalizer(owned=True)  # the parsed step records are ours to keep
    for rec in log.steps:  # each with a plain 64-bit integer step: the run-log parser saw to it
        metrics = rec.get("metrics")
        table.add(rec["step"], norm(metrics) if isinstance(metrics, dict) else {})
    finish(src, table)
    src.samples = StepSamples(index)  # type: ignore[assignment]
    src.context = context_from_header(log.header)
    crashed = next(filter(None, map(recorded_crash, reversed(log.notes))), None)
    if crashed is not None:
        src.meta["crash"] = crashed  # the exception the training loop left with, read when it happened
    if log.header_count > 1:
        src.parts = runs_written_twice(src)
    return src


def runs_written_twice(src: Source) -> list[tuple[str, Source]]:
    """A ``run.jsonl`` into which a second run was written, as one source per run (``Source.parts``); empty
    when it holds one run.

    A resumed run appends a header with ``resumed_from_step`` > 0 and continues the same run; a header that
    starts from step 0 under another run id after steps were logged is a new run. Each part is replayed
    without samples: the runs' samples cannot be told apart.
    """
    from grpo_monitor.core.runlog import RunLog, RunLogError, iter_records

    run = src.run
    assert run is not None
    run_file = Path(run.path) / "run.jsonl"
    logs: list[RunLog] = []
    current: RunLog | None = None
    try:
        records = list(iter_records(run_file))
    except RunLogError:
        return []
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
        return []
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
        out.append((f"run {i} of {len(logs)}: {log.header.get('run_id')}", part))
    return out


def skipped_records(src: Source) -> Skipped:
    """Every line of a run directory's files left out as not a record so far (the samples of a
    step are parsed when the replay reaches it, so ask after the replay)."""
    from grpo_monitor.core.runlog import Skipped

    out = Skipped()
    if src.run is not None:
        out.merge(src.run.skipped)
    index = getattr(src.samples, "index", None)
    if index is not None and isinstance(getattr(index, "skipped", None), Skipped):
        out.merge(index.skipped)
    return out


def context_from_header(header: dict[str, Any]) -> RunContext:
    config = header.get("config")
    config = dict(config) if isinstance(config, dict) else {}
    model = header.get("model")
    model = dict(model) if isinstance(model, dict) else {}
    rewards = header.get("reward_funcs")
    rewards = [str(r) for r in rewards] if isinstance(rewards, list) else []
    logging_steps = as_step(config.get("logging_steps"))
    raw, max_steps = config.get("logging_steps"), as_step(config.get("max_steps"))
    if logging_steps is None and isinstance(raw, float) and 0 < raw < 1 and max_steps and max_steps > 0:
        logging_steps = math.ceil(max_steps * raw)  # transformers reads logging_steps < 1 as a fraction
    correctness = header.get("correctness_reward")
    fmt = header.get("format_reward")
    return RunContext(
        config=config,
        model=model,
        reward_names=rewards,
        correctness_reward=correctness if isinstance(correctness, str) else None,
        format_reward=fmt if isinstance(fmt, str) else None,
        logging_steps=logging_steps if logging_steps and logging_steps > 0 else 1,
    )


class RunDirReader(Reader):
    name = "run_dir"
    formats = ("run_dir",)
    describes = "run.jsonl"
    folder_holds = "run.jsonl"

    def sniff(self, probe: Probe) -> str | None:
        if probe.is_dir:
            return "run_dir" if (probe.path / "run.jsonl").is_file() else None
        if probe.path.name == "run.jsonl":
            return "run_dir"
        first = probe.first_record
        if isinstance(first, dict) and first.get("type") == "header" and "schema" in first:
            raise SourceError(probe.path, "a grpo-monitor run log must be named run.jsonl inside its run directory")
        return None

    def one_run(self, folder: Path) -> bool:
        return (folder / "run.jsonl").is_file()

    def read(self, probe: Probe, fmt: str) -> Source:
        return read_run_dir(probe.path)
