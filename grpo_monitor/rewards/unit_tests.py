"""Unit-test execution reward: the share of an example's tests the completion's code truly passes.

Tests are ``assert`` statements (MBPP's ``test_list``, asserts converted from HumanEval) or
stdin/stdout pairs (``{"input": ..., "output": ...}``, as in APPS and CodeContests).

Why the count cannot be forged. A test never runs in the same process as its verdict. Each
``assert`` is split, in the trainer, into *probes*, the sub-expressions that call into the
completion's code (``f(3)`` in ``assert f(3) == 9``, ``f(3)`` again in ``assert f(3)[0] == 9``),
and the rest (``_ == 9``). The sandbox runs the completion and evaluates only the probes, each test
in a fresh process, with only the setup statements the probes need, and reports their values as
plain data (exact built-in types: an object whose ``__eq__`` always says yes is refused). A third
process, the judge, evaluates the rest of the assertion on those values, with its own copy of the
standard library (a module the test uses without importing it, ``math.isclose``, is that module,
never the completion's patched one), under a memory and a time limit. The completion never sees
the expected values, so exiting early, printing a pass summary, raising ``SystemExit``, patching
``builtins``, a library or the runner, or writing to the result pipe can only report values, and
values pass only if they are the right answers. A test whose verdict logic would have to run
beside the completion (a comprehension or lambda that calls it) is refused: the example scores
None.
"""

from __future__ import annotations

import ast
import builtins
import functools
import importlib
import json
import logging
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from grpo_monitor.rewards._sandbox_child import PROBE_PREFIX as _PROBE_PREFIX
from grpo_monitor.rewards._sandbox_child import verdict as _verdict
from grpo_monitor.rewards._text import completion_text, extract_code, row_value
from grpo_monitor.rewards.sandbox import JobResult, Limits, Sandbox, SandboxRefused, default_sandbox

logger = logging.getLogger(__name__)

_BUILTIN_NAMES = frozenset(dir(builtins))
# Standard-library modules a test may name without importing them (the solution was expected to):
# ``math.isclose(...)`` is the judge's ``math``. Not these two, whose import has side effects.
_STDLIB = frozenset(m for m in sys.stdlib_module_names if not m.startswith("_")) - {"this", "antigravity"}


class UnsplittableTestError(ValueError):
    """A test the harness cannot split safely."""


def _bound_names(tree: ast.AST) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                out.add((a.asname or a.name).split(".")[0])
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            out.add(node.id)
    return out


def _loaded_names(tree: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _stdlib_modules(tree: ast.AST, known: set[str]) -> list[str]:
    """Unbound names the test uses as ``name.attr`` where ``name`` is a standard-library module
    that has ``attr``."""
    out: list[str] = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in _STDLIB
                and node.value.id not in known and node.value.id not in out):
            try:
                if hasattr(importlib.import_module(node.value.id), node.attr):
                    out.append(node.value.id)
            except Exception:  # a module this interpreter cannot import is not the one meant
                pass
    return out


def _needed(stmts: list[ast.stmt], names: set[str]) -> list[ast.stmt]:
    """The setup statements the probes need: those that bind a name in ``names`` or one that such a
    statement uses, and those that bind nothing (calls made for their effect). Nothing else enters
    the sandbox: a setup that holds the expected values keeps them in the trainer."""
    need, keep = set(names), [False] * len(stmts)
    changed = True
    while changed:
        changed = False
        for i, st in enumerate(stmts):
            if not keep[i]:
                bound = _bound_names(st)
                if not bound or bound & need:
                    keep[i], changed = True, True
                    need |= _loaded_names(st)
    return [st for st, k in zip(stmts, keep) if k]


def _unknown(node: ast.AST, known: set[str]) -> bool:
    return any(isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id not in known for n in ast.walk(node))


_SCOPES = (ast.Lambda, ast.GeneratorExp, ast.ListComp, ast.SetComp, ast.DictComp, ast.NamedExpr, ast.Await, ast.Yield,
           ast.YieldFrom)


class _Splitter(ast.NodeTransformer):
    """Replace each maximal sub-expression headed by a name the completion defines with a placeholder."""

    def __init__(self, known: set[str]) -> None:
        self.known = known
        self.probes: list[str] = []

    def _probe(self, node: ast.expr) -> ast.expr:
        if any(isinstance(n, _SCOPES) and _unknown(n, self.known) for n in ast.walk(node) if n is not node) or isinstance(node, _SCOPES):
            raise UnsplittableTestError(f"{ast.unparse(node)}: the solution is called inside a comprehension or lambda")
        name = f"{_PROBE_PREFIX}{len(self.probes)}"
        self.probes.append(ast.unparse(node))
        return ast.copy_location(ast.Name(id=name, ctx=ast.Load()), node)

    def visit(self, node: ast.AST) -> Any:
        if not isinstance(node, ast.expr) or not _unknown(node, self.known):
            return node
        if isinstance(node, _SCOPES):
            raise UnsplittableTestError(f"{ast.unparse(node)}: the solution is called inside a comprehension or lambda")
        if isinstance(node, (ast.Compare, ast.BoolOp, ast.UnaryOp, ast.BinOp, ast.Tuple, ast.List, ast.Set, ast.Dict,
                             ast.IfExp, ast.JoinedStr, ast.FormattedValue, ast.Starred, ast.Slice)):
            return self.generic_visit(node)
        if isinstance(node, ast.Call) and not _unknown(node.func, self.known):
            node.args = [self.visit(a) for a in node.args]
            for kw in node.keywords:
                kw.value = self.visit(kw.value)
            return node
        if isinstance(node, ast.Subscript):  # the index is taken in the judge, on the value
            node.value = self.visit(node.value)
            node.slice = self.visit(node.slice)
            return node
        return self._probe(node)


class SplitTest:
    """One test: setup statements, probes (run in the sandbox, with the setup they need) and checks
    (run in the judge, after the whole setup)."""

    def __init__(self, source: str, setup: str = "") -> None:
        self.source = source
        try:
            setup_tree = ast.parse(setup or "")
            tree = ast.parse(source)
        except SyntaxError as exc:
            raise UnsplittableTestError(f"{source!r}: not Python ({exc.msg})") from None
        known = set(_BUILTIN_NAMES) | _bound_names(setup_tree)
        setup_stmts: list[ast.stmt] = list(setup_tree.body)
        modules = _stdlib_modules(tree, known | _bound_names(tree))
        setup_stmts = [ast.Import(names=[ast.alias(name=m)]) for m in modules] + setup_stmts
        known |= set(modules)
        self.checks: list[ast.Expression] = []
        probes: list[str] = []
        for stmt in tree.body:
            if isinstance(stmt, ast.Assert):
                splitter = _Splitter(known)
                splitter.probes = probes
                expr = splitter.visit(stmt.test)
                self.checks.append(ast.fix_missing_locations(ast.Expression(body=expr)))
            elif not _unknown(stmt, known) and isinstance(stmt, (ast.Import, ast.ImportFrom, ast.Assign, ast.AnnAssign,
                                                                 ast.FunctionDef, ast.ClassDef, ast.Expr)):
                setup_stmts.append(stmt)
                known |= _bound_names(stmt)
            else:
                raise UnsplittableTestError(f"{source!r}: only asserts and setup statements that do not use the solution are supported")
        if not self.checks:
            raise UnsplittableTestError(f"{source!r}: no assert")
        self.probes = probes
        self.setup = ast.unparse(ast.Module(body=setup_stmts, type_ignores=[]))
        used = set().union(*(_loaded_names(ast.parse(p, mode="eval")) for p in probes)) if probes else set()
        self.sandbox_setup = ast.unparse(ast.Module(body=_needed(setup_stmts, used), type_ignores=[]))
        self.check_sources = [ast.unparse(c.body) for c in self.checks]

    def request(self, values: Sequence[Any]) -> dict[str, Any]:
        """What the judge gets: the setup, the checks and the encoded values the sandbox reported."""
        return {"setup": self.setup, "checks": self.check_sources, "values": list(values)}

    def verdict(self, values: Sequence[Any]) -> bool:
        """Evaluate the checks on decoded probe values here, in this process and without limits (the
        reward asks the judge instead: ``Sandbox.verdicts``)."""
        return _verdict(self.setup, self.check_sources, values)


@functools.lru_cache(maxsize=4096)
def _split(source: str, setup: str) -> SplitTest:
    return SplitTest(source, setup)


def _setup_text(setup: Any) -> str:
    """Setup code from a dataset cell: code, a list of lines, or such a list stored as its text."""
    if setup is None:
        return ""
    if isinstance(setup, (list, tuple)) and all(isinstance(x, str) for x in setup):
        return "\n".join(setup)
    if not isinstance(setup, str):
        raise UnsplittableTestError(f"setup {setup!r:.80}: neither code nor a list of lines")
    try:
        body = ast.parse(setup).body
    except SyntaxError:
        return setup
    if len(body) == 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, (ast.List, ast.Tuple)):
        items = body[0].value.elts
        if items and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in items):
            return "\n".join(e.value for e in items)  # type: ignore[attr-defined]
    return setup


def _norm_output(s: str) -> list[str]:
    lines = [ln.rstrip() for ln in s.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


class UnitTestReward:
    """Reward = share of the example's tests passed (0.0–1.0); None when the example has no usable tests.

    ``tests_column`` (default: the first of ``tests``, ``test_list``, ``test_cases``,
    ``input_output``) holds a list of assert strings, a single string of asserts (one test per
    assert), a list of ``{"input", "output"}`` pairs, APPS' ``{"inputs": [...], "outputs": [...]}``,
    or any of these JSON-encoded. ``setup_column`` (default ``test_setup_code``) holds setup code
    that runs before the tests on both sides. Code is taken from the last fenced block of the
    completion (``python`` preferred), or the whole completion when it has no fence.
    """

    def __init__(self, tests_column: str | None = None, setup_column: str | None = None,
                 sandbox: Sandbox | None = None, limits: Limits | None = None, name: str = "unit_test_reward") -> None:
        self.tests_column = tests_column
        self.setup_column = setup_column
        self._sandbox = sandbox
        self.limits = limits
        self.__name__ = name

    @property
    def sandbox(self) -> Sandbox:
        return self._sandbox or default_sandbox()

    def _tests_for(self, kwargs: Mapping[str, Any], i: int) -> Any:
        names = [self.tests_column] if self.tests_column else ["tests", "test_list", "test_cases", "input_output"]
        for n in names:
            v = row_value(kwargs, n, i)
            if v is not None:
                return v
        return None

    def __call__(self, prompts: Sequence[Any] | None = None, completions: Sequence[Any] | None = None,
                 **kwargs: Any) -> list[float | None]:
        completions = list(completions or [])
        plans: list[Any] = []
        jobs: list[dict[str, Any]] = []
        for i, c in enumerate(completions):
            try:
                plans.append(self._plan(c, kwargs, i, jobs))
            except UnsplittableTestError as exc:
                self._warn_once(str(exc))
                plans.append(None)
            except Exception as exc:  # never kill the training step over one example
                self._warn_once(f"{type(exc).__name__}: {exc}")
                plans.append(None)
        sandbox = self.sandbox
        try:
            results = sandbox.map(jobs) if jobs else []
            passed = [0] * len(plans)
            asked: list[tuple[int, dict[str, Any]]] = []
            for n, plan in enumerate(plans):
                for kind, test, job_index, test_index in plan or ():
                    res = results[job_index][test_index]
                    if kind == "stdio":
                        passed[n] += int(res.status == "exit" and res.code == 0 and res.ok
                                         and _norm_output(res.stdout) == _norm_output(test))
                    elif self._reported(test, res):
                        asked.append((n, test.request(res.values)))
            for (n, _), ok in zip(asked, sandbox.verdicts([req for _, req in asked], self.limits)):
                passed[n] += int(ok)
        except SandboxRefused:
            raise  # no isolation on this machine: refuse, in one line, rather than score
        except Exception as exc:
            self._warn_once(f"sandbox failed: {type(exc).__name__}: {exc}")
            return [None] * len(completions)
        return [None if plan is None else passed[n] / len(plan) for n, plan in enumerate(plans)]

    def _plan(self, completion: Any, kwargs: Mapping[str, Any], i: int, jobs: list[dict[str, Any]]) -> list[Any] | None:
        tests = self._tests_for(kwargs, i)
        if tests is None:
            return None
        setup = _setup_text(row_value(kwargs, self.setup_column or "test_setup_code", i))
        if isinstance(tests, str) and tests.lstrip()[:1] in ("[", "{"):  # JSON-encoded, as datasets often store them
            try:
                tests = json.loads(tests)
            except ValueError:
                pass
        if isinstance(tests, Mapping) and isinstance(tests.get("inputs"), list) and isinstance(tests.get("outputs"), list):
            tests = [{"input": a, "output": b} for a, b in zip(tests["inputs"], tests["outputs"])]  # APPS' input_output
        if isinstance(tests, str):  # one string of statements: each assert is a test, the rest is setup
            body = ast.parse(tests).body
            setup = "\n".join([setup] + [ast.unparse(s) for s in body if not isinstance(s, ast.Assert)])
            tests = [ast.unparse(s) for s in body if isinstance(s, ast.Assert)]
        if not isinstance(tests, (list, tuple)) or not tests:
            return None
        code = extract_code(completion_text(completion))
        plan = []
        job_tests: list[dict[str, Any]] = []
        for t in tests:
            if isinstance(t, Mapping) and "input" in t and "output" in t:
                job_tests.append({"stdin": str(t["input"])})
                plan.append(("stdio", str(t["output"]), len(jobs), len(job_tests) - 1))
            elif isinstance(t, str):
                split = _split(t, setup)
                job_tests.append({"probes": split.probes, "setup": split.sandbox_setup})
                plan.append(("assert", split, len(jobs), len(job_tests) - 1))
            else:
                raise UnsplittableTestError(f"unsupported test {t!r:.80}")
        jobs.append({"code": code, "tests": job_tests, "limits": self.limits})
        return plan

    @staticmethod
    def _reported(test: SplitTest, res: JobResult) -> bool:
        """The sandbox ran the code and reported one value per probe: the judge may decide."""
        return res.ok and res.values is not None and len(res.values) == len(test.probes)

    def _warn_once(self, msg: str) -> None:
        seen = self.__dict__.setdefault("_warned", set())
        if msg not in seen and len(seen) < 20:
            seen.add(msg)
            logger.warning("grpo-monitor %s: %s (scored None)", self.__name__, msg)

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_warned"}


unit_test_reward = UnitTestReward()
