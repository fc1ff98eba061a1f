"""What a log says about the model it trained: the facts the detectors' ``RunContext`` needs offline.

Live, the callback reads them off the model (``callbacks.model_facts``); offline they come from,
best first: what the user says (``analyze --model Qwen/Qwen3-30B-A3B`` or a local model folder),
the ``config.json`` a checkpoint keeps beside its ``trainer_state.json`` (or the base model an
``adapter_config.json`` names), and a model id the log itself prints (a notebook's
``model_name = "..."``, a printed ``model_name_or_path``, verl's ``actor_rollout_ref.model.path``).
A model known only by its id takes its shape from ``core.model_config.config_from_model_id`` (the common
architectures lint sizes too), else is MoE when ``moe_from_model_id`` knows its family.
Every set of facts says where it came from (``source``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from grpo_monitor.core.jsonparse import loads
from grpo_monitor.core.model_config import config_from_model_id, config_model_facts, moe_from_model_id
from grpo_monitor.readers._base import Source, SourceError

# ``key = "owner/name"`` in code or a printed config; the id needs a slash (a hub id or a path), so a
# bare word (``model_name = "policy"``) names nothing.
_ID = r"['\"]?(?P<id>[\w.~-]*/[\w./~-]*[\w-])"
_NAMED = re.compile(
    r"(?<![\w.])(?P<key>model_name_or_path|pretrained_model_name_or_path|model_name|model_id|base_model_name_or_path|"
    r"base_model|actor_rollout_ref\.model\.path)['\"]?\s*[:=]\s*" + _ID)
_LOADED = re.compile(r"\b(?P<key>from_pretrained)\(\s*(?:model_name\s*=\s*)?" + _ID)
# Printed configs come before training: the head of a long log is enough.
_HINT_CHARS = 2_000_000


def facts_for_id(model_id: str, source: str) -> dict[str, Any]:
    """A model known by its hub id (or path) alone: a common architecture's shape from the table
    lint sizes memory with (type, layout, vision), else what its MoE family says."""
    known = config_from_model_id(model_id)
    if known is not None:
        facts = config_model_facts(known, name=model_id)
    else:
        facts = {"name_or_path": model_id}
        moe = moe_from_model_id(model_id)
        if moe:
            facts.update(is_moe=True, num_experts=moe.get("num_experts"), top_k=moe.get("top_k"))
    facts["source"] = source
    return facts


def model_in_folder(folder: Path) -> dict[str, Any] | None:
    """The model a checkpoint or model folder holds: its ``config.json``, else the base model its
    ``adapter_config.json`` (a PEFT adapter) names; None when it holds neither."""
    config = _json_file(folder / "config.json")
    if isinstance(config, dict) and ("architectures" in config or "model_type" in config):
        facts = config_model_facts(config)
        facts["source"] = f"{folder / 'config.json'}"
        return facts
    adapter = _json_file(folder / "adapter_config.json")
    base = adapter.get("base_model_name_or_path") if isinstance(adapter, dict) else None
    if isinstance(base, str) and base:
        return facts_for_id(base, f"{folder / 'adapter_config.json'} (base model)")
    return None


def model_from_spec(spec: str) -> dict[str, Any]:
    """The model a user names (``--model``): a local model folder or ``config.json``, else a hub id."""
    text = str(spec).strip()
    if not text:
        raise SourceError(None, "--model: empty model name")
    p = Path(text).expanduser()
    if p.exists():
        facts = model_in_folder(p if p.is_dir() else p.parent) if p.is_dir() or p.name == "config.json" else None
        if facts is None:
            raise SourceError(p, "--model: neither a model folder with config.json (or adapter_config.json) nor a hub id")
        facts["source"] = f"--model {text} ({facts['source']})"
        return facts
    if text.startswith(("/", "./", "../", "~")):
        raise SourceError(p, "--model: no such file or directory")
    return facts_for_id(text, f"--model {text}")


def model_in_text(text: str, where: str) -> dict[str, Any] | None:
    """The model a log's text names (code or a printed config), as facts by its id; None if none."""
    head = text[:_HINT_CHARS]
    m = _NAMED.search(head) or _LOADED.search(head)
    if m is None:
        return None
    model_id = m.group("id")
    return facts_for_id(model_id, f"{where} ({m.group('key')} {model_id})")


def set_model(src: Source, facts: dict[str, Any] | None, *, override: bool = False) -> None:
    """Give ``src`` (and each run it holds) these model facts, unless it has its own and ``override``
    is False. A model the user names replaces the log's, and the source says so."""
    if not facts:
        return
    for part in [src, *(p for _, p in src.parts if p is not src)]:
        own = part.context.model
        if own and not override:
            continue
        if own and override:
            named = own.get("name_or_path") or own.get("class")
            if named and named != facts.get("name_or_path"):
                part.warnings.append(f"{part.path}: {facts.get('source')} used in place of the model the log names ({named})")
        part.context.model = dict(facts)


def _json_file(path: Path) -> Any:
    try:
        return loads(path.read_bytes()) if path.is_file() else None
    except (OSError, ValueError, RecursionError):
        return None
