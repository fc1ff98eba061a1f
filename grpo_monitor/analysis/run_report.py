"""The report of an analysis, one model every rendering reads (text, Markdown, JSON, HTML, the alerts).

A ``RunReport`` is one run's replay: its findings and recommendations, which detectors could judge it, its
status, costs, notes and key curves; its ``verdict`` is the worst training finding's severity, ``cannot_judge``
when no failure detector had its inputs, ``incomplete`` for a run that stopped before its end. The recipe's
pre-flight ``config_*`` findings are shown with their recommendations but never set the verdict: the logs of
one run differ only in what they hold (samples, steps), and the coverage says what each could not judge. A ``Report`` holds every run analysed, the
paths that could not be read and the loose files skipped.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo_monitor.core.exit_codes import ExitCode
from grpo_monitor.detectors.base import Finding

SEVERITY_RANK = {"info": 0, "warning": 1, "critical": 2}
VERDICTS = ("healthy", "incomplete", "cannot_judge", "warning", "critical")
# The status of a run that stopped before its end (Ctrl-C, a crash): its verdict is ``incomplete``
# unless a finding says more.
INTERRUPTED = "interrupted"
# The inputs the failure detectors read, in the order a user would map them.
KEY_INPUTS = ("reward", "completions/mean_length", "completions/clipped_ratio", "entropy", "frac_reward_zero_std",
              "reward_std", "rewards/<name>/mean")
# What a finding's evidence carries beyond the detector's own figures.
ANNOTATIONS = ("cost", "forecast")


@dataclass
class RunReport:
    source: str
    format: str
    steps: int
    findings: list[Finding]
    recommendations: list[dict[str, Any]]
    series: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    # The file (or folder) actually read, which detectors could judge, the metrics with a value.
    file: str = ""
    coverage: dict[str, dict[str, Any]] = field(default_factory=dict)
    metrics_found: list[str] = field(default_factory=list)
    # None (finished, or nothing says otherwise), "incomplete" (no final summary), "restarted"
    # (stopped by the monitor for a restart), with a sentence saying so.
    status: str | None = None
    status_note: str = ""
    # The run's segment in a restarted lineage, counted from 1 as every screen shows it (headers
    # record it from 0); None for a run that was never restarted.
    segment: int | None = None
    # Patterns in the run that look wrong but are normal GRPO behaviour (``grpo_monitor.analysis.explain``); they
    # never change the verdict.
    notes: list[dict[str, Any]] = field(default_factory=list)
    # Lines of the run's files that were not records, each left out alone: how many, and where.
    skipped: dict[str, Any] | None = None
    # What the run's writer could not write (the disk filled, an I/O error), from its notes, and
    # the steps the run logged, those missing from the log included.
    not_written: dict[str, Any] | None = None
    steps_logged: int | None = None
    # What the run spent (``run``) and what each warning/critical finding cost from its onset to the end of
    # the run (``findings``, in the order of ``findings``; ``core.cost``).
    cost: dict[str, Any] = field(default_factory=dict)
    # The GPU's health over the run (``core.device.device_health``, with the device the run header names),
    # None when the run logged no device readings.
    device: dict[str, Any] | None = None
    # Where a foreign log's training config came from (a notebook's GRPOConfig cell, the config verl printed)
    # and the settings read there that the detectors and recommendations use; None when the log gave none.
    config_from: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    # Each detector's state at the end of the replay, as the session shows it (the dashboard's board).
    states: dict[str, str] = field(default_factory=dict)
    # The log's own names mapped onto the canonical ones by their words (``core.names``): ``mapped`` (name ->
    # {to, by}) and ``ambiguous`` (canonical name -> the names left unmapped for it); empty when none was.
    names: dict[str, Any] = field(default_factory=dict)
    # Each finding's samples (``core.finding_samples``), in the order of ``findings``: references into the run's
    # kept samples with their numbers and a short excerpt; None for a log that records no samples.
    finding_samples: list[list[dict[str, Any]]] | None = None

    def samples_of(self, index: int) -> list[dict[str, Any]]:
        """The samples behind ``findings[index]`` (empty when the run records none)."""
        picks = self.finding_samples
        return list(picks[index]) if picks is not None and 0 <= index < len(picks) else []

    @property
    def judged_by(self) -> list[str]:
        return [d for d, c in self.coverage.items() if c.get("role") == "failure" and c.get("status") == "judged"]

    @property
    def checked_by(self) -> list[str]:
        """The sanity checks (``role = "guard"``: non-finite values, grad-norm spikes, stalls, ...) that had their
        inputs: they raise findings, but a run only they could read is not called judged."""
        return [d for d, c in self.coverage.items() if c.get("role") in ("guard", "rule") and c.get("status") == "judged"]

    @property
    def rules_not_checked(self) -> dict[str, str]:
        """The team rules (``core.rules``) the run gave no input: each with why, never silently left out."""
        return {d: str(c.get("reason")) for d, c in self.coverage.items()
                if c.get("role") == "rule" and c.get("status") not in ("judged", "not_applicable")}

    @property
    def not_judged(self) -> dict[str, str]:
        return {d: str(c.get("reason")) for d, c in self.coverage.items()
                if c.get("role") == "failure" and c.get("status") != "judged" and c.get("status") != "not_applicable"}

    @property
    def training_findings(self) -> list[Finding]:
        """The detectors' findings about the training, without the pre-flight ``config_*`` ones."""
        return [f for f in self.findings if not is_preflight(f)]

    @property
    def preflight_findings(self) -> list[Finding]:
        """The pre-flight ``config_*`` findings a run directory records: advice on the recipe."""
        return [f for f in self.findings if is_preflight(f)]

    @property
    def worst_severity(self) -> int:
        # The verdict is about the training: the recipe's pre-flight findings are shown with their
        # recommendations; a run directory's verdict differs from its console log's only by what the logs hold.
        return max((SEVERITY_RANK.get(f.severity, 0) for f in self.training_findings), default=-1)

    @property
    def verdict(self) -> str:
        worst = self.worst_severity
        if worst >= 2:
            return "critical"
        if worst == 1:
            return "warning"
        if self.coverage and not self.judged_by:
            return "cannot_judge"
        if self.status in ("incomplete", INTERRUPTED):
            # A run that stopped before its end is never called healthy; a finding, above, wins over it.
            return "incomplete"
        return "healthy"

    @property
    def flagged(self) -> bool:
        return any(f.severity in ("warning", "critical") for f in self.training_findings)

    @property
    def exit_code(self) -> int:
        v = self.verdict
        if v in ("critical", "warning"):
            return ExitCode.FINDINGS
        return ExitCode.NOT_JUDGED if v in ("cannot_judge", "incomplete") else ExitCode.CLEAN

    def to_dict(self) -> dict[str, Any]:
        out = {
            "source": self.source,
            "steps": self.steps,
            "findings": [f.to_dict() if self.finding_samples is None else {**f.to_dict(), "samples": self.samples_of(i)}
                         for i, f in enumerate(self.findings)],
            "recommendations": shown_recommendations(self.recommendations),
            "file": self.file,
            "format": self.format,
            "verdict": self.verdict,
            "judged_by": self.judged_by,
            "checked_by": self.checked_by,
            "not_judged": self.not_judged,
            "rules_not_checked": self.rules_not_checked,
            "metrics_found": self.metrics_found,
            "model": dict(self.model),
        }
        if self.status:
            out["status"] = self.status
            out["status_note"] = self.status_note
        if self.verdict == "cannot_judge":
            out["needs"] = needs_text(self)
        if self.warnings:
            out["notes"] = list(self.warnings)
        if self.skipped:
            out["skipped_records"] = dict(self.skipped)
        if self.not_written:
            out["not_written"] = dict(self.not_written)
            out["steps_logged"] = self.steps_logged
        # Explanations of normal behaviour under their own key: "notes" has carried the read warnings.
        out["normal"] = list(self.notes)
        if self.config_from:
            out["config_from"] = self.config_from
            out["config"] = dict(self.config)
        if self.cost:
            out["cost"] = dict(self.cost)
        if self.device:
            out["device"] = dict(self.device)
        if self.names:
            out["names"] = dict(self.names)
        return out


def is_preflight(finding: Finding | Mapping[str, Any]) -> bool:
    """A pre-flight ``config_*`` finding (the recipe lint's), not a detector's finding about the training."""
    det = finding.get("detector") if isinstance(finding, Mapping) else getattr(finding, "detector", "")
    return str(det or "").startswith("config_")


@dataclass
class Report:
    runs: list[RunReport]
    # Paths inside an analysed folder that could not be read: (path, one-line reason).
    errors: list[tuple[str, str]] = field(default_factory=list)
    # Loose files beside the runs of a folder that looked like logs but did not read as one.
    skipped: list[tuple[str, str]] = field(default_factory=list)

    def acted_on(self, run: RunReport) -> bool:
        """A lineage's segment the monitor stopped to restart, whose next segment is in this report: its
        findings were acted on by that restart."""
        if run.status != "restarted" or run.segment is None:
            return False
        here = Path(run.source)
        root = here if run.segment == 1 else here.parent
        return any(o.segment == run.segment + 1 and Path(o.source).parent == root for o in self.runs)

    @property
    def lineage_verdict(self) -> str | None:
        """For a restarted lineage, its verdict as ``supervise`` and ``demo --auto-restart`` give it: the worst of the
        segments no restart acted on (``cured`` when that is healthy); None when no segment was acted on. The
        report's ``verdict`` and exit code still count every segment's findings, as the CLI contract says."""
        if not any(self.acted_on(r) for r in self.runs):
            return None
        rest = {r.verdict for r in self.runs if not self.acted_on(r)}
        worst = next((v for v in ("critical", "warning", "cannot_judge", "incomplete") if v in rest), "healthy")
        return "cured" if worst == "healthy" else worst

    @property
    def verdict(self) -> str:
        """The verdict over every run, worst first as the exit code ranks them: ``critical``, ``warning``,
        ``unreadable`` (a run found could not be read), ``cannot_judge``, ``incomplete``, ``healthy``;
        a single run's own verdict when one was analysed."""
        verdicts = {r.verdict for r in self.runs}
        for v in ("critical", "warning"):
            if v in verdicts:
                return v
        if self.errors or not self.runs:
            return "unreadable"
        for v in ("cannot_judge", "incomplete"):
            if v in verdicts:
                return v
        return "healthy"

    @property
    def exit_code(self) -> int:
        """1 when a run has a warning or critical finding; else 2 when a run could not be read;
        else 3 when a run could not be judged or is incomplete; else 0."""
        codes = {r.exit_code for r in self.runs}
        if ExitCode.FINDINGS in codes:
            return ExitCode.FINDINGS
        if self.errors:
            return ExitCode.BAD_INPUT
        if ExitCode.NOT_JUDGED in codes:
            return ExitCode.NOT_JUDGED
        return ExitCode.CLEAN

    def to_dict(self) -> dict[str, Any]:
        # A run of the folder that could not be read keeps the fixed shape, with its error.
        unreadable = [{"source": p, "steps": 0, "findings": [], "recommendations": [], "verdict": "unreadable", "error": e}
                      for p, e in self.errors]
        return {"runs": [r.to_dict() for r in self.runs] + unreadable}

def shown_recommendations(recs: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The records as a report shows them: a warning's advice that a later critical finding turned into a
    recommendation (of the same change, or of the same detector) is shown once, as the recommendation,
    with the step it was first advised at (``advised_at``): the text, Markdown, HTML and ``--json`` alike.

    >>> recs = [{"variant": "lower_learning_rate", "status": "advice", "detector": "sudden_collapse", "step": 27},
    ...         {"variant": "lower_learning_rate", "status": "recommended", "detector": "sudden_collapse", "step": 28},
    ...         {"variant": "dapo", "status": "advice", "detector": "entropy_collapse", "step": 28}]
    >>> [(r["variant"], r["status"], r.get("advised_at")) for r in shown_recommendations(recs)]
    [('lower_learning_rate', 'recommended', 27), ('dapo', 'advice', None)]
    """
    from grpo_monitor.core.recommend import ADVICE, CODE_CHANGE, RECOMMENDED

    confirmed = [r for r in recs if (r.get("status") or RECOMMENDED) == RECOMMENDED]
    switched = {r.get("variant") for r in confirmed} - {CODE_CHANGE}
    by = {r.get("detector") for r in confirmed}
    folded = [r for r in recs if r.get("status") == ADVICE and (r.get("variant") in switched or r.get("detector") in by)]
    out: list[Mapping[str, Any]] = []
    for r in recs:
        if any(r is f for f in folded):
            continue
        if r in confirmed:
            first = next((f for f in folded if f.get("variant") == r.get("variant") or f.get("detector") == r.get("detector")),
                         None)
            if first is not None:
                r = {**r, "advised_at": first.get("step")}
        out.append(r)
    return out


def needs_text(run: RunReport) -> str:
    """For a run nothing could judge: what it logged, what the monitor reads, how to map a column."""
    if not run.steps:
        return "no logged step: nothing to judge"
    found = ", ".join(run.metrics_found[:24]) + (f", … ({len(run.metrics_found)} in all)" if len(run.metrics_found) > 24 else "")
    hints = map_hints(run.metrics_found)
    example = " ".join(f"--map {c}={m}" for c, m in hints[:3]) or "--map COLUMN=reward --map COLUMN=length"
    return (f"found {found or 'no metric with a value'}; the detectors read {', '.join(KEY_INPUTS)}; "
            f"map the log's own names onto them: grpo-monitor analyze {run.file or run.source} {example}")


_KNOWN = frozenset({"reward", "reward_std", "entropy", "grad_norm", "loss", "learning_rate", "kl", "frac_reward_zero_std",
                    "epoch", "num_tokens", "ppo_kl", "step_time", "aux_loss"})


def map_hints(names: Sequence[str]) -> list[tuple[str, str]]:
    """Likely ``--map`` items for names the normaliser does not know.

    >>> map_hints(["step", "my_score", "len", "ent"])
    [('my_score', 'reward'), ('len', 'length'), ('ent', 'entropy')]
    """
    from grpo_monitor.core.metrics import normalize

    out = []
    for n in names:
        low = n.lower()
        if normalize(n) != n or n in _KNOWN or "/" in n and low.split("/")[0] in ("rewards", "completions", "sampling", "mismatch", "moe"):
            continue
        if any(x in low for x in ("val", "test", "eval", "time", "lr", "learning_rate", "std", "min", "max", "step")):
            continue
        words = [w for w in re.split(r"[^a-z]+", low) if w]
        if "entropy" in low or any(w in ("ent", "ents", "h") for w in words):  # short forms a hand-written logger uses
            out.append((n, "entropy"))
        elif "clip" in low or "trunc" in low:
            out.append((n, "clipped_ratio"))
        elif "correct" in low or "acc" in low or "exact" in low:
            out.append((n, "correctness"))
        elif "reward" in low or "score" in low or "return" in low:
            out.append((n, "reward"))
        elif "len" in low or "token" in low:
            out.append((n, "length"))
    return out
