"""The detectors on public GRPO runs (``../shared/real-runs``), against their labels; and every file there
read and judged by a failure detector, or saying precisely what it lacks (the folders' own notes).

``real-runs/*.trainer_state.json`` are replayed through the engine directly; every run in
``real-runs/wild/`` (console logs, JSON lists, verl and hand-written console output, W&B, Trinity-RFT,
prime-rl and Tinker exports, trainer_state.json) goes through ``analyze`` as a user's would: it must
read, be judged, and raise what its label expects by the label's ``fail`` step with the label's
variant, and nothing outside ``expect``, ``allow`` and ``ignore``, except, on a failure run only, the
symptom detectors in ``SYMPTOMS``: the labels name the diagnosis, and a run whose completions are cut at the
cap while its task reward falls is also a truncation (class K1 of the field catalogue), read earlier. A run
labelled healthy tolerates nothing.
"""

from __future__ import annotations

import json
import re

import pytest

from grpo_monitor.analysis.report import analyze_one, analyze_run, needs_text
from grpo_monitor.core.engine import Engine
from grpo_monitor.detectors import ALL_DETECTORS
from grpo_monitor.readers import SourceError, load_source
from tests.conftest import SHARED

RUNS = SHARED / "real-runs"
LABELS = json.loads((RUNS / "labels.json").read_text()) if (RUNS / "labels.json").exists() else {}
WILD = RUNS / "wild"
WILD_LABELS = json.loads((WILD / "labels.json").read_text()) if (WILD / "labels.json").exists() else {}
NOTEBOOKS = RUNS / "notebooks"
ALL_FILES = sorted(p for p in RUNS.rglob("*") if p.is_file()) if RUNS.is_dir() else []
NOTES = {"SOURCES.md", "labels.json"}  # what each folder holds and its labels: not logs
ALARMS = ("warning", "critical")
# Detectors of a failure's symptoms (the cut completions, spikes, entropy climb that come with it) that a
# failure run's label does not list because they do not name its cure.
SYMPTOMS = {"truncation", "grad_norm_spike", "entropy_rise"}


def _replay(name):
    src = load_source(RUNS / f"{name}.trainer_state.json")
    engine = Engine(src.context, [cls() for cls in ALL_DETECTORS])
    for step, metrics in src.steps:
        engine.update(step, metrics, src.samples.get(step, []))
    return src, engine.findings


@pytest.mark.skipif(not LABELS, reason="../shared/real-runs is not available")
@pytest.mark.parametrize("name", sorted(LABELS))
def test_real_run_matches_its_label(name):
    labels = LABELS[name]
    _, findings = _replay(name)
    alarms = [f for f in findings if f.severity in ALARMS]
    for expected in labels["expect"]:
        hits = [f for f in alarms if f.detector == expected]
        assert hits, f"{expected} not raised"
        assert hits[0].step <= labels["fail"]
        assert hits[0].variant == labels["variant"]
    tolerated = set(labels["expect"]) | set(labels.get("allow", []))
    assert [(f.detector, f.step) for f in alarms if f.detector not in tolerated] == []


@pytest.mark.skipif(not LABELS, reason="../shared/real-runs is not available")
def test_short_degenerate_episode_recovers_and_the_late_one_is_raised_again():
    # Logged every 5 steps: an episode at steps 40-50 recovers, the one from ~140 does not.
    _, findings = _replay("sunshine_grpo_rho1.00_qwen2.5-7b")
    warnings = [f.step for f in findings if f.detector == "degenerate_long_cot" and f.severity == "warning"]
    assert len(warnings) == 2 and warnings[0] <= 50 and 140 <= warnings[1] <= 150


@pytest.mark.skipif(not LABELS, reason="../shared/real-runs is not available")
def test_healthy_run_with_falling_length_and_no_entropy_stays_quiet():
    _, findings = _replay("abdo_gemma3_grpo")
    assert findings == []


@pytest.mark.skipif(not WILD_LABELS, reason="../shared/real-runs/wild is not available")
@pytest.mark.parametrize("name", sorted(WILD_LABELS))
def test_wild_run_reads_and_its_label_holds(name):
    label = WILD_LABELS[name]
    report = analyze_one(WILD / label["file"])
    assert report.steps > 0 and report.file.endswith(label["file"])
    assert report.verdict != "cannot_judge", report.not_judged
    ignored = set(label.get("ignore", []))
    alarms = [f for f in report.findings if f.severity in ALARMS and f.detector not in ignored]
    summary = [(f.detector, f.severity, f.step, f.variant) for f in alarms]
    if label["expect"]:
        # Several expected detectors: each sees the same failure, so any one raised in time counts.
        fail = label.get("fail")
        hits = [f for f in alarms if f.detector in label["expect"] and (fail is None or f.step <= fail)]
        assert hits, f"none of {label['expect']} raised by step {fail}: {summary}"
        assert any(f.variant == label["variant"] for f in hits), f"variant {label['variant']} expected: {summary}"
    tolerated = set(label["expect"]) | set(label.get("allow", [])) | (SYMPTOMS if label["expect"] else set())
    assert [s for s in summary if s[0] not in tolerated] == []


@pytest.mark.skipif(not ALL_FILES, reason="../shared/real-runs is not available")
@pytest.mark.parametrize("path", ALL_FILES, ids=lambda p: str(p.relative_to(RUNS)))
def test_every_shared_file_is_read_and_judged_or_says_what_it_lacks(path):
    try:
        reports = analyze_run(path)
    except SourceError as exc:
        msg = str(exc)
        assert path.name in NOTES, msg
        assert msg.startswith(f"{path}: ") and "\n" not in msg
        assert "has no step-like column" in msg or "nor per-metric arrays" in msg, msg
        return
    for r in reports:
        if path.name in NOTES:  # a line of prose that reads as one logged step: the report says what is missing
            assert r.verdict == "cannot_judge" and needs_text(r).startswith("found"), r.verdict
        else:
            assert r.steps > 1 and r.judged_by, (r.verdict, r.not_judged)


def _table_rows() -> dict[str, list[int]]:
    """Rows of each training table ``notebooks/SOURCES.md`` lists, per notebook."""
    rows: dict[str, list[int]] = {}
    for m in re.finditer(r"^\| `([^`]+\.ipynb)` \|.*\| (\d+) x \d+ \|", (NOTEBOOKS / "SOURCES.md").read_text(), re.M):
        rows.setdefault(m.group(1), []).append(int(m.group(2)))
    return rows


@pytest.mark.skipif(not (NOTEBOOKS / "SOURCES.md").is_file(), reason="../shared/real-runs/notebooks is not available")
def test_the_notebooks_read_their_training_table():
    listed = _table_rows()
    assert len(listed) == 24
    for name, rows in listed.items():
        src = load_source(NOTEBOOKS / name)
        assert src.format == "notebook" and "reward" in src.metric_names(), name
        assert "HTML table" in src.meta["table"] and len(src.steps) >= max(rows), (name, src.meta["table"], rows)
        assert all(" / " not in n for n in src.metric_names()), name
        if len(rows) > 1:  # a display kept twice: the longer run is read, and the note says what was left out
            assert any("left out" in w for w in src.warnings), (name, src.warnings)
