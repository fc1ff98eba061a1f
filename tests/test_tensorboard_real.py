"""TensorBoard logs written by real tiny GRPOTrainer runs, read back and checked against the trainer's own log_history."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import pytest

from grpo_monitor.core.metrics import SUMMARY_KEYS, normalize
from grpo_monitor.readers import load_source

pytest.importorskip("trl")
pytest.importorskip("tensorboard")


def grpo_trainer(output_dir: Path, max_steps: int):
    import transformers
    from trl import GRPOConfig, GRPOTrainer

    from grpo_monitor.fixtures.tiny import REWARD_FUNCS, build_dataset, build_model, build_tokenizer

    transformers.logging.set_verbosity_error()
    warnings.filterwarnings("ignore")
    args = GRPOConfig(
        output_dir=str(output_dir),
        bf16=False,
        use_cpu=True,
        use_vllm=False,
        logging_steps=1,
        max_completion_length=16,
        num_generations=4,
        per_device_train_batch_size=4,
        max_steps=max_steps,
        report_to=["tensorboard"],
        save_steps=2,
        learning_rate=3e-4,
        seed=7,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    return GRPOTrainer(
        model=build_model(),
        reward_funcs=list(REWARD_FUNCS),
        args=args,
        train_dataset=build_dataset(32),
        processing_class=build_tokenizer(),
    )


def logged_steps(log_history: list[dict]) -> dict[int, dict]:
    """What TensorBoardCallback writes as scalars: numeric values of every non-summary entry."""
    out: dict[int, dict] = {}
    for entry in log_history:
        if "train_runtime" in entry:
            continue
        metrics = out.setdefault(entry["step"], {})
        for key, value in entry.items():
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                metrics[normalize(key)] = value
    return out


def assert_matches(src, expected: dict[int, dict]) -> None:
    got = dict(src.steps)
    assert sorted(got) == sorted(expected)
    for step, metrics in expected.items():
        assert set(got[step]) == set(metrics), step
        for name, value in metrics.items():
            want = float(np.float32(value))  # simple_value is a 32-bit float
            assert got[step][name] == want or (math.isnan(want) and math.isnan(got[step][name])), (step, name)


@pytest.fixture(scope="module")
def single_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("single")
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("TENSORBOARD_LOGGING_DIR", raising=False)
        trainer = grpo_trainer(out, max_steps=3)
        trainer.train()
    return out, trainer.state.log_history


@pytest.fixture(scope="module")
def resumed_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("resumed")
    tb_dir = out / "tb"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TENSORBOARD_LOGGING_DIR", str(tb_dir))
        first = grpo_trainer(out, max_steps=3)
        first.train()
        second = grpo_trainer(out, max_steps=4)
        second.train(resume_from_checkpoint=str(out / "checkpoint-2"))
    return tb_dir, first.state.log_history, second.state.log_history


def test_single_run_matches_log_history(single_run):
    out, history = single_run
    event_files = list((out / "runs").rglob("*tfevents*"))
    assert event_files
    src = load_source(out)  # the output_dir: runs/<date>_<host>/ is found, checkpoints are not preferred
    assert src.format == "tensorboard" and src.warnings == []
    expected = logged_steps(history)
    assert sorted(expected) == [1, 2, 3]
    assert_matches(src, expected)
    assert not SUMMARY_KEYS & set(src.metric_names())
    assert {"entropy", "reward", "completions/mean_length", "rewards/format_reward/mean"} <= set(src.metric_names())
    assert src.context.reward_names == ["format_reward", "correctness_reward"]
    assert src.context.correctness_reward == "correctness_reward"
    scalar_file = max(event_files, key=lambda p: p.stat().st_size)
    assert load_source(scalar_file).steps == src.steps


def test_single_run_agrees_with_tbparse_and_checkpoint(single_run):
    tbparse = pytest.importorskip("tbparse")
    out, history = single_run
    src = load_source(out / "runs")
    df = tbparse.SummaryReader(str(out / "runs")).scalars
    theirs = {}
    for step, tag, value in df[["step", "tag", "value"]].itertuples(index=False):
        name = normalize(tag)
        if name != "step" and name not in SUMMARY_KEYS:
            theirs.setdefault(int(step), {})[name] = float(value)
    assert dict(src.steps).keys() == theirs.keys()
    for step, metrics in src.steps:
        assert metrics == pytest.approx(theirs[step], nan_ok=True)
    ckpt = load_source(out / "checkpoint-2")
    assert ckpt.format == "trainer_state" and [s for s, _ in ckpt.steps] == [1, 2]
    assert ckpt.steps[0][1]["entropy"] == pytest.approx(dict(src.steps)[1]["entropy"], rel=1e-6)


def test_resumed_run_two_event_files_later_wins(resumed_run):
    tb_dir, first, second = resumed_run
    assert len(list(tb_dir.rglob("*tfevents*"))) >= 2
    src = load_source(tb_dir)
    assert [s for s, _ in src.steps] == [1, 2, 3, 4]
    assert len([w for w in src.warnings if "more than once" in w]) == 1
    # The resumed run re-logged step 3; its record is the one kept.
    before, after = logged_steps(first), logged_steps(second)
    assert before[3]["step_time"] != after[3]["step_time"]
    assert_matches(src, {**{s: before[s] for s in (1, 2)}, **{s: after[s] for s in (3, 4)}})
