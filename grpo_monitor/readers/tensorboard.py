"""TensorBoard event files, read without TensorFlow, TensorBoard or protobuf.

An event file is a sequence of TFRecords::

    uint64 length | uint32 masked CRC32C of length | data[length] | uint32 masked CRC32C of data

and each ``data`` is a serialised ``Event`` proto. The fields read here are::

    Event   { double wall_time = 1; int64 step = 2; Summary summary = 5; }
    Summary { repeated Value value = 1; }
    Value   { string tag = 1; float simple_value = 2; TensorProto tensor = 8; }

A scalar is a ``simple_value`` (``torch.utils.tensorboard``, which transformers' TensorBoard
callback uses, writes ``train/<key>`` scalars this way) or a one-element numeric ``tensor``
(TF2 ``tf.summary.scalar``). Everything else (text, histograms, images, hparams) is skipped.

Speed: nearly every record in a training log has exactly the same layout (wall time, step, one
summary holding one simple-valued tag), so records are framed in one tight loop and then the
standard layout is decoded for all of them at once with numpy; only records that do not match
it byte for byte go through the general parser. Length CRCs are verified (vectorised), which
catches framing faults and garbage; payload CRCs are not, for speed, and a damaged payload shows
up as an unparsable record instead.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any

import numpy as np

from grpo_monitor.core.metrics import SUMMARY_KEYS, normalize
from grpo_monitor.readers._base import Probe, Reader, Source, SourceError, guess_context

_U64 = struct.Struct("<Q")
_F32 = struct.Struct("<f")
_F64 = struct.Struct("<d")
_MASK_DELTA = 0xA282EAD8


# ------------------------------------------------------------------------------------ CRC32C

_CRC_TABLE: np.ndarray | None = None


def _crc_table() -> np.ndarray:
    global _CRC_TABLE
    if _CRC_TABLE is None:
        table = []
        for i in range(256):
            crc = i
            for _ in range(8):
                crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
            table.append(crc)
        _CRC_TABLE = np.array(table, dtype=np.uint32)
    return _CRC_TABLE


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC32C of ``data`` (pure Python; used for short headers only)."""
    table = _crc_table()
    crc = 0xFFFFFFFF
    for b in data:
        crc = int(table[(crc ^ b) & 0xFF]) ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


def _masked_crc32c_rows(rows: np.ndarray) -> np.ndarray:
    """Masked CRC32C of every row of a ``(n, k)`` uint8 array, vectorised over rows."""
    table = _crc_table()
    crc = np.full(rows.shape[0], 0xFFFFFFFF, dtype=np.uint32)
    for j in range(rows.shape[1]):
        crc = table[(crc ^ rows[:, j]) & 0xFF] ^ (crc >> np.uint32(8))
    crc ^= np.uint32(0xFFFFFFFF)
    return ((crc >> np.uint32(15)) | (crc << np.uint32(17))) + np.uint32(_MASK_DELTA)


def looks_like_event_file(head: bytes) -> bool:
    """True when ``head`` starts with a well-framed TFRecord header (length and its CRC)."""
    if len(head) < 12:
        return False
    return masked_crc32c(head[:8]) == int.from_bytes(head[8:12], "little")


def find_event_files(folder: Path) -> list[Path]:
    """Event files (``*tfevents*``) anywhere under ``folder``, in a stable order."""
    found = []
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        for name in sorted(files):
            if "tfevents" in name:
                p = Path(root) / name
                if p.is_file():
                    found.append(p)
    return found


# ------------------------------------------------------------------------- general parser


class _Corrupt(Exception):
    pass


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    b = buf[pos]
    if b < 0x80:
        return b, pos + 1
    result = b & 0x7F
    shift = 7
    pos += 1
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise _Corrupt("varint too long")


def _skip(buf: bytes, pos: int, wire: int, end: int) -> int:
    if wire == 0:
        return _varint(buf, pos)[1]
    if wire == 1:
        pos += 8
    elif wire == 2:
        n, pos = _varint(buf, pos)
        pos += n
    elif wire == 5:
        pos += 4
    else:
        raise _Corrupt(f"unsupported wire type {wire}")
    if pos > end:
        raise _Corrupt("field runs past its message")
    return pos


def _fields(buf: bytes, pos: int, end: int):
    """(field number, wire type, value start, value end) of every field in ``buf[pos:end]``."""
    while pos < end:
        key, pos = _varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == 2:
            n, start = _varint(buf, pos)
            pos = start + n
            if pos > end:
                raise _Corrupt("field runs past its message")
            yield field, wire, start, pos
        else:
            start = pos
            pos = _skip(buf, pos, wire, end)
            yield field, wire, start, pos
    if pos != end:
        raise _Corrupt("message overruns its length")


def parse_event(buf: bytes, pos: int, end: int) -> tuple[float, int, list[tuple[bytes, float]]]:
    """Wall time, step and the scalar ``(tag, value)`` pairs (tags as raw bytes) of one serialised ``Event``."""
    wall, step, scalars = 0.0, 0, []
    for field, wire, a, b in _fields(buf, pos, end):
        if field == 1 and wire == 1:
            wall = _F64.unpack_from(buf, a)[0]
        elif field == 2 and wire == 0:
            step = _varint(buf, a)[0] & ((1 << 64) - 1)  # a varint may carry more bits than int64 holds
            if step >= 1 << 63:
                step -= 1 << 64
        elif field == 5 and wire == 2:
            for f2, w2, c, d in _fields(buf, a, b):
                if f2 == 1 and w2 == 2:
                    item = _parse_value(buf, c, d)
                    if item is not None:
                        scalars.append(item)
    return wall, step, scalars


def _parse_value(buf: bytes, pos: int, end: int) -> tuple[bytes, float] | None:
    tag = node = None
    value = None
    for field, wire, a, b in _fields(buf, pos, end):
        if field == 1 and wire == 2:
            tag = buf[a:b]
        elif field == 7 and wire == 2:
            node = buf[a:b]
        elif field == 2 and wire == 5:
            value = _F32.unpack_from(buf, a)[0]
        elif field == 8 and wire == 2:
            value = _tensor_scalar(buf, a, b)
    tag = tag or node
    if tag is None or value is None:
        return None
    return tag, value


# TensorProto dtypes -> (struct code of tensor_content, the repeated field that holds values)
_DTYPES: dict[int, tuple[str, int]] = {
    1: ("f", 5),  # DT_FLOAT, float_val
    2: ("d", 6),  # DT_DOUBLE, double_val
    3: ("i", 7),  # DT_INT32, int_val
    4: ("B", 7),  # DT_UINT8
    5: ("h", 7),  # DT_INT16
    6: ("b", 7),  # DT_INT8
    9: ("q", 10),  # DT_INT64, int64_val
    10: ("?", 11),  # DT_BOOL, bool_val
    14: ("bf16", 13),  # DT_BFLOAT16, half_val
    19: ("e", 13),  # DT_HALF, half_val
}


def _tensor_scalar(buf: bytes, pos: int, end: int) -> float | None:
    """The value of a one-element numeric tensor; None for anything else."""
    dtype = 0
    elements = 1
    content = None
    vals: dict[int, list[float]] = {}
    for field, wire, a, b in _fields(buf, pos, end):
        if field == 1 and wire == 0:
            dtype = _varint(buf, a)[0]
        elif field == 2 and wire == 2:
            for f2, w2, c, d in _fields(buf, a, b):
                if f2 == 2 and w2 == 2:  # dim { size = 1 }
                    size = 1
                    for f3, w3, e, _ in _fields(buf, c, d):
                        if f3 == 1 and w3 == 0:
                            size = _varint(buf, e)[0]
                    elements *= size
                elif f2 == 3 and w2 == 0 and _varint(buf, c)[0]:
                    return None  # unknown rank
        elif field == 4 and wire == 2:
            content = buf[a:b]
        elif field in (5, 6, 7, 10, 11, 13):
            vals.setdefault(field, []).extend(_repeated(buf, field, wire, a, b))
    if elements != 1 or dtype not in _DTYPES:
        return None
    code, val_field = _DTYPES[dtype]
    if content:
        if code == "bf16":
            if len(content) != 2:
                return None
            return struct.unpack("<f", b"\x00\x00" + content)[0]
        if len(content) != struct.calcsize("<" + code):
            return None
        return float(struct.unpack("<" + code, content)[0])
    got = vals.get(val_field)
    if not got:
        return None
    x = got[0]
    if code == "e":
        return struct.unpack("<e", int(x).to_bytes(2, "little"))[0]
    if code == "bf16":
        return struct.unpack("<f", (int(x) << 16).to_bytes(4, "little"))[0]
    return float(x)


def _repeated(buf: bytes, field: int, wire: int, a: int, b: int) -> list[float]:
    if field == 5:  # float
        if wire == 5:
            return [_F32.unpack_from(buf, a)[0]]
        if wire == 2 and (b - a) % 4 == 0:
            return list(struct.unpack_from(f"<{(b - a) // 4}f", buf, a))
    elif field == 6:  # double
        if wire == 1:
            return [_F64.unpack_from(buf, a)[0]]
        if wire == 2 and (b - a) % 8 == 0:
            return list(struct.unpack_from(f"<{(b - a) // 8}d", buf, a))
    else:  # varint-encoded integers
        if wire == 0:
            return [_signed(_varint(buf, a)[0], field)]
        if wire == 2:
            out, p = [], a
            while p < b:
                v, p = _varint(buf, p)
                out.append(_signed(v, field))
            return out
    raise _Corrupt("bad repeated field")


def _signed(v: int, field: int) -> int:
    if field in (7, 10) and v >= 1 << 63:
        return v - (1 << 64)
    if field == 7 and v >= 1 << 31:  # int32 written as a sign-extended varint
        return v - (1 << 32) if v < 1 << 32 else v
    return v


# ------------------------------------------------------------------------------ one file


class _Scalars:
    """Scalar events of every file as parallel arrays; tags as ids into ``tags``.

    ``order`` ranks records by recency: files oldest first, records in file order (a writer
    appends in time order, so a later record in a file is a later write).
    """

    def __init__(self) -> None:
        self.tags: list[str] = []
        self.steps: list[np.ndarray] = []
        self.tag_ids: list[np.ndarray] = []
        self.values: list[np.ndarray] = []
        self.order: list[np.ndarray] = []
        self._tag_index: dict[bytes, int] = {}

    def tag_id(self, tag: bytes) -> int:
        i = self._tag_index.get(tag)
        if i is None:
            i = self._tag_index[tag] = len(self.tags)
            self.tags.append(tag.decode("utf-8", "backslashreplace"))  # distinct bytes, distinct names
        return i

    def tag_ids_of(self, tags: list[bytes]) -> np.ndarray:
        index = self._tag_index
        get = index.get
        ids = [get(t, -1) for t in tags]
        if -1 in ids:  # first sight of some tags: register them, then look up again
            for t in set(tags).difference(index):
                self.tag_id(t)
            ids = [index[t] for t in tags]
        return np.array(ids, dtype=np.int64)

    def add(self, steps, tag_ids, values, order) -> None:
        self.steps.append(np.asarray(steps, dtype=np.int64))
        self.tag_ids.append(np.asarray(tag_ids, dtype=np.int64))
        self.values.append(np.asarray(values, dtype=np.float64))
        self.order.append(np.asarray(order, dtype=np.int64))


# Sequential stretches: the first one, the longest one (reached by doubling while no period shows),
# the one after a broken prediction (enough records to see a few periods again), and the one after
# a pattern that held a while broke (enough to step over a few one-off records, such as an
# evaluation's scalars between two training steps, and see whether the pattern goes on).
_WALK_FIRST = 4096
_WALK_MAX = 1 << 15
_WALK_MIN = 64
_WALK_RESUME = 32
_RESUME_TAIL = 12  # latest sizes that must follow the broken pattern for it to be taken up again
_RESUME_MISSES = 2  # times in a row it may then break within a period before it is given up
_MAX_PERIOD = 512
_SPAN_MIN = 256  # fewest latest record sizes that must repeat before a period is trusted
_PERIOD_TAIL = 16  # sizes compared for every candidate period before the full check
_PREDICT_MAX = 1 << 16  # records predicted and checked at once


def _frame(buf: bytes) -> np.ndarray:
    """Start offsets of the records, following the length fields (bounds are checked by the caller).

    Every offset is the one the plain walk (read the length at ``pos``, go to ``pos + length + 16``
    until fewer than 8 bytes are left; drop a last offset beyond the end) gives, for any bytes. A
    training log repeats the same record sizes step after step, so once a stretch walked one record
    at a time shows a period, the following offsets are predicted from it and each prediction is
    checked against the length stored there, all at once with numpy; the walk goes on from the
    first offset whose length differs.

    >>> rec = lambda n: struct.pack("<Q", n) + bytes(n + 8)
    >>> _frame(rec(3) + rec(0) + b"xy").tolist()
    [0, 19, 35]
    """
    n = len(buf)
    u64 = _view(buf, "<u8")  # u64[p] is the length field of a record starting at p (p + 8 <= n)
    parts: list[np.ndarray] = []
    pos = 0
    walk = _WALK_FIRST
    held: np.ndarray | None = None  # the pattern that last held for at least a period
    misses = 0  # predictions from ``held`` since, that did not hold for a period
    while True:
        starts, pos, done = _walk(buf, pos, walk)
        if done or pos > n - 8:  # the file ends here or with the next walk (``pos`` may not fit numpy)
            parts.append(np.array(starts, dtype=np.int64))
            if done:
                break
            continue
        starts.append(pos)
        known = np.array(starts, dtype=np.int64)
        parts.append(known[:-1])
        sizes = known[1:] - known[:-1]
        pattern = _resumed(held, sizes) if held is not None else None
        if pattern is None:
            held = None
            period = _period(sizes)
            pattern = sizes[len(sizes) - period :] if period else None
        if pattern is None:
            walk = min(2 * walk, _WALK_MAX)
            continue
        pos, count = _predict(u64, n, pos, pattern, parts)
        if count >= len(pattern):
            held, misses, walk = pattern, 0, _WALK_RESUME
        elif held is not None and misses < _RESUME_MISSES:  # one-off records close together
            misses, walk = misses + 1, _WALK_RESUME
        else:  # a period seen by chance: look again over records that no longer reach back to it
            held, walk = None, max(_WALK_MIN, _period_span(len(pattern)) + 1)
    return np.concatenate(parts)


def _walk(buf: bytes, pos: int, count: int) -> tuple[list[int], int, bool]:
    """Up to ``count`` record starts from ``pos``, the next start, and whether the file ended."""
    starts: list[int] = []
    add = starts.append
    unpack = _U64.unpack_from
    try:
        for _ in range(count):
            add(pos)
            pos += unpack(buf, pos)[0] + 16
    except (struct.error, OverflowError):  # OverflowError: a damaged length sent ``pos`` beyond any offset
        if starts[-1] > len(buf):  # only the last offset can lie beyond the end: every other one was read
            starts.pop()
        return starts, pos, True
    return starts, pos, False


def _windows(a: np.ndarray, width: int) -> np.ndarray:
    """Row ``i`` is ``a[i : i + width]`` (a view; ``a`` must be contiguous)."""
    return np.ndarray((len(a) - width + 1, width), dtype=a.dtype, buffer=a, strides=(a.itemsize, a.itemsize))


def _resumed(pattern: np.ndarray, sizes: np.ndarray) -> np.ndarray | None:
    """``pattern`` turned to the phase that goes on after ``sizes``, if their latest ones follow it."""
    period = len(pattern)
    tail = min(_RESUME_TAIL, len(sizes))
    need = period + tail - 1  # every phase's run of ``tail`` sizes
    ring = np.concatenate((pattern, pattern[: tail - 1])) if tail <= period + 1 else np.resize(pattern, need)
    hits = np.flatnonzero((_windows(ring, tail) == sizes[len(sizes) - tail :]).all(axis=1))
    if not len(hits):
        return None
    turn = (int(hits[0]) + tail) % period
    return np.concatenate((pattern[turn:], pattern[:turn]))


def _period_span(period: int) -> int:
    """How many of the latest record sizes must repeat with ``period`` before it is trusted."""
    return max(8 * period, _SPAN_MIN)


def _period(sizes: np.ndarray) -> int | None:
    """The smallest period with which the latest record sizes repeat, if any (up to ``_MAX_PERIOD``)."""
    m = len(sizes)
    top = min(_MAX_PERIOD, m // 2)
    tail = min(_PERIOD_TAIL, m - top)
    if top < 1 or tail < 1:
        return None
    # Row i holds the ``tail`` sizes ending ``top - i`` records before the last: a cheap first cut.
    rows = _windows(sizes[m - tail - top :], tail)
    agree = (rows[:top] == rows[top]).all(axis=1)
    for period in (top - np.flatnonzero(agree))[::-1].tolist():
        recent = sizes[max(0, m - _period_span(period)) :]
        if np.array_equal(recent[period:], recent[:-period]):
            return period
    return None


def _predict(u64: np.ndarray, n: int, pos: int, pattern: np.ndarray, out: list[np.ndarray]) -> tuple[int, int]:
    """Append to ``out`` the starts from the true start ``pos`` on, assuming the record sizes repeat
    ``pattern``; each is kept only while the length stored at it is the one predicted (so the next
    start is right too). Returns the first start not confirmed, itself a true start, and how many
    were."""
    period = len(pattern)
    offsets = np.cumsum(pattern) - pattern
    lengths = (pattern - 16).astype(np.uint64)
    whole = int(offsets[-1] + pattern[-1])
    reps = max(1, 256 // period)  # doubled while predictions hold: small, in case they soon break
    last = n - 8  # the last offset a length can be read at
    count = 0
    while pos <= last:
        # Periods that cannot start before the end would only waste work (and could overflow int64).
        reps = min(reps, (n - pos) // whole + 1)
        at = (pos + whole * np.arange(reps, dtype=np.int64)[:, None] + offsets).ravel()
        if at[-1] <= last:  # starts only grow: all of them can be read
            ok = u64[at].reshape(reps, period) == lengths
        else:
            fits = at <= last
            ok = fits.reshape(reps, period) & (u64[np.where(fits, at, 0)].reshape(reps, period) == lengths)
        if ok.all():
            out.append(at)
            count += len(at)
            pos += reps * whole
            reps = min(2 * reps, max(1, _PREDICT_MAX // period))
            continue
        first = int(np.argmin(ok.ravel()))
        out.append(at[:first])
        return int(at[first]), count + first
    return pos, count


def _view(buf: bytes, dtype: str) -> np.ndarray:
    """Every byte offset of ``buf`` as the start of a ``dtype`` value: ``view[i]`` reads ``buf[i:i+size]``."""
    size = np.dtype(dtype).itemsize
    count = max(len(buf) - size + 1, 0)
    return np.ndarray((count,), dtype=dtype, buffer=buf, offset=0, strides=(1,))


class _Views:
    def __init__(self, buf: bytes) -> None:
        self.n = len(buf)
        self.u8 = np.frombuffer(buf, dtype=np.uint8)
        self.u32 = _view(buf, "<u4")
        self.u64 = _view(buf, "<u8")
        self.f32 = _view(buf, "<f4")

    def at(self, view: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """``view`` at ``pos``; positions past the end read the last value (callers mask those out)."""
        if not len(view):
            return np.zeros(len(pos), dtype=view.dtype)
        return view[np.clip(pos, 0, len(view) - 1)]


_LEN_CRC: np.ndarray | None = None
_CHUNK = 1 << 15


def _length_crcs(lens: np.ndarray) -> np.ndarray:
    """Masked CRC32C of each length's 8-byte little-endian encoding (a table for lengths < 65536)."""
    global _LEN_CRC
    if _LEN_CRC is None:
        small = np.arange(65536, dtype=np.uint64)
        _LEN_CRC = _masked_crc32c_rows(_le_bytes(small))
    lens = lens.astype(np.uint64)
    out = np.empty(len(lens), dtype=np.uint32)
    small = lens < 65536
    out[small] = _LEN_CRC[lens[small].astype(np.int64)]
    if not small.all():
        out[~small] = _masked_crc32c_rows(_le_bytes(lens[~small]))
    return out


def _le_bytes(x: np.ndarray) -> np.ndarray:
    return np.stack([((x >> np.uint64(8 * k)) & np.uint64(0xFF)).astype(np.uint8) for k in range(8)], axis=1)


def _file_time(buf: bytes, starts: np.ndarray, lens: np.ndarray) -> float:
    """Wall time of the file's first event (its creation), to order files oldest first."""
    if not len(starts):
        return 0.0
    try:
        return parse_event(buf, int(starts[0]) + 12, int(starts[0] + 12 + lens[0]))[0]
    except (_Corrupt, IndexError, struct.error):
        return 0.0


class _EventFile:
    """One event file framed and checked, ready to be decoded."""

    def __init__(self, path: Path, warnings: list[str]) -> None:
        self.path = path
        self.buf = buf = path.read_bytes()
        self.starts = np.zeros(0, dtype=np.int64)
        self.lens = np.zeros(0, dtype=np.int64)
        self.time = 0.0
        if not buf:
            warnings.append(f"{path}: empty event file")
            return
        if not looks_like_event_file(buf[:12]):
            raise SourceError(path, "not a TensorBoard event file (bad record header)")
        n = len(buf)
        v = self.views = _Views(buf)
        starts = _frame(buf)
        starts = starts[starts + 12 <= n]
        raw = v.at(v.u64, starts)
        # Framing is trusted only as far as the length CRCs hold: what follows a damaged record is dropped.
        crc_ok = np.concatenate(
            [_length_crcs(raw[i : i + _CHUNK]) == v.at(v.u32, starts[i : i + _CHUNK] + 8) for i in range(0, len(raw), _CHUNK)]
            or [np.zeros(0, dtype=bool)]
        )
        lens = raw.astype(np.int64)
        overrun = (raw > np.uint64(n)) | (starts + lens + 16 > n)
        bad = ~crc_ok | overrun
        cut = int(np.argmax(bad)) if bad.any() else len(starts)
        if cut < len(starts):
            at = int(starts[cut])
            if crc_ok[cut] and overrun[cut]:
                warnings.append(f"{path}: skipped a half-written last record ({n - at} bytes)")
            else:
                warnings.append(f"{path}: damaged record at byte {at}; read the {cut} record(s) before it")
        elif len(starts) and starts[-1] + lens[-1] + 16 < n:
            warnings.append(f"{path}: skipped a half-written last record")
        self.starts, self.lens = starts[:cut], lens[:cut]
        self.time = _file_time(buf, self.starts, self.lens)

    def decode(self, out: _Scalars, seq: int, warnings: list[str], fast: bool = True) -> int:
        """Add this file's scalars to ``out``; return how many there were."""
        n = len(self.starts)
        if n == 0:
            return 0
        buf = self.buf
        data = self.starts + 12
        end = data + self.lens
        order = np.arange(n, dtype=np.int64) + (seq << 40)
        count = 0
        slow = np.arange(n)
        if fast:
            # Chunks small enough to stay in cache: fresh multi-megabyte temporaries cost more in
            # page faults than the arithmetic done on them.
            parts: list[tuple[np.ndarray, ...]] = []
            slow_parts = []
            for lo in range(0, n, _CHUNK):
                hi = min(n, lo + _CHUNK)
                m, step, value, tag_off, tag_len = _fast_layout(self.views, data[lo:hi], end[lo:hi])
                sel = np.flatnonzero(m)
                if len(sel):
                    ids = _tag_ids(self.views, buf, tag_off[sel], tag_len[sel], out)
                    parts.append((step[sel], ids, value[sel], order[lo:hi][sel]))
                    count += len(sel)
                slow_parts.append(lo + np.flatnonzero(~m))
            if parts:
                out.add(*(np.concatenate(col) for col in zip(*parts)))
            slow = np.concatenate(slow_parts)
        rows: list[tuple[int, int, float, int]] = []
        unreadable = 0
        first_bad = None
        for i in slow.tolist():
            a, b = int(data[i]), int(end[i])
            try:
                _, step_n, scalars = parse_event(buf, a, b)
            except (_Corrupt, IndexError, struct.error, OverflowError):
                unreadable += 1
                first_bad = first_bad if first_bad is not None else a - 12
                continue
            for tag, val in scalars:
                rows.append((step_n, out.tag_id(tag), val, int(order[i])))
        if unreadable:
            warnings.append(f"{self.path}: skipped {unreadable} unreadable record(s) (first at byte {first_bad})")
        if rows:
            out.add(*zip(*rows))
            count += len(rows)
        return count


_U = np.uint64
# Bytes 0..5 after the step: 0x2a (summary), its length, 0x0a (value), its length, 0x0a (tag), tag length.
_SUMMARY_HEAD = _U(0x0A_00_0A_00_2A)


def _fast_layout(v: _Views, data: np.ndarray, end: np.ndarray):
    """Decode every record laid out as ``Event{wall_time, [step], Summary{Value{tag, simple_value}}}``.

    This is what ``SummaryWriter.add_scalar`` writes for tags under 118 bytes and steps under
    2**35. Returns a mask of the records that match the layout exactly (every length consistent
    with the record's size) and, for those, step, value and the tag's offset and length. Eight
    bytes are read at a time, so a record costs five gathers whatever its size.
    """
    m = (end - data >= 16) & (v.at(v.u8, data) == 0x09)
    p = data + 9
    wp = v.at(v.u64, p)  # 0x10 and the step varint, or (step 0 is not written) the summary field
    has_step = (wp & _U(0xFF)) == _U(0x10)
    x = wp >> _U(8)
    ends = ~x & _U(0x80_80_80_80_80)  # high bit clear: the varint's last byte
    m &= ~has_step | (ends != _U(0))  # longer than 5 bytes: left to the general parser
    last = ends & (~ends + _U(1))  # lowest terminator only
    nbytes = 1 + sum((last > _U(0x80 << (8 * k))).astype(np.int64) for k in range(4))
    x &= (last << _U(1)) - _U(1)
    step = (x & _U(0x7F)).astype(np.int64)
    for k in range(1, int(nbytes[has_step].max()) if has_step.any() else 1):
        step |= ((x >> _U(8 * k)) & _U(0x7F)).astype(np.int64) << (7 * k)
    step[~has_step] = 0
    q = p + np.where(has_step, 1 + nbytes, 0)
    # From q the rest of the record is fixed by its size: all three lengths follow from end - q.
    rem = end - q
    m &= (rem >= 11) & (rem < 130)
    r = np.clip(rem, 11, 129).astype(np.uint64)
    expected = _SUMMARY_HEAD | ((r - _U(2)) << _U(8)) | ((r - _U(4)) << _U(24)) | ((r - _U(11)) << _U(40))
    m &= (v.at(v.u64, q) & _U(0xFFFF_FFFF_FFFF)) == expected
    m &= v.at(v.u8, end - 5) == 0x15
    with np.errstate(invalid="ignore"):  # a signalling NaN is still a NaN
        value = v.at(v.f32, end - 4).astype(np.float64)
    return m, step, value, q + 6, rem - 11


_MIX = np.uint64(0x9E3779B97F4A7C15)
_WORD_MASKS = np.array([(1 << (8 * k)) - 1 for k in range(8)] + [(1 << 64) - 1], dtype=np.uint64)


def _tag_ids(v: _Views, buf: bytes, off: np.ndarray, length: np.ndarray, out: _Scalars) -> np.ndarray:
    """A tag id per record: tags hashed eight bytes at a time, then checked word for word."""
    h = length.astype(np.uint64) * _MIX
    words = []
    for j in range(-(-int(length.max()) // 8) if len(length) else 0):
        w = v.at(v.u64, off + 8 * j)
        if int(length.min()) < 8 * (j + 1):  # some tags end inside this word: clear what follows them
            w &= _WORD_MASKS[np.clip(length - 8 * j, 0, 8)]
        words.append(w)
        h = (h ^ w) * _MIX
        h ^= h >> np.uint64(29)
    codes, rep = _factorize(h)
    exact = np.array_equal(length, length[rep][codes]) and all(np.array_equal(w, w[rep][codes]) for w in words)
    if not exact:  # a hash collision: fall back to comparing the tags themselves
        return out.tag_ids_of([buf[a : a + b] for a, b in zip(off.tolist(), length.tolist())])
    local = np.array([out.tag_id(buf[int(off[i]) : int(off[i] + length[i])]) for i in rep.tolist()], dtype=np.int64)
    return local[codes]


def _factorize(h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(code per element, one index per code) without sorting the whole array: logs repeat few tags."""
    uniq = np.unique(h[:4096])
    pos = np.minimum(np.searchsorted(uniq, h), len(uniq) - 1)
    missing = uniq[pos] != h
    if missing.any():
        uniq = np.union1d(uniq, np.unique(h[missing]))
        pos = np.searchsorted(uniq, h)
    rep = np.empty(len(uniq), dtype=np.int64)
    rep[pos] = np.arange(len(h), dtype=np.int64)  # any occurrence will do as the representative
    return pos, rep


# ---------------------------------------------------------------------------- the source


def read_tensorboard(path: Path, fast: bool = True) -> Source:
    """One event file, or every event file under a folder, merged into one Source.

    Files are taken oldest first (by the wall time of their first event). When a step's metric
    was logged more than once, the latest write wins: a run resumed into the same folder re-logs
    the steps after its checkpoint in a newer file. One warning says so.
    """
    files = find_event_files(path) if path.is_dir() else [path]
    if not files:
        raise SourceError(path, "no TensorBoard event files (*tfevents*) in this folder")
    src = Source(path=path, format="tensorboard")
    opened: list[_EventFile] = []
    errors = []
    for f in files:
        try:
            opened.append(_EventFile(f, src.warnings))
        except SourceError as exc:
            if len(files) == 1:
                raise
            errors.append(str(exc))
    if errors:
        src.warnings.append(f"{path}: skipped {len(errors)} unreadable event file(s): {errors[0]}")
    opened.sort(key=lambda e: e.time)  # stable: same-time files keep their name order
    out = _Scalars()
    total = 0
    for seq, ef in enumerate(opened):
        total += ef.decode(out, seq, src.warnings, fast=fast)
        ef.buf = b""  # release the file's bytes as soon as it is decoded
    if not total:
        raise SourceError(path, f"no scalar summaries in {len(files)} event file(s)")
    _pivot(src, out)
    src.context = guess_context(src.metric_names(), None, [s for s, _ in src.steps])
    return src


def _names(tags: list[str], first_seen) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Normalised metric names and, per tag, its column (-1: dropped, e.g. ``train/global_step``)
    and whether it only stands in for another tag.

    Two tags that normalise to one name (``train/completion_length`` next to
    ``train/completions/mean_length``) share a column, as ``normalize_metrics`` merges them in
    one logged dict: the canonically spelled tag wins where both hold a value, else the tag seen
    first in the log; the other fills the steps the winner lacks. The Trainer's end-of-training
    summary (``train/train_runtime``, ...) is dropped, as it is from ``trainer_state.json``.
    """
    groups: dict[str, list[int]] = {}
    for i, tag in enumerate(tags):
        name = normalize(tag)
        if name == "step" or name in SUMMARY_KEYS:
            continue
        groups.setdefault(name, []).append(i)
    names = list(groups)
    col = np.full(len(tags), -1, dtype=np.int64)
    standin = np.zeros(len(tags), dtype=bool)
    for j, name in enumerate(names):
        members = groups[name]
        col[members] = j
        if len(members) > 1:
            canonical = [i for i in members if tags[i] == name or tags[i] == "train/" + name]
            seen = first_seen()
            winner = min(canonical or members, key=lambda i: seen[i])
            standin[[i for i in members if i != winner]] = True
    return names, col, standin


def _pivot(src: Source, out: _Scalars) -> None:
    steps = np.concatenate(out.steps)
    tag_ids = np.concatenate(out.tag_ids)
    values = np.concatenate(out.values)
    order = np.concatenate(out.order)
    if not (order[1:] > order[:-1]).all():
        idx = np.argsort(order, kind="stable")  # a file's slow-path records were appended after its fast ones
        steps, tag_ids, values, order = steps[idx], tag_ids[idx], values[idx], order[idx]

    def first_seen() -> np.ndarray:
        seen = np.full(len(out.tags), np.iinfo(np.int64).max)
        uniq, first = np.unique(tag_ids, return_index=True)
        seen[uniq] = first
        return seen

    names, col_of_tag, standin = _names(out.tags, first_seen)
    cols = col_of_tag[tag_ids]
    keep = cols >= 0
    if not keep.all():
        steps, tag_ids, cols, values, order = steps[keep], tag_ids[keep], cols[keep], values[keep], order[keep]
    if len(steps) == 0:
        raise SourceError(src.path, "no scalar metrics besides the step counter")
    # Rows: one per distinct step. A single writer's steps never decrease, which spares a sort.
    if (steps[1:] >= steps[:-1]).all():
        new = np.empty(len(steps), dtype=bool)
        new[0] = True
        np.not_equal(steps[1:], steps[:-1], out=new[1:])
        uniq = steps[new]
        row = np.cumsum(new) - 1
    else:
        uniq, row = np.unique(steps, return_inverse=True)
        row = row.reshape(-1)
    ncol = len(names)
    key = row * ncol + cols
    if standin.any():  # an alias counts only at steps its canonical twin did not log
        sub = standin[tag_ids]
        drop = sub & np.isin(key, key[~sub])
        if drop.any():
            key, values, order = key[~drop], values[~drop], order[~drop]
    if np.bincount(key, minlength=len(uniq) * ncol).max() > 1:
        _resolve_duplicates(src, key, values, order, uniq, ncol)
        srt = np.argsort(key, kind="stable")  # ties stay in write order: the last one is the latest
        last = np.ones(len(srt), dtype=bool)
        last[:-1] = key[srt][1:] != key[srt][:-1]
        keep = srt[last]
        key, values = key[keep], values[keep]
    matrix = np.full(len(uniq) * ncol, np.nan)
    present = np.zeros(len(uniq) * ncol, dtype=bool)
    matrix[key] = values
    present[key] = True
    matrix = matrix.reshape(len(uniq), ncol)
    present = present.reshape(len(uniq), ncol)
    full = present.all(axis=1).tolist()
    rows = matrix.tolist()
    result: list[tuple[int, dict[str, Any]]] = []
    for k, s in enumerate(uniq.tolist()):
        if full[k]:
            result.append((s, dict(zip(names, rows[k]))))
        else:
            r = rows[k]
            result.append((s, {names[j]: r[j] for j in np.flatnonzero(present[k]).tolist()}))
    src.steps = result


def _resolve_duplicates(src: Source, key: np.ndarray, values: np.ndarray, order: np.ndarray, uniq: np.ndarray, ncol: int) -> None:
    """Warn once when a (step, metric) was written more than once with different values or by different files.

    The Trainer itself re-logs ``epoch`` with its end-of-training summary (same file, same
    value): that is not worth a warning.
    """
    srt = np.lexsort((order, key))
    k, v, o = key[srt], values[srt], order[srt]
    same_key = k[1:] == k[:-1]
    a, b = v[:-1], v[1:]
    differ = ~((a == b) | (np.isnan(a) & np.isnan(b))) | ((o[:-1] >> 40) != (o[1:] >> 40))
    clash = same_key & differ
    if clash.any():
        dup_steps = np.unique(uniq[k[1:][clash] // ncol])
        src.warnings.append(
            f"{src.path}: {len(dup_steps)} step(s) logged more than once (first at step {int(dup_steps[0])}, "
            "e.g. a resumed run); the latest write wins"
        )


class TensorBoardReader(Reader):
    name = "tensorboard"
    formats = ("tensorboard",)
    describes = "TensorBoard"
    folder_holds = "TensorBoard event files"

    def sniff(self, probe: Probe) -> str | None:
        if probe.is_dir:
            return "tensorboard" if find_event_files(probe.path) else None
        head = probe.head
        if looks_like_event_file(head) or ("tfevents" in probe.path.name and head.lstrip()[:1] not in (b"{", b"[")):
            return "tensorboard"
        return None

    def one_run(self, folder: Path) -> bool:
        # Event files beside the folder's other entries; deeper ones belong to the runs below it.
        return any("tfevents" in f.name for f in folder.iterdir() if f.is_file())

    def read(self, probe: Probe, fmt: str) -> Source:
        return read_tensorboard(probe.path)
