"""Metric names by meaning: a log's own names mapped onto the canonical ones by their words and values.

``core.metrics.normalize`` knows the spellings of TRL, verl, the trackers' exports and the families seen in
public logs. A hand-written trainer names the same quantities its own way (``rollout_reward_mean``,
``mean_response_length``, ``answer_accuracy``, ``val_accuracy``). ``resolve`` reads what is left: it splits
each name into words, finds the quantity (a reward, a length, an entropy, a truncated share, the share of
groups without spread, an accuracy, ...), the statistic (mean, std, min, max) and the scope (training or
held-out), checks the values fit (a share lies in [0, 1], a length is not negative) and proposes the
canonical name, saying why. A target two names compete for is left unmapped and said (ambiguous), and a
name the log already has canonically is never taken over. A user's ``--map`` is applied before and wins.

>>> r = resolve(["rollout_reward_mean", "rollout_reward_std", "mean_response_length", "gradient_norm",
...              "answer_accuracy", "format_accuracy", "val_accuracy", "wall_seconds"])
>>> sorted(r.mapping.items())  # doctest: +NORMALIZE_WHITESPACE
[('answer_accuracy', 'rewards/answer_accuracy/mean'), ('format_accuracy', 'rewards/format_accuracy/mean'),
 ('rollout_reward_mean', 'reward'), ('rollout_reward_std', 'reward_std')]
>>> r.how["rollout_reward_mean"]
'reward + mean'
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from grpo_monitor.core.metrics import normalize
from grpo_monitor.detectors.numbers import finite

_SPLIT = re.compile(r"[/_\-\s.:@]+|(?<=[a-z])(?=[A-Z])")
_EVAL = frozenset({"val", "valid", "validation", "test", "eval", "evaluation", "heldout", "dev"})
_TRAIN = frozenset({"train", "training", "rollout", "rollouts", "policy", "actor", "batch", "sample", "samples", "gen",
                    "generation"})
_STATS = {"mean": "mean", "avg": "mean", "average": "mean", "std": "std", "stdev": "std", "stddev": "std",
          "min": "min", "max": "max"}
_REWARD = frozenset({"reward", "rewards", "score", "scores", "return", "returns"})
_LENGTH = frozenset({"length", "len", "lengths"})
_TOKENS = frozenset({"tokens", "ntokens", "toks"})  # a length only of a completion: "tokens" alone is a total
_LENGTH_OF = frozenset({"response", "completion", "completions", "output", "generation", "gen", "answer", "resp"})
_ACCURACY = frozenset({"accuracy", "acc", "correct", "correctness", "exact", "em", "solved", "success", "pass"})
_TRUNC = frozenset({"truncated", "truncation", "truncate", "clipped"})
_SHARE = frozenset({"ratio", "frac", "fraction", "rate", "share", "pct"})
_ZERO = re.compile(r"zero_?std|no_?var|zero_?var|all_?same|identical|degenerate_?group|same_?reward")
# Quantities that are not ours to map (timings, memory, counts): a name with one of these words is left alone.
_OTHER = frozenset({"time", "seconds", "sec", "secs", "ms", "memory", "mem", "gb", "mb", "throughput", "tps", "count",
                    "num", "samples_per_second", "per", "epoch", "lr_scale", "prompt", "prompts", "advantage",
                    "advantages", "value", "values", "critic"})


# The names TRL logs (and the monitor's own families): already canonical, never resolved again.
CANONICAL = frozenset({"reward", "reward_std", "entropy", "kl", "grad_norm", "loss", "learning_rate",
                       "frac_reward_zero_std", "epoch", "num_tokens", "step_time", "ppo_kl", "aux_loss", "entropy_coef",
                       "policy_loss", "eval_reward", "eval_accuracy", "eval_loss"})
CANONICAL_PREFIXES = ("rewards/", "completions/", "sampling/", "mismatch/", "moe/", "system/", "samples/", "clip_ratio/",
                      "eval_", "advantages/", "reward/", "grpo_monitor/")


def is_canonical(name: str) -> bool:
    """A name in the canonical vocabulary (TRL's, or a family the monitor owns)."""
    return name in CANONICAL or name.startswith(CANONICAL_PREFIXES)


@dataclasses.dataclass
class Resolution:
    """``mapping`` (a log's name -> the canonical name), ``how`` (the words it was mapped by) and ``ambiguous``
    (a canonical name -> the names that competed for it, left unmapped)."""

    mapping: dict[str, str] = dataclasses.field(default_factory=dict)
    how: dict[str, str] = dataclasses.field(default_factory=dict)
    ambiguous: dict[str, list[str]] = dataclasses.field(default_factory=dict)

    def lines(self) -> list[str]:
        """``name → canonical (words)`` per mapped name and one line per ambiguous target, as a report shows them."""
        out = [f"{n} → {t} ({self.how.get(n, '')})" for n, t in self.mapping.items()]
        out += [f"{', '.join(ns)} left unmapped: each could be {t}" for t, ns in self.ambiguous.items()]
        return out


def words(name: str) -> list[str]:
    """The lower-case words of a name.

    >>> words("rolloutRewardMean"), words("val/acc_mean@1")
    (['rollout', 'reward', 'mean'], ['val', 'acc', 'mean', '1'])
    """
    return [w.lower() for w in _SPLIT.split(name) if w]


def meaning(name: str) -> tuple[str, str] | None:
    """The canonical name ``name``'s words say it is, and the words that say so; None when they do not say one.

    >>> meaning("mean_response_length"), meaning("frac_zero_std_groups"), meaning("eval_reward_mean")
    (('completions/mean_length', 'length + mean'), ('frac_reward_zero_std', 'zero-std share'), ('eval_reward', 'held-out reward + mean'))
    >>> meaning("clip_frac") is None, meaning("step_time_seconds") is None
    (True, True)
    """
    ws = words(name)
    if not ws:
        return None
    wset = set(ws)
    if wset & _OTHER:
        return None
    stat = next((_STATS[w] for w in ws if w in _STATS), None)
    held_out = bool(wset & _EVAL)
    folded = "_".join(ws)
    if _ZERO.search(folded):
        return None if held_out else ("frac_reward_zero_std", "zero-std share")
    if wset & _TRUNC and not held_out:
        return "completions/clipped_ratio", "truncated share"
    if wset & {"clip", "clipfrac"} and wset & (_LENGTH | _LENGTH_OF) and not held_out:
        return "completions/clipped_ratio", "clipped share of completions"
    if "entropy" in wset and not held_out:
        return ("entropy", "entropy") if stat in (None, "mean") else None
    if "kl" in wset and not held_out:
        return ("kl", "kl") if stat in (None, "mean") else None
    if {"grad", "gradient"} & wset and "norm" in wset:
        return ("grad_norm", "gradient norm") if stat in (None, "mean") else None
    if wset & _ACCURACY:
        if held_out:
            return "eval_accuracy", "held-out accuracy"
        return f"rewards/{name}/mean", "accuracy of a component" + (" (format)" if "format" in wset or "fmt" in wset else "")
    if wset & _REWARD:
        if held_out:
            return ("eval_reward", "held-out reward" + (" + mean" if stat == "mean" else "")) if stat in (None, "mean") else None
        if stat is None or stat == "mean":
            return "reward", "reward" + (" + mean" if stat else "")
        return ("reward_std", "reward + std") if stat == "std" else (f"reward/{stat}", f"reward + {stat}")
    if ((wset & _LENGTH and (wset & _LENGTH_OF or stat is not None or len(ws) <= 2))
            or (wset & _TOKENS and wset & _LENGTH_OF)) and not held_out:
        s = stat or "mean"
        return f"completions/{s}_length" if s != "std" else "completions/std_length", f"length + {s}"
    return None


def _fits(target: str, values: Sequence[float]) -> bool:
    """The values can be what ``target`` names: shares and accuracies within [0, 1], lengths and spreads >= 0."""
    if not values:
        return True
    if target in ("completions/clipped_ratio", "frac_reward_zero_std", "eval_accuracy") or (
            target.startswith("rewards/") and target.endswith("/mean") and "accuracy" in target):
        return all(-1e-9 <= v <= 1 + 1e-9 for v in values)
    if target.startswith("completions/"):
        return all(-1e-9 <= v <= 1e6 for v in values)  # tokens of one completion, not of a whole batch
    if target in ("reward_std", "entropy", "grad_norm"):
        return all(v >= -1e-9 for v in values)
    return True


def resolve(names: Iterable[str], values: Mapping[str, Sequence[Any]] | None = None,
            known: Iterable[str] = ()) -> Resolution:
    """Canonical names for the names ``normalize`` left as they were. ``values`` (a few of each name's values)
    check the fit; ``known`` are canonical names the log already has, never taken over."""
    taken = set(known)
    candidates: dict[str, list[tuple[str, str]]] = {}
    for name in names:
        if not isinstance(name, str) or normalize(name) != name or is_canonical(name):
            continue
        m = meaning(name)
        if m is None:
            continue
        target, how = m
        vals = [v for v in (finite(x) for x in (values or {}).get(name, ())) if v is not None]
        if target in taken or not _fits(target, vals):
            continue
        candidates.setdefault(target, []).append((name, how))
    out = Resolution()
    for target, found in candidates.items():
        if len(found) > 1:
            # Several names for one quantity: a plain one ("reward_mean") over qualified ones ("reward_mean_math")
            # only where exactly one is shortest in words; else none is guessed.
            shortest = min(len(words(n)) for n, _ in found)
            plain = [(n, h) for n, h in found if len(words(n)) == shortest]
            if len(plain) != 1:
                out.ambiguous[target] = [n for n, _ in found]
                continue
            found = plain
        name, how = found[0]
        out.mapping[name] = target
        out.how[name] = how
    return out
