"""The detector contract, checked on every registered detector.

Parameter validation, ``reset`` equivalence, causality, robustness to any finite/non-finite/missing
input (property-based), JSON-serialisable findings with every fixed field, bounded state.
"""

from __future__ import annotations

import json
import math
import random
from collections import deque
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_monitor import detectors
from grpo_monitor.detectors import ALL_DETECTORS, DETECTOR_IDS
from grpo_monitor.detectors.base import SEVERITIES, VARIANTS, Finding, RunContext
from grpo_monitor.detectors.base import STATES
from grpo_monitor.detectors.variants import VARIANT_PRESETS
from grpo_monitor.fixtures.synthetic import CASES, generate

IDS = [c.id for c in ALL_DETECTORS]
FIELDS = {"detector", "severity", "step", "onset_step", "variant", "config_overrides", "evidence", "message"}
EXPECTED_VARIANT = {
    "entropy_collapse": "dapo",
    "degenerate_long_cot": "dapo",
    "length_reward_coupling": "dr_grpo",
    "moe_instability": "gspo",
    "no_learning_signal": None,
    "reward_component_divergence": None,
    "non_finite": None,
    "moe_model_detected": None,
    "rollout_mismatch": None,
    "sudden_collapse": None,
    "entropy_rise": None,
    "grad_norm_spike": None,
    "length_collapse": "dr_grpo",
    "no_improvement": None,
    "reward_function_bug": None,
    "truncation": None,
    "broken_generation": None,
    "advantage_mask_bug": None,
    "language_mixing": None,
    "memory_pressure": None,
    "stall": None,
    "train_eval_divergence": None,
    "eval_drop": None,
    "kl_pinned": None,
    "device_throttled": None,
    "extreme_start": None,
}
# Detectors whose findings may be information only (a fact about the run, a plateau without a cause).
MAY_INFORM = {"moe_model_detected", "no_improvement", "device_throttled", "extreme_start"}
# Runs that make each detector raise something, so the contract checks see real findings.
TRIGGER = {
    "entropy_collapse": "entropy_collapse",
    "degenerate_long_cot": "degenerate_long_cot",
    "length_reward_coupling": "length_coupling",
    "moe_instability": "moe_instability",
    "no_learning_signal": "no_learning_signal",
    "reward_component_divergence": "reward_divergence",
    "non_finite": "non_finite",
    "moe_model_detected": "healthy_moe",
    "rollout_mismatch": "rollout_mismatch",
    "sudden_collapse": "sudden_collapse",
    "entropy_rise": "entropy_rise",
    "grad_norm_spike": "grad_spikes",
    "length_collapse": "length_collapse_flat_accuracy",
    "no_improvement": "no_improvement_small_group",
    "reward_function_bug": "reward_bug_dead_format",
    "truncation": "truncation_creeping_format",
    "broken_generation": "k10_stale_generator_weights",
    "advantage_mask_bug": "k16_equal_lengths_mask_bug",
    "language_mixing": "k19_language_mixing",
    "memory_pressure": "k17_memory_grows_to_capacity",
    "stall": "k18_stall_at_weight_sync",
    "train_eval_divergence": "k4_proxy_hack_after_plateau",
    "eval_drop": "k9_validation_drop",
    "kl_pinned": "kl_pinned_adapter_not_applied",
    "device_throttled": "device_thermal_throttling",
    "extreme_start": "healthy_extreme_first_step",
}
METRIC_KEYS = [
    "loss", "grad_norm", "learning_rate", "entropy", "reward", "reward_std", "frac_reward_zero_std",
    "completions/mean_length", "completions/clipped_ratio", "completions/max_length",
    "rewards/correctness_reward/mean", "rewards/format_reward/mean", "rewards/length_bonus/mean",
    "clip_ratio/region_mean", "clip_ratio/high_mean", "clip_ratio/low_mean", "aux_loss", "moe/flip_rate",
    "sampling/importance_sampling_ratio/max", "kl", "num_tokens",
    "sampling/sampling_logp_difference/mean", "sampling/importance_sampling_ratio/mean", "mismatch/kl", "mismatch/ess",
    "mismatch/masked_fraction", "mismatch/probs_corr",
]


def _run(det, run, upto: int | None = None) -> list[Finding]:
    det.start(run.context)
    out: list[Finding] = []
    for step, metrics in run.steps:
        if upto is not None and step > upto:
            break
        out.extend(det.update(step, metrics, run.samples.get(step, [])))
    return out


@pytest.fixture(scope="module")
def trigger_runs():
    return {name: generate(name, seed=0, logging_steps=1) for name in set(TRIGGER.values())}


def test_registry_covers_every_fixed_id_once():
    assert sorted(IDS) == sorted(DETECTOR_IDS)
    assert len(set(IDS)) == len(IDS)
    assert all(name in detectors.__all__ for name in ("ALL_DETECTORS", "Finding", "RunContext", "Detector"))


@pytest.mark.parametrize("cls", ALL_DETECTORS, ids=IDS)
def test_declared_variant_and_presets(cls):
    assert cls.variant == EXPECTED_VARIANT[cls.id]
    assert cls.variant is None or cls.variant in VARIANT_PRESETS


@pytest.mark.parametrize("cls", ALL_DETECTORS, ids=IDS)
def test_params_round_trip_and_repr(cls):
    det = cls()
    params = det.params()
    again = cls(**params)
    assert again.params() == params
    assert repr(det).startswith(cls.__name__ + "(")


@pytest.mark.parametrize("cls", [c for c in ALL_DETECTORS if c().params()], ids=[c.id for c in ALL_DETECTORS if c().params()])
@pytest.mark.parametrize("bad", ["x", math.nan, -1e9, None, True], ids=["str", "nan", "neg", "none", "bool"])
def test_every_parameter_rejects_invalid_values(cls, bad):
    for name in cls().params():
        with pytest.raises(ValueError, match=name):
            cls(**{name: bad})


@pytest.mark.parametrize("cls", ALL_DETECTORS, ids=IDS)
def test_reset_equals_a_fresh_detector(cls, trigger_runs):
    run = trigger_runs[TRIGGER[cls.id]]
    used = cls()
    _run(used, run)
    used.reset()
    fresh = cls()
    fresh.start(run.context)
    a = [f.to_dict() for s, m in run.steps for f in used.update(s, m, run.samples.get(s, []))]
    b = [f.to_dict() for s, m in run.steps for f in fresh.update(s, m, run.samples.get(s, []))]
    assert a == b
    assert a, f"{cls.id} raised nothing on {TRIGGER[cls.id]}: the equivalence check would be vacuous"


@pytest.mark.parametrize("cls", ALL_DETECTORS, ids=IDS)
def test_findings_are_causal(cls, trigger_runs):
    run = trigger_runs[TRIGGER[cls.id]]
    full = [f.to_dict() for f in _run(cls(), run)]
    assert full
    for cut in sorted({f["step"] for f in full} | {run.steps[len(run.steps) // 3][0], run.steps[-2][0]}):
        prefix = [f.to_dict() for f in _run(cls(), run, upto=cut)]
        assert prefix == [f for f in full if f["step"] <= cut]


@pytest.mark.parametrize("cls", ALL_DETECTORS, ids=IDS)
def test_findings_have_every_fixed_field_and_serialise(cls, trigger_runs):
    run = trigger_runs[TRIGGER[cls.id]]
    found = _run(cls(), run)
    assert found
    for f in found:
        d = f.to_dict()
        assert set(d) == FIELDS
        assert d["detector"] == cls.id
        assert d["severity"] in SEVERITIES
        assert d["variant"] is None or d["variant"] in VARIANTS
        assert isinstance(d["config_overrides"], dict) and isinstance(d["evidence"], dict) and d["evidence"]
        assert isinstance(d["message"], str) and 20 < len(d["message"]) < 600
        assert d["onset_step"] is None or d["onset_step"] <= d["step"]
        text = json.dumps(d, allow_nan=False)
        assert Finding.from_dict(json.loads(text)).to_dict() == d
        if cls.id != "moe_model_detected":
            assert d["variant"] == EXPECTED_VARIANT[cls.id]
            assert d["severity"] in (("info",) if cls.id in MAY_INFORM else ()) + ("warning", "critical")
            remedy = d["evidence"].get("remedy")
            if remedy == "lower_learning_rate":
                # A collapse: the run's own recipe again, at a lower learning rate (no variant).
                assert set(d["config_overrides"]) == {"learning_rate"}
                assert d["config_overrides"]["learning_rate"] < run.context.config["learning_rate"]
            elif remedy:
                # A flag that fixes it: a named remedy carries the settings to change, and no variant.
                assert isinstance(remedy, str) and d["config_overrides"] and d["variant"] is None
            elif d["variant"] is None and not d["config_overrides"]:
                # No flag fixes it (a reward function's code, the engine's weights): the advice says what to do.
                assert d["evidence"].get("advice") or cls.id in ("no_learning_signal", "non_finite", "reward_component_divergence", "rollout_mismatch", "sudden_collapse")
            else:
                assert d["config_overrides"] == (VARIANT_PRESETS[d["variant"]] | ({"steps_per_generation": 4} if d["variant"] == "gspo" else {})
                                                 if d["variant"] else {})


@pytest.mark.parametrize("cls", ALL_DETECTORS, ids=IDS)
def test_state_and_evidence_for_dashboards(cls, trigger_runs):
    run = trigger_runs[TRIGGER[cls.id]]
    det = cls()
    det.start(run.context)
    seen = set()
    last_severity: str | None = None
    for step, metrics in run.steps:
        for f in det.update(step, metrics, run.samples.get(step, [])):
            # One finding per severity per episode: the same severity again needs an episode end
            # (state back to ok) in between, and a warning never follows a critical in an episode.
            assert f.severity != last_severity
            assert not (last_severity == "critical" and f.severity == "warning")
            last_severity = f.severity
        assert det.state in STATES
        assert isinstance(det.last_evidence, dict)
        json.dumps(det.last_evidence, allow_nan=False)
        seen.add(det.state)
        if det.state == "ok":
            last_severity = None
    if cls.id not in ("moe_model_detected", "extreme_start"):
        assert seen & {"warning", "critical"}
    elif cls.id == "moe_model_detected":
        assert det.raised
    else:  # a fact about the run's start: said once, as information, its state stays ok
        assert det.said and seen <= {"ok", "warming_up"}


# --- robustness to anything a log can hold -------------------------------------------------------

values = st.one_of(
    st.none(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=-1e300, max_value=1e300),
    st.sampled_from([0.0, 1.0, -1.0, 1e308, -1e308, 5e-324, math.nan, math.inf, -math.inf]),
    st.integers(min_value=-(10**18), max_value=10**18),
)
metrics_st = st.dictionaries(st.one_of(st.sampled_from(METRIC_KEYS), st.text(max_size=12)), values, max_size=12)
sample_st = st.dictionaries(
    st.sampled_from(["group", "length", "truncated", "rewards", "correct", "completion", "index", "step"]),
    st.one_of(values, st.booleans(), st.text(max_size=20),
              st.dictionaries(st.sampled_from(["correctness_reward", "format_reward"]), values, max_size=2)),
    max_size=8,
)
contexts = st.sampled_from([
    RunContext(),
    RunContext(model={"is_moe": True}, config={"max_completion_length": 64, "importance_sampling_level": "token"}),
    RunContext(correctness_reward="correctness_reward", reward_names=["correctness_reward", "format_reward"],
               config={"max_completion_length": 0, "gradient_accumulation_steps": "x"}),
])


@pytest.mark.parametrize("cls", ALL_DETECTORS, ids=IDS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(context=contexts, series=st.lists(st.tuples(st.integers(0, 50), metrics_st,
                                                   st.lists(st.one_of(sample_st, st.none(), st.text(max_size=5)), max_size=6)),
                                         max_size=40))
def test_never_crashes_on_arbitrary_input(cls, context, series):
    det = cls()
    det.start(context)
    step = 0
    for jump, metrics, samples in series:
        step += jump  # steps may repeat (jump 0): a re-logged step must not break anything
        for f in det.update(step, metrics, samples):
            json.dumps(f.to_dict(), allow_nan=False)
        assert det.state in STATES
        json.dumps(det.last_evidence, allow_nan=False)


@pytest.mark.parametrize("cls", ALL_DETECTORS, ids=IDS)
def test_missing_keys_empty_dicts_and_gaps_are_not_findings(cls):
    det = cls()
    det.start(RunContext(model={"is_moe": False}))
    found = []
    for step in range(1, 200):
        metrics: dict[str, Any] = {} if step % 3 == 0 else {"loss": None, "entropy": None, "reward": None}
        found += det.update(step, metrics, [])
    assert found == []


# --- bounded state --------------------------------------------------------------------------------

def _container_sizes(obj: Any, seen: set[int] | None = None, depth: int = 0) -> list[int]:
    """Lengths of every container reachable from ``obj``'s attributes."""
    seen = set() if seen is None else seen
    if id(obj) in seen or depth > 6:
        return []
    seen.add(id(obj))
    sizes: list[int] = []
    if isinstance(obj, (list, tuple, deque, dict, set)):
        sizes.append(len(obj))
        items = obj.values() if isinstance(obj, dict) else obj
        for item in list(items)[:1000]:
            sizes += _container_sizes(item, seen, depth + 1)
    elif hasattr(obj, "__dict__") and not isinstance(obj, (RunContext, type)):
        for v in vars(obj).values():
            sizes += _container_sizes(v, seen, depth + 1)
    elif hasattr(obj, "__slots__"):
        for name in obj.__slots__:
            sizes += _container_sizes(getattr(obj, name, None), seen, depth + 1)
    return sizes


def _long_run(n: int, moe: bool):
    """A long noisy run with samples, every key present, cheap to build."""
    rng = random.Random(7)
    for step in range(1, n + 1):
        m = {k: rng.uniform(0.0, 2.0) for k in METRIC_KEYS}
        m["completions/mean_length"] = 200 + 400 * (step % 97) / 97
        if not moe:
            m.pop("aux_loss"), m.pop("moe/flip_rate")
        samples = []
        if step % 50 == 0:
            samples = [{"group": g, "length": rng.randint(1, 300), "rewards": {"correctness_reward": float(rng.random() < 0.5)},
                        "correct": rng.random() < 0.5, "completion": " ".join(rng.choice("abcde") for _ in range(40))}
                       for g in range(4) for _ in range(8)]
        yield step, m, samples


@pytest.mark.parametrize("cls", ALL_DETECTORS, ids=IDS)
def test_state_stays_bounded_over_a_long_run(cls):
    det = cls()
    det.start(RunContext(model={"is_moe": True}, correctness_reward="correctness_reward",
                         reward_names=["correctness_reward", "format_reward", "length_bonus"]))
    checkpoints = {}
    for step, m, samples in _long_run(20_000, moe=True):
        det.update(step, m, samples)
        if step in (5_000, 20_000):
            checkpoints[step] = _container_sizes(det)
    assert max(checkpoints[20_000]) <= 512
    # Nothing keeps growing with the length of the run.
    assert sum(checkpoints[20_000]) <= sum(checkpoints[5_000]) + 64


def test_all_cases_generate_and_are_labelled():
    for name in CASES:
        run = generate(name, seed=0, logging_steps=10, with_samples=False)
        assert run.steps and set(run.labels) >= {"expect", "variant", "fail"}
        assert all(isinstance(s, int) for s, _ in run.steps)
