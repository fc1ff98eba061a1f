"""Alerts from a real GRPOTrainer on the tiny model: each tracker the trainer reports to holds the
alerts, the findings table and the verdict in the run the trainer opened (read back with the
tracker's own reader), webhooks reach a real HTTP server on 127.0.0.1, an unreachable server
never stops the training, and the URL is written nowhere.

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
from pathlib import Path

import pytest

from test_alerts import Hook, refused_url

pytest.importorskip("trl")

ROOT = Path(__file__).resolve().parents[1]
STEPS = 8

DRIVER = r'''
import json, logging, os, sys, warnings
cfg = json.loads(os.environ["ALERTS_TEST_DRIVER"])  # not argv: W&B records the command line
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
import transformers
from trl import GRPOConfig, GRPOTrainer
from grpo_monitor.callbacks import attach
from grpo_monitor.detectors.base import Detector, Finding
from grpo_monitor.detectors.no_learning_signal import NoLearningSignal
from grpo_monitor.fixtures.tiny import build_dataset, build_model, build_tokenizer
transformers.logging.set_verbosity_error()
warnings.filterwarnings("ignore")
calls = [0]

def stall_then_spread(completions, **kwargs):
    calls[0] += 1
    if calls[0] <= 4:
        return [0.5] * len(completions)
    return [float(i % 2) for i in range(len(completions))]

class BurstProbe(Detector):
    """Twelve warnings at step 2, each its own episode."""
    id = "burst_probe"
    def _reset_state(self):
        self.state = "ok"
    def update(self, step, metrics, samples=None):
        if step != 2:
            return []
        return [Finding(detector=f"burst_probe_{i}", severity="warning", step=step, onset_step=step, variant=None,
                        config_overrides={}, evidence={"i": i}, message=f"burst finding {i}") for i in range(12)]

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
det = NoLearningSignal(persist_points=2, persist_steps=0)
det.clear_after, det.clear_steps = 2, 1
detectors = [BurstProbe()] if cfg.get("burst") else [det]
cb = attach(trainer, cfg["run_dir"], detectors=detectors, **cfg.get("attach", {}))
trainer.train()
print("TRAINED", trainer.state.global_step, flush=True)
'''


def train(tmp_path: Path, report_to, attach=None, argv=(), **extra):
    """Train in a fresh process; ``argv`` lands on its command line (and so in the run log's header)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "TRACKIO_", "MLFLOW_", "GRPO_MONITOR_"))}
    env.update(WANDB_MODE="offline", WANDB_DIR=str(tmp_path / "wandb"), WANDB_SILENT="true", WANDB_PROJECT="alerts-test",
               TRACKIO_DIR=str(tmp_path / "trackio"), MLFLOW_TRACKING_URI=f"file:{tmp_path / 'mlruns'}",
               MLFLOW_ALLOW_FILE_STORE="true", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=str(ROOT), TENSORBOARD_LOGGING_DIR=str(tmp_path / "out" / "tb"))
    (tmp_path / "wandb").mkdir(exist_ok=True)
    cfg = {"out": str(tmp_path / "out"), "run_dir": str(tmp_path / "run"), "steps": STEPS, "report_to": report_to,
           "attach": attach or {}, **extra}
    env["ALERTS_TEST_DRIVER"] = json.dumps(cfg)
    out = subprocess.run([sys.executable, "-c", DRIVER, *argv], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=600)
    assert out.returncode == 0 and f"TRAINED {STEPS}" in out.stdout, out.stderr[-3000:]
    return out


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


def check_wandb(tmp_path: Path) -> None:
    files = glob.glob(str(tmp_path / "wandb" / "wandb" / "offline-run-*" / "run-*.wandb"))
    assert len(files) == 1, files  # the trainer's run, no second one
    recs = wandb_records(Path(files[0]))
    run_ids = {r.run.run_id for r in recs if r.WhichOneof("record_type") == "run"}
    assert len(run_ids) == 1
    alerts = [(r.alert.level, r.alert.title) for r in recs if r.WhichOneof("record_type") == "alert"]
    assert alerts == [("WARN", "grpo-monitor warning: no_learning_signal"), ("ERROR", "grpo-monitor critical: no_learning_signal"),
                      ("INFO", "grpo-monitor resolved: no_learning_signal")]
    summary = {}
    tables = []
    for r in recs:
        kind = r.WhichOneof("record_type")
        if kind == "summary":
            summary.update({u.key: json.loads(u.value_json) for u in r.summary.update if u.key})
        elif kind == "history":
            for item in r.history.item:
                key = item.key or "/".join(item.nested_key)
                if key == "grpo_monitor/findings/path":
                    tables.append(json.loads(item.value_json))
    assert summary["grpo_monitor/verdict"] == "critical" and summary["grpo_monitor/findings_count"] == 2
    table = json.loads((Path(files[0]).parent / "files" / tables[-1]).read_text())
    assert table["columns"][:3] == ["severity", "detector", "step"]
    assert [row[:2] + [row[4]] for row in table["data"]] == [["warning", "no_learning_signal", "resolved"],
                                                             ["critical", "no_learning_signal", "resolved"]]


def check_trackio(tmp_path: Path) -> None:
    reader = r'''
import json
from trackio.sqlite_storage import SQLiteStorage as S
runs = S.get_runs("huggingface")
alerts = S.get_alerts("huggingface")
logs = S.get_logs("huggingface", runs[0]) if runs else []
rows = [{k: v for k, v in l.items() if k.startswith("grpo_monitor/")} for l in logs]
print(json.dumps({"runs": runs, "alerts": alerts, "rows": [r for r in rows if r]}, default=str))
'''
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
    table = last["grpo_monitor/findings"]
    table = table if isinstance(table, dict) else json.loads(table)
    assert [(r["severity"], r["status"]) for r in table["_value"]] == [("warning", "resolved"), ("critical", "resolved")]


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


def check_mlflow(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"file:{tmp_path / 'mlruns'}")
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    assert len(runs) == 1  # the trainer's run, no second one
    run = runs[0]
    tags = run.data.tags
    assert tags["grpo_monitor.verdict"] == "critical" and tags["grpo_monitor.findings_count"] == "2"
    assert tags["grpo_monitor.no_learning_signal.warning"].startswith("step 2 ")
    assert tags["grpo_monitor.no_learning_signal.critical"].startswith("step 3 ")
    assert tags["grpo_monitor.no_learning_signal.resolved"].startswith("step 6 ")
    assert "train_loss" in run.data.metrics  # the trainer's own metrics are in the same run
    arts = {a.path for a in client.list_artifacts(run.info.run_id, "grpo_monitor")}
    assert arts == {"grpo_monitor/findings.json", "grpo_monitor/findings.md"}
    local = client.download_artifacts(run.info.run_id, "grpo_monitor/findings.json", str(tmp_path / "dl"))
    doc = json.loads(Path(local).read_text())
    assert doc["verdict"] == "critical" and doc["final"] and [f["severity"] for f in doc["findings"]] == ["warning", "critical"]


@pytest.mark.parametrize("tracker,path", [("wandb", "/hook/secret-token-123"), ("trackio", "/hook/secret-token-123"),
                                          ("tensorboard", "/services/T0/B0/secret-token-123"),
                                          ("mlflow", "/api/webhooks/42/secret-token-123")])
def test_tracker_and_webhook_hold_the_alerts(tmp_path, monkeypatch, tracker, path):
    hook = Hook()
    try:
        out = train(tmp_path, [tracker], attach={"alerts": hook.url(path)})
        got = hook.wait(3)
    finally:
        hook.close()
    {"wandb": lambda: check_wandb(tmp_path), "trackio": lambda: check_trackio(tmp_path),
     "tensorboard": lambda: check_tensorboard(tmp_path), "mlflow": lambda: check_mlflow(tmp_path, monkeypatch)}[tracker]()
    assert len(got) == 3 and not alerts_warning_lines(out), out.stderr[-2000:]
    bodies = [b for _, b in got]
    if tracker in ("wandb", "trackio"):
        assert [(b["event"], b["level"], b["finding"]["step"]) for b in bodies] == [
            ("finding", "warning", 2), ("finding", "critical", 3), ("resolved", "resolved", 3)]
        assert bodies[0]["run_dir"] == str(tmp_path / "run") and bodies[2]["resolved_step"] == 6
    elif tracker == "tensorboard":
        assert all("blocks" in b for b in bodies)
    else:
        assert all(b["embeds"][0]["title"] for b in bodies)
    records = run_records(tmp_path)
    assert [r["severity"] for r in records if r["type"] == "finding" and r["detector"] == "no_learning_signal"] == ["warning", "critical"]
    assert_secret_nowhere(tmp_path, "secret-token-123", out)


@pytest.mark.parametrize("kind", ["silent", "refused"])
def test_training_completes_when_the_webhook_cannot_be_reached(tmp_path, kind):
    hook = Hook(mode="silent") if kind == "silent" else None
    url = hook.url() if hook else refused_url()
    try:
        out = train(tmp_path, [], attach={"alerts": url, "alerts_timeout": 1.0, "alerts_retries": 1,
                                          "alerts_flush_timeout": 1.0}, argv=["--alerts", url])
    finally:
        if hook:
            hook.close()
    records = run_records(tmp_path)
    assert sum(r["type"] == "step" for r in records) == STEPS
    assert [r["severity"] for r in records if r["type"] == "finding" and r["detector"] == "no_learning_signal"] == ["warning", "critical"]
    assert records[0]["argv"][-2:] == ["--alerts", "http://127.0.0.1:%d/***" % int(url.split(":")[2].split("/")[0])]
    if kind == "refused":
        lines = alerts_warning_lines(out)
        assert len(lines) == 1 and "alerts webhook failed" in lines[0] and "127.0.0.1" in lines[0]
        notes = [r["message"] for r in records if r["type"] == "note"]
        assert any("alerts webhook" in n for n in notes)
    assert_secret_nowhere(tmp_path, "secret-token-123", out)


def test_a_burst_is_rate_limited_and_nothing_is_lost_from_the_run_log(tmp_path):
    hook = Hook()
    try:
        out = train(tmp_path, [], burst=True, attach={"alerts": hook.url(), "alerts_burst": 3, "alerts_per_minute": 6})
        got = hook.wait(4, timeout=5)
    finally:
        hook.close()
    records = run_records(tmp_path)
    assert sorted(r["detector"] for r in records if r["type"] == "finding" and r["detector"].startswith("burst_probe")) == sorted(
        f"burst_probe_{i}" for i in range(12))
    events = [b["event"] for _, b in got]
    assert events[:3] == ["finding"] * 3 and len(got) <= 4
    assert_secret_nowhere(tmp_path, "secret-token-123", out)


def test_a_tracker_that_raises_costs_one_warning_line(tmp_path):
    hook = Hook()
    try:
        out = train(tmp_path, ["mlflow"], raise_in="mlflow", attach={"alerts": hook.url()})
        got = hook.wait(3)
    finally:
        hook.close()
    lines = alerts_warning_lines(out)
    assert len(lines) == 1 and "alerts to mlflow failed (RuntimeError: tracking server unavailable)" in lines[0]
    assert len(got) == 3  # the webhook and the run went on
    assert sum(r["type"] == "step" for r in run_records(tmp_path)) == STEPS
