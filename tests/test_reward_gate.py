"""The reward-inspection gate: real completions of the tiny model, judged through the real screen,
the saved verdict enforced by check_gate, and the non-interactive --auto report."""

from __future__ import annotations

import json
import sys

import pytest

from grpo_monitor.fixtures.tiny import REWARD_FUNCS, correctness_reward, format_reward
from grpo_monitor.rewards.registry import load_reward_func
from grpo_monitor.preflight.reward_gate import (
    GATE_FILE,
    GateSession,
    RewardGateError,
    check_gate,
    main_inspect,
    require_gate,
    reward_source_hash,
    sample_from_model,
    save_verdict,
    score_samples,
)

N = 12  # samples judged in the screen tests; the --auto tests draw the recipe's 50-100


@pytest.fixture(scope="module")
def completions():
    from grpo_monitor.fixtures.tiny import build_dataset, build_model, build_tokenizer

    return sample_from_model(build_model(warm_start=150), build_tokenizer(), build_dataset(), num_samples=N,
                             per_prompt=4, max_new_tokens=16, seed=0)


def _session(completions, threshold=0.9):
    scores, errors = score_samples(completions, REWARD_FUNCS)
    return GateSession(list(completions), scores, errors, threshold=threshold, min_judged=N)


def test_real_completions_are_scored_like_trl_does(completions):
    assert len(completions) == N
    assert all(isinstance(s["completion"], str) and s["prompt"].startswith("What is") for s in completions)
    scores, errors = score_samples(completions, REWARD_FUNCS)
    assert errors == {}
    texts = [s["completion"] for s in completions]
    assert scores["format_reward"] == format_reward(texts)
    # the dataset's extra column reaches the reward function as a keyword argument
    assert scores["correctness_reward"] == correctness_reward(texts, [s["columns"]["target"] for s in completions])
    assert any(v == 1.0 for v in scores["format_reward"])  # the warm-started model answers in the format


def _plain(app, selector):
    from textual.widgets import Static

    return app.query_one(selector, Static).visual.plain


async def test_gate_screen_mark_note_save_and_check(completions, tmp_path):
    from grpo_monitor.app.gate_screen import RewardGateApp

    session = _session(completions)
    app = RewardGateApp(session, tmp_path, REWARD_FUNCS, {"model": "tiny"})
    async with app.run_test() as pilot:
        assert completions[0]["completion"] in _plain(app, "#completion")
        assert "1. format_reward" in _plain(app, "#scores")
        await pilot.press("d", "2")  # sample 0: the correctness score is wrong
        await pilot.press("n", *"target", "space", *"misread", "enter")
        assert session.judgements[0].note == "target misread"
        assert "target misread" in _plain(app, "#note-view")
        await pilot.press("right")
        for _ in range(N - 1):
            await pilot.press("a")  # agree moves on
        await pilot.press("left", "left")
        assert app.index == N - 3
        await pilot.press("s")
        await pilot.pause()
        assert "saved" in _plain(app, "#status")
        await pilot.press("q")
    verdict = json.loads((tmp_path / GATE_FILE).read_text())
    assert verdict["judged"] == N and verdict["agreed"] == N - 1
    assert verdict["pass_rate"] == pytest.approx((N - 1) / N)
    assert verdict["component_agreement"] == {"format_reward": 1.0, "correctness_reward": pytest.approx((N - 1) / N)}
    [dis] = verdict["disagreements"]
    assert dis["index"] == 0 and dis["wrong_components"] == ["correctness_reward"] and dis["note"] == "target misread"
    assert dis["completion"] == completions[0]["completion"]
    assert verdict["reward_funcs"] == ["format_reward", "correctness_reward"]
    assert set(verdict["reward_sources"]) == {"format_reward", "correctness_reward"}
    assert verdict["timestamp"] > 0 and verdict["threshold"] == 0.9 and verdict["passed"] is True
    assert not list(tmp_path.glob(".*tmp*"))  # the atomic write left no temporary file
    # 11/12 = 92% passes the default 90%, not a stricter 95%
    assert check_gate(tmp_path, REWARD_FUNCS)[0] is True
    ok, msg = check_gate(tmp_path, REWARD_FUNCS, min_agreement=0.95)
    assert not ok and "below" in msg and "correctness_reward" in msg and "grpo-monitor inspect-rewards" in msg


async def test_disagree_without_a_component_counts_every_component_wrong(completions, tmp_path):
    from grpo_monitor.app.gate_screen import RewardGateApp

    session = _session(completions)
    app = RewardGateApp(session, tmp_path, REWARD_FUNCS)
    async with app.run_test() as pilot:
        await pilot.press("d", "right", "d", "1", "1")  # toggling twice leaves "disagree, unspecified"
        await pilot.press("n", "x", "escape")  # Escape drops the note
        await pilot.press("s", "q")
    verdict = json.loads((tmp_path / GATE_FILE).read_text())
    assert verdict["judged"] == 2 and verdict["required"] == N and verdict["passed"] is False
    assert verdict["component_agreement"] == {"format_reward": 0.0, "correctness_reward": 0.0}
    assert all(d["note"] == "" for d in verdict["disagreements"])
    ok, msg = check_gate(tmp_path, REWARD_FUNCS, min_agreement=0.0)
    assert not ok and f"only 2 of the required {N}" in msg


async def test_screen_shows_model_text_literally(tmp_path):
    from grpo_monitor.app.gate_screen import RewardGateApp

    evil = "[bold red]x[/] [link=http://e]y[/link] \x1b[31mred\x1b[0m"
    samples = [{"prompt": "[b]p[/b]", "completion": evil, "columns": {"target": "1"}}]
    scores, errors = score_samples(samples, REWARD_FUNCS)
    app = RewardGateApp(GateSession(samples, scores, errors, min_judged=1), tmp_path, REWARD_FUNCS)
    async with app.run_test():
        shown = _plain(app, "#completion")
        assert "[bold red]x[/] [link=http://e]y[/link]" in shown
        assert "\x1b" not in shown and "␛[31m" in shown
        assert _plain(app, "#prompt") == "[b]p[/b]"


def _write_rewards(path, name, target_pattern):
    path.write_text(
        "import re\n"
        f"_ANSWER = re.compile(r'{target_pattern}')\n\n"
        "def format_reward(completions, **kwargs):\n"
        "    return [1.0 if _ANSWER.search(c) else 0.0 for c in completions]\n\n"
        "def correctness_reward(completions, target, **kwargs):\n"
        "    return [1.0 if t in c else 0.0 for c, t in zip(completions, target)]\n"
    )
    sys.path.insert(0, str(path.parent))
    return [load_reward_func(f"{name}:format_reward"), load_reward_func(f"{name}:correctness_reward")]


async def test_check_gate_pass_changed_and_missing(completions, tmp_path):
    from grpo_monitor.app.gate_screen import RewardGateApp

    funcs = _write_rewards(tmp_path / "gate_rewards_v1.py", "gate_rewards_v1", r"<answer>\s*(\S+)\s*</answer>")
    run_dir = tmp_path / "run"
    ok, msg = check_gate(run_dir, funcs)
    assert not ok and "no inspection verdict" in msg
    assert ("grpo-monitor inspect-rewards --run-dir " + str(run_dir)) in msg
    assert "--reward-funcs gate_rewards_v1:format_reward gate_rewards_v1:correctness_reward" in msg
    scores, errors = score_samples(completions, funcs)
    app = RewardGateApp(GateSession(list(completions), scores, errors, min_judged=N), run_dir, funcs)
    async with app.run_test() as pilot:
        await pilot.press(*["a"] * N, "s", "q")
    assert app.return_value["passed"] is True
    ok, msg = check_gate(run_dir, funcs)
    assert ok and "100% agreement on 12 judged samples" in msg
    # the same function names, but the module-level pattern the format reward reads has changed
    changed = _write_rewards(tmp_path / "gate_rewards_v2.py", "gate_rewards_v2", r"<answer>(\S+)</answer>")
    ok, msg = check_gate(run_dir, [changed[0], funcs[1]])
    assert not ok and "format_reward changed since inspection" in msg
    ok, msg = check_gate(run_dir, funcs[:1])
    assert not ok and "reward functions changed" in msg
    # a human verdict is required: a verdict not made in the screen does not count
    doc = json.loads((run_dir / GATE_FILE).read_text())
    (run_dir / GATE_FILE).write_text(json.dumps(dict(doc, mode="auto")))
    assert check_gate(run_dir, funcs)[0] is False
    (run_dir / GATE_FILE).write_text("{torn")
    ok, msg = check_gate(run_dir, funcs)
    assert not ok and "unreadable" in msg


def test_source_hash_follows_what_the_function_reads():
    h = reward_source_hash(format_reward)
    assert h == reward_source_hash(format_reward) and h != reward_source_hash(correctness_reward)
    import functools

    assert reward_source_hash(functools.partial(correctness_reward, target=["1"])) != reward_source_hash(correctness_reward)


def test_attach_wrapping_keeps_the_gate_and_the_trainer_check(tmp_path):
    from grpo_monitor.callbacks import attach
    from grpo_monitor.app.demo import build_trainer, demo_config
    from grpo_monitor.preflight.reward_gate import check_trainer_gate, reward_fingerprints

    trainer = build_trainer(demo_config(tmp_path / "trainer", 1))
    before = reward_fingerprints(trainer.reward_funcs)
    ok, msg = check_trainer_gate(trainer, tmp_path / "run")
    assert not ok and "--model " + trainer.model.config._name_or_path in msg
    assert "--reward-funcs grpo_monitor.fixtures.tiny:format_reward grpo_monitor.fixtures.tiny:correctness_reward" in msg
    attach(trainer, tmp_path / "run")  # wraps the reward functions with the reward tap
    assert reward_fingerprints(trainer.reward_funcs) == before
    with pytest.raises(RewardGateError, match="grpo-monitor inspect-rewards"):
        require_gate(trainer, tmp_path / "run")
    session = GateSession([{"prompt": "p", "completion": "c"}], {n: [1.0] for n in before}, min_judged=1)
    session.agree(0)
    save_verdict(tmp_path / "run", session.verdict(trainer.reward_funcs))
    assert "reward gate passed" in require_gate(trainer, tmp_path / "run")


# -- --auto -------------------------------------------------------------------------------------------


def test_auto_prints_the_table_and_summary_and_never_passes(tmp_path, capsys):
    code = main_inspect(["--demo", "--auto", "--num-samples", "64", "--run-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0
    rows = [line for line in out.splitlines() if line[:3].strip().isdigit()]
    assert len(rows) == 64 and all("What is" in r for r in rows)
    assert "format_reward" in out.splitlines()[0] and "correctness_reward" in out.splitlines()[0]
    assert "summary over 64 samples:" in out
    for name in ("format_reward", "correctness_reward"):
        line = next(x for x in out.splitlines() if x.strip().startswith(name + ":"))
        assert "mean" in line and "non-zero" in line and "NaN 0" in line and "histogram" in line
    assert "never passes the reward gate" in out
    assert not (tmp_path / GATE_FILE).exists()


def test_auto_json_and_literal_text_from_a_samples_file(tmp_path, capsys):
    src = tmp_path / "samples.jsonl"
    rows = [{"prompt": "What is 1 + 1 ? Answer :", "completion": "<answer> 2 </answer>", "target": "2"},
            {"prompt": "What is 1 + 2 ? Answer :", "completion": "\x1b[2J[red]3[/red]", "target": "3"}]
    src.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    funcs = ["--reward-funcs", "grpo_monitor.fixtures.tiny:format_reward", "grpo_monitor.fixtures.tiny.correctness_reward"]
    assert main_inspect(["--samples", str(src), "--auto", *funcs]) == 0
    cap = capsys.readouterr()
    assert "\x1b" not in cap.out and "␛[2J[red]3[/red]" in cap.out
    assert "2 samples" in cap.err  # below the recipe's 50-100: said on stderr
    assert main_inspect(["--samples", str(src), "--auto", "--json", *funcs]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["gate_passed"] is False
    assert [s["scores"]["correctness_reward"] for s in doc["samples"]] == [1.0, 0.0]
    assert doc["summary"]["format_reward"]["mean"] == 0.5


def test_auto_reports_a_reward_function_that_raises(tmp_path, capsys):
    (tmp_path / "raising_rewards.py").write_text("def broken_reward(completions, **kw):\n    raise KeyError('answer')\n")
    sys.path.insert(0, str(tmp_path))
    code = main_inspect(["--demo", "--auto", "--num-samples", "50",
                         "--reward-funcs", "grpo_monitor.fixtures.tiny:format_reward", "raising_rewards:broken_reward"])
    out = capsys.readouterr().out
    assert code == 1 and "broken_reward raised KeyError" in out and "NaN 50" in out


@pytest.mark.parametrize("argv,needle", [
    (["--demo", "--auto", "--reward-funcs", "no_such_module_xyz:f"], "no_such_module_xyz"),
    (["--samples", "/nonexistent/s.jsonl", "--auto", "--reward-funcs", "grpo_monitor.fixtures.tiny:format_reward"], "/nonexistent/s.jsonl"),
    (["--demo", "--reward-funcs", "grpo_monitor.fixtures.tiny:format_reward"], "--run-dir"),
    (["--auto", "--reward-funcs", "grpo_monitor.fixtures.tiny:format_reward"], "source of completions"),
])
def test_unusable_input_exits_2(argv, needle, capsys):
    assert main_inspect(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1


def test_attach_refuses_to_train_without_a_passed_gate(tmp_path):
    import transformers

    from grpo_monitor.callbacks import attach
    from grpo_monitor.app.demo import build_trainer, demo_config
    from grpo_monitor.preflight.reward_gate import RewardGateError

    transformers.logging.set_verbosity_error()
    trainer = build_trainer(demo_config(tmp_path / "t", 2))
    with pytest.raises(RewardGateError, match="grpo-monitor inspect-rewards"):
        attach(trainer, tmp_path / "run", require_reward_gate=True)
    assert trainer.state.global_step == 0


# -- cross-check against a reference ---------------------------------------------------------------


def _planted_samples(tmp_path, n=60, planted=(5, 17, 33, 48)):
    """GSM8K-style samples the user's tag-only correctness gets right, except the planted ones, which
    answer correctly in forms it misses (4.0, a fraction, a boxed answer, a missing tag)."""
    rows = []
    forms = ["<answer> {v}.0 </answer>", "<answer> \\frac{{{w}}}{{2}} </answer>", "So \\boxed{{{v}}}", "the sum is {v}"]
    for i in range(n):
        v = i % 9 + 1
        text = forms[planted.index(i) % len(forms)].format(v=v, w=2 * v) if i in planted else f"<answer> {v} </answer>"
        rows.append({"prompt": f"What is {v - 1} + 1 ? Answer :", "completion": text, "target": str(v)})
    path = tmp_path / "planted.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path, list(planted)


def test_auto_with_a_reference_lists_exactly_the_planted_disagreements_first(tmp_path, capsys):
    path, planted = _planted_samples(tmp_path)
    argv = ["--samples", str(path), "--auto", "--reward-funcs", "grpo_monitor.fixtures.tiny:format_reward",
            "grpo_monitor.fixtures.tiny:correctness_reward", "--reference", "correctness_reward=exact_match"]
    assert main_inspect(argv) == 1  # disagreements: a CI run fails
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("disagreements between the reward functions and their references: 4 (on 4 of 60")
    table = [ln for ln in out[3:] if ln[:3].strip().isdigit()]
    listed = [int(ln.split()[1]) for ln in table[:4]]
    assert listed == planted
    assert all("correctness_reward" in ln and "exact_match" in ln for ln in table[:4])
    main_rows = [ln for ln in out if ln[:3].strip().isdigit() and "What is" in ln]
    assert len(main_rows) == 60
    assert "correctness_reward~exact_match" in next(ln for ln in out if ln.lstrip().startswith("#  prompt"))
    # the JSON document carries the same order and the agreement numbers
    assert main_inspect([*argv, "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert [s["original_index"] for s in doc["samples"][:4]] == planted
    assert [s["disagrees"] for s in doc["samples"][:5]] == [["correctness_reward"]] * 4 + [[]]
    ref = doc["references"]["correctness_reward"]
    assert ref["function_reference"] == pytest.approx(56 / 60) and ref["disagreements"] == [0, 1, 2, 3]


def _gold_samples(tmp_path, n=64):
    """Samples whose gold answer sits in a column named ``gold``, which no default of exact_match reads;
    a third of the completions answer one too many, and the user's function reads the column."""
    rows = [{"prompt": f"What is {i % 5} + 2 ?",
             "completion": f"The answer is {i % 5 + 2 + (i % 3 == 0)}, since {i % 5} + 2 = {i % 5 + 2}.",
             "gold": str(i % 5 + 2)} for i in range(n)]
    path = tmp_path / "gold.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (tmp_path / "gold_rewards.py").write_text(
        "def gold_reward(completions, gold, **kw):\n"
        "    return [1.0 if c.split(',')[0].split()[-1] == g else 0.0 for c, g in zip(completions, gold)]\n")
    return path


def test_a_reference_that_finds_no_gold_column_says_so_and_counts_no_disagreement(tmp_path, capsys, monkeypatch, caplog):
    path = _gold_samples(tmp_path)
    monkeypatch.chdir(tmp_path)
    argv = ["--samples", str(path), "--auto", "--json", "--reward-funcs", "gold_rewards:gold_reward",
            "--reference", "gold_reward=exact_match"]
    with caplog.at_level("WARNING"):
        assert main_inspect(argv) == 1  # nothing was cross-checked: a CI run stops on it
    doc = json.loads(capsys.readouterr().out)
    ref = doc["references"]["gold_reward"]
    assert ref["disagreements"] == [] and ref["compared"] == 0 and ref["function_reference"] is None
    assert all(s["disagrees"] == [] for s in doc["samples"])
    [err] = [v for k, v in doc["errors"].items() if "exact_match" in k]
    assert "scored none of the 64 samples" in err and "--reference gold_reward=exact_match:COLUMN" in err
    # One warning line, naming the columns looked for and the one the dataset has.
    [warning] = [r.getMessage() for r in caplog.records if "no gold answer" in r.getMessage()]
    assert "answer, solution, target" in warning and "the dataset gives gold" in warning
    assert "exact_match:gold" in warning
    # Named, the column is read: every sample compared, and they all agree.
    assert main_inspect([*argv[:-1], "gold_reward=exact_match:gold"]) == 0
    doc = json.loads(capsys.readouterr().out)
    ref = doc["references"]["gold_reward"]
    assert ref["compared"] == 64 and ref["function_reference"] == 1.0 and ref["disagreements"] == []
    assert doc["errors"] == {}


def test_reference_input_errors_exit_2(tmp_path, capsys):
    path, _ = _planted_samples(tmp_path, n=4, planted=())
    base = ["--samples", str(path), "--auto", "--reward-funcs", "grpo_monitor.fixtures.tiny:correctness_reward"]
    for ref, needle in (("nosuch=exact_match", "no reward function named 'nosuch'"),
                        ("correctness_reward=no_such_reference", "unknown reference"),
                        ("correctness_reward=answer_format:gold", "answer_format reads no dataset column"),
                        ("correctness_reward", "NAME=REFERENCE")):
        assert main_inspect([*base, "--reference", ref]) == 2
        err = capsys.readouterr().err
        assert needle in err and "Traceback" not in err


def test_verdict_records_function_reference_and_person_agreement(tmp_path):
    from grpo_monitor.preflight.reward_gate import disagreements_first, read_samples_file, score_references

    path, planted = _planted_samples(tmp_path, n=10, planted=(2, 7))
    samples = read_samples_file(path)
    scores, _ = score_samples(samples, [correctness_reward])
    refs, errs = score_references(samples, [("correctness_reward", "exact_match")])
    assert errs == {}
    samples, scores, refs, n = disagreements_first(samples, scores, refs)
    assert n == 2 and [s["original_index"] for s in samples[:2]] == planted
    session = GateSession(samples, scores, references=refs, min_judged=10)
    session.toggle_wrong(0, 0)  # the person sides with the reference on the first disagreement
    session.agree(1)  # ... and with the function on the second
    for i in range(2, 10):
        session.agree(i)
    verdict = session.verdict([correctness_reward])
    ref = verdict["references"]["correctness_reward"]
    assert ref["reference"] == "exact_match"
    assert ref["function_reference"] == pytest.approx(0.8)
    assert ref["function_person"] == pytest.approx(0.9)
    assert ref["reference_person"] == pytest.approx(0.9)  # consistent with the person on 9 of 10
    assert ref["disagreements"] == [0, 1] and ref["disagreements_judged"] == 2
    d = verdict["disagreements"][0]
    assert d["reference_scores"] == {"correctness_reward": 1.0} and d["original_index"] == planted[0]
    save_verdict(tmp_path / "run", verdict)
    assert json.loads((tmp_path / "run" / GATE_FILE).read_text())["references"]["correctness_reward"]["reference"] == "exact_match"


async def test_gate_screen_shows_the_reference_score(tmp_path):
    from grpo_monitor.app.gate_screen import RewardGateApp

    samples = [{"prompt": "What is 1 + 1 ?", "completion": "<answer> 2.0 </answer>", "columns": {"target": "2"}}]
    session = GateSession(samples, {"correctness_reward": [0.0]}, min_judged=1,
                          references={"correctness_reward": {"reference": "exact_match", "scores": [1.0]}})
    app = RewardGateApp(session, tmp_path / "run")
    async with app.run_test() as pilot:
        await pilot.pause()
        text = _plain(app, "#scores")
        assert "reference exact_match: 1" in text and "≠ reference" in text
        assert "1 sample(s) disagree with a reference" in _plain(app, "#status")


def test_interactive_gate_hands_the_screen_the_disagreements_first(tmp_path):
    path, planted = _planted_samples(tmp_path)
    seen = {}

    def screen(session, run_dir, funcs, source):  # stands in for the person at the screen
        seen["first"] = [s["original_index"] for s in session.samples[:4]]
        seen["marked"] = [session.disagrees("correctness_reward", i) for i in range(6)]
        for i in range(len(session.samples)):
            session.toggle_wrong(i, 1) if i < 4 else session.agree(i)
        verdict = session.verdict(funcs, source)
        save_verdict(run_dir, verdict)
        return verdict

    argv = ["--samples", str(path), "--run-dir", str(tmp_path / "run"), "--reward-funcs", "grpo_monitor.fixtures.tiny:format_reward",
            "grpo_monitor.fixtures.tiny:correctness_reward", "--reference", "correctness_reward=exact_match", "--threshold", "0.5"]
    assert main_inspect(argv, open_screen=screen) == 0
    assert seen["first"] == planted and seen["marked"] == [True] * 4 + [False] * 2
    saved = json.loads((tmp_path / "run" / GATE_FILE).read_text())
    ref = saved["references"]["correctness_reward"]
    assert ref["reference_person"] == 1.0 and ref["function_person"] == pytest.approx(56 / 60)
    assert saved["source"]["references"] == {"correctness_reward": "exact_match"}
    assert main_inspect(argv[:-2]) == 2  # interactive without a screen: says so, no traceback


def test_the_command_line_opens_the_screen_for_the_gate(tmp_path, monkeypatch):
    import grpo_monitor.app.gate_screen as gate_app
    from grpo_monitor.app.cli import main

    path, planted = _planted_samples(tmp_path, n=6, planted=(4,))
    opened = {}

    def fake_run_gate(session, run_dir, funcs, source):
        opened.update(n=len(session.samples), first=session.samples[0]["original_index"], run_dir=str(run_dir))
        return None  # the person quit without saving

    monkeypatch.setattr(gate_app, "run_gate", fake_run_gate)
    code = main(["inspect-rewards", "--samples", str(path), "--run-dir", str(tmp_path / "run"),
                 "--reward-funcs", "grpo_monitor.fixtures.tiny:correctness_reward", "--reference", "correctness_reward=exact_match"])
    assert code == 1 and opened == {"n": 6, "first": 4, "run_dir": str(tmp_path / "run")}


# -- pre-flight checks on the gate's samples --------------------------------------------------------

def _tiny_model_dir(tmp_path, with_tokenizer, chat_template=None):
    """The tiny model saved the way a user's checkpoint folder is: with or without its tokenizer files."""
    from grpo_monitor.fixtures.tiny import build_model, build_tokenizer

    folder = tmp_path / ("model" if with_tokenizer else "model-no-tokenizer")
    build_model(warm_start=150).save_pretrained(folder)
    if with_tokenizer:
        tok = build_tokenizer()
        if chat_template:
            tok.chat_template = chat_template
        tok.save_pretrained(folder)
    return folder


def _dataset(tmp_path, conversational=False, n=16):
    from grpo_monitor.fixtures.tiny import task_rows

    rows = task_rows(n)
    if conversational:
        rows = [{"prompt": [{"role": "user", "content": r["prompt"]}], "target": r["target"]} for r in rows]
    path = tmp_path / ("conv.jsonl" if conversational else "prompts.jsonl")
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_model_folder_without_tokenizer_is_one_line_exit_2(tmp_path, capsys):
    import subprocess

    folder = _tiny_model_dir(tmp_path, with_tokenizer=False)
    ds = _dataset(tmp_path)
    argv = ["--model", str(folder), "--dataset", str(ds), "--auto", "--num-samples", "8",
            "--reward-funcs", "grpo_monitor.fixtures.tiny:format_reward"]
    capsys.readouterr()  # the model build's own progress output
    assert main_inspect(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and str(folder) in err
    assert "no tokenizer files" in err and "--tokenizer" in err
    # The real command line says the same, without a traceback.
    proc = subprocess.run([sys.executable, "-m", "grpo_monitor", "inspect-rewards", *argv],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "no tokenizer files" in proc.stderr
    # Passing the tokenizer it was trained with makes the folder usable.
    tok_dir = _tiny_model_dir(tmp_path, with_tokenizer=True)
    main_inspect([*argv, "--tokenizer", str(tok_dir)])
    out = capsys.readouterr().out
    assert "summary over 8 samples" in out and out.count("What is") == 8


def test_a_constant_reward_function_is_flagged_and_fails_auto(tmp_path, capsys):
    (tmp_path / "strict_rewards.py").write_text(
        "import re\n"
        "_STRICT = re.compile(r'^<think>.*</think>\\n<answer>.*</answer>$')  # no DOTALL: multi-line thinking never matches\n\n"
        "def strict_format(completions, **kwargs):\n"
        "    return [1.0 if _STRICT.match(c) else 0.0 for c in completions]\n")
    sys.path.insert(0, str(tmp_path))
    rows = [{"prompt": f"What is {i % 5} + 1 ?", "completion": f"<think>\nadd one\nto {i % 5}\n</think>\n<answer>{i % 5 + (i % 2)}</answer>",
             "target": str(i % 5 + 1)} for i in range(12)]
    src = tmp_path / "multi_line.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    argv = ["--samples", str(src), "--auto", "--reward-funcs", "strict_rewards:strict_format",
            "grpo_monitor.fixtures.tiny:correctness_reward"]
    assert main_inspect(argv) == 1  # CI fails on a reward that cannot pay
    out = capsys.readouterr().out
    assert "pre-flight checks:" in out and "strict_format gave all 12 samples the same score 0" in out
    assert main_inspect([*argv, "--json"]) == 1
    [check] = json.loads(capsys.readouterr().out)["checks"]
    assert (check["check"], check["component"], check["value"], check["samples"]) == ("constant_reward", "strict_format", 0.0, 12)


_THINK_TEMPLATE = ("{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {% endfor %}"
                   "{% if add_generation_prompt %}assistant : <think> {% endif %}")


def test_a_chat_template_that_writes_the_scaffold_is_flagged(tmp_path, capsys):
    (tmp_path / "think_rewards.py").write_text(
        "def think_format(completions, **kwargs):\n"
        "    texts = [c[-1]['content'] for c in completions]\n"
        "    return [1.0 if '<think>' in t and '</think>' in t else 0.0 for t in texts]\n\n"
        "def opens_thinking(completions, **kwargs):\n"
        "    return [0.5 if '<think>' in c[-1]['content'] else 0.0 for c in completions]\n\n"
        "def exact_answer(completions, target, **kwargs):\n"
        "    return [1.0 if t in c[-1]['content'] else 0.0 for c, t in zip(completions, target)]\n")
    sys.path.insert(0, str(tmp_path))
    folder = _tiny_model_dir(tmp_path, with_tokenizer=True, chat_template=_THINK_TEMPLATE)
    ds = _dataset(tmp_path, conversational=True)
    argv = ["--model", str(folder), "--dataset", str(ds), "--auto", "--json", "--num-samples", "16",
            "--max-new-tokens", "8", "--reward-funcs", "think_rewards:think_format", "think_rewards:opens_thinking",
            "think_rewards:exact_answer"]
    assert main_inspect(argv) == 1
    checks = {c["component"]: c for c in json.loads(capsys.readouterr().out)["checks"] if c["check"] == "template_scaffold"}
    assert set(checks) == {"think_format", "opens_thinking"}  # exact_answer looks for no tag
    assert checks["think_format"]["tags"] == ["think"] and checks["think_format"]["pays_for_scaffold_alone"] is False
    assert "scores 0 forever" in checks["think_format"]["message"]
    assert checks["opens_thinking"]["pays_for_scaffold_alone"] is True and "free" in checks["opens_thinking"]["message"]
    assert checks["think_format"]["generation_prompt"].strip().endswith("<think>")


def test_sampled_lengths_against_max_completion_length(tmp_path, capsys):
    base = ["--demo", "--auto", "--json", "--num-samples", "64"]
    # The demo's answers take a few tokens: a cap of 2 cuts nearly all of them.
    assert main_inspect([*base, "--max-completion-length", "2"]) == 1
    [check] = [c for c in json.loads(capsys.readouterr().out)["checks"] if c["check"] == "truncation"]
    assert check["severity"] == "warning" and check["share"] >= 0.9 and check["max_completion_length"] == 2
    assert check["config_overrides"]["max_completion_length"] > 2 and check["alternative"] == {"mask_truncated_completions": True}
    assert "max_completion_length=2" in check["message"]
    # A generous cap: nothing to say.
    assert main_inspect([*base, "--max-completion-length", "12"]) == 0
    assert [c for c in json.loads(capsys.readouterr().out)["checks"] if c["check"] == "truncation"] == []
    # A gate budget at or below the cap cannot tell what the cap would cut, and says so as a note. (Two
    # tokens hold no answer, so both rewards are constant 0: those are the warnings.)
    assert main_inspect([*base, "--max-completion-length", "4", "--max-new-tokens", "2"]) == 1
    checks = json.loads(capsys.readouterr().out)["checks"]
    [note] = [c for c in checks if c["check"] == "truncation"]
    assert note["severity"] == "info" and "--max-new-tokens above 4" in note["message"]
    assert sorted(c["component"] for c in checks if c["severity"] == "warning") == ["correctness_reward", "format_reward"]


async def test_gate_screen_shows_the_checks_and_the_verdict_keeps_them(tmp_path):
    from grpo_monitor.app.gate_screen import RewardGateApp
    from grpo_monitor.preflight.reward_gate import preflight_checks

    samples = [{"prompt": "What is 1 + 1 ?", "completion": f"<answer> {i} </answer>", "columns": {"target": "2"}}
               for i in range(10)]
    scores, errors = score_samples(samples, REWARD_FUNCS)
    checks = preflight_checks(samples, scores, errors, REWARD_FUNCS)
    assert [c["component"] for c in checks] == ["format_reward"]  # every sample well formed: the same 1.0
    app = RewardGateApp(GateSession(samples, scores, errors, min_judged=1, checks=checks), tmp_path, REWARD_FUNCS)
    async with app.run_test() as pilot:
        assert "format_reward gave all 10 samples the same score 1" in _plain(app, "#checks")
        await pilot.press("a", "s", "q")
    assert json.loads((tmp_path / GATE_FILE).read_text())["checks"][0]["component"] == "format_reward"


def _run_in_a_terminal(argv, keys_when, keys, timeout=240.0):
    """``argv`` in a pseudo-terminal (the gate is a full-screen app); once ``keys_when`` is on the screen
    the keys are typed one by one. Returns (exit code, everything it wrote)."""
    import fcntl
    import os
    import pty
    import select
    import struct
    import subprocess
    import termios
    import time

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 140, 0, 0))
    env = {**os.environ, "TERM": "xterm-256color", "TEXTUAL_ANIMATIONS": "none", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True)
    os.close(slave)
    out, typed, end = b"", False, time.monotonic() + timeout
    try:
        while time.monotonic() < end:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # the child closed the terminal
                    chunk = b""
                if not chunk and proc.poll() is not None:
                    break
                out += chunk
            elif proc.poll() is not None:
                break
            if not typed and keys_when in out:
                typed = True
                for key in keys:
                    os.write(master, key.encode())
                    time.sleep(0.03)
        return proc.wait(timeout=max(1.0, end - time.monotonic())), out.decode("utf-8", "replace")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)


def test_the_command_a_refused_training_prints_runs_as_printed_on_the_tiny_model(tmp_path):
    import shlex
    from pathlib import Path

    import transformers

    from grpo_monitor.app.demo import build_trainer, demo_config
    from grpo_monitor.callbacks import attach
    from grpo_monitor.preflight.reward_gate import DEFAULT_NUM_SAMPLES, RewardGateError

    transformers.logging.set_verbosity_error()
    trainer = build_trainer(demo_config(tmp_path / "t", 2))
    run = tmp_path / "run"
    with pytest.raises(RewardGateError) as refused:
        attach(trainer, run, require_reward_gate=True)
    command = str(refused.value).split("Inspect the rewards first: ", 1)[1]
    assert "<" not in command, command  # no placeholder left for the user to fill in
    argv = shlex.split(command)
    script = Path(sys.executable).with_name("grpo-monitor")
    argv[0] = str(script) if script.is_file() else argv[0]
    # Agree with every sample, save, quit: the gate's own verdict, not a usage error.
    code, screen = _run_in_a_terminal(argv, b"agree", ["a"] * DEFAULT_NUM_SAMPLES + ["s", "q"])
    assert "no tokenizer files" not in screen and code == 0, screen[-2000:]
    assert "reward gate passed" in require_gate(trainer, run)
