"""Unit-test execution reward: the share of an example's tests the completion's code truly passes.

Tests are ``assert`` statements (MBPP's ``test_list``, asserts converted from HumanEval) or
stdin/stdout pairs (``{"input": ..., "output": ...}``, as in APPS and CodeContests).

Why the count cannot be forged. A test never runs in the same process as its verdict. Each
``assert`` is split, in the trainer, into *probes*, the sub-expressions that call into the
completion's code (``f(3)`` in ``assert f(3) == 9``, ``f(3)`` again in ``assert f(3)[0] == 9``),
and the rest (``_ == 9``). The sandbox runs the completion and evaluates only the probes, each test
in a fresh process, and reports their values as plain data (exact built-in types: an object whose
``__eq__`` always says yes is refused). Of the setup code, no statement that binds a value enters
the sandbox: a probe's inputs that read the setup's names (``x`` in ``f(x)``, ``cases[0][0]``) are
evaluated by the judge and passed in by value, so a setup line that binds an input together with
its answer (``x, expected = 5, 25``, a list of pairs) keeps the answer out; only the imports the
probes use and calls made for their effect on an imported module (``sys.setrecursionlimit(...)``)
run there. A third process, the judge, evaluates the rest of the assertion on those values, with
its own copy of the standard library (a module the test uses without importing it,
``math.isclose``, is that module, never the completion's patched one), under a memory and a time
limit. Where the setup's own code calls the solution (a helper ``def check(x): return solve(x) ==
9``), the judge runs it with each such call answered by the sandbox, from its arguments only. The
completion never sees the expected values, so exiting early, printing a pass summary, raising
``SystemExit``, patching ``builtins``, a library or the runner, or writing to the result pipe can
only report values, and values pass only if they are the right answers. A test whose verdict logic
would have to run beside the completion (a comprehension or lambda that calls it) is refused, and
so is one whose inputs are not plain data: the example scores None.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import functools
import importlib
import json
import keyword
import logging
import symtable
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from grpo_monitor.rewards._sandbox_child import ARG_PREFIX as _ARG_PREFIX
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
    """The setup statements the sandbox runs: imports the probes use, and calls made for their
    effect on an imported module (``sys.setrecursionlimit(10 ** 6)``: literal arguments only), with
    the imports they use. No statement that binds a value: a value a probe needs is passed in."""
    imports = [st for st in stmts if isinstance(st, (ast.Import, ast.ImportFrom))]
    modules = _bound_names(ast.Module(body=imports, type_ignores=[]))
    need = set(names)
    effects = []
    for st in stmts:
        if (isinstance(st, ast.Expr) and isinstance(st.value, ast.Call) and isinstance(st.value.func, ast.Attribute)
                and _root_name(st.value.func) in modules
                and not any(_loaded_names(a) for a in st.value.args + [k.value for k in st.value.keywords])):
            effects.append(st)
            need.add(_root_name(st.value.func))  # type: ignore[arg-type]
    return [st for st in stmts if st in effects or (st in imports and _bound_names(st) & need)]


def _root_name(node: ast.expr) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _solution_names(setup: str) -> list[str]:
    """Names the setup's code reads (in a helper's body too) that nothing in it binds at module
    level and that are not builtins: the solution's, as the setup sees it."""
    try:
        top = symtable.symtable(setup, "<test setup>", "exec")
    except SyntaxError:
        return []
    bound = {sym.get_name() for sym in top.get_symbols() if sym.is_assigned() or sym.is_imported()}
    found: set[str] = set()
    tables = [top]
    while tables:
        table = tables.pop()
        for sym in table.get_symbols():
            if sym.is_referenced() and (table is top or sym.is_global()):
                found.add(sym.get_name())
            if table is not top and sym.is_declared_global() and sym.is_assigned():
                bound.add(sym.get_name())
        tables.extend(table.get_children())
    return sorted(found - bound - _BUILTIN_NAMES)


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


class _Inputs(ast.NodeTransformer):
    """Inside a probe: each largest sub-expression that does not involve the solution and reads a
    name the setup binds to a value becomes an input, ``__grpo_arg_<i>``, evaluated by the judge
    and passed in by value. What reads only builtins and imported modules stays as written: it is
    the test's own text."""

    def __init__(self, known: set[str], literal: set[str], sources: list[str]) -> None:
        self.known, self.literal, self.sources = known, literal, sources

    def visit(self, node: ast.AST) -> Any:
        # A starred argument, a slice or an f-string part is no expression of its own: its parts are.
        if (isinstance(node, ast.expr) and not isinstance(node, (ast.Starred, ast.Slice, ast.FormattedValue))
                and not _unknown(node, self.known)):
            if _loaded_names(node) <= self.literal:
                return node
            name = f"{_ARG_PREFIX}{len(self.sources)}"
            self.sources.append(ast.unparse(node))
            return ast.copy_location(ast.Name(id=name, ctx=ast.Load()), node)
        return self.generic_visit(node)


class SplitTest:
    """One test: setup statements, probes (run in the sandbox with their inputs passed by value, and
    the imports they use) and checks (run in the judge, after the whole setup).

    ``probes``: the sub-expressions as the test writes them; ``sandbox_probes``: as the sandbox
    evaluates them, each input read from the setup replaced by ``__grpo_arg_<i>``, whose source is
    ``arg_sources[i]`` (the judge evaluates it, ``args`` holds the encoded values once it has);
    ``sandbox_setup``: the setup statements the sandbox runs; ``remote``: the solution's names the
    setup's own code calls (the judge asks the sandbox for each such call)."""

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
        setup_module = ast.Module(body=setup_stmts, type_ignores=[])
        assigned = _bound_names(ast.Module(body=[st for st in setup_stmts if not isinstance(st, (ast.Import, ast.ImportFrom))],
                                           type_ignores=[]))
        imported = _bound_names(ast.Module(body=[st for st in setup_stmts if isinstance(st, (ast.Import, ast.ImportFrom))],
                                           type_ignores=[])) - assigned
        literal = (set(_BUILTIN_NAMES) - assigned) | imported
        self.arg_sources: list[str] = []
        inputs = _Inputs(known, literal, self.arg_sources)
        trees = [inputs.visit(ast.parse(p, mode="eval").body) for p in probes]
        self.sandbox_probes = [ast.unparse(t) for t in trees]
        used = set().union(*(_loaded_names(t) for t in trees)) if trees else set()
        self.sandbox_setup = ast.unparse(ast.Module(body=_needed(setup_stmts, used), type_ignores=[]))
        self.remote = _solution_names(ast.unparse(setup_module))
        self.args: list[Any] | None = None if self.arg_sources else []
        self.check_sources = [ast.unparse(c.body) for c in self.checks]

    def arg_request(self) -> dict[str, Any]:
        """What the judge gets to evaluate the probes' inputs."""
        return {"setup": self.setup, "args": self.arg_sources, "remote": self.remote}

    def sandbox_test(self) -> dict[str, Any]:
        """The test as the sandbox runs it (its inputs evaluated: ``args`` is set)."""
        if self.args is None:
            raise RuntimeError("the judge has not evaluated this test's inputs yet")
        return {"probes": self.sandbox_probes, "setup": self.sandbox_setup, "args": self.args}

    def calls_test(self, calls: Sequence[Any]) -> dict[str, Any]:
        """The calls into the solution the judge needs (``[path, args, kwargs]``, encoded), as a
        sandbox test whose answers are the calls' values or what they raised."""
        probes, args = [], []
        for path, a, kw in calls:
            if not (isinstance(path, str) and all(p.isidentifier() and not keyword.iskeyword(p) for p in path.split("."))):
                raise ValueError(f"not a name of the solution's: {path!r:.80}")
            probes.append(f"{path}(*{_ARG_PREFIX}{len(args)}, **{_ARG_PREFIX}{len(args) + 1})")
            args += [a, kw]
        return {"probes": probes, "setup": self.sandbox_setup, "args": args, "calls": True}

    def request(self, values: Sequence[Any], answers: Sequence[Any] = ()) -> dict[str, Any]:
        """What the judge gets: the setup, the checks and the encoded values the sandbox reported,
        and the answers to the setup's calls into the solution so far."""
        return {"setup": self.setup, "checks": self.check_sources, "values": list(values), "remote": self.remote,
                "answers": list(answers)}

    def verdict(self, values: Sequence[Any]) -> bool:
        """Evaluate the checks on decoded probe values here, in this process and without limits (the
        reward asks the judge instead: ``Sandbox.judge``). A setup calling the solution fails here."""
        return _verdict(self.setup, self.check_sources, values, self.remote)


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


# The setup's calls into the solution, per test: rounds of sandbox runs, and calls in all.
MAX_ROUNDS = 16
MAX_CALLS = 64


@dataclasses.dataclass
class _Plan:
    code: str
    tests: list[tuple[str, Any, Any]] = dataclasses.field(default_factory=list)  # ("stdio", stdin, stdout) | ("assert", SplitTest, None)


@dataclasses.dataclass
class _Open:
    """An assert test the judge has yet to decide."""

    n: int  # the completion
    test: SplitTest
    values: list[Any]
    answers: list[Any] = dataclasses.field(default_factory=list)
    need: list[Any] = dataclasses.field(default_factory=list)
    calls: dict[str, Any] = dataclasses.field(default_factory=dict)


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
        plans: list[_Plan | None] = []
        for i, c in enumerate(completions):
            try:
                plans.append(self._plan(c, kwargs, i))
            except UnsplittableTestError as exc:
                self._warn_once(str(exc))
                plans.append(None)
            except Exception as exc:  # never kill the training step over one example
                self._warn_once(f"{type(exc).__name__}: {exc}")
                plans.append(None)
        sandbox = self.sandbox
        try:
            self._inputs(plans, sandbox)
            ran = [n for n, plan in enumerate(plans) if plan is not None]
            jobs = [{"code": plans[n].code,  # type: ignore[union-attr]
                     "tests": [{"stdin": t} if kind == "stdio" else t.sandbox_test() for kind, t, _ in plans[n].tests],  # type: ignore[union-attr]
                     "limits": self.limits} for n in ran]
            results = sandbox.map(jobs) if jobs else []
            passed = [0] * len(plans)
            open_: list[_Open] = []
            for n, job_results in zip(ran, results):
                for (kind, test, expected), res in zip(plans[n].tests, job_results):  # type: ignore[union-attr]
                    if kind == "stdio":
                        passed[n] += int(res.status == "exit" and res.code == 0 and res.ok
                                         and _norm_output(res.stdout) == _norm_output(expected))
                    elif self._reported(test, res):
                        open_.append(_Open(n, test, list(res.values or [])))
            self._judge(open_, plans, passed, sandbox)
        except SandboxRefused:
            raise  # no isolation on this machine: refuse, in one line, rather than score
        except Exception as exc:
            self._warn_once(f"sandbox failed: {type(exc).__name__}: {exc}")
            return [None] * len(completions)
        return [None if plan is None else passed[n] / len(plan.tests) for n, plan in enumerate(plans)]

    def _inputs(self, plans: list[_Plan | None], sandbox: Sandbox) -> None:
        """Have the judge evaluate the inputs of the tests that read them from the setup, once per
        test; an example with an input that is not plain data scores None."""
        todo: dict[int, SplitTest] = {}
        for plan in plans:
            for kind, t, _ in plan.tests if plan else ():
                if kind == "assert" and t.args is None:
                    todo[id(t)] = t
        tests = list(todo.values())
        failed: dict[int, str] = {}
        for t, rep in zip(tests, sandbox.judge([t.arg_request() for t in tests], self.limits) if tests else []):
            if rep.get("ok") is True and isinstance(rep.get("values"), list) and len(rep["values"]) == len(t.arg_sources):
                t.args = rep["values"]
            else:
                failed[id(t)] = (f"{t.source!r:.120}: its inputs ({', '.join(t.arg_sources)}) cannot be passed to "
                                 f"the sandbox by value ({rep.get('error') or 'not plain data'})")
        for n, plan in enumerate(plans):
            for kind, t, _ in plan.tests if plan else ():
                if kind == "assert" and id(t) in failed:
                    self._warn_once(failed[id(t)])
                    plans[n] = None
                    break

    def _judge(self, open_: list[_Open], plans: list[_Plan | None], passed: list[int], sandbox: Sandbox) -> None:
        """Ask the judge about each test; where the setup's code calls the solution, run the calls it
        needs in the sandbox and ask again, up to ``MAX_ROUNDS`` times and ``MAX_CALLS`` calls."""
        for round_ in range(MAX_ROUNDS + 1):
            if not open_:
                return
            replies = sandbox.judge([o.test.request(o.values, o.answers) for o in open_], self.limits)
            waiting: dict[int, list[_Open]] = {}
            for o, rep in zip(open_, replies):
                need = rep.get("need")
                if isinstance(need, list) and need and round_ < MAX_ROUNDS and len(o.answers) + len(need) <= MAX_CALLS:
                    try:
                        o.calls = o.test.calls_test(need)
                    except (TypeError, ValueError):
                        continue
                    o.need = need
                    waiting.setdefault(o.n, []).append(o)
                elif rep.get("ok") is True:
                    passed[o.n] += 1
            if not waiting:
                return
            jobs = [{"code": plans[n].code, "tests": [o.calls for o in group], "limits": self.limits}  # type: ignore[union-attr]
                    for n, group in waiting.items()]
            open_ = []
            for group, results in zip(waiting.values(), sandbox.map(jobs)):
                for o, res in zip(group, results):
                    if res.ok and isinstance(res.values, list) and len(res.values) == len(o.need):
                        o.answers += [[call, value] for call, value in zip(o.need, res.values)]
                        open_.append(o)

    def _plan(self, completion: Any, kwargs: Mapping[str, Any], i: int) -> _Plan | None:
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
        plan = _Plan(extract_code(completion_text(completion)))
        for t in tests:
            if isinstance(t, Mapping) and "input" in t and "output" in t:
                plan.tests.append(("stdio", str(t["input"]), str(t["output"])))
            elif isinstance(t, str):
                plan.tests.append(("assert", _split(t, setup), None))
            else:
                raise UnsplittableTestError(f"unsupported test {t!r:.80}")
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
