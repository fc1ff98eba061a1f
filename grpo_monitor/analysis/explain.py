"""Explanations of GRPO metrics that look wrong but are normal.

Users keep filing the same worries about healthy GRPO runs: a loss of about 0 (or below 0), clipping
that never fires, a logged gradient norm above ``max_grad_norm``, a KL that keeps rising, a reward
spread that shrinks. ``explain`` reads a run's logged metrics and its config and returns one note per
such pattern the run actually shows, with the run's own numbers, the TRL/GRPO reason it is fine, and
what would make it a real problem (naming the detector that watches for that). A note never judges
the run: verdicts and exit codes come from the detectors alone.

A pattern whose "unless" condition the run also shows gets no note: a loss of 0 next to a gradient
norm of 0 is not reassuring, and a gradient norm that spikes far above its own level is not the
pre-clip norm at work. Those are the detectors' business.

>>> steps = [(s, {"loss": 0.001 * (-1) ** s, "grad_norm": 0.3 + 0.01 * (s % 3), "reward_std": 0.4,
...              "clip_ratio/region_mean": 0.0}) for s in range(1, 21)]
>>> notes = explain(steps, {"num_iterations": 1, "gradient_accumulation_steps": 2, "beta": 0.0})
>>> [n["id"] for n in notes]
['loss_near_zero', 'loss_negative', 'clip_ratio_zero']
>>> print(notes[0]["pattern"])
loss is within ±0.05 of 0 on 20 of 20 logged steps (median |loss| 0.001)
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from grpo_monitor.detectors.base import RunContext
from grpo_monitor.detectors.numbers import finite, number_or_nan
from grpo_monitor.detectors.signals import resolve_correctness, reward_names_in, reward_roles

log = logging.getLogger(__name__)

# Advantages are rewards centred (and by default scaled) within each group, so the policy term of
# the loss is a mean of unit-scale numbers weighted by a ratio near 1: 5% of one advantage standard
# deviation is as close to 0 as a batch average of them gets.
LOSS_NEAR_ZERO = 0.05
MIN_POINTS = 5
MIN_TREND_POINTS = 10
# TRL's default when a log does not record the config.
DEFAULT_MAX_GRAD_NORM = 1.0
# A gradient norm this many times its trailing median is a spike, not the pre-clip norm at work
# (the grad-norm spike signature of the field reports).
SPIKE_FACTOR = 10.0
SPIKE_WINDOW = 20
# KL above this, or a last third far above the middle one, is divergence rather than drift.
KL_MODERATE_MAX = 1.0
KL_ACCELERATION = 5.0
# The importance-sampling ratio band a healthy vLLM engine stays in at temperature 1.
IS_BAND = (0.85, 1.15)

CLIP_KEYS = ("clip_ratio/region_mean", "clip_ratio/low_mean", "clip_ratio/high_mean")
ADVANTAGE_KEYS = ("critic/advantages/mean", "advantages/mean", "advantage/mean")

# Each note, and the detectors that raise the real problem it rules out (named in its "unless").
WATCHED_BY: dict[str, tuple[str, ...]] = {
    "loss_near_zero": ("no_learning_signal",),
    "loss_negative": ("non_finite",),
    "loss_rising": ("sudden_collapse",),
    "clip_ratio_zero": ("grad_norm_spike",),
    "grad_norm_above_max": ("grad_norm_spike",),
    "kl_rising": ("sudden_collapse",),
    "reward_std_falling": ("no_learning_signal", "entropy_collapse"),
    "length_falling": ("truncation", "length_collapse", "reward_component_divergence"),
    "reward_zero_at_start": ("no_learning_signal",),
    "component_std_vs_group_std": ("no_learning_signal",),
    "is_ratio_not_one": ("rollout_mismatch",),
    "reward_negative": ("no_learning_signal",),
    "advantage_mean_zero": ("no_learning_signal",),
    "capped_but_learning": ("truncation", "no_learning_signal"),
    "format_reward_saturated": ("reward_function_bug", "reward_component_divergence"),
}
NOTE_IDS = tuple(WATCHED_BY)


def _g(x: float) -> str:
    """A number as a user reads it in a note."""
    if x == 0:
        return "0"
    return f"{x:.3g}" if abs(x) >= 1e-3 else f"{x:.2e}"


class _Run:
    """The run as finite-value columns: ``values(name)`` gives the steps and values where it was logged."""

    def __init__(self, steps: np.ndarray, columns: Mapping[str, Any], context: RunContext) -> None:
        self.steps = np.asarray(steps, dtype=np.float64)
        self.columns = columns
        self.context = context
        self.config = context.config or {}

    def has(self, name: str) -> bool:
        return name in self.columns

    def values(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        col = self.columns.get(name)
        if col is None:
            return np.empty(0), np.empty(0)
        v = np.asarray(col, dtype=np.float64)
        ok = np.isfinite(v)
        return self.steps[ok], v[ok]

    def has_infinite(self, name: str) -> bool:
        """An infinite value logged (a NaN reads as a gap here, so infinities are what can be told apart)."""
        col = self.columns.get(name)
        return col is not None and bool(np.isinf(np.asarray(col, dtype=np.float64)).any())

    def cfg_number(self, key: str) -> float | None:
        return finite(self.config.get(key))


def _thirds(v: np.ndarray) -> tuple[float, float, float]:
    """Medians of the first, middle and last third: levels robust to single-step noise and spikes."""
    k = max(1, len(v) // 3)
    return float(np.median(v[:k])), float(np.median(v[k:len(v) - k] if len(v) > 2 * k else v)), float(np.median(v[-k:]))


def _rank_corr(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rank correlation (0 when either side is constant)."""
    if len(x) < 3:
        return 0.0
    rx = np.argsort(np.argsort(x, kind="stable"), kind="stable").astype(float)
    ry = np.argsort(np.argsort(y, kind="stable"), kind="stable").astype(float)
    if ry.std() == 0 or rx.std() == 0 or np.ptp(y) == 0:
        return 0.0
    return float(np.corrcoef(rx, ry)[0, 1])


def _trailing_median(v: np.ndarray, window: int) -> np.ndarray:
    """Median of the ``window`` values before each point (NaN for the first few): causal."""
    out = np.full(len(v), np.nan)
    if len(v) <= MIN_POINTS:
        return out
    padded = np.concatenate([np.full(window, np.nan), v[:-1]])
    windows = np.lib.stride_tricks.sliding_window_view(padded, window)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the first windows are all NaN
        med = np.nanmedian(windows, axis=1)
    seen = np.arange(len(v))
    med[seen < MIN_POINTS] = np.nan
    out[:] = med
    return out


def _spikes(v: np.ndarray) -> np.ndarray:
    base = _trailing_median(v, SPIKE_WINDOW)
    with np.errstate(invalid="ignore"):
        return np.flatnonzero((base > 0) & (v > SPIKE_FACTOR * base))


def _note(id: str, pattern: str, why: str, unless: str, evidence: dict[str, Any]) -> dict[str, Any]:
    return {"id": id, "pattern": pattern, "why": why, "unless": unless, "watched_by": list(WATCHED_BY[id]),
            "evidence": {k: (round(v, 6) if isinstance(v, float) else v) for k, v in evidence.items()}}


def _liveness(run: _Run) -> tuple[bool, dict[str, Any]]:
    """Whether the run shows an update happening (gradient, reward spread), and the numbers saying so."""
    ev: dict[str, Any] = {}
    _, g = run.values("grad_norm")
    _, rs = run.values("reward_std")
    _, fz = run.values("frac_reward_zero_std")
    if len(g):
        ev["grad_norm_median"] = float(np.median(g))
        ev["grad_norm_zero_share"] = float(np.mean(g <= 1e-12))
    if len(rs):
        ev["reward_std_median"] = float(np.median(rs))
    if len(fz):
        ev["frac_reward_zero_std_median"] = float(np.median(fz))
    if (not len(g) and not len(rs)) or run.has_infinite("grad_norm") or run.has_infinite("loss"):
        return False, ev
    alive = (not len(g) or ev["grad_norm_zero_share"] <= 0.1) and (not len(rs) or ev["reward_std_median"] > 0)
    alive = alive and (not len(fz) or ev["frac_reward_zero_std_median"] < 0.5)
    return alive, ev


def _live_text(ev: Mapping[str, Any]) -> str:
    parts = []
    if "grad_norm_median" in ev:
        parts.append(f"grad_norm (median {_g(ev['grad_norm_median'])})")
    if "reward_std_median" in ev:
        parts.append(f"reward_std (median {_g(ev['reward_std_median'])})")
    return " and ".join(parts)


def _on_policy(run: _Run) -> bool | None:
    """True/False when the config says, None when the log does not record it."""
    cfg = run.config
    if not any(k in cfg for k in ("num_iterations", "steps_per_generation", "gradient_accumulation_steps")):
        return None
    from grpo_monitor.core.recommend import is_on_policy

    return is_on_policy(cfg)


# -- the notes ------------------------------------------------------------------------------------


def _loss_near_zero(run: _Run) -> dict[str, Any] | None:
    _, loss = run.values("loss")
    if len(loss) < MIN_POINTS:
        return None
    near = np.abs(loss) <= LOSS_NEAR_ZERO
    if near.mean() < 0.6:
        return None
    alive, ev = _liveness(run)
    if not alive:
        return None
    beta = run.cfg_number("beta")
    on = _on_policy(run)
    live = _live_text(ev)
    if on and beta == 0:
        why = ("With num_iterations=1 and beta=0 the policy ratio is exactly 1 and the advantages are centred within "
               "each group, so the loss value averages to about 0 by construction while its gradient does not")
    elif beta is not None and beta > 0:
        why = (f"The policy term of GRPO's loss is a mean of group-centred advantages times a ratio near 1, about 0 "
               f"by construction; the rest is beta x KL (beta={_g(beta)}), small while the policy stays near its reference")
    else:
        why = ("The policy term of GRPO's loss is a mean of group-centred advantages times a ratio that is 1 on-policy, "
               "so its value sits near 0 while its gradient does not")
    why += f": {live} show that the update is happening. Watch the reward, not the loss."
    ev.update(steps=len(loss), near_zero_steps=int(near.sum()), median_abs_loss=float(np.median(np.abs(loss))))
    return _note(
        "loss_near_zero",
        f"loss is within ±{LOSS_NEAR_ZERO:g} of 0 on {int(near.sum())} of {len(loss)} logged steps "
        f"(median |loss| {_g(float(np.median(np.abs(loss))))})",
        why,
        "Not normal when grad_norm is 0 as well, or frac_reward_zero_std is near 1: then no group of completions "
        "carries a learning signal and nothing is updated (no_learning_signal watches for it).",
        ev)


def _loss_negative(run: _Run) -> dict[str, Any] | None:
    steps, loss = run.values("loss")
    if len(loss) < MIN_POINTS:
        return None
    neg = loss < 0
    if neg.sum() < 2 or neg.mean() < 0.1:
        return None
    sign = np.sign(loss[loss != 0])
    changes = int(np.sum(sign[1:] != sign[:-1])) if len(sign) > 1 else 0
    low = int(np.argmin(loss))
    return _note(
        "loss_negative",
        f"loss is negative on {int(neg.sum())} of {len(loss)} logged steps (lowest {_g(float(loss[low]))} at step "
        f"{int(steps[low])}) and changes sign {changes} times",
        "GRPO's loss is minus the advantage-weighted ratio (plus beta x KL). Advantages are centred within each group "
        "and their batch mean comes out positive or negative from batch to batch, so the loss takes either sign; a "
        "negative loss is neither better nor worse.",
        "A loss that turns NaN or infinite is a real fault, and the Trainer's logging filter can hide it in the loss "
        "(non_finite also reads grad_norm, entropy and kl).",
        {"steps": len(loss), "negative_steps": int(neg.sum()), "sign_changes": changes, "min_loss": float(loss[low])})


def _kl_shape(run: _Run) -> dict[str, Any] | None:
    """A steady, moderate KL rise: its levels, or None when KL is absent, flat or exploding."""
    steps, kl = run.values("kl")
    if len(kl) < MIN_TREND_POINTS:
        return None
    first, middle, last = _thirds(kl)
    rho = _rank_corr(steps, kl)
    if rho < 0.6 or last <= 1.5 * first or last <= 0:
        return None
    if float(kl.max()) > KL_MODERATE_MAX or (middle > 0 and last > KL_ACCELERATION * middle):
        return None
    return {"kl_first": first, "kl_middle": middle, "kl_last": last, "kl_max": float(kl.max()), "kl_rank_corr": rho}


def _loss_rising(run: _Run) -> dict[str, Any] | None:
    steps, loss = run.values("loss")
    beta = run.cfg_number("beta")
    if len(loss) < MIN_TREND_POINTS or beta == 0:
        return None
    kl = _kl_shape(run)
    if kl is None:
        return None
    first, _, last = _thirds(loss)
    rho = _rank_corr(steps, loss)
    if rho < 0.5 or last <= first:
        return None
    b = f" (beta={_g(beta)})" if beta is not None else ""
    return _note(
        "loss_rising",
        f"loss rises from {_g(first)} to {_g(last)} (medians of the first and last third of the run) while kl rises "
        f"from {_g(kl['kl_first'])} to {_g(kl['kl_last'])}",
        f"With a KL penalty{b} the loss includes beta x KL to the reference model. As the policy learns it moves away "
        "from the reference, the KL term grows and the loss with it; the policy term itself stays near 0.",
        "KL growing faster than linearly, or far above 1, comes before collapses (sudden_collapse watches KL jumps "
        "against its trailing level, next to the reward).",
        {"loss_first": first, "loss_last": last, "loss_rank_corr": rho, **kl})


def clipping_never_fired(steps: Iterable[tuple[int, Mapping[str, Any]]]) -> bool:
    """The log's clip ratios (TRL's ``clip_ratio/*``) are exactly 0 at every one of at least ``MIN_POINTS``
    logged steps: whatever its config said, the run trained on-policy.

    >>> clipping_never_fired([(s, {"clip_ratio/region_mean": 0.0}) for s in range(1, 9)])
    True
    >>> clipping_never_fired([(1, {"clip_ratio/region_mean": 0.0}), (2, {"clip_ratio/region_mean": 0.01})])
    False
    """
    n = 0
    for _, metrics in steps:
        vals = [v for v in (finite(metrics.get(k)) for k in CLIP_KEYS) if v is not None]
        if not vals:
            continue
        if any(v != 0 for v in vals):
            return False
        n += 1
    return n >= MIN_POINTS


def _clip_ratio_zero(run: _Run) -> dict[str, Any] | None:
    logged = [k for k in CLIP_KEYS if len(run.values(k)[1])]
    if not logged:
        return None
    vals = np.concatenate([run.values(k)[1] for k in logged])
    n = max(len(run.values(k)[1]) for k in logged)
    if n < MIN_POINTS or np.any(vals != 0):
        return None
    on = _on_policy(run)
    if on is False:
        return None
    cfg = run.config
    if on:
        ga = int(cfg.get("gradient_accumulation_steps") or 1)
        spg = cfg.get("steps_per_generation") or ga
        why = (f"With num_iterations={int(cfg.get('num_iterations') or 1)} and steps_per_generation ({spg}) equal to "
               f"gradient_accumulation_steps ({ga}), every completion is trained on once, by the policy that sampled "
               "it: the importance ratio is exactly 1 and nothing can be clipped. It also means epsilon_high "
               "(clip-higher) and a sequence-level ratio change nothing in this run.")
    else:
        why = ("TRL's defaults (num_iterations=1, steps_per_generation equal to gradient_accumulation_steps) train each "
               "completion once, with the policy that sampled it: the importance ratio is exactly 1 and nothing is "
               "clipped. The log does not record those settings; this holds if the run kept them.")
    return _note(
        "clip_ratio_zero",
        f"{logged[0]} is exactly 0 on all {n} logged steps",
        why,
        "With num_iterations > 1 or steps_per_generation above gradient_accumulation_steps the ratio moves and some "
        "clipping is expected; clipping that bursts together with grad_norm is a spike (grad_norm_spike watches for it).",
        {"metrics": logged, "steps": n, "on_policy": on})


def _grad_norm_above_max(run: _Run) -> dict[str, Any] | None:
    steps, g = run.values("grad_norm")
    if len(g) < MIN_POINTS:
        return None
    cap = run.cfg_number("max_grad_norm")
    assumed = "max_grad_norm" not in run.config
    if assumed:
        cap = DEFAULT_MAX_GRAD_NORM
    if cap is None or cap <= 0:
        return None  # clipping off: the logged norm is the norm applied
    above = g > cap
    if not above.any() or run.has_infinite("grad_norm"):
        return None
    if len(_spikes(g)) or float(g.max()) > SPIKE_FACTOR * float(np.median(g)):
        return None  # far above the run's own level: a spike, whatever the clipping
    top = int(np.argmax(g))
    unsaid = " (TRL's default; the recorded config does not set it)" if run.config else " (TRL's default; the log does not record it)"
    said = f"max_grad_norm={_g(cap)}" + (unsaid if assumed else "")
    deepspeed = " Under DeepSpeed the clipping is DeepSpeed's own gradient_clipping, and the logged value is again the norm before it." \
        if run.config.get("deepspeed") else ""
    return _note(
        "grad_norm_above_max",
        f"grad_norm exceeds {said} on {int(above.sum())} of {len(g)} logged steps (median {_g(float(np.median(g)))}, "
        f"highest {_g(float(g[top]))} at step {int(steps[top])})",
        "The Trainer logs the gradient norm measured before clipping; the update itself uses the gradient scaled "
        f"down to max_grad_norm.{deepspeed}",
        f"Not normal when DeepSpeed runs without gradient_clipping (max_grad_norm is then ignored), or when grad_norm "
        f"jumps above {SPIKE_FACTOR:g}x its trailing median (grad_norm_spike watches for that).",
        {"max_grad_norm": cap, "assumed_default": assumed, "steps": len(g), "steps_above": int(above.sum()),
         "grad_norm_median": float(np.median(g)), "grad_norm_max": float(g[top]), "max_step": int(steps[top])})


def _kl_rising(run: _Run) -> dict[str, Any] | None:
    kl = _kl_shape(run)
    if kl is None:
        return None
    beta = run.cfg_number("beta")
    b = f" (beta={_g(beta)})" if beta is not None else ""
    return _note(
        "kl_rising",
        f"kl rises steadily from {_g(kl['kl_first'])} to {_g(kl['kl_last'])} (medians of the first and last third; "
        f"rank correlation with the step {kl['kl_rank_corr']:.2f}), peak {_g(kl['kl_max'])}",
        f"KL to the reference model grows as the policy learns and moves away from it; the KL penalty{b} only keeps it "
        "from growing without bound. A steady, moderate rise is drift, not divergence.",
        f"Growth faster than linear, or values far above {KL_MODERATE_MAX:g}, come before collapses (sudden_collapse "
        "watches KL jumps against its trailing level).",
        kl)


def _reward_std_falling(run: _Run) -> dict[str, Any] | None:
    steps, rs = run.values("reward_std")
    _, r = run.values("reward")
    if len(rs) < MIN_TREND_POINTS or len(r) < MIN_TREND_POINTS:
        return None
    a, _, b = _thirds(rs)
    ra, _, rb = _thirds(r)
    if not (a > 0 and b < 0.6 * a) or _rank_corr(steps, rs) > -0.3 or rb < ra:
        return None
    _, fz = run.values("frac_reward_zero_std")
    fz_last = _thirds(fz)[2] if len(fz) >= MIN_TREND_POINTS else None
    if fz_last is not None and fz_last >= 0.5:
        return None
    _, h = run.values("entropy")
    if len(h) >= MIN_TREND_POINTS:
        h0, _, h1 = _thirds(h)
        if h0 > 0 and h1 < 0.35 * h0:
            return None  # diversity lost with entropy: entropy_collapse's case, not consistency
    ev: dict[str, Any] = {"reward_std_first": a, "reward_std_last": b, "reward_first": ra, "reward_last": rb}
    if fz_last is not None:
        ev["frac_reward_zero_std_last"] = fz_last
    return _note(
        "reward_std_falling",
        f"reward_std falls from {_g(a)} to {_g(b)} while reward rises from {_g(ra)} to {_g(rb)} (medians of the first "
        "and last third)",
        "As the policy gets better at a prompt its completions agree more often, so the spread of rewards within a "
        "group shrinks. That is consistency, not collapse, while groups still disagree somewhere"
        + (f" (frac_reward_zero_std {_g(fz_last)} at the end)." if fz_last is not None else "."),
        "When frac_reward_zero_std approaches 1 while the reward is below its ceiling, no group carries a learning "
        "signal any more (no_learning_signal; entropy_collapse when entropy falls with it).",
        ev)


def _length_falling(run: _Run) -> dict[str, Any] | None:
    steps, L = run.values("completions/mean_length")
    if len(L) < MIN_TREND_POINTS:
        return None
    a, _, b = _thirds(L)
    if not (a > 0 and b <= 0.85 * a) or _rank_corr(steps, L) > -0.3:
        return None
    if b < 0.25 * a or b < 8:
        return None  # shrinking to a fraction or to a few tokens is collapse, not trimming
    _, clipped = run.values("completions/clipped_ratio")
    if len(clipped) and float(np.median(clipped)) >= 0.2:
        return None  # length falling under truncation: the cap, not the policy
    key, name = resolve_correctness(run.context, run.columns.keys())
    _, c = run.values(key)
    if len(c) < MIN_TREND_POINTS:
        return None
    ca, _, cb = _thirds(c)
    if cb <= ca:
        return None
    return _note(
        "length_falling",
        f"completions/mean_length falls from {_g(a)} to {_g(b)} tokens while {key} rises from {_g(ca)} to {_g(cb)} "
        "(medians of the first and last third)",
        "Early in GRPO the policy learns the answer format and drops rambling, so completions get shorter while the "
        "reward rises; not every task lengthens its chains of thought.",
        "Length falling under a high completions/clipped_ratio is the cap at work (truncation watches for it); length "
        "falling while correctness falls, or down to a few tokens, is collapse (length_collapse, "
        "reward_component_divergence).",
        {"length_first": a, "length_last": b, "measure": key, "measure_first": ca, "measure_last": cb,
         "clipped_ratio_median": float(np.median(clipped)) if len(clipped) else None})


def _reward_zero_at_start(run: _Run) -> dict[str, Any] | None:
    steps, r = run.values("reward")
    if len(r) < MIN_TREND_POINTS:
        return None
    zero = np.abs(r) <= 1e-12
    k = int(np.argmax(~zero)) if (~zero).any() else len(r)
    rest = r[k:]
    if k < 2 or len(rest) < MIN_POINTS or np.mean(rest > 0) < 0.5:
        return None
    _, fz = run.values("frac_reward_zero_std")
    later = fz[-max(1, len(fz) // 3):] if len(fz) else fz
    if len(later) and float(np.median(later)) >= 0.5:
        return None
    return _note(
        "reward_zero_at_start",
        f"reward is 0 on the first {k} logged steps (to step {int(steps[k - 1])}), then rises to "
        f"{_g(float(np.median(rest[-max(1, len(rest) // 3):])))}",
        "A run that starts from a model which has not yet produced the format its reward asks for (R1-Zero style) "
        "scores 0 in every group until some completion hits it; from then on the reward appears and learning starts.",
        "A reward that stays at 0 with frac_reward_zero_std near 1 means nothing is learning (no_learning_signal); "
        "check the reward functions with grpo-monitor inspect-rewards.",
        {"zero_steps": k, "last_zero_step": int(steps[k - 1])})


def _capped_but_learning(run: _Run) -> dict[str, Any] | None:
    _, clipped = run.values("completions/clipped_ratio")
    steps, r = run.values("reward")
    if len(clipped) < MIN_TREND_POINTS or len(r) < MIN_TREND_POINTS or float(np.median(clipped)) < 0.95:
        return None
    _, fz = run.values("frac_reward_zero_std")
    _, rs = run.values("reward_std")
    spread = float(np.median(fz)) < 0.5 if len(fz) else (len(rs) > 0 and float(np.median(rs)) > 1e-6)
    a, _, b = _thirds(r)
    if not spread or b <= a or _rank_corr(steps, r) < 0.3:
        return None
    return _note(
        "capped_but_learning",
        f"completions/clipped_ratio stays at {_g(float(np.median(clipped)))} (nearly every completion cut at the length "
        f"cap) while reward rises from {_g(a)} to {_g(b)} (medians of the first and last third)",
        "Cut completions still score differently within their groups (the reward's spread is there), so GRPO has "
        "advantages to follow and the run learns within the budget it has; the cap is a choice, not a broken run.",
        "Completions cut mid-thought may be why the reward is not higher: raising max_completion_length, or asking "
        "for shorter answers, is worth a try. If the reward stops rising while every group scores alike, nothing is "
        "learning any more (no_learning_signal).",
        {"clipped_ratio_median": float(np.median(clipped)), "reward_first": a, "reward_last": b})


def _component_std_vs_group_std(run: _Run) -> dict[str, Any] | None:
    rs_col = run.columns.get("reward_std")
    comps = [n for n in run.columns if n.startswith("rewards/") and n.endswith("/std")]
    if rs_col is None or not comps:
        return None
    rs = np.asarray(rs_col, dtype=np.float64)
    best: tuple[int, str, float] | None = None
    hits = np.zeros(len(rs), dtype=bool)
    for name in comps:
        c = np.asarray(run.columns[name], dtype=np.float64)
        with np.errstate(invalid="ignore"):
            hit = np.isfinite(rs) & (np.abs(rs) <= 1e-9) & np.isfinite(c) & (c > 1e-6)
        if hit.any():
            hits |= hit
            i = int(np.flatnonzero(hit)[0])
            if best is None or i < best[0]:
                best = (i, name, float(c[i]))
    if best is None:
        return None
    logged = int(np.isfinite(rs).sum())
    _, fz = run.values("frac_reward_zero_std")
    if hits.sum() > 0.2 * logged or (len(fz) >= MIN_TREND_POINTS and _thirds(fz)[2] >= 0.5):
        return None  # no longer a metric puzzle but a run without signal: no_learning_signal's finding says so
    i, name, v = best
    return _note(
        "component_std_vs_group_std",
        f"on {int(hits.sum())} logged steps reward_std is 0 while {name} is above 0 (step {int(run.steps[i])}: {_g(v)})",
        "rewards/<f>/std is the spread of one function over the whole batch, across prompts; reward_std is the spread "
        "within each group of completions of one prompt, averaged. Prompts can score differently while every "
        "completion of a prompt scores alike: the batch spread is then above 0 and the group spread 0. Both metrics "
        "are right.",
        "Those steps carry no learning signal (every advantage is 0); if it lasts, no_learning_signal raises it.",
        {"steps": int(hits.sum()), "first_step": int(run.steps[i]), "component": name, "component_std": v})


def _is_ratio_not_one(run: _Run) -> dict[str, Any] | None:
    _, m = run.values("sampling/importance_sampling_ratio/mean")
    if len(m) < MIN_POINTS:
        return None
    dev = float(np.median(np.abs(m - 1.0)))
    lo, hi = float(m.min()), float(m.max())
    if dev < 0.002 or lo < IS_BAND[0] or hi > IS_BAND[1]:
        return None
    # The mean can sit in the band while the gap grows elsewhere: a widening extreme, a falling
    # minimum, a log-prob difference or KL between the engines that keeps rising.
    for key, rises in (("sampling/importance_sampling_ratio/max", True), ("sampling/importance_sampling_ratio/min", False),
                       ("sampling/sampling_logp_difference/mean", True), ("mismatch/kl", True)):
        _, x = run.values(key)
        if len(x) < MIN_TREND_POINTS:
            continue
        first, _, last = _thirds(x)
        if (rises and last > 3 * first) or (not rises and last < first / 3):
            return None
    return _note(
        "is_ratio_not_one",
        f"sampling/importance_sampling_ratio/mean is not 1: it ranges {_g(lo)} to {_g(hi)} (median distance from 1 "
        f"{_g(dev)})",
        "vLLM and the trainer compute the same log-probabilities with different kernels and precision, so their "
        f"ratio scatters around 1 even with identical weights; {IS_BAND[0]:g} to {IS_BAND[1]:g} is typical at temperature 1.",
        "A mean far from 1, a minimum near 0, or a gap that keeps growing is a real train-inference mismatch "
        "(rollout_mismatch watches its trend against the run's early level).",
        {"min": lo, "max": hi, "median_abs_deviation_from_1": dev, "steps": len(m)})


def _reward_negative(run: _Run) -> dict[str, Any] | None:
    _, r = run.values("reward")
    if len(r) < MIN_POINTS:
        return None
    neg = r < 0
    if neg.sum() < 2 or neg.mean() < 0.1:
        return None
    return _note(
        "reward_negative",
        f"reward is negative on {int(neg.sum())} of {len(r)} logged steps (lowest {_g(float(r.min()))})",
        "GRPO uses only the ranking of completions within a group: the advantage is the reward minus its group's "
        "mean (divided by the group's spread), so a constant offset, or a scale that makes every reward negative, "
        "changes nothing in the update.",
        "A reward that is the same for every completion of a prompt gives no signal whatever its sign "
        "(no_learning_signal).",
        {"steps": len(r), "negative_steps": int(neg.sum()), "min_reward": float(r.min())})


def _advantage_mean_zero(run: _Run) -> dict[str, Any] | None:
    for key in ADVANTAGE_KEYS:
        _, a = run.values(key)
        if len(a) >= MIN_POINTS:
            break
    else:
        return None
    near = np.abs(a) <= 0.05
    if near.mean() < 0.8:
        return None
    return _note(
        "advantage_mean_zero",
        f"{key} is within ±0.05 of 0 on {int(near.sum())} of {len(a)} logged steps (median {_g(float(np.median(a)))})",
        "Advantages are rewards centred on their group's mean, so their mean is 0 by construction. The update comes "
        "from which completions sit above or below their group, not from the mean, and not only from the KL term.",
        "What matters is their spread: groups whose completions all score alike give advantages of exactly 0 "
        "(no_learning_signal watches reward_std and frac_reward_zero_std).",
        {"metric": key, "steps": len(a), "near_zero_steps": int(near.sum())})


def _format_reward_saturated(run: _Run) -> dict[str, Any] | None:
    names = reward_names_in(run.columns.keys())
    name = run.context.format_reward or reward_roles(names)[1]
    if not name:
        return None
    steps, mean = run.values(f"rewards/{name}/mean")
    _, std = run.values(f"rewards/{name}/std")
    if len(mean) < MIN_POINTS or len(std) != len(mean):
        return None
    pinned = (np.abs(std) <= 1e-9) & (mean > 1e-9)
    if pinned.sum() < MIN_POINTS or not pinned[-MIN_POINTS:].all():
        return None
    first = int(np.flatnonzero(pinned)[0])
    value = float(mean[-1])
    if np.ptp(mean[pinned]) > 1e-9:
        return None  # one value per batch, not a saturated score: reward_function_bug's case
    _, rs = run.values("reward_std")
    return _note(
        "format_reward_saturated",
        f"{name} pays {_g(value)} to every completion (std 0) on {int(pinned.sum())} of {len(mean)} logged steps, "
        f"since step {int(steps[first])}",
        "The model already writes the format the reward asks for (instruct models do from the start; a run learns it "
        "early): the format reward is saturated. It gives every completion of a group the same score, so it carries no "
        "advantage and needs none; the other components carry the learning signal"
        + (f" (reward_std median {_g(float(np.median(rs)))})." if len(rs) else "."),
        "A format reward pinned at 0 from the start is a broken function (reward_function_bug). Pinned at its full "
        "score because the chat template writes the format into the prompt, it pays for nothing the model does: "
        "grpo-monitor inspect-rewards checks the template before training.",
        {"component": name, "value": value, "steps_pinned": int(pinned.sum()), "since_step": int(steps[first])})


_NOTES: tuple[Callable[[_Run], dict[str, Any] | None], ...] = (
    _loss_near_zero, _loss_negative, _loss_rising, _clip_ratio_zero, _grad_norm_above_max, _kl_rising,
    _reward_std_falling, _length_falling, _reward_zero_at_start, _component_std_vs_group_std, _is_ratio_not_one,
    _reward_negative, _advantage_mean_zero, _capped_but_learning, _format_reward_saturated,
)
_reported: set[str] = set()


# -- entry points ---------------------------------------------------------------------------------


def _context(config: Mapping[str, Any] | RunContext | None) -> RunContext:
    if isinstance(config, RunContext):
        return config
    return RunContext(config=dict(config or {}))


def explain_columns(steps: Any, columns: Mapping[str, Any], config: Mapping[str, Any] | RunContext | None = None) -> list[dict[str, Any]]:
    """The notes for a run given as a step array and one value array per metric (NaN: not logged then)."""
    run = _Run(np.asarray(steps, dtype=np.float64), columns, _context(config))
    out = []
    for build in _NOTES:
        try:
            note = build(run)
        except Exception as exc:  # advice only: a note that cannot be computed is left out, once said
            if build.__name__ not in _reported:
                _reported.add(build.__name__)
                log.warning("grpo-monitor: note %s skipped (%s: %s)", build.__name__.lstrip("_"), type(exc).__name__, exc)
            continue
        if note is not None:
            out.append(note)
    return out


def explain(steps: Any, config: Mapping[str, Any] | RunContext | None = None) -> list[dict[str, Any]]:
    """Notes on the patterns in a run's metrics that look wrong but are normal GRPO behaviour.

    ``steps``: a DataFrame indexed by step (``grpo_monitor.load_run``), ``(step, metrics)`` pairs (a
    prepared source's ``steps``), or per-step dicts (``{"step": 3, "loss": ...}`` or run-log step records
    ``{"step": 3, "metrics": {...}}``). ``config``: the run's config (``RunContext.config``; empty for
    foreign logs) or its ``RunContext``. Each note is ``{"id", "pattern", "why", "unless", "watched_by",
    "evidence"}``; ``watched_by`` names the detectors that raise the real problem the note rules out.

    >>> [n["id"] for n in explain([{"step": s, "reward": -1.0 + 0.01 * s, "reward_std": 0.3} for s in range(1, 11)])]
    ['reward_negative']
    """
    step_array, columns = _as_columns(steps)
    return explain_columns(step_array, columns, config)


def _as_columns(steps: Any) -> tuple[np.ndarray, Mapping[str, np.ndarray]]:
    if hasattr(steps, "columns") and hasattr(steps, "index"):  # a DataFrame
        frame = steps
        if "step" in frame.columns:
            at = np.asarray(frame["step"], dtype=np.float64)
        else:
            try:
                at = np.asarray(frame.index, dtype=np.float64)
            except (TypeError, ValueError):
                at = np.arange(1, len(frame) + 1, dtype=np.float64)
        cols = {}
        for name in frame.columns:
            if name in ("step", "segment"):
                continue
            try:
                cols[str(name)] = np.asarray(frame[name], dtype=np.float64)
            except (TypeError, ValueError):
                continue
        return at, cols
    rows = list(_rows(steps))
    at = np.array([s for s, _ in rows], dtype=np.float64)
    return at, _LazyColumns([m for _, m in rows])


class _LazyColumns(Mapping[str, np.ndarray]):
    """The metrics a note reads, each built into an array the first time a note asks for it: a long
    run's other columns (and those of notes that stop early) are never built."""

    def __init__(self, rows: list[Mapping[str, Any]]) -> None:
        self._rows = rows
        keys = set().union(*(m.keys() for m in rows)) if rows else set()
        self._names = sorted(k for k in keys if isinstance(k, str) and _read(k))
        self._built: dict[str, np.ndarray] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        col = self._built.get(name)
        if col is None:
            if name not in self._names:
                raise KeyError(name)
            values = [m.get(name) for m in self._rows]
            try:
                col = np.array(values, dtype=np.float64)  # floats and None (a gap, NaN here): the common case
            except (TypeError, ValueError):
                col = np.array([number_or_nan(v) for v in values], dtype=np.float64)
            self._built[name] = col
        return col

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


_READ = frozenset(("loss", "grad_norm", "reward", "reward_std", "frac_reward_zero_std", "kl", "entropy",
                   "completions/mean_length", "completions/clipped_ratio", *CLIP_KEYS, *ADVANTAGE_KEYS))


def _read(name: str) -> bool:
    """Whether a note reads this metric (a long run's other columns are never built)."""
    return name in _READ or name.startswith(("rewards/", "sampling/", "mismatch/"))


def _rows(steps: Iterable[Any]) -> Iterable[tuple[float, Mapping[str, Any]]]:
    for i, item in enumerate(steps, 1):
        if isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], Mapping):
            yield number_or_nan(item[0]), item[1]
        elif isinstance(item, Mapping):
            step = number_or_nan(item.get("step", i))
            metrics = item.get("metrics")
            yield (step if math.isfinite(step) else float(i)), (metrics if isinstance(metrics, Mapping) else
                                                                 {k: v for k, v in item.items() if k != "step"})


def render_lines(notes: Iterable[Mapping[str, Any]], indent: str = "  ") -> list[str]:
    """Notes as text lines: the pattern, then why it is fine and when it would not be."""
    out = []
    for n in notes:
        out.append(f"{indent}{n['id']}: {n['pattern']}")
        out.append(f"{indent}    why: {n['why']}")
        out.append(f"{indent}    unless: {n['unless']}")
    return out
