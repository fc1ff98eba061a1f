"""A held-out score that drops suddenly while training looks fine.

Users report the validation score collapsing after some step (HotpotQA after step 60, the step varying from
run to run) with the training reward still where it was: no training metric shows it, so a monitor that
reads only training metrics says nothing. Judged at each evaluation, from the pairs ``EvalTrack`` keeps:
the held-out score stands below its running best by more than ``z`` times its own evaluation-to-evaluation
noise and ``drop_frac`` of its gain since the first evaluation (or of half its level, when it gained less),
one of the last ``max_drop_evals`` evaluations before still standing within a quarter of the drop from the best (a sudden drop; a slow slide
beside a rising reward is ``train_eval_divergence``'s), while the training level has not fallen by as much
in its own terms (a training reward that crashed too is ``sudden_collapse``'s). One evaluation below the
line is a warning, ``persist`` of them in a row are critical.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from grpo_monitor.detectors.base import Assessment, Detector, Metrics, Sample, check_float, check_int
from grpo_monitor.detectors.eval_track import EVAL_INPUT, TRAIN_INPUT, EvalTrack, diff_sigma


class EvalDrop(Detector):
    """The held-out score falls suddenly below its best; the training reward does not.

    Parameters: ``min_points`` (evaluations before judging), ``z`` and ``drop_frac`` (the drop line: noise
    units below the best, and a share of the score's gain or level), ``max_drop_evals`` (the best stood within
    this many evaluations before the first one below the line), ``train_frac`` (the training level counts as
    fine while it stays above its level at the best by more than minus this share of its own range),
    ``persist`` (evaluations below the line that make it critical).

    >>> det = EvalDrop()
    >>> found = []
    >>> for s in range(1, 201):
    ...     m = {"reward": 0.5 + 0.1 * min(s, 100) / 100}
    ...     if s % 10 == 0:
    ...         m["eval_reward"] = 0.3 + 0.15 * min(s, 60) / 60 if s <= 60 else 0.2
    ...     found += det.update(s, m)
    >>> [(f.severity, f.step, f.onset_step) for f in found]
    [('warning', 70, 60), ('critical', 80, 60)]
    """

    id = "eval_drop"
    variant = None
    requires = ((TRAIN_INPUT, EVAL_INPUT),)
    clear_after = 2
    clear_steps = 0

    def __init__(self, min_points: int = 5, z: float = 4.0, drop_frac: float = 0.5, max_drop_evals: int = 2,
                 train_frac: float = 0.5, persist: int = 2) -> None:
        self.min_points = check_int("min_points", min_points, 3)
        self.z = check_float("z", z, 0.0, 100.0)
        self.drop_frac = check_float("drop_frac", drop_frac, 0.0, 1.0, low_open=True)
        self.max_drop_evals = check_int("max_drop_evals", max_drop_evals, 1)
        self.train_frac = check_float("train_frac", train_frac, 0.0, 10.0)
        self.persist = check_int("persist", persist, 1)
        super().__init__()

    def _reset_state(self) -> None:
        self.track = EvalTrack()
        self.below = 0
        self.drop_at: int | None = None

    def assess(self, step: int, metrics: Metrics, samples: Sequence[Sample]) -> Assessment | None:
        if not self.track.push(step, metrics):
            return None
        pts = self.track.paired()
        if len(pts) < self.min_points:
            return Assessment(warming_up=True, evidence={"evaluations": len(pts), "needs": self.min_points})
        evals = [e for _, e, _ in pts]
        trains = [t for _, _, t in pts]
        before = evals[:-1]
        best_i = max(range(len(before)), key=lambda i: before[i])
        best_step, best, train_at_best = pts[best_i]
        noise = diff_sigma(before)
        # The drop is measured against the score's gain, or half its level where it gained little (a score
        # that never moved has no gain to lose): one noisy evaluation must not look like a collapse.
        scale = max(best - min(before[: best_i + 1]), 0.5 * abs(best))
        line = best - max(self.z * noise, self.drop_frac * max(scale, 1e-12))
        now, train_now = evals[-1], trains[-1]
        train_range = max(trains) - min(trains)
        train_fine = train_now >= train_at_best - self.train_frac * max(train_range, 1e-12)
        if now < line:
            if self.below == 0:
                # Sudden: an evaluation among the last few before this one still stood within a quarter of
                # the drop from the best (a slow slide is not a drop).
                near = best - 0.25 * (best - now)
                sudden = any(e >= near for e in before[-self.max_drop_evals:])
                self.below = 1 if sudden else 0
                self.drop_at = best_step if sudden else None
            else:
                self.below += 1
        else:
            self.below = 0
            self.drop_at = None
        evidence: dict[str, Any] = {
            "eval_metric": self.track.key, "train_metric": self.track.train_key, "evaluations": len(pts),
            "eval_now": now, "eval_best": best, "eval_best_step": best_step, "eval_noise": noise, "drop_line": line,
            "drop": best - now, "evaluations_below": self.below, "train_now": train_now,
            "train_at_eval_best": train_at_best, "train_fine": train_fine,
            "advice": (f"resume from the checkpoint nearest step {best_step}, where the held-out score stood at its best, "
                       "and read what the completions on the held-out prompts look like now; a drop that training "
                       "does not show is often a format or length change the training reward does not punish"),
        }
        if not self.below or not train_fine:
            return Assessment(0, evidence)
        level = 2 if self.below >= self.persist else 1
        return Assessment(level, evidence, onset_step=self.drop_at)

    def _message(self, severity: str, evidence: Mapping[str, Any]) -> str:
        return (f"The held-out {evidence.get('eval_metric')} dropped from {evidence.get('eval_best'):.4g} "
                f"(step {evidence.get('eval_best_step')}) to {evidence.get('eval_now'):.4g} while the training "
                f"{evidence.get('train_metric')} looks fine: the policy got worse at the task in a way the training "
                f"reward does not see. Resume from the checkpoint nearest step {evidence.get('eval_best_step')} "
                "and inspect the held-out completions.")
