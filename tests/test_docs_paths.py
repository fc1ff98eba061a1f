"""Docs a test keeps true: every module, object and file path the docs and the package's docstrings name exists.

Dotted names (``grpo_monitor.core.session.open_session``) must import and resolve; file paths (``core/diagnosis.py``,
``benchmarks/detection.py``, ``widgets/device.py`` in the dashboard's row) must exist under the repository, the package
or one of the package's folders. Names that the trackers write (MLflow tags
such as ``grpo_monitor.verdict``, artifact paths such as ``grpo_monitor/findings.md``) are names in a user's tracker,
not in this code, and are listed below.
"""

from __future__ import annotations

import ast
import importlib
import re

from tests.conftest import ROOT

PACKAGE = ROOT / "grpo_monitor"
DOTTED = re.compile(r"(?<![\w./<-])grpo_monitor(?:\.[A-Za-z_]\w*)+")
# A backticked path ending in .py or .md; placeholders (``detectors/<detector_id>.py``) and globs are not paths.
FILE = re.compile(r"`{1,2}((?:[\w-]+/)+[\w.-]+\.(?:py|md))`{1,2}")
TRACKER_NAMES = {
    "grpo_monitor.restart", "grpo_monitor.crash", "grpo_monitor.verdict", "grpo_monitor.findings_count",
    "grpo_monitor.recommended", "grpo_monitor.alerts_", "grpo_monitor/findings.md", "grpo_monitor/findings.json",
}


def _texts():
    for md in sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]:
        yield md.relative_to(ROOT), md.read_text()
    for py in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(py.read_text())):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node, clean=False)
                if doc:
                    yield py.relative_to(ROOT), doc


def _resolves(name: str) -> bool:
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


_FILES = None


def _exists(path: str) -> bool:
    """Under the repository, the package, or (as the docs' tables write them) under one of its folders."""
    global _FILES
    if any((base / path).exists() for base in (ROOT, PACKAGE, ROOT / "docs")):
        return True
    if _FILES is None:
        _FILES = [f.as_posix() for f in PACKAGE.rglob("*") if "__pycache__" not in f.parts]
    return any(f.endswith("/" + path) for f in _FILES)


def test_every_dotted_name_in_the_docs_and_docstrings_resolves():
    missing = sorted({(str(where), name) for where, text in _texts() for m in DOTTED.finditer(text)
                      if (name := m.group(0).rstrip(".")) not in TRACKER_NAMES and not _resolves(name)})
    assert not missing, missing


def test_every_file_path_in_the_docs_and_docstrings_exists():
    missing = sorted({(str(where), path) for where, text in _texts() for m in FILE.finditer(text)
                      if (path := m.group(1)) not in TRACKER_NAMES and "*" not in path and not _exists(path)})
    assert not missing, missing


def test_the_checks_find_a_stale_name_and_a_missing_file():
    assert not _resolves("grpo_monitor.sources.load_source") and _resolves("grpo_monitor.readers.load_source")
    assert not _exists("core/sources.py") and _exists("core/session.py")
