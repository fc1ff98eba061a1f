"""Every public run in ``../shared/real-runs`` (all folders, the notebooks included) through ``analyze``: what was
read and judged, every warning or critical finding with the reason the run's own curves justify it, the
labelled runs against their labels, and the figures on the two halves of the set: the runs whose curves
shaped a detector rule while it was calibrated (``TUNED``) and the runs nobody looked at beyond their verdict
line (the rest). A rule tuned to one file shows up as a gap between the halves.

An alarm without a written judgement is listed as UNREVIEWED: a change that raises a new alarm on a public run
cannot pass unnoticed.

    python benchmarks/real_runs.py [--no-write]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from grpo_monitor.fixtures.judge import judge as one_judge  # noqa: E402
from benchmarks.results import stamp, update_section  # noqa: E402
from grpo_monitor.analysis.analyze import analyze  # noqa: E402

REAL = Path(os.environ.get("GRPO_MONITOR_SHARED") or ROOT.parent / "shared") / "real-runs"
ALARM = ("warning", "critical")

# Runs whose curves were read while a detector rule was calibrated on them (their alarms, then their curves).
# Notebooks that are copies of one another (the same training cell, re-run) stay on one side together.
TUNED = {
    "unslothai_4bb753d5_HuggingFace_Course-Mistral_v0.3__7B__GRPO",
    "unslothai_8081c7e4_AMD-Advanced_Llama3_1__3B__GRPO_LoRA",
    "unslothai_155332fb_AMD-Gemma4__E2B__GRPO",
    "unslothai_8081c7e4_AMD-Qwen3_VL__8B_-Vision-GRPO",
    "unslothai_8081c7e4_AMD-Qwen3_5__4B__Vision_GRPO",
    "unslothai_025d39ea_gpt-oss-_20B_-GRPO",
    "unslothai_5640e3ba_AMD-gpt_oss__20B__Reinforcement_Learning_2048_Game",
    "unslothai_a8e47adc_gpt_oss__20B__Reinforcement_Learning_2048_Game",
    "unslothai_8081c7e4_AMD-Llama_FP8_GRPO",
    "unslothai_8e1a4b58_OpenEnv_gpt_oss__20B__Reinforcement_Learning_2048_Game",
    "unslothai_f1a28026_OpenEnv_gpt_oss__20B__Reinforcement_Learning_2048_Game",
    "Rusheel86_chaos-economy-llama32",
    "AmitChowdary122_cybersoc-qwen25-1p5b",
    "shamanez_exp27-damped-ef-qa6sll3h",
    "sunshine_grpo_rho1.00_qwen2.5-7b",
    "dumbkin31_verl_grpo_qwen3-1.7b",
    "koivualeksi_sanitizer-qwen25-0p5b",
    "Coicozoi_minimind-grpo-r1-gsm8k",
    "HarleyCoops_dakota_qwen3_06b_primerl_orchestrator",
    "HarleyCoops_dakota_qwen3_06b_primerl_trainer",
}

# Why each alarm stands, from the run's own curves: (run stem, detector) -> judgement.
JUDGEMENTS: dict[tuple[str, str], str] = {
    ("sunshine_grpo_rho1.00_qwen2.5-7b", "degenerate_long_cot"):
        "labelled: entropy 5.4x its level with completions pinned at the 512 cap and reward 0 from ~140; the "
        "short episode at 40-50 is the same signature, and it recovers",
    ("dumbkin31_verl_grpo_qwen3-1.7b", "length_reward_coupling"):
        "labelled: length 870 -> 2600 tokens while the training reward stalls and validation falls",
    ("koivualeksi_sanitizer-qwen25-0p5b", "no_learning_signal"):
        "labelled: every completion cut at the cap from step 20, every group scored alike",
    ("Coicozoi_minimind-grpo-r1-gsm8k", "reward_component_divergence"):
        "labelled: the format reward sits at 1.0 from step 1 while correctness never leaves ~0 for 500 steps",
    ("HarleyCoops_dakota_qwen3_06b_primerl_orchestrator", "reward_component_divergence"):
        "labelled: affix_reward at ~0.96 from step 0 and char_overlap climbing while exact_match is exactly 0 "
        "at every one of 1000 steps",
    ("HarleyCoops_dakota_qwen3_06b_primerl_trainer", "rollout_mismatch"):
        "labelled: the trainer-inference log-prob gap grows for tens of steps before the failure",
    ("Rusheel86_chaos-economy-llama32", "degenerate_long_cot"):
        "labelled: clipped share 0.77 -> 0.98, length to the 512 cap, the task reward 0.37 -> -0.10",
    ("Rusheel86_chaos-economy-llama32", "truncation"):
        "warning only: 70-85% of completions are cut at 512 from step 5, which the label's note records; the cap "
        "costs this run before it degenerates (not in the label's list: a defensible extra alarm)",
    ("unslothai_5640e3ba_AMD-gpt_oss__20B__Reinforcement_Learning_2048_Game", "truncation"):
        "warning only: half the completions of each step hit the cap (the largest logged length) from step 1; "
        "two completions a step, so never critical without a measured harm",
    ("unslothai_a8e47adc_gpt_oss__20B__Reinforcement_Learning_2048_Game", "truncation"):
        "warning only: the same training cell as the 5640e3ba gpt-oss run, half the completions at the cap from step 1",
    ("unslothai_8081c7e4_AMD-Llama_FP8_GRPO", "truncation"):
        "warning only: 75% of completions cut at the cap from step 1 with four completions a step",
    ("unslothai_155332fb_AMD-Gemma4__E2B__GRPO", "truncation"):
        "warning only: half or more of each step's completions end at 718 tokens (the longest logged) from step 2",
    ("sunshine_grpo_rho1.00_qwen2.5-7b", "no_learning_signal"):
        "warning only: frac_reward_zero_std 0.7-1.0 at every logged point from 70 to 115 while the reward sits at "
        "0.75-0.95, its best range; no correctness is logged to call it solved",
    ("HarleyCoops_dakota_qwen3_06b_primerl_orchestrator", "reward_function_bug"):
        "exact_match_reward is exactly 0.0 at all 1000 steps of 32x8 completions while the shaping rewards rise: "
        "a correctness that never pays (the label's note says so; its expected finding is the divergence)",
    ("unslothai_498c5211_Ministral_3__3B__Reinforcement_Learning_Sudoku_Game", "no_learning_signal"):
        "warning only: reward_std is 0 at 150 of 200 points (one prompt, four completions a step); from ~87 the "
        "groups agree at reward 7.4-8.6, the run's best range: the strategy has converged",
    ("unslothai_4bb753d5_HuggingFace_Course-Mistral_v0.3__7B__GRPO", "reward_function_bug"):
        "warning only: soft_format and strict_format are exactly 0.0 at all 250 points while xmlcount, int and "
        "correctness vary: the notebook's format regexes never match (a real bug in those functions)",
    ("unslothai_8081c7e4_AMD-Llama3.1__8B_-GRPO", "reward_function_bug"):
        "warning only: the same reward functions as the Mistral course notebook, soft/strict format exactly 0.0 at "
        "all 250 points; raised at 24, before the correctness had shown it carries the learning",
    ("unslothai_8081c7e4_AMD-Qwen3_5__4B__Vision_GRPO", "no_learning_signal"):
        "warning only: num_generations=2 with one prompt a step: reward_std 0 at 40 of 60 points, the correctness "
        "pays on 5 of 60",
    ("unslothai_8081c7e4_AMD-Qwen3_VL__8B_-Vision-GRPO", "no_learning_signal"):
        "num_generations=2 with one prompt a step: reward_std 0 at 55 of 60 points (both completions alike), the "
        "correctness pays on 5 of 60; the config check warns of the two generations before training",
}


def files() -> list[Path]:
    out = []
    for folder in (REAL, REAL / "wild", REAL / "notebooks"):
        out += sorted(p for p in folder.iterdir() if p.is_file() and p.name not in ("labels.json", "SOURCES.md"))
    return out


def stem(p: Path) -> str:
    name = p.name
    for suffix in (".trainer_state.json", ".ipynb", ".jsonl", ".json", ".csv", ".log"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def labels() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for path in (REAL / "labels.json", REAL / "wild" / "labels.json"):
        if path.exists():
            out.update(json.loads(path.read_text()))
    return out


def judge(lab: dict[str, Any] | None, alarms: list[Any]) -> dict[str, Any]:
    """A labelled run against its label, by the one judge (``fixtures.judge``, ``evaluate.py``'s semantics)."""
    if lab is None:
        return {"label": "unlabelled"}
    v = one_judge(lab, alarms)
    if not v.positive:
        return {"label": "healthy", "false_alarm": v.kind == "false", "unexpected": v.raised}
    return {"label": "failure", "detected": v.kind == "hit", "in_time": v.kind == "hit" and v.in_time,
            "variant_ok": v.kind == "hit" and v.variant_ok, "unexpected": v.others,
            "first": (None if v.kind != "hit" else v.step)}


def survey() -> list[dict[str, Any]]:
    labs = labels()
    rows = []
    for path in files():
        s = stem(path)
        row: dict[str, Any] = {"run": s, "folder": path.parent.name, "half": "tuned" if s in TUNED else "held out"}
        try:
            report = analyze(path)
        except Exception as exc:  # a file the readers refuse: the one line they say
            row.update(read=False, error=str(exc).splitlines()[0])
            rows.append(row)
            continue
        run = report.runs[0]
        alarms = [f for r in report.runs for f in r.training_findings if f.severity in ALARM]
        row.update(read=True, format=run.format, steps=run.steps, verdict=report.verdict,
                   judged_by=sorted({d for r in report.runs for d in r.judged_by}),
                   not_judged=run.not_judged if not run.judged_by else {},
                   alarms=[(f.detector, f.severity, f.step, f.message) for f in alarms],
                   **judge(labs.get(s), alarms))
        rows.append(row)
    return rows


def figures(rows: list[dict[str, Any]]) -> dict[str, Any]:
    read = [r for r in rows if r.get("read")]
    fail = [r for r in read if r.get("label") == "failure"]
    quiet = [r for r in read if r.get("label") in ("healthy", "unlabelled")]
    return {
        "files": len(rows), "read": len(read), "judged": sum(bool(r["judged_by"]) for r in read),
        "failure": len(fail), "detected_in_time": sum(r["in_time"] for r in fail),
        "variant_ok": sum(r["variant_ok"] for r in fail),
        "unexpected": sum(bool(r["unexpected"]) for r in fail),
        "healthy": sum(r.get("label") == "healthy" for r in read),
        "healthy_alarmed": sum(r.get("label") == "healthy" and bool(r.get("false_alarm")) for r in read),
        "unlabelled": sum(r.get("label") == "unlabelled" for r in read),
        "unlabelled_alarmed": sum(r.get("label") == "unlabelled" and bool(r["alarms"]) for r in read),
        "quiet_critical": sum(any(a[1] == "critical" for a in r["alarms"]) for r in quiet),
    }


def render(rows: list[dict[str, Any]], seconds: float) -> str:
    halves = {h: figures([r for r in rows if r["half"] == h]) for h in ("tuned", "held out")}
    halves["all"] = figures(rows)
    lines = [
        "## Public runs: read, judged, every alarm audited (`benchmarks/real_runs.py`)", "", stamp(), "",
        f"Every file under `real-runs/` (top level, `wild/`, `notebooks/`) through `grpo_monitor.analyze`, {seconds:.0f} s. "
        "Tuned: the runs whose curves shaped a detector rule while it was calibrated; held out: the runs seen only as "
        "their verdict line.", "",
        "| | tuned | held out | all |", "|---|---|---|---|",
    ]
    def cell(key: str, of: str | None = None) -> list[str]:
        return [f"{halves[h][key]}" + (f"/{halves[h][of]}" if of else "") for h in ("tuned", "held out", "all")]
    for title, key, of in (("files read", "read", "files"), ("judged by at least one failure detector", "judged", "read"),
                           ("labelled failures found in time", "detected_in_time", "failure"),
                           ("... with the labelled variant", "variant_ok", "failure"),
                           ("... with an alarm outside the label", "unexpected", "failure"),
                           ("labelled healthy runs with any warning/critical", "healthy_alarmed", "healthy"),
                           ("unlabelled runs with any warning/critical", "unlabelled_alarmed", "unlabelled"),
                           ("healthy or unlabelled runs with a critical", "quiet_critical", None)):
        lines.append(f"| {title} | " + " | ".join(cell(key, of)) + " |")
    lines += ["", "Every warning or critical any public run raises, and why its curves justify it:", "",
              "| run | half | label | detector | severity | step | why |", "|---|---|---|---|---|---|---|"]
    unreviewed = 0
    for r in rows:
        seen: set[tuple[str, str]] = set()
        for det, sev, step, _msg in r.get("alarms") or []:
            if (det, sev) in seen:
                continue  # one line per detector and severity: the first
            seen.add((det, sev))
            why = JUDGEMENTS.get((r["run"], det))
            if why is None:
                unreviewed += 1
                why = "UNREVIEWED"
            lines.append(f"| {r['run'][:60]} | {r['half']} | {r.get('label')} | `{det}` | {sev} | {step} | {why} |")
    lines += ["", f"Unreviewed alarms: {unreviewed}.", "",
              "| run | half | format | steps | verdict | judged by | label |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        if not r.get("read"):
            lines.append(f"| {r['run'][:60]} | {r['half']} | — | — | unreadable: {r['error'][:120]} | — | — |")
            continue
        judged = str(len(r["judged_by"])) if r["judged_by"] else "none: " + "; ".join(f"{k} {v}" for k, v in list(r["not_judged"].items())[:2])
        label = r.get("label")
        if label == "failure":
            label = "failure: " + ("found in time" if r["in_time"] else "found late" if r["detected"] else "MISSED")
        lines.append(f"| {r['run'][:60]} | {r['half']} | {r['format']} | {r['steps']} | {r['verdict']} | {judged} | {label} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = ap.parse_args()
    if not REAL.exists():
        raise SystemExit(f"{REAL}: no public runs here (../shared beside the checkout, or GRPO_MONITOR_SHARED)")
    t0 = time.perf_counter()
    rows = survey()
    body = render(rows, time.perf_counter() - t0)
    print(body)
    if not args.no_write:
        update_section("real_runs", body)


if __name__ == "__main__":
    main()
