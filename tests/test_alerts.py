"""Alerts without a trainer: the episode messages a real detector's findings make, the Slack /
Discord / generic payloads as a real HTTP server on 127.0.0.1 receives them, retries, the rate
limit, servers that never answer or refuse, the URL kept secret, and ``analyze --alerts``."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest

from grpo_monitor.detectors.no_learning_signal import NoLearningSignal
from grpo_monitor.alerts import AlertDispatcher, AlertOptions, WebhookSender, build_dispatcher, detect_format, mask_url
from grpo_monitor.alerts.webhook import DeliveryError, RateLimit, post_json
from grpo_monitor.core.engine import Engine
from grpo_monitor.detectors.base import RunContext

ROOT = Path(__file__).resolve().parents[1]
STALL = {"completions/clipped_ratio": 1.0, "frac_reward_zero_std": 1.0, "reward": 0.0, "reward_std": 0.0, "grad_norm": 0.0}
HEALTHY = {"completions/clipped_ratio": 0.1, "frac_reward_zero_std": 0.1, "reward": 0.5, "reward_std": 0.4, "grad_norm": 1.0}


class Hook:
    """A real HTTP server on 127.0.0.1 that records each POST; ``codes`` are answered in order
    (then 200). ``mode="silent"`` accepts connections and never answers."""

    def __init__(self, codes=(), mode="answer"):
        self.received: list[tuple[str, dict]] = []
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
                self.send_response(code)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

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
            self.port = self.server.server_address[1]
            threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, path="/hook/secret-token-123"):
        return f"http://127.0.0.1:{self.port}{path}"

    def wait(self, n, timeout=10.0):
        end = time.monotonic() + timeout
        while len(self.received) < n and time.monotonic() < end:
            time.sleep(0.02)
        return self.received

    def close(self):
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        else:
            self.sock.close()


def refused_url():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now: connections are refused
    return f"http://127.0.0.1:{port}/hook/secret-token-123"


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
        metrics = STALL if stall[0] <= step <= stall[1] else HEALTHY
        findings = engine.update(step, dict(metrics))
        dispatcher.on_step(step, engine.state_names(), findings, [])
    return engine


def test_format_recognised_from_host_or_path():
    assert detect_format("https://hooks.slack.com/services/T1/B2/xyz") == "slack"
    assert detect_format("http://127.0.0.1:8080/services/T1/B2/xyz") == "slack"
    assert detect_format("https://discord.com/api/webhooks/123/abc") == "discord"
    assert detect_format("http://127.0.0.1:8080/api/webhooks/123/abc") == "discord"
    assert detect_format("https://alerts.example.org/hook") == "generic"
    assert detect_format("https://hooks.slack.com/services/T1/B2/xyz", "generic") == "generic"
    with pytest.raises(ValueError, match="alerts_format"):
        detect_format("https://x.org/", "teams")
    assert mask_url("https://user:pw@hooks.slack.com/services/T1/B2/xyz?k=1") == "https://hooks.slack.com/***"


@pytest.mark.parametrize("path,fmt", [("/hook/secret-token-123", "generic"), ("/services/T0/B0/secret", "slack"),
                                      ("/api/webhooks/42/secret", "discord")])
def test_one_message_per_episode_stage_in_each_format(hook, path, fmt):
    sender = WebhookSender(hook.url(path))
    assert sender.format == fmt
    d = AlertDispatcher([], sender, run_id="abc123", run_dir="/runs/r1")
    drive(d)
    d.close()
    got = hook.wait(3)
    assert len(got) == 3 and all(p == path for p, _ in got)
    bodies = [b for _, b in got]
    if fmt == "generic":
        assert [(b["event"], b["level"]) for b in bodies] == [("finding", "warning"), ("finding", "critical"), ("resolved", "resolved")]
        f = bodies[0]["finding"]
        assert set(f) == {"detector", "severity", "step", "onset_step", "variant", "config_overrides", "evidence", "message"}
        assert f["detector"] == "no_learning_signal" and f["evidence"]["conditions"]
        assert bodies[0]["run_dir"] == "/runs/r1" and bodies[0]["run_id"] == "abc123"
        assert bodies[0]["recommendation"] is None  # no variant cures a stall
        assert bodies[2]["resolved_step"] > bodies[1]["finding"]["step"]
    elif fmt == "slack":
        for b in bodies:
            assert b["text"] and b["blocks"][0]["type"] == "section"
        assert "warning" in bodies[0]["text"] and "critical" in bodies[1]["text"] and "resolved" in bodies[2]["text"]
        assert bodies[0]["blocks"][-1]["type"] == "context" and "/runs/r1" in bodies[0]["blocks"][-1]["elements"][0]["text"]
    else:
        embeds = [b["embeds"][0] for b in bodies]
        assert [e["color"] for e in embeds] == [0xECB22E, 0xE01E5A, 0x2EB67D]
        assert "no_learning_signal" in embeds[0]["title"] and embeds[0]["description"]


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
                         {"alerts": hook.url(), "alerts_min_severity": "critical"})
    drive(d)
    d.close()
    got = hook.wait(2)
    time.sleep(0.3)
    assert [b["event"] + ":" + b["level"] for _, b in hook.received] == ["finding:critical", "resolved:resolved"]


def test_server_error_then_success_is_one_message():
    h = Hook(codes=[500])
    try:
        status = post_json(h.url(), {"x": 1}, backoff=0.01)
        assert status == 200 and h.attempts == 2 and len(h.received) == 1
    finally:
        h.close()


def test_client_error_is_not_retried_and_the_url_stays_secret():
    h = Hook(codes=[404])
    try:
        with pytest.raises(DeliveryError) as err:
            post_json(h.url(), {"x": 1}, backoff=0.01)
        assert h.attempts == 1 and "secret-token-123" not in str(err.value) and "HTTP 404" in str(err.value)
    finally:
        h.close()


@pytest.mark.parametrize("kind", ["silent", "refused"])
def test_unreachable_server_never_blocks_the_caller(kind):
    h = Hook(mode="silent") if kind == "silent" else None
    url = h.url() if h else refused_url()
    errors = []
    d = AlertDispatcher([], WebhookSender(url, timeout=0.5, retries=1, backoff=0.05), flush_timeout=2.0,
                        on_error=lambda c, e: errors.append((c, str(e))))
    try:
        worst = 0.0
        for step in range(1, 31):
            t0 = time.perf_counter()
            d.on_step(step, {"no_learning_signal": "critical"}, [
                {"detector": f"probe_{step}", "severity": "warning", "step": step, "onset_step": step, "variant": None,
                 "config_overrides": {}, "evidence": {}, "message": "m"}], [])
            worst = max(worst, time.perf_counter() - t0)
        assert worst < 0.05  # formatting and a queue put, never the network
        t0 = time.perf_counter()
        d.close()
        assert time.perf_counter() - t0 < 3.0
        if kind == "refused":
            assert errors and all("secret-token-123" not in text for _, text in errors)
            assert errors[0][0] == "alerts webhook" and "127.0.0.1" in errors[0][1]
    finally:
        if h:
            h.close()


def test_burst_is_rate_limited_and_the_rest_is_announced(hook):
    sender = WebhookSender(hook.url(), burst=3, per_minute=120.0)
    d = AlertDispatcher([], sender, run_dir="/runs/burst")
    findings = [{"detector": f"probe_{i}", "severity": "warning", "step": 5, "onset_step": 5, "variant": None,
                 "config_overrides": {}, "evidence": {}, "message": f"finding {i}"} for i in range(20)]
    d.on_step(5, {}, findings, [])
    got = hook.wait(4, timeout=5.0)
    d.close()
    events = [b["event"] for _, b in got]
    assert events[:3] == ["finding"] * 3 and events[3] == "held_back" and len(got) == 4
    assert got[3][1]["held_back"] == 17 and "/runs/burst" in got[3][1]["text"]


def test_rate_limit_refills():
    now = [0.0]
    rl = RateLimit(per_minute=60, burst=2, clock=lambda: now[0])
    assert rl.take() and rl.take() and not rl.take()
    now[0] = 1.0
    assert rl.take() and not rl.take()


def test_options_are_checked_and_never_show_the_url(monkeypatch):
    with pytest.raises(ValueError, match="alerts_min_severity"):
        AlertOptions.of({"alerts_min_severity": "info"})
    with pytest.raises(ValueError, match="unknown alert options"):
        AlertOptions.of({"alerts_retry": 3})
    opts = AlertOptions.of("https://hooks.slack.com/services/T1/B2/topsecret")
    assert "topsecret" not in repr(opts)
    monkeypatch.setenv("GRPO_MONITOR_WEBHOOK_URL", "https://hooks.slack.com/services/T1/B2/fromenv")
    assert AlertOptions.of(None).url.endswith("fromenv") and AlertOptions.of(False).url is None
    errors = []
    d = build_dispatcher(SimpleNamespace(args=SimpleNamespace(report_to="none")), "/r", "id", "ftp://host/secret-path",
                         on_error=lambda c, e: errors.append(str(e)))
    assert d is None and errors and "secret-path" not in errors[0]
    assert "topsecret" not in repr(WebhookSender("https://hooks.slack.com/services/T1/B2/topsecret"))


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
    out = subprocess.run([sys.executable, "-c", _missing_tracker_script(tracker)], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"WARNING grpo-monitor: alerts to {tracker} failed (ModuleNotFoundError"), lines
    assert out.stdout.strip() == "dispatcher None"


def test_a_sink_that_raises_is_dropped_after_one_report(hook):
    class Broken:
        name = "broken"
        calls = 0

        def event(self, m):
            Broken.calls += 1
            raise RuntimeError("tracker down")

    errors = []
    d = AlertDispatcher([Broken()], WebhookSender(hook.url()), on_error=lambda c, e: errors.append(c))
    drive(d)
    d.close()
    assert errors == ["alerts to broken"] and Broken.calls == 1
    assert len(hook.wait(3)) == 3  # the webhook went on


def _stalled_export(path: Path, stalled: bool) -> Path:
    rows = [{"step": s, **(STALL if stalled else HEALTHY)} for s in range(1, 31)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_analyze_posts_the_verdict_of_a_foreign_run(tmp_path, hook):
    bad = _stalled_export(tmp_path / "stalled.jsonl", True)
    good = _stalled_export(tmp_path / "fine.jsonl", False)
    out = subprocess.run([sys.executable, "-m", "grpo_monitor.app.cli", "analyze", str(bad), str(good), "--alerts", hook.url()],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 1, out.stderr
    (path, body), = hook.wait(1)
    assert body["event"] == "verdict" and body["verdict"] == "critical" and body["source"] == str(bad)
    assert [f["detector"] for f in body["findings"]] == ["no_learning_signal", "no_learning_signal"]
    time.sleep(0.2)
    assert len(hook.received) == 1  # the healthy run stays quiet at the default minimum severity


def test_analyze_alerts_failure_is_one_masked_line(tmp_path):
    bad = _stalled_export(tmp_path / "stalled.jsonl", True)
    url = refused_url()
    out = subprocess.run([sys.executable, "-m", "grpo_monitor.app.cli", "analyze", str(bad), "--alerts", url, "--alerts-format", "slack"],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 1
    err = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("grpo-monitor: alerts not sent:") and "secret-token-123" not in out.stderr
    assert "secret-token-123" not in out.stdout


def test_importing_alerts_loads_no_tracker_and_no_torch():
    code = ("import sys, grpo_monitor.alerts\n"
            "print(','.join(m for m in ('torch', 'transformers', 'wandb', 'trackio', 'mlflow', 'tensorboard') if m in sys.modules))")
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
