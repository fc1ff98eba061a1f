"""``AlertDispatcher``: the live callback hands it each step's findings and the run's life (a
restart, the end, a crash); it fans them out to the trackers and to each destination (webhooks,
email), each isolated from the others and from the run, and accounts for every message.

The options it is built from are ``alerts.options.AlertOptions``, checked when ``attach`` is called.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from grpo_monitor.alerts.delivery import FAILED, LOST, QUEUE_FULL, RATE_LIMITED, UNSENT, Sender
from grpo_monitor.alerts.events import (
    RANK,
    Episodes,
    RunInfo,
    as_dict,
    crash_message,
    end_message,
    finding_message,
    notice_message,
    recommendation_for,
    resolved_message,
    restart_message,
    verdict_of,
)
from grpo_monitor.alerts.options import AlertOptions
from grpo_monitor.alerts.trackers import SummaryState, TrackerWorker, build_sinks, reported_trackers
from grpo_monitor.alerts.webhook import mask_url

logger = logging.getLogger("grpo_monitor")

# The open episodes a segment stopped for a restart hands to the next one (in its run directory).
STATE_FILE = "alerts_state.json"


class AlertDispatcher:
    """Rank 0's alert fan-out. ``on_step`` per logged step, ``restart`` when the monitor stops the run
    to restart it, ``finish`` at the trainer's final log (the run's end message, the flush, the
    counts), ``crash`` when the training raised, ``close`` at train end.

    ``senders``: a ``Sender`` or a list of them, or ``(Sender, min_severity)`` pairs. A tracker sink
    that raises is reported once through ``on_error`` and dropped; trouble delivering a message is
    counted, noted in the run log (``note``) and said in one warning line at the end."""

    def __init__(self, sinks: Sequence[Any], senders: Any = None, *, min_severity: str = "warning",
                 run_id: str | None = None, run_dir: str | None = None, flush_timeout: float = 5.0,
                 on_error: Callable[[str, BaseException], None] | None = None,
                 note: Callable[[dict[str, Any]], None] | None = None, max_per_run: int | None = None,
                 cooldown_steps: int = 0, segment: int = 0, inherited: Mapping[str, Any] | None = None,
                 max_steps: int | None = None) -> None:
        self.run = RunInfo(run_id, run_dir, segment, (inherited or {}).get("lineage"))
        self.trackers = TrackerWorker(sinks) if sinks else None
        if senders is None:
            senders = []
        elif isinstance(senders, Sender):
            senders = [senders]
        self.routes: list[tuple[Sender, int]] = []
        for s in senders:
            sender, sev = s if isinstance(s, tuple) else (s, min_severity)
            if sender.notice is None:
                sender.notice = lambda count, seq: notice_message(self.run, count, "the rate limit", seq)
            self.routes.append((sender, RANK[sev]))
        self.flush_timeout = float(flush_timeout)
        self.on_error = on_error or _log_error
        self.note = note
        self.max_per_run, self.cooldown_steps, self.max_steps = max_per_run, int(cooldown_steps), max_steps
        self.episodes = Episodes()
        self.findings: list[dict[str, Any]] = []
        self.recs: list[dict[str, Any]] = []
        self.status: dict[tuple[str, Any], str] = {}
        # Per destination: the keys of the messages each open episode put on its queue, for the resolution.
        self._episode_keys: list[dict[str, list[str]]] = [{} for _ in self.routes]
        self._last_said: dict[str, int] = {}  # detector -> step of its last message (the cooldown)
        self._announced = 0  # finding messages handed to a destination (the per-run cap)
        self.not_sent = {"over_the_cap": 0, "in_the_cooldown": 0, "resolution_of_an_unsent_opening": 0}
        self._troubled: set[str] = set()
        self.restarted: Mapping[str, Any] | None = None
        self.delivery_report: dict[str, Any] | None = None
        self.last_step = 0
        self.closed = False
        if inherited:
            self._inherit(inherited)

    @property
    def webhook(self) -> Sender | None:
        """The first destination's sender (kept for callers that had one)."""
        return self.routes[0][0] if self.routes else None

    @property
    def sinks(self) -> list[Any]:
        return self.trackers.sinks if self.trackers is not None else []

    # -- per step -------------------------------------------------------------------------

    def on_step(self, step: int, states: Mapping[str, str], findings: Sequence[Any], recs: Sequence[Mapping[str, Any]] = ()) -> None:
        self.last_step = int(step)
        self._report_trouble()
        fds = [as_dict(f) for f in findings]
        self.recs.extend(dict(r) for r in recs)
        events = self.episodes.step(step, states, fds)
        if not events:
            return
        for e in events:
            f = e.finding
            key = (f["detector"], f.get("onset_step"))
            if e.kind == "finding":
                self.findings.append(f)
                self.status[key] = "open"
                message = finding_message(f, recommendation_for(f, self.recs), self.run, e.opened_at)
                self._to_trackers(message)
                self._announce(message, f, step)
            else:
                self.status[key] = "resolved"
                message = resolved_message(f, step, self.run, e.opened_at, e.inherited)
                self._to_trackers(message)
                self._resolve(message, f["detector"], step)
        self._summary(final=False)

    def _to_trackers(self, message: Mapping[str, Any]) -> None:
        if self.trackers is not None:
            self.trackers.event(message)

    def _announce(self, m: dict[str, Any], f: Mapping[str, Any], step: int) -> None:
        det, rank = f["detector"], RANK[f["severity"]]
        routes = [(i, s) for i, (s, min_rank) in enumerate(self.routes) if rank >= min_rank]
        if not routes:
            return
        if self.max_per_run is not None and self._announced >= self.max_per_run:
            self.not_sent["over_the_cap"] += 1
            return
        last = self._last_said.get(det)
        if rank < RANK["critical"] and self.cooldown_steps and last is not None and step - last < self.cooldown_steps:
            self.not_sent["in_the_cooldown"] += 1  # a critical always goes out
            return
        self._announced += 1
        self._last_said[det] = step
        for i, sender in routes:
            if sender.submit(m):
                self._episode_keys[i].setdefault(det, []).append(m["idempotency_key"])

    def _resolve(self, m: dict[str, Any], det: str, step: int) -> None:
        for i, (sender, _) in enumerate(self.routes):
            keys = self._episode_keys[i].pop(det, None)
            if not keys:
                continue  # this destination never had the episode's opening
            if all(sender.fate(k) in LOST for k in keys):
                self.not_sent["resolution_of_an_unsent_opening"] += 1
                continue
            sender.submit(m)
            self._last_said[det] = step

    def _life(self, m: dict[str, Any]) -> None:
        if m["event"] != "end":
            self._to_trackers(m)
        for sender, _ in self.routes:
            sender.submit(m, urgent=True)

    def _summary(self, final: bool, delivery: Mapping[str, Any] | None = None) -> None:
        if self.trackers is not None:
            self.trackers.summary(SummaryState(self.last_step, verdict_of(self.findings), self.findings, self.recs,
                                               self.status, final, delivery))

    @property
    def verdict(self) -> str:
        return verdict_of(self.findings)

    # -- the run's life ---------------------------------------------------------------------

    def restart(self, plan: Mapping[str, Any]) -> None:
        """The monitor stopped the run to restart it: say so, and leave the open episodes to the next segment."""
        self.restarted = dict(plan)
        self._life(restart_message(plan, self.run))
        overrides = ", ".join(f"{k}={v!r}" for k, v in (plan.get("config_overrides") or {}).items())
        state = {
            "lineage": self.run.lineage,
            "segment": self.run.segment + 1,
            "how": f"{plan.get('variant')}" + (f": {overrides}" if overrides else ""),
            "episodes": self.episodes.state(),
            # which destination had each open episode's opening, by a name that does not hold the URL
            "announced": {s.destination.secret_id: sorted(self._episode_keys[i]) for i, (s, _) in enumerate(self.routes)
                          if hasattr(s.destination, "secret_id")},
        }
        if self.run.run_dir:
            target = Path(self.run.run_dir) / STATE_FILE
            tmp = target.with_name(f".{STATE_FILE}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(state, default=str))
            os.replace(tmp, target)

    def _inherit(self, state: Mapping[str, Any]) -> None:
        origin = {"segment": state.get("segment"), "how": state.get("how"), "lineage": state.get("lineage")}
        for ep in state.get("episodes") or []:
            self.episodes.inherit(ep["finding"], ep["opened_at"], ep.get("origin") or origin)
        announced = state.get("announced") or {}
        for i, (s, _) in enumerate(self.routes):
            for det in announced.get(getattr(s.destination, "secret_id", None), []):
                if det in self.episodes.open:
                    self._episode_keys[i][det] = [f"inherited:{det}"]

    def finish(self, step: int | None = None) -> dict[str, Any] | None:
        """At the trainer's final log, while every integration still has its run open: the end
        message (unless the run stopped for a restart, which said so), the flush, the final summary
        with the delivery counts. Returns those counts (for the run log's summary record)."""
        if step is not None:
            self.last_step = int(step)
        if self.delivery_report is None and not self.closed:
            if self.restarted is None:
                for e in self.episodes.resolve_inherited():
                    m = resolved_message(e.finding, self.last_step, self.run, e.opened_at,
                                         {**(e.inherited or {}), "end": True})
                    self._to_trackers(m)
                    self._resolve(m, e.finding["detector"], self.last_step)
                self._life(end_message(self.last_step, self.run, self.verdict, self.findings, self.episodes.open_list(),
                                       self.max_steps))
            self._wrap_up()
        return self.delivery_report if self.routes else None

    def crash(self, exc: BaseException, step: int | None = None) -> None:
        """The training raised: say where and what, then flush and account as at the end."""
        if self.delivery_report is not None or self.closed:
            return
        if step is not None:
            self.last_step = int(step)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        error = f"{type(exc).__name__}: {first}"[:500] if first else type(exc).__name__
        for s, _ in self.routes:
            error = s.destination.scrub(error)
        self._life(crash_message(error, self.last_step, self.run, self.episodes.open_list(),
                                 interrupted=isinstance(exc, KeyboardInterrupt)))
        self._wrap_up()

    def _wrap_up(self) -> None:
        """Flush every destination by one deadline, then the trackers' final summary: the end of
        training waits at most ``flush_timeout`` in all."""
        start = time.monotonic()
        deadline = start + self.flush_timeout
        # The trackers' final write gets the last fifth of the flush time (a second at most).
        reserve = min(1.0, self.flush_timeout / 5) if self.trackers is not None else 0.0
        for sender, _ in self.routes:
            sender.close(deadline - reserve)
        self.delivery_report = self.delivery()
        self._summary(final=True, delivery=self.delivery_report if self.routes else None)
        if self.trackers is not None:
            self.trackers.drain(deadline)
        self._report_trouble()
        self._account()

    def delivery(self) -> dict[str, Any]:
        """What became of the messages: per destination, and those the cap or cooldown held back."""
        return {"destinations": [{"destination": s.name, **s.counts()} for s, _ in self.routes],
                "not_sent": dict(self.not_sent)}

    def _account(self) -> None:
        """The counts as a note in the run log, and any loss in one warning line."""
        if not self.routes:
            return
        report = self.delivery_report or self.delivery()
        parts, trouble = [], False
        for d in report["destinations"]:
            bad = d["lost"] + d["unconfirmed"]
            trouble = trouble or bad > 0
            text = f"{d['destination']}: {d['messages']} message(s), {d['delivered']} delivered"
            if d["unconfirmed"]:
                text += f", {d['unconfirmed']} sent without an answer (not sent again: arrived once or not at all)"
            if d["lost"]:
                why = ", ".join(f"{d[k]} {k.replace('_', ' ')}" for k in (FAILED, RATE_LIMITED, QUEUE_FULL, UNSENT) if d[k])
                text += f", {d['lost']} lost ({why})"
            if d["skipped"]:
                text += f", {d['skipped']} not for this format"
            parts.append(text)
        held = {k: v for k, v in report["not_sent"].items() if v}
        if held:
            parts.append("held back on purpose: " + ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in held.items()))
        line = "alerts: " + "; ".join(parts)
        if self.note is not None:
            try:
                self.note({"type": "note", "step": self.last_step, "level": "warning" if trouble else "info",
                           "message": line, "alerts": report})
            except Exception as exc:
                self.on_error("alerts", exc)
        if trouble:
            logger.warning("grpo-monitor: %s; every finding is in the run log", line)

    def _report_trouble(self) -> None:
        """A destination's first trouble as a note (the count comes at the end); a failing tracker
        through ``on_error`` (one line, and it is dropped)."""
        for sender, _ in self.routes:
            for text in sender.take_errors():
                if sender.name in self._troubled:
                    continue
                self._troubled.add(sender.name)
                logger.info("grpo-monitor: alerts to %s: %s; training continues, the count comes at the end", sender.name, text)
                if self.note is not None:
                    try:
                        self.note({"type": "note", "step": self.last_step, "level": "warning",
                                   "message": f"alerts to {sender.name}: {text}"})
                    except Exception as exc:
                        self.on_error("alerts", exc)
        if self.trackers is not None:
            for component, exc in self.trackers.take_errors():
                self.on_error(component, exc)

    def close(self) -> None:
        if self.closed:
            return
        if self.delivery_report is None:
            self._wrap_up()
        self.closed = True
        if self.trackers is not None:
            for component, exc in self.trackers.close(time.monotonic() + 1.0):
                self.on_error(component, exc)


def _log_error(component: str, exc: BaseException) -> None:
    logger.warning("grpo-monitor: %s failed (%s: %s); training continues", component, type(exc).__name__, exc)


def read_state(lineage_root: Any, segment: int) -> dict[str, Any] | None:
    """The open episodes the previous segment of a lineage handed over, if it left any."""
    if not segment or lineage_root is None:
        return None
    from grpo_monitor.core.restart import segment_dir

    path = segment_dir(lineage_root, segment - 1) / STATE_FILE
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def build_dispatcher(trainer: Any, run_dir: Any, run_id: str | None, options: Any,
                     on_error: Callable[[str, BaseException], None] | None = None, *,
                     note: Callable[[dict[str, Any]], None] | None = None, segment: int = 0,
                     lineage_root: Any = None) -> AlertDispatcher | None:
    """The dispatcher for this trainer and ``attach`` options; None when nothing would receive alerts."""
    on_error = on_error or _log_error
    opts = AlertOptions.of(options)
    if not opts.enabled:
        return None
    if opts.trackers is True:
        names = reported_trackers(trainer)
    elif not opts.trackers:
        names = []
    else:
        wanted = [opts.trackers] if isinstance(opts.trackers, str) else list(opts.trackers)
        names = [n for n in reported_trackers(trainer) if n in wanted]
    sinks = build_sinks(trainer, names, on_error)
    if not sinks and not opts.routes:
        return None
    senders = [(Sender(r.destination, per_minute=r.per_minute, burst=r.burst),
                "critical" if r.min_rank == RANK["critical"] else "warning") for r in opts.routes]
    max_steps = getattr(getattr(trainer, "args", None), "max_steps", None)
    return AlertDispatcher(sinks, senders, min_severity=opts.min_severity, run_id=run_id,
                           run_dir=str(run_dir) if run_dir is not None else None, flush_timeout=opts.flush_timeout,
                           on_error=on_error, note=note, max_per_run=opts.max_per_run,
                           cooldown_steps=opts.cooldown_steps, segment=segment,
                           inherited=read_state(lineage_root, segment),
                           max_steps=max_steps if isinstance(max_steps, int) and max_steps > 0 else None)


def describe(options: Any) -> list[str]:
    """The destinations of ``options``, masked (for a line saying where alerts go)."""
    return [r.name for r in AlertOptions.of(options).routes]


__all__ = ["AlertDispatcher", "AlertOptions", "build_dispatcher", "describe", "mask_url"]
