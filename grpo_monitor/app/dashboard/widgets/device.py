"""The device panel: the GPU under the run as the monitor's NVML sampler logged it (``core.device``):
utilisation, SM clock against its maximum, temperature, power against its limit, the throttle reasons,
generation's share of the wall time and device memory; per rank when several trained."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Grid, Vertical, VerticalScroll
from textual.widgets import Label, Static

from grpo_monitor.app.dashboard.model import RunModel
from grpo_monitor.app.dashboard.widgets.chart import LineChart, SeriesSpec
from grpo_monitor.app.dashboard.widgets.common import role_style
from grpo_monitor.core.device import GENERATION_SHARE, PREFIX, reason_names

# What a GPU does at its limit routinely (power cap, idle) against what slows it (heat, hardware slowdown).
_SLOWING = {"sw_thermal_slowdown", "hw_thermal_slowdown", "hw_slowdown", "hw_power_brake_slowdown"}


def _latest_ref(metric: str, label: str):
    def refs(model: RunModel) -> list[tuple[str, float]]:
        v = model.latest_metric(metric)
        return [(label, v)] if v is not None else []

    return refs


CHARTS = [
    ("chart-device-util", "utilisation %", [SeriesSpec("gpu", PREFIX + "util"), SeriesSpec("memory", PREFIX + "mem_busy")],
     None),
    ("chart-device-clock", "SM clock MHz", [SeriesSpec("sm clock", PREFIX + "sm_clock_mhz")],
     _latest_ref(PREFIX + "sm_clock_max_mhz", "max")),
    ("chart-device-throttle", "throttled (share of readings)",
     [SeriesSpec("thermal", PREFIX + "throttle_thermal"), SeriesSpec("hw slowdown", PREFIX + "throttle_hw"),
      SeriesSpec("power cap", PREFIX + "throttle_power")], None),
    ("chart-device-temp", "temperature °C", [SeriesSpec("temp", PREFIX + "temp_c")], None),
    ("chart-device-power", "power W", [SeriesSpec("power", PREFIX + "power_w")],
     _latest_ref(PREFIX + "power_limit_w", "limit")),
    ("chart-device-generation", "generation share of wall time", [SeriesSpec("generation", GENERATION_SHARE)], None),
    ("chart-device-memory", "device memory GiB (peak per step)", [SeriesSpec("used", PREFIX + "used_peak_gib")],
     _latest_ref(PREFIX + "total_gib", "total")),
]


def _fmt(v: Any, unit: str, digits: int = 0) -> str:
    return "—" if v is None else f"{v:.{digits}f}{unit}"


def rank_line(values: dict[str, Any]) -> str:
    """One rank's latest readings in a line.

    >>> rank_line({"rank": 1, "system/gpu_util": 91.5, "system/gpu_temp_c": 88.0,
    ...            "system/gpu_sm_clock_mhz": 1185.0, "system/gpu_throttle_reasons": 64.0})
    'rank 1: util 92% · 88 °C · SM 1185 MHz · hw_thermal_slowdown'
    """
    reasons = reason_names(values.get(PREFIX + "throttle_reasons"))
    return (f"rank {values.get('rank')}: util {_fmt(values.get(PREFIX + 'util'), '%')} · "
            f"{_fmt(values.get(PREFIX + 'temp_c'), ' °C')} · SM {_fmt(values.get(PREFIX + 'sm_clock_mhz'), ' MHz')} · "
            + (", ".join(reasons) if reasons else "no throttle reason"))


class DeviceSummary(Static):
    """The device's name and its latest state, throttle reasons named."""

    def __init__(self, **kwargs) -> None:
        super().__init__("", markup=False, **kwargs)

    def show(self, model: RunModel) -> None:
        app = self.app
        facts = model.header.get("device") if isinstance(model.header.get("device"), dict) else {}
        t = Text()
        t.append(str(facts.get("name") or "GPU"), role_style(app, "primary", bold=True))
        if facts.get("unified_memory"):
            t.append(f"  unified memory ({facts['unified_memory']})", role_style(app, "warning"))
        latest = {n: model.latest_metric(n) for n in (PREFIX + "util", PREFIX + "temp_c", PREFIX + "power_w",
                                                      PREFIX + "power_limit_w", PREFIX + "sm_clock_mhz",
                                                      PREFIX + "sm_clock_max_mhz", GENERATION_SHARE)}
        t.append(f"\nutil {_fmt(latest[PREFIX + 'util'], '%')} · {_fmt(latest[PREFIX + 'temp_c'], ' °C')} · "
                 f"{_fmt(latest[PREFIX + 'power_w'], ' W')} of {_fmt(latest[PREFIX + 'power_limit_w'], ' W')} · "
                 f"SM {_fmt(latest[PREFIX + 'sm_clock_mhz'], '')} of {_fmt(latest[PREFIX + 'sm_clock_max_mhz'], ' MHz')}")
        if latest[GENERATION_SHARE] is not None:
            t.append(f" · generating {latest[GENERATION_SHARE]:.0%} of the time")
        reasons = reason_names(model.latest_metric(PREFIX + "throttle_reasons"))
        t.append("\nthrottle reasons: ")
        if not reasons:
            t.append("none", role_style(app, "ok"))
        for i, r in enumerate(reasons):
            t.append(("" if i == 0 else ", ") + r, role_style(app, "critical" if r in _SLOWING else "muted"))
        ranks = (model.last_step or {}).get("devices")
        if isinstance(ranks, list) and len(ranks) > 1:
            for entry in ranks:
                if isinstance(entry, dict):
                    t.append("\n" + rank_line(entry), role_style(app, "muted"))
        self.update(t)


class DevicePanel(Vertical):
    def compose(self) -> ComposeResult:
        with VerticalScroll(id="device-scroll"):
            yield Label("Device", id="device-title")
            yield DeviceSummary(id="device-summary")
            with Grid(id="device-grid"):
                for cid, title, series, refs in CHARTS:
                    yield LineChart(title, series, refs=refs, id=cid, classes="device-chart")

    def bind(self, model: RunModel) -> None:
        for w in self.query(LineChart):
            w.bind(model)

    def show(self, model: RunModel) -> None:
        self.query_one(DeviceSummary).show(model)
        for w in self.query(LineChart):
            w.refresh()

    def focus_main(self) -> None:
        self.query_one("#device-scroll").focus()
