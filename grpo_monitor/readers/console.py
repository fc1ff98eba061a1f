"""Console output people keep (``nohup``, ``tee``, notebook cells): three kinds of log.

* ``trl_console``: transformers/TRL print one Python-literal dict per logged step
  (``{'loss': '0.0123', 'reward': '0.55', ..., 'epoch': '0.02'}``) among progress bars, ANSI colours,
  warnings and anything else the script prints, sometimes hard-wrapped by the terminal; the final
  ``train_runtime`` dict is the run's summary, not a step. The dicts carry no step: the k-th is step
  k × logging_steps, with logging_steps taken from the log where it says (a printed config, the
  progress bar's position at each dict, ``epoch`` against the progress bar's total), else from the
  caller, and the source says which.
* ``verl_console``: verl's ``step:N - key:value - ...`` lines, Ray's ``(TaskRunner pid=...)`` prefixes,
  ``np.float64(...)`` values.
* ``console``: a hand-written loop's lines with a step counter (``step 12``, ``(12/500)``,
  ``[12/500]``) and ``Name: value`` / ``name=value`` pairs. Several loops in one log (an SFT phase
  before the RL phase, an evaluation pass) are told apart by their counter and keys; the family with
  the most lines is the training loop.

Nothing here evaluates text: dicts are parsed as JSON where they are plain, else by
``ast.literal_eval`` of the dict span alone.
"""

from __future__ import annotations

import ast
import math
import re
from bisect import bisect_right
from itertools import accumulate
from pathlib import Path
from typing import Any

from grpo_monitor.core.crashes import read_crash
from grpo_monitor.core.jsonparse import loads
from grpo_monitor.core.metrics import SUMMARY_KEYS
from grpo_monitor.core.runlog import Skipped
from grpo_monitor.detectors.numbers import to_number
from grpo_monitor.readers._base import (
    STEP_FIELDS,
    Normalizer,
    Probe,
    Reader,
    Source,
    SourceError,
    StepTable,
    as_step,
    decode_text,
    finish,
    guess_context,
    loads_lenient,
    note_skipped,
    step_fault,
    usable_step,
)
from grpo_monitor.readers.verl_config import group_of_one_note, verl_config

_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")
# A flat Python dict whose first key is quoted: the shape of every printed log dict.
_DICT = re.compile(r"\{'[^{}]*\}")
_DICT_SPLIT = re.compile(r"(\{'[^{}]*\})")
# Starts with a literal so the scan of a 100 MB log skips ahead instead of trying every digit.
_TQDM = re.compile(r"%\|[^|\r\n]{0,200}\|\s*(\d+)/(\d+)\s*\[")
_LOGGING_STEPS = re.compile(r"""logging[_-]steps['"]?\s*[=:]?\s*['"]?(\d+(?:\.\d+)?)""")
_TOTAL_STEPS = re.compile(r"Total (?:optimization )?steps\s*=\s*([\d,]+)")
_NUM_EPOCHS = re.compile(r"Num (?:train )?epochs\s*=\s*([\d,]+)", re.IGNORECASE)
_VERL_LINE = re.compile(r"(?:^|[\s)\]])step:(-?\d+) - ([^\r\n]*)")
_VERL_SNIFF = re.compile(r"(?:^|[\s)\]])step:\d+ - [^\s:]+:")
_NP_SCALAR = re.compile(r"\b(?:np|numpy)\.(?:float|int|uint|bool_?)\d*\(([^()]*)\)")
_TENSOR = re.compile(r"\btensor\(([^(),]*)(?:,[^()]*)?\)")
_BARE = re.compile(r"(?<=[:\[,(]\s)(-?inf|nan)(?=\s*[,}\])])")
# A printed dict is a logged step when a key says so; a learning rate or a KL coefficient alone is
# as likely a printed config.
_TRAIN_KEYS = frozenset({"loss", "epoch", "grad_norm", "reward", "entropy"})
_TRAIN_PREFIXES = ("reward", "completion", "train_", "eval_", "entropy", "clip_ratio", "frac_reward")


def strip_ansi(text: str) -> str:
    """Escape sequences removed: one match per escape, not a regex scan of a 100 MB log."""
    out = []
    last = 0
    i = text.find("\x1b")
    while i != -1:
        m = _ANSI.match(text, i)
        if m is None:  # a lone ESC stays, as the regex would leave it
            i = text.find("\x1b", i + 1)
            continue
        out.append(text[last:i])
        last = m.end()
        i = text.find("\x1b", last)
    out.append(text[last:])
    return "".join(out)


_LINE = re.compile(r"[^\r\n]+")
_TOO_LONG = 2**64  # stands for a counter of more digits than any 64-bit step: int() of thousands of them raises


def _count(digits: str) -> int:
    """A printed counter as an integer; one of more digits than any step stands in as ``_TOO_LONG`` (converting
    thousands of digits raises, and is slow), keeping its sign and its digit count for the message; a
    fraction (``Step 1.5/30``) as ``_Fraction``, which no step is."""
    if "." in digits:
        out = _Fraction(-1)
        out.text = digits
        return out
    if len(digits) <= 40:
        return int(digits)
    out = _Long(-_TOO_LONG if digits.startswith("-") else _TOO_LONG)
    out.digits = len(digits.lstrip("-+"))
    return out


class _Long(int):
    digits = 0


class _Fraction(int):
    text = ""


def _shown_count(n: int) -> str:
    if isinstance(n, _Fraction):
        return f"{n.text} is not an integer"
    if isinstance(n, _Long):
        return f"of {n.digits:,} digits is beyond the 64-bit range"
    return f"{n} is negative" if n < 0 else f"{n} is beyond the 64-bit range"


class LineNumbers:
    """The line of a position in ``text``, for positions asked in increasing order (the skipped lines of one
    pass): each newline is counted once, however many are asked."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.line = 1

    def __call__(self, pos: int) -> int:
        if pos < self.pos:
            self.pos, self.line = 0, 1
        self.line += self.text.count("\n", self.pos, pos)
        self.pos = pos
        return self.line


def sniff(text: str) -> str | None:
    """Which console log ``text`` is, or None."""
    if "step:" in text and _VERL_SNIFF.search(text):
        return "verl_console"
    for m in _DICT.finditer(text):
        d = _parse_dict(m.group())
        if d is not None and _classify(d) is not None:
            return "trl_console"
    if _step_lines(text, limit=1) or _metric_blocks(text, enough=_MIN_BLOCKS):
        return "console"
    return None


_TRACEBACK = "Traceback (most recent call last):"
_RAISED = re.compile(r"^(?P<exc>[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Failure|Timeout|Killed)\b[^\n]*)$", re.M)


def ended_by_traceback(text: str) -> str | None:
    """The exception a log ends with: its last traceback's final line (``KeyboardInterrupt``,
    ``torch.OutOfMemoryError: CUDA out of memory ...``) when no metrics were printed after it; None
    when the log does not end in a traceback (one a reward function printed mid-run is followed by
    more steps).

    >>> ended_by_traceback("{'loss': 0.1}\\nTraceback (most recent call last):\\n  File \\"t.py\\", line 3\\nKeyboardInterrupt\\n")
    'KeyboardInterrupt'
    """
    at = text.rfind(_TRACEBACK)
    if at < 0:
        return None
    m = _RAISED.search(text, at + len(_TRACEBACK))
    if m is None:
        return None
    if sniff(text[m.end():]) is not None:
        return None  # training went on (and logged) after it
    return m.group("exc").strip()[:200]


def read_console(path: Path, text: str | None = None, fmt: str | None = None, logging_steps: int | None = None,
                 label: str | None = None) -> Source:
    if text is None:
        text = decode_text(path.read_bytes())
    if fmt is None:
        fmt = sniff(text)
    src: Source | None = None
    if fmt == "trl_console":
        src = read_trl(path, text, logging_steps)
    elif fmt == "verl_console":
        src = read_verl(path, text)
    elif fmt == "console":
        src = read_step_lines(path, text, logging_steps)
    if src is not None:
        ending = ended_by_traceback(text)
        if ending:
            src.meta["ended_by"] = ending  # an interrupted run: analyze reports it as such
        crashed = read_crash(text)
        if crashed is not None and (ending or sniff(text[crashed.offset:]) is None):
            src.meta["crash"] = crashed.to_dict()  # what ended it, with the line it was read from
        return src
    raise SourceError(path, f"{label or 'text'} holds no training log (no printed metrics dicts, verl "
                            "'step:N - key:value' lines, or lines with a step counter and name: value pairs)")


# ------------------------------------------------------------------------------- dict parsing


def _parse_dict(span: str) -> dict[str, Any] | None:
    """One printed dict: JSON when it is plain, else ``ast.literal_eval`` of the span alone."""
    if "\n" in span or "\r" in span:
        span = span.replace("\r", "").replace("\n", "")  # hard-wrapped by a terminal
    if "\x1b" in span:
        span = strip_ansi(span)
    if '"' not in span and "\\" not in span:
        try:
            obj = loads_lenient(_plain_to_json(span))  # a step of thousands of digits stays, to be named
            if isinstance(obj, dict):
                return obj
        except (ValueError, RecursionError):
            pass
    if "(" in span:
        span = _TENSOR.sub(r"\1", _NP_SCALAR.sub(r"\1", span))
    if "nan" in span or "inf" in span:
        span = _BARE.sub(r"'\1'", span)
    try:
        obj = ast.literal_eval(span)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


def _plain_to_json(text: str, literals: bool = True) -> str:
    """A plain printed dict (no double quotes or backslashes) as JSON: value quotes dropped so
    ``'0.55'`` is a number; with ``literals``, nan/inf spelt as JSON's standard-library extension
    and True/False/None as JSON's."""
    text = text.replace("': '", "': ").replace("', '", ", '").replace("'}", "}").replace("'", '"')
    if literals:
        text = _json_literals(text)
    return text


def _json_literals(text: str) -> str:
    if "nan" in text or "inf" in text:
        text = (text.replace(": nan", ": NaN").replace(": -inf", ": -Infinity").replace(": inf", ": Infinity"))
    if "True" in text or "False" in text or "None" in text:
        text = text.replace(": True", ": true").replace(": False", ": false").replace(": None", ": null")
    return text


_KINDS: dict[tuple[Any, ...], str | None] = {}
_NUMERIC_TYPES = frozenset({int, float})


def _classify(d: dict[str, Any]) -> str | None:
    """``train``, ``eval`` or ``summary`` (the end-of-training dict) for a logged dict; None for any
    other dict the script printed (a config, kwargs). Worked out once per key set."""
    keys = tuple(d)
    kind = _KINDS.get(keys, False)
    if kind is False:
        kind = _kind_of_keys(keys)
        if len(_KINDS) < 4096:
            _KINDS[keys] = kind
    if kind is None:
        return None
    if set(map(type, d.values())) <= _NUMERIC_TYPES:
        return kind
    numeric = sum(1 for v in d.values() if to_number(v) is not None)
    return kind if numeric * 2 >= len(d) else None


def _kind_of_keys(keys: tuple[Any, ...]) -> str | None:
    if not keys or not all(isinstance(k, str) for k in keys):
        return None
    if not any(k in _TRAIN_KEYS or k.startswith(_TRAIN_PREFIXES) for k in keys):
        return None
    if "train_runtime" in keys or ("train_loss" in keys and "loss" not in keys and SUMMARY_KEYS.intersection(keys)):
        return "summary"
    if any(k.startswith("eval_") for k in keys) and all(k.startswith("eval_") or k in ("epoch", "step") for k in keys):
        return "eval"
    return "train"


# -------------------------------------------------------------------------------- TRL console


Found = list[tuple[int, dict[str, Any], str]]


def _all_dicts(text: str) -> Found:
    """``(position, dict, kind)`` of every printed log dict, one JSON parse for the common case."""
    parts = _DICT_SPLIT.split(text)  # gap, dict, gap, dict, ..., gap: the dicts and where they start
    if len(parts) < 3:
        return []
    ends = list(accumulate(map(len, parts)))
    texts = parts[1::2]
    spans = list(zip(ends[0::2], texts))
    del parts, ends
    texts[0] = "[" + texts[0]  # the JSON array's brackets, without copying 100 MB twice more
    texts[-1] = texts[-1] + "]"
    joined = ",".join(texts)
    del texts
    if ('"' not in joined and "\\" not in joined and "\n" not in joined and "\r" not in joined and "(" not in joined
            and "\x1b" not in joined):
        # Plain dicts: with double quotes they are JSON (bare nan, inf, True, None aside).
        plain = joined.replace("'", '"')
        del joined
        try:
            objs = loads(plain)
        except (ValueError, RecursionError):  # nan, inf, True, None: spelt the JSON way, then once more
            try:
                objs = loads(_json_literals(plain))
            except (ValueError, RecursionError):
                objs = None
        del plain
        if isinstance(objs, list) and len(objs) == len(spans) and all(type(o) is dict for o in objs):
            out = []
            # One dict of each key set is checked whole; the rest of a 100k-step log repeats it, and
            # its quoted numbers are read as floats by the normaliser, in the same pass that renames.
            kinds: dict[tuple[Any, ...], str | None] = {}
            for (pos, _), o in zip(spans, objs):
                keys = tuple(o)
                kind = kinds.get(keys, False)
                if kind is False:
                    kind = kinds[keys] = _classify(o)
                if kind is not None:
                    out.append((pos, o, kind))
            return out
    out = []
    for pos, span in spans:
        d = _parse_dict(span)
        if d is not None and (kind := _classify(d)) is not None:
            out.append((pos, d, kind))
    return out


def read_trl(path: Path, text: str, logging_steps: int | None = None, fmt: str = "trl_console") -> Source:
    found = _all_dicts(text)
    if not found:
        raise SourceError(path, "no printed metrics dict ({'loss': ..., 'reward': ...}) in the log")
    return steps_from_dicts(path, fmt, found, text, logging_steps)


def steps_from_dicts(path: Path, fmt: str, found: Found, text: str, logging_steps: int | None) -> Source:
    """A Source from logged dicts in order (``position`` in ``text`` for progress-bar hints).

    Dicts with a step field keep it; the others get k × logging_steps.
    """
    src = Source(path=path, format=fmt)
    found = _last_run(path, found, src)
    train: list[tuple[int, dict[str, Any]]] = []
    evals: list[tuple[int, int, dict[str, Any]]] = []  # (position, index of the train dict before it, dict)
    for pos, d, kind in found:
        if kind == "train":
            train.append((pos, d))
        elif kind == "summary":
            src.meta.setdefault("summary", {k: to_number(v) for k, v in d.items()})
        else:
            evals.append((pos, len(train), d))
    if not train:
        raise SourceError(path, "the log's dicts hold only a run summary or evaluations, no logged training step")
    fields = [_step_of(d) for _, d in train] if _step_of(train[0][1]) is not None else [None]
    own = [usable_step(v) for v in fields]
    skipped = Skipped()
    if all(v is not None for v in fields) and any(s is not None for s in own):
        # Every dict states its step: one whose step is no step (true, 3.5, -1) is a bad record, left out alone.
        lines_of = LineNumbers(text)
        for k, (step, value) in enumerate(zip(own, fields)):
            if step is None:
                skipped.add(f"{path}:{lines_of(train[k][0])}: a logged dict whose step is no step ({step_fault(value)})")
        steps: list[int | None] = own
        src.meta["steps_from"] = "the step field of each logged dict"
    else:
        L, how, first = _logging_steps(text, [p for p, _ in train], [d for _, d in train], src.meta.get("summary"),
                                       logging_steps, path, src.warnings)
        steps = [first + k * L for k in range(len(train))]
        if as_step(steps[-1]) is None:
            raise SourceError(path, f"logging_steps={L} ({how}) puts the logged dicts beyond the 64-bit step range")
        src.meta["logging_steps"] = L
        src.meta["steps_from"] = how
        src.warnings.append(f"{path}: the logged dicts carry no step; step = k x logging_steps with "
                            f"logging_steps={L} ({how})")
    table = StepTable()
    norm = Normalizer(drop=SUMMARY_KEYS, owned=True)  # the parsed dicts are ours to keep
    for step, (_, d) in zip(steps, train):
        if step is not None:
            table.add(step, norm(d))
    for _, idx, d in evals:
        at = usable_step(_step_of(d))
        if at is None:  # the train dict before it (the first, for one before any), passing over skipped ones
            k = idx - 1 if idx > 0 else 0
            while k > 0 and steps[k] is None:
                k -= 1
            at = steps[k] if steps[k] is not None else next((s for s in steps if s is not None), None)
        if at is not None:
            table.add(at, norm(d))
    note_skipped(src, skipped)
    finish(src, table, "dicts")
    L = src.meta.get("logging_steps")
    src.context = guess_context(src.metric_names(), L, [s for s, _ in src.steps])
    return src


def _last_run(path: Path, found: Found, src: Source) -> Found:
    """One log may hold several trainings (an SFT phase, then GRPO), each closed by its summary
    dict: the last one that logged steps is the run; the others are left out, and the source says so."""
    ends = [i for i, item in enumerate(found) if item[2] == "summary"]
    if not ends or ends == [len(found) - 1]:  # the common case: one training, closed by its summary or cut off
        return list(found)
    runs: list[Found] = [[]]
    for item in found:
        runs[-1].append(item)
        if item[2] == "summary":
            runs.append([])
    trained = [r for r in runs if any(kind != "summary" for _, _, kind in r)]
    if len(trained) <= 1:
        return list(found)
    with_reward = [r for r in trained if any(k.startswith("reward") for _, d, _ in r for k in d)]
    chosen = (with_reward or trained)[-1]
    left = sum(len(r) for r in trained if r is not chosen)
    src.meta["trainings_in_log"] = len(trained)
    src.warnings.append(f"{path}: the log holds {len(trained)} trainings (each closed by its summary); read the last "
                        f"one with rewards, {len(chosen)} dicts, and left out {left} of the others")
    return chosen


# A printed dict's own step field: TRL's spellings first, then any other step-like key.
_TRL_STEPS = ("step", "global_step", "train/global_step")
_DICT_STEPS = (*_TRL_STEPS, *(k for k in STEP_FIELDS if k not in _TRL_STEPS))


def _step_of(d: dict[str, Any]) -> Any:
    for key in _DICT_STEPS:
        if key in d:
            return d[key]
    return None


def _logging_steps(text: str, positions: list[int], dicts: list[dict[str, Any]], summary: dict[str, Any] | None,
                   given: int | None, path: Path, warnings: list[str]) -> tuple[int, str, int]:
    """The logging interval, where it came from, and the first dict's step; best evidence first."""
    first = positions[0] if positions else len(text)
    bars, sample = _sampled_bars(text, positions)
    total = _total_steps(text, bars, first)
    from_bar = _from_progress_positions(bars, total, positions, sample)
    printed = _printed_logging_steps(text, first, total)
    if printed is not None and (from_bar is None or from_bar[0] == printed):
        if given and given != printed:
            warnings.append(f"{path}: --logging-steps {given} ignored: the log's printed config says logging_steps={printed}")
        return printed, "from the printed config", from_bar[1] if from_bar else printed
    if from_bar is not None:
        L, start = from_bar
        if given and given != L:
            warnings.append(f"{path}: --logging-steps {given} ignored: the progress bar advances {L} steps between dicts")
        how = "from the progress bar's position at each logged dict"
        if start != L:
            how += f", the first at step {start} (a resumed run)"
        return L, how, start
    from_epoch = _from_epochs(text, total, dicts, summary)
    if from_epoch is not None:
        if given and given != from_epoch:
            warnings.append(f"{path}: --logging-steps {given} ignored: 'epoch' against the progress bar's total gives {from_epoch}")
        return from_epoch, "from 'epoch' against the progress bar's total", from_epoch
    if given and given > 0:
        return int(given), "as given by --logging-steps", int(given)
    return 1, "assumed: the log does not say; pass --logging-steps N", 1


def _printed_logging_steps(text: str, before: int, total: int | None) -> int | None:
    """The last ``logging_steps`` a config printout states before the first logged dict."""
    value = None
    for m in _LOGGING_STEPS.finditer(text, 0, before):
        value = m.group(1)
    if value is None:
        return None
    x = float(value)
    if not math.isfinite(x):
        return None
    if 0 < x < 1:  # transformers reads a fraction as a share of max_steps
        return math.ceil(total * x) if total else None
    n = int(x) if x == int(x) else None
    return n if n and n > 0 else None


def _bars(text: str, start: int = 0, end: int | None = None) -> list[tuple[int, int, int]]:
    """``(position, count, total)`` of every tqdm update."""
    return [(m.start(), _count(m.group(1)), _count(m.group(2)))
            for m in _TQDM.finditer(text, start, len(text) if end is None else end)]


def _sampled_bars(text: str, positions: list[int], n: int = 1000) -> tuple[list[tuple[int, int, int]], list[int]]:
    """The progress bars around the first and the last ``n`` dicts, and those dicts' indices: the
    bar's place at 2,000 dicts says as much as at 100,000, at a fiftieth of the scan."""
    K = len(positions)
    if K <= 2 * n:
        return _bars(text), list(range(K))
    bars = _bars(text, 0, positions[n - 1]) + _bars(text, positions[K - n - 1], positions[-1])
    return bars, [*range(n), *range(K - n, K)]


def _total_steps(text: str, bars: list[tuple[int, int, int]], before: int | None = None) -> int | None:
    """The run's step count: as the trainer's banner states it before training (the last banner before the
    first dict read: a log of an SFT stage and then GRPO prints one per training), else the total of the
    progress bar drawn most often."""
    m = None
    for m in _TOTAL_STEPS.finditer(text, 0, len(text) if before is None else before):
        pass
    if m:
        try:
            return int(m.group(1).replace(",", ""))
        except ValueError:
            pass
    totals: dict[int, int] = {}
    for _, _, total in bars:
        totals[total] = totals.get(total, 0) + 1
    return max(totals, key=lambda t: (totals[t], t)) if totals else None


def _from_progress_positions(bars: list[tuple[int, int, int]], total: int | None, positions: list[int],
                             sample: list[int]) -> tuple[int, int] | None:
    """Where the progress bar stands right before every (sampled) dict is first + k × L (an
    unbuffered log)."""
    if len(positions) < 2:
        return None
    bars = [b for b in bars if b[2] == total]
    if not bars:
        return None
    at = [b[0] for b in bars]
    counts = {}
    for k in sample:
        i = bisect_right(at, positions[k]) - 1
        if i < 0:
            return None
        counts[k] = bars[i][1]
    # Evenly spaced positions: the interval, and the first step (past 0 when the run was resumed
    # from a checkpoint and its bar started there).
    L = counts[1] - counts[0]
    if L < 1 or counts[0] < 1:
        return None
    if not all(c == counts[0] + k * L for k, c in counts.items()) or counts[0] % L:
        return None
    return L, counts[0]


def _from_epochs(text: str, total: int | None, dicts: list[dict[str, Any]], summary: dict[str, Any] | None) -> int | None:
    """``epoch`` of the k-th dict is k × L / steps_per_epoch: the L that fits every dict."""
    epochs = [to_number(d.get("epoch")) for d in dicts]
    if not total or len(dicts) < 1 or any(e is None for e in epochs):
        return None
    n_epochs = None
    m = _NUM_EPOCHS.search(text)
    if m:
        n_epochs = float(m.group(1).replace(",", ""))
    elif summary and summary.get("epoch"):
        n_epochs = float(summary["epoch"])
    else:
        n_epochs = float(math.ceil(max(epochs)))  # type: ignore[type-var]
    if not n_epochs or n_epochs <= 0:
        return None
    per_epoch = total / n_epochs
    K = len(epochs)
    guess = epochs[-1] * per_epoch / K  # type: ignore[operator]
    best: tuple[float, int] | None = None
    for L in {max(1, math.floor(guess)), max(1, math.ceil(guess)), max(1, round(guess) - 1), round(guess) + 1}:
        err = max(abs((k + 1) * L / per_epoch - e) for k, e in enumerate(epochs))  # type: ignore[operator]
        if best is None or err < best[0]:
            best = (err, L)
    # Printed epochs carry two decimals (or four significant digits): allow their rounding.
    if best is None or best[0] > 0.0151 or (K * best[1] > total * 1.01):
        return None
    return best[1]


# ------------------------------------------------------------------------------- verl console


def read_verl(path: Path, text: str) -> Source:
    if "\x1b" in text:
        text = strip_ansi(text)
    src = Source(path=path, format="verl_console")
    table = StepTable()
    norm = Normalizer(drop=SUMMARY_KEYS)
    skipped = Skipped()
    lines_of = LineNumbers(text)
    for m in _VERL_LINE.finditer(text):
        step = usable_step(m.group(1))
        if step is None:
            skipped.add(f"{path}:{lines_of(m.start(1))}: step:{_shown_count(_count(m.group(1)))}")
            continue
        metrics: dict[str, Any] = {}
        for part in m.group(2).split(" - "):
            key, sep, value = part.partition(":")
            key = key.strip()
            if not sep or not key:
                continue
            metrics[key] = _verl_value(value.strip())
        table.add(step, norm(metrics))
    if not len(table):
        raise SourceError(path, "no verl 'step:N - key:value' line with a step in range"
                          + (f" ({skipped.where[0]})" if skipped.where else ""))
    note_skipped(src, skipped)
    finish(src, table, "lines")
    src.context = guess_context(src.metric_names(), None, [s for s, _ in src.steps])
    config, model, estimator = verl_config(text)
    if config:
        src.context.config = {**config, **(src.context.config or {})}
        src.meta["config_from"] = f"the config verl printed ({len(config)} settings)"
        if (note := group_of_one_note(config, estimator)) is not None:
            src.warnings.append(f"{path}: {note}")
    if model:
        from grpo_monitor.readers.model import facts_for_id, set_model

        set_model(src, facts_for_id(model, f"the log (actor_rollout_ref.model.path {model})"))
    return src


def _verl_value(value: str) -> Any:
    m = _NP_SCALAR.fullmatch(value) or _TENSOR.fullmatch(value)
    if m:
        value = m.group(1).strip()
    try:
        return float(value)
    except ValueError:
        return value


# ------------------------------------------------------------------------ hand-written loops

_COUNTER = re.compile(
    r"(?P<epoch>\bepoch\W{0,3})?"
    r"(?:(?P<word>\b(?:global[_ ]?)?(?:step|iter(?:ation)?|it|update|batch)\b\s*[:=#]?\s*)(?P<n1>(?:(?<=[\s:=#])-)?\d+(?:\.\d+(?=\s*/\s*\d))?)"
    r"(?:\s*/\s*(?P<m1>\d+))?"
    r"|\((?P<n2>\d+)\s*/\s*(?P<m2>\d+)\)|\[(?P<n3>\d+)\s*/\s*(?P<m3>\d+)\])",
    re.IGNORECASE,
)
_EPOCH = re.compile(r"\bepoch\W{0,3}(\d+)(?:\s*/\s*(\d+))?", re.IGNORECASE)
_PAIR = re.compile(
    r"(?<![\w./@-])([A-Za-z_][\w./@-]*(?: [A-Za-z_][\w./@-]*){0,3})\s*[:=]\s*"
    r"([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?%?|[-+]?inf|nan)(?![\w.])",
    re.IGNORECASE,
)
_LEVEL = re.compile(r"^(?:INFO|DEBUG|WARNING|WARN|ERROR|CRITICAL|TRAIN|Train|train)\s+")  # "INFO loss: 0.3" is loss
_SKIP_NAMES = frozenset({"step", "steps", "epoch", "iter", "iteration", "it", "global step", "global_step", "batch", "update"})


def _counter(line: str) -> re.Match[str] | None:
    """The step counter of a line: of several (``Iteration 1/1, Step 5/500, GRPO iter 1/1``), the one that counts
    the most (the largest total; an outer loop of one iteration never advances), else the first."""
    found = [m for m in _COUNTER.finditer(line) if not m.group("epoch")]
    if len(found) < 2:
        return found[0] if found else None

    def total(m: re.Match[str]) -> int:
        t = m.group("m1") or m.group("m2") or m.group("m3")
        return _count(t) if t else 0

    return max(found, key=lambda m: (total(m), -m.start()))


def _metric_pairs(text: str) -> dict[str, float]:
    """The ``Name: value`` pairs of a line that prints metrics and nothing else (names that say what they
    measure), or {}."""
    pairs = list(_PAIR.finditer(text))
    if not pairs or not _FILLER.match(_LEVEL.sub("", _PAIR.sub(" ", text).lstrip())):
        return {}
    out: dict[str, float] = {}
    for pm in pairs:
        name = _LEVEL.sub("", pm.group(1).strip())
        if not _METRIC_WORDS.search(name):
            continue
        raw = pm.group(2)
        try:
            out[name] = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
        except ValueError:
            continue
    return out


def _step_lines(text: str, limit: int | None = None,
                loose: list[tuple[int, dict[str, float]]] | None = None,
                where: list[int] | None = None,
                ) -> list[tuple[tuple[Any, ...], int, int | None, int | None, dict[str, float], int]]:
    """``(family, n, total, epoch, metrics, offset)`` of every line with a step counter and a number pair
    (``offset``: where the line starts in ``text``); with
    ``loose``, the lines that print metrics alone (``Average Reward: 0.71`` between the step lines) go there as
    ``(line number, metrics)``, and each step line's number goes to ``where``."""
    out = []
    # The pieces ``re.split(r"[\r\n]+", text)`` gives, numbered as it numbers them, with where each starts.
    lead = 1 if text[:1] in ("\r", "\n") else 0
    for lineno, m in enumerate(_LINE.finditer(text), lead):
        line = m.group()
        if "\x1b" in line:
            line = strip_ansi(line)
        if len(line) > 20000 or not any(c.isdigit() for c in line):
            continue
        counter = _counter(line)
        if counter is None:
            if loose is not None and len(line) <= 2000:
                found = _metric_pairs(line)
                if found:
                    loose.append((lineno, found))
            continue
        n = _count(counter.group("n1") or counter.group("n2") or counter.group("n3"))
        total_s = counter.group("m1") or counter.group("m2") or counter.group("m3")
        total = _count(total_s) if total_s else None
        rest = line[: counter.start()] + " " + line[counter.end():]
        metrics: dict[str, float] = {}
        for pm in _PAIR.finditer(rest):
            name = _LEVEL.sub("", pm.group(1).strip())
            if name.lower() in _SKIP_NAMES or name.lower().startswith("epoch"):
                continue
            raw = pm.group(2)
            pct = raw.endswith("%")
            try:
                x = float(raw[:-1] if pct else raw)
            except ValueError:
                continue
            metrics[name] = x / 100 if pct else x
        if not metrics:
            continue
        em = _EPOCH.search(line)
        epoch = _count(em.group(1)) if em else None
        kind = "word" if counter.group("word") else ("paren" if counter.group("n2") else "bracket")
        word = (counter.group("word") or "").strip(" :=#").lower()
        family = (kind, word, total, tuple(sorted(metrics)))
        out.append((family, n, total, epoch, metrics, m.start()))
        if where is not None:
            where.append(lineno)
        if limit and len(out) >= limit:
            break
    return out


def _attach_loose(lines: list[Any], at: list[int], loose: list[tuple[int, dict[str, float]]]) -> tuple[int, str]:
    """Metrics printed on lines of their own beside each step line (``Average Reward: 0.71`` then
    ``Step 1/500, loss: 0.0``) join that step line: the one after them where they come first in the log, else
    the one before. ``at`` holds the step lines' line numbers, ``loose`` the others' with their metrics. Only
    names no step line prints itself, and only where they come about once per step line. Returns how many
    joined and which way."""
    if not loose or not lines:
        return 0, ""
    own = {k for line in lines for k in line[4]}
    loose = [(i, {k: v for k, v in m.items() if k not in own}) for i, m in loose]
    loose = [(i, m) for i, m in loose if m and at[0] - 2 * (at[-1] - at[0]) // max(1, len(at)) <= i]
    if not (0.5 * len(lines) <= len(loose) <= 1.5 * len(lines)):
        return 0, ""
    import bisect

    after = loose[0][0] < at[0]  # printed ahead of the first step line: each belongs to the next one
    joined = 0
    for i, m in loose:
        k = bisect.bisect_right(at, i) if after else bisect.bisect_left(at, i) - 1
        if 0 <= k < len(lines):
            lines[k][4].update({n: v for n, v in m.items() if n not in lines[k][4]})
            joined += 1
    return joined, "after" if after else "before"


def read_step_lines(path: Path, text: str, logging_steps: int | None = None) -> Source:
    loose: list[tuple[int, dict[str, float]]] = []
    where: list[int] = []
    lines = _step_lines(text, loose=loose, where=where)
    if not lines:
        blocks = _metric_blocks(text)
        if len(blocks) >= _MIN_BLOCKS:
            return _read_blocks(path, blocks, logging_steps)
        raise SourceError(path, "no line with a step counter (step 12, (12/500), [12/500]) and name: value pairs")
    # A loop is its counter and total; its keys may vary a little from line to line (an eval metric
    # every few steps), so families are grouped on the counter first, then the richest key set.
    counts: dict[tuple[Any, ...], int] = {}
    for family, *_ in lines:
        loop = family[:3]
        counts[loop] = counts.get(loop, 0) + 1
    loop = max(counts, key=lambda f: counts[f])
    chosen = [x for x in lines if x[0][:3] == loop]
    joined, way = _attach_loose(chosen, [w for x, w in zip(lines, where) if x[0][:3] == loop], loose)
    other = len(lines) - len(chosen)
    src = Source(path=path, format="console")
    table = StepTable()
    norm = Normalizer(drop=SUMMARY_KEYS)
    total = loop[2]
    epochs = [e for _, _, _, e, _, _ in chosen if e is not None]
    base = min(epochs) if epochs else None
    offset = 0
    skipped = Skipped()
    lines_of = LineNumbers(text)
    last_n: int | None = None
    last_epoch: int | None = None
    for _, n, _, epoch, metrics, at in chosen:
        if as_step(n) is None or n < 0:  # a damaged counter: no step to place the line at
            skipped.add(f"{path}:{lines_of(at)}: step counter {_shown_count(n)}")
            continue
        if epoch is not None and total and base is not None:
            step = (epoch - base) * total + n
        else:
            if last_n is not None and n < last_n and (epoch is None or epoch != last_epoch):
                offset += last_n  # the counter restarts each epoch
            step = offset + n
        last_n, last_epoch = n, epoch
        if as_step(step) is None or step < 0:
            skipped.add(f"{path}:{lines_of(at)}: step {_shown_count(step)} (epoch {epoch} of {total}-step epochs)")
            continue
        table.add(step, norm(metrics))
    if not len(table):
        raise SourceError(path, "no step counter line with a usable step" + (f" ({skipped.where[0]})" if skipped.where else ""))
    note_skipped(src, skipped)
    if other:
        src.warnings.append(
            f"{path}: read the {len(chosen)} lines of the most frequent step counter; "
            f"{other} line(s) of other counters (another phase, an evaluation) left out"
        )
    if joined:
        src.warnings.append(f"{path}: {joined} line(s) printing metrics alone joined the step line {way} them")
    finish(src, table, "lines")
    src.context = guess_context(src.metric_names(), None, [s for s, _ in src.steps])
    return src


# A loop that prints its metrics without a counter on the same line (``Average Reward: 0.71``, one
# or several lines per iteration, perhaps under a ``Step 5`` line): a record ends where a name comes
# again. A metric's name must say what it measures, and a loop repeats it: three records at least.
_MIN_BLOCKS = 3
_METRIC_WORDS = re.compile(r"(?i)reward|loss|\bkl\b|kl_|entropy|accura|\bacc\b|correct|\bfmt\b|format|length|\blen\b|score|"
                           r"return|grad")
_FILLER = re.compile(r"^[\s,;|:\-*>#=\[\]()]*$")


def _metric_blocks(text: str, enough: int | None = None) -> list[tuple[int | None, dict[str, float]]]:
    """``(counter, metrics)`` of each record printed as lines of nothing but ``Name: value`` pairs;
    ``counter`` is the step of a counter-only line just above it (``Step 5``, ``Iteration 5/100``)."""
    records: list[tuple[int | None, dict[str, float]]] = []
    current: dict[str, float] = {}
    counter: int | None = None
    pending: int | None = None

    def flush() -> None:
        nonlocal current, counter
        if current:
            records.append((counter, current))
        current, counter = {}, None

    for line in re.split(r"[\r\n]+", text):
        if enough is not None and len(records) >= enough:
            break
        if len(line) > 2000 or not any(c.isdigit() for c in line):
            continue
        if "\x1b" in line:
            line = strip_ansi(line)
        pairs = list(_PAIR.finditer(line))
        if not pairs:
            m = next((c for c in _COUNTER.finditer(line) if not c.group("epoch")), None)
            if m is not None and _FILLER.match(line[: m.start()] + line[m.end():]):
                flush()
                pending = _count(m.group("n1") or m.group("n2") or m.group("n3"))
            continue
        if not _FILLER.match(_LEVEL.sub("", _PAIR.sub(" ", line).lstrip())):
            continue  # prose with a number in it, not a metrics line
        for pm in pairs:
            name = _LEVEL.sub("", pm.group(1).strip())
            if not _METRIC_WORDS.search(name):  # "Answer: 42" in a printed completion measures nothing
                continue
            raw = pm.group(2)
            try:
                x = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
            except ValueError:
                continue
            if name in current:
                flush()
            if not current:
                counter, pending = pending, None
            current[name] = x
    flush()
    return records


def _read_blocks(path: Path, blocks: list[tuple[int | None, dict[str, float]]], logging_steps: int | None) -> Source:
    # The loop is the key set printed most often; another (an evaluation every few iterations) is left out.
    counts: dict[tuple[str, ...], int] = {}
    for _, m in blocks:
        counts[tuple(sorted(m))] = counts.get(tuple(sorted(m)), 0) + 1
    keys = max(counts, key=lambda k: (counts[k], len(k)))
    chosen = [(c, m) for c, m in blocks if tuple(sorted(m)) == keys]
    src = Source(path=path, format="console")
    counters = [c for c, _ in chosen]
    if all(c is not None for c in counters) and all(b > a for a, b in zip(counters, counters[1:])):
        steps: list[int] = counters  # type: ignore[assignment]
        src.meta["steps_from"] = "the counter line above each record"
    else:
        L = logging_steps if logging_steps and logging_steps > 0 else 1
        how = "as given by --logging-steps" if logging_steps else "assumed: the log does not say; pass --logging-steps N"
        steps = [(k + 1) * L for k in range(len(chosen))]
        src.meta.update(logging_steps=L, steps_from=how)
        src.warnings.append(f"{path}: the printed metrics carry no step; step = k x logging_steps with "
                            f"logging_steps={L} ({how})")
    table = StepTable()
    norm = Normalizer(drop=SUMMARY_KEYS)
    skipped = Skipped()
    for k, (step, (_, metrics)) in enumerate(zip(steps, chosen)):
        if usable_step(step) is not None:
            table.add(step, norm(metrics))
        else:
            skipped.add(f"{path}: printed record {k + 1}: step counter {_shown_count(step)}")
    note_skipped(src, skipped)
    if len(chosen) < len(blocks):
        src.warnings.append(f"{path}: read the {len(chosen)} records printing {', '.join(keys)}; "
                            f"{len(blocks) - len(chosen)} other record(s) left out")
    finish(src, table, "records")
    src.context = guess_context(src.metric_names(), src.meta.get("logging_steps"), [s for s, _ in src.steps])
    return src


class ConsoleReader(Reader):
    name = "console"
    formats = ("trl_console", "verl_console", "console")
    describes = "a console log with printed metrics dicts or step lines"

    def sniff(self, probe: Probe) -> str | None:
        return sniff(probe.text()) if probe.layout == "text" else None

    def read(self, probe: Probe, fmt: str) -> Source:
        from grpo_monitor.readers.model import model_in_text, set_model

        text = probe.text()
        src = read_console(probe.path, text, fmt, probe.logging_steps)
        set_model(src, model_in_text(text, "the log"))
        return src
