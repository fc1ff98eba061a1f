import json
import math

import pytest

from grpo_monitor.core.runlog import RUN_FILE, RunLogError, read_run, run_frame, samples_file
from grpo_monitor.core.runlog_writer import RunWriter


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
    frame = run_frame(tmp_path)
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


def test_corrupt_middle_line_costs_that_line_alone_and_is_named(tmp_path):
    write_run(tmp_path)
    lines = (tmp_path / RUN_FILE).read_text().splitlines()
    lines[2] = "{not json"  # step 2
    (tmp_path / RUN_FILE).write_text("\n".join(lines) + "\n")
    log = read_run(tmp_path)
    assert [r["step"] for r in log.steps] == [1, 3] and len(log.findings) == 1
    assert log.skipped.count == 1 and log.skipped.where[0].startswith(f"{tmp_path / RUN_FILE}:3: corrupt record")
    assert any(f"{RUN_FILE}:3:" in w and "skipped 1 unreadable record" in w and "\n" not in w for w in log.warnings)


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


# -- one bad record costs that record --------------------------------------------------------

import subprocess  # noqa: E402
import sys  # noqa: E402
import textwrap  # noqa: E402

from grpo_monitor import analyze  # noqa: E402
from grpo_monitor.core import runlog  # noqa: E402
from grpo_monitor.core.sample_index import SampleIndex
from grpo_monitor.core.runlog import dumps, parse_line  # noqa: E402
from grpo_monitor.readers import load_source  # noqa: E402

STEPS = 12


def healthy_run(path, steps=STEPS, samples=4):
    w = RunWriter(path)
    w.header(run_id="r", config={"logging_steps": 1, "max_steps": steps}, model={"is_moe": False})
    for s in range(1, steps + 1):
        w.step(s, {"entropy": 1.0 - s / 100, "reward": s / 100, "completions/mean_length": 10.0 + s}, time=100.0 + s)
        w.samples([{"step": s, "rank": 0, "index": i, "group": i // 2, "length": 5 + i, "truncated": False,
                    "rewards": {"f": float(i % 2)}, "correct": bool(i % 2)} for i in range(samples)])
    w.write({"type": "summary", "step": steps, "metrics": {"train_runtime": 1.0}})
    w.close()
    return path


def replace_line(path, lineno, line: bytes):
    lines = path.read_bytes().split(b"\n")
    lines[lineno - 1] = line
    path.write_bytes(b"\n".join(lines))


def line_of(path, prefix: bytes) -> int:
    return next(i for i, line in enumerate(path.read_bytes().split(b"\n"), 1) if line.startswith(prefix))


DEEP = "[" * 1100 + "]" * 1100
BAD_STEP_LINES = {
    "torn": b'{"type":"step","step":5,"time":105.0,"metr',
    "beyond_4300_digits": b'{"type":"step","step":5,"time":105.0,"metrics":{"entropy":' + b"9" * 5000 + b"}}",
    "step_1e999": b'{"type":"step","step":1e999,"time":105.0,"metrics":{"entropy":0.9}}',
    "nested_1100": b'{"type":"step","step":5,"time":105.0,"metrics":{"entropy":' + DEEP.encode() + b"}}",
    # Deeper than a record may be, not deeper than the parser takes: the parse alone would keep it.
    "nested_150": b'{"type":"step","step":5,"metrics":{"x":' + b"[" * 149 + b"]" * 149 + b"}}",
    "nul_bytes": b"\x00" * 5000,
}


@pytest.mark.parametrize("kind", sorted(BAD_STEP_LINES))
def test_a_bad_step_line_costs_that_step_alone(tmp_path, kind):
    assert getattr(runlog, "MAX_DEPTH", 100) < 150
    run = healthy_run(tmp_path / "run")
    lineno = line_of(run / RUN_FILE, b'{"type":"step","step":5,')
    replace_line(run / RUN_FILE, lineno, BAD_STEP_LINES[kind])
    report = analyze(run)
    [r] = report.runs
    assert r.steps == STEPS - 1 and [s for s, _ in r.series["entropy"]] == [s for s in range(1, STEPS + 1) if s != 5]
    assert r.skipped == {"count": 1, "where": [r.skipped["where"][0]]}
    assert r.skipped["where"][0].startswith(f"{run / RUN_FILE}:{lineno}: ")
    doc = r.to_dict()
    assert doc["skipped_records"]["count"] == 1 and any(f"{RUN_FILE}:{lineno}:" in n for n in doc["notes"])


def test_1e999_as_a_metric_value_is_the_infinity_it_stands_for(tmp_path):
    """Not a corrupt record: JSON's 1e999 is a number beyond every float, read as inf and flagged."""
    run = healthy_run(tmp_path / "run")
    lineno = line_of(run / RUN_FILE, b'{"type":"step","step":5,')
    replace_line(run / RUN_FILE, lineno, b'{"type":"step","step":5,"time":105.0,"metrics":{"entropy":1e999,"reward":' + b"9" * 400 + b"}}")
    [r] = analyze(run).runs
    assert r.steps == STEPS and r.skipped is None
    assert any(f.detector == "non_finite" and f.step == 5 for f in r.findings)


def test_a_deeply_nested_sample_costs_that_sample_alone(tmp_path):
    run = healthy_run(tmp_path / "run")
    samples = run / samples_file(0)
    lineno = line_of(samples, b'{"type":"sample","step":3,')
    replace_line(samples, lineno, b'{"type":"sample","step":3,"index":0,"rewards":{"f":' + DEEP.encode() + b"}}")
    [r] = analyze(run).runs
    assert r.steps == STEPS
    assert r.skipped["count"] == 1 and r.skipped["where"][0].startswith(f"{samples}:{lineno}: corrupt record (nested")
    assert any("skipped 1 unreadable record" in w and f"{samples_file(0)}:{lineno}" in w for w in r.warnings)
    assert len(read_run(run).samples) == STEPS * 4 - 1


def test_nesting_is_refused_alike_line_by_line_and_in_a_step_block(tmp_path):
    MAX_DEPTH = runlog.MAX_DEPTH

    def record(depth):
        value = 1
        for _ in range(depth - 1):
            value = [value]
        return dumps({"type": "sample", "step": 1, "index": 0, "x": value}).encode()

    assert parse_line(record(MAX_DEPTH), "x")["step"] == 1
    with pytest.raises(RunLogError, match="nested deeper than"):
        parse_line(record(MAX_DEPTH + 1), "x")
    (tmp_path / RUN_FILE).write_text(dumps({"type": "header", "schema": 1}) + "\n")
    (tmp_path / samples_file(0)).write_bytes(b"\n".join([record(MAX_DEPTH), record(MAX_DEPTH + 1), record(3)]) + b"\n")
    idx = SampleIndex(tmp_path)
    idx.scan(final=True)
    assert len(idx.load(1)) == 2 and idx.skipped.count == 1 and f"{samples_file(0)}:2:" in idx.skipped.where[0]


@pytest.mark.parametrize("value", [True, '"4"', "5.5", "2.0", "9223372036854775808"])
def test_a_step_must_be_a_plain_integer_in_every_reader(tmp_path, value):
    """``"step": 2.0`` must not stand in for step 2: it would overwrite that step's record."""
    run = healthy_run(tmp_path / "run")
    literal = {True: b"true"}.get(value, str(value).encode())
    forged = b'{"type":"step","step":' + literal + b',"time":1.0,"metrics":{"entropy":7.0}}'
    with open(run / RUN_FILE, "ab") as fh:
        fh.write(forged + b"\n" + forged.replace(b'"type":"step"', b'"type":"summary"') + b"\n")
    with open(run / samples_file(0), "ab") as fh:
        fh.write(b'{"type":"sample","step":' + literal + b',"index":99,"rewards":{"f":7.0}}\n')
    log = read_run(run)
    assert [r["step"] for r in log.steps] == list(range(1, STEPS + 1)) and log.summary["step"] == STEPS
    assert all(r["metrics"]["entropy"] != 7.0 for r in log.steps) and log.skipped.count == 3
    assert all(s["index"] != 99 for s in log.samples)
    src = load_source(run)
    assert all(m.get("entropy") != 7.0 for _, m in src.steps) and len(src.steps) == STEPS
    idx = SampleIndex(run)
    idx.scan(final=True)
    assert idx.steps() == list(range(1, STEPS + 1)) and idx.skipped.count == 1
    from grpo_monitor.app.dashboard.tail import RunTailer

    batch = RunTailer(run).poll()
    assert sorted(r["step"] for r in batch.records if r["type"] == "step") == list(range(1, STEPS + 1))
    assert sum("without an integer 'step'" in w for w in batch.warnings) == 3


def test_plain_step_is_what_the_foreign_readers_share_for_integers():
    from grpo_monitor.core.runlog import plain_step
    from grpo_monitor.readers._base import as_step

    assert [plain_step(v) for v in (0, -3, 2**63 - 1, 2**63, True, 2.0, "4")] == [0, -3, 2**63 - 1, None, None, None, None]
    assert [as_step(v) for v in (2**63 - 1, 2**63, True)] == [2**63 - 1, None, None]


# A read limited to less memory than the file holds: a reader that takes the file whole fails it.
STREAMED = textwrap.dedent("""
    import resource, sys
    from grpo_monitor.core.runlog import RunLogError, read_run
    from grpo_monitor.core.sample_index import SampleIndex
    limit = {limit}
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        read_run(sys.argv[1])
    except RunLogError as exc:
        print(exc)
    idx = SampleIndex(sys.argv[2])
    idx.scan(final=True)
    print(idx.steps(), idx.warnings)
""")


def test_readers_stream_a_huge_sparse_file_in_bounded_memory(tmp_path):
    """(Its speed and memory are measured in benchmarks/runlog_faults.py.)"""
    huge = 4 << 30
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    with open(a / RUN_FILE, "wb") as fh:
        fh.truncate(huge)  # all one hole: no newline, no byte of a record
    healthy_run(b, steps=2)
    with open(b / samples_file(1), "wb") as fh:
        fh.truncate(huge)
    limit = 1 << 30  # address space: far more than the reader needs, a quarter of the file
    out = subprocess.run([sys.executable, "-c", STREAMED.format(limit=limit), str(a), str(b)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    first, second = out.stdout.splitlines()
    assert first == f"{a / RUN_FILE}: no header record"
    assert second.startswith("[1, 2] [") and "half-written last line" in second


def _resumed_run(path, resume_at=30, until=40, end=50, resume=True):
    """Steps 1..until, then (a resume from checkpoint ``resume_at``) steps resume_at+1..end logged again."""
    w = RunWriter(path)
    w.header(run_id="r1", config={}, model={"is_moe": False}, resumed_from_step=0)
    for s in range(1, until + 1):
        w.step(s, {"reward": 0.1, "entropy": 1.0}, time=float(s))
    if resume:
        w.header(run_id="r1", config={}, model={"is_moe": False}, resumed_from_step=resume_at)
    for s in range(resume_at + 1, end + 1):
        w.step(s, {"reward": 0.9, "entropy": 0.5}, time=100.0 + s)
    w.close()


def test_a_step_logged_twice_is_kept_once_with_a_note_naming_it(tmp_path):
    from grpo_monitor.readers import load_source

    _resumed_run(tmp_path)
    log = read_run(tmp_path)
    assert [r["step"] for r in log.steps] == list(range(1, 51))
    assert all(r["metrics"]["reward"] == 0.9 for r in log.steps[30:])  # the later records win
    [note] = [w for w in log.warnings if "logged twice" in w]
    assert note.startswith(f"{tmp_path / RUN_FILE}: steps 31-40 logged twice (lines 32-41 and 43-52; "
                           "a resume from step 30 at line 42): the later records kept"), note
    src = load_source(tmp_path)
    assert note in src.warnings and [s for s, _ in src.steps] == list(range(1, 51))
    assert src.steps[35][1]["reward"] == 0.9


def test_a_step_logged_twice_without_a_resume_says_so(tmp_path):
    _resumed_run(tmp_path, resume_at=4, until=5, end=6, resume=False)
    [note] = [w for w in read_run(tmp_path).warnings if "logged twice" in w]
    assert "step 5 logged twice (lines 6 and 7; no resume header between them)" in note
    assert note.endswith("the later records kept (the latest record of a step wins)")


def test_a_negative_step_is_a_skipped_record(tmp_path):
    from grpo_monitor.readers import load_source

    write_run(tmp_path, steps=3)
    lines = (tmp_path / RUN_FILE).read_text().splitlines(keepends=True)
    lines.insert(2, json.dumps({"type": "step", "step": -1, "metrics": {"entropy": 9.0}}) + "\n")
    (tmp_path / RUN_FILE).write_text("".join(lines))
    log = read_run(tmp_path)
    assert [r["step"] for r in log.steps] == [1, 2, 3]
    assert log.skipped.count == 1 and log.skipped.where[0] == f"{tmp_path / RUN_FILE}:3: step record with a negative 'step' (-1)"
    src = load_source(tmp_path)
    assert [s for s, _ in src.steps] == [1, 2, 3] and any("skipped 1 unreadable record" in w for w in src.warnings)


def test_step_zero_is_a_step(tmp_path):
    write_run(tmp_path, steps=2)
    with open(tmp_path / RUN_FILE, "a") as fh:
        fh.write(json.dumps({"type": "step", "step": 0, "metrics": {"entropy": 2.0}}) + "\n")
    log = read_run(tmp_path)
    assert [r["step"] for r in log.steps] == [0, 1, 2] and log.skipped.count == 0
