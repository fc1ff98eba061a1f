"""The engine: one place that drives every detector, live and in replay.

The live callback and ``analyze`` both feed steps through ``Engine.update``, so a finding
replayed offline is raised at the same step it was raised live. A detector that raises is
reported once and switched off; the others keep running.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from grpo_monitor.detectors.base import RESETS, Detector, Finding, RunContext, StepCount
from grpo_monitor.detectors.episode import EpisodeDetector, is_fused_update
from grpo_monitor.detectors.signals import StepClock

logger = logging.getLogger("grpo_monitor")
_EPISODE_INNER = EpisodeDetector._update


def default_detectors() -> list[Detector]:
    """A fresh instance of every built-in detector, with default parameters."""
    from grpo_monitor import detectors

    return [cls() for cls in detectors.ALL_DETECTORS]


class Engine:
    def __init__(
        self,
        context: RunContext | None = None,
        detectors: Sequence[Detector] | None = None,
        on_error: Callable[[str, BaseException], None] | None = None,
    ) -> None:
        self.context = context or RunContext()
        self.detectors = list(default_detectors() if detectors is None else detectors)
        self.findings: list[Finding] = []
        self.disabled: dict[str, str] = {}
        self._on_error = on_error
        for d in self.detectors:
            d.start(self.context)
        # The detectors still running and their bound ``update``, with what they were taken from
        # (the detector list and the number disabled): rebuilt only when either changes.
        self._plan: list[Callable[..., Any]] = []
        self._plan_detectors: list[Detector] = []
        self._plan_from: list[Detector] | None = None
        self._plan_disabled = -1
        # Detectors that declare ``inert_without``, and for the metric names and sample presence
        # last seen (``_lean_keys``, ``_lean_has``): the plan without those the step leaves inert
        # (``_lean_plan``, ``_lean_detectors``) and those it leaves out, whose step it counts (``_lean_idle``).
        self._inert: list[Detector] = []
        self._lean_keys: list[Any] | None = None
        self._lean_has = False
        self._lean_plan: list[Callable[..., Any]] = []
        self._lean_detectors: list[Detector] = []
        self._lean_idle: list[Detector] = []
        # Detectors that define ``inert_now``; steps until they are asked again while some are not
        # yet settled (``_lean_ttl``, 0: not before the names change); the resets seen when last asked.
        self._settling: list[Detector] = []
        self._lean_ttl = 0
        self._lean_resets = -1
        # Every detector sees every step, so their step clocks agree: on the common path the
        # episode detectors whose clock matches share this one, which the engine ticks once per
        # step (``_lean_own``: idle ones with a clock of their own, ticked one by one). Detectors
        # driven one at a time over a whole run (``replay``) get their own copy back first.
        self._clock: StepClock | None = None
        self._lean_own: list[Detector] = []
        # On the common path the engine counts steps once for the detectors it leaves idle and for
        # those it calls through ``_step`` (``StepCount``); each folds the count into its own when
        # driven otherwise.
        self._count = StepCount()
        self._counted: list[Detector] = []

    def _replan(self) -> None:
        self._plan_detectors = [d for d in self.detectors if d.id not in self.disabled]
        self._plan = [d.update for d in self._plan_detectors]
        self._plan_from = list(self.detectors)
        self._plan_disabled = len(self.disabled)
        # With shared ids one failure silences the later namesakes mid-step, which only calling
        # each detector in turn reproduces.
        unique = len({d.id for d in self._plan_detectors}) == len(self._plan_detectors)
        self._inert = [d for d in self._plan_detectors if unique and _countable(d)]
        self._settling = [d for d in self._plan_detectors if unique and _settles(d)]
        self._inert += [d for d in self._settling if d not in self._inert]
        self._lean_keys = None

    def _relean(self, metrics: dict[Any, Any], has_samples: bool) -> None:
        self._hand_back_count()
        idle = set()
        self._lean_resets = RESETS[0]
        for d in self._inert:
            needs = type(d).__dict__.get("inert_without")
            if needs is not None and not any(has_samples if n == "samples" else n in metrics for n in needs):
                idle.add(id(d))
        settling = False
        for d in self._settling:
            if id(d) not in idle:
                try:
                    settled = d.inert_now(metrics, has_samples) is True  # type: ignore[attr-defined]
                except Exception:  # it will say so when called
                    settled = False
                if settled:
                    idle.add(id(d))
                else:
                    settling = True
        # Those not settled yet are asked again a few steps on (a settled one stays so while the
        # names stay: its steps change nothing).
        self._lean_ttl = _ASK_AGAIN if settling else 0
        clock = self._share_clock()
        self._lean_detectors = [d for d in self._plan_detectors if id(d) not in idle]
        entries = {id(d) for d in self._lean_detectors if _engine_entry(d, clock)}
        self._lean_plan = [d._step if id(d) in entries else u  # type: ignore[attr-defined]
                           for d, u in zip(self._plan_detectors, self._plan) if id(d) not in idle]
        self._lean_idle = [d for d in self._plan_detectors if id(d) in idle]
        self._lean_own = [d for d in self._lean_idle if isinstance(d, EpisodeDetector) and d.clock is not clock]
        count = self._count
        self._counted = [d for d in self._plan_detectors if id(d) in idle or id(d) in entries]
        for d in self._counted:
            d._count, d._count_base = count, count.n
        self._lean_keys = [*metrics]
        self._lean_has = has_samples

    def _hand_back_count(self) -> None:
        """Fold the steps the engine counted into each detector's own count (before it is driven
        otherwise, or handed over anew)."""
        count = self._count
        for d in self._counted:
            if d._count is count:  # not reset since
                d._n += count.n - d._count_base
                d._count = None
        self._counted = []
        self._lean_keys = None

    def _leave_common(self) -> None:
        """Before a step off the common path (or a replay) calls every detector itself."""
        if self._counted:
            self._hand_back_count()
        self._unshare_clock()

    def _share_clock(self) -> StepClock:
        """The engine's clock, shared with every episode detector whose own clock reads the same
        (all of them, unless one was reset or driven alone); taken from the first one after a replay."""
        clock = self._clock
        episodes = [d for d in self._plan_detectors if isinstance(d, EpisodeDetector)
                    and getattr(d, "clock", None).__class__ is StepClock]
        if clock is None:
            clock = self._clock = episodes[0].clock.copy() if episodes else StepClock()  # type: ignore[attr-defined]
        for d in episodes:
            own = d.clock  # type: ignore[attr-defined]
            if own is not clock and own._steps == clock._steps:
                d.clock = clock  # type: ignore[attr-defined]
        return clock

    def _unshare_clock(self) -> None:
        """Give every detector sharing the engine's clock a copy of its own (before they are driven
        one at a time); the engine shares it anew on its next common step."""
        clock = self._clock
        if clock is None:
            return
        self._clock = None
        self._lean_keys = None
        for d in self.detectors:
            if getattr(d, "clock", None) is clock:
                d.clock = clock.copy()  # type: ignore[attr-defined]

    def update(
        self, step: int, metrics: Mapping[str, float | None], samples: Sequence[Mapping[str, Any]] | None = None
    ) -> list[Finding]:
        if self._plan_disabled != len(self.disabled) or self._plan_from != self.detectors:
            self._replan()
        # The common step (plain types, metric names and sample presence as before, no detector
        # reset since): the plan without the detectors it leaves inert, whose step is counted here
        # exactly as their ``update`` would count it, and one tick of the shared step clock.
        if metrics.__class__ is dict and step.__class__ is int and (
                samples is None or samples.__class__ is list or samples.__class__ is tuple):
            try:
                if (bool(samples) is not self._lean_has or [*metrics] != self._lean_keys
                        or self._lean_resets != RESETS[0] or self._clock is None):
                    self._relean(metrics, bool(samples))
                elif self._lean_ttl:
                    self._lean_ttl -= 1
                    if not self._lean_ttl:
                        self._relean(metrics, bool(samples))
                common = True
            except Exception:  # odd keys (an ``__eq__`` that raises): every detector is called
                self._leave_common()
                common = False
        else:
            self._leave_common()
            common = False
        if common:
            plan, planned = self._lean_plan, self._lean_detectors
            clock = self._clock
            cs = clock._steps  # type: ignore[union-attr]
            if not cs or step > cs[-1]:  # StepClock.tick
                cs.append(step)
                clock._gap = None  # type: ignore[union-attr]
            self._count.n += 1
            for d in self._lean_own:  # reset or driven alone since the clock was shared: rare
                d.clock.tick(step)  # type: ignore[attr-defined]
        else:
            plan, planned = self._plan, self._plan_detectors
        raised: list[Finding] = []
        # One handler around the whole loop (a handler per detector costs on every step); the
        # ``update`` it was says which detector raised. ``+=`` is ``extend``: it raises for what a
        # detector must not return (None, a number), which disables that detector.
        try:
            for update in plan:
                raised += update(step, metrics, samples)
        except Exception as exc:  # a broken detector must not take the others, or the run, down
            i = next(k for k, u in enumerate(plan) if u is update)
            self._disable(planned[i].id, exc)
            for d in planned[i + 1:]:
                if d.id in self.disabled:
                    continue
                try:
                    raised.extend(d.update(step, metrics, samples))
                except Exception as exc2:
                    self._disable(d.id, exc2)
        if raised:
            self.findings += raised
        return raised

    def _disable(self, det_id: str, exc: BaseException) -> None:
        self.disabled[det_id] = f"{type(exc).__name__}: {exc}"
        if self._on_error is not None:
            self._on_error(f"detector {det_id}", exc)
        else:
            logger.warning("grpo-monitor: detector %s failed and is disabled: %s", det_id, exc)

    def replay(
        self, steps: Sequence[tuple[int, Mapping[str, float | None]]],
        samples: Mapping[int, Sequence[Mapping[str, Any]]] | None = None,
        processes: int | None = 1,
    ) -> list[Finding]:
        """Feed a whole recorded run; the same findings, in the same order, as ``update`` per step.

        Detectors share no state, so each one runs over every step before the next starts: a
        tight loop per detector is much faster than cycling through all of them at each step.
        Findings are then merged back into step order (detectors in their order within a step),
        and a detector that raises is disabled from that step on, exactly as ``update`` does.

        ``processes`` > 1 (``None``: one per CPU) lets a long run's detectors be shared out over
        forked processes; the findings and the detectors' final state are the same.
        """
        self._leave_common()  # detectors driven one at a time below: each needs its own clock and count
        self._lean_keys = None  # ask the settled ones again after
        streamed = bool(getattr(samples, "streamed", False))
        if streamed and not samples:
            samples = None
        if streamed and samples or len({d.id for d in self.detectors}) != len(self.detectors):
            # Samples read from disk a step at a time go step by step: each step read once, for
            # every detector. Disabling goes by id: with shared ids one failure silences several
            # detectors mid-step, which only the step-by-step loop reproduces.
            raised: list[Finding] = []
            for step, metrics in steps:
                raised.extend(self.update(step, metrics, samples.get(step) if samples else None))
            return raised
        steps = steps if isinstance(steps, list) else list(steps)
        per_step = [samples.get(step) for step, _ in steps] if samples else None
        jobs = [(j, d) for j, d in enumerate(self.detectors) if d.id not in self.disabled]
        workers = _fork_workers(processes, len(steps), len(jobs))
        if workers > 1:
            found, errors = self._replay_forked(jobs, steps, per_step, workers)
        else:
            found, errors, _ = _replay_span(jobs, steps, per_step, 0, len(steps))
        found.sort(key=lambda t: (t[0], t[1]))
        errors.sort(key=lambda t: (t[0], t[1]))
        for _, _, det_id, exc in errors:
            self._disable(det_id, exc)
        raised = [f for _, _, fs in found for f in fs]
        self.findings.extend(raised)
        return raised

    def _replay_forked(
        self, jobs: list[tuple[int, Detector]], steps: list[Any], per_step: list[Any] | None, workers: int
    ) -> tuple[list[tuple[int, int, list[Finding]]], list[tuple[int, int, str, BaseException]]]:
        """Replay a first stretch here, timing each detector; then this process and forked ones
        take the detectors one at a time, costliest first, and carry each to the end. A child
        sends back its findings and its detectors; whatever does not come back is replayed here,
        from the same point."""
        import multiprocessing
        import pickle

        ctx = multiprocessing.get_context("fork")
        try:
            taken = ctx.Value("i", 0)
        except OSError:  # no shared memory here: one process does it all
            taken = None
        head = min(_TIMED_PREFIX, len(steps) // 10) if taken is not None else 0
        found, errors, cost = _replay_span(jobs, steps, per_step, 0, head)
        failed = {j for _, j, _, _ in errors}
        order = sorted((jd for jd in jobs if jd[0] not in failed), key=lambda jd: -cost.get(jd[0], 0.0))
        if taken is None:
            more, errs, _ = _replay_span(order, steps, per_step, head, len(steps))
            return found + more, errors + errs

        def drain() -> tuple[list[Any], list[Any], dict[int, Detector]]:
            out_found: list[Any] = []
            out_errors: list[Any] = []
            done: dict[int, Detector] = {}
            while True:
                with taken.get_lock():
                    k = taken.value
                    taken.value += 1
                if k >= len(order):
                    return out_found, out_errors, done
                j, d = order[k]
                more, errs, _ = _replay_span([(j, d)], steps, per_step, head, len(steps))
                out_found += more
                out_errors += errs
                done[j] = d

        def child(conn: Any) -> None:
            try:
                blob = pickle.dumps(drain(), protocol=pickle.HIGHEST_PROTOCOL)
            except Exception:  # unpicklable findings or detectors: the parent replays them
                blob = b""
            conn.send_bytes(blob)
            conn.close()

        children = []
        for _ in range(min(workers, len(order)) - 1):
            recv, send = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=child, args=(send,), daemon=True)
            try:
                proc.start()
            except Exception:  # e.g. inside a daemonic worker, which may not have children: go on without
                recv.close()
                send.close()
                break
            send.close()
            children.append((proc, recv))
        more, errs, finished = drain()
        found += more
        errors += errs
        for proc, recv in children:
            try:
                blob = recv.recv_bytes()
            except (EOFError, OSError):
                blob = b""
            recv.close()
            proc.join()
            try:
                # An exception class whose constructor takes other arguments pickles but does not unpickle.
                more, errs, replayed = pickle.loads(blob) if blob else ([], [], None)
            except Exception:
                replayed = None
            if replayed is not None:
                found += more
                errors += errs
                for j, d in replayed.items():
                    self.detectors[j] = d
                finished.update(replayed)
        for j, d in order:
            if j not in finished:  # a child that died or could not send: its detectors, here
                more, errs, _ = _replay_span([(j, d)], steps, per_step, head, len(steps))
                found += more
                errors += errs
        return found, errors

    def coverage(self, names: Collection[str], has_samples: bool = False) -> dict[str, dict[str, Any]]:
        """Which detectors could judge the steps fed so far, and why the others could not.

        ``names`` are the metrics the run logged with a value. Each detector gets ``role``,
        ``status`` (``judged``, ``missing_inputs``, ``too_few_points``, ``not_applicable`` or
        ``failed``) and ``reason`` (None when judged). A detector with its inputs that never left
        its warm-up had too few logged points to set its baseline.
        """
        names = names if isinstance(names, (set, frozenset, dict)) else set(names)
        out: dict[str, dict[str, Any]] = {}
        for d in self.detectors:
            role = getattr(d, "role", "failure")
            status, reason = "judged", None
            try:
                if d.id in self.disabled:
                    status, reason = "failed", f"failed and was switched off ({self.disabled[d.id]})"
                elif (why := _hook(d, "not_applicable", names)) is not None:
                    status, reason = "not_applicable", why
                elif (why := _hook(d, "missing_inputs", names, has_samples)) is not None:
                    status, reason = "missing_inputs", why
                elif getattr(d, "state", "ok") == "warming_up":
                    n = getattr(d, "n_updates", 0)
                    status = "too_few_points"
                    reason = f"still warming up after {n} logged point{'s' if n != 1 else ''}: too few to set its baseline"
            except Exception as exc:  # a broken hook must not hide the other detectors' coverage
                status, reason = "failed", f"could not tell ({type(exc).__name__}: {exc})"
            out[d.id] = {"role": role, "status": status, "reason": reason}
        return out

    def state_names(self) -> dict[str, str]:
        """Each detector's state alone (what a step record keeps), without building evidence."""
        return {d.id: "disabled" if d.id in self.disabled else getattr(d, "state", "ok") for d in self.detectors}

    def states(self) -> dict[str, dict[str, Any]]:
        """Each detector's current state for dashboards: ``state`` and the latest evidence."""
        out = {}
        for d in self.detectors:
            state = "disabled" if d.id in self.disabled else getattr(d, "state", "ok")
            out[d.id] = {"state": state, "evidence": getattr(d, "last_evidence", {})}
        return out


def _countable(d: Detector) -> bool:
    """Whether the engine may count a step that leaves ``d`` inert instead of calling it: its class
    declares ``inert_without`` itself and steps go through ``EpisodeDetector``'s own ``update``,
    which, for a step ``_assess`` answers with None, only counts it (``n_updates``, the clock)."""
    cls = type(d)
    return (isinstance(d, EpisodeDetector) and cls.__dict__.get("inert_without") is not None
            and is_fused_update(cls.update) and "update" not in getattr(d, "__dict__", {})
            and getattr(cls, "_update", None) is _EPISODE_INNER)


def _engine_entry(d: Detector, clock: StepClock) -> bool:
    """Whether the engine may call ``d._step`` for ``update``: the shared episode ``update`` (as for
    ``_countable``), whose class has its ``_step``, nothing of its own on the instance, and the
    engine's clock."""
    cls = type(d)
    return (isinstance(d, EpisodeDetector) and getattr(d, "clock", None) is clock and is_fused_update(cls.update)
            and getattr(cls, "_update", None) is _EPISODE_INNER and "_step" in cls.__dict__
            and not {"update", "_step"} & d.__dict__.keys())


def _settles(d: Detector) -> bool:
    """Whether ``d``'s class defines ``inert_now`` itself for the ``update`` it runs: the shared
    episode ``update`` (as for ``_countable``) or its own, defined next to it."""
    cls = type(d)
    if not callable(cls.__dict__.get("inert_now")) or "update" in getattr(d, "__dict__", {}):
        return False
    if isinstance(d, EpisodeDetector):
        return is_fused_update(cls.update) and getattr(cls, "_update", None) is _EPISODE_INNER
    return "update" in cls.__dict__


def _hook(d: Detector, name: str, *args: Any) -> str | None:
    """A coverage hook of a detector that may predate it (an object without the method answers None)."""
    fn = getattr(d, name, None)
    return fn(*args) if callable(fn) else None


# Steps after which detectors not yet settled are asked again.
_ASK_AGAIN = 16
# Steps replayed in one process, timing each detector, before a long replay is shared out.
_TIMED_PREFIX = 2000
# Below this many steps a replay takes well under a second: forking would not pay.
FORK_FROM_STEPS = 20_000


def _fork_workers(processes: int | None, n_steps: int, n_detectors: int) -> int:
    if processes == 1 or n_steps < FORK_FROM_STEPS or n_detectors < 2:
        return 1
    import multiprocessing
    import os
    import sys
    import threading

    # Forking a process that runs other threads can copy a lock mid-use (a dashboard, a notebook).
    if not sys.platform.startswith("linux") or threading.active_count() > 1:
        return 1
    if "fork" not in multiprocessing.get_all_start_methods():
        return 1
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cpus if processes is None else processes, n_detectors))


def _replay_span(
    jobs: Sequence[tuple[int, Detector]], steps: list[Any], per_step: list[Any] | None, lo: int, hi: int
) -> tuple[list[tuple[int, int, list[Finding]]], list[tuple[int, int, str, BaseException]], dict[int, float]]:
    """Each detector over ``steps[lo:hi]``: findings as ``(index, position, findings)``, failures
    as ``(index, position, id, exception)`` (a detector stops at its failure), and seconds spent."""
    import time

    found: list[tuple[int, int, list[Finding]]] = []
    errors: list[tuple[int, int, str, BaseException]] = []
    cost: dict[int, float] = {}
    if hi <= lo:
        return found, errors, cost
    span = steps if lo == 0 and hi == len(steps) else steps[lo:hi]
    span_samples = None if per_step is None else (per_step if span is steps else per_step[lo:hi])
    for j, d in jobs:
        t0 = time.perf_counter()
        fast = getattr(d, "replay_steps", None)
        if fast is not None and is_fused_update(type(d).update) and getattr(type(d), "_update", None) is _EPISODE_INNER:
            fs, err = fast(span, span_samples)
            found.extend((lo + i, j, out) for i, out in fs)
            if err is not None:
                errors.append((lo + err[0], j, d.id, err[1]))
            cost[j] = time.perf_counter() - t0
            continue
        update = d.update
        i = 0
        try:
            if span_samples is None:
                for i, (step, metrics) in enumerate(span):
                    out = update(step, metrics, None)
                    if out:
                        found.append((lo + i, j, out if type(out) is list else list(out)))
                    elif out.__class__ is not list:
                        list(out)  # what ``extend`` would make of it: raises for a non-iterable
            else:
                for i, (step, metrics) in enumerate(span):
                    out = update(step, metrics, span_samples[i])
                    if out:
                        found.append((lo + i, j, out if type(out) is list else list(out)))
                    elif out.__class__ is not list:
                        list(out)
        except Exception as exc:  # a broken detector must not take the others down
            errors.append((lo + i, j, d.id, exc))
        cost[j] = time.perf_counter() - t0
    return found, errors, cost
