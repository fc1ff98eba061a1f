"""Text a model wrote, made safe to print: every control character shown, never obeyed.

Completions and prompts are whatever a policy emitted, ANSI escape sequences included; a terminal
must show them as characters. The dashboard's Rich helpers (``app.dashboard.text``) and the reward
gate's table build on ``visible``.

>>> visible("\\x1b[31mred")
'␛[31mred'
"""

from __future__ import annotations

import re

# C0 controls (but newline and tab), DEL and the C1 range (0x9b is a one-byte CSI on some terminals).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _picture(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code < 0x20:
        return chr(0x2400 + code)  # Unicode control pictures: ESC -> ␛
    if code == 0x7F:
        return "␡"
    return f"\\x{code:02x}"


def visible(s: object) -> str:
    """The string with every control character replaced by a visible stand-in."""
    return _CONTROL.sub(_picture, "" if s is None else str(s))
