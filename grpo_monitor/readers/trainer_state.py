"""Hugging Face ``trainer_state.json``: the ``log_history`` every Trainer checkpoint carries.

Two readers: ``TrainerStateReader`` (the file, or a checkpoint folder holding it) and
``CheckpointsReader`` (a Trainer output_dir: its newest ``checkpoint-*/``). The ``config.json`` a
checkpoint keeps beside its state names the model (``readers.model``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from grpo_monitor.core.metrics import SUMMARY_KEYS
from grpo_monitor.core.runlog import Skipped
from grpo_monitor.readers._base import (
    HugeNumber,
    Normalizer,
    Probe,
    Reader,
    Source,
    SourceError,
    StepTable,
    as_step,
    finish,
    guess_context,
    note_skipped,
    parse_json,
    refuse_if_mostly_skipped,
    step_fault,
    usable_step,
)


def is_trainer_state(obj: Any) -> bool:
    return isinstance(obj, dict) and "log_history" in obj


def read_trainer_state(path: Path, obj: Any) -> Source:
    """Build a Source from a parsed ``trainer_state.json`` object.

    Every ``log_history`` entry is one logged step; entries sharing a step (a train entry and
    an eval entry) are merged. The end-of-training summary (``train_runtime``, ``train_loss``,
    ...) is not a step: it is set aside in ``meta["summary"]``.
    """
    if not isinstance(obj, dict):
        raise SourceError(path, f"expected a JSON object with 'log_history', got {type(obj).__name__}")
    if "log_history" not in obj:
        raise SourceError(path, "a JSON object without 'log_history' (not a trainer_state.json)")
    history = obj["log_history"]
    if not isinstance(history, list):
        raise SourceError(path, f"'log_history' is {type(history).__name__}, expected a list")
    src = Source(path=path, format="trainer_state")
    table = StepTable()
    norm = Normalizer()
    summaries = 0
    bad: list[tuple[int, str]] = []  # (index, why) of each entry left out: named once their lines are known
    for i, entry in enumerate(history):
        if not isinstance(entry, dict):
            bad.append((i, f"{type(entry).__name__}, expected an object"))
            continue
        if "train_runtime" in entry or (SUMMARY_KEYS & entry.keys() and "loss" not in entry and "train_loss" in entry):
            summaries += 1
            # Kept aside: its train_runtime is the run's clock where the steps carry none (core.cost).
            src.meta.setdefault("summary", {k: v for k, v in entry.items() if isinstance(v, (int, float))})
            continue
        if "step" not in entry:
            bad.append((i, "no 'step'"))
            continue
        step = usable_step(entry["step"])
        if step is None:
            bad.append((i, f"step {_short(entry['step'])} is no step ({step_fault(entry['step'])})"))
            continue
        table.add(step, norm(entry))
    skipped = Skipped()
    if bad:
        lines = entry_lines(path, [i for i, _ in bad])
        for i, why in bad:
            at = f"{path}:{lines[i]}" if i in lines else str(path)
            skipped.add(f"{at}: log_history[{i}]: {why}")
    refuse_if_mostly_skipped(path, skipped, len(table), "log_history entries")
    if not len(table):
        if skipped.count:
            raise SourceError(path, f"log_history holds no usable step ({skipped.where[0]})")
        raise SourceError(path, "log_history holds no logged steps")
    note_skipped(src, skipped)
    finish(src, table, "entries")
    logging_steps = as_step(obj.get("logging_steps"))
    src.context = guess_context(src.metric_names(), logging_steps, [s for s, _ in src.steps])
    return src


def _short(value: Any) -> str:
    try:
        text = json.dumps(value) if not isinstance(value, (str, HugeNumber)) else repr(value)
    except ValueError:  # an integer of thousands of digits
        text = "a number of many digits"
    return text if len(text) <= 40 else text[:37] + "..."


_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{},\n]|[^\s\[\]{},":]+')


def entry_lines(path: Path, wanted: list[int]) -> dict[int, int]:
    """The line each wanted ``log_history`` entry starts on, found by one scan of the file's strings and
    brackets (the parsed document keeps no positions); {} where the file cannot be scanned so."""
    try:
        text = path.read_bytes().decode("utf-8-sig", "replace")
    except OSError:
        return {}
    want = set(wanted)
    out: dict[int, int] = {}
    depth = 0
    line = 1
    in_history = False
    index = 0
    expect_value = False  # inside the array, the next token starts entry ``index``
    last_key = None
    for m in _TOKENS.finditer(text):
        tok = m.group()
        if tok == "\n":
            line += 1
            continue
        if in_history and depth == 2 and expect_value:
            if index in want:
                out[index] = line
                if len(out) == len(want):
                    break
            expect_value = False
        if tok[0] == '"':
            if depth == 1:
                last_key = tok
            continue
        if tok[0] not in "[]{},":  # a number or a literal
            continue
        if tok in "[{":
            depth += 1
            if tok == "[" and depth == 2 and last_key == '"log_history"':
                in_history, expect_value = True, True
        elif tok in "]}":
            depth -= 1
            if in_history and depth < 2:
                break
        elif tok == "," and in_history and depth == 2:
            index += 1
            expect_value = True
    return out


def read_state_file(path: Path, obj: Any = None) -> Source:
    """A ``trainer_state.json`` with the model its folder holds, when it holds one."""
    from grpo_monitor.readers.model import model_in_folder, set_model

    src = read_trainer_state(path, parse_json(path, path.read_bytes()) if obj is None else obj)
    set_model(src, model_in_folder(path.parent))
    return src


class TrainerStateReader(Reader):
    name = "trainer_state"
    formats = ("trainer_state",)
    describes = "trainer_state.json"
    folder_holds = "trainer_state.json"

    def sniff(self, probe: Probe) -> str | None:
        if probe.is_dir:
            return "trainer_state" if (probe.path / "trainer_state.json").is_file() else None
        if probe.layout != "document":
            return None
        return "trainer_state" if is_trainer_state(probe.document()) else None

    def one_run(self, folder: Path) -> bool:
        return (folder / "trainer_state.json").is_file()

    def read(self, probe: Probe, fmt: str) -> Source:
        if probe.is_dir:
            return read_state_file(probe.path / "trainer_state.json")
        return read_state_file(probe.path, probe.document())


class CheckpointsReader(Reader):
    """A Trainer output_dir without TensorBoard logs: the newest checkpoint has the longest history."""

    name = "checkpoints"
    formats = ("trainer_state",)
    folder_holds = "checkpoint-*/"

    def sniff(self, probe: Probe) -> str | None:
        if not probe.is_dir:
            return None
        best = newest_checkpoint(probe.path)
        if best is None:
            return None
        probe.cache["checkpoint"] = best
        return "trainer_state"

    def one_run(self, folder: Path) -> bool:
        return any(folder.glob("checkpoint-*/trainer_state.json"))

    def read(self, probe: Probe, fmt: str) -> Source:
        state = probe.cache.get("checkpoint") or newest_checkpoint(probe.path)
        src = read_state_file(state)
        src.warnings.append(f"{probe.path}: read the newest checkpoint's {state.relative_to(probe.path)}")
        return src


def newest_checkpoint(folder: Path) -> Path | None:
    """``checkpoint-<n>/trainer_state.json`` with the largest n, or None."""
    best: tuple[int, Path] | None = None
    for child in folder.glob("checkpoint-*/trainer_state.json"):
        try:
            n = int(child.parent.name.split("-", 1)[1])
        except ValueError:
            continue
        if best is None or n > best[0]:
            best = (n, child)
    return best[1] if best else None
