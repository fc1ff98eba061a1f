"""Offline analysis: honest verdicts, column mapping, whole run directories and folders of runs.

Run directories here are real files written by ``RunWriter`` from labelled synthetic runs; the
command line is run as a real subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import grpo_monitor as monitor
from grpo_monitor.fixtures.synthetic import generate
from grpo_monitor.analysis.analyze import analyze
from grpo_monitor.analysis.discovery import discover_runs
from grpo_monitor.analysis.prepare import parse_mapping
from grpo_monitor.core.runlog_writer import RunWriter
from grpo_monitor.core.runlog import read_run


def cli(*args):
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, "-m", "grpo_monitor", "analyze", *map(str, args)], capture_output=True, text=True,
                          env=env)


def write_run(run_dir: Path, case: str = "healthy_slow", *, steps: int | None = None, summary: bool = True,
              run_id: str = "run-a", findings: list[dict] | None = None, resumed_from_step: int = 0,
              writer: RunWriter | None = None) -> Path:
    """A run directory of a labelled synthetic run, as the callback writes it."""
    run = generate(case, seed=1, with_samples=False)
    rows = run.steps if steps is None else run.steps[:steps]
    w = writer or RunWriter(run_dir)
    max_steps = run.steps[-1][0]
    w.header(run_id=run_id, start_time=time.time(), config={"max_steps": max_steps, "logging_steps": 1, "num_generations": 8,
                                                            **run.context.config},
             model={"class": "Qwen3ForCausalLM", "is_moe": False}, world_size=1, parent_run=None,
             reward_funcs=run.context.reward_names, correctness_reward=run.context.correctness_reward,
             format_reward=run.context.format_reward, resumed_from_step=resumed_from_step)
    for f in findings or []:
        w.write({"type": "finding", **f})
    for step, metrics in rows:
        w.step(step, metrics, time.time())
    if summary:
        w.write({"type": "summary", "step": rows[-1][0] if rows else 0, "metrics": {"train_runtime": 1.0}})
    if writer is None:
        w.close()
    return run_dir


CONFIG_FINDING = {"detector": "config_num_generations", "severity": "critical", "step": 0, "onset_step": None,
                  "variant": None, "config_overrides": {"num_generations": 8},
                  "evidence": {"num_generations": 2, "minimum": 8}, "message": "Only 2 completions per prompt."}


def test_csv_with_only_entropy_and_grad_norm_cannot_be_judged(tmp_path):
    path = tmp_path / "export.csv"
    path.write_text("step,entropy,grad_norm\n" + "".join(f"{s},{0.5 + 0.01 * (s % 3)},{0.3}\n" for s in range(1, 120)))
    out = cli(path)
    assert out.returncode == 3, out.stderr
    assert "HEALTHY" not in out.stdout and "CANNOT JUDGE" in out.stdout
    assert "found entropy, grad_norm" in out.stdout and "--map" in out.stdout
    doc = json.loads(cli(path, "--json").stdout)
    run = doc["runs"][0]
    assert run["verdict"] == "cannot_judge" and run["judged_by"] == []
    assert {"source", "steps", "findings", "recommendations"} <= set(run)
    assert "entropy_collapse" in run["not_judged"] and "needs" in run
    # The sanity checks that had their inputs say so, though they never make a run count as judged.
    assert "grad_norm_spike" in run["checked_by"] and "also checked: " in out.stdout
    assert "grad_norm_spike" in out.stdout.split("also checked: ")[1].splitlines()[0]


def test_unrecognised_csv_header_names_its_columns_and_map_makes_it_readable(tmp_path):
    path = tmp_path / "export.csv"
    rows = "".join(f"{s},{0.5 + 0.001 * (s % 5)},{100 + 2 * s},{s % 7}\n" for s in range(1, 200))
    path.write_text("step,alpha,beta,misc\n" + rows)
    out = cli(path)
    assert out.returncode == 3
    assert "alpha, beta, misc" in out.stdout and "--map COLUMN=reward" in out.stdout
    mapped = cli(path, "--map", "alpha=reward", "--map", "beta=length", "--json")
    run = json.loads(mapped.stdout)["runs"][0]
    assert "length_reward_coupling" in run["judged_by"] and run["verdict"] != "cannot_judge"
    assert mapped.returncode == (1 if run["verdict"] in ("warning", "critical") else 0)
    report = monitor.analyze(path, monitor.AnalyzeOptions(mapping={"alpha": "reward", "beta": "length"}))
    assert [f.detector for f in report.runs[0].findings] == [f["detector"] for f in run["findings"]]
    frame = monitor.load_run(path, mapping={"alpha": "reward"})
    assert "reward" in frame.columns and "alpha" not in frame.columns


def test_bad_map_item_is_one_line_and_exit_2(tmp_path):
    path = tmp_path / "export.csv"
    path.write_text("step,reward\n1,0.5\n2,0.6\n")
    out = cli(path, "--map", "reward")
    assert out.returncode == 2 and "COLUMN=METRIC" in out.stderr and "Traceback" not in out.stderr


def test_parse_mapping_short_targets():
    assert parse_mapping({"acc": "correctness", "x": "rewards/fmt"}) == {"acc": "rewards/correctness/mean",
                                                                           "x": "rewards/fmt/mean"}
    with pytest.raises(ValueError):
        parse_mapping(["=reward"])


def test_header_only_run_directory_is_not_healthy(tmp_path):
    run_dir = write_run(tmp_path / "run", steps=0, summary=False)
    out = cli(run_dir)
    assert out.returncode == 3 and "HEALTHY" not in out.stdout
    run = json.loads(cli(run_dir, "--json").stdout)["runs"][0]
    assert run["steps"] == 0 and run["verdict"] == "cannot_judge" and run["file"].endswith("run.jsonl")


def test_run_that_stopped_early_is_incomplete(tmp_path):
    # A reward function raised at step 7: no final summary, far from max_steps.
    run_dir = write_run(tmp_path / "run", steps=7, summary=False)
    out = cli(run_dir)
    assert out.returncode == 3 and "HEALTHY" not in out.stdout
    assert "stopped at step 7 of max_steps" in out.stdout


def test_long_run_that_stopped_early_is_incomplete_even_where_judged(tmp_path):
    run_dir = write_run(tmp_path / "run", steps=200, summary=False)
    report = analyze(run_dir)
    run = report.runs[0]
    assert run.judged_by and run.verdict == "incomplete" and report.exit_code == 3
    finished = analyze(write_run(tmp_path / "done")).runs[0]
    assert finished.verdict == "healthy" and finished.status is None


def test_a_config_finding_in_the_run_log_is_reported_offline_but_never_sets_the_verdict(tmp_path):
    run_dir = write_run(tmp_path / "run", findings=[CONFIG_FINDING])
    out = cli(run_dir, "--json")
    run = json.loads(out.stdout)["runs"][0]
    assert run["findings"][0]["detector"] == "config_num_generations" and run["findings"][0]["severity"] == "critical"
    # Advice on the recipe: the training's own detectors give the verdict, as for the run's other logs.
    assert run["verdict"] == "healthy" and out.returncode == 0
    text = cli(run_dir).stdout
    assert "pre-flight (the recipe, checked when training began; not part of the verdict):" in text


def test_one_run_has_one_verdict_whichever_of_its_logs_is_read(tmp_path):
    """num_generations=4 is a deviation from the recipe, not a broken run: its run directory, read by
    analyze, gets the verdict its checkpoint gets, and the fix reaches the recommendations."""
    from tests.conftest import train_tiny

    run_dir = tmp_path / "run"
    train_tiny(run_dir, steps=6, num_generations=4, save_strategy="steps", save_steps=6)
    live = read_run(run_dir)
    [pre] = [f for f in live.findings if f["detector"] == "config_num_generations"]
    assert pre["severity"] == "warning" and pre["config_overrides"] == {"num_generations": 8}
    checkpoint = run_dir / "trainer" / "checkpoint-6" / "trainer_state.json"
    assert checkpoint.is_file()
    by_dir, by_checkpoint = (json.loads(cli(p, "--json").stdout)["runs"][0] for p in (run_dir, checkpoint))
    assert by_dir["verdict"] == by_checkpoint["verdict"]
    assert cli(run_dir).returncode == cli(checkpoint).returncode
    [rec] = [r for r in by_dir["recommendations"] if r["detector"] == "config_num_generations"]
    assert rec["config_overrides"] == {"num_generations": 8} and rec["status"] == "advice"
    assert "--num_generations 8" in rec["cli_flags"]
    # The dashboard's Recommendations tab shows the records the run log holds: the same one is there.
    assert any(r.get("detector") == "config_num_generations" and r["config_overrides"] == {"num_generations": 8}
               for r in live.recommendations)


def test_analyze_returns_a_report_with_a_verdict(tmp_path):
    healthy = analyze(write_run(tmp_path / "ok"))
    assert healthy.verdict == "healthy" and healthy.exit_code == 0
    both = analyze([write_run(tmp_path / "ok2"), write_run(tmp_path / "bad", case="entropy_collapse")])
    assert both.verdict == "critical" == max((r.verdict for r in both.runs), key=["healthy", "critical"].index)


def test_second_run_written_into_the_same_run_directory_is_two_runs(tmp_path):
    run_dir = tmp_path / "run"
    w = RunWriter(run_dir)
    write_run(run_dir, steps=40, run_id="first", writer=w)
    write_run(run_dir, steps=30, run_id="second", writer=w)
    w.close()
    report = analyze(run_dir)
    assert [r.steps for r in report.runs] == [40, 30]
    assert "run 1 of 2" in report.runs[0].source and "second" in report.runs[1].source
    # A resume (header with resumed_from_step) continues the same run.
    resumed = tmp_path / "resumed"
    w = RunWriter(resumed)
    write_run(resumed, steps=40, run_id="first", writer=w, summary=False)
    write_run(resumed, steps=60, run_id="again", writer=w, resumed_from_step=40)
    w.close()
    assert [r.steps for r in analyze(resumed).runs] == [60]


def test_folder_of_run_directories_is_analysed_run_by_run(tmp_path):
    root = tmp_path / "runs"
    write_run(root / "a" / "grpo-monitor")
    write_run(root / "b" / "grpo-monitor", findings=[CONFIG_FINDING])
    write_run(root / "c", case="entropy_collapse")
    (root / "a" / "checkpoint-5").mkdir()
    (root / "a" / "checkpoint-5" / "trainer_state.json").write_text(json.dumps({"log_history": [{"step": 5, "loss": 0.1}]}))
    found = discover_runs(root)
    assert found == [root / "a" / "grpo-monitor", root / "b" / "grpo-monitor", root / "c"]
    out = cli(root)
    assert out.returncode == 1, out.stderr
    table = out.stdout.split("run ", 1)[-1]
    for name in ("a/grpo-monitor", "b/grpo-monitor", "c"):
        assert str(root / name) in out.stdout
    assert "verdict" in table and "critical" in table
    doc = json.loads(cli(root, "--json").stdout)
    assert len(doc["runs"]) == 3 and all(r["file"].endswith("run.jsonl") for r in doc["runs"])
    # A Trainer output_dir: its own grpo-monitor run directory speaks for it.
    assert discover_runs(root / "a") == [root / "a" / "grpo-monitor"]


def test_folder_with_an_unreadable_run_reports_the_others(tmp_path):
    root = tmp_path / "runs"
    write_run(root / "good")
    bad = root / "bad"
    bad.mkdir(parents=True)
    (bad / "run.jsonl").write_text("not json\n{}\n")
    out = cli(root)
    assert out.returncode == 2
    assert str(root / "good") in out.stdout and "unreadable" in out.stdout and "Traceback" not in out.stderr
    doc = json.loads(cli(root, "--json").stdout)
    assert set(doc) == {"runs"}
    assert [r["verdict"] for r in doc["runs"] if r["source"] == str(bad)] == ["unreadable"]


def test_dashboard_says_it_cannot_judge_a_run_it_cannot_see(tmp_path):
    pytest.importorskip("textual")
    import asyncio

    from grpo_monitor.app.dashboard import WatchApp
    from grpo_monitor.app.dashboard.widgets.header import RunHeader

    blind = tmp_path / "blind.csv"
    blind.write_text("step,entropy,grad_norm\n" + "".join(f"{s},{0.5 + 0.01 * (s % 3)},{0.3}\n" for s in range(1, 80)))
    seen = write_run(tmp_path / "seen")

    async def header_text(path):
        app = WatchApp(path)
        async with app.run_test(size=(160, 40)) as pilot:
            for _ in range(400):
                if app.caught_up.is_set():
                    break
                await pilot.pause(0.02)
            await pilot.pause()
            return str(app.screen.query_one(RunHeader).render())

    assert "CANNOT JUDGE" in asyncio.run(header_text(blind))
    assert "CANNOT JUDGE" not in asyncio.run(header_text(seen))


def test_a_loose_note_in_a_folder_of_runs_is_skipped_not_judged(tmp_path):
    """A README beside the logs whose one line happens to parse as a step is not a run."""
    import grpo_monitor as monitor

    rows = ["step,reward,entropy,completions/mean_length"] + [f"{s},{0.5 + 0.001 * s},{1.0 - 0.001 * s},100" for s in range(1, 41)]
    (tmp_path / "history.csv").write_text("\n".join(rows) + "\n")
    (tmp_path / "NOTES.md").write_text("# notes\n\nstep 3 loss=0.1 reward=0.2\n")
    report = monitor.analyze(tmp_path)
    assert [r.steps for r in report.runs] == [40]
    assert [p.endswith("NOTES.md") for p, _ in report.skipped] == [True]
    assert "not a training log" in report.skipped[0][1]


def test_analyze_of_a_folder_never_reads_the_tools_own_saved_reports_as_logs(tmp_path):
    root = tmp_path / "work"
    run_dir = write_run(root / "run")
    (root / "report.txt").write_text(cli(run_dir).stdout)
    (root / "report.json").write_text(cli(run_dir, "--json").stdout)
    cli(run_dir, "--markdown", root / "report.md")
    lint = subprocess.run([sys.executable, "-m", "grpo_monitor", "lint", str(run_dir), "--json", "--device", "cpu"],
                          capture_output=True, text=True, timeout=300)
    (root / "lint.json").write_text(lint.stdout)
    out = cli(root, "--json")
    runs = json.loads(out.stdout)["runs"]
    assert [Path(r["source"]).name for r in runs] == ["run"]
    text = cli(root).stdout
    for name in ("report.txt", "report.json", "report.md", "lint.json"):
        assert f"skipped {root / name}: a grpo-monitor" in text and "not a training log" in text
    given = cli(root / "report.json")
    assert given.returncode == 2 and "a grpo-monitor analyze --json report, not a training log" in given.stderr


def test_a_long_analysis_shows_one_progress_line_on_a_terminal_and_leaves_the_report_alone(tmp_path, capsys):
    import io

    from grpo_monitor.app.analyze_cmd import Progress, run_cli

    run_dir = write_run(tmp_path / "run")
    screen = io.StringIO()
    code = run_cli([str(run_dir)], monitor.AnalyzeOptions(), as_json=True, progress=Progress(screen, after=0.0, tty=True))
    out = capsys.readouterr()
    doc = json.loads(out.out)  # stdout holds the report and nothing else
    assert code == doc_code(doc) and out.err == ""
    drawn = [part for part in screen.getvalue().split("\r\x1b[2K") if part]
    steps = len(read_run(run_dir).steps)
    assert drawn and drawn[-1] == f"grpo-monitor: {run_dir}: replayed {steps} of {steps} steps (100%)"
    assert screen.getvalue().endswith("\r\x1b[2K")  # the line is cleared once the report is out

    quiet = io.StringIO()  # a pipe, a CI log: nothing
    run_cli([str(run_dir)], monitor.AnalyzeOptions(), as_json=True, progress=Progress(quiet, after=0.0, tty=False))
    capsys.readouterr()
    assert quiet.getvalue() == ""
    slow_start = io.StringIO()  # an analysis that ends before the threshold says nothing either
    run_cli([str(run_dir)], monitor.AnalyzeOptions(), progress=Progress(slow_start, after=3600.0, tty=True))
    capsys.readouterr()
    assert slow_start.getvalue() == ""


def doc_code(doc: dict) -> int:
    verdicts = {r["verdict"] for r in doc["runs"]}
    return 1 if verdicts & {"warning", "critical"} else (3 if verdicts & {"cannot_judge", "incomplete"} else 0)


@pytest.mark.parametrize(("field", "value", "said"), [
    ("logging_steps", 0, "AnalyzeOptions(logging_steps=0)"),
    ("devices", -2, "AnalyzeOptions(devices=-2)"),
    ("gpu_hour_price", float("nan"), "AnalyzeOptions(gpu_hour_price=nan)"),
    ("mapping", "score=reward", "AnalyzeOptions(mapping='score=reward')"),
])
def test_analyze_options_name_the_field_the_user_wrote(field, value, said):
    with pytest.raises(ValueError) as err:
        monitor.AnalyzeOptions(**{field: value})
    assert str(err.value).startswith(said + ": ")


def test_an_option_that_cannot_be_used_is_said_before_any_run_is_read(tmp_path):
    from grpo_monitor.analysis.analyze import OptionsError

    with pytest.raises(OptionsError, match="expected COLUMN=METRIC"):
        analyze(tmp_path / "does-not-exist", monitor.AnalyzeOptions(mapping=["no-equals-sign"]))


def test_the_map_hint_for_a_log_nobody_could_judge_names_every_column_it_can_read(tmp_path):
    rows = ["iteration,ent,foo"] + [f"{s},{0.6 - 0.001 * s},{s % 3}" for s in range(1, 40)]
    path = tmp_path / "loop.csv"
    path.write_text("\n".join(rows) + "\n")
    [run] = analyze(path).runs
    assert run.verdict == "cannot_judge" and run.to_dict()["needs"].endswith(f"analyze {path} --map ent=entropy")
    from grpo_monitor.analysis.run_report import map_hints

    assert map_hints(["iteration", "my_score", "len", "ent"]) == [("my_score", "reward"), ("len", "length"),
                                                                   ("ent", "entropy")]
