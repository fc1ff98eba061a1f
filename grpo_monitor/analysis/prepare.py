"""A read log made ready for the detectors: a user's ``--map``, the names the log's own words resolve to
(``core.names``) and the metrics a log reports in parts, derived; then the names that hold a value.

The same preparation serves ``analyze``, the dashboard and ``grpo_monitor.load_run``: one guess at what a
log's columns mean, used everywhere a log is read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from grpo_monitor.detectors.numbers import finite

# ``--map`` targets a user may write short.
MAP_TARGETS = {
    "length": "completions/mean_length",
    "mean_length": "completions/mean_length",
    "completion_length": "completions/mean_length",
    "max_length": "completions/max_length",
    "clipped_ratio": "completions/clipped_ratio",
    "clipped": "completions/clipped_ratio",
    "truncated": "completions/clipped_ratio",
    "correctness": "rewards/correctness/mean",
    "correct": "rewards/correct/mean",
    "accuracy": "rewards/accuracy/mean",
    "format": "rewards/format/mean",
    "zero_std": "frac_reward_zero_std",
}


def parse_mapping(items: Sequence[str] | Mapping[str, str] | None) -> dict[str, str]:
    """``["score_mean=reward", ...]`` (or a dict) as ``{column: metric}``; raises ValueError on a bad item.

    The metric may be a TRL name (``reward``, ``entropy``, ``completions/mean_length``,
    ``rewards/<name>/mean``), a short form (``length``, ``clipped_ratio``, ``correctness``) or any
    spelling the normaliser knows.

    >>> parse_mapping(["score_mean=reward", "acc = correctness", "len=length"])
    {'score_mean': 'reward', 'acc': 'rewards/correctness/mean', 'len': 'completions/mean_length'}
    """
    from grpo_monitor.core.metrics import normalize

    if items is None:
        return {}
    pairs: list[tuple[str, str]] = []
    if isinstance(items, Mapping):
        pairs = [(str(k), str(v)) for k, v in items.items()]
    else:
        for item in items:
            column, sep, metric = str(item).partition("=")
            if not sep or not column.strip() or not metric.strip():
                raise ValueError(f"--map {item!r}: expected COLUMN=METRIC, e.g. --map score_mean=reward")
            pairs.append((column, metric))
    out: dict[str, str] = {}
    for column, metric in pairs:
        column, metric = column.strip(), metric.strip()
        out[column] = normalize(MAP_TARGETS.get(metric, metric))
    return out


def prepare(src: Any, mapping: Mapping[str, str] | None = None) -> Any:
    return prepare_names(src, mapping)[0]


def prepare_names(src: Any, mapping: Mapping[str, str] | None = None) -> tuple[Any, list[str]]:
    """Apply a user's column mapping, then the names the log's own words resolve to (``core.names``), and
    derive the metrics a log reports in parts, in place; the source and its metric names afterwards. What the
    words mapped (and what they could not tell apart) is kept in ``src.meta["names"]``.

    A mapped column is found under its name as logged or as normalised; the mapped metric wins
    over one of the same name the log already had.
    """
    from grpo_monitor.core.metrics import derive_metrics, normalize
    from grpo_monitor.core.names import resolve
    from grpo_monitor.detectors.signals import reward_names_in, reward_roles

    names = src.metric_names()
    renames: dict[str, str] = {}
    for column, metric in (mapping or {}).items():
        for key in (column, normalize(column)):
            if key in names and key != metric:
                renames[key] = metric
                break
        else:
            if metric not in names:
                src.warnings.append(f"--map {column}={metric}: the run logs no column {column!r}")
    if src.format != "run_dir":  # our own run log holds TRL's names already
        mapped = set(renames)
        left = [n for n in names if n not in mapped]
        values: dict[str, list[Any]] = {n: [] for n in left}
        for _, metrics in src.steps[:64]:
            for n in left:
                v = metrics.get(n)
                if v is not None:
                    values[n].append(v)
        words = resolve(left, values, known=[n for n in names if n not in mapped] + list(renames.values()))
        renames.update(words.mapping)
        spelled = {n: {"to": t, "by": "a known spelling"} for n, t in (src.meta.get("spellings") or {}).items()}
        if words.mapping or words.ambiguous or spelled:
            src.meta["names"] = {"mapped": {**spelled, **{n: {"to": t, "by": words.how[n]}
                                                         for n, t in words.mapping.items()}},
                                 "ambiguous": words.ambiguous}
    probe = dict.fromkeys(names, 0.0)
    derives = derive_metrics(probe) is not None
    if renames or derives:
        steps = []
        for step, metrics in src.steps:
            m = dict(metrics)
            for key, metric in renames.items():
                if key in m:
                    v = m.pop(key)
                    if v is not None or metric not in m:
                        m[metric] = v
            if derives:
                extra = derive_metrics(m)
                if extra:
                    m.update(extra)
            steps.append((step, m))
        src.steps = steps
    if renames:
        known = list(src.context.reward_names or [])
        for name in reward_names_in(renames.values()):
            if name not in known:
                known.append(name)
        src.context.reward_names = known
        correct, fmt = reward_roles(known)  # the one guess, live and offline
        src.context.correctness_reward = src.context.correctness_reward or correct
        src.context.format_reward = src.context.format_reward or fmt
    if renames or derives:
        names = list(dict.fromkeys([renames.get(n, n) for n in names] + (["frac_reward_zero_std"] if derives else [])))
    return src, names


def names_with_values(steps: Sequence[tuple[int, Mapping[str, Any]]], names: Sequence[str] | None = None) -> list[str]:
    """The metric names (all of ``names``, by default every name logged) holding a finite value at
    some step, in their order. Steps are walked only until every name has shown one."""
    if names is None:
        names = list(dict.fromkeys(k for _, m in steps for k in m))
    pending = dict.fromkeys(names)
    found: set[str] = set()
    for _, metrics in steps:
        if not pending:
            break
        done = [k for k in pending if finite(metrics.get(k)) is not None]
        for k in done:
            del pending[k]
            found.add(k)
    return [n for n in names if n in found]
