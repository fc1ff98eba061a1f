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
from collections.abc import Mapping, Sequence
from typing import Any

from grpo_monitor.detectors.base import Assessment, Detector, Metrics, Sample, check_float, check_int, finite
from grpo_monitor.detectors.signals import CorrectnessSource, get
from grpo_monitor.detectors.stats import MAD_SCALE, StepClock, median


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
    # A stall since the start is one fact about the run: ``info`` alone, ``warning`` with a likely cause,
    # each at most once (noise around the line must not repeat it).
    severities = ("info", "warning")
    clear_after = None
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

    def _reset_state(self) -> None:
        # The spacing of the points that carry a reward (the blocks are cut from those alone).
        self.reward_clock = StepClock()
        self.correctness = CorrectnessSource(self.context)
        # (mid step, mean, signal, correctness, first step)
        self.done: deque[tuple[float, float, float, float, int]] = deque(maxlen=self.blocks)
        self.early: list[float] = []
        self.fix: dict[str, Any] = {}
        self._open(None)

    def _open(self, step: int | None) -> None:
        self.b_start = step
        self.b_sum = 0.0
        self.b_n = 0
        self.b_sig = 0  # points whose group spread and gradient were both present
        self.b_sig_n = 0
        self.b_cor = 0.0
        self.b_cor_n = 0
        self.b_len = max(self.reward_clock.gap, math.ceil(self.span_steps / self.blocks))

    def assess(self, step: int, metrics: Metrics, samples: Sequence[Sample]) -> Assessment | None:
        r = get(metrics, "reward")
        if r is None:
            return None
        self.reward_clock.tick(step)
        if self.b_start is None:
            self._open(step)
        self.b_sum += r
        self.b_n += 1
        g = get(metrics, "grad_norm")
        if g is not None:
            rs, fz = get(metrics, "reward_std"), get(metrics, "frac_reward_zero_std")
            if rs is not None or fz is not None:
                self.b_sig_n += 1
                if g > 0 and (rs is None or rs > 0) and (fz is None or fz < 0.5):
                    self.b_sig += 1
        c = self.correctness.value(metrics)
        if c is not None and self.correctness.fixed:
            self.b_cor += c
            self.b_cor_n += 1
        if step - (self.b_start or step) + self.reward_clock.gap < self.b_len:
            return None
        return self._close(step)

    def _close(self, step: int) -> Assessment:
        mean = self.b_sum / self.b_n
        signal = self.b_sig / self.b_sig_n if self.b_sig_n else math.nan
        cor = self.b_cor / self.b_cor_n if self.b_cor_n else math.nan
        self.done.append((0.5 * ((self.b_start or step) + step), mean, signal, cor, self.b_start or step))
        if len(self.early) < 3:
            self.early.append(mean)
        self._open(None)
        if len(self.done) < self.blocks or self.done[-1][0] - self.done[0][0] < 0.8 * self.span_steps:
            return Assessment(warming_up=True)
        return self._judge(step)

    def _judge(self, step: int) -> Assessment:
        xs = [b[0] for b in self.done]
        ys = [b[1] for b in self.done]
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
            "slope_per_100_steps": finite(100 * slope),
            "gain_over_window": finite(gain),
            "gain_standard_error": finite(se_gain),
            "reward_early": finite(early),
            "reward_recent": finite(recent),
            "gain_since_start": finite(since_start),
            "block_noise_sigma": finite(sigma),
            "z": self.z,
            "share_with_signal": finite(signal),
        }
        improving = gain > self.z * se_gain or since_start > self.z * se_start
        has_signal = signal is not None and signal >= 0.5
        if improving or not has_signal:
            return Assessment(0, ev)
        causes = ev["causes"] = self._causes(ev)
        self.fix = self._overrides_for(causes, ev) if causes else {}
        # The oldest block's own first step: half a nominal block back from its middle lands before the first
        # logged step on a sparse log (a block of 25 steps logged every 10 starts at 10, its middle is 20).
        return Assessment(2 if causes else 1, ev, onset_step=int(self.done[0][4]))

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
            ev["correctness"] = {"metric": self.correctness.key, "median": finite(pass_rate)}
            if pass_rate <= self.low_pass:
                causes.append("task_too_hard")
        return causes

    def _adapter(self, ev: dict[str, Any]) -> bool:
        cfg, model = self.context.config or {}, self.context.model or {}
        total, trainable = model.get("num_parameters"), model.get("trainable_parameters")
        if isinstance(total, int) and isinstance(trainable, int) and total > 0:
            ev["trainable_share"] = finite(trainable / total)
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

    def _overrides(self) -> dict[str, Any]:
        return self.fix

    def _message(self, severity: str, evidence: Mapping[str, Any]) -> str:
        width = evidence.get("window_steps")
        text = (f"The reward has not improved over the last {width} steps (from {evidence.get('reward_early')} at the "
                f"start to {evidence.get('reward_recent')} now, within its noise), although groups carry a reward "
                "spread and gradients flow.")
        if severity == "warning":
            return text + " Likely cause: " + str(evidence.get("advice"))
        return text + (" If it stays flat: a learning rate too low (especially for LoRA), num_generations too small, or a"
                       " task too hard (check the pass rate).")
