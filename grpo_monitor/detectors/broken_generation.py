"""Broken generation: the generator produces garbage from the first updates, or runs on stale weights.

Two failures of the rollout side, both present from the start of a run (or of a resumed segment):

- Garbage after the first optimiser steps (``!!!!`` to the cap: token 0 repeated, the sign of NaN
  logits or corrupted weights in the engine; gibberish after step 1 under fp16). Read from the
  completions: the tap records each one's number of distinct token ids, so a completion of one
  token repeated is plain even without spaces; logs without it fall back to the recorded text.
  Within ``early_steps`` training steps of the first logged step, half the completions being
  garbage is evidence, and with the reward down from its first level (by ``drop_frac``), at
  zero, or every completion at the cap, it is critical. Without samples, the reward falling by
  ``drop_frac`` from its first level together with completions at the cap and every group scoring
  alike, on two points, is the same failure, unless the first point was already there (truncation).
- Stale generator weights (vLLM sleep mode or LoRA adapters not synchronised, a resume that
  reloads the old adapter): the engine keeps sampling from the initial policy while the trainer
  moves, so the train-inference log-prob gap (``sampling/sampling_logp_difference/mean``) grows
  steadily from the first step while the reward stays flat and the gradient is not zero. A drift
  that starts later is ``rollout_mismatch``'s; this one is judged within ``stale_steps`` of the start.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from grpo_monitor.detectors.base import Assessment, Detector, Metrics, Sample, check_float, check_int, finite
from grpo_monitor.detectors.signals import fair_sample, get, sample_length, sample_top_word_share
from grpo_monitor.detectors.stats import mann_kendall, median

GAP = "sampling/sampling_logp_difference/mean"


def one_token_text(text: str) -> bool | None:
    """Whether a completion's text is one character (or word) repeated: ``!!!!…``, ``a a a a…``
    (None: too short to tell).

    >>> one_token_text("!!!!!!!!!!!!!!!!"), one_token_text("The answer is 42."), one_token_text("ok")
    (True, False, None)
    """
    body = (text[:256] + text[-256:] if len(text) > 512 else text).replace(" ", "").replace("\n", "")
    if len(body) < 8:
        return None
    chars = set(body)
    if len(chars) <= 4:
        top = max(body.count(c) for c in chars)
        if top >= 0.9 * len(body):
            return True
    share = sample_top_word_share({"completion": text})
    return share is not None and share >= 0.9


def garbage_completion(sample: Mapping[str, Any]) -> bool | None:
    """A completion made of one token repeated (None: cannot tell). The tap's ``distinct_tokens``
    when recorded, else its ``top_word``, else the recorded text."""
    d = sample.get("distinct_tokens")
    L = sample_length(sample)
    if type(d) is int and L is not None:
        return d <= 3 if L >= 8 else None
    text = sample.get("completion")
    if isinstance(text, str):
        return one_token_text(text)
    if "tail_rep" in sample:
        v = finite(sample.get("top_word"))
        return v is not None and v >= 0.9
    return None


def garbage_share(samples: Sequence[Sample], max_samples: int = 256, min_samples: int = 4) -> tuple[float, int] | None:
    """Share of the measurable completions that are garbage, and how many were measurable."""
    n = bad = 0
    for s in fair_sample(samples, max_samples):
        if type(s) is not dict and not isinstance(s, Mapping):
            continue
        g = garbage_completion(s)
        if g is None:
            continue
        n += 1
        bad += g
    return (bad / n, n) if n >= min_samples else None


class BrokenGeneration(Detector):
    """Garbage completions right after the first updates, or a generator left on stale weights.

    Parameters: ``early_steps`` (training steps after the first logged step within which garbage
    counts as a broken generator; later it is a collapse), ``garbage_frac`` (share of garbage
    completions that is evidence), ``drop_frac`` (the fall of the reward from its first level that
    corroborates), ``stale_steps`` (training steps from the start within which the stale-weights
    trend is judged; coarse logs get eight points), ``stale_ratio`` (growth of the log-prob gap over its first level),
    ``min_points`` (logged points the trend needs).

    >>> det = BrokenGeneration()
    >>> found = []
    >>> for step in range(1, 11):
    ...     broken = step >= 2
    ...     rows = [{"group": i // 8, "length": 256 if broken else 40 + i, "distinct_tokens": 1 if broken else 25 + i}
    ...             for i in range(32)]
    ...     found += det.update(step, {"reward": 0.0 if broken else 0.6, "completions/clipped_ratio": 1.0 if broken else 0.1},
    ...                         rows)
    >>> [(f.severity, f.step, f.onset_step, f.evidence["mode"]) for f in found]
    [('critical', 2, 1, 'garbage_after_first_update')]
    """

    id = "broken_generation"
    variant = None
    requires = (("samples",), ("reward", "completions/clipped_ratio", "frac_reward_zero_std"), (GAP, "reward"))

    def __init__(self, early_steps: int = 10, garbage_frac: float = 0.5, drop_frac: float = 0.8, stale_steps: int = 60,
                 stale_ratio: float = 2.0, min_points: int = 5) -> None:
        self.early_steps = check_int("early_steps", early_steps, 1)
        self.garbage_frac = check_float("garbage_frac", garbage_frac, 0.0, 1.0, low_open=True)
        self.drop_frac = check_float("drop_frac", drop_frac, 0.0, 1.0, low_open=True, high_open=True)
        self.stale_steps = check_int("stale_steps", stale_steps, 2)
        self.stale_ratio = check_float("stale_ratio", stale_ratio, 1.0, 1e6, low_open=True)
        self.min_points = check_int("min_points", min_points, 4)
        super().__init__()


    def _reset_state(self) -> None:
        self.first_step: int | None = None
        self.first_reward: float | None = None
        self.first_was_stuck = False
        self.bad_run = 0
        self.broken_level = 0  # the garbage episode's level, kept while the reward stays down
        self.mode: str | None = None
        self.gaps: list[float] = []
        self.gap_rewards: list[float] = []
        self.grads: list[float] = []
        self.stale_level = 0
        self.stale_first: float | None = None
        self.done_early = False
        self.done_stale = False

    # -- garbage after the first update ---------------------------------------------------------

    def _garbage(self, step: int, metrics: Metrics, samples: Sequence[Sample], ev: dict[str, Any]) -> int:
        r = get(metrics, "reward")
        clip, zero = get(metrics, "completions/clipped_ratio"), get(metrics, "frac_reward_zero_std")
        if self.first_reward is None and r is not None:
            self.first_reward = r
            # Already at the cap with every group alike before any update counts: truncation, not a broken engine.
            self.first_was_stuck = (clip is not None and clip >= 0.5) or (zero is not None and zero >= 0.5)
        early = step <= (self.first_step or step) + max(self.early_steps, self._gap())
        if not early and not self.broken_level:
            self.done_early = True
            return 0
        got = garbage_share(samples) if samples else None
        g = got[0] if got else None
        r0 = self.first_reward
        dropped = r is not None and r0 is not None and r0 > 0 and r <= (1 - self.drop_frac) * r0
        capped = clip is not None and clip >= 0.9
        alike = zero is not None and zero >= 0.9
        garbage = g is not None and g >= self.garbage_frac
        ev.update({"reward": finite(r), "first_reward": finite(r0), "clipped_ratio": finite(clip), "frac_reward_zero_std": finite(zero)})
        if got:
            ev.update({"garbage_share": finite(g), "measured_completions": got[1]})
        if not early:
            # Past the start: the episode lasts while the reward stays down or the garbage stays.
            if garbage or dropped:
                return self.broken_level
            self.broken_level = 0
            self.done_early = True
            return 0
        bad = garbage or (dropped and capped and alike and not self.first_was_stuck)
        self.bad_run = self.bad_run + 1 if bad else 0
        level = 0
        if garbage and (dropped or capped or alike or (r is not None and r <= 0)):
            level = 2
        elif bad:
            level = 2 if self.bad_run >= 2 else 1
        if level:
            self.broken_level = max(self.broken_level, level)
            signs = [n for n, on in (("garbage_completions", garbage), ("reward_dropped", dropped),
                                     ("completions_at_cap", capped), ("groups_alike", alike)) if on]
            ev.update({"mode": "garbage_after_first_update", "signs": signs, "first_step": self.first_step,
                       "advice": ("The generator produces garbage from the first updates (one token repeated: NaN "
                                  "logits or corrupted weights in the engine). Check the weight sync to vLLM "
                                  "(vllm_enable_sleep_mode, LoRA merge), the dtype (fp16 on GPUs without bf16 "
                                  "overflows: use fp32 or bf16), and that a resumed run loads the right weights.")})
        return level

    def _gap(self) -> int:
        """Steps per logged point; before a second point shows it, the run's ``logging_steps``."""
        return self.clock.gap if len(self.clock.steps) >= 2 else max(1, int(self.context.logging_steps or 1))

    # -- stale weights ---------------------------------------------------------------------------

    def _stale_span(self) -> int:
        """Training steps from the start judged for the trend: ``stale_steps``, and on coarse logs
        enough for eight points."""
        return max(self.stale_steps, 8 * self._gap())

    def _stale(self, step: int, metrics: Metrics, ev: dict[str, Any]) -> int:
        d = get(metrics, GAP)
        if d is None or d < 0:
            return self.stale_level
        r = get(metrics, "reward")
        if step > (self.first_step or step) + self._stale_span():
            self.gaps, self.gap_rewards, self.grads = [], [], []
            if self.stale_level and self.stale_first is not None and d < self.stale_ratio * self.stale_first:
                self.stale_level = 0
            return self.stale_level
        if r is None:
            return 0
        self.gaps.append(d)
        self.gap_rewards.append(r)
        gn = get(metrics, "grad_norm")
        if gn is not None:
            self.grads.append(gn)
        n = len(self.gaps)
        if n < self.min_points:
            return 0
        head = median(self.gaps[:3])
        tail = median(self.gaps[-3:])
        trend = mann_kendall(self.gaps)
        rew = mann_kendall(self.gap_rewards)
        grad = median(self.grads) if self.grads else None
        ratio = tail / head if head > 0 else None
        rising = trend.tau >= 0.6 and trend.p_up <= 0.01 and ratio is not None and ratio >= self.stale_ratio and tail >= 0.02
        flat = rew.p_up > 0.05
        learning = grad is None or grad > 0
        level = 0
        if rising and flat and learning:
            level = 2 if ratio is not None and ratio >= self.stale_ratio ** 2 else 1
            self.stale_level = max(self.stale_level, level)
            self.stale_first = head
            sleep = (self.context.config or {}).get("vllm_enable_sleep_mode") is True
            ev.update({"mode": "stale_generator_weights", "logp_gap_first": finite(head), "logp_gap_recent": finite(tail),
                       "logp_gap_ratio": finite(ratio), "gap_trend": trend.as_evidence(), "reward_trend_p_up": finite(rew.p_up),
                       "grad_norm_median": finite(grad), "points": n, "first_step": self.first_step,
                       "advice": ("The train-inference gap grows from the first step while the reward stays flat: the "
                                  "generator samples from weights the trainer no longer has. Check the weight sync "
                                  "(vllm_enable_sleep_mode with colocate, LoRA adapters merged or reloaded into vLLM) "
                                  "and, after a resume, that the engine loads the checkpoint's weights.")})
            if sleep:
                ev["remedy"] = "disable_vllm_sleep_mode"
        elif self.stale_level and self.stale_first is not None and d >= self.stale_ratio * self.stale_first:
            return self.stale_level  # a noisy point does not end it while the gap stays up
        return level

    def assess(self, step: int, metrics: Metrics, samples: Sequence[Sample]) -> Assessment | None:
        if self.done_early and self.done_stale:  # both start windows are over and nothing is open
            return None
        if self.first_step is None:
            if get(metrics, "reward") is None and not samples and get(metrics, GAP) is None:
                return None
            self.first_step = step
        ev: dict[str, Any] = {}
        level = self._garbage(step, metrics, samples, ev) if not self.done_early else 0
        mode = ev.get("mode") or (self.mode if level else None)
        if not self.done_stale:
            ev2: dict[str, Any] = {}
            stale = self._stale(step, metrics, ev2)
            if step > self.first_step + self._stale_span() and not self.stale_level:
                self.done_stale = True
            if stale > level:
                level, ev, mode = stale, {**ev, **ev2}, "stale_generator_weights"
        if level:
            self.mode = mode
            ev["mode"] = mode
        return Assessment(level=level, evidence=ev, onset_step=self.first_step if level else None)

    def _overrides(self) -> dict[str, Any]:
        if self.mode == "stale_generator_weights" and (self.context.config or {}).get("vllm_enable_sleep_mode") is True:
            return {"vllm_enable_sleep_mode": False}
        return {}

    def _message(self, severity: str, evidence: Mapping[str, Any]) -> str:
        if evidence.get("mode") == "stale_generator_weights":
            return (f"The generator seems to run on stale weights: the train-inference log-prob gap grew from "
                    f"{evidence.get('logp_gap_first')} to {evidence.get('logp_gap_recent')} since the first step while the "
                    f"reward stayed flat (grad_norm {evidence.get('grad_norm_median')} > 0). Check the weight sync to "
                    "the inference engine (sleep mode, LoRA) and the resume path.")
        signs = ", ".join(str(s).replace("_", " ") for s in evidence.get("signs") or [])
        share = evidence.get("garbage_share")
        what = f"{share} of completions are one token repeated" if share is not None else "the reward collapsed"
        return (f"Broken generation right after the first updates: {what} (with: {signs}); reward "
                f"{evidence.get('first_reward')} at the first logged step, {evidence.get('reward')} now. Check the "
                "inference engine's weight sync, the dtype and the resumed weights before training on.")
