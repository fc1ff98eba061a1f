"""Email over SMTP (``smtplib``): one mail per message, plain text, to one or more addresses.

``smtp://host[:25]``, ``smtp+starttls://host[:587]`` (STARTTLS, the default on port 587) or
``smtps://host[:465]`` (TLS from the start); a user in the URL (``smtp://alerts@host``) logs in with
the ``password`` given or ``$GRPO_MONITOR_SMTP_PASSWORD``. A mail is tried again while the server
has not taken it (no connection, a 4xx answer before or after the data); once the whole mail has
been sent and the connection breaks before the server's answer, it may be on its way, so it is
counted ``unconfirmed`` and not sent again. Each mail's ``Message-ID`` comes from the message's
idempotency key, so a copy can be told from a new mail.
"""

from __future__ import annotations

import os
import smtplib
import socket
import ssl
import time
from collections.abc import Mapping, Sequence
from email.message import EmailMessage
from email.utils import formatdate
from typing import Any
from urllib.parse import unquote, urlsplit

from grpo_monitor.alerts.delivery import DELIVERED, FAILED, UNCONFIRMED, Outcome
from grpo_monitor.alerts.formats import plain_text

ENV_PASSWORD = "GRPO_MONITOR_SMTP_PASSWORD"
ENV_SMTP = "GRPO_MONITOR_SMTP_URL"
SCHEMES = {"smtp": 25, "smtp+starttls": 587, "smtps": 465}


class _BodyWatch:
    """Knows when the whole mail (its final ``CRLF.CRLF``) has gone out on the connection."""

    body_sent = False

    def send(self, s: Any) -> None:
        super().send(s)  # type: ignore[misc]
        if isinstance(s, (bytes, bytearray)) and bytes(s).endswith(b"\r\n.\r\n"):
            self.body_sent = True


class _SMTP(_BodyWatch, smtplib.SMTP):
    pass


class _SMTPS(_BodyWatch, smtplib.SMTP_SSL):
    pass


def _addresses(to: Any) -> list[str]:
    if isinstance(to, str):
        to = [a for a in to.replace(";", ",").split(",")]
    if not isinstance(to, Sequence) or isinstance(to, (bytes, bytearray)):
        raise ValueError(f"an email destination's 'to' must be an address or a list of them, got {type(to).__name__}")
    out = [str(a).strip() for a in to if str(a).strip()]
    bad = [a for a in out if "@" not in a or any(c in a for c in " \r\n<>")]
    if not out or bad:
        raise ValueError(f"an email destination needs addresses such as oncall@example.org, got {bad or to!r}")
    return out


class EmailDestination:
    kind = "email"

    def __init__(self, to: Any, smtp: str | None = None, sender: str | None = None, *, password: str | None = None,
                 timeout: float = 10.0, retries: int = 2, backoff: float = 1.0, max_backoff: float = 8.0) -> None:
        self.to = _addresses(to)
        smtp = smtp or os.environ.get(ENV_SMTP) or "smtp://localhost"
        parts = urlsplit(smtp)
        if parts.scheme not in SCHEMES or not parts.hostname:
            raise ValueError(f"an email destination's smtp must be smtp://host[:port], smtp+starttls://… or smtps://…, "
                             f"got {parts.scheme or '?'}://{parts.hostname or '?'}")
        try:
            port = parts.port or SCHEMES[parts.scheme]
        except ValueError:
            raise ValueError("an email destination's smtp URL has a port that is not a number") from None
        self.scheme, self.host, self.port = parts.scheme, parts.hostname, port
        self.starttls = parts.scheme == "smtp+starttls" or (parts.scheme == "smtp" and port == 587)
        self.user = unquote(parts.username) if parts.username else None
        self._password = password if password is not None else (unquote(parts.password) if parts.password else None)
        if self.user and self._password is None:
            self._password = os.environ.get(ENV_PASSWORD)
        if self.user and not self._password:
            raise ValueError(f"the SMTP user {self.user} has no password: give 'password' or set ${ENV_PASSWORD}")
        self.sender = sender or f"grpo-monitor@{socket.gethostname() or 'localhost'}"
        _addresses([self.sender])
        if not timeout > 0 or retries < 0:
            raise ValueError(f"timeout must be > 0 and retries >= 0, got {timeout}, {retries}")
        self.timeout, self.retries, self.backoff, self.max_backoff = float(timeout), int(retries), backoff, max_backoff
        shown = ", ".join(self.to[:3]) + (f" and {len(self.to) - 3} more" if len(self.to) > 3 else "")
        self.name = f"email to {shown} via {self.scheme}://{self.host}:{self.port}"

    def __repr__(self) -> str:
        return f"EmailDestination({self.name})"

    @property
    def secret_id(self) -> str:
        from grpo_monitor.alerts.events import message_key

        return message_key("email", self.host, self.port, *self.to)

    def scrub(self, text: str) -> str:
        return text.replace(self._password, "***") if self._password and len(self._password) > 1 else text

    def render(self, message: Mapping[str, Any]) -> EmailMessage:
        mail = EmailMessage()
        mail["Subject"] = message["title"]
        mail["From"] = self.sender
        mail["To"] = ", ".join(self.to)
        mail["Date"] = formatdate(localtime=True)
        domain = self.sender.rsplit("@", 1)[-1]
        mail["Message-ID"] = f"<{message['idempotency_key']}@{domain}>"
        mail["X-GRPO-Monitor-Event"] = str(message.get("event"))
        mail["X-GRPO-Monitor-Level"] = str(message.get("level"))
        if message.get("level") == "critical":
            mail["Importance"] = "high"
        mail.set_content(plain_text(message))
        return mail

    def _connect(self, timeout: float) -> smtplib.SMTP:
        if self.scheme == "smtps":
            conn: smtplib.SMTP = _SMTPS(self.host, self.port, timeout=timeout, context=ssl.create_default_context())
        else:
            conn = _SMTP(self.host, self.port, timeout=timeout)
            if self.starttls:
                conn.starttls(context=ssl.create_default_context())
        if self.user:
            conn.login(self.user, self._password or "")
        return conn

    def send(self, body: EmailMessage, message: Mapping[str, Any], deadline: float | None) -> Outcome:
        where = f"{self.host}:{self.port}"
        last = ""
        for attempt in range(self.retries + 1):
            t = self.timeout if deadline is None else min(self.timeout, deadline - time.monotonic())
            if t <= 0:
                return Outcome(FAILED, f"{where}: the flush time ran out before the mail was taken ({last or 'not tried'})", attempt)
            conn: Any = None
            try:
                conn = self._connect(t)
                refused = conn.send_message(body, self.sender, self.to)
                try:
                    conn.quit()
                except (OSError, smtplib.SMTPException):
                    pass  # the mail was accepted; the goodbye does not matter
                detail = f"refused for {', '.join(refused)}" if refused else "accepted"
                return Outcome(DELIVERED, detail, attempt + 1)
            except smtplib.SMTPRecipientsRefused as exc:
                return Outcome(FAILED, f"{where} refused every recipient ({_codes(exc.recipients)})", attempt + 1)
            except smtplib.SMTPResponseException as exc:
                last = f"SMTP {exc.smtp_code} {_text(exc.smtp_error)}"
                if exc.smtp_code >= 500 or isinstance(exc, smtplib.SMTPAuthenticationError):
                    return Outcome(FAILED, self.scrub(f"{where} refused the mail ({last})"), attempt + 1)
            except (OSError, smtplib.SMTPException) as exc:
                last = self.scrub(f"{type(exc).__name__}: {exc}")
                if conn is not None and conn.body_sent:
                    return Outcome(UNCONFIRMED, f"{where} had the whole mail and gave no answer ({last}); not sent "
                                                "again, so it arrived once or not at all", attempt + 1)
            finally:
                if conn is not None:
                    try:
                        conn.close()
                    except OSError:
                        pass
            if attempt < self.retries:
                delay = min(self.max_backoff, self.backoff * (2 ** attempt))
                if deadline is not None and time.monotonic() + delay >= deadline:
                    break
                time.sleep(delay)
        return Outcome(FAILED, f"{where} did not take the mail after {self.retries + 1} tries ({last})", self.retries + 1)


def _text(b: Any) -> str:
    return b.decode("utf-8", "replace") if isinstance(b, (bytes, bytearray)) else str(b)


def _codes(recipients: Mapping[str, Any]) -> str:
    return ", ".join(f"{a}: {c[0]}" for a, c in list(recipients.items())[:3])
