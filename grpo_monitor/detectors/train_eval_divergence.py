"""Training reward rising while the held-out score stalls or falls: reward hacking, or a proxy overfitted.

A single proxy reward (a keyword overlap, a judge's score, a reward that pays templates) leaves one
signature only: the reward the policy optimises keeps rising while a held-out evaluation (a reference
metric, a test set) stops following it. No component diverges, so ``reward_component_divergence`` cannot
see it; the evaluation can. Judged at each evaluation, over the last ``window`` of them, from the pairs
``EvalTrack`` keeps (the held-out score and the training reward's median over the steps since the previous
evaluation):

- the training level rises significantly (Mann-Kendall, one-sided ``alpha``) by at least ``min_rise`` of
  its own range over the run;
- and the held-out score does not: no significant rise over the same evaluations (a stall, level 1);
- or, over any stretch, the held-out score stands below its best by more than ``z`` times its own
  evaluation-to-evaluation noise and ``min_drop`` of its level while the training level (the median of its
  last two) has risen since that best by more than ``z`` times its own noise and ``min_rise`` of its range
  (a fall: level 1, level 2 once it holds on two evaluations in a row).

A healthy run whose evaluation tracks its training reward (both rise, both level off) raises nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from grpo_monitor.detectors.base import Assessment, Detector, Metrics, Sample, check_float, check_int
from grpo_monitor.detectors.eval_track import EVAL_INPUT, TRAIN_INPUT, EvalTrack, diff_sigma
from grpo_monitor.detectors.stats import mann_kendall, median, quantile, theil_sen


class TrainEvalDivergence(Detector):
    """Training reward up, held-out score flat or down.

    Parameters: ``window`` (evaluations judged together), ``min_points`` (evaluations with a training
    level before judging), ``alpha`` (significance of the training rise; the held-out score counts as
    rising at ``2 * alpha``), ``min_rise`` (the training rise over the window, as a share of its range
    over the run), ``z`` and ``min_drop`` (how far below its best the held-out score must stand to have
    fallen: noise units, and a share of its best level).

    >>> det = TrainEvalDivergence()
    >>> found = []
    >>> for s in range(1, 301):
    ...     m = {"reward": min(s, 300) / 300}
    ...     if s % 20 == 0:
    ...         m["eval_reward"] = 0.2 + 0.3 * min(s, 120) / 120 - (0.002 * (s - 140) if s > 140 else 0.0)
    ...     found += det.update(s, m)
    >>> [(f.severity, f.step) for f in found]
    [('critical', 180)]
    """

    id = "train_eval_divergence"
    variant = None
    requires = ((TRAIN_INPUT, EVAL_INPUT),)
    clear_after = 2
    clear_steps = 0
    # Two evaluations in a row: one window's trend test alone is a coin with a 5 % edge.
    confirm_points = 2

    def __init__(self, window: int = 6, min_points: int = 5, alpha: float = 0.05, min_rise: float = 0.2,
                 z: float = 3.0, min_drop: float = 0.05) -> None:
        self.window = check_int("window", window, 4)
        self.min_points = check_int("min_points", min_points, 3)
        self.alpha = check_float("alpha", alpha, 0.0, 0.5, low_open=True)
        self.min_rise = check_float("min_rise", min_rise, 0.0, 1.0)
        self.z = check_float("z", z, 0.0, 100.0)
        self.min_drop = check_float("min_drop", min_drop, 0.0, 1.0)
        super().__init__()

    def _reset_state(self) -> None:
        self.track = EvalTrack()
        self.falls = 0

    def assess(self, step: int, metrics: Metrics, samples: Sequence[Sample]) -> Assessment | None:
        if not self.track.push(step, metrics):
            return None
        pts = self.track.paired()
        if len(pts) < self.min_points:
            return Assessment(warming_up=True, evidence={"evaluations": len(pts), "needs": self.min_points})
        recent = pts[-self.window:]
        xs = [float(s) for s, _, _ in recent]
        evals = [e for _, e, _ in recent]
        trains = [t for _, _, t in recent]
        all_train = [t for _, _, t in pts]
        all_eval = [e for _, e, _ in pts]
        train_trend = mann_kendall(trains, xs)
        eval_trend = mann_kendall(evals, xs)
        span = xs[-1] - xs[0]
        train_gain = theil_sen(xs, trains) * span
        eval_gain = theil_sen(xs, evals) * span
        train_range = quantile(all_train, 0.95) - quantile(all_train, 0.05)
        rising = (train_trend.p_up <= self.alpha and train_gain > 0
                  and train_gain >= self.min_rise * max(train_range, 1e-12))
        best_i = max(range(len(pts)), key=lambda i: pts[i][1])
        best_step, best_eval, train_at_best = pts[best_i]
        noise = diff_sigma(all_eval)
        line = best_eval - max(self.z * noise, self.min_drop * max(abs(best_eval), 1e-12))
        now_eval = evals[-1]
        now_train = median(trains[-2:])
        train_noise = diff_sigma(all_train)
        # Risen since the held-out best: beyond the training level's own noise and a share of its range.
        train_up = now_train - train_at_best
        risen = train_up >= max(self.z * train_noise, self.min_rise * max(train_range, 1e-12))
        fallen = best_i < len(pts) - 1 and now_eval < line and risen
        self.falls = self.falls + 1 if fallen else 0
        stalled = eval_trend.p_up > 2 * self.alpha or eval_gain <= 0
        evidence: dict[str, Any] = {
            "eval_metric": self.track.key, "train_metric": self.track.train_key,
            "evaluations": len(pts), "window_steps": [int(xs[0]), int(xs[-1])],
            "train_trend": train_trend.as_evidence(), "train_gain": train_gain, "train_range": train_range,
            "eval_trend": eval_trend.as_evidence(), "eval_gain": eval_gain, "eval_now": now_eval,
            "eval_best": best_eval, "eval_best_step": best_step, "eval_noise": noise, "eval_fall_line": line,
            "train_now": now_train, "train_at_eval_best": train_at_best, "train_noise": train_noise,
            "advice": ("inspect completions the reward scores highest against the held-out metric (recipe step 8): "
                       "the reward pays for something other than the task; fix the reward or stop at the "
                       f"checkpoint nearest step {best_step}, where the held-out score peaked"),
        }
        if self.falls >= 2:
            level = 2
        elif fallen or (rising and stalled):
            level = 1
        else:
            level = 0
        evidence["shape"] = "fall" if fallen else "stall" if stalled else "tracking"
        onset = best_step if fallen else int(xs[0])
        return Assessment(level, evidence, onset_step=onset if level else None)

    def _message(self, severity: str, evidence: Mapping[str, Any]) -> str:
        train, ev = evidence.get("train_metric"), evidence.get("eval_metric")
        lo, hi = (evidence.get("window_steps") or [None, None])[:2]
        if evidence.get("shape") == "fall":
            head = (f"The training {train} keeps rising while the held-out {ev} has fallen from its best "
                    f"{evidence.get('eval_best'):.4g} (step {evidence.get('eval_best_step')}) to {evidence.get('eval_now'):.4g}")
        else:
            head = f"The training {train} rose over steps {lo}-{hi} while the held-out {ev} stayed flat"
        return (head + ": the policy is optimising the reward, not the task (reward hacking, or a proxy reward "
                "overfitted). Read the completions the reward scores highest; fix the reward rather than the "
                "hyper-parameters.")
