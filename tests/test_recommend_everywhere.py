"""Every finding that names a variant, a remedy or a fix carries its recommendation in every output:
the live run log, ``analyze`` (text, --json, --markdown) and the dashboard's Recommendations tab.
A warning's variant is advice (never a restart), a variant an earlier segment tried is shown as tried,
and what is not a config field (the ``extra`` advice) travels with it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("textual")

from textual.widgets import DataTable, TextArea  # noqa: E402

from grpo_monitor.detectors.base import Detector, Finding  # noqa: E402
from grpo_monitor import read_run  # noqa: E402
from grpo_monitor.core.recommend import ADVICE, RECOMMENDED, TRIED, Recommender, recommend  # noqa: E402
from grpo_monitor.app.dashboard import WatchApp  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
aio = pytest.mark.asyncio
SOFT_OVERLONG = "get_soft_overlong_punishment"


def cli(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_MONITOR_")}
    env["PYTHONWARNINGS"] = "ignore"
    return subprocess.run([sys.executable, "-m", "grpo_monitor", *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=timeout)


@pytest.fixture(scope="module")
def collapse(tmp_path_factory) -> Path:
    """The collapse demo, run to its end without restarts: a warning, then a critical entropy collapse."""
    d = tmp_path_factory.mktemp("collapse") / "run"
    out = cli("demo", "--scenario", "collapse", "--run-dir", str(d))
    assert out.returncode == 0, out.stderr[-3000:]
    return d


def _named(findings):
    return [f for f in findings if f["variant"] and f["severity"] != "info"]


def test_the_live_log_carries_a_recommendation_for_every_finding_naming_a_variant(collapse):
    log = read_run(collapse)
    named = _named(log.findings)
    assert {f["severity"] for f in named} >= {"warning", "critical"}
    by_finding = {(r["detector"], r["step"]): r for r in log.recommendations}
    warning = next(f for f in named if f["severity"] == "warning")
    critical = next(f for f in named if f["severity"] == "critical")
    advice, switch = by_finding[(warning["detector"], warning["step"])], by_finding[(critical["detector"], critical["step"])]
    assert advice["status"] == ADVICE and switch["status"] == RECOMMENDED
    for rec in (advice, switch):
        assert rec["variant"] == "dapo" and rec["config_overrides"]["epsilon_high"] == 0.28
        assert "--epsilon_high 0.28" in rec["cli_flags"] and "epsilon_high=0.28" in rec["python"]
        assert SOFT_OVERLONG in rec["extra"]["reward_funcs"]
    assert not log.restarts  # advice or not, nothing restarts a run without auto_restart


def test_analyze_text_json_and_markdown_show_the_advice_the_switch_and_the_extra_advice(collapse, tmp_path):
    out = cli("analyze", str(collapse), "--json")
    assert out.returncode == 1, out.stderr[-2000:]
    [run] = json.loads(out.stdout)["runs"]
    # The warning's advice and the critical's switch are one change in --json too: listed once, as the switch,
    # with the step the advice came first.
    dapo = [r for r in run["recommendations"] if r["variant"] == "dapo"]
    assert [r["status"] for r in dapo] == [RECOMMENDED] and dapo[0]["advised_at"] < dapo[0]["step"]
    assert dapo[0]["config_overrides"]["epsilon_high"] == 0.28
    # The numbers the run used, never a placeholder: its cap and a quarter of it.
    assert "<" not in dapo[0]["extra"]["reward_funcs"] and "max_completion_len=" in dapo[0]["extra"]["reward_funcs"]

    md = tmp_path / "report.md"
    text = cli("analyze", str(collapse), "--markdown", str(md))
    assert text.returncode == 1
    for shown in (text.stdout, md.read_text()):
        # The warning's advice and the critical's switch are one change: shown once, saying when it was advised.
        assert "advice only until then" in shown and "switch to dapo" in shown.lower()
        assert "advice: switch to dapo" not in shown.lower()
        assert "--epsilon_high 0.28" in shown and "epsilon_high=0.28" in shown
        assert SOFT_OVERLONG in shown  # the advice that is not a config field
    assert "also: **reward_funcs**" in md.read_text()


async def _recommendations_tab(run_dir: Path) -> tuple[list[str], list[str]]:
    """The Recommendations tab's variant column and the text shown for each row."""
    app = WatchApp(run_dir, poll_interval=0.05)
    async with app.run_test(size=(160, 48)) as pilot:
        for _ in range(400):
            if app.caught_up.is_set():
                break
            await pilot.pause(0.05)
        await pilot.press("3")
        await pilot.pause()
        table = app.screen.query_one("#recs", DataTable)
        variants, texts = [], []
        for row in range(table.row_count):
            table.move_cursor(row=row)
            await pilot.pause()
            variants.append(str(table.get_row_at(row)[1]))
            texts.append(app.screen.query_one("#rec-text", TextArea).text)
        return variants, texts


@aio
async def test_the_dashboard_tab_shows_the_advice_the_switch_and_the_extra_advice(collapse):
    variants, texts = await _recommendations_tab(collapse)
    assert "dapo (advice, no restart)" in variants and "dapo" in variants
    texts = [t for v, t in zip(variants, texts) if v.startswith("dapo")]
    for text in texts:
        assert "+ epsilon_high=0.28" in text and "--epsilon_high 0.28" in text
        assert "# Also" in text and SOFT_OVERLONG in text
    assert any("advice only, never triggers a restart" in t for t in texts)


def _as_later_segment(run_dir: Path, dest: Path) -> Path:
    """The same run as segment-1/ of a lineage whose first segment switched to DAPO: its header
    names the variant tried and the config carries DAPO's settings, as a relaunch writes them."""
    seg = dest / "segment-1"
    seg.mkdir(parents=True)
    shutil.copy(run_dir / "samples.rank0.jsonl", seg / "samples.rank0.jsonl")
    lines = (run_dir / "run.jsonl").read_text().splitlines()
    header = json.loads(lines[0])
    header.update(segment=1, tried_variants=["dapo"], parent_run="first-segment")
    header["config"].update(loss_type="dapo", epsilon_high=0.28, mask_truncated_completions=True, steps_per_generation=4)
    kept = [json.dumps(header)] + [ln for ln in lines[1:] if json.loads(ln)["type"] != "recommendation"]
    (seg / "run.jsonl").write_text("\n".join(kept) + "\n")
    return seg


def test_a_variant_an_earlier_segment_tried_is_shown_as_tried_not_dropped(collapse, tmp_path):
    seg = _as_later_segment(collapse, tmp_path / "lineage")
    out = cli("analyze", str(seg), "--json")
    [run] = json.loads(out.stdout)["runs"]
    assert any(f["variant"] == "dapo" and f["severity"] == "critical" for f in run["findings"])
    [rec] = [r for r in run["recommendations"] if r["variant"] == "dapo"]
    assert rec["status"] == TRIED and rec["tried_in_segment"] == 2
    assert rec["config_overrides"] == {}  # nothing left to change against this run
    assert "epsilon_high=0.28" in rec["python"] and "--epsilon_high 0.28" in rec["cli_flags"]
    md = tmp_path / "r.md"
    text = cli("analyze", str(seg), "--markdown", str(md))
    for shown in (text.stdout, md.read_text()):
        assert "tried in segment 2 of this lineage" in shown and "epsilon_high=0.28" in shown


def test_the_moe_demo_gives_gspo_its_diff(tmp_path):
    d = tmp_path / "moe"
    out = cli("demo", "--moe", "--steps", "6", "--run-dir", str(d))
    assert out.returncode == 0, out.stderr[-3000:]
    recs = [r for r in read_run(d).recommendations if r["variant"] == "gspo"]
    assert recs and recs[0]["status"] == ADVICE
    assert recs[0]["config_overrides"]["importance_sampling_level"] == "sequence"
    assert "--importance_sampling_level sequence" in out.stdout  # the demo's own summary
    report = json.loads(cli("analyze", str(d), "--json").stdout)["runs"][0]
    assert any(r["variant"] == "gspo" and r["config_overrides"].get("importance_sampling_level") == "sequence"
               for r in report["recommendations"])


# --- the contract new detectors rely on: variant None, config_overrides, evidence["remedy"] / ["advice"] ---

REMEDY = "raise_max_completion_length"
FIX = "return 0.0, not None, for a completion the reward cannot parse"


class PlantedRemedy(Detector):
    """A truncation detector's shape: a remedy that is a config change, warned, then confirmed."""

    id = "planted_truncation"

    def _reset_state(self):
        pass

    def update(self, step, metrics, samples=None):
        severity = {2: "warning", 3: "critical"}.get(step)
        if severity is None:
            return []
        return [Finding(self.id, severity, step, 1, None, {"max_completion_length": 48},
                        {"remedy": REMEDY, "clipped_ratio": 0.9}, "completions hit the cap")]


class PlantedCodeFix(Detector):
    """A broken reward function's shape: a fix outside the config, warned of first (a critical one would stop an
    auto-restarting run: no config change cures it)."""

    id = "planted_reward_check"

    def _reset_state(self):
        pass

    def update(self, step, metrics, samples=None):
        if step != 1:
            return []
        return [Finding(self.id, "warning", step, None, None, {}, {"advice": FIX}, "the reward returned None")]


@pytest.fixture(scope="module")
def remedy_lineage(tmp_path_factory) -> Path:
    import transformers

    from grpo_monitor import run_with_restarts
    from grpo_monitor.app.demo import build_trainer, demo_config

    transformers.logging.set_verbosity_error()
    root = tmp_path_factory.mktemp("remedy")
    run_with_restarts(lambda a: build_trainer(a), demo_config(root / "out", 4, disable_tqdm=True),
                      run_dir=root / "run", max_restarts=1, detectors=[PlantedRemedy(), PlantedCodeFix()])
    return root / "run"


def test_a_remedy_is_advice_when_warned_acted_on_when_confirmed_and_tried_afterwards(remedy_lineage):
    first, second = read_run(remedy_lineage), read_run(remedy_lineage / "segment-1")
    recs = {(r["detector"], r["step"]): r for r in first.recommendations}
    warned, confirmed = recs[("planted_truncation", 2)], recs[("planted_truncation", 3)]
    assert (warned["variant"], warned["status"]) == (REMEDY, ADVICE)
    assert (confirmed["variant"], confirmed["status"]) == (REMEDY, RECOMMENDED)
    for rec in (warned, confirmed):
        assert rec["config_overrides"] == {"max_completion_length": 48} and rec["cli_flags"] == "--max_completion_length 48"
    fix = recs[("planted_reward_check", 1)]
    assert fix["status"] == ADVICE and fix["extra"]["advice"] == FIX and fix["config_overrides"] == {}
    # The restart acted on the confirmed remedy, not on the code fix that came first nor on the warning.
    [restart] = first.restarts
    assert restart["variant"] == REMEDY and restart["step"] == 3
    assert second.header["config"]["max_completion_length"] == 48 and second.header["tried_variants"] == [REMEDY]
    tried = [r for r in second.recommendations if r["variant"] == REMEDY]
    assert tried and tried[0]["status"] == TRIED and tried[0]["tried_in_segment"] == 2
    assert not second.restarts


def test_analyze_replays_a_remedy_and_a_code_fix_into_every_format(remedy_lineage):
    from grpo_monitor import AnalyzeOptions, analyze
    from grpo_monitor.analysis.render import render_markdown, render_text

    report = analyze(remedy_lineage, AnalyzeOptions(detectors=[PlantedRemedy(), PlantedCodeFix()]))
    first = report.runs[0].to_dict()
    by = {(r["variant"], r["status"]) for r in first["recommendations"]}
    assert {(REMEDY, RECOMMENDED), ("code_change", ADVICE)} <= by and (REMEDY, ADVICE) not in by
    assert next(r for r in first["recommendations"] if r["variant"] == REMEDY).get("advised_at") is not None
    text, md = render_text(report), render_markdown(report)
    for shown in (text, md):
        assert f"apply {REMEDY}" in shown.lower() and "--max_completion_length 48" in shown
        assert FIX in shown and "tried in segment 2" in shown


@aio
async def test_the_dashboard_shows_the_remedy_its_advice_and_the_tried_segment(remedy_lineage):
    variants, texts = await _recommendations_tab(remedy_lineage)
    assert REMEDY in variants and f"{REMEDY} (advice, no restart)" in variants and f"{REMEDY} (tried)" in variants
    assert "code_change (advice, no restart)" in variants
    assert any("+ max_completion_length=48" in t and "- max_completion_length=16" in t for t in texts)
    assert any(FIX in t for t in texts)


def test_remedy_rules_for_auto_restart_and_moe():
    config = {"max_completion_length": 16, "learning_rate": 1e-6, "max_grad_norm": 1.0, "gradient_accumulation_steps": 1}

    def f(remedy, overrides, severity="critical"):
        return {"detector": "d", "severity": severity, "step": 9, "onset_step": 5, "variant": None,
                "config_overrides": overrides, "evidence": {"remedy": remedy}, "message": "m"}

    assert recommend(f(REMEDY, {"max_completion_length": 48}, "warning"), config) is None  # restarts act on critical only
    assert recommend(f(REMEDY, {"max_completion_length": 48}), config, tried=[REMEDY]) is None
    assert recommend(f(REMEDY, {}), config) is None  # a remedy without overrides changes nothing
    # A longer budget leaves the loss alone on MoE; a collapse remedy comes with GSPO there.
    assert recommend(f(REMEDY, {"max_completion_length": 48}), config, is_moe=True)["variant"] == REMEDY
    grad = recommend(f("lower_max_grad_norm", {"max_grad_norm": 0.2}), config, is_moe=True)
    assert grad["variant"] == "gspo" and grad["config_overrides"]["max_grad_norm"] == 0.2
    r = Recommender(config)
    assert r(f(REMEDY, {"max_completion_length": 48}, "warning"))["status"] == ADVICE
    assert r(f(REMEDY, {"max_completion_length": 48}))["status"] == RECOMMENDED
    assert r(f(REMEDY, {"max_completion_length": 48})) is None  # once per run
