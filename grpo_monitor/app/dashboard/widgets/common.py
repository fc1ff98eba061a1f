"""Small helpers the panels share: theme colours for table cells and value formatting."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from rich.style import Style
from textual.app import App

from grpo_monitor.app.dashboard.widgets.chart import fmt

# Theme variables that Textual derives so text stays readable on the theme's background,
# in dark and light themes alike.
_ROLE = {
    "ok": "text-success",
    "critical": "text-error",
    "warning": "text-warning",
    "info": "text-primary",
    "muted": "foreground-muted",
    "accent": "text-accent",
    "primary": "text-primary",
}


def role_style(app: App[Any], role: str, bold: bool = False) -> Style:
    """A Rich style for a semantic role (``ok``, ``warning``, ...) in the app's current theme."""
    value = app.theme_variables.get(_ROLE.get(role, role)) if app.theme_variables else None
    if not value:
        return Style(bold=bold)
    try:
        from textual.color import Color

        bg = Color.parse(app.theme_variables.get("background", "#000000"))
        color = bg + Color.parse(value)  # folds any alpha onto the background
        return Style(color=color.rich_color, bold=bold)
    except Exception:
        return Style(bold=bold)


STATE_ROLE = {"ok": "ok", "warming_up": "muted", "warning": "warning", "critical": "critical", "disabled": "muted",
              "not applicable": "muted", "cannot judge": "muted"}


def short(value: Any) -> str:
    """A compact rendering of one evidence or config value."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, float):
        return fmt(value) if math.isfinite(value) else str(value)
    if isinstance(value, (int, str)):
        return str(value)
    try:
        return json.dumps(value, separators=(",", ":"), default=str)
    except (TypeError, ValueError):
        return str(value)


def evidence_text(evidence: Any, limit: int | None = None) -> str:
    """``k=v, k=v`` for a finding's evidence dict.

    >>> evidence_text({"baseline": 0.41234, "window": 20, "p": 1e-06})
    'baseline=0.4123, window=20, p=1.00e-06'
    """
    if not isinstance(evidence, Mapping):
        return short(evidence) if evidence else ""
    out = ", ".join(f"{k}={short(v)}" for k, v in evidence.items())
    if limit is not None and len(out) > limit:
        out = out[: limit - 1] + "…"
    return out


def pyrepr(value: Any) -> str:
    """A config value as Python source (what a user pastes into ``GRPOConfig(...)``)."""
    return repr(value)
