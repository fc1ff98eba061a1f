"""``AlertDispatcher``: the live callback hands it each step's findings; it fans them out to the
trackers and the webhook, each isolated from the others and from the run."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from grpo_monitor.alerts.events import RANK, Episodes, as_dict, finding_message, recommendation_for, resolved_message, verdict_of
from grpo_monitor.alerts.trackers import SummaryState, build_sinks, reported_trackers
from grpo_monitor.alerts.webhook import ENV_FORMAT, ENV_URL, WebhookSender, mask_url, scrub

logger = logging.getLogger("grpo_monitor")

# attach(...) keyword -> option name here; all optional.
OPTION_KEYS = ("alerts", "alerts_format", "alerts_min_severity", "alerts_trackers", "alerts_per_minute",
               "alerts_burst", "alerts_retries", "alerts_timeout", "alerts_flush_timeout")
MIN_SEVERITIES = ("warning", "critical")


class AlertOptions:
    def __init__(self, alerts: Any = None, alerts_format: str | None = None, alerts_min_severity: str = "warning",
                 alerts_trackers: Any = True, alerts_per_minute: float = 20.0, alerts_burst: int = 5,
                 alerts_retries: int = 3, alerts_timeout: float = 5.0, alerts_flush_timeout: float = 5.0) -> None:
        if alerts_min_severity not in MIN_SEVERITIES:
            raise ValueError(f"alerts_min_severity must be one of {MIN_SEVERITIES}, got {alerts_min_severity!r}")
        self.enabled = alerts is not False
        self.url = alerts if isinstance(alerts, str) and alerts else None
        if self.url is None and self.enabled:
            self.url = os.environ.get(ENV_URL) or None
        self.format = alerts_format or os.environ.get(ENV_FORMAT) or None
        self.min_severity = alerts_min_severity
        self.trackers = alerts_trackers
        self.per_minute, self.burst = float(alerts_per_minute), int(alerts_burst)
        self.retries, self.timeout, self.flush_timeout = int(alerts_retries), float(alerts_timeout), float(alerts_flush_timeout)

    def __repr__(self) -> str:  # never the URL
        return f"AlertOptions(webhook={mask_url(self.url) if self.url else None}, min_severity={self.min_severity})"

    @classmethod
    def of(cls, options: Any) -> AlertOptions:
        if isinstance(options, AlertOptions):
            return options
        if options is None or isinstance(options, (str, bool)):
            return cls(alerts=options)
        if isinstance(options, Mapping):
            unknown = set(options) - set(OPTION_KEYS)
            if unknown:
                raise ValueError(f"unknown alert options {sorted(unknown)}; known: {', '.join(OPTION_KEYS)}")
            return cls(**options)
        raise ValueError(f"alerts must be a webhook URL, False, or a dict of alert options, got {type(options).__name__}")


class AlertDispatcher:
    """Rank 0's alert fan-out. ``on_step`` per logged step, ``finish`` at the trainer's final log,
    ``close`` at train end. A sink that raises is reported once through ``on_error`` and dropped."""

    def __init__(self, sinks: Sequence[Any], webhook: WebhookSender | None, *, min_severity: str = "warning",
                 run_id: str | None = None, run_dir: str | None = None, flush_timeout: float = 5.0,
                 on_error: Callable[[str, BaseException], None] | None = None) -> None:
        self.sinks = list(sinks)
        self.webhook = webhook
        self.min_rank = RANK[min_severity]
        self.run_id, self.run_dir = run_id, run_dir
        self.flush_timeout = flush_timeout
        self.on_error = on_error or _log_error
        self.episodes = Episodes()
        self.findings: list[dict[str, Any]] = []
        self.recs: list[dict[str, Any]] = []
        self.status: dict[tuple[str, Any], str] = {}
        self._webhooked: set[str] = set()  # detectors whose open episode reached the webhook
        self.last_step = 0
        self.closed = False

    def _sink_call(self, sink: Any, method: str, arg: Any) -> None:
        fn = getattr(sink, method, None)
        if fn is None:
            return
        try:
            fn(arg)
        except Exception as exc:
            self.sinks = [s for s in self.sinks if s is not sink]
            self.on_error(f"alerts to {sink.name}", exc)

    def on_step(self, step: int, states: Mapping[str, str], findings: Sequence[Any], recs: Sequence[Mapping[str, Any]] = ()) -> None:
        self.last_step = int(step)
        self._report_webhook_errors()
        fds = [as_dict(f) for f in findings]
        self.recs.extend(dict(r) for r in recs)
        events = self.episodes.step(step, states, fds)
        if not events:
            return
        for kind, f in events:
            key = (f["detector"], f.get("onset_step"))
            if kind == "finding":
                self.findings.append(f)
                self.status[key] = "open"
                message = finding_message(f, recommendation_for(f, self.recs), self.run_id, self.run_dir)
                to_webhook = RANK[f["severity"]] >= self.min_rank
                if to_webhook:
                    self._webhooked.add(f["detector"])
            else:
                self.status[key] = "resolved"
                message = resolved_message(f, step, self.run_id, self.run_dir)
                to_webhook = f["detector"] in self._webhooked
                self._webhooked.discard(f["detector"])
            for sink in list(self.sinks):
                self._sink_call(sink, "event", message)
            if to_webhook and self.webhook is not None:
                self.webhook.submit(message)
        self._summary(final=False)

    def _summary(self, final: bool) -> None:
        if not self.sinks:
            return
        state = SummaryState(self.last_step, verdict_of(self.findings), self.findings, self.recs, self.status, final)
        for sink in list(self.sinks):
            self._sink_call(sink, "summary", state)

    @property
    def verdict(self) -> str:
        return verdict_of(self.findings)

    def finish(self, step: int | None = None) -> None:
        """The final summary, written while the integrations still have their runs open."""
        if step is not None:
            self.last_step = int(step)
        self._summary(final=True)

    def _report_webhook_errors(self) -> None:
        if self.webhook is None:
            return
        for text in self.webhook.take_errors()[:1]:
            self.on_error("alerts webhook", RuntimeError(text))

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.webhook is not None:
            self.webhook.close(self.flush_timeout)
            self._report_webhook_errors()
        for sink in self.sinks:
            close = getattr(sink, "close", None)
            if close is not None:
                try:
                    close()
                except Exception as exc:
                    self.on_error(f"alerts to {sink.name}", exc)


def _log_error(component: str, exc: BaseException) -> None:
    logger.warning("grpo-monitor: %s failed (%s: %s); training continues", component, type(exc).__name__, exc)


def build_dispatcher(trainer: Any, run_dir: Any, run_id: str | None, options: Any,
                     on_error: Callable[[str, BaseException], None] | None = None) -> AlertDispatcher | None:
    """The dispatcher for this trainer and ``attach`` options; None when nothing would receive alerts."""
    on_error = on_error or _log_error
    opts = AlertOptions.of(options)
    if not opts.enabled:
        return None
    if opts.trackers is True:
        names = reported_trackers(trainer)
    elif not opts.trackers:
        names = []
    else:
        wanted = [opts.trackers] if isinstance(opts.trackers, str) else list(opts.trackers)
        names = [n for n in reported_trackers(trainer) if n in wanted]
    sinks = build_sinks(trainer, names, on_error)
    webhook = None
    if opts.url:
        try:
            webhook = WebhookSender(opts.url, opts.format, per_minute=opts.per_minute, burst=opts.burst,
                                    timeout=opts.timeout, retries=opts.retries)
        except Exception as exc:
            on_error("alerts webhook", RuntimeError(scrub(str(exc), opts.url)))
    if not sinks and webhook is None:
        return None
    return AlertDispatcher(sinks, webhook, min_severity=opts.min_severity, run_id=run_id,
                           run_dir=str(run_dir) if run_dir is not None else None,
                           flush_timeout=opts.flush_timeout, on_error=on_error)
