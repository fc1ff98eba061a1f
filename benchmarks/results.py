"""Shared by the benchmark scripts: rewrite one marked section of benchmarks/RESULTS.md."""

from __future__ import annotations

import os
import platform
import re
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
TITLE = "# Benchmark results\n\nEach section is rewritten by the script named in it; figures are from its latest run.\n"


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    return f"{platform.system()} {platform.machine()} ({cpu}), {os.cpu_count()} CPUs, Python {platform.python_version()}"


def stamp() -> str:
    return f"_{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} · {machine()}_"


def update_section(name: str, body: str, path: Path = RESULTS) -> None:
    """Replace the text between ``<!-- name:begin -->`` and ``<!-- name:end -->`` (appending it if absent)."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    block = f"{begin}\n{body.rstrip()}\n{end}"
    text = path.read_text() if path.exists() else TITLE
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text)
