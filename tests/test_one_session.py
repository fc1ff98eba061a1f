"""One session for every driver: ``analyze`` and the dashboard give the same diagnosis on every labelled public run.

Both replay through ``core.session.open_session``; the dashboard builds its records from the session's steps
(``app.dashboard.app.replay_source``) and its board from them (``RunModel``). Each labelled run under
``../shared`` is read both ways and the findings, recommendations, each detector's coverage and its final state
compared.
"""

from __future__ import annotations

import json

import pytest

from grpo_monitor.analysis.analyze import analyze
from grpo_monitor.app.dashboard.app import replay_source
from grpo_monitor.app.dashboard.model import COVERAGE_SHOWN, RunModel
from tests.conftest import SHARED

FOLDERS = [SHARED / "labelled-runs" / "logs", SHARED / "labelled-runs" / "notebooks", SHARED / "real-runs" / "wild",
           SHARED / "real-runs"]


def _labelled() -> list:
    out = []
    for folder in FOLDERS:
        labels = folder / "labels.json"
        if not labels.is_file():
            continue
        for case, label in sorted(json.loads(labels.read_text()).items()):
            path = folder / label["file"] if label.get("file") else folder / f"{case}.trainer_state.json"
            out.append(pytest.param(path, id=f"{folder.name}/{case}"))
    return out


CASES = _labelled()


def _finding(f) -> tuple:
    d = f if isinstance(f, dict) else f.to_dict()
    return d["detector"], d["severity"], d["step"], d["onset_step"], d["variant"], d["message"]


def _rec(r) -> tuple:
    return r.get("detector"), r.get("variant"), r.get("status"), r.get("step"), r.get("severity")


@pytest.mark.skipif(not CASES, reason="../shared is not available")
@pytest.mark.parametrize("path", CASES)
def test_analyze_and_the_dashboard_give_the_same_diagnosis(path):
    reports = analyze(path).runs
    assert len(reports) == 1, "a labelled case is one run"
    report = reports[0]
    model = RunModel()
    model.ingest(replay_source(path))
    assert [_finding(f) for f in model.findings] == [_finding(f) for f in report.findings]
    assert [_rec(r) for r in model.recommendations] == [_rec(r) for r in report.recommendations]
    coverage, _ = model.coverage()
    assert {d: c["status"] for d, c in coverage.items()} == {d: c["status"] for d, c in report.coverage.items()}
    assert model.detector_states == report.states
    # The board never shows a detector that could not judge the run as judging it ("ok" beside "could not judge").
    for det, c in report.coverage.items():
        if c["status"] in COVERAGE_SHOWN and report.states.get(det) in ("ok", "warming_up"):
            assert model.shown_state(det) == COVERAGE_SHOWN[c["status"]], det


def test_a_csv_whose_zero_variance_share_is_derived_feeds_the_dashboard_what_it_feeds_analyze(tmp_path):
    # Tinker-style columns: the share of groups all right or all wrong, the parts of frac_reward_zero_std.
    rows = ["step,env/all/reward/total,env/all/by_group/frac_all_good,env/all/by_group/frac_all_bad,env/all/ac_tokens_per_turn"]
    for s in range(1, 61):
        good, bad = (0.1, 0.1) if s < 20 else (0.55, 0.45)
        rows.append(f"{s},{0.5 + 0.001 * s},{good},{bad},{120 + s % 3}")
    path = tmp_path / "metrics.csv"
    path.write_text("\n".join(rows) + "\n")
    report = analyze(path).runs[0]
    model = RunModel()
    model.ingest(replay_source(path))
    assert model.store.has("frac_reward_zero_std")
    assert [_finding(f) for f in model.findings] == [_finding(f) for f in report.findings]
    assert "no_learning_signal" in {f.detector for f in report.findings}
    # A run without device readings: the board says the device check could not judge it, never "warming_up".
    assert report.coverage["device_throttled"]["status"] in ("not_applicable", "missing_inputs")
    assert model.shown_state("device_throttled") == COVERAGE_SHOWN[report.coverage["device_throttled"]["status"]]
    assert model.shown_state("reward_component_divergence") == "cannot judge"
