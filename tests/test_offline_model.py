"""The model a run trained, offline: ``analyze --model`` / ``analyze(path, AnalyzeOptions(model=...))``, a checkpoint's
``config.json`` (or its adapter's base model) beside ``trainer_state.json``; an MoE model gets GSPO
offline as it does live."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import grpo_monitor
from grpo_monitor.core.model_config import moe_from_model_id
from grpo_monitor.preflight import lint
from grpo_monitor.readers import load_source


def moe_blowup_state(steps: int = 80) -> dict:
    """A TRL + vLLM run of an MoE model whose grad norm and KL blow up to ~1e6 from step 40 while the reward
    falls; its log names no model."""
    rng = random.Random(3)
    hist = []
    for s in range(1, steps + 1):
        spike = s > 40 and s % 4 == 0
        hist.append({"step": s, "loss": 0.01, "grad_norm": 0.3 * (1 + 0.1 * rng.random()) * (3e6 if spike else 1),
                     "learning_rate": 1e-6, "kl": 0.01 * (1e6 if spike else 1),
                     "reward": 0.5 + 0.003 * s + 0.02 * rng.random() - (0.01 * (s - 40) if s > 40 else 0),
                     "reward_std": 0.3, "completions/mean_length": 300 + 10 * rng.random(),
                     "completions/clipped_ratio": 0.02, "entropy": 0.6 + 0.02 * rng.random(),
                     "frac_reward_zero_std": 0.1, "epoch": s / steps})
    return {"global_step": steps, "logging_steps": 1, "log_history": hist}


def write_state(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "trainer_state.json"
    path.write_text(json.dumps(moe_blowup_state()))
    return path


def gspo(report) -> list[dict]:
    return [r for run in report.runs for r in run.recommendations if r["variant"] == "gspo"]


def test_an_moe_run_analysed_with_model_gets_gspo(tmp_path):
    path = write_state(tmp_path / "run")
    plain = grpo_monitor.analyze(path)
    assert any(f.detector == "grad_norm_spike" and f.severity == "critical" for f in plain.runs[0].findings)
    assert gspo(plain) == [] and not plain.runs[0].model  # the log does not name the model
    report = grpo_monitor.analyze(path, grpo_monitor.AnalyzeOptions(model="Qwen/Qwen3-30B-A3B"))
    run = report.runs[0]
    assert run.model["is_moe"] and run.model["num_experts"] == 128 and run.model["name_or_path"] == "Qwen/Qwen3-30B-A3B"
    recommended = [r for r in gspo(report) if r["detector"] == "grad_norm_spike"]
    assert recommended and recommended[0]["status"] == "recommended"
    assert any("mixture-of-experts" in why for why in recommended[0]["reasons"])
    assert any(f.detector == "moe_model_detected" for f in run.findings)
    # a dense model named: no GSPO
    assert gspo(grpo_monitor.analyze(path, grpo_monitor.AnalyzeOptions(model="Qwen/Qwen2.5-7B-Instruct"))) == []


def test_a_checkpoint_config_json_names_the_model(tmp_path):
    out = tmp_path / "outputs"
    write_state(out / "checkpoint-80")
    (out / "checkpoint-80" / "config.json").write_text(json.dumps({
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "_name_or_path": "Qwen/Qwen3-30B-A3B",
        "num_hidden_layers": 48, "num_experts": 128, "num_experts_per_tok": 8, "mlp_only_layers": []}))
    src = load_source(out)
    assert src.context.is_moe and src.context.model["class"] == "Qwen3MoeForCausalLM"
    assert src.context.model["source"].endswith("checkpoint-80/config.json")
    report = grpo_monitor.analyze(out)
    assert report.runs[0].model["top_k"] == 8 and gspo(report)
    # a LoRA checkpoint keeps no config.json, but its adapter names the base model
    lora = tmp_path / "lora" / "checkpoint-80"
    write_state(lora)
    (lora / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "Qwen/Qwen3-30B-A3B", "r": 16}))
    assert load_source(lora.parent).context.is_moe


def test_the_user_names_the_model_over_the_log(tmp_path):
    folder = tmp_path / "ckpt"
    write_state(folder)
    (folder / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
                                                     "num_hidden_layers": 2}))
    assert not load_source(folder).context.is_moe
    run = grpo_monitor.analyze(folder, grpo_monitor.AnalyzeOptions(model="Qwen/Qwen3-30B-A3B")).runs[0]
    assert run.model["is_moe"] and any("in place of the model the log names (Qwen2ForCausalLM)" in w for w in run.warnings)
    model_dir = tmp_path / "my-moe"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps({"architectures": ["MixtralForCausalLM"], "num_local_experts": 8,
                                                        "num_experts_per_tok": 2, "num_hidden_layers": 4}))
    run = grpo_monitor.analyze(folder, grpo_monitor.AnalyzeOptions(model=str(model_dir))).runs[0]
    assert run.model["class"] == "MixtralForCausalLM" and run.model["num_experts"] == 8


def test_cli_model_flag(tmp_path):
    path = write_state(tmp_path / "run")
    cmd = [sys.executable, "-m", "grpo_monitor.app.cli", "analyze", str(path), "--json"]
    done = subprocess.run([*cmd, "--model", "Qwen/Qwen3-30B-A3B"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    run = json.loads(done.stdout)["runs"][0]
    assert any(r["variant"] == "gspo" and r["status"] == "recommended" for r in run["recommendations"])
    missing = subprocess.run([*cmd, "--model", str(tmp_path / "no-such-model")], capture_output=True, text=True, timeout=300)
    assert missing.returncode == 2 and missing.stdout == ""
    assert missing.stderr.count("\n") == 1 and "no-such-model" in missing.stderr and "--model" in missing.stderr


def test_one_table_of_moe_hub_ids_for_lint_and_analyze():
    assert moe_from_model_id("Qwen/Qwen3-30B-A3B")["num_experts"] == 128 and moe_from_model_id("Qwen/Qwen3-4B") == {}
    assert lint.moe_from_model_id is moe_from_model_id


def test_a_model_named_by_a_common_hub_id_has_its_shape_offline_as_lint_sizes_it():
    from grpo_monitor.readers.model import model_from_spec

    dense = model_from_spec("Qwen/Qwen2.5-7B-Instruct")
    assert dense["model_type"] == "qwen2" and dense["is_moe"] is False and dense["num_layers"] == 28
    moe = model_from_spec("openai/gpt-oss-20b")
    assert moe["is_moe"] and (moe["num_experts"], moe["top_k"], moe["num_layers"]) == (32, 4, 24)
    assert model_from_spec("google/gemma-3-12b-it")["is_vlm"] is True
    assert lint.config_from_model_id is __import__("grpo_monitor.core.model_config", fromlist=["x"]).config_from_model_id
