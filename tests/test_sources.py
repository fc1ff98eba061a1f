"""Readers of training logs: every format, format detection from content, and bad input."""

from __future__ import annotations

import json
import math
import struct
import time
from pathlib import Path

import numpy as np
import pytest

from grpo_monitor.core.metrics import normalize
from grpo_monitor.core.runlog_writer import RunWriter
from grpo_monitor.readers import Source, SourceError, detect_format, load_source

from tests.conftest import SHARED

REAL_RUNS = sorted((SHARED / "real-runs").glob("*.trainer_state.json")) if (SHARED / "real-runs").is_dir() else []


def same(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return a == b or (math.isnan(a) and math.isnan(b))


def same_steps(a, b) -> bool:
    return len(a) == len(b) and all(
        sa == sb and ma.keys() == mb.keys() and all(same(ma[k], mb[k]) for k in ma) for (sa, ma), (sb, mb) in zip(a, b)
    )


def assert_one_line_error(path, fragment: str = "") -> SourceError:
    with pytest.raises(SourceError) as info:
        load_source(path)
    msg = str(info.value)
    assert "\n" not in msg and "Traceback" not in msg
    assert Path(path).name in msg, msg
    assert fragment in msg, msg
    assert isinstance(info.value, ValueError)
    return info.value


# ----------------------------------------------------------------------------- trainer_state

TRL_116_ENTRY = {
    "loss": 0.01,
    "grad_norm": 0.5,
    "learning_rate": 1e-6,
    "num_tokens": 1234.0,
    "completions/mean_length": 40.0,
    "completions/clipped_ratio": 0.0,
    "rewards/format_reward/mean": 0.5,
    "rewards/format_reward/std": 0.1,
    "rewards/correctness_reward/mean": 0.25,
    "reward": 0.75,
    "reward_std": 0.2,
    "frac_reward_zero_std": 0.0,
    "entropy": 0.4,
    "clip_ratio/region_mean": 0.0,
    "epoch": 0.1,
}


def trainer_state(history, **extra) -> dict:
    return {"global_step": len(history), "logging_steps": 1, "log_history": history, **extra}


def write_json(path: Path, obj, indent=2) -> Path:
    path.write_text(json.dumps(obj, indent=indent))
    return path


def test_trainer_state_trl_116_names_summary_eval_and_gaps(tmp_path):
    history = []
    for step in range(1, 6):
        entry = dict(TRL_116_ENTRY, step=step, entropy=0.4 - step * 0.01)
        history.append(entry)
    history[1]["entropy"] = None  # every value in the window was NaN
    history[2]["kl"] = float("nan")
    history.append({"eval_loss": 1.5, "eval_runtime": 0.2, "epoch": 0.1, "step": 5})
    history.append({"train_runtime": 12.0, "train_loss": 0.01, "total_flos": 0.0, "epoch": 0.5, "step": 5})
    path = tmp_path / "trainer_state.json"
    path.write_text(json.dumps(trainer_state(history, logging_steps=1), indent=2))  # NaN literal, as HF writes it
    src = load_source(path)
    assert isinstance(src, Source) and src.format == "trainer_state" and src.path == path
    assert [s for s, _ in src.steps] == [1, 2, 3, 4, 5]
    m1 = src.steps[0][1]
    assert m1["entropy"] == pytest.approx(0.39) and m1["rewards/format_reward/mean"] == 0.5
    assert "step" not in m1
    assert src.steps[1][1]["entropy"] is None
    assert math.isnan(src.steps[2][1]["kl"])
    last = src.steps[-1][1]
    assert last["eval_loss"] == 1.5 and last["loss"] == 0.01  # eval merged onto its step
    assert not any("train_runtime" in m for _, m in src.steps)
    assert src.context.reward_names == ["format_reward", "correctness_reward"]
    assert src.context.correctness_reward == "correctness_reward"
    assert src.context.format_reward == "format_reward"
    assert src.context.logging_steps == 1 and src.context.config == {}
    assert src.samples == {} and src.run is None and src.warnings == []


def test_trainer_state_old_trl_names(tmp_path):
    history = [
        {"completion_length": 100.0 + s, "rewards/accuracy_reward": 0.1 * s, "rewards/format_reward": 0.2,
         "reward": 0.3, "kl": 0.001, "step": 10 * s}
        for s in range(1, 4)
    ]
    src = load_source(write_json(tmp_path / "trainer_state.json", {"log_history": history}))
    assert [s for s, _ in src.steps] == [10, 20, 30]
    m = src.steps[0][1]
    assert m["completions/mean_length"] == 101.0
    assert m["rewards/accuracy_reward/mean"] == pytest.approx(0.1)
    assert "completion_length" not in m and "rewards/format_reward" not in m
    assert src.context.correctness_reward == "accuracy_reward"
    assert src.context.logging_steps == 10  # inferred from the step spacing when the file lacks it


@pytest.mark.skipif(not REAL_RUNS, reason="../shared/real-runs not present")
@pytest.mark.parametrize("path", REAL_RUNS, ids=lambda p: p.name.split(".")[0])
def test_real_trainer_states(path):
    raw = json.loads(path.read_text())
    src = load_source(path)
    entries = [e for e in raw["log_history"] if "train_runtime" not in e]
    assert src.format == "trainer_state"
    assert [s for s, _ in src.steps] == sorted({int(e["step"]) for e in entries})
    assert src.context.logging_steps == raw["logging_steps"]
    by_step = dict(src.steps)
    for e in entries:
        for key, value in e.items():
            if key != "step":
                assert same(by_step[e["step"]][normalize(key)], value), (e["step"], key)
    frame = src.frame()
    assert frame.index.name == "step" and len(frame) == len(src.steps)
    assert set(frame.columns) == set(src.metric_names())


@pytest.mark.skipif(not REAL_RUNS, reason="../shared/real-runs not present")
def test_real_old_trl_names_are_normalised():
    path = SHARED / "real-runs" / "abdo_gemma3_grpo.trainer_state.json"
    if not path.exists():
        pytest.skip("older-TRL real run not present")
    src = load_source(path)
    names = src.metric_names()
    assert "completions/mean_length" in names and "completion_length" not in names
    assert "rewards/correctness_reward_func/mean" in names
    assert src.context.correctness_reward == "correctness_reward_func"


def test_detection_from_content_not_name(tmp_path):
    state = trainer_state([dict(TRL_116_ENTRY, step=1), dict(TRL_116_ENTRY, step=2)])
    for name, text in [
        ("state.txt", json.dumps(state, indent=2)),
        ("noext", json.dumps(state)),  # one line: still a trainer_state, not JSONL
        ("bom.json", "\ufeff" + json.dumps(state, indent=1)),
    ]:
        p = tmp_path / name
        p.write_text(text, encoding="utf-8")
        assert detect_format(p) == "trainer_state"
        assert len(load_source(p).steps) == 2
    csv_noext = tmp_path / "history"
    csv_noext.write_text("_step,train/loss\n1,0.5\n2,0.4\n")
    assert load_source(csv_noext).format == "csv"
    jsonl_txt = tmp_path / "metrics.txt"
    jsonl_txt.write_text('{"step": 1, "data": {"actor/entropy": 1.0}}\n{"step": 2, "data": {"actor/entropy": 0.9}}\n')
    assert load_source(jsonl_txt).format == "jsonl"
    events_json = tmp_path / "events.json"
    write_tb_file(events_json, [(1, "train/loss", 0.5)])
    assert load_source(events_json).format == "tensorboard"


def test_checkpoint_and_output_dirs(tmp_path):
    for n in (2, 10, 4):
        hist = [dict(TRL_116_ENTRY, step=s) for s in range(1, n + 1)]
        write_json((tmp_path / f"checkpoint-{n}").mkdir() or tmp_path / f"checkpoint-{n}" / "trainer_state.json",
                   trainer_state(hist))
    src = load_source(tmp_path)
    assert src.format == "trainer_state" and len(src.steps) == 10  # the newest checkpoint, not the first by name
    assert src.path == tmp_path / "checkpoint-10" / "trainer_state.json"
    assert load_source(tmp_path / "checkpoint-4").steps[-1][0] == 4


def test_trainer_state_duplicate_steps_merge_and_warn(tmp_path):
    hist = [dict(TRL_116_ENTRY, step=1), dict(TRL_116_ENTRY, step=2, loss=0.5), dict(TRL_116_ENTRY, step=2, loss=0.7)]
    src = load_source(write_json(tmp_path / "trainer_state.json", trainer_state(hist)))
    assert dict(src.steps)[2]["loss"] == 0.7
    assert len(src.warnings) == 1 and "step 2" in src.warnings[0]


def test_numeric_string_step_is_accepted(tmp_path):
    src = load_source(write_json(tmp_path / "s.json", {"log_history": [{"step": "3", "loss": 1}, {"step": 4.0, "loss": 2}]}))
    assert src.steps == [(3, {"loss": 1.0}), (4, {"loss": 2.0})]


# ----------------------------------------------------------------------------------- run dir


def write_run(run_dir: Path, steps=5, **header) -> Path:
    w = RunWriter(run_dir)
    w.header(
        run_id="r1",
        start_time=time.time(),
        config={"logging_steps": 2, "num_generations": 4, "loss_type": "dapo"},
        model={"class": "Qwen3ForCausalLM", "num_parameters": 96000, "is_moe": False, "num_experts": None},
        world_size=1,
        parent_run=None,
        reward_funcs=["format_reward", "correctness_reward"],
        correctness_reward="correctness_reward",
        format_reward="format_reward",
        segment=0,
        **header,
    )
    for s in range(2, 2 * steps + 1, 2):
        w.step(s, {"entropy": 0.5 / s, "reward": math.nan if s == 4 else 0.1 * s, "kl": None,
                   "grad_norm": math.inf if s == 6 else 1.0}, time=time.time())
        w.samples([{"step": s, "rank": 0, "index": i, "group": i // 2, "length": 3 + i, "truncated": False,
                    "rewards": {"format_reward": 1.0, "correctness_reward": None}, "correct": None,
                    "prompt": "p", "completion": "c"} for i in range(4)])
    w.close()
    return run_dir


def test_run_dir(tmp_path):
    run_dir = write_run(tmp_path / "run")
    src = load_source(run_dir)
    assert src.format == "run_dir" and src.path == run_dir
    assert [s for s, _ in src.steps] == [2, 4, 6, 8, 10]
    m = dict(src.steps)
    assert m[2]["entropy"] == 0.25 and m[2]["kl"] is None
    assert math.isnan(m[4]["reward"]) and m[6]["grad_norm"] == math.inf
    ctx = src.context
    assert ctx.config["loss_type"] == "dapo" and ctx.logging_steps == 2
    assert ctx.model["class"] == "Qwen3ForCausalLM" and not ctx.is_moe
    assert ctx.reward_names == ["format_reward", "correctness_reward"]
    assert ctx.correctness_reward == "correctness_reward" and ctx.format_reward == "format_reward"
    assert sorted(src.samples) == [2, 4, 6, 8, 10] and len(src.samples[2]) == 4
    assert src.samples[2][1]["length"] == 4
    assert src.run is not None and src.run.header["run_id"] == "r1"
    assert load_source(run_dir / "run.jsonl").steps == src.steps
    frame = src.frame()
    assert list(frame.index) == [2, 4, 6, 8, 10] and np.isnan(frame.loc[2, "kl"])


def test_run_dir_with_lineage_reads_the_top_level_run(tmp_path):
    run_dir = write_run(tmp_path / "run", steps=3)
    write_run(run_dir / "segment-1", steps=8)
    src = load_source(run_dir)
    assert [s for s, _ in src.steps] == [2, 4, 6]


def test_run_dir_torn_last_line_is_a_warning(tmp_path):
    run_dir = write_run(tmp_path / "run", steps=3)
    with open(run_dir / "run.jsonl", "ab") as fh:
        fh.write(b'{"type":"step","step":8,"metr')
    src = load_source(run_dir)
    assert [s for s, _ in src.steps] == [2, 4, 6]
    assert any("half-written" in w for w in src.warnings)


def test_run_dir_corrupt_middle_line_costs_that_line_and_is_named(tmp_path):
    run_dir = write_run(tmp_path / "run", steps=3)
    lines = (run_dir / "run.jsonl").read_text().splitlines()
    lines[2] = lines[2][:15] + "#garbage"  # the second step record (step 4)
    (run_dir / "run.jsonl").write_text("\n".join(lines) + "\n")
    src = load_source(run_dir)
    assert [s for s, _ in src.steps] == [2, 6]
    [warning] = [w for w in src.warnings if "run.jsonl:3" in w]
    assert "corrupt record" in warning and "skipped 1 unreadable record" in warning and "\n" not in warning


# ----------------------------------------------------------------------------------- CSV


def test_wandb_history_csv(tmp_path):
    p = tmp_path / "wandb_export.csv"
    p.write_text(
        ",_step,_runtime,_timestamp,train/loss,train/entropy,train/rewards/format_reward/mean,eval/loss,train/global_step\n"
        "0,0,1.0,1700000000,0.5,0.40,0.1,,1\n"
        "1,1,2.0,1700000001,0.4,,0.2,,2\n"
        "2,2,3.0,1700000002,NaN,0.38,0.3,0.9,3\n"
        "3,3,4.0,1700000003,0.3,inf,0.4,,4\n"
    )
    src = load_source(p)
    assert src.format == "csv"
    # the trainer's own step column wins over W&B's call counter
    assert [s for s, _ in src.steps] == [1, 2, 3, 4]
    m = dict(src.steps)
    assert m[1] == {"loss": 0.5, "entropy": 0.4, "rewards/format_reward/mean": 0.1}
    assert "entropy" not in m[2]  # an empty cell is no measurement
    assert math.isnan(m[3]["loss"]) and m[3]["eval/loss"] == 0.9 and m[4]["entropy"] == math.inf
    assert not any(k.startswith("_") or k == "step" for k in src.metric_names())
    assert src.context.reward_names == ["format_reward"]
    frame = src.frame()
    assert frame.index.name == "step" and np.isnan(frame.loc[2, "entropy"])


def test_csv_step_column_variants_and_duplicates(tmp_path):
    p = tmp_path / "m.csv"
    p.write_text("step,entropy,completion_length\n1,0.5,10\n2,0.4,11\n2,,12\n\n3,0.3,13\n")
    src = load_source(p)
    assert [s for s, _ in src.steps] == [1, 2, 3]
    assert dict(src.steps)[2] == {"entropy": 0.4, "completions/mean_length": 12.0}
    assert any("step 2" in w for w in src.warnings)
    p2 = tmp_path / "g.csv"
    p2.write_text("global_step\tloss\n5\t1.0\n10\t0.5\n")
    src2 = load_source(p2)
    assert src2.steps == [(5, {"loss": 1.0}), (10, {"loss": 0.5})] and src2.context.logging_steps == 5


def test_wandb_panel_export_csv(tmp_path):
    p = tmp_path / "panel.csv"
    p.write_text(
        '"Step","grpo-run - train/entropy","grpo-run - train/entropy__MIN","grpo-run - train/entropy__MAX"\n'
        '"1","0.5","0.5","0.5"\n"2","0.4","0.4","0.4"\n'
    )
    src = load_source(p)
    assert src.steps == [(1, {"entropy": 0.5}), (2, {"entropy": 0.4})]


# ---------------------------------------------------------------------------------- JSONL


def test_verl_file_logger_jsonl(tmp_path):
    p = tmp_path / "metrics.jsonl"
    lines = [
        {"step": s, "data": {"actor/entropy": 1.0 - 0.1 * s, "response_length/mean": 100.0 + s,
                             "response_length/clip_ratio": 0.01, "critic/score/mean": 0.2 * s,
                             "actor/pg_clipfrac": 0.001, "actor/ppo_kl": 1e-4, "actor/grad_norm": 0.3,
                             "training/global_step": s, "training/epoch": 0, "timing_s/gen": 3.2}}
        for s in range(1, 5)
    ]
    p.write_text("".join(json.dumps(x) + "\n" for x in lines))
    src = load_source(p)
    assert src.format == "jsonl" and [s for s, _ in src.steps] == [1, 2, 3, 4]
    m = src.steps[0][1]
    assert m["entropy"] == pytest.approx(0.9) and m["completions/mean_length"] == 101.0
    assert m["completions/clipped_ratio"] == 0.01 and m["reward"] == pytest.approx(0.2)
    assert m["clip_ratio/region_mean"] == 0.001 and m["ppo_kl"] == 1e-4 and m["grad_norm"] == 0.3
    assert m["timing_s/gen"] == 3.2 and "step" not in m


def test_flat_and_metrics_nested_jsonl(tmp_path):
    p = tmp_path / "flat.jsonl"
    p.write_text('{"training/global_step": 2, "actor/entropy": 0.5, "note": "text dropped"}\n'
                 '{"config": {"lr": 1}}\n'
                 '{"training/global_step": 1, "actor/entropy": 0.6, "x": null}\n')
    src = load_source(p)
    assert src.steps == [(1, {"entropy": 0.6, "x": None}), (2, {"entropy": 0.5})]
    assert any("without a step" in w for w in src.warnings)
    p2 = tmp_path / "nested.jsonl"
    p2.write_text('{"step": 1, "metrics": {"train/loss": 1.0}}\n{"step": 2, "metrics": {"train/loss": "NaN"}}\n')
    src2 = load_source(p2)
    assert src2.steps[0] == (1, {"loss": 1.0}) and math.isnan(src2.steps[1][1]["loss"])


def test_jsonl_torn_last_line_and_corrupt_middle_line(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text('{"step": 1, "data": {"actor/entropy": 1.0}}\n{"step": 2, "data": {"actor/entropy": 0.9}}\n{"step": 3, "da')
    src = load_source(p)
    assert [s for s, _ in src.steps] == [1, 2] and any("half-written" in w for w in src.warnings)
    p.write_text('{"step": 1, "data": {}}\n{"step": 2, "da\n{"step": 3, "data": {}}\n')
    src = load_source(p)  # a corrupt line in the middle costs that line alone
    assert [s for s, _ in src.steps] == [1, 3] and src.meta["skipped"]["count"] == 1
    assert src.meta["skipped"]["where"][0].startswith(f"{p}:2: corrupt JSON line")
    assert any(w.startswith("skipped 1 unreadable record (the rest was read): ") and f"{p}:2:" in w for w in src.warnings)


# ---------------------------------------------------------------------------- TensorBoard


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _ld(field: int, payload: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


def write_tb_file(path: Path, events, wall0: float = 1.7e9) -> Path:
    """Events serialised by hand: (step, tag, value) with a float, or (step, tag, ('tensor', dtype, bytes))."""
    from tensorboard.summary.writer.record_writer import RecordWriter

    with open(path, "wb") as fh:
        rw = RecordWriter(fh)
        rw.write(b"\x09" + struct.pack("<d", wall0) + _ld(3, b"brain.Event:2"))
        for i, (step, tag, value) in enumerate(events):
            if isinstance(value, tuple):
                value_msg = _ld(1, tag.encode()) + _ld(8, value[2])
            else:
                value_msg = _ld(1, tag.encode()) + b"\x15" + struct.pack("<f", value)
            event = b"\x09" + struct.pack("<d", wall0 + i) + (b"\x10" + _varint(step) if step else b"")
            rw.write(event + _ld(5, _ld(1, value_msg)))
    return path


def test_tensorboard_summarywriter_file(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    w = SummaryWriter(str(tmp_path / "runs" / "Jan01_host"))
    w.add_text("args", '{"a": 1}')
    for s in range(1, 40):
        w.add_scalar("train/loss", 1.0 / s, s)
        w.add_scalar("train/entropy", float("nan") if s == 5 else 0.5, s)
        w.add_scalar("train/rewards/correct_reward/mean", 0.1, s)
        w.add_scalar("train/global_step", s, s)
        if s % 10 == 0:
            w.add_scalar("eval/loss", 2.0, s)
    w.add_histogram("weights", np.arange(20), 3)
    w.close()
    src = load_source(tmp_path)  # the output dir: event files are found at any depth
    assert src.format == "tensorboard" and [s for s, _ in src.steps] == list(range(1, 40))
    m = dict(src.steps)
    assert m[3]["loss"] == np.float32(1 / 3) and math.isnan(m[5]["entropy"])
    assert "eval/loss" in m[10] and "eval/loss" not in m[11]
    assert set(m[1]) == {"loss", "entropy", "rewards/correct_reward/mean"}
    assert src.context.correctness_reward == "correct_reward"
    event_file = next((tmp_path / "runs").rglob("*tfevents*"))
    assert same_steps(load_source(event_file).steps, src.steps)


def test_tensorboard_fast_path_equals_general_parser(tmp_path):
    from grpo_monitor.readers.tensorboard import read_tensorboard

    events = [(s, f"train/m{k}", float(s * k)) for s in range(0, 300) for k in range(5)]
    events += [(2**40, "train/m0", 1.0), (7, "a" * 200, 3.0)]  # long varints take the general path
    write_tb_file(tmp_path / "events.out.tfevents.1", events)
    fast, slow = read_tensorboard(tmp_path), read_tensorboard(tmp_path, fast=False)
    assert fast.steps == slow.steps and len(fast.steps) == 301
    assert fast.steps[-1] == (2**40, {"m0": 1.0}) and dict(fast.steps)[7]["a" * 200] == 3.0


def test_tensorboard_tensor_scalars(tmp_path):
    def tensor(dtype: int, *fields: bytes) -> tuple:
        return ("tensor", dtype, b"\x08" + _varint(dtype) + b"\x12\x00" + b"".join(fields))

    events = [
        (1, "float_val", tensor(1, _ld(5, struct.pack("<f", 0.25)))),
        (1, "double_content", tensor(2, _ld(4, struct.pack("<d", 0.125)))),
        (1, "int64_val", tensor(9, _ld(10, _varint(7)))),
        (1, "half_val", tensor(19, _ld(13, _varint(int.from_bytes(struct.pack("<e", 1.5), "little"))))),
        (1, "string", ("tensor", 7, b"\x08\x07" + _ld(8, b"hello"))),
        (1, "vector", ("tensor", 1, b"\x08\x01" + _ld(2, _ld(2, b"\x08\x03")) + _ld(5, struct.pack("<3f", 1, 2, 3)))),
    ]
    src = load_source(write_tb_file(tmp_path / "events.out.tfevents.2", events))
    assert src.steps == [(1, {"float_val": 0.25, "double_content": 0.125, "int64_val": 7.0, "half_val": 1.5})]


def test_tensorboard_two_files_duplicate_steps_later_wins(tmp_path):
    write_tb_file(tmp_path / "events.out.tfevents.1", [(s, "train/loss", 1.0) for s in range(1, 5)], wall0=1000)
    write_tb_file(tmp_path / "events.out.tfevents.0", [(s, "train/loss", 2.0) for s in range(3, 7)], wall0=2000)
    src = load_source(tmp_path)
    assert src.steps == [(1, {"loss": 1.0}), (2, {"loss": 1.0})] + [(s, {"loss": 2.0}) for s in range(3, 7)]
    assert len(src.warnings) == 1 and "more than once" in src.warnings[0]


def test_tensorboard_truncated_and_damaged_files(tmp_path):
    p = write_tb_file(tmp_path / "events.out.tfevents.1", [(s, "loss", float(s)) for s in range(1, 11)])
    data = p.read_bytes()
    p.write_bytes(data[:-7])  # a writer killed mid-record
    src = load_source(p)
    assert [s for s, _ in src.steps] == list(range(1, 10)) and "half-written" in src.warnings[0]
    starts, pos = [], 0
    while pos < len(data):
        starts.append(pos)
        pos += struct.unpack_from("<Q", data, pos)[0] + 16
    damaged = bytearray(data)
    damaged[starts[8] + 1] ^= 0xFF  # the length of the 8th scalar record no longer matches its CRC
    p.write_bytes(bytes(damaged))
    src = load_source(p)
    assert [s for s, _ in src.steps] == list(range(1, 8)) and "damaged record" in src.warnings[0]
    damaged = bytearray(data)
    damaged[starts[8] + 7] = 0xFF  # a length beyond any file offset
    p.write_bytes(bytes(damaged))
    src = load_source(p)
    assert [s for s, _ in src.steps] == list(range(1, 8)) and "damaged record" in src.warnings[0]


# --------------------------------------------------------------------------------- bad input

BAD_FILES = {
    "empty.json": (b"", "empty file"),
    "blank.csv": (b"\n\n  \n", "empty file"),
    "truncated_trainer_state.json": (b'{"log_history": [{"step": 1, "loss": 0.5}, {"step": 2, "lo', "JSON"),
    "garbage.bin": (bytes(range(256)) * 40, "binary"),
    "garbage_no_nul.dat": (bytes(range(1, 256)) * 40, "neither UTF-8 text"),
    "history_not_list.json": (b'{"log_history": {"step": 1}}', "'log_history' is dict"),
    "history_entry_not_object.json": (b'{"log_history": [1, 2]}', "log_history[0]"),
    "step_not_number.json": (b'{"log_history": [{"step": "ten", "loss": 1}]}', "'ten'"),
    "step_missing.json": (b'{"log_history": [{"loss": 1}]}', "no 'step'"),
    "step_negative.json": (b'{"log_history": [{"step": -1, "loss": 1}]}', "negative"),
    "empty_history.json": (b'{"log_history": []}', "no logged steps"),
    "only_summary.json": (b'{"log_history": [{"train_runtime": 1.0, "step": 3}]}', "no logged steps"),
    "other_json.json": (b'{\n "hello": 1\n}', "without 'log_history'"),
    "array.json": (b"[1, 2, 3]", "JSON array"),
    "nested.json": (b"[" * 100000, "JSON"),
    "csv_no_step.csv": (b"loss,entropy\n1,2\n", "step column"),
    "csv_bad_step.csv": (b"step,loss\n1,2\nabc,3\nxyz,4\n", "csv:3"),
    "csv_only_header.csv": (b"step,loss\n", "no row"),
    "jsonl_no_step.jsonl": (b'{"loss": 1}\n{"loss": 2}\n', "no line has a step"),
    "jsonl_bad_step.jsonl": (b'{"step": 1}\n{"step": "x"}\n{"step": true}\n', ":2"),
    "jsonl_not_object.jsonl": (b'{"step": 1}\n[1]\n"x"\n', ":2"),
    "latin1.csv": ("step,loss\n1,2\n\xe9\xe8,3\n\xe9,4\n".encode("latin-1"), "UTF-8"),
    "fake.tfevents.bin": (b"\x00" * 64, "not a TensorBoard event file"),
    "plain_text.log": (b"epoch 1 loss 0.5\nepoch 2 loss 0.4\n", "not a known log format"),
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_bad_files_raise_one_line_source_error(tmp_path, name):
    data, fragment = BAD_FILES[name]
    p = tmp_path / name
    p.write_bytes(data)
    assert_one_line_error(p, fragment)


def test_bad_paths_and_folders(tmp_path):
    assert_one_line_error(tmp_path / "missing.json", "no such file")
    (tmp_path / "empty_dir").mkdir()
    assert_one_line_error(tmp_path / "empty_dir", "nothing readable")
    junk = tmp_path / "junk_dir"
    (junk / "sub").mkdir(parents=True)
    (junk / "sub" / "notes.txt").write_text("hello")
    assert_one_line_error(junk, "nothing readable")
    tb = tmp_path / "tb_no_scalars"
    tb.mkdir()
    from torch.utils.tensorboard import SummaryWriter

    w = SummaryWriter(str(tb))
    w.add_text("args", "x")
    w.close()
    assert_one_line_error(tb, "no scalar summaries")
    run = tmp_path / "run_no_header"
    run.mkdir()
    (run / "run.jsonl").write_text('{"type": "step", "step": 1, "metrics": {}}\n')
    assert_one_line_error(run, "no header")
    with pytest.raises(SourceError):
        load_source(12345)  # not a path at all


def test_very_large_junk_files_fail_fast(tmp_path):
    junk = b"this is not a log line, just noise 0123456789\n" * 400_000  # ~18 MB
    cases = {
        "junk.txt": junk,
        "junk_after_json.jsonl": b'{"step": 1, "loss": 0.5}\n' + junk,
        "junk_after_header.csv": b"step,loss\n1,0.5\n" + junk,
        "junk.tfevents": junk,
    }
    for name, data in cases.items():
        p = tmp_path / name
        p.write_bytes(data)
        start = time.perf_counter()
        assert_one_line_error(p)
        assert time.perf_counter() - start < 30  # a hang, not a speed target


def test_frame_is_float_indexed_by_step(tmp_path):
    p = tmp_path / "m.csv"
    p.write_text("step,a,b\n3,1,\n1,2,5\n")
    frame = load_source(p).frame()
    assert list(frame.index) == [1, 3] and frame.index.name == "step"
    assert list(frame.columns) == ["a", "b"] and frame.dtypes.tolist() == [np.float64, np.float64]
    assert np.isnan(frame.loc[3, "b"]) and frame.loc[1, "b"] == 5.0


def test_tensorboard_same_value_relogged_in_one_file_is_not_a_conflict(tmp_path):
    # The Trainer re-logs ``epoch`` with its end-of-training summary at the last step.
    events = [(1, "train/epoch", 0.5), (2, "train/epoch", 1.0), (2, "train/train_runtime", 3.0), (2, "train/epoch", 1.0)]
    src = load_source(write_tb_file(tmp_path / "events.out.tfevents.1", events))
    assert src.steps == [(1, {"epoch": 0.5}), (2, {"epoch": 1.0})] and src.warnings == []


def test_tensorboard_alias_tags_merge_like_normalize_metrics(tmp_path):
    events = [(1, "train/completion_length", 10.0), (2, "train/completion_length", 11.0),
              (2, "train/completions/mean_length", 12.0), (3, "train/completions/mean_length", 13.0)]
    src = load_source(write_tb_file(tmp_path / "events.out.tfevents.1", events))
    m = dict(src.steps)
    assert [m[s]["completions/mean_length"] for s in (1, 2, 3)] == [10.0, 12.0, 13.0]  # canonical wins at step 2
    assert src.warnings == []


def test_tensorboard_tags_that_are_not_utf8_stay_distinct(tmp_path):
    from grpo_monitor.readers.tensorboard import read_tensorboard

    p = tmp_path / "events.out.tfevents.1"
    write_tb_file(p, [(1, "x", 1.0)])
    data = p.read_bytes().replace(b"\x0a\x01x", b"\x0a\x01\xad")
    p.write_bytes(data)  # the length CRC is unaffected; payload CRCs are not checked
    write_tb_file(tmp_path / "events.out.tfevents.2", [(2, "y", 2.0)], wall0=2e9)
    p2 = tmp_path / "events.out.tfevents.2"
    p2.write_bytes(p2.read_bytes().replace(b"\x0a\x01y", b"\x0a\x01\x81"))
    src = load_source(tmp_path)
    assert src.steps == [(1, {"\\xad": 1.0}), (2, {"\\x81": 2.0})]
    assert read_tensorboard(tmp_path, fast=False).steps == src.steps


def test_reading_foreign_logs_stays_light(tmp_path):
    """Reading any format loads neither torch, TensorBoard nor pandas (frame() is where pandas comes in;
    a CSV of millions of characters also reads through pandas)."""
    import subprocess
    import sys

    write_tb_file(tmp_path / "events.out.tfevents.1", [(1, "train/loss", 0.5)])
    (tmp_path / "m.csv").write_text("step,loss\n1,0.5\n")
    (tmp_path / "m.jsonl").write_text('{"step": 1, "data": {"actor/entropy": 1.0}}\n')
    write_json(tmp_path / "trainer_state.json", trainer_state([dict(TRL_116_ENTRY, step=1)]))
    write_run(tmp_path / "run", steps=2)
    code = (
        "import sys\nfrom grpo_monitor.readers import load_source\n"
        f"for p in ['events.out.tfevents.1', 'm.csv', 'm.jsonl', 'trainer_state.json', 'run']:\n"
        f"    load_source({str(tmp_path)!r} + '/' + p)\n"
        "print(','.join(m for m in ('torch', 'tensorboard', 'pandas', 'transformers', 'google.protobuf') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""
