"""The engine: every detector over each step, one fault guard per detector, and a replay that is the same loop."""

from __future__ import annotations

import pytest

from grpo_monitor.core.engine import Engine
from grpo_monitor.detectors.base import Assessment, Detector, Finding
from grpo_monitor.fixtures.synthetic import generate


def outcome(engine: Engine, raised: list[Finding] | None = None):
    found = [f.to_dict() for f in (engine.findings if raised is None else raised)]
    return found, engine.states(), dict(engine.disabled)


@pytest.mark.parametrize("name", ["entropy_collapse", "moe_instability", "k19_language_mixing", "healthy_noisy"])
def test_a_replay_raises_what_step_by_step_updates_raised_with_their_samples(name):
    run = generate(name, seed=0, logging_steps=1)
    live = Engine(run.context)
    for step, metrics in run.steps:
        live.update(step, metrics, run.samples.get(step))
    replayed = Engine(run.context)
    raised = replayed.replay(run.steps, run.samples)
    assert outcome(replayed, raised) == outcome(live)
    assert replayed.state_names() == {k: v["state"] for k, v in replayed.states().items()}


class Probe(Detector):
    """Counts the steps it saw; raises from ``fail_at`` on; an info finding every 50 steps."""

    id = "probe"
    severities = ("info", "info")
    clear_after = 1
    clear_steps = 1

    def __init__(self, fail_at: int | None = None) -> None:
        self.fail_at = fail_at
        super().__init__()

    def _reset_state(self) -> None:
        self.seen = 0

    def assess(self, step, metrics, samples):
        self.seen += 1
        if self.fail_at is not None and step >= self.fail_at:
            raise RuntimeError(f"broken at step {step}")
        return Assessment(1 if step % 50 == 0 else 0, {"step": step})

    def _message(self, severity, evidence):
        return "checkpoint"


def test_a_detector_failing_mid_step_is_switched_off_and_the_rest_of_the_step_still_runs():
    run = generate("healthy_slow", seed=0)
    steps = [s for s, _ in run.steps]
    assert 100 in steps
    probes = [Probe(), Probe(fail_at=100), Probe(), Probe()]
    for p, name in zip(probes, ["before", "broken", "after", "broken"]):
        p.id = name  # the last one shares the broken one's id: it is switched off with it, mid-step
    errors: list[str] = []
    engine = Engine(run.context, probes, on_error=lambda who, exc: errors.append(f"{who}: {exc}"))
    raised: list[Finding] = []
    for step, metrics in run.steps:
        raised += engine.update(step, metrics)
    assert errors == ["detector broken: broken at step 100"]
    assert engine.disabled == {"broken": "RuntimeError: broken at step 100"}
    before, broken, after, twin = probes
    assert before.seen == after.seen == len(steps)
    assert broken.seen == steps.index(100) + 1 and twin.seen == steps.index(100)
    assert [f.step for f in raised if f.detector == "after"] == [s for s in steps if s % 50 == 0]
    assert raised == engine.findings
    assert engine.state_names()["broken"] == "disabled"


class ReturnsNone(Detector):
    """Breaks the ``update`` contract: returns None instead of a list."""

    id = "returns_none"

    def update(self, step, metrics, samples=None):
        return None


def test_a_detector_returning_no_list_is_switched_off_as_one_that_raises():
    run = generate("healthy_slow", seed=0)
    errors: list[str] = []
    probe = Probe()
    engine = Engine(run.context, [ReturnsNone(), probe], on_error=lambda who, exc: errors.append(who))
    for step, metrics in run.steps[:3]:
        assert engine.update(step, metrics) == []
    assert errors == ["detector returns_none"] and engine.disabled["returns_none"].startswith("TypeError")
    assert probe.seen == 3


def test_a_replay_over_a_detector_that_fails_keeps_every_other_detectors_findings():
    run = generate("entropy_collapse", seed=0)
    whole = Engine(run.context)
    whole.replay(run.steps, run.samples)
    broken = Probe(fail_at=run.steps[0][0])
    with_broken = Engine(run.context, [broken, *Engine(run.context).detectors])
    with_broken.replay(run.steps, run.samples)
    assert list(with_broken.disabled) == ["probe"]
    assert [f.to_dict() for f in with_broken.findings] == [f.to_dict() for f in whole.findings]
