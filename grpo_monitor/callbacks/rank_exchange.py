"""Across ranks: every rank's detectors see the whole step's completions, and all ranks stop together.

Under ``torchrun``/``accelerate`` each rank scores its own completions. At every log the ranks exchange
each completion's numbers (``pack_samples``: a few dozen bytes each, never the text), the findings
each raised at the previous log and its device's readings (``core.device``: a dozen numbers, or None); every rank unpacks all parts alike, its own included, so the detectors
of every rank see the same values and reach the same findings. A disagreement (a detector failing on
one rank only) is recorded once. On one process nothing is exchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from grpo_monitor.callbacks.reward_tap import exchange_size, pack_samples, unpack_samples
from grpo_monitor.core.runlog import batch_index

logger = logging.getLogger("grpo_monitor")


def distributed() -> Any:
    """``torch.distributed`` when this process is one of several ranks, else None."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    return dist


class RankExchange:
    """One exchange per log: the step's samples from every rank (in global batch order), and whether the
    ranks' findings still agree."""

    def __init__(self, report: Callable[[str, BaseException], None]) -> None:
        self.report = report
        self.sent_bytes = 0  # what this rank sent at the last log
        self._digest: list[Any] = []
        self._disagreed = False
        self.devices: list[Any] = []  # each rank's device readings of the last log (None: none)

    def share(self, local: list[dict[str, Any]],
              device: dict[str, float] | None = None) -> tuple[list[dict[str, Any]], list[Any] | None]:
        """The step's samples from every rank and each rank's findings of the previous log; on one process,
        this rank's samples and no digests. Each rank's ``device`` readings land in ``devices``, in rank
        order. Every rank must call it at every log, whatever failed before: a rank that skipped it would
        leave the others waiting forever."""
        dist = distributed()
        self.devices = [device]
        if dist is None:
            self.sent_bytes = 0
            return local, None
        try:
            packed: Any = pack_samples(local)
        except Exception as exc:  # still join the collective below
            self.report("rank exchange", exc)
            packed = None
        payload = (packed, self._digest, device or None)
        gathered: list[Any] = [None] * dist.get_world_size()
        try:
            dist.all_gather_object(gathered, payload)
        except Exception as exc:  # the collective itself failed: go on with this rank's own view
            self.report("rank exchange", exc)
            self.sent_bytes = 0
            return local, None
        merged: list[dict[str, Any]] = []
        try:
            for part in gathered:
                if part and part[0] is not None:
                    merged.extend(unpack_samples(part[0]))
        except Exception as exc:
            self.report("rank exchange", exc)
            merged = list(local)
        merged.sort(key=batch_index)
        self.devices = [part[2] if part and len(part) > 2 else None for part in gathered]
        self.sent_bytes = exchange_size(payload)
        return merged, [part[1] if part else None for part in gathered]

    def remember(self, findings: list[Any]) -> None:
        """This rank's findings of this log, sent with the next exchange."""
        self._digest = [(f.detector, f.severity, f.step) for f in findings]

    def disagreement(self, step: int, digests: list[Any]) -> str | None:
        """The first time the ranks' findings differ, the note that says how (None otherwise)."""
        if self._disagreed or all(d == digests[0] for d in digests):
            return None
        self._disagreed = True
        differing = [r for r, d in enumerate(digests) if d != digests[0]]
        return (f"findings differ across ranks before step {step}: rank 0 {digests[0]}, "
                + ", ".join(f"rank {r} {digests[r]}" for r in differing))

    @staticmethod
    def agree(decision: Any) -> Any:
        """Every rank adopts rank 0's decision, so all of them act on it at the same step (or none does)."""
        dist = distributed()
        if dist is None:
            return decision
        box = [decision]
        dist.broadcast_object_list(box, src=0)
        return box[0]
