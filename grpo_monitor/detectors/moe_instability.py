"""MoE instability: routing volatility turning token-level importance ratios into noise (GSPO).

Only mixture-of-experts runs are watched (the model facts say so, or the run logs ``aux_loss`` or
``moe/*`` metrics). No single spike counts: a finding needs at least two of these, each measured
against the run's own baseline (levels are not comparable across variants or clip settings):
the routing flip rate rising (``moe/flip_rate``, when the router tap logs it), the clip fraction
turning bursty, importance-sampling ratio extremes, repeated grad-norm spikes, ``aux_loss`` drift.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from grpo_monitor.detectors.base import (  # noqa: F401  (RunContext: doctest)
    Assessment,
    Detector,
    Metrics,
    RunContext,
    Sample,
    check_float,
    check_int,
    finite,
)
from grpo_monitor.detectors.stats import Window, mad_sigma, median, quantile
from grpo_monitor.detectors.signals import get, names_like


class _Baselined:
    """A metric with a baseline frozen from its points after the first ``skip_steps`` steps, once
    at least ``min_points`` of them cover ``span`` steps (at most ``max_points`` are kept)."""

    def __init__(self, min_points: int, span: int, skip_steps: int, recent: int, max_points: int = 64) -> None:
        self.min_points = min_points
        self.span = span
        self.skip_steps = skip_steps
        self.max_points = max_points
        self.first_step: int | None = None
        self.base_vals: list[float] = []
        self.base_first: int | None = None
        self.recent = Window(recent)
        self.base: float | None = None
        self.spread: float | None = None
        self.q90: float | None = None
        # The first points (within five steps of the start): a provisional reference for runs
        # that break before a baseline can be taken.
        self.first: list[float] = []
        self.seen = 0

    def ref(self) -> tuple[float, float, float, bool] | None:
        """(level, spread, upper tail, provisional) to compare with, or None while there is none."""
        if self.base is not None:
            return self.base, self.spread or 0.0, self.q90 if self.q90 is not None else self.base, False
        if self.first and self.seen >= len(self.first) + 2:
            return median(self.first), 0.0, max(self.first), True
        return None

    def push(self, step: int, v: float) -> None:
        if self.first_step is None:
            self.first_step = step
        self.recent.push(step, v)
        self.seen += 1
        if len(self.first) < 3 and step - self.first_step < 5:
            self.first.append(v)
        if self.base is None and step - self.first_step >= self.skip_steps:
            if self.base_first is None:
                self.base_first = step
            self.base_vals.append(v)
            enough = len(self.base_vals) >= self.min_points and step - self.base_first >= self.span
            if enough or len(self.base_vals) >= self.max_points:
                self.base = median(self.base_vals)
                self.spread = mad_sigma(self.base_vals, self.base)
                self.q90 = quantile(self.base_vals, 0.9)
                self.base_vals = []

    @property
    def ready(self) -> bool:
        return self.base is not None


def is_moe_run(context_is_moe: bool, metrics: Mapping[str, Any]) -> bool:
    """An MoE run: the model facts say so, or the step logs ``aux_loss`` or ``moe/*`` metrics."""
    if context_is_moe or "aux_loss" in metrics:
        return True
    return bool(names_like(metrics, "moe/"))


class MoeSighting:
    """``is_moe_run`` for a stream of steps: MoE from the model facts, or from the first step that logs
    MoE metrics on (a run never turns dense again)."""

    def __init__(self, context_is_moe: bool) -> None:
        self.moe = bool(context_is_moe)

    def see(self, metrics: Mapping[str, Any]) -> bool:
        self.moe = self.moe or is_moe_run(False, metrics)
        return self.moe


class MoeInstability(Detector):
    """At least ``min_signals`` corroborating instability signals on an MoE run.

    Parameters: ``min_signals`` (distinct signals needed for a warning; one more, or persistence,
    makes it critical), ``spike_z`` (robust z of log grad norm that counts as a spike),
    ``spike_factor`` (a spike is also at least this multiple of the baseline grad norm),
    ``recent_steps`` (how far back, in training steps, spikes and bursts are counted),
    ``base_points``/``base_steps``/``skip_steps`` (the baseline takes at least ``base_points``
    points covering ``base_steps`` steps, after skipping the first ``skip_steps`` steps).

    >>> det = MoeInstability()
    >>> det.start(RunContext(model={"is_moe": True}))
    >>> found = []
    >>> for step in range(1, 121):
    ...     bad = step > 80
    ...     found += det.update(step, {"aux_loss": 3.6 if bad else 2.0 + 0.01 * (step % 3),
    ...         "grad_norm": (40.0 if step % 3 == 0 else 0.5) if bad else 0.3 + 0.01 * (step % 5),
    ...         "clip_ratio/region_mean": 0.02 + 0.001 * (step % 4)})
    >>> [(f.severity, f.variant) for f in found]
    [('warning', 'gspo'), ('critical', 'gspo')]
    >>> MoeInstability().update(1, {"grad_norm": 1e9})  # a dense run is never flagged
    []
    """

    id = "moe_instability"
    variant = "gspo"

    def not_applicable(self, names: Collection[str]) -> str | None:
        if self.sighting.moe or is_moe_run(self.context.is_moe, dict.fromkeys(names)):
            return None
        return "not a mixture-of-experts run"

    def __init__(
        self,
        min_signals: int = 2,
        spike_z: float = 6.0,
        recent_steps: int = 30,
        base_points: int = 6,
        base_steps: int = 40,
        skip_steps: int = 20,
        spike_factor: float = 6.0,
    ) -> None:
        self.min_signals = check_int("min_signals", min_signals, 2)
        self.spike_z = check_float("spike_z", spike_z, 0.0, 1e6, low_open=True)
        self.recent_steps = check_int("recent_steps", recent_steps, 1)
        self.base_points = check_int("base_points", base_points, 3)
        self.base_steps = check_int("base_steps", base_steps, 0)
        self.skip_steps = check_int("skip_steps", skip_steps, 0)
        self.spike_factor = check_float("spike_factor", spike_factor, 1.0, 1e9, low_open=True)
        super().__init__()


    def _reset_state(self) -> None:
        mk = lambda: _Baselined(self.base_points, self.base_steps, self.skip_steps, 64)
        # The router tap logs the flip rate only every ~10 steps: fewer points, same stretch.
        self.flip = _Baselined(3, self.base_steps, self.skip_steps, 16)
        self.clip = mk()
        self.is_max = mk()
        self.grad = mk()
        self.aux = mk()
        self.sighting = MoeSighting(self.context.is_moe)

    def _clip_value(self, metrics: Metrics) -> float | None:
        v = get(metrics, "clip_ratio/region_mean")
        if v is not None:
            return v
        vals = [x for x in (get(metrics, "clip_ratio/low_mean"), get(metrics, "clip_ratio/high_mean")) if x is not None]
        return sum(vals) if vals else None

    def assess(self, step: int, metrics: Metrics, samples: Sequence[Sample]) -> Assessment | None:
        if not self.sighting.see(metrics):
            return Assessment(0, {"moe": False})
        pushed = False
        for track, v in (
            (self.flip, get(metrics, "moe/flip_rate")),
            (self.clip, self._clip_value(metrics)),
            (self.is_max, get(metrics, "sampling/importance_sampling_ratio/max")),
            (self.aux, get(metrics, "aux_loss")),
        ):
            if v is not None and v >= 0:
                track.push(step, v)
                pushed = True
        g = get(metrics, "grad_norm")
        if g is not None and g > 0:
            self.grad.push(step, math.log(g))
            pushed = True
        if not pushed:
            return None
        if not any(t.ref() for t in (self.clip, self.grad, self.aux, self.is_max, self.flip)):
            return Assessment(warming_up=True)
        return self._judge(step)

    def _recent(self, track: _Baselined, step: int, at_least: int = 3) -> list[float]:
        vals = [v for s, v in zip(track.recent.steps, track.recent.values) if s > step - self.recent_steps]
        if len(vals) < at_least:
            vals = track.recent.last(at_least)
        return vals

    def _judge(self, step: int) -> Assessment:
        ev: dict[str, Any] = {"recent_steps": self.recent_steps}
        signals: list[str] = []
        relax = 0.8 if self.episode.open else 1.0
        k = self.clock.points()
        # On coarse logs each point already averages many steps: one high point is a burst.
        bursts_needed = 2 if k >= 3 else 1
        provisional = False
        ref = self.flip.ref()
        if ref:
            b, sp, _, prov = ref
            provisional |= prov
            r = median(self.flip.recent.last(2))
            sp = max(sp, 0.1 * b, 1e-4)
            need = 2.0 * b if prov else max(1.5 * b, b + 4 * sp)
            ev["flip_rate"] = {"recent": finite(r), "baseline": finite(b), "threshold": finite(need)}
            if r >= need * relax:
                signals.append("flip_rate_up")
        ref = self.clip.ref()
        if ref:
            _, _, bq, prov = ref
            provisional |= prov
            vals = self._recent(self.clip, step, 4)
            q = quantile(vals, 0.9)
            need = max(3.0 * bq, bq + 0.15) if prov else max(1.75 * bq, bq + 0.05)
            ev["clip_fraction"] = {"recent_q90": finite(q), "baseline_q90": finite(bq), "threshold": finite(need)}
            # Bursty: the upper tail moved, on more than one point.
            if q >= need * relax and sum(1 for v in vals if v >= need * relax) >= bursts_needed:
                signals.append("clip_bursts")
        ref = self.is_max.ref()
        if ref:
            b, _, _, prov = ref
            provisional |= prov
            vals = self._recent(self.is_max, step, 2)
            r = median(vals[-k:])
            need = max(b, 1e-6) * (5.0 if prov else 3.0)
            ev["importance_ratio_max"] = {"recent": finite(r), "baseline": finite(b), "threshold": finite(need)}
            if r >= need * relax:
                signals.append("importance_ratio_extremes")
        ref = self.grad.ref()
        if ref:
            b, sp, _, prov = ref
            provisional |= prov
            vals = self._recent(self.grad, step, 3)
            sp = max(sp, 0.05)
            # A spike is both far out in the run's own noise and a large factor in absolute terms.
            cut = math.log(10.0) if prov else max(self.spike_z * sp, math.log(self.spike_factor))
            spikes = sum(1 for v in vals if v - b >= cut * relax)
            ev["grad_norm"] = {"spikes_in_window": spikes, "baseline": finite(math.exp(b)), "robust_z_threshold": self.spike_z,
                               "log_mad_sigma": finite(sp), "spike_factor": finite(math.exp(cut))}
            if spikes >= 2:
                signals.append("grad_norm_spikes")
        ref = self.aux.ref()
        if ref:
            b, sp, _, prov = ref
            provisional |= prov
            r = median(self.aux.recent.last(k))
            sp = max(sp, 0.01 * abs(b), 1e-6)
            need = b + (0.3 * abs(b) if prov else max(4 * sp, 0.15 * abs(b)))
            ev["aux_loss"] = {"recent": finite(r), "baseline": finite(b), "threshold": finite(need), "robust_z": finite((r - b) / sp)}
            if r >= b + (need - b) * relax:
                signals.append("aux_loss_drift")
        ev["signals"] = signals
        if provisional:
            ev["reference"] = "first logged points (no settled baseline yet)"
        level = 0
        if len(signals) >= self.min_signals:
            level = 1
            if len(signals) >= self.min_signals + 1 or self.episode.points >= 2:
                level = 2
        return Assessment(level=level, evidence=ev, onset_step=None)

    def _message(self, severity: str, evidence: Mapping[str, Any]) -> str:
        sig = ", ".join(s.replace("_", " ") for s in evidence.get("signals", []))
        lead = "The MoE run is unstable" if severity == "critical" else "The MoE run is turning unstable"
        cfg = self.context.config or {}
        uses = cfg.get("importance_sampling_level") == "sequence"
        tail = (" It already uses sequence-level ratios: lower the learning rate or tighten the GSPO clip range."
                if uses else " Switch to GSPO (importance_sampling_level='sequence'); per-token ratios are unstable under MoE routing.")
        return f"{lead} ({sig}).{tail}"

