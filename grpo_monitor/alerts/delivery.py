"""One destination's deliveries, from a daemon thread of its own, with every message accounted for.

The training thread only puts a message on the destination's bounded queue (``Sender.submit``);
the thread renders and sends it. Each message ends in exactly one of:

* ``delivered`` — the destination confirmed it;
* ``unconfirmed`` — sent whole, but no answer came in time; it is not sent again where a second
  copy would be a duplicate (a chat webhook, an SMTP server that had the whole mail), so it
  arrived once or not at all;
* ``failed`` — refused, or every try failed before the destination took it;
* ``rate_limited`` / ``queue_full`` — dropped on the training thread, never waited for;
* ``unsent`` — still queued when the flush time at the end of training ran out;
* ``skipped`` — the destination's format has nothing to send for that event (not a loss).

``counts()`` gives the tally; the dispatcher writes it to the run log and says any loss in one line.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

DELIVERED, UNCONFIRMED, FAILED = "delivered", "unconfirmed", "failed"
RATE_LIMITED, QUEUE_FULL, UNSENT, SKIPPED = "rate_limited", "queue_full", "unsent", "skipped"
QUEUED, SENDING = "queued", "sending"
OUTCOMES = (DELIVERED, UNCONFIRMED, FAILED, RATE_LIMITED, QUEUE_FULL, UNSENT, SKIPPED)
LOST = (FAILED, RATE_LIMITED, QUEUE_FULL, UNSENT)


@dataclass(frozen=True)
class Outcome:
    status: str  # DELIVERED, UNCONFIRMED or FAILED
    detail: str = ""  # what happened, secrets masked
    tries: int = 1


class Destination(Protocol):
    name: str  # masked: "webhook https://hooks.slack.com/***"

    def render(self, message: Mapping[str, Any]) -> Any: ...  # None: nothing to send for this event

    def send(self, body: Any, message: Mapping[str, Any], deadline: float | None) -> Outcome: ...

    def scrub(self, text: str) -> str: ...


class RateLimit:
    """Token bucket: ``burst`` messages at once, then ``per_minute`` a minute."""

    def __init__(self, per_minute: float = 20.0, burst: int = 5, clock: Callable[[], float] = time.monotonic) -> None:
        if not per_minute > 0 or burst < 1:
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


def _importance(m: Mapping[str, Any]) -> int:
    """At the flush, the run's life (its end, a crash, a restart) goes first; the rest keeps its order."""
    from grpo_monitor.alerts.events import LIFE_EVENTS

    return 0 if m.get("event") in LIFE_EVENTS else 1


class Sender:
    """A daemon thread delivering one destination's messages; ``submit`` never blocks.

    ``notice`` makes the message that tells the destination how many were held back by the rate
    limit (sent once the limit allows, when the queue is idle)."""

    def __init__(self, destination: Destination, *, queue_size: int = 64, per_minute: float = 20.0, burst: int = 5,
                 notice: Callable[[int, int], Mapping[str, Any]] | None = None) -> None:
        self.destination = destination
        self.name = destination.name
        self.limit = RateLimit(per_minute, burst)
        self.queue_size = int(queue_size)
        self.notice = notice
        self._pending: deque[dict[str, Any]] = deque()
        self._fates: dict[str, str] = {}
        self._counts = dict.fromkeys(OUTCOMES, 0)
        self._details: dict[str, str] = {}  # the first reason seen for each outcome but delivered
        self._held = 0  # rate-limited since the last notice
        self._notices = 0
        self._errors: list[str] = []  # the first trouble, for the training thread to report
        self._reported = False
        self._cv = threading.Condition()
        self._stopping = False
        self._deadline: float | None = None
        self._thread = threading.Thread(target=self._run, name="grpo-monitor-alerts", daemon=True)
        self._thread.start()

    def __repr__(self) -> str:  # the name is masked
        return f"Sender({self.name})"

    # -- the training thread ------------------------------------------------------------------

    def submit(self, message: Mapping[str, Any], urgent: bool = False) -> bool:
        """Queue one message; False when it was dropped (rate limit, full queue, closed). ``urgent``
        messages (the run's life) pass the rate limit and the queue's bound: a run has a handful."""
        key = message["idempotency_key"]
        with self._cv:
            if self._stopping:
                return self._drop(key, UNSENT, "handed over after the flush began")
            if not urgent and not self.limit.take():
                self._held += 1
                return self._drop(key, RATE_LIMITED, "over the rate limit")
            if not urgent and len(self._pending) >= self.queue_size:
                return self._drop(key, QUEUE_FULL, f"the queue of {self.queue_size} was full")
            self._pending.append(dict(message))
            self._fates[key] = QUEUED
            self._cv.notify()
        return True

    def _drop(self, key: str, why: str, detail: str) -> bool:
        self._fates[key] = why
        self._counts[why] += 1
        self._details.setdefault(why, detail)
        return False

    def fate(self, key: str) -> str | None:
        with self._cv:
            return self._fates.get(key)

    def counts(self) -> dict[str, Any]:
        """The tally so far; what is still queued or on its way is counted as ``pending``."""
        with self._cv:
            out: dict[str, Any] = dict(self._counts)
            out["pending"] = sum(1 for f in self._fates.values() if f in (QUEUED, SENDING))
            out["messages"] = sum(self._counts.values()) + out["pending"]
            out["lost"] = sum(self._counts[k] for k in LOST)
            out["held_back_notices"] = self._notices
            out["details"] = dict(self._details)
        return out

    def take_errors(self) -> list[str]:
        with self._cv:
            out, self._errors = self._errors, []
        return out

    def close(self, deadline: float) -> bool:
        """Let the queue go out until ``deadline`` (``time.monotonic()``); what is left then is counted
        unsent, and what is on its way, unconfirmed. True when everything was done by then. The
        thread is a daemon: a destination that never answers cannot hold the process."""
        with self._cv:
            if not self._stopping:
                self._stopping = True
                self._deadline = deadline
                # The run's life first: with little time left, its end matters most.
                ordered = sorted(self._pending, key=_importance)
                self._pending.clear()
                self._pending.extend(ordered)
            self._cv.notify()
        self._thread.join(max(0.0, deadline - time.monotonic()))
        with self._cv:
            for m in self._pending:
                self._settle(m["idempotency_key"], UNSENT, "the flush time ran out first")
            self._pending.clear()
            for key, fate in self._fates.items():
                if fate == SENDING:  # on its way at the deadline: it may still arrive, it is never sent twice
                    self._fates[key] = UNCONFIRMED
                    self._counts[UNCONFIRMED] += 1
                    self._details.setdefault(UNCONFIRMED, "still on its way when the flush time ran out")
        return not self._thread.is_alive()

    # -- the sender's thread -----------------------------------------------------------------

    def _settle(self, key: str, status: str, detail: str) -> None:
        if self._fates.get(key) not in (QUEUED, SENDING):
            return  # settled already (counted at the deadline, say)
        self._fates[key] = status
        self._counts[status] += 1
        if status != DELIVERED:
            self._details.setdefault(status, detail)
        if status in (FAILED, UNCONFIRMED) and not self._reported:
            self._reported = True
            self._errors.append(detail)

    def _next(self) -> dict[str, Any] | None:
        with self._cv:
            while True:
                if self._pending:
                    if self._deadline is not None and time.monotonic() >= self._deadline:
                        return None
                    m = self._pending.popleft()
                    self._fates[m["idempotency_key"]] = SENDING
                    return m
                if self._stopping:
                    return None
                if self._held and self.notice is not None and self.limit.take():
                    held, self._held = self._held, 0
                    self._notices += 1
                    return {**self.notice(held, self._notices), "_notice": True}
                self._cv.wait(0.25)

    def _run(self) -> None:
        while True:
            m = self._next()
            if m is None:
                return
            notice = m.pop("_notice", False)
            key = m["idempotency_key"]
            try:
                body = self.destination.render(m)
                if body is None:
                    status, detail = SKIPPED, "nothing to send for this event in this format"
                else:
                    with self._cv:
                        deadline = self._deadline
                    out = self.destination.send(body, m, deadline)
                    status, detail = out.status, out.detail
            except Exception as exc:  # nobody to raise to on this thread: counted and reported
                status, detail = FAILED, self.destination.scrub(f"{type(exc).__name__}: {exc}")
            if notice:
                continue
            with self._cv:
                self._settle(key, status, detail)
