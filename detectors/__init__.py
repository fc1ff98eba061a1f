"""Online detectors of GRPO failure modes: pure statistics over logged steps (numpy/scipy only)."""

from detectors.base import DETECTOR_IDS, Detector, Finding, RunContext

ALL_DETECTORS: list[type[Detector]] = []

__all__ = ["ALL_DETECTORS", "DETECTOR_IDS", "Detector", "Finding", "RunContext"]
