"""Chat and webhook delivery: Slack, Discord or a generic JSON payload, posted from a daemon thread.

The training thread only formats a message and puts it on a bounded queue; a full queue or the
rate limit drops the message (counted, and said in the next message that goes out), so the loop
never waits on the network. The URL is a secret: it is kept on the sender only, and every error
text that leaves this module has it masked.
"""

from __future__ import annotations

import json
import logging
import math
import queue
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

logger = logging.getLogger("grpo_monitor")

FORMATS = ("slack", "discord", "generic")
ENV_URL = "GRPO_MONITOR_WEBHOOK_URL"
ENV_FORMAT = "GRPO_MONITOR_WEBHOOK_FORMAT"
# Slack and Discord webhook paths; recognised on any host, so a proxy or a local relay keeps the format.
_SLACK_PATH = re.compile(r"^/services/[^/]+/[^/]+/[^/]+")
_DISCORD_PATH = re.compile(r"^/api(/v\d+)?/webhooks/\d+/[^/]+")
COLORS = {"critical": 0xE01E5A, "warning": 0xECB22E, "resolved": 0x2EB67D, "healthy": 0x2EB67D, "info": 0x439FE0}
ICONS = {"critical": "🚨", "warning": "⚠️", "resolved": "✅", "healthy": "✅", "info": "ℹ️"}


def mask_url(url: str) -> str:
    """Scheme and host only: webhook tokens live in the path and query."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or "?"
        if parts.port:
            host = f"{host}:{parts.port}"
        return f"{parts.scheme or '?'}://{host}/***"
    except Exception:
        return "<webhook URL>"


def scrub(text: str, url: str) -> str:
    """``text`` with the URL and each of its secret parts replaced by the masked form."""
    masked = mask_url(url)
    out = text.replace(url, masked)
    try:
        parts = urlsplit(url)
        for secret in (parts.path + ("?" + parts.query if parts.query else ""), parts.path, parts.query,
                       parts.password or "", parts.username or ""):
            if len(secret) > 1:
                out = out.replace(secret, "/***")
    except Exception:
        pass
    return out


def detect_format(url: str, explicit: str | None = None) -> str:
    if explicit:
        if explicit not in FORMATS:
            raise ValueError(f"alerts_format must be one of {', '.join(FORMATS)}, got {explicit!r}")
        return explicit
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if host == "hooks.slack.com" or _SLACK_PATH.match(parts.path):
        return "slack"
    if host.endswith(("discord.com", "discordapp.com")) or _DISCORD_PATH.match(parts.path):
        return "discord"
    return "generic"


def check_url(url: Any) -> str:
    if not isinstance(url, str) or urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).hostname:
        shown = mask_url(url) if isinstance(url, str) else type(url).__name__
        raise ValueError(f"the alerts webhook must be an http(s) URL, got {shown}")
    return url


# -- payloads ------------------------------------------------------------------------------


def _cut(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def payload(message: Mapping[str, Any], fmt: str) -> dict[str, Any]:
    """The JSON body for one message (see ``monitor.alerts.events.Message.to_dict``)."""
    if fmt == "slack":
        return _slack(message)
    if fmt == "discord":
        return _discord(message)
    return {"source": "grpo-monitor", **message}


def _slack(m: Mapping[str, Any]) -> dict[str, Any]:
    level = m["level"]
    head = f"{ICONS.get(level, '')} *{m['title']}*"
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": {"type": "mrkdwn", "text": _cut(head, 3000)}},
        {"type": "section", "text": {"type": "mrkdwn", "text": _cut(m["text"], 3000)}},
    ]
    rec = m.get("recommendation")
    if rec and rec.get("python"):
        blocks.append({"type": "section", "text": {"type": "mrkdwn",
                       "text": _cut(f"Recommended *{rec['variant']}*: `{rec['python']}`\nTRL flags: `{rec.get('cli_flags', '')}`", 3000)}})
    blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": _cut(_footer(m), 3000)}]})
    return {"text": _cut(f"{m['title']}: {m['text']}", 3000), "blocks": blocks}


def _discord(m: Mapping[str, Any]) -> dict[str, Any]:
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
        "footer": {"text": _cut(_footer(m), 1024)},
    }
    return {"username": "grpo-monitor", "embeds": [embed]}


def _footer(m: Mapping[str, Any]) -> str:
    bits = [f"run {m['run_id']}" if m.get("run_id") else None, m.get("run_dir")]
    return " · ".join(b for b in bits if b)


# -- delivery -------------------------------------------------------------------------------


def _strict(obj: Any) -> Any:
    """Non-finite floats as the strings the run log uses: chat services reject bare NaN in JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, Mapping):
        return {str(k): _strict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_strict(v) for v in obj]
    return obj


class DeliveryError(Exception):
    """A message that could not be delivered; its text never holds the URL."""


def post_json(url: str, body: Mapping[str, Any], *, timeout: float = 5.0, retries: int = 3, backoff: float = 0.5,
              max_backoff: float = 8.0, sleep: Callable[[float], None] = time.sleep) -> int:
    """POST ``body``; retry connection failures, time-outs, 429 and 5xx with exponential back-off
    (``Retry-After`` honoured up to ``max_backoff``). Returns the HTTP status; raises
    ``DeliveryError`` (URL masked) when every try failed or the server refused the message."""
    data = json.dumps(_strict(body), allow_nan=False, default=str).encode()
    last = ""
    for attempt in range(retries + 1):
        delay = min(max_backoff, backoff * (2 ** attempt))
        req = urllib.request.Request(url, data=data, method="POST",
                                     headers={"Content-Type": "application/json", "User-Agent": "grpo-monitor"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310  (http(s) checked in check_url)
                resp.read(65536)
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code} {exc.reason}"
            if exc.code != 429 and exc.code < 500:
                raise DeliveryError(f"{mask_url(url)} refused the message ({last})") from None
            after = exc.headers.get("Retry-After") if exc.headers else None
            if after and after.strip().isdigit():
                delay = min(max_backoff, float(after))
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            last = scrub(f"{type(reason).__name__}: {reason}", url)
        if attempt < retries:
            sleep(delay)
    raise DeliveryError(f"{mask_url(url)} did not take the message after {retries + 1} tries ({last})")


class RateLimit:
    """Token bucket: ``burst`` messages at once, then ``per_minute`` a minute."""

    def __init__(self, per_minute: float = 20.0, burst: int = 5, clock: Callable[[], float] = time.monotonic) -> None:
        if per_minute <= 0 or burst < 1:
            raise ValueError(f"the alerts rate limit needs per_minute > 0 and burst >= 1, got {per_minute}, {burst}")
        self.rate = per_minute / 60.0
        self.burst = float(burst)
        self.tokens = float(burst)
        self.clock = clock
        self.last = clock()
        self.lock = threading.Lock()

    def _refill(self) -> None:
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
        self.last = now

    def take(self) -> bool:
        with self.lock:
            self._refill()
            if self.tokens >= 1.0:
                self.tokens -= 1.0
                return True
            return False


class WebhookSender:
    """A daemon thread posting queued messages; ``submit`` never blocks."""

    def __init__(self, url: str, fmt: str | None = None, *, queue_size: int = 64, per_minute: float = 20.0,
                 burst: int = 5, timeout: float = 5.0, retries: int = 3, backoff: float = 0.5,
                 max_backoff: float = 8.0) -> None:
        self._url = check_url(url)
        self.masked = mask_url(url)
        self.format = detect_format(url, fmt)
        self.limit = RateLimit(per_minute, burst)
        self.timeout, self.retries, self.backoff, self.max_backoff = timeout, retries, backoff, max_backoff
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=queue_size)
        self.sent = 0
        self.dropped = 0  # held back by the rate limit or a full queue, not yet said
        self.dropped_total = 0
        self.errors: list[str] = []  # masked texts, collected by the caller's thread
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="grpo-monitor-alerts", daemon=True)
        self._thread.start()

    def __repr__(self) -> str:  # never the URL
        return f"WebhookSender({self.masked}, format={self.format})"

    def submit(self, message: Mapping[str, Any]) -> bool:
        """Queue one message; False when the rate limit or a full queue dropped it."""
        if self._stopping.is_set() or not self.limit.take():
            self._drop()
            return False
        try:
            self._queue.put_nowait(dict(message))
            return True
        except queue.Full:
            self._drop()
            return False

    def _drop(self) -> None:
        with self._lock:
            self.dropped += 1
            self.dropped_total += 1

    def take_errors(self) -> list[str]:
        with self._lock:
            out, self.errors = self.errors, []
        return out

    def _run(self) -> None:
        last: dict[str, Any] | None = None
        while True:
            try:
                item = self._queue.get(timeout=0.25)
            except queue.Empty:
                item = None
            if item is None:
                if self._stopping.is_set() and self._queue.empty():
                    return
                with self._lock:
                    held = self.dropped
                if held and last is not None and self.limit.take():
                    self._deliver(held_back_notice(last, held))
                    with self._lock:
                        self.dropped -= held
                continue
            last = item
            self._deliver(item)
            self._queue.task_done()

    def _deliver(self, message: Mapping[str, Any]) -> None:
        try:
            post_json(self._url, payload(message, self.format), timeout=self.timeout, retries=self.retries,
                      backoff=self.backoff, max_backoff=self.max_backoff)
            with self._lock:
                self.sent += 1
        except Exception as exc:  # a worker thread has nobody to raise to: the caller collects the text
            text = scrub(str(exc), self._url) if not isinstance(exc, DeliveryError) else str(exc)
            with self._lock:
                self.errors.append(text)

    def close(self, timeout: float = 5.0) -> bool:
        """Let queued messages go out for at most ``timeout`` seconds; True when all did. The
        thread is a daemon, so a server that never answers cannot hold the process."""
        self._stopping.set()
        self._thread.join(timeout)
        return not self._thread.is_alive()


def held_back_notice(last: Mapping[str, Any], count: int) -> dict[str, Any]:
    return {
        "event": "held_back",
        "level": "info",
        "title": f"grpo-monitor: {count} more alert{'s' if count != 1 else ''} held back by the rate limit",
        "text": f"Every finding is in the run log: {last.get('run_dir') or 'run.jsonl'}",
        "run_id": last.get("run_id"),
        "run_dir": last.get("run_dir"),
        "held_back": count,
        "finding": None,
        "recommendation": None,
    }


def post_messages(url: str, messages: Sequence[Mapping[str, Any]], fmt: str | None = None, **kwargs: Any) -> list[str]:
    """Post messages one by one in this thread (the offline verb); the masked errors, if any."""
    check_url(url)
    fmt = detect_format(url, fmt)
    errors = []
    for m in messages:
        try:
            post_json(url, payload(m, fmt), **kwargs)
        except DeliveryError as exc:
            errors.append(str(exc))
    return errors
