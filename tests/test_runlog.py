import json
import math

import pytest

from grpo_monitor.core.runlog import RUN_FILE, RunLogError, RunWriter, load_run, read_run, samples_file


def write_run(path, steps=3):
    w = RunWriter(path)
    w.header(run_id="r1", config={"max_completion_length": 16}, model={"is_moe": False})
    for s in range(1, steps + 1):
        w.step(s, {"entropy": 1.0 / s, "reward": None, "loss": float("nan"), "grad_norm": float("inf")}, time=100.0 + s)
    w.samples([{"step": 1, "rank": 0, "index": 0, "group": 0, "length": 5, "truncated": False,
                "rewards": {"f": 1.0, "g": None}, "correct": True, "prompt": "p", "completion": "c"}])
    w.write({"type": "finding", "detector": "non_finite", "severity": "critical", "step": 2, "onset_step": 2,
             "variant": None, "config_overrides": {}, "evidence": {}, "message": "m"})
    w.close()


def test_round_trip_keeps_every_record_and_non_finite_values(tmp_path):
    write_run(tmp_path)
    log = read_run(tmp_path)
    assert log.header["run_id"] == "r1" and log.header["schema"] == 1
    assert [r["step"] for r in log.steps] == [1, 2, 3]
    m = log.steps[1]["metrics"]
    assert m["entropy"] == 0.5 and m["reward"] is None
    assert math.isnan(m["loss"]) and m["grad_norm"] == math.inf
    assert log.samples[0]["rewards"] == {"f": 1.0, "g": None}
    assert log.findings[0]["detector"] == "non_finite"
    frame = load_run(tmp_path)
    assert list(frame.index) == [1, 2, 3] and frame.index.name == "step"
    assert frame.loc[2, "entropy"] == 0.5 and math.isnan(frame.loc[2, "reward"])


def test_files_are_strict_json_lines(tmp_path):
    write_run(tmp_path)
    for name in (RUN_FILE, samples_file(0)):
        for line in (tmp_path / name).read_text().splitlines():
            json.loads(line, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))


def test_torn_last_line_is_skipped_and_reported(tmp_path):
    write_run(tmp_path)
    with open(tmp_path / RUN_FILE, "ab") as fh:
        fh.write(b'{"type":"step","step":4,"metr')
    log = read_run(tmp_path)
    assert [r["step"] for r in log.steps] == [1, 2, 3]
    assert len(log.findings) == 1
    assert len(log.warnings) == 1 and "half-written last line" in log.warnings[0] and RUN_FILE in log.warnings[0]


def test_writer_reopening_after_a_crash_cuts_the_torn_record(tmp_path):
    write_run(tmp_path)
    with open(tmp_path / RUN_FILE, "ab") as fh:
        fh.write(b'{"type":"step","st')
    w = RunWriter(tmp_path)
    assert w._run.truncated_bytes == len(b'{"type":"step","st')
    w.step(9, {"entropy": 0.1}, time=1.0)
    w.close()
    log = read_run(tmp_path)  # every complete record kept, the torn one gone, no corrupt line
    assert [r["step"] for r in log.steps] == [1, 2, 3, 9] and not log.warnings


def test_corrupt_middle_line_names_file_and_line(tmp_path):
    write_run(tmp_path)
    lines = (tmp_path / RUN_FILE).read_text().splitlines()
    lines[2] = "{not json"
    (tmp_path / RUN_FILE).write_text("\n".join(lines) + "\n")
    with pytest.raises(RunLogError) as err:
        read_run(tmp_path)
    msg = str(err.value)
    assert f"{RUN_FILE}:3:" in msg and "\n" not in msg


def test_missing_and_foreign_directories_are_clear_errors(tmp_path):
    with pytest.raises(RunLogError, match="no such file"):
        read_run(tmp_path / "nope")
    with pytest.raises(RunLogError, match="not a grpo-monitor run directory"):
        read_run(tmp_path)


def test_samples_of_every_rank_are_merged(tmp_path):
    write_run(tmp_path)
    w1 = RunWriter(tmp_path, rank=1)
    w1.samples([{"step": 1, "rank": 1, "index": 8, "group": 1, "length": 3, "truncated": True,
                 "rewards": {"f": 0.0}, "correct": False, "prompt": "p", "completion": "c"}])
    w1.write({"type": "step", "step": 99, "metrics": {}})  # non-zero ranks never write the shared log
    w1.close()
    log = read_run(tmp_path)
    assert sorted(s["rank"] for s in log.samples) == [0, 1]
    assert 99 not in [r["step"] for r in log.steps]


def test_resumed_steps_keep_the_latest_record(tmp_path):
    write_run(tmp_path)
    w = RunWriter(tmp_path)
    w.header(run_id="r1-resumed")
    w.step(3, {"entropy": 7.0}, time=1.0)
    w.close()
    log = read_run(tmp_path)
    assert log.header["run_id"] == "r1"
    assert [r["step"] for r in log.steps] == [1, 2, 3] and log.steps[-1]["metrics"]["entropy"] == 7.0
