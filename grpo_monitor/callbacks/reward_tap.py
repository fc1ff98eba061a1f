"""The reward tap: records every completion's reward components without touching the rewards.

TRL calls each reward function with the same ``prompts``, ``completions`` and ``completion_ids``
objects for one generation batch. The tap wraps each function, lets it run exactly as before
(its exceptions propagate unchanged, its return value is passed through), and then records one
sample per completion: position in the global batch, group, token length, truncation, the
reward of each component, and what the detectors read from the text, measured on the whole
completion while it is whole (``chars``, ``tail_rep``: repeated 4-gram share of its last 200
words, ``text_hash``: a fingerprint of the whole text, ``top_word``: the share of those words taken
by the commonest one, recorded only where it is high), ``distinct_tokens`` (distinct token ids of the
completion, up to 64: ``!!!!`` to the cap is one) and ``other_script`` (share of its letters in another script than
its prompt's). Text itself is kept only for the
completions a ``SampleRetention`` policy picks, as an excerpt of its head and tail.
Recording failures are reported by the owner's error handler and never reach the trainer.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import math
import pickle
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from grpo_monitor.detectors.language_mixing import dominant_script, other_script_share
from grpo_monitor.core.finding_samples import notable
from grpo_monitor.detectors.signals import TOP_WORD_RECORDED, repeated_ngram_share, sample_reward, text_hash, top_word_share
from grpo_monitor.detectors.numbers import to_number

def _text(x: Any) -> str:
    """Prompts and completions are strings, or chat messages in conversational datasets."""
    if isinstance(x, str):
        return x
    if isinstance(x, list) and x and isinstance(x[-1], dict) and "content" in x[-1]:
        content = x[-1]["content"]
        return content if isinstance(content, str) else json.dumps(content, default=str)
    return json.dumps(x, default=str)


class _Batch:
    __slots__ = ("ids", "prompts", "completions", "rewards", "signals", "extra")

    def __init__(self, ids: Any, prompts: Any, completions: Any) -> None:
        self.ids = ids  # held so its id() cannot be reused by a later batch
        self.prompts = prompts
        self.completions = completions
        self.rewards: dict[str, list[float | None]] = {}
        self.signals: Any = None  # a Future of text_signals(completions), or None
        self.extra: Any = None  # a Future of extra_signals(prompts, completions, ids), or None


def text_signals(completions: Sequence[Any]) -> list[tuple[int, float | None, int, float | None] | None]:
    """``(chars, tail_rep, text_hash, top_word)`` of each whole completion (None where there is
    none; ``top_word`` None below ``TOP_WORD_RECORDED``)."""
    out: list[tuple[int, float | None, int, float | None] | None] = []
    for c in completions:
        if c is None:
            out.append(None)
            continue
        text = c if type(c) is str else _text(c)
        rep = repeated_ngram_share(text)
        # A text that one word dominates repeats its 4-grams ("w w w w x" over and over: 0.18):
        # the words of the others, nearly all of them, are not counted.
        top = top_word_share(text) if rep is not None and rep >= 0.1 else None
        out.append((len(text), rep, text_hash(text), top if top is not None and top >= TOP_WORD_RECORDED else None))
    return out


DISTINCT_CAP = 64


def distinct_tokens(ids: list[int]) -> int:
    """Distinct token ids of a completion, counted up to ``DISTINCT_CAP``: what tells one token repeated
    (``!!!!``, one) from text (dozens or more). A completion's first few hundred tokens already hold that
    many distinct ids unless it is degenerate, so only a degenerate one is read whole.

    >>> distinct_tokens([7] * 9000), distinct_tokens(list(range(9000)))
    (1, 64)
    """
    if len(set(ids[: 4 * DISTINCT_CAP])) >= DISTINCT_CAP:
        return DISTINCT_CAP
    return min(len(set(ids)), DISTINCT_CAP)


def extra_signals(prompts: Sequence[Any] | None, completions: Sequence[Any] | None,
                  ids: Sequence[Any]) -> list[tuple[int | None, float | None]]:
    """``(distinct_tokens, other_script)`` of each completion: its distinct token ids up to
    ``DISTINCT_CAP`` (None when the ids are not a list) and the share of its letters in another script
    than its prompt's (None when either has no letters)."""
    n = len(ids)
    scripts: dict[int, str | None] = {}
    out: list[tuple[int | None, float | None]] = []
    for i in range(n):
        seq = ids[i]
        distinct = distinct_tokens(seq) if type(seq) is list else None
        other = None
        p = prompts[i] if prompts is not None and i < len(prompts) else None
        c = completions[i] if completions is not None and i < len(completions) else None
        if p is not None and c is not None:
            key = id(p)  # a group's completions share one prompt object: its script is read once
            if key not in scripts:
                scripts[key] = dominant_script(p if type(p) is str else _text(p))
            other = other_script_share(c if type(c) is str else _text(c), scripts[key])
        out.append((distinct, other))
    return out


class RewardTap:
    def __init__(
        self,
        names: Sequence[str],
        num_generations: int,
        eos_and_pad: Sequence[int],
        process_index: int = 0,
        correctness_reward: str | None = None,
        correct_threshold: float = 0.0,
        max_text_chars: int = 2000,
        on_error: Callable[[str, BaseException], None] | None = None,
        background: bool = True,
        training: Callable[[], bool] | None = None,
    ) -> None:
        self.names = list(names)
        # Whether the trainer is training now: TRL scores an evaluation's completions with the same reward
        # functions, and those are the held-out prompts' completions, not the next training step's samples.
        self.training = training
        self.num_generations = max(1, int(num_generations))
        self.eos_and_pad = set(int(t) for t in eos_and_pad if t is not None)
        self.process_index = int(process_index)
        self.correctness_reward = correctness_reward
        self.correct_threshold = float(correct_threshold)
        self.max_text_chars = int(max_text_chars)
        self._on_error = on_error
        self._current: _Batch | None = None
        self._done: list[_Batch] = []
        self._texts: list[tuple[Any, Any]] = []  # (prompt, completion) of the last drain's records
        # The text signals of a batch are measured on a worker thread from the moment the batch
        # is scored: the trainer's forward and backward passes (GPU work that releases the
        # interpreter) run meanwhile, and the log that needs them finds them done.
        self.background = bool(background)
        self._pool: Any = None

    def wrap(self, func: Callable[..., Any], name: str) -> Callable[..., Any]:
        tap = self
        if inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(getattr(func, "__call__", None)):

            @functools.wraps(func)
            async def async_wrapped(*args: Any, **kwargs: Any) -> Any:
                out = await func(*args, **kwargs)
                tap._observe(name, kwargs, out)
                return out

            async_wrapped.__grpo_monitor_tap__ = func  # type: ignore[attr-defined]
            return async_wrapped

        @functools.wraps(func)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            out = func(*args, **kwargs)
            tap._observe(name, kwargs, out)
            return out

        wrapped.__grpo_monitor_tap__ = func  # type: ignore[attr-defined]
        if not hasattr(wrapped, "__name__"):  # functools.partial and callable objects
            wrapped.__name__ = name  # type: ignore[attr-defined]
        return wrapped

    def _observe(self, name: str, kwargs: dict[str, Any], out: Any) -> None:
        try:
            ids = kwargs.get("completion_ids")
            if ids is None or (self.training is not None and not self.training()):
                return
            if self._current is None or self._current.ids is not ids:
                if self._current is not None:
                    self._done.append(self._current)
                self._current = _Batch(ids, kwargs.get("prompts"), kwargs.get("completions"))
                self._start_signals(self._current)
            self._current.rewards[name] = [to_number(v, bools=True) for v in out]
        except Exception as exc:
            if self._on_error is not None:
                self._on_error("reward tap", exc)

    def _start_signals(self, batch: _Batch) -> None:
        if not self.background or not batch.completions:
            return
        try:
            if self._pool is None:
                from concurrent.futures import ThreadPoolExecutor

                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grpo-monitor-tap")
            batch.signals = self._pool.submit(text_signals, batch.completions)
            batch.extra = self._pool.submit(extra_signals, batch.prompts, batch.completions, batch.ids)
        except Exception:  # no thread to be had (interpreter shutting down): measured at the log
            self.background = False
            batch.signals = batch.extra = None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def drain(self, step: int) -> list[dict[str, Any]]:
        """Every completion scored since the last drain, as sample records of ``step`` (numbers
        only: ``add_text`` adds the excerpts a retention policy keeps)."""
        batches = self._done + ([self._current] if self._current is not None else [])
        self._done, self._current = [], None
        records: list[dict[str, Any]] = []
        texts: list[tuple[Any, Any]] = []
        for batch in batches:
            records.extend(self._records(batch, step, texts))
        self._texts = texts
        return records

    def _records(self, batch: _Batch, step: int, texts: list[tuple[Any, Any]]) -> list[dict[str, Any]]:
        ids = batch.ids
        n = len(ids)
        prompts = batch.prompts or [None] * n
        completions = batch.completions or [None] * n
        base = self.process_index * n
        eos = self.eos_and_pad
        rank = self.process_index
        G = self.num_generations
        reward_items = list(batch.rewards.items())
        signals = None
        if batch.signals is not None:
            try:
                signals = batch.signals.result()
            except Exception as exc:  # measured again here; the failure is reported once
                if self._on_error is not None:
                    self._on_error("reward tap", exc)
        if signals is None or len(signals) != n:
            signals = text_signals([completions[i] for i in range(n)])
        extra = None
        if batch.extra is not None:
            try:
                extra = batch.extra.result()
            except Exception as exc:
                if self._on_error is not None:
                    self._on_error("reward tap", exc)
        if extra is None or len(extra) != n:
            extra = extra_signals(batch.prompts, batch.completions, ids)
        correct_vals = batch.rewards.get(self.correctness_reward) if self.correctness_reward is not None else None
        threshold = self.correct_threshold
        out = []
        for i in range(n):
            seq = ids[i]
            rewards = {name: (vals[i] if i < len(vals) else None) for name, vals in reward_items}
            correct = None
            if correct_vals is not None and i < len(correct_vals):
                v = correct_vals[i]
                if v is not None and not math.isnan(v):
                    correct = v > threshold
            index = base + i
            L = len(seq)
            record = {
                "step": int(step),
                "rank": rank,
                "index": index,
                "group": index // G,
                "length": L,
                "truncated": bool(L and int(seq[-1]) not in eos),
                "rewards": rewards,
                "correct": correct,
            }
            c = completions[i]
            sig = signals[i]
            if sig is not None:
                record["chars"], record["tail_rep"], record["text_hash"], top = sig
                if top is not None:
                    record["top_word"] = top
            distinct, other = extra[i]
            if distinct is not None:
                record["distinct_tokens"] = distinct
            if other is not None:
                record["other_script"] = other
            out.append(record)
            texts.append((prompts[i], c))
        return out

    def add_text(self, records: Sequence[dict[str, Any]], keep: Callable[[dict[str, Any]], bool] | None = None) -> int:
        """Add the prompt and completion excerpts to the records of the last drain that ``keep``
        accepts (all of them without ``keep``), then let go of the texts. Returns how many."""
        texts, self._texts = self._texts, []
        limit = self.max_text_chars
        added = 0
        for record, (p, c) in zip(records, texts):
            if keep is not None and not keep(record):
                continue
            record["prompt"] = excerpt(_text(p), limit) if p is not None else ""
            record["completion"] = excerpt(_text(c), limit) if c is not None else ""
            added += 1
        return added


def excerpt(text: str, limit: int) -> str:
    """The text, or its head and tail (``limit`` characters together) around a marker saying how
    much was left out: long chains of thought go wrong at their end.

    >>> print(excerpt("abcdefghij", 4))
    ab
    [… 6 characters omitted …]
    ij
    >>> excerpt("short", 10)
    'short'
    """
    if len(text) <= limit:
        return text
    if limit <= 0:
        return ""
    head = limit // 2
    tail = limit - head
    return f"{text[:head]}\n[… {len(text) - limit} characters omitted …]\n{text[len(text) - tail:]}"


# -- retention ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SampleRetention:
    """Which completions keep their text in the samples files (every completion keeps its numbers).

    Per logging step, across all ranks: ``fair`` completions (first those a finding would point at,
    ``core.finding_samples.notable``: the longest, the most repetitive, a group scored all alike, the
    best; the rest drawn at random, seeded by the step), the best and the worst completion (by total
    reward) of ``groups`` groups drawn at random, and up to ``truncated`` of the completions cut at
    the length cap. A step with at most ``fair`` completions keeps all of them. ``all=True`` keeps every completion's text.
    Each kept text is an excerpt of ``max_text_chars`` (the head and the tail).
    """

    fair: int = 32
    groups: int = 8
    truncated: int = 4
    all: bool = False

    @classmethod
    def of(cls, value: Any) -> SampleRetention:
        if value is None or value == "default":
            return cls()
        if isinstance(value, cls):
            return value
        if value == "all":
            return cls(all=True)
        if value == "none":
            return cls(fair=0, groups=0, truncated=0)
        if isinstance(value, Mapping):
            return cls(**dict(value))
        raise ValueError(f"sample_text must be 'default', 'all', 'none', a dict or a SampleRetention, got {value!r}")

    def __post_init__(self) -> None:
        for name in ("fair", "groups", "truncated"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"SampleRetention.{name} must be an integer >= 0, got {v!r}")

    def select(self, samples: Sequence[Mapping[str, Any]], step: int) -> set[tuple[int, int]]:
        """The ``(rank, index)`` of the step's completions whose text is kept. Every rank picks
        the same from the same merged numbers, so a rank only writes the text of its own picks."""
        keys = [(_int(s.get("rank")), _int(s.get("index"))) for s in samples]
        if self.all or len(samples) <= self.fair:
            return set(keys)
        rng = random.Random(f"grpo-monitor-samples:{int(step)}")
        # A few of the fair slots go to the completions a finding points at (the longest, the most
        # repetitive, a group scored all alike, the best): the same number kept, the telling ones among them.
        reserved = notable(samples)[:self.fair]
        taken = set(reserved)
        rest = [i for i in range(len(samples)) if i not in taken]
        keep = {keys[i] for i in reserved} | {keys[i] for i in rng.sample(rest, self.fair - len(reserved))}
        if self.groups:
            groups: dict[Any, list[int]] = {}
            for i, s in enumerate(samples):
                groups.setdefault(s.get("group"), []).append(i)
            names = sorted(groups, key=lambda g: (str(type(g)), g if isinstance(g, int) else str(g)))
            for g in rng.sample(names, min(self.groups, len(names))):
                scored = [(r, i) for i in groups[g] if (r := sample_reward(samples[i])) is not None]
                if scored:
                    keep.add(keys[min(scored, key=lambda t: (t[0], t[1]))[1]])
                    keep.add(keys[max(scored, key=lambda t: (t[0], -t[1]))[1]])
        if self.truncated:
            cut = [i for i, s in enumerate(samples) if s.get("truncated") is True]
            keep.update(keys[i] for i in rng.sample(cut, min(self.truncated, len(cut))))
        return keep


def _int(v: Any) -> int:
    return v if type(v) is int else -1


# -- the rank exchange -------------------------------------------------------------------------
# Ranks exchange each completion's numbers in one packed array (never text): 60 bytes plus 8 per
# reward component, whatever the completion's length.

_FIXED = [("index", "<i8"), ("group", "<i8"), ("length", "<i4"), ("chars", "<i4"), ("rank", "<i2"),
          ("truncated", "u1"), ("correct", "i1"), ("flags", "u1"), ("tail_rep", "<f8"), ("text_hash", "<i8"),
          ("top_word", "<f8"), ("distinct_tokens", "<i4"), ("other_script", "<f8")]
_HAS_TEXT = 1  # flags: the record carries text signals (chars, tail_rep, text_hash)


def pack_samples(samples: Sequence[Mapping[str, Any]]) -> tuple[int, list[str], bytes, bytes]:
    """One rank's sample records as ``(step, reward names, packed numbers, presence bits)``."""
    names: list[str] = []
    for s in samples:
        for k in s.get("rewards") or ():
            if k not in names:
                names.append(k)
    n = len(samples)
    arr = np.zeros(n, dtype=_FIXED + [(f"r{j}", "<f8") for j in range(len(names))])
    present = np.zeros((n, max(1, len(names))), dtype=bool)
    cols: dict[str, list[Any]] = {f: [] for f, _ in _FIXED}
    rcols: list[list[float]] = [[] for _ in names]
    for i, s in enumerate(samples):
        has = "tail_rep" in s
        cols["index"].append(_int(s.get("index")))
        cols["group"].append(_int(s.get("group")))
        cols["length"].append(_int(s.get("length")))
        cols["chars"].append(_int(s.get("chars")))
        cols["rank"].append(_int(s.get("rank")))
        cols["truncated"].append(bool(s.get("truncated")))
        c = s.get("correct")
        cols["correct"].append(1 if c is True else 0 if c is False else -1)
        cols["flags"].append(_HAS_TEXT if has else 0)
        t = s.get("tail_rep")
        cols["tail_rep"].append(t if isinstance(t, float) else math.nan)
        h = s.get("text_hash")
        cols["text_hash"].append(h if type(h) is int else -1)
        w = s.get("top_word")
        cols["top_word"].append(w if isinstance(w, float) else math.nan)
        d = s.get("distinct_tokens")
        cols["distinct_tokens"].append(d if type(d) is int and d >= 0 else -1)
        o = s.get("other_script")
        cols["other_script"].append(float(o) if isinstance(o, (int, float)) and not isinstance(o, bool) else math.nan)
        rewards = s.get("rewards") or {}
        for j, name in enumerate(names):
            v = rewards.get(name, _ABSENT)
            if v is not _ABSENT:
                present[i, j] = True
            rcols[j].append(math.nan if v is None or v is _ABSENT else float(v))
    for f, vals in cols.items():
        arr[f] = vals
    for j, vals in enumerate(rcols):
        arr[f"r{j}"] = vals
    step = samples[0].get("step") if n else 0
    return (step if type(step) is int else 0), names, arr.tobytes(), np.packbits(present).tobytes()


_ABSENT = object()


def unpack_samples(packed: tuple[int, list[str], bytes, bytes]) -> list[dict[str, Any]]:
    """The records ``pack_samples`` packed, numbers only (a NaN reward comes back as None)."""
    step, names, data, bits = packed
    dtype = np.dtype(_FIXED + [(f"r{j}", "<f8") for j in range(len(names))])
    arr = np.frombuffer(data, dtype=dtype)
    n = len(arr)
    present = np.unpackbits(np.frombuffer(bits, dtype=np.uint8))[: n * max(1, len(names))].reshape(n, max(1, len(names)))
    cols = {f: arr[f].tolist() for f, _ in _FIXED}
    rcols = [arr[f"r{j}"].tolist() for j in range(len(names))]
    pres = present.tolist()
    out = []
    for i in range(n):
        rewards = {}
        for j, name in enumerate(names):
            if pres[i][j]:
                v = rcols[j][i]
                rewards[name] = None if v != v else v
        c = cols["correct"][i]
        rec: dict[str, Any] = {
            "step": step, "rank": cols["rank"][i], "index": cols["index"][i], "group": cols["group"][i],
            "length": cols["length"][i], "truncated": bool(cols["truncated"][i]), "rewards": rewards,
            "correct": True if c == 1 else False if c == 0 else None,
        }
        if cols["flags"][i] & _HAS_TEXT:
            t = cols["tail_rep"][i]
            rec["chars"] = cols["chars"][i]
            rec["tail_rep"] = None if t != t else t
            rec["text_hash"] = cols["text_hash"][i]
            w = cols["top_word"][i]
            if w == w:
                rec["top_word"] = w
        d = cols["distinct_tokens"][i]
        if d >= 0:
            rec["distinct_tokens"] = d
        o = cols["other_script"][i]
        if o == o:
            rec["other_script"] = o
        out.append(rec)
    return out


def exchange_size(payload: Any) -> int:
    """Bytes one rank sends for ``payload`` through ``all_gather_object`` (its pickle)."""
    return len(pickle.dumps(payload))
