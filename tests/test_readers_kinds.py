"""The kinds of log people keep beyond the trainer's own files: notebooks (the progress table, a
hand-written loop's lines), Kaggle kernel logs, exports indexed by iteration, results files with
per-metric arrays per arm, tables of numbers in text; and the one reader interface they sit behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import grpo_monitor
import grpo_monitor.readers as readers
from grpo_monitor.analysis.analyze import analyze
from grpo_monitor.readers import Reader, Source, SourceError, detect_format, load_source

GRPO_HEADER = ["Step", "Training Loss", "reward", "reward_std", "completions / mean_length", "completions / clipped_ratio",
               "kl", "rewards / match_format / mean", "rewards / check_answer / mean"]


def grpo_rows(n: int) -> list[list[str]]:
    return [[str(s), "No log" if s == 1 else f"{0.01 * s:.6f}", f"{0.5 + 0.02 * s:.6f}", "0.300000", f"{200 + s}.000000",
             "0.000000", f"{0.001 * s:.6f}", "1.000000", f"{0.1 + 0.02 * s:.6f}"] for s in range(1, n + 1)]


def progress_html(header: list[str], rows: list[list[str]], done: int, total: int) -> str:
    """The transformers notebook progress display, as a saved notebook keeps it."""
    head = "".join(f"      <th>{h}</th>\n" for h in header)
    body = "".join("    <tr>\n" + "".join(f"      <td>{c}</td>\n" for c in r) + "    </tr>\n" for r in rows)
    return (f"\n    <div>\n      \n      <progress value='{done}' max='{total}' style='width:300px; height:20px;'></progress>\n"
            f"      [{done}/{total} 01:24, Epoch 0.5/1]\n    </div>\n    <table border=\"1\" class=\"dataframe\">\n  <thead>\n"
            f" <tr style=\"text-align: left;\">\n{head}    </tr>\n  </thead>\n  <tbody>\n{body}  </tbody>\n</table><p>")


def display(html: str) -> dict:
    return {"output_type": "display_data", "metadata": {},
            "data": {"text/html": html.splitlines(keepends=True), "text/plain": ["<IPython.core.display.HTML object>"]}}


def stream(text: str, name: str = "stdout") -> dict:
    return {"output_type": "stream", "name": name, "text": text.splitlines(keepends=True)}


def code(source: str, outputs: list[dict]) -> dict:
    return {"cell_type": "code", "execution_count": 1, "metadata": {}, "source": source.splitlines(keepends=True),
            "outputs": outputs}


def notebook(*cells: dict) -> dict:
    return {"cells": list(cells), "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def write(path: Path, obj) -> Path:
    path.write_text(json.dumps(obj, indent=1) if not isinstance(obj, str) else obj)
    return path


# --------------------------------------------------------------------------------- notebooks


def test_notebook_reads_the_progress_table_of_the_longest_training_run(tmp_path):
    dataset = ('<div><table border="1" class="dataframe"><thead><tr><th></th><th>answer</th><th>problem</th></tr>'
               "</thead><tbody><tr><th>0</th><td>14</td><td>Given x</td></tr><tr><th>6</th><td>-2</td><td>Find a</td></tr>"
               "</tbody></table></div>")
    sft = progress_html(["Step", "Training Loss"], [[str(5 * k), f"{1.2 - 0.1 * k:.6f}"] for k in range(1, 5)], 20, 20)
    nb = notebook(
        code("df.head()", [{"output_type": "execute_result", "data": {"text/html": dataset, "text/plain": "df"}}]),
        code("trainer.train()  # SFT first", [display(sft)]),
        code('model, tok = FastLanguageModel.from_pretrained(\n    model_name = "unsloth/gpt-oss-20b",\n)', []),
        code("trainer = GRPOTrainer(...)\ntrainer.train()", [
            stream("==((====))==  Unsloth - 2x faster free finetuning | Num GPUs used = 1\n", "stderr"),
            display(progress_html(GRPO_HEADER, grpo_rows(3), 3, 8)),  # the display while it trained
            stream("Question: what is 2+2?\nAnswer: 4\n"),
            display(progress_html(GRPO_HEADER, grpo_rows(8), 8, 8)),
            {"output_type": "execute_result", "data": {"text/plain": [
                "TrainOutput(global_step=8, training_loss=0.01, metrics={'train_runtime': 84.0, 'train_loss': 0.01, "
                "'epoch': 1.0})"]}},
        ]),
    )
    path = write(tmp_path / "grpo.ipynb", nb)
    assert detect_format(path) == "notebook"
    src = load_source(path)
    assert src.format == "notebook" and [s for s, _ in src.steps] == list(range(1, 9))
    names = src.metric_names()
    for name in ("loss", "reward", "reward_std", "completions/mean_length", "completions/clipped_ratio", "kl",
                 "rewards/match_format/mean", "rewards/check_answer/mean"):
        assert name in names, names
    assert not any(" / " in n or n == "Training Loss" for n in names)
    assert src.steps[0][1]["loss"] is None and src.steps[7][1]["reward"] == pytest.approx(0.66)
    assert "cell 4" in src.meta["table"] and "8 rows" in src.meta["table"]
    assert any("earlier snapshot" in w and "without a reward column" in w for w in src.warnings), src.warnings
    assert src.context.reward_names == ["match_format", "check_answer"]
    assert src.context.model["is_moe"] and src.context.model["num_experts"] == 32  # gpt-oss-20b, named in the code


def test_notebook_config_is_read_from_its_grpoconfig_cell(tmp_path):
    nb = notebook(
        code("%%capture\n!pip install unsloth trl\nmax_seq_length = 2048\nmax_prompt_length = 256", []),
        code("from trl import GRPOConfig\ntraining_args = GRPOConfig(learning_rate = 5e-6, num_generations = 2,\n"
             "    max_completion_length = max_seq_length - max_prompt_length, loss_type = 'dr_grpo',\n"
             "    max_steps = len(dataset), per_device_train_batch_size = 1)", []),
        code("training_args = GRPOConfig(learning_rate = 1e-5, num_generations = 4, max_completion_length = 1024)\n"
             "trainer.train()", [display(progress_html(GRPO_HEADER, grpo_rows(6), 6, 6))]),
    )
    src = load_source(write(tmp_path / "grpo.ipynb", nb))
    # The cell run last trains; a value computed from data is left out, never guessed.
    assert src.context.config == {"learning_rate": 1e-5, "num_generations": 4, "max_completion_length": 1024}
    assert "GRPOConfig" in src.meta["config_from"]
    first = load_source(write(tmp_path / "one.ipynb", notebook(*nb["cells"][:2], code("trainer.train()", nb["cells"][2]["outputs"]))))
    assert first.context.config["max_completion_length"] == 1792 and "max_steps" not in first.context.config
    # The report says where the settings its verdict rests on came from; a log without them says nothing.
    from grpo_monitor.analysis.analyze import analyze
    from grpo_monitor.analysis.render import render_text

    report = analyze(str(tmp_path / "grpo.ipynb"))
    text = render_text(report)
    assert "config: max_completion_length=1024, num_generations=4, learning_rate=1e-05 — from the notebook's code" in text
    run = report.to_dict()["runs"][0]
    assert run["config"] == src.context.config and "GRPOConfig" in run["config_from"]
    plain = notebook(code("trainer.train()", nb["cells"][2]["outputs"]))
    bare = analyze(str(write(tmp_path / "bare.ipynb", plain)))
    assert "\nconfig: " not in render_text(bare) and "config_from" not in bare.to_dict()["runs"][0]


def test_notebook_outputs_saved_as_a_list_of_records_with_the_table(tmp_path):
    outputs = [stream("Unsloth: Will smartly offload gradients\n"), display(progress_html(GRPO_HEADER, grpo_rows(6), 6, 6))]
    src = load_source(write(tmp_path / "cell_output.json", outputs))
    assert src.format == "notebook" and len(src.steps) == 6 and "rewards/check_answer/mean" in src.metric_names()


@pytest.mark.parametrize("lines", [
    "".join(f"Iteration {i}/12\n  Loss: {0.3 - 0.01 * i:.3f}\n  Average Reward: {0.4 + 0.02 * i:.2f}\n" for i in range(1, 13)),
    "".join(f"Average Reward: {0.4 + 0.02 * i:.2f}\nGenerating...\n" for i in range(1, 13)),
])
def test_notebook_hand_written_loop_lines(tmp_path, lines):
    nb = notebook(code("for it in range(12): ...", [stream("Loading model...\nAnswer: 4\n" + lines)]))
    src = load_source(write(tmp_path / "loop.ipynb", nb))
    assert src.format == "notebook" and src.meta["console_format"] == "console"
    assert [s for s, _ in src.steps] == list(range(1, 13))
    assert src.steps[-1][1]["reward"] == pytest.approx(0.64) and "Answer" not in src.metric_names()


def test_notebook_without_a_training_log_says_so(tmp_path):
    nb = notebook(code("print('hello')", [stream("hello\n")]))
    with pytest.raises(SourceError) as info:
        load_source(write(tmp_path / "empty.ipynb", nb))
    assert "empty.ipynb" in str(info.value) and "no table with a step column" in str(info.value)


# ----------------------------------------------------------------------------------- Kaggle


def kaggle_log(n: int = 20) -> list[dict]:
    recs = [{"stream_name": "stderr", "time": 2.1, "data": "Loading checkpoint shards: 100%|##########| 2/2\n"},
            {"stream_name": "stdout", "time": 3.0, "data": "Training with model_name_or_path=Qwen/Qwen3-30B-A3B\n"}]
    for k in range(1, n + 1):
        recs.append({"stream_name": "stderr", "time": 3.0 + k, "data": f"\r {100 * k // n}%|#    | {k}/{n} [00:{k:02d}<00:20,  1.0it/s]"})
        d = {"loss": "0.01", "grad_norm": "0.5", "learning_rate": "1e-06", "reward": f"{0.1 + 0.02 * k:.3f}",
             "reward_std": "0.3", "completions/mean_length": f"{100 + k}", "entropy": "0.8", "epoch": f"{k / n:.2f}"}
        recs.append({"stream_name": "stdout", "time": 3.5 + k, "data": str(d) + "\n"})
    return recs


def test_kaggle_log_reads_the_printed_dicts_of_its_records(tmp_path):
    path = write(tmp_path / "kernel.log", kaggle_log())
    assert detect_format(path) == "kaggle"
    src = load_source(path)
    assert src.format == "kaggle" and src.meta["console_format"] == "trl_console"
    assert [s for s, _ in src.steps] == list(range(1, 21))  # from the progress bar's position at each dict
    assert src.steps[-1][1]["reward"] == pytest.approx(0.5) and "entropy" in src.metric_names()
    assert src.context.model["is_moe"] and src.context.model["source"] == "the Kaggle log (model_name_or_path Qwen/Qwen3-30B-A3B)"


# ----------------------------------------------------------------------- step-like indexes


@pytest.mark.parametrize("index", ["iteration", "Iteration", "iter", "update", "global_step", "_step", "Step"])
def test_csv_indexed_like_a_step(tmp_path, index):
    rows = "".join(f"{10 * i},{0.1 + 0.01 * i},0.9,{150 + i}\n" for i in range(1, 31))
    src = load_source(write(tmp_path / "metrics.csv", f"{index},reward,entropy,response_length/mean\n{rows}"))
    assert src.format == "csv" and [s for s, _ in src.steps][:3] == [10, 20, 30]
    assert src.metric_names() == ["reward", "entropy", "completions/mean_length"]


def test_jsonl_indexed_by_iteration(tmp_path):
    lines = "".join(json.dumps({"iteration": i, "reward": 0.1 * i, "entropy": 0.5}) + "\n" for i in range(1, 6))
    src = load_source(write(tmp_path / "metrics.jsonl", lines))
    assert src.format == "jsonl" and [s for s, _ in src.steps] == [1, 2, 3, 4, 5]
    assert src.metric_names() == ["reward", "entropy"]


# ------------------------------------------------------------------ per-metric arrays per arm


def arms_results(n: int = 40) -> dict:
    return {"experiment": "entropy regularisation", "seeds": [1],
            "arms": [{"arm": arm, "seed": 1, "final_acc": 0.6,
                      "acc": [0.2 + 0.01 * i for i in range(n)], "entropy": [1.0 - drop * i / n for i in range(n)],
                      "grad_norm": [0.3] * n, "mean_len": [200 + i for i in range(n)]}
                     for arm, drop in (("baseline", 0.0), ("entropy_bonus", 0.5))]}


def test_results_json_holds_one_run_per_arm(tmp_path):
    path = write(tmp_path / "results.json", arms_results())
    src = load_source(path)
    assert src.format == "columns" and [label for label, _ in src.parts] == ["arm=baseline", "arm=entropy_bonus"]
    for _, part in src.parts:
        assert len(part.steps) == 40
        assert set(part.metric_names()) == {"rewards/acc/mean", "entropy", "grad_norm", "completions/mean_length"}
    reports = analyze(path).runs
    assert [r.source for r in reports] == [f"{path} [arm=baseline]", f"{path} [arm=entropy_bonus]"]
    assert all(r.steps == 40 and r.judged_by for r in reports)
    frame = grpo_monitor.load_run(path)
    assert sorted(set(frame["run"])) == ["arm=baseline", "arm=entropy_bonus"] and len(frame) == 80


def test_per_metric_arrays_further_down_and_a_lone_run(tmp_path):
    deep = {"meta": {"name": "x"}, "results": {"runs": [arms_results(10)["arms"][0]]}}
    src = load_source(write(tmp_path / "deep.json", deep))
    assert src.parts == [] and len(src.steps) == 10 and src.meta["read_from"] == "arm=baseline"
    # the top-level columns form reads as it always did
    src = load_source(write(tmp_path / "metrics.json", {"reward": [0.1, 0.2, None], "loss": [1, 2, 3]}))
    assert src.format == "columns" and src.steps[2][1] == {"reward": None, "loss": 3.0}


def test_a_json_object_without_arrays_says_what_it_lacks(tmp_path):
    path = write(tmp_path / "labels.json", {"run-a": {"expect": ["entropy_collapse"], "fail": 150, "note": "collapses"}})
    with pytest.raises(SourceError) as info:
        load_source(path)
    msg = str(info.value)
    assert "labels.json" in msg and "per-metric arrays" in msg and "'run-a'" in msg and "\n" not in msg


# ------------------------------------------------------------------------- tables in text

MARKDOWN = "# Training\n\n| Step | Training Loss | reward | kl |\n|---:|---:|---:|---:|\n" + "".join(
    f"| {s} | {0.01 * s:.4f} | {0.3 + 0.02 * s:.3f} | {0.001 * s:.4f} |\n" for s in range(1, 11)) + "\nDone.\n"
ALIGNED = "Training summary\n   step  reward  completion_length  entropy\n" + "".join(
    f"{s - 1:<3}{s:>5}{0.3 + 0.02 * s:>8.3f}{150 + s:>19}{0.8:>9.2f}\n" for s in range(1, 11))
RICH = "┏━━━━━━┳━━━━━━━━┳━━━━━━━━━┓\n┃ iter ┃ reward ┃ entropy ┃\n┡━━━━━━╇━━━━━━━━╇━━━━━━━━━┩\n" + "".join(
    f"│ {s:>4} │ {0.3 + 0.02 * s:>6.3f} │ {0.8:>7.2f} │\n" for s in range(1, 11)) + "└──────┴────────┴─────────┘\n"
HTML = "<html><body><h1>run</h1>" + progress_html(GRPO_HEADER, grpo_rows(10), 10, 10) + "</body></html>"


@pytest.mark.parametrize("text, kind, last", [(MARKDOWN, "markdown table", 0.5), (ALIGNED, "aligned columns", 0.5),
                                              (RICH, "markdown table", 0.5), (HTML, "HTML table", 0.7)])
def test_a_table_of_numbers_with_a_step_column(tmp_path, text, kind, last):
    path = write(tmp_path / "report.txt", text)
    assert detect_format(path) == "table"
    src = load_source(path)
    assert src.format == "table" and [s for s, _ in src.steps] == list(range(1, 11)), src.steps[:2]
    assert src.steps[-1][1]["reward"] == pytest.approx(last) and kind in src.meta["table"]
    assert "step" not in src.metric_names() and all(" / " not in n for n in src.metric_names())


def test_a_table_without_a_step_column_says_what_it_lacks(tmp_path):
    text = "| file | commit | rows |\n|---|---|---|\n| a.ipynb | 07a9d241 | 52 |\n| b.ipynb | 8081c7e4 | 100 |\n"
    with pytest.raises(SourceError) as info:
        load_source(write(tmp_path / "SOURCES.md", text))
    msg = str(info.value)
    assert "SOURCES.md" in msg and "no step-like column" in msg and "file, commit, rows" in msg


# ---------------------------------------------------------------------- one interface


def test_readers_are_tried_in_their_declared_order():
    loaded = readers.readers()
    assert [f"{type(r).__module__.rsplit('.', 1)[1]}:{type(r).__name__}" for r in loaded] == list(readers.READERS)
    assert all(isinstance(r, Reader) and r.name and r.formats for r in loaded)
    assert len({r.name for r in loaded}) == len(loaded)
    assert {"notebook", "kaggle", "table", "columns", "csv"} <= set(readers.FORMATS)


def test_adding_a_format_is_adding_a_reader(tmp_path, monkeypatch):
    class EventsReader(Reader):
        name = "events"
        formats = ("events",)

        def sniff(self, probe):
            return "events" if probe.start.startswith(b"#events") else None

        def read(self, probe, fmt):
            rows = [line.split() for line in probe.text().splitlines()[1:]]
            return Source(path=probe.path, format="events", steps=[(int(s), {"reward": float(r)}) for s, r in rows])

    path = write(tmp_path / "run.events", "#events\n1 0.5\n2 0.6\n")
    with pytest.raises(SourceError):
        load_source(path)
    monkeypatch.setattr(readers, "_LOADED", [EventsReader(), *readers.readers()])
    assert load_source(path).steps == [(1, {"reward": 0.5}), (2, {"reward": 0.6})]
    assert "events" in readers.FORMATS
