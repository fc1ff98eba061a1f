"""What the dashboard knows about a run, built up record by record (no Textual here).

Step metrics live in columnar numpy arrays that grow by doubling, so appending a step is O(1)
amortised and a chart reads a 100k-step history without copying it. A step record whose step
does not advance (a run resumed from a checkpoint logs some steps again) rewinds the columns
to that step: the latest record of a step wins, as in ``grpo_monitor.core.runlog.read_run``.

>>> m = RunModel()
>>> _ = m.ingest([{"type": "header", "config": {"max_completion_length": 64}, "model": {}},
...               {"type": "step", "step": 1, "metrics": {"entropy": 0.5}},
...               {"type": "step", "step": 2, "metrics": {"entropy": 0.4, "kl": 0.01}}])
>>> m.store.n, m.store.column("kl").tolist()[1], m.latest_metric("entropy")
(2, 0.01, 0.4)
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from grpo_monitor.core.crashes import crash_finding, recorded_crash
from grpo_monitor.detectors.numbers import finite, number_or_nan

_REWARD_MEAN = re.compile(r"^rewards/(.+)/mean$")
MOE_CAP = 4096  # load records kept for the heatmap; beyond it older ones are thinned by half
# How the board shows a detector that could not judge the run (``Engine.coverage`` statuses).
COVERAGE_SHOWN = {"not_applicable": "not applicable", "missing_inputs": "cannot judge", "too_few_points": "warming_up"}
SAMPLES_CAP = 200_000  # sample records held in memory (replayed logs); run directories are indexed
STEP_CACHE = 8  # steps of samples kept parsed, for moving back and forth between them
WARNINGS_KEPT = 200  # the newest warnings kept for the screen; all are counted


class SeriesStore:
    """Steps and one float column per metric name, NaN where a step did not log that name."""

    def __init__(self, capacity: int = 1024) -> None:
        self._cap = capacity
        self._steps = np.empty(capacity, dtype=np.float64)
        self._cols: dict[str, np.ndarray] = {}
        self.n = 0
        self.gen = 0  # bumped when history is rewritten (a rewind), so caches start over

    @property
    def steps(self) -> np.ndarray:
        return self._steps[: self.n]

    @property
    def names(self) -> list[str]:
        return list(self._cols)

    def column(self, name: str) -> np.ndarray:
        col = self._cols.get(name)
        if col is None:
            return np.full(self.n, np.nan)
        return col[: self.n]

    def has(self, name: str) -> bool:
        return name in self._cols

    def _reserve(self, need: int) -> None:
        if need <= self._cap:
            return
        cap = self._cap
        while cap < need:
            cap *= 2
        steps = np.empty(cap, dtype=np.float64)
        steps[: self.n] = self._steps[: self.n]
        self._steps = steps
        for k, col in self._cols.items():
            grown = np.full(cap, np.nan)
            grown[: self.n] = col[: self.n]
            self._cols[k] = grown
        self._cap = cap

    def truncate(self, step: float) -> None:
        """Forget every row at or after ``step``."""
        keep = int(np.searchsorted(self.steps, step, side="left"))
        if keep < self.n:
            for col in self._cols.values():
                col[keep : self.n] = np.nan
            self.n = keep
            self.gen += 1

    def extend(self, steps: list[int], metrics: list[Mapping[str, Any]]) -> None:
        """Append rows whose steps are increasing and beyond the last stored step."""
        k = len(steps)
        if not k:
            return
        self._reserve(self.n + k)
        lo, hi = self.n, self.n + k
        self._steps[lo:hi] = steps
        names: set[str] = set()
        for m in metrics:
            names.update(m)
        for name in names:
            col = self._cols.get(name)
            if col is None:
                col = self._cols[name] = np.full(self._cap, np.nan)
            col[lo:hi] = [number_or_nan(m.get(name)) for m in metrics]
        self.n = hi


class RunModel:
    """Everything read from a run so far. ``ingest`` returns the kinds of data that changed."""

    def __init__(self) -> None:
        self.headers: list[dict[str, Any]] = []
        self.store = SeriesStore()
        self.detector_states: dict[str, str] = {}
        self.last_step: dict[str, Any] | None = None
        self.findings: list[dict[str, Any]] = []
        self.recommendations: list[dict[str, Any]] = []
        self.restarts: list[dict[str, Any]] = []
        self.notes: list[dict[str, Any]] = []
        self.mem_samples: list[dict[str, Any]] = []  # sample records that arrived as records
        self.sample_indexes: list[Any] = []  # ``grpo_monitor.core.sample_index.SampleIndex`` of each followed directory
        self._index_versions: tuple[int, ...] = ()
        self._step_cache: dict[int, tuple[int, list[dict[str, Any]]]] = {}
        self.summary: dict[str, Any] | None = None
        # What the readers said (a line left out, a file that shrank) and the monitor's own warning
        # notes (a write that failed, a detector that broke): the header shows them.
        self.warnings: list[str] = []
        self.warning_count = 0
        self.skipped = 0  # lines of the run's files left out as not records
        self.moe_steps: list[int] = []
        self.moe_load: list[np.ndarray] = []
        self.source_format: str | None = None  # set for logs that are not a run directory
        # A replayed log's coverage as ``analyze`` computed it (``coverage`` record); None while following a run.
        self.replayed_coverage: dict[str, dict[str, Any]] | None = None
        self.sample_version = 0

    # -- reading -----------------------------------------------------------------------------
    @property
    def header(self) -> dict[str, Any]:
        """The latest segment's header (its config is what the run trains with now)."""
        return self.headers[-1] if self.headers else {}

    @property
    def config(self) -> dict[str, Any]:
        cfg = self.header.get("config")
        return cfg if isinstance(cfg, dict) else {}

    @property
    def model_info(self) -> dict[str, Any]:
        m = self.header.get("model")
        return m if isinstance(m, dict) else {}

    @property
    def segment(self) -> int:
        """The segment shown, counted from 1 for the run as first launched.

        Headers record ``segment`` from 0 (the lineage root; ``segment-<n>/`` is segment n), as the
        callback and ``grpo-monitor supervise`` number them; the screen counts from 1 like
        ``analyze`` does. A header without the field is a segment when it names a parent run
        (a resumed run's second header names none).

        >>> m = RunModel()
        >>> m.segment, m.ingest([{"type": "header", "segment": 0}]) and m.segment
        (1, 1)
        >>> _ = m.ingest([{"type": "header", "segment": 2, "parent_run": "r"}]); m.segment
        3
        """
        seg = self.header.get("segment")
        if isinstance(seg, int) and not isinstance(seg, bool) and seg >= 0:
            return seg + 1
        return 1 + sum(1 for h in self.headers[1:] if h.get("parent_run"))

    @property
    def is_moe(self) -> bool:
        return bool(self.model_info.get("is_moe")) or bool(self.moe_load) or any(
            n.startswith("moe/") for n in self.store.names
        )

    @property
    def has_device(self) -> bool:
        """The run logged NVML device readings (``core.device``; torch's own memory metrics are not them)."""
        return self.store.has("system/gpu_samples")

    @property
    def finished(self) -> bool:
        """The run wrote its final summary, or logged its last step (a summary line torn by a crash, as
        ``analyze`` reads it: ``analysis.run_status.reached_max_steps``)."""
        if self.summary is not None:
            return True
        from grpo_monitor.analysis.run_status import reached_max_steps

        last = self.last_step
        return bool(last) and reached_max_steps(self.config, last.get("step"))

    @property
    def length_cap(self) -> float | None:
        return finite(self.config.get("max_completion_length"))

    def reward_components(self) -> list[str]:
        names: list[str] = []
        for h in self.headers:
            for f in h.get("reward_funcs") or ():
                if isinstance(f, str) and f not in names:
                    names.append(f)
        for n in self.store.names:
            m = _REWARD_MEAN.match(n)
            if m and m.group(1) not in names:
                names.append(m.group(1))
        return names

    def latest_metric(self, name: str) -> float | None:
        """The newest finite value of a metric (None when it was never measured)."""
        col = self.store.column(name)
        end = col.size
        size = 8
        while end > 0:  # look back from the end in growing windows: O(1) when the last value is there
            start = max(0, end - size)
            ok = np.flatnonzero(np.isfinite(col[start:end]))
            if ok.size:
                return float(col[start + ok[-1]])
            end, size = start, size * 8
        return None

    def coverage(self) -> tuple[dict[str, dict[str, Any]], list[str]]:
        """Which detectors can judge what the run logs, as ``analyze`` reports it, and the metric names holding
        a value: a replayed log's own coverage (the session that replayed it computed it), else
        ``analysis.coverage_from_states`` over a followed run's recorded states; recomputed only when the
        logged names, the detectors' states or the segments change."""
        names = list(self.store.names)
        key = (tuple(names), tuple(sorted(self.detector_states.items())), len(self.headers),
               self.replayed_coverage is not None)
        cached = getattr(self, "_coverage", None)
        if cached is not None and cached[0] == key:
            return cached[1], cached[2]
        found = [n for n in names if self.latest_metric(n) is not None]
        if self.replayed_coverage is not None:
            cov = self.replayed_coverage
        else:
            from grpo_monitor.analysis.replay import coverage_from_states

            cov = coverage_from_states(self.header, found, self.detector_states,
                                      has_samples=bool(self.sample_indexes or self.mem_samples))
        self._coverage = (key, cov, found)
        return cov, found

    def shown_state(self, detector: str) -> str:
        """A detector's state as the board shows it: where it could not judge the run (``not applicable``:
        MoE instability on a dense model, the rollout mismatch without an inference engine's metrics;
        ``cannot judge``: its inputs are not logged) whatever state it records (ok, or warming up for good),
        the coverage says so, as ``analyze`` does; else its recorded state.

        >>> m = RunModel()
        >>> _ = m.ingest([{"type": "header", "model": {"is_moe": False}},
        ...               {"type": "step", "step": 1, "metrics": {"reward": 0.5},
        ...                "detectors": {"moe_instability": "ok", "rollout_mismatch": "warming_up"}}])
        >>> m.shown_state("moe_instability"), m.shown_state("rollout_mismatch")
        ('not applicable', 'not applicable')
        """
        state = self.detector_states.get(detector, "—")
        if state in ("ok", "warming_up"):
            try:
                cov, _ = self.coverage()
            except Exception:  # the board draws whatever the coverage check makes of an odd log
                return state
            status = cov.get(detector, {}).get("status")
            if status in COVERAGE_SHOWN:
                return COVERAGE_SHOWN[status]
        return state

    def metric_names(self, prefix: str) -> list[str]:
        return sorted(n for n in self.store.names if n.startswith(prefix))

    def latest_findings_by_detector(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for f in self.findings:
            out[str(f.get("detector"))] = f
        return out

    # -- writing -----------------------------------------------------------------------------
    def warn(self, warnings: Iterable[str], skipped: int | None = None) -> bool:
        """Add what a reader said; True when there is something new to show."""
        new = [str(w) for w in warnings]
        self.warning_count += len(new)
        self.warnings = (self.warnings + new)[-WARNINGS_KEPT:]
        grew = skipped is not None and skipped != self.skipped
        if skipped is not None:
            self.skipped = skipped
        return bool(new) or grew

    def ingest(self, records: Iterable[Mapping[str, Any]]) -> set[str]:
        changed: set[str] = set()
        pend_steps: list[int] = []
        pend_metrics: list[Mapping[str, Any]] = []

        def flush() -> None:
            if pend_steps:
                self.store.extend(pend_steps, pend_metrics)
                pend_steps.clear()
                pend_metrics.clear()

        for rec in records:
            kind = rec.get("type")
            if kind == "step":
                step = int(rec["step"])
                last = pend_steps[-1] if pend_steps else (self.store.steps[-1] if self.store.n else None)
                if last is not None and step <= last:
                    flush()
                    self.store.truncate(step)
                    self._truncate_moe(step)
                    changed.add("rewind")
                metrics = rec.get("metrics")
                pend_steps.append(step)
                pend_metrics.append(metrics if isinstance(metrics, Mapping) else {})
                det = rec.get("detectors")
                if isinstance(det, Mapping):
                    self.detector_states = {str(k): str(v) for k, v in det.items()}
                    changed.add("detectors")
                load = rec.get("moe_load")
                if load is not None:
                    self._add_moe(step, load)
                    changed.add("moe")
                self.last_step = dict(rec)
                changed.add("steps")
            elif kind == "sample":
                self.mem_samples.append(dict(rec))
                changed.add("samples")
            elif kind == "header":
                self.headers.append(dict(rec))
                if isinstance(rec.get("source_format"), str):
                    self.source_format = rec["source_format"]
                changed.add("header")
            elif kind == "finding":
                self.findings.append(dict(rec))
                changed.add("findings")
            elif kind == "recommendation":
                self.recommendations.append(dict(rec))
                changed.add("recommendations")
            elif kind == "restart":
                self.restarts.append(dict(rec))
                changed.add("header")
            elif kind == "summary":
                self.summary = dict(rec)
                changed.add("header")
            elif kind == "coverage" and isinstance(rec.get("coverage"), Mapping):
                self.replayed_coverage = {str(k): dict(v) for k, v in rec["coverage"].items() if isinstance(v, Mapping)}
                changed.add("detectors")
            elif kind == "note":
                self.notes.append(dict(rec))
                changed.add("notes")
                step = rec.get("step")
                crashed = recorded_crash(rec)
                if crashed is not None:  # the finding analyze gives the same run
                    last = int(self.last_step["step"]) if self.last_step else (step if type(step) is int else 0)
                    self.findings.append({"type": "finding", **crash_finding(crashed, last, config=self.config).to_dict()})
                    changed.add("findings")
                if rec.get("level") == "warning" and isinstance(rec.get("message"), str):
                    self.warn([f"{'step ' + str(step) + ': ' if type(step) is int else ''}{rec['message']}"])
                    changed.add("header")
        flush()
        if "samples" in changed:
            if len(self.mem_samples) > SAMPLES_CAP:
                del self.mem_samples[: len(self.mem_samples) - SAMPLES_CAP * 3 // 4]
            self._step_cache.clear()
            self.sample_version += 1
        return changed

    # -- samples -----------------------------------------------------------------------------
    # A run directory's samples stay on disk, indexed by step; a step's records are parsed when a
    # panel asks for them, so a run of millions of completions costs the dashboard a few
    # megabytes. Samples that arrive as records (a replayed log) are held in memory.
    def set_sample_indexes(self, indexes: list[Any]) -> bool:
        """Follow these indexes; True when they grew since last asked."""
        self.sample_indexes = list(indexes)
        versions = tuple(i.version for i in self.sample_indexes)
        if versions == self._index_versions:
            return False
        self._index_versions = versions
        self._step_cache.clear()
        self.sample_version += 1
        return True

    @property
    def sample_count(self) -> int:
        return len(self.mem_samples) + sum(i.count for i in self.sample_indexes)

    def sample_steps(self) -> list[int]:
        """Every step with samples, ascending."""
        steps: set[int] = set()
        for idx in self.sample_indexes:
            steps.update(idx.steps())
        steps.update(s["step"] for s in self.mem_samples if type(s.get("step")) is int)
        return sorted(steps)

    def step_sample_count(self, step: int) -> int:
        n = sum(i.count_of(step) for i in self.sample_indexes)
        return n + (sum(1 for s in self.mem_samples if s.get("step") == step) if self.mem_samples else 0)

    def samples_of(self, step: int) -> list[dict[str, Any]]:
        """One step's samples (every rank, every followed directory), read when first asked."""
        key = self.step_sample_count(step)
        hit = self._step_cache.get(step)
        if hit is not None and hit[0] == key:
            return hit[1]
        rows: list[dict[str, Any]] = []
        for idx in self.sample_indexes:
            if idx.count_of(step):
                rows.extend(idx.load(step))
        if self.mem_samples:
            rows.extend(s for s in self.mem_samples if s.get("step") == step)
        if len(self._step_cache) >= STEP_CACHE:
            self._step_cache.pop(next(iter(self._step_cache)))
        self._step_cache[step] = (key, rows)
        return rows

    @property
    def samples(self) -> list[dict[str, Any]]:
        """Every sample of the run, read now (small runs and tests: panels read steps as needed)."""
        if not self.sample_indexes:
            return self.mem_samples
        out: list[dict[str, Any]] = []
        for step in self.sample_steps():
            out.extend(self.samples_of(step))
        return out

    def _add_moe(self, step: int, load: Any) -> None:
        try:
            arr = np.asarray(load, dtype=np.float32)
        except (TypeError, ValueError):
            return
        if arr.ndim == 1:
            arr = arr[None, :]
        if arr.ndim != 2 or arr.size == 0:
            return
        self.moe_steps.append(step)
        self.moe_load.append(arr)
        if len(self.moe_steps) > MOE_CAP:  # thin the older half so the heatmap spans the whole run
            half = len(self.moe_steps) // 2
            self.moe_steps = self.moe_steps[:half:2] + self.moe_steps[half:]
            self.moe_load = self.moe_load[:half:2] + self.moe_load[half:]

    def _truncate_moe(self, step: int) -> None:
        while self.moe_steps and self.moe_steps[-1] >= step:
            self.moe_steps.pop()
            self.moe_load.pop()
