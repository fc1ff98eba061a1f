"""Recommendations as validated diffs, and auto-restart into the variant, in process."""

from __future__ import annotations

import json

import pytest

from grpo_monitor.detectors.base import Detector, Finding
from grpo_monitor import read_run
from grpo_monitor.core.catalogue import CatalogueError, apply_overrides, catalogue, validate
from grpo_monitor.core.recommend import recommend
from grpo_monitor.core.restart import PLAN_FILE, choose_checkpoint, read_plan


class PlantedFinding(Detector):
    """Raises one critical finding at a fixed step: drives the restart machinery on a real run."""

    id = "entropy_collapse"
    variant = "dapo"

    def __init__(self, at_step: int = 3, variant: str = "dapo"):
        self.at_step = at_step
        self.planted_variant = variant
        super().__init__()

    def _reset_state(self):
        pass

    def update(self, step, metrics, samples=None):
        return [self.planted(step)] if step == self.at_step else []

    def planted(self, step):
        return Finding("entropy_collapse", "critical", step, step - 1, self.planted_variant, {}, {"planted": True},
                       "planted for the test")


def finding(variant="dapo", severity="critical", overrides=None):
    return {"detector": "entropy_collapse", "severity": severity, "step": 40, "onset_step": 30, "variant": variant,
            "config_overrides": overrides or {}, "evidence": {}, "message": "m"}


def test_recommendation_is_a_diff_without_no_op_advice():
    config = {"loss_type": "dapo", "epsilon": 0.2, "epsilon_high": None, "beta": 0.0,
              "mask_truncated_completions": False, "num_iterations": 1, "gradient_accumulation_steps": 2,
              "steps_per_generation": None}
    rec = recommend(finding(), config)
    assert rec["config_overrides"] == {"epsilon_high": 0.28, "mask_truncated_completions": True, "steps_per_generation": 8}
    assert rec["cli_flags"] == "--epsilon_high 0.28 --mask_truncated_completions True --steps_per_generation 8"
    assert rec["python"] == "GRPOConfig(..., epsilon_high=0.28, mask_truncated_completions=True, steps_per_generation=8)"
    assert any("already uses TRL's token-level 'dapo' loss" in r for r in rec["reasons"])
    assert any("on-policy" in r for r in rec["reasons"])
    assert "soft_overlong" in json.dumps(rec["extra"]) or "overlong" in json.dumps(rec["extra"])


def test_recipe_rules():
    config = {"loss_type": "grpo", "scale_rewards": "group", "beta": 0.04}
    assert recommend(finding(severity="warning"), config) is None  # switch only on a confirmed finding
    assert recommend(finding(variant=None), config) is None
    assert recommend(finding(variant="dr_grpo"), config, tried=["dr_grpo"]) is None  # never twice in a lineage
    dr = recommend(finding(variant="dr_grpo"), config)
    assert dr["config_overrides"] == {"loss_type": "dr_grpo", "scale_rewards": "none", "beta": 0.0}
    assert dr["cli_flags"] == "--loss_type dr_grpo --scale_rewards none --beta 0.0"
    moe = recommend(finding(variant="dapo"), {"gradient_accumulation_steps": 1, "num_iterations": 1}, is_moe=True)
    assert moe["variant"] == "gspo" and moe["config_overrides"]["importance_sampling_level"] == "sequence"
    already = {"loss_type": "dr_grpo", "scale_rewards": "none", "beta": 0.0}
    assert recommend(finding(variant="dr_grpo"), already) is None


def test_catalogue_is_validated_against_installed_trl():
    import trl

    cat = catalogue({"gradient_accumulation_steps": 2})
    assert set(cat) == {"dapo", "dr_grpo", "gspo"} and cat["gspo"]["steps_per_generation"] == 8
    with pytest.raises(CatalogueError, match=f"TRL {trl.__version__}.*loss_type='drgrpo'"):
        validate({"loss_type": "drgrpo"})
    with pytest.raises(CatalogueError, match="no field 'epsilon_hi'"):
        validate({"epsilon_hi": 0.3})
    with pytest.raises(CatalogueError, match="importance_sampling_level"):
        validate({"importance_sampling_level": "seq"})


@pytest.mark.parametrize("variant", ["dapo", "dr_grpo", "gspo"])
def test_every_catalogue_entry_trains_a_step_and_changes_the_loss_path(tmp_path, variant):
    import transformers

    from grpo_monitor.app.demo import build_trainer, demo_config

    transformers.logging.set_verbosity_error()
    base = demo_config(tmp_path / "t", 2, disable_tqdm=True, learning_rate=1e-3)
    overrides = catalogue(base.to_dict())[variant]
    if variant == "dapo":
        overrides["steps_per_generation"] = 4  # clip-higher acts only off-policy
    args = apply_overrides(base, overrides)
    trainer = build_trainer(args)
    assert trainer.loss_type == overrides["loss_type"]
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 2
    if variant == "gspo":
        assert trainer.importance_sampling_level == "sequence"
        assert trainer.epsilon_high == pytest.approx(4e-4)
        # Off-policy second step: the sequence-level ratio moved away from 1 and the tight bounds clip.
        assert logs[1]["clip_ratio/region_mean"] > 0
    if variant == "dr_grpo":
        assert trainer.scale_rewards == "none"
    if variant == "dapo":
        assert trainer.epsilon_high == pytest.approx(0.28) and trainer.mask_truncated_completions


def test_choose_checkpoint(tmp_path):
    for s in (5, 10, 20):
        (tmp_path / f"checkpoint-{s}").mkdir()
    assert choose_checkpoint(tmp_path, onset_step=15, step=25).endswith("checkpoint-10")
    assert choose_checkpoint(tmp_path, onset_step=3, step=25) is None
    assert choose_checkpoint(tmp_path, onset_step=15, step=25, policy="latest").endswith("checkpoint-25")
    assert choose_checkpoint(tmp_path, onset_step=15, step=25, policy="initial") is None
    with pytest.raises(ValueError, match="restart_from"):
        choose_checkpoint(tmp_path, 1, 2, policy="newest")


def _make_trainer(args):
    from grpo_monitor.app.demo import build_trainer

    return build_trainer(args)


def test_run_with_restarts_switches_to_the_variant_and_records_the_lineage(tmp_path):
    import transformers

    from grpo_monitor import run_with_restarts
    from grpo_monitor.app.demo import demo_config

    transformers.logging.set_verbosity_error()
    args = demo_config(tmp_path / "out", 6, disable_tqdm=True, save_strategy="steps", save_steps=2)
    lineage = run_with_restarts(_make_trainer, args, run_dir=tmp_path / "run", max_restarts=2,
                                detectors=[PlantedFinding(at_step=3)])
    assert [s.variant for s in lineage.segments] == [None, "dapo"]  # dapo is not tried twice
    first, second = (read_run(s.run_dir) for s in lineage.segments)
    assert [r["step"] for r in first.steps] == [1, 2, 3]
    assert first.restarts and first.restarts[0]["variant"] == "dapo" and first.restarts[0]["child_run"] == "segment-1"
    plan = read_plan(tmp_path / "run")
    assert plan.variant == "dapo" and plan.step == 3 and plan.onset_step == 2
    assert plan.resume_from is None  # no checkpoint before the onset: the initial model
    assert (tmp_path / "out" / "checkpoint-3").is_dir() and (tmp_path / "out" / "checkpoint-2").is_dir()
    cfg = second.header["config"]
    assert cfg["epsilon_high"] == 0.28 and cfg["mask_truncated_completions"] is True
    assert cfg["steps_per_generation"] == 4 and cfg["output_dir"].endswith("segment-1")
    assert second.header["parent_run"] == first.header["run_id"] and second.header["segment"] == 1
    assert second.header["tried_variants"] == ["dapo"]
    assert lineage.segments[1].global_step == 6 and lineage.segments[1].plan is None
    assert (tmp_path / "run" / PLAN_FILE).is_file() and not (tmp_path / "run" / "segment-1" / PLAN_FILE).exists()
    # The lineage reads back as one frame with its segments, and analyze reports each segment.
    import grpo_monitor as monitor

    frame = monitor.load_run(tmp_path / "run")
    assert list(frame["segment"]) == [0, 0, 0, 1, 1, 1, 1, 1, 1]
    report = monitor.analyze(tmp_path / "run")
    assert [r.source for r in report.runs] == [str(tmp_path / "run"), str(tmp_path / "run" / "segment-1")]


def test_max_restarts_zero_never_stops(tmp_path):
    import transformers

    from grpo_monitor import run_with_restarts
    from grpo_monitor.app.demo import demo_config

    transformers.logging.set_verbosity_error()
    args = demo_config(tmp_path / "out", 4, disable_tqdm=True)
    lineage = run_with_restarts(_make_trainer, args, run_dir=tmp_path / "run", max_restarts=0,
                                detectors=[PlantedFinding(at_step=2)])
    assert len(lineage) == 1 and lineage.segments[0].global_step == 4
    log = read_run(tmp_path / "run")
    assert [f["detector"] for f in log.findings if not f["detector"].startswith("config_")] == ["entropy_collapse"]
    assert not log.restarts
    assert log.recommendations and log.recommendations[0]["variant"] == "dapo"


def test_findings_reach_tensorboard_when_the_run_reports_there(tmp_path, monkeypatch):
    from tests.conftest import train_tiny

    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))
    train_tiny(tmp_path / "run", steps=3, report_to="tensorboard", attach_options={"detectors": [PlantedFinding(at_step=2)]})
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    states = [(e.step, e.value) for e in acc.Scalars("grpo_monitor/entropy_collapse")]
    assert [s for s, _ in states] == [1, 2, 3]
    assert "train/entropy" in acc.Tags()["scalars"]  # the same event file as TRL's own scalars
    texts = acc.Tensors("grpo_monitor/findings/text_summary")
    assert [t.step for t in texts] == [2]
    body = texts[0].tensor_proto.string_val[0].decode()
    assert "entropy_collapse" in body and "Recommended **dapo**" in body


def test_vllm_settings_are_validated_against_installed_trl():
    from grpo_monitor.core.catalogue import installed
    from grpo_monitor.core.recommend import IS_CORRECTION_OVERRIDES

    _, _, choices = installed()
    # read from the trainer's own branches, not written down here
    assert {"sequence_mask", "token_truncate"} <= choices["vllm_importance_sampling_mode"]
    assert choices["vllm_mode"] >= {"colocate", "server"}
    assert validate(IS_CORRECTION_OVERRIDES) == IS_CORRECTION_OVERRIDES
    with pytest.raises(CatalogueError, match="vllm_importance_sampling_mode='sequence'"):
        validate({"vllm_importance_sampling_mode": "sequence"})


def test_the_demo_summary_names_the_next_segment_beside_the_one_that_stopped(tmp_path, capsys):
    # Segments are siblings under the lineage root: segment-1's restart leads to <root>/segment-2.
    import time

    from grpo_monitor.app.demo import print_summary
    from grpo_monitor.core.runlog_writer import RunWriter

    root = tmp_path / "run"
    for n, d in enumerate([root, root / "segment-1", root / "segment-2"]):
        w = RunWriter(d)
        start = time.time() - 100 + 10 * n
        w.header(run_id=f"r{n}", start_time=start, config={}, model={"class": "Qwen3ForCausalLM", "num_parameters": 1},
                 world_size=1, parent_run=None, reward_funcs=[], segment=n)
        for s in range(1, 4):
            w.step(s, {"reward": 1.0}, start + s)
        if n < 2:
            w.write({"type": "restart", "step": 3, "variant": "dapo", "config_overrides": {}, "resume_from": None,
                     "child_run": f"segment-{n + 1}", "reasons": []})
        w.close()
    print_summary(root / "segment-1")
    out = capsys.readouterr().out
    assert f"→ {root / 'segment-2'}" in out and "segment-1/segment-2" not in out
    assert "in 3.0 s" in out  # this segment's own duration: its header's start to its last step


def test_cli_flags_parse_back_through_trl_argument_parser():
    """The flags are what a user pastes after ``python train.py``: TRL's own parser must read them back."""
    from transformers import HfArgumentParser
    from trl import GRPOConfig

    from grpo_monitor.core.recommend import cli_flags

    overrides = {"reward_weights": [1.0, 1.0, 0.0], "mask_truncated_completions": True, "beta": 0.0,
                 "loss_type": "dr_grpo"}
    argv = ["--output_dir", "/tmp/unused", "--use_cpu", "True", "--bf16", "False", *cli_flags(overrides).split()]
    (cfg,) = HfArgumentParser(GRPOConfig).parse_args_into_dataclasses(args=argv)
    assert cfg.reward_weights == [1.0, 1.0, 0.0]
    assert cfg.mask_truncated_completions is True and cfg.beta == 0.0 and cfg.loss_type == "dr_grpo"


class PlantedNoCure(PlantedFinding):
    """Raises one critical finding no configuration change cures (a reward function's bug) at a fixed step."""

    id = "reward_function_bug"
    variant = None

    def planted(self, step):
        return Finding("reward_function_bug", "critical", step, 1, None, {},
                       {"advice": "run the function on a known-correct completion", "cost": {"steps": step}},
                       "planted: correctness_reward never pays")


def test_auto_restart_stops_on_a_finding_no_change_cures_instead_of_training_on(tmp_path):
    import transformers

    from grpo_monitor import run_with_restarts
    from grpo_monitor.app.demo import demo_config

    transformers.logging.set_verbosity_error()
    args = demo_config(tmp_path / "out", 8, disable_tqdm=True)
    lineage = run_with_restarts(_make_trainer, args, run_dir=tmp_path / "run", max_restarts=2,
                                detectors=[PlantedNoCure(at_step=3)])
    # Stopped at the finding, no restart (there is nothing to restart with), rather than training on to step 8.
    assert len(lineage) == 1 and lineage.segments[0].global_step == 3 and lineage.segments[0].plan is None
    log = read_run(tmp_path / "run")
    assert not log.restarts and not (tmp_path / "run" / PLAN_FILE).exists()
    (note,) = [n for n in log.notes if n.get("event") == "stopped"]
    assert note["detector"] == "reward_function_bug" and "no configuration cure" in note["message"]
    assert note["advice"].startswith("run the function") and note["cost"]["steps"] == 3  # the cost meter's figures
    import grpo_monitor as monitor

    run = monitor.analyze(tmp_path / "run").runs[0]
    assert run.status == "stopped" and "no configuration cure" in run.status_note


ALONE = """
import sys, warnings
import transformers
from grpo_monitor import attach
from grpo_monitor.app.demo import build_trainer, demo_config
from tests.test_restart import PlantedFinding
transformers.logging.set_verbosity_error()
warnings.filterwarnings("ignore")
trainer = build_trainer(demo_config(sys.argv[1] + "/out", 6, disable_tqdm=True))
attach(trainer, sys.argv[1] + "/run", auto_restart=True, detectors=[PlantedFinding(at_step=3)])
trainer.train()
"""


def test_auto_restart_in_a_plain_script_prints_the_supervise_command(tmp_path):
    """Nothing relaunches a plain script: at the stop it says so and prints the command that would."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    script = tmp_path / "train.py"
    script.write_text(ALONE, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_MONITOR_")}
    env["PYTHONPATH"] = str(root)
    out = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, cwd=root,
                         env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "stopping at step 3 to restart with dapo" in out.stderr
    assert "nothing relaunches this script by itself" in out.stderr
    assert f"grpo-monitor supervise -- python {script} {tmp_path}" in out.stderr, out.stderr[-2000:]
    assert read_plan(tmp_path / "run").variant == "dapo"


def test_run_with_restarts_does_not_print_the_supervise_command(tmp_path, caplog):
    import logging

    import transformers

    from grpo_monitor import run_with_restarts
    from grpo_monitor.app.demo import demo_config

    transformers.logging.set_verbosity_error()
    caplog.set_level(logging.WARNING, logger="grpo_monitor")
    run_with_restarts(_make_trainer, demo_config(tmp_path / "out", 4, disable_tqdm=True), run_dir=tmp_path / "run",
                      max_restarts=1, detectors=[PlantedFinding(at_step=2)])
    said = "\n".join(r.getMessage() for r in caplog.records)
    assert "stopping at step 2 to restart with dapo" in said and "nothing relaunches" not in said
