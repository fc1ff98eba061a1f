"""Online detectors of GRPO failure modes: pure statistics over logged steps (numpy/scipy only)."""

from grpo_monitor.detectors.base import DETECTOR_IDS, Detector, Finding, RunContext
from grpo_monitor.detectors.degenerate_long_cot import DegenerateLongCot
from grpo_monitor.detectors.entropy_collapse import EntropyCollapse
from grpo_monitor.detectors.length_reward_coupling import LengthRewardCoupling
from grpo_monitor.detectors.moe_instability import MoeInstability
from grpo_monitor.detectors.moe_model_detected import MoeModelDetected
from grpo_monitor.detectors.no_learning_signal import NoLearningSignal
from grpo_monitor.detectors.non_finite import NonFinite
from grpo_monitor.detectors.reward_component_divergence import RewardComponentDivergence
from grpo_monitor.detectors.rollout_mismatch import RolloutMismatch
from grpo_monitor.detectors.sudden_collapse import SuddenCollapse
from grpo_monitor.detectors.variants import VARIANT_PRESETS

ALL_DETECTORS: list[type[Detector]] = [
    # First: a reward crash explains the entropy and length moves that come with it, so at a step where
    # several detectors confirm at once, the restart follows the crash.
    SuddenCollapse,
    EntropyCollapse,
    DegenerateLongCot,
    LengthRewardCoupling,
    MoeInstability,
    NoLearningSignal,
    RewardComponentDivergence,
    NonFinite,
    MoeModelDetected,
    RolloutMismatch,
]

__all__ = [
    "ALL_DETECTORS",
    "DETECTOR_IDS",
    "VARIANT_PRESETS",
    "DegenerateLongCot",
    "Detector",
    "EntropyCollapse",
    "Finding",
    "LengthRewardCoupling",
    "MoeInstability",
    "MoeModelDetected",
    "NoLearningSignal",
    "NonFinite",
    "RewardComponentDivergence",
    "RolloutMismatch",
    "RunContext",
    "SuddenCollapse",
]
