"""Memory sizing: the estimate's terms against the bytes real tensors take after a real optimizer step."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from grpo_monitor.preflight.memory import GIB, estimate, model_shape, shape_from_config

QWEN25_7B = {
    "model_type": "qwen2", "vocab_size": 152064, "hidden_size": 3584, "intermediate_size": 18944,
    "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
QWEN3_30B_A3B = {
    "model_type": "qwen3_moe", "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144,
    "moe_intermediate_size": 768, "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4,
    "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [],
    "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}
RECIPE = dict(output_dir="./outputs-grpo", use_vllm=True, num_generations=8, learning_rate=5e-7, beta=0.01,
              per_device_train_batch_size=8, gradient_accumulation_steps=4, bf16=True, logging_steps=10, seed=3407,
              max_completion_length=512)


def _bytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


def _one_optimizer_step(model, optim_name):
    """One real forward/backward/step with the optimizer transformers builds for ``optim_name``."""
    import torch
    from transformers import Trainer, TrainingArguments

    from grpo_monitor.fixtures.tiny import build_tokenizer, task_rows

    args = TrainingArguments(output_dir="/tmp/unused", optim=optim_name, use_cpu=True, report_to="none")
    cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(args, model)
    optimizer = cls(model.parameters(), **kwargs)
    tok = build_tokenizer()
    batch = tok([r["prompt"] + " <answer> 3 </answer>" for r in task_rows(8)], return_tensors="pt", padding=True)
    model.train()
    torch.manual_seed(0)
    model(**batch, labels=batch["input_ids"]).loss.backward()
    grads = _bytes(p.grad for p in model.parameters() if p.grad is not None)
    optimizer.step()
    states = _bytes(t for st in optimizer.state.values() for t in st.values() if torch.is_tensor(t))
    return grads, states


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
@pytest.mark.parametrize("optim", ["adamw_torch", "adamw_torch_fused"])
def test_weights_gradients_optimizer_states_equal_real_tensors(moe, optim):
    from grpo_monitor.fixtures.tiny import build_model

    model = build_model(moe=moe, warm_start=150)
    config = {"optim": optim, "bf16": False, "use_cpu": True, "beta": 0.0, "per_device_train_batch_size": 8,
              "max_completion_length": 16}
    est = estimate(config, model, num_devices=1, device_kind="cpu")
    grads, states = _one_optimizer_step(model, optim)
    assert est.terms["weights"] == _bytes(model.parameters())
    assert est.terms["gradients"] == grads
    assert est.terms["optimizer_states"] == states
    assert est.terms["reference_model"] == 0 and est.terms["runtime_overhead"] == 0


def test_reference_model_term_equals_the_trainers_reference_model(tmp_path):
    from grpo_monitor.app.demo import build_trainer, demo_config

    trainer = build_trainer(demo_config(tmp_path, 1, beta=0.04))
    est = estimate(trainer.args, trainer.model, num_devices=1, device_kind="cpu")
    assert trainer.ref_model is not None
    assert est.terms["reference_model"] == _bytes(trainer.ref_model.parameters()) == _bytes(trainer.model.parameters())
    assert estimate(demo_config(tmp_path, 1, beta=0.0), trainer.model).terms["reference_model"] == 0


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_parameter_count_from_config_matches_the_model(moe):
    from grpo_monitor.fixtures.tiny import build_model

    model = build_model(moe=moe, warm_start=150)
    shape = shape_from_config(model.config)
    params = list(model.parameters())
    assert shape["num_parameters"] == sum(p.numel() for p in params)
    assert shape["num_param_tensors"] == len(params)
    assert shape["is_moe"] is moe
    if moe:
        assert shape["active_parameters"] < shape["num_parameters"]


def test_published_model_sizes_from_their_configs():
    dense, moe = shape_from_config(QWEN25_7B), shape_from_config(QWEN3_30B_A3B)
    assert dense["num_parameters"] == pytest.approx(7.6e9, rel=0.01)
    assert moe["num_parameters"] == pytest.approx(30.5e9, rel=0.01)
    assert moe["active_parameters"] == pytest.approx(3.3e9, rel=0.03)
    assert moe["is_moe"] and moe["num_experts"] == 128 and moe["top_k"] == 8


def test_recipe_7b_on_one_80gb_gpu_does_not_fit_and_names_the_levers():
    est = estimate(RECIPE, QWEN25_7B, num_devices=1, device_memory_gib=80)
    # TRL loads a model named by path in float32: 4 + 4 + 8 bytes per parameter, plus the reference copy
    p = shape_from_config(QWEN25_7B)["num_parameters"]
    assert est.terms["weights"] == 4 * p and est.terms["gradients"] == 4 * p
    assert est.terms["reference_model"] == 4 * p
    assert est.terms["vllm_colocate"] == int(0.3 * 80 * GIB)
    assert est.fits is False
    f = est.finding()
    assert f.detector == "config_memory" and f.severity == "critical"
    # The fix climbs the ladder rung by rung, each sized on the whole estimate, the policy's dtype among them.
    assert [r["remedy"] for r in est.ladder] == ["vllm_sleep_mode", "bf16_weights", "low_bit_optimizer"]
    assert f.config_overrides == {"vllm_enable_sleep_mode": True, "model_init_kwargs": {"dtype": "bfloat16"},
                                  "optim": "paged_adamw_8bit"}
    peaks = [est.peak] + [r["peak_bytes"] for r in est.ladder]
    assert peaks == sorted(peaks, reverse=True) and len(set(peaks)) == len(peaks)  # every rung lowers the peak
    for text in ("vllm_enable_sleep_mode", "8-bit", "bfloat16", "leaving at least 10% free"):
        assert text in f.message, text
    lean = estimate(dict(RECIPE, model_init_kwargs={"dtype": "bfloat16"}, optim="paged_adamw_8bit",
                         vllm_enable_sleep_mode=True), QWEN25_7B, num_devices=1, device_memory_gib=80)
    assert lean.fits is True and lean.finding() is None
    assert lean.terms["weights"] == 2 * p


def test_moe_30b_sharded_with_zero3_over_eight_gpus():
    ds = {"zero_optimization": {"stage": 3}}
    one = estimate(dict(RECIPE, model_init_kwargs={"dtype": "bfloat16"}), QWEN3_30B_A3B, num_devices=1, device_memory_gib=80)
    eight = estimate(dict(RECIPE, model_init_kwargs={"dtype": "bfloat16"}, deepspeed=ds, vllm_mode="server"),
                     QWEN3_30B_A3B, num_devices=8, device_memory_gib=80)
    p = shape_from_config(QWEN3_30B_A3B)["num_parameters"]
    assert eight.terms["weights"] == -(-2 * p // 8)
    # DeepSpeed keeps fp32 m, v and an fp32 master copy of 16-bit weights: 12 bytes per parameter, sharded
    assert eight.terms["optimizer_states"] == -(-12 * p // 8)
    assert eight.terms["vllm_colocate"] == 0
    assert one.fits is False and eight.peak < one.peak


def test_zero2_and_fsdp_shard_what_they_say():
    base = dict(RECIPE, use_vllm=False, model_init_kwargs={"dtype": "bfloat16"})
    plain = estimate(base, QWEN25_7B, num_devices=4)
    z2 = estimate(dict(base, deepspeed={"zero_optimization": {"stage": 2}}), QWEN25_7B, num_devices=4)
    fsdp = estimate(dict(base, fsdp="full_shard auto_wrap"), QWEN25_7B, num_devices=4)
    assert z2.terms["weights"] == plain.terms["weights"]
    assert z2.terms["gradients"] == -(-plain.terms["gradients"] // 4)
    assert fsdp.terms["weights"] == -(-plain.terms["weights"] // 4)
    assert fsdp.terms["optimizer_states"] == -(-plain.terms["optimizer_states"] // 4)


def test_sleep_mode_frees_the_vllm_share_in_the_training_phase_only():
    awake = estimate(RECIPE, QWEN25_7B, device_memory_gib=80)
    asleep = estimate(dict(RECIPE, vllm_enable_sleep_mode=True), QWEN25_7B, device_memory_gib=80)
    share = awake.terms["vllm_colocate"]
    assert share > 0 and asleep.terms["vllm_colocate"] == share
    assert awake.train_phase - asleep.train_phase == share
    assert awake.generation_phase == asleep.generation_phase
    server = estimate(dict(RECIPE, vllm_mode="server"), QWEN25_7B, device_memory_gib=80)
    assert server.terms["vllm_colocate"] == 0


def test_activation_and_logit_terms_respond_to_their_settings():
    ckpt = estimate(dict(RECIPE, gradient_checkpointing=True), QWEN25_7B, prompt_length=256)
    full = estimate(dict(RECIPE, gradient_checkpointing=False), QWEN25_7B, prompt_length=256)
    eager = estimate(dict(RECIPE, gradient_checkpointing=False), QWEN25_7B, prompt_length=256, attn_implementation="eager")
    assert ckpt.terms["activations"] < full.terms["activations"] < eager.terms["activations"]
    tiled = estimate(RECIPE, QWEN25_7B, fused_lm_head=True)
    dense = estimate(RECIPE, QWEN25_7B, fused_lm_head=False)
    assert dense.terms["logits"] == 2 * 8 * 512 * 152064 * 4
    assert tiled.terms["logits"] < dense.terms["logits"]
    few = estimate(dict(RECIPE, per_device_train_batch_size=4), QWEN25_7B, fused_lm_head=False, prompt_length=256)
    assert few.terms["logits"] * 2 == dense.terms["logits"]


def test_optimizer_names_change_the_state_size():
    base = dict(RECIPE, model_init_kwargs={"dtype": "float32"})
    p = shape_from_config(QWEN25_7B)["num_parameters"]
    adam = estimate(dict(base, optim="adamw_torch"), QWEN25_7B).terms["optimizer_states"]
    bnb8 = estimate(dict(base, optim="adamw_8bit"), QWEN25_7B).terms["optimizer_states"]
    sgd = estimate(dict(base, optim="sgd"), QWEN25_7B).terms["optimizer_states"]
    assert adam >= 8 * p and 2 * p <= bnb8 < 2.1 * p and sgd == 0


def test_run_header_facts_give_a_parameter_only_estimate():
    facts = {"class": "Qwen3ForCausalLM", "num_parameters": 1_000_000, "is_moe": False, "num_layers": 2}
    est = estimate({"bf16": False, "beta": 0.0}, facts)
    assert est.terms["weights"] == 4_000_000
    assert est.terms["activations"] is None and est.terms["logits"] is None
    assert "?" in est.table()


def test_fields_left_out_take_the_installed_grpoconfig_defaults():
    import dataclasses

    from trl import GRPOConfig

    fields = {f.name: f.default for f in dataclasses.fields(GRPOConfig)}
    spelled_out = {k: fields[k] for k in ("max_completion_length", "per_device_train_batch_size", "gradient_checkpointing",
                                          "optim", "beta", "vllm_gpu_memory_utilization", "use_vllm", "fp16")}
    spelled_out["bf16"] = not spelled_out["fp16"]  # GRPOConfig resolves its None default so
    bare = estimate({}, QWEN25_7B, device_memory_gib=80)
    full = estimate(spelled_out, QWEN25_7B, device_memory_gib=80)
    assert bare.terms == full.terms and bare.peak == full.peak
    assert f"max_completion_length {fields['max_completion_length']} tokens (GRPOConfig's default)" in bare.assumptions
    assert not any("max_completion_length" in a for a in full.assumptions)
    # fp16 given, bf16 left out: bf16 follows it as in TRL, so activations stay 16-bit either way
    assert estimate({"fp16": True}, QWEN25_7B).terms["activations"] == bare.terms["activations"]


def test_without_trl_the_documented_defaults_give_the_same_estimate():
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('trl', 'torch', 'transformers'):\n"
        "            raise ModuleNotFoundError(name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import json\n"
        "from grpo_monitor.preflight.memory import estimate\n"
        f"print(estimate({{}}, {QWEN25_7B!r}, device_memory_gib=80).peak)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert int(out) == estimate({}, QWEN25_7B, device_memory_gib=80).peak


def test_model_shape_reads_a_model_directory(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN25_7B))
    assert model_shape(tmp_path)["num_parameters"] == shape_from_config(QWEN25_7B)["num_parameters"]


def test_system_metrics_without_torch_and_light_imports():
    code = (
        "import sys, grpo_monitor.preflight.memory, grpo_monitor.preflight.lint, grpo_monitor.preflight.reward_gate\n"
        "import grpo_monitor.core.telemetry\nm = grpo_monitor.core.telemetry.system_metrics()\n"
        "heavy = [x for x in ('torch', 'transformers', 'trl', 'textual') if x in sys.modules]\n"
        "gpu = [k for k in m if k.startswith('system/gpu')]\n"
        "print(gpu, heavy, m['system/rss_peak_gib'] >= m['system/rss_gib'] > 0)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[] [] True"  # no device figures from a process that never imported torch


def test_system_metrics_after_torch_import_still_reports_process_memory():
    import torch  # noqa: F401  (CPU here: no device keys)

    from grpo_monitor.core.telemetry import system_metrics

    m = system_metrics()
    assert m["system/rss_gib"] > 0
    assert all(k.startswith("system/") for k in m)


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_activation_term_matches_what_autograd_saves(moe):
    """Without checkpointing, the activation term is what autograd keeps for backward (saved-tensor
    hooks on a real forward of the tiny model), within the per-token scalars the formula leaves out."""
    import torch

    from grpo_monitor.fixtures.tiny import build_model

    model = build_model(moe=moe, warm_start=150)
    model.train()
    b, s = 8, 64
    ids = torch.randint(3, 40, (b, s), generator=torch.Generator().manual_seed(0))
    storages: dict[int, int] = {}

    def pack(t):
        storages.setdefault(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.model(input_ids=ids)  # the backbone; the LM head is the logits term
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved = sum(n for ptr, n in storages.items() if ptr not in params)
    est = estimate({"bf16": False, "gradient_checkpointing": False, "per_device_train_batch_size": b,
                    "max_completion_length": s}, model, prompt_length=0, device_kind="cpu")
    assert est.terms["activations"] == pytest.approx(saved, rel=0.05)
    ckpt = estimate({"bf16": False, "gradient_checkpointing": True, "per_device_train_batch_size": b,
                     "max_completion_length": s}, model, prompt_length=0, device_kind="cpu")
    assert ckpt.terms["activations"] < est.terms["activations"]
