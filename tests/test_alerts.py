"""Alerts without a trainer: the episode messages a real detector's findings make, every payload
(Slack, Discord, Teams, PagerDuty, generic, a template of one's own, email) as real local servers
receive it — an HTTP server on 127.0.0.1 that answers, answers 500, hangs, answers only after the
time-out, or is not there, and an SMTP server (``aiosmtpd``) that does the same — every message
accounted for (delivered once, or counted), the rate limit, cap and cooldown, the options checked,
the secrets kept, and ``analyze --alerts``."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
import subprocess
import sys
import threading
import time
from email import message_from_bytes
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest

from grpo_monitor.alerts import AlertDispatcher, AlertOptions, Sender, WebhookSender, build_dispatcher, detect_format, mask_url
from grpo_monitor.alerts.delivery import RateLimit
from grpo_monitor.alerts.mail import EmailDestination
from grpo_monitor.alerts.webhook import WebhookDestination, post_json
from grpo_monitor.core.engine import Engine
from grpo_monitor.detectors.base import RunContext
from grpo_monitor.detectors.no_learning_signal import NoLearningSignal

ROOT = Path(__file__).resolve().parents[1]
STALL = {"completions/clipped_ratio": 1.0, "frac_reward_zero_std": 1.0, "reward": 0.0, "reward_std": 0.0, "grad_norm": 0.0}
HEALTHY = {"completions/clipped_ratio": 0.1, "frac_reward_zero_std": 0.1, "reward": 0.5, "reward_std": 0.4, "grad_norm": 1.0}
SECRET = "secret-token-123"


class Hook:
    """A real HTTP server on 127.0.0.1 recording each POST it takes.

    ``mode="answer"``: ``codes`` are answered in order, then 200 (a 5xx answer means it kept nothing);
    ``mode="slow"``: takes each request, then answers 200 only after ``delay`` seconds;
    ``mode="silent"``: accepts connections and never reads or answers (a hung server)."""

    def __init__(self, codes=(), mode="answer", delay=0.0):
        self.received: list[tuple[str, dict]] = []
        self.headers: list[dict] = []
        self.codes = list(codes)
        self.attempts = 0
        self.mode = mode
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                hook.attempts += 1
                code = hook.codes.pop(0) if hook.codes else 200
                if code == 200:
                    hook.received.append((self.path, json.loads(body)))
                    hook.headers.append(dict(self.headers))
                if hook.mode == "slow":
                    time.sleep(delay)
                try:
                    self.send_response(code)
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"ok")
                except OSError:
                    pass  # the client gave up waiting

            def log_message(self, *args):
                pass

        if mode == "silent":
            self.sock = socket.socket()
            self.sock.bind(("127.0.0.1", 0))
            self.sock.listen(64)  # the kernel completes the handshakes; nobody ever reads or answers
            self.port = self.sock.getsockname()[1]
            self.server = None
        else:
            self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
            self.server.daemon_threads = True
            self.port = self.server.server_address[1]
            threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, path=f"/hook/{SECRET}"):
        return f"http://127.0.0.1:{self.port}{path}"

    def wait(self, n, timeout=10.0):
        end = time.monotonic() + timeout
        while len(self.received) < n and time.monotonic() < end:
            time.sleep(0.02)
        return self.received

    def keys(self):
        return [h.get("Idempotency-Key") for h in self.headers]

    def close(self):
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        else:
            self.sock.close()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def refused_url():
    return f"http://127.0.0.1:{free_port()}/hook/{SECRET}"  # nothing listens there: connections are refused


class Mailbox:
    """A real SMTP server on 127.0.0.1 (aiosmtpd): ``codes`` answer the end of each mail's data in
    order (then 250); ``delay`` holds the answer back (the mail is taken first)."""

    def __init__(self, codes=(), delay=0.0):
        from aiosmtpd.controller import Controller

        self.mails = []
        self.codes = list(codes)
        box = self

        class Handler:
            async def handle_DATA(self, server, session, envelope):  # noqa: N802
                code = box.codes.pop(0) if box.codes else "250 OK"
                if code.startswith("250"):
                    box.mails.append(envelope)
                if delay:
                    await asyncio.sleep(delay)
                return code

        self.port = free_port()
        self.controller = Controller(Handler(), hostname="127.0.0.1", port=self.port)
        self.controller.start()

    @property
    def url(self):
        return f"smtp://127.0.0.1:{self.port}"

    def wait(self, n, timeout=10.0):
        end = time.monotonic() + timeout
        while len(self.mails) < n and time.monotonic() < end:
            time.sleep(0.02)
        return self.mails

    def close(self):
        self.controller.stop()


@pytest.fixture
def hook():
    h = Hook()
    yield h
    h.close()


def drive(dispatcher, stall=(1, 12), total=30):
    """A real no-learning-signal detector through the engine: stalled steps, then healthy ones."""
    det = NoLearningSignal(persist_points=2, persist_steps=0)
    det.clear_after, det.clear_steps = 2, 2
    engine = Engine(RunContext(), [det])
    for step in range(1, total + 1):
        metrics = STALL if any(a <= step <= b for a, b in ([stall] if isinstance(stall[0], int) else stall)) else HEALTHY
        findings = engine.update(step, dict(metrics))
        dispatcher.on_step(step, engine.state_names(), findings, [])
    return engine


def probe(step, i=0, severity="warning"):
    return {"detector": f"probe_{step}_{i}", "severity": severity, "step": step, "onset_step": step, "variant": None,
            "config_overrides": {}, "evidence": {"i": i}, "message": f"probe finding {i}"}


def test_format_recognised_from_host_or_path():
    assert detect_format("https://hooks.slack.com/services/T1/B2/xyz") == "slack"
    assert detect_format("http://127.0.0.1:8080/services/T1/B2/xyz") == "slack"
    assert detect_format("https://discord.com/api/webhooks/123/abc") == "discord"
    assert detect_format("http://127.0.0.1:8080/api/webhooks/123/abc") == "discord"
    assert detect_format("https://acme.webhook.office.com/webhookb2/x") == "teams"
    assert detect_format("https://prod-12.westus.logic.azure.com/workflows/x") == "teams"
    assert detect_format("https://events.pagerduty.com/v2/enqueue") == "pagerduty"
    assert detect_format("https://alerts.example.org/hook") == "generic"
    assert detect_format("https://hooks.slack.com/services/T1/B2/xyz", "generic") == "generic"
    with pytest.raises(ValueError, match="format must be one of"):
        detect_format("https://x.org/", "opsgenie")
    assert mask_url("https://user:pw@hooks.slack.com/services/T1/B2/xyz?k=1") == "https://hooks.slack.com/***"


@pytest.mark.parametrize("path,fmt", [(f"/hook/{SECRET}", "generic"), (f"/services/T0/B0/{SECRET}", "slack"),
                                      (f"/api/webhooks/42/{SECRET}", "discord"), (f"/teams/{SECRET}", "teams")])
def test_one_message_per_episode_stage_in_each_format(hook, path, fmt):
    sender = WebhookSender(hook.url(path), "teams" if fmt == "teams" else None)
    assert sender.format == fmt
    d = AlertDispatcher([], sender, run_id="abc123", run_dir="/runs/r1")
    drive(d)
    d.close()
    got = hook.wait(3)
    assert len(got) == 3 and all(p == path for p, _ in got)
    bodies = [b for _, b in got]
    keys = hook.keys()
    assert len(set(keys)) == 3 and all(keys)  # every request names its message
    if fmt == "generic":
        assert [(b["event"], b["level"]) for b in bodies] == [("finding", "warning"), ("finding", "critical"), ("resolved", "resolved")]
        assert [b["idempotency_key"] for b in bodies] == keys
        f = bodies[0]["finding"]
        assert set(f) == {"detector", "severity", "step", "onset_step", "variant", "config_overrides", "evidence", "message"}
        assert f["detector"] == "no_learning_signal" and f["evidence"]["conditions"]
        assert bodies[0]["run_dir"] == "/runs/r1" and bodies[0]["run_id"] == "abc123"
        assert bodies[0]["recommendation"] is None  # no variant cures a stall
        assert bodies[2]["resolved_step"] > bodies[1]["finding"]["step"]
        # one episode: its warning, critical and resolution share the episode's id
        assert len({b["episode"]["id"] for b in bodies}) == 1 and bodies[0]["episode"]["opened_at"] == bodies[0]["step"]
    elif fmt == "slack":
        for b, key in zip(bodies, keys):
            assert b["text"] and b["blocks"][0]["type"] == "section" and key in b["blocks"][-1]["elements"][0]["text"]
        assert "warning" in bodies[0]["text"] and "critical" in bodies[1]["text"] and "resolved" in bodies[2]["text"]
        assert "/runs/r1" in bodies[0]["blocks"][-1]["elements"][0]["text"]
    elif fmt == "discord":
        embeds = [b["embeds"][0] for b in bodies]
        assert [e["color"] for e in embeds] == [0xECB22E, 0xE01E5A, 0x2EB67D]
        assert "no_learning_signal" in embeds[0]["title"] and embeds[0]["description"] and keys[0] in embeds[0]["footer"]["text"]
    else:
        cards = [b["attachments"][0] for b in bodies]
        assert all(c["contentType"] == "application/vnd.microsoft.card.adaptive" for c in cards)
        blocks = [c["content"]["body"] for c in cards]
        assert [bl[0]["color"] for bl in blocks] == ["Warning", "Attention", "Good"] and keys[1] in blocks[1][-1]["text"]


def test_the_same_message_always_has_the_same_key(hook):
    """A restarted segment replaying the same steps, or a run analysed twice, names its messages alike."""
    keys = []
    for _ in range(2):
        d = AlertDispatcher([], WebhookSender(hook.url()), run_id="same-run")
        drive(d)
        d.close()
    hook.wait(6)
    keys = [b["idempotency_key"] for _, b in hook.received]
    assert keys[:3] == keys[3:] and len(set(keys[:3])) == 3


def test_recommendation_diff_travels_with_the_finding(hook):
    d = AlertDispatcher([], WebhookSender(hook.url()), run_dir="/runs/r2")
    finding = {"detector": "entropy_collapse", "severity": "critical", "step": 40, "onset_step": 31, "variant": "dapo",
               "config_overrides": {"epsilon_high": 0.28}, "evidence": {"ratio": 0.2}, "message": "Entropy collapsed."}
    rec = {"type": "recommendation", "step": 40, "variant": "dapo", "detector": "entropy_collapse",
           "config_overrides": {"epsilon_high": 0.28, "loss_type": "dapo"}, "cli_flags": "--epsilon_high 0.28 --loss_type dapo",
           "python": "epsilon_high=0.28, loss_type='dapo'", "extra": {}, "reasons": []}
    d.on_step(40, {"entropy_collapse": "critical"}, [finding], [rec])
    d.close()
    (_, body), = hook.wait(1)
    assert body["recommendation"] == {"variant": "dapo", "config_overrides": {"epsilon_high": 0.28, "loss_type": "dapo"},
                                      "cli_flags": "--epsilon_high 0.28 --loss_type dapo", "python": "epsilon_high=0.28, loss_type='dapo'"}


def test_min_severity_critical_skips_the_warning_but_keeps_the_resolution(hook):
    d = build_dispatcher(SimpleNamespace(args=SimpleNamespace(report_to=[])), "/runs/r3", "id1",
                         AlertOptions(to=hook.url(), min_severity="critical"))
    drive(d)
    d.close()
    hook.wait(2)
    time.sleep(0.3)
    assert [b["event"] + ":" + b["level"] for _, b in hook.received] == ["finding:critical", "resolved:resolved"]


# -- one POST: what the server did with it decides whether it is sent again -------------------------


def test_a_server_error_is_tried_again_and_kept_once():
    h = Hook(codes=[500, 503])
    try:
        out = post_json(h.url(), {"x": 1}, key="k1", backoff=0.01)
        assert out.status == "delivered" and out.tries == 3 and h.attempts == 3 and len(h.received) == 1
    finally:
        h.close()


def test_a_client_error_is_not_tried_again_and_the_url_stays_secret():
    h = Hook(codes=[404])
    try:
        out = post_json(h.url(), {"x": 1}, backoff=0.01)
        assert out.status == "failed" and h.attempts == 1 and SECRET not in out.detail and "HTTP 404" in out.detail
    finally:
        h.close()


def test_a_server_that_took_the_post_and_answers_late_gets_it_once():
    """Answering after the time-out, the server has the message already: a chat webhook cannot tell a
    second copy from a new message, so it is not sent again; an endpoint that de-duplicates by the
    idempotency key (PagerDuty, or one declared ``idempotent``) is tried again, with the same key."""
    h = Hook(mode="slow", delay=1.0)
    try:
        out = post_json(h.url(), {"x": 1}, key="once", timeout=0.3, retries=3, backoff=0.01)
        assert out.status == "unconfirmed" and out.tries == 1 and "not sent again" in out.detail
        time.sleep(0.2)
        assert h.attempts == 1 and h.keys() == ["once"]
        again = post_json(h.url(), {"x": 2}, key="twice", timeout=0.3, retries=1, backoff=0.01, idempotent=True)
        time.sleep(0.2)
        assert again.status == "failed" and h.keys()[1:] == ["twice", "twice"]
    finally:
        h.close()


def test_a_hung_server_gets_one_try_and_a_refused_one_is_tried_again():
    h = Hook(mode="silent")
    try:
        out = post_json(h.url(), {"x": 1}, timeout=0.3, retries=3, backoff=0.01)
        assert out.status == "unconfirmed" and out.tries == 1 and SECRET not in out.detail
    finally:
        h.close()
    out = post_json(refused_url(), {"x": 1}, timeout=0.3, retries=2, backoff=0.01)
    assert out.status == "failed" and out.tries == 3 and "3 tries" in out.detail and SECRET not in out.detail


# -- a run's worth of messages: each delivered once or counted ------------------------------------


@pytest.mark.parametrize("kind", ["answer", "server_error", "silent", "slow", "refused"])
def test_every_message_is_delivered_once_or_counted(kind, caplog):
    """Nine episodes' openings to a server that answers, answers 500 to everything, hangs, takes each
    POST and answers after the time-out, or is not there: the tally adds up to the nine, the server
    holds each message at most once, the count is noted, one warning line says any loss, and the flush
    waits at most its time."""
    h = {"answer": lambda: Hook(), "server_error": lambda: Hook(codes=[500] * 100), "silent": lambda: Hook(mode="silent"),
         "slow": lambda: Hook(mode="slow", delay=0.6), "refused": lambda: None}[kind]()
    url = h.url() if h else refused_url()
    notes = []
    caplog.set_level(logging.INFO, logger="grpo_monitor")
    d = AlertDispatcher([], WebhookSender(url, timeout=0.3, retries=2, backoff=0.01, burst=100, per_minute=1e6),
                        flush_timeout=1.0, note=notes.append, run_dir="/runs/r")
    try:
        for step in range(1, 10):
            d.on_step(step, {}, [probe(step)], [])
        time.sleep(0.5)
        t0 = time.monotonic()
        d.close()
        waited = time.monotonic() - t0
        time.sleep(0.7)  # let a slow server finish what it took
    finally:
        if h:
            h.close()
    assert waited < 1.0 + 0.5
    (dest,) = d.delivery_report["destinations"]
    assert dest["messages"] == 9 and dest["pending"] == 0
    assert dest["delivered"] + dest["unconfirmed"] + dest["lost"] + dest["skipped"] == 9
    if h is not None:
        assert len(h.keys()) == len(set(h.keys()))  # never a message twice
    if kind == "answer":
        assert dest["delivered"] == 9 and len(h.received) == 9
    elif kind == "server_error":
        assert dest["failed"] >= 1 and dest["delivered"] == 0 and not h.received and h.attempts > 9
    elif kind == "slow":
        assert dest["unconfirmed"] >= 1 and dest["unconfirmed"] + dest["unsent"] == 9
        assert len(h.received) == dest["unconfirmed"]  # what went out arrived, once each
    elif kind == "silent":
        assert dest["unconfirmed"] >= 1 and dest["unconfirmed"] + dest["unsent"] == 9
    else:
        assert dest["failed"] >= 1 and dest["failed"] + dest["unsent"] == 9
    (note,) = [n for n in notes if "alerts" in n]
    assert note["alerts"] == d.delivery_report and SECRET not in note["message"]
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    if kind == "answer":
        assert lines == [] and note["level"] == "info"
    else:
        assert len(lines) == 1 and "every finding is in the run log" in lines[0] and SECRET not in lines[0]
        assert note["level"] == "warning"


def test_several_destinations_one_hung_does_not_hold_the_others(hook):
    hung = Hook(mode="silent")
    box = Mailbox()
    try:
        opts = AlertOptions(to=[hung.url(), hook.url(), {"email": "oncall@example.org", "smtp": box.url}],
                            timeout=2.0, flush_timeout=1.0)
        d = AlertDispatcher([], [Sender(r.destination) for r in opts.routes], flush_timeout=1.0)
        for step in range(1, 4):
            d.on_step(step, {}, [probe(step)], [])
        assert len(hook.wait(3, timeout=1.5)) == 3  # while the hung one still waits on its first
        d.close()
        report = {x["destination"]: x for x in d.delivery_report["destinations"]}
        assert report[f"webhook {mask_url(hook.url())}"]["delivered"] == 3
        hung_counts = report[f"webhook {mask_url(hung.url())}"]
        assert hung_counts["delivered"] == 0 and hung_counts["unconfirmed"] + hung_counts["unsent"] == 3
        assert report[f"email to oncall@example.org via smtp://127.0.0.1:{box.port}"]["delivered"] == 3
    finally:
        hung.close()
        box.close()


def test_burst_is_rate_limited_announced_and_counted(hook):
    sender = WebhookSender(hook.url(), burst=3, per_minute=120.0)
    d = AlertDispatcher([], sender, run_dir="/runs/burst")
    d.on_step(5, {}, [probe(5, i) for i in range(20)], [])
    got = hook.wait(4, timeout=5.0)
    d.close()
    events = [b["event"] for _, b in got]
    assert events[:3] == ["finding"] * 3 and events[3] == "held_back" and len(got) == 4
    assert got[3][1]["held_back"] == 17 and "/runs/burst" in got[3][1]["text"]
    (dest,) = d.delivery_report["destinations"]
    assert dest["rate_limited"] == 17 and dest["delivered"] == 3 and dest["lost"] == 17 and dest["held_back_notices"] == 1


def test_a_full_queue_drops_without_waiting_and_counts():
    h = Hook(mode="silent")
    try:
        sender = WebhookSender(h.url(), queue_size=2, burst=100, per_minute=1e6, timeout=0.3, retries=0)
        d = AlertDispatcher([], sender, flush_timeout=0.5)
        d.on_step(1, {}, [probe(1, i) for i in range(10)], [])
        d.close()
    finally:
        h.close()
    (dest,) = d.delivery_report["destinations"]
    # one on its way, two queued behind it, the other seven dropped on the spot
    assert dest["queue_full"] >= 7 and dest["messages"] == 10 and dest["delivered"] == 0
    assert dest["unconfirmed"] + dest["unsent"] + dest["queue_full"] == 10


def test_no_resolution_for_an_episode_whose_opening_was_dropped(hook):
    """The rate limit drops one episode's opening: its resolution is not sent either; the other
    episode's opening and resolution go out."""
    d = AlertDispatcher([], WebhookSender(hook.url(), burst=1, per_minute=0.001))
    d.on_step(1, {}, [probe(1, 0), probe(1, 1)], [])
    d.routes[0][0].limit.tokens = 5.0  # the limit allows again
    d.on_step(2, {"probe_1_0": "ok", "probe_1_1": "ok"}, [], [])
    d.close()
    hook.wait(2)
    time.sleep(0.3)
    got = [(b["event"], b["finding"]["detector"]) for _, b in hook.received if b["event"] != "held_back"]
    assert got == [("finding", "probe_1_0"), ("resolved", "probe_1_0")]


def test_cap_and_cooldown_hold_back_on_purpose_and_say_so(hook):
    d = AlertDispatcher([], WebhookSender(hook.url(), burst=100, per_minute=1e6), max_per_run=4, cooldown_steps=5)
    det = "flappy"
    f = lambda step, sev="warning": {**probe(step, severity=sev), "detector": det, "onset_step": step}  # noqa: E731
    d.on_step(1, {det: "warning"}, [f(1)], [])            # sent (1)
    d.on_step(2, {det: "ok"}, [], [])                     # its resolution: always sent
    d.on_step(3, {det: "warning"}, [f(3)], [])            # within 5 steps of the last message: held back
    d.on_step(4, {det: "critical"}, [f(4, "critical")], [])  # a critical always goes (2)
    d.on_step(5, {det: "ok"}, [], [])                     # resolves the episode the critical opened
    for step in range(20, 26):
        d.on_step(step, {}, [probe(step)], [])            # 2 more under the cap, then 4 over it
    d.close()
    hook.wait(7)
    time.sleep(0.3)
    seen = [(b["event"], b["level"], b["step"]) for _, b in hook.received]
    assert seen == [("finding", "warning", 1), ("resolved", "resolved", 2), ("finding", "critical", 4),
                    ("resolved", "resolved", 5), ("finding", "warning", 20), ("finding", "warning", 21)]
    assert d.delivery_report["not_sent"] == {"over_the_cap": 4, "in_the_cooldown": 1, "resolution_of_an_unsent_opening": 0}


# -- headers, templates, mentions -----------------------------------------------------------------


def test_headers_and_a_template_for_an_internal_relay(hook):
    template = {"service": "grpo", "severity": "{level}", "summary": "{title}", "dedup": "{idempotency_key}",
                "detector": "{finding[detector]}", "finding": "{finding}", "fix": "{recommendation[python]}"}
    opts = AlertOptions.of({"url": hook.url(), "headers": {"Authorization": "Bearer tok-987"},
                                       "template": template})
    d = AlertDispatcher([], [Sender(opts.routes[0].destination)])
    drive(d)
    d.close()
    got = hook.wait(3)
    assert [h["Authorization"] for h in hook.headers] == ["Bearer tok-987"] * 3
    first = got[0][1]
    assert first["service"] == "grpo" and first["severity"] == "warning" and first["detector"] == "no_learning_signal"
    assert first["finding"]["severity"] == "warning" and first["fix"] == "" and first["dedup"] == hook.keys()[0]
    assert "tok-987" not in repr(opts) and "tok-987" not in opts.scrub("Authorization: Bearer tok-987")


def test_pagerduty_triggers_and_resolves_one_incident_per_episode(hook):
    opts = AlertOptions.of({"url": hook.url(), "format": "pagerduty", "routing_key": "R0UT1NG"})
    d = AlertDispatcher([], [Sender(opts.routes[0].destination)], run_dir="/runs/pd")
    drive(d)
    d.finish(30)  # the run's end is not a page
    d.close()
    got = [b for _, b in hook.wait(3)]
    time.sleep(0.3)
    assert [b["event_action"] for b in got] == ["trigger", "trigger", "resolve"] and len(hook.received) == 3
    assert len({b["dedup_key"] for b in got}) == 1 and all(b["routing_key"] == "R0UT1NG" for b in got)
    assert [b["payload"]["severity"] for b in got[:2]] == ["warning", "critical"]
    (dest,) = d.delivery_report["destinations"]
    assert dest["skipped"] == 1 and dest["lost"] == 0


def test_a_mention_on_critical_messages_only(hook):
    for path, check in [(f"/services/T/B/{SECRET}", lambda b: b["text"].startswith("<!here> ")),
                        (f"/api/webhooks/1/{SECRET}", lambda b: b.get("content") == "<!here>"),
                        (f"/hook/{SECRET}", lambda b: b.get("mention") == "<!here>")]:
        hook.received.clear()
        d = AlertDispatcher([], WebhookSender(hook.url(path), mention="<!here>"))
        drive(d)
        d.close()
        got = [b for _, b in hook.wait(3)]
        assert [check(b) for b in got] == [False, True, False], path


@pytest.mark.parametrize("bad,where,match", [
    ({"to": "ftp://host/secret-path"}, "AlertOptions(to=...)", "http"),
    ({"to": "https://host:notaport/x"}, "AlertOptions(to=...)", "http"),
    ({"to": "https://x.org/h", "format": "teamz"}, "AlertOptions(format=...)", "teamz"),
    ({"per_minute": 0}, "AlertOptions(per_minute=...)", "> 0"),
    ({"burst": 0}, "AlertOptions(burst=...)", ">= 1"),
    ({"min_severity": "info"}, "AlertOptions(min_severity=...)", "'info'"),
    ({"to": {"url": "https://x.org/h", "hedaers": {}}}, "AlertOptions(to=...)", "unknown keys"),
    ({"to": {"url": "https://x.org/h", "headers": {"Bad Name": "v"}}}, "AlertOptions(to=...)", "header name"),
    ({"to": "https://x.org/h", "headers": {"Bad Name": "v"}}, "AlertOptions(headers=...)", "header name"),
    ({"to": {"url": "https://x.org/h", "template": {"s": "{titel}"}}}, "AlertOptions(to=...)", "titel"),
    ({"template": {"s": "{titel}"}}, "AlertOptions(template=...)", "titel"),
    ({"to": {"url": "https://events.pagerduty.com/v2/enqueue"}}, "AlertOptions(to=...)", "routing_key"),
    ({"to": ["https://x.org/h", "mailto:not-an-address"]}, "AlertOptions(to=...)", "destination 2: .*addresses"),
    ({"to": {"email": "a@b.org", "smtp": "imap://mail"}}, "AlertOptions(to=...)", "smtp"),
    ({"to": {"url": "https://x.org/h", "burst": 0}}, "AlertOptions(to=...)", "burst must be"),
    ({"to": 42}, "AlertOptions(to=...)", "got int"),
    ({"mention": ""}, "AlertOptions(mention=...)", "non-empty"),
    ({"max_per_run": 0}, "AlertOptions(max_per_run=...)", ">= 1"),
    ({"cooldown_steps": -1}, "AlertOptions(cooldown_steps=...)", ">= 0"),
])
def test_each_bad_option_is_one_line_naming_the_field(bad, where, match):
    with pytest.raises(ValueError, match=re.escape(where) + ": .*" + match) as info:
        AlertOptions(**bad)
    assert "\n" not in str(info.value) and "secret-path" not in str(info.value)


def test_the_shorthand_names_what_attach_was_given(monkeypatch):
    """``AlertOptions.of`` is what ``attach(alerts=...)`` does with a bare destination: an error names that."""
    with pytest.raises(ValueError, match=r"^attach\(alerts=\.\.\.\): the alerts webhook must be an http\(s\) URL"):
        AlertOptions.of("hooks.slack.com/services/T/B/x")
    with pytest.raises(ValueError, match=r"^attach\(alerts=\.\.\.\): destination 2: unknown keys \['hedaers'\]"):
        AlertOptions.of(["https://x.org/a", {"url": "https://x.org/b", "hedaers": {}}])
    opts = AlertOptions(to="https://x.org/h", min_severity="critical")
    assert AlertOptions.of(opts) is opts
    monkeypatch.setenv("GRPO_MONITOR_WEBHOOK_FORMAT", "slak")
    with pytest.raises(ValueError, match=r"^\$GRPO_MONITOR_WEBHOOK_FORMAT: must be one of"):
        AlertOptions.of(None)


def test_options_never_show_a_secret(monkeypatch):
    opts = AlertOptions.of("https://hooks.slack.com/services/T1/B2/topsecret")
    assert "topsecret" not in repr(opts)
    monkeypatch.setenv("GRPO_MONITOR_WEBHOOK_URL", "https://hooks.slack.com/services/T1/B2/fromenv")
    assert AlertOptions.of(None).url.endswith("fromenv") and AlertOptions.of(False).url is None
    assert "topsecret" not in repr(WebhookSender("https://hooks.slack.com/services/T1/B2/topsecret"))
    monkeypatch.setenv("GRPO_MONITOR_WEBHOOK_URL", "not a url/with-secret")
    with pytest.raises(ValueError, match="http") as info:
        AlertOptions.of(None)  # what attach does: the environment's URL is checked there too
    assert "with-secret" not in str(info.value)


# -- email ------------------------------------------------------------------------------------------


def test_email_to_several_addresses_with_the_key_as_message_id():
    box = Mailbox()
    try:
        opts = AlertOptions.of({"email": ["oncall@example.org", "ml@example.org"], "smtp": box.url,
                                           "from": "monitor@example.org"})
        d = AlertDispatcher([], [Sender(opts.routes[0].destination)], run_dir="/runs/mail")
        drive(d)
        d.close()
        mails = box.wait(3)
    finally:
        box.close()
    assert len(mails) == 3 and all(sorted(m.rcpt_tos) == ["ml@example.org", "oncall@example.org"] for m in mails)
    parsed = [message_from_bytes(m.original_content) for m in mails]
    assert [p["Subject"].split(" at ")[0] for p in parsed] == ["grpo-monitor: warning no_learning_signal",
                                                               "grpo-monitor: critical no_learning_signal",
                                                               "grpo-monitor: resolved no_learning_signal"]
    assert len({p["Message-ID"] for p in parsed}) == 3 and parsed[1]["Importance"] == "high"
    assert "/runs/mail" in parsed[0].get_payload() and parsed[0]["From"] == "monitor@example.org"


@pytest.mark.parametrize("kind", ["try_later", "slow", "refused", "hung"])
def test_email_delivered_once_or_counted(kind):
    box = {"try_later": lambda: Mailbox(codes=["451 try again later"]), "slow": lambda: Mailbox(delay=1.0),
           "refused": lambda: None, "hung": lambda: Hook(mode="silent")}[kind]()
    port = box.port if box is not None else free_port()
    dest = EmailDestination("oncall@example.org", f"smtp://127.0.0.1:{port}", timeout=0.4, retries=2, backoff=0.01)
    from grpo_monitor.alerts.events import RunInfo, finding_message

    m = finding_message(probe(3, severity="critical"), None, RunInfo("r1", "/runs/r"), 3)
    try:
        out = dest.send(dest.render(m), m, None)
        time.sleep(1.0 if kind == "slow" else 0)
    finally:
        if box is not None:
            box.close()
    if kind == "try_later":
        assert out.status == "delivered" and out.tries == 2 and len(box.mails) == 1
    elif kind == "slow":
        assert out.status == "unconfirmed" and out.tries == 1 and len(box.mails) == 1  # taken, so never twice
    else:
        assert out.status == "failed" and out.tries == 3


def test_smtp_password_stays_secret(monkeypatch):
    monkeypatch.setenv("GRPO_MONITOR_SMTP_PASSWORD", "pw-55555")
    opts = AlertOptions.of({"email": "a@example.org", "smtp": "smtp+starttls://alerts@mail.example.org"})
    dest = opts.routes[0].destination
    assert dest.starttls and dest.port == 587 and "pw-55555" not in repr(opts) and "pw-55555" not in dest.name
    assert opts.scrub("login alerts pw-55555") == "login alerts ***"
    monkeypatch.delenv("GRPO_MONITOR_SMTP_PASSWORD")
    with pytest.raises(ValueError, match="no password"):
        AlertOptions.of({"email": "a@example.org", "smtp": "smtp://alerts@mail.example.org"})


# -- trackers off the training thread -----------------------------------------------------------------


def test_tracker_sinks_run_off_the_calling_thread_and_a_broken_one_is_dropped(hook):
    calls = []

    class Slow:
        name = "slow"

        def event(self, m):
            time.sleep(0.2)
            calls.append(("event", threading.current_thread().name))

        def summary(self, s):
            calls.append(("summary", threading.current_thread().name, s.final, s.delivery_totals()))

    class Broken:
        name = "broken"
        calls = 0

        def event(self, m):
            Broken.calls += 1
            raise RuntimeError("tracker down")

    errors = []
    d = AlertDispatcher([Slow(), Broken()], WebhookSender(hook.url()), on_error=lambda c, e: errors.append(c))
    d.on_step(1, {}, [probe(1)], [])
    assert calls == []  # handed over: the step does not wait on the sink
    drive(d)
    d.finish(30)
    d.close()
    assert errors == ["alerts to broken"] and Broken.calls == 1
    assert {c[1] for c in calls} == {"grpo-monitor-trackers"}
    assert len(hook.wait(5)) == 5  # the webhook went on: the step-1 warning, the episode's three, the end
    # the last summary is the final one, with the counts
    assert calls[-1] == ("summary", "grpo-monitor-trackers", True, {"messages": 5, "delivered": 5, "unconfirmed": 0, "lost": 0})


def _missing_tracker_script(tracker: str) -> str:
    return f"""
import logging, sys
sys.modules[{tracker!r}] = None  # an import of it now fails, as when it is not installed
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
from types import SimpleNamespace
from grpo_monitor.alerts import build_dispatcher
d = build_dispatcher(SimpleNamespace(args=SimpleNamespace(report_to=[{tracker!r}]), callback_handler=SimpleNamespace(callbacks=[])),
                     "/r", "id", None)
print("dispatcher", d)
"""


@pytest.mark.parametrize("tracker", ["wandb", "trackio", "mlflow"])
def test_a_tracker_that_is_not_installed_costs_one_warning_line(tracker):
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("GRPO_MONITOR_")}
    out = subprocess.run([sys.executable, "-c", _missing_tracker_script(tracker)], capture_output=True, text=True,
                         cwd=ROOT, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"WARNING grpo-monitor: alerts to {tracker} failed (ModuleNotFoundError"), lines
    assert out.stdout.strip() == "dispatcher None"


# -- analyze --alerts --------------------------------------------------------------------------------


def _export(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _stalled_export(path: Path, stalled: bool) -> Path:
    return _export(path, [{"step": s, **(STALL if stalled else HEALTHY)} for s in range(1, 31)])


def cli(*args):
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("GRPO_MONITOR_")}
    return subprocess.run([sys.executable, "-m", "grpo_monitor.app.cli", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=300, env=env)


def test_analyze_posts_the_verdict_of_a_foreign_run(tmp_path, hook):
    bad = _stalled_export(tmp_path / "stalled.jsonl", True)
    good = _stalled_export(tmp_path / "fine.jsonl", False)
    out = cli("analyze", str(bad), str(good), "--alerts", hook.url())
    assert out.returncode == 1, out.stderr
    (path, body), = hook.wait(1)
    assert body["event"] == "verdict" and body["verdict"] == "critical" and body["source"] == str(bad)
    assert [f["detector"] for f in body["findings"]] == ["no_learning_signal", "no_learning_signal"]
    assert body["idempotency_key"] == hook.keys()[0]
    time.sleep(0.2)
    assert len(hook.received) == 1  # the healthy run stays quiet at the default minimum severity


def test_analyze_sends_a_run_it_could_not_judge_with_the_reason(tmp_path, hook):
    unknown = _export(tmp_path / "mystery.jsonl", [{"step": s, "alpha": 0.1 * s, "beta": 10 + s} for s in range(1, 31)])
    out = cli("analyze", str(unknown), "--alerts", hook.url())
    assert out.returncode == 3, out.stderr
    (_, body), = hook.wait(1)
    assert body["verdict"] == "cannot_judge" and "alpha" in body["reason"] and "--map" in body["reason"]
    assert "Not judged:" in body["text"]


def test_analyze_checks_the_destination_before_it_reads_anything(tmp_path):
    bad = _stalled_export(tmp_path / "stalled.jsonl", True)
    out = cli("analyze", str(bad), "--alerts", "htp://example.org/secret-path")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().count("\n") == 0 and "--alerts" in out.stderr and "secret-path" not in out.stderr


def test_analyze_alerts_failure_has_its_own_exit_code(tmp_path):
    bad = _stalled_export(tmp_path / "stalled.jsonl", True)
    out = cli("analyze", str(bad), "--alerts", refused_url(), "--alerts-format", "slack")
    assert out.returncode == 4
    err = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(err) == 2 and err[0].startswith("grpo-monitor: alerts not sent:") and "exits 1" in err[1]
    assert SECRET not in out.stderr and SECRET not in out.stdout and "critical" in out.stdout


def test_analyze_alerts_analyses_each_run_once(tmp_path, hook, monkeypatch, capsys):
    import grpo_monitor.analysis.analyze as analysis
    from grpo_monitor.app.cli import main

    calls = []
    real = analysis._runs_of
    monkeypatch.setattr(analysis, "_runs_of", lambda p, *a, **k: calls.append(str(p)) or real(p, *a, **k))  # a spy
    bad = _stalled_export(tmp_path / "stalled.jsonl", True)
    good = _stalled_export(tmp_path / "fine.jsonl", False)
    assert main(["analyze", str(bad), str(good), "--alerts", hook.url(), "--alerts-min-severity", "info"]) == 1
    assert sorted(calls) == sorted([str(bad), str(good)]) and len(hook.wait(2)) == 2


def test_importing_alerts_loads_no_tracker_and_no_torch():
    code = ("import sys, grpo_monitor.alerts\n"
            "print(','.join(m for m in ('torch', 'transformers', 'wandb', 'trackio', 'mlflow', 'tensorboard', 'aiosmtpd') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120, check=True)
    assert out.stdout.strip() == ""


def test_non_finite_evidence_is_sent_as_strict_json(hook):
    d = AlertDispatcher([], WebhookSender(hook.url()))
    d.on_step(3, {}, [{"detector": "non_finite", "severity": "critical", "step": 3, "onset_step": 3, "variant": None,
                       "config_overrides": {}, "evidence": {"loss": float("nan"), "grad_norm": float("inf")},
                       "message": "The loss is NaN."}], [])
    d.close()
    (_, body), = hook.wait(1)
    assert body["finding"]["evidence"] == {"loss": "nan", "grad_norm": "inf"}


def test_rate_limit_refills():
    now = [0.0]
    rl = RateLimit(per_minute=60, burst=2, clock=lambda: now[0])
    assert rl.take() and rl.take() and not rl.take()
    now[0] = 1.0
    assert rl.take() and not rl.take()


def test_webhook_destination_repr_hides_the_url():
    dest = WebhookDestination(f"https://hooks.slack.com/services/T/B/{SECRET}")
    assert SECRET not in repr(dest) and SECRET not in dest.name and SECRET not in dest.scrub(f"x {dest._url} y")
