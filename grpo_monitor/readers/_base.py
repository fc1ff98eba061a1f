"""What every reader shares: the ``Reader`` interface and the ``Probe`` it sniffs, the ``Source``
record it returns, ``SourceError``, and step bookkeeping."""

from __future__ import annotations

import operator
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpo_monitor.detectors.base import RunContext
from grpo_monitor.detectors.signals import reward_roles
from grpo_monitor.core.metrics import normalize, normalize_metrics, reward_components
from grpo_monitor.detectors.numbers import to_number
from grpo_monitor.core.runlog import Skipped, plain_step

if TYPE_CHECKING:  # pragma: no cover
    import pandas

    from grpo_monitor.core.runlog import RunLog

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
    # A file holding several runs (one per arm of a results JSON): each as ``(label, Source)``, the
    # first of them also this source's own steps; ``analyze`` reports each as a run of its own.
    parts: list[tuple[str, Source]] = field(default_factory=list)

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
            x = to_number(text)
            return as_step(x) if x is not None else None
    return None


def step_fault(value: Any) -> str | None:
    """Why a record's step value is no step (None when ``as_step`` reads it and it is not negative): said
    the way the skipped record is reported.

    >>> [step_fault(v) for v in (3, "4", 2.0, True, 31.5, -1, "abc", 10**30, float("nan"))]
    [None, None, None, 'true is not a number', '31.5 is not an integer', '-1 is negative', "'abc' is not a number", '1000000000000000000000000000000 is beyond the 64-bit range', 'NaN is not an integer']
    """
    step = as_step(value)
    if step is not None:
        return f"{step} is negative" if step < 0 else None
    if isinstance(value, bool) or value is None:
        return f"{str(value).lower() if value is not None else 'null'} is not a number"
    if isinstance(value, str):
        text = value.strip()
        if len(text) > 40 and text.lstrip("+-").isdigit():
            return f"a number of {len(text.lstrip('+-')):,} digits is beyond the 64-bit range"
        x = to_number(text)
        if x is None:
            return f"{_shown(value)} is not a number"
        value = x
    if isinstance(value, int) or isinstance(value, HugeNumber):
        return f"{_shown(value)} is beyond the 64-bit range"
    if isinstance(value, float):
        if value != value:
            return "NaN is not an integer"
        if value in (float("inf"), float("-inf")) or abs(value) >= _TWO63:
            return f"{_shown(value)} is beyond the 64-bit range"
        return f"{_shown(value)} is not an integer"
    return f"a {type(value).__name__} is not a number"


def _shown(value: Any) -> str:
    if isinstance(value, HugeNumber):
        text = repr(value)
    elif isinstance(value, float):
        text = "Infinity" if value == float("inf") else "-Infinity" if value == float("-inf") else repr(value)
    elif isinstance(value, int):
        digits = len(str(abs(value))) if value.bit_length() < 13000 else None
        text = str(value) if digits is not None and digits <= 40 else "a number of many digits"
    else:
        text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def usable_step(value: Any) -> int | None:
    """``as_step`` without negative steps: no trainer counts below 0, and a record that says so is a bad one."""
    step = as_step(value)
    return step if step is not None and step >= 0 else None


def note_skipped(src: Source, skipped: Skipped) -> None:
    """The source's warning line (and ``meta["skipped"]``) for the records a reader left out, each alone."""
    if skipped.count:
        src.warnings.append(skipped.line())  # type: ignore[arg-type]
        src.meta["skipped"] = skipped.to_dict()


def refuse_if_mostly_skipped(path: Path, skipped: Skipped, read: int, what: str) -> None:
    """A file with more unreadable records than readable ones is not a log with a bad record but something
    else (noise after one good line, another format): refused, naming the first fault."""
    if skipped.count and skipped.count > read:
        first = skipped.where[0] if skipped.where else ""
        raise SourceError(path, f"{skipped.count} of {skipped.count + read} {what} unreadable, more than were read "
                                f"(the first: {first})")


_MAX_DIGITS = 4000  # under Python's 4300-digit limit on int(): the standard JSON parser raises beyond it


class HugeNumber(float):
    """An integer literal too long to convert, read as the infinity of its sign; ``digits`` says how long."""

    digits = 0

    def __repr__(self) -> str:
        return f"a number of {self.digits:,} digits"


def _bounded_int(text: str) -> int | float:
    if len(text) <= _MAX_DIGITS:
        return int(text)
    out = HugeNumber("-inf" if text.startswith("-") else "inf")
    out.digits = len(text.lstrip("-"))
    return out


def loads_lenient(data: bytes | str) -> Any:
    """A JSON value where an integer literal of thousands of digits (no log writes one, a damaged or hostile
    one may) reads as an infinity instead of refusing the whole text: a step that large is then a bad record's
    step, and a metric that large is beyond float range anyway."""
    import json

    from grpo_monitor.core.jsonparse import loads

    try:
        return loads(data)
    except json.JSONDecodeError:
        raise
    except ValueError as exc:
        if "digits" not in str(exc):
            raise
        return json.loads(data, parse_int=_bounded_int)


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
        self._spelled: dict[str, str] = {}

    def spellings(self) -> dict[str, str]:
        """The log's own names that a known spelling renamed (``gradient_norm`` -> ``grad_norm``), for the
        report to say; a tracker's prefix alone (``train/reward``) is not a renaming worth saying."""
        return dict(self._spelled)

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
        if kinds == _STRINGS:  # numbers printed as text ('0.55'): where float() reads them all, it agrees with to_number
            try:
                return dict(zip(names, map(float, values)))
            except ValueError:
                return self._reference(logs)
        if not kinds <= _NUMBERS:  # a string, a bool or something odd: the reference implementation decides
            return self._reference(logs)
        return dict(zip(names, map(to_number, values)))

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
        self._spelled.update((key, name) for key, name in pairs if _renamed(key, name))
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


def _renamed(key: str, name: str) -> bool:
    return key != name and key.rsplit("/", 1)[-1] != name.rsplit("/", 1)[-1] and not key.endswith("/" + name)


_FLOATS = frozenset({float, type(None)})
_NUMBERS = frozenset({float, int, type(None)})
_STRINGS = {str}


def guess_context(names: Iterable[str], logging_steps: int | None, steps: list[int]) -> RunContext:
    """The facts a foreign log reveals: reward components and the logging interval."""
    rewards = reward_components(list(names))
    correctness, fmt = reward_roles(rewards)
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


# ------------------------------------------------------------------------------- step columns

# Index fields named like a step, best first: the trainer's own step beats a logger's call counter
# (W&B's ``_step`` counts ``wandb.log`` calls, which differs from the trainer step when
# logging_steps > 1); a trainer that counts iterations or updates names them so.
STEP_FIELDS = ("train/global_step", "global_step", "training/global_step", "trainer/global_step", "step",
               "iteration", "iter", "update", "_step")
_STEP_RANK = {name: i for i, name in enumerate(STEP_FIELDS)}


# A trainer's own counter of its optimiser steps (``grpo_step``, ``optimizer_step``, ``rl_iteration``): ranked
# after the fields above.
COUNTER_NAME = re.compile(r"^(?:grpo|rl|ppo|optimizer|optim|opt|train|training|policy|learner|outer|global)"
                          r"_(?:step|iteration|iter|update)s?$")


def step_rank(name: Any) -> int | None:
    """Where a column or key named ``name`` ranks among step fields (case and spaces aside), or None.

    >>> step_rank("Step"), step_rank("iteration"), step_rank("_step"), step_rank("grpo_step"), step_rank("reward")
    (4, 5, 8, 9, None)
    """
    if not isinstance(name, str):
        return None
    folded = name.strip().lower().replace(" ", "_")
    rank = _STEP_RANK.get(folded)
    if rank is None and COUNTER_NAME.match(folded):
        return len(STEP_FIELDS)
    return rank


def step_column(names: Iterable[Any]) -> int | None:
    """The position of the best step-like name among ``names``, or None."""
    ranked = [(r, i) for i, n in enumerate(names) if (r := step_rank(n)) is not None]
    return min(ranked)[1] if ranked else None


# --------------------------------------------------------------------------------- the probe

SNIFF_BYTES = 64 * 1024
_TEXT_START = b"\xef\xbb\xbf \t\r\n"


class Probe:
    """One path as every reader sees it while the format is told: its first bytes, and (once, when a
    reader asks) its text and its parsed JSON document, so the reader that takes it reads nothing twice.

    ``layout`` is what the bytes look like, before any format is decided: ``dir``, ``empty``,
    ``binary`` (NUL bytes), ``undecodable`` (not UTF-8), ``document`` (one JSON document),
    ``lines`` (a JSON value per line) or ``text``.
    """

    def __init__(self, path: Path, logging_steps: int | None = None) -> None:
        self.path = path
        self.logging_steps = logging_steps
        self.is_dir = path.is_dir()
        self.cache: dict[str, Any] = {}  # what a reader's sniff worked out, for its read
        self._head: bytes | None = None
        self._text: str | None = None
        self._layout: str | None = None
        self._first: Any = _UNSET
        self._doc: Any = _UNSET

    @property
    def head(self) -> bytes:
        """The first ``SNIFF_BYTES`` of a file (``b""`` for a folder)."""
        if self._head is None:
            if self.is_dir:
                self._head = b""
            else:
                with open(self.path, "rb") as fh:
                    self._head = fh.read(SNIFF_BYTES)
        return self._head

    @property
    def start(self) -> bytes:
        """The head without a byte-order mark and leading whitespace."""
        return self.head.lstrip(_TEXT_START)

    def text(self) -> str:
        """The whole file as text (``decode_text``), decoded once for every sniff and the read."""
        if self._text is None:
            self._text = decode_text(self.path.read_bytes())
        return self._text

    @property
    def first_record(self) -> Any:
        """The JSON value on the first line when the file starts with ``{`` and that line is one, else None."""
        if self._first is _UNSET:
            self._first = None
            start = self.start
            if start[:1] == b"{":
                self._first = first_json_line(start.split(b"\n", 1)[0])
        return self._first

    @property
    def layout(self) -> str:
        if self._layout is None:
            self._layout = self._tell_layout()
        return self._layout

    def _tell_layout(self) -> str:
        if self.is_dir:
            return "dir"
        head = self.head
        if not head.strip():
            return "empty"
        if b"\x00" in head:
            return "binary"
        start = self.start
        if (self.first_record is None and not (start[:1] == b"[" and _json_array_start(start))
                and _json_lines_follow(start)):
            return "lines"  # JSON lines whose first line is damaged: that line is one bad record, not the format
        if start[:1] == b"{":
            first = self.first_record
            if first is None:
                # A pretty-printed JSON document, or a printed Python dict (console output).
                return "text" if start[:2] == b"{'" else "document"
            if isinstance(first, dict) and ("log_history" in first or isinstance(first.get("cells"), list) or (
                    first and all(isinstance(v, list) for v in first.values()))):
                return "document"
            return "lines"
        if start[:1] == b"[":
            # "[INFO] ...", "[12/500] loss=...": a console log, not JSON.
            return "document" if _json_array_start(start) else "text"
        return "text" if decode_head(head) is not None else "undecodable"

    def document(self) -> Any:
        """The parsed JSON document (``layout == "document"``), else None; a broken one raises ``SourceError``."""
        if self._doc is _UNSET:
            self._doc = None
            if self.layout == "document":
                self._doc = parse_json(self.path, self.path.read_bytes())
        return self._doc


_UNSET = object()


def _json_lines_follow(start: bytes, n: int = 5) -> bool:
    """The lines after the first (up to ``n`` of them, at least two) are each a JSON object: a pretty-printed
    document's lines never are (``"key": value,``), nor a console log's printed Python dicts."""
    lines = start.split(b"\n")[1:-1]  # the last may be cut by the sniff window
    seen = 0
    for line in lines:
        line = line.strip()
        if not line:
            continue
        if line[:1] != b"{" or not isinstance(first_json_line(line), dict):
            return False
        seen += 1
        if seen >= n:
            break
    return seen >= 2


def _json_array_start(text: bytes) -> bool:
    first = text.split(b"\n", 1)[0].strip()
    if first == b"[" or first[:2] in (b"[{", b"[[", b'["', b"[]") or first[:3] in (b"[ {", b"[ [", b'[ "'):
        return True
    return first_json_line(first) is not None


def first_json_line(line: bytes) -> Any:
    """The JSON value on one line, or None when the line is not a complete JSON value."""
    from grpo_monitor.core.jsonparse import loads

    try:
        return loads(line)
    except (ValueError, RecursionError):
        return None


def decode_head(head: bytes) -> str | None:
    """A file's first bytes as text, or None when they are not UTF-8."""
    head = head[3:] if head.startswith(b"\xef\xbb\xbf") else head
    try:
        return head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 4:  # a multi-byte character cut by the sniff window is fine
            return None
        return head[: exc.start].decode("utf-8", "ignore")


def decode_text(data: bytes) -> str:
    """Any bytes as text: a stray byte in a long console log is no reason to refuse it. Colours
    stay: each reader strips them where they can stand in its way (a 100 MB log is not copied for
    the two escapes around a warning)."""
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    return data.decode("utf-8", "replace")


def parse_json(path: Path, data: bytes) -> Any:
    """A whole JSON document; a one-line ``SourceError`` naming where it breaks."""
    import json

    try:  # the bytes as they are: a decoded copy of a 200 MB notebook would double the peak memory of the read
        return loads_lenient(data[3:] if data.startswith(b"\xef\xbb\xbf") else data)
    except (ValueError, RecursionError):
        pass  # parsed again below, for the message that says where and why
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise SourceError(path, f"not UTF-8 text (bad byte at offset {exc.start})") from None
    try:
        return loads_lenient(text)
    except json.JSONDecodeError as exc:
        what = "truncated JSON" if exc.pos >= len(text.rstrip()) else "invalid JSON"
        raise SourceError(path, f"{what} at line {exc.lineno} column {exc.colno} ({exc.msg})") from None
    except RecursionError:
        raise SourceError(path, "JSON nested too deeply") from None


# -------------------------------------------------------------------------------- the reader


class Reader:
    """One log format: a name, a cheap content sniff, and a read that returns a ``Source``.

    ``readers.load_source`` tries the readers in their declared order (``readers.READERS``); the
    first whose ``sniff`` names a format reads the path. ``sniff`` looks at the probe only (its
    first bytes, a folder's entries; the parsed document or text where the layout says it is
    one), returns the format it would read (one of ``formats``) or None, and may raise
    ``SourceError`` when the path is plainly of its kind but unusable. ``near_miss`` says, when no
    reader took a path, what it lacks to be of this reader's kind.
    """

    name: str = ""
    formats: tuple[str, ...] = ()
    # What it reads, for the line that lists the known formats, and what a folder of its kind holds.
    describes: str = ""
    folder_holds: str = ""

    def sniff(self, probe: Probe) -> str | None:  # pragma: no cover - every reader has its own
        raise NotImplementedError

    def read(self, probe: Probe, fmt: str) -> Source:  # pragma: no cover - every reader has its own
        raise NotImplementedError

    def near_miss(self, probe: Probe) -> str | None:
        return None

    def one_run(self, folder: Path) -> bool:
        """Whether ``folder`` itself is one run of this kind, as a search through a folder of runs meets it
        (a folder that merely holds such runs deeper down is not): looked at cheaply, never read."""
        return False
