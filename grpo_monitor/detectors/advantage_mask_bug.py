"""Advantage or mask bugs: logged statistics that no correct GRPO implementation can produce.

Two invariants are checked, each on several logged points in a row:

- Every completion of a batch the same length (``completions/min_length`` = ``max_length`` =
  ``mean_length``) while most of them ended before the cap (``clipped_ratio`` <= 0.9): the length is
  counted over positions past the end of the text, e.g. post-EOS positions filled with the EOS id
  and counted by the completion mask, so the loss and the advantages see padding as text. A task
  whose answers really are one fixed short length (a label, a digit) gives the same length at every
  step and far below the cap; that is left alone. So is a run that logged different lengths within a
  batch before: its mask counts correctly, and a few completions of one format can all come out alike.
- Normalised advantages that vanish (``advantages/max`` and ``/min`` within 1e-3 of zero
  relative to the raw reward spread) while groups do differ in reward (``reward_std`` > 0): the
  standard deviation was taken of already-centred rewards, or the advantages are scaled away.

No configuration flag fixes code; the finding is critical and says where to look.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from grpo_monitor.detectors.base import Assessment, Detector, Metrics, Sample, check_float, check_int, finite
from grpo_monitor.detectors.signals import get

MEAN, LO, HI, CLIP = "completions/mean_length", "completions/min_length", "completions/max_length", "completions/clipped_ratio"
ADV_MAX, ADV_MIN = "advantages/max", "advantages/min"
SHORT_ANSWER_TOKENS = 16  # a label, a number, a yes/no with its end token


class AdvantageMaskBug(Detector):
    """Equal completion lengths with completions ending before the cap, or vanishing advantages.

    Parameters: ``persist_points`` (consecutive training steps that must violate an invariant, in
    logged points: a point of a coarse log covers several), ``short_frac`` (a length
    held constant at every step below this share of the cap is a fixed-length answer, not a bug),
    ``adv_ratio`` (advantages smaller than this share of the reward spread have vanished),
    ``max_clipped`` (equal lengths count only while at most this share of completions is truncated).

    >>> det = AdvantageMaskBug()
    >>> found = []
    >>> for step in range(1, 9):
    ...     L = 100.0 + 7 * step
    ...     found += det.update(step, {"completions/min_length": L, "completions/max_length": L,
    ...                               "completions/mean_length": L, "completions/clipped_ratio": 0.25})
    >>> [(f.severity, f.step, f.onset_step, f.evidence["invariant"]) for f in found]
    [('critical', 3, 1, 'equal_lengths')]
    """

    id = "advantage_mask_bug"
    variant = None
    role = "guard"  # an implementation check: a run it alone could read is not judged
    requires = ((f"{LO}", f"{HI}", f"{MEAN}", f"{CLIP}"), (ADV_MAX, "reward_std"))

    def __init__(self, persist_points: int = 3, short_frac: float = 0.5, adv_ratio: float = 1e-3,
                 max_clipped: float = 0.9) -> None:
        self.persist_points = check_int("persist_points", persist_points, 2)
        self.max_clipped = check_float("max_clipped", max_clipped, 0.0, 1.0, high_open=True)
        self.short_frac = check_float("short_frac", short_frac, 0.0, 1.0)
        self.adv_ratio = check_float("adv_ratio", adv_ratio, 0.0, 1.0, low_open=True)
        super().__init__()

    def _reset_state(self) -> None:
        self.equal_run = 0
        self.equal_since: int | None = None
        self.equal_values: deque[float] = deque(maxlen=8)
        self.equal_clipped: deque[float] = deque(maxlen=8)
        self.adv_run = 0
        self.adv_since: int | None = None
        self.adv_last: dict[str, Any] = {}
        self.distinct_at: int | None = None
        cap = (self.context.config or {}).get("max_completion_length")
        self.cap = float(cap) if isinstance(cap, (int, float)) and not isinstance(cap, bool) and cap > 0 else None

    def _equal_lengths(self, step: int, metrics: Metrics) -> bool | None:
        lo, hi = get(metrics, LO), get(metrics, HI)
        if lo is not None and hi is not None and hi - lo > 1e-6 * max(1.0, abs(hi)):
            # Lengths that differ are not equal, whatever else the step logs; and a mask that let one batch
            # end its completions at different lengths counts correctly for the rest of the run.
            self.equal_run = 0
            self.equal_since = None
            if self.distinct_at is None:
                self.distinct_at = step
            return False
        mean, clip = get(metrics, MEAN), get(metrics, CLIP)
        if mean is None or lo is None or hi is None or clip is None:
            return None
        tol = 1e-6 * max(1.0, abs(hi))
        # Most completions must have ended by themselves: nearly all cut at the cap is truncation (K1).
        equal = hi > 0 and abs(hi - lo) <= tol and abs(hi - mean) <= tol and clip <= self.max_clipped
        if equal:
            if not self.equal_run:
                self.equal_since = step
                self.equal_values.clear()
                self.equal_clipped.clear()
            self.equal_run += 1
            self.equal_values.append(hi)
            self.equal_clipped.append(clip)
        else:
            self.equal_run = 0
            self.equal_since = None
        return equal

    def _fixed_short_answer(self) -> bool:
        """The equal lengths are an honest constant: a short fixed-length answer, or the cap itself."""
        vals = self.equal_values
        if not vals:
            return False
        if max(vals) <= SHORT_ANSWER_TOKENS:  # label-sized answers: a batch of them is often all alike
            return True
        if len(vals) == 1 or max(vals) - min(vals) > 1e-6 * max(1.0, max(vals)):
            return False
        limit = self.short_frac * self.cap if self.cap is not None else 32.0
        if vals[-1] < limit:
            return True
        # Nearly every completion cut at the cap, the odd one ending exactly there: truncation, not a mask bug.
        clipped = sorted(self.equal_clipped)
        return self.cap is not None and vals[-1] >= self.cap and clipped[len(clipped) // 2] >= 0.9

    def _vanished_advantages(self, step: int, metrics: Metrics) -> bool | None:
        if ADV_MAX not in metrics:
            return None
        amax, amin, rstd = get(metrics, ADV_MAX), get(metrics, ADV_MIN), get(metrics, "reward_std")
        if amax is None or rstd is None:
            return None
        zero = get(metrics, "frac_reward_zero_std")
        spread = max(abs(amax), abs(amin) if amin is not None else 0.0)
        bad = rstd > 1e-3 and (zero is None or zero < 0.9) and spread < self.adv_ratio * rstd
        if bad:
            if not self.adv_run:
                self.adv_since = step
            self.adv_run += 1
            self.adv_last = {"advantages_max_abs": finite(spread), "reward_std": finite(rstd), "frac_reward_zero_std": finite(zero)}
        else:
            self.adv_run = 0
            self.adv_since = None
        return bad

    def assess(self, step: int, metrics: Metrics, samples: Sequence[Sample]) -> Assessment | None:
        eq = self._equal_lengths(step, metrics)
        adv = self._vanished_advantages(step, metrics)
        if eq is None and adv is None:
            return None
        if not eq and not adv and not self.episode.open:
            return Assessment(0, {"equal_lengths": False, "vanished_advantages": False})
        # A logged point averages its window, and an average of maxima equals one of minima only if
        # every step's did: a coarse point is as many steps of evidence as it covers.
        # Before a second point shows the spacing, the run's logging_steps says it.
        gap = self.clock.gap if len(self.clock.steps) >= 2 else max(1, int(self.context.logging_steps or 1))
        # Two points at least: a log's first point often averages a transient.
        need = max(2, -(-self.persist_points // gap))
        ev: dict[str, Any] = {"persist_points": need}
        # The same mask measured different lengths before: a run of equal ones is chance (a few completions
        # of a fixed-format answer), not padding counted as text.
        chance = self.distinct_at is not None
        if eq and self.equal_run >= need and not chance and not self._fixed_short_answer():
            ev.update({
                "invariant": "equal_lengths",
                "points": self.equal_run,
                "since_step": self.equal_since,
                "lengths": [finite(v) for v in self.equal_values],
                "clipped_ratio": [finite(v) for v in self.equal_clipped],
                "length_cap": finite(self.cap),
                "advice": ("Every completion has the same length although some end before the cap: the completion "
                           "mask counts positions past the end of the text. Pad after EOS with the pad id (not the EOS "
                           "id), build the mask from the first EOS, and check that pad_token differs from eos_token."),
            })
            return Assessment(level=2, evidence=ev, onset_step=self.equal_since)
        if adv and self.adv_run >= need:
            ev.update({"invariant": "vanished_advantages", "points": self.adv_run, "since_step": self.adv_since,
                       **self.adv_last,
                       "advice": ("The normalised advantages are near zero although rewards differ within groups: "
                                  "compute the group std on the raw rewards, not on the centred ones, and check the "
                                  "advantage scaling.")})
            return Assessment(level=2, evidence=ev, onset_step=self.adv_since)
        if eq and self.equal_run >= need and chance:
            ev.update(equal_lengths_by_chance=finite(self.equal_values[-1]), distinct_lengths_at=self.distinct_at)
        elif eq and self.equal_run >= need:
            ev["fixed_length_answers"] = finite(self.equal_values[-1])
        return Assessment(level=0, evidence=ev)

    def _message(self, severity: str, evidence: Mapping[str, Any]) -> str:
        if evidence.get("invariant") == "vanished_advantages":
            return (f"The advantages have vanished: at most {evidence.get('advantages_max_abs')} in size while the "
                    f"within-group reward std is {evidence.get('reward_std')}, for {evidence.get('points')} logged points. "
                    "That is an implementation bug (std taken of centred rewards?): the policy gets no signal.")
        lengths = evidence.get("lengths") or []
        return (f"Impossible completion lengths: min = max = mean ({lengths[-1] if lengths else '?'} tokens) for "
                f"{evidence.get('points')} logged points while clipped_ratio is below 1. The completion mask counts "
                "padding as text (post-EOS positions filled with the EOS id?); fix the masking before training on.")
