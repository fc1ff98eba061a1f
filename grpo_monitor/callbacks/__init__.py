"""The training-side integration of grpo-monitor: attach it to a TRL trainer in one call.

    from grpo_monitor.callbacks import attach
    attach(trainer)
"""

try:
    import transformers  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("the training integration needs the 'train' extra: pip install 'grpo-monitor[train]'") from exc

from grpo_monitor.alerts.options import AlertOptions
from grpo_monitor.callbacks.attach import attach
from grpo_monitor.callbacks.monitor_callback import MonitorCallback
from grpo_monitor.callbacks.options import DeviceOptions, RestartOptions, RewardGateOptions, RouterOptions, SampleOptions
from grpo_monitor.callbacks.reward_tap import SampleRetention

__all__ = ["AlertOptions", "DeviceOptions", "MonitorCallback", "RestartOptions", "RewardGateOptions", "RouterOptions",
           "SampleOptions", "SampleRetention", "attach"]
