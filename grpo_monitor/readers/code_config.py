"""The training config a notebook's code spells out: the keyword arguments of its ``GRPOConfig(...)`` call.

A notebook's log is a progress table with no config beside it, but the cell that built the trainer is in
the same file, and the settings that decide a verdict are literals there (``max_completion_length = 1024``,
``num_generations = 2``, ``loss_type = "dr_grpo"``, ``learning_rate = 5e-6``). Only what can be read without
running anything is taken: literals, and arithmetic over names the code assigned literals to earlier
(``max_completion_length = max_seq_length - max_prompt_length``). Anything else (a value read from data, a
function call) is left out rather than guessed. The last ``GRPOConfig`` call wins: a notebook re-run with
other settings trains with the latest.

>>> config_in_code('max_seq_length = 2048\\nmax_prompt_length = 256\\n'
...                'args = GRPOConfig(learning_rate=5e-6, num_generations=4,\\n'
...                '    max_completion_length=max_seq_length - max_prompt_length, report_to="none", seed=len(x))')
{'learning_rate': 5e-06, 'num_generations': 4, 'max_completion_length': 1792, 'report_to': 'none'}
>>> config_in_code("!pip install trl\\nfrom trl import GRPOConfig\\ncfg = trl.GRPOConfig(beta=0.0)")
{'beta': 0.0}
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Mapping
from typing import Any

_OPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
}
_UNKNOWN = object()


def _value(node: ast.AST, names: Mapping[str, Any]) -> Any:
    """The value of a literal, a known name, or arithmetic over them; ``_UNKNOWN`` for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, str, bool, type(None))):
        return node.value
    if isinstance(node, ast.Name):
        return names.get(node.id, _UNKNOWN)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _value(node.operand, names)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return -v if isinstance(node.op, ast.USub) else v
        return _UNKNOWN
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        a, b = _value(node.left, names), _value(node.right, names)
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b)):
            try:
                return _OPS[type(node.op)](a, b)
            except ArithmeticError:
                return _UNKNOWN
    if isinstance(node, (ast.List, ast.Tuple)):
        items = [_value(e, names) for e in node.elts]
        return _UNKNOWN if any(v is _UNKNOWN for v in items) else list(items)
    return _UNKNOWN


def _parse(cell: str) -> ast.Module | None:
    # Shell and magic lines (``!pip install``, ``%%capture``) are not Python.
    lines = ["" if line.lstrip().startswith(("!", "%")) else line for line in cell.splitlines()]
    try:
        return ast.parse("\n".join(lines))
    except (SyntaxError, ValueError):
        return None


def _called(node: ast.Call) -> str | None:
    f = node.func
    if isinstance(f, ast.Name):
        return f.id
    if isinstance(f, ast.Attribute):
        return f.attr
    return None


def config_in_code(code: str | list[str], call: str = "GRPOConfig") -> dict[str, Any]:
    """The literal keyword arguments of the last ``call(...)`` in ``code`` (one string, or one per cell)."""
    cells = [code] if isinstance(code, str) else list(code)
    names: dict[str, Any] = {}
    found: dict[str, Any] | None = None
    for cell in cells:
        tree = _parse(cell)
        if tree is None:
            continue
        for stmt in tree.body:  # in the order the cell runs them
            for node in ast.walk(stmt):
                if isinstance(node, ast.Call) and _called(node) == call:
                    found = {k.arg: v for k in node.keywords
                             if k.arg is not None and (v := _value(k.value, names)) is not _UNKNOWN}
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
                v = _value(stmt.value, names)
                if v is not _UNKNOWN:
                    names[stmt.targets[0].id] = v
    return found or {}
