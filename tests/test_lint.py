"""Pre-flight recipe lint: every rule fires on a config that breaks it, its fix silences it, and the
recipe's reference configuration raises nothing above info."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
from pathlib import Path

import pytest

from grpo_monitor.preflight.lint import DEFAULTS, add_lint_arguments, lint, lint_path, run_lint_cli

# The recipe's reference GRPOConfig; the tests run it on "one GPU" (device facts passed in, not measured here)
REFERENCE = dict(output_dir="./outputs-grpo", use_vllm=True, num_generations=8, learning_rate=5e-7, beta=0.01,
                 per_device_train_batch_size=8, gradient_accumulation_steps=4, bf16=True, logging_steps=10, seed=3407)
GPU = dict(num_devices=1, device_kind="cuda", bf16_supported=True, device_memory_gib=80)
# The only finding the reference config raises: its logging_steps=10 coarsens detection (info).
REFERENCE_INFO = {"config_logging_steps"}
# A 2B dense model (Qwen3-1.7B's layout) as run-header facts: enough for both memory checks, and a model the
# recipe's learning rate is sized for (the tiny fixture model is not).
SHAPE_2B = {"num_parameters": 2_031_739_904, "num_layers": 28, "num_kv_heads": 8, "head_dim": 128, "hidden_size": 2048,
            "vocab_size": 151_936, "num_heads": 16, "intermediate_size": 6144, "is_moe": False}


@pytest.fixture(scope="module")
def tiny():
    from grpo_monitor.fixtures.tiny import REWARD_FUNCS, build_dataset, build_model

    return {"dense": build_model(warm_start=150), "moe": build_model(moe=True, warm_start=150),
            "funcs": list(REWARD_FUNCS), "dataset": build_dataset()}


def _ids(findings, severities=("info", "warning", "critical")):
    return {f.detector for f in findings if f.severity in severities}


def _lint(cfg, tiny, **kw):
    args = dict(model=tiny["dense"], reward_funcs=tiny["funcs"], dataset=tiny["dataset"], **GPU)
    args.update(kw)
    return lint(cfg, **args)


def test_reference_config_is_quiet(tiny):
    findings = _lint(REFERENCE, tiny)
    assert _ids(findings, ("warning", "critical")) == set()
    assert _ids(findings) == REFERENCE_INFO
    for f in findings:
        assert f.step == 0 and f.onset_step is None and f.detector.startswith("config_") and f.message


def test_reference_config_as_a_real_grpoconfig_is_quiet(tiny, tmp_path):
    from trl import GRPOConfig

    cfg = GRPOConfig(**dict(REFERENCE, output_dir=str(tmp_path), bf16=False))  # bf16=True cannot be built on CPU
    assert _ids(_lint(cfg, tiny)) == REFERENCE_INFO


def test_defaults_table_matches_grpoconfig():
    from trl import GRPOConfig

    fields = {f.name: f.default for f in dataclasses.fields(GRPOConfig)}
    for key, value in DEFAULTS.items():
        if key == "bf16":  # None in the dataclass, resolved to True unless fp16 is set
            assert fields[key] in (None, True)
            continue
        assert fields[key] == value, key


# (rule, severity, change to the reference config, extra lint() keyword arguments, variant)
BREAKS = [
    ("config_num_generations", "warning", {"num_generations": 4}, {}, None),
    ("config_learning_rate", "info", {"learning_rate": 1e-5}, {"model": SHAPE_2B}, None),
    ("config_learning_rate", "info", {"learning_rate": 1e-8}, {}, None),
    ("config_beta", "info", {"beta": 0.0}, {}, None),
    ("config_beta", "info", {"beta": 0.5}, {}, None),
    ("config_vllm_mode", "warning", {"vllm_mode": "server"}, {}, None),
    ("config_vllm_mode", "warning", {}, {"num_devices": 4}, None),
    ("config_on_policy_trap", "warning", {"epsilon_high": 0.28}, {}, "dapo"),
    ("config_on_policy_trap", "warning", {"importance_sampling_level": "sequence"}, {}, "gspo"),
    ("config_logging_steps", "info", {"logging_steps": 5}, {}, None),
    ("config_max_completion_length", "warning", {"max_completion_length": 16}, {"completion_lengths": [16] * 6 + [9] * 2}, None),
    ("config_max_completion_length", "warning", {}, {"clipped_ratio": 0.8}, None),
    ("config_bf16", "critical", {}, {"device_kind": "cpu", "bf16_supported": None, "device_memory_gib": None}, None),
    ("config_bf16", "critical", {}, {"bf16_supported": False}, None),
    ("config_bf16", "critical", {"use_cpu": True}, {"bf16_supported": None}, None),
    ("config_vllm_cpu", "critical", {"use_cpu": True, "bf16": False}, {}, None),
    ("config_memory", "critical", {"per_device_train_batch_size": 8}, {"device_memory_gib": 0.5}, None),
    ("config_vllm_is_correction", "warning", {"vllm_importance_sampling_correction": False}, {}, None),
    ("config_vllm_off", "warning", {"use_vllm": False}, {"num_devices": 4}, None),
]


@pytest.mark.parametrize("rule,severity,change,kwargs,variant", BREAKS,
                         ids=[f"{b[0]}-{i}" for i, b in enumerate(BREAKS)])
def test_each_rule_fires_and_its_fix_silences_it(tiny, rule, severity, change, kwargs, variant):
    cfg = dict(REFERENCE, **change)
    hits = [f for f in _lint(cfg, tiny, **kwargs) if f.detector == rule]
    assert len(hits) == 1, [f.detector for f in _lint(cfg, tiny, **kwargs)]
    f = hits[0]
    assert f.severity == severity and f.variant == variant
    json.dumps(f.to_dict())
    if rule == "config_memory":
        return  # its levers are several; the memory tests check them
    if rule == "config_max_completion_length" and "completion_lengths" not in kwargs:
        return  # an observed ratio belongs to the old cap; the fix is judged on new observations
    assert f.config_overrides, rule
    fixed = dict(cfg, **f.config_overrides)
    after = dict(kwargs)
    if rule == "config_max_completion_length":
        after["completion_lengths"] = [16] * 6 + [9] * 2  # the same completions fit under the raised cap
    assert rule not in _ids(_lint(fixed, tiny, **after))


def test_reward_and_dataset_rules(tiny):
    from grpo_monitor.fixtures.tiny import correctness_reward

    one = _lint(REFERENCE, tiny, reward_funcs=[correctness_reward])
    assert {"config_reward_count", "config_format_reward"} <= _ids(one, ("warning",))
    by_name = _lint(REFERENCE, tiny, reward_funcs=None, reward_names=["accuracy", "xml_structure"])
    assert not _ids(by_name) & {"config_reward_count", "config_format_reward"}
    leaked = _lint(REFERENCE, tiny, dataset=tiny["dataset"].add_column("completion", ["x"] * len(tiny["dataset"])))
    f = [x for x in leaked if x.detector == "config_dataset_completions"]
    assert f and f[0].evidence["completion_like"] == ["completion"]
    no_prompt = _lint(REFERENCE, tiny, dataset=[{"question": "q", "answer": "a"}])
    assert "config_dataset_prompt" in _ids(no_prompt)
    # an answer target is fine: prompts plus targets are what the recipe expects
    assert not _ids(_lint(REFERENCE, tiny, dataset=[{"prompt": "p", "answer": "a"}])) & {
        "config_dataset_prompt", "config_dataset_completions"}


def test_first_run_advice_only_on_a_first_run(tiny):
    cfg = dict(REFERENCE, learning_rate=1e-4, beta=0.0)
    assert {"config_learning_rate", "config_beta"} <= _ids(_lint(cfg, tiny, model=SHAPE_2B))
    assert not {"config_learning_rate", "config_beta"} & _ids(_lint(cfg, tiny, model=SHAPE_2B, first_run=False))
    # within 10x either way is not "far"
    assert not {"config_learning_rate", "config_beta"} & _ids(_lint(dict(REFERENCE, learning_rate=4e-6, beta=0.002), tiny))


def test_a_small_model_is_never_advised_a_learning_rate_below_its_own(tiny):
    """The recipe's 5e-7 is sized for billion-parameter policies: a tiny model (the demo's 3e-4) is not told to
    take it, a model the recipe is sized for is, and a small model's rate far below the recipe still is."""
    demo = dict(REFERENCE, learning_rate=3e-4)
    assert "config_learning_rate" not in _ids(_lint(demo, tiny))
    [f] = [f for f in _lint(demo, tiny, model=SHAPE_2B) if f.detector == "config_learning_rate"]
    assert f.config_overrides == {"learning_rate": 5e-7}
    [low] = [f for f in _lint(dict(REFERENCE, learning_rate=1e-9), tiny) if f.detector == "config_learning_rate"]
    assert low.config_overrides["learning_rate"] > 1e-9


def test_on_policy_trap_is_quiet_off_policy(tiny):
    for change in ({"steps_per_generation": 16}, {"num_iterations": 2}):
        cfg = dict(REFERENCE, epsilon_high=0.28, importance_sampling_level="sequence", **change)
        assert "config_on_policy_trap" not in _ids(_lint(cfg, tiny))
    assert "config_on_policy_trap" not in _ids(_lint(dict(REFERENCE, epsilon_high=0.2), tiny))


def test_moe_model_needs_gspo(tiny):
    hits = [f for f in _lint(REFERENCE, tiny, model=tiny["moe"]) if f.detector == "config_moe_gspo"]
    assert len(hits) == 1 and hits[0].variant == "gspo" and hits[0].severity == "warning"
    overrides = hits[0].config_overrides
    assert overrides["importance_sampling_level"] == "sequence" and overrides["steps_per_generation"] == 16
    fixed = _lint(dict(REFERENCE, **overrides), tiny, model=tiny["moe"])
    assert not _ids(fixed) & {"config_moe_gspo", "config_on_policy_trap"}
    # run-header facts are enough
    assert "config_moe_gspo" in _ids(_lint(REFERENCE, tiny, model={"num_parameters": 10, "is_moe": True}))


def test_vision_language_model_is_out_of_scope(tiny):
    from transformers import Qwen2VLConfig

    hits = [f for f in _lint(REFERENCE, tiny, model=Qwen2VLConfig(), device_memory_gib=None) if f.detector == "config_vlm"]
    assert len(hits) == 1 and "out of scope" in hits[0].message


def _cpu_machine():
    import torch

    if torch.cuda.is_available():
        pytest.skip("measures a machine without CUDA")


def test_a_gpu_recipe_linted_on_this_cpu_machine_is_judged_for_a_gpu(tiny):
    _cpu_machine()
    details: dict = {}
    findings = lint(REFERENCE, model=tiny["dense"], reward_funcs=tiny["funcs"], num_devices=1, details=details)
    assert not _ids(findings, ("warning", "critical"))
    # nothing advises turning the GPU recipe into a CPU one
    for f in findings:
        assert f.config_overrides.get("use_vllm") is not False and f.config_overrides.get("bf16") is not False, f
        assert not f.config_overrides.get("use_cpu"), f
    assert (details["device"], details["device_from"], details["local_device"]) == ("cuda", "config", "cpu")
    assert {"bf16=True", "use_vllm=True"} <= set(details["device_reasons"])


def test_a_config_naming_no_gpu_setting_is_judged_for_this_machine(tiny):
    _cpu_machine()
    plain = {k: v for k, v in REFERENCE.items() if k not in ("bf16", "use_vllm")}
    details: dict = {}
    findings = lint(plain, model=tiny["dense"], reward_funcs=tiny["funcs"], num_devices=1, details=details)
    assert (details["device"], details["device_from"]) == ("cpu", "this machine")
    # TRL's default bf16=True cannot start on this CPU; the finding says the value is the default
    [bf16] = [f for f in findings if f.detector == "config_bf16"]
    assert bf16.severity == "critical" and "default" in bf16.message


def test_device_cpu_judges_a_gpu_recipe_for_this_machine(tiny):
    details: dict = {}
    findings = lint(REFERENCE, model=tiny["dense"], reward_funcs=tiny["funcs"], num_devices=1, device_kind="cpu",
                    details=details)
    assert {"config_bf16", "config_vllm_cpu"} <= _ids(findings, ("critical",))
    assert details["device_from"] == "given"


@pytest.mark.parametrize("setting", [
    {"fp16": True}, {"use_vllm": True}, {"vllm_mode": "server"}, {"deepspeed": "ds_zero3.json"},
    {"fsdp": "full_shard auto_wrap"}, {"ddp_backend": "nccl"}, {"optim": "paged_adamw_8bit"}, {"tf32": True},
    {"attn_implementation": "flash_attention_2"}, {"model_init_kwargs": {"attn_implementation": "flash_attention_2"}},
    {"use_liger_kernel": True}, {"bf16": "true"},
], ids=lambda s: next(iter(s)))
def test_each_gpu_setting_makes_a_gpu_recipe(setting):
    from grpo_monitor.preflight.lint import recipe_device

    kind, reasons = recipe_device({"num_generations": 8, **setting})
    assert kind == "cuda" and len(reasons) == 1
    assert recipe_device({"num_generations": 8, **setting, "use_cpu": True})[0] == "cpu"


def test_gradient_checkpointing_is_a_gpu_setting_on_a_multi_gb_model_only(tiny):
    from grpo_monitor.preflight.lint import recipe_device

    assert recipe_device({"gradient_checkpointing": True}, SHAPE_2B)[0] == "cuda"
    assert recipe_device({"gradient_checkpointing": True}, tiny["dense"]) == (None, [])
    assert recipe_device({"gradient_checkpointing": False}, SHAPE_2B) == (None, [])
    assert recipe_device({}, SHAPE_2B) == (None, [])  # a default says nothing about the hardware
    # transformers 5's new name wins over the deprecated alias, as TrainingArguments resolves them.
    assert recipe_device({"activation_checkpointing": False, "gradient_checkpointing": True}, SHAPE_2B) == (None, [])
    assert recipe_device({"activation_checkpointing": True}, SHAPE_2B)[0] == "cuda"


def test_one_reading_of_the_checkpointing_setting_across_lint_memory_and_the_memory_ladder():
    from grpo_monitor.detectors.memory_pressure import memory_ladder
    from grpo_monitor.detectors.variants import checkpointing
    from grpo_monitor.preflight.memory import _checkpointing

    both = {"activation_checkpointing": False, "gradient_checkpointing": True}
    assert checkpointing(both) == ("activation_checkpointing", False)
    assert _checkpointing(both) is False and _checkpointing({}) is True
    rungs = memory_ladder(both)
    assert any(r.get("overrides") == {"activation_checkpointing": True} for r in rungs), rungs


def test_lint_trainer_reads_a_real_grpo_trainer(tmp_path):
    from grpo_monitor.app.demo import build_trainer, demo_config
    from grpo_monitor.preflight.lint import lint_trainer, trainer_facts

    trainer = build_trainer(demo_config(tmp_path, 1))
    facts = trainer_facts(trainer)
    assert facts["num_devices"] == 1 and facts["device_kind"] == "cpu"
    assert facts["reward_names"] == ["format_reward", "correctness_reward"]
    # the demo trains fast on purpose: beta 0 is far from the recipe (info); its lr 3e-4 suits a 76k-parameter
    # model, which the recipe's 5e-7 would leave unmoved (the demo says so), so nothing advises that
    assert _ids(lint_trainer(trainer)) == {"config_beta"}
    assert _ids(lint_trainer(trainer, first_run=False)) == set()


# -- the CLI entry -----------------------------------------------------------------------------------


def _cli(argv, capsys):
    parser = add_lint_arguments(argparse.ArgumentParser())
    code = run_lint_cli(parser.parse_args(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def _yaml(path, tiny_dir, **change):
    # the shape `trl grpo --config` reads: flat GRPOConfig keys plus script arguments; note YAML 1.1
    # reads 5e-7 (no dot) as a string, which TRL's parser converts by type and so must we
    cfg = dict(REFERENCE, model_name_or_path=str(tiny_dir), dataset_name="my/prompts",
               reward_funcs=["grpo_monitor.fixtures.tiny.format_reward", "grpo_monitor.fixtures.tiny.correctness_reward"], **change)
    lines = [f"{k}: {json.dumps(v) if not isinstance(v, float) else format(v, 'g')}" for k, v in cfg.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def _tiny_dir():
    from grpo_monitor.fixtures.tiny import DENSE, _key, cache_dir

    spec = dict(DENSE, seed=0, warm_start=150)
    return cache_dir() / f"{spec['kind']}-{_key(spec)}"


def test_cli_on_a_trl_yaml_config(tmp_path, capsys, tiny):
    path = _yaml(tmp_path / "grpo.yaml", _tiny_dir())
    assert "learning_rate: 5e-07" in path.read_text()
    code, out, err = _cli([str(path), "--device", "cuda", "--num-devices", "1", "--device-memory-gib", "80"], capsys)
    assert code == 0, out + err
    assert "config_logging_steps" in out and "memory per device" in out and "peak per device" in out
    assert "fits" in out
    bad = _yaml(tmp_path / "bad.yaml", _tiny_dir(), num_generations=4)
    code, out, _ = _cli([str(bad), "--device", "cuda", "--num-devices", "1", "--json"], capsys)
    doc = json.loads(out)
    # A deviation that does not break the run is a warning: shown, with its fix, and the check passes.
    assert code == 0 and "config_num_generations" in {f["detector"] for f in doc["findings"]}
    assert doc["memory"]["terms"]["weights"] > 0


def _memory_figures(out):
    """(finding's peak, table's peak, table's generation phase, table's training phase) as printed, in GiB."""
    finding = re.search(r"config_memory: Estimated peak ([\d.]+) GiB", out)
    return (finding.group(1) if finding else None,
            *(re.search(rf"^  {name}\s+([\d.]+)", out, re.M).group(1)
              for name in ("peak per device", "generation phase", "training phase")))


def test_memory_figures_agree_in_the_finding_the_table_and_the_json(tmp_path, capsys):
    """One estimate on one set of defaults: a recipe that leaves max_completion_length out is sized with
    TRL's default in the finding, the table and the JSON alike."""
    from trl import GRPOConfig

    from grpo_monitor.fixtures.tiny import build_model
    from grpo_monitor.preflight.memory import DEFAULT_PROMPT_LENGTH, GIB

    model_dir = tmp_path / "tiny"
    build_model(path=model_dir)
    path = _plain_yaml(tmp_path / "recipe.yaml", **REFERENCE)
    assert "max_completion_length" not in path.read_text()
    argv = [str(path), "--device", "cuda", "--num-devices", "1", "--device-memory-gib", "1", "--model", str(model_dir)]
    code, out, err = _cli(argv, capsys)
    assert code == 1, out + err
    finding, table, _, train = _memory_figures(out)
    code, out, _ = _cli(argv + ["--json"], capsys)
    doc = json.loads(out)
    [f] = [f for f in doc["findings"] if f["detector"] == "config_memory"]
    assert finding == table == f"{doc['memory']['peak'] / GIB:.2f}"
    assert f["evidence"]["peak_bytes"] == doc["memory"]["peak"]
    assert f["evidence"]["train_phase"] == doc["memory"]["train_phase"] and train == f"{doc['memory']['train_phase'] / GIB:.2f}"
    default = {x.name: x.default for x in dataclasses.fields(GRPOConfig)}["max_completion_length"]
    seq = DEFAULT_PROMPT_LENGTH + default
    assert f"{REFERENCE['per_device_train_batch_size']} seq x {seq} tok" in doc["memory"]["formulas"]["activations"]
    assert f"max_completion_length {default} tokens (GRPOConfig's default)" in doc["memory"]["assumptions"]


@pytest.mark.parametrize("model,section", [("QWEN25_7B", "### 7B dense"), ("QWEN3_30B_A3B", "### 30B-A3B MoE")])
def test_docs_worked_figures_are_what_lint_prints(tmp_path, capsys, model, section):
    """docs/MEMORY.md's first column (the recipe as written on one 80 GiB GPU) is lint's output for that recipe."""
    import tests.test_memory as shapes

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(getattr(shapes, model)))
    path = _plain_yaml(tmp_path / "recipe.yaml", **REFERENCE)
    code, out, err = _cli([str(path), "--device", "cuda", "--num-devices", "1", "--device-memory-gib", "80",
                           "--model", str(tmp_path / "model")], capsys)
    assert code == 1, out + err
    finding, peak, generation, train = _memory_figures(out)
    doc = (Path(__file__).resolve().parents[1] / "docs" / "MEMORY.md").read_text(encoding="utf-8")
    part = doc.split(section, 1)[1].split("\n### ", 1)[0]

    def first_column(row):
        return re.search(rf"^\| {row} \| ([\d.]+)", part, re.M).group(1)

    assert (first_column("generation phase"), first_column("training phase")) == (generation, train)
    assert finding == peak == max(generation, train, key=float)


def test_trl_parser_accepts_the_yaml_the_lint_reads(tmp_path, tiny):
    from trl import GRPOConfig, ModelConfig, TrlParser
    from trl.scripts.grpo import GRPOScriptArguments

    path = _yaml(tmp_path / "grpo.yaml", _tiny_dir(), bf16=False)
    _, training, _ = TrlParser((GRPOScriptArguments, GRPOConfig, ModelConfig)).parse_args_and_config(
        ["--config", str(path), "--output_dir", str(tmp_path / "out")])
    assert training.learning_rate == 5e-7
    findings, ctx = lint_path(path, **GPU)
    assert ctx["config"]["learning_rate"] == 5e-7
    assert _ids(findings) == REFERENCE_INFO


def test_cli_says_once_that_a_gpu_recipe_is_judged_for_a_gpu(tmp_path, capsys):
    _cpu_machine()
    path = _plain_yaml(tmp_path / "gpu.yaml", **REFERENCE)
    code, out, err = _cli([str(path)], capsys)
    assert code == 0, out + err  # the reference recipe raises only info, wherever it is linted
    notes = [line for line in out.splitlines() if "judged for a CUDA GPU" in line]
    assert len(notes) == 1 and "--device cpu" in notes[0] and "bf16=True" in notes[0]
    assert "config_vllm_cpu" not in out and "config_bf16" not in out and "use_vllm False" not in out
    code, out, _ = _cli([str(path), "--json"], capsys)
    doc = json.loads(out)
    assert doc["device"]["judged_for"] == "cuda" and doc["device"]["this_machine"] == "cpu" and doc["device"]["note"]
    code, out, _ = _cli([str(path), "--device", "cpu"], capsys)
    assert code == 1 and "config_vllm_cpu" in out and "config_bf16" in out and "judged for a CUDA GPU" not in out


@pytest.mark.parametrize("content,name", [(None, "missing.yaml"), ("a: [1, 2\n", "broken.yaml"), ("- 1\n- 2\n", "list.yaml"),
                                          ("{not json", "broken.json")])
def test_cli_unusable_input_exits_2_with_one_line(tmp_path, capsys, content, name):
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    code, out, err = _cli([str(path)], capsys)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and str(path) in err


def test_cli_on_a_run_directory_sees_truncation_in_the_first_steps(tmp_path, capsys):
    from tests.conftest import train_tiny

    run_dir = tmp_path / "run"
    train_tiny(run_dir, steps=3, max_completion_length=2)  # every completion is cut at 2 tokens
    findings, ctx = lint_path(run_dir, device_kind="cpu")
    hit = [f for f in findings if f.detector == "config_max_completion_length"]
    assert hit and hit[0].evidence["truncated_fraction"] > 0.5
    assert ctx["model"]["num_parameters"] > 0
    code, out, _ = _cli([str(run_dir), "--device", "cpu"], capsys)
    assert code == 0 and "[warning] config_max_completion_length" in out and "weights" in out


# --- the vLLM pre-flight ------------------------------------------------------------------------------

def _plain_yaml(path, **cfg):
    path.write_text("\n".join(f"{k}: {json.dumps(v)}" for k, v in cfg.items()) + "\n")
    return path


def test_cli_says_gspo_is_required_for_a_well_known_moe_id_without_local_config(tmp_path, capsys):
    path = _plain_yaml(tmp_path / "moe.yaml", model_name_or_path="Qwen/Qwen3-30B-A3B", use_vllm=True, num_generations=8,
                       logging_steps=1)
    code, out, err = _cli([str(path), "--device", "cuda", "--num-devices", "1", "--device-memory-gib", "80"], capsys)
    assert code == 1, out + err
    line = next(x for x in out.splitlines() if "config_moe_gspo" in x)
    assert "GSPO" in line and "required" in line and "Qwen/Qwen3-30B-A3B" in line
    assert "config_memory" in out  # known by its id, it is sized too: 30B parameters do not fit 80 GiB
    assert "--importance_sampling_level sequence" in out
    for model_id in ("mistralai/Mixtral-8x7B-Instruct-v0.1", "deepseek-ai/DeepSeek-V3-0324", "allenai/OLMoE-1B-7B-0924",
                     "openai/gpt-oss-20b"):
        assert "config_moe_gspo" in _ids(lint({"model_name_or_path": model_id}, device_kind="cuda", num_devices=1))
    assert "config_moe_gspo" not in _ids(lint({"model_name_or_path": "Qwen/Qwen3-4B"}, device_kind="cuda", num_devices=1))


def test_cli_says_the_correction_is_off_with_the_fix_as_a_flag(tmp_path, capsys):
    path = _plain_yaml(tmp_path / "off.yaml", model_name_or_path="Qwen/Qwen3-4B", use_vllm=True, num_generations=8,
                       vllm_importance_sampling_correction=False, logging_steps=1)
    code, out, _ = _cli([str(path), "--device", "cuda", "--num-devices", "1", "--device-memory-gib", "80"], capsys)
    assert code == 1 and "config_vllm_is_correction" in out
    assert "fix: --vllm_importance_sampling_correction True" in out


def test_moe_with_token_level_vllm_correction_is_told_to_correct_per_sequence(tiny):
    cfg = dict(REFERENCE, importance_sampling_level="sequence", steps_per_generation=16,
               vllm_importance_sampling_mode="token_truncate", vllm_importance_sampling_clip_min=0.5)
    [f] = [f for f in _lint(cfg, tiny, model=tiny["moe"]) if f.detector == "config_moe_gspo"]
    assert f.config_overrides == {"vllm_importance_sampling_mode": "sequence_mask", "epsilon": 3e-4, "epsilon_high": 4e-4,
                                  "loss_type": "grpo", "beta": 0.0}
    assert "config_moe_gspo" not in _ids(_lint(dict(cfg, **f.config_overrides), tiny, model=tiny["moe"]))


def test_server_mode_without_an_address_to_connect_to(tiny):
    cfg = dict(REFERENCE, vllm_mode="server")
    [f] = [f for f in _lint(cfg, tiny, num_devices=4) if f.detector == "config_vllm_server_host"]
    assert f.severity == "warning" and "--vllm_server_host" in f.message
    for fixed in ({"vllm_server_host": "10.0.0.5"}, {"vllm_server_base_url": "http://10.0.0.5:8000"}):
        assert "config_vllm_server_host" not in _ids(_lint(dict(cfg, **fixed), tiny, num_devices=4))




def test_vllm_share_against_the_memory_estimate(tiny):
    small = dict(REFERENCE, vllm_gpu_memory_utilization=0.03, gradient_checkpointing=True)
    [f] = [f for f in _lint(small, tiny, model=SHAPE_2B) if f.detector == "config_vllm_memory"]
    assert f.severity == "critical" and f.evidence["vllm_share_gib"] < f.evidence["needed_gib"]
    fixed = dict(small, **f.config_overrides)
    assert fixed["vllm_gpu_memory_utilization"] * 80 > f.evidence["needed_gib"]
    assert "config_vllm_memory" not in _ids(_lint(fixed, tiny, model=SHAPE_2B))
    # A share that leaves training too little is the memory plan's to resolve: one finding, one value for the flag.
    greedy = dict(REFERENCE, vllm_gpu_memory_utilization=0.9, gradient_checkpointing=True)
    found = _lint(greedy, tiny, model=SHAPE_2B)
    assert "config_vllm_memory" not in _ids(found)
    [g] = [f for f in found if f.detector == "config_memory"]
    assert g.severity == "critical" and g.config_overrides
    again = _lint(dict(greedy, **g.config_overrides), tiny, model=SHAPE_2B)
    assert not _ids(again, ("critical",)) and "config_memory" not in _ids(again)
    # the recipe's default share for a small model is quiet
    assert "config_vllm_memory" not in _ids(_lint(REFERENCE, tiny))



# --- memory of a model known by its hub id --------------------------------------------------------

RECIPE_7B = dict(model_name_or_path="Qwen/Qwen2.5-7B-Instruct", use_vllm=True, vllm_mode="colocate", num_generations=8,
                 per_device_train_batch_size=8, gradient_accumulation_steps=4, bf16=True, learning_rate=5e-7,
                 beta=0.01, logging_steps=1)


@pytest.mark.parametrize("model_id,fits", [("Qwen/Qwen2.5-7B-Instruct", False), ("Qwen/Qwen2.5-1.5B-Instruct", True),
                                           ("Qwen/Qwen2.5-14B-Instruct", False), ("Qwen/Qwen3-30B-A3B", False)])
def test_a_recipe_naming_a_hub_id_is_sized_per_device(tmp_path, capsys, model_id, fits):
    path = _plain_yaml(tmp_path / "recipe.yaml", **dict(RECIPE_7B, model_name_or_path=model_id))
    code, out, err = _cli([str(path), "--device-memory-gib", "80", "--json"], capsys)
    doc = json.loads(out)
    memory = doc["memory"]
    assert memory is not None and memory["peak"] > 0 and memory["device_memory"] == 80 * 1024**3
    assert memory["fits"] is fits and doc["model"]["shape_from"].startswith(model_id)
    found = {f["detector"] for f in doc["findings"]}
    assert ("config_memory" in found) is (not fits) and code == (0 if fits else 1)
    assert "config_memory_unchecked" not in found
    code, out, _ = _cli([str(path), "--device-memory-gib", "80"], capsys)
    assert "peak per device" in out and "the table of common architectures" in out
    assert ("no findings: the configuration follows the recipe and fits its device's memory" in out) is fits


def test_the_issue_recipe_on_an_80_gib_gpu_does_not_fit(tmp_path, capsys):
    path = _plain_yaml(tmp_path / "recipe.yaml", **RECIPE_7B)
    code, out, _ = _cli([str(path), "--device-memory-gib", "80"], capsys)
    assert code == 1 and "[critical] config_memory: Estimated peak" in out and "DOES NOT FIT" in out
    assert "7,615,616,512 params" in out  # Qwen2.5-7B's parameter count, from its config shape


def test_memory_not_checked_is_a_finding_never_no_findings(tmp_path, capsys):
    unknown = _plain_yaml(tmp_path / "unknown.yaml", **dict(RECIPE_7B, model_name_or_path="my-org/house-model-7b"))
    code, out, _ = _cli([str(unknown), "--device-memory-gib", "80"], capsys)
    assert code == 0 and "no findings" not in out
    assert "[info] config_memory_unchecked: Memory was not checked: my-org/house-model-7b is neither" in out
    # Sized, but with no device memory to hold it against (no GPU here, none given): said so, with the estimate.
    _cpu_machine()
    known = _plain_yaml(tmp_path / "known.yaml", **RECIPE_7B)
    code, out, _ = _cli([str(known), "--json"], capsys)
    [f] = [f for f in json.loads(out)["findings"] if f["detector"] == "config_memory_unchecked"]
    assert f["severity"] == "info" and f["evidence"]["reason"] == "device memory unknown"
    assert "--device-memory-gib" in f["message"] and f["evidence"]["peak_gib"] > 80


def test_common_architectures_by_hub_id_match_their_published_sizes():
    from grpo_monitor.core.model_config import config_from_model_id, moe_from_model_id
    from grpo_monitor.preflight.memory import model_shape

    published = {  # total parameters, billions (model cards)
        "Qwen/Qwen2.5-0.5B-Instruct": 0.49, "Qwen/Qwen2.5-Math-7B": 7.62, "Qwen/Qwen2.5-72B-Instruct": 72.7,
        "Qwen/Qwen3-0.6B": 0.6, "Qwen/Qwen3-8B": 8.2, "Qwen/Qwen3-32B": 32.8, "Qwen/Qwen3-30B-A3B": 30.5,
        "meta-llama/Llama-3.2-1B-Instruct": 1.24, "meta-llama/Meta-Llama-3-8B": 8.03, "meta-llama/Llama-3.3-70B-Instruct": 70.6,
        "mistralai/Mistral-7B-Instruct-v0.3": 7.25, "mistralai/Mixtral-8x7B-Instruct-v0.1": 46.7,
        "google/gemma-2-9b-it": 9.24, "google/gemma-3-1b-it": 1.0, "microsoft/phi-4": 14.7,
        "microsoft/Phi-3-mini-4k-instruct": 3.82, "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B": 1.78,
        "deepseek-ai/DeepSeek-V3": 671, "openai/gpt-oss-20b": 20.9, "openai/gpt-oss-120b": 116.8,
    }
    for model_id, billions in published.items():
        shape = model_shape(config_from_model_id(model_id))
        assert shape["num_parameters"] / 1e9 == pytest.approx(billions, rel=0.03), model_id
    assert model_shape(config_from_model_id("Qwen/Qwen3-30B-A3B"))["active_parameters"] / 1e9 == pytest.approx(3.3, rel=0.05)
    # The MoE check reads the same table: one answer to "is this id a mixture of experts".
    assert moe_from_model_id("openai/gpt-oss-20b")["num_experts"] == 32 and moe_from_model_id("Qwen/Qwen3-8B") == {}
    assert config_from_model_id("google/gemma-3-4b-it").get("vision_config") is not None
    assert config_from_model_id("my-org/my-model") is None and config_from_model_id("Qwen/Qwen3-80B") is None


def test_lint_exits_1_on_a_critical_finding_only(tmp_path, capsys):
    warned = _plain_yaml(tmp_path / "warned.yaml", **dict(REFERENCE, vllm_mode="server"))  # one GPU: a warning
    code, out, _ = _cli([str(warned), "--device", "cuda", "--num-devices", "1"], capsys)
    assert "[warning] config_vllm_mode" in out and code == 0
    broken = _plain_yaml(tmp_path / "broken.yaml", **dict(REFERENCE, use_cpu=True))
    code, out, _ = _cli([str(broken)], capsys)
    assert "[critical]" in out and code == 1


def test_evidence_gives_the_ratio_not_the_threshold():
    [f] = [f for f in lint({"learning_rate": 1e-4, "beta": 0.01, "logging_steps": 1}, device_kind="cpu")
           if f.detector == "config_learning_rate"]
    assert f.evidence["ratio"] == pytest.approx(200) and f.evidence["far_factor"] == 10
    assert "factor" not in f.evidence
