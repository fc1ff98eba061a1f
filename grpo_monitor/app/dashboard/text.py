"""Model output as literal text.

Completions and prompts are whatever a policy emitted: Rich markup, Textual markup, ANSI escape
sequences. The dashboard must show them as characters, never obey them, so every piece of
model-controlled text goes through ``literal`` (or ``one_line``) and ends up in a
``rich.text.Text`` built without markup parsing.

>>> literal("[bold red]x[/] \\x1b[31mred").plain
'[bold red]x[/] ␛[31mred'
>>> one_line("a\\nb\\tc", 20).plain
'a⏎b c'
"""

from __future__ import annotations

from rich.text import Text

from grpo_monitor.core.safe_text import visible

__all__ = ["literal", "one_line", "visible"]


def literal(s: object, style: str = "") -> Text:
    """A Text showing ``s`` character for character (newlines kept)."""
    return Text(visible(s).replace("\t", "    "), style=style, no_wrap=False)


def one_line(s: object, width: int | None = None, style: str = "") -> Text:
    """``s`` squeezed onto one line for a table cell, cut to ``width`` with an ellipsis."""
    flat = visible(s).replace("\r\n", "⏎").replace("\n", "⏎").replace("\t", " ")
    if width is not None and len(flat) > width:
        flat = flat[: max(0, width - 1)] + "…"
    return Text(flat, style=style, no_wrap=True, overflow="ellipsis")
