"""MoE model detected: the recipe requires GSPO for mixture-of-experts models.

Raised once (severity ``info``) on the first step at which the run is known to be MoE: from the
model facts of the run header, or else from the first ``aux_loss``/``moe/*`` metric. The finding
carries variant ``gspo`` and the GSPO preset when the run does not already use sequence-level
importance ratios (or its config is unknown, as for foreign logs); when it does, variant is None
and there is nothing to change.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from grpo_monitor.detectors.base import Assessment, Detector, Metrics, RunContext, Sample  # noqa: F401  (RunContext: doctest)
from grpo_monitor.detectors.moe_instability import MoeSighting


class MoeModelDetected(Detector):
    """One ``info`` finding on the first step of an MoE run, saying whether it already uses GSPO.

    >>> det = MoeModelDetected()
    >>> det.start(RunContext(model={"is_moe": True, "num_experts": 8, "top_k": 2},
    ...                      config={"importance_sampling_level": "token", "gradient_accumulation_steps": 2}))
    >>> [f] = det.update(1, {"loss": 0.1})
    >>> f.severity, f.variant, f.config_overrides["importance_sampling_level"], f.config_overrides["steps_per_generation"]
    ('info', 'gspo', 'sequence', 8)
    >>> det.update(2, {"loss": 0.1})
    []
    """

    id = "moe_model_detected"
    variant = None
    role = "info"
    # One fact about the run, raised once.
    severities = ("info", "info")
    clear_after = None

    def _reset_state(self) -> None:
        self.raised = False
        self.sighting = MoeSighting(self.context.is_moe)

    def assess(self, step: int, metrics: Metrics, samples: Sequence[Sample]) -> Assessment | None:
        if self.raised:
            return None
        if not self.sighting.see(metrics):
            return Assessment(0, {"is_moe": False})
        self.raised = True
        model = self.context.model or {}
        cfg = self.context.config or {}
        return Assessment(1, {
            "is_moe": True,
            "source": "model facts" if self.context.is_moe else "logged MoE metrics",
            "num_experts": model.get("num_experts"),
            "top_k": model.get("top_k"),
            "importance_sampling_level": cfg.get("importance_sampling_level") if cfg else None,
            "config_known": bool(cfg),
        }, onset_step=step)

    def _uses_gspo(self) -> bool:
        return (self.context.config or {}).get("importance_sampling_level") == "sequence"

    def _variant(self) -> str | None:
        return None if self._uses_gspo() else "gspo"

    def _message(self, severity: str, evidence: Mapping[str, Any]) -> str:
        model = self.context.model or {}
        experts = f" ({model.get('num_experts')} experts, top-{model.get('top_k')})" if model.get("num_experts") else ""
        if self._uses_gspo():
            return (f"This is a mixture-of-experts model{experts}; the run already uses GSPO "
                    "(importance_sampling_level='sequence'), as the recipe requires for MoE.")
        if evidence.get("config_known"):
            return (f"This is a mixture-of-experts model{experts} trained with token-level importance ratios; "
                    "the recipe requires GSPO (importance_sampling_level='sequence', off-policy steps) for MoE.")
        return (f"This is a mixture-of-experts model{experts} and the run's config is unknown; "
                "the recipe requires GSPO (importance_sampling_level='sequence') for MoE: check that the run uses it.")
