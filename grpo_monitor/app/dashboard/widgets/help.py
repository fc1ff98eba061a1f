"""The ``?`` help screen."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

HELP = [
    ("Keys", None),
    ("1 … 6", "Overview, Detectors, Recommendations, Samples, MoE, Device"),
    ("Tab / Shift+Tab", "next / previous panel"),
    ("↑ ↓ PgUp PgDn", "scroll, move the table cursor"),
    ("/", "filter samples: 12 · 10-20 · correct · incorrect · truncated · any text"),
    ("Enter", "open the selected sample in full (Samples panel)"),
    ("Esc", "close the sample, the filter or this help"),
    ("c / y", "copy the recommended GRPOConfig call / CLI flags"),
    ("[ ]  ← →", "previous / next MoE layer in the heatmap"),
    ("t", "toggle dark / light theme"),
    ("?", "this help; Esc closes it"),
    ("q", "quit"),
    ("Panels", None),
    ("Overview", "entropy, completion length against the cap, rewards by component, KL (not logged when "
                 "beta=0), clipping, zero-std groups, grad norm; ◆ ▲ mark where a finding's change began"),
    ("Detectors", "each detector's state at the latest step, and every finding with its evidence"),
    ("Recommendations", "the GRPO variant to switch to, as Python and as CLI flags, with the reasons"),
    ("Samples", "every recorded completion with its rewards; model output is shown verbatim"),
    ("MoE", "expert load per layer over steps, routing flip rate, aux loss (MoE runs only)"),
    ("Device", "GPU utilisation, SM clock, throttle reasons, temperature, power, generation's share of the time, "
               "device memory (runs that log NVML readings only)"),
]


class HelpScreen(ModalScreen[None]):
    BINDINGS = [
        Binding("escape,question_mark,q", "dismiss", "Close"),
    ]

    def compose(self) -> ComposeResult:
        from rich.table import Table

        table = Table(box=None, show_header=False, padding=(0, 1), expand=True)
        table.add_column(no_wrap=True, style="bold")
        table.add_column(ratio=1)
        for key, desc in HELP:
            if desc is None:
                table.add_row(Text(key, style="bold underline"), "")
            else:
                table.add_row(Text(key), Text(desc))
        with VerticalScroll(id="help-box"):
            yield Static(table, id="help-text")
