"""A braille line chart that redraws a long history in constant time per appended point.

Each series is reduced to buckets of ``w`` steps (``w`` a power of two chosen so the whole run
fits the chart's pixel width) holding the bucket's min, max, first and last value. Min/max
buckets keep spikes visible however long the run; and because bucket boundaries only move when
``w`` doubles, appending a step touches only the last bucket. Drawing then costs O(chart width),
not O(history).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.strip import Strip
from textual.widget import Widget

from grpo_monitor.app.dashboard.model import RunModel

# Braille dot bits by (row in cell 0..3, column in cell 0..1).
_DOTS = np.array([[0x01, 0x08], [0x02, 0x10], [0x04, 0x20], [0x40, 0x80]], dtype=np.uint16)
N_SERIES_STYLES = 6
_MARK = {"critical": "◆", "warning": "▲", "info": "△"}


def fmt(v: float | None) -> str:
    """A number in at most 8 characters.

    >>> fmt(0.41234), fmt(12345.0), fmt(0.0), fmt(None), fmt(2.5e-05)
    ('0.4123', '1.23e+04', '0', '—', '2.50e-05')
    """
    if v is None:
        return "—"
    if not math.isfinite(v):
        return str(v)
    a = abs(v)
    if a != 0 and (a >= 1e4 or a < 1e-3):
        return f"{v:.2e}"
    return f"{v:.4g}"


class Buckets:
    """Per ``w``-step bucket: min, max, first and last finite value and where the first and
    last of them lie; kept incrementally as the series grows."""

    __slots__ = ("origin", "w", "n_done", "ids", "lo", "hi", "first", "last", "fx", "lx")

    def __init__(self, origin: float, w: float) -> None:
        self.origin, self.w, self.n_done = origin, w, 0
        self.ids: list[int] = []
        self.lo: list[float] = []
        self.hi: list[float] = []
        self.first: list[float] = []
        self.last: list[float] = []
        self.fx: list[float] = []
        self.lx: list[float] = []

    def update(self, xs: np.ndarray, ys: np.ndarray) -> None:
        n = len(xs)
        if n <= self.n_done:
            return
        x, y = xs[self.n_done : n], ys[self.n_done : n]
        self.n_done = n
        ok = np.isfinite(y)
        if not ok.all():
            x, y = x[ok], y[ok]
        if not x.size:
            return
        b = np.floor((x - self.origin) / self.w).astype(np.int64)
        starts = np.flatnonzero(np.r_[True, b[1:] != b[:-1]])
        ends = np.r_[starts[1:], b.size] - 1
        ids = b[starts].tolist()
        lo = np.minimum.reduceat(y, starts).tolist()
        hi = np.maximum.reduceat(y, starts).tolist()
        first, last = y[starts].tolist(), y[ends].tolist()
        fx, lx = x[starts].tolist(), x[ends].tolist()
        if self.ids and self.ids[-1] == ids[0]:
            self.lo[-1] = min(self.lo[-1], lo[0])
            self.hi[-1] = max(self.hi[-1], hi[0])
            self.last[-1] = last[0]
            self.lx[-1] = lx[0]
            ids, lo, hi, first, last, fx, lx = ids[1:], lo[1:], hi[1:], first[1:], last[1:], fx[1:], lx[1:]
        self.ids += ids
        self.lo += lo
        self.hi += hi
        self.first += first
        self.last += last
        self.fx += fx
        self.lx += lx

    def coarsen(self, factor: int) -> Buckets:
        """The same data in buckets ``factor`` times wider (no pass over the raw history)."""
        out = Buckets(self.origin, self.w * factor)
        out.n_done = self.n_done
        for i, b in enumerate(self.ids):
            nb = b // factor
            if out.ids and out.ids[-1] == nb:
                out.lo[-1] = min(out.lo[-1], self.lo[i])
                out.hi[-1] = max(out.hi[-1], self.hi[i])
                out.last[-1] = self.last[i]
                out.lx[-1] = self.lx[i]
            else:
                out.ids.append(nb)
                out.lo.append(self.lo[i])
                out.hi.append(self.hi[i])
                out.first.append(self.first[i])
                out.last.append(self.last[i])
                out.fx.append(self.fx[i])
                out.lx.append(self.lx[i])
        return out

    def arrays(self) -> tuple[np.ndarray, ...]:
        """(first x, last x, lo, hi, first, last) as float arrays, for drawing."""
        return tuple(np.asarray(v, dtype=np.float64) for v in (self.fx, self.lx, self.lo, self.hi, self.first, self.last))


def bucket_width(span: float, pixels: int) -> float:
    """The smallest power of two (at least 1) such that ``span`` steps fit ``pixels`` buckets.

    >>> bucket_width(50, 140), bucket_width(100_000, 140)
    (1.0, 1024.0)
    """
    if span <= 0 or pixels <= 0:
        return 1.0
    return float(2 ** max(0, math.ceil(math.log2(max(span / pixels, 1.0)))))


def column_spans(
    fx: np.ndarray, lx: np.ndarray, lo: np.ndarray, hi: np.ndarray, first: np.ndarray, last: np.ndarray,
    x0: float, x1: float, ymin: float, ymax: float, cols: int, rows: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Pixel rows [top, bottom] lit in each of ``cols`` pixel columns (top > bottom: none).

    A bucket lights its min..max in the columns from its first to its last point, and consecutive
    buckets are joined by a line from the last value of one to the first value of the next.
    """
    top = np.full(cols, np.inf)
    bot = np.full(cols, -np.inf)
    if not fx.size:
        return top, bot

    def col(x: np.ndarray) -> np.ndarray:
        if x1 <= x0:
            return np.zeros(x.size, dtype=np.int64)
        return np.clip(np.rint((x - x0) / (x1 - x0) * (cols - 1)), 0, cols - 1).astype(np.int64)

    scale = (rows - 1) / (ymax - ymin)
    cf, cl = col(fx), col(lx)
    r_hi, r_lo = np.rint((ymax - hi) * scale), np.rint((ymax - lo) * scale)  # high value = small row
    r_first, r_last = (ymax - first) * scale, (ymax - last) * scale
    width = cl - cf  # a bucket is at most about two pixel columns wide
    for off in range(int(width.max()) + 1):
        m = width >= off
        np.minimum.at(top, cf[m] + off, r_hi[m])
        np.maximum.at(bot, cf[m] + off, r_lo[m])
    if fx.size > 1:
        a, b = cl[:-1], cf[1:]
        ra, rb = r_last[:-1], r_first[1:]
        same = a == b  # both ends in one column: that column spans them
        np.minimum.at(top, a[same], np.rint(np.minimum(ra, rb)[same]))
        np.maximum.at(bot, a[same], np.rint(np.maximum(ra, rb)[same]))
        span = np.arange(cols)
        k = np.searchsorted(a, span, side="right") - 1
        inside = k >= 0
        inside[inside] &= span[inside] < b[k[inside]]
        cc, kk = span[inside], k[inside]
        d = (b[kk] - a[kk]).astype(np.float64)
        y0 = ra[kk] + (rb[kk] - ra[kk]) * (cc - a[kk]) / d
        y1 = ra[kk] + (rb[kk] - ra[kk]) * (cc + 1 - a[kk]) / d
        # Each column takes the line from its own x to half-way to the next column.
        ymid = (y0 + y1) / 2
        top[cc] = np.minimum(top[cc], np.rint(np.minimum(y0, ymid)))
        bot[cc] = np.maximum(bot[cc], np.rint(np.maximum(y0, ymid)))
        nxt = cc + 1
        okn = nxt < cols
        np.minimum.at(top, nxt[okn], np.rint(np.minimum(ymid, y1))[okn])
        np.maximum.at(bot, nxt[okn], np.rint(np.maximum(ymid, y1))[okn])
    np.clip(top, 0, rows - 1, out=top)
    np.clip(bot, 0, rows - 1, out=bot)
    return top, bot


def braille(top: np.ndarray, bot: np.ndarray, cell_rows: int) -> np.ndarray:
    """Braille dot bits per character cell for lit pixel spans (2 pixel columns, 4 rows per cell)."""
    cols = top.size
    r = np.arange(cell_rows * 4)[:, None]
    lit = (r >= top[None, :]) & (r <= bot[None, :])
    lit = lit.reshape(cell_rows, 4, cols // 2, 2)
    return np.einsum("ijkl,jl->ik", lit.astype(np.uint16), _DOTS).astype(np.uint16)


@dataclass
class SeriesSpec:
    label: str
    metric: str


@dataclass
class _Cache:
    key: tuple[Any, ...] = ()
    strips: list[Strip] = field(default_factory=list)


class LineChart(Widget):
    """A titled braille chart of one or more metrics of a ``RunModel``, with finding onsets marked."""

    COMPONENT_CLASSES = {
        *(f"linechart--s{i}" for i in range(N_SERIES_STYLES)),
        "linechart--title",
        "linechart--axis",
        "linechart--ref",
        "linechart--critical",
        "linechart--warning",
        "linechart--info",
    }
    DEFAULT_CSS = """
    LineChart { height: 9; min-height: 4; }
    """

    def __init__(
        self,
        title: str,
        series: Callable[[RunModel], Sequence[SeriesSpec]] | Sequence[SeriesSpec],
        *,
        refs: Callable[[RunModel], Sequence[tuple[str, float]]] | None = None,
        absent: Callable[[RunModel], str | None] | None = None,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        super().__init__(id=id, classes=classes)
        self.title = title
        self._series = series
        self._refs = refs
        self._absent = absent  # why none of the series is logged, when the run's config says
        self.model: RunModel | None = None
        self._buckets: dict[str, Buckets] = {}
        self._gen = -1
        self._cache = _Cache()
        self._style_cache: dict[str, Style] | None = None
        self.rendered_n = -1  # store rows drawn in the last rebuild
        self.rendered_at = 0.0  # perf_counter() at the end of the last rebuild

    def bind(self, model: RunModel) -> None:
        self.model = model
        self.refresh()

    def series(self) -> list[SeriesSpec]:
        if self.model is None:
            return []
        s = self._series(self.model) if callable(self._series) else self._series
        return list(s)

    def empty_message(self) -> str:
        """What the chart says while none of its series has a value."""
        model = self.model
        if model is not None and self._absent is not None:
            why = self._absent(model)
            if why:
                return why
        if model is not None and model.store.n and (model.finished or model.source_format is not None):
            return "not logged in this run"  # nothing more will come
        return "waiting for data…"

    def notify_style_update(self) -> None:
        self._cache = _Cache()  # theme change: component colours are part of what we drew
        self._style_cache = None
        super().notify_style_update()

    # -- data ------------------------------------------------------------------------------
    def _buckets_for(self, name: str, xs: np.ndarray, ys: np.ndarray, w: float) -> Buckets:
        b = self._buckets.get(name)
        origin = float(xs[0])
        if b is None or b.origin != origin or b.w > w:
            b = Buckets(origin, w)
        elif b.w < w:
            b = b.coarsen(int(w // b.w))
        b.update(xs, ys)
        self._buckets[name] = b
        return b

    def render_line(self, y: int) -> Strip:
        width, height = self.size.width, self.size.height
        model = self.model
        store = model.store if model is not None else None
        key = (
            width, height,
            store.gen if store else -1, store.n if store else -1,
            len(model.findings) if model else 0,
            len(store.names) if store else 0,
            len(model.headers) if model else 0,
            model.finished if model else False,
        )
        if key != self._cache.key:
            self._cache = _Cache(key, self._build(width, height))
            self.rendered_n = store.n if store else -1
            self.rendered_at = time.perf_counter()
        strips = self._cache.strips
        return strips[y] if 0 <= y < len(strips) else Strip.blank(width, self.rich_style)

    # -- drawing ---------------------------------------------------------------------------
    def _styles(self) -> dict[str, Style]:
        if self._style_cache is not None:
            return self._style_cache
        self._style_cache = self._resolve_styles()
        return self._style_cache

    def _resolve_styles(self) -> dict[str, Style]:
        base = self.rich_style
        names = [*(f"s{i}" for i in range(N_SERIES_STYLES)), "title", "axis", "ref", "critical", "warning", "info"]
        out = {n: base + self.get_component_rich_style(f"linechart--{n}", partial=True) for n in names}
        out["base"] = base
        return out

    def _build(self, width: int, height: int) -> list[Strip]:
        st = self._styles()
        base = st["base"]
        model = self.model
        specs = self.series()
        store = model.store if model is not None else None
        if store is not None and store.gen != self._gen:
            self._buckets.clear()
            self._gen = store.gen
        present = [s for s in specs if store is not None and store.has(s.metric)]
        refs = list(self._refs(model)) if (self._refs and model is not None) else []

        title = Text(no_wrap=True, overflow="ellipsis")
        title.append(self.title, st["title"])
        for i, s in enumerate(present):
            v = model.latest_metric(s.metric) if model is not None else None
            if len(present) > 1 or s.label != self.title:
                title.append("  ▪", st[f"s{i % N_SERIES_STYLES}"])
                title.append(f"{s.label} ", st["title"])
            else:
                title.append("  ")
            title.append(fmt(v), st[f"s{i % N_SERIES_STYLES}"])
        for label, value in refs:
            title.append(f"  ┄{label} {fmt(value)}", st["ref"])
        lines = [Strip(title.render(self.app.console), title.cell_len).adjust_cell_length(width, base)]
        if height < 2:
            return lines[:height]
        plot_h = height - 2
        blank = Strip.blank(width, base)
        if not present or store is None or store.n == 0 or plot_h < 1:
            msg = Text(self.empty_message() if not present else "", style=st["axis"])
            mid = Strip(msg.render(self.app.console), msg.cell_len)
            body = [blank] * max(0, height - 1)
            if body:
                pad = max(0, (width - msg.cell_len) // 2)
                body[len(body) // 2] = Strip([Segment(" " * pad, base), *mid]).adjust_cell_length(width, base)
            return lines + body

        xs = store.steps
        x0, x1 = float(xs[0]), float(xs[-1])
        # Provisional width for the y labels; the plot area is what is left.
        label_w = 8
        plot_w = max(1, width - label_w - 1)
        w = bucket_width(x1 - x0, plot_w * 2)
        data = []
        for s in present:
            b = self._buckets_for(s.metric, xs, store.column(s.metric), w)
            if b.ids:
                data.append((s, b))
        ymin, ymax = math.inf, -math.inf
        for _, b in data:
            ymin = min(ymin, min(b.lo))
            ymax = max(ymax, max(b.hi))
        for _, v in refs:
            if math.isfinite(v):
                ymin, ymax = min(ymin, v), max(ymax, v)
        if not math.isfinite(ymin):
            ymin, ymax = 0.0, 1.0
        if ymax - ymin <= 1e-12 * max(1.0, abs(ymax)):
            pad = abs(ymax) * 0.1 or 1.0
            ymin, ymax = ymin - pad, ymax + pad
        labels = [fmt(ymax), fmt((ymax + ymin) / 2), fmt(ymin)]
        label_w = max(len(s) for s in labels) + 1
        plot_w = max(1, width - label_w - 1)
        cols, rows = plot_w * 2, plot_h * 4
        exact = label_w + 1 + plot_w == width  # rows come out at the widget's width: no re-measuring

        codes = np.zeros((plot_h, plot_w), dtype=np.uint16)
        owner = np.full((plot_h, plot_w), -1, dtype=np.int16)
        for i in range(len(data) - 1, -1, -1):  # first series drawn last, so it stays on top
            s, b = data[i]
            top, bot = column_spans(*b.arrays(), x0, x1, ymin, ymax, cols, rows)
            bits = braille(top, bot, plot_h)
            lit = bits > 0
            codes |= bits
            owner[lit] = present.index(s) % N_SERIES_STYLES

        # Overlays on empty cells: finding onsets (vertical) and reference levels (horizontal).
        style_ids = owner.astype(np.int16)
        chars = np.where(codes > 0, 0x2800 + codes, 0x20).astype(np.uint32)
        extra = {N_SERIES_STYLES: "ref", N_SERIES_STYLES + 1: "critical", N_SERIES_STYLES + 2: "warning",
                 N_SERIES_STYLES + 3: "info"}
        empty = codes == 0
        for _, v in refs:
            if math.isfinite(v):
                r = int(np.clip(round((ymax - v) / (ymax - ymin) * (rows - 1)), 0, rows - 1)) // 4
                m = empty[r]
                chars[r, m] = ord("┄")
                style_ids[r, m] = N_SERIES_STYLES
        marks: list[tuple[int, str]] = []
        if model is not None:
            for f in model.findings:
                at = f.get("onset_step")
                at = f.get("step") if at is None else at
                if not isinstance(at, (int, float)) or not x0 <= at <= x1:
                    continue
                sev = f.get("severity") if f.get("severity") in _MARK else "info"
                pc = 0 if x1 == x0 else int(round((at - x0) / (x1 - x0) * (cols - 1)))
                marks.append((pc // 2, str(sev)))
        sev_rank = {"info": 0, "warning": 1, "critical": 2}
        marks.sort(key=lambda m: sev_rank[m[1]])
        for c, sev in marks:
            col = empty[:, c] & (chars[:, c] != ord("┄"))
            chars[col, c] = ord("┊")
            style_ids[col, c] = N_SERIES_STYLES + 1 + ["critical", "warning", "info"].index(sev)
        style_of = [st[f"s{i}"] for i in range(N_SERIES_STYLES)] + [st[extra[k]] for k in sorted(extra)]

        label_rows = {0: labels[0], plot_h // 2: labels[1], plot_h - 1: labels[2]} if plot_h >= 3 else {
            0: labels[0], plot_h - 1: labels[2]}
        for r in range(plot_h):
            segs = [Segment(label_rows.get(r, "").rjust(label_w - 1) + " ", st["axis"]),
                    Segment("┤" if r in label_rows else "│", st["axis"])]
            row_chars = chars[r].tobytes().decode("utf-32-le")
            ids = style_ids[r]
            cuts = np.flatnonzero(np.diff(ids)) + 1
            start = 0
            for end in [*cuts.tolist(), plot_w]:
                sid = int(ids[start])
                segs.append(Segment(row_chars[start:end], style_of[sid] if sid >= 0 else base))
                start = end
            lines.append(Strip(segs, width) if exact else Strip(segs).adjust_cell_length(width, base))

        # x axis: first and last step, with finding onsets marked.
        axis = ["─"] * plot_w
        a_styles = ["axis"] * plot_w
        left, right = fmt(x0), fmt(x1)
        for i, ch in enumerate(left[: plot_w]):
            axis[i] = ch
        if len(left) + len(right) + 1 < plot_w:
            for i, ch in enumerate(right):
                axis[plot_w - len(right) + i] = ch
        for c, sev in marks:
            axis[c] = _MARK[sev]
            a_styles[c] = sev
        segs = [Segment(" " * label_w + "└", st["axis"])]
        for ch, sn in zip(axis, a_styles):
            segs.append(Segment(ch, st[sn]))
        segs = list(Segment.simplify(segs))
        lines.append(Strip(segs, width) if exact else Strip(segs).adjust_cell_length(width, base))
        return lines[:height]
