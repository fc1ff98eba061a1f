"""A Kaggle kernel log: the JSON array Kaggle saves for a notebook run,
``[{"stream_name": "stdout", "time": 12.3, "data": "{'loss': 0.1, ...}\\n"}, ...]``.

The ``data`` strings, in order, are what the kernel printed (stdout and stderr interleaved as they
came), read as printed output: TRL's dicts, a hand-written loop's lines, or a table
(``readers.tables.read_printed``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from grpo_monitor.readers._base import Probe, Reader, Source
from grpo_monitor.readers.tables import read_printed


def is_kaggle_log(obj: Any) -> bool:
    """A JSON list whose records (the first hundred looked at) carry ``stream_name`` and ``data``."""
    if not isinstance(obj, list) or not obj:
        return False
    head = obj[:100]
    return all(isinstance(r, dict) and "data" in r and ("stream_name" in r or "time" in r) for r in head) and any(
        "stream_name" in r for r in head)


def read_kaggle(path: Path, records: list[Any], logging_steps: int | None = None) -> Source:
    text = "".join(r["data"] for r in records if isinstance(r, dict) and isinstance(r.get("data"), str))
    src = read_printed(path, text, logging_steps, "the Kaggle log's output")
    src.meta["console_format"] = src.format
    src.format = "kaggle"
    if not src.context.model:
        from grpo_monitor.readers.model import model_in_text, set_model

        set_model(src, model_in_text(text, "the Kaggle log"))
    return src


class KaggleReader(Reader):
    name = "kaggle"
    formats = ("kaggle",)
    describes = "Kaggle log"

    def sniff(self, probe: Probe) -> str | None:
        return "kaggle" if probe.layout == "document" and is_kaggle_log(probe.document()) else None

    def read(self, probe: Probe, fmt: str) -> Source:
        return read_kaggle(probe.path, probe.document(), probe.logging_steps)
