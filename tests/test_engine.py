"""The engine: a whole-run replay equals step-by-step updates, in one process or shared out over
forked ones (findings, their order, the detectors' final state, failures)."""

from __future__ import annotations

import os
import threading
import time

import pytest

import grpo_monitor.core.engine as engine_module
from grpo_monitor.detectors import ALL_DETECTORS
from grpo_monitor.detectors.base import Detector, Finding
from grpo_monitor.fixtures.synthetic import CASES, generate
from grpo_monitor.core.engine import Engine


def outcome(engine: Engine, raised: list[Finding] | None = None):
    found = [f.to_dict() for f in (engine.findings if raised is None else raised)]
    return found, engine.states(), dict(engine.disabled)


def stepwise(run, detectors=None):
    engine = Engine(run.context, detectors if detectors is not None else [c() for c in ALL_DETECTORS])
    for step, metrics in run.steps:
        engine.update(step, metrics, run.samples.get(step))
    return engine


@pytest.fixture
def fork_early(monkeypatch):
    """Share out even short replays, so labelled runs exercise the forked path."""
    monkeypatch.setattr(engine_module, "FORK_FROM_STEPS", 50)
    monkeypatch.setattr(engine_module, "_TIMED_PREFIX", 20)


@pytest.fixture
def forks(fork_early, monkeypatch):
    """... and fork although other tests of this session left idle threads behind (the engine
    refuses to fork beside live threads; these tests take no lock a thread could hold)."""
    monkeypatch.setattr(threading, "active_count", lambda: 1)


@pytest.mark.parametrize("logging_steps", [1, 10])
@pytest.mark.parametrize("name", CASES)
def test_replay_equals_stepwise_updates(name, logging_steps):
    run = generate(name, seed=0, logging_steps=logging_steps)
    want = outcome(stepwise(run))
    engine = Engine(run.context, [c() for c in ALL_DETECTORS])
    raised = engine.replay(run.steps, run.samples)
    assert outcome(engine, raised) == want
    assert outcome(engine) == want
    assert engine.state_names() == {k: v["state"] for k, v in engine.states().items()}


class WhereItRan(Detector):
    """Records the process it ran in; raises at ``fail_at`` when asked to."""

    id = "where_it_ran"

    def __init__(self, fail_at: int | None = None, pause_at: int | None = None) -> None:
        self.fail_at = fail_at
        self.pause_at = pause_at
        super().__init__()

    def _reset(self) -> None:
        self.pids: set[int] = set()
        self.seen = 0

    def _update(self, step, metrics, samples):
        self.pids.add(os.getpid())
        self.seen += 1
        if step == self.pause_at:  # long enough for the other process to take the next detector
            time.sleep(0.5)
        if self.fail_at is not None and step >= self.fail_at:
            raise RuntimeError(f"broken at step {step}")
        if step % 50 == 0:
            return [Finding(detector=self.id, severity="info", step=step, onset_step=None, variant=None,
                            config_overrides={}, evidence={"seen": self.seen}, message="checkpoint")]
        return []


class Unpicklable(WhereItRan):
    id = "unpicklable"

    def _reset(self) -> None:
        super()._reset()
        self.lock = threading.Lock()  # a lock cannot be pickled: the child's share comes back empty


@pytest.mark.parametrize("name", ["entropy_collapse", "length_coupling", "moe_instability", "healthy_noisy"])
def test_forked_replay_equals_stepwise_updates(name, forks):
    run = generate(name, seed=1)
    want = outcome(stepwise(run, [c() for c in ALL_DETECTORS] + [WhereItRan()]))
    engine = Engine(run.context, [c() for c in ALL_DETECTORS] + [WhereItRan()])
    raised = engine.replay(run.steps, run.samples, processes=2)
    assert outcome(engine, raised) == want
    assert engine.detectors[-1].seen == len(run.steps)
    assert all(d.n_updates == len(run.steps) for d in engine.detectors)


def test_forked_replay_really_forks(forks):
    run = generate("healthy_slow", seed=0)
    probes = [WhereItRan(pause_at=run.steps[-1][0]) for _ in range(4)]
    for i, p in enumerate(probes):
        p.id = f"probe_{i}"
    engine = Engine(run.context, probes)
    engine.replay(run.steps, None, processes=2)
    pids = set().union(*(d.pids for d in engine.detectors))
    assert os.getpid() in pids and len(pids) == 2
    assert all(d.seen == len(run.steps) for d in engine.detectors)


def test_a_failure_in_a_forked_share_disables_that_detector_alone(forks):
    run = generate("entropy_collapse", seed=2)
    errors: list[tuple[str, str]] = []

    def build():
        return [c() for c in ALL_DETECTORS] + [WhereItRan(fail_at=120)]

    want_errors: list[tuple[str, str]] = []
    want_engine = Engine(run.context, build(), on_error=lambda who, exc: want_errors.append((who, str(exc))))
    for step, metrics in run.steps:
        want_engine.update(step, metrics, run.samples.get(step))
    engine = Engine(run.context, build(), on_error=lambda who, exc: errors.append((who, str(exc))))
    raised = engine.replay(run.steps, run.samples, processes=2)
    assert [f.to_dict() for f in raised] == [f.to_dict() for f in want_engine.findings]
    assert engine.disabled == want_engine.disabled == {"where_it_ran": "RuntimeError: broken at step 120"}
    assert errors == want_errors == [("detector where_it_ran", "broken at step 120")]


def test_a_share_that_cannot_come_back_is_replayed_here(forks):
    run = generate("length_coupling", seed=0)
    want = outcome(stepwise(run, [c() for c in ALL_DETECTORS] + [Unpicklable()]))
    engine = Engine(run.context, [c() for c in ALL_DETECTORS] + [Unpicklable()])
    engine.replay(run.steps, run.samples, processes=2)
    assert outcome(engine) == want
    assert engine.detectors[-1].pids == {os.getpid()}


def test_no_fork_while_other_threads_run(fork_early):
    run = generate("healthy_slow", seed=0)
    assert engine_module._fork_workers(2, 10**6, 8) == (2 if threading.active_count() == 1 else 1)
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait, daemon=True)
    worker.start()
    try:
        probes = [WhereItRan() for _ in range(3)]
        for i, p in enumerate(probes):
            p.id = f"probe_{i}"
        engine = Engine(run.context, probes)
        engine.replay(run.steps, None, processes=2)
    finally:
        stop.set()
        worker.join()
    assert set().union(*(d.pids for d in engine.detectors)) == {os.getpid()}


def _replay_in_daemon(run, out):
    probes = [WhereItRan() for _ in range(3)]
    for i, p in enumerate(probes):
        p.id = f"probe_{i}"
    engine = Engine(run.context, probes)
    engine.replay(run.steps, None, processes=2)
    out.put(sorted(d.seen for d in engine.detectors))


def test_replay_inside_a_daemonic_process_goes_on_alone(forks):
    """A daemonic process may not start children: the replay then runs in that process alone."""
    import multiprocessing

    run = generate("healthy_slow", seed=0)
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    proc = ctx.Process(target=_replay_in_daemon, args=(run, out), daemon=True)
    proc.start()
    seen = out.get(timeout=120)
    proc.join(timeout=60)
    assert proc.exitcode == 0 and seen == [len(run.steps)] * 3


class OddError(Exception):
    """Pickles, but does not unpickle: its constructor wants two arguments."""

    def __init__(self, step, why):
        super().__init__(f"{why} at step {step}")


class RaisesOddly(WhereItRan):
    id = "raises_oddly"

    def _update(self, step, metrics, samples):
        if step >= 90:
            raise OddError(step, "odd")
        return super()._update(step, metrics, samples)


def test_a_failure_that_cannot_travel_back_is_replayed_here(forks):
    run = generate("entropy_collapse", seed=0)

    def build():
        # Two of them, each pausing past the timed stretch: one is replayed in each process.
        odd = [RaisesOddly(pause_at=50) for _ in range(2)]
        odd[1].id = "raises_oddly_too"
        return odd + [c() for c in ALL_DETECTORS]

    want = outcome(stepwise(run, build()))
    engine = Engine(run.context, build())
    engine.replay(run.steps, run.samples, processes=2)
    assert outcome(engine) == want
    assert engine.disabled == {"raises_oddly": "OddError: odd at step 90", "raises_oddly_too": "OddError: odd at step 90"}
    assert set().union(*(d.pids for d in engine.detectors[:2])) == {os.getpid()}  # the child's came back empty


class ReturnsNone(Detector):
    id = "returns_none"

    def _reset(self) -> None:
        pass

    def _update(self, step, metrics, samples):
        return None


def test_a_detector_failing_mid_step_is_switched_off_and_the_rest_of_the_step_still_runs():
    run = generate("healthy_slow", seed=0)
    steps = [s for s, _ in run.steps]
    assert 100 in steps
    probes = [WhereItRan(), WhereItRan(fail_at=100), WhereItRan(), WhereItRan()]
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


def test_a_detector_returning_no_list_is_switched_off_as_one_that_raises():
    run = generate("healthy_slow", seed=0)
    errors: list[str] = []
    probe = WhereItRan()
    engine = Engine(run.context, [ReturnsNone(), probe], on_error=lambda who, exc: errors.append(who))
    for step, metrics in run.steps[:3]:
        assert engine.update(step, metrics) == []
    assert errors == ["detector returns_none"] and engine.disabled["returns_none"].startswith("TypeError")
    assert probe.seen == 3


def _mixed_inputs_run():
    """A healthy run whose mismatch and memory metrics start partway (the mismatch then drifts),
    whose sample batches come only on some steps, whose lengths and advantages leave a stretch,
    and which turns out to be a mixture of experts late on: each inert stretch ends at a different
    step, and detectors that had settled are woken by names they had not seen."""
    import math

    run = generate("healthy_fast_drop", seed=0, logging_steps=1)
    steps, samples = [], {}
    for step, metrics in run.steps:
        m = dict(metrics)
        if step >= 60:
            m["mismatch/kl"] = 0.001 if step < 120 else 0.001 * math.exp((step - 120) / 8)
        if 40 <= step < 200:
            m["system/gpu_total_gib"] = 80.0
            m["system/gpu_peak_reserved_gib"] = min(79.5, 40.0 + 0.5 * max(0, step - 100))
        if 150 <= step < 170:
            m.pop("completions/min_length", None)
        if step >= 220:
            m["aux_loss"] = 2.0 + (0.01 * (step % 3) if step < 265 else 1.5)
        steps.append((step, m))
        if step % 3 == 0 and step > 30:
            samples[step] = run.samples[step]
    return run.context, steps, samples


def test_a_step_that_leaves_detectors_inert_is_counted_for_them_exactly_as_their_update_would():
    ctx, steps, samples = _mixed_inputs_run()
    engine = Engine(ctx, [c() for c in ALL_DETECTORS])
    direct = Engine(ctx, [c() for c in ALL_DETECTORS])  # its detectors are called by hand, each step
    raised, by_hand, left_out = [], [], set()
    for step, metrics in steps:
        batch = samples.get(step, [])
        raised += engine.update(step, metrics, batch)
        left_out.update(d.id for d in engine._lean_idle)
        for d in direct.detectors:
            by_hand += d.update(step, metrics, batch)
    # Each of them was left out on some steps and called on others.
    assert left_out == {"rollout_mismatch", "memory_pressure", "language_mixing", "advantage_mask_bug",
                        "broken_generation", "reward_function_bug", "moe_instability", "moe_model_detected"}
    assert [f.to_dict() for f in raised] == [f.to_dict() for f in by_hand]
    assert {f.detector for f in raised} >= {"rollout_mismatch", "memory_pressure", "moe_model_detected"}
    for ours, theirs in zip(engine.detectors, direct.detectors):
        assert ours.n_updates == theirs.n_updates == len(steps), ours.id
        if hasattr(ours, "clock"):
            assert list(ours.clock._steps) == list(theirs.clock._steps) and ours.clock.gap == theirs.clock.gap, ours.id
    assert engine.states() == {d.id: {"state": d.state, "evidence": d.last_evidence} for d in direct.detectors}


def test_a_subclass_that_changes_what_a_step_does_is_called_at_every_step():
    from grpo_monitor.detectors.rollout_mismatch import RolloutMismatch

    class Counting(RolloutMismatch):
        id = "counting_mismatch"

        def _reset_state(self) -> None:
            super()._reset_state()
            self.assessed = 0

        def _assess(self, step, metrics, samples):
            self.assessed += 1
            return super()._assess(step, metrics, samples)

    run = generate("healthy_slow", seed=0)
    plain, counting = RolloutMismatch(), Counting()
    engine = Engine(run.context, [plain, counting])
    for step, metrics in run.steps:
        engine.update(step, metrics, [])
    assert "mismatch/kl" not in run.steps[0][1]
    assert counting.assessed == plain.n_updates == counting.n_updates == len(run.steps)
    assert [d.id for d in engine._lean_idle] == ["rollout_mismatch"] and engine._lean_detectors == [counting]


def test_settled_detectors_reset_mid_run_are_called_again_until_they_settle_anew():
    ctx, steps, _ = _mixed_inputs_run()
    samples: dict[int, list] = {}  # no batches: the names stay the same from step 60 to 150
    engine = Engine(ctx, [c() for c in ALL_DETECTORS])
    direct = Engine(ctx, [c() for c in ALL_DETECTORS])
    raised, by_hand, idle_before_reset = [], [], set()
    for step, metrics in steps:
        if step == 100:
            idle_before_reset = {d.id for d in engine._lean_idle}
            for eng in (engine, direct):
                for d in eng.detectors:
                    if d.id in ("broken_generation", "reward_function_bug", "moe_model_detected"):
                        d.reset()
        batch = samples.get(step, [])
        raised += engine.update(step, metrics, batch)
        for d in direct.detectors:
            by_hand += d.update(step, metrics, batch)
        assert engine.state_names() == direct.state_names(), step
        assert [d.__dict__.get("first_step") for d in engine.detectors] == [
            d.__dict__.get("first_step") for d in direct.detectors], step
    assert {"broken_generation", "moe_model_detected"} <= idle_before_reset
    assert [f.to_dict() for f in raised] == [f.to_dict() for f in by_hand]
    for ours, theirs in zip(engine.detectors, direct.detectors):
        assert ours.n_updates == theirs.n_updates, ours.id
        if hasattr(ours, "clock"):
            assert list(ours.clock._steps) == list(theirs.clock._steps), ours.id
    assert engine.states() == {d.id: {"state": d.state, "evidence": d.last_evidence} for d in direct.detectors}


_OWN_STEP = [c for c in ALL_DETECTORS if "_step" in c.__dict__]


@pytest.mark.parametrize("logging_steps", [1, 10])
@pytest.mark.parametrize("name", [
    "healthy_fast_drop", "healthy_noisy", "healthy_isolated_grad_spikes", "entropy_collapse", "entropy_rise",
    "degenerate_long_cot", "length_coupling", "no_learning_signal", "reward_divergence", "non_finite",
    "sudden_collapse", "grad_spikes_reward_falling", "length_collapse_flat_accuracy", "k16_equal_lengths_mask_bug",
    "k18_stall_at_weight_sync", "truncation_partial"])
@pytest.mark.parametrize("batches", ["every_step", "none", "every_third_step"])
def test_a_detectors_own_step_is_what_its_assessment_and_the_shared_step_make(name, logging_steps, batches):
    """A detector that takes its commonest step whole in its own ``_step`` gives exactly what the
    shared ``_step`` over its ``_assess`` gives (what a subclass gets): same findings, states, counts,
    windows. Most of those steps are metrics-only: with sample batches, several take the general way."""
    assert {c.id for c in _OWN_STEP} >= {"entropy_collapse", "sudden_collapse", "no_learning_signal", "stall"}
    run = generate(name, seed=0, logging_steps=logging_steps)
    plain = [c() for c in _OWN_STEP]
    shared = [type("Shared" + c.__name__, (c,), {})() for c in _OWN_STEP]
    assert all("_step" in type(d).__dict__ and type(d)._step is not c._step for d, c in zip(shared, _OWN_STEP))
    engines = [Engine(run.context, plain), Engine(run.context, shared)]
    for i, (step, metrics) in enumerate(run.steps):
        batch = run.samples.get(step, []) if batches == "every_step" or (batches != "none" and i % 3 == 0) else []
        a, b = (e.update(step, metrics, batch) for e in engines)
        assert [f.to_dict() for f in a] == [f.to_dict() for f in b], step
        assert [d.state for d in plain] == [d.state for d in shared], step
    assert [d.last_evidence for d in plain] == [d.last_evidence for d in shared]
    assert [d.n_updates for d in plain] == [d.n_updates for d in shared] == [len(run.steps)] * len(plain)
    for d, e in zip(plain, shared):  # every window and running figure, not only what was raised
        caches = _CACHES.get(d.id, set())
        assert ({k: v for k, v in _state(d).items() if k not in caches}
                == {k: v for k, v in _state(e).items() if k not in caches}), d.id


# Where a detector's own ``_step`` may legitimately differ: how its count is kept (the engine
# counts the steps of a detector it calls through ``_step`` or leaves idle; a subclass is called
# through ``update`` and never left idle), and what its own
# ``_step`` caches for itself alone (a fixed key, a line worked out once, "nothing left to set up").
_NOT_STATE = {"_evidence", "_n", "_count", "_count_base", "context", "clock"}
_CACHES = {"entropy_rise": {"_correct_key"},
           "entropy_collapse": {"_far_for", "_far_line", "_zs_set", "_rs_set", "_correct_set", "_correct_key"}}


def _state(obj, depth=0):
    import collections

    if depth > 6:
        return "..."
    if isinstance(obj, float):
        return "nan" if obj != obj else obj
    if obj is None or isinstance(obj, (int, str)):
        return obj
    if isinstance(obj, (list, tuple, collections.deque)):
        return [_state(x, depth + 1) for x in obj]
    if isinstance(obj, dict):
        return {str(k): _state(v, depth + 1) for k, v in obj.items()}
    if isinstance(obj, (set, frozenset)):
        return sorted(map(repr, obj))
    if callable(obj):
        return getattr(obj, "__qualname__", "callable")
    if hasattr(obj, "__dict__") and any(c.__module__.startswith("grpo_monitor") for c in type(obj).__mro__):
        return {k: _state(v, depth + 1) for k, v in vars(obj).items() if k not in _NOT_STATE}
    if hasattr(obj, "__slots__"):
        return {k: _state(getattr(obj, k, None), depth + 1) for k in obj.__slots__}
    return type(obj).__name__
