"""Webhooks: Slack, Discord, Microsoft Teams, PagerDuty or any JSON endpoint, over HTTP(S).

A POST is tried again only while the server has not taken it: a connection that failed, a request
that did not get through whole, or an answer saying it was not acted on (408, 425, 429, 5xx).
Once the whole request is sent and no answer comes within the time-out, the server may well have
acted on it, and a chat webhook has no way to tell a second copy from a new message: such a
message is counted ``unconfirmed`` and not sent again. Where the protocol de-duplicates
(PagerDuty's ``dedup_key``, or an endpoint declared ``idempotent`` that honours the
``Idempotency-Key`` header every request carries), it is tried again.

The URL and the headers are secrets: they stay on the destination, and every text that leaves
this module has them masked.
"""

from __future__ import annotations

import base64
import http.client
import json
import math
import re
import ssl
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import unquote, urlsplit

from grpo_monitor.alerts.delivery import DELIVERED, FAILED, UNCONFIRMED, Outcome, Sender
from grpo_monitor.alerts.formats import FORMATS, check_template, render

ENV_URL = "GRPO_MONITOR_WEBHOOK_URL"
ENV_FORMAT = "GRPO_MONITOR_WEBHOOK_FORMAT"
ENV_ROUTING_KEY = "GRPO_MONITOR_PAGERDUTY_ROUTING_KEY"
# Slack and Discord webhook paths; recognised on any host, so a proxy or a local relay keeps the format.
_SLACK_PATH = re.compile(r"^/services/[^/]+/[^/]+/[^/]+")
_DISCORD_PATH = re.compile(r"^/api(/v\d+)?/webhooks/\d+/[^/]+")
# Answers that say the server did not act on the request: safe to send it again.
RETRY_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")

__all__ = ["ENV_FORMAT", "ENV_URL", "FORMATS", "WebhookDestination", "WebhookSender", "check_url", "detect_format",
           "mask_url", "post_json", "scrub"]


def mask_url(url: str) -> str:
    """Scheme and host only: webhook tokens live in the path, the query and the user part."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or "?"
        if parts.port:
            host = f"{host}:{parts.port}"
        return f"{parts.scheme or '?'}://{host}/***"
    except Exception:
        return "<webhook URL>"


def url_secrets(url: str) -> list[str]:
    try:
        parts = urlsplit(url)
    except Exception:
        return [url]
    found = [parts.path + ("?" + parts.query if parts.query else ""), parts.path, parts.query,
             parts.password or "", parts.username or ""]
    return [s for s in found if len(s) > 1]


def scrub(text: str, url: str | None, *secrets: str) -> str:
    """``text`` with the URL, each of its secret parts and each of ``secrets`` masked."""
    out = text
    if url:
        out = out.replace(url, mask_url(url))
        for part in url_secrets(url):
            out = out.replace(part, "/***")
    for secret in secrets:
        if secret and len(secret) > 1:
            out = out.replace(secret, "***")
    return out


def detect_format(url: str, explicit: str | None = None) -> str:
    if explicit:
        if explicit not in FORMATS:
            raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {explicit!r}")
        return explicit
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if host == "hooks.slack.com" or _SLACK_PATH.match(parts.path):
        return "slack"
    if host.endswith(("discord.com", "discordapp.com")) or _DISCORD_PATH.match(parts.path):
        return "discord"
    if host.endswith((".webhook.office.com", ".logic.azure.com", ".powerplatform.com")):
        return "teams"
    if host == "events.pagerduty.com" or host.endswith(".events.pagerduty.com"):
        return "pagerduty"
    return "generic"


def check_url(url: Any) -> str:
    ok = False
    if isinstance(url, str):
        try:
            parts = urlsplit(url)
            ok = parts.scheme in ("http", "https") and bool(parts.hostname) and (parts.port or 1) > 0
        except ValueError:  # a port that is not a number
            ok = False
    if not ok:
        raise ValueError(f"the alerts webhook must be an http(s) URL, got {_what_is_wrong(url)}")
    return url


def _what_is_wrong(url: Any) -> str:
    """What is wrong with a refused webhook, without printing a token it may hold: the value itself
    only when it has no path, user part or query (where tokens live), else its first part.

    >>> _what_is_wrong("not a url"), _what_is_wrong("ftp://example.org/x/secret")
    ("'not a url' (no scheme: write https://...)", "ftp://example.org/*** (scheme 'ftp')")
    >>> _what_is_wrong("hooks.slack.com/services/T0/B0/XYZ"), _what_is_wrong(None)
    ("'hooks.slack.com/***' (no scheme: write https://...)", 'NoneType')
    """
    if not isinstance(url, str):
        return type(url).__name__
    try:
        parts = urlsplit(url)
        scheme, host, port = parts.scheme, parts.hostname, parts.port
    except ValueError:
        return f"{mask_url(url)} (a port that is not a number)"
    if not scheme:
        head = url.strip()
        if any(c in head for c in "/@?#"):
            head = head.split("/")[0].split("@")[-1].split("?")[0].split("#")[0] + "/***"
        return f"{head[:60]!r} (no scheme: write https://...)"
    if scheme not in ("http", "https"):
        return f"{mask_url(url)} (scheme {scheme!r})"
    if not host:
        return f"{scheme}://?/*** (no host)"
    return f"{mask_url(url)} (port {port})"


def check_headers(headers: Any) -> dict[str, str]:
    if headers is None:
        return {}
    if not isinstance(headers, Mapping):
        raise ValueError(f"headers must be a dict of header names to values, got {type(headers).__name__}")
    out = {}
    for name, value in headers.items():
        if not isinstance(name, str) or not _HEADER_NAME.match(name):
            raise ValueError(f"headers: {name!r} is not an HTTP header name")
        if not isinstance(value, str) or "\r" in value or "\n" in value:
            raise ValueError(f"headers: the value of {name} must be a one-line string")
        out[name] = value
    return out


# -- sending ----------------------------------------------------------------------------------


def _strict(obj: Any) -> Any:
    """Non-finite floats as the strings the run log uses: chat services reject bare NaN in JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, Mapping):
        return {str(k): _strict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_strict(v) for v in obj]
    return obj


class _NotTaken(Exception):
    """The request never got through whole: the server cannot have acted on it."""


class _NoAnswer(Exception):
    """The whole request went out and no answer came: the server may have acted on it."""


def _post_once(url: str, data: bytes, headers: Mapping[str, str], timeout: float) -> tuple[int, str | None, str]:
    parts = urlsplit(url)
    if parts.scheme == "https":
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(
            parts.hostname, parts.port, timeout=timeout, context=ssl.create_default_context())
    else:
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    try:
        try:
            conn.connect()
            conn.request("POST", target, body=data, headers=dict(headers))
        except (OSError, http.client.HTTPException) as exc:
            raise _NotTaken(f"{type(exc).__name__}: {exc}") from None
        try:
            resp = conn.getresponse()
            resp.read(65536)
        except (OSError, http.client.HTTPException) as exc:
            raise _NoAnswer(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__) from None
        return resp.status, resp.getheader("Retry-After"), resp.reason
    finally:
        conn.close()


def post_json(url: str, body: Any, *, key: str | None = None, headers: Mapping[str, str] | None = None,
              timeout: float = 5.0, retries: int = 3, backoff: float = 0.5, max_backoff: float = 8.0,
              idempotent: bool = False, deadline: float | None = None,
              sleep: Callable[[float], None] = time.sleep) -> Outcome:
    """POST ``body`` as JSON (with ``Idempotency-Key: key``); what became of it (the text masked).

    Tries again, with exponential back-off (``Retry-After`` honoured up to ``max_backoff``), while
    the server has not taken it (see the module's doc), up to ``retries`` times and never past
    ``deadline`` (``time.monotonic()``)."""
    data = json.dumps(_strict(body), allow_nan=False, default=str).encode()
    hdrs = {"Content-Type": "application/json", "User-Agent": "grpo-monitor"}
    if key:
        hdrs["Idempotency-Key"] = key
    parts = urlsplit(url)
    if parts.username is not None:
        creds = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
        hdrs["Authorization"] = "Basic " + base64.b64encode(creds).decode()
    hdrs.update(headers or {})
    secrets = [v for v in (headers or {}).values()]
    where = mask_url(url)
    last = ""
    for attempt in range(retries + 1):
        t = timeout if deadline is None else min(timeout, deadline - time.monotonic())
        if t <= 0:
            return Outcome(FAILED, f"{where}: the flush time ran out before it was taken ({last or 'not tried'})", attempt)
        delay = min(max_backoff, backoff * (2 ** attempt))
        try:
            status, after, reason = _post_once(url, data, hdrs, t)
        except _NotTaken as exc:
            last = scrub(str(exc), url, *secrets)
        except _NoAnswer as exc:
            last = scrub(str(exc), url, *secrets)
            if not idempotent:
                return Outcome(UNCONFIRMED, f"{where} took the message and gave no answer within {t:.3g} s ({last}); "
                                            "not sent again, so it arrived once or not at all", attempt + 1)
        else:
            if 200 <= status < 300:
                return Outcome(DELIVERED, f"HTTP {status}", attempt + 1)
            last = f"HTTP {status} {reason}".strip()
            if status not in RETRY_STATUS:
                return Outcome(FAILED, f"{where} refused the message ({last})", attempt + 1)
            if after and after.strip().isdigit():
                delay = min(max_backoff, float(after))
        if attempt < retries:
            if deadline is not None and time.monotonic() + delay >= deadline:
                return Outcome(FAILED, f"{where} did not take the message before the flush time ran out ({last})", attempt + 1)
            sleep(delay)
    return Outcome(FAILED, f"{where} did not take the message after {retries + 1} tries ({last})", retries + 1)


class WebhookDestination:
    """One webhook: its URL, format (or payload template), headers and mention."""

    kind = "webhook"

    def __init__(self, url: str, fmt: str | None = None, *, headers: Mapping[str, str] | None = None,
                 template: Any = None, mention: str | None = None, routing_key: str | None = None,
                 idempotent: bool | None = None, timeout: float = 5.0, retries: int = 3, backoff: float = 0.5,
                 max_backoff: float = 8.0) -> None:
        self._url = check_url(url)
        self.format = detect_format(url, fmt)
        self._headers = check_headers(headers)
        self.template = check_template(template)
        if mention is not None and (not isinstance(mention, str) or not mention.strip()):
            raise ValueError(f"mention must be a non-empty string such as '<!here>', got {mention!r}")
        self.mention = mention
        self._routing_key = routing_key
        if self.format == "pagerduty" and template is None and not routing_key:
            raise ValueError("a PagerDuty destination needs its integration's routing_key "
                             "(the destination's 'routing_key', or $GRPO_MONITOR_PAGERDUTY_ROUTING_KEY)")
        # PagerDuty drops a repeated event by its dedup_key: trying again after a time-out is safe there.
        self.idempotent = bool(self.format == "pagerduty" and template is None) if idempotent is None else bool(idempotent)
        if not timeout > 0 or retries < 0:
            raise ValueError(f"timeout must be > 0 and retries >= 0, got {timeout}, {retries}")
        self.timeout, self.retries, self.backoff, self.max_backoff = float(timeout), int(retries), backoff, max_backoff
        self.name = f"webhook {mask_url(url)}"

    def __repr__(self) -> str:  # never the URL
        return f"WebhookDestination({mask_url(self._url)}, format={self.format})"

    @property
    def secret_id(self) -> str:
        """Names this destination across segments of a lineage without saying its URL."""
        from grpo_monitor.alerts.events import message_key

        return message_key("webhook", self._url)

    def scrub(self, text: str) -> str:
        return scrub(text, self._url, *self._headers.values(), *([self._routing_key] if self._routing_key else []))

    def render(self, message: Mapping[str, Any]) -> Any:
        return render(message, self.format, mention=self.mention, template=self.template, routing_key=self._routing_key)

    def send(self, body: Any, message: Mapping[str, Any], deadline: float | None) -> Outcome:
        return post_json(self._url, body, key=message.get("idempotency_key"), headers=self._headers, timeout=self.timeout,
                         retries=self.retries, backoff=self.backoff, max_backoff=self.max_backoff,
                         idempotent=self.idempotent, deadline=deadline)


class WebhookSender(Sender):
    """A webhook destination and its daemon thread (``Sender``)."""

    def __init__(self, url: str, fmt: str | None = None, *, queue_size: int = 64, per_minute: float = 20.0,
                 burst: int = 5, notice: Callable[[int, int], Mapping[str, Any]] | None = None, **destination: Any) -> None:
        dest = WebhookDestination(url, fmt, **destination)
        self.format = dest.format
        self.masked = mask_url(url)
        super().__init__(dest, queue_size=queue_size, per_minute=per_minute, burst=burst, notice=notice)
