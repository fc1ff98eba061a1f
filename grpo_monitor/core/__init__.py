"""The core: metric names, the run log, the engine that drives the detectors, recommendations and restarts."""

__version__ = "0.1.0"
