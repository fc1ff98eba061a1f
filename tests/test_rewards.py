"""Reference reward functions on real inputs: answers as GSM8K and MATH write them, JSON in and out
of fences, plain and conversational completions, and a judge behind a real HTTP server."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from grpo_monitor.rewards import (
    ExactMatchReward,
    FormatReward,
    JudgeReward,
    SchemaReward,
    SoftOverlong,
    exact_match,
    extract_answer,
    extract_json,
    format_and_correctness,
    json_schema,
    parse_score,
)


def conv(text):
    return [{"role": "assistant", "content": text}]


# -- exact match -----------------------------------------------------------------------------------

GSM8K_GOLD = ("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips "
              "altogether in April and May.\n#### 72")
MATH_GOLD = r"The probability is $\frac{5}{9} \cdot \frac{3}{5} = \boxed{\frac{1}{3}}$."

CASES = [
    # (completion, gold, expected)
    ("She sold 24 in May, so 48 + 24 = 72.\n#### 72", GSM8K_GOLD, 1.0),
    ("She sold 72 clips in total.", GSM8K_GOLD, 1.0),  # last number
    ("The answer is 73.", GSM8K_GOLD, 0.0),
    ("It costs $1,250.", "1250", 1.0),  # thousands separator, dollar sign
    (r"\boxed{\$1,250}", "1250", 1.0),  # an escaped dollar sign goes whole
    ("The bill is 18 dollars.", "#### 18", 1.0),  # unit word after the number
    (r"So the answer is $\boxed{0.3333}$", MATH_GOLD, 0.0),  # a rounded decimal is not 1/3
    (r"Thus $\boxed{\dfrac{1}{3}}$.", MATH_GOLD, 1.0),  # \dfrac vs \frac
    (r"\boxed{\frac13}", MATH_GOLD, 1.0),
    (r"\boxed{2/6}", MATH_GOLD, 1.0),  # an unreduced fraction
    (r"\boxed{\frac{1}{2}}", "0.5", 1.0),
    (r"\boxed{5\text{ cm}}", "5", 1.0),  # units in \text{}
    (r"\boxed{90^\circ}", "90", 1.0),
    (r"\boxed{2\sqrt{2}}", r"\sqrt{8}", 1.0),  # math-verify
    (r"\boxed{(x+1)^2}", "x^2+2x+1", 1.0),  # math-verify
    (r"\boxed{\left( 3, \frac{\pi}{2} \right)}", r"\left( 3, \frac{\pi}{2} \right)", 1.0),
    (r"\boxed{x+2}", "x+1", 0.0),
    ("<answer> 7 </answer>", "7", 1.0),
    ("<answer>seven</answer> but 7", "7", 0.0),  # the tagged answer wins over a later number
    ("I cannot answer.", "7", 0.0),  # nothing extractable: a wrong answer, not unscorable
]


@pytest.mark.parametrize("completion,gold,expected", CASES)
def test_exact_match_plain_and_conversational(completion, gold, expected):
    assert exact_match(prompts=["q"], completions=[completion], answer=[gold]) == [expected]
    assert exact_match(prompts=[[{"role": "user", "content": "q"}]], completions=[conv(completion)],
                       answer=[gold]) == [expected]


def test_exact_match_reads_the_usual_gold_columns_and_skips_unscorable_rows():
    assert exact_match(completions=[r"\boxed{4}"], solution=[r"so $\boxed{4}$"]) == [1.0]
    assert exact_match(completions=["4"], target=["4"]) == [1.0]
    assert exact_match(completions=["4"], ground_truth=[4]) == [1.0]  # a number, not a string
    assert exact_match(completions=["4", "4", "4"], answer=[None, "", r"\boxed{}"]) == [None, None, None]
    assert exact_match(completions=["4"]) == [None]  # no gold column at all
    custom = ExactMatchReward(answer_column="label")
    assert custom(completions=["<answer>4</answer>"], label=["4"], answer=["5"]) == [1.0]


def test_exact_match_string_mode_for_non_maths_tasks():
    r = ExactMatchReward(mode="string")
    got = r(completions=["<answer>Paris</answer>", "<answer>  paris. </answer>", "<answer>Lyon</answer>",
                         "The answer is New  York"],
            answer=["Paris", "Paris", "Paris", "new york"])
    assert got == [1.0, 1.0, 0.0, 1.0]
    assert r(completions=["<answer>1/2</answer>"], answer=["0.5"]) == [0.0]  # no maths in string mode


def test_exact_match_string_reads_gsm8k_gold_and_bare_answers():
    from grpo_monitor.rewards import exact_match_string
    said = ["12", "#### 12", "The answer is 12.", r"\boxed{12}", "13", "The answer is 13."]
    assert exact_match_string(completions=said, answer=["#### 12"] * len(said)) == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0]
    # A completion that is only its answer marks nothing, and is still that answer.
    assert exact_match_string(completions=["Paris", " paris. ", "London", "Paris " * 60],
                              answer=["Paris"] * 4) == [1.0, 1.0, 0.0, 0.0]


def test_extract_answer_priorities():
    assert extract_answer(r"first \boxed{1} then \boxed{\frac{2}{3}}") == (r"\frac{2}{3}", "boxed")
    assert extract_answer(r"\boxed{\{1, 2\}}") == (r"\{1, 2\}", "boxed")  # nested braces
    assert extract_answer("<answer>a</answer> <answer>b</answer>") == ("b", "answer_tag")
    assert extract_answer("work\n#### 1,234") == ("1,234", "gsm8k")
    assert extract_answer("Final answer: 12") == ("12", "stated")
    assert extract_answer("x is -3.5 or 2") == ("2", "last_number")
    assert extract_answer("") is None and extract_answer("no digits") is None


# -- schema -------------------------------------------------------------------------------------------

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
          "required": ["name", "age"], "additionalProperties": False}


def test_schema_fenced_bare_invalid_and_missing():
    r = SchemaReward(SCHEMA)
    comps = [
        'Here you go:\n```json\n{"name": "Ada", "age": 36}\n```',
        'Sure! {"name": "Ada", "age": 36} hope this helps',
        '```\n{"name": "Ada", "age": 36}\n```',  # an untagged fence
        '```json\n{"name": "Ada", "age": -1}\n```',  # parses, invalid
        '{"name": "Ada"}',  # parses, a required field missing
        '```json\n{"name": "Ada", "age": 36,}\n```',  # not JSON
        "no json here",
        'thinking {about it}... final: {"name": "Bo", "age": 3}',  # the last parseable object
    ]
    assert r(completions=comps) == [1.0, 1.0, 1.0, 0.5, 0.5, 0.0, 0.0, 1.0]
    assert r(completions=[conv(c) for c in comps]) == [1.0, 1.0, 1.0, 0.5, 0.5, 0.0, 0.0, 1.0]


def test_schema_per_row_column_and_unscorable_rows():
    comps = ['{"a": 1}', '{"a": 1}', '{"a": 1}', '{"a": 1}']
    schemas = [{"type": "object", "required": ["a"]}, json.dumps({"required": ["b"]}), "not a schema", None]
    assert json_schema(completions=comps, schema=schemas) == [1.0, 0.5, None, None]
    assert json_schema(completions=['[1, 2]'], schema=[{"type": "array", "items": {"type": "integer"}}]) == [1.0]
    assert SchemaReward(SCHEMA, partial=0.0)(completions=['{"name": 1}']) == [0.0]
    with pytest.raises(Exception):
        SchemaReward({"type": "no-such-type"})  # a broken fixed schema is reported at construction
    assert extract_json("nothing") is extract_json.NOTHING
    assert extract_json("null") is extract_json.NOTHING  # a bare null is not an object or array


# -- length penalty ----------------------------------------------------------------------------------


@pytest.mark.parametrize("max_len,cache", [(100, 20), (16, 4), (20, 7), (8, 0), (5, 5)])
def test_soft_overlong_agrees_with_trl(max_len, cache):
    from trl.rewards import get_soft_overlong_punishment

    trl_fn = get_soft_overlong_punishment(max_completion_len=max_len, soft_punish_cache=cache)
    ids = [[1] * n for n in range(0, 2 * max_len + 3)]
    ours = SoftOverlong(None, max_len, cache)(prompts=[""] * len(ids), completions=["x"] * len(ids), completion_ids=ids)
    theirs = trl_fn(completion_ids=ids)
    assert len(ours) == len(theirs)
    assert max(abs(a - b) for a, b in zip(ours, theirs)) <= 1e-9


def test_soft_overlong_wraps_a_reward_and_keeps_none():
    from trl.rewards import get_soft_overlong_punishment

    wrapped = SoftOverlong(exact_match, 10, 4)
    ids = [[0] * 5, [0] * 8, [0] * 12, [0] * 8]
    got = wrapped(completions=["<answer>7</answer>"] * 4, completion_ids=ids, answer=["7", "7", "7", None])
    pen = get_soft_overlong_punishment(10, 4)(completion_ids=ids)
    assert got[:3] == pytest.approx([1.0 + pen[0], 1.0 + pen[1], 1.0 + pen[2]], abs=1e-12)
    assert got[3] is None
    assert wrapped.__name__ == "exact_match_overlong"
    words = SoftOverlong(None, 4, 2)(completions=["a b c d e f", conv("a b")])  # no ids: words
    assert words == [-1.0, 0.0]


# -- composite ---------------------------------------------------------------------------------------


def test_format_and_correctness_pair_separates_wrong_from_malformed():
    fmt, acc = format_and_correctness(answer_column="target")
    comps = ["<answer> 7 </answer>", "<answer> 6 </answer>", "7", "<answer></answer>", "<answer>7</answer> extra"]
    f = fmt(completions=comps)
    a = acc(completions=comps, target=["7"] * 5)
    assert f == [1.0, 1.0, 0.0, 0.0, 0.0]
    assert a == [1.0, 0.0, 1.0, 0.0, 1.0]
    totals = [x + y for x, y in zip(f, a)]
    assert totals[1] != totals[3]  # a well-formatted wrong answer and a malformed one differ
    assert FormatReward("think_answer")(completions=["<think>hm</think> <answer>1</answer>", "<answer>1</answer>"]) == [1.0, 0.0]
    assert FormatReward("boxed")(completions=[conv(r"so \boxed{3}"), "3"]) == [1.0, 0.0]
    assert (fmt.__name__, acc.__name__) == ("answer_format", "exact_match")


# -- judge against a real server -----------------------------------------------------------------------


class _Judge(BaseHTTPRequestHandler):
    mode = {"value": "ok"}
    calls: list[str] = []

    def log_message(self, *a):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        user = body["messages"][-1]["content"]
        type(self).calls.append(user)
        mode = type(self).mode["value"]
        if "FAIL500" in user or mode == "500":
            self.send_response(500)
            self.end_headers()
            self.wfile.write(b"boom")
            return
        if "SLOW" in user or mode == "slow":
            time.sleep(1.5)
        if "MALFORMED" in user or mode == "malformed":
            content = "I think it is pretty good overall."
        elif "NOTJSON" in user:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b"<html>")
            return
        elif "GOOD" in user:
            content = '{"score": 9, "reason": "meets the rubric"}'
        elif "TEXTSCORE" in user:
            content = "Reasoning... Score: 4"
        else:
            content = '```json\n{"score": 2, "reason": "misses most points"}\n```'
        data = json.dumps({"id": "x", "object": "chat.completion",
                           "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                                        "finish_reason": "stop"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def judge_server():
    _Judge.calls = []
    _Judge.mode["value"] = "ok"
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Judge)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def test_judge_scores_failures_are_none_and_cached(judge_server):
    j = JudgeReward("Is the answer polite and correct?", base_url=judge_server, model="judge", timeout=0.5,
                    retries=1, backoff=0.01, concurrency=4)
    comps = ["GOOD answer", "weak answer", "TEXTSCORE answer", "FAIL500", "SLOW answer", "MALFORMED", "NOTJSON",
             conv("GOOD answer")]
    got = j(prompts=["p"] * len(comps), completions=comps)
    assert got == [0.9, 0.2, 0.4, None, None, None, None, 0.9]
    # failures are retried (bounded), then given up: 2 tries each for the 4 failures
    assert j.stats["failures"] == 4 and j.stats["retries"] == 4
    n = len(_Judge.calls)
    again = j(prompts=["p"] * len(comps), completions=comps)
    assert again == got
    assert len(_Judge.calls) == n + 4 * 2  # the successes came from the cache; the failures were asked again
    # the cache key includes the rubric and the prompt
    j(prompts=["another prompt"], completions=["GOOD answer"])
    assert len(_Judge.calls) == n + 9


def test_judge_called_as_trl_calls_it_never_raises(judge_server):
    _Judge.mode["value"] = "500"
    j = JudgeReward("r", base_url=judge_server, timeout=0.5, retries=2, backoff=0.01)
    out = j(prompts=["p"] * 3, completions=["a", "b", "c"], completion_ids=None, trainer_state=None,
            log_extra=lambda *a: None, log_metric=lambda *a: None)
    assert out == [None, None, None]
    dead = JudgeReward("r", base_url="http://127.0.0.1:9/v1", timeout=0.5, retries=0)
    assert dead(prompts=["p"], completions=["a"]) == [None]  # refused connection
    with pytest.raises(ValueError):
        JudgeReward("r")  # neither an endpoint nor a local judge


def test_judge_local_callable_and_rubric_column():
    seen = []

    def gen(messages):
        seen.append(messages)
        if "explode" in messages[-1]["content"]:
            raise RuntimeError("local model crashed")
        return '{"score": 10}' if messages[-1]["content"].endswith("Response:\ngreat") else '{"score": 15}'

    j = JudgeReward(generate=gen, rubric_column="rubric", retries=0)
    assert j(prompts=["p", "p", "p", "p"], completions=["great", "meh", "explode", "great"],
             rubric=["be great", "be great", "x", None]) == [1.0, None, None, None]
    assert "be great" in seen[0][-1]["content"]


def test_parse_score_forms():
    assert parse_score('{"score": 7}', 10) == 0.7
    assert parse_score('{"score": "3"}', 10) == 0.3
    assert parse_score("score = 5", 10) == 0.5
    assert parse_score("I give it 8/10", 10) == 0.8
    assert parse_score('{"score": 11}', 10) is None
    assert parse_score("no number", 10) is None
    assert parse_score('{"score": true}', 10) is None


# -- light import ---------------------------------------------------------------------------------------


def test_rewards_package_is_light_to_import():
    code = ("import sys, grpo_monitor, grpo_monitor.rewards; from grpo_monitor.rewards import exact_match, json_schema, "
            "unit_test_reward, SoftOverlong, JudgeReward, format_and_correctness\n"
            "heavy = [m for m in ('torch', 'transformers', 'trl', 'textual', 'math_verify', 'sympy', 'jsonschema') "
            "if m in sys.modules]\nprint(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    code2 = "import sys, grpo_monitor, grpo_monitor\nprint('grpo_monitor.rewards' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code2], capture_output=True, text=True, timeout=60).stdout.strip() == "False"


def test_references_are_picklable_for_trl_workers():
    import pickle

    from grpo_monitor.rewards import unit_test_reward

    for f in (exact_match, json_schema, unit_test_reward, SoftOverlong(exact_match, 8, 2), FormatReward(),
              JudgeReward("r", base_url="http://127.0.0.1:9/v1")):
        g = pickle.loads(pickle.dumps(f))
        assert g.__name__ == f.__name__


def test_stated_answers_end_where_their_reasons_begin():
    from grpo_monitor.rewards import exact_match, extract_answer

    assert extract_answer("The answer is 12, since 3 x 4 = 12.") == ("12", "stated")
    assert extract_answer("Answer: 7 (seven)") == ("7", "stated")
    assert extract_answer("So the answer is 1,234; easy.") == ("1,234", "stated")
    assert extract_answer("The final answer is x = 5") == ("x = 5", "stated")
    assert exact_match(completions=["The answer is 12, since 3 x 4 = 12.", "Answer: 7 (seven)"],
                       answer=["12", "7"]) == [1.0, 1.0]


def test_exact_match_without_its_gold_column_warns_once_naming_it(caplog):
    from grpo_monitor.rewards import ExactMatchReward

    reward = ExactMatchReward()
    with caplog.at_level("WARNING"):
        assert reward(completions=["The answer is 12."], gold=["12"]) == [None]
        assert reward(completions=["The answer is 12."], gold=["12"]) == [None]
    [line] = [r.getMessage() for r in caplog.records if "no gold answer" in r.getMessage()]
    assert "answer, solution, target, ground_truth, final_answer, reference" in line and "gives gold" in line
    assert "answer_column='gold'" in line
    assert ExactMatchReward(answer_column="gold")(completions=["The answer is 12."], gold=["12"]) == [1.0]


def test_the_reward_package_lists_its_names_and_every_registered_reference_is_an_attribute():
    import grpo_monitor.rewards as rewards
    from grpo_monitor.rewards.registry import REFERENCES, resolve_reference

    names = dir(rewards)
    assert {"exact_match", "exact_match_string", "ExactMatchReward", "json_schema", "format_and_correctness"} <= set(names)
    assert rewards.exact_match_string.mode == "string" and rewards.exact_match_string.__name__ == "exact_match_string"
    assert resolve_reference("exact_match_string:label").answer_column == "label"
    assert set(REFERENCES) >= {"exact_match", "exact_match_string"}
