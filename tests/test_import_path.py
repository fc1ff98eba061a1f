"""The import path users get: ``grpo_monitor`` only, which no module of a training project can shadow.

A training repository often has its own ``callbacks.py`` or ``monitor.py``; Python puts the script's folder
first on ``sys.path``, so a package installed under those names would lose to them (and PyPI has
distributions called ``callbacks``, ``detectors`` and ``monitor``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
tomllib = __import__("pytest").importorskip("tomllib")  # Python >= 3.11
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

TRAIN = """
import callbacks, detectors, monitor          # the project's own modules, as a user has them
from grpo_monitor import attach
from grpo_monitor.fixtures.tiny import build_dataset, build_model, build_tokenizer, correctness_reward, format_reward
from trl import GRPOConfig, GRPOTrainer

assert callbacks.OWN and detectors.OWN and monitor.OWN
args = GRPOConfig(output_dir="out", max_steps=5, per_device_train_batch_size=8, num_generations=8,
                  max_completion_length=16, learning_rate=3e-4, beta=0.0, logging_steps=1, save_strategy="no",
                  report_to="none", bf16=False, use_cpu=True, disable_tqdm=True, seed=0)
trainer = GRPOTrainer(model=build_model(), reward_funcs=[format_reward, correctness_reward], args=args,
                      train_dataset=build_dataset(), processing_class=build_tokenizer())
attach(trainer, "run")
trainer.train()
print("trained", trainer.state.global_step)
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A training project whose own modules carry the names of the repository's folders."""
    folder = tmp_path_factory.mktemp("project")
    for name in ("callbacks", "monitor", "detectors", "fixtures"):
        (folder / f"{name}.py").write_text(f"OWN = True\n\ndef attach(*a, **k):\n    raise RuntimeError('{name}.py of the project')\n")
    (folder / "train.py").write_text(TRAIN)
    return folder


def _clean_env() -> dict[str, str]:
    # The subprocess must find grpo_monitor through the installation alone, never through the repository.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONWARNINGS"] = "ignore"
    return env


def test_a_project_with_its_own_callbacks_monitor_and_detectors_trains_with_the_monitor(project):
    proc = subprocess.run([sys.executable, "train.py"], cwd=project, capture_output=True, text=True, env=_clean_env(),
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "trained 5" in proc.stdout
    header, *records = [json.loads(line) for line in (project / "run" / "run.jsonl").read_text().splitlines()]
    steps = sorted({r["step"] for r in records if r.get("type") == "step"})
    assert steps == [1, 2, 3, 4, 5]


def test_the_cli_runs_from_such_a_project(project):
    for cmd in ([sys.executable, "-m", "grpo_monitor", "--help"], [str(Path(sys.executable).with_name("grpo-monitor")), "--help"]):
        proc = subprocess.run(cmd, cwd=project, capture_output=True, text=True, env=_clean_env(), timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert "analyze" in proc.stdout and "watch" in proc.stdout


def test_the_distribution_installs_nothing_at_the_top_but_grpo_monitor(tmp_path):
    """The wheel holds ``grpo_monitor`` alone, with every package of the tree and the dashboard's styles: a
    top-level ``monitor`` would clash with PyPI's ``monitor`` distribution and with users' own modules."""
    import zipfile

    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path),
                    str(ROOT)], check=True, capture_output=True, timeout=300)
    [wheel] = tmp_path.glob("grpo_monitor-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")} == {"grpo_monitor"}
    on_disk = {str(init.relative_to(ROOT)) for init in (ROOT / "grpo_monitor").rglob("__init__.py")}
    assert on_disk <= set(names)
    assert "grpo_monitor/app/dashboard/app.tcss" in names
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["grpo-monitor"].startswith("grpo_monitor.")


def test_the_code_imports_itself_only_through_grpo_monitor():
    """An internal ``from monitor.x import y`` works in the repository but breaks (or picks up a user's
    module) once installed."""
    pattern = re.compile(r"^\s*(?:from|import)\s+(?:monitor|callbacks|detectors|fixtures)(?:\.|\s|$)", re.M)
    offenders = []
    for top in ("grpo_monitor", "tests", "benchmarks", "examples"):
        for path in (ROOT / top).rglob("*.py"):
            for m in pattern.finditer(path.read_text()):
                offenders.append(f"{path.relative_to(ROOT)}: {m.group().strip()}")
    assert offenders == []


def test_the_documented_entry_point_is_curated_and_light():
    code = textwrap.dedent("""
        import sys, grpo_monitor
        print(sorted(grpo_monitor.__all__))
        print([m for m in ('torch', 'transformers', 'trl', 'textual') if m in sys.modules])
        print(grpo_monitor.attach.__module__, grpo_monitor.analyze.__module__)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=_clean_env(),
                         cwd=ROOT.parent).stdout.splitlines()
    names = eval(out[0])  # noqa: S307 - our own printed list
    assert {"attach", "analyze", "load_run", "run_with_restarts"} <= set(names)
    assert out[1] == "[]"
    assert out[2] == "grpo_monitor.callbacks.attach grpo_monitor.analysis.analyze"
