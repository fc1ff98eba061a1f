"""Reward-function bugs that are silent: a component that never varies, or one that ignores the completion.

A reward function with a bug rarely raises. It returns 0 for everything (a regex without DOTALL that
never matches a multi-line answer, a tag the chat template already wrote into the prompt, a wrong
dataset key), 1 for everything (a fallback that pays when the gold answer cannot be parsed, a format
the template satisfies), one value for the whole batch (broadcast to every completion), or one value
per prompt. The total reward still moves on the other components, so the run looks alive while the
component the user relies on teaches nothing.

A format reward that pays its full score to every completion from the start is *saturated*, not broken:
the model already writes the format (the demos' restarted segments, most instruct models). It carries no
signal, which is fine, and it is never raised here (``analysis.explain`` notes it); a format the chat
template writes into the prompt is the reward-inspection gate's check. A reward that pays per completion
token (exactly ``a x length + b`` in every sample batch) pays for length, not quality: it is named as
the cause (warning), and once the completions have grown under it while correctness has not (critical)
its fix is ``reward_weights`` with its weight at 0 (remedy ``drop_length_reward``); a loss variant cannot
remove a reward that pays per token.

The signature is constancy *from the start*: ``rewards/<f>/std`` exactly 0 at every logged point since
the component's first one, with the mean pinned at one value while another component or the total
varies. A component that learned its way to a constant (a format reward saturated at 1.0 after a
hundred steps) varied first and is never judged here. A component whose std is 0 while its mean changes
from point to point is given one value per batch. In sample batches, a component that gives every
completion of a prompt the same score, while the completions differ and another component tells them
apart, batch after batch from the first one, scores the prompt and not the completion.

Penalties that have not fired yet look like a dead component, so a component at 0 whose name says
neither format nor correctness is only raised after a long stretch. Logs without ``rewards/<f>/std``
(older TRL, notebooks' progress tables) are judged on the mean alone: one mean can average signed rewards
to 0, but the same mean to the last digit at every logged point, over ``mean_only_points`` points and
``other_steps`` steps (three times ``min_steps`` for two format checks that have both never paid), is a
component that never varied. A constant at or below 0 never pays (a penalty or a
parser's "no answer" value); above 0 it pays everything alike. No config flag fixes a broken reward
function: the finding's ``advice`` says what to check in the code.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from grpo_monitor.detectors.base import Assessment, Detector, Metrics, Sample, check_float, check_int, finite
from grpo_monitor.detectors.signals import (
    completions_per_step,
    duplicate_key,
    fair_sample,
    get,
    groups_of,
    resolve_correctness,
)

# Names of format checks: tags and templates, and the validity of structured output (a JSON action or tool call).
_FORMAT = re.compile(r"format|xml|tag|think|strict|soft|struct|schema|json", re.IGNORECASE)
_EPS = 1e-9
# The recommendation's name for giving a reward that pays per token the weight 0.
DROP_LENGTH_REWARD = "drop_length_reward"

ADVICE = {
    "dead_format": ("Run the function on a few completions that follow the format. Common causes: a regex "
                    "without re.DOTALL (or a ^...$ anchor) that fails on multi-line answers; a tag the chat "
                    "template already writes into the prompt (the completion never contains it: prepend it "
                    "before matching); tags that are special tokens (TRL decodes with skip_special_tokens=True)."),
    "dead_correctness": ("Run the function on a known-correct completion. Common causes: the wrong dataset column "
                         "or key for the gold answer, an answer parser that reads the whole completion (think block "
                         "included) or never finds the answer format the model uses."),
    "dead": ("Check the function can pay at all: run it on completions that should earn it. A penalty that has "
             "not fired yet looks the same; if so, ignore this."),
    "per_token": ("A reward that pays per completion token lets length, not quality, drive the score, and the "
                  "policy learns to be long. Remove it, set its weight to 0 (reward_weights) or cap it (a length "
                  "penalty or DAPO's soft overlong punishment); a loss variant such as Dr. GRPO removes GRPO's "
                  "length bias but cannot remove a reward that pays per token."),
    "free": ("A reward that pays every completion the same carries no signal. Check for a fallback that returns "
             "a fixed score (e.g. 1.0 when the gold answer cannot be parsed), a format the chat template already "
             "satisfies, or a function that returns a constant."),
    "per_batch": ("The function returns one score for the whole batch, which is broadcast to every completion: "
                  "return one score per completion (a list as long as `completions`)."),
    "per_prompt": ("The function scores the prompt or the reference answer, not the completion (or returns one "
                   "score per prompt, repeated): read `completions`, one score per completion."),
}


class _Component:
    """One reward component followed from its first logged point while its std stays 0."""

    __slots__ = ("changes", "first", "first_step", "last_step", "mean_only", "moved", "points", "prev", "status",
                 "support")

    def __init__(self, value: float, step: int, mean_only: bool = False) -> None:
        self.mean_only = mean_only  # no std logged: constant only while the mean stays the same to the last digit
        self.first = value
        self.first_step = step
        self.last_step = step
        self.points = 0
        self.support = 0  # points at which another component or the total varied
        self.moved = False  # the mean changed between points (std still 0): one value per batch
        self.prev = value
        self.changes = 0  # points whose mean differs from the point before
        self.status = "pinned"  # "pinned" | "alive" (its std was > 0 once) | "done" (raised at its top level)


class RewardFunctionBug(Detector):
    """A reward component constant from the first step, one value per batch, or one value per prompt.

    Parameters: ``min_points``/``min_steps`` (logged points and training steps a component must stay
    pinned before it is raised; critical at ``critical_factor`` times the steps), ``other_steps`` (a
    component at 0 whose name says neither format nor correctness is raised only after this many steps:
    a penalty that has not fired looks alike), ``min_batches`` (sample batches in a row, from the first,
    showing one score per prompt), ``max_components`` (components followed at most); a reward paying per
    token turns critical once the mean completion length is ``length_growth`` times its first batches' and
    at least ``min_length_gain`` tokens longer. ``min_completions``: where the config says how many completions
    a step scores (``signals.completions_per_step``), a pinned component must also have scored this many (twice
    as many for critical): two completions a step at 0 for a dozen steps is a hard task's ordinary luck.

    >>> det = RewardFunctionBug()
    >>> found = []
    >>> for step in range(1, 41):
    ...     found += det.update(step, {"rewards/format_reward/mean": 0.0, "rewards/format_reward/std": 0.0,
    ...                                "rewards/accuracy/mean": 0.3 + 0.01 * (step % 4), "rewards/accuracy/std": 0.45,
    ...                                "reward_std": 0.4})
    >>> [(f.severity, f.step, f.evidence["components"][0]["component"]) for f in found]
    [('warning', 8, 'format_reward'), ('critical', 24, 'format_reward')]
    >>> found[0].evidence["components"][0]["kind"], found[0].config_overrides
    ('dead_format', {})
    """

    id = "reward_function_bug"
    variant = None
    requires = (("rewards/*/std",), ("samples",), ("rewards/*/mean",))

    def __init__(self, min_points: int = 2, min_steps: int = 8, critical_factor: float = 3.0, other_steps: int = 100,
                 min_batches: int = 3, max_components: int = 32, length_growth: float = 1.5,
                 min_length_gain: float = 4.0, min_completions: int = 64, mean_only_points: int = 8) -> None:
        self.min_points = check_int("min_points", min_points, 1)
        self.mean_only_points = check_int("mean_only_points", mean_only_points, 2)
        self.min_completions = check_int("min_completions", min_completions, 1)
        self.length_growth = check_float("length_growth", length_growth, 1.0, 1e3, low_open=True)
        self.min_length_gain = check_float("min_length_gain", min_length_gain, 0.0, 1e6)
        self.min_steps = check_int("min_steps", min_steps, 1)
        self.critical_factor = check_float("critical_factor", critical_factor, 1.0, 1e3)
        self.other_steps = check_int("other_steps", other_steps, 1)
        self.min_batches = check_int("min_batches", min_batches, 1)
        self.max_components = check_int("max_components", max_components, 1)
        super().__init__()

    def missing_inputs(self, names: Collection[str], has_samples: bool = False) -> str | None:
        if has_samples or any(isinstance(n, str) and n.startswith("rewards/") and n.endswith(("/std", "/mean"))
                              for n in names):
            return None
        return "needs rewards/<f>/mean (per-function reward) or per-completion samples"


    def _reset_state(self) -> None:
        self.components: dict[str, _Component] = {}
        self._nkeys = -1
        self._keys: list[tuple[str, str, str]] = []
        self._pinned = 0  # components still followed (status "pinned")
        self._unseen = 0  # logged components not yet seen with a finite mean and std
        # One score per prompt, judged on the first sample batches: consecutive batches per component that
        # showed it, the value each gave the whole batch last time, and whether the check still runs.
        self.batch_runs: dict[str, int] = {}
        self.batch_values: dict[str, set[float]] = {}
        self.batch_moved: dict[str, bool] = {}
        self.batches = 0
        self.sample_check = True
        self.per_prompt: dict[str, dict[str, Any]] = {}
        self._correct: str | None = self.context.correctness_reward
        self._format: str | None = self.context.format_reward
        # Rewards paying per completion token, judged on every sample batch: per component, the batches in a
        # row (from the first) whose scores are exactly affine in the length, the rate, and the lengths and
        # correctness of the first batches as the baseline. A batch that breaks the line ends the check.
        self.token_check = True
        self.token_runs: dict[str, int] = {}
        self.token_fit: dict[str, tuple[float, float]] = {}
        self.token_broken: set[str] = set()
        self.token_batches = 0
        self.token_base: list[tuple[float, float | None]] = []
        self.token_now: tuple[float, float | None] | None = None
        self.token_since: int | None = None
        self.saturated: dict[str, float] = {}

    # -- per step ---------------------------------------------------------------------------------

    def assess(self, step: int, metrics: Metrics, samples: Sequence[Sample]) -> Assessment | None:
        if (not self._pinned and not self.episode.open and len(metrics) == self._nkeys
                and not (samples and (self.sample_check or self.token_check))):
            return None  # nothing left to follow: the healthy path from the first steps on
        if len(metrics) != self._nkeys:
            self._nkeys = len(metrics)
            self._scan(metrics)
        if self._pinned or self._unseen:
            self._follow(step, metrics)
        if samples and (self.sample_check or self.token_check):
            self._batch(step, samples)
        return self._judge(step)

    def _scan(self, metrics: Metrics) -> None:
        keys: list[tuple[str, str, str | None]] = []
        for k in metrics:
            if isinstance(k, str) and k.startswith("rewards/") and k.endswith("/mean"):
                name = k[len("rewards/"):-len("/mean")]
                if name and "/" not in name:
                    std = f"rewards/{name}/std"
                    keys.append((name, k, std if std in metrics else None))
        self._keys = keys[: self.max_components]
        self._unseen = sum(1 for n, _, _ in self._keys if n not in self.components)
        if self._correct is None:
            _, self._correct = resolve_correctness(self.context, [m for _, m, _ in self._keys])

    def _follow(self, step: int, metrics: Metrics) -> None:
        stds: list[tuple[str, float, float | None]] = []
        for name, mkey, skey in self._keys:
            m = get(metrics, mkey)
            s = get(metrics, skey) if skey is not None else None
            if m is not None and (s is not None or skey is None):
                stds.append((name, m, s))
        if not stds:
            return
        total_std = get(metrics, "reward_std")
        comps = self.components
        # Another component varied at this point: its std says so, or, without one, its mean moved.
        varying = sum(1 for n, m, s in stds if (s is not None and s > _EPS)
                      or (s is None and n in comps and abs(m - comps[n].prev) > _EPS * max(1.0, abs(comps[n].prev))))
        for name, m, s in stds:
            c = comps.get(name)
            if c is None:
                if len(comps) >= self.max_components:
                    continue
                c = comps[name] = _Component(m, step, mean_only=s is None)
                self._unseen = max(0, self._unseen - 1)
                if s is not None and s > _EPS:
                    c.status = "alive"
                else:
                    self._pinned += 1
            if c.status != "pinned":
                continue
            if s is not None and s > _EPS:
                c.status = "alive"
                self._pinned -= 1
                continue
            if abs(m - c.prev) > _EPS * max(1.0, abs(c.prev)):
                c.changes += 1
                c.prev = m
                if self.clock.gap > 1 or c.mean_only:
                    # A point averaging several batches: a sparse score (a penalty that fires on a whole small
                    # batch now and then) averages to any value with std 0. Without a std, a mean that moved
                    # says the completions were scored differently. Not constant, not judged.
                    c.status = "alive"
                    self._pinned -= 1
                    continue
                c.moved = True
            c.points += 1
            c.last_step = step
            if varying or (total_std is not None and total_std > _EPS):
                c.support += 1

    def _batch(self, step: int, samples: Sequence[Sample]) -> None:
        rows = fair_sample(samples, 256)
        if self.token_check:
            self._per_token(step, rows)
        if not self.sample_check:
            return
        groups = groups_of(rows)
        names: list[str] = []
        for r in rows:
            rw = r.get("rewards") if isinstance(r, Mapping) else None
            if isinstance(rw, Mapping):
                names = [n for n in rw if isinstance(n, str)]
                break
        if len(names) < 2:
            return
        self.batches += 1
        # Per component: groups whose completions differ, how many of those it scored alike, the
        # distinct scores across groups.
        differing = 0
        uniform = dict.fromkeys(names, 0)
        spread = {n: set() for n in names}
        present = dict.fromkeys(names, 0)
        n_rows = 0
        for rs in groups.values():
            n_rows += len(rs)
            keys = set()
            vals: dict[str, list[float]] = {n: [] for n in names}
            for r in rs:
                k = duplicate_key(r)
                keys.add(k if isinstance(k, (int, str)) else ("length", finite(r.get("length"))))
                rw = r.get("rewards") if isinstance(r.get("rewards"), Mapping) else {}
                for n in names:
                    v = finite(rw.get(n))
                    if v is not None:
                        vals[n].append(v)
                        present[n] += 1
            if len(rs) < 2 or len(keys) < 2:
                continue
            differing += 1
            for n in names:
                v = vals[n]
                if len(v) == len(rs) and max(v) - min(v) <= _EPS:
                    uniform[n] += 1
                    spread[n].add(round(v[0], 9))
        for n in names:
            one_value = present[n] == 1 and n_rows >= 4
            others = any(uniform[o] < differing for o in names if o != n)
            alike = differing >= 2 and uniform[n] == differing and others
            if (one_value or alike) and self.batch_runs.get(n, 0) == self.batches - 1:
                self.batch_runs[n] = self.batches
                seen = self.batch_values.setdefault(n, set())
                if len(seen) < 3:
                    seen.update(list(spread[n])[:3])
                if len(spread[n]) >= 2:
                    self.batch_moved[n] = True  # scores differ between prompts, never within one
                # A single score everywhere, the same every batch, is a constant (or a saturated reward):
                # broadcast only once the scores differ between prompts or batches.
                if self.batches >= self.min_batches and (one_value or len(seen) >= 2):
                    kind = "per_prompt" if self.batch_moved.get(n) else "per_batch"
                    self.per_prompt[n] = {"component": n, "kind": kind, "batches": self.batches,
                                          "groups_alike": uniform[n], "groups_with_differing_completions": differing,
                                          "since_step": step if n not in self.per_prompt else self.per_prompt[n]["since_step"]}
            elif n in self.per_prompt:
                self.per_prompt.pop(n)
        if not any(self.batch_runs.get(n, 0) == self.batches for n in names) or self.batches >= 4 * self.min_batches:
            # From the start or never: a later batch alike is a model that settled, not a bug.
            self.sample_check = False

    def _weight(self, name: str) -> float | None:
        """The weight the run's ``reward_weights`` gives component ``name`` (None: not known)."""
        weights = (self.context.config or {}).get("reward_weights")
        names = list(self.context.reward_names or [])
        if not isinstance(weights, (list, tuple)) or name not in names or len(weights) != len(names):
            return None
        return finite(weights[names.index(name)])

    def _per_token(self, step: int, rows: Sequence[Sample]) -> None:
        """Components whose score is ``a x length + b`` (a > 0, the line explaining at least 95% of the scores'
        variance: a reward paying per word tracks the token count closely, not exactly) over a batch of
        completions with at least three distinct lengths: a reward paying per token. Two lengths always fit a
        line, so a batch with fewer says nothing; one that breaks the line clears the component for the rest
        of the run."""
        scored: list[tuple[float, Mapping[str, Any]]] = []
        for r in rows:
            n = finite(r.get("length")) if isinstance(r, Mapping) else None
            rw = r.get("rewards") if isinstance(r, Mapping) else None
            if n is not None and isinstance(rw, Mapping):
                scored.append((n, rw))
        if not scored:
            return
        right = [v for v in (finite(rw.get(self._correct)) for _, rw in scored) if v is not None] if self._correct else []
        self.token_now = (sum(n for n, _ in scored) / len(scored), sum(right) / len(right) if right else None)
        if len(self.token_base) < self.min_batches:
            self.token_base.append(self.token_now)
        if len({n for n, _ in scored}) < 3:
            return
        self.token_batches += 1
        names = {k for _, rw in scored for k in rw if isinstance(k, str)}
        for name in sorted(names - self.token_broken):
            pairs = [(n, v) for n, v in ((n, finite(rw.get(name))) for n, rw in scored) if v is not None]
            fit = _affine(pairs)
            if fit is None or fit[0] <= _EPS or self.token_runs.get(name, 0) != self.token_batches - 1:
                self.token_broken.add(name)
                self.token_runs.pop(name, None)
                self.token_fit.pop(name, None)
                continue
            self.token_runs[name] = self.token_batches
            self.token_fit[name] = fit
            if self.token_since is None:
                self.token_since = step
        if self.token_batches >= self.min_batches and not self.token_fit:
            self.token_check = False  # no component pays per token: nothing left to follow

    def _length_grown(self) -> dict[str, Any] | None:
        """The growth of the mean length since the first batches, with correctness not improving."""
        if not self.token_base or self.token_now is None:
            return None
        base_len = sorted(b[0] for b in self.token_base)[len(self.token_base) // 2]
        now_len, now_correct = self.token_now
        base_correct = [b[1] for b in self.token_base if b[1] is not None]
        before = sum(base_correct) / len(base_correct) if base_correct else None
        grown = now_len >= self.length_growth * base_len and now_len >= base_len + self.min_length_gain
        improving = before is not None and now_correct is not None and now_correct > before + 0.1
        if not grown or improving:
            return None
        return {"mean_length_first_batches": base_len, "mean_length_now": now_len,
                "correctness_first_batches": before, "correctness_now": now_correct}

    # -- judging ------------------------------------------------------------------------------------

    def _kind(self, name: str, c: _Component) -> str:
        if c.moved:
            return "per_batch"
        if c.first > _EPS:
            # A format reward paying its score to every completion: the model writes the format already.
            is_format = name == self._format or (bool(_FORMAT.search(name)) and name != self._correct)
            return "saturated" if is_format else "free"
        if name == self._format or (_FORMAT.search(name) and name != self._correct):
            return "dead_format"
        if name == self._correct:
            return "dead_correctness"
        return "dead"

    def _judge(self, step: int) -> Assessment:
        gap = self.clock.gap
        level = 0
        onset: int | None = None
        found: list[dict[str, Any]] = []
        # Completions a logged point scores: a point of a coarse log averages ``gap`` steps.
        per_step = completions_per_step(self.context.config)
        per_step = per_step * gap if per_step else None
        for name, c in self.components.items():
            if c.status == "alive" or c.points < self.min_points:
                continue
            covered = c.last_step - c.first_step + gap
            kind = self._kind(name, c)
            if kind == "saturated":
                self.saturated[name] = c.first
                continue
            need = self.other_steps if kind == "dead" else self.min_steps
            if c.mean_only:
                # The mean alone cannot tell a component that never varies from one that has not paid yet (a
                # correctness that needs a format the model has not learned, a penalty that has not fired): the
                # same value to the last digit over ``other_steps`` and ``mean_only_points`` points. Two format
                # checks that have both never paid (a strict and a soft regex with the same bug) corroborate each
                # other: three times ``min_steps`` then.
                corroborated = kind == "dead_format" and any(
                    o is not c and o.mean_only and o.status != "alive" and not o.moved and abs(o.first) <= _EPS
                    and self._kind(n, o) == "dead_format" for n, o in self.components.items())
                need = 3 * self.min_steps if corroborated else max(need, self.other_steps)
                if c.points < self.mean_only_points:
                    continue
            if covered < need or 2 * c.support < c.points:
                continue
            if kind == "per_batch" and 3 * c.changes < c.points:
                continue  # a broadcast score changes with nearly every batch
            scored = c.points * per_step if per_step else None
            if scored is not None and scored < self.min_completions:
                continue
            lvl = 1
            if (kind != "dead" and covered >= self.critical_factor * need and c.points >= self.min_points + 1
                    and (scored is None or scored >= 2 * self.min_completions)):
                lvl = 2
            found.append({"component": name, "kind": kind, "value": finite(c.first) if not c.moved else None,
                          "std": None if c.mean_only else 0.0, "points": c.points, "since_step": c.first_step, "steps": covered,
                          "advice": ADVICE[kind], "level": lvl})
            level = max(level, lvl)
            onset = c.first_step if onset is None else min(onset, c.first_step)
            if lvl == 2 and c.status == "pinned":
                c.status = "done"  # raised at its top level: no need to follow it further
                self._pinned -= 1
        for name, info in self.per_prompt.items():
            if any(f["component"] == name for f in found):
                continue
            lvl = 2 if info["batches"] >= 2 * self.min_batches else 1
            found.append(dict(info, advice=ADVICE[info["kind"]], level=lvl))
            level = max(level, lvl)
        grown = self._length_grown()
        for name, (rate, intercept) in self.token_fit.items():
            if self.token_runs.get(name, 0) < self.min_batches or any(f["component"] == name for f in found):
                continue
            weight = self._weight(name)
            if weight is not None and abs(weight) <= _EPS:
                continue  # weighted out of the total: it pays nothing
            lvl = 2 if grown is not None else 1
            found.append({"component": name, "kind": "per_token", "per_token": rate, "intercept": intercept,
                          "batches": self.token_runs[name], "since_step": self.token_since,
                          **(grown or {}), "advice": ADVICE["per_token"], "level": lvl})
            level = max(level, lvl)
            onset = self.token_since if onset is None else min(onset, self.token_since or onset)
        base: dict[str, Any] = {"pinned_components": self._pinned,
                                "sample_check": "running" if self.sample_check else "done"}
        if self.saturated:
            base["saturated_components"] = dict(self.saturated)
        if not found:
            return Assessment(level=0, evidence=base)
        found.sort(key=lambda f: (-f["level"], f["kind"] == "dead", f["since_step"] or 0))
        ev = {"components": found, "advice": found[0]["advice"], "min_points": self.min_points,
              "min_steps": self.min_steps}
        if self.saturated:
            ev["saturated_components"] = dict(self.saturated)
        top = found[0]
        if top["kind"] == "per_token" and top["level"] == 2 and self._drop_weights(top["component"]):
            ev["remedy"] = DROP_LENGTH_REWARD
        return Assessment(level=level, evidence=ev, onset_step=onset)

    def _drop_weights(self, name: str) -> list[float] | None:
        """``reward_weights`` with component ``name`` at 0 and the others as the run weighs them."""
        names = list(self.context.reward_names or [])
        if name not in names:
            return None
        weights = (self.context.config or {}).get("reward_weights")
        out = [float(w) for w in weights] if isinstance(weights, (list, tuple)) and len(weights) == len(names) \
            else [1.0] * len(names)
        out[names.index(name)] = 0.0
        return out

    def _overrides(self) -> dict[str, Any]:
        comps = self.evidence.get("components") or [{}]
        if self.evidence.get("remedy") == DROP_LENGTH_REWARD:
            weights = self._drop_weights(comps[0].get("component"))
            if weights is not None:
                return {"reward_weights": weights}
        return {}

    def _message(self, severity: str, evidence: Mapping[str, Any]) -> str:
        comps = evidence.get("components") or [{}]
        f = comps[0]
        name, kind = f.get("component", "a reward component"), f.get("kind")
        more = f" ({len(comps) - 1} more component(s) in the evidence)" if len(comps) > 1 else ""
        if kind == "per_token":
            b = f.get("intercept") or 0.0
            line = f"{f.get('per_token'):.4g} x length" + (f" {'+' if b > 0 else '-'} {abs(b):.4g}" if abs(b) > 1e-9 else "")
            what = (f"Reward component {name} pays {f.get('per_token'):.4g} per completion token (its score follows "
                    f"{line} in every sample batch since step {f.get('since_step')})")
            if f.get("mean_length_now") is not None:
                what += (f", and the completions have grown under it from {f['mean_length_first_batches']:.3g} to "
                         f"{f['mean_length_now']:.3g} tokens while correctness has not improved: this reward is the "
                         f"cause of the length growth")
                weights = self._drop_weights(name)
                fix = f" Set its weight to 0 (reward_weights={weights})." if weights else ""
                return f"{what}{more}.{fix} {f.get('advice', '')}"
            return f"{what}{more}: it pays for length, not quality. {f.get('advice', '')}"
        if kind == "per_prompt":
            what = (f"Reward component {name} gives every completion of a prompt the same score although the "
                    f"completions differ, in every sample batch since the first")
        elif kind == "per_batch":
            what = (f"Reward component {name} gives one score to a whole batch (its std is 0 at every step while its "
                    f"value changes) since step {f.get('since_step')}")
        elif f.get("std") is None:
            what = (f"Reward component {name} has logged the same mean, {f.get('value')}, to the last digit at every "
                    f"one of {f.get('points')} logged points since step {f.get('since_step')} while the other rewards "
                    "vary: it never varies")
        else:
            what = (f"Reward component {name} has paid exactly {f.get('value')} to every completion since step "
                    f"{f.get('since_step')} (std 0 over {f.get('points')} logged points) while the other rewards vary")
        return f"{what}{more}: the function is likely broken and teaches nothing. {f.get('advice', '')}"


def _affine(pairs: Sequence[tuple[float, float]], min_r2: float = 0.95) -> tuple[float, float] | None:
    """``(a, b)`` of the least-squares line ``y = a x + b`` when it explains the scores (R^2 at least ``min_r2``:
    a reward paying per word moves with the token count almost, not exactly, linearly), else None.

    >>> _affine([(4, 0.3), (4, 0.3), (5, 0.4), (7, 0.6)])
    (0.1, -0.1)
    >>> _affine([(4, 0.3), (5, 0.4), (7, 0.5), (4, 0.3)]) is not None, _affine([(4, 1.0), (5, 0.0), (7, 1.0)])
    (True, None)
    """
    if len({x for x, _ in pairs}) < 3:
        return None  # two lengths always fit a line
    n = len(pairs)
    mx = sum(x for x, _ in pairs) / n
    my = sum(y for _, y in pairs) / n
    sxx = sum((x - mx) ** 2 for x, _ in pairs)
    syy = sum((y - my) ** 2 for _, y in pairs)
    if sxx <= _EPS or syy <= _EPS:
        return None
    sxy = sum((x - mx) * (y - my) for x, y in pairs)
    a = sxy / sxx
    b = my - a * mx
    if sxy * sxy / (sxx * syy) < min_r2:
        return None
    return float(f"{a:.6g}"), float(f"{b:.6g}")
