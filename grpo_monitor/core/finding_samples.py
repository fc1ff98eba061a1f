"""The completions behind a finding: for each finding, a few of the run's recorded samples that show it,
referenced by ``(step, index)`` and picked from what the run log already keeps (never a copy of its text).

One table says, per finding kind, which steps to look at (those nearest the step the finding was raised,
or nearest its onset for a collapse) and how to rank a step's completions (the zero-variance groups for
``no_learning_signal``, the longest for ``degenerate_long_cot``, ...); a kind the table does not name (a
team rule, a pre-flight ``config_*`` finding, a detector added later) takes the default: around the onset,
the lowest and the highest reward. Picks come from a step's *kept* set, the completions whose text the
retention policy kept (``callbacks.reward_tap.SampleRetention``), so each pick has an excerpt; a run that
kept no text is picked from its numbers alone. ``notable`` names the completions the policy reserves text
slots for, so the picks a finding needs are among the kept ones.

>>> rows = [{"step": 5, "index": i, "group": i // 2, "length": 10 * (i + 1), "truncated": i == 3,
...          "rewards": {"r": 1.0 if i < 2 else float(i)}, "completion": "word " * i} for i in range(4)]
>>> f = {"detector": "no_learning_signal", "step": 5, "onset_step": 3}
>>> [(p["step"], p["index"], p["reward"]) for p in pick_samples(f, [5], {5: rows}.__getitem__)]
[(5, 0, 1.0), (5, 1, 1.0)]
>>> [p["index"] for p in pick_samples(dict(f, detector="degenerate_long_cot"), [5], {5: rows}.__getitem__)]
[3, 2, 1, 0]
>>> [p["index"] for p in pick_samples(dict(f, detector="truncation"), [5], {5: rows}.__getitem__)]
[3]
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from grpo_monitor.detectors.numbers import finite
from grpo_monitor.detectors.signals import sample_length, sample_reward, sample_tail_repetition

PICKS = 4  # completions shown per finding
STEPS = 2  # logged steps of samples looked at per finding
EXCERPT_CHARS = 160  # characters of a pick's text shown beside it


@dataclasses.dataclass(frozen=True)
class Selection:
    """How one finding kind picks its samples: ``anchor`` is the step the picks sit nearest (``step``, where
    the finding was raised, or ``onset``), ``order`` how a step's completions rank, ``tail`` whether the
    excerpt is the text's end (where a cut or a loop shows) rather than its start."""

    anchor: str
    order: str
    why: str
    tail: bool = False


DEFAULT = Selection("onset", "spread", "around the onset: lowest and highest reward")

SELECTIONS: dict[str, Selection] = {
    "no_learning_signal": Selection("step", "zero_variance", "a group whose completions all scored the same"),
    "reward_function_bug": Selection("step", "zero_variance", "a group whose completions all scored the same"),
    "degenerate_long_cot": Selection("step", "longest", "the longest completions", tail=True),
    "truncation": Selection("step", "truncated", "completions cut at the length cap", tail=True),
    "length_reward_coupling": Selection("step", "reward_length", "the highest reward, longest first", tail=True),
    "length_collapse": Selection("step", "shortest", "the shortest completions"),
    "broken_generation": Selection("step", "repetitive", "the most repetitive completions", tail=True),
    "language_mixing": Selection("step", "other_script", "the most text in another script"),
    # Collapses: the policy changed around the onset, so the samples there show what it turned into.
    "entropy_collapse": Selection("onset", "spread", "around the onset: lowest and highest reward"),
    "sudden_collapse": Selection("onset", "spread", "around the onset: lowest and highest reward"),
    "entropy_rise": Selection("onset", "repetitive", "around the onset: the most repetitive", tail=True),
}


def selection_of(kind: str) -> Selection:
    """The selection a finding kind uses (``DEFAULT`` for a kind the table does not name)."""
    return SELECTIONS.get(str(kind), DEFAULT)


def _get(finding: Any, name: str) -> Any:
    return finding.get(name) if isinstance(finding, Mapping) else getattr(finding, name, None)


def _step(v: Any) -> int | None:
    return v if type(v) is int else None


def steps_for(finding: Any, steps: Sequence[int], sel: Selection | None = None) -> list[int]:
    """The logged steps with samples a finding's picks come from: the ``STEPS`` nearest its anchor, none after
    the step it was raised at (what it saw), later first on a tie (the step after an onset shows the change)."""
    raised = _step(_get(finding, "step"))
    if raised is None:
        return []
    sel = sel or selection_of(_get(finding, "detector"))
    onset = _step(_get(finding, "onset_step"))
    anchor = onset if sel.anchor == "onset" and onset is not None else raised
    seen = [s for s in steps if type(s) is int and s <= raised]
    return sorted(seen, key=lambda s: (abs(s - anchor), -s))[:STEPS]


def kept(rows: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """A step's completions whose text was kept; all of them when the run kept no text."""
    with_text = [r for r in rows if isinstance(r.get("completion"), str)]
    return with_text or list(rows)


def zero_variance_groups(rows: Iterable[Mapping[str, Any]]) -> list[Any]:
    """The groups (a prompt's completions) of a step, all of whose completions scored the same, by the whole
    step's numbers (every completion keeps them), in group order."""
    by: dict[Any, list[float | None]] = {}
    for r in rows:
        g = r.get("group")
        if type(g) is int:
            by.setdefault(g, []).append(sample_reward(r))
    return [g for g, rs in sorted(by.items()) if len(rs) > 1 and None not in rs and len(set(rs)) == 1]


def _num(r: Mapping[str, Any], name: str, default: float) -> float:
    v = finite(r.get(name))
    return default if v is None else v


def _ranked(order: str, rows: Sequence[Mapping[str, Any]], step_rows: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """One step's kept completions in the order ``order`` ranks them, those that do not show it left out."""
    def length(r: Mapping[str, Any]) -> float:
        v = sample_length(r)
        return -1.0 if v is None else v

    def reward(r: Mapping[str, Any]) -> float | None:
        return sample_reward(r)

    if order == "zero_variance":
        groups = zero_variance_groups(step_rows)
        members = {g: [r for r in rows if r.get("group") == g] for g in groups}
        # A group with two kept members shows the tie; one alone shows only a reward.
        ordered = sorted(groups, key=lambda g: (len(members[g]) < 2, g))
        return [r for g in ordered for r in members[g]]
    if order == "longest":
        return sorted((r for r in rows if sample_length(r) is not None), key=lambda r: -length(r))
    if order == "truncated":
        return sorted((r for r in rows if r.get("truncated") is True), key=lambda r: -length(r))
    if order == "shortest":
        return sorted((r for r in rows if sample_length(r) is not None), key=length)
    if order == "reward_length":
        return sorted((r for r in rows if reward(r) is not None), key=lambda r: (-(reward(r) or 0.0), -length(r)))
    if order == "repetitive":
        return sorted((r for r in rows if sample_tail_repetition(r) is not None or "distinct_tokens" in r),
                      key=lambda r: (-(sample_tail_repetition(r) or 0.0), -_num(r, "top_word", 0.0),
                                     _num(r, "distinct_tokens", 64.0)))
    if order == "other_script":
        return sorted((r for r in rows if _num(r, "other_script", 0.0) > 0), key=lambda r: -_num(r, "other_script", 0.0))
    # spread: the lowest and the highest reward, then the next of each
    scored = sorted((r for r in rows if reward(r) is not None), key=lambda r: reward(r) or 0.0)
    out: list[Mapping[str, Any]] = []
    lo, hi = 0, len(scored) - 1
    while lo <= hi:
        out.append(scored[lo])
        if hi != lo:
            out.append(scored[hi])
        lo, hi = lo + 1, hi - 1
    return out


def excerpt(text: Any, tail: bool = False, chars: int = EXCERPT_CHARS) -> str | None:
    """At most ``chars`` characters of a kept text on one line, its start (or its end), … where cut.

    >>> excerpt("a  b\\nc"), excerpt("x" * 200, tail=True, chars=5)
    ('a b c', '…xxxx')
    """
    if not isinstance(text, str):
        return None
    flat = " ".join(text.split())
    if len(flat) <= chars:
        return flat
    return "…" + flat[-(chars - 1):] if tail else flat[:chars - 1] + "…"


def pick_samples(finding: Any, steps: Sequence[int], load: Callable[[int], Sequence[Mapping[str, Any]]],
                 limit: int = PICKS) -> list[dict[str, Any]]:
    """The samples that show ``finding``: up to ``limit`` references into the run's samples, each with its
    numbers and a short excerpt. ``steps`` are the steps that have samples, ``load(step)`` their records.
    Where no kept completion shows the kind's property (no group scored alike, none cut), the default's
    picks stand in, saying so in their ``why``."""
    sel = selection_of(_get(finding, "detector"))
    picks = _pick(finding, sel, steps, load, limit)
    return picks if picks or sel == DEFAULT else _pick(finding, DEFAULT, steps, load, limit)


def _pick(finding: Any, sel: Selection, steps: Sequence[int], load: Callable[[int], Sequence[Mapping[str, Any]]],
          limit: int) -> list[dict[str, Any]]:
    picks: list[dict[str, Any]] = []
    for step in steps_for(finding, steps, sel):
        step_rows = load(step)
        ranked = _ranked(sel.order, kept(step_rows), step_rows)
        # The spread is per step (each step's lowest and highest); the other orders rank across the steps.
        per_step = ranked[:2] if sel.order == "spread" else ranked
        picks.extend(_reference(r, step, sel) for r in per_step)
    if sel.order not in ("spread", "zero_variance"):
        key = {"longest": lambda p: -p["length"], "truncated": lambda p: -p["length"],
               "shortest": lambda p: p["length"]}.get(sel.order)
        if key is not None:
            picks.sort(key=lambda p: key(p) if p["length"] is not None else 0)  # stable: nearer step first on a tie
    return picks[:limit]


def _reference(r: Mapping[str, Any], step: int, sel: Selection) -> dict[str, Any]:
    return {"step": step, "index": r.get("index"), "rank": r.get("rank"), "group": r.get("group"),
            "reward": sample_reward(r), "length": sample_length(r), "truncated": r.get("truncated") is True,
            "why": sel.why, "excerpt": excerpt(r.get("completion"), sel.tail)}


class StepCache:
    """A few steps' records, loaded once for all the findings that look at them (a long run's step holds
    thousands of completions, so only the last ``size`` are kept)."""

    def __init__(self, load: Callable[[int], Sequence[Mapping[str, Any]]], size: int = 8) -> None:
        self._load = load
        self._size = size
        self._rows: OrderedDict[int, Sequence[Mapping[str, Any]]] = OrderedDict()

    def __call__(self, step: int) -> Sequence[Mapping[str, Any]]:
        rows = self._rows.get(step)
        if rows is None:
            rows = self._rows[step] = self._load(step)
            while len(self._rows) > self._size:
                self._rows.popitem(last=False)
        else:
            self._rows.move_to_end(step)
        return rows


def samples_of_findings(findings: Sequence[Any], samples: Mapping[int, Sequence[Mapping[str, Any]]]) -> list[list[dict[str, Any]]]:
    """Each finding's picks (``pick_samples``), in the order of ``findings``, from a run's samples by step."""
    steps = sorted(s for s in samples if type(s) is int)
    load = StepCache(samples.__getitem__)
    return [pick_samples(f, steps, load) for f in findings]


def notable(samples: Sequence[Mapping[str, Any]]) -> list[int]:
    """Positions of a step's completions the retention policy keeps text for ahead of its fair draw, so the
    findings' picks are among the kept: the longest, the most repetitive, the best and worst of the first
    group that scored all alike, the highest reward (longest first). In that order, each once.

    >>> rows = [{"group": 0, "length": 5, "rewards": {"r": 1.0}}, {"group": 0, "length": 9, "rewards": {"r": 1.0}},
    ...         {"group": 1, "length": 7, "rewards": {"r": 2.0}}, {"group": 1, "length": 3, "rewards": {"r": 0.0}}]
    >>> notable(rows)
    [1, 0, 2]
    """
    # One pass: the policy runs on the training thread at every log, over up to thousands of completions.
    longest = repetitive = best = None
    top_len: float = 0.0
    top_rep = 0.0
    top_score: tuple[float, float] | None = None
    groups: dict[int, list[Any]] = {}  # group -> [first, last, its reward, still all alike]
    for i, s in enumerate(samples):
        length = s.get("length")
        if type(length) is not int or length < 0:
            length = sample_length(s)
        reward = _reward(s)
        rep = s.get("tail_rep")
        if type(rep) is not float:  # (a NaN one never beats a number below)
            rep = sample_tail_repetition(s)
        if length is not None and (longest is None or length > top_len):
            longest, top_len = i, length
        if rep is not None and rep > top_rep:
            repetitive, top_rep = i, rep
        if reward is not None and (top_score is None or (reward, length or 0.0) > top_score):
            best, top_score = i, (reward, length or 0.0)
        g = s.get("group")
        if type(g) is int:
            seen = groups.get(g)
            if seen is None:
                groups[g] = [i, i, reward, reward is not None]
            else:
                seen[1] = i
                seen[3] = seen[3] and reward == seen[2]
    out: list[int] = []
    for i in (longest, repetitive):
        if i is not None:
            out.append(i)
    alike = next((v for _, v in sorted(groups.items()) if v[3] and v[0] != v[1]), None)
    for i in ((alike[0], alike[1]) if alike else ()) + ((best,) if best is not None else ()):
        if i not in out:
            out.append(i)
    return out


def _reward(s: Mapping[str, Any]) -> float | None:
    """``sample_reward``, with a fast path for the plain case (float components, a finite sum: each is finite)."""
    rewards = s.get("rewards")
    if type(rewards) is dict and rewards:
        values = rewards.values()
        if all(type(v) is float for v in values):
            total = sum(values)
            if total - total == 0:
                return total
    return sample_reward(s)
