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

from monitor.sources import Source, SourceError, load_source

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
    assert src.format in ("run_dir", "trainer_state", "tensorboard", "csv", "jsonl")
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
    from monitor.sources.tensorboard import read_tensorboard

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
    import monitor.sources.tabular as tabular

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
    from monitor.jsonparse import loads

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
    import monitor.sources.tabular as tabular

    text = "".join(json.dumps({**outer, nested: inner}) + "\n" for outer, nested, inner in lines)
    original = tabular._only_nested
    results = [outcome_of(text, "m.jsonl")]
    tabular._only_nested = lambda keys: None
    try:
        results.append(outcome_of(text, "m.jsonl"))
    finally:
        tabular._only_nested = original
    assert_same_outcome(*results)
