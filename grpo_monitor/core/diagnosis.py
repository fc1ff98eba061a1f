"""The diagnosis: each finding's cause checked against the rest of the run's signals.

A detector names the failure it watches for. The first to fire is not always the cause: groups with no reward
variance are the symptom of a reward that never pays, of an entropy collapse, of completions that grew into the
cap, or of a task that is simply solved; a reward that falls right after the learning rate jumped is the
learning rate, whatever the completions then look like. The diagnosis sits between the detectors and the
verdict, in the one session the callback, ``analyze`` and the dashboard share, and checks each finding's
preconditions against what the whole run shows (``core.run_signals``):

- *Learning signal gone* is never healthy, and never "solved" unless the correctness is at the ceiling the run
  has shown: saturated (a warning, stop or make the prompts harder) or collapsed (critical, with the cause the
  signals support: a reward that never pays, a learning-rate blow-up, completions grown into the cap, an entropy
  collapse). No signal that rests on truncation alone while the reward still climbs is not "no signal".
- *A reward component that never varies* costs what it carries: critical when it is the correctness signal (or
  nothing varies), a warning when nothing else carries the learning either, info when another component does.
- *A fall right after a jump* (the learning rate or the gradient norm), or from the first updates, is a
  learning-rate finding with the last healthy learning rate (or one a hundred times lower), not degeneration or an
  engine fault; *garbage from the first updates* on a run with no inference engine is the updates themselves (its
  advice says so, with the learning rate), not a weight sync.
- *Format rising while correctness is flat* is not divergence while another task component carries the learning.

A finding whose cause is another failure is raised under that failure's id (``evidence["diagnosis"]`` says which
detector saw it and why); one whose preconditions fail is kept as ``info`` with the reason; alternatives the
evidence leaves open are named (``also_consistent_with``). One finding per cause and severity per episode.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from grpo_monitor.core.run_signals import RunSignals, is_format_name
from grpo_monitor.detectors.base import Finding, RunContext
from grpo_monitor.detectors.numbers import finite
from grpo_monitor.detectors.signals import completions_per_step
from grpo_monitor.detectors.stats import median
from grpo_monitor.detectors.sudden_collapse import REMEDY as LOWER_LR, lowered_learning_rate
from grpo_monitor.detectors.variants import EXTRA_ADVICE, preset

SEVERITY_LEVEL = {"info": 0, "warning": 1, "critical": 2}
_NEVER_PAYS_COMPLETIONS = 128
_TRL_COMPLETIONS_PER_STEP = 8  # per_device_train_batch_size=8 on one process
# Detectors whose finding, right after a jump of the learning rate or the gradient norm, is that jump's doing.
_AFTER_A_JUMP = ("degenerate_long_cot", "broken_generation", "entropy_collapse", "no_learning_signal", "entropy_rise",
                 "length_collapse")
_TEXT_SHAPE = ("degenerate_long_cot", "entropy_rise", "length_collapse")  # broken_generation: its own rule


@dataclasses.dataclass
class Judgement:
    """What the diagnosis makes of one finding: its cause (a detector id; None: set aside as info), severity,
    variant and change, and the reasons."""

    cause: str | None
    severity: str
    because: list[str]
    variant: str | None = None
    overrides: dict[str, Any] | None = None  # None: the finding's own
    message: str | None = None  # None: the finding's own
    also: list[str] = dataclasses.field(default_factory=list)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


class Diagnosis:
    """Reviews each step's findings against the run's signals; ``review`` once per logged step."""

    def __init__(self, context: RunContext) -> None:
        self.context = context
        self.signals = RunSignals(context)
        # Per cause: the highest severity level raised in its open episode, and the detectors that fed it.
        self.emitted: dict[str, tuple[int, set[str]]] = {}
        # Detectors whose latest finding was set aside: their state shows as ok while that episode lasts.
        self.set_aside: set[str] = set()
        # The latest no-learning-signal finding as raised, while its episode is open and its cause not yet named:
        # re-judged at every step, since the cause (an entropy that goes on falling) often shows after the symptom.
        self.undetermined: Finding | None = None
        self._falling = (-1, 0)  # (logged point last tested, logged points in a row the correctness was seen falling)
        # A reward-function finding kept at info because another component carries the learning: judged again at
        # every step, since that may stop (the correctness falls), and then it is raised at its harm.
        self.revisit: Finding | None = None

    # -- per step ----------------------------------------------------------------------------------

    def review(self, raised: Sequence[Finding], step: int, metrics: Mapping[str, Any], engine: Any) -> list[Finding]:
        self.signals.observe(step, metrics)
        states = engine.state_names() if engine is not None else {}
        self._close_episodes(states)
        out: list[Finding] = []
        raised = list(raised) + self._reconsider(raised, step, states)
        for f in raised:
            j = self.judge(f)
            if j is None:
                out.append(f)
                self._book(f.detector, f.detector, SEVERITY_LEVEL[f.severity])
                if f.detector == "no_learning_signal":
                    self.undetermined = f  # no cause named yet: judged again as the run goes on
                continue
            g = self._apply(f, j)
            if g.severity == "info" and j.cause is None:
                self.set_aside.add(f.detector)
                out.append(g)
                continue
            if g.severity == "info" and g.detector == f.detector:
                self.set_aside.add(f.detector)  # kept as information: its state shows no alarm either
            else:
                self.set_aside.discard(f.detector)
            if f.detector == "no_learning_signal":
                self.undetermined = f if g.detector == "no_learning_signal" else None
            if f.detector == "reward_function_bug":
                self.revisit = f if g.severity == "info" and j.cause == "reward_function_bug" else None
            level = SEVERITY_LEVEL[g.severity]
            held = self.emitted.get(g.detector)
            if held is not None and held[0] >= level:
                held[1].add(f.detector)  # the same cause, already raised at this severity in this episode
                continue
            self._book(g.detector, f.detector, level)
            out.append(g)
        return out

    def _reconsider(self, raised: Sequence[Finding], step: int, states: Mapping[str, str]) -> list[Finding]:
        """The open no-signal episode again, where its cause is still undetermined, and a reward-function finding kept
        at info: the finding as of this step, when the signals now name a cause or a harm (else nothing)."""
        out: list[Finding] = []
        r = self.revisit
        if r is not None and not any(x.detector == r.detector for x in raised):
            j = self._reward_bug(r)
            if j is not None and j.severity != "info":
                self.revisit = None
                out.append(dataclasses.replace(r, step=step))
        f = self.undetermined
        if f is None or any(r.detector == f.detector for r in raised):
            return out
        if states.get(f.detector) not in ("warning", "critical"):
            self.undetermined = None
            return []
        j = self._signal_gone(f)
        if j is None or j.cause in (None, "no_learning_signal") or j.cause in self.emitted:
            return out
        self.undetermined = None
        return [*out, dataclasses.replace(f, step=step)]

    def _book(self, cause: str, raiser: str, level: int) -> None:
        held = self.emitted.get(cause)
        self.emitted[cause] = (max(level, held[0] if held else 0), (held[1] if held else set()) | {raiser, cause})

    def _close_episodes(self, states: Mapping[str, str]) -> None:
        quiet = ("ok", "warming_up")
        for cause in [c for c, (_, feeders) in self.emitted.items() if all(states.get(d, "ok") in quiet for d in feeders)]:
            del self.emitted[cause]
        self.set_aside = {d for d in self.set_aside if states.get(d, "ok") not in quiet}

    def shown_states(self, states: dict[str, str]) -> dict[str, str]:
        """Each detector's state as the diagnosis leaves it: a set-aside finding's detector shows ``ok``, a cause
        raised for another detector shows its severity while that episode lasts."""
        out = dict(states)
        for d in self.set_aside:
            if out.get(d) in ("warning", "critical"):
                out[d] = "ok"
        for cause, (level, _) in self.emitted.items():
            if level and cause in out and SEVERITY_LEVEL.get(out[cause], -1) < level:
                out[cause] = ("warning", "critical")[level - 1]
        return out

    # -- the rules -----------------------------------------------------------------------------------

    def judge(self, f: Finding) -> Judgement | None:
        """The judgement of one finding (None: its own diagnosis stands)."""
        if f.severity == "info" or f.detector.startswith("config_"):
            return None
        if f.detector in _AFTER_A_JUMP:
            j = self._after_a_jump(f) or self._broken_by_first_updates(f)
            if j is not None:
                return j
        rule = {
            "no_learning_signal": self._signal_gone,
            "reward_function_bug": self._reward_bug,
            "reward_component_divergence": self._divergence,
            "broken_generation": self._broken_generation,
            "entropy_collapse": self._collapse_claim,
            "truncation": self._cut_for_pay,
        }.get(f.detector)
        return rule(f) if rule is not None else None

    def _after_a_jump(self, f: Finding) -> Judgement | None:
        """The task reward fell right after the learning rate or the gradient norm jumped: a learning-rate
        finding with the last healthy learning rate, whatever the completions did next. (Not where a train-inference
        mismatch or a MoE instability was raised first: its gradient spikes and crash are that failure's, which has
        its own cure.)"""
        sig = self.signals
        if "rollout_mismatch" in self.emitted or "moe_instability" in self.emitted:
            return None
        at = f.onset_step if f.onset_step is not None else f.step
        jump = sig.jump_before(at, within=max(10, 3 * sig.steps_per_point()))
        task = sig.task()
        if jump is None or task is None:
            return None
        key, series = task
        key = self._name(key)
        best, now = series.best, series.recent
        if best is None or now is None or best - now <= max(2.0 * series.spread, 0.1 * abs(best), 1e-9):
            return None  # the reward did not fall: the jump did no visible harm
        lr = jump.get("learning_rate_before") if jump["what"] == "learning_rate" else None
        lr = lr if lr is not None else lowered_learning_rate(self.context.config)
        because = [f"the {jump['what'].replace('_', ' ')} jumped x{jump['factor']} at step {jump['step']}",
                   f"{key} fell from {_r(best)} to {_r(now)} right after it",
                   f"{f.detector} saw what followed"]
        overrides = {"learning_rate": lr} if lr is not None else {}
        cause_text = (f"The {key} fell from {_r(best)} to {_r(now)} right after the {jump['what'].replace('_', ' ')} "
                      f"jumped x{jump['factor']} at step {jump['step']}: the update size broke the policy. Resume from "
                      f"the checkpoint saved before step {jump['step']}"
                      + (f" with learning_rate={lr}, the run's last healthy rate" if lr is not None else " with a lower learning rate")
                      + (" and a lower max_grad_norm" if jump["what"] == "grad_norm" else "")
                      + f". ({f.detector} saw the consequence: {f.message})")
        return Judgement("sudden_collapse", "critical" if f.severity == "critical" or jump["what"] == "learning_rate"
                         else f.severity, because, None, overrides, cause_text,
                         extra={"remedy": LOWER_LR, "jump": jump,
                                "learning_rate": {"configured": finite((self.context.config or {}).get("learning_rate")),
                                                  "recommended": lr}})

    def _broken_by_first_updates(self, f: Finding) -> Judgement | None:
        """The task reward fell from its first level within the first few updates and stayed at the bottom (a
        learning rate far too high breaks a warm-started policy at once): a learning-rate finding, the rate lowered
        a hundredfold, since one order of magnitude rarely saves a policy that broke this fast."""
        fall = self.signals.fell_at_start()
        if fall is None and f.detector in _TEXT_SHAPE and not {"moe_instability", "rollout_mismatch"} & set(self.emitted):
            # Text gone long or repetitive within the first updates, the reward down with it: no drift takes so few
            # steps (degeneration needs a baseline to drift from), and no variant cures a policy the updates broke.
            # Raised that early, not merely dated back there (an onset estimate reaches back over a coarse log; a coarse
            # log shows the fall by the first points instead, ``fell_at_start``).
            fall = self.signals.fell_right_away(f.step)
        if fall is None:
            return None
        lr = lowered_learning_rate(self.context.config, 100.0)
        key = self._name(fall["metric"])
        return Judgement("sudden_collapse", "critical" if f.severity == "critical" else f.severity,
                         [f"{fall['metric']} fell from {_r(fall['first'])} at the first logged step to {_r(fall['now'])} within the "
                          "first updates", f"{f.detector} saw what followed"], None,
                         {"learning_rate": lr} if lr is not None else {},
                         (f"The first updates broke the policy: {key} fell from {_r(fall['first'])} at the first logged step "
                          f"to {_r(fall['now'])} within a few steps" + (" and has stayed there" if fall.get("stayed", True) else "")
                          + ". The learning rate is far too high "
                          "for this model" + (f": restart from the initial model with learning_rate={lr} (a hundredth; a "
                                              "tenth rarely saves a policy that breaks this fast)" if lr is not None else
                                              ": restart from the initial model with a learning rate a hundred times lower")
                          + f". ({f.detector} saw what followed: {f.message})"),
                         also=["fp16 overflow, where the run trains in fp16"],
                         extra={"remedy": LOWER_LR, "first_updates": fall, "learning_rate": {
                             "configured": finite((self.context.config or {}).get("learning_rate")), "recommended": lr}})

    def _collapse_claim(self, f: Finding) -> Judgement | None:
        """An entropy collapse is not one where the sampler was cold (or greedy) from the start, nor where the task
        is solved (every completion right: the groups are alike because they are right, and the entropy with them)."""
        cold = self._cold_sampler(f)
        if cold is not None:
            return cold
        if self._solved() and (self.signals.zero_variance_share() or 0.0) >= 0.8:
            level = self.signals.correct.latest()
            return Judgement("no_learning_signal", "warning", [f"{self._name(self.signals.correct_key or '')} is at "
                                                                f"{_r(level)}: the task is solved"],
                             message=(f"Saturated, not collapsed: {self._name(self.signals.correct_key or '')} is at "
                                      f"{_r(level)} and the groups score alike because every completion is right; the "
                                      "entropy fell with the uncertainty. Stop the run or use harder prompts; DAPO would "
                                      "not add anything here."), extra={"signal": "saturated"})
        return None

    def _cold_sampler(self, f: Finding) -> Judgement | None:
        """An entropy that never fell is not a collapse: low from the first step (under a low sampling temperature,
        or a model deterministic before training), the groups score alike from the start."""
        temp = finite((self.context.config or {}).get("temperature"))
        cold = temp is not None and temp <= 0.3
        if not cold and not self.signals.entropy_low_from_start():
            return None
        if cold:
            return Judgement("no_learning_signal", f.severity, [f"temperature={temp}", "the entropy was low from the first step"],
                             None, {"temperature": 1.0}, self._cold_text(temp), extra={"remedy": "raise_temperature"})
        e = self.signals.series["entropy"]
        return Judgement("no_learning_signal", f.severity,
                         [f"the entropy was {_r(median(e.early_vals[:3]))} at the first logged steps and is {_r(e.recent)} now: "
                          "it never fell", "groups lose their reward variance"],
                         message=("No learning signal: the completions of a group are nearly identical from the first step "
                                  f"(the entropy was already {_r(median(e.early_vals[:3]))} nats then; it never fell, so this is "
                                  "not a collapse). Check the sampling settings (temperature, top_p, top_k: TRL samples at "
                                  "temperature=1.0) before anything else."),
                         also=["a model made deterministic by its fine-tuning before GRPO"])

    @staticmethod
    def _cold_text(temp: float) -> str:
        return (f"The sampler is too cold: temperature={temp} makes the completions of a group nearly identical from the "
                "first step (the entropy never had room to fall), so groups score alike and nothing is learned. Sample at "
                "temperature=1.0 (TRL's default) or close to it; lower it only for evaluation.")

    def _cut_for_pay(self, f: Finding) -> Judgement | None:
        """Completions that grow into the cap because a reward component pays for them to grow: raising the cap would
        feed it. The component rising with the length while the correctness does not is the cause."""
        sig = self.signals
        if not sig.grew("completions/mean_length") or not sig.improving("reward"):
            return None
        correct = sig.correct_key
        if correct is not None and sig.improving(correct):
            return None
        payers = [n for n in sig.carriers(besides=[sig.correctness.name or ""], lengths=True)]
        if not payers:
            return None
        s = sig.series["completions/mean_length"]
        who = ", ".join(payers)
        return Judgement("length_reward_coupling", f.severity,
                         [f"the mean length grew from {_r(s.early)} to {_r(s.recent)}", f"{who} rose with it",
                          "correctness did not" if correct else "no correctness reward to say it improved"], "dr_grpo",
                         preset("dr_grpo", self.context.config),
                         (f"The completions grow into the cap because the reward pays for length: {who} rose as the mean "
                          f"length grew from {_r(s.early)} to {_r(s.recent)} tokens, while "
                          + (f"{self._name(correct)} did not improve" if correct else "nothing shows the answers improved")
                          + ". Raising the cap would feed it: remove or cap that reward (reward_weights, a length penalty) "
                          "and switch to Dr. GRPO, which removes GRPO's length bias."),
                         also=["a cap too short for the task"])

    def _signal_gone(self, f: Finding) -> Judgement | None:
        """Most groups without reward variance: saturated or collapsed, with the cause the signals support."""
        sig = self.signals
        ev = f.evidence or {}
        conds = list(ev.get("conditions") or [])
        task = sig.task()
        if conds == ["all_truncated"] and task is not None and sig.improving(task[0]):
            return Judgement(None, "info", [f"{self._name(task[0])} still rises", "no group is without reward spread"],
                             message=(f"Completions are cut at the length cap, but {self._name(task[0])} still improves: the groups "
                                      "still rank their completions, so learning goes on (the truncation detector tells the "
                                      "cut itself)."))
        temp = finite((self.context.config or {}).get("temperature"))
        if temp is not None and temp <= 0.3:
            # A sampler this cold makes the completions of a group alike on its own: the first cause to remove.
            return Judgement("no_learning_signal", f.severity, [f"temperature={temp}", "groups score alike"],
                             None, {"temperature": 1.0}, self._cold_text(temp), extra={"remedy": "raise_temperature"},
                             also=[] if sig.entropy_low_from_start() else ["an entropy collapse"])
        reward = sig.series["reward"]
        if ("all_truncated" in conds and sig.capped_from_start() and reward.early_vals
                and max(reward.early_vals) <= 1e-9 and (reward.recent or 0.0) <= 1e-9):
            # Cut before the answer from the first step on, every completion has scored nothing: the cap, not the task,
            # leaves no signal. (A run that scored at first and then ran to the cap broke; it did not outgrow the cap.)
            return self._cap_too_short(f)
        bug = self._dead_task_reward() if not (sig.fell() or sig.all_at_zero_after_paying()) else None
        if bug is not None:
            name, value = bug
            return Judgement("reward_function_bug", "critical",
                             [f"{name} paid {value} on every logged step", "groups carry no reward variance"],
                             message=(f"No learning signal, and the reason is a reward that never pays: {name} has paid "
                                      f"{value} on every logged step, so every completion of a group scores alike. Check "
                                      "its code or the dataset column it reads (run it on a known-correct completion)."),
                             also=["a task too hard for the model"])
        ratio = sig.entropy_ratio()
        greedy = sig.entropy_low_from_start()
        collapsed_entropy = ratio is not None and ratio <= 0.25 and not greedy
        at_ceiling = self._at_ceiling()
        solved = self._solved()
        if at_ceiling and (solved or not collapsed_entropy):
            # At the ceiling: saturated. With the entropy collapsed too, only a correctness at the top of its
            # scale (every completion right) says solved rather than collapsed.
            key, level = at_ceiling
            return Judgement("no_learning_signal", "warning", [f"{key} is at the ceiling the run has shown ({_r(level)})"],
                             message=(f"Saturated: {key} is at the ceiling this run has shown ({_r(level)}) and most groups "
                                      "score alike, so nothing is left to learn from these prompts. Stop the run or use "
                                      "harder prompts; training on spends compute for nothing."),
                             also=["a collapse onto one answer"] if ratio is None else [],
                             extra={"signal": "saturated"})
        if greedy and (ratio is None or ratio <= 0.25):
            return self._cold_sampler(f)
        if sig.grew_into_cap() and "all_truncated" in conds:
            return Judgement("degenerate_long_cot", "critical" if f.severity == "critical" else "warning",
                             ["completions grew into the length cap", "groups carry no reward variance"], "dapo",
                             preset("dapo", self.context.config),
                             ("No learning signal: the completions grew into the length cap (the truncated share rose to "
                              f"{_r(sig.series['completions/clipped_ratio'].recent)} after the run had finished completions), "
                              "so every completion is cut and scores alike. Switch to DAPO: mask_truncated_completions=True "
                              "takes cut completions out of the loss, and the soft overlong punishment teaches ending in time."),
                             also=["a cap too short for the task"])
        if collapsed_entropy:
            return Judgement("entropy_collapse", "critical", [f"entropy fell to {_r(ratio)} of its early level",
                                                              "groups lost their reward variance"], "dapo",
                             preset("dapo", self.context.config),
                             (f"Entropy collapse: the policy's entropy fell to {100 * ratio:.0f}% of its early level and "
                              "most groups now score alike, so the learning signal is gone"
                              + (" while the reward stays below the ceiling it had shown" if not at_ceiling else "")
                              + ". Switch to DAPO (clip-higher keeps exploration alive); resume from a checkpoint saved "
                              "before the fall."), also=[] if not at_ceiling else ["a task the model has mastered"])
        if ev.get("signal") in ("saturated", "had_signal") or (task is not None and task[1].best is not None
                                                              and ev.get("signal") != "never_had"):
            # The detector read "every group alike at the best reward" without a correctness at its ceiling.
            return self._collapsed(f, task)
        return None

    def _cap_too_short(self, f: Finding) -> Judgement:
        """Every completion cut at the cap from the first step: the cap is too short for the task's answers."""
        cap = (self.context.config or {}).get("max_completion_length")
        ok = isinstance(cap, int) and not isinstance(cap, bool) and cap > 0
        new = 2 * cap if ok else None
        return Judgement("no_learning_signal", "critical" if f.severity == "critical" else "warning",
                         ["every completion was cut at the cap from the first step", "groups carry no reward variance"],
                         None, {"max_completion_length": new} if new else {},
                         ("No learning signal because the length cap is too short: every completion has been cut at "
                          + (f"max_completion_length={cap} " if ok else "the cap ")
                          + "from the first step, before it can finish its answer, so every group scores alike. Raise "
                          + (f"max_completion_length to {new} or more" if new else "max_completion_length")
                          + " (or ask for shorter answers); no GRPO variant fixes this."),
                         extra={"remedy": "raise_max_completion_length",
                                "max_completion_length": {"current": cap if ok else None, "recommended": new}})

    def _collapsed(self, f: Finding, task: tuple[str, Any] | None) -> Judgement | None:
        if task is None:
            return None
        key, series = task
        key = self._name(key)
        # Where the reward stands over the stretch without signal (a short stretch is outweighed in the recent window).
        stretch = (f.evidence or {}).get("points_in_a_row")
        best = series.best
        now = series.latest(min(stretch, series.window)) if isinstance(stretch, int) and stretch >= 1 else series.recent
        if best is None or now is None:
            return None
        if best - now <= max(2.0 * series.spread, 0.1 * abs(best), 1e-9):
            # At the best level, but no correctness to show the task is solved: a plateau without signal.
            return Judgement("no_learning_signal", "warning",
                             [f"{key} sits at {_r(now)}, its best level", "no correctness at its ceiling to call it solved"],
                             message=(f"The learning signal is gone: most groups score alike while {key} sits at {_r(now)}. "
                                      "Nothing shows the task is solved; if the model has mastered these prompts, stop or "
                                      "use harder ones, else the policy has settled on one answer per prompt: more "
                                      "generations per prompt or a finer-grained reward bring the spread back."),
                             also=["a solved task", "a collapse onto one answer"])
        g = (self.context.config or {}).get("num_generations")
        more = (f" With num_generations={g}, two or four completions easily agree: raise it to 8 or more."
                if isinstance(g, int) and not isinstance(g, bool) and g <= 4 else "")
        return Judgement("no_learning_signal", "critical",
                         [f"{key} fell from the ceiling {_r(best)} to {_r(now)}", "most groups score alike"],
                         message=(f"The learning signal collapsed: {key} fell from {_r(best)}, the best this run reached, "
                                  f"to {_r(now)}, and most groups now score alike, so the policy has settled on one answer "
                                  f"per prompt.{more} Resume from a checkpoint saved before the fall; a lower learning rate "
                                  "keeps it from settling as fast."),
                         also=["an entropy collapse (the run logs no entropy to tell)"]
                         if self.signals.entropy_ratio() is None else [])

    def _dead_task_reward(self) -> tuple[str, float] | None:
        """The task's reward component (correctness) constant on every logged step while groups lost variance, or
        every component constant: (its name, its value)."""
        sig = self.signals
        comps = sig.components
        if not comps:
            return None
        varying = set(sig.varying_components())
        correct = sig.correctness.name
        # Enough completions scored to call a 0 "never pays" rather than "not yet" (a hard task, two completions a
        # step): as many as the reward-function detector wants before its critical. A log without its config is
        # read with TRL's defaults (eight completions a step), so a run reads the same with its config or without.
        per = completions_per_step(self.context.config) or _TRL_COMPLETIONS_PER_STEP
        if min(s.seen for s in comps.values()) * per * sig.steps_per_point() < _NEVER_PAYS_COMPLETIONS:
            return None
        # "Never pays": constant at or below 0 (a positive constant pays everything alike: saturated, or free).
        if correct in comps and correct not in varying and comps[correct].seen >= 4 and comps[correct].recent_vals[-1] <= 0:
            return correct, comps[correct].recent_vals[-1]
        if not varying and all(s.seen >= 4 for s in comps.values()) and all(s.recent_vals[-1] <= 0 for s in comps.values()):
            name = next(iter(comps))
            return name, comps[name].recent_vals[-1]
        return None

    def _solved(self) -> bool:
        """The correctness, a share in [0, 1], at 0.9 or above now: every completion or nearly all of them right."""
        s = self.signals.correct
        now = s.latest()
        return (self.signals.correct_key is not None and now is not None and now >= 0.9
                and all(0.0 <= v <= 1.0 for v in s.recent_vals))

    def _name(self, key: str) -> str:
        """A metric as a message names it: a reward component by its function's name."""
        return key[len("rewards/"):-len("/mean")] if key.startswith("rewards/") and key.endswith("/mean") else key

    def _at_ceiling(self) -> tuple[str, float] | None:
        """The correctness at the ceiling this run has shown, and above where it started (a correctness stuck at its
        first level, or at 0, is never "solved")."""
        sig = self.signals
        if sig.correct_key is None:
            return None
        s = sig.correct
        now, early = s.recent, s.early
        if now is None or early is None or now <= 0:
            return None
        unit = all(0.0 <= v <= 1.0 for v in s.recent_vals)
        if unit and now >= 0.9:
            return self._name(sig.correct_key), now
        if s.at_ceiling() and now > early + max(2.0 * s.spread, 0.05 * abs(early), 1e-9):
            return self._name(sig.correct_key), now
        return None

    def _reward_bug(self, f: Finding) -> Judgement | None:
        """A constant component's severity follows its harm."""
        comps = (f.evidence or {}).get("components") or []
        if not comps:
            return None
        top = comps[0]
        kind, name = top.get("kind"), str(top.get("component"))
        if kind in ("per_token", "per_prompt", "per_batch"):
            return None
        sig = self.signals
        if "sudden_collapse" in self.emitted or sig.fell_at_start() is not None or sig.all_at_zero_after_paying():
            return Judgement(None, "info", ["the policy collapsed: the whole reward fell to its floor"],
                             message=(f"{f.message} Set aside: the policy collapsed (the whole reward fell to "
                                      f"{_r(sig.series['reward'].recent)}), so the policy, not this function, stopped earning it; "
                                      "the collapse finding says why."), also=["a broken reward function"])
        constant = {str(c.get("component")) for c in comps}
        correct = sig.correctness.name or self.context.correctness_reward
        carriers = sig.carriers(besides=sorted(constant))
        varying = set(sig.varying_components()) - constant
        is_task = name == correct or kind == "dead_correctness" or not (is_format_name(name) or name == self.context.format_reward)
        if kind == "free" and name == correct and not varying:
            # Every completion at full marks from the first step, to the last digit: a fallback that pays everything
            # is likelier than a model right on every sample of every step, but the two read alike.
            return Judgement("reward_function_bug", "critical", ["the correctness pays every completion the same"],
                             also=["a task the model already solves on every sample (then stop, or use harder prompts)"])
        if carriers:
            return Judgement("reward_function_bug", "info",
                             [f"{', '.join(carriers)} carr{'y' if len(carriers) > 1 else 'ies'} the learning"],
                             message=(f"{f.message} It adds nothing to any advantage, but {', '.join(carriers)} "
                                      f"carr{'y' if len(carriers) > 1 else 'ies'} the learning meanwhile (a correctness "
                                      "reward that needs the exact format pays once the format is learned)."))
        if not varying or (is_task and kind in ("dead_correctness", "dead")):
            return Judgement("reward_function_bug", "critical", ["it is the task's signal" if varying else "nothing else varies"])
        paying = self._correctness_pays(correct, constant)
        if not is_task and paying is not None:
            # A format check that never pays while the correctness pays and varies: the groups' advantages come from
            # the correctness, and this component adds nothing to any of them. Information; judged again at each step
            # (``revisit``): should the correctness fall, nothing carries the learning and it is raised.
            return Judgement("reward_function_bug", "info", [f"{paying} pays and varies: it carries the learning"],
                             message=(f"{f.message} It adds nothing to any advantage; {paying} pays and varies, so the "
                                      "run learns from it meanwhile."))
        if kind == "free" and is_task:
            # Full marks on every completion from a task component while others vary: the task's signal is the broken
            # one, so the harm is the detector's own reading (a critical once confirmed).
            return Judgement("reward_function_bug", f.severity, ["it is the task's signal"],
                             also=["a task the model already solves on every sample (then stop, or use harder prompts)"])
        if kind == "free" or not is_task:
            return Judgement("reward_function_bug", "warning" if f.severity != "info" else "info",
                             ["nothing else carries the learning either"])
        return None

    def _correctness_pays(self, correct: str | None, constant: set[str]) -> str | None:
        """The correctness component, when it varies, its latest level is above zero (it pays some completions and
        tells them apart, so the groups' advantages come from it) and it is not falling; else None."""
        sig = self.signals
        if not correct or correct in constant or correct not in sig.varying_components():
            return None
        c = sig.components.get(correct)
        now = c.latest() if c is not None else None
        if now is None or now <= 0:
            return None
        return None if self._correctness_falls() else correct

    def _correctness_falls(self) -> bool:
        """The correctness seen falling at two logged points in a row: a trend test repeated at every point finds a
        chance dip in a noisy correctness now and then; a real fall stays found."""
        sig = self.signals
        at = sig.points
        if self._falling[0] != at:
            self._falling = (at, self._falling[1] + 1 if sig.correct.falling() else 0)
        return self._falling[1] >= 2

    def _divergence(self, f: Finding) -> Judgement | None:
        """Format up, correctness flat: not a divergence while another task component carries the learning."""
        ev = f.evidence or {}
        if ev.get("pattern") == "saturated":
            # A component paying everything from the start: partial credit elsewhere does not refute it. But the
            # correctness beside it that never pays is the reward bug already named, and where the run's groups have
            # lost their spread it is the no-signal episode already raised: the same cause, seen from its parts.
            dead = self._dead_task_reward()
            for cause, because in (("reward_function_bug", dead is not None and f"{dead[0]} never pays"),
                                   ("no_learning_signal", "the groups carry no reward spread")):
                if because and cause in self.emitted:
                    return Judgement(cause, f.severity, [because, f"{ev.get('component')} pays everything from the start"])
            return None
        rising = str(ev.get("component") or "")
        correct = (ev.get("correctness") or {}).get("metric") if isinstance(ev.get("correctness"), Mapping) else None
        besides = [rising] + ([correct[len("rewards/"):-len("/mean")]] if isinstance(correct, str) and correct.startswith("rewards/") else [])
        carriers = self.signals.carriers(besides=besides)
        if carriers:
            return Judgement(None, "info", [f"{', '.join(carriers)} rises too"],
                             message=(f"{f.message} Set aside: {', '.join(carriers)}, another task component, rises too, "
                                      "so the task is being learned (a format learned first is the usual order)."))
        return None

    def _broken_generation(self, f: Finding) -> Judgement | None:
        """Garbage from the first updates with no inference engine: the generator is the trained model, so the
        updates broke it (a learning rate far too high, or fp16 overflow), not a weight sync."""
        ev = f.evidence or {}
        if ev.get("mode") != "garbage_after_first_update" or self.signals.engine:
            return None
        lr = lowered_learning_rate(self.context.config, 100.0)
        signs = ", ".join(str(s).replace("_", " ") for s in ev.get("signs") or [])
        return Judgement("broken_generation", "critical" if f.severity == "critical" else "warning",
                         ["garbage within the first updates", "the run samples with the trained model itself (no vLLM)"],
                         None, {"learning_rate": lr} if lr is not None else {},
                         ("The first updates broke the policy: completions turned into one token repeated ("
                          f"{signs}) within a few steps, and the run samples with the trained model itself, so no engine "
                          "sync is involved. The learning rate is far too high for this model"
                          + (f": restart from the initial model with learning_rate={lr}" if lr is not None else "")
                          + " (an order of magnitude may not be enough); under fp16, use bf16 or fp32."),
                         also=["fp16 overflow"],
                         extra={"remedy": LOWER_LR, "advice": ("The run samples with the trained model itself: lower the "
                                                                "learning rate (or train in bf16/fp32, not fp16)."),
                                "learning_rate": {"configured": finite((self.context.config or {}).get("learning_rate")),
                                                  "recommended": lr}})

    # -- building the diagnosed finding ---------------------------------------------------------

    def _apply(self, f: Finding, j: Judgement) -> Finding:
        cause = j.cause or f.detector
        severity = j.severity
        evidence = dict(f.evidence or {})
        evidence.update(j.extra)
        evidence["diagnosis"] = {"cause": j.cause or "set_aside", "raised_by": f.detector, "because": j.because,
                                 **({"also_consistent_with": j.also} if j.also else {})}
        if j.cause is None:
            evidence.pop("remedy", None)
            return dataclasses.replace(f, severity="info", variant=None, config_overrides={}, evidence=evidence,
                                       message=j.message or f.message)
        if cause == f.detector and j.message is None and j.overrides is None:
            return dataclasses.replace(f, severity=severity, evidence=evidence)
        variant = j.variant if cause != f.detector or j.variant is not None else f.variant
        overrides = dict(j.overrides) if j.overrides is not None else dict(f.config_overrides)
        message = j.message or f.message
        if j.cause != f.detector or j.overrides is not None:
            if variant != "dapo":
                evidence.pop("extra_advice", None)
            if variant is None and j.extra.get("remedy") is None:
                evidence.pop("remedy", None)
        variant, overrides, message = self._moe(variant, overrides, message)
        if variant == "dapo":
            cap = (self.context.config or {}).get("max_completion_length")
            evidence["extra_advice"] = dict(EXTRA_ADVICE["dapo"])
            if isinstance(cap, int) and not isinstance(cap, bool) and cap > 0:
                evidence["extra_advice"]["reward_funcs"] = (
                    f"+trl.rewards.get_soft_overlong_punishment(max_completion_len={cap}, soft_punish_cache={max(1, cap // 4)})")
        if j.also:
            message += f" Also consistent with: {'; '.join(j.also)}."
        return Finding(detector=cause, severity=severity, step=f.step, onset_step=f.onset_step, variant=variant,
                       config_overrides=overrides, evidence=evidence, message=message)

    def _moe(self, variant: str | None, overrides: dict[str, Any], message: str) -> tuple[str | None, dict[str, Any], str]:
        """The recipe requires GSPO on MoE: any switch there is GSPO (as ``Detector`` does for its own findings)."""
        cfg = self.context.config or {}
        if self.context.is_moe and variant not in (None, "gspo") and cfg.get("importance_sampling_level") != "sequence":
            return "gspo", preset("gspo", cfg), message + (" This is a mixture-of-experts model: instead, switch to GSPO "
                                                           "(sequence-level importance ratio), which the recipe requires there.")
        return variant, overrides, message


def _r(x: Any) -> Any:
    """A value as a message shows it: four significant digits."""
    v = finite(x)
    return x if v is None else float(f"{v:.4g}")
