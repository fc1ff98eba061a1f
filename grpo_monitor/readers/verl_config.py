"""The training config a verl console log prints: the Hydra config its ``TaskRunner`` pretty-prints before
the first step (else the ``key.path=value`` overrides its launch script echoes), given the ``GRPOConfig``
names the detectors read.

verl's console log carries no config beside it, but its first lines are the whole resolved config, one
``pprint`` of a nested dict behind Ray's ``(TaskRunner pid=...)`` prefix; a script run with ``set -x`` also
prints its command line, ``data.max_response_length=4096`` and the like. The settings that decide a verdict
are there: the length cap (``data.max_response_length``: without it a detector can only take the longest
completion seen for the cap), the group size (``rollout.n``), the prompts per step, an entropy bonus
(``actor.entropy_coeff``), the learning rate, the KL coefficient and a sequence-level loss (GSPO). Only
literals are read; a dump that does not parse gives no config rather than a guess.

>>> text = '''(TaskRunner pid=7) {'actor_rollout_ref': {'actor': {'entropy_coeff': 0.1, 'optim': {'lr': 1e-06},
... (TaskRunner pid=7)                                 'use_kl_loss': False},
... (TaskRunner pid=7)                       'model': {'path': '/models/Qwen2.5-7B-Instruct'},
... (TaskRunner pid=7)                       'rollout': {'n': 4, 'temperature': 1.0}},
... (TaskRunner pid=7)  'data': {'max_response_length': 128, 'train_batch_size': 2}}
... step:1 - actor/entropy:0.12'''
>>> config, model, estimator = verl_config(text)
>>> config
{'learning_rate': 1e-06, 'entropy_coef': 0.1, 'num_generations': 4, 'temperature': 1.0, 'max_completion_length': 128, 'beta': 0.0, 'generation_batch_size': 8}
>>> model, estimator
('/models/Qwen2.5-7B-Instruct', None)
>>> verl_config("+ python3 -m verl.trainer.main_ppo data.max_response_length=4096 actor_rollout_ref.rollout.n=4 "
...             "actor_rollout_ref.actor.policy_loss.loss_mode=gspo algorithm.adv_estimator=grpo")
({'num_generations': 4, 'max_completion_length': 4096, 'importance_sampling_level': 'sequence'}, None, 'grpo')
>>> group_of_one_note({"num_generations": 1}, "grpo")[:60]
'rollout.n = 1 with the GRPO advantage: each prompt has one c'
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from typing import Any

# The line the dump starts on: an optional Ray prefix, then the dict's first key (verl's top-level groups).
_START = re.compile(r"^(?P<prefix>\([\w.:-]+ pid=\d+[^)]*\)\s?)?\{'(?:actor_rollout_ref|algorithm|data|trainer)'", re.M)
_STRING = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")
# A config dump is a few hundred lines; a log that never closes it is not one.
_MAX_LINES = 5000
_HEAD_CHARS = 2_000_000


def _dump(text: str) -> dict[str, Any] | None:
    """The first printed config dict in ``text``, parsed; None when there is none or it does not parse."""
    m = _START.search(text, 0, _HEAD_CHARS)
    if m is None:
        return None
    prefix = m.group("prefix") or ""
    lines: list[str] = []
    depth = 0
    for n, line in enumerate(text[m.start():].splitlines()):
        if n >= _MAX_LINES:
            return None
        if prefix:
            if not line.startswith(prefix.rstrip()):
                continue  # another process's line interleaved with the dump
            line = line[len(prefix.rstrip()):]
        lines.append(line)
        bare = _STRING.sub("", line)
        depth += sum(bare.count(c) for c in "{[(") - sum(bare.count(c) for c in "}])")
        if depth <= 0:
            break
    try:
        obj = ast.literal_eval("\n".join(lines).strip())
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


_OVERRIDE = re.compile(r"(?<![\w.])((?:actor_rollout_ref|algorithm|data|trainer)(?:\.\w+)+)=([\w.+-]+)(?=[\s'\"\\]|$)", re.M)


def _scalar(text: str) -> Any:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _overrides(text: str) -> dict[str, Any] | None:
    """The ``key.path=value`` overrides a launch command passes, as the nested dict they set (the last wins)."""
    tree: dict[str, Any] = {}
    for m in _OVERRIDE.finditer(text, 0, _HEAD_CHARS):
        *parents, leaf = m.group(1).split(".")
        node = tree
        for part in parents:
            child = node.get(part)
            if not isinstance(child, dict):
                child = node[part] = {}
            node = child
        node[leaf] = _scalar(m.group(2))
    return tree or None


def _at(tree: Mapping[str, Any], path: str) -> Any:
    node: Any = tree
    for part in path.split("."):
        if not isinstance(node, Mapping):
            return None
        node = node.get(part)
    return node


def _number(v: Any) -> int | float | None:
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


# verl's setting -> the GRPOConfig name the detectors and the recommendations read.
_NAMES = {
    "actor_rollout_ref.actor.optim.lr": "learning_rate",
    "actor_rollout_ref.actor.grad_clip": "max_grad_norm",
    "actor_rollout_ref.actor.entropy_coeff": "entropy_coef",
    "actor_rollout_ref.rollout.n": "num_generations",
    "actor_rollout_ref.rollout.temperature": "temperature",
    "data.max_prompt_length": "max_prompt_length",
    "data.max_response_length": "max_completion_length",
}


def verl_config(text: str) -> tuple[dict[str, Any], str | None, str | None]:
    """The config a verl log prints, in ``GRPOConfig`` names, the model path it trains and its advantage
    estimator (``algorithm.adv_estimator``: ``grpo``, ``gae``, ``rloo``, ...); ``({}, None, None)`` when the
    log prints none."""
    tree = _dump(text) or _overrides(text)
    if tree is None:
        return {}, None, None
    config: dict[str, Any] = {}
    for path, name in _NAMES.items():
        v = _number(_at(tree, path))
        if v is not None:
            config[name] = v
    if _at(tree, "actor_rollout_ref.actor.use_kl_loss") is False:
        config["beta"] = 0.0  # verl's KL term is off unless asked for; TRL names its coefficient beta
    elif (coef := _number(_at(tree, "actor_rollout_ref.actor.kl_loss_coef"))) is not None:
        config["beta"] = coef
    if _at(tree, "actor_rollout_ref.actor.policy_loss.loss_mode") == "gspo":
        config["importance_sampling_level"] = "sequence"  # GSPO's sequence-level ratio, in TRL's words
    # Every step generates n completions for each of train_batch_size prompts.
    prompts, n = _number(_at(tree, "data.train_batch_size")), config.get("num_generations")
    if isinstance(prompts, int) and isinstance(n, int) and prompts > 0 and n > 0:
        config["generation_batch_size"] = prompts * n
    model = _at(tree, "actor_rollout_ref.model.path")
    estimator = _at(tree, "algorithm.adv_estimator")
    return (config, model if isinstance(model, str) and model.strip() else None,
            estimator if isinstance(estimator, str) and estimator else None)


def group_of_one_note(config: Mapping[str, Any], estimator: str | None) -> str | None:
    """What to tell of a GRPO run that samples one completion per prompt, else None. verl's GRPO advantage
    normalises each score within its prompt's group and takes a group of one as mean 0, std 1: the advantage
    is then the raw score, REINFORCE without a baseline, and every detector that reads the group's spread
    reads nothing."""
    if config.get("num_generations") != 1 or (estimator or "grpo") != "grpo":
        return None
    return ("rollout.n = 1 with the GRPO advantage: each prompt has one completion, so there is no group to "
            "compare it with and the advantage is the raw score (REINFORCE without a baseline), not GRPO's "
            "group-relative one; sample several completions per prompt (the recipe: rollout.n >= 8)")
