"""What every reader shares: the ``Source`` record, ``SourceError`` and step bookkeeping."""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpo_monitor.detectors.base import RunContext
from grpo_monitor.core.metrics import normalize, normalize_metrics, reward_components, to_value
from grpo_monitor.core.runlog import plain_step

if TYPE_CHECKING:  # pragma: no cover
    import pandas

    from grpo_monitor.core.runlog import RunLog

FORMATS = (
    "run_dir", "trainer_state", "tensorboard", "csv", "jsonl",
    "log_history", "columns", "notebook", "trl_console", "verl_console", "console", "wandb", "trackio",
)
Metrics = dict[str, "float | None"]

# A malformed input can put anything into an error message (control bytes, a 1 MB line): the
# message must stay one readable line.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")
_MAX_MESSAGE = 400


class SourceError(ValueError):
    """An unusable log; ``str()`` is one line naming the file and what is wrong with it."""

    def __init__(self, path: str | Path | None, what: str, line: int | None = None) -> None:
        self.path = None if path is None else Path(path)
        self.line = line
        self.what = one_line(what)
        where = "" if path is None else one_line(str(path)) + ("" if line is None else f":{line}")
        super().__init__(f"{where}: {self.what}" if where else self.what)


def one_line(text: str, limit: int = _MAX_MESSAGE) -> str:
    text = _CONTROL.sub(" ", str(text)).strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass
class Source:
    """The metrics of one run, read from any supported log format.

    ``steps`` is sorted by step with each step once; metric names are TRL 1.16 names (unknown
    names are carried along), NaN and inf are kept and ``None`` marks a gap.
    """

    path: Path
    format: str
    context: RunContext = field(default_factory=RunContext)
    steps: list[tuple[int, Metrics]] = field(default_factory=list)
    samples: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    run: RunLog | None = None
    warnings: list[str] = field(default_factory=list)
    # How the reader made its choices (``logging_steps`` and where it came from, a summary it set
    # aside, the tracker run it read): for reports and for callers who want to check.
    meta: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        return (
            f"Source(path={str(self.path)!r}, format={self.format!r}, steps={len(self.steps)}, "
            f"metrics={len(self.metric_names())})"
        )

    def metric_names(self) -> list[str]:
        """Every metric name, in the order it first appears."""
        seen: dict[str, None] = {}
        last: Any = None
        for _, metrics in self.steps:
            keys = metrics.keys()
            if keys == last:  # the common case: every step logs the same keys
                continue
            last = keys
            for k in keys:
                seen.setdefault(k, None)
        return list(seen)

    def frame(self) -> pandas.DataFrame:
        """The steps as a float DataFrame indexed by ``step``, one column per metric (gaps are NaN)."""
        import numpy as np
        import pandas as pd

        names = self.metric_names()
        col = {n: i for i, n in enumerate(names)}
        data = np.full((len(self.steps), len(names)), np.nan)
        for row, (_, metrics) in enumerate(self.steps):
            for k, v in metrics.items():
                if v is not None:
                    data[row, col[k]] = v
        index = pd.Index([s for s, _ in self.steps], name="step", dtype="int64")
        return pd.DataFrame(data, index=index, columns=pd.Index(names, dtype=object))


_TWO63 = float(2**63)


def as_step(value: Any) -> int | None:
    """A step number from a foreign log's value: an integer, an integral float or a numeric string
    (int64 range). Our own run log takes only what its writer writes (``core.runlog.plain_step``)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return plain_step(int(value))
    if isinstance(value, float):
        # |value| >= 2**63 is refused even where it rounds into range: it stands for a huge integer.
        return int(value) if -_TWO63 < value < _TWO63 and value == int(value) else None
    if isinstance(value, str):
        text = value.strip()
        try:
            return as_step(int(text))
        except ValueError:
            x = to_value(text)
            return as_step(x) if x is not None else None
    return None


class StepTable:
    """Collects ``(step, metrics)`` in any order and resolves repeated steps.

    A step logged twice keeps the union of its metrics; where both records hold a value for the
    same metric the later one wins (a resumed run re-logs the steps after its checkpoint), and a
    gap never overwrites a value.
    """

    def __init__(self) -> None:
        self._steps: dict[int, Metrics] = {}
        self._sorted = True
        self._last: int | None = None
        self.conflicts = 0
        self.first_conflict: int | None = None
        self._merged: set[int] = set()

    def add(self, step: int, metrics: Metrics) -> None:
        old = self._steps.get(step)
        if old is None:
            self._steps[step] = metrics
            if self._last is not None and step < self._last:
                self._sorted = False
            self._last = step
            return
        if old is not metrics and step not in self._merged:
            # The first record's dict may be shared with its reader (a run log's step record): merge into a copy.
            old = self._steps[step] = dict(old)
            self._merged.add(step)
        for k, v in metrics.items():
            if v is None:
                old.setdefault(k, None)
                continue
            prev = old.get(k)
            if prev is not None and not _same(prev, v):
                self.conflicts += 1
                if self.first_conflict is None:
                    self.first_conflict = step
            old[k] = v

    def __len__(self) -> int:
        return len(self._steps)

    def items(self) -> list[tuple[int, Metrics]]:
        if self._sorted:
            return list(self._steps.items())
        return sorted(self._steps.items(), key=lambda kv: kv[0])

    def conflict_warning(self, path: Path, what: str = "records") -> str | None:
        if not self.conflicts:
            return None
        return (
            f"{path}: {self.conflicts} value(s) logged more than once for the same step "
            f"(first at step {self.first_conflict}); the later {what} win"
        )


def _same(a: float, b: float) -> bool:
    return a == b or (a != a and b != b)


class Normalizer:
    """``normalize_metrics`` with the name mapping cached per key set.

    Logs repeat the same keys at every step; working the names out once per distinct key set
    keeps a 100k-step log from normalising three million names one by one.
    """

    def __init__(self, drop: Iterable[str] = (), owned: bool = False) -> None:
        self._plans: dict[tuple[Any, ...], tuple[tuple[str, ...], Any, bool] | None] = {}
        self._drop = frozenset(drop)
        # ``owned``: callers hand over dicts nobody else holds, so one already in canonical names
        # with float values (our own run log) is returned as it is instead of copied.
        self._owned = owned

    def __call__(self, logs: Mapping[str, Any]) -> Metrics:
        keys = tuple(logs)
        plan = self._plans.get(keys, False)
        if plan is False:
            plan = self._plan(keys)
            self._plans[keys] = plan
        if plan is None:
            return self._reference(logs)
        names, pick, as_is = plan
        if as_is and type(logs) is dict and set(map(type, logs.values())) <= _FLOATS:
            return logs  # type: ignore[return-value]
        if len(names) > 1:
            values = pick(logs)
        else:
            values = (pick(logs),) if names else ()
        kinds = set(map(type, values))
        if kinds <= _FLOATS:  # the common case, checked and copied at C speed
            return dict(zip(names, values))
        if kinds == _STRINGS:  # numbers printed as text ('0.55'): where float() reads them all, it agrees with to_value
            try:
                return dict(zip(names, map(float, values)))
            except ValueError:
                return self._reference(logs)
        if not kinds <= _NUMBERS:  # a string, a bool or something odd: the reference implementation decides
            return self._reference(logs)
        return dict(zip(names, map(_as_float, values)))

    def _reference(self, logs: Mapping[str, Any]) -> Metrics:
        out = normalize_metrics(logs)
        if self._drop:
            for name in self._drop.intersection(out):
                del out[name]
        return out

    def _plan(self, keys: tuple[str, ...]) -> tuple[tuple[str, ...], Any, bool] | None:
        """Names kept, the getter of their values, and whether an owned dict can be kept as it is."""
        if not all(isinstance(k, str) for k in keys):
            return None
        pairs = plan_names(keys, self._drop)
        names = tuple(name for _, name in pairs)
        pick = operator.itemgetter(*(key for key, _ in pairs)) if pairs else (lambda logs: ())
        return names, pick, self._owned and names == keys


def plan_names(keys: Iterable[str], drop: frozenset[str] = frozenset()) -> list[tuple[str, str]]:
    """``(key, name)`` for every key ``normalize_metrics`` keeps, in its order and with its winners.

    When two keys map to one name (an alias next to the canonical spelling) the canonical key
    wins, else the first; ``step`` aliases and ``drop`` names are left out.
    """
    out: dict[str, str] = {}
    for key in keys:
        name = normalize(key)
        if name == "step" or (name in out and key != name):
            continue
        out[name] = key
    return [(key, name) for name, key in out.items() if name not in drop]


def _as_float(v: Any) -> float | None:
    if v is None or type(v) is float:
        return v
    try:
        return float(v)
    except OverflowError:  # an integer beyond float range (JSON allows it)
        return math.inf if v > 0 else -math.inf


_FLOATS = frozenset({float, type(None)})
_NUMBERS = frozenset({float, int, type(None)})
_STRINGS = {str}


def guess_context(names: Iterable[str], logging_steps: int | None, steps: list[int]) -> RunContext:
    """The facts a foreign log reveals: reward components and the logging interval."""
    rewards = reward_components(list(names))
    correctness = next((r for r in rewards if "correct" in r.lower() or "accura" in r.lower()), None)
    fmt = next((r for r in rewards if "format" in r.lower()), None)
    if not logging_steps or logging_steps < 1:
        logging_steps = infer_interval(steps)
    return RunContext(
        reward_names=rewards, correctness_reward=correctness, format_reward=fmt, logging_steps=int(logging_steps)
    )


def infer_interval(steps: list[int]) -> int:
    """The most common gap between consecutive logged steps (1 when it cannot be told)."""
    if len(steps) < 2:
        return 1
    counts: dict[int, int] = {}
    for a, b in zip(steps, steps[1:]):
        d = b - a
        if d > 0:
            counts[d] = counts.get(d, 0) + 1
    return max(counts, key=lambda d: (counts[d], -d)) if counts else 1


def finish(src: Source, table: StepTable, what: str = "records") -> Source:
    src.steps = table.items()
    warning = table.conflict_warning(src.path, what)
    if warning:
        src.warnings.append(warning)
    return src
