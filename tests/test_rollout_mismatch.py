"""The train-inference mismatch: detector, metric names, logs of TRL/verl/prime-rl, and its recommendation."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from grpo_monitor.detectors import ALL_DETECTORS
from grpo_monitor.detectors.rollout_mismatch import RolloutMismatch
from grpo_monitor.fixtures.synthetic import generate
from grpo_monitor.core.engine import Engine
from grpo_monitor.core.metrics import normalize
from grpo_monitor.core.recommend import IS_CORRECTION, Recommender, recommend
from tests.conftest import ROOT, SHARED

ALARM = ("warning", "critical")


def _alarms(run):
    engine = Engine(run.context, [cls() for cls in ALL_DETECTORS])
    for step, metrics in run.steps:
        engine.update(step, metrics, run.samples.get(step, []))
    return [f for f in engine.findings if f.severity in ALARM]


@pytest.mark.parametrize("ls", [1, 10])
@pytest.mark.parametrize("name", ["rollout_mismatch", "rollout_mismatch_kl"])
def test_rising_mismatch_is_raised_before_the_collapse(name, ls):
    run = generate(name, seed=0, logging_steps=ls)
    alarms = _alarms(run)
    hits = [f for f in alarms if f.detector == "rollout_mismatch"]
    assert hits and hits[0].step <= run.labels["fail"]
    assert [f.severity for f in hits] == ["warning", "critical"]
    assert hits[0].variant is None and hits[0].config_overrides == {}
    assert hits[0].onset_step is not None and hits[0].onset_step <= hits[0].step
    assert "drift" in hits[0].evidence["signals"] and hits[0].evidence["drift"]["ratio_to_baseline"] > 2
    assert hits[-1].evidence["corroborated_by"] or len(hits[-1].evidence["signals"]) >= 2
    # Only the symptoms the case itself plants (grad-norm spikes, entropy climbing after the gap) may be raised too.
    assert [f.detector for f in alarms if f.detector != "rollout_mismatch" and f.detector not in run.labels["allow"]] == []


@pytest.mark.parametrize("ls", [1, 10])
@pytest.mark.parametrize("name", ["healthy_small_mismatch", "healthy_noisy_is"])
def test_steady_or_noisy_but_centred_mismatch_raises_nothing(name, ls):
    for seed in range(3):
        assert _alarms(generate(name, seed=seed, logging_steps=ls, with_samples=False)) == []


def test_is_ratio_mean_leaving_the_band_and_ess_falling_are_each_seen():
    from grpo_monitor.detectors.base import RunContext

    det = RolloutMismatch()
    det.start(RunContext(config={"use_vllm": True}))
    found = []
    for step in range(1, 121):
        bad = step > 60
        found += det.update(step, {"sampling/importance_sampling_ratio/mean": 0.3 if bad else 1.0 + 0.01 * (step % 3),
                                   "mismatch/ess": 0.15 if bad else 0.95})
    assert [f.severity for f in found] == ["warning", "critical"]
    assert set(found[-1].evidence["signals"]) >= {"is_ratio_out_of_band", "ess_low"}
    assert 60 < found[0].step <= 70


def test_names_of_every_trainer_are_normalised():
    assert normalize("mismatch_kl/mean") == normalize("rollout_corr/kl") == normalize("optim/kl_sample_train_v1") == "mismatch/kl"
    assert normalize("is_masked/mean") == normalize("rollout_corr/rollout_rs_token_masked_fraction") == "mismatch/masked_fraction"
    assert normalize("rollout_corr/rollout_is_eff_sample_size") == normalize("ess") == "mismatch/ess"
    assert normalize("rollout_corr/rollout_is_mean") == "sampling/importance_sampling_ratio/mean"
    assert normalize("training/rollout_actor_probs_pearson_corr") == "mismatch/probs_corr"
    assert normalize("kl_k3") == normalize("rollout_corr/k3_kl") == "mismatch/k3_kl"
    assert normalize("train/sampling/sampling_logp_difference/mean") == "sampling/sampling_logp_difference/mean"


def _analyze_json(path):
    proc = subprocess.run([sys.executable, "-m", "grpo_monitor", "analyze", str(path), "--json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode in (0, 1, 3), proc.stderr
    return proc.returncode, json.loads(proc.stdout)["runs"][0]


def _mismatch_curve(step):
    return 0.012 if step < 40 else min(1.0, 0.012 * math.exp((step - 40) / 10))


def test_a_verl_jsonl_log_is_read_and_judged(tmp_path):
    path = tmp_path / "verl_metrics.jsonl"
    with open(path, "w") as fh:
        for step in range(1, 121):
            d = _mismatch_curve(step)
            fh.write(json.dumps({
                "step": step, "critic/score/mean": 0.5 + 0.001 * step, "actor/entropy": 0.5, "actor/grad_norm": 0.3,
                "response_length/mean": 200.0, "rollout_corr/kl": 0.8 * d * d, "rollout_corr/rollout_is_mean": 1.0,
                "rollout_corr/rollout_is_eff_sample_size": 1 / (1 + 20 * d * d),
                "rollout_corr/rollout_rs_token_masked_fraction": min(0.6, max(0.0, 1.5 * (d - 0.03))),
                "training/rollout_probs_diff_mean": 0.3 * d, "training/rollout_actor_probs_pearson_corr": 1 - 0.2 * d,
            }) + "\n")
    rc, run = _analyze_json(path)
    hits = [f for f in run["findings"] if f["detector"] == "rollout_mismatch"]
    assert rc == 1 and [f["severity"] for f in hits] == ["warning", "critical"]
    assert hits[0]["step"] < 80
    assert hits[0]["evidence"]["drift"]["metric"] in ("mismatch/kl", "mismatch/probs_diff/mean", "mismatch/probs_corr")
    recs = [r for r in run["recommendations"] if r["detector"] == "rollout_mismatch"]
    assert recs and recs[0]["config_overrides"]["vllm_importance_sampling_mode"] == "sequence_mask"


def test_a_trl_trainer_state_with_sampling_metrics_is_read_and_judged(tmp_path):
    history = []
    for step in range(1, 121):
        d = _mismatch_curve(step)
        masked = min(0.6, max(0.0, 1.5 * (d - 0.03)))
        history.append({"step": step, "epoch": step / 120, "loss": 0.0, "reward": 0.5, "reward_std": 0.3, "entropy": 0.5,
                        "grad_norm": 0.3, "completions/mean_length": 200.0,
                        "sampling/sampling_logp_difference/mean": d, "sampling/sampling_logp_difference/max": 30 * d,
                        "sampling/importance_sampling_ratio/min": 0.0 if masked else 0.9,
                        "sampling/importance_sampling_ratio/mean": 1.0 - masked,
                        "sampling/importance_sampling_ratio/max": 1.5})
    path = tmp_path / "trainer_state.json"
    path.write_text(json.dumps({"global_step": 120, "max_steps": 120, "logging_steps": 1, "log_history": history}))
    rc, run = _analyze_json(path)
    hits = [f for f in run["findings"] if f["detector"] == "rollout_mismatch"]
    assert rc == 1 and hits and hits[0]["evidence"]["drift"]["metric"] == "sampling/sampling_logp_difference/mean"
    assert hits[0]["step"] < 80


PRIME_RL = SHARED / "real-runs" / "wild" / "HarleyCoops_dakota_qwen3_06b_primerl_trainer.csv"


@pytest.mark.skipif(not PRIME_RL.exists(), reason="../shared/real-runs is not available")
def test_the_prime_rl_run_meets_its_label():
    labels = json.loads((PRIME_RL.parent / "labels.json").read_text())["HarleyCoops_dakota_qwen3_06b_primerl_trainer"]
    rc, run = _analyze_json(PRIME_RL)
    alarms = [f for f in run["findings"] if f["severity"] in ALARM]
    hits = [f for f in alarms if f["detector"] == "rollout_mismatch"]
    assert rc == 1 and hits and hits[0]["step"] <= labels["fail"]
    assert {f["detector"] for f in alarms} <= set(labels["expect"]) | set(labels["allow"])


# --- the recommendation ---------------------------------------------------------------------------

def _finding(severity="critical"):
    return {"detector": "rollout_mismatch", "severity": severity, "step": 50, "onset_step": 30, "variant": None,
            "config_overrides": {}, "evidence": {}, "message": "m"}


@pytest.mark.parametrize("moe", [False, True])
def test_the_recommendation_builds_a_grpoconfig_of_the_installed_trl(tmp_path, moe):
    from trl import GRPOConfig

    from grpo_monitor.core.catalogue import apply_overrides, validate

    base = GRPOConfig(output_dir=str(tmp_path), use_vllm=True, vllm_importance_sampling_correction=False,
                      vllm_importance_sampling_mode="token_truncate", vllm_importance_sampling_clip_min=0.1,
                      use_cpu=True, bf16=False, report_to="none")
    rec = recommend(_finding(), base.to_dict(), is_moe=moe)
    assert rec["variant"] == ("gspo" if moe else IS_CORRECTION)
    assert validate(rec["config_overrides"]) == rec["config_overrides"]
    args = apply_overrides(base, rec["config_overrides"])
    assert args.vllm_importance_sampling_correction is True
    assert args.vllm_importance_sampling_mode == "sequence_mask"
    assert (args.vllm_importance_sampling_clip_min, args.vllm_importance_sampling_clip_max) == (0.5, 2.0)
    assert args.importance_sampling_level == ("sequence" if moe else "token")
    assert "precision" in rec["extra"] and ("routing" in rec["extra"]) == moe
    assert rec["cli_flags"].startswith("--")


def test_recommendation_rules_for_the_mismatch():
    cfg = {"use_vllm": True, "vllm_importance_sampling_correction": True, "vllm_importance_sampling_mode": "sequence_mask",
           "vllm_importance_sampling_clip_min": 0.5, "vllm_importance_sampling_clip_max": 2.0}
    assert recommend(_finding("warning"), {}) is None  # a switch only on a confirmed finding
    assert recommend(_finding(), cfg) is None  # nothing left to change: the message's advice stands alone
    assert recommend(_finding(), {}, tried=[IS_CORRECTION]) is None  # never twice in a lineage
    moe = recommend(_finding(), {}, is_moe=True, tried=["gspo"])
    assert moe["variant"] == IS_CORRECTION  # GSPO already tried: the correction alone
    r = Recommender({})
    assert r(_finding())["variant"] == IS_CORRECTION and r(_finding()) is None


def test_a_moe_run_seen_only_through_its_logs_gets_gspo_for_every_switch():
    rec = Recommender({"importance_sampling_level": "token", "gradient_accumulation_steps": 1})
    rec({"detector": "moe_model_detected", "severity": "info", "step": 1, "variant": "gspo"})
    out = rec({"detector": "entropy_collapse", "severity": "critical", "step": 40, "onset_step": 30, "variant": "dapo",
               "config_overrides": {}})
    assert out["variant"] == "gspo" and out["config_overrides"]["importance_sampling_level"] == "sequence"


def test_moe_findings_name_gspo_as_the_switch():
    from grpo_monitor.detectors import EntropyCollapse
    from grpo_monitor.detectors.base import RunContext

    run = generate("entropy_collapse", seed=0, with_samples=True)
    det = EntropyCollapse()
    det.start(RunContext(config=dict(run.context.config), model={"is_moe": True, "num_experts": 8, "top_k": 2},
                         correctness_reward=run.context.correctness_reward, reward_names=run.context.reward_names))
    found = [f for s, m in run.steps for f in det.update(s, m, run.samples.get(s, []))]
    assert found and all(f.variant == "gspo" for f in found)
    assert all(f.config_overrides["importance_sampling_level"] == "sequence" and "GSPO" in f.message for f in found)


def test_a_ratio_not_known_to_come_from_the_engine_needs_a_drift_to_count():
    # A custom loop's old-vs-new policy ratio under the same name: no vLLM config, no logged gap.
    det = RolloutMismatch()
    found = []
    for step in range(1, 121):
        found += det.update(step, {"sampling/importance_sampling_ratio/mean": 0.05 if step > 60 else 1.0})
    assert found == [] and det.last_evidence["band_signals_need_a_drift"] == ["is_ratio_out_of_band"]


class PlantedMismatch(RolloutMismatch):
    """Raises one critical mismatch finding at a fixed step: drives the restart machinery on a real run."""

    def update(self, step, metrics, samples=None):
        from grpo_monitor.detectors.base import Finding

        if step != 3:
            return []
        return [Finding("rollout_mismatch", "critical", step, step - 1, None, {}, {"planted": True},
                        "planted for the test: rollouts are off the trainer's policy")]


def test_the_mismatch_fix_joins_the_restart_protocol(tmp_path):
    import transformers

    from grpo_monitor import read_run, run_with_restarts
    from grpo_monitor.app.demo import build_trainer, demo_config
    from grpo_monitor.core.restart import read_plan

    transformers.logging.set_verbosity_error()
    args = demo_config(tmp_path / "out", 5, disable_tqdm=True, vllm_importance_sampling_correction=False)
    lineage = run_with_restarts(build_trainer, args, run_dir=tmp_path / "run", max_restarts=2,
                                detectors=[PlantedMismatch()])
    assert [s.variant for s in lineage.segments] == [None, IS_CORRECTION]  # not tried twice
    plan = read_plan(tmp_path / "run")
    assert plan.variant == IS_CORRECTION and plan.config_overrides == {
        "vllm_importance_sampling_correction": True, "vllm_importance_sampling_clip_min": 0.5,
        "vllm_importance_sampling_clip_max": 2.0}  # TRL's default mode is already sequence_mask
    cfg = read_run(lineage.segments[1].run_dir).header["config"]
    assert cfg["vllm_importance_sampling_correction"] is True
    assert (cfg["vllm_importance_sampling_clip_min"], cfg["vllm_importance_sampling_clip_max"]) == (0.5, 2.0)
    # The cure is in force in the second segment and the mismatch came back: no change is left, the run stops.
    assert lineage.segments[1].global_step == 3
    (stop,) = [n for n in read_run(lineage.segments[1].run_dir).notes if n.get("event") == "stopped"]
    assert "is_correction" in stop["message"] and "in force already" in stop["message"]
