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

from monitor.metrics import SUMMARY_KEYS, normalize
from monitor.sources._base import Source, SourceError, guess_context

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


def parse_event(buf: bytes, pos: int, end: int) -> tuple[float, int, list[tuple[str, float]]]:
    """Wall time, step and the scalar ``(tag, value)`` pairs of one serialised ``Event``."""
    wall, step, scalars = 0.0, 0, []
    for field, wire, a, b in _fields(buf, pos, end):
        if field == 1 and wire == 1:
            wall = _F64.unpack_from(buf, a)[0]
        elif field == 2 and wire == 0:
            step = _varint(buf, a)[0]
            if step >= 1 << 63:
                step -= 1 << 64
        elif field == 5 and wire == 2:
            for f2, w2, c, d in _fields(buf, a, b):
                if f2 == 1 and w2 == 2:
                    item = _parse_value(buf, c, d)
                    if item is not None:
                        scalars.append(item)
    return wall, step, scalars


def _parse_value(buf: bytes, pos: int, end: int) -> tuple[str, float] | None:
    tag = node = None
    value = None
    for field, wire, a, b in _fields(buf, pos, end):
        if field == 1 and wire == 2:
            tag = buf[a:b].decode("utf-8", "replace")
        elif field == 7 and wire == 2:
            node = buf[a:b].decode("utf-8", "replace")
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
    """Scalar events of one file as parallel arrays (tags as ids into ``tags``)."""

    def __init__(self) -> None:
        self.tags: list[str] = []
        self.steps: list[np.ndarray] = []
        self.tag_ids: list[np.ndarray] = []
        self.values: list[np.ndarray] = []
        self.walls: list[np.ndarray] = []
        self.order: list[np.ndarray] = []
        self._tag_index: dict[str, int] = {}

    def tag_id(self, tag: str) -> int:
        i = self._tag_index.get(tag)
        if i is None:
            i = self._tag_index[tag] = len(self.tags)
            self.tags.append(tag)
        return i

    def add(self, steps, tag_ids, values, walls, order) -> None:
        self.steps.append(np.asarray(steps, dtype=np.int64))
        self.tag_ids.append(np.asarray(tag_ids, dtype=np.int64))
        self.values.append(np.asarray(values, dtype=np.float64))
        self.walls.append(np.asarray(walls, dtype=np.float64))
        self.order.append(np.asarray(order, dtype=np.int64))


def _frame(buf: bytes) -> tuple[np.ndarray, int]:
    """Start offsets of every complete record, and the offset where framing stopped."""
    n = len(buf)
    starts: list[int] = []
    add = starts.append
    unpack = _U64.unpack_from
    pos = 0
    while pos + 12 <= n:
        end = pos + unpack(buf, pos)[0] + 16
        if end > n:
            break
        add(pos)
        pos = end
    return np.array(starts, dtype=np.int64), pos


def _gather(arr: np.ndarray, idx: np.ndarray, width: int) -> np.ndarray:
    """``arr[idx + 0 .. idx + width - 1]`` as an ``(len(idx), width)`` array, clipped to ``arr``."""
    full = idx[:, None] + np.arange(width, dtype=np.int64)
    np.minimum(full, len(arr) - 1, out=full)
    return arr[full]


def _varint_vec(arr: np.ndarray, pos: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Decode varints of at most ``width`` bytes at ``pos``: (value, byte count, ok)."""
    raw = _gather(arr, pos, width).astype(np.int64)
    ends = raw < 0x80
    ok = ends.any(axis=1)
    nbytes = np.argmax(ends, axis=1) + 1
    shifts = np.arange(width, dtype=np.int64) * 7
    keep = np.arange(width)[None, :] < nbytes[:, None]
    value = (((raw & 0x7F) << shifts) * keep).sum(axis=1)
    return value, nbytes, ok


def _tag_ids(arr: np.ndarray, off: np.ndarray, length: np.ndarray, out: _Scalars) -> np.ndarray:
    """A tag id per record, computed per tag length with a row hash verified byte for byte."""
    ids = np.empty(len(off), dtype=np.int64)
    for tl in np.unique(length):
        sel = np.flatnonzero(length == tl)
        width = max(8, -(-int(tl) // 8) * 8)
        rows = _gather(arr, off[sel], width)
        if tl < width:
            rows[:, int(tl):] = 0
        words = np.ascontiguousarray(rows).view(np.uint64)
        h = words[:, 0].copy()
        for c in range(1, words.shape[1]):
            h = h * np.uint64(0x9E3779B97F4A7C15) + words[:, c]
        uniq, first, inverse = np.unique(h, return_index=True, return_inverse=True)
        if not np.array_equal(words, words[first][inverse]):  # a hash collision: compare whole rows
            uniq_rows, first, inverse = np.unique(words, axis=0, return_index=True, return_inverse=True)
        inverse = inverse.reshape(-1)
        local = np.array(
            [out.tag_id(bytes(rows[i, : int(tl)]).decode("utf-8", "replace")) for i in first], dtype=np.int64
        )
        ids[sel] = local[inverse]
    return ids


def read_event_file(path: Path, out: _Scalars, seq: int, warnings: list[str], fast: bool = True) -> int:
    """Add the scalars of one event file to ``out``; return how many scalar events it held."""
    buf = path.read_bytes()
    if not buf:
        warnings.append(f"{path}: empty event file")
        return 0
    if not looks_like_event_file(buf[:12]):
        raise SourceError(path, "not a TensorBoard event file (bad record header)")
    arr = np.frombuffer(buf, dtype=np.uint8)
    starts, stop = _frame(buf)
    # Framing trusted only as far as the length CRCs hold: garbage after a damaged record is dropped.
    head = _gather(arr, starts, 12)
    lens = np.ascontiguousarray(head[:, :8]).view("<u8").reshape(-1).astype(np.int64)
    stored = np.ascontiguousarray(head[:, 8:12]).view("<u4").reshape(-1)
    bad = np.flatnonzero(_masked_crc32c_rows(head[:, :8]) != stored)
    if len(bad):
        cut = int(bad[0])
        warnings.append(
            f"{path}: damaged record at byte {int(starts[cut])}; read the {cut} record(s) before it"
        )
        starts, lens = starts[:cut], lens[:cut]
    elif stop < len(buf):
        if stop + 12 <= len(buf) and not looks_like_event_file(buf[stop : stop + 12]):
            warnings.append(
                f"{path}: damaged record at byte {stop}; read the {len(starts)} record(s) before it"
            )
        else:
            warnings.append(f"{path}: skipped a half-written last record ({len(buf) - stop} bytes)")
    n = len(starts)
    if n == 0:
        return 0
    data = starts + 12
    end = data + lens
    order = np.arange(n, dtype=np.int64) + (seq << 40)
    fast_mask = np.zeros(n, dtype=bool)
    count = 0
    if fast:
        m, step, wall, value, tag_off, tag_len = _fast_layout(arr, data, end)
        fast_mask = m
        if m.any():
            ids = _tag_ids(arr, tag_off[m], tag_len[m], out)
            out.add(step[m], ids, value[m], wall[m], order[m])
            count += int(m.sum())
    slow = np.flatnonzero(~fast_mask)
    rows: list[tuple[int, int, float, float, int]] = []
    unreadable = 0
    first_bad = None
    for i in slow.tolist():
        a, b = int(data[i]), int(end[i])
        try:
            wall_t, step_n, scalars = parse_event(buf, a, b)
        except (_Corrupt, IndexError, struct.error, OverflowError):
            unreadable += 1
            first_bad = first_bad if first_bad is not None else a - 12
            continue
        for tag, v in scalars:
            rows.append((step_n, out.tag_id(tag), v, wall_t, int(order[i])))
    if unreadable:
        warnings.append(f"{path}: skipped {unreadable} unreadable record(s) (first at byte {first_bad})")
    if rows:
        cols = list(zip(*rows))
        out.add(*cols)
        count += len(rows)
    return count


def _fast_layout(arr: np.ndarray, data: np.ndarray, end: np.ndarray):
    """Decode every record laid out as ``Event{wall_time, [step], Summary{Value{tag, simple_value}}}``.

    Returns a mask of the records that match this layout exactly (every length consistent with
    the record's size) and, for those, step, wall time, value and the tag's offset and length.
    """
    size = len(arr)
    m = (end - data >= 16) & (arr[np.minimum(data, size - 1)] == 0x09)
    wall = np.ascontiguousarray(_gather(arr, data + 1, 8)).view("<f8").reshape(-1)
    p = data + 9
    has_step = arr[np.minimum(p, size - 1)] == 0x10
    step, step_n, ok = _varint_vec(arr, p + 1, 9)
    m &= ~has_step | ok
    step = np.where(has_step, step, 0)
    q = np.where(has_step, p + 1 + step_n, p)
    m &= arr[np.minimum(q, size - 1)] == 0x2A
    slen, sn, ok = _varint_vec(arr, q + 1, 3)
    r = q + 1 + sn
    m &= ok & (r + slen == end)
    m &= arr[np.minimum(r, size - 1)] == 0x0A
    vlen, vn, ok = _varint_vec(arr, r + 1, 3)
    t = r + 1 + vn
    m &= ok & (t + vlen == end)
    m &= arr[np.minimum(t, size - 1)] == 0x0A
    tlen, tn, ok = _varint_vec(arr, t + 1, 3)
    tag_off = t + 1 + tn
    f = tag_off + tlen
    m &= ok & (f + 5 == end)
    m &= arr[np.clip(f, 0, size - 1)] == 0x15
    value = np.ascontiguousarray(_gather(arr, np.clip(f + 1, 0, size - 1), 4)).view("<f4").reshape(-1).astype(np.float64)
    return m, step, wall, value, tag_off, tlen


# ---------------------------------------------------------------------------- the source


def read_tensorboard(path: Path, fast: bool = True) -> Source:
    """One event file, or every event file under a folder, merged into one Source.

    Files are taken oldest first (by their first event's wall time); when a step's metric was
    logged more than once (a run resumed into the same folder re-logs the steps after its
    checkpoint) the record with the later wall time wins, and one warning says so.
    """
    files = find_event_files(path) if path.is_dir() else [path]
    if not files:
        raise SourceError(path, "no TensorBoard event files (*tfevents*) in this folder")
    src = Source(path=path, format="tensorboard")
    out = _Scalars()
    total = 0
    errors = []
    for seq, f in enumerate(files):
        try:
            total += read_event_file(f, out, seq, src.warnings, fast=fast)
        except SourceError as exc:
            if len(files) == 1:
                raise
            errors.append(str(exc))
    if errors:
        src.warnings.append(f"{path}: skipped {len(errors)} unreadable event file(s): {errors[0]}")
    if not total:
        raise SourceError(path, f"no scalar summaries in {len(files)} event file(s)")
    _pivot(src, out)
    src.context = guess_context(src.metric_names(), None, [s for s, _ in src.steps])
    return src


def _names(tags: list[str]) -> tuple[list[str], np.ndarray]:
    """Normalised metric names and, per tag, its column (-1: dropped, e.g. ``train/global_step``).

    Two tags that normalise to one name (``train/completion_length`` next to
    ``train/completions/mean_length``): the tag already spelled canonically wins, else the first.
    The Trainer's end-of-training summary (``train/train_runtime``, ...) is dropped, as it is from
    ``trainer_state.json``.
    """
    chosen: dict[str, int] = {}
    for i, tag in enumerate(tags):
        name = normalize(tag)
        if name == "step" or name in SUMMARY_KEYS:  # the end-of-training summary is not a step
            continue
        canonical = tag == name or (tag.startswith("train/") and tag[6:] == name)
        if name not in chosen or canonical:
            chosen[name] = i
    names = list(chosen)
    col = np.full(len(tags), -1, dtype=np.int64)
    for j, name in enumerate(names):
        col[chosen[name]] = j
    return names, col


def _pivot(src: Source, out: _Scalars) -> None:
    steps = np.concatenate(out.steps)
    cols_all = np.concatenate(out.tag_ids)
    values = np.concatenate(out.values)
    walls = np.concatenate(out.walls)
    order = np.concatenate(out.order)
    names, col_of_tag = _names(out.tags)
    cols = col_of_tag[cols_all]
    keep = cols >= 0
    if not keep.all():
        steps, cols, values, walls, order = steps[keep], cols[keep], values[keep], walls[keep], order[keep]
    if len(steps) == 0:
        raise SourceError(src.path, "no scalar metrics besides the step counter")
    idx = np.lexsort((order, walls, cols, steps))
    steps, cols, values, order = steps[idx], cols[idx], values[idx], order[idx]
    # The last record of every (step, metric) group wins.
    last = np.ones(len(steps), dtype=bool)
    last[:-1] = (steps[1:] != steps[:-1]) | (cols[1:] != cols[:-1])
    if not last.all():
        # Worth a warning only when files overlap or values disagree: the Trainer itself re-logs
        # ``epoch`` with its end-of-training summary, same file, same value.
        a, b = values[:-1], values[1:]
        differ = ~((a == b) | (np.isnan(a) & np.isnan(b))) | ((order[:-1] >> 40) != (order[1:] >> 40))
        clash = ~last[:-1] & differ
        if clash.any():
            dup_steps = np.unique(steps[:-1][clash])
            src.warnings.append(
                f"{src.path}: {len(dup_steps)} step(s) logged more than once (first at step {int(dup_steps[0])}, "
                "e.g. a resumed run); the later record wins"
            )
        steps, cols, values = steps[last], cols[last], values[last]
    uniq, row = np.unique(steps, return_inverse=True)
    ncol = len(names)
    matrix = np.full((len(uniq), ncol), np.nan)
    present = np.zeros((len(uniq), ncol), dtype=bool)
    matrix[row, cols] = values
    present[row, cols] = True
    full = present.all(axis=1)
    name_arr = names
    result: list[tuple[int, dict[str, Any]]] = []
    rows = matrix.tolist()
    step_list = uniq.tolist()
    full_list = full.tolist()
    for k, s in enumerate(step_list):
        if full_list[k]:
            result.append((s, dict(zip(name_arr, rows[k]))))
        else:
            pres = present[k]
            result.append((s, {name_arr[j]: rows[k][j] for j in np.flatnonzero(pres).tolist()}))
    src.steps = result
