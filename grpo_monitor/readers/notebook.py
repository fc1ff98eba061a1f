"""Jupyter/Colab notebooks: a whole ``.ipynb``, or its outputs saved as a JSON list of records
(``{"name": "stdout", "output_type": "stream", "text": [...]}``, ``display_data``, ...).

A notebook's training cell shows the transformers notebook progress table: an HTML ``<table>`` in
a ``text/html`` output, one row per logged step (``Step``, ``Training Loss``, ``reward``,
``completions / mean_length``, ``rewards / <func> / mean``, ...; the names are TRL's with spaces
around the slashes, which ``core.metrics.normalize`` undoes). A cell run again, or a display
updated while it trained, leaves several tables: the longest training run's is read (an earlier
snapshot of the same run is its prefix; a table without a reward column, an SFT phase, gives way
to one with), and ``Source.meta["table"]`` says which. Where there is no such table, the cells'
printed text is read as a console log (printed dicts, a hand-written loop's lines). The code cells
name the model (``model_name = "unsloth/gpt-oss-20b"``), which ``readers.model`` turns into model facts, and
spell out the ``GRPOConfig`` (``readers.code_config``): the run's config, as a checkpoint would hold it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from grpo_monitor.readers._base import Probe, Reader, Source
from grpo_monitor.readers.code_config import config_in_code
from grpo_monitor.readers.tables import Table, html_tables, read_printed


def is_notebook_outputs(obj: Any) -> bool:
    """A JSON list of notebook output records."""
    return isinstance(obj, list) and bool(obj) and all(
        isinstance(r, dict) and ("output_type" in r or ("name" in r and "text" in r)) for r in obj
    )


def text_of(value: Any) -> str:
    """A notebook's multi-line string: one string, or the list of its lines."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(v for v in value if isinstance(v, str))
    return ""


def _outputs(obj: Any) -> list[tuple[str, list[Any]]]:
    """``(where, outputs)`` of every cell that has outputs."""
    if isinstance(obj, dict):
        cells = obj.get("cells") or []
        return [(f"cell {i}", c.get("outputs") or []) for i, c in enumerate(cells, 1)
                if isinstance(c, dict) and isinstance(c.get("outputs"), list)]
    return [("the outputs", obj)]


def _cells(obj: Any) -> list[str]:
    if not isinstance(obj, dict):
        return []
    return [text_of(c.get("source")) for c in obj.get("cells") or []
            if isinstance(c, dict) and c.get("cell_type") == "code"]


def _code(obj: Any) -> str:
    return "\n".join(_cells(obj))


def read_notebook(path: Path, obj: Any, logging_steps: int | None = None) -> Source:
    parts: list[str] = []
    tables: list[Table] = []
    for where, outputs in _outputs(obj):
        for k, r in enumerate(outputs, 1):
            if not isinstance(r, dict):
                continue
            if "text" in r:
                parts.append(text_of(r["text"]))
            data = r.get("data")
            if not isinstance(data, dict):
                continue
            if "text/plain" in data:
                parts.append(text_of(data["text/plain"]) + "\n")
            if "text/html" in data:
                html = text_of(data["text/html"])
                if "<table" in html:
                    tables.extend(html_tables(html, f"{where}, output {k}", order=len(tables)))
    src = read_printed(path, "".join(parts), logging_steps, "the notebook's output", tables)
    if src.format != "table":  # the printed text was the log (``meta["table"]`` says which table otherwise)
        src.meta["console_format"] = src.format
    src.format = "notebook"
    config = config_in_code(_cells(obj))
    if config:
        for part in [src, *(p for _, p in src.parts if p is not src)]:
            part.context.config = {**config, **(part.context.config or {})}
        src.meta["config_from"] = f"the notebook's code (GRPOConfig: {len(config)} settings)"
    if not src.context.model:
        from grpo_monitor.readers.model import model_in_text, set_model

        set_model(src, model_in_text(_code(obj), "the notebook's code") or model_in_text("".join(parts), "the notebook's output"))
    return src


class NotebookReader(Reader):
    name = "notebook"
    formats = ("notebook",)
    describes = "notebook (.ipynb or its outputs)"

    def sniff(self, probe: Probe) -> str | None:
        if probe.layout != "document":
            return None
        obj = probe.document()
        if isinstance(obj, dict) and isinstance(obj.get("cells"), list):
            return "notebook"
        return "notebook" if is_notebook_outputs(obj) else None

    def read(self, probe: Probe, fmt: str) -> Source:
        return read_notebook(probe.path, probe.document(), probe.logging_steps)
