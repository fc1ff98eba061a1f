"""The package's wings import only downwards: a wing may import the wings below it, never one above.

``docs/ARCHITECTURE.md`` draws the same order; this test reads every import statement (including the
lazy ones inside functions) and fails on an arrow that points up or a wing the order does not know.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "grpo_monitor"

# Lowest first. ``grpo_monitor/__init__.py`` and ``__main__.py`` are the public face: they may import any wing.
WINGS = ("detectors", "core", "readers", "analysis", "fixtures", "rewards", "preflight", "alerts", "callbacks", "app")


def _wing(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "grpo_monitor" else None


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "grpo_monitor":
                out += [(node.lineno, f"grpo_monitor.{a.name}") for a in node.names]
            else:
                out.append((node.lineno, node.module))
    # Modules named in strings that are imported by name (importlib, "module:function" specs).
    text = path.read_text(encoding="utf-8")
    for m in re.finditer(r"[\"'](grpo_monitor\.(?:%s)(?:\.\w+)*)(?::\w+)?[\"']" % "|".join(WINGS), text):
        out.append((text[: m.start()].count("\n") + 1, m.group(1)))
    return out


def test_every_module_lives_in_a_known_wing():
    stray = sorted(p.name for p in PKG.iterdir() if p.suffix == ".py" and p.name not in ("__init__.py", "__main__.py"))
    wings = sorted(p.name for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    assert stray == []
    assert sorted(wings) == sorted(WINGS)


def test_imports_only_point_downwards():
    upward = []
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG)
        if len(rel.parts) == 1:
            continue  # the package's face
        own = WINGS.index(rel.parts[0])
        for line, module in _imports(path):
            wing = _wing(module)
            if wing is None or wing == rel.parts[0]:
                continue
            if wing not in WINGS or WINGS.index(wing) > own:
                upward.append(f"grpo_monitor/{rel}:{line} ({rel.parts[0]}) imports {module} ({wing})")
    assert upward == [], "\n".join(upward)


def test_the_architecture_document_draws_the_same_order():
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    drawn = re.findall(r"^\s*(\w+)/\s", text.split("## Layers", 1)[1].split("##", 1)[0], re.M)
    assert tuple(reversed(drawn)) == WINGS
