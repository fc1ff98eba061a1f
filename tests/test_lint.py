"""Pre-flight recipe lint: every rule fires on a config that breaks it, its fix silences it, and the
recipe's reference configuration raises nothing above info."""

from __future__ import annotations

import argparse
import dataclasses
import json

import pytest

from monitor.lint import DEFAULTS, add_lint_arguments, lint, lint_path, run_lint_cli

# REFERENCE §1, step 2; the tests run it on "one GPU" (device facts passed in, not measured here)
REFERENCE = dict(output_dir="./outputs-grpo", use_vllm=True, num_generations=8, learning_rate=5e-7, beta=0.01,
                 per_device_train_batch_size=8, gradient_accumulation_steps=4, bf16=True, logging_steps=10, seed=3407)
GPU = dict(num_devices=1, device_kind="cuda", bf16_supported=True, device_memory_gib=80)
# The only finding the reference config raises: its logging_steps=10 coarsens detection (info).
REFERENCE_INFO = {"config_logging_steps"}


@pytest.fixture(scope="module")
def tiny():
    from fixtures.tiny import REWARD_FUNCS, build_dataset, build_model

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
    ("config_num_generations", "critical", {"num_generations": 4}, {}, None),
    ("config_learning_rate", "info", {"learning_rate": 1e-5}, {}, None),
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
    from fixtures.tiny import correctness_reward

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
    assert {"config_learning_rate", "config_beta"} <= _ids(_lint(cfg, tiny))
    assert not {"config_learning_rate", "config_beta"} & _ids(_lint(cfg, tiny, first_run=False))
    # within 10x either way is not "far"
    assert not {"config_learning_rate", "config_beta"} & _ids(_lint(dict(REFERENCE, learning_rate=4e-6, beta=0.002), tiny))


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


def test_bf16_on_this_cpu_machine_measured_through_torch(tiny):
    import torch

    if torch.cuda.is_available():
        pytest.skip("measures a machine without CUDA")
    findings = lint(REFERENCE, model=tiny["dense"], reward_funcs=tiny["funcs"], num_devices=1)
    assert {"config_bf16", "config_vllm_cpu"} <= _ids(findings, ("critical",))


def test_lint_trainer_reads_a_real_grpo_trainer(tmp_path):
    from monitor.demo import build_trainer, demo_config
    from monitor.lint import lint_trainer, trainer_facts

    trainer = build_trainer(demo_config(tmp_path, 1))
    facts = trainer_facts(trainer)
    assert facts["num_devices"] == 1 and facts["device_kind"] == "cpu"
    assert facts["reward_names"] == ["format_reward", "correctness_reward"]
    # the demo trains fast on purpose: lr 3e-4 and beta 0 are far from the recipe (info); nothing else
    assert _ids(lint_trainer(trainer)) == {"config_learning_rate", "config_beta"}
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
               reward_funcs=["fixtures.tiny.format_reward", "fixtures.tiny.correctness_reward"], **change)
    lines = [f"{k}: {json.dumps(v) if not isinstance(v, float) else format(v, 'g')}" for k, v in cfg.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def _tiny_dir():
    from fixtures.tiny import DENSE, _key, cache_dir

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
    assert code == 1 and "config_num_generations" in {f["detector"] for f in doc["findings"]}
    assert doc["memory"]["terms"]["weights"] > 0


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
    assert code == 1 and "config_max_completion_length" in out and "weights" in out
