"""The reference rewards on completions built to make their text searches slow: right scores, and work
bounded by counting what is searched (never by the clock), plus agreement with the regexes they replace."""

from __future__ import annotations

import json
import random
import re

import pytest

from grpo_monitor.rewards import FormatReward, exact_match, exact_match_string, extract_answer, json_schema
from grpo_monitor.rewards import _text, composite, correctness, schema
from grpo_monitor.rewards._text import extract_code, fenced_blocks

N = 1 << 20  # characters of a hostile completion


class Recorder:
    """A compiled pattern that records how much text each call may read (from ``pos`` to ``endpos``)."""

    def __init__(self, pattern: re.Pattern[str]) -> None:
        self.pattern, self.spans = pattern, []

    def __getattr__(self, name: str):
        method = getattr(self.pattern, name)

        def call(string, pos=0, endpos=None):
            end = len(string) if endpos is None else min(endpos, len(string))
            self.spans.append(end - pos)
            return method(string, pos, end)

        return call


def record(monkeypatch, module, *names):
    recs = {}
    for name in names:
        recs[name] = Recorder(getattr(module, name))
        monkeypatch.setattr(module, name, recs[name])
    return recs


# -- the regexes these replace, as the reference for what the replacements must return ------------

OLD_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.S)
OLD_FORMATS = {
    "answer_tag": re.compile(r"^(?:(?!<answer>).)*<answer>(?:(?!</?answer>).)+</answer>\s*$", re.S),
    "think_answer": re.compile(r"^\s*<think>(?:(?!</?think>).)*</think>\s*<answer>(?:(?!</?answer>).)+</answer>\s*$", re.S),
    "boxed": re.compile(r"\\boxed\s*\{.+\}", re.S),
}
OLD_BOXED = re.compile(r"\\(?:boxed|fbox)\s*(\{)")
OLD_TAG = re.compile(r"<answer>(.*?)</answer>", re.S | re.I)
OLD_ASIDE = re.compile(r"\s*(?:[,;]\s|\s\(|\s(?:since|because|as|which|so|for|given|where|when)\b|\s[-–—]\s)", re.I)


def old_boxed(text):
    boxed = None
    for m in OLD_BOXED.finditer(text):
        depth = 0
        for j in range(m.start(1), len(text)):
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            if depth == 0:
                boxed = text[m.start(1) + 1:j]
                break
    return boxed


def old_stated(value):
    text = value.strip()
    m = correctness._LEADING_NUMBER.match(text)
    if m and not re.match(r"\s*[=<>]", text[m.end():]):
        return m.group(1)
    cut = OLD_ASIDE.search(text)
    if cut:
        text = text[:cut.start()]
    return text.strip().rstrip(".").strip()


def strings(seed, tokens, count, longest=14):
    rng = random.Random(seed)
    for _ in range(count):
        yield "".join(rng.choice(tokens) for _ in range(rng.randint(0, longest)))


def test_fenced_blocks_match_the_regex_they_replace():
    for t in strings(1, ["```", "`", "\n", " ", "\t", "Py", "x", "json", "-"], 40_000):
        assert fenced_blocks(t) == [(m.group(1).lower(), m.group(2)) for m in OLD_FENCE.finditer(t)], t


def test_format_checks_match_the_regexes_they_replace():
    tokens = ["<think>", "</think>", "<answer>", "</answer>", "answer>", "<", "/", " ", "\n", "x", "\\boxed", "{", "}",
              "\u00a0", "\x1c", "think>"]
    for t in strings(2, tokens, 40_000, 12):
        s = t.strip()
        for fmt, pat in OLD_FORMATS.items():
            assert composite._FORMATS[fmt](s) == bool(pat.search(s)), (fmt, s)


def test_answer_extraction_matches_the_regexes_it_replaces():
    tokens = ["\\boxed", "\\fbox", "{", "}", " ", "\n", "<answer>", "</answer>", "<ANSWER>", "</Answer>", "x", "12",
              "(", "since", ",", ";", "—", "\t"]
    for t in strings(3, tokens, 40_000, 16):
        assert correctness._last_boxed(t, 0) == old_boxed(t), t
        tags = OLD_TAG.findall(t)
        assert correctness._last_tag(t, 0) == (tags[-1] if tags else None), t
        assert correctness._stated(t) == old_stated(t), t


# -- hostile completions: the right score, the searched text capped --------------------------------

def fill(unit, tail=""):
    return unit * ((N - len(tail)) // len(unit)) + tail


def test_exact_match_reads_only_the_last_window(monkeypatch):
    recs = record(monkeypatch, correctness, "_BOXED", "_BRACE", "_TAG_OPEN", "_TAG_CLOSE", "_GSM", "_SAYS", "_NUMBER")
    cases = [(fill("\\boxed{", "\\boxed{72}"), 1.0), (fill("\\boxed{"), 0.0), (fill("<answer>"), 0.0),
             (fill("<answer>", "<answer>72</answer>"), 0.0),  # the first <answer> opens it
             (fill("</answer>", "<answer>72</answer>"), 1.0), (fill("The answer is "), 0.0), (fill("``` "), 0.0),
             (fill("1 ", "#### 72"), 1.0), (fill("#### "), 0.0),
             (fill("x", "The answer is 72" + " " * 50_000 + "apples, since 8 x 9."), 1.0)]
    for text, want in cases:
        assert exact_match(completions=[text], answer=["72"]) == [want], text[:20]
        assert exact_match_string(completions=[text], answer=["72"]) == [want], text[:20]
    spans = [s for r in recs.values() for s in r.spans]
    assert spans and max(spans) <= correctness.ANSWER_WINDOW


def test_an_answer_within_the_window_is_found_as_before():
    pad = "x " * (correctness.ANSWER_WINDOW // 4)
    assert extract_answer(pad + "\\boxed{3/4} since we halve") == ("3/4", "boxed")
    assert extract_answer("q " * N + "<answer>\\boxed{7}</answer>") == ("7", "boxed")


def test_a_long_stated_answer_is_not_sent_to_math_verify(monkeypatch):
    asked = []
    monkeypatch.setattr(correctness, "_math_verify_equal_uncapped", lambda g, a: asked.append(a) or False)
    assert exact_match(completions=[fill("The answer is ")], answer=["72"]) == [0.0]
    assert exact_match(completions=["The answer is x^2 + 1"], answer=["(x+1)^2 - 2x"]) == [0.0]
    assert asked == ["x^2 + 1"]


def test_math_verify_log_lines_are_cut_during_our_calls(caplog):
    import logging

    log = logging.getLogger("math_verify.parser")

    def fake(gold, answer):
        log.warning("Timeout during parsing: %s", "y" * 5000)
        return False

    real = correctness._math_verify_equal_uncapped
    correctness._math_verify_equal_uncapped = fake
    try:
        with caplog.at_level(logging.WARNING, logger="math_verify.parser"):
            assert correctness._math_verify_equal("1", "y" * 10) is False
            log.warning("outside our calls %s", "z" * 500)
    finally:
        correctness._math_verify_equal_uncapped = real
    ours, theirs = [r.getMessage() for r in caplog.records]
    assert len(ours) < 400 and "characters omitted" in ours
    assert theirs == "outside our calls " + "z" * 500


def test_fences_search_stops_where_the_last_match_can_end(monkeypatch):
    recs = record(monkeypatch, _text, "_FENCE")
    assert fenced_blocks(fill("``` ")) == []
    assert fenced_blocks("```py\nx = 1\n```" + fill("``` ")) == [("py", "x = 1\n")]
    assert extract_code("```python\nprint(1)\n```\n" + fill("``` ")) == "print(1)\n"
    assert max(recs["_FENCE"].spans) <= 64  # the regex never reads the hostile line


def test_json_reads_only_the_last_window_and_bounded_failed_parses(monkeypatch):
    work = []

    class Counting(json.JSONDecoder):
        def raw_decode(self, s, idx=0):
            try:
                return super().raw_decode(s, idx)
            except ValueError as exc:
                work.append((len(s), getattr(exc, "pos", idx) - idx))
                raise

    monkeypatch.setattr(schema.json, "JSONDecoder", Counting)
    recs = record(monkeypatch, schema, "_JSON_START")
    good = '{"name": "Ada", "age": 36}'
    schema_ = {"type": "object", "required": ["name", "age"]}
    # Past the bound on failed parses the scan stops: the object after "[" * n (each "[" a parse that
    # fails as deep as the interpreter allows) is not read; after the others it is.
    for unit, after in [('{"', 1.0), ('["', 1.0), ("{", 1.0), ("```\n", 1.0), ("[", 0.0), ("[1,", 0.0)]:
        work.clear()
        assert json_schema(completions=[fill(unit)], schema=[schema_]) == [0.0], unit
        assert json_schema(completions=[fill(unit, good)], schema=[schema_]) == [after], unit
        assert sum(w for _, w in work) <= 2 * schema.BARE_JSON_WORK + 2 * schema.BARE_JSON_WINDOW
        assert all(length <= schema.BARE_JSON_WINDOW for length, _ in work)
    assert max(recs["_JSON_START"].spans) <= schema.BARE_JSON_WINDOW
    assert json_schema(completions=["```json\n" + good + "\n```" + "```\n```\n" * 1000], schema=[schema_]) == [1.0]


def test_format_rewards_on_hostile_completions():
    tag, think, boxed = FormatReward("answer_tag"), FormatReward("think_answer"), FormatReward("boxed")
    assert tag(completions=[fill("<answer>")]) == [0.0]
    assert tag(completions=[fill("x", "<answer>72</answer>")]) == [1.0]
    assert think(completions=["<think>" + "x" * N + "</think>\n<answer>72</answer>"]) == [1.0]
    assert think(completions=[fill("<think>")]) == [0.0]
    assert boxed(completions=[fill("\\boxed{")]) == [0.0]
    assert boxed(completions=[fill("\\boxed{", "}")]) == [1.0]


@pytest.mark.parametrize("n", [1000, 4000])
def test_stated_answer_search_has_no_leading_run_of_spaces(n):
    # The aside search without a leading \s*: each start reads a bounded stretch, however long a run of spaces.
    assert not correctness._ASIDE.pattern.startswith("\\s*")
    assert correctness._stated("x" + " " * n + "y") == "x" + " " * n + "y"
