"""One real TRL run on the tiny model, logged four ways at once: its console output captured to a
file (tqdm on), its checkpoint's trainer_state.json, a W&B offline run directory and a trackio
project. Every reader must give the same steps and values, and ``analyze`` the same findings.

A second run, with the monitor attached and driven into a sudden collapse (the demo's scenario),
reports to W&B and trackio: what ``analyze`` reads back from each gives the run log's findings and
recommendations (the whole config read, the monitor's own tables and verdict not taken as metrics),
and a ``wandb/`` folder holding both runs is reported run by run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from grpo_monitor.readers import SourceError, load_source

pytest.importorskip("trl")
pytest.importorskip("wandb")
pytest.importorskip("trackio")

ROOT = Path(__file__).resolve().parents[1]
STEPS, LOGGING_STEPS = 24, 2

# A reward that pays every completion alike: no group has a spread, so the run raises a finding
# (a reward that never pays) whatever the trajectory, and the readers must agree on a finding, not on silence.
SCRIPT = f"""
import sys
from grpo_monitor.app.demo import build_trainer, demo_config


def flat_reward(completions, **kwargs):
    return [0.0 for _ in completions]

args = demo_config(sys.argv[1], {STEPS}, report_to=["wandb", "trackio"], disable_tqdm=False,
                   logging_steps={LOGGING_STEPS}, save_strategy="steps", save_steps={STEPS // 2},
                   project="console-check", run_name="console-check")
build_trainer(args, reward_funcs=[flat_reward]).train()
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("logged-four-ways")
    env = dict(os.environ, WANDB_MODE="offline", WANDB_DIR=str(root / "wb"), WANDB_SILENT="true",
               TRACKIO_DIR=str(root / "trackio"), HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    env.pop("PYTHONUNBUFFERED", None)  # as under nohup: stdout is a buffered file
    (root / "wb").mkdir()
    with open(root / "train.log", "wb") as log:  # `python train.py > train.log 2>&1`
        proc = subprocess.run([sys.executable, "-c", SCRIPT, str(root / "out")], stdout=log,
                              stderr=subprocess.STDOUT, env=env, cwd=root, timeout=900)
    assert proc.returncode == 0, (root / "train.log").read_text()[-3000:]
    checkpoints = sorted((root / "out").glob("checkpoint-*/trainer_state.json"), key=lambda p: int(p.parent.name[11:]))
    return {
        "console": root / "train.log",
        "trainer_state": checkpoints[-1],
        "wandb": root / "wb" / "wandb",
        "trackio": root / "trackio" / "console-check.db",
    }


MONITORED = """
import sys
from grpo_monitor.app.demo import SCENARIOS, build_scenario_trainer, demo_config
from grpo_monitor.callbacks import attach

spec = SCENARIOS["sudden_collapse"]
args = demo_config(sys.argv[1], spec["steps"], report_to=["wandb", "trackio"], project="monitored",
                   run_name="monitored", **spec["config"])
trainer = build_scenario_trainer(args, "sudden_collapse")
attach(trainer, sys.argv[1] + "/grpo-monitor")
trainer.train()
"""


@pytest.fixture(scope="module")
def monitored(tmp_path_factory):
    root = tmp_path_factory.mktemp("monitored")
    env = dict(os.environ, WANDB_MODE="offline", WANDB_DIR=str(root / "wb"), WANDB_SILENT="true",
               TRACKIO_DIR=str(root / "trackio"), HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    env = {k: v for k, v in env.items() if not k.startswith("GRPO_MONITOR_")}
    (root / "wb").mkdir()
    proc = subprocess.run([sys.executable, "-c", MONITORED, str(root / "out")], capture_output=True, text=True, env=env,
                          cwd=root, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"run_dir": root / "out" / "grpo-monitor", "wandb": root / "wb" / "wandb",
            "trackio": root / "trackio" / "monitored.db"}


def test_the_run_logged_every_way(run):
    assert b"it/s]" in run["console"].read_bytes()  # tqdm's bar is in the captured output
    assert run["trainer_state"].parent.name == f"checkpoint-{STEPS}"
    assert list(run["wandb"].glob("offline-run-*/run-*.wandb"))


@pytest.mark.parametrize("kind", ["console", "wandb", "trackio"])
def test_same_frame_as_trainer_state(run, kind):
    ref = load_source(run["trainer_state"]).frame()
    src = load_source(run[kind])
    assert src.format == {"console": "trl_console"}.get(kind, kind)
    frame = src.frame()
    assert list(frame.index) == list(range(LOGGING_STEPS, STEPS + 1, LOGGING_STEPS)) == list(ref.index)
    assert sorted(frame.columns) == sorted(ref.columns)
    a, b = frame[ref.columns].to_numpy(), ref.to_numpy()
    assert (np.isnan(a) == np.isnan(b)).all()
    # transformers prints floats with 4 significant digits; the trackers keep them whole.
    rtol = 5e-4 if kind == "console" else 0
    ok = np.isnan(b) | np.isclose(a, b, rtol=rtol, atol=1e-12 if kind == "console" else 0)
    assert ok.all(), frame.columns[~ok.all(axis=0)].tolist()
    if kind == "console":
        assert src.meta["logging_steps"] == LOGGING_STEPS


def analyze_json(path: Path) -> dict:
    proc = subprocess.run([sys.executable, "-m", "grpo_monitor.app.cli", "analyze", str(path), "--json"], capture_output=True,
                          text=True, timeout=600, cwd=ROOT)
    assert proc.returncode in (0, 1, 3), proc.stderr
    return json.loads(proc.stdout)["runs"][0]


def test_analyze_gives_the_same_findings(run):
    def findings(run_report):
        return sorted((f["detector"], f["severity"], f["step"], f.get("onset_step"), f.get("variant"))
                      for f in run_report["findings"])

    reports = {kind: analyze_json(path) for kind, path in run.items()}
    ref = reports["trainer_state"]
    assert ref["judged_by"], ref  # enough logged points for detectors to judge: the comparison means something
    # No group has a spread and the gradient is 0: the reward that never pays is named.
    assert "reward_function_bug" in {f["detector"] for f in ref["findings"]}, ref["findings"]
    for kind, report in reports.items():
        assert report["steps"] == ref["steps"] == STEPS // LOGGING_STEPS, kind
        assert findings(report) == findings(ref), kind
        for field in ("verdict", "judged_by", "not_judged", "metrics_found"):
            mine, theirs = report.get(field), ref.get(field)
            if isinstance(theirs, list):  # a tracker may store the keys in another order
                mine, theirs = sorted(mine or []), sorted(theirs)
            if field == "not_judged":
                # kl_pinned applies only with beta > 0: a tracker stores the config that says beta=0, a bare
                # trainer_state.json does not, so there it reads as needing kl rather than not applicable.
                mine, theirs = ({k: v for k, v in (d or {}).items() if k != "kl_pinned"} for d in (mine, theirs))
            assert mine == theirs, (kind, field)


def test_torn_wandb_log_reads_what_came_before(run, tmp_path):
    log = next(run["wandb"].glob("offline-run-*/run-*.wandb"))
    data = log.read_bytes()
    torn = tmp_path / "run-torn.wandb"
    torn.write_bytes(data[: len(data) * 2 // 3])
    src = load_source(torn)
    assert src.format == "wandb" and 0 < len(src.steps) <= STEPS // LOGGING_STEPS
    assert any("torn" in w for w in src.warnings)


@pytest.mark.parametrize("name,data", [
    ("run-x.wandb", b":W&B\xe1\xbe\x00" + b"\x07" * 100),
    ("run-y.wandb", b":W&B"),
    ("proj.db", b"SQLite format 3\x00" + b"\x00" * 200),
])
def test_broken_tracker_files_give_one_line(tmp_path, name, data):
    p = tmp_path / name
    p.write_bytes(data)
    with pytest.raises(SourceError) as info:
        load_source(p)
    msg = str(info.value)
    assert name in msg and "\n" not in msg


def test_wandb_missing_names_the_extra(run, monkeypatch):
    for name in ("wandb", "wandb.proto", "wandb.proto.wandb_internal_pb2"):
        monkeypatch.setitem(sys.modules, name, None)  # as if wandb were not installed
    with pytest.raises(SourceError) as info:
        load_source(next(run["wandb"].glob("offline-run-*/run-*.wandb")))
    assert "grpo-monitor[trackers]" in str(info.value)


def test_folders_lead_to_the_run(run):
    assert load_source(run["trackio"].parent).format == "trackio"  # TRACKIO_DIR holding one project
    latest = load_source(run["wandb"] / "latest-run")
    assert latest.format == "wandb" and len(latest.steps) == STEPS // LOGGING_STEPS


def test_wandb_falls_back_to_its_files(tmp_path):
    run_dir = tmp_path / "wandb" / "offline-run-20260101_000000-abc"
    (run_dir / "files").mkdir(parents=True)
    (run_dir / "run-abc.wandb").write_bytes(b":W&B\xe1\xbe\x00" + b"\xff" * 50)  # corrupt from the first record
    (run_dir / "files" / "wandb-summary.json").write_text(json.dumps({"train/reward": 0.5, "train/global_step": 40,
                                                                     "_step": 7, "_runtime": 3.0}))
    src = load_source(tmp_path / "wandb")
    assert src.format == "wandb" and src.steps == [(40, {"reward": 0.5})]
    assert any("final summary" in w for w in src.warnings)
    (run_dir / "files" / "wandb-history.jsonl").write_text(
        "".join(json.dumps({"train/reward": r, "train/global_step": s}) + "\n" for s, r in [(10, 0.1), (20, 0.2)]))
    assert [s for s, _ in load_source(run_dir).steps] == [10, 20]


def _verdicts(report: dict) -> tuple:
    findings = sorted((f["detector"], f["severity"], f["step"], f.get("onset_step"), f.get("variant"),
                       json.dumps(f.get("config_overrides"), sort_keys=True))
                      for f in report["findings"] if not f["detector"].startswith("config_"))
    recs = [(r["variant"], r.get("status"), r["detector"], r["step"], json.dumps(r["config_overrides"], sort_keys=True))
            for r in report["recommendations"] if not r["detector"].startswith("config_")]
    return findings, recs


@pytest.mark.parametrize("kind", ["wandb", "trackio"])
def test_a_trackers_run_gives_the_run_logs_findings_and_recommendations(monitored, kind):
    ref = analyze_json(monitored["run_dir"])
    got = analyze_json(monitored[kind])
    assert got["verdict"] == ref["verdict"] == "critical"
    assert _verdicts(got) == _verdicts(ref)
    # the remedy for the crash needs the configured learning rate: the whole config was read
    assert "lower_learning_rate" in {r["variant"] for r in got["recommendations"]}
    # the monitor's own findings tables and verdict, logged into the same run, are not metrics of it
    assert not [m for m in got["metrics_found"] if m.startswith("grpo_monitor")]
    assert not [w for w in got.get("notes", []) if "without the trainer's step" in w]


def test_a_wandb_folder_of_two_runs_is_reported_run_by_run(run, monitored, tmp_path):
    both = tmp_path / "wandb"
    for source in (run["wandb"], monitored["wandb"]):
        for d in source.glob("offline-run-*"):
            shutil.copytree(d, both / d.name)
    proc = subprocess.run([sys.executable, "-m", "grpo_monitor.app.cli", "analyze", str(both), "--json"],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    runs = json.loads(proc.stdout)["runs"]
    assert sorted(Path(r["source"]).name for r in runs) == sorted(d.name for d in both.iterdir())
    assert sorted(r["steps"] for r in runs) == sorted([STEPS // LOGGING_STEPS, 50])
    assert len(runs) == 2 and {r["format"] for r in runs} == {"wandb"}
    # read as one path, the folder gives its latest run and says there are more
    latest = load_source(both)
    assert any("2 W&B runs here" in w for w in latest.warnings)
