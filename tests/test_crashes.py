"""The crash catalogue: each cause recognised on the exception text its library prints, as reported in the
public thread cited beside it; a console log ending in one is analysed with a critical ``crash`` finding that
names the cause, the line and the fix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_monitor.core.crashes import CATALOGUE, crash, read_crash

ROOT = Path(__file__).resolve().parents[1]

# Each cause: the end of a traceback as the failing library prints it, in the form the cited thread shows.
TRACEBACKS = {
    "vllm_kv_cache_too_small": """\
  File "/usr/local/lib/python3.10/dist-packages/vllm/engine/llm_engine.py", line 309, in from_engine_args
    engine = cls(*engine_configs,
ValueError: The model's max seq len (32768) is larger than the maximum number of tokens that can be stored in KV cache (7344). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.
""",
    "vllm_no_cache_memory": """\
ERROR 10-25 13:08:43 [core.py:708]   File "/opt/conda/lib/python3.13/site-packages/vllm/v1/core/kv_cache_utils.py", line 699, in check_enough_kv_cache_memory
ERROR 10-25 13:08:43 [core.py:708]     raise ValueError("No available memory for the cache blocks. "
ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine.
Traceback (most recent call last):
  File "/home/user/.venv/lib/python3.12/site-packages/vllm/v1/engine/utils.py", line 759, in wait_for_engine_startup
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore_0': 1}
""",
    "cuda_oom_generation": """\
  File "/opt/conda/lib/python3.11/site-packages/trl/trainer/grpo_trainer.py", line 1410, in _generate_and_score_completions
    prompt_completion_ids = unwrapped_model.generate(
  File "/opt/conda/lib/python3.11/site-packages/transformers/generation/utils.py", line 2465, in generate
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 130.00 MiB. GPU 0 has a total capacity of 79.10 GiB of which 12.81 MiB is free. Of the allocated memory 10.47 GiB is allocated by PyTorch, and 93.52 MiB is reserved by PyTorch but unallocated.
""",
    "cuda_oom_training": """\
  File "/opt/conda/lib/python3.11/site-packages/transformers/trainer.py", line 3791, in training_step
    self.accelerator.backward(loss, **kwargs)
  File "/opt/conda/lib/python3.11/site-packages/torch/autograd/__init__.py", line 347, in backward
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 296.00 MiB. GPU 0 has a total capacity of 44.40 GiB of which 102.31 MiB is free. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.
""",
    "nccl_watchdog_timeout": """\
[rank2]:[E424 01:17:25.031978332 ProcessGroupNCCL.cpp:1895] [PG ID 0 PG GUID 0(default_pg) Rank 2] Process group watchdog thread terminated with exception: [Rank 2] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=4, OpType=BROADCAST, NumelIn=112, NumelOut=112, Timeout(ms)=1800000) ran for 1800010 milliseconds before timing out.
Exception raised from checkTimeout at /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:632 (most recent call first):
""",
    "dataloader_worker_killed": """\
  File "/usr/lib/python3.8/site-packages/torch/utils/data/_utils/signal_handling.py", line 66, in handler
    _error_if_any_worker_fails()
RuntimeError: DataLoader worker (pid 1817) is killed by signal: Killed.
""",
    "disk_full_on_save": """\
  File "/home/ma-user/anaconda3/envs/myenv/lib/python3.9/site-packages/torch/serialization.py", line 650, in _save
    zip_file.write_record(name, storage.data_ptr(), num_bytes)
RuntimeError: [enforce fail at inline_container.cc:445] . PytorchStreamWriter failed writing file data/176: file write failed
""",
    "non_finite_sampling": """\
  File "/opt/conda/lib/python3.10/site-packages/transformers/generation/utils.py", line 2655, in sample
    next_tokens = torch.multinomial(probs, num_samples=1).squeeze(1)
RuntimeError: probability tensor contains either `inf`, `nan` or element < 0
""",
    "chat_template_missing": """\
[rank0]:   File "/home/ken/miniconda3/envs/openr1/lib/python3.11/site-packages/transformers/tokenization_utils_base.py", line 1617, in apply_chat_template
[rank0]: ValueError: Cannot use chat template functions because tokenizer.chat_template is not set and no template argument was passed! For information about writing templates and setting the tokenizer.chat_template attribute, please see the documentation at https://huggingface.co/docs/transformers/main/en/chat_templating
""",
    "hub_unreachable": """\
huggingface_hub.errors.LocalEntryNotFoundError: An error happened while trying to locate the file on the Hub and we cannot find the requested files in the local cache. Please check your connection and try again or make sure your Internet connection is on.

The above exception was the direct cause of the following exception:

OSError: We couldn't connect to 'https://huggingface.co' to load this file, couldn't find it in the cached files and it looks like Qwen/Qwen2.5-0.5B-Instruct is not the path to a directory containing a file named config.json.
""",
    "fsdp_mixed_dtypes": """\
[rank0]:   File "/root/miniconda3/lib/python3.12/site-packages/torch/distributed/fsdp/_flat_param.py", line 770, in _validate_tensors_to_flatten
[rank0]:     raise ValueError(
[rank0]: ValueError: Must flatten tensors with uniform dtype but got torch.bfloat16 and torch.float32
""",
    "fp16_loss_scale_at_minimum": """\
  File "/usr/local/lib/python3.10/site-packages/deepspeed/runtime/fp16/loss_scaler.py", line 183, in update_scale
    raise Exception(
Exception: Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.
""",
    "non_finite_gradient": """\
  File "/usr/local/lib/python3.7/site-packages/torch/functional.py", line 1336, in norm
    return _VF.frobenius_norm(input, _dim, keepdim=keepdim)
RuntimeError: Function 'MulBackward0' returned nan values in its 0th output.
""",
    "deepspeed_batch_mismatch": """\
[rank0]:   File "/usr/local/lib/python3.10/site-packages/deepspeed/runtime/config.py", line 891, in _batch_assertion
[rank0]:     assert train_batch == micro_batch * grad_acc * self.world_size, (
[rank0]: AssertionError: Check batch related parameters. train_batch_size is not equal to micro_batch_per_gpu * gradient_acc_step * world_size 8 != 2 * 1 * 1 
""",
    "vllm_engine_failed": """\
(APIServer pid=1179246)   File "/home/ss345/vllm/vllm/v1/engine/utils.py", line 759, in wait_for_engine_startup
(APIServer pid=1179246)     raise RuntimeError("Engine core initialization failed. "
(APIServer pid=1179246) RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
""",
}
# The vLLM engine's own reason comes first in its log; the generic line after it does not hide it.
EXPECTED = {"vllm_no_cache_memory": "No available memory for the cache blocks"}


def trl_log(n_steps: int = 30, tail: str = "") -> str:
    lines = [f"{{'loss': {0.01 * i:.4f}, 'grad_norm': 0.5, 'learning_rate': 1e-06, 'reward': {0.2 + 0.01 * i:.3f}, "
             f"'reward_std': 0.3, 'completion_length': {100 + i:.1f}, 'kl': 0.001, 'epoch': {i / 100:.2f}}}"
             for i in range(1, n_steps + 1)]
    return "\n".join(lines) + "\nTraceback (most recent call last):\n  File \"train_grpo.py\", line 88, in <module>\n" \
        "    trainer.train()\n" + tail


def test_the_catalogue_has_a_cited_cause_and_fix_for_each_of_its_patterns():
    assert len(CATALOGUE) >= 12 and set(TRACEBACKS) == {c.id for c in CATALOGUE}
    for c in CATALOGUE:
        assert c.cite.startswith("https://github.com/") and c.cause and c.fix


@pytest.mark.parametrize("crash_id", sorted(TRACEBACKS))
def test_each_cause_is_read_from_its_traceback(crash_id):
    text = trl_log(tail=TRACEBACKS[crash_id])
    m = read_crash(text)
    assert m is not None and m.crash.id == crash_id, (crash_id, m and m.crash.id)
    shown = EXPECTED.get(crash_id)
    assert text.splitlines()[m.line_no - 1].strip()[:300] == m.line and (shown is None or shown in m.line)


def test_a_log_that_only_mentions_errors_or_trains_on_after_one_is_no_crash(tmp_path):
    assert read_crash(trl_log(tail="KeyboardInterrupt\n")) is None
    assert read_crash("{'loss': 0.1, 'reward': 0.4}\nreward error bars: none; out of memory? no\n") is None
    assert read_crash("x" * 200_000) is None
    # A recovered OOM (the trainer skipped the batch and logged on) is no crash of the run.
    path = tmp_path / "recovered.log"
    path.write_text(trl_log(tail=TRACEBACKS["cuda_oom_training"]).replace("Traceback (most recent call last):", "warning:")
                    + trl_log(5).split("\nTraceback")[0] + "\n")
    out = analyze(path, "--json")
    assert not [f for f in json.loads(out.stdout)["runs"][0]["findings"] if f["detector"] == "crash"]


def test_only_the_end_of_a_huge_log_is_read():
    assert read_crash(TRACEBACKS["dataloader_worker_killed"] + "{'loss': 0.1}\n" * 20_000) is None


def analyze(*args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_MONITOR_")}
    return subprocess.run([sys.executable, "-m", "grpo_monitor", "analyze", *map(str, args)], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=300)


def test_analyze_names_every_catalogued_crash_a_console_log_ends_in(tmp_path):
    paths = {}
    for crash_id, tail in TRACEBACKS.items():
        paths[crash_id] = tmp_path / f"{crash_id}.log"
        paths[crash_id].write_text(trl_log(tail=tail), encoding="utf-8")
    page = tmp_path / "report.html"
    out = analyze(*paths.values(), "--json", "--html", page)
    assert out.returncode == 1, out.stderr[-2000:]
    runs = json.loads(out.stdout)["runs"]
    html = page.read_text(encoding="utf-8")
    assert len(runs) == len(TRACEBACKS)
    for run, (crash_id, path) in zip(runs, paths.items()):
        found = [f for f in run["findings"] if f["detector"] == "crash"]
        line_no = read_crash(path.read_text()).line_no
        assert [f["evidence"]["cause"] for f in found] == [crash_id], (crash_id, found)
        assert found[0]["evidence"]["at"] == f"{path}:{line_no}" and run["verdict"] == "critical"
        assert f"The run crashed ({crash_id})" in html and crash(crash_id).cite in html
        # A console log with no config: the generic memory levers, no ladder claimed to fit this run.
        assert "ladder" not in found[0]["evidence"]


def test_watch_of_a_console_log_ending_in_a_crash_shows_the_finding_analyze_gives(tmp_path):
    from grpo_monitor.app.dashboard.app import replay_source

    path = tmp_path / "train.log"
    path.write_text(trl_log(tail=TRACEBACKS["dataloader_worker_killed"]), encoding="utf-8")
    shown = [r for r in replay_source(path) if r.get("type") == "finding" and r.get("detector") == "crash"]
    [found] = [f for f in json.loads(analyze(path, "--json").stdout)["runs"][0]["findings"] if f["detector"] == "crash"]
    assert [r["message"] for r in shown] == [found["message"]]


@pytest.mark.parametrize("crash_id", ["cuda_oom_generation", "nccl_watchdog_timeout", "disk_full_on_save"])
def test_analyze_of_a_console_log_ending_in_a_crash_names_it(tmp_path, crash_id):
    path = tmp_path / "train.log"
    path.write_text(trl_log(tail=TRACEBACKS[crash_id]), encoding="utf-8")
    line_no = read_crash(path.read_text()).line_no
    text = analyze(path)
    assert text.returncode == 1, text.stderr[-2000:]
    assert f"[critical] crash: The run crashed ({crash_id}): {crash(crash_id).cause}" in text.stdout
    assert f"Read at {path}:{line_no}:" in text.stdout and f"Fix: {crash(crash_id).fix}" in text.stdout
    doc = json.loads(analyze(path, "--json").stdout)["runs"][0]
    found = [f for f in doc["findings"] if f["detector"] == "crash"]
    assert len(found) == 1 and found[0]["severity"] == "critical" and doc["verdict"] == "critical"
    ev = found[0]["evidence"]
    assert ev["cause"] == crash_id and ev["at"] == f"{path}:{line_no}" and ev["source"] == crash(crash_id).cite
    assert ev["line"] == path.read_text().splitlines()[line_no - 1].strip()[:300]
    assert found[0]["step"] == 30


OOM_IN_TRAINING = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB of which "
                   "1.19 GiB is free. Of the allocated memory 75.02 GiB is allocated by PyTorch.")


def test_a_run_that_crashes_under_the_monitor_gets_the_fix_sized_from_its_own_config(tmp_path):
    """A real GRPOTrainer with the monitor attached stops at step 4 with torch's out-of-memory error. No GPU
    runs here, so the error is raised by a callback with the text torch prints (the one stand-in); the rest is
    the real path: the run log's note records the crash read from the exception, and analyze of the run
    directory names it with the memory ladder for the settings its header recorded."""
    import torch
    import transformers
    from transformers import TrainerCallback

    from grpo_monitor import attach
    from grpo_monitor.app.demo import build_trainer, demo_config
    from grpo_monitor.core.runlog import read_run
    from grpo_monitor.detectors.memory_pressure import ladder_text, memory_ladder

    class OutOfMemoryAt4(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 4:
                raise torch.OutOfMemoryError(OOM_IN_TRAINING)

    transformers.logging.set_verbosity_error()
    trainer = build_trainer(demo_config(str(tmp_path / "trainer"), 8, disable_tqdm=True))
    trainer.add_callback(OutOfMemoryAt4())
    run_dir = tmp_path / "grpo-monitor"
    attach(trainer, str(run_dir))
    with pytest.raises(torch.OutOfMemoryError):
        trainer.train()
    log = read_run(run_dir)
    [note] = [n for n in log.notes if n.get("event") == "interrupted"]
    assert note["crash"]["id"] == "cuda_oom_training" and note["crash"]["line"].endswith(OOM_IN_TRAINING)
    ladder = memory_ladder(log.header["config"])
    assert [r["remedy"] for r in ladder][:1] == ["gradient_checkpointing"]
    [batch] = [r["overrides"] for r in ladder if r["remedy"] == "smaller_micro_batch"]
    assert batch["per_device_train_batch_size"] == 4 and batch["gradient_accumulation_steps"] == 2  # the demo's 8 x 1

    out = analyze(run_dir, "--json")
    assert out.returncode == 1, out.stderr[-2000:]
    [found] = [f for f in json.loads(out.stdout)["runs"][0]["findings"] if f["detector"] == "crash"]
    assert found["severity"] == "critical" and found["evidence"]["cause"] == "cuda_oom_training"
    assert found["evidence"]["at"] == "the OutOfMemoryError that stopped the run after step 3"
    assert found["evidence"]["ladder"] == ladder
    # watch: the dashboard's model, fed the run log as its tailer feeds it, shows the same finding.
    from grpo_monitor.app.dashboard.model import RunModel

    model = RunModel()
    model.ingest(json.loads(line) for line in (run_dir / "run.jsonl").read_text().splitlines())
    [live] = [f for f in model.findings if f.get("detector") == "crash"]
    assert live["message"] == found["message"] and live["step"] == found["step"] == 3
    text = analyze(run_dir).stdout
    assert f"for this run's settings, one rung at a time: {ladder_text(ladder)}" in text
    assert "per_device_train_batch_size=4" in text and "gradient_accumulation_steps=2" in text
