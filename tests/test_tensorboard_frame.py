"""Record framing of TensorBoard event files: the fast framing must give exactly the offsets of the
plain one-record-at-a-time walk, for any bytes (regular, damaged, truncated, irregular, garbage)."""

from __future__ import annotations

import contextlib
import os
import struct
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_monitor.readers import tensorboard as tb

FUZZ = settings(
    max_examples=int(os.environ.get("GRPO_MONITOR_FUZZ_EXAMPLES", "150")), deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# The framing's stretch and block sizes only change its speed, never its result; shrunk, they make
# small inputs go through every path (walk, period search, prediction, broken prediction).
TUNINGS = {
    "default": {},
    "tiny": dict(
        _WALK_FIRST=5, _WALK_MAX=16, _WALK_MIN=2, _WALK_RESUME=4, _RESUME_TAIL=3, _RESUME_MISSES=1, _SPAN_MIN=4,
        _MAX_PERIOD=8, _PERIOD_TAIL=2, _PREDICT_MAX=8,
    ),
}


@contextlib.contextmanager
def tuned(name: str):
    saved = {k: getattr(tb, k) for k in TUNINGS[name]}
    for k, v in TUNINGS[name].items():
        setattr(tb, k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(tb, k, v)


def reference_frame(buf: bytes) -> np.ndarray:
    """The plain walk: read the length at ``pos``, go on to ``pos + length + 16``."""
    starts = []
    pos = 0
    try:
        while True:
            starts.append(pos)
            pos += struct.unpack_from("<Q", buf, pos)[0] + 16
    except (struct.error, OverflowError):
        pass
    if starts[-1] > len(buf):
        starts.pop()
    return np.array(starts, dtype=np.int64)


def assert_same(buf: bytes, tuning: str = "default") -> np.ndarray:
    with tuned(tuning):
        got = tb._frame(buf)
    want = reference_frame(buf)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, want)
    return got


def stream(lengths, seed: int | None = 0) -> bytearray:
    """Records with these payload lengths; header CRCs, payloads and data CRCs are random bytes
    (``seed``) or zeros (``None``): framing reads only the lengths."""
    lengths = np.asarray(lengths, dtype=np.uint64)
    sizes = lengths.astype(np.int64) + 16
    starts = np.cumsum(sizes) - sizes
    total = int(sizes.sum())
    if seed is None:
        buf = np.zeros(total, dtype=np.uint8)
    else:
        buf = np.random.default_rng(seed).integers(0, 256, total, dtype=np.uint8)
    buf[(starts[:, None] + np.arange(8)).ravel()] = lengths.astype("<u8").view(np.uint8)
    return bytearray(buf.tobytes())


def repeat(pattern: list[int], count: int) -> list[int]:
    return (pattern * (count // len(pattern) + 1))[:count]


# --- fixed cases, checked against literal offsets as well --------------------------------------


@pytest.mark.parametrize("tuning", sorted(TUNINGS))
@pytest.mark.parametrize(
    "buf, want",
    [
        (b"", [0]),
        (b"\x00" * 7, [0]),
        (b"\x00" * 15, [0]),
        (b"\x00" * 16, [0, 16]),  # a whole empty record: the end itself is the next start
        (b"\x00" * 17, [0, 16]),
        (struct.pack("<Q", 1) + b"\x00" * 8, [0]),  # its next start lies beyond the end
        (struct.pack("<Q", 2**64 - 1) + b"\x00" * 40, [0]),
        (struct.pack("<Q", 2**63 - 17) + b"\x00" * 40, [0]),  # next start 2**63: past any C offset
        (bytes(stream([3, 0])) + b"xy", [0, 19, 35]),
    ],
)
def test_fixed_cases(buf, want, tuning):
    assert assert_same(buf, tuning).tolist() == want


@pytest.mark.parametrize("tuning", sorted(TUNINGS))
def test_long_regular_stream_with_a_changed_length_and_a_torn_tail(tuning):
    lengths = repeat([30, 41, 41, 52, 37], 20000)
    buf = stream(lengths)
    at = int(np.sum(np.array(lengths[:12345]) + 16))
    buf[at : at + 8] = struct.pack("<Q", 29)  # the framing drifts into the payloads from here on
    got = assert_same(bytes(buf[:-5]), tuning)
    assert got[12345] == at and len(got) > 12346


@pytest.mark.parametrize("tuning", sorted(TUNINGS))
def test_one_off_records_close_together(tuning):
    lengths = repeat([12, 30, 30, 7, 19, 55, 40], 9000)
    for at in (8000, 6013, 6011, 6004, 6000, 3000):  # from the back, so each index is where it lands
        lengths.insert(at, 200)
    got = assert_same(bytes(stream(lengths)), tuning)
    assert len(got) == len(lengths) + 1


@pytest.mark.parametrize("tuning", sorted(TUNINGS))
def test_random_sizes_from_two_values(tuning):
    # Short runs repeat by chance everywhere: many periods are tried and few hold.
    lengths = np.random.default_rng(5).choice([8, 9], 20000).tolist()
    got = assert_same(bytes(stream(lengths, seed=None)) + b"\xff" * 9, tuning)
    assert len(got) == len(lengths) + 1


def test_long_regular_stream_is_mostly_predicted(monkeypatch):
    # Each record walked one at a time costs a Python loop turn: a long regular file must skip most.
    walked = []
    walk = tb._walk

    def counting(buf, pos, count):
        starts, pos, done = walk(buf, pos, count)
        walked.append(len(starts))
        return starts, pos, done

    monkeypatch.setattr(tb, "_walk", counting)
    lengths = repeat(list(range(30, 60)), 29000) + repeat(list(range(31, 61)), 30000)  # as when steps reach 128
    got = assert_same(bytes(stream(lengths, seed=None)))
    assert len(got) == len(lengths) + 1
    assert sum(walked) < len(lengths) // 5


# --- properties -------------------------------------------------------------------------------


@FUZZ
@given(data=st.binary(max_size=3000), tuning=st.sampled_from(sorted(TUNINGS)))
def test_arbitrary_bytes(data, tuning):
    assert_same(data, tuning)


@FUZZ
@given(
    lengths=st.lists(st.integers(0, 40), min_size=1, max_size=4).flatmap(
        lambda few: st.lists(st.sampled_from(few), max_size=300)  # few sizes: periods seen by chance
    ),
    garbage=st.binary(max_size=64),
    seed=st.one_of(st.none(), st.integers(0, 2**32 - 1)),
)
def test_arbitrary_lengths(lengths, garbage, seed):
    assert_same(bytes(stream(lengths, seed)) + garbage, "tiny")


LENGTH_VALUES = st.one_of(
    st.integers(0, 300),
    st.integers(2**64 - 300, 2**64 - 1),
    st.integers(2**63 - 300, 2**63 + 300),
    st.integers(0, 2**64 - 1),
)


@st.composite
def damaged_streams(draw, max_records: int):
    pattern = draw(st.lists(st.integers(0, 120), min_size=1, max_size=40))
    count = draw(st.integers(0, max_records))
    lengths = repeat(pattern, count)
    if draw(st.booleans()):  # the sizes change for good partway, as when steps grow a varint byte
        cut = draw(st.integers(0, count))
        lengths = lengths[:cut] + [n + draw(st.integers(-3, 3)) % 121 for n in lengths[cut:]]
    for _ in range(draw(st.integers(0, 3))):  # one-off records in between, as an eval scalar
        lengths.insert(draw(st.integers(0, len(lengths))), draw(st.integers(0, 300)))
    seed = draw(st.one_of(st.none(), st.integers(0, 2**32 - 1)))
    buf = stream(lengths, seed)
    sizes = np.array(lengths, dtype=np.int64) + 16
    starts = (np.cumsum(sizes) - sizes).tolist()
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(["length", "bytes", "truncate", "append", "append_record"]))
        if kind == "length" and starts:
            at = starts[draw(st.integers(0, len(starts) - 1))]
            buf[at : at + 8] = struct.pack("<Q", draw(LENGTH_VALUES))
        elif kind == "bytes" and buf:
            at = draw(st.integers(0, len(buf) - 1))
            new = draw(st.binary(min_size=1, max_size=8))
            buf[at : at + len(new)] = new
        elif kind == "truncate":
            del buf[draw(st.integers(0, len(buf))) :]
        elif kind == "append":
            buf += draw(st.binary(max_size=100))
        elif kind == "append_record":
            buf += struct.pack("<Q", draw(LENGTH_VALUES)) + draw(st.binary(max_size=40))
    return bytes(buf)


@FUZZ
@given(buf=damaged_streams(max_records=600))
def test_damaged_regular_streams(buf):
    assert_same(buf, "tiny")


@settings(FUZZ, max_examples=max(10, FUZZ.max_examples // 5))
@given(buf=damaged_streams(max_records=12000))
def test_damaged_long_regular_streams(buf):
    assert_same(buf, "default")


# --- a real event file ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def summary_writer_file(tmp_path_factory) -> bytes:
    pytest.importorskip("tensorboard")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.utils.tensorboard import SummaryWriter

    folder = tmp_path_factory.mktemp("tb")
    writer = SummaryWriter(str(folder))
    tags = ["train/loss", "train/reward", "train/grad_norm", "train/learning_rate", "train/completions/mean_length"]
    rng = np.random.default_rng(3)
    for step in range(1, 301):  # steps cross 128, where the step's varint grows a byte
        for tag in tags:
            writer.add_scalar(tag, float(rng.normal()), step)
        if step % 50 == 0:
            writer.add_scalar("eval/loss", float(rng.normal()), step)
    writer.close()
    (path,) = Path(folder).glob("events.out.tfevents.*")
    return path.read_bytes()


@pytest.mark.parametrize("tuning", sorted(TUNINGS))
def test_summary_writer_file(summary_writer_file, tuning):
    buf = summary_writer_file
    got = assert_same(buf, tuning)
    assert len(got) == 1 + 300 * 5 + 6 + 1 and got[-1] == len(buf)  # version record, scalars, the end


@FUZZ
@given(data=st.data(), tuning=st.sampled_from(sorted(TUNINGS)))
def test_damaged_summary_writer_file(summary_writer_file, data, tuning):
    buf = bytearray(summary_writer_file)
    at = data.draw(st.integers(0, len(buf) - 1))
    new = data.draw(st.binary(min_size=1, max_size=8))
    buf[at : at + len(new)] = new
    del buf[data.draw(st.integers(0, len(buf))) :]
    buf += data.draw(st.binary(max_size=64))
    assert_same(bytes(buf), tuning)
