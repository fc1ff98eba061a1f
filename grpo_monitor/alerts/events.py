"""From findings to alert messages: one message per detector episode and severity, then one when
the episode resolves; and the run's verdict.

A detector raises at most one warning and one critical per episode, and its state returns to
``ok`` when the episode ends; ``Episodes`` turns that into ``finding`` and ``resolved`` events.
A message is a plain JSON-safe dict (the generic webhook payload is exactly this dict).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

RANK = {"info": 0, "warning": 1, "critical": 2}
QUIET_STATES = ("ok", "warming_up")
# The recommendation fields a message carries: the variant (or remedy), whether it is a switch or advice
# (``status``), its diff against the run's config and the advice no flag carries (``extra``).
REC_FIELDS = ("variant", "config_overrides", "cli_flags", "python")
REC_OPTIONAL = ("status", "extra")
FINDING_FIELDS = ("detector", "severity", "step", "onset_step", "variant", "config_overrides", "evidence", "message")


def as_dict(finding: Any) -> dict[str, Any]:
    return dict(finding.to_dict() if hasattr(finding, "to_dict") else finding)


def recommendation_for(finding: Mapping[str, Any], recs: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    for r in recs:
        if r.get("detector") == finding.get("detector") and r.get("step") == finding.get("step"):
            return rec_fields(r)
    return None


def rec_fields(rec: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: rec.get(k) for k in REC_FIELDS}
    out.update({k: rec[k] for k in REC_OPTIONAL if rec.get(k)})
    return out


def verdict_of(findings: Iterable[Mapping[str, Any]]) -> str:
    worst = max((RANK.get(f.get("severity"), 0) for f in findings), default=0)
    return {0: "healthy", 1: "warning", 2: "critical"}[worst]


def evidence_line(evidence: Mapping[str, Any], limit: int = 6) -> str:
    items = []
    for k, v in list(evidence.items())[:limit]:
        if isinstance(v, float):
            v = f"{v:.4g}"
        elif isinstance(v, (list, dict)):
            continue
        items.append(f"{k}={v}")
    return ", ".join(items)


def finding_message(f: Mapping[str, Any], rec: Mapping[str, Any] | None, run_id: str | None, run_dir: str | None) -> dict[str, Any]:
    onset = f" (onset ~step {f['onset_step']})" if f.get("onset_step") is not None else ""
    text = f"{f.get('message', '')}{onset}"
    ev = evidence_line(f.get("evidence") or {})
    if ev:
        text += f"\nEvidence: {ev}"
    return {
        "event": "finding",
        "level": f["severity"],
        "title": f"grpo-monitor: {f['severity']} {f['detector']} at step {f['step']}",
        "text": text,
        "run_id": run_id,
        "run_dir": run_dir,
        "finding": {k: f.get(k) for k in FINDING_FIELDS},
        "recommendation": dict(rec) if rec else None,
    }


def resolved_message(opened: Mapping[str, Any], step: int, run_id: str | None, run_dir: str | None) -> dict[str, Any]:
    return {
        "event": "resolved",
        "level": "resolved",
        "title": f"grpo-monitor: resolved {opened['detector']} at step {step}",
        "text": (f"{opened['detector']} is healthy again at step {step}; the episode began ~step "
                 f"{opened.get('onset_step') if opened.get('onset_step') is not None else opened.get('step')} "
                 f"and reached {opened['severity']}."),
        "run_id": run_id,
        "run_dir": run_dir,
        "finding": {k: opened.get(k) for k in FINDING_FIELDS},
        "recommendation": None,
        "resolved_step": step,
    }


def verdict_message(verdict: str, findings: Sequence[Mapping[str, Any]], recs: Sequence[Mapping[str, Any]], *,
                    run_id: str | None, run_dir: str | None, source: str | None = None,
                    steps: int | None = None) -> dict[str, Any]:
    where = source or run_dir or "the run"
    flagged = [f for f in findings if RANK.get(f.get("severity"), 0) >= 1]
    lines = [f"- [{f['severity']}] {f['detector']} at step {f['step']}: {f.get('message', '')}" for f in flagged[:10]]
    if len(flagged) > 10:
        lines.append(f"- … and {len(flagged) - 10} more")
    for r in recs[:3]:
        lines.append(f"Recommended {r.get('variant')}: {r.get('python')}")
    head = f"{len(flagged)} warning/critical finding{'s' if len(flagged) != 1 else ''}" + (f" over {steps} steps" if steps is not None else "")
    return {
        "event": "verdict",
        "level": verdict,
        "title": f"grpo-monitor: {verdict} — {where}",
        "text": head + (":\n" + "\n".join(lines) if lines else "."),
        "run_id": run_id,
        "run_dir": run_dir,
        "source": source,
        "steps": steps,
        "verdict": verdict,
        "findings": [{k: f.get(k) for k in FINDING_FIELDS} for f in flagged],
        "recommendations": [rec_fields(r) for r in recs],
        "finding": None,
        "recommendation": None,
    }


class Episodes:
    """Which detectors are in an open episode, and the events each step brings."""

    def __init__(self) -> None:
        self.open: dict[str, dict[str, Any]] = {}
        self._seen: set[tuple[Any, ...]] = set()

    def step(self, step: int, states: Mapping[str, str], findings: Sequence[Mapping[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
        """``("finding", finding)`` for each warning/critical new to its episode, and
        ``("resolved", opening finding)`` for each open episode whose detector is quiet again."""
        out: list[tuple[str, dict[str, Any]]] = []
        raised = set()
        for f in findings:
            if RANK.get(f.get("severity"), 0) < 1:
                continue
            det = f["detector"]
            raised.add(det)
            key = (det, f.get("onset_step"), f["severity"])
            opened = self.open.get(det)
            if key in self._seen or (opened is not None and RANK[f["severity"]] <= RANK[opened["severity"]]):
                continue  # the same episode said again (a replayed step, a restarted segment)
            self._seen.add(key)
            self.open[det] = dict(f)
            out.append(("finding", dict(f)))
        if self.open:
            # Over the detectors' states, not the open episodes: the cost per step stays that of
            # one look per detector, however many episodes a run opens.
            for det, state in states.items():
                if det in raised or det not in self.open:
                    continue
                if state == "disabled":
                    del self.open[det]
                elif state in QUIET_STATES:
                    out.append(("resolved", self.open.pop(det)))
        return out
