"""Analysing logs offline must never pay for torch, transformers, TRL or Textual."""

import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers", "trl", "textual", "accelerate", "datasets")


@pytest.mark.parametrize("module", ["grpo_monitor", "grpo_monitor.detectors", "grpo_monitor.analysis.analyze", "grpo_monitor.readers", "grpo_monitor.app.cli", "grpo_monitor.core.runlog", "grpo_monitor.core.metrics", "grpo_monitor.core.engine"])
def test_light_imports(module):
    code = (
        f"import sys, {module}\n"
        f"heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "", f"import {module} loaded {out}"


def test_public_api_is_curated():
    import grpo_monitor
    from grpo_monitor import callbacks, detectors, rewards

    for pkg in (grpo_monitor, detectors, callbacks, rewards):
        assert pkg.__all__ and all(hasattr(pkg, name) for name in pkg.__all__)
