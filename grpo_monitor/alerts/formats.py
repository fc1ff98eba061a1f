"""What each destination receives for a message: Slack, Discord, Microsoft Teams, PagerDuty, the
generic JSON (the message itself), a payload template of the user's, and the plain text of an email.

A format may have nothing to send for an event (PagerDuty pages on findings and crashes, not on a
run's end): it returns None and the message is counted as skipped there, never as lost. A mention
(``@here``, a user or a role) is added to critical messages only.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable, Mapping
from typing import Any

FORMATS = ("slack", "discord", "teams", "pagerduty", "generic")
COLORS = {"critical": 0xE01E5A, "warning": 0xECB22E, "resolved": 0x2EB67D, "healthy": 0x2EB67D, "info": 0x439FE0}
ICONS = {"critical": "🚨", "warning": "⚠️", "resolved": "✅", "healthy": "✅", "info": "ℹ️"}
TEAMS_COLORS = {"critical": "Attention", "warning": "Warning", "resolved": "Good", "healthy": "Good"}
# PagerDuty Events API v2: a finding triggers the episode's incident, its resolution resolves it,
# a crash triggers one of its own; the rest of a run's life is not a page.
PAGERDUTY_SEVERITY = {"critical": "critical", "warning": "warning", "info": "info"}


def urgent(m: Mapping[str, Any]) -> bool:
    """Critical findings and crashes: the messages a mention is for."""
    return m.get("level") == "critical" and m.get("event") in ("finding", "crash")


def _cut(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def footer(m: Mapping[str, Any]) -> str:
    bits = [f"run {m['run_id']}" if m.get("run_id") else None,
            f"segment {m['segment']}" if (m.get("segment") or 1) > 1 else None, m.get("run_dir"),
            f"key {m['idempotency_key']}" if m.get("idempotency_key") else None]
    return " · ".join(b for b in bits if b)


def _rec_lines(m: Mapping[str, Any]) -> list[str]:
    rec = m.get("recommendation")
    if not rec or not rec.get("python"):
        return []
    return [f"Recommended {rec['variant']}: {rec['python']}", f"TRL flags: {rec.get('cli_flags', '')}"]


def plain_text(m: Mapping[str, Any]) -> str:
    """The message as plain text (an email's body): title, text, recommendation, where it came from."""
    return "\n\n".join(p for p in (m["title"], m["text"], "\n".join(_rec_lines(m)), footer(m)) if p) + "\n"


def slack(m: Mapping[str, Any], mention: str | None = None) -> dict[str, Any]:
    level = m["level"]
    lead = f"{mention} " if mention and urgent(m) else ""
    head = f"{lead}{ICONS.get(level, '')} *{m['title']}*"
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": {"type": "mrkdwn", "text": _cut(head, 3000)}},
        {"type": "section", "text": {"type": "mrkdwn", "text": _cut(m["text"], 3000)}},
    ]
    rec = m.get("recommendation")
    if rec and rec.get("python"):
        blocks.append({"type": "section", "text": {"type": "mrkdwn",
                       "text": _cut(f"Recommended *{rec['variant']}*: `{rec['python']}`\nTRL flags: `{rec.get('cli_flags', '')}`", 3000)}})
    blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": _cut(footer(m), 3000)}]})
    return {"text": _cut(f"{lead}{m['title']}: {m['text']}", 3000), "blocks": blocks}


def discord(m: Mapping[str, Any], mention: str | None = None) -> dict[str, Any]:
    level = m["level"]
    fields = []
    rec = m.get("recommendation")
    if rec and rec.get("python"):
        fields.append({"name": f"Recommended: {rec['variant']}", "value": _cut(f"`{rec['python']}`", 1024), "inline": False})
        fields.append({"name": "TRL flags", "value": _cut(f"`{rec.get('cli_flags', '')}`", 1024), "inline": False})
    embed = {
        "title": _cut(f"{ICONS.get(level, '')} {m['title']}", 256),
        "description": _cut(m["text"], 3500),
        "color": COLORS.get(level, 0),
        "fields": fields,
        "footer": {"text": _cut(footer(m), 1024)},
    }
    out: dict[str, Any] = {"username": "grpo-monitor", "embeds": [embed]}
    if mention and urgent(m):
        out["content"] = _cut(mention, 2000)
        out["allowed_mentions"] = {"parse": ["users", "roles", "everyone"]}
    return out


def teams(m: Mapping[str, Any], mention: str | None = None) -> dict[str, Any]:
    """An Adaptive Card, as a Teams channel's Workflows webhook takes it."""
    lead = f"{mention} " if mention and urgent(m) else ""
    body: list[dict[str, Any]] = [
        {"type": "TextBlock", "text": _cut(f"{lead}{m['title']}", 1000), "weight": "Bolder", "size": "Medium",
         "wrap": True, "color": TEAMS_COLORS.get(m["level"], "Default")},
        {"type": "TextBlock", "text": _cut(m["text"], 6000), "wrap": True},
    ]
    body += [{"type": "TextBlock", "text": _cut(line, 2000), "wrap": True, "fontType": "Monospace"} for line in _rec_lines(m)]
    body.append({"type": "TextBlock", "text": _cut(footer(m), 1000), "wrap": True, "isSubtle": True, "size": "Small"})
    card = {"$schema": "http://adaptivecards.io/schemas/adaptive-card.json", "type": "AdaptiveCard", "version": "1.4", "body": body}
    return {"type": "message", "attachments": [{"contentType": "application/vnd.microsoft.card.adaptive", "content": card}]}


def pagerduty(m: Mapping[str, Any], routing_key: str | None) -> dict[str, Any] | None:
    """PagerDuty Events API v2: the episode id is the ``dedup_key``, so a warning and its critical
    are one incident, its resolution resolves it, and a repeated event is dropped by PagerDuty."""
    event = m.get("event")
    episode = m.get("episode") or {}
    if event == "resolved":
        return {"routing_key": routing_key, "event_action": "resolve", "dedup_key": episode.get("id") or m["idempotency_key"]}
    if event not in ("finding", "crash") and not (event == "verdict" and m.get("level") in ("warning", "critical")):
        return None
    finding = m.get("finding") or {}
    details = {"text": m["text"], "run_dir": m.get("run_dir"), "idempotency_key": m["idempotency_key"]}
    if finding:
        details["finding"] = finding
    if m.get("recommendation"):
        details["recommendation"] = m["recommendation"]
    return {
        "routing_key": routing_key,
        "event_action": "trigger",
        "dedup_key": episode.get("id") or m["idempotency_key"],
        "payload": {"summary": _cut(m["title"], 1024), "source": m.get("run_dir") or m.get("source") or "grpo-monitor",
                    "severity": PAGERDUTY_SEVERITY.get(m["level"], "error"), "component": finding.get("detector") or event,
                    "group": m.get("run_id") or "grpo-monitor", "class": event, "custom_details": details},
        "client": "grpo-monitor",
    }


def generic(m: Mapping[str, Any], mention: str | None = None) -> dict[str, Any]:
    out = {"source": "grpo-monitor", **m}
    if mention and urgent(m):
        out["mention"] = mention
    return out


# -- the user's own payload ---------------------------------------------------------------------


class _Fields(string.Formatter):
    """``{name}``, ``{finding[detector]}``: the message's fields by name and key (never attributes).
    A key a message lacks (a ``recommendation`` that is None) reads as empty."""

    def get_field(self, field_name: str, args: Any, kwargs: Mapping[str, Any]) -> tuple[Any, str]:
        m = _FIELD.match(field_name)
        if m is None:
            raise ValueError(f"{{{field_name}}}: name a field and its keys, as {{finding[detector]}}")
        if m.group(1) not in kwargs:
            raise KeyError(m.group(1))
        try:
            return super().get_field(field_name, args, kwargs)
        except (KeyError, IndexError, TypeError):
            return "", m.group(1)

    def format_field(self, value: Any, format_spec: str) -> str:
        return "" if value is None else super().format_field(value, format_spec)


_FIELD = re.compile(r"^(\w+)(?:\[[^\]]*\])*$")
_FORMATTER = _Fields()


def template_fields(m: Mapping[str, Any], mention: str | None) -> dict[str, Any]:
    finding = m.get("finding") or {}
    rec = m.get("recommendation") or {}
    return {**m, "mention": mention if mention and urgent(m) else "", "detector": finding.get("detector"),
            "severity": finding.get("severity"), "message": finding.get("message"), "variant": rec.get("variant"),
            "python": rec.get("python"), "cli_flags": rec.get("cli_flags"), "footer": footer(m), "body": plain_text(m)}


def fill(template: Any, fields: Mapping[str, Any]) -> Any:
    """``template`` (dicts, lists and strings) with each ``{field}`` filled in; a string that is one
    field alone (``"{finding}"``) takes the field's value as it is (an object, a number)."""
    if isinstance(template, str):
        parsed = list(_FORMATTER.parse(template))
        if len(parsed) == 1 and parsed[0][0] == "" and parsed[0][1] is not None and not parsed[0][2] and not parsed[0][3]:
            return _FORMATTER.get_field(parsed[0][1], (), fields)[0]
        return _FORMATTER.vformat(template, (), fields)
    if isinstance(template, Mapping):
        return {fill(k, fields) if isinstance(k, str) else k: fill(v, fields) for k, v in template.items()}
    if isinstance(template, (list, tuple)):
        return [fill(v, fields) for v in template]
    return template


def render(m: Mapping[str, Any], fmt: str, *, mention: str | None = None, template: Any = None,
           routing_key: str | None = None) -> Any:
    """The JSON body for ``m`` in ``fmt`` (or the user's ``template``: a dict/list/str to fill in, or a
    callable taking the message); None when the destination has nothing to send for it."""
    if template is not None:
        if callable(template):
            return template(dict(m))
        return fill(template, template_fields(m, mention))
    if fmt == "slack":
        return slack(m, mention)
    if fmt == "discord":
        return discord(m, mention)
    if fmt == "teams":
        return teams(m, mention)
    if fmt == "pagerduty":
        return pagerduty(m, routing_key)
    return generic(m, mention)


def check_template(template: Any) -> Callable[[Mapping[str, Any]], Any] | Any:
    """Fill ``template`` for a sample message now, so a field that does not exist is one clear
    error at ``attach``, not a failure at the first finding."""
    if template is None or callable(template):
        return template
    if not isinstance(template, (Mapping, list, tuple, str)):
        raise ValueError(f"template must be a dict, list or string to fill in, or a function of the message; "
                         f"got {type(template).__name__}")
    from grpo_monitor.alerts.events import RunInfo, finding_message

    sample = finding_message({"detector": "entropy_collapse", "severity": "critical", "step": 40, "onset_step": 31,
                              "variant": "dapo", "config_overrides": {}, "evidence": {}, "message": "m"},
                             None, RunInfo("0123456789ab", "runs/r"), 40)
    try:
        fill(template, template_fields(sample, None))
    except KeyError as exc:
        known = ", ".join(sorted(template_fields(sample, None)))
        raise ValueError(f"template names the field {{{exc.args[0]}}}, which no message has; fields: {known}") from None
    except (ValueError, IndexError) as exc:
        raise ValueError(f"template cannot be filled in: {exc}") from None
    return template
