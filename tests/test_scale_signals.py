"""Production-scale sample handling: text signals measured on the whole completion, the compact
rank exchange, fair bounded work, the retention policy, and samples read a step at a time."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from grpo_monitor.callbacks.reward_tap import RewardTap, SampleRetention, exchange_size, pack_samples, unpack_samples
from grpo_monitor.detectors.base import RunContext
from grpo_monitor.detectors.degenerate_long_cot import DegenerateLongCot, long_completion_repetition
from grpo_monitor.detectors.entropy_collapse import duplicate_share
from grpo_monitor.detectors.signals import fair_sample, groups_of, repeated_ngram_share
from grpo_monitor.core.engine import Engine
from grpo_monitor.core.runlog_writer import RunWriter
from grpo_monitor.core.sample_index import SampleIndex, StepSamples
from grpo_monitor.core.runlog import read_run

EOS = 2
G = 16
rng = random.Random(7)
WORDS = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 8))) for _ in range(3000)]


def prose(n_words: int, seed: int) -> str:
    r = random.Random(seed)
    return " ".join(r.choice(WORDS) for _ in range(n_words))


def looping_completion(tokens: int = 16_000, loop_tokens: int = 3_000, seed: int = 0) -> str:
    """About 4 characters per token: healthy prose, then one sentence repeated for the last 3k tokens."""
    body = prose(tokens * 4 // 6, seed)[: (tokens - loop_tokens) * 4]
    loop = "so the answer is the same as before and we check it again "
    return body + (loop * (loop_tokens * 4 // len(loop) + 1))[: loop_tokens * 4]


def tap_records(completions: list[str], step: int = 1, rewards: list[float] | None = None,
                truncated: list[bool] | None = None, rank: int = 0, **tap_kw) -> tuple[RewardTap, list[dict]]:
    """Records of one generation batch through a real tap, called as TRL calls a reward function."""
    n = len(completions)
    tap = RewardTap(["accuracy_reward"], num_generations=G, eos_and_pad=[EOS, 0], process_index=rank,
                    correctness_reward="accuracy_reward", **tap_kw)
    scores = rewards if rewards is not None else [float(i % 2) for i in range(n)]
    wrapped = tap.wrap(lambda prompts, completions, completion_ids, **kw: scores, "accuracy_reward")
    ids = [[5] * (4 * len(c) // 16) + [5 if (truncated and truncated[i]) else EOS] for i, c in enumerate(completions)]
    wrapped(prompts=[f"prompt {i // G}" for i in range(n)], completions=completions, completion_ids=ids)
    return tap, tap.drain(step)


# -- text signals from the whole completion -----------------------------------------------------


def test_a_completion_looping_in_its_last_3k_tokens_is_seen_by_the_tap_and_the_detector():
    looping = [looping_completion(seed=i) for i in range(8)]
    healthy = [prose(2600, 100 + i) for i in range(8)]
    tap, records = tap_records(looping + healthy)
    assert len(looping[0]) >= 64_000
    loop_reps = [r["tail_rep"] for r in records[:8]]
    assert min(loop_reps) >= 0.9 and max(r["tail_rep"] for r in records[8:]) < 0.1
    assert all(r["chars"] == len(c) for r, c in zip(records, looping + healthy))
    # The excerpt the run keeps has the tail, so a foreign reader of the text sees the loop too.
    tap.add_text(records)
    assert repeated_ngram_share(records[0]["completion"]) >= 0.5
    assert records[0]["completion"].startswith(looping[0][:500]) and records[0]["completion"].endswith(looping[0][-500:])
    # What the detectors read without any text: the numbers alone.
    numbers_only = [{k: v for k, v in r.items() if k not in ("prompt", "completion")} for r in records]
    assert long_completion_repetition(numbers_only) >= 0.9
    # Reading the first 2,000 characters (what used to be kept) would have seen nothing.
    head_only = [{**r, "completion": c[:2000]} for r, c in zip(numbers_only, looping + healthy)]
    for r in head_only:
        del r["tail_rep"]
    assert long_completion_repetition(head_only) < 0.1

    det = DegenerateLongCot()
    det.start(RunContext(config={"max_completion_length": 16_384}))
    clean = [{**r, "tail_rep": 0.01} for r in numbers_only]
    for step in range(1, 41):
        det.update(step, {"entropy": 0.5, "completions/mean_length": 9000.0, "completions/clipped_ratio": 0.02,
                          "reward": 0.5}, clean)
    for step in range(41, 61):
        det.update(step, {"entropy": 0.5, "completions/mean_length": 9000.0, "completions/clipped_ratio": 0.02,
                          "reward": 0.5}, [{**r, "step": step} for r in numbers_only])
    assert det.repetition.ready and det.repetition.recent(3) >= 0.9 and det.repetition.base <= 0.05


def test_completions_sharing_their_first_8000_characters_are_not_duplicates():
    head = prose(2000, 1)[:8000]
    assert len(head) == 8000
    distinct = [head + " " + prose(600, 50 + i) for i in range(G)]
    _, records = tap_records(distinct)
    numbers_only = [{k: v for k, v in r.items() if k not in ("prompt", "completion")} for r in records]
    assert duplicate_share(numbers_only) == 0.0
    same = [head + " the end"] * G
    _, records = tap_records(same)
    assert duplicate_share(records) == pytest.approx(1 - 1 / G)
    # A log without the fingerprints (foreign, or older) falls back to the recorded text.
    assert duplicate_share([{"group": 0, "completion": t} for t in same]) == pytest.approx(1 - 1 / G)


# -- the rank exchange -------------------------------------------------------------------------


def test_ranks_exchange_numbers_only_in_a_few_dozen_bytes_per_completion():
    completions = [prose(2000, i) for i in range(63)] + ["!!!! " * 5000]
    _, records = tap_records(completions, rank=1, truncated=[i % 9 == 0 for i in range(64)])
    assert records[-1]["top_word"] == 1.0 and records[-1]["tail_rep"] > 0.9
    assert all("top_word" not in r for r in records[:-1])  # recorded only where one word dominates
    records[3]["rewards"]["accuracy_reward"] = None
    payload = (pack_samples(records), [("entropy_collapse", "warning", 3)])
    size = exchange_size(payload)
    assert size / len(records) <= 300 and size < sum(len(c) for c in completions) / 100
    back = unpack_samples(payload[0])
    assert back == records  # every number exactly, nothing else
    assert all("completion" not in r for r in back)


# -- fair bounded work -------------------------------------------------------------------------


def test_bounded_work_takes_a_fair_deterministic_sample_of_groups():
    rows = [{"step": 9, "group": g, "index": g * 4 + k} for g in range(1000) for k in range(4)]
    picked = fair_sample(rows, 400)
    groups = {r["group"] for r in picked}
    assert len(picked) == 400 and len(groups) == 100
    assert all(sum(1 for r in picked if r["group"] == g) == 4 for g in groups)  # whole groups
    assert max(groups) > 500 and min(groups) < 500  # not the first ranks' prompts only
    assert picked == fair_sample([dict(r) for r in rows], 400)  # the same draw, live and in replay
    assert set(groups_of(rows, 400)) == groups
    other_step = fair_sample([{**r, "step": 10} for r in rows], 400)
    assert {r["group"] for r in other_step} != groups


# -- retention -------------------------------------------------------------------------------


def test_default_retention_keeps_numbers_for_all_and_text_for_a_bounded_fair_set_and_extremes():
    n = 1024
    rewards = [random.Random(i).random() for i in range(n)]
    truncated = [i % 50 == 0 for i in range(n)]
    tap, records = tap_records([prose(300, i) for i in range(n)], rewards=rewards, truncated=truncated, max_text_chars=500)
    policy = SampleRetention()
    keep = policy.select(records, step=1)
    assert keep == policy.select([dict(r) for r in records], step=1)
    assert policy.fair <= len(keep) <= policy.fair + 2 * policy.groups + policy.truncated
    kept = [r for r in records if (r["rank"], r["index"]) in keep]
    assert sum(r["truncated"] for r in kept) >= policy.truncated
    by_group: dict[int, list[dict]] = {}
    for r in records:
        by_group.setdefault(r["group"], []).append(r)
    extremes = 0
    for rows in by_group.values():
        best = max(rows, key=lambda r: r["rewards"]["accuracy_reward"])
        worst = min(rows, key=lambda r: r["rewards"]["accuracy_reward"])
        extremes += ((best["rank"], best["index"]) in keep) + ((worst["rank"], worst["index"]) in keep)
    assert extremes >= 2 * policy.groups
    assert tap.add_text(records, lambda r: (r["rank"], r["index"]) in keep) == len(keep)
    assert all(("completion" in r) == ((r["rank"], r["index"]) in keep) for r in records)
    assert all(len(r["completion"]) <= 500 + 60 for r in records if "completion" in r)
    assert all("tail_rep" in r and "text_hash" in r for r in records)
    # A small step keeps every text; "all" and "none" do what they say.
    assert SampleRetention().select(records[:20], step=1) == {(0, i) for i in range(20)}
    assert len(SampleRetention.of("all").select(records, 1)) == n
    assert SampleRetention.of("none").select(records, 1) == set()
    with pytest.raises(ValueError):
        SampleRetention.of("most")


def test_the_reward_gate_reads_a_samples_file_with_numbers_only_records(tmp_path: Path):
    from grpo_monitor.preflight.reward_gate import read_samples_file

    tap, records = tap_records([prose(50, i) for i in range(40)])
    tap.add_text(records, lambda r: r["index"] % 4 == 0)
    w = RunWriter(tmp_path)
    w.samples(records)
    w.close()
    samples = read_samples_file(tmp_path / "samples.rank0.jsonl")
    assert len(samples) == 10 and all(s["completion"] and "tail_rep" not in s["columns"] for s in samples)


# -- samples read a step at a time -------------------------------------------------------------


def write_two_ranks(d: Path, steps: int = 6, per_rank: int = 8) -> None:
    for rank in (0, 1):
        w = RunWriter(d, rank=rank)
        if rank == 0:
            w.header(run_id="r", config={"num_generations": 4})
        for s in range(1, steps + 1):
            w.samples([{"step": s, "rank": rank, "index": rank * per_rank + i, "group": (rank * per_rank + i) // 4,
                        "length": 10 + i + s, "truncated": i == 0, "rewards": {"f": float(i % 3), "g": None},
                        "correct": i % 2 == 0, "completion": f"{'x ' * i}{s}"} for i in range(per_rank)])
            if rank == 0:
                w.step(s, {"entropy": 1.0 / s}, time=0.0)
        w.close()


def test_sample_index_reads_each_step_as_read_run_merges_it(tmp_path: Path):
    write_two_ranks(tmp_path)
    # A torn last line (a writer killed mid-record) is left out, as read_run leaves it out.
    with open(tmp_path / "samples.rank1.jsonl", "ab") as fh:
        fh.write(b'{"type":"sample","step":6,"rank":1,"ind')
    log = read_run(tmp_path)
    idx = SampleIndex(tmp_path)
    idx.scan(final=True)
    assert idx.steps() == sorted(log.samples_by_step()) and idx.count == len(log.samples)
    for step, rows in log.samples_by_step().items():
        assert idx.load(step) == rows
    lazy = StepSamples(idx)
    assert sorted(lazy) == list(range(1, 7)) and lazy[3] == log.samples_by_step()[3] and 99 not in lazy
    # The replay reads the steps one at a time and finds what the in-memory replay finds.
    steps = [(r["step"], r["metrics"]) for r in log.steps]
    a = Engine(RunContext()).replay(steps, lazy)
    b = Engine(RunContext()).replay(steps, log.samples_by_step())
    assert [f.to_dict() for f in a] == [f.to_dict() for f in b]


def test_sample_index_grows_with_the_files_and_reads_other_writers_lines(tmp_path: Path):
    w = RunWriter(tmp_path)
    w.samples([{"step": 1, "index": i} for i in range(3)])
    idx = SampleIndex(tmp_path)
    assert idx.scan() is False and idx.count == 3
    path = tmp_path / "samples.rank0.jsonl"
    with open(path, "ab") as fh:  # a record written with other separators, and one still being written
        fh.write(json.dumps({"type": "sample", "step": 2, "index": 0}).encode() + b"\n" + b'{"type":"sample","st')
    idx.scan()
    assert idx.steps() == [1, 2] and idx.count == 4
    with open(path, "ab") as fh:
        fh.write(b'ep":2,"index":1}\n')
    w.samples([{"step": 3, "index": i} for i in range(2)])
    w.close()
    idx.scan()
    assert [len(idx.load(s)) for s in (1, 2, 3)] == [3, 2, 2] and idx.count == 7


def test_the_dashboard_tailer_indexes_samples_instead_of_parsing_them(tmp_path: Path):
    from grpo_monitor.app.dashboard.model import RunModel
    from grpo_monitor.app.dashboard.tail import RunTailer

    write_two_ranks(tmp_path)
    tailer = RunTailer(tmp_path, index_samples=True)
    first = tailer.poll()  # the run's records first, then the samples' index
    assert first.more and [r["type"] for r in first.records].count("step") == 6
    batch = tailer.poll()
    assert not [r for r in first.records + batch.records if r["type"] == "sample"] and batch.samples_grew
    model = RunModel()
    model.ingest(first.records)
    assert model.set_sample_indexes(batch.sample_indexes)
    assert model.sample_count == 96 and model.sample_steps() == list(range(1, 7))
    assert [r["index"] for r in model.samples_of(4)] == list(range(16))
    assert model.samples == read_run(tmp_path).samples_by_step()[1] + [r for s in range(2, 7) for r in model.samples_of(s)]


def test_the_tap_measures_alike_on_its_worker_thread_and_inline():
    completions = [looping_completion(tokens=2000, loop_tokens=600, seed=i) for i in range(4)] + [prose(400, 9)] * 4
    _, threaded = tap_records(completions)
    _, inline = tap_records(completions, background=False)
    assert threaded == inline and all("tail_rep" in r for r in inline)
