"""Team rules: a small declarative file of checks beyond the built-in detectors, each becoming a detector.

A rule file is JSON, YAML (PyYAML: the ``train`` or ``preflight`` extra) or TOML (Python 3.11's ``tomllib``),
told by its suffix (``.json``, ``.yaml``/``.yml``, ``.toml``), holding a list of rules under ``rules``
(TOML: ``[[rules]]`` tables)::

    rules:
      - id: eval_accuracy_floor        # the finding's detector id: new, lowercase, unique
        metric: eval_accuracy          # any logged metric; names are normalised as every reader's are
        below: 0.55                    # or: above: LINE, drop: SHARE, rise: SHARE (of the baseline)
        for_steps: 40                  # the breach must hold this many training steps (default 1)
        severity: critical             # warning (default) or critical
        message: Held-out accuracy is under the release bar.
      - id: reward_slump
        metric: reward
        drop: 0.3                      # 30 % under its baseline: the median of the first baseline_steps
        baseline_steps: 20
        advice: resume from the last checkpoint before the slump

Each rule becomes a ``detectors.rule.RuleDetector``, so the engine, the run log, alerts, the dashboard's
states and the reports treat it like any built-in detector. A rule that cannot be used is refused with
one line naming the file, the rule and what is wrong.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from grpo_monitor.core.metrics import normalize
from grpo_monitor.detectors.rule import KINDS, RuleDetector

KEYS = frozenset({"id", "metric", *KINDS, "for_steps", "baseline_steps", "severity", "message", "advice"})


def parse_rule_file(path: str | os.PathLike[str]) -> Any:
    """The parsed document of a rule file; ValueError (one line, naming the file) when it cannot be read."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{p}: cannot read the rule file ({getattr(exc, 'strerror', None) or exc})") from None
    suffix = p.suffix.lower()
    try:
        if suffix == ".toml":
            try:
                import tomllib
            except ImportError:  # Python 3.10
                try:
                    import tomli as tomllib  # type: ignore[no-redef]
                except ImportError:
                    raise ValueError(f"{p}: TOML rule files need Python 3.11 or the tomli package; "
                                     "or write the rules as JSON or YAML") from None
            return tomllib.loads(text)
        if suffix in (".yaml", ".yml"):
            try:
                import yaml
            except ImportError:
                raise ValueError(f"{p}: YAML rule files need PyYAML: pip install 'grpo-monitor[preflight]'; "
                                 "or write the rules as JSON") from None
            return yaml.safe_load(text)
        return json.loads(text)
    except ValueError as exc:
        if str(exc).startswith(str(p)):
            raise
        raise ValueError(f"{p}: not valid {suffix.lstrip('.').upper() or 'JSON'}: {str(exc).splitlines()[0]}") from None
    except Exception as exc:  # yaml's own errors
        raise ValueError(f"{p}: not valid {suffix.lstrip('.').upper()}: {str(exc).splitlines()[0]}") from None


def rules_from_data(data: Any, where: str = "rules") -> list[RuleDetector]:
    """Rule detectors from a parsed document (``{"rules": [...]}`` or the list itself)."""
    from grpo_monitor.detectors import DETECTOR_IDS

    if isinstance(data, Mapping):
        unknown = sorted(set(data) - {"rules"})
        if unknown:
            raise ValueError(f"{where}: unknown top-level key {unknown[0]!r}; the rules go in a list under 'rules'")
        data = data.get("rules")
    if not isinstance(data, list) or not data:
        raise ValueError(f"{where}: expected a list of rules under 'rules'")
    out: list[RuleDetector] = []
    seen: set[str] = set()
    for i, item in enumerate(data, 1):
        label = f"{where}: rule {i}"
        if not isinstance(item, Mapping):
            raise ValueError(f"{label}: expected a table of keys (id, metric, below/above/drop/rise, ...)")
        rid = item.get("id")
        if rid is not None:
            label = f"{where}: rule {rid!r}"
        unknown = sorted(set(item) - KEYS)
        if unknown:
            raise ValueError(f"{label}: unknown key {unknown[0]!r} (known: {', '.join(sorted(KEYS))})")
        for key in ("id", "metric"):
            if key not in item:
                raise ValueError(f"{label}: '{key}' is missing")
        if rid in DETECTOR_IDS:
            raise ValueError(f"{label}: the id is a built-in detector's; give the rule an id of its own")
        if rid in seen:
            raise ValueError(f"{label}: the id is used twice")
        seen.add(rid)
        kwargs = {k: v for k, v in item.items() if k not in ("id", "metric")}
        metric = item["metric"]
        try:
            out.append(RuleDetector(rid, normalize(metric) if isinstance(metric, str) else metric, **kwargs))
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
    return out


def load_rules(rules: str | os.PathLike[str] | Sequence[Any] | Mapping[str, Any]) -> list[RuleDetector]:
    """The rule detectors a rule file's path, its parsed document, or a list of rules (dicts or
    ``RuleDetector``) gives; raises ValueError with one line saying what is wrong.

    >>> [r.id for r in load_rules([{"id": "kl_ceiling", "metric": "actor/kl_loss", "above": 0.5}])]
    ['kl_ceiling']
    >>> load_rules([{"id": "entropy_collapse", "metric": "entropy", "below": 0.1}])
    Traceback (most recent call last):
    ...
    ValueError: rules: rule 'entropy_collapse': the id is a built-in detector's; give the rule an id of its own
    """
    if isinstance(rules, (str, os.PathLike)):
        return rules_from_data(parse_rule_file(rules), str(rules))
    if isinstance(rules, Sequence) and rules and all(isinstance(r, RuleDetector) for r in rules):
        return list(rules)
    return rules_from_data(rules)
