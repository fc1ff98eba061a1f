"""What the training process measures of itself at each logged step: its memory (host and device) as
``system/*`` metrics. Nothing here imports torch: a process that has not imported it has no device memory.
"""

from __future__ import annotations

import os
import sys

GIB = 1024**3


def system_metrics(reset_peak: bool = False) -> dict[str, float]:
    """Peak and current memory of this process as ``system/*`` metrics, in GiB.

    On CUDA (when torch is already imported and has initialised a device):
    ``system/gpu_peak_allocated_gib``, ``system/gpu_peak_reserved_gib``, ``system/gpu_allocated_gib``,
    ``system/gpu_device_used_gib`` (all processes) and ``system/gpu_total_gib`` of the current device;
    ``reset_peak=True`` then resets the CUDA peak counters, so each call reports the peak since the
    previous one (one logging window). Always:
    ``system/rss_gib`` and ``system/rss_peak_gib`` (since process start) of the process, and
    ``system/ram_total_gib`` (the machine's physical memory, the host-side capacity). torch is
    never imported here: a process that has not imported it has no device memory.
    """
    out: dict[str, float] = {}
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                dev = torch.cuda.current_device()
                out["system/gpu_peak_allocated_gib"] = torch.cuda.max_memory_allocated(dev) / GIB
                out["system/gpu_peak_reserved_gib"] = torch.cuda.max_memory_reserved(dev) / GIB
                out["system/gpu_allocated_gib"] = torch.cuda.memory_allocated(dev) / GIB
                out["system/gpu_total_gib"] = torch.cuda.get_device_properties(dev).total_memory / GIB
                # What the whole device holds, this process's allocator or not (a colocated vLLM
                # engine allocates outside torch's caching allocator; other processes too).
                free, total = torch.cuda.mem_get_info(dev)
                out["system/gpu_device_used_gib"] = (total - free) / GIB
                if reset_peak:
                    torch.cuda.reset_peak_memory_stats(dev)
        except Exception:
            pass
    rss, peak = _process_memory()
    if rss is not None:
        out["system/rss_gib"] = rss / GIB
    if peak is not None:
        out["system/rss_peak_gib"] = peak / GIB
    if _RAM_TOTAL:
        out["system/ram_total_gib"] = _RAM_TOTAL / GIB
    return out


def _process_memory() -> tuple[int | None, int | None]:
    # Every logged step asks: one short read of /proc/self/statm and one getrusage, not a parse
    # of the fifty-line /proc/self/status.
    rss = peak = None
    try:
        fd = os.open("/proc/self/statm", os.O_RDONLY)
        try:
            rss = int(os.read(fd, 128).split()[1]) * _PAGE
        finally:
            os.close(fd)
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource

        ru = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        peak = ru if sys.platform == "darwin" else ru * 1024  # bytes on macOS, KiB on Linux
    except Exception:
        pass
    if rss is not None and peak is not None:
        peak = max(peak, rss)  # the two counters are sampled apart: the peak is never below the present
    return rss, peak


try:
    _PAGE = os.sysconf("SC_PAGE_SIZE")
except (AttributeError, ValueError, OSError):
    _PAGE = 4096
try:
    _RAM_TOTAL = os.sysconf("SC_PHYS_PAGES") * _PAGE
except (AttributeError, ValueError, OSError):
    _RAM_TOTAL = 0
