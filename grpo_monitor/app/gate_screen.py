"""The reward-inspection screen: one sample at a time, its prompt, completion and every score.

Keys: ``a`` agree (the scores are right), ``d`` disagree, ``1``..``9`` toggle "this component is
wrong", ``n`` write a note (Enter keeps it, Escape drops it), ``left``/``right`` move, ``s`` save
the verdict, ``q`` quit. Model text is shown character for character: markup and escape
sequences in a completion are displayed, never obeyed.

The command line opens this screen and hands ``run_gate`` to the gate; the gate never imports it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import Footer, Input, Static

from grpo_monitor.preflight.reward_gate import GateSession, _text, save_verdict
from grpo_monitor.app.dashboard.text import literal


def _score(v: float | None) -> str:
    return "nan" if v is None or math.isnan(v) else f"{v:.4g}"


class RewardGateApp(App):
    """Judge the reward functions sample by sample; ``s`` saves ``<run_dir>/reward_gate.json``."""

    TITLE = "grpo-monitor · reward inspection"
    CSS = """
    #status { height: 2; padding: 0 1; background: $boost; }
    #body { height: 1fr; padding: 0 1; }
    .label { color: $text-muted; margin-top: 1; }
    #scores { margin-top: 1; }
    #note { display: none; }
    #note.open { display: block; }
    #checks { padding: 0 1; color: $warning; }
    """
    BINDINGS = [
        Binding("a", "agree", "agree"),
        Binding("d", "disagree", "disagree"),
        Binding("n", "note", "note"),
        Binding("left", "move(-1)", "prev"),
        Binding("right", "move(1)", "next"),
        Binding("s", "save", "save"),
        Binding("q", "quit_gate", "quit"),
        *[Binding(str(k), f"toggle({k - 1})", "component wrong", show=(k == 1)) for k in range(1, 10)],
    ]

    def __init__(self, session: GateSession, run_dir: str | os.PathLike[str], reward_funcs: Sequence[Any] | None = None,
                 source: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.session = session
        self.run_dir = run_dir
        self.reward_funcs = reward_funcs
        self.source = dict(source or {})
        self.index = 0
        self.saved: dict[str, Any] | None = None
        self.dirty = False

    def compose(self) -> ComposeResult:
        yield Static(id="status")
        yield Static(id="checks")
        with VerticalScroll(id="body"):
            yield Static("prompt", classes="label")
            yield Static(id="prompt")
            yield Static("completion", classes="label")
            yield Static(id="completion")
            yield Static(id="scores")
            yield Static(id="note-view")
        yield Input(placeholder="note for this sample (Enter keeps it, Escape drops it)", id="note")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#checks", Static).update(self.checks_text())
        self.refresh_sample()

    # -- rendering ------------------------------------------------------------------------

    def status_text(self) -> Text:
        s = self.session.summary()
        rate = "—" if s["pass_rate"] is None else f"{100 * s['pass_rate']:.0f}%"
        state = "saved" if (self.saved is not None and not self.dirty) else "unsaved"
        line1 = (f"sample {self.index + 1}/{s['num_samples']}   judged {s['judged']}/{s['required']} required   "
                 f"agree {s['agreed']}   pass rate {rate} (needs {100 * s['threshold']:.0f}%)   [{state}]")
        verdict = self.session.judgements[self.index].verdict
        line2 = f"this sample: {verdict or 'not judged'}"
        if self.session.references:
            n = sum(1 for i in range(len(self.session.samples)) if any(self.session.disagrees(c, i) for c in self.session.references))
            line2 += f"   {n} sample(s) disagree with a reference (shown first)"
        if self.saved is not None:
            line2 += f"   last save: {'PASSED' if self.saved['passed'] else 'not passed'}"
        return Text(line1 + "\n" + line2)

    def checks_text(self) -> Text:
        """The pre-flight findings on these samples, above every sample: what one sample cannot show."""
        t = Text()
        for c in self.session.checks:
            t.append(f"{c.get('severity', 'note')}: ", style="bold")
            t.append(literal(str(c.get("message", ""))))
            t.append("\n")
        return t

    def scores_text(self) -> Text:
        t = Text()
        wrong = set(self.session.wrong_components(self.index))
        explicit = set(self.session.judgements[self.index].wrong)
        for k, name in enumerate(self.session.names):
            mark = "✗ wrong" if name in explicit else ("✗ (disagree)" if name in wrong else "")
            t.append(f"{k + 1}. ", style="bold")
            t.append(name)
            t.append(f": {_score(self.session.scores[name][self.index])}")
            if name in self.session.references:
                ref = self.session.references[name]
                t.append(f"   reference {ref.get('reference')}: {_score(self.session.reference_score(name, self.index))}")
                if self.session.disagrees(name, self.index):
                    t.append("   ≠ reference", style="bold yellow")
            if mark:
                t.append(f"   {mark}", style="red")
            if name in self.session.errors:
                t.append(f"   raised {self.session.errors[name]}", style="yellow")
            t.append("\n")
        return t

    def refresh_sample(self) -> None:
        sample = self.session.samples[self.index]
        self.query_one("#status", Static).update(self.status_text())
        self.query_one("#prompt", Static).update(literal(_text(sample["prompt"])))
        self.query_one("#completion", Static).update(literal(_text(sample["completion"])))
        self.query_one("#scores", Static).update(self.scores_text())
        note = self.session.judgements[self.index].note
        self.query_one("#note-view", Static).update(Text("note: ", style="bold") + literal(note) if note else Text(""))

    # -- actions --------------------------------------------------------------------------

    def _changed(self) -> None:
        self.dirty = True
        self.refresh_sample()

    def action_agree(self) -> None:
        self.session.agree(self.index)
        self._changed()
        self.action_move(1)

    def action_disagree(self) -> None:
        self.session.disagree(self.index)
        self._changed()

    def action_toggle(self, component: int) -> None:
        if component < len(self.session.names):
            self.session.toggle_wrong(self.index, component)
            self._changed()

    def action_move(self, delta: int) -> None:
        self.index = max(0, min(len(self.session.samples) - 1, self.index + int(delta)))
        self.refresh_sample()

    def action_note(self) -> None:
        box = self.query_one("#note", Input)
        box.value = self.session.judgements[self.index].note
        box.add_class("open")
        box.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.session.set_note(self.index, event.value)
        self._close_note()
        self._changed()

    def on_key(self, event: Any) -> None:
        box = self.query_one("#note", Input)
        if event.key == "escape" and box.has_class("open"):
            event.stop()
            self._close_note()

    def _close_note(self) -> None:
        box = self.query_one("#note", Input)
        box.remove_class("open")
        box.value = ""
        self.set_focus(None)

    def action_save(self) -> None:
        verdict = self.session.verdict(self.reward_funcs, self.source)
        path = save_verdict(self.run_dir, verdict)
        self.saved = verdict
        self.dirty = False
        self.refresh_sample()
        self.notify(f"saved {path}: {'passed' if verdict['passed'] else 'not passed'}")

    def action_quit_gate(self) -> None:
        self.exit(self.saved)


def run_gate(session: GateSession, run_dir: str | os.PathLike[str], reward_funcs: Sequence[Any] | None = None,
             source: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """Open the screen and block; returns the last saved verdict, or None when nothing was saved."""
    app = RewardGateApp(session, run_dir, reward_funcs, source)
    return app.run()
