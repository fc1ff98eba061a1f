"""The callback's device part: the NVML sampler of this rank's GPU (``core.device``) and the time the
trainer spends generating, summed up at each log.

``start`` (at train begin) finds the device this rank trains on (torch's current CUDA device, matched to
NVML by its UUID) or the one ``DeviceOptions.device`` names, and starts the sampler; without NVML, its
driver or a CUDA device it does nothing at all, and the part stays inert for the whole run. Once
sampling, it also times the trainer's ``_generate`` (TRL's rollout: vLLM, colocated or a server, or
transformers ``generate``), so each log carries the share of the wall time spent generating
(``system/generation_share``). ``collect`` (at each log, on the training thread) drains the sampler's
window: a lock and a few additions, never an NVML call.
"""

from __future__ import annotations

import os
import time
from typing import Any

from grpo_monitor.callbacks.options import DeviceOptions
from grpo_monitor.core.device import GENERATION_SHARE, DeviceSampler, start_sampler, unified_memory
from grpo_monitor.preflight.memory import cuda_device


def nvml_index(cuda_index: int) -> int:
    """The NVML index of CUDA device ``cuda_index``, through ``CUDA_VISIBLE_DEVICES`` when it lists indices
    (NVML numbers every device of the machine; CUDA only the visible ones).

    >>> import os; os.environ["CUDA_VISIBLE_DEVICES"] = "2,3"; nvml_index(1)
    3
    >>> del os.environ["CUDA_VISIBLE_DEVICES"]; nvml_index(1)
    1
    """
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if cuda_index < len(visible) and visible[cuda_index].isdigit():
        return int(visible[cuda_index])
    return cuda_index


class DeviceHealth:
    """One rank's device readings and generation time, per log."""

    def __init__(self, trainer: Any, options: DeviceOptions | None) -> None:
        self.trainer = trainer
        self.options = options
        self.sampler: DeviceSampler | None = None
        self.facts: dict[str, Any] | None = None
        self._generating = 0.0
        self._since = time.perf_counter()
        self._wrapped = False

    @property
    def active(self) -> bool:
        return self.sampler is not None

    def start(self) -> dict[str, Any] | None:
        """Start sampling; the device's facts for the run header, or None when nothing is sampled."""
        options = self.options
        if options is None or self.sampler is not None:
            return self.facts
        torch_dev = cuda_device(initialised_only=True)
        target = options.device
        if target is None:
            if torch_dev is None:
                return None  # not training on a GPU: nothing to watch
            target = torch_dev["uuid"] or torch_dev["index"]
        sampler = start_sampler(target, options.interval_s)
        if sampler is None and torch_dev is not None and options.device is None and target == torch_dev["uuid"]:
            sampler = start_sampler(nvml_index(torch_dev["index"]), options.interval_s)  # no UUID lookup
        if sampler is None:
            return None
        self.sampler = sampler
        facts = sampler.facts
        if torch_dev is not None and options.device is None:
            facts["integrated"] = torch_dev["integrated"]
            if facts.get("total_gib") is None:  # a unified-memory device: what torch may allocate
                facts["total_gib"] = torch_dev["total_gib"]
        um = unified_memory(facts)
        facts["unified_memory"] = um["kind"] if um else None
        self.facts = facts
        self._wrap_generate()
        self._since = time.perf_counter()
        return facts

    def _wrap_generate(self) -> None:
        trainer = self.trainer
        original = getattr(trainer, "_generate", None)
        if not callable(original) or getattr(original, "__grpo_monitor_timed__", False):
            return

        def timed(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                return original(*args, **kwargs)  # its result and its exceptions reach TRL unchanged
            finally:
                self._generating += time.perf_counter() - t

        timed.__grpo_monitor_timed__ = True  # type: ignore[attr-defined]
        trainer._generate = timed  # the instance attribute shadows the method; removed at stop
        self._wrapped = True

    def collect(self) -> dict[str, float]:
        """This rank's window since the last log (empty when inert, or when no reading fell in it)."""
        if self.sampler is None:
            return {}
        if self.sampler.error is not None:
            error, self.sampler.error = self.sampler.error, None
            self.stop()
            raise RuntimeError(f"the NVML sampler stopped: {type(error).__name__}: {error}")
        out = self.sampler.drain()
        now = time.perf_counter()
        wall = now - self._since
        if self._wrapped and wall > 0:
            out[GENERATION_SHARE] = min(1.0, self._generating / wall)
        self._generating, self._since = 0.0, now
        return out

    def stop(self) -> None:
        if self._wrapped:
            try:
                del self.trainer._generate
            except AttributeError:
                pass
            self._wrapped = False
        if self.sampler is not None:
            sampler, self.sampler = self.sampler, None
            sampler.stop()
