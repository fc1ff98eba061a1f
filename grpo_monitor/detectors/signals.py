"""Reading the signals detectors share: metric values, the correctness series, tracked levels.

>>> resolve_correctness(RunContext(), ["reward", "rewards/format_reward/mean", "rewards/accuracy_reward/mean"])
('rewards/accuracy_reward/mean', 'accuracy_reward')
>>> resolve_correctness(RunContext(correctness_reward="exact"), [])
('rewards/exact/mean', 'exact')
>>> resolve_correctness(RunContext(), ["reward"])
('reward', None)
"""

from __future__ import annotations

import functools
import math
import random
import re
import zlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from grpo_monitor.detectors.base import RunContext
from grpo_monitor.detectors.numbers import finite
from grpo_monitor.detectors.stats import SettledBaseline, Window, log_ratio, mad_sigma, median

_CORRECT_HINT = re.compile(r"correct|accura|(^|[^a-z])acc([^a-z]|$)|exact|match|answer", re.IGNORECASE)
_FORMAT_HINT = re.compile(r"format|(^|[^a-z])fmt([^a-z]|$)|xml|tag|schema|struct", re.IGNORECASE)
_LENGTH_HINT = re.compile(r"len|overlong|long|short|token", re.IGNORECASE)


def get(metrics: Mapping[str, Any], key: str) -> float | None:
    """A finite value of one metric, or None (missing key, gap, NaN or inf)."""
    return finite(metrics.get(key))


def names_like(metrics: Mapping[str, Any], prefix: str, suffix: str = "") -> tuple[str, ...]:
    """The names logged in ``metrics`` that start with ``prefix`` and end with ``suffix``, in logged order.

    A run logs the same names step after step while several detectors look for a family of them
    (``rewards/*/mean``, ``moe/*``, ``eval_rewards/*/mean``) at every step, so the answer is kept per
    set of names rather than found again by a scan of every name.

    >>> names_like({"reward": 0.5, "rewards/acc/mean": 0.5, "rewards/acc/std": 0.1}, "rewards/", "/mean")
    ('rewards/acc/mean',)
    """
    return _names_like(tuple(metrics), prefix, suffix)


@functools.lru_cache(maxsize=512)
def _names_like(names: tuple[Any, ...], prefix: str, suffix: str) -> tuple[str, ...]:
    return tuple(k for k in names if isinstance(k, str) and k.startswith(prefix) and k.endswith(suffix))


def batch_size_hint(shares: Iterable[float], most: int = 16) -> int | None:
    """The number of completions a logged share was counted over, where every share reads as ``k / n`` for
    one small ``n`` (``completions/clipped_ratio`` of a two-completion batch is 0, 0.5 or 1); None when the
    shares are finer than ``most`` or too few differ from 0 and 1 to tell.

    >>> batch_size_hint([0.0, 0.5, 1.0, 0.5, 0.0]), batch_size_hint([0.25, 0.75, 0.5]), batch_size_hint([0.13, 0.5])
    (2, 4, None)
    """
    vals = [v for v in shares if 0.0 < v < 1.0]
    if not vals:
        return None
    for n in range(2, most + 1):
        if all(abs(v * n - round(v * n)) < 1e-6 for v in vals):
            return n
    return None


def completions_per_step(config: Mapping[str, Any] | None, shares: Iterable[float] = ()) -> int | None:
    """How many completions one logged step averages over: read off its shares (``batch_size_hint``), else
    from the config (``per_device_train_batch_size`` times ``gradient_accumulation_steps``, at least one group
    of ``num_generations`` per micro-batch, one process: a lower bound; ``generation_batch_size`` where no
    per-device batch is given); None when neither tells.

    >>> completions_per_step({"per_device_train_batch_size": 1, "num_generations": 2}), completions_per_step({})
    (2, None)
    >>> completions_per_step({"per_device_train_batch_size": 8}, [0.0, 0.25, 0.75])
    4
    >>> completions_per_step({"generation_batch_size": 8, "num_generations": 4})
    8
    """
    hint = batch_size_hint(shares)
    if hint is not None:
        return hint
    cfg = config or {}

    def setting(name: str) -> int | None:
        v = cfg.get(name)
        return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None

    per_device, groups = setting("per_device_train_batch_size"), setting("num_generations")
    if per_device is None and setting("generation_batch_size") is not None:
        return setting("generation_batch_size")  # a trainer that states the batch outright (verl: prompts x n)
    if per_device is None and groups is None:
        return None
    return max(per_device or 0, groups or 0) * (setting("gradient_accumulation_steps") or 1)


def component_key(name: str) -> str:
    return f"rewards/{name}/mean"


def reward_names_in(keys: Iterable[str]) -> list[str]:
    """The reward functions whose mean is logged among ``keys`` (``rewards/<name>/mean``), in logged order."""
    names = (k[len("rewards/"):-len("/mean")] for k in _names_like(tuple(keys), "rewards/", "/mean"))
    return [n for n in names if n and "/" not in n]


def reward_roles(names: Iterable[str]) -> tuple[str | None, str | None]:
    """Which reward function measures correctness and which the format, guessed from their names: the
    one guess made live (``attach``) and offline (every reader, every detector).

    A name that speaks of format (``format``, ``fmt``, ``xml``, ``tag``, ``schema``, ``struct``) is the
    format reward, never correctness, even when it also says ``correct`` (``format_correct`` pays for a
    correct format); correctness is the first other name that says so (``correct``, ``accuracy``,
    ``acc``, ``exact``, ``match``, ``answer``).

    >>> reward_roles(["format_correct", "answer_match"]), reward_roles(["math_match", "fmt"])
    (('answer_match', 'format_correct'), ('math_match', 'fmt'))
    >>> reward_roles(["has_answer_tag", "subtraction_is_right"])
    (None, 'has_answer_tag')
    """
    names = [n for n in dict.fromkeys(names) if isinstance(n, str)]
    fmt = next((n for n in names if _FORMAT_HINT.search(n)), None)
    correct = next((n for n in names if _CORRECT_HINT.search(n) and not _FORMAT_HINT.search(n)), None)
    return correct, fmt


def resolve_correctness(context: RunContext, keys: Iterable[str]) -> tuple[str, str | None]:
    """The metric that measures correctness: the declared correctness reward, else the reward component
    ``reward_roles`` takes for correctness, else the total ``reward``."""
    if context.correctness_reward:
        return component_key(context.correctness_reward), context.correctness_reward
    name, _ = reward_roles([*(context.reward_names or []), *reward_names_in(keys)])
    return ("reward", None) if name is None else (component_key(name), name)


def is_length_name(name: str) -> bool:
    return bool(_LENGTH_HINT.search(name)) and not _CORRECT_HINT.search(name)


class CorrectnessSource:
    """Resolves the correctness metric once a reward component names it, then sticks to it.

    Until a component appears the total reward stands in; the choice only ever moves from the total
    to a component (never back), so replays are deterministic.
    """

    def __init__(self, context: RunContext) -> None:
        self.context = context
        self.key, self.name = resolve_correctness(context, ())
        self.fixed = self.key != "reward"
        self._seen_keys = -1

    def value(self, metrics: Mapping[str, Any]) -> float | None:
        # Re-resolve only when the set of logged keys may have changed (cheap proxy: its size).
        if not self.fixed and len(metrics) != self._seen_keys:
            self._seen_keys = len(metrics)
            key, name = resolve_correctness(self.context, metrics.keys())
            if key != "reward":
                self.key, self.name, self.fixed = key, name, True
        return get(metrics, self.key)

    def sample_value(self, sample: Mapping[str, Any]) -> float | None:
        """Per-completion correctness: the ``correct`` flag, else the correctness component."""
        c = sample.get("correct")
        if isinstance(c, bool):
            return 1.0 if c else 0.0
        rewards = sample.get("rewards")
        if isinstance(rewards, Mapping):
            if self.name is not None:
                return finite(rewards.get(self.name))
            vals = [finite(v) for v in rewards.values()]
            vals = [v for v in vals if v is not None]
            return sum(vals) if vals else None
        return None


def sample_reward(sample: Mapping[str, Any]) -> float | None:
    """Total reward of one completion (sum of its components), None if none is finite."""
    rewards = sample.get("rewards")
    if not isinstance(rewards, Mapping):
        return finite(sample.get("reward"))
    vals = [finite(v) for v in rewards.values()]
    vals = [v for v in vals if v is not None]
    return sum(vals) if vals else None


def sample_length(sample: Mapping[str, Any]) -> float | None:
    v = finite(sample.get("length"))
    return v if v is not None and v >= 0 else None


def _group_key(s: Mapping[str, Any], i: int) -> Any:
    g = s.get("group")
    if g is None or isinstance(g, (float, list, dict)):
        g = ("index", s.get("index", i) if not isinstance(s.get("index"), (list, dict)) else i)
    return g


def _all_groups(samples: Sequence[Any]) -> dict[Any, list[Mapping[str, Any]]]:
    out: dict[Any, list[Mapping[str, Any]]] = {}
    for i, s in enumerate(samples):
        if type(s) is not dict and not isinstance(s, Mapping):
            continue
        out.setdefault(_group_key(s, i), []).append(s)
    return out


def _seed(samples: Sequence[Any]) -> str:
    """The same seed live and in replay: the step the samples belong to."""
    for s in samples:
        if type(s) is dict or isinstance(s, Mapping):
            step = s.get("step")
            return f"grpo-monitor:{step if isinstance(step, int) else 0}"
    return "grpo-monitor:0"


def fair_sample(samples: Sequence[Any], max_samples: int) -> list[Mapping[str, Any]]:
    """At most ``max_samples`` samples made of whole generation groups drawn at random (seeded by
    the step, so live and replayed runs draw the same), in their original order. The first N
    would be the first ranks' prompts only.

    >>> rows = [{"step": 3, "group": g, "index": 2 * g + k} for g in range(100) for k in range(2)]
    >>> picked = fair_sample(rows, 10)
    >>> len(picked), len({r["group"] for r in picked}), picked == fair_sample(rows, 10)
    (10, 5, True)
    >>> max(r["group"] for r in picked) > 5
    True
    """
    rows = samples if isinstance(samples, list) else list(samples)
    if len(rows) <= max_samples:
        return rows
    # Several detectors bound the same step's batch alike: draw once per batch and bound.
    cached = _FAIR.get(max_samples)
    if cached is not None and cached[0] is rows and cached[1] == len(rows):
        return cached[2]
    keys = _plain_group_keys(rows)
    if keys is None:  # records of every shape: the careful way
        groups = _all_groups(rows)
        order = list(groups)
        sizes = {k: len(v) for k, v in groups.items()}
    else:
        order = list(dict.fromkeys(keys))
        sizes = Counter(keys)
    random.Random(_seed(rows)).shuffle(order)
    chosen: set[Any] = set()
    n = 0
    for k in order:
        size = sizes[k]
        if n and n + size > max_samples:
            continue  # a smaller group later may still fit
        chosen.add(k)
        n += size
        if n >= max_samples:
            break
    if keys is None:
        ids = {id(s) for k in chosen for s in groups[k]}
        out = [s for s in rows if id(s) in ids]
    else:
        out = [s for s, k in zip(rows, keys) if k in chosen]
    if len(_FAIR) > 8:
        _FAIR.clear()
    _FAIR[max_samples] = (rows, len(rows), out)
    return out


_FAIR: dict[int, tuple[list[Any], int, list[Any]]] = {}


def _plain_group_keys(rows: list[Any]) -> list[int] | None:
    """Every sample's ``group`` when all are dicts with an integer one (the tap's records), else None."""
    try:
        keys = [s["group"] for s in rows]
    except (KeyError, TypeError, IndexError):
        return None
    if set(map(type, keys)) != {int} or set(map(type, rows)) != {dict}:
        return None
    return keys


def groups_of(samples: Sequence[Mapping[str, Any]], max_samples: int = 4096) -> dict[Any, list[Mapping[str, Any]]]:
    """Samples by generation group (bounded: beyond ``max_samples``, a fair sample of the groups)."""
    rows = samples if isinstance(samples, list) else list(samples)
    if len(rows) > max_samples:
        rows = fair_sample(rows, max_samples)
    return _all_groups(rows)


# -- signals read from completion text ---------------------------------------------------------
# The reward tap computes these on the whole completion and records them as numbers
# (``tail_rep``, ``text_hash``); a log without them (a foreign or older log) falls back to the
# recorded text.

def repeated_ngram_share(text: str, n: int = 4, max_words: int = 200) -> float | None:
    """Share of word n-grams that repeat an earlier n-gram of the same text (0 = none repeated).

    >>> repeated_ngram_share("a b c d a b c d a b c d")
    0.556
    >>> repeated_ngram_share("one two three four five six")
    0.0
    """
    # The tail is where degenerate text loops; reading only it bounds the cost per completion.
    # (``rsplit`` from the right makes only the words kept: this runs on every completion.)
    words = text[-12 * max_words:].rsplit(None, max_words)
    if len(words) > max_words:
        del words[0]
    k = len(words) - n + 1
    if k < 2:
        return None
    return round(1.0 - len(set(zip(*(words[i:] for i in range(n))))) / k, 3)


def top_word_share(text: str, max_words: int = 200) -> float | None:
    """Share of the last ``max_words`` words taken by the commonest one (``!!!! !!!! ...`` is 1.0).

    >>> top_word_share("! ! ! ! ok")
    0.8
    """
    words = text[-12 * max_words:].rsplit(None, max_words)
    if len(words) > max_words:
        del words[0]
    if len(words) < 4:
        return None
    return round(Counter(words).most_common(1)[0][1] / len(words), 3)


TOP_WORD_RECORDED = 0.5  # the tap records ``top_word`` only from this share up (below it: absent)


def sample_top_word_share(sample: Mapping[str, Any]) -> float | None:
    """How much one word dominates the completion: the tap's number (absent: below
    ``TOP_WORD_RECORDED``, read as 0), else measured on the recorded text."""
    if "tail_rep" in sample:
        v = finite(sample.get("top_word"))
        return 0.0 if v is None else v
    text = sample.get("completion")
    return top_word_share(text) if isinstance(text, str) else None


def text_hash(text: str) -> int:
    """A 52-bit fingerprint of a completion (stripped), equal for equal texts on every machine:
    CRC-32 of the UTF-8 bytes (several GB/s) in the low bits, the byte length above them, so
    texts of different lengths never collide and equal-length ones with odds 2**-32."""
    data = text.strip().encode("utf-8", "surrogatepass")
    return ((len(data) & 0xFFFFF) << 32) | zlib.crc32(data)


def has_text_signals(sample: Mapping[str, Any]) -> bool:
    return "tail_rep" in sample or isinstance(sample.get("completion"), str)


def sample_tail_repetition(sample: Mapping[str, Any]) -> float | None:
    """The completion's tail repetition: the tap's number, else measured on the recorded text."""
    if "tail_rep" in sample:
        return finite(sample.get("tail_rep"))
    text = sample.get("completion")
    return repeated_ngram_share(text) if isinstance(text, str) else None


def duplicate_key(sample: Mapping[str, Any]) -> Any:
    """What two identical completions share: the tap's fingerprint of the whole text, else the
    recorded text itself (stripped); None when neither is there."""
    h = sample.get("text_hash")
    if type(h) is int:
        return h
    text = sample.get("completion")
    return None if text is None else str(text).strip()


class LevelTrack:
    """One positive-scale metric: a settled early baseline plus its recent window.

    ``ratio(k)`` is the median of the last ``k`` points over the baseline, so a one-step spike
    never moves it.
    """

    def __init__(self, window: int = 64, half: int = 3, tol: float = 0.3, max_points: int = 60, positive: bool = True,
                 min_span: int = 0) -> None:
        self.window = Window(window)
        self.baseline = SettledBaseline(half=half, tol=tol, max_points=max_points, positive=positive, min_span=min_span)
        self.base_step: int | None = None
        # The first few points: the only reference a series has when it fails before it settles.
        self.first: list[float] = []
        self.first_steps: list[int] = []

    def push(self, step: int, v: float) -> None:
        self.window.push(step, v)
        if self.baseline.value is None:
            # The first points within a few steps of the start: three on fine logs, one on coarse
            # logs (where the third point may already be deep into an early failure).
            if len(self.first) < 3 and (not self.first_steps or step - self.first_steps[0] < 5):
                self.first.append(v)
                self.first_steps.append(step)
            if self.baseline.push(v, step):
                self.base_step = step

    @property
    def early(self) -> float | None:
        """Median of the first (up to three) points."""
        return median(self.first) if self.first else None

    def early_ratio(self, k: int) -> float | None:
        """Recent median over the first points' median, while the baseline has not settled."""
        r, e = self.recent(k), self.early
        if r is None or e is None or self.baseline.value is not None or len(self.window) < len(self.first) + k:
            return None
        return math.exp(log_ratio(r, e))

    def force_if_moved(self, step: int, k: int, low: float | None = None, high: float | None = None) -> bool:
        """Freeze the baseline at the first points' level when, before settling, the recent median
        and the latest point have fallen to ``low`` or risen to ``high`` times that level."""
        if self.baseline.value is not None or not self.window.values:
            return False
        er = self.early_ratio(k)
        e = self.early or 0.0
        last = self.window.values[-1]
        if er is None:
            return False
        if (low is not None and er <= low and last <= low * e) or (high is not None and er >= high and last >= high * e):
            self.force_early(step)
            return True
        return False

    def force_early(self, step: int) -> None:
        """Freeze the baseline at the first points' level: the series moved far before settling."""
        b = self.baseline
        if b.value is None and self.first:
            b.value = median(self.first)
            b.spread = mad_sigma(self.first, b.value)
            self.base_step = step

    @property
    def ready(self) -> bool:
        return self.baseline.ready

    @property
    def base(self) -> float | None:
        return self.baseline.value

    def recent(self, k: int) -> float | None:
        return self.window.recent_median(k)

    def ratio(self, k: int) -> float | None:
        b = self.baseline.value
        if b is None:
            return None
        r = self.window.recent_median(k)
        if r is None:
            return None
        return math.exp(log_ratio(r, b))

    def last_step(self) -> int | None:
        return self.window.steps[-1] if len(self.window) else None


class EntropyTrack(LevelTrack):
    """Entropy with the masked-truncation trap handled.

    With ``mask_truncated_completions=True`` and every completion truncated, TRL logs entropy as
    exactly 0.0 (nothing was left to measure); that value is a gap, not a collapse.
    """

    def push_metrics(self, step: int, metrics: Mapping[str, Any]) -> float | None:
        h = get(metrics, "entropy")
        if h is None or h < 0.0:
            return None
        if h == 0.0:
            clipped = get(metrics, "completions/clipped_ratio")
            if clipped is None or clipped >= 0.99:
                return None
        self.push(step, h)
        return h
