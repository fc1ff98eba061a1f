"""No learning signal: the run spends compute without any gradient to follow (TRL issue 5697).

Every group has identical rewards (``frac_reward_zero_std`` = 1), every completion is cut at
``max_completion_length`` (``completions/clipped_ratio`` = 1), or rewards have no spread and the
gradient is zero, sustained over several logged points. Whether that is a task solved or a policy
collapsed (an entropy collapse, a learning rate that broke it, a reward that never pays) is the
diagnosis's to say (``core.diagnosis``), against the run's other signals. A share that is high but not total, or a
batch without spread on most points (``reward_std`` 0 where the share is not logged), counts too once
it holds on average over a stretch of twice ``persist_steps`` (``most``): a sparse reward that pays one
group in ten now and then still leaves most of the compute without signal. No GRPO variant fixes this, so the finding
carries none. When entropy has exploded or collapsed relative to its own baseline, the stall is a
symptom of that failure and is left to its own detector.

A signal *lost* is not a signal never had. A run whose groups had reward spread for a while and whose
reward then fell has collapsed: the task was learnable, so the advice is a lower learning rate from a
checkpoint before the onset (the finding carries it as a config change), not easier prompts. A run
that never had a spread is told the task is too hard or the reward never pays.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from grpo_monitor.detectors.base import Assessment, Detector, Metrics, Sample, check_float, check_int, finite
from grpo_monitor.detectors.signals import CorrectnessSource, EntropyTrack, completions_per_step, get
from grpo_monitor.detectors.stats import Window, median
from grpo_monitor.detectors.sudden_collapse import REMEDY, lowered_learning_rate

# Nats a token below which sampling is all but greedy (the top token's probability about 0.99 or more), whatever
# the model.
NEAR_GREEDY = 0.05


class NoLearningSignal(Detector):
    """Sustained all-zero-std groups, all-truncated completions, or zero spread with zero gradient.

    Parameters: ``level`` (a share at or above it counts as "all"), ``persist_points``/``persist_steps``
    (logged points and training steps in a row; critical at twice as many, or with two conditions
    together), ``defer_high`` (the entropy ratio to its baseline beyond which the stall belongs to
    degeneration), ``defer_low`` (kept for the evidence: the diagnosis reads a collapse from the ratio),
    ``most`` (the stretch's mean share of groups without spread that counts as most).

    >>> det = NoLearningSignal()
    >>> found = []
    >>> for step in range(1, 31):
    ...     found += det.update(step, {"completions/clipped_ratio": 1.0, "frac_reward_zero_std": 1.0,
    ...                                "reward": 0.0, "reward_std": 0.0, "grad_norm": 0.0})
    >>> [(f.severity, f.step) for f in found]
    [('warning', 10), ('critical', 11)]
    """

    id = "no_learning_signal"
    variant = None
    requires = (("frac_reward_zero_std",), ("completions/clipped_ratio",), ("reward_std",))

    def __init__(self, level: float = 0.98, persist_points: int = 3, persist_steps: int = 10, defer_high: float = 2.5,
                 defer_low: float = 0.25, most: float = 0.8) -> None:
        self.level = check_float("level", level, 0.5, 1.0)
        self.most = check_float("most", most, 0.5, 1.0)
        self.persist_points = check_int("persist_points", persist_points, 1)
        self.persist_steps = check_int("persist_steps", persist_steps, 0)
        self.defer_high = check_float("defer_high", defer_high, 1.0, 1e6, low_open=True)
        self.defer_low = check_float("defer_low", defer_low, 0.0, 1.0, low_open=True, high_open=True)
        super().__init__()

    def _reset_state(self) -> None:
        self.entropy = EntropyTrack(window=8, half=3, tol=0.3, min_span=20)
        # The flagged points (step, number of conditions). Only the trailing run of them is ever read,
        # so an unflagged point is not stored: it only ends the run.
        self.flags = Window(64)
        # Alongside: whether each flagged point had every completion cut at the cap (1) or not (0).
        self.cut = Window(64)
        # The reward at each flagged point: where the stretch sits (its latest point may be an outlier).
        self.flat_rewards = Window(64)
        # The share of groups without spread at each point (``reward_std`` 0 counts as all, above 0 as none),
        # for the stretch average.
        self.zero = Window(64)
        # One or two groups a step: a point's share is all or nothing, so one lucky group says little of the stretch.
        cfg = self.context.config or {}
        per_step, g = completions_per_step(cfg), cfg.get("num_generations")
        self._few_groups = bool(per_step and isinstance(g, int) and not isinstance(g, bool) and g > 0 and per_step // g <= 2)
        # Trailing flagged points in ``flags``.
        self._run = 0
        self.last_reward: float | None = None
        cap = (self.context.config or {}).get("max_completion_length")
        self.cap = cap if isinstance(cap, int) and not isinstance(cap, bool) else None
        self.masked = (self.context.config or {}).get("mask_truncated_completions") is True
        # The run's own history of signal: points where most groups had a reward spread.
        self.signal_points = 0
        self.signal_steps = 0  # training steps those points cover
        # Every point so far with reward spread 0 and gradient exactly 0: the policy has never moved.
        self._still = True
        self.last_signal_step: int | None = None
        self.best_reward: float | None = None
        self.lost = False
        self.correctness = CorrectnessSource(self.context)
        self.correct_recent: deque[float] = deque(maxlen=5)
        self.correct_unit = True  # every correctness value seen lies in [0, 1]

    def _solved(self, ev: dict[str, Any]) -> bool:
        """Saturated on the correctness share itself (near 1 with every group alike): the task is solved, the
        signal is not lost to a collapse, whatever the signal's history (a task solved in its first ten steps never
        had a stretch of spread). Without a correctness share in [0, 1] this is not told apart."""
        if not self.correct_recent or not self.correct_unit:
            return False
        c = median(self.correct_recent)
        ev["correctness"] = {"metric": self.correctness.key, "recent": c}
        if c >= 0.9:
            ev["signal"] = "saturated"
            return True
        return False

    def _mostly_alike(self, step: int) -> float | None:
        """The mean share of groups without spread over the last ``2 x persist_steps`` of training (at least four
        points), when it is at or above ``most``; else None."""
        z = self.zero
        if len(z) < 4:
            return None
        span = 2 * self.persist_steps
        vals = [v for s, v in zip(z.steps, z.values) if s > step - span]
        if len(vals) < 4:
            vals = z.last(4)
            if step - z.steps[-4] + self.clock.gap < span:
                return None
        share = sum(vals) / len(vals)
        return share if share >= self.most else None

    def _conditions(self, fz: float | None, cr: float | None, rs: float | None, gn: float | None,
                    most: float | None = None) -> list[str]:
        """The no-signal conditions holding at a step with these ``frac_reward_zero_std``,
        ``completions/clipped_ratio``, ``reward_std`` and ``grad_norm``, and the stretch's mean share ``most``."""
        out = []
        if fz is not None and fz >= self.level:
            out.append("all_groups_zero_std")
        elif most is not None:
            out.append("most_groups_zero_std")
        if cr is not None:
            # Truncated completions still carry their group's advantages unless TRL masks them out of
            # the loss: all-truncated is no signal only when masked, or when the groups' spread is gone.
            spread = (fz < 0.5) if fz is not None else (rs > 1e-6) if rs is not None else False
            if cr >= self.level and (self.masked or not spread):
                out.append("all_truncated")
        if rs is not None and gn is not None and rs <= 1e-6 and gn <= 1e-8:
            out.append("zero_reward_std_and_gradient")
        return out

    def assess(self, step: int, metrics: Metrics, samples: Sequence[Sample]) -> Assessment | None:
        entropy = self.entropy
        settled = entropy.baseline.value is not None
        if entropy.push_metrics(step, metrics) is not None and not settled and entropy.baseline.value is None:
            entropy.force_if_moved(step, 2, low=self.defer_low, high=self.defer_high)
        fz, cr = get(metrics, "frac_reward_zero_std"), get(metrics, "completions/clipped_ratio")
        rs, gn = get(metrics, "reward_std"), get(metrics, "grad_norm")
        if fz is None and cr is None and rs is None:
            return None  # nothing measurable
        z = fz if fz is not None else (1.0 if rs is not None and rs <= 1e-6 else 0.0 if rs is not None else None)
        if z is not None:
            self.zero.push(step, z)
        # The stretch's mean counts only at a point whose own share is at least half: a point where most groups
        # have spread again ends the stretch, however alike the points before it were. (Where only reward_std is
        # logged, a point with spread may be one group of many: its share is unknown, and the mean decides.)
        counts = z is not None and (fz is None or fz >= 0.5 or self._few_groups)
        conds = self._conditions(fz, cr, rs, gn, self._mostly_alike(step) if counts else None)
        r = get(metrics, "reward")
        if r is not None:
            self.last_reward = r
        c = self.correctness.value(metrics) if self.correctness.fixed or self.correctness.name is None else None
        if c is not None and self.correctness.name is not None:
            self.correct_recent.append(c)
            self.correct_unit = self.correct_unit and 0.0 <= c <= 1.0
        flags = self.flags
        self._still = self._still and "zero_reward_std_and_gradient" in conds
        if conds:
            flags.push(step, len(conds))
            self.cut.push(step, 1.0 if "all_truncated" in conds else 0.0)
            if r is not None:
                self.flat_rewards.push(step, r)
            self._run = min(self._run + 1, flags.maxlen)
        else:
            if fz is None or fz <= 0.5:
                self.signal_points += 1
                self.signal_steps += self.clock.gap
                self.last_signal_step = step
                if r is not None and (self.best_reward is None or r > self.best_reward):
                    self.best_reward = r
            self._run = 0
            if not self.episode.open:
                return Assessment(0, _evidence([], 0, self.persist_points, self.level))
        run = self._run
        k = self.persist_points
        # The flagged run must also cover persist_steps of training (a coarse point covers several).
        covered = (step - flags.steps[-run] + self.clock.gap) if run else 0
        # A coarse log (each point covering many steps) needs fewer points for the same stretch of training.
        need = max(2, min(k, -(-self.persist_steps // max(1, self.clock.gap)) + 1))
        sustained = run >= need and covered >= self.persist_steps
        long_sustained = run >= 2 * need and covered >= 2 * self.persist_steps
        had = self.signal_points >= k and self.signal_steps >= self.persist_steps
        solved = self._solved({})
        if not had and not solved and not self._still:
            # No stretch of signal as long as the one that calls it gone: a model often needs a while before its
            # completions differ at all (at the cap, all alike, in its first steps), so the stretch that counts is
            # three times as long, and six for critical on one sign alone. Not while the gradient has been exactly
            # 0 at every point with its reward spread 0: the policy has not moved, so waiting changes nothing.
            sustained = sustained and covered >= 3 * self.persist_steps
            long_sustained = long_sustained and covered >= (6 if len(conds) < 2 else 3) * self.persist_steps
        ev = _evidence(conds, run, k, self.level)
        if run:
            ev["all_truncated_share"] = round(sum(self.cut.last(run)) / min(run, len(self.cut)), 4)
            flat = [v for s_, v in zip(list(self.flat_rewards.steps)[-run:], self.flat_rewards.last(run))
                    if s_ >= flags.steps[-run]]
            if flat:
                ev["stretch_reward"] = finite(median(flat))
        if self.last_reward is not None:
            ev["reward"] = self.last_reward
        ev["signal"] = "never_had"
        if had and self.last_signal_step is not None:
            best, now = self.best_reward, self.last_reward
            ev["had_signal_until"] = self.last_signal_step
            ev["signal_points"] = self.signal_points
            ev["best_reward"] = best
            if best is None or now is None:
                ev["signal"] = "had_signal"  # without a reward, a solved task and a collapse look alike
            else:
                # Every group scoring alike at the best reward is a solved task, not a lost signal.
                ev["signal"] = "lost" if now < best - 0.5 * max(abs(best), 1e-9) else "saturated"
        deferred = None
        self._solved(ev)
        ratio = self.entropy.ratio(2)
        if ratio is not None:
            ev["entropy_ratio_to_baseline"] = finite(ratio)
            # An entropy that exploded makes the stall a degeneration's, judged there. One that collapsed is not
            # deferred: the diagnosis (``core.diagnosis``) names the collapse as this finding's cause where the
            # correctness is not at its ceiling, and a deferral to a detector that stays quiet would lose it.
            if ratio >= self.defer_high:
                deferred = "degenerate_long_cot"
        if deferred:
            ev["deferred_to"] = deferred
        self.lost = ev["signal"] == "lost"
        if self.lost:
            lr = lowered_learning_rate(self.context.config)
            if lr is not None:
                ev["remedy"] = REMEDY
                ev["learning_rate"] = {"configured": finite(self.context.config.get("learning_rate")), "recommended": lr}
        level = 0
        if sustained and not deferred:
            level = 1
            if long_sustained or (self.episode.points >= 1 and sum(1 for v in flags.last(need) if v >= 2) == need):
                level = 2
        onset = flags.steps[-run] if run and level else None
        return Assessment(level=level, evidence=ev, onset_step=onset)

    def _overrides(self) -> dict[str, Any]:
        if not self.lost:
            return {}
        lr = lowered_learning_rate(self.context.config)
        return {"learning_rate": lr} if lr is not None else {}

    def _message(self, severity: str, evidence: Mapping[str, Any]) -> str:
        conds = evidence.get("conditions", [])
        reward = evidence.get("reward")
        if evidence.get("signal") == "lost":
            lead = "The learning signal was lost" if severity == "critical" else "The learning signal is being lost"
            lr = (evidence.get("learning_rate") or {}).get("recommended")
            change = f"a lower learning rate (learning_rate={lr})" if lr is not None else "a lower learning rate"
            return (f"{lead}: the run had reward spread within its groups until step {evidence.get('had_signal_until')} "
                    f"(reward up to {evidence.get('best_reward')}, now {reward}), so the task is learnable and the "
                    f"policy collapsed. Resume from a checkpoint saved before the onset with {change}, or with the "
                    "variant a collapse detector names; training on wastes compute.")
        # The cap is the cause only where most of the stretch was cut, not where its latest point happened to be.
        if "all_truncated" in conds and evidence.get("all_truncated_share", 1.0) >= 0.5:
            cap = f" (now {self.cap}; try {2 * self.cap} or more)" if self.cap else ""
            advice = f"every completion is cut at the length cap: raise max_completion_length{cap} or ask for shorter answers."
        elif evidence.get("signal") == "saturated":
            advice = (f"the task is solved: every group scores alike at the run's best reward ({reward}), so nothing is left "
                      "to learn from; use harder prompts, or stop the run.")
        elif evidence.get("stretch_reward", reward) is not None and evidence.get("stretch_reward", reward) <= 0:
            advice = "every completion scores the same zero reward: the task is too hard for the model or the reward never pays; use easier prompts or partial credit."
        else:
            g = (self.context.config or {}).get("num_generations")
            few = (f" (num_generations={g}: two or four completions easily agree; raise it to 8 or more)"
                   if isinstance(g, int) and not isinstance(g, bool) and g <= 4 else "")
            advice = ("every completion in a group scores the same: more completions per prompt or a finer-grained reward "
                      f"bring the spread back{few}; if the model has mastered these prompts, use harder ones.")
        lead = "No learning signal" if severity == "critical" else "The learning signal is vanishing"
        return f"{lead}: {advice} No GRPO variant fixes this; the run is wasting compute."


def _evidence(conds: list[str], run: int, persist_points: int, level: float) -> dict[str, Any]:
    return {"conditions": conds, "points_in_a_row": run, "persist_points": persist_points, "level": level}
