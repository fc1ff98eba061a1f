"""Reference rewards in a real GRPOTrainer on the tiny model, monitor attached."""

from __future__ import annotations

import json
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.conftest import train_tiny

pytest.importorskip("trl")


def _logged(trainer, key):
    return [h[key] for h in trainer.state.log_history if key in h]


class _FlakyJudge(BaseHTTPRequestHandler):
    """An OpenAI-shaped judge that answers, fails with 500, stalls past the timeout or talks nonsense."""

    n = [0]

    def log_message(self, *a):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        k = type(self).n[0] = type(self).n[0] + 1
        if k % 4 == 1:
            self.send_response(500)
            self.end_headers()
            return
        if k % 4 == 2:
            time.sleep(0.6)
        content = "no idea" if k % 4 == 3 else '{"score": 6}'
        data = json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def test_composite_reward_trains_with_the_monitor(tmp_path):
    from grpo_monitor.rewards import JudgeReward, SoftOverlong, format_and_correctness

    server = ThreadingHTTPServer(("127.0.0.1", 0), _FlakyJudge)
    server.request_queue_size = 64
    threading.Thread(target=server.serve_forever, daemon=True).start()
    judge = JudgeReward("Is the sum right?", base_url=f"http://127.0.0.1:{server.server_address[1]}/v1",
                        timeout=0.3, retries=1, backoff=0.01, concurrency=4)
    fmt, acc = format_and_correctness(answer_column="target")
    funcs = [fmt, acc, SoftOverlong(None, max_completion_length := 16, 4), judge]
    try:
        trainer, callback = train_tiny(tmp_path / "run", steps=3, reward_funcs=funcs,
                                       max_completion_length=max_completion_length)
    finally:
        server.shutdown()
        server.server_close()
    assert judge.stats["requests"] >= 24 and judge.stats["failures"] > 0  # failures became None, not exceptions
    judged = _logged(trainer, "rewards/rubric_judge/mean")
    assert len(judged) == 3 and any(v == pytest.approx(0.6) for v in judged)  # TRL averages over the scored ones
    fmt_means = _logged(trainer, "rewards/answer_format/mean")
    acc_means = _logged(trainer, "rewards/exact_match/mean")
    assert len(fmt_means) == 3 and len(acc_means) == 3
    assert all(0.0 <= v <= 1.0 for v in fmt_means + acc_means)
    assert max(fmt_means) > 0  # the warm-started model writes the answer format
    assert all(math.isfinite(v) for v in _logged(trainer, "rewards/soft_overlong_punishment/mean"))
    logged = (tmp_path / "run").rglob("*.jsonl")
    assert any("exact_match" in p.read_text() for p in logged), "the monitor saw the reference's component"


def test_unit_test_reward_trains_on_a_tiny_code_task(tmp_path):
    import transformers
    from datasets import Dataset
    from trl import GRPOTrainer

    from grpo_monitor.callbacks import attach
    from grpo_monitor.fixtures.tiny import build_model, build_tokenizer, task_rows
    from grpo_monitor.app.demo import demo_config
    from grpo_monitor.rewards import Limits, Sandbox, UnitTestReward

    transformers.logging.set_verbosity_error()
    # The task: a program that runs cleanly and prints what the test expects. The tiny model's
    # "7" or "3 + 4" is a valid Python program printing nothing; "<answer> 7 </answer>" is not.
    rows = task_rows(16)
    data = Dataset.from_dict({
        "prompt": [r["prompt"] for r in rows],
        "tests": [json.dumps([{"input": "", "output": ""}])] * len(rows),
    })
    reward = UnitTestReward(sandbox=Sandbox(Limits(wall=3.0, cpu=2, memory=512 << 20), workers=2))
    calls = []

    class Recording(UnitTestReward):
        def __call__(self, *a, **kw):
            out = super().__call__(*a, **kw)
            calls.append(out)
            return out

    reward = Recording(sandbox=reward.sandbox, name="unit_tests")
    args = demo_config(tmp_path / "trainer", 2)
    trainer = GRPOTrainer(model=build_model(warm_start=150), reward_funcs=[reward], args=args,
                          train_dataset=data, processing_class=build_tokenizer())
    attach(trainer, tmp_path / "run")
    trainer.train()
    means = _logged(trainer, "rewards/unit_tests/mean")
    assert len(means) == 2 and all(0.0 <= m <= 1.0 for m in means)
    assert len(calls) == 2 and all(len(c) == 8 for c in calls)
    assert all(v in (0.0, 1.0) for c in calls for v in c)  # one test each: pass or fail, never None


def test_judge_with_a_local_transformers_model_never_raises():
    from grpo_monitor.fixtures.tiny import build_model, build_tokenizer
    from grpo_monitor.rewards import JudgeReward, local_judge

    gen = local_judge(build_model(warm_start=150), build_tokenizer(), max_new_tokens=8)
    j = JudgeReward("answer with the right sum", generate=gen, retries=1, backoff=0.0)
    out = j(prompts=["What is 3 + 4 ? Answer :"] * 2, completions=["<answer> 7 </answer>", "<answer> 5 </answer>"])
    # the tiny model is no judge: its text holds no score in range, so both are None, quietly
    assert len(out) == 2 and all(v is None or 0.0 <= v <= 1.0 for v in out)
    assert j.stats["requests"] >= 2
