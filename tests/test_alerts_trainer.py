"""Alerts from a real GRPOTrainer on the tiny model: each tracker the trainer reports to holds the
alerts, the findings table and the verdict in the run the trainer opened (read back with the
tracker's own reader, and matching the run log), webhooks reach real HTTP servers on 127.0.0.1, a
server that hangs, fails or answers late never holds the training and every message it was due is
accounted for in the run log, a crash and the demo's auto-restart are said in the channel, the
options are checked at ``attach``, and the URL is written nowhere.

Each training runs in its own process: the trackers keep global state (the current W&B run, the
active MLflow run, trackio's directory read at import) and W&B writes its offline file at exit.
The run is driven into a stall by design: from the first step every completion gets the same
reward (no learning signal), from step 5 the rewards differ again, so the detector raises a
warning, then a critical, then resolves.
"""

from __future__ import annotations

import glob
import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_alerts import SECRET, Hook, refused_url

pytest.importorskip("trl")

ROOT = Path(__file__).resolve().parents[1]
STEPS = 8

DRIVER = r"""
import json, logging, os, sys, time, warnings
cfg = json.loads(os.environ["ALERTS_TEST_DRIVER"])  # not argv: W&B records the command line
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
import transformers
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer
from grpo_monitor.callbacks import AlertOptions, attach
from grpo_monitor.detectors.base import Detector, Finding
from grpo_monitor.detectors.no_learning_signal import NoLearningSignal
from grpo_monitor.fixtures.tiny import build_dataset, build_model, build_tokenizer
transformers.logging.set_verbosity_error()
warnings.filterwarnings("ignore")
calls = [0]
# The steps (reward calls) at which every completion scores alike; the others have a spread.
stalled = set(cfg.get("stalled", [1, 2, 3, 4]))

def stall_then_spread(completions, **kwargs):
    calls[0] += 1
    if cfg.get("raise_at") == calls[0]:
        raise ValueError("reward server returned 503")
    if calls[0] in stalled:
        # A stall that comes back later may fall below what the run has paid (a collapse, not a saturation).
        return [cfg.get("relapse", 0.5) if calls[0] > 4 else 0.5] * len(completions)
    return [float(i % 2) for i in range(len(completions))]

class BurstProbe(Detector):
    # Twelve warnings at step 2, each its own episode.
    id = "burst_probe"
    def _reset_state(self):
        self.state = "ok"
    def update(self, step, metrics, samples=None):
        if step != 2:
            return []
        return [Finding(detector=f"burst_probe_{i}", severity="warning", step=step, onset_step=step, variant=None,
                        config_overrides={}, evidence={"i": i}, message=f"burst finding {i}") for i in range(12)]

class Clock(TrainerCallback):
    # When the trainer's final log began (before the monitor's own on_log: added first).
    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "train_runtime" in logs:
            self.final_log = time.monotonic()

if cfg.get("raise_in") == "mlflow":
    import mlflow
    def refuse(*a, **k):
        raise RuntimeError("tracking server unavailable")
    mlflow.MlflowClient.set_tag = refuse

args = GRPOConfig(output_dir=cfg["out"], bf16=False, use_cpu=True, use_vllm=False, logging_steps=1,
                  max_completion_length=8, num_generations=4, per_device_train_batch_size=4, max_steps=cfg["steps"],
                  report_to=cfg["report_to"], save_strategy="no", learning_rate=1e-4, seed=7, disable_tqdm=True,
                  dataloader_num_workers=0, run_name="alerts-test")
trainer = GRPOTrainer(model=build_model(), reward_funcs=[stall_then_spread], args=args,
                      train_dataset=build_dataset(32), processing_class=build_tokenizer())
clock = Clock()
trainer.add_callback(clock)
det = NoLearningSignal(persist_points=2, persist_steps=0)
det.clear_after, det.clear_steps = 2, 1
detectors = [BurstProbe()] if cfg.get("burst") else [det]
options = dict(cfg.get("attach", {}))
if "alert_options" in cfg:
    options["alerts"] = AlertOptions(**cfg["alert_options"])
cb = attach(trainer, cfg["run_dir"], detectors=detectors, **options)
try:
    trainer.train()
except ValueError as exc:
    print("RAISED", exc, flush=True)
else:
    print("FINAL_LOG_TO_END", time.monotonic() - clock.final_log, flush=True)
print("TRAINED", trainer.state.global_step, flush=True)
"""


def train(tmp_path: Path, report_to, attach=None, argv=(), steps=STEPS, **extra):
    """Train in a fresh process; ``argv`` lands on its command line (and so in the run log's header)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "TRACKIO_", "MLFLOW_", "GRPO_MONITOR_"))}
    env.update(WANDB_MODE="offline", WANDB_DIR=str(tmp_path / "wandb"), WANDB_SILENT="true", WANDB_PROJECT="alerts-test",
               TRACKIO_DIR=str(tmp_path / "trackio"), MLFLOW_TRACKING_URI=f"file:{tmp_path / 'mlruns'}",
               MLFLOW_ALLOW_FILE_STORE="true", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=str(ROOT), TENSORBOARD_LOGGING_DIR=str(tmp_path / "out" / "tb"))
    (tmp_path / "wandb").mkdir(exist_ok=True)
    cfg = {"out": str(tmp_path / "out"), "run_dir": str(tmp_path / "run"), "steps": steps, "report_to": report_to,
           "attach": attach or {}, **extra}
    env["ALERTS_TEST_DRIVER"] = json.dumps(cfg)
    out = subprocess.run([sys.executable, "-c", DRIVER, *argv], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=600)
    assert out.returncode == 0 and "TRAINED" in out.stdout, out.stderr[-3000:]
    return out


def final_log_to_end(out) -> float:
    return float(next(ln.split()[1] for ln in out.stdout.splitlines() if ln.startswith("FINAL_LOG_TO_END")))


def run_records(tmp_path: Path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "run" / "run.jsonl").read_text().splitlines()]


def assert_secret_nowhere(tmp_path: Path, secret: str, out) -> None:
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path
    assert secret not in out.stdout and secret not in out.stderr


def alerts_warning_lines(out) -> list[str]:
    return [ln for ln in out.stderr.splitlines() if "alerts" in ln and ln.startswith("WARNING")]


# -- W&B: its offline transaction log, read record by record with W&B's own protobuf schema --------


def wandb_records(path: Path) -> list:
    """Records of a W&B ``.wandb`` file: a 7-byte header, then 32 KiB blocks of chunks, each with a
    checksum, a length and a type (full, first, middle, last), as W&B's leveldb-style log writes them."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, chunks, buf = 7, 32768, [], b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 1:
            chunks.append(chunk)
        elif kind == 2:
            buf = chunk
        elif kind == 3:
            buf += chunk
        elif kind == 4:
            chunks.append(buf + chunk)
            buf = b""
    out = []
    for c in chunks:
        r = pb.Record()
        r.ParseFromString(c)
        out.append(r)
    return out


def run_findings(records) -> list[tuple]:
    """The run log's warning and critical findings as the trackers' tables show them."""
    return [(r["severity"], r["detector"], r["step"], r.get("onset_step"), r["message"]) for r in records
            if r["type"] == "finding" and r["severity"] in ("warning", "critical") and not r["detector"].startswith("config_")]


def run_recommendations(records) -> list[tuple]:
    """The training findings' recommendations (the pre-flight ``config_*`` ones stay out, as from the verdict)."""
    return [(r.get("variant") or "", r.get("detector"), r.get("step"), r.get("python") or "") for r in records
            if r["type"] == "recommendation" and not str(r.get("detector")).startswith("config_")]


def table_findings(columns, rows) -> list[tuple]:
    rows = [dict(zip(columns, r)) if not isinstance(r, dict) else r for r in rows]
    return [(r["severity"], r["detector"], r["step"], None if r["onset_step"] in (-1, None) else r["onset_step"], r["message"])
            for r in rows]


def table_recommendations(columns, rows) -> list[tuple]:
    rows = [dict(zip(columns, r)) if not isinstance(r, dict) else r for r in rows]
    return [(r["variant"], r["detector"], r["step"], r["python"]) for r in rows]


def check_wandb(tmp_path: Path) -> dict:
    files = glob.glob(str(tmp_path / "wandb" / "wandb" / "offline-run-*" / "run-*.wandb"))
    assert len(files) == 1, files  # the trainer's run, no second one
    recs = wandb_records(Path(files[0]))
    run_ids = {r.run.run_id for r in recs if r.WhichOneof("record_type") == "run"}
    assert len(run_ids) == 1
    alerts = [(r.alert.level, r.alert.title) for r in recs if r.WhichOneof("record_type") == "alert"]
    assert alerts == [("WARN", "grpo-monitor warning: no_learning_signal"), ("ERROR", "grpo-monitor critical: no_learning_signal"),
                      ("INFO", "grpo-monitor resolved: no_learning_signal")]
    summary = {}
    tables: dict[str, list] = {"grpo_monitor/findings": [], "grpo_monitor/recommendations": []}
    for r in recs:
        kind = r.WhichOneof("record_type")
        if kind == "summary":
            summary.update({u.key: json.loads(u.value_json) for u in r.summary.update if u.key})
        elif kind == "history":
            for item in r.history.item:
                key = item.key or "/".join(item.nested_key)
                for name in tables:
                    if key == name + "/path":
                        tables[name].append(json.loads(item.value_json))
    assert summary["grpo_monitor/verdict"] == "critical" and summary["grpo_monitor/findings_count"] == 2
    table = json.loads((Path(files[0]).parent / "files" / tables["grpo_monitor/findings"][-1]).read_text())
    assert table["columns"][:3] == ["severity", "detector", "step"]
    assert [row[:2] + [row[4]] for row in table["data"]] == [["warning", "no_learning_signal", "resolved"],
                                                             ["critical", "no_learning_signal", "resolved"]]
    out = {"findings": table_findings(table["columns"], table["data"]), "summary": summary, "recommendations": []}
    if tables["grpo_monitor/recommendations"]:
        rt = json.loads((Path(files[0]).parent / "files" / tables["grpo_monitor/recommendations"][-1]).read_text())
        out["recommendations"] = table_recommendations(rt["columns"], rt["data"])
    return out


def check_trackio(tmp_path: Path) -> dict:
    reader = r"""
import json
from trackio.sqlite_storage import SQLiteStorage as S
runs = S.get_runs("huggingface")
alerts = S.get_alerts("huggingface")
logs = S.get_logs("huggingface", runs[0]) if runs else []
rows = [{k: v for k, v in l.items() if k.startswith("grpo_monitor/")} for l in logs]
print(json.dumps({"runs": runs, "alerts": alerts, "rows": [r for r in rows if r]}, default=str))
"""
    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "trackio")}
    out = subprocess.run([sys.executable, "-c", reader], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(got["runs"]) == 1  # the trainer's run, no second one
    alerts = sorted((a["step"], a["level"], a["title"]) for a in got["alerts"])
    assert [(lv, t) for _, lv, t in alerts] == [("warn", "grpo-monitor warning: no_learning_signal"),
                                                 ("error", "grpo-monitor critical: no_learning_signal"),
                                                 ("info", "grpo-monitor resolved: no_learning_signal")]
    last = got["rows"][-1]
    assert last["grpo_monitor/verdict"] == "critical" and last["grpo_monitor/verdict_level"] == 2

    def value(v):
        return (v if isinstance(v, dict) else json.loads(v))["_value"]

    table = value(last["grpo_monitor/findings"])
    assert [(r["severity"], r["status"]) for r in table] == [("warning", "resolved"), ("critical", "resolved")]
    recs = value(last["grpo_monitor/recommendations"]) if "grpo_monitor/recommendations" in last else []
    return {"findings": table_findings(None, table), "recommendations": table_recommendations(None, recs)}


def check_tensorboard(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = glob.glob(str(tmp_path / "out" / "tb" / "events.out.tfevents.*"))
    assert len(files) == 1, files  # the trainer's own event file: scalars and findings together
    ea = EventAccumulator(str(tmp_path / "out" / "tb"), size_guidance={"tensors": 0, "scalars": 0})
    ea.Reload()
    assert "train/reward" in ea.Tags()["scalars"]
    texts = {tag.split("/text_summary")[0]: [(e.step, e.tensor_proto.string_val[0].decode()) for e in ea.Tensors(tag)]
             for tag in ea.Tags()["tensors"]}
    assert [s for s, _ in texts["grpo_monitor/findings"]] == [2, 3]
    table = texts["grpo_monitor/findings_table"][-1][1]
    assert "**Verdict: critical**" in table and table.count("| no_learning_signal |") == 2 and "| resolved |" in table
    assert texts["grpo_monitor/verdict"][-1][1] == "critical"
    assert texts["grpo_monitor/alerts"] == [(6, texts["grpo_monitor/alerts"][0][1])] and "resolved" in texts["grpo_monitor/alerts"][0][1]


def mlflow_run(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"file:{tmp_path / 'mlruns'}")
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    assert len(runs) == 1  # the trainer's run, no second one
    return client, runs[0]


def check_mlflow(tmp_path: Path, monkeypatch) -> dict:
    client, run = mlflow_run(tmp_path, monkeypatch)
    tags = run.data.tags
    assert tags["grpo_monitor.verdict"] == "critical" and tags["grpo_monitor.findings_count"] == "2"
    assert tags["grpo_monitor.no_learning_signal.2.warning"].startswith("step 2 ")
    assert tags["grpo_monitor.no_learning_signal.2.critical"].startswith("step 3 ")
    assert tags["grpo_monitor.no_learning_signal.2.resolved"].startswith("step 6 ")
    assert tags["grpo_monitor.no_learning_signal.state"] == "resolved at step 6"
    assert "train_loss" in run.data.metrics  # the trainer's own metrics are in the same run
    arts = {a.path for a in client.list_artifacts(run.info.run_id, "grpo_monitor")}
    assert arts == {"grpo_monitor/findings.json", "grpo_monitor/findings.md"}
    local = client.download_artifacts(run.info.run_id, "grpo_monitor/findings.json", str(tmp_path / "dl"))
    doc = json.loads(Path(local).read_text())
    assert doc["verdict"] == "critical" and doc["final"] and [f["severity"] for f in doc["findings"]] == ["warning", "critical"]
    return {"findings": [(f["severity"], f["detector"], f["step"], f.get("onset_step"), f["message"]) for f in doc["findings"]],
            "recommendations": [(r.get("variant") or "", r.get("detector"), r.get("step"), r.get("python") or "")
                                for r in doc["recommendations"]],
            "delivery": doc.get("alerts_delivery"), "tags": tags}


def test_trackers_and_webhooks_hold_the_alerts_as_the_run_log_has_them(tmp_path, monkeypatch):
    """One run reporting to all four trackers, alerting three webhooks (generic, Slack, Discord): each
    tracker holds the alerts, the findings table and the verdict in the trainer's own run, and what
    each holds reads back as the run log's findings and recommendations."""
    hook = Hook()
    paths = [f"/hook/{SECRET}", f"/services/T0/B0/{SECRET}", f"/api/webhooks/42/{SECRET}"]
    try:
        out = train(tmp_path, ["wandb", "trackio", "tensorboard", "mlflow"], attach={"alerts": [hook.url(p) for p in paths]})
        got = hook.wait(12)
    finally:
        hook.close()
    records = run_records(tmp_path)
    wandb, trackio, mlflow = check_wandb(tmp_path), check_trackio(tmp_path), check_mlflow(tmp_path, monkeypatch)
    check_tensorboard(tmp_path)
    want_findings, want_recs = run_findings(records), run_recommendations(records)
    assert [f[:2] for f in want_findings] == [("warning", "no_learning_signal"), ("critical", "no_learning_signal")]
    for name, held in (("wandb", wandb), ("trackio", trackio), ("mlflow", mlflow)):
        assert held["findings"] == want_findings, name
        assert held["recommendations"] == want_recs, name
    # every webhook: the episode's three messages and the run's end, each once
    assert len(got) == 12 and not alerts_warning_lines(out), out.stderr[-2000:]
    by_path = {p: [b for q, b in got if q == p] for p in paths}
    generic = by_path[paths[0]]
    assert [(b["event"], b["level"]) for b in generic] == [("finding", "warning"), ("finding", "critical"),
                                                          ("resolved", "resolved"), ("end", "critical")]
    assert generic[0]["run_dir"] == str(tmp_path / "run") and generic[2]["resolved_step"] == 6
    assert generic[3]["step"] == STEPS and "ended at step 8 of 8" in generic[3]["text"]
    assert all("blocks" in b for b in by_path[paths[1]]) and all(b["embeds"][0]["title"] for b in by_path[paths[2]])
    assert len(set(hook.keys())) == 4  # one key per message, the same at each destination
    # the counts: the run log's summary record, its note, the trackers' final summaries
    summary = next(r for r in records if r["type"] == "summary")
    assert [d["delivered"] for d in summary["alerts"]["destinations"]] == [4, 4, 4]
    assert wandb["summary"]["grpo_monitor/alerts_delivered"] == 12 and wandb["summary"]["grpo_monitor/alerts_lost"] == 0
    assert mlflow["tags"]["grpo_monitor.alerts_lost"] == "0" and mlflow["delivery"] == summary["alerts"]
    assert any(r["type"] == "note" and r.get("alerts") == summary["alerts"] for r in records)
    assert_secret_nowhere(tmp_path, SECRET, out)


@pytest.mark.parametrize("kind", ["silent", "refused", "server_error", "slow"])
def test_a_webhook_that_fails_is_counted_and_never_holds_the_run(tmp_path, kind):
    """A server that hangs, is not there, answers 500, or takes each POST and answers after the
    time-out: the run trains to its end, waits at most the flush time at its end, and the run log's
    summary record and a note hold the counts; one warning line says the loss. Nothing arrives twice."""
    hook = {"silent": lambda: Hook(mode="silent"), "refused": lambda: None, "server_error": lambda: Hook(codes=[500] * 100),
            "slow": lambda: Hook(mode="slow", delay=3.0)}[kind]()
    url = hook.url() if hook else refused_url()
    try:
        out = train(tmp_path, [], alert_options={"to": url, "timeout": 1.0, "retries": 1, "flush_timeout": 1.0},
                    argv=["--alerts", url])
        keys = hook.keys() if hook else []
    finally:
        if hook:
            hook.close()
    records = run_records(tmp_path)
    assert sum(r["type"] == "step" for r in records) == STEPS
    assert [r["severity"] for r in records if r["type"] == "finding" and r["detector"] == "no_learning_signal"] == ["warning", "critical"]
    assert records[0]["argv"][-2:] == ["--alerts", "http://127.0.0.1:%d/***" % int(url.split(":")[2].split("/")[0])]
    assert final_log_to_end(out) < 1.0 + 1.0  # the flush time, and some slack for this shared machine
    delivery = next(r for r in records if r["type"] == "summary")["alerts"]
    (dest,) = delivery["destinations"]
    # the warning, the critical, the end; the resolution too, unless both openings were lost by then
    assert dest["messages"] + delivery["not_sent"]["resolution_of_an_unsent_opening"] == 4
    assert dest["delivered"] == 0 and dest["pending"] == 0 and dest["unconfirmed"] + dest["lost"] == dest["messages"]
    if kind in ("silent", "slow"):
        assert dest["unconfirmed"] >= 1  # taken, never sent again
    else:
        assert dest["failed"] >= 1
    assert len(keys) == len(set(keys))
    lines = alerts_warning_lines(out)
    assert len(lines) == 1 and "alerts: webhook http://127.0.0.1" in lines[0] and f"{dest['messages']} message(s), 0 delivered" in lines[0]
    notes = [r for r in records if r["type"] == "note" and r.get("alerts")]
    assert len(notes) == 1 and notes[0]["level"] == "warning" and notes[0]["alerts"] == delivery
    assert any(r["type"] == "note" and "alerts to webhook" in r["message"] for r in records)  # the first trouble, as it came
    assert_secret_nowhere(tmp_path, SECRET, out)


def test_a_burst_is_rate_limited_and_counted(tmp_path):
    hook = Hook()
    try:
        out = train(tmp_path, [], burst=True, alert_options={"to": hook.url(), "burst": 3, "per_minute": 6})
        got = hook.wait(5, timeout=5)
    finally:
        hook.close()
    records = run_records(tmp_path)
    assert sorted(r["detector"] for r in records if r["type"] == "finding" and r["detector"].startswith("burst_probe")) == sorted(
        f"burst_probe_{i}" for i in range(12))
    events = [b["event"] for _, b in got]
    assert events[:3] == ["finding"] * 3 and "end" in events  # the run's end passes the rate limit
    (dest,) = next(r for r in records if r["type"] == "summary")["alerts"]["destinations"]
    assert dest["rate_limited"] == 9 and dest["delivered"] == 4 and dest["messages"] == 13
    (line,) = alerts_warning_lines(out)
    assert "9 rate limited" in line
    assert_secret_nowhere(tmp_path, SECRET, out)


def test_a_tracker_that_raises_costs_one_warning_line(tmp_path):
    hook = Hook()
    try:
        out = train(tmp_path, ["mlflow"], raise_in="mlflow", attach={"alerts": hook.url()})
        got = hook.wait(4)
    finally:
        hook.close()
    lines = alerts_warning_lines(out)
    assert len(lines) == 1 and "alerts to mlflow failed (RuntimeError: tracking server unavailable)" in lines[0]
    assert len(got) == 4  # the webhook and the run went on
    assert sum(r["type"] == "step" for r in run_records(tmp_path)) == STEPS


def test_a_reward_function_that_raises_is_said_flushed_and_counted(tmp_path):
    hook = Hook()
    try:
        out = train(tmp_path, [], raise_at=6, attach={"alerts": hook.url()})
        got = [b for _, b in hook.wait(3)]
    finally:
        hook.close()
    assert "RAISED reward server returned 503" in out.stdout  # the training's own exception, unchanged
    assert [b["event"] for b in got] == ["finding", "finding", "crash"]
    crash = got[2]
    assert crash["level"] == "critical" and crash["error"] == "ValueError: reward server returned 503"
    assert crash["step"] == 5 and "crashed at step 5" in crash["title"] and "no_learning_signal (critical)" in crash["text"]
    records = run_records(tmp_path)
    (note,) = [r for r in records if r["type"] == "note" and r.get("alerts")]
    assert note["alerts"]["destinations"][0]["delivered"] == 3 and note["level"] == "info"


def test_mlflow_keeps_each_episode_of_a_detector(tmp_path, monkeypatch):
    """The stall comes back after it resolved, every completion now at 0 (below what the run paid, so a collapse):
    the second episode has tags of its own beside the first's."""
    train(tmp_path, ["mlflow"], steps=14, stalled=[1, 2, 3, 4, 9, 10, 11, 12], relapse=0.0, attach={})
    records = run_records(tmp_path)
    raised = {r["step"]: r["severity"] for r in records if r["type"] == "finding" and r["detector"] == "no_learning_signal"}
    # An episode opens at a finding with none at the step before (the relapse may open critical at once).
    openings = [s for s in sorted(raised) if s - 1 not in raised]
    assert len(openings) == 2
    _, run = mlflow_run(tmp_path, monkeypatch)
    tags = run.data.tags
    for opened in openings:
        assert tags[f"grpo_monitor.no_learning_signal.{opened}.{raised[opened]}"].startswith(f"step {opened} ")
        assert f"grpo_monitor.no_learning_signal.{opened}.critical" in tags
    assert tags[f"grpo_monitor.no_learning_signal.{openings[0]}.resolved"]
    resolved_second = f"grpo_monitor.no_learning_signal.{openings[1]}.resolved" in tags
    assert tags["grpo_monitor.no_learning_signal.state"] == (
        tags[f"grpo_monitor.no_learning_signal.{openings[1]}.resolved"].split(" (")[0].replace("step", "resolved at step")
        if resolved_second else f"critical since step {openings[1]}")


def test_options_are_checked_at_attach(monkeypatch):
    """Each bad option is one ValueError from ``attach`` naming what was written, before anything trains; the
    trainer is left as it was."""
    from trl import GRPOConfig, GRPOTrainer

    from grpo_monitor.callbacks import attach
    from grpo_monitor.fixtures.tiny import build_dataset, build_model, build_tokenizer

    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        args = GRPOConfig(output_dir=tmp, bf16=False, use_cpu=True, use_vllm=False, max_steps=1, report_to=[],
                          max_completion_length=8, num_generations=4, per_device_train_batch_size=4, save_strategy="no")
        trainer = GRPOTrainer(model=build_model(), reward_funcs=[lambda completions, **k: [0.0] * len(completions)],
                              args=args, train_dataset=build_dataset(8), processing_class=build_tokenizer())
        before = list(trainer.callback_handler.callbacks)
        for bad, where in (({"alerts": "hooks.slack.com/services/T/B/x"}, "attach(alerts=...): "),
                           ({"alerts": ["https://x.org/h", {"url": "https://x.org/h", "format": "slak"}]},
                            "attach(alerts=...): destination 2: format"),
                           ({"alerts": 3.5}, "attach(alerts=...): "),
                           ({"alerts": {"email": "oncall@example.org", "smtp": "imap://mail"}}, "attach(alerts=...): ")):
            with pytest.raises(ValueError) as info:
                attach(trainer, Path(tmp) / "run", **bad)
            assert str(info.value).startswith(where) and "\n" not in str(info.value)
        monkeypatch.setenv("GRPO_MONITOR_WEBHOOK_URL", "slack-hook-without-scheme")
        with pytest.raises(ValueError, match=r"^\$GRPO_MONITOR_WEBHOOK_URL: .*http"):
            attach(trainer, Path(tmp) / "run")
        assert trainer.callback_handler.callbacks == before and not (Path(tmp) / "run").exists()


def test_restart_and_end_reach_the_channel_from_the_demos_auto_restart(tmp_path):
    """The demo's sudden collapse with auto-restart: the channel hears the collapse, the stop with the
    change and the checkpoint it resumes from, the first segment's episodes resolved in the second,
    and the end of the run, each once; the first segment sends no end of its own."""
    from grpo_monitor import read_run
    from grpo_monitor.core.lineage import read_lineage

    hook = Hook()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_MONITOR_")}
    env.update(GRPO_MONITOR_WEBHOOK_URL=hook.url(), PYTHONWARNINGS="ignore")
    try:
        out = subprocess.run([sys.executable, "-m", "grpo_monitor", "demo", "--scenario", "sudden_collapse", "--auto-restart",
                              "--max-restarts", "1", "--run-dir", str(tmp_path / "D")], capture_output=True, text=True,
                             env=env, cwd=ROOT, timeout=900)
        assert out.returncode == 0, out.stderr[-3000:]
        time.sleep(0.5)
        got = [b for _, b in hook.received]
    finally:
        hook.close()
    lineage = read_lineage(tmp_path / "D")
    first = read_run(lineage.segments[0].run_dir)
    restart = first.restarts[0]
    events = [(b["event"], b["segment"]) for b in got]
    assert events.count(("restart", 1)) == 1 and events[-1] == ("end", 2) and ("end", 1) not in events
    (msg,) = [b for b in got if b["event"] == "restart"]
    assert msg["restart"]["variant"] == restart["variant"] == "lower_learning_rate"
    assert msg["restart"]["resume_from"] == restart["resume_from"] and restart["resume_from"] in msg["text"]
    assert msg["restart"]["config_overrides"] == restart["config_overrides"] and "learning_rate=" in msg["text"]
    before = events.index(("restart", 1))
    opened = {b["finding"]["detector"] for b in got[:before] if b["event"] == "finding"}
    resolved_first = {b["finding"]["detector"] for b in got[:before] if b["event"] == "resolved"}
    assert "sudden_collapse" in opened
    inherited = opened - resolved_first
    resolved_later = [b for b in got[before:] if b["event"] == "resolved" and b["finding"]["detector"] in inherited]
    assert sorted(b["finding"]["detector"] for b in resolved_later) == sorted(inherited)  # each once
    for b in resolved_later:
        assert b["segment"] == 2 and "segment 1" in b["text"] and "lower_learning_rate" in b["text"]
        opening = next(o for o in got[:before] if o["event"] == "finding" and o["finding"]["detector"] == b["finding"]["detector"])
        assert b["episode"]["id"] == opening["episode"]["id"]  # one episode across the segments
    keys = [b["idempotency_key"] for b in got]
    assert len(keys) == len(set(keys))
