"""The overview: the time series that show every failure mode the detectors look for."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Grid, VerticalScroll
from textual.widgets import Static

from grpo_monitor.app.dashboard.model import RunModel
from grpo_monitor.app.dashboard.text import one_line, visible
from grpo_monitor.app.dashboard.widgets.chart import LineChart, SeriesSpec
from grpo_monitor.app.dashboard.widgets.common import role_style, short


def _length(model: RunModel) -> list[SeriesSpec]:
    return [
        SeriesSpec("mean", "completions/mean_length"),
        SeriesSpec("max", "completions/max_length"),
        SeriesSpec("term", "completions/mean_terminated_length"),
    ]


def _length_cap(model: RunModel) -> list[tuple[str, float]]:
    cap = model.length_cap
    return [("cap", cap)] if cap is not None else []


def _reward(model: RunModel) -> list[SeriesSpec]:
    return [SeriesSpec("total", "reward")] + [SeriesSpec(f, f"rewards/{f}/mean") for f in model.reward_components()]


def _clip(model: RunModel) -> list[SeriesSpec]:
    order = ["region_mean", "low_mean", "high_mean", "low_min", "high_max"]
    names = model.metric_names("clip_ratio/")
    names.sort(key=lambda n: (order.index(n[11:]) if n[11:] in order else len(order), n))
    return [SeriesSpec(n[11:], n) for n in names]


# Train-inference mismatch, shown only when the run logs it (vLLM rollouts with the correction on,
# verl's rollout correction, prime-rl, Tinker): the gap itself, then the importance weights it causes.
_DRIFT = [
    ("logp diff", "sampling/sampling_logp_difference/mean"),
    ("kl", "mismatch/kl"),
    ("k3 kl", "mismatch/k3_kl"),
    ("k2 kl", "mismatch/k2_kl"),
    ("probs diff", "mismatch/probs_diff/mean"),
]
_WEIGHTS = [
    ("IS mean", "sampling/importance_sampling_ratio/mean"),
    ("ess", "mismatch/ess"),
    ("masked", "mismatch/masked_fraction"),
]


def _present(model: RunModel, specs: list[tuple[str, str]]) -> list[SeriesSpec]:
    names = model.store.names
    return [SeriesSpec(label, metric) for label, metric in specs if metric in names]


def _mismatch(model: RunModel) -> list[SeriesSpec]:
    return _present(model, _DRIFT)


def _weights(model: RunModel) -> list[SeriesSpec]:
    return _present(model, _WEIGHTS)


def _is_band(model: RunModel) -> list[tuple[str, float]]:
    return [("band low", 0.5), ("band high", 2.0)] if "sampling/importance_sampling_ratio/mean" in model.store.names else []


def _kl_absent(model: RunModel) -> str | None:
    # TRL computes and logs KL only with a KL penalty: beta=0 (its default) means no kl, ever.
    beta = model.config.get("beta")
    if isinstance(beta, (int, float)) and not isinstance(beta, bool) and beta == 0:
        return "not logged (beta=0)"
    return None


# Why a chart stays empty, where the run's configuration says so.
ABSENT = {"chart-kl": _kl_absent}

CHARTS = [
    ("chart-entropy", "entropy", [SeriesSpec("entropy", "entropy")], None),
    ("chart-length", "completion length", _length, _length_cap),
    ("chart-reward", "reward", _reward, None),
    ("chart-zero-std", "frac_reward_zero_std", [SeriesSpec("frac_reward_zero_std", "frac_reward_zero_std")], None),
    ("chart-kl", "kl", [SeriesSpec("kl", "kl")], None),
    ("chart-clip", "clip_ratio", _clip, None),
    ("chart-grad", "grad_norm", [SeriesSpec("grad_norm", "grad_norm")], None),
]
# Charts that take a grid cell only once the run has logged one of their metrics.
OPTIONAL_CHARTS = [
    ("chart-mismatch", "rollout mismatch", _mismatch, None),
    ("chart-is-weights", "importance weights", _weights, _is_band),
]


class FindingsSummary(Static):
    """The newest findings, one line each, next to the charts that show them."""

    def __init__(self, **kwargs) -> None:
        super().__init__("", markup=False, **kwargs)
        self._last: Text | None = None

    def show(self, model: RunModel) -> None:
        app = self.app
        t = Text()
        t.append("findings", role_style(app, "primary", bold=True))
        t.append(f"  {len(model.findings)}", role_style(app, "muted"))
        if not model.findings:
            t.append("\nnone so far", role_style(app, "muted"))
        for f in model.findings[-6:][::-1]:
            sev = str(f.get("severity"))
            onset = f.get("onset_step")
            t.append("\n")
            t.append({"critical": "◆ ", "warning": "▲ "}.get(sev, "△ "), role_style(app, sev))
            t.append(f"{short(f.get('step'))}", role_style(app, sev, bold=True))
            if onset is not None:
                t.append(f" (onset {short(onset)})", role_style(app, "muted"))
            t.append(f" {visible(f.get('detector'))}: ")
            t.append_text(one_line(f.get("message")))
        if t != self._last:
            self._last = t
            self.update(t, layout=False)  # a fixed grid cell: no layout pass needed


class OverviewPanel(VerticalScroll):
    def compose(self) -> ComposeResult:
        with Grid(id="overview-grid"):
            for cid, title, series, refs in CHARTS:
                yield LineChart(title, series, refs=refs, absent=ABSENT.get(cid), id=cid, classes="overview-chart")
            yield FindingsSummary(id="findings-summary")

    def bind(self, model: RunModel) -> None:
        for chart in self.query(LineChart):
            chart.bind(model)

    def show(self, model: RunModel) -> None:
        for cid, title, series, refs in OPTIONAL_CHARTS:
            # Mounted (before the findings cell) the first time the run logs one of its metrics, so a
            # run without them keeps the grid it always had.
            if self.query(f"#{cid}") or not series(model):
                continue
            chart = LineChart(title, series, refs=refs, id=cid, classes="overview-chart")
            self.query_one("#overview-grid", Grid).mount(chart, before=self.query_one(FindingsSummary))
            chart.bind(model)
        for chart in self.query(LineChart):
            chart.refresh()
        self.query_one(FindingsSummary).show(model)

    def focus_main(self) -> None:
        self.focus()
