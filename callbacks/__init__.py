"""The training-side integration of grpo-monitor: attach it to a TRL trainer in one call.

    from callbacks import attach
    attach(trainer)
"""

try:
    import transformers  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("the training integration needs the 'train' extra: pip install 'grpo-monitor[train]'") from exc

from callbacks.attach import attach
from callbacks.monitor_callback import MonitorCallback
from callbacks.reward_tap import SampleRetention

__all__ = ["MonitorCallback", "SampleRetention", "attach"]
