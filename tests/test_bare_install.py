"""A bare install (``pip install grpo-monitor``: numpy, scipy, pandas, orjson): every verb that needs an
optional package says which extra in one line and exits 2; the verbs that need none still work.

The real CLI runs in a subprocess (``python -m grpo_monitor``) whose import system refuses the optional
packages, as on a machine that never installed them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

OPTIONAL = ("textual", "transformers", "torch", "trl", "yaml", "wandb", "trackio", "tensorboard", "accelerate",
            "datasets", "mcp")

# Installed before grpo_monitor is imported: a finder that answers for the optional packages first,
# so neither an import nor importlib.util.find_spec can reach them.
BARE = f"""
import runpy, sys

class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {OPTIONAL!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
sys.argv[0] = "grpo-monitor"
runpy.run_module("grpo_monitor", run_name="__main__", alter_sys=True)
"""


def bare(*argv, cwd):
    return subprocess.run([sys.executable, "-c", BARE, *map(str, argv)], capture_output=True, text=True, cwd=cwd,
                          timeout=120)


def _one_line_naming(result, extra):
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr + result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert f"'{extra}'" in lines[0] and f"pip install 'grpo-monitor[{extra}]'" in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def samples(tmp_path):
    """A samples file and a reward module: what inspect-rewards judges without sampling from a model."""
    path = tmp_path / "samples.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"2+{i}=", "completion": f"<answer>{2 + i}</answer>" if i % 3 else f"{2 + i}"}) + "\n"
                            for i in range(50)))
    (tmp_path / "my_rewards.py").write_text(
        "def tagged(completions, **kwargs):\n    return [float('<answer>' in c) for c in completions]\n")
    return path


def test_watch_names_the_tui_extra(tmp_path):
    line = _one_line_naming(bare("watch", tmp_path / "run", cwd=tmp_path), "tui")
    assert line.startswith("grpo-monitor watch needs")


def test_mcp_names_the_mcp_extra(tmp_path):
    _one_line_naming(bare("mcp", cwd=tmp_path), "mcp")


def test_demo_names_the_train_extra(tmp_path):
    _one_line_naming(bare("demo", "--steps", "1", "--run-dir", tmp_path / "demo", cwd=tmp_path), "train")
    assert not (tmp_path / "demo").exists()
    tb = bare("demo", "--report-to", "tensorboard", cwd=tmp_path)
    assert tb.returncode == 2 and tb.stderr.strip() == (
        "grpo-monitor demo needs the 'train' and 'tensorboard' extras: pip install 'grpo-monitor[train,tensorboard]'")


def test_lint_of_a_yaml_config_names_the_preflight_extra_and_a_json_config_needs_none(tmp_path):
    cfg = {"num_generations": 8, "learning_rate": 5e-7, "beta": 0.01, "logging_steps": 1}
    (tmp_path / "recipe.yaml").write_text("".join(f"{k}: {v}\n" for k, v in cfg.items()))
    line = _one_line_naming(bare("lint", "recipe.yaml", cwd=tmp_path), "preflight")
    assert "recipe.yaml" in line
    (tmp_path / "recipe.json").write_text(json.dumps(cfg))
    ok = bare("lint", "recipe.json", "--device", "cuda", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert "Traceback" not in ok.stderr and "recipe.json" in ok.stdout


def test_inspect_rewards_names_the_extra_each_mode_needs(tmp_path, samples):
    _one_line_naming(bare("inspect-rewards", "--demo", "--auto", cwd=tmp_path), "train")
    _one_line_naming(bare("inspect-rewards", "--model", tmp_path, "--auto", cwd=tmp_path), "train")
    # the interactive gate is a Textual screen; it is refused before any reward function runs
    _one_line_naming(bare("inspect-rewards", "--samples", samples, "--reward-funcs", "my_rewards:tagged",
                          "--run-dir", tmp_path / "gate", cwd=tmp_path), "tui")
    both = bare("inspect-rewards", "--demo", "--run-dir", tmp_path / "gate", cwd=tmp_path)
    assert both.returncode == 2 and "pip install 'grpo-monitor[train,tui]'" in both.stderr
    # scoring a samples file with --auto needs no extra at all
    auto = bare("inspect-rewards", "--samples", samples, "--reward-funcs", "my_rewards:tagged", "--auto", cwd=tmp_path)
    assert auto.returncode == 0, auto.stderr
    assert "tagged" in auto.stdout and "Traceback" not in auto.stderr


def test_analyze_of_a_wandb_run_names_the_trackers_extra(tmp_path):
    (tmp_path / "run-x.wandb").write_bytes(b":W&B\xe1\xbe\x00" + b"\x07" * 100)
    _one_line_naming(bare("analyze", "run-x.wandb", cwd=tmp_path), "trackers")


def test_analyze_and_supervise_need_no_extra(tmp_path):
    from grpo_monitor.fixtures.synthetic import generate

    run = generate("healthy_fast_drop", seed=0, logging_steps=10)
    history = [{"step": step, **{k: v for k, v in metrics.items() if v is not None}} for step, metrics in run.steps]
    (tmp_path / "trainer_state.json").write_text(json.dumps({"global_step": run.steps[-1][0], "log_history": history}))
    out = bare("analyze", tmp_path / "trainer_state.json", "--json", cwd=tmp_path)
    assert out.returncode in (0, 1), out.stderr
    assert len(json.loads(out.stdout)["runs"]) == 1 and "Traceback" not in out.stderr
    sup = bare("supervise", "--run-dir", tmp_path / "lineage", "--", sys.executable, "-c", "print('trained')",
               cwd=tmp_path)
    assert sup.returncode == 0, sup.stderr
    assert "trained" in sup.stdout and "Traceback" not in sup.stderr


def test_the_package_metadata_builds_without_setuptools_warnings_about_it():
    """Set-up used to print setuptools' "`project.license` as a TOML table is deprecated" once per build step."""
    import warnings
    from pathlib import Path

    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    root = Path(__file__).resolve().parents[1]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist = apply_configuration(Distribution(), str(root / "pyproject.toml"))
    said = [str(w.message).splitlines()[0] for w in caught if "project." in str(w.message)]
    assert not said, said
    assert dist.metadata.license_expression == "Apache-2.0"
