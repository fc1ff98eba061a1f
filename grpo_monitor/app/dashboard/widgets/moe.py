"""The MoE panel: per-layer expert load over steps, routing flip rate and the aux loss."""

from __future__ import annotations

import numpy as np
from rich.segment import Segment
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.strip import Strip
from textual.widget import Widget
from textual.widgets import Label

from grpo_monitor.app.dashboard.messages import LayerChanged
from grpo_monitor.app.dashboard.model import RunModel
from grpo_monitor.app.dashboard.widgets.chart import LineChart, SeriesSpec, fmt

# Load relative to a uniform router (1/E): shade by how far an expert is over or under its share.
_SHADES = [(0.25, " "), (0.75, "░"), (1.5, "▒"), (3.0, "▓"), (float("inf"), "█")]


def shade(ratio: float) -> str:
    """The block character for an expert's load relative to its uniform share.

    >>> shade(0.0), shade(1.0), shade(2.0), shade(8.0)
    (' ', '▒', '▓', '█')
    """
    if not np.isfinite(ratio):
        return "?"
    for limit, ch in _SHADES:
        if ratio < limit:
            return ch
    return "█"


def load_matrix(steps: list[int], loads: list[np.ndarray], layer: int, columns: int) -> tuple[np.ndarray, float, float]:
    """(experts × columns) mean load of one layer, steps bucketed to ``columns``; NaN where no record."""
    rows = [(s, a[layer]) for s, a in zip(steps, loads) if a.ndim == 2 and layer < a.shape[0]]
    if not rows or columns < 1:
        return np.zeros((0, 0)), 0.0, 0.0
    e = max(r[1].shape[0] for r in rows)
    rows = [r for r in rows if r[1].shape[0] == e]
    st = np.array([r[0] for r in rows], dtype=np.float64)
    mat = np.stack([r[1] for r in rows]).astype(np.float64)  # (n, E)
    s0, s1 = float(st[0]), float(st[-1])
    if s1 == s0:
        return np.repeat(mat[-1][:, None], columns, axis=1), s0, s1
    if columns >= len(rows):  # fewer records than cells: each cell shows the nearest record
        at = s0 + np.arange(columns) / max(1, columns - 1) * (s1 - s0)
        idx = np.clip(np.searchsorted(st, at), 1, len(st) - 1)
        idx -= (at - st[idx - 1]) < (st[idx] - at)
        return mat[idx].T, s0, s1
    c = np.rint((st - s0) / (s1 - s0) * (columns - 1)).astype(np.int64)
    acc = np.zeros((columns, e))
    cnt = np.zeros(columns)
    np.add.at(acc, c, mat)
    np.add.at(cnt, c, 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = (acc / cnt[:, None]).T  # a column no record fell into stays NaN (blank)
    return out, s0, s1


class Heatmap(Widget, can_focus=True):
    """Expert load of one MoE layer: a row per expert, a column per step bucket."""

    COMPONENT_CLASSES = {"heatmap--cell", "heatmap--hot", "heatmap--axis"}
    BINDINGS = [
        Binding("right_square_bracket,right", "layer(1)", "Next layer"),
        Binding("left_square_bracket,left", "layer(-1)", "Prev layer"),
    ]
    DEFAULT_CSS = "Heatmap { height: auto; }"

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.model: RunModel | None = None
        self.moe_layer = 0
        self._key: tuple = ()
        self._strips: list[Strip] = []

    def bind(self, model: RunModel) -> None:
        self.model = model
        self.refresh(layout=True)

    def n_layers(self) -> int:
        if self.model is None or not self.model.moe_load:
            return 0
        return int(self.model.moe_load[-1].shape[0])

    def n_experts(self) -> int:
        if self.model is None or not self.model.moe_load:
            return 0
        return int(self.model.moe_load[-1].shape[1])

    def action_layer(self, delta: int) -> None:
        n = self.n_layers()
        if n:
            self.moe_layer = (self.moe_layer + delta) % n
            self.refresh(layout=True)
            self.post_message(LayerChanged())

    def get_content_height(self, container, viewport, width: int) -> int:
        return max(1, self.n_experts()) + 1

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        m = self.model
        key = (width, self.moe_layer, len(m.moe_steps) if m else 0, m.moe_steps[-1] if m and m.moe_steps else None)
        if key != self._key:
            self._key = key
            self._strips = self._build(width)
        return self._strips[y] if y < len(self._strips) else Strip.blank(width, self.rich_style)

    def _build(self, width: int) -> list[Strip]:
        base = self.rich_style
        cell = base + self.get_component_rich_style("heatmap--cell", partial=True)
        hot = base + self.get_component_rich_style("heatmap--hot", partial=True)
        axis = base + self.get_component_rich_style("heatmap--axis", partial=True)
        m = self.model
        if m is None or not m.moe_load:
            return [Strip([Segment("no expert-load records yet", axis)]).adjust_cell_length(width, base)]
        e = self.n_experts()
        lw = len(f"e{e - 1}") + 1
        plot_w = max(1, width - lw - 1)
        mat, s0, s1 = load_matrix(m.moe_steps, m.moe_load, min(self.moe_layer, self.n_layers() - 1), plot_w)
        strips = []
        for i in range(mat.shape[0]):
            ratio = mat[i] * e
            chars = "".join(shade(r) if np.isfinite(r) else " " for r in ratio)
            segs = [Segment(f"e{i}".rjust(lw - 1) + " │", axis)]
            hot_mask = ratio >= 3.0
            start = 0
            for j in range(1, len(chars) + 1):
                if j == len(chars) or hot_mask[j] != hot_mask[start]:
                    segs.append(Segment(chars[start:j], hot if hot_mask[start] else cell))
                    start = j
            strips.append(Strip(segs).adjust_cell_length(width, base))
        left, right = fmt(s0), fmt(s1)
        gap = max(1, mat.shape[1] - len(left) - len(right))
        strips.append(Strip([Segment(" " * lw + "└" + left + "─" * gap + right, axis)]).adjust_cell_length(width, base))
        return strips


def _moe_extra(model: RunModel) -> list[SeriesSpec]:
    return [SeriesSpec(n[4:], n) for n in model.metric_names("moe/") if n != "moe/flip_rate"][:6]


class MoePanel(Vertical):
    def compose(self) -> ComposeResult:
        with VerticalScroll(id="moe-scroll"):
            yield Label("", id="moe-title", markup=False)
            yield Heatmap(id="heatmap")
            yield Label("", id="moe-legend", markup=False, classes="muted")
            yield LineChart("moe/flip_rate", [SeriesSpec("moe/flip_rate", "moe/flip_rate")], id="chart-flip",
                            classes="moe-chart")
            yield LineChart("aux_loss", [SeriesSpec("aux_loss", "aux_loss")], id="chart-aux", classes="moe-chart")
            yield LineChart("moe/*", _moe_extra, id="chart-moe-other", classes="moe-chart")

    def bind(self, model: RunModel) -> None:
        self._model = model
        for w in self.query(LineChart):
            w.bind(model)
        self.query_one(Heatmap).bind(model)

    def show(self, model: RunModel) -> None:
        hm = self.query_one(Heatmap)
        mi = model.model_info
        layers = mi.get("moe_layers") if isinstance(mi.get("moe_layers"), list) else None
        n = hm.n_layers()
        t = Text()
        t.append("Expert load")
        if n:
            li = min(hm.moe_layer, n - 1)
            name = f"model layer {layers[li]}" if layers and li < len(layers) else f"MoE layer {li}"
            t.append(f" · {name} ({li + 1}/{n}) · {hm.n_experts()} experts")
            if mi.get("top_k"):
                t.append(f", top-{mi['top_k']}")
            t.append("  · [ ] ← → layer")
        self.query_one("#moe-title", Label).update(t)
        self.query_one("#moe-legend", Label).update(
            "share of tokens vs uniform:  ' ' <¼  ░ <¾  ▒ ≈1×  ▓ <3×  █ ≥3× (hot)"
        )
        hm.refresh(layout=True)
        for w in self.query(LineChart):
            w.refresh()

    def on_layer_changed(self, _: LayerChanged) -> None:
        if getattr(self, "_model", None) is not None:
            self.show(self._model)

    def focus_main(self) -> None:
        self.query_one(Heatmap).focus()
