"""Console logs and hand-saved JSON: TRL's printed dicts, verl's step lines, hand-written loops,
log_history lists, per-metric columns and notebook output, and the public runs kept in those forms."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_monitor.analysis.analyze import analyze
from grpo_monitor.analysis.render import render_text
from grpo_monitor.readers import SourceError, detect_format, load_source
from tests.conftest import SHARED

WILD = SHARED / "real-runs" / "wild"


def write(tmp_path: Path, name: str, data: str | bytes) -> Path:
    p = tmp_path / name
    if isinstance(data, str):
        data = data.encode("utf-8")
    p.write_bytes(data)
    return p


def trl_line(loss: float, reward: float, epoch: float, fmt: str = "str") -> str:
    d = {"loss": loss, "grad_norm": 1.5, "learning_rate": 1e-05, "reward": reward, "reward_std": 0.2,
         "completions/mean_length": 40.0, "epoch": epoch}
    if fmt == "str":  # transformers >= 5 prints every float as '%.4g'
        d = {k: f"{v:.4g}" for k, v in d.items()}
    return str(d)


# ----------------------------------------------------------------------------- TRL console


def test_trl_console_among_bars_ansi_and_warnings(tmp_path):
    parts = ["\x1b[33mWARNING: something\x1b[0m\n", "Loading checkpoint shards: 100%|##| 2/2 [00:01<00:00]\n"]
    for k in range(1, 6):
        for s in range(2 * k - 1, 2 * k + 1):
            parts.append(f"\r {s * 10}%|##        | {s}/10 [00:0{s}<00:10, 1.2it/s]")
        parts.append("\r" + " " * 40 + "\r" + trl_line(0.1 * k, 0.5 + k / 100, 0.1 * k) + "\n")
    parts.append("{'train_runtime': '12.5', 'train_samples_per_second': '3.2', 'train_loss': '0.3', 'epoch': '1'}\n")
    p = write(tmp_path, "train.log", "".join(parts))
    assert detect_format(p) == "trl_console"
    src = load_source(p)
    assert [s for s, _ in src.steps] == [2, 4, 6, 8, 10]
    assert src.meta["logging_steps"] == 2 and "progress bar" in src.meta["steps_from"]
    assert src.steps[0][1]["reward"] == pytest.approx(0.51)
    assert src.steps[-1][1]["completions/mean_length"] == 40.0
    assert "train_runtime" not in src.metric_names() and src.meta["summary"]["train_runtime"] == 12.5
    assert any("logging_steps=2" in w for w in src.warnings)


def test_trl_console_hard_wrapped_and_python_floats(tmp_path):
    lines = []
    for k in range(1, 4):
        line = trl_line(0.1 * k, 0.25 * k, 0.25 * k, fmt="float")
        lines.extend(line[i:i + 37] for i in range(0, len(line), 37))  # a terminal 37 columns wide
    p = write(tmp_path, "nohup.out", "\n".join(lines) + "\n")
    src = load_source(p, logging_steps=5)
    assert src.format == "trl_console"
    assert [s for s, _ in src.steps] == [5, 10, 15]
    assert src.steps[2][1]["reward"] == 0.75 and src.steps[0][1]["learning_rate"] == 1e-05
    assert "--logging-steps" in src.meta["steps_from"]


def test_trl_console_printed_config_wins_and_nan_np_values(tmp_path):
    text = (
        "GRPOConfig(output_dir='out', logging_steps=25, num_generations=8)\n"
        "{'loss': nan, 'reward': np.float64(0.5), 'kl': inf, 'epoch': 0.1}\n"
        "{'loss': 0.2, 'reward': np.float64(0.6), 'kl': 0.01, 'epoch': 0.2, 'note': \"it's fine\"}\n"
    )
    p = write(tmp_path, "out.txt", text)
    src = load_source(p, logging_steps=3)
    assert [s for s, _ in src.steps] == [25, 50]
    first = src.steps[0][1]
    assert math.isnan(first["loss"]) and first["reward"] == 0.5 and first["kl"] == math.inf
    assert src.meta["steps_from"] == "from the printed config"
    assert any("--logging-steps 3 ignored" in w for w in src.warnings)


def test_trl_console_epoch_against_total(tmp_path):
    # A buffered log (nohup): the dicts come out in bursts, long after the progress bar passed them.
    bar = "".join(f"\r{s}%|#| {s}/400 [00:00<00:00]" for s in range(1, 401))
    dicts = "\n".join(trl_line(0.1, 0.5, round(20 * k / 400, 2), fmt="float") for k in range(1, 21))
    text = bar + "\n" + dicts + "\n{'train_runtime': 10.0, 'train_loss': 0.1, 'epoch': 1.0}\n"
    src = load_source(write(tmp_path, "grpo.log", text))
    assert src.meta["logging_steps"] == 20 and "epoch" in src.meta["steps_from"]
    assert [s for s, _ in src.steps][:3] == [20, 40, 60]


def test_trl_console_without_hints_assumes_one_and_says_so(tmp_path):
    src = load_source(write(tmp_path, "a.log", trl_line(0.1, 0.2, 0.5) + "\n" + trl_line(0.1, 0.3, 1.0) + "\n"))
    assert [s for s, _ in src.steps] == [1, 2]
    assert "assumed" in src.meta["steps_from"]


def test_trl_console_eval_dicts_join_their_step(tmp_path):
    text = (trl_line(0.1, 0.2, 0.5, "float") + "\n{'eval_loss': 0.7, 'eval_runtime': 1.0, 'epoch': 0.5}\n"
            + trl_line(0.1, 0.3, 1.0, "float") + "\n")
    src = load_source(write(tmp_path, "a.log", text), logging_steps=10)
    assert [s for s, _ in src.steps] == [10, 20]
    assert src.steps[0][1]["eval_loss"] == 0.7


def test_config_dicts_are_not_steps(tmp_path):
    text = "ray init kwargs: {'num_cpus': None, 'runtime_env': 'x'}\n{'lr': 1e-5, 'batch': 8}\n"
    with pytest.raises(SourceError) as info:
        load_source(write(tmp_path, "run.log", text))
    assert "run.log" in str(info.value) and "\n" not in str(info.value)


# ------------------------------------------------------------------------------------ verl


def test_verl_console(tmp_path):
    lines = ["+ export X=1", "(TaskRunner pid=1) ray init kwargs: {'num_cpus': None}"]
    for s in range(1, 4):
        lines.append(f"\x1b[36m(TaskRunner pid=14462)\x1b[0m step:{s} - actor/entropy:{0.5 - s / 10} - "
                     f"critic/score/mean:np.float64({s / 4}) - response_length/mean:{100 + s} - actor/pg_loss:-1.5e-05"
                     f" - training/global_step:{s}")
    lines.append("(TaskRunner pid=14462) step:3 - val-core/gsm8k/acc/mean@1:0.75")
    src = load_source(write(tmp_path, "verl.log", "\n".join(lines) + "\n"))
    assert src.format == "verl_console"
    assert [s for s, _ in src.steps] == [1, 2, 3]
    m = src.steps[2][1]
    assert m["entropy"] == pytest.approx(0.2) and m["reward"] == 0.75 and m["completions/mean_length"] == 103
    assert m["eval_accuracy"] == 0.75 and m["loss"] == -1.5e-05  # verl's held-out accuracy, under its canonical name


def _verl_steps(n=3):
    return [f"(TaskRunner pid=7) step:{s} - actor/entropy:0.3 - critic/score/mean:0.5 - response_length/mean:19"
            f" - response_length/max:20 - response_length/clip_ratio:0.0" for s in range(1, n + 1)]


def test_verl_console_config_dump_gives_the_cap_the_group_and_the_model(tmp_path):
    # The resolved config verl pretty-prints before training, wrapped over lines behind Ray's prefix, with
    # another process's line in the middle of it.
    dump = [
        "\x1b[36m(TaskRunner pid=7)\x1b[0m {'actor_rollout_ref': {'actor': {'entropy_coeff': 0.05,",
        "\x1b[36m(TaskRunner pid=7)\x1b[0m                                  'optim': {'lr': 1e-05},",
        "\x1b[36m(WorkerDict pid=9)\x1b[0m kwargs: {'n': 1, 'max_tokens': 128}",
        "\x1b[36m(TaskRunner pid=7)\x1b[0m                                  'use_kl_loss': True, 'kl_loss_coef': 0.001},",
        "\x1b[36m(TaskRunner pid=7)\x1b[0m                        'model': {'path': '/workspace/models/Qwen2.5-7B-Instruct'},",
        "\x1b[36m(TaskRunner pid=7)\x1b[0m                        'rollout': {'n': 4, 'name': 'vllm'}},",
        "\x1b[36m(TaskRunner pid=7)\x1b[0m  'data': {'max_response_length': 128, 'train_batch_size': 2}}",
    ]
    src = load_source(write(tmp_path, "verl.log", "\n".join(dump + _verl_steps()) + "\n"))
    assert src.format == "verl_console" and [s for s, _ in src.steps] == [1, 2, 3]
    assert src.context.config == {"learning_rate": 1e-05, "entropy_coef": 0.05, "num_generations": 4,
                                  "max_completion_length": 128, "beta": 0.001, "generation_batch_size": 8}
    assert src.context.model["name_or_path"] == "/workspace/models/Qwen2.5-7B-Instruct"
    assert "model.path" in src.context.model["source"]


def test_verl_console_launch_overrides_when_no_dump_is_printed(tmp_path):
    cmd = ("+ python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo data.max_response_length=4096 "
           "data.train_batch_size=64 actor_rollout_ref.rollout.n=4 actor_rollout_ref.actor.policy_loss.loss_mode=gspo "
           "'data.train_files=[/data/train.parquet]' actor_rollout_ref.actor.use_kl_loss=false")
    src = load_source(write(tmp_path, "verl.log", "\n".join([cmd, *_verl_steps()]) + "\n"))
    assert src.context.config == {"num_generations": 4, "max_completion_length": 4096, "beta": 0.0,
                                  "importance_sampling_level": "sequence", "generation_batch_size": 256}


@pytest.mark.parametrize("n, estimator, told", [(1, "grpo", True), (1, None, True), (4, "grpo", False),
                                                (1, "reinforce_plus_plus", False)])
def test_verl_grpo_with_one_completion_per_prompt_is_told_as_reinforce_without_a_baseline(tmp_path, n, estimator, told):
    cmd = ("+ python3 -m verl.trainer.main_ppo data.max_response_length=512 data.train_batch_size=2 "
           f"actor_rollout_ref.rollout.n={n}" + (f" algorithm.adv_estimator={estimator}" if estimator else ""))
    path = write(tmp_path, "verl.log", "\n".join([cmd, *_verl_steps()]) + "\n")
    src = load_source(path)
    notes = [w for w in src.warnings if "rollout.n = 1" in w]
    assert bool(notes) is told, src.warnings
    if told:
        assert notes[0].startswith(f"{path}:") and "REINFORCE without a baseline" in notes[0]
        assert "note: " + notes[0] in render_text(analyze(str(path)))


def test_verl_console_with_a_broken_dump_reads_its_steps_without_a_config(tmp_path):
    dump = ["(TaskRunner pid=7) {'data': {'max_response_length': 128,", "(TaskRunner pid=7)  'x': <object at 0x1>}}"]
    src = load_source(write(tmp_path, "verl.log", "\n".join(dump + _verl_steps()) + "\n"))
    assert src.context.config == {} and len(src.steps) == 3


# ---------------------------------------------------------------------- hand-written loops


def test_hand_written_counters(tmp_path):
    text = "\n".join([
        "Model Params: 30M",
        *(f"Epoch:[{e}/2]({n}/3), Reward: {0.1 * n:.2f}, Fmt: 1.00, KL_ref: -0.0004, Avg Len: 12{n}"
          for e in (1, 2) for n in (1, 2, 3)),
        "  [100/444] running IoU=0.9",
    ])
    src = load_source(write(tmp_path, "r1.log", text))
    assert src.format == "console"
    assert [s for s, _ in src.steps] == [1, 2, 3, 4, 5, 6]
    names = src.metric_names()
    assert len(names) == 4 and src.steps[5][1][names[0]] == pytest.approx(0.3)
    assert any("other counters" in w for w in src.warnings)


@pytest.mark.parametrize("line", ["step 12 loss=0.5 reward=0.25", "Step: 12/500 | loss: 0.5 | reward: 0.25",
                                  "[12/500] loss=0.5, reward=0.25", "iter 12: loss 1 loss=0.5 reward=25%"])
def test_counter_spellings(tmp_path, line):
    src = load_source(write(tmp_path, "train.out", line + "\n"))
    assert src.format == "console" and src.steps[0][0] == 12
    assert src.steps[0][1]["loss"] == 0.5 and src.steps[0][1]["reward"] == 0.25


# ---------------------------------------------------------------------- JSON saved by hand


def test_log_history_list_with_and_without_steps(tmp_path):
    rows = [{"loss": 0.1, "reward": 0.5, "epoch": 0.5, "step": 4}, {"loss": 0.2, "reward": 0.6, "epoch": 1.0, "step": 8},
            {"train_runtime": 1.0, "train_loss": 0.1, "epoch": 1.0, "step": 8}]
    src = load_source(write(tmp_path, "training_log.json", json.dumps(rows, indent=2)))
    assert src.format == "log_history" and [s for s, _ in src.steps] == [4, 8]
    bare = [{k: v for k, v in r.items() if k != "step"} for r in rows]
    src = load_source(write(tmp_path, "bare.json", json.dumps(bare)), logging_steps=4)
    assert src.format == "log_history" and [s for s, _ in src.steps] == [4, 8]


def test_columns(tmp_path):
    src = load_source(write(tmp_path, "metrics.json", json.dumps({"reward": [0.1, 0.2, None], "loss": [1, 2, 3]})))
    assert src.format == "columns" and [s for s, _ in src.steps] == [1, 2, 3]
    assert src.steps[2][1] == {"reward": None, "loss": 3.0}
    src = load_source(write(tmp_path, "m2.json", json.dumps({"step": [10, 20], "reward": [0.1, 0.2]}, indent=1)))
    assert [s for s, _ in src.steps] == [10, 20]


def test_notebook_outputs_and_ipynb(tmp_path):
    text = [trl_line(0.1, 0.2, 0.5) + "\n", trl_line(0.1, 0.3, 1.0) + "\n"]
    outputs = [{"name": "stderr", "output_type": "stream", "text": ["\x1b[31mUserWarning: padding side\x1b[0m\n"]},
               {"name": "stdout", "output_type": "stream", "text": text}]
    src = load_source(write(tmp_path, "cell.json", json.dumps(outputs)), logging_steps=10)
    assert src.format == "notebook" and [s for s, _ in src.steps] == [10, 20]
    nb = {"cells": [{"cell_type": "code", "outputs": outputs}], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    src = load_source(write(tmp_path, "train.ipynb", json.dumps(nb, indent=1)), logging_steps=10)
    assert src.format == "notebook" and src.meta["console_format"] == "trl_console"


# ------------------------------------------------------------------------- CLI and errors


def test_cli_logging_steps_and_one_line_errors(tmp_path):
    log = write(tmp_path, "train.log", "".join(trl_line(0.1, 0.5, 0.1 * k) + "\n" for k in range(1, 4)))
    run = subprocess.run([sys.executable, "-m", "grpo_monitor.app.cli", "analyze", str(log), "--json", "--logging-steps", "7"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode in (0, 1, 3), run.stderr
    assert json.loads(run.stdout)["runs"][0]["steps"] == 3
    bad = write(tmp_path, "notes.txt", "just some words\nand more words\n")
    run = subprocess.run([sys.executable, "-m", "grpo_monitor.app.cli", "analyze", str(bad)], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 2 and run.stderr.count("\n") == 1 and "notes.txt" in run.stderr
    assert "Traceback" not in run.stderr


# ------------------------------------------------------------------------ the public runs

WILD_EXPECT = {
    # file: (format, first step, last step, steps, a column that must be read)
    "Ning-Guo_hotpotqa-qwen25-3b.log": ("trl_console", 20, 1860, 93, "kl"),
    "koivualeksi_sanitizer-qwen25-0p5b.log": ("trl_console", 10, 400, 40, "completions/clipped_ratio"),
    "AmitChowdary122_cybersoc-qwen25-1p5b.json": ("log_history", 2, 720, 360, "reward"),
    "toolanzyhhh1234_gspo-qwen25-3b-gsm8k.log": ("verl_console", 1, 100, 100, "entropy"),
    "Coicozoi_minimind-grpo-r1-gsm8k.log": ("console", 1, 500, 500, "reward"),
    "Rusheel86_chaos-economy-llama32.trainer_state.json": ("trainer_state", 5, 200, 40, "completions/clipped_ratio"),
    "sushantmehta-code_rlvr_qwen3_4b_v2p3.jsonl": ("jsonl", 0, 56, 57, None),
    "shamanez_exp27-dense-5e2jpho9.csv": ("csv", 0, 50, 50, "entropy"),
    "shamanez_exp27-damped-ef-qa6sll3h.csv": ("csv", 1, 67, 67, "entropy"),
    "agentscope-ai_trinity-alfworld-lora32-speed.csv": ("csv", 1, 250, 250, None),
    "HarleyCoops_dakota_qwen3_06b_primerl_trainer.csv": ("csv", 0, 998, 500, None),
    "HarleyCoops_dakota_qwen3_06b_primerl_orchestrator.csv": ("csv", 0, 999, 1000, None),
}


@pytest.mark.skipif(not WILD.is_dir(), reason="../shared/real-runs/wild is not here")
def test_every_wild_run_reads_in_its_format():
    labels = json.loads((WILD / "labels.json").read_text())
    files = {case["file"] for case in labels.values()}
    assert files <= set(WILD_EXPECT), sorted(files - set(WILD_EXPECT))
    for name in sorted(files):
        fmt, first, last, n, column = WILD_EXPECT[name]
        src = load_source(WILD / name)
        steps = [s for s, _ in src.steps]
        assert (src.format, steps[0], steps[-1], len(steps)) == (fmt, first, last, n), name
        assert column is None or column in src.metric_names(), (name, src.metric_names())
        case = next(c for c in labels.values() if c["file"] == name)
        if "logging_steps" in src.meta:  # a log whose dicts carry no step: the interval the label gives
            assert src.meta["logging_steps"] == case["logging_steps"], name


def test_resumed_run_keeps_its_steps(tmp_path):
    parts = []
    for k in range(1, 4):  # resumed from checkpoint-100: the bar starts at 100 of 200
        for s in range(100 + 10 * (k - 1) + 1, 100 + 10 * k + 1):
            parts.append(f"\r {s // 2}%|###| {s}/200 [00:01<00:02, 1.0it/s]")
        parts.append("\r" + trl_line(0.1, 0.2 * k, 0.5 + k / 20) + "\n")
    src = load_source(write(tmp_path, "resumed.log", "".join(parts)))
    assert [s for s, _ in src.steps] == [110, 120, 130] and src.meta["logging_steps"] == 10
    assert "resumed" in src.meta["steps_from"]


def test_a_log_with_two_trainings_reads_the_grpo_one(tmp_path):
    sft = "".join(str({"loss": f"{2 - k / 10:.4g}", "grad_norm": "1", "learning_rate": "1e-05", "epoch": f"{k / 5:.4g}"}) + "\n"
                  for k in range(1, 6))
    sft += str({"train_runtime": "10", "train_loss": "1.5", "epoch": "1"}) + "\n"
    grpo = "".join(trl_line(0.1, 0.1 * k, k / 3) + "\n" for k in range(1, 4))
    src = load_source(write(tmp_path, "two.log", sft + grpo), logging_steps=1)
    assert [s for s, _ in src.steps] == [1, 2, 3] and "reward" in src.metric_names()
    assert src.meta["trainings_in_log"] == 2 and any("2 trainings" in w for w in src.warnings)


def test_a_grpo_stage_after_sft_takes_its_steps_from_its_own_banner_and_bar(tmp_path):
    # Unsloth prints a banner per training; the GRPO stage logs every 5 of its 1,404 steps, its bar at k/1404
    # right before each dict.
    def banner(total):
        return f"   \\\\   /|    Num examples = 100 | Num Epochs = 2 | Total steps = {total:,}\n"

    sft = banner(200) + "".join(f"\r {s // 2}%|###| {s}/200 [00:01<00:02, 1.0it/s]" + (
        str({"loss": f"{2 - s / 100:.4g}", "grad_norm": "1", "learning_rate": "1e-05", "epoch": f"{s / 100:.4g}"}) + "\n"
        if s % 10 == 0 else "") for s in range(1, 201))
    sft += str({"train_runtime": "10", "train_loss": "1.5", "epoch": "2"}) + "\n"
    grpo = banner(1404) + "".join(f"\r  0%|          | {s}/1404 [00:37<1:34:11,  4.04s/it]" + (
        "\n" + trl_line(0.1, 0.0, 0.5) + "\n" if s % 5 == 0 else "") for s in range(1, 31))
    src = load_source(write(tmp_path, "sft_then_grpo.log", sft + grpo))
    assert [s for s, _ in src.steps] == [5, 10, 15, 20, 25, 30] and src.meta["logging_steps"] == 5
    assert src.meta["steps_from"].startswith("from the progress bar")


def test_python_api_takes_logging_steps(tmp_path):
    import grpo_monitor as monitor

    log = write(tmp_path, "train.log", "".join(trl_line(0.1, 0.5, 0.1 * k) + "\n" for k in range(1, 4)))
    assert list(monitor.load_run(log, logging_steps=5).index) == [5, 10, 15]
    report = monitor.analyze(log, monitor.AnalyzeOptions(logging_steps=5))
    assert report.runs[0].steps == 3 and any("logging_steps=5" in w for w in report.runs[0].warnings)
