"""Alerts: findings sent where a team already looks.

Live, ``attach(trainer, alerts=...)`` (a destination, a list of them, or ``AlertOptions``; or ``GRPO_MONITOR_WEBHOOK_URL``) sends one message per detector
episode and severity, one when it resolves, and the run's life (a restart, a crash, its end) to each
destination: Slack, Discord, Microsoft Teams, PagerDuty, any JSON webhook (with its own headers or
payload template), email over SMTP. The trackers in ``args.report_to`` (W&B, trackio, TensorBoard,
MLflow) get the findings in the run they already have. Offline, ``grpo-monitor analyze --alerts``
sends each analysed run's verdict.

Nothing here imports a tracker or opens a connection until it is used; ``docs/ALERTS.md`` shows
every message.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from grpo_monitor.alerts.delivery import Outcome, RateLimit, Sender
from grpo_monitor.alerts.dispatch import AlertDispatcher, build_dispatcher, describe
from grpo_monitor.alerts.events import verdict_message
from grpo_monitor.alerts.formats import FORMATS
from grpo_monitor.alerts.options import AlertOptions, OptionError
from grpo_monitor.alerts.webhook import ENV_URL, WebhookSender, detect_format, mask_url

__all__ = [
    "ENV_URL",
    "FORMATS",
    "AlertDispatcher",
    "AlertOptions",
    "OptionError",
    "Outcome",
    "RateLimit",
    "Sender",
    "WebhookSender",
    "build_dispatcher",
    "describe",
    "detect_format",
    "mask_url",
    "post_report",
    "redact",
    "report_messages",
]

# A verdict worth a message at each minimum severity: a run nothing could judge is never passed over
# as healthy, one still running (``incomplete``) is news only to ``info``.
_SEVERITY_RANK = {"info": 0, "healthy": 0, "incomplete": 0, "cannot_judge": 1, "warning": 1, "critical": 2}


def redact(items: Sequence[str], options: Any = None) -> list[str]:
    """``items`` (a command line, say) with every destination's secrets in ``options`` (or the
    environment's) masked, so the run log never holds them."""
    try:
        opts = AlertOptions.of(options)
    except Exception:
        from grpo_monitor.alerts.webhook import scrub

        url = options if isinstance(options, str) else None
        return [scrub(x, url) if isinstance(x, str) and url else x for x in items]
    return [opts.scrub(x) if isinstance(x, str) else x for x in items]


def report_messages(report: Any, min_severity: str = "warning") -> list[dict[str, Any]]:
    """One verdict message per run of an ``analysis.run_report.Report`` whose verdict reaches
    ``min_severity`` (``info`` sends every run, healthy ones too); a run that could not be judged
    says why."""
    from grpo_monitor.analysis.run_report import needs_text

    out = []
    for run in report.runs:
        verdict = run.verdict
        if _SEVERITY_RANK.get(verdict, 1) < _SEVERITY_RANK[min_severity]:
            continue
        reason = needs_text(run) if verdict == "cannot_judge" else (run.status_note or None if verdict == "incomplete" else None)
        out.append(verdict_message(verdict, [f.to_dict() for f in run.findings], run.recommendations,
                                   run_id=None, run_dir=str(run.source), source=str(run.source), steps=run.steps,
                                   reason=reason))
    return out


def cli_destination(spec: str, fmt: str | None = None) -> Any:
    """The destination ``grpo-monitor analyze --alerts SPEC`` sends to (checked now: a bad URL or
    format is one line before anything is read)."""
    try:
        return AlertOptions(to=spec, format=fmt, trackers=False).routes[0].destination
    except OptionError as exc:  # the command line says which flag; the reason is what it lacks
        raise ValueError(exc.reason) from None


def post_report(report: Any, destination: Any, min_severity: str = "warning") -> list[str]:
    """Send ``report``'s verdicts to ``destination`` now, in this thread (retries included); what
    went wrong with each that was not confirmed delivered, secrets masked."""
    from grpo_monitor.alerts.delivery import DELIVERED, SKIPPED

    errors = []
    for m in report_messages(report, min_severity):
        try:
            body = destination.render(m)
            if body is None:
                continue
            out = destination.send(body, m, None)
        except Exception as exc:  # one line, never a traceback
            errors.append(destination.scrub(f"{m.get('source')}: {type(exc).__name__}: {exc}"))
            continue
        if out.status not in (DELIVERED, SKIPPED):
            errors.append(f"{m.get('source')}: {out.detail}")
    return errors
