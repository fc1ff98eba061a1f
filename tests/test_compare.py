"""``grpo-monitor compare``: runs of every kind analyze reads, side by side — the settings that differ, the
curves on one step axis, each run's findings, and a sentence per finding kind whose numbers are recomputed
here from the logged values (each run's metric against its own early level)."""

from __future__ import annotations

import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpo_monitor.analysis.analyze import analyze
from grpo_monitor.analysis.compare import Comparison, compare, pct
from grpo_monitor.core.runlog_writer import RunWriter
from grpo_monitor.fixtures.synthetic import generate
from tests.conftest import ROOT, SHARED

LABELLED = SHARED / "labelled-runs" / "logs"
HEALTHY_REAL = LABELLED / "alexchilton_wordle-qwen25-3b.trainer_state.json"  # labelled: nothing expected
FAILING_REAL = LABELLED / "aaravarora01_finance-redteam-qwen25-3b.trainer_state.json"  # labelled: no_learning_signal
CURVE_METRICS = ("entropy", "reward", "reward_std", "frac_reward_zero_std", "completions/mean_length",
                 "completions/clipped_ratio", "rewards/correctness_reward/mean", "grad_norm")


def cli(*args, timeout=300):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_MONITOR_")}
    env["PYTHONWARNINGS"] = "ignore"
    return subprocess.run([sys.executable, "-m", "grpo_monitor", "compare", *map(str, args)], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=timeout)


def steps_of(case):
    return generate(case, seed=1, with_samples=False).steps


def write_run_dir(run_dir: Path, case: str, run_id: str, **config) -> Path:
    run = generate(case, seed=1, with_samples=False)
    w = RunWriter(run_dir)
    w.header(run_id=run_id, start_time=time.time(),
             config={"max_steps": run.steps[-1][0], "logging_steps": 1, **run.context.config,
                     "output_dir": str(run_dir / "out"), **config},
             model={"class": "Qwen3ForCausalLM", "is_moe": False}, world_size=1, parent_run=None,
             reward_funcs=run.context.reward_names, correctness_reward=run.context.correctness_reward,
             format_reward=run.context.format_reward)
    for step, metrics in run.steps:
        w.step(step, metrics, time.time())
    w.write({"type": "summary", "step": run.steps[-1][0], "metrics": {"train_runtime": 1.0}})
    w.close()
    return run_dir


# -- the numbers a sentence says, recomputed from the logged points by the documented definition --------------

def early(values):
    n = max(3, min(20, len(values) // 10))
    return statistics.median(values[:n]), n


def level_at(points, step):
    return statistics.median([v for s, v in points if s <= step][-3:])


def lowest(points, n, until):
    vals = [v for s, v in points[n:] if s <= until]
    return min(statistics.median(vals[max(0, i - 2):i + 1]) for i in range(len(vals)))


def series(steps, metric, cast=float):
    return [(s, cast(m[metric])) for s, m in steps if m.get(metric) is not None]


def difference(doc, detector):
    found = [d for d in doc["differences"] if d["detector"] == detector]
    assert found, doc["differences"]
    return found[0]


def check_collapse_sentence(doc, collapsing: str, steady: str, points_a, points_b):
    """The entropy_collapse sentence: the collapsing run's share at its finding's step, the steady run's lowest
    share up to there, each against its own early level, as recomputed from the points."""
    d = difference(doc, "entropy_collapse")
    assert d["metric"] == "entropy"
    side = {r["label"]: r for r in d["runs"]}
    assert side[collapsing]["raised"] and not side[steady]["raised"]
    step = side[collapsing]["step"]
    finding = next(f for r in doc["runs"] if r["label"] == collapsing for f in r["findings"]
                   if f["detector"] == "entropy_collapse")
    assert step == finding["step"]
    base_a, _ = early([v for _, v in points_a])
    share_a = level_at(points_a, step) / base_a
    base_b, n_b = early([v for _, v in points_b])
    share_b = lowest(points_b, n_b, step) / base_b
    assert side[collapsing]["share"] == pytest.approx(share_a) and side[steady]["share"] == pytest.approx(share_b)
    assert share_a < 0.5 < share_b  # the collapse is one, the steady run's entropy stays
    s = d["sentence"]
    assert f"{collapsing}'s entropy falls to {pct(share_a)} of its early level by step {step}" in s
    assert f"{steady}'s entropy stays at or above {pct(share_b)} of its early level through step {step}" in s
    return d


# -- run directories: a GRPO arm and a DAPO arm; the text, --json and --html through the real CLI ---------------

@pytest.fixture(scope="module")
def arms(tmp_path_factory):
    root = tmp_path_factory.mktemp("arms")
    grpo = write_run_dir(root / "grpo", "entropy_collapse", "run-a", seed=1)
    dapo = write_run_dir(root / "dapo", "healthy_slow", "run-b", seed=2, epsilon_high=0.28,
                         mask_truncated_completions=True)
    return grpo, dapo


def test_run_dirs_text_json_and_config_diff_through_the_cli(arms, tmp_path):
    grpo, dapo = arms
    out = cli(grpo, dapo, "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert [(r["label"], r["verdict"], r["config_recorded"]) for r in doc["runs"]] == [
        ("grpo", "critical", True), ("dapo", "healthy", True)]
    # Only what differs, where-to-write settings (output_dir) left out.
    assert doc["config_diff"] == [
        {"key": "epsilon_high", "values": {"grpo": None, "dapo": 0.28}},
        {"key": "mask_truncated_completions", "values": {"grpo": False, "dapo": True}},
        {"key": "seed", "values": {"grpo": 1, "dapo": 2}}]
    d = check_collapse_sentence(doc, "grpo", "dapo", series(steps_of("entropy_collapse"), "entropy"),
                                series(steps_of("healthy_slow"), "entropy"))
    # The settings that bear on entropy collapse (DAPO's preset) and differ; the seed does not bear on it.
    assert d["config_keys"] == ["epsilon_high", "mask_truncated_completions"]
    assert d["sentence"].endswith("dapo sets epsilon_high=0.28, mask_truncated_completions=True "
                                  "(grpo: epsilon_high=None, mask_truncated_completions=False).")
    assert set(doc["curves"]) >= {"entropy", "reward", "completions/mean_length"}
    assert doc["curves"]["entropy"]["grpo"][0] == [1, steps_of("entropy_collapse")[0][1]["entropy"]]

    text = cli(grpo, dapo)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    row = next(line for line in lines if line.strip().startswith("epsilon_high"))
    assert row.split() == ["epsilon_high", "None", "0.28"]
    assert not [line for line in lines if line.strip().startswith("output_dir")]
    # The sparklines of a curve one under the other, same width, on one step axis.
    at = lines.index("entropy  (steps 1–300, one scale)")
    spark = [lines[at + 1].split()[1], lines[at + 2].split()[1]]
    assert lines[at + 1].split()[0] == "grpo" and lines[at + 2].split()[0] == "dapo"
    assert len(spark[0]) == len(spark[1]) == 48 and spark[0] != spark[1]
    assert d["sentence"] in " ".join(text.stdout.split())
    assert "grpo: CRITICAL" in text.stdout and "dapo: HEALTHY" in text.stdout


def test_html_page_in_a_real_browser(arms, tmp_path):
    from grpo_monitor.analysis.compare_render import RUN_COLOURS
    from grpo_monitor.analysis.html_report import FETCHING

    pytest.importorskip("matplotlib")
    grpo, dapo = arms
    page = tmp_path / "compare.html"
    out = cli(grpo, dapo, "--html", page)
    assert out.returncode == 0, out.stderr
    text = page.read_text(encoding="utf-8")
    assert FETCHING.search(text) is None and text.count("<svg") == 1
    assert "<td><code>epsilon_high</code></td><td>None</td><td>0.28</td>" in text
    assert "entropy_collapse in grpo" in text and "dapo sets epsilon_high=0.28" in text
    # Each run's curve in its colour, the collapse's onset marker in grpo's.
    onset = next(f.onset_step for f in compare(analyze(list(arms))).runs[0].findings if f.detector == "entropy_collapse")
    assert f"grpo: entropy_collapse from step {onset}" in text
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed")
    from PIL import Image

    from tests.test_html_report import FLAGS

    shot = tmp_path / "compare.png"
    done = subprocess.run([chromium, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1280,2400",
                           f"--screenshot={shot}", page.as_uri()], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0 and shot.is_file(), done.stderr[-2000:]
    img = Image.open(shot).convert("RGB")
    px, (w, h) = img.load(), img.size

    def share(colour, tol=40):
        ref = tuple(int(colour[i:i + 2], 16) for i in (1, 3, 5))
        hits = sum(1 for y in range(0, h, 3) for x in range(0, w, 3) if all(abs(a - b) <= tol for a, b in zip(px[x, y], ref)))
        return hits / ((h // 3) * (w // 3))

    # Both runs' curves are drawn (pixels, not markup), and the critical verdict badge of the collapsing arm.
    assert share(RUN_COLOURS[0]) > 0.001 and share(RUN_COLOURS[1]) > 0.001
    assert share("#dc2626") > 0.0005 and share("#15803d") > 0.0005
    white = sum(1 for y in range(0, h, 3) for x in range(0, w, 3) if px[x, y] == (255, 255, 255)) / ((h // 3) * (w // 3))
    assert 0.5 < white < 0.98


# -- trainer_state.json, CSV, TensorBoard ------------------------------------------------------------------------

def test_a_report_file_that_cannot_be_written_is_one_line_and_exit_2(arms, tmp_path):
    missing = tmp_path / "no-such-dir"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_MONITOR_")}
    runs = [
        (cli(*arms, "--html", missing / "c.html"), "c.html", "HTML comparison"),
        *[(subprocess.run([sys.executable, "-m", "grpo_monitor", "analyze", str(arms[0]), flag, str(missing / name)],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=300), name, what)
          for flag, name, what in (("--markdown", "r.md", "Markdown report"), ("--html", "r.html", "HTML report"))],
    ]
    for out, name, what in runs:
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
        assert out.stderr.strip().splitlines()[-1] == \
            f"grpo-monitor: {missing / name}: cannot write the {what} (No such file or directory)"
        assert out.stdout  # the report asked for on stdout is out all the same


def write_trainer_state(path: Path, case: str, batch: int) -> Path:
    history = [{"step": s, **{k: v for k, v in m.items() if v is not None}} for s, m in steps_of(case)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"log_history": history, "logging_steps": 1, "max_steps": len(history),
                                "train_batch_size": batch, "global_step": len(history)}), encoding="utf-8")
    return path


def test_trainer_states(tmp_path):
    a = write_trainer_state(tmp_path / "lr-high" / "trainer_state.json", "entropy_collapse", 16)
    b = write_trainer_state(tmp_path / "lr-low" / "trainer_state.json", "healthy_slow", 8)
    doc = compare(analyze([a, b])).to_dict()
    assert [r["label"] for r in doc["runs"]] == ["lr-high/trainer_state", "lr-low/trainer_state"]
    assert doc["config_diff"] == [{"key": "train_batch_size",
                                   "values": {"lr-high/trainer_state": 16, "lr-low/trainer_state": 8}}]
    d = check_collapse_sentence(doc, "lr-high/trainer_state", "lr-low/trainer_state",
                                series(steps_of("entropy_collapse"), "entropy"), series(steps_of("healthy_slow"), "entropy"))
    assert d["config_keys"] == []
    assert d["sentence"].endswith("no setting tied to entropy_collapse differs (other differences: train_batch_size).")


def write_csv(path: Path, case: str) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["step", *CURVE_METRICS])
        for s, m in steps_of(case):
            w.writerow([s, *("" if m.get(k) is None else repr(m[k]) for k in CURVE_METRICS)])
    return path


def test_csv_exports_record_no_config(tmp_path):
    a, b = write_csv(tmp_path / "grpo.csv", "entropy_collapse"), write_csv(tmp_path / "dapo.csv", "healthy_slow")
    cmp = compare(analyze([a, b]))
    doc = cmp.to_dict()
    assert [(r["label"], r["config_recorded"]) for r in doc["runs"]] == [("grpo", False), ("dapo", False)]
    assert doc["config_diff"] == []
    d = check_collapse_sentence(doc, "grpo", "dapo", series(steps_of("entropy_collapse"), "entropy"),
                                series(steps_of("healthy_slow"), "entropy"))
    assert d["sentence"].endswith("the logs record no config to set against it.")


def test_tensorboard_event_files(tmp_path):
    import numpy as np
    from torch.utils.tensorboard import SummaryWriter

    points = {}
    for name, case in (("grpo", "entropy_collapse"), ("dapo", "healthy_slow")):
        w = SummaryWriter(str(tmp_path / name))
        for s, m in steps_of(case):
            for k in CURVE_METRICS:
                if m.get(k) is not None:
                    w.add_scalar(f"train/{k}", m[k], s)
        w.close()
        # An event file keeps 32-bit floats: the sentence's numbers are the logged ones.
        points[name] = series(steps_of(case), "entropy", cast=lambda v: float(np.float32(v)))
    doc = compare(analyze([tmp_path / "grpo", tmp_path / "dapo"])).to_dict()
    assert [(r["label"], r["format"]) for r in doc["runs"]] == [("grpo", "tensorboard"), ("dapo", "tensorboard")]
    check_collapse_sentence(doc, "grpo", "dapo", points["grpo"], points["dapo"])


# -- two shared real runs ----------------------------------------------------------------------------------------

@pytest.mark.skipif(not (HEALTHY_REAL.is_file() and FAILING_REAL.is_file()), reason="../shared/labelled-runs is not here")
def test_two_real_runs_healthy_and_failing():
    out = cli(HEALTHY_REAL, FAILING_REAL, "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    healthy, failing = "alexchilton_wordle-qwen25-3b", "aaravarora01_finance-redteam-qwen25-3b"
    assert [(r["label"], r["verdict"]) for r in doc["runs"]] == [(healthy, "healthy"), (failing, "critical")]
    tops = [json.loads(p.read_text()) for p in (HEALTHY_REAL, FAILING_REAL)]
    expected = {k: {healthy: tops[0][k], failing: tops[1][k]}
                for k in ("train_batch_size", "logging_steps", "max_steps", "num_train_epochs", "eval_steps", "save_steps")
                if tops[0].get(k) != tops[1].get(k)}
    assert {c["key"]: c["values"] for c in doc["config_diff"]} == expected and "train_batch_size" in expected
    d = difference(doc, "no_learning_signal")
    side = {r["label"]: r for r in d["runs"]}
    assert side[failing]["raised"] and not side[healthy]["raised"] and d["metric"] == "frac_reward_zero_std"
    # From the logged frac_reward_zero_std: every group of the failing run scores alike from its early steps on,
    # while the healthy run's stays at 0.
    step = side[failing]["step"]
    pts = [(e["step"], float(e["frac_reward_zero_std"])) for e in tops[1]["log_history"] if "frac_reward_zero_std" in e]
    base, _ = early([v for _, v in pts])
    assert side[failing]["share"] == pytest.approx(level_at(pts, step) / base)
    h_pts = [(e["step"], float(e["frac_reward_zero_std"])) for e in tops[0]["log_history"] if "frac_reward_zero_std" in e]
    h_base, n = early([v for _, v in h_pts])
    assert h_base == 0 and side[healthy]["share"] is None
    assert side[healthy]["level"] == pytest.approx(max(statistics.median([v for s, v in h_pts[n:] if s <= step][max(0, i - 2):i + 1])
                                                       for i in range(len([1 for s, _ in h_pts[n:] if s <= step]))))
    assert f"no_learning_signal in {failing} (warning at step {step}, critical later" in d["sentence"]
    assert f"{healthy}'s frac_reward_zero_std stays at or below {side[healthy]['level']:.3g} (0 early)" in d["sentence"]
    assert "no setting tied to no_learning_signal differs (other differences: " in d["sentence"]


# -- a restarted run's lineage, given as one path ----------------------------------------------------------------

@pytest.fixture(scope="module")
def lineage(tmp_path_factory):
    """A real restarted run: a planted critical finding at step 3 stops the tiny model's training, which
    resumes as segment 2 with DAPO (as tests/test_restart.py builds it)."""
    pytest.importorskip("trl")
    import transformers

    from grpo_monitor import run_with_restarts
    from grpo_monitor.app.demo import demo_config
    from tests.test_restart import PlantedFinding, _make_trainer

    transformers.logging.set_verbosity_error()
    root = tmp_path_factory.mktemp("lineage")
    args = demo_config(root / "out", 6, disable_tqdm=True, save_strategy="steps", save_steps=2)
    run_with_restarts(_make_trainer, args, run_dir=root / "run", max_restarts=1, detectors=[PlantedFinding(at_step=3)])
    return root / "run"


def test_a_lineage_given_as_one_path_compares_its_segments(lineage):
    from grpo_monitor import read_run
    from grpo_monitor.core.lineage import read_lineage

    out = cli(lineage, "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert [(r["label"], r["segment"]) for r in doc["runs"]] == [("segment 1", 1), ("segment 2", 2)]
    headers = [read_run(s.run_dir).header["config"] for s in read_lineage(lineage).segments]
    diff = {c["key"]: c["values"] for c in doc["config_diff"]}
    # The variant the restart switched to, as the segments' headers record it; where they wrote is left out.
    for key in ("epsilon_high", "mask_truncated_completions", "steps_per_generation"):
        assert diff[key] == {"segment 1": headers[0].get(key), "segment 2": headers[1][key]}
    assert diff["epsilon_high"]["segment 2"] == 0.28 and "output_dir" not in diff
    assert {k for k in diff} == {k for k in set(headers[0]) | set(headers[1])
                                 if headers[0].get(k, "∅") != headers[1].get(k, "∅")} - {"output_dir", "logging_dir",
                                                                                         "run_name"}
    assert doc["curves"] and all(set(c) <= {"segment 1", "segment 2"} for c in doc["curves"].values())
    text = cli(lineage)
    assert text.returncode == 0 and "segment 1" in text.stdout and "segment 2" in text.stdout


# -- bad input ----------------------------------------------------------------------------------------------------

def test_fewer_than_two_runs_and_an_unreadable_path_are_one_line_and_exit_2(arms, tmp_path):
    grpo, _ = arms
    one = cli(grpo)
    assert one.returncode == 2 and one.stdout == ""
    assert one.stderr == f"grpo-monitor: compare needs at least two runs; found 1 ({grpo})\n"
    missing = cli(grpo, tmp_path / "missing")
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1
    assert f"{tmp_path / 'missing'}: no such file or directory" in missing.stderr and "Traceback" not in missing.stderr
    with pytest.raises(ValueError, match="at least two runs"):
        compare(analyze([grpo]))
    assert isinstance(compare(analyze(list(arms))), Comparison)
