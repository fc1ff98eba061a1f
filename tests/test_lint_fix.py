"""lint's fix line is a fixed point: apply the printed `fix:` flags, lint again, and nothing critical or
memory-related is left (or, where no setting of the recipe fits the device, one critical says so with no fix);
keys are read as TRL reads them; a Trainer output_dir is linted from its run's recorded config."""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from grpo_monitor.core.model_config import ARCHITECTURE_EXAMPLES, ARCHITECTURES
from grpo_monitor.preflight.lint import add_lint_arguments, format_report, lint, lint_path, run_lint_cli

COLOCATE = dict(use_vllm=True, vllm_mode="colocate", num_generations=8, per_device_train_batch_size=8,
                gradient_accumulation_steps=4, bf16=True, learning_rate=5e-7, beta=0.01, logging_steps=1,
                max_completion_length=1024, output_dir="out")
NO_VLLM = dict(COLOCATE, use_vllm=False)
NO_VLLM.pop("vllm_mode")
DEVICES_GIB = (24, 48, 80, 141)
MEMORY = {"config_memory", "config_vllm_memory"}


def _write(path: Path, cfg: dict) -> Path:
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def _lint(path: Path, gib: float):
    findings, ctx = lint_path(path, device_kind="cuda", num_devices=1, device_memory_gib=gib)
    return findings, format_report(str(path), findings, ctx.get("estimate"))


def _fix_lines(report: str) -> list[str]:
    return [line.split("fix:", 1)[1].strip() for line in report.splitlines() if line.strip().startswith("fix:")]


def _parse_flags(line: str) -> dict:
    """`--key value ...` as the config changes TRL's parser makes of them (a JSON value for a dict field)."""
    words = shlex.split(line)
    out, key = {}, None
    for w in words:
        if w.startswith("--"):
            key = w[2:]
            out[key] = None
        else:
            value = yaml.safe_load(w)
            out[key] = value if out[key] is None else [*(out[key] if isinstance(out[key], list) else [out[key]]), value]
    return out


def _apply(cfg: dict, report: str) -> dict:
    changed = dict(cfg)
    seen: dict = {}
    for line in _fix_lines(report):
        for key, value in _parse_flags(line).items():
            assert seen.setdefault(key, value) == value, f"two values for --{key}: {seen[key]!r} and {value!r}"
            changed[key] = value
    return changed


def _one_value_per_flag(findings):
    values: dict = {}
    for f in findings:
        for key, value in f.config_overrides.items():
            assert values.setdefault(key, value) == value, (key, values[key], value, [x.detector for x in findings])


def test_every_table_entry_has_an_example_id_found_by_that_entry():
    assert len(ARCHITECTURE_EXAMPLES) == len(ARCHITECTURES)
    for (pattern, _), model_id in zip(ARCHITECTURES, ARCHITECTURE_EXAMPLES):
        first = next(p for p, _ in ARCHITECTURES if re.search(p, model_id.lower()))
        assert first == pattern, model_id


@pytest.mark.parametrize("model_id", ARCHITECTURE_EXAMPLES)
def test_applying_the_fix_once_leaves_nothing_critical_and_no_memory_warning(tmp_path, model_id):
    """Every family x size of the hub-id table x 24/48/80/141 GiB x (colocated vLLM, no vLLM)."""
    outcomes = []
    for name, recipe in (("colocate", COLOCATE), ("no_vllm", NO_VLLM)):
        for gib in DEVICES_GIB:
            cfg = dict(recipe, model_name_or_path=model_id)
            first, report = _lint(_write(tmp_path / f"{name}-{gib}.yaml", cfg), gib)
            _one_value_per_flag(first)
            [mem] = [f for f in first if f.detector == "config_memory"] or [None]
            if mem is not None and mem.evidence["plan"] == "none":
                # Nothing fits: one critical says so plainly, with no fix that pretends.
                assert [f.detector for f in first if f.severity == "critical"] == ["config_memory"], report
                assert mem.config_overrides == {} and "no setting of this recipe makes it fit" in mem.message
                outcomes.append("none")
                continue
            fixed = _apply(cfg, report)
            second, report2 = _lint(_write(tmp_path / f"{name}-{gib}-fixed.yaml", fixed), gib)
            assert not [f for f in second if f.severity == "critical"], (model_id, gib, name, report, report2)
            left = [f for f in second if f.detector in MEMORY]
            if mem is not None and mem.evidence["plan"] == "tight":
                # It fits with every rung, with less than the headroom: said the first time, nothing more to apply.
                assert all(f.severity == "warning" and not f.config_overrides for f in left), report2
                outcomes.append("tight")
            else:
                assert left == [], (model_id, gib, name, report, report2)
                outcomes.append("fits")
    assert len(outcomes) == 2 * len(DEVICES_GIB)


def test_the_issue_7b_colocate_recipe_converges_in_one_step(tmp_path, capsys):
    cfg = dict(COLOCATE, model_name_or_path="Qwen/Qwen2.5-7B-Instruct", max_completion_length=1024)
    path = _write(tmp_path / "qwen7b.yaml", cfg)
    parser = add_lint_arguments(argparse.ArgumentParser())
    assert run_lint_cli(parser.parse_args([str(path), "--device-memory-gib", "80"])) == 1
    out = capsys.readouterr().out
    [line] = _fix_lines(out)
    assert _parse_flags(line) == {"vllm_enable_sleep_mode": True, "model_init_kwargs": {"dtype": "bfloat16"},
                                  "optim": "paged_adamw_8bit"}
    # each rung's effect on the peak, sleep mode's included (the share leaves the training phase)
    rungs = re.findall(r"^\s+\d\. (\S+)=.*?: ([\d.]+) -> ([\d.]+) GiB", out, re.M)
    assert [r[0] for r in rungs] == ["vllm_enable_sleep_mode", "model_init_kwargs", "optim"]
    assert all(float(after) < float(before) for _, before, after in rungs)
    fixed = _write(tmp_path / "fixed.yaml", _apply(cfg, out))
    assert run_lint_cli(parser.parse_args([str(fixed), "--device-memory-gib", "80"])) == 0
    out = capsys.readouterr().out
    assert "fix:" not in out and "no findings" in out


def test_a_moe_recipe_that_cannot_fit_gets_one_critical_and_no_conflicting_share(tmp_path):
    cfg = dict(COLOCATE, model_name_or_path="Qwen/Qwen3-30B-A3B", vllm_gpu_memory_utilization=0.05)
    findings, _ = _lint(_write(tmp_path / "moe.yaml", cfg), 80)
    _one_value_per_flag(findings)
    assert [f.detector for f in findings if f.severity == "critical"] == ["config_memory"]


def test_a_share_too_small_to_start_vllm_is_raised_to_one_value_that_also_fits(tmp_path):
    cfg = dict(COLOCATE, model_name_or_path="Qwen/Qwen2.5-1.5B-Instruct", vllm_gpu_memory_utilization=0.02,
               model_init_kwargs={"dtype": "bfloat16"})
    findings, report = _lint(_write(tmp_path / "small.yaml", cfg), 24)
    _one_value_per_flag(findings)
    [v] = [f for f in findings if f.detector == "config_vllm_memory"]
    assert v.severity == "critical" and v.config_overrides["vllm_gpu_memory_utilization"] >= v.evidence["least_share"]
    again, report2 = _lint(_write(tmp_path / "fixed.yaml", _apply(cfg, report)), 24)
    assert not [f for f in again if f.severity == "critical" or f.detector in MEMORY], report2


# -- keys as TRL reads them ------------------------------------------------------------------------------------


def _trl_refuses(tmp_path, cfg) -> str:
    from trl import GRPOConfig, ModelConfig, TrlParser
    from trl.scripts.grpo import GRPOScriptArguments

    path = _write(tmp_path / "trl.yaml", cfg)
    with pytest.raises(ValueError) as err:
        TrlParser((GRPOScriptArguments, GRPOConfig, ModelConfig)).parse_args_and_config(["--config", str(path)])
    return str(err.value)


CPU_SAFE = dict(num_generations=8, learning_rate=5e-7, beta=0.01, logging_steps=1, bf16=False, use_cpu=True,
                output_dir="out", model_name_or_path="Qwen/Qwen3-0.6B", dataset_name="trl-lib/DeepMath-103K",
                reward_funcs=["accuracy_reward"], dtype="bfloat16", attn_implementation="sdpa")


@pytest.mark.parametrize("key,value,nearest,words", [
    ("num_generation", 8, "num_generations", "did you mean num_generations"),
    ("max_prompt_length", 512, None, "not a field of GRPOConfig in TRL"),
    ("lerning_rate", 1e-6, "learning_rate", "did you mean learning_rate"),
])
def test_a_key_trl_refuses_is_a_critical_naming_the_nearest_field(tmp_path, key, value, nearest, words):
    import trl

    cfg = dict(CPU_SAFE, **{key: value})
    assert f"'--{key}'" in _trl_refuses(tmp_path, cfg)  # TRL's own parser stops on it
    findings, _ = lint_path(_write(tmp_path / "recipe.yaml", cfg), device_kind="cpu")
    [f] = [f for f in findings if f.detector == "config_unknown_key"]
    assert f.severity == "critical" and f.evidence["key"] == key and words in f.message
    assert f"TRL {trl.__version__}" in f.message
    if nearest:
        assert f.evidence["nearest"] == nearest and f"Rename it to {nearest}" in f.message
    else:
        assert "Remove it" in f.message


def test_trl_grpo_script_model_and_launch_keys_are_accepted(tmp_path):
    from trl import GRPOConfig, ModelConfig, TrlParser
    from trl.scripts.grpo import GRPOScriptArguments

    cfg = dict(CPU_SAFE)
    path = _write(tmp_path / "ok.yaml", cfg)
    TrlParser((GRPOScriptArguments, GRPOConfig, ModelConfig)).parse_args_and_config(["--config", str(path)])
    findings, _ = lint_path(_write(tmp_path / "ok.yaml", dict(cfg, num_processes=1, accelerate_config="zero2")),
                            device_kind="cpu")
    assert "config_unknown_key" not in {f.detector for f in findings}


def test_a_refused_key_is_left_out_of_the_memory_estimate():
    from grpo_monitor.core.model_config import config_from_model_id

    cfg = dict(COLOCATE, model_name_or_path="Qwen/Qwen2.5-7B-Instruct")
    model = config_from_model_id(cfg["model_name_or_path"])
    details: dict = {}
    lint(dict(cfg, max_prompt_length=4096), model=model, device_kind="cuda", num_devices=1, device_memory_gib=80,
         details=details)
    with_key = details["estimate"].terms["activations"]
    lint(cfg, model=model, device_kind="cuda", num_devices=1, device_memory_gib=80, details=details)
    assert details["estimate"].terms["activations"] == with_key


def test_values_are_read_as_trls_parser_reads_them(tmp_path):
    findings, ctx = lint_path(_write(tmp_path / "r.yaml", dict(CPU_SAFE, learning_rate="5e-7", optim="adamw_8bits")),
                              device_kind="cpu")
    [f] = [f for f in findings if f.detector == "config_unknown_key"]
    assert f.evidence["key"] == "optim" and f.evidence["nearest"] == "adamw_8bit"
    assert "config_learning_rate" not in {x.detector for x in findings}


def test_without_trl_keys_are_checked_against_the_field_list_and_it_says_so():
    code = ("import sys; sys.modules['trl'] = None\n"
            "from grpo_monitor.preflight.trl_fields import read_keys\n"
            "import json; r = read_keys({'num_generation': 8, 'model_name_or_path': 'x', 'num_generations': 8})\n"
            "print(json.dumps({'refused': [x['key'] for x in r['refused']], 'near': [x['nearest'] for x in r['refused']],"
            " 'how': r['how']}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    doc = json.loads(out)
    assert doc["refused"] == ["num_generation"] and doc["near"] == ["num_generations"]
    assert "TRL is not installed" in doc["how"]


def test_the_fallback_field_list_is_trl_1_16s():
    import dataclasses

    import trl
    from trl import DatasetMixtureConfig, GRPOConfig, ModelConfig
    from trl.scripts.grpo import GRPOScriptArguments

    from grpo_monitor.preflight import trl_fields

    if not trl.__version__.startswith(trl_fields.FALLBACK_VERSION):
        pytest.skip("the fallback list is TRL 1.16's")
    for names, cls in ((trl_fields._GRPO_CONFIG_1_16, GRPOConfig), (trl_fields._SCRIPT_1_16, GRPOScriptArguments),
                       (trl_fields._MODEL_1_16, ModelConfig), (trl_fields._MIXTURE_1_16, DatasetMixtureConfig)):
        assert set(names.split()) == {f.name for f in dataclasses.fields(cls) if f.init}, cls.__name__


# -- a Trainer output_dir ----------------------------------------------------------------------------------------


def test_lint_of_a_trainer_output_dir_reads_its_runs_recorded_config(tmp_path, capsys):
    from tests.conftest import train_tiny

    out_dir = tmp_path / "out"
    train_tiny(out_dir / "grpo-monitor", steps=2)
    findings, ctx = lint_path(out_dir)
    assert ctx["run_dir"] == str(out_dir / "grpo-monitor") and ctx["config"]["learning_rate"] == 3e-4
    # the demo's 3e-4 suits its 76k-parameter model: no advice to take the recipe's 5e-7
    assert "config_learning_rate" not in {f.detector for f in findings}
    parser = add_lint_arguments(argparse.ArgumentParser())
    code = run_lint_cli(parser.parse_args([str(out_dir)]))
    text = capsys.readouterr().out
    assert code == 0 and "--learning_rate" not in text and "recorded config" in text


def test_lint_of_an_output_dir_written_by_the_run_writer(tmp_path):
    from grpo_monitor.core.runlog_writer import RunWriter

    run = tmp_path / "out" / "grpo-monitor"
    w = RunWriter(run)
    w.header(run_id="r", start_time=0.0, config=dict(COLOCATE, max_prompt_length=256),
             model={"num_parameters": 7_615_616_512}, world_size=1, reward_funcs=["format_reward", "accuracy"])
    w.close()
    findings, ctx = lint_path(tmp_path / "out", device_kind="cuda", device_memory_gib=80)
    # a header's config was a real GRPOConfig of the TRL that ran it: its fields are not refused here
    assert "config_unknown_key" not in {f.detector for f in findings}
    assert ctx["config"]["max_prompt_length"] == 256
