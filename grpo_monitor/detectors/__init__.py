"""Online detectors of GRPO failure modes: pure statistics over logged steps (numpy/scipy only)."""

from grpo_monitor.detectors.advantage_mask_bug import AdvantageMaskBug
from grpo_monitor.detectors.base import Assessment, Detector, Finding, RunContext
from grpo_monitor.detectors.broken_generation import BrokenGeneration
from grpo_monitor.detectors.degenerate_long_cot import DegenerateLongCot
from grpo_monitor.detectors.device_throttled import DeviceThrottled
from grpo_monitor.detectors.entropy_collapse import EntropyCollapse
from grpo_monitor.detectors.entropy_rise import EntropyRise
from grpo_monitor.detectors.eval_drop import EvalDrop
from grpo_monitor.detectors.extreme_start import ExtremeStart
from grpo_monitor.detectors.grad_norm_spike import GradNormSpike
from grpo_monitor.detectors.kl_pinned import KlPinned
from grpo_monitor.detectors.length_collapse import LengthCollapse
from grpo_monitor.detectors.language_mixing import LanguageMixing
from grpo_monitor.detectors.length_reward_coupling import LengthRewardCoupling
from grpo_monitor.detectors.memory_pressure import MemoryPressure
from grpo_monitor.detectors.moe_instability import MoeInstability
from grpo_monitor.detectors.moe_model_detected import MoeModelDetected
from grpo_monitor.detectors.no_improvement import NoImprovement
from grpo_monitor.detectors.no_learning_signal import NoLearningSignal
from grpo_monitor.detectors.non_finite import NonFinite
from grpo_monitor.detectors.reward_component_divergence import RewardComponentDivergence
from grpo_monitor.detectors.reward_function_bug import RewardFunctionBug
from grpo_monitor.detectors.rollout_mismatch import RolloutMismatch
from grpo_monitor.detectors.stall import Stall
from grpo_monitor.detectors.sudden_collapse import SuddenCollapse
from grpo_monitor.detectors.train_eval_divergence import TrainEvalDivergence
from grpo_monitor.detectors.truncation import Truncation
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
    RewardFunctionBug,
    Truncation,
    NonFinite,
    MoeModelDetected,
    RolloutMismatch,
    BrokenGeneration,
    AdvantageMaskBug,
    LanguageMixing,
    MemoryPressure,
    Stall,
    DeviceThrottled,
    EntropyRise,
    GradNormSpike,
    LengthCollapse,
    NoImprovement,
    # Evaluation-aware: the held-out score against the training reward, and the KL the penalty should move.
    TrainEvalDivergence,
    EvalDrop,
    KlPinned,
    # Facts about the run's start.
    ExtremeStart,
]

# The fixed detector ids, in the registry's order.
DETECTOR_IDS: tuple[str, ...] = tuple(cls.id for cls in ALL_DETECTORS)

__all__ = [
    "ALL_DETECTORS",
    "AdvantageMaskBug",
    "Assessment",
    "BrokenGeneration",
    "DETECTOR_IDS",
    "VARIANT_PRESETS",
    "DegenerateLongCot",
    "DeviceThrottled",
    "Detector",
    "EntropyCollapse",
    "EntropyRise",
    "EvalDrop",
    "ExtremeStart",
    "GradNormSpike",
    "KlPinned",
    "Finding",
    "LanguageMixing",
    "LengthCollapse",
    "LengthRewardCoupling",
    "MemoryPressure",
    "MoeInstability",
    "MoeModelDetected",
    "NoImprovement",
    "NoLearningSignal",
    "NonFinite",
    "RewardComponentDivergence",
    "RewardFunctionBug",
    "RolloutMismatch",
    "RunContext",
    "Stall",
    "SuddenCollapse",
    "TrainEvalDivergence",
    "Truncation",
]
