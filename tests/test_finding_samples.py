"""The samples behind a finding: picked per kind from the run log's kept samples, referenced by (step, index),
shown by ``analyze --json``, the HTML report and the dashboard's finding view; the retention policy keeps the
completions the picks need without keeping more."""

from __future__ import annotations

import html
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_monitor import analyze
from grpo_monitor.callbacks.reward_tap import SampleRetention
from grpo_monitor.core.finding_samples import (
    DEFAULT, EXCERPT_CHARS, SELECTIONS, STEPS, notable, pick_samples, selection_of, zero_variance_groups,
)
from grpo_monitor.core.runlog_writer import RunWriter
from grpo_monitor.core.sample_index import SampleIndex, StepSamples
from grpo_monitor.detectors import DETECTOR_IDS
from grpo_monitor.detectors.base import Finding
from grpo_monitor.detectors.signals import sample_reward
from grpo_monitor.fixtures.synthetic import generate


def write_run(run_dir: Path, case: str, findings: list[dict] | None = None, mark: str = "") -> Path:
    """A labelled synthetic run as the callback writes its directory: each step's samples, then the step, then
    the findings raised at it; ``mark`` starts every kept text (to follow it into a report)."""
    run = generate(case, seed=0)
    w = RunWriter(run_dir)
    w.header(run_id=case, start_time=0.0,
             config={"max_steps": run.steps[-1][0], "logging_steps": 1, "num_generations": 8, **run.context.config},
             model={"class": "Qwen3ForCausalLM", "is_moe": False}, world_size=1, parent_run=None,
             reward_funcs=run.context.reward_names, correctness_reward=run.context.correctness_reward,
             format_reward=run.context.format_reward, resumed_from_step=0)
    for step, metrics in run.steps:
        if step in run.samples:
            w.samples([dict(r, completion=mark + r["completion"]) if mark else r for r in run.samples[step]])
        w.step(step, metrics, float(step))
        for f in findings or ():
            if f["step"] == step:
                w.write({"type": "finding", **f})
    w.write({"type": "summary", "step": run.steps[-1][0], "metrics": {"train_runtime": 1.0}})
    w.close()
    return run_dir


def step_samples(run_dir: Path) -> StepSamples:
    index = SampleIndex(run_dir)
    index.scan(final=True)
    return StepSamples(index)


def kept_at(samples: StepSamples, step: int) -> list[dict]:
    return [r for r in samples[step] if isinstance(r.get("completion"), str)]


def analysed(tmp_path: Path, case: str):
    run_dir = write_run(tmp_path / case, case)
    return run_dir, analyze(run_dir).runs[0]


def picks_of(run, detector: str) -> list[tuple[Finding, list[dict]]]:
    out = [(f, run.samples_of(i)) for i, f in enumerate(run.findings) if f.detector == detector]
    assert out, f"the {detector} case raised no {detector} finding: {[f.detector for f in run.findings]}"
    return out


# -- every kind -------------------------------------------------------------------------------------


def test_every_finding_kind_picks_kept_samples_near_its_anchor(tmp_path):
    assert set(SELECTIONS) <= set(DETECTOR_IDS), "a selection names a detector that does not exist"
    run_dir = write_run(tmp_path / "run", "degenerate_long_cot")
    samples = step_samples(run_dir)
    steps = sorted(samples)
    # Every detector, a team rule and a pre-flight finding: the table's kinds and the default's.
    kinds = list(DETECTOR_IDS) + ["reward_floor_rule", "config_num_generations"]
    for kind in kinds:
        sel = selection_of(kind)
        assert sel is SELECTIONS.get(kind, DEFAULT)
        f = Finding(kind, "warning", 166, 150, None, {}, {}, "")
        picks = pick_samples(f, steps, samples.__getitem__)
        assert 0 < len(picks) <= 4, kind
        # Where no kept completion shows the kind's property, the default's picks (around the onset) stand in.
        used = sel if picks[0]["why"] == sel.why else DEFAULT
        assert all(p["why"] == used.why for p in picks), kind
        anchor = f.onset_step if used.anchor == "onset" else f.step
        for p in picks:
            assert p["step"] <= f.step, kind  # nothing the finding had not seen
            assert abs(p["step"] - anchor) < STEPS, (kind, p)
            row = next(r for r in samples[p["step"]] if r["index"] == p["index"])
            assert isinstance(row.get("completion"), str)  # a kept one: it has its text
            assert p["reward"] == sample_reward(row) and p["length"] == row["length"]
            assert p["truncated"] is row["truncated"]
            assert p["excerpt"] and len(p["excerpt"]) <= EXCERPT_CHARS
    # A finding before any sample, and the pre-flight's step 0, point at nothing.
    assert pick_samples(Finding("config_x", "warning", 0, None, None, {}, {}, ""), steps, samples.__getitem__) == []


# -- each kind shows its property --------------------------------------------------------------------


def test_no_learning_signal_points_at_groups_scored_all_alike(tmp_path):
    run_dir, run = analysed(tmp_path, "no_learning_signal")
    samples = step_samples(run_dir)
    for f, picks in picks_of(run, "no_learning_signal"):
        assert picks and all(p["why"] == SELECTIONS["no_learning_signal"].why for p in picks)
        for p in picks:
            group = [sample_reward(r) for r in samples[p["step"]] if r["group"] == p["group"]]
            assert len(group) > 1 and set(group) == {p["reward"]}, p  # the whole group, not only the kept
            assert p["group"] in zero_variance_groups(samples[p["step"]])
        # The tie itself: two completions of one prompt, side by side.
        assert max(sum(1 for q in picks if (q["step"], q["group"]) == (p["step"], p["group"])) for p in picks) >= 2


def test_degenerate_long_cot_points_at_the_longest(tmp_path):
    run_dir, run = analysed(tmp_path, "degenerate_long_cot")
    samples = step_samples(run_dir)
    for f, picks in picks_of(run, "degenerate_long_cot"):
        top = picks[0]
        assert top["length"] == max(r["length"] for r in kept_at(samples, top["step"]))
        looked = {p["step"] for p in picks}
        assert top["length"] == max(r["length"] for s in looked for r in kept_at(samples, s))
        assert [p["length"] for p in picks] == sorted((p["length"] for p in picks), reverse=True)
        assert picks[0]["excerpt"].startswith("…")  # a long one's end, where it loops or is cut


def test_truncation_points_at_cut_completions(tmp_path):
    run_dir, run = analysed(tmp_path, "truncation_creeping_format")
    samples = step_samples(run_dir)
    for f, picks in picks_of(run, "truncation"):
        assert picks and all(p["truncated"] for p in picks)
        for p in picks:
            assert next(r for r in samples[p["step"]] if r["index"] == p["index"])["truncated"] is True


def test_length_reward_coupling_points_at_the_best_rewarded_longest(tmp_path):
    run_dir, run = analysed(tmp_path, "length_coupling")
    samples = step_samples(run_dir)
    for f, picks in picks_of(run, "length_reward_coupling"):
        top = picks[0]
        best = max(sample_reward(r) for r in kept_at(samples, top["step"]))
        assert top["reward"] == best
        assert top["length"] == max(r["length"] for r in kept_at(samples, top["step"]) if sample_reward(r) == best)


def test_entropy_collapse_points_around_the_onset(tmp_path):
    _, run = analysed(tmp_path, "entropy_collapse")
    for f, picks in picks_of(run, "entropy_collapse"):
        assert f.onset_step is not None and f.step - f.onset_step > STEPS  # the onset is not the step raised
        assert picks and all(abs(p["step"] - f.onset_step) < STEPS for p in picks)
        per_step: dict[int, list[float]] = {}
        for p in picks:
            per_step.setdefault(p["step"], []).append(p["reward"])
        assert any(len(set(r)) == 2 for r in per_step.values())  # a step's lowest and highest


# -- the reports ------------------------------------------------------------------------------------


def cli(*args):
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, "-m", "grpo_monitor", "analyze", *map(str, args)], capture_output=True,
                          text=True, env=env)


def test_json_and_html_carry_each_findings_samples(tmp_path):
    run_dir = write_run(tmp_path / "run", "degenerate_long_cot", mark="<b>&loop</b> ")
    out = cli(run_dir, "--json")
    doc = json.loads(out.stdout)
    findings = doc["runs"][0]["findings"]
    flagged = [f for f in findings if f["detector"] == "degenerate_long_cot"]
    assert flagged
    for f in findings:
        for p in f["samples"]:
            assert set(p) >= {"step", "index", "reward", "length", "truncated", "excerpt"}
            assert len(p["excerpt"]) <= EXCERPT_CHARS and p["step"] <= f["step"]
    # the excerpt of a long one is its end; its start (the mark) shows in the default's picks
    assert all(p["excerpt"].startswith("…") for p in flagged[0]["samples"])
    report = tmp_path / "report.html"
    done = cli(run_dir, "--html", report)
    assert done.returncode in (0, 1), done.stderr
    page = report.read_text()
    assert page.count('<details class="samples">') == sum(1 for f in findings if f["samples"])
    assert "<details open" not in page  # collapsed
    first = flagged[0]["samples"][0]
    assert html.escape(first["excerpt"]) in page
    spread = next(f for f in findings if f["samples"] and not f["samples"][0]["excerpt"].startswith("…"))
    assert "&lt;b&gt;&amp;loop&lt;/b&gt;" in page and "<b>&loop</b>" not in page, spread["detector"]


def test_a_log_without_samples_leaves_findings_as_they_were(tmp_path):
    path = tmp_path / "export.csv"
    path.write_text("step,reward,entropy\n" + "".join(f"{s},{0.5},{0.6}\n" for s in range(1, 40)))
    doc = json.loads(cli(path, "--json").stdout)
    assert all("samples" not in f for f in doc["runs"][0]["findings"])


# -- the retention policy -----------------------------------------------------------------------------


def big_batch(n_groups: int = 64) -> list[dict]:
    """A step of 512 completions from the synthetic runs' groups, renumbered, with one planted group scored
    all alike, one looping completion and one that is the longest."""
    run = generate("degenerate_long_cot", seed=0)
    rows = [r for s in sorted(run.samples)[:n_groups // 4] for r in run.samples[s]]
    rows = [dict(r, index=i, group=i // 8, rank=0, rewards={"r": float(i % 3)}, tail_rep=0.0) for i, r in enumerate(rows)]
    for r in rows[80:88]:
        r["rewards"] = {"r": 1.0}
    rows[301]["tail_rep"] = 0.9
    rows[402]["length"] = 10_000
    return rows


def test_retention_keeps_the_completions_findings_point_at_within_the_same_bound():
    rows = big_batch()
    policy = SampleRetention()
    for step in range(1, 6):
        keep = policy.select(rows, step)
        # No more than before: the fair draw, best and worst of each drawn group, the truncated.
        assert len(keep) <= policy.fair + 2 * policy.groups + policy.truncated
        assert {(0, 402), (0, 301)} <= keep  # the longest, the most repetitive
        assert len({(0, i) for i in range(80, 88)} & keep) >= 2  # two of the group scored all alike
    assert [rows[i]["index"] for i in notable(rows)[:3]] == [402, 301, 80]
    assert zero_variance_groups(rows) == [10]
    # The policy's other choices stand: a small step keeps all, "none" none, "all" all.
    assert policy.select(rows[:20], 1) == {(0, i) for i in range(20)}
    assert SampleRetention.of("none").select(rows, 1) == set()
    assert len(SampleRetention(fair=2, groups=0, truncated=0).select(rows, 1)) == 2


def test_a_tiny_training_run_keeps_the_completions_findings_point_at(tmp_path, quiet_monitor_logs):
    from conftest import train_tiny

    run_dir = tmp_path / "run"
    # Two text slots a step: a fair draw of 2 in 8 would miss the longest on most steps.
    train_tiny(run_dir, steps=3, attach_options={"sample_text": {"fair": 2, "groups": 0, "truncated": 0}})
    samples = step_samples(run_dir)
    assert len(samples) == 3
    for step in samples:
        rows = samples[step]
        kept = kept_at(samples, step)
        assert len(kept) == 2 < len(rows)
        longest = max(rows, key=lambda r: (r["length"], -r["index"]))
        assert longest in kept
        top = pick_samples(Finding("degenerate_long_cot", "warning", step, step, None, {}, {}, ""), [step],
                           samples.__getitem__)[0]
        assert (top["step"], top["index"], top["length"]) == (step, longest["index"], longest["length"])
        if zero_variance_groups(rows):
            picks = pick_samples(Finding("no_learning_signal", "warning", step, None, None, {}, {}, ""), [step],
                                 samples.__getitem__)
            assert picks and picks[0]["why"] == SELECTIONS["no_learning_signal"].why
            assert len({p["reward"] for p in picks}) == 1


# -- the dashboard ------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_the_dashboards_finding_view_shows_the_samples(tmp_path):
    pytest.importorskip("textual")
    from textual.widgets import DataTable, Static

    from grpo_monitor.app.dashboard import WatchApp

    # The findings a live run would have written beside its steps: those the replay raises.
    found = analyze(write_run(tmp_path / "replayed", "degenerate_long_cot")).runs[0]
    records = [f.to_dict() for f in found.findings]
    run_dir = write_run(tmp_path / "run", "degenerate_long_cot", findings=records)
    target = next(i for i, f in enumerate(records) if f["detector"] == "degenerate_long_cot")
    expected = found.samples_of(target)
    app = WatchApp(run_dir, poll_interval=0.05)
    async with app.run_test(size=(160, 60)) as pilot:
        for _ in range(400):
            if app.caught_up.is_set():
                break
            await pilot.pause(0.05)
        assert app.caught_up.is_set()
        await pilot.press("2")
        await pilot.pause()
        table = app.screen.query_one("#findings", DataTable)
        assert table.row_count == len(records)
        table.move_cursor(row=target)
        await pilot.pause()
        shown = app.screen.query_one("#finding-detail", Static).visual.plain
    assert "degenerate_long_cot" in shown and f"samples ({SELECTIONS['degenerate_long_cot'].why})" in shown
    for p in expected:
        assert f"step {p['step']} #{p['index']}" in shown
        assert p["excerpt"] in shown
