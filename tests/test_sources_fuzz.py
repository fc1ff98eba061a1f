"""Property-based fuzzing of every reader: load_source returns a Source or raises SourceError, nothing else."""

from __future__ import annotations

import contextlib
import json
import math
import os
import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_monitor.readers import FORMATS, Source, SourceError, load_source

# GRPO_MONITOR_FUZZ_EXAMPLES=2000 for a longer search than the default run affords.
FUZZ = settings(
    max_examples=int(os.environ.get("GRPO_MONITOR_FUZZ_EXAMPLES", "150")), deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
NAMES = ["trainer_state.json", "metrics.jsonl", "history.csv", "events.out.tfevents.1", "log.txt", "noext"]


def check(path: Path) -> Source | None:
    try:
        src = load_source(path)
    except SourceError as exc:
        msg = str(exc)
        assert "\n" not in msg and msg.strip()
        return None
    steps = [s for s, _ in src.steps]
    assert steps == sorted(set(steps)) and all(type(s) is int for s in steps)
    for _, metrics in src.steps:
        for k, v in metrics.items():
            assert isinstance(k, str) and (v is None or type(v) is float)
    assert src.format in FORMATS
    assert all(isinstance(w, str) and "\n" not in w for w in src.warnings)
    frame = src.frame()
    assert len(frame) == len(src.steps)
    return src


@contextlib.contextmanager
def folder():
    with tempfile.TemporaryDirectory(prefix="fuzz-") as d:
        yield Path(d)


def check_bytes(data: bytes, name: str) -> Source | None:
    with folder() as d:
        p = d / name
        p.write_bytes(data)
        return check(p)


def same_steps(a, b) -> bool:
    def same(x, y):
        return x == y or (x is not None and y is not None and math.isnan(x) and math.isnan(y))

    return len(a) == len(b) and all(
        sa == sb and ma.keys() == mb.keys() and all(same(ma[k], mb[k]) for k in ma) for (sa, ma), (sb, mb) in zip(a, b)
    )


def outcome_of(text: str, name: str):
    """What reading ``text`` as file ``name`` gives: ``(steps, warnings)``, or the error's text
    (paths left out, so two readings of the same text compare)."""
    with folder() as d:
        (d / name).write_text(text)
        try:
            src = load_source(d / name)
        except SourceError as exc:
            return str(exc).replace(str(d), "")
        return src.steps, [w.replace(str(d), "") for w in src.warnings]


def assert_same_outcome(a, b) -> None:
    if isinstance(a, str) or isinstance(b, str):
        assert a == b
    else:
        assert same_steps(a[0], b[0]) and a[1] == b[1]


@FUZZ
@given(data=st.binary(max_size=2000), name=st.sampled_from(NAMES))
def test_arbitrary_bytes(data, name):
    check_bytes(data, name)


@FUZZ
@given(data=st.binary(max_size=500))
def test_arbitrary_bytes_as_run_log(data):
    with folder() as d:
        (d / "run.jsonl").write_bytes(data)
        check(d / "run.jsonl")
        check(d)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
KEYS = st.sampled_from(["step", "loss", "entropy", "completion_length", "rewards/f", "train_runtime", "eval_loss",
                        "global_step", "_step", "data", "metrics", "training/global_step", "actor/entropy"]) | st.text(max_size=6)
ENTRY = st.dictionaries(KEYS, JSON, max_size=6)


@FUZZ
@given(value=JSON, name=st.sampled_from(NAMES))
def test_arbitrary_json_document(value, name):
    check_bytes(json.dumps(value).encode(), name)


@FUZZ
@given(history=st.one_of(JSON, st.lists(ENTRY, max_size=8)), extra=st.dictionaries(st.text(max_size=5), JSON, max_size=3),
       indent=st.sampled_from([None, 2]))
def test_arbitrary_trainer_state(history, extra, indent):
    src = check_bytes(json.dumps({**extra, "log_history": history}, indent=indent).encode(), "trainer_state.json")
    if src is not None:
        assert src.format == "trainer_state"


@FUZZ
@given(lines=st.lists(st.one_of(ENTRY, JSON), max_size=8), torn=st.binary(max_size=20))
def test_arbitrary_jsonl(lines, torn):
    text = "".join(json.dumps(x) + "\n" for x in lines).encode() + torn
    check_bytes(text, "metrics.jsonl")


CELL = st.one_of(st.text(max_size=6), st.integers(-5, 10**6).map(str), st.floats().map(repr), st.just(""))


@FUZZ
@given(
    header=st.lists(st.sampled_from(["step", "_step", "loss", "train/global_step", "a b", '"q"', ""]) | st.text(max_size=6),
                    min_size=1, max_size=5),
    rows=st.lists(st.lists(CELL, max_size=6), max_size=8),
    delim=st.sampled_from([",", "\t", ";"]),
)
def test_arbitrary_csv(header, rows, delim):
    text = delim.join(header) + "\n" + "".join(delim.join(r) + "\n" for r in rows)
    check_bytes(text.encode("utf-8", "surrogatepass"), "history.csv")


@FUZZ
@given(records=st.lists(st.binary(max_size=60), max_size=8), tail=st.binary(max_size=10))
def test_framed_records_with_arbitrary_payloads(records, tail):
    from tensorboard.summary.writer.record_writer import RecordWriter

    with folder() as d:
        p = d / "events.out.tfevents.0"
        with open(p, "wb") as fh:
            w = RecordWriter(fh)
            for r in records:
                w.write(r)
            fh.write(tail)
        check(p)
        check(d)


def _event(step: int, tag: bytes, value: float) -> bytes:
    v = b"\x0a" + bytes([len(tag)]) + tag + b"\x15" + struct.pack("<f", value)
    s = b"\x0a" + bytes([len(v)]) + v
    step_bytes = b""
    if step:
        n, out = step, bytearray()
        while n > 0x7F:
            out.append(n & 0x7F | 0x80)
            n >>= 7
        out.append(n)
        step_bytes = b"\x10" + bytes(out)
    return b"\x09" + struct.pack("<d", 1.7e9 + step) + step_bytes + b"\x2a" + bytes([len(s)]) + s


@FUZZ
@given(
    events=st.lists(
        st.tuples(st.integers(0, 10**6), st.binary(min_size=1, max_size=30), st.floats(width=32)), min_size=1, max_size=20
    ),
    flips=st.lists(st.tuples(st.integers(0, 10**5), st.integers(1, 255)), max_size=4),
    cut=st.integers(0, 50),
)
def test_mutated_event_files(events, flips, cut):
    from tensorboard.summary.writer.record_writer import RecordWriter
    from grpo_monitor.readers.tensorboard import read_tensorboard

    with folder() as d:
        p = d / "events.out.tfevents.0"
        with open(p, "wb") as fh:
            w = RecordWriter(fh)
            for step, tag, value in events:
                w.write(_event(step, tag, value))
        data = bytearray(p.read_bytes())
        clean = check(p)
        assert clean is not None  # an intact file always reads, and the fast path agrees with the parser
        assert same_steps(clean.steps, read_tensorboard(p, fast=False).steps)
        assert {s for s, _, _ in events} == {s for s, _ in clean.steps}
        for pos, x in flips:
            data[pos % len(data)] ^= x
        p.write_bytes(bytes(data[: len(data) - cut]))
        check(p)


@pytest.mark.parametrize("n", [0, 1, 3])
def test_run_log_with_arbitrary_records(tmp_path, n):
    @FUZZ
    @given(records=st.lists(ENTRY, max_size=6))
    def inner(records):
        with folder() as d:
            head = [{"type": "header", "schema": 1, "run_id": "x", "config": {"logging_steps": n}}]
            lines = head + [{"type": "step", **r} for r in records]
            (d / "run.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
            (d / "samples.rank0.jsonl").write_text("".join(json.dumps({"type": "sample", **r}) + "\n" for r in records))
            check(d)

    inner()


NUMERIC_CELL = st.one_of(
    st.integers(-(2**70), 2**70).map(str), st.floats().map(repr), st.floats(width=32).map(str),
    st.sampled_from(["", "nan", "NaN", "inf", "-inf", "Infinity", "1e400", " 1.5", "1_000", "True", "false",
                     "null", "0x10", "1.", ".5", "+3", "-0.0", "abc"]),
)
STEP_CELL = st.one_of(st.integers(-(2**64), 2**64).map(str), st.sampled_from(["", "1.0", "x", " 7"]))


@FUZZ
@given(
    columns=st.lists(st.sampled_from(["loss", "entropy", "reward", "loss", "_runtime", "train/loss", "x"]),
                     min_size=1, max_size=4),
    rows=st.lists(st.tuples(STEP_CELL, st.lists(NUMERIC_CELL, min_size=4, max_size=4)), min_size=1, max_size=8),
    delim=st.sampled_from([",", "\t", ";"]),
    step_first=st.booleans(),
)
def test_csv_readers_agree(columns, rows, delim, step_first):
    """A long export goes through pandas' reader, a short one cell by cell: the same table either way."""
    import grpo_monitor.readers.tabular as tabular

    def line(step, cells):
        cells = cells[: len(columns)]
        return delim.join([step, *cells] if step_first else [*cells, step])

    header = ["step", *columns] if step_first else [*columns, "step"]
    text = delim.join(header) + "\n" + "".join(line(s, c) + "\n" for s, c in rows)
    original = tabular.PANDAS_FROM_CHARS
    results = []
    for threshold in (0, 10**12):
        tabular.PANDAS_FROM_CHARS = threshold
        try:
            results.append(outcome_of(text, "m.csv"))
        finally:
            tabular.PANDAS_FROM_CHARS = original
    assert_same_outcome(*results)


@FUZZ
@given(value=JSON, allow_nan=st.booleans(), data=st.binary(max_size=60))
def test_json_parsers_agree(value, allow_nan, data):
    """orjson where it accepts the text, the standard parser's value or error everywhere else."""
    from grpo_monitor.core.jsonparse import loads

    try:
        text = json.dumps(value, allow_nan=allow_nan)
    except ValueError:
        text = json.dumps(None)
    for doc in (text, text.encode(), data):
        try:
            want = json.loads(doc)
        except (ValueError, RecursionError) as exc:
            with pytest.raises(type(exc)):
                loads(doc)
            continue
        got = loads(doc)
        shown = json.dumps(got, sort_keys=True)
        assert shown in (json.dumps(want, sort_keys=True), json.dumps(beyond_64_bits_as_float(want), sort_keys=True))


def beyond_64_bits_as_float(value):
    if isinstance(value, dict):
        return {k: beyond_64_bits_as_float(v) for k, v in value.items()}
    if isinstance(value, list):
        return [beyond_64_bits_as_float(v) for v in value]
    if type(value) is int and not -(2**63) <= value < 2**64:
        return float(value)
    return value


SCALAR = st.none() | st.booleans() | st.integers(-3, 10**20) | st.floats() | st.sampled_from(["7", "x", "1.5"])
STEPISH = st.sampled_from(["step", "_step", "global_step", "train/global_step", "training/global_step",
                           "trainer/global_step", "loss", "data", "metrics"])


@FUZZ
@given(
    lines=st.lists(
        st.tuples(st.dictionaries(STEPISH, SCALAR, max_size=3), st.sampled_from(["data", "metrics"]),
                  st.one_of(st.dictionaries(KEYS | STEPISH, SCALAR, max_size=6), SCALAR)),
        min_size=1, max_size=6),
)
def test_jsonl_nested_records_read_as_flattened(lines):
    """``{"step": 7, "data": {...}}`` lines skip the flat copy: the same table as flattening them."""
    import grpo_monitor.readers.tabular as tabular

    text = "".join(json.dumps({**outer, nested: inner}) + "\n" for outer, nested, inner in lines)
    original = tabular._only_nested
    results = [outcome_of(text, "m.jsonl")]
    tabular._only_nested = lambda keys: None
    try:
        results.append(outcome_of(text, "m.jsonl"))
    finally:
        tabular._only_nested = original
    assert_same_outcome(*results)


# ------------------------------------------------------------------ console logs and trackers

METRIC_KEYS = ["loss", "grad_norm", "learning_rate", "reward", "reward_std", "kl", "entropy", "epoch",
               "completions/mean_length", "rewards/correct/mean", "frac_reward_zero_std"]
NUMBER = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10**6, 10**6),
                   st.floats(-1e6, 1e6).map(lambda x: f"{x:.4g}"))
FRAGMENT = st.one_of(
    st.text(max_size=30),
    st.dictionaries(st.sampled_from(METRIC_KEYS) | st.text(max_size=5), NUMBER | st.text(max_size=4), max_size=5).map(str),
    st.tuples(st.integers(0, 99), st.integers(1, 99)).map(lambda t: f"\r{t[0]}%|##  | {t[0]}/{t[1]} [00:01<00:02, 1it/s]"),
    st.sampled_from(["\x1b[36m(TaskRunner pid=1)\x1b[0m ", "\x1b[0m", "\n", "\r", "logging_steps=", "Total steps = ",
                     "{'", "'}", ": ", ", ", "np.float64(", ")", "step:", " - ", "Epoch:[1/2]", "(3/9)", "step 4 ",
                     "Reward: ", "loss=", "nan", "inf"]),
    st.tuples(st.integers(-3, 10**20), st.dictionaries(st.sampled_from(METRIC_KEYS), NUMBER.map(str), max_size=3)).map(
        lambda t: f"step:{t[0]} - " + " - ".join(f"{k}:{v}" for k, v in t[1].items())),
)


@FUZZ
@given(parts=st.lists(FRAGMENT, max_size=25), name=st.sampled_from(["train.log", "nohup.out", "out.txt"]),
       logging_steps=st.one_of(st.none(), st.integers(-2, 50)))
def test_arbitrary_console_text(parts, name, logging_steps):
    with folder() as d:
        p = d / name
        p.write_text("".join(parts), encoding="utf-8", errors="surrogatepass")
        try:
            src = load_source(p, logging_steps=logging_steps)
        except SourceError as exc:
            assert "\n" not in str(exc) and str(exc).strip()
            return
        check(p)
        assert all(type(s) is int for s, _ in src.steps)


def _printed(entry: dict, style: str) -> str:
    shown = {k: v for k, v in entry.items() if k != "step"}
    if style == "4g":  # transformers >= 5: every float as '%.4g'
        shown = {k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in shown.items()}
    return str(shown)


@FUZZ
@given(
    rows=st.lists(st.fixed_dictionaries({k: st.floats(-1e4, 1e4, allow_nan=False) for k in METRIC_KEYS[:6]}),
                  min_size=1, max_size=12),
    logging_steps=st.integers(1, 7),
    style=st.sampled_from(["repr", "4g"]),
    wrap=st.one_of(st.none(), st.integers(7, 120)),
    bar=st.booleans(),
)
def test_console_log_and_trainer_state_give_the_same_frame(rows, logging_steps, style, wrap, bar):
    total = len(rows) * logging_steps
    history = [{**r, "epoch": round((k + 1) * logging_steps / total, 4), "step": (k + 1) * logging_steps}
               for k, r in enumerate(rows)]
    out = [f"GRPOConfig(logging_steps={logging_steps})\n"] if not bar else []
    for k, entry in enumerate(history):
        if bar:
            out.extend(f"\r{100 * s // total}%|#| {s}/{total} [00:00<00:00]" for s in range(k * logging_steps + 1, entry["step"] + 1))
            out.append("\r" + " " * 30 + "\r")
        line = _printed(entry, style)
        if wrap:
            line = "\n".join(line[i:i + wrap] for i in range(0, len(line), wrap))
        out.append(line + "\n")
    out.append(str({"train_runtime": 1.5, "train_loss": 0.1, "epoch": 1.0}) + "\n")
    with folder() as d:
        (d / "trainer_state.json").write_text(json.dumps({"log_history": history, "logging_steps": logging_steps}))
        (d / "train.log").write_text("".join(out))
        ref = load_source(d / "trainer_state.json")
        got = load_source(d / "train.log")
    assert got.format == "trl_console" and got.meta["logging_steps"] == logging_steps
    assert [s for s, _ in got.steps] == [s for s, _ in ref.steps]
    for (_, a), (_, b) in zip(got.steps, ref.steps):
        assert a.keys() == b.keys()
        for k in b:
            if style == "repr":
                assert a[k] == b[k]
            else:
                assert math.isclose(a[k], float(f"{b[k]:.4g}"))


@FUZZ
@given(records=st.lists(st.fixed_dictionaries({"output_type": st.just("stream"), "name": st.sampled_from(["stdout", "stderr"]),
                                               "text": st.lists(FRAGMENT, max_size=6) | FRAGMENT}), min_size=1, max_size=5),
       ipynb=st.booleans())
def test_arbitrary_notebook_output(records, ipynb):
    doc = {"cells": [{"cell_type": "code", "outputs": records}], "nbformat": 4} if ipynb else records
    check_bytes(json.dumps(doc).encode(), "train.ipynb" if ipynb else "cell_output.json")


@FUZZ
@given(columns=st.dictionaries(st.sampled_from(["step", "reward", "loss", "_step", "x"]) | st.text(max_size=4),
                               st.lists(SCALAR, max_size=6), min_size=1, max_size=4),
       logging_steps=st.one_of(st.none(), st.integers(1, 5)))
def test_arbitrary_columns(columns, logging_steps):
    with folder() as d:
        p = d / "metrics.json"
        p.write_text(json.dumps(columns))
        try:
            load_source(p, logging_steps=logging_steps)
        except SourceError as exc:
            assert "\n" not in str(exc)
        check(p)


def _leveldb_log(payloads: list[bytes]) -> bytes:
    """W&B's framing (LevelDB log records in 32 KiB blocks) around arbitrary payloads."""
    import zlib

    out = bytearray(b":W&B" + struct.pack("<HB", 0xBEE1, 0))
    for payload in payloads:
        first = True
        while True:
            left = 32768 - len(out) % 32768
            if left < 7:
                out += b"\x00" * left
                continue
            chunk, payload = payload[: left - 7], payload[left - 7:]
            kind = (1 if first else 4) if not payload else (2 if first else 3)
            out += struct.pack("<IHB", zlib.crc32(chunk, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF, len(chunk), kind) + chunk
            first = False
            if not payload:
                break
    return bytes(out)


@FUZZ
@given(
    rows=st.lists(st.dictionaries(st.sampled_from(["train/global_step", "_step", "train/loss", "train/reward",
                                                   "profiling/Time taken: x", "entropy"]), NUMBER | st.none(), max_size=4),
                  max_size=6),
    junk=st.lists(st.binary(max_size=40), max_size=3),
    cut=st.integers(0, 30),
    big=st.booleans(),
)
def test_wandb_logs_with_arbitrary_records(rows, junk, cut, big):
    pb = pytest.importorskip("wandb.proto.wandb_internal_pb2")
    payloads = []
    for i, row in enumerate(rows):
        rec = pb.Record()
        for k, v in row.items():
            item = rec.history.item.add()
            item.key = k
            item.value_json = json.dumps(v)
        rec.history.step.num = i
        payloads.append(rec.SerializeToString() + (b"\x00" * 40000 if big and i == 0 else b""))
    payloads.extend(junk)
    data = _leveldb_log(payloads)
    with folder() as d:
        p = d / "run-abc.wandb"
        p.write_bytes(data[: max(0, len(data) - cut)])
        check(p)


@FUZZ
@given(rows=st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(-5, 10**19) | st.text(max_size=3),
                               JSON.map(json.dumps) | st.binary(max_size=20)), max_size=8))
def test_trackio_databases_with_arbitrary_rows(rows):
    import sqlite3

    with folder() as d:
        p = d / "project.db"
        conn = sqlite3.connect(p)
        conn.execute("CREATE TABLE metrics (id INTEGER PRIMARY KEY AUTOINCREMENT, run_name TEXT, step INTEGER, metrics TEXT)")
        conn.executemany("INSERT INTO metrics (run_name, step, metrics) VALUES (?, ?, ?)",
                         [(r, s if not isinstance(s, int) or s < 2**63 else str(s), m) for r, s, m in rows])
        conn.commit()
        conn.close()
        check(p)
        check(d)


@FUZZ
@given(parts=st.lists(st.sampled_from(["\x1b", "[", "0", ";", "m", "]", "\x07", "\\", "a", "\n", "38;5;208", "K", "("]),
                      max_size=30))
def test_ansi_stripping_is_the_regex_substitution(parts):
    """The escape-by-escape stripping (fast on a 100 MB log) removes exactly what the pattern matches."""
    from grpo_monitor.readers.console import _ANSI, strip_ansi

    text = "".join(parts)
    assert strip_ansi(text) == _ANSI.sub("", text)


@pytest.mark.parametrize("text,kwargs", [
    ("{\nstep:9223372036854775808 - loss:0.0\n", {}),
    ("step 9223372036854775808 loss=1\n", {}),
    ("logging_steps=99999999999999999999\n{'loss': 1.0, 'epoch': 0.1}\n", {}),
    ("{'loss': 1.0, 'epoch': 0.1}\n{'loss': 1.0, 'epoch': 0.2}\n", {"logging_steps": 2**62}),
])
def test_steps_beyond_64_bits_give_one_line(text, kwargs):
    with folder() as d:
        p = d / "train.log"
        p.write_text(text)
        try:
            load_source(p, **kwargs)
        except SourceError as exc:
            assert "\n" not in str(exc)
        check(p)


# -- one bad line in a run log costs that line alone -----------------------------------------------

RUN_STEPS = 8
BAD_STEPS = [b"true", b'"4"', b"5.5", b"2.0", b"1e999", b"-" + b"9" * 30, b"null", b"[1]"]


def _valid_run(d: Path) -> None:
    from grpo_monitor.core.runlog_writer import RunWriter

    w = RunWriter(d)
    w.header(run_id="r", config={"logging_steps": 1, "max_steps": RUN_STEPS}, model={"is_moe": False})
    for s in range(1, RUN_STEPS + 1):
        w.step(s, {"entropy": 1.0 - s / 50, "reward": s / 10, "completions/mean_length": 10.0 + s}, time=float(s))
        w.samples([{"step": s, "rank": 0, "index": i, "group": 0, "length": 3 + i, "truncated": False,
                    "rewards": {"f": float(i)}, "correct": None} for i in range(3)])
    w.write({"type": "summary", "step": RUN_STEPS, "metrics": {"train_runtime": 1.0}})
    w.close()


def _bad_version(line: bytes, how: str, data) -> bytes:
    """``line`` (a whole record) made into a line that is no record, by construction."""
    if how == "torn":  # a prefix of a JSON object never closes it
        return line[: data.draw(st.integers(1, len(line) - 1), label="cut")]
    if how == "step":
        return line.replace(b'"step":', b'"step":' + data.draw(st.sampled_from(BAD_STEPS), label="step") + b',"was":', 1)
    if how == "huge_number":  # beyond Python's 4300-digit limit for integers
        return line[:-1] + b',"big":' + b"7" * 4400 + b"}"
    if how == "deep":
        depth = data.draw(st.integers(1025, 3000), label="depth")
        return line[:-1] + b',"deep":' + b"[" * depth + b"]" * depth + b"}"
    junk = data.draw(st.binary(min_size=1, max_size=80).filter(lambda b: b"\n" not in b and b.strip() and b'"type"' not in b),
                     label="junk")
    return junk


@FUZZ
@given(data=st.data())
def test_one_bad_or_inserted_line_costs_that_line_alone(data):
    """For a valid run log and any single corrupted or inserted line, ``analyze`` reads every other
    step and reports the bad line with its file and line number."""
    from grpo_monitor import analyze

    name = data.draw(st.sampled_from(["run.jsonl", "samples.rank0.jsonl"]), label="file")
    how = data.draw(st.sampled_from(["torn", "step", "huge_number", "deep", "junk", "insert"]), label="how")
    with folder() as d:
        _valid_run(d)
        path = d / name
        lines = path.read_bytes().split(b"\n")[:-1]
        first = 1 if name == "run.jsonl" else 0  # the header is the run: it is not one bad line among others
        at = data.draw(st.integers(first, len(lines) - (0 if how == "insert" else 1)), label="line")
        if how == "insert":
            lines.insert(at, _bad_version(b"", "junk", data))
        else:
            lines[at] = _bad_version(lines[at], how, data)
        path.write_bytes(b"\n".join(lines) + b"\n")
        expected = list(range(1, RUN_STEPS + 1))
        if name == "run.jsonl" and how != "insert" and at <= RUN_STEPS:  # a step record was spoilt
            expected.remove(at)
        [run] = analyze(d).runs
        assert [s for s, _ in run.series["entropy"]] == expected
        assert run.skipped is not None and run.skipped["count"] == 1, run.skipped
        assert run.skipped["where"][0].startswith(f"{path}:{at + 1}: ")
        doc = run.to_dict()
        assert doc["skipped_records"]["count"] == 1 and any(f"{name}:{at + 1}:" in n for n in doc["notes"])


# -- one bad record costs that record alone, in every format the readers take ------------------------------------

N_STEPS = 8
HUGE = "9" * 5000  # beyond Python's 4300-digit limit on int(): converting it raises
GARBAGE = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters='\x00\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"'),
                  min_size=1, max_size=40).filter(lambda t: t.strip() and not any(c.isdigit() for c in t))


def _not_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return True
    return False


def _skipped_one(src: Source, where: str) -> None:
    skipped = src.meta.get("skipped")
    assert skipped is not None and skipped["count"] == 1, (src.warnings, where)
    assert skipped["where"][0].startswith(where), (skipped["where"][0], where)
    line = [w for w in src.warnings if w.startswith("skipped 1 unreadable record (the rest was read): ")]
    assert len(line) == 1 and where in line[0]


def _expect(src: Source, at: int, how: str) -> None:
    expected = list(range(1, N_STEPS + 1))
    if how != "insert":
        expected.remove(at + 1)
    assert [s for s, _ in src.steps] == expected
    for _, m in src.steps:
        assert set(m) >= {"loss", "reward"}


@FUZZ
@given(data=st.data())
def test_jsonl_one_bad_line_costs_that_line_alone(data):
    how = data.draw(st.sampled_from(["bool", "float", "huge", "negative", "garbage", "insert"]), label="how")
    at = data.draw(st.integers(0, N_STEPS - (0 if how == "insert" else 1)), label="line")
    lines = [json.dumps({"step": s, "loss": 1 / s, "reward": s / 10}) for s in range(1, N_STEPS + 1)]
    bad = {"bool": "true", "float": f"{at + 1}.5", "huge": HUGE, "negative": f"-{at + 1}"}
    if how in bad:
        lines[at] = lines[at].replace(f'"step": {at + 1},', f'"step": {bad[how]},')
    else:
        junk = data.draw(GARBAGE.filter(_not_json), label="junk")
        if how == "insert":
            lines.insert(at, junk)
        else:
            lines[at] = junk
    with folder() as d:
        p = d / "metrics.jsonl"
        p.write_text("".join(x + "\n" for x in lines))
        src = check(p)
        assert src is not None and src.format == "jsonl"
        _expect(src, at, how)
        _skipped_one(src, f"{p}:{at + 1}: ")


@FUZZ
@given(data=st.data())
def test_csv_one_bad_row_costs_that_row_alone(data):
    how = data.draw(st.sampled_from(["bool", "float", "huge", "negative", "garbage", "quote", "insert"]), label="how")
    at = data.draw(st.integers(0, N_STEPS - (0 if how == "insert" else 1)), label="row")
    delim = data.draw(st.sampled_from([",", "\t", ";"]), label="delim")
    rows = [delim.join([str(s), repr(1 / s), repr(s / 10)]) for s in range(1, N_STEPS + 1)]
    bad = {"bool": "True", "float": f"{at + 1}.5", "huge": HUGE, "negative": f"-{at + 1}"}
    if how in bad:
        rows[at] = delim.join([bad[how], "0.5", "0.5"])
    elif how == "quote":  # a quote that never closes: it would take every row after it
        rows[at] = delim.join([str(at + 1), '"0.5', "0.5"])
    else:
        junk = data.draw(GARBAGE, label="junk")
        if how == "insert":
            rows.insert(at, junk)
        else:
            rows[at] = junk
    with folder() as d:
        p = d / "history.csv"
        p.write_text(delim.join(["step", "loss", "reward"]) + "\n" + "".join(r + "\n" for r in rows))
        src = check(p)
        assert src is not None and src.format == "csv"
        _expect(src, at, how)
        _skipped_one(src, f"{p}:{at + 2}: ")


@FUZZ
@given(data=st.data())
def test_trainer_state_one_bad_entry_costs_that_entry_alone(data):
    how = data.draw(st.sampled_from(["bool", "float", "huge", "negative", "garbage", "insert"]), label="how")
    at = data.draw(st.integers(0, N_STEPS - (0 if how == "insert" else 1)), label="entry")
    indent = data.draw(st.sampled_from([None, 2]), label="indent")
    history: list = [{"loss": 1 / s, "reward": s / 10, "step": s} for s in range(1, N_STEPS + 1)]
    bad = {"bool": True, "float": at + 1.5, "huge": "HUGE", "negative": -(at + 1)}
    if how in bad:
        history[at] = {**history[at], "step": bad[how]}
    elif how == "insert":
        history.insert(at, data.draw(st.sampled_from(["garbage", 7, None, [1]]), label="entry value"))
    else:
        history[at] = data.draw(st.sampled_from(["garbage", 7, None, [1], {"loss": 0.5}]), label="entry value")
    text = json.dumps({"log_history": history, "logging_steps": 1}, indent=indent).replace('"HUGE"', HUGE)
    line = 1 if indent is None else 3 + sum(json.dumps(e, indent=2).count("\n") + 1 for e in history[:at])
    with folder() as d:
        p = d / "trainer_state.json"
        p.write_text(text)
        src = check(p)
        assert src is not None and src.format == "trainer_state"
        _expect(src, at, how)
        _skipped_one(src, f"{p}:{line}: log_history[{at}]: ")


@FUZZ
@given(data=st.data())
def test_console_one_bad_line_costs_that_line_alone(data):
    """A loop's lines, TRL's printed dicts and verl's lines: a damaged step costs its line, counted and named; a
    line of noise in place of a step line costs that line (console output is mostly noise: not a record)."""
    kind = data.draw(st.sampled_from(["loop", "trl", "verl"]), label="kind")
    hows = {"loop": ["float", "huge", "negative", "garbage", "insert"], "trl": ["bool", "float", "huge", "negative",
            "garbage", "insert"], "verl": ["huge", "negative", "garbage", "insert"]}[kind]
    how = data.draw(st.sampled_from(hows), label="how")
    at = data.draw(st.integers(0, N_STEPS - (0 if how == "insert" else 1)), label="line")

    def line(step: str, s: int) -> str:
        if kind == "loop":
            return f"Step {step}/{N_STEPS} | loss: {1 / s:.4f} | reward: {s / 10:.4f}"
        if kind == "trl":
            return "{'loss': %r, 'reward': %r, 'step': %s, 'epoch': %r}" % (1 / s, s / 10, step, s / N_STEPS)
        return f"step:{step} - loss:{1 / s} - reward:{s / 10}"

    lines = [line(str(s), s) for s in range(1, N_STEPS + 1)]
    bad = {"bool": "True", "float": f"{at + 1}.5", "huge": HUGE, "negative": f"-{at + 1}"}
    if how in bad:
        lines[at] = line(bad[how], at + 1)
    else:
        junk = data.draw(GARBAGE.filter(lambda t: "{" not in t and "|" not in t), label="junk")
        if how == "insert":
            lines.insert(at, junk)
        else:
            lines[at] = junk
    with folder() as d:
        p = d / "train.log"
        p.write_text("".join(x + "\n" for x in lines))
        src = check(p)
        assert src is not None and src.format == {"loop": "console", "trl": "trl_console", "verl": "verl_console"}[kind]
        _expect(src, at, how)
        if how in bad:
            _skipped_one(src, f"{p}:{at + 1}: ")
        else:
            assert "skipped" not in src.meta


def _progress_table(rows: list[list[str]]) -> str:
    head = "".join(f"<th>{h}</th>" for h in ["Step", "Training Loss", "reward"])
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>\n" for r in rows)
    return f'<table border="1" class="dataframe">\n<thead><tr style="text-align: left;">{head}</tr></thead>\n<tbody>\n{body}</tbody>\n</table>'


@FUZZ
@given(data=st.data())
def test_notebook_one_bad_table_row_costs_that_row_alone(data):
    how = data.draw(st.sampled_from(["bool", "float", "huge", "negative", "garbage", "insert"]), label="how")
    at = data.draw(st.integers(0, N_STEPS - (0 if how == "insert" else 1)), label="row")
    markup = data.draw(st.booleans(), label="markup")  # markup in a cell: the HTML parser reads the table
    rows = [[str(s), f"{1 / s:.6f}", f"{s / 10:.6f}"] for s in range(1, N_STEPS + 1)]
    bad = {"bool": "True", "float": f"{at + 1}.5", "huge": HUGE, "negative": f"-{at + 1}"}
    if how in bad:
        rows[at] = [bad[how], "0.5", "0.5"]
    else:
        junk = data.draw(GARBAGE.filter(lambda t: "<" not in t and "&" not in t), label="junk")
        if how == "insert":
            rows.insert(at, [junk])
        else:
            rows[at] = [junk]
    if markup:
        rows[-1][-1] = f"<b>{rows[-1][-1]}</b>"
    html = _progress_table(rows)
    doc = {"cells": [{"cell_type": "code", "source": ["trainer.train()"],
                      "outputs": [{"output_type": "display_data", "data": {"text/html": [html]}, "metadata": {}}]}],
           "nbformat": 4}
    with folder() as d:
        p = d / "train.ipynb"
        p.write_text(json.dumps(doc))
        src = check(p)
        assert src is not None and src.format == "notebook"
        _expect(src, at, how)
        _skipped_one(src, f"{p}: cell 1, output 1, row {at + 1}: ")


@FUZZ
@given(rows=st.lists(st.lists(st.sampled_from(["1", "0.5", "x", "&amp;", "", " 2 ", "<b>3</b>", "a<br>b", "No log"]),
                              min_size=1, max_size=4), max_size=5),
       open_row=st.booleans(), sections=st.booleans(), nested=st.booleans())
def test_plain_html_tables_read_as_the_parser_reads_them(rows, open_row, sections, nested):
    """A million-row progress table goes through the regular-expression reader; it agrees with the HTML parser."""
    from grpo_monitor.readers.tables import _HtmlTables, _plain_tables

    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + ("" if open_row and k == 0 else "</tr>")
                   for k, r in enumerate(rows))
    if sections:
        body = f"<thead><tr><th>Step</th></tr></thead><tbody>{body}</tbody>"
    html = f"<p>x</p><table>{body}</table>" + ("<table><tr><td><table><tr><td>1</td></tr></table></td></tr></table>" if nested else "")
    fast = _plain_tables(html)
    parser = _HtmlTables()
    parser.feed(html)
    parser.close()
    if fast is not None:
        assert fast == parser.tables


def test_a_wide_csv_and_a_long_notebook_table_are_read_whole(tmp_path):
    """20k columns and 100k rows read whole; their speed (linear, where a list made the columns quadratic) is
    measured by benchmarks/reader_worst_cases.py, never timed here."""
    cols = 20_000
    p = tmp_path / "wide.csv"
    p.write_text("step," + ",".join(f"m{i}" for i in range(cols)) + "\n"
                 + "".join(f"{s}," + ",".join("0.5" for _ in range(cols)) + "\n" for s in range(1, 4)))
    src = load_source(p)
    assert len(src.metric_names()) == cols
    rows = [[str(s), "0.5", "0.25"] for s in range(1, 100_001)]
    nb = tmp_path / "long.ipynb"
    nb.write_text(json.dumps({"cells": [{"cell_type": "code", "source": [], "outputs": [
        {"output_type": "display_data", "data": {"text/html": [_progress_table(rows)]}}]}], "nbformat": 4}))
    src = load_source(nb)
    assert len(src.steps) == 100_000
