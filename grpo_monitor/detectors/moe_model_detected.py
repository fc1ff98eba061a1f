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

from grpo_monitor.detectors.base import Detector, Finding, Metrics, RunContext, Sample  # noqa: F401  (RunContext: doctest)
from grpo_monitor.detectors.moe_instability import MoeSighting
from grpo_monitor.detectors.variants import preset


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

    def __init__(self) -> None:
        super().__init__()

    def _reset(self) -> None:
        self.state = "warming_up"
        self.last_evidence: dict[str, Any] = {}
        self.raised = False
        self.sighting = MoeSighting(self.context.is_moe)

    def inert_now(self, metrics: Metrics, has_samples: bool) -> bool:
        # Raised already, or a dense run whose names ``MoeSighting.see`` already scanned and judged.
        if self.raised:
            return True
        s = self.sighting
        return not s.moe and s._nkeys == len(metrics) and "aux_loss" not in metrics and self.state == "ok"

    def update(self, step: int, metrics: Metrics, samples: Sequence[Sample] | None = None) -> list[Finding]:
        # ``Detector.update`` written out: once raised, every later step is this one test.
        self._n += 1
        if type(step) is not int:
            step = int(step)
        if self.raised:
            return []
        return self._update(step, metrics, samples or ())

    def _update(self, step: int, metrics: Metrics, samples: Sequence[Sample]) -> list[Finding]:
        if self.raised:
            return []
        if type(metrics) is not dict and not isinstance(metrics, Mapping):
            metrics = {}
        if not self.sighting.see(metrics):
            if self.state != "ok":
                self.state = "ok"
                self.last_evidence = {"is_moe": False}
            return []
        self.raised = True
        self.state = "ok"
        model = self.context.model or {}
        cfg = self.context.config or {}
        level = cfg.get("importance_sampling_level")
        known = bool(cfg)
        uses_gspo = level == "sequence"
        evidence = {
            "is_moe": True,
            "source": "model facts" if self.context.is_moe else "logged MoE metrics",
            "num_experts": model.get("num_experts"),
            "top_k": model.get("top_k"),
            "importance_sampling_level": level if known else None,
            "config_known": known,
        }
        self.last_evidence = evidence
        experts = ""
        if model.get("num_experts"):
            experts = f" ({model.get('num_experts')} experts, top-{model.get('top_k')})"
        if uses_gspo:
            msg = (f"This is a mixture-of-experts model{experts}; the run already uses GSPO "
                   "(importance_sampling_level='sequence'), as the recipe requires for MoE.")
            variant, overrides = None, {}
        elif known:
            msg = (f"This is a mixture-of-experts model{experts} trained with token-level importance ratios; "
                   "the recipe requires GSPO (importance_sampling_level='sequence', off-policy steps) for MoE.")
            variant, overrides = "gspo", preset("gspo", cfg)
        else:
            msg = (f"This is a mixture-of-experts model{experts} and the run's config is unknown; "
                   "the recipe requires GSPO (importance_sampling_level='sequence') for MoE: check that the run uses it.")
            variant, overrides = "gspo", preset("gspo", cfg)
        return [Finding(detector=self.id, severity="info", step=step, onset_step=step, variant=variant,
                        config_overrides=overrides, evidence=evidence, message=msg)]
