"""Team rules: one declarative file (JSON, YAML or TOML), each rule a detector with the fixed finding fields,
through ``analyze`` (and its CLI's one-line refusals); the README's example is the one tested here."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from grpo_monitor.analysis.analyze import AnalyzeOptions, analyze
from grpo_monitor.core.rules import load_rules
from grpo_monitor.detectors.base import Finding
from tests.conftest import ROOT, SHARED

RULES = [
    {"id": "reward_floor", "metric": "reward", "below": 0.2, "for_steps": 10, "severity": "critical",
     "message": "Below the bar.", "advice": "roll back"},
    {"id": "length_creep", "metric": "response_length/mean", "rise": 0.5, "baseline_steps": 20},
]
YAML = """rules:
  - id: reward_floor
    metric: reward
    below: 0.2
    for_steps: 10
    severity: critical
    message: Below the bar.
    advice: roll back
  - id: length_creep
    metric: response_length/mean   # verl's name: normalised like every reader's
    rise: 0.5
    baseline_steps: 20
"""
TOML = """[[rules]]
id = "reward_floor"
metric = "reward"
below = 0.2
for_steps = 10
severity = "critical"
message = "Below the bar."
advice = "roll back"

[[rules]]
id = "length_creep"
metric = "response_length/mean"
rise = 0.5
baseline_steps = 20
"""
SUNSHINE = SHARED / "real-runs" / "sunshine_grpo_rho1.00_qwen2.5-7b.trainer_state.json"


def test_json_yaml_and_toml_give_the_same_rules(tmp_path):
    (tmp_path / "r.json").write_text(json.dumps({"rules": RULES}))
    (tmp_path / "r.yaml").write_text(YAML)
    (tmp_path / "r.toml").write_text(TOML)
    built = [[r.to_dict() for r in load_rules(str(tmp_path / f"r.{ext}"))] for ext in ("json", "yaml", "toml")]
    assert built[0] == built[1] == built[2]
    assert built[0][1]["metric"] == "completions/mean_length"


@pytest.mark.skipif(not SUNSHINE.is_file(), reason="../shared/real-runs is not here")
def test_rules_raise_findings_with_the_fixed_fields_on_a_real_run(tmp_path):
    (tmp_path / "r.yaml").write_text(YAML)
    run = analyze(SUNSHINE, AnalyzeOptions(rules=str(tmp_path / "r.yaml"))).runs[0]
    floor = [f for f in run.findings if f.detector == "reward_floor"]
    # The reward falls to ~0 around step 45 and again from ~155 (logged every 5 steps).
    assert [f.severity for f in floor] == ["critical", "critical"]
    f = floor[0]
    assert Finding.from_dict(f.to_dict()) == f and f.variant is None and f.config_overrides == {}
    assert f.evidence["rule"] == {"metric": "reward", "below": 0.2, "for_steps": 10}
    assert f.evidence["advice"] == "roll back" and "cost" in f.evidence and f.message.endswith("Below the bar.")
    assert f.step - f.onset_step >= 5
    assert any(r["detector"] == "reward_floor" for r in run.recommendations)  # its advice, like a detector's
    creep = [f for f in run.findings if f.detector == "length_creep"]
    assert creep and creep[0].evidence["baseline"] > 0
    # A rule is a check of the team's: it flags, it does not make a run count as judged.
    assert "reward_floor" not in run.judged_by


@pytest.mark.parametrize(("rules", "says"), [
    ([{"id": "x1", "metric": "reward"}], "give exactly one of below, above, drop, rise"),
    ([{"id": "no_learning_signal", "metric": "reward", "below": 1}], "built-in detector"),
    ([{"id": "a_rule", "metric": "reward", "below": 1, "for": 3}], "unknown key 'for'"),
    ([{"id": "a_rule", "metric": "reward", "drop": 1.5}], "0 < drop < 1"),
    ([{"id": "a_rule", "metric": "reward", "below": 1, "severity": "fatal"}], "severity must be"),
    ([{"id": "Bad Id", "metric": "reward", "below": 1}], "lowercase"),
    ([{"id": "twice", "metric": "reward", "below": 1}, {"id": "twice", "metric": "kl", "above": 1}], "used twice"),
    ({"rule": []}, "unknown top-level key"),
])
def test_a_rule_that_cannot_be_used_is_refused_in_one_line(tmp_path, rules, says):
    path = tmp_path / "rules.json"
    path.write_text(json.dumps(rules))
    with pytest.raises(ValueError, match=re.escape(says)):
        load_rules(str(path))


@pytest.mark.skipif(not SUNSHINE.is_file(), reason="../shared/real-runs is not here")
def test_the_cli_refuses_a_broken_rule_file_with_one_line_and_exit_2(tmp_path):
    path = tmp_path / "rules.yaml"
    path.write_text("rules:\n  - id: r1\n    metric: reward\n    below: [oops\n")
    done = subprocess.run([sys.executable, "-m", "grpo_monitor", "analyze", str(SUNSHINE), "--rules", str(path)],
                          capture_output=True, text=True, cwd=ROOT, check=False)
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and "not valid YAML" in lines[0], done.stderr


@pytest.mark.skipif(not SUNSHINE.is_file(), reason="../shared/real-runs is not here")
def test_the_readme_example_is_a_working_rule_file(tmp_path):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = readme.split("<!-- rules-example -->", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "team-rules.yaml"
    path.write_text(block)
    rules = load_rules(str(path))
    assert len(rules) >= 2
    done = subprocess.run([sys.executable, "-m", "grpo_monitor", "analyze", str(SUNSHINE), "--rules", str(path), "--json"],
                          capture_output=True, text=True, cwd=ROOT, check=False)
    found = {f["detector"] for f in json.loads(done.stdout)["runs"][0]["findings"]}
    assert {r.id for r in rules} & found


@pytest.mark.skipif(not SUNSHINE.is_file(), reason="../shared/real-runs is not here")
def test_a_rule_on_a_metric_the_run_never_logs_is_said_and_a_rules_advice_is_the_teams(tmp_path):
    from grpo_monitor.analysis.render import render_markdown, render_text
    from grpo_monitor.core.recommend import title

    (tmp_path / "r.yaml").write_text(YAML + "  - id: eval_accuracy_floor\n    metric: eval_accuracy\n    below: 0.55\n")
    report = analyze(SUNSHINE, AnalyzeOptions(rules=str(tmp_path / "r.yaml")))
    [run] = report.runs
    assert set(run.rules_not_checked) == {"eval_accuracy_floor"} and "eval_accuracy" in run.rules_not_checked["eval_accuracy_floor"]
    assert run.to_dict()["rules_not_checked"] == run.rules_not_checked
    assert "could not check team rule eval_accuracy_floor" in render_text(report)
    assert "could not check team rule `eval_accuracy_floor`" in render_markdown(report)
    rec = next(r for r in run.recommendations if r["detector"] == "reward_floor")
    assert "follow the team rule's advice" in title(rec) and "change the code" not in title(rec)
    assert "roll back" in render_text(report)
