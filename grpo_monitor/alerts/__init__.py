"""Alerts: findings sent where a team already looks.

Live, ``attach(trainer, alerts=URL)`` (or ``GRPO_MONITOR_WEBHOOK_URL``) posts one Slack, Discord
or generic JSON message per detector episode and severity, and one when it resolves; the trackers
in ``args.report_to`` (W&B, trackio, TensorBoard, MLflow) get the findings in the run they already
have. Offline, ``grpo-monitor analyze --alerts URL`` posts each analysed run's verdict.

Nothing here imports a tracker or opens a connection until it is used; ``docs/ALERTS.md`` shows
every message.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from grpo_monitor.alerts.dispatch import OPTION_KEYS, AlertDispatcher, AlertOptions, build_dispatcher
from grpo_monitor.alerts.events import verdict_message
from grpo_monitor.alerts.webhook import ENV_URL, FORMATS, WebhookSender, detect_format, mask_url, post_messages

__all__ = [
    "ENV_URL",
    "FORMATS",
    "OPTION_KEYS",
    "AlertDispatcher",
    "AlertOptions",
    "WebhookSender",
    "build_dispatcher",
    "detect_format",
    "mask_url",
    "post_report",
    "redact",
    "report_messages",
]

_SEVERITY_RANK = {"info": 0, "healthy": 0, "incomplete": 0, "cannot_judge": 0, "warning": 1, "critical": 2}


def redact(items: Sequence[str], options: Any = None) -> list[str]:
    """``items`` (a command line, say) with the webhook URL of ``options`` (or the environment's)
    masked, so the run log never holds it."""
    from grpo_monitor.alerts.webhook import scrub

    try:
        url = AlertOptions.of(options).url
    except Exception:
        url = options if isinstance(options, str) else None
    if not url:
        return list(items)
    return [scrub(x, url) if isinstance(x, str) else x for x in items]


def report_messages(report: Any, min_severity: str = "warning") -> list[dict[str, Any]]:
    """One verdict message per run of a ``monitor.analysis.Report`` whose verdict reaches ``min_severity``
    (``info`` posts every run, healthy ones too)."""
    out = []
    for run in report.runs:
        verdict = run.verdict
        if _SEVERITY_RANK.get(verdict, 1) < _SEVERITY_RANK[min_severity]:
            continue
        out.append(verdict_message(verdict, [f.to_dict() for f in run.findings], run.recommendations,
                                   run_id=None, run_dir=str(run.source), source=str(run.source), steps=run.steps))
    return out


def post_report(report: Any, url: str, fmt: str | None = None, min_severity: str = "warning",
                **kwargs: Any) -> list[str]:
    """Post ``report``'s verdicts to ``url`` now (retries included); the errors, URL masked."""
    return post_messages(url, report_messages(report, min_severity), fmt, **kwargs)


def analyze_cli_post(paths: Sequence[str], url: str, fmt: str | None, min_severity: str, **analyze_options: Any) -> bool:
    """``grpo-monitor analyze --alerts``: replay ``paths`` and post the verdicts; one stderr line
    per delivery that failed. True when every message went out."""
    from grpo_monitor.analysis.report import analyze

    try:
        detect_format(url, fmt)
        errors = post_report(analyze(list(paths), **analyze_options), url, fmt, min_severity)
    except Exception as exc:  # the report is printed already; the post failing is one line, never a traceback
        from grpo_monitor.alerts.webhook import scrub

        errors = [scrub(f"{type(exc).__name__}: {exc}", url)]
    for e in errors:
        print(f"grpo-monitor: alerts not sent: {e}", file=sys.stderr)
    return not errors
