"""The detectors on public GRPO runs (``../shared/real-runs``), against their labels."""

from __future__ import annotations

import json

import pytest

from detectors import ALL_DETECTORS
from monitor.engine import Engine
from monitor.sources import load_source
from tests.conftest import SHARED

RUNS = SHARED / "real-runs"
LABELS = json.loads((RUNS / "labels.json").read_text()) if (RUNS / "labels.json").exists() else {}
pytestmark = pytest.mark.skipif(not LABELS, reason="../shared/real-runs is not available")


def _replay(name):
    src = load_source(RUNS / f"{name}.trainer_state.json")
    engine = Engine(src.context, [cls() for cls in ALL_DETECTORS])
    for step, metrics in src.steps:
        engine.update(step, metrics, src.samples.get(step, []))
    return src, engine.findings


@pytest.mark.parametrize("name", sorted(LABELS))
def test_real_run_matches_its_label(name):
    labels = LABELS[name]
    _, findings = _replay(name)
    alarms = [f for f in findings if f.severity in ("warning", "critical")]
    for expected in labels["expect"]:
        hits = [f for f in alarms if f.detector == expected]
        assert hits, f"{expected} not raised"
        assert hits[0].step <= labels["fail"]
        assert hits[0].variant == labels["variant"]
    tolerated = set(labels["expect"]) | set(labels.get("allow", []))
    assert [(f.detector, f.step) for f in alarms if f.detector not in tolerated] == []


def test_short_degenerate_episode_recovers_and_the_late_one_is_raised_again():
    # Logged every 5 steps: an episode at steps 40-50 recovers, the one from ~140 does not.
    _, findings = _replay("sunshine_grpo_rho1.00_qwen2.5-7b")
    warnings = [f.step for f in findings if f.detector == "degenerate_long_cot" and f.severity == "warning"]
    assert len(warnings) == 2 and warnings[0] <= 50 and 140 <= warnings[1] <= 150


def test_healthy_run_with_falling_length_and_no_entropy_stays_quiet():
    _, findings = _replay("abdo_gemma3_grpo")
    assert findings == []
