"""From findings to alert messages: one message per detector episode and severity, one when the
episode resolves, the run's life (a restart, a crash, its end) and, offline, a run's verdict.

A detector raises at most one warning and one critical per episode, and its state returns to
``ok`` when the episode ends; ``Episodes`` turns that into ``finding`` and ``resolved`` events. A
message is a plain JSON-safe dict (the generic webhook payload is exactly this dict). Every message
carries an ``idempotency_key``, derived from what it says (the run, the event, the episode), so the
same message sent twice, or said again by a restarted segment replaying the same steps, has the
same key and a receiver can drop the copy.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

RANK = {"info": 0, "warning": 1, "critical": 2}
QUIET_STATES = ("ok", "warming_up")
# The recommendation fields a message carries: the variant (or remedy), whether it is a switch or advice
# (``status``), its diff against the run's config and the advice no flag carries (``extra``).
REC_FIELDS = ("variant", "config_overrides", "cli_flags", "python")
REC_OPTIONAL = ("status", "extra")
FINDING_FIELDS = ("detector", "severity", "step", "onset_step", "variant", "config_overrides", "evidence", "message")
# The run's life: sent whatever the minimum severity, rate limit, cap or cooldown (a run has a handful).
LIFE_EVENTS = ("restart", "crash", "end")
_KEYS = uuid.UUID("6f1e3a52-8c1d-4f0b-9a57-3d2f6c0e9b14")


def message_key(*parts: Any) -> str:
    """A UUID named by ``parts``: the same message always gets the same key."""
    return str(uuid.uuid5(_KEYS, "/".join("" if p is None else str(p) for p in parts)))


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


class RunInfo:
    """Who is speaking: the run, its directory, its segment in a restarted lineage and the
    lineage's id (the first segment's run id), which names the episodes across segments."""

    def __init__(self, run_id: str | None = None, run_dir: str | None = None, segment: int = 0,
                 lineage: str | None = None) -> None:
        self.run_id, self.run_dir, self.segment = run_id, run_dir, int(segment)
        self.lineage = lineage or run_id

    def base(self, event: str, level: str, title: str, text: str, key: str) -> dict[str, Any]:
        return {"event": event, "level": level, "title": title, "text": text, "run_id": self.run_id,
                "run_dir": self.run_dir, "segment": self.segment + 1, "idempotency_key": key,
                "episode": None, "finding": None, "recommendation": None}


def episode_of(run: RunInfo, f: Mapping[str, Any], opened_at: int) -> dict[str, Any]:
    """An episode's identity: one id for its warning, its critical and its resolution (PagerDuty's
    ``dedup_key``), whichever segment of the lineage says them."""
    return {"id": message_key(run.lineage, "episode", f["detector"], opened_at), "detector": f["detector"],
            "opened_at": opened_at}


def finding_message(f: Mapping[str, Any], rec: Mapping[str, Any] | None, run: RunInfo, opened_at: int) -> dict[str, Any]:
    onset = f" (onset ~step {f['onset_step']})" if f.get("onset_step") is not None else ""
    text = f"{f.get('message', '')}{onset}"
    ev = evidence_line(f.get("evidence") or {})
    if ev:
        text += f"\nEvidence: {ev}"
    episode = episode_of(run, f, opened_at)
    m = run.base("finding", f["severity"], f"grpo-monitor: {f['severity']} {f['detector']} at step {f['step']}", text,
                 message_key(episode["id"], f["severity"]))
    m.update(step=f["step"], episode=episode, finding={k: f.get(k) for k in FINDING_FIELDS},
             recommendation=dict(rec) if rec else None)
    return m


def resolved_message(opened: Mapping[str, Any], step: int, run: RunInfo, opened_at: int,
                     inherited: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``inherited``: the episode opened in an earlier segment of the lineage (its ``segment``, 1-based,
    how this segment came to be, and ``end`` when this segment ran to its end without raising it again)."""
    began = opened.get("onset_step") if opened.get("onset_step") is not None else opened.get("step")
    where = f" in segment {inherited['segment']}" if inherited else ""
    after = f" after the restart ({inherited['how']})" if inherited and inherited.get("how") else ""
    if inherited and inherited.get("end"):
        now = (f"{opened['detector']} was not raised again in segment {run.segment + 1}{after}, which ran to its end "
               f"at step {step}")
    else:
        now = f"{opened['detector']} is healthy again at step {step}{after}"
    text = f"{now}; the episode began ~step {began}{where} and reached {opened['severity']}."
    episode = episode_of(RunInfo(lineage=inherited["lineage"]) if inherited else run, opened, opened_at)
    m = run.base("resolved", "resolved", f"grpo-monitor: resolved {opened['detector']} at step {step}", text,
                 message_key(episode["id"], "resolved"))
    m.update(step=step, episode=episode, finding={k: opened.get(k) for k in FINDING_FIELDS}, resolved_step=step)
    return m


def restart_message(plan: Mapping[str, Any], run: RunInfo) -> dict[str, Any]:
    """The monitor stopped the run to restart it: with which change, from which checkpoint, why."""
    change = ", ".join(f"{k}={v!r}" for k, v in (plan.get("config_overrides") or {}).items()) or "no setting"
    resume = plan.get("resume_from") or "the initial model"
    reasons = [f"{f.get('severity')} {f.get('detector')} at step {f.get('step')}" for f in plan.get("findings") or []]
    step = plan.get("step")
    text = (f"Stopped at step {step} ({'; '.join(reasons) or 'a confirmed finding'}). Restarting as segment "
            f"{int(plan.get('segment', run.segment)) + 2} with {plan.get('variant')} ({change}), resumed from {resume}.")
    if plan.get("reasons"):
        text += "\nWhy: " + " ".join(str(r) for r in plan["reasons"][:3])
    m = run.base("restart", "info", f"grpo-monitor: restarting with {plan.get('variant')} (stopped at step {step})", text,
                 message_key(run.run_id, "restart", step))
    m.update(step=step, restart={"variant": plan.get("variant"), "config_overrides": plan.get("config_overrides") or {},
                                 "resume_from": plan.get("resume_from"), "next_run_dir": plan.get("next_run_dir"),
                                 "next_segment": int(plan.get("segment", run.segment)) + 2})
    return m


def crash_message(error: str, step: int | None, run: RunInfo, open_episodes: Sequence[Mapping[str, Any]],
                  interrupted: bool = False) -> dict[str, Any]:
    what = "was interrupted" if interrupted else "crashed"
    text = f"The training {what} at step {step}: {error}"
    if open_episodes:
        text += "\nOpen episodes: " + ", ".join(f"{f['detector']} ({f['severity']})" for f in open_episodes)
    text += f"\nEverything recorded so far is in {run.run_dir or 'the run log'}."
    m = run.base("crash", "warning" if interrupted else "critical", f"grpo-monitor: run {what} at step {step}", text,
                 message_key(run.run_id, "crash"))
    m.update(step=step, error=error)
    return m


def end_message(step: int, run: RunInfo, verdict: str, findings: Sequence[Mapping[str, Any]],
                open_episodes: Sequence[Mapping[str, Any]], max_steps: int | None = None) -> dict[str, Any]:
    of = f" of {max_steps}" if max_steps else ""
    flagged = [f for f in findings if RANK.get(f.get("severity"), 0) >= 1]
    text = f"The training ended at step {step}{of}: {verdict}, {len(flagged)} warning/critical finding{'s' if len(flagged) != 1 else ''}."
    if open_episodes:
        text += "\nStill open: " + ", ".join(f"{f['detector']} ({f['severity']}, step {f['step']})" for f in open_episodes)
    m = run.base("end", verdict, f"grpo-monitor: run ended at step {step} — {verdict}", text, message_key(run.run_id, "end"))
    m.update(step=step, verdict=verdict, findings_count=len(flagged))
    return m


def notice_message(run: RunInfo, count: int, why: str, seq: int) -> dict[str, Any]:
    """What a destination missed: ``count`` messages held back (``why``: the rate limit, say)."""
    m = run.base("held_back", "info", f"grpo-monitor: {count} more alert{'s' if count != 1 else ''} held back by {why}",
                 f"Every finding is in the run log: {run.run_dir or 'run.jsonl'}", message_key(run.run_id, "held_back", seq))
    m["held_back"] = count
    return m


def verdict_message(verdict: str, findings: Sequence[Mapping[str, Any]], recs: Sequence[Mapping[str, Any]], *,
                    run_id: str | None, run_dir: str | None, source: str | None = None,
                    steps: int | None = None, reason: str | None = None) -> dict[str, Any]:
    """A run's verdict (``analyze --alerts``); ``reason`` says why a run could not be judged."""
    where = source or run_dir or "the run"
    flagged = [f for f in findings if RANK.get(f.get("severity"), 0) >= 1]
    lines = [f"- [{f['severity']}] {f['detector']} at step {f['step']}: {f.get('message', '')}" for f in flagged[:10]]
    if len(flagged) > 10:
        lines.append(f"- … and {len(flagged) - 10} more")
    for r in recs[:3]:
        lines.append(f"Recommended {r.get('variant')}: {r.get('python')}")
    head = f"{len(flagged)} warning/critical finding{'s' if len(flagged) != 1 else ''}" + (f" over {steps} steps" if steps is not None else "")
    text = head + (":\n" + "\n".join(lines) if lines else ".")
    if reason:
        text += f"\nNot judged: {reason}"
    key = message_key("verdict", source or run_dir, steps, verdict, *sorted((f["detector"], f["severity"], f["step"]) for f in flagged))
    m = RunInfo(run_id, run_dir).base("verdict", verdict, f"grpo-monitor: {verdict} — {where}", text, key)
    del m["segment"]
    m.update(source=source, steps=steps, verdict=verdict, findings=[{k: f.get(k) for k in FINDING_FIELDS} for f in flagged],
             recommendations=[rec_fields(r) for r in recs])
    if reason:
        m["reason"] = reason
    return m


class Event(NamedTuple):
    kind: str  # "finding" or "resolved"
    finding: dict[str, Any]  # the finding; for a resolution, the episode's last one
    opened_at: int  # the step the episode opened
    inherited: dict[str, Any] | None  # for an episode an earlier segment opened: where it came from


class Episodes:
    """Which detectors are in an open episode, and the events each step brings.

    ``inherit`` takes the episodes an earlier segment of the lineage left open: the same episode
    said again by this segment (it resumed before the onset and replays it) is not said twice, and
    it resolves once this segment's detector has judged a step healthy (``ok``, past its warm-up)."""

    def __init__(self) -> None:
        self.open: dict[str, dict[str, Any]] = {}
        self.opened_at: dict[str, int] = {}
        self.inherited: dict[str, dict[str, Any]] = {}
        self._seen: set[tuple[Any, ...]] = set()

    def inherit(self, finding: Mapping[str, Any], opened_at: int, origin: Mapping[str, Any]) -> None:
        det = finding["detector"]
        self.open[det] = dict(finding)
        self.opened_at[det] = int(opened_at)
        self.inherited[det] = dict(origin)
        for sev in ("warning", "critical"):
            if RANK[sev] <= RANK[finding["severity"]]:
                self._seen.add((det, finding.get("onset_step"), sev))

    def step(self, step: int, states: Mapping[str, str], findings: Sequence[Mapping[str, Any]]) -> list[Event]:
        """A ``finding`` event for each warning/critical new to its episode, and a ``resolved``
        event for each open episode whose detector is quiet again."""
        out: list[Event] = []
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
            if opened is None:
                self.opened_at[det] = int(f["step"])
            self.open[det] = dict(f)
            out.append(Event("finding", dict(f), self.opened_at[det], self.inherited.get(det)))
        if self.open:
            # Over the detectors' states, not the open episodes: the cost per step stays that of
            # one look per detector, however many episodes a run opens.
            for det, state in states.items():
                if det in raised or det not in self.open:
                    continue
                if state == "disabled":
                    self._close(det)
                elif state == "ok" or (state in QUIET_STATES and det not in self.inherited):
                    out.append(Event("resolved", self.open[det], self.opened_at[det], self.inherited.get(det)))
                    self._close(det)
        return out

    def resolve_inherited(self) -> list[Event]:
        """At the end of a segment, the inherited episodes its detectors never raised again."""
        out = [Event("resolved", self.open[d], self.opened_at[d], self.inherited[d]) for d in list(self.inherited)]
        for e in out:
            self._close(e.finding["detector"])
        return out

    def _close(self, det: str) -> None:
        self.open.pop(det, None)
        self.opened_at.pop(det, None)
        self.inherited.pop(det, None)

    def open_list(self) -> list[dict[str, Any]]:
        return [dict(f) for f in self.open.values()]

    def state(self) -> list[dict[str, Any]]:
        """The open episodes as a later segment takes them over (``inherit``)."""
        return [{"finding": dict(f), "opened_at": self.opened_at[d], "origin": self.inherited.get(d)}
                for d, f in self.open.items()]
