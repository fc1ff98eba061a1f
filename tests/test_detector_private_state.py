"""A detector judges from what ``assess`` is given and its own state, never from the base's bookkeeping.

The base's ``update`` owns the episode (open, onset, points, what awaits confirmation) and the confirmation a
raise needs; a detector reads the first through ``self.episode`` (a frozen view) and says the second in its
``Assessment``. A detector that reads or writes the bookkeeping itself couples its verdicts to the state
machine's internals, so a change there silently changes what it raises.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
from pathlib import Path

import pytest

from grpo_monitor.detectors import base
from grpo_monitor.detectors.base import Assessment, Detector, Episode
from grpo_monitor.detectors.non_finite import NonFinite

DETECTORS = Path(base.__file__).parent
# The base's bookkeeping under public names: kept for callers outside a detector.
EPISODE_NAMES = {"in_episode", "episode_start", "episode_len"}
# Fixed in ``__init__``; a need that varies goes in the ``Assessment``.
CONFIRM_NAMES = {"confirm_points", "confirm_steps"}
# Written only by the base (``warms_up`` says how a fresh one starts), read-only views.
BASE_WRITES = {"state", "episode", "evidence"}
# Private methods of the base a detector is meant to override.
HOOKS = {"_reset_state", "_message", "_variant", "_overrides"}


def _base_private_names() -> set[str]:
    """Every ``self._x`` the base's ``Detector`` assigns, and its private methods other than the hooks."""
    tree = ast.parse(Path(base.__file__).read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Detector")
    names = {n.name for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
             and n.name.startswith("_") and not n.name.startswith("__") and n.name not in HOOKS}
    for node in ast.walk(cls):
        if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and isinstance(node.value, ast.Name)
                and node.value.id == "self" and node.attr.startswith("_") and not node.attr.startswith("__")):
            names.add(node.attr)
    return names


BASE_PRIVATE = _base_private_names()


def _stored(node: ast.Attribute) -> bool:
    return isinstance(node.ctx, (ast.Store, ast.Del))


def violations(cls_node: ast.ClassDef) -> list[str]:
    """What a detector class's methods do with the base's state: ``line: method: what``."""
    out = []
    for item in cls_node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name in BASE_PRIVATE:
            out.append(f"{item.lineno}: overrides the base's {item.name}")
    for fn in cls_node.body:
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or not fn.args.args:
            continue
        me = fn.args.args[0].arg
        for node in ast.walk(fn):
            name, stored = None, False
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == me:
                name, stored = node.attr, _stored(node)
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                  and node.func.id in ("getattr", "setattr", "delattr", "hasattr") and len(node.args) >= 2
                  and isinstance(node.args[0], ast.Name) and node.args[0].id == me
                  and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
                name, stored = node.args[1].value, node.func.id in ("setattr", "delattr")
            if name is None:
                continue
            where = f"{node.lineno}: {fn.name}: {me}.{name}"
            if name in BASE_PRIVATE:
                out.append(f"{where} is the base's private state")
            elif name in EPISODE_NAMES:
                out.append(f"{where} (read self.episode)")
            elif name in BASE_WRITES and stored:
                out.append(f"{where} written (the base's)")
            elif name in CONFIRM_NAMES and stored and fn.name != "__init__":
                out.append(f"{where} changed outside __init__ (say it in the Assessment)")
    return out


def _detector_classes() -> list[tuple[str, str]]:
    """(module file, class name) of every Detector subclass defined in ``detectors/`` outside the base."""
    found = []
    for path in sorted(DETECTORS.glob("*.py")):
        if path.name == "base.py":
            continue
        module = importlib.import_module(f"grpo_monitor.detectors.{path.stem}")
        for name, obj in vars(module).items():
            if (inspect.isclass(obj) and issubclass(obj, Detector) and obj is not Detector
                    and obj.__module__ == module.__name__):
                found.append((path.name, name))
    return found


CLASSES = _detector_classes()


def test_every_registered_detector_is_checked():
    from grpo_monitor.detectors import ALL_DETECTORS

    checked = {name for _, name in CLASSES}
    assert {c.__name__ for c in ALL_DETECTORS} <= checked
    assert {"_pending", "_in_episode", "_episode_len", "_emitted", "_evidence", "_book"} <= BASE_PRIVATE


@pytest.mark.parametrize(("module", "cls"), CLASSES, ids=[f"{m}:{c}" for m, c in CLASSES])
def test_detector_keeps_off_the_base_state(module: str, cls: str):
    tree = ast.parse((DETECTORS / module).read_text())
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls)
    assert violations(node) == []


def test_the_check_finds_each_kind_of_violation():
    source = '''
class Bad(Detector):
    def __init__(self):
        self.confirm_points = 2
        super().__init__()

    def _reset_state(self):
        self.state = "ok"

    def assess(self, step, metrics, samples):
        if self.in_episode and self._pending and getattr(self, "_emitted"):
            self.confirm_steps = 10
        return Assessment(1 if self.episode_len else 0)

    def _book(self, step, a):
        return []
'''
    found = violations(ast.parse(source).body[0])
    assert len(found) == 7, found
    assert not any(": __init__:" in f for f in found)
    for what in ("_book", "self.state written", "self.in_episode", "self._pending", "self._emitted",
                 "self.confirm_steps changed", "self.episode_len"):
        assert any(what in f for f in found), what


# -- the view and the Assessment field, at run time --------------------------------------------------

class _Probe(Detector):
    id = "probe"

    def __init__(self, levels: tuple[int, ...] = (), confirm: int | None = None) -> None:
        self.levels = levels
        self.confirm = confirm
        super().__init__()

    def _reset_state(self) -> None:
        self.seen: list[Episode] = []

    def assess(self, step, metrics, samples):
        self.seen.append(self.episode)
        level = self.levels[step - 1] if step <= len(self.levels) else 0
        return Assessment(level, {"step": step}, confirm_points=self.confirm)

    def _message(self, severity, evidence):
        return "probe"


def test_the_episode_view_is_read_only():
    det = _Probe(levels=(1, 1, 0, 0, 0))
    with pytest.raises(AttributeError):
        det.episode = Episode(open=True)  # type: ignore[misc]
    with pytest.raises(AttributeError):
        det.evidence = {}  # type: ignore[misc]
    with pytest.raises(AttributeError):
        det.in_episode = True  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        det.episode.open = True  # type: ignore[misc]
    det.update(1, {})
    with pytest.raises(dataclasses.FrozenInstanceError):
        det.episode.points = 5  # type: ignore[misc]
    assert det.episode == Episode(open=True, since=1, points=1, pending=0)


def test_assess_sees_the_episode_as_it_stood_before_its_step():
    det = _Probe(levels=(0, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), confirm=2)
    found = [f for s in range(1, 16) for f in det.update(s, {})]
    assert [(f.severity, f.step, f.onset_step) for f in found] == [("warning", 3, 2)]
    assert det.seen[:5] == [Episode(), Episode(), Episode(pending=1), Episode(True, 2, 1), Episode(True, 2, 2)]
    assert det.seen[-1] == Episode() and not det.in_episode
    det.reset()
    assert det.episode == Episode() and det.seen == []


@pytest.mark.parametrize(("confirm", "raised_at"), [(None, 1), (1, 1), (3, 3)])
def test_assessment_confirm_points_overrides_the_default(confirm, raised_at):
    det = _Probe(levels=(1, 1, 1, 1), confirm=confirm)
    assert [f.step for s in range(1, 5) for f in det.update(s, {})] == [raised_at]
    assert det.confirm_points == 1  # the default itself is never changed


def test_assessment_confirm_steps_needs_the_stretch_of_training():
    class Stretch(_Probe):
        def assess(self, step, metrics, samples):
            return Assessment(1, {}, confirm_steps=10)

    det = Stretch()
    assert [f.step for s in range(1, 16) for f in det.update(s, {})] == [10]


def test_a_check_without_warm_up_starts_ok():
    det = NonFinite()
    assert det.state == "ok"
    det.update(1, {"loss": float("nan")})
    det.reset()
    assert det.state == "ok" and _Probe().state == "warming_up"
