"""No improvement: the reward has not moved since the run began, though groups carry signal and gradients flow.

Users report runs whose reward "weaves back and forth" for hundreds of steps: a LoRA at a learning rate
too low to move it, groups of two completions, a task too hard for the model. Unlike
``no_learning_signal`` (every group alike, or a zero gradient) the run here has what it needs to learn;
it just does not.

The reward is averaged into blocks of training steps (a running sum per step: the common path costs
a few additions), and once per block a robust slope (Theil-Sen) is fitted over the last ``span_steps``
of blocks; its noise is the robust spread of the blocks around that line, so autocorrelated noise
inside a block does not shrink it. The run counts as not improving when neither the slope over the
window nor the level since the first blocks rises beyond ``z`` standard errors. A plateau reached
after real gains is convergence, not this. The finding is ``info`` alone; ``warning`` when the
configuration names a likely cause (two completions per group, an adapter at a very low learning
rate) or correctness sits near zero. Never critical: the run is wasting compute, not breaking.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import Any

from grpo_monitor.detectors.base import Detector, Finding, Metrics, Sample, slow_finite
from grpo_monitor.detectors.episode import check_float, check_int
from grpo_monitor.detectors.signals import CorrectnessSource, StepClock
from grpo_monitor.detectors.stats import MAD_SCALE, fin, median, tidy


def theil_sen_line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Theil-Sen slope and intercept (plain Python: a dozen points once per block).

    >>> theil_sen_line([0, 1, 2, 3, 4], [1.0, 2.0, 3.0, 4.0, 50.0])
    (1.0, 1.0)
    """
    slopes = [(ys[j] - ys[i]) / (xs[j] - xs[i]) for i in range(len(xs)) for j in range(i + 1, len(xs)) if xs[j] != xs[i]]
    slope = median(slopes) if slopes else 0.0
    return slope, median([y - slope * x for x, y in zip(xs, ys)])


class NoImprovement(Detector):
    """Reward flat (no robust rise) over a long stretch while reward_std > 0 and grad_norm > 0.

    Parameters: ``span_steps`` (training steps the flat stretch must cover), ``blocks`` (blocks the
    stretch is cut into), ``z`` (a rise beyond this many standard errors counts as improvement),
    ``small_group`` (num_generations at or below this is a likely cause), ``adapter_lr`` (an adapter
    trained at or below this learning rate is a likely cause), ``low_pass`` (correctness at or below
    this is a task too hard).

    >>> from grpo_monitor.detectors.base import RunContext
    >>> det = NoImprovement()
    >>> det.start(RunContext(config={"num_generations": 2, "learning_rate": 1e-6}))
    >>> found = []
    >>> for step in range(1, 301):
    ...     r = 0.4 + 0.05 * (((step * 7) % 11) - 5) / 5
    ...     found += det.update(step, {"reward": r, "reward_std": 0.3, "grad_norm": 0.2})
    >>> [(f.severity, f.step, f.evidence["causes"]) for f in found]
    [('warning', 156, ['num_generations'])]
    >>> found[0].config_overrides, found[0].evidence["remedy"]
    ({}, 'raise_num_generations')
    """

    id = "no_improvement"
    variant = None
    requires = (("reward", "reward_std|frac_reward_zero_std", "grad_norm"),)

    def __init__(self, span_steps: int = 150, blocks: int = 12, z: float = 2.0, small_group: int = 2,
                 adapter_lr: float = 1e-6, low_pass: float = 0.05) -> None:
        self.span_steps = check_int("span_steps", span_steps, 10)
        self.blocks = check_int("blocks", blocks, 6)
        self.z = check_float("z", z, 0.0, 100.0)
        self.small_group = check_int("small_group", small_group, 1)
        self.adapter_lr = check_float("adapter_lr", adapter_lr, 0.0, 1.0)
        self.low_pass = check_float("low_pass", low_pass, 0.0, 1.0)
        super().__init__()

    @property
    def last_evidence(self) -> dict[str, Any]:  # type: ignore[override]
        """The latest judgement's evidence, JSON-safe."""
        if self._evidence_raw:
            self._evidence, self._evidence_raw = tidy(self._evidence), False  # type: ignore[assignment]
        return self._evidence

    @last_evidence.setter
    def last_evidence(self, value: dict[str, Any]) -> None:
        self._evidence, self._evidence_raw = value, False

    def _reset(self) -> None:
        self.state = "warming_up"
        self.last_evidence = {}
        self.clock = StepClock()
        self.correctness = CorrectnessSource(self.context)
        self._gap_span = self._gap_n = -1
        self._gap = 1
        self.done: deque[tuple[float, float, float, float]] = deque(maxlen=self.blocks)  # (mid step, mean, signal, correctness)
        # The pairwise slopes of the closed blocks, one list per block (its slopes to the blocks after it):
        # a closing block adds its slopes to the others and the oldest block's leave with it, so the
        # judgement sorts what is there instead of working out every pair again.
        self._slopes: deque[list[float]] = deque()
        self.early: list[float] = []
        self._open(None)
        # 1 once the info is out, 2 once the warning is: each at most once, a stall since the start is one
        # fact about the run, and noise around the line must not repeat it.
        self.raised = 0

    def _open(self, step: int | None) -> None:
        self.b_start = step
        self.b_sum = 0.0
        self.b_n = 0
        self.b_sig = 0  # points whose group spread and gradient were both present
        self.b_sig_n = 0
        self.b_cor = 0.0
        self.b_cor_n = 0
        self.b_len = max(self.clock.gap, math.ceil(self.span_steps / self.blocks))

    def update(self, step: int, metrics: Metrics, samples: Sequence[Sample] | None = None) -> list[Finding]:
        # ``Detector.update`` and ``_update`` in one: this runs at every step, and most steps only add to
        # the open block. Each metric is read once; a finite plain float is taken as it is, anything
        # else goes the careful way.
        self._n += 1
        if step.__class__ is not int:
            step = int(step)
        mget = metrics.get
        r = mget("reward")
        if r.__class__ is not float or r - r != 0.0:
            r = slow_finite(r)
            if r is None:
                return []
        clock = self.clock
        cs = clock._steps
        if not cs or step > cs[-1]:  # StepClock.tick
            cs.append(step)
            clock._gap = None
        if self.b_start is None:
            self._open(step)
        self.b_sum += r
        self.b_n += 1
        g = mget("grad_norm")
        if g.__class__ is not float or g - g != 0.0:
            g = slow_finite(g)
        if g is not None:
            rs = mget("reward_std")
            if rs.__class__ is not float or rs - rs != 0.0:
                rs = slow_finite(rs)
            fz = mget("frac_reward_zero_std")
            if fz.__class__ is not float or fz - fz != 0.0:
                fz = slow_finite(fz)
            if rs is not None or fz is not None:
                self.b_sig_n += 1
                if g > 0 and (rs is None or rs > 0) and (fz is None or fz < 0.5):
                    self.b_sig += 1
        source = self.correctness
        if source.fixed:
            c = mget(source.key)
            if c.__class__ is not float or c - c != 0.0:
                c = slow_finite(c)
            if c is not None:
                self.b_cor += c
                self.b_cor_n += 1
        elif self.b_n == 1:
            c = source.value(metrics)
            if c is not None and source.fixed:
                self.b_cor += c
                self.b_cor_n += 1
        # ``StepClock.gap``, worked out again only when the span or the count of its points changed
        # (on a regular log, neither does once the clock is full).
        n = len(cs)
        span = cs[-1] - cs[0]
        if span != self._gap_span or n != self._gap_n:
            self._gap_span, self._gap_n = span, n
            self._gap = 1 if n < 2 else max(1, round(span / (n - 1)))
        if step - (self.b_start or step) + self._gap < self.b_len:
            return []
        return self._close(step)

    def _update(self, step: int, metrics: Metrics, samples: Sequence[Sample]) -> list[Finding]:
        self._n -= 1  # ``update`` counts the step
        return self.update(step, metrics, samples)

    def _close(self, step: int) -> list[Finding]:
        mean = self.b_sum / self.b_n
        signal = self.b_sig / self.b_sig_n if self.b_sig_n else math.nan
        cor = self.b_cor / self.b_cor_n if self.b_cor_n else math.nan
        x = 0.5 * ((self.b_start or step) + step)
        done, rows = self.done, self._slopes
        done.append((x, mean, signal, cor))
        if len(rows) == len(done):  # the oldest block left: its slopes go with it
            rows.popleft()
        for (xi, yi, _, _), row in zip(done, rows):  # every block but the new one
            if x != xi:
                row.append((mean - yi) / (x - xi))
        rows.append([])
        if len(self.early) < 3:
            self.early.append(mean)
        self._open(None)
        if len(self.done) < self.blocks or self.done[-1][0] - self.done[0][0] < 0.8 * self.span_steps:
            self.state = "warming_up"
            return []
        return self._judge(step)

    def _judge(self, step: int) -> list[Finding]:
        xs = [b[0] for b in self.done]
        ys = [b[1] for b in self.done]
        slopes = [v for row in self._slopes for v in row]
        total = sum(slopes)
        if total - total == 0.0:  # all finite: sorted in any order, they are the same values ``theil_sen_line`` sorts
            slope = median(slopes) if slopes else 0.0
            icpt = median([y - slope * x for x, y in zip(xs, ys)])
        else:  # a NaN sorts by where it stands: the pairs in their own order
            slope, icpt = theil_sen_line(xs, ys)
        resid = [y - icpt - slope * x for x, y in zip(xs, ys)]
        mid = median(resid)
        sigma = MAD_SCALE * median([abs(e - mid) for e in resid])
        mx = sum(xs) / len(xs)
        sxx = sum([(x - mx) ** 2 for x in xs])
        width = xs[-1] - xs[0]
        gain = slope * width
        se_gain = sigma * width / math.sqrt(sxx) if sxx > 0 else math.inf
        early = median(self.early)
        recent = median(ys[-3:])
        since_start = recent - early
        se_start = sigma * math.sqrt(2.0 / 3.0)
        signals = [b[2] for b in self.done if b[2] == b[2]]  # not NaN
        signal = median(signals) if signals else None
        ev: dict[str, Any] = {
            "window_steps": round(width + self.b_len),
            "slope_per_100_steps": fin(100 * slope),
            "gain_over_window": fin(gain),
            "gain_standard_error": fin(se_gain),
            "reward_early": fin(early),
            "reward_recent": fin(recent),
            "gain_since_start": fin(since_start),
            "block_noise_sigma": fin(sigma),
            "z": self.z,
            "share_with_signal": fin(signal),
        }
        improving = gain > self.z * se_gain or since_start > self.z * se_start
        has_signal = signal is not None and signal >= 0.5
        if improving or not has_signal:
            self.state = "ok"
            # Tidied when read: dashboards read it far less often than blocks close.
            self._evidence, self._evidence_raw = ev, True
            return []
        causes = self._causes(ev)
        ev["causes"] = causes
        if (not causes and self.raised < 1) or (causes and self.raised < 2):
            # A finding follows, and its advice is added to ``ev``: the state shows ``ev`` as it is now.
            self.last_evidence = tidy(ev)  # type: ignore[assignment]
        else:
            self._evidence, self._evidence_raw = ev, True
        out: list[Finding] = []
        onset = int(xs[0] - 0.5 * self.b_len)
        if not causes and self.raised < 1:
            self.raised = 1
            out.append(self._finding("info", step, onset, ev, {}))
        if causes and self.raised < 2:
            self.raised = 2
            out.append(self._finding("warning", step, onset, ev, self._overrides_for(causes, ev)))
        self.state = "warning" if self.raised >= 2 else "ok"
        return out

    def _causes(self, ev: dict[str, Any]) -> list[str]:
        cfg = self.context.config or {}
        causes = []
        g = cfg.get("num_generations")
        if isinstance(g, int) and not isinstance(g, bool) and 0 < g <= self.small_group:
            causes.append("num_generations")
            ev["num_generations"] = g
        lr = cfg.get("learning_rate")
        if isinstance(lr, (int, float)) and not isinstance(lr, bool):
            ev["learning_rate"] = lr
            if self._adapter(ev) and 0 < lr <= self.adapter_lr:
                causes.append("adapter_learning_rate")
        cors = [b[3] for b in self.done if not math.isnan(b[3])]
        if len(cors) >= len(self.done) // 2 and cors:
            pass_rate = median(cors)
            ev["correctness"] = {"metric": self.correctness.key, "median": fin(pass_rate)}
            if pass_rate <= self.low_pass:
                causes.append("task_too_hard")
        return causes

    def _adapter(self, ev: dict[str, Any]) -> bool:
        cfg, model = self.context.config or {}, self.context.model or {}
        total, trainable = model.get("num_parameters"), model.get("trainable_parameters")
        if isinstance(total, int) and isinstance(trainable, int) and total > 0:
            ev["trainable_share"] = fin(trainable / total)
            if trainable < 0.2 * total:
                return True
        return bool(cfg.get("use_peft") or cfg.get("peft_config") or cfg.get("lora_r"))

    def _overrides_for(self, causes: list[str], ev: dict[str, Any]) -> dict[str, Any]:
        cfg = self.context.config or {}
        advice = []
        overrides: dict[str, Any] = {}
        if "adapter_learning_rate" in causes:
            overrides["learning_rate"] = 1e-5
            ev.setdefault("remedy", "raise_learning_rate")
            advice.append("an adapter (LoRA) at this learning rate barely moves; adapters usually train at 1e-5 to 1e-4")
        if "num_generations" in causes:
            batch = cfg.get("per_device_train_batch_size")
            spg = cfg.get("steps_per_generation") or cfg.get("gradient_accumulation_steps") or 1
            if isinstance(batch, int) and isinstance(spg, int) and batch * spg % 8 == 0:
                overrides["num_generations"] = 8
            ev.setdefault("remedy", "raise_num_generations")
            advice.append("groups of two completions give a weak, noisy advantage; use 8 or more")
        if "task_too_hard" in causes:
            advice.append("correctness sits near zero: the task is too hard for the model; use easier prompts, "
                          "partial credit or a supervised warm start, and check the pass rate")
        ev["advice"] = "; ".join(advice) + "."
        return overrides

    def _finding(self, severity: str, step: int, onset: int, ev: dict[str, Any], overrides: dict[str, Any]) -> Finding:
        evidence: dict[str, Any] = tidy(dict(ev))  # type: ignore[assignment]
        width = evidence.get("window_steps")
        text = (f"The reward has not improved over the last {width} steps (from {evidence.get('reward_early')} at the "
                f"start to {evidence.get('reward_recent')} now, within its noise), although groups carry a reward "
                "spread and gradients flow.")
        if severity == "warning":
            text += " Likely cause: " + str(evidence.get("advice"))
        else:
            text += (" If it stays flat: a learning rate too low (especially for LoRA), num_generations too small, or a"
                     " task too hard (check the pass rate).")
        return Finding(detector=self.id, severity=severity, step=step, onset_step=onset, variant=None,
                       config_overrides=overrides, evidence=evidence, message=text)
