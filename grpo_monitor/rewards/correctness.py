"""Exact-match correctness: the final answer, extracted the way datasets mark it, against the gold answer.

Extraction, first that applies: the last ``\\boxed{...}`` (or ``\\fbox{...}``), the last
``<answer>...</answer>``, GSM8K's ``#### X``, "the answer is X" / "Answer: X" (the number it opens
with, else the words up to an aside: "The answer is 12, since 3 x 4 = 12." is 12, "Answer: 7
(seven)" is 7), and the last number.
The gold answer goes through the same extraction (a MATH solution's ``\\boxed{}``, a GSM8K answer's
``####``), else it is used whole.

Comparison (``mode="math"``): equal after normalisation (spaces, ``$``, ``\\left``/``\\right``,
``\\text{}`` units, thousands separators, a trailing period); else equal as numbers (``3/4``,
``\\frac{3}{4}``, ``0.75``, ``75\\%`` against ``0.75`` is *not* equal); else mathematically equal
through ``math-verify`` (imported on first use). ``mode="string"``: case- and space-insensitive
equality of the extracted answers, for non-maths tasks.

Scores 1.0 or 0.0; None when the example has no usable gold answer (TRL skips it); when no column
holds one at all, a warning names the columns looked for and those given, once.

Bounded work on any text (a reward runs on every completion of every step, and the policy writes
the text): the answer is looked for only in the last ``ANSWER_WINDOW`` characters (64 Ki, some
16k tokens: a final answer closes the completion, and one followed by that much more text is not
its final answer), every search is linear, and math-verify is asked only about answers of up to
``MATH_VERIFY_CHARS`` characters (1024; a final answer, even a matrix of fractions, is a few
hundred at most), with its log lines cut to 300 characters during our calls.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

from grpo_monitor.rewards._text import completion_text, first_column

logger = logging.getLogger(__name__)

GOLD_COLUMNS = ("answer", "solution", "target", "ground_truth", "final_answer", "reference")
# What TRL passes every reward function besides the dataset's columns.
TRL_ARGUMENTS = frozenset({"prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric"})


ANSWER_WINDOW = 64 * 1024
MATH_VERIFY_CHARS = 1024
_MATH_VERIFY_LOG_CHARS = 300

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*(\{)")
_BRACE = re.compile(r"[{}]")
_TAG_OPEN = re.compile(r"<answer>", re.I)
_TAG_CLOSE = re.compile(r"</answer>", re.I)


def _window(text: str) -> int:
    """Where the search for the answer starts: the last ``ANSWER_WINDOW`` characters."""
    return max(0, len(text) - ANSWER_WINDOW)


def _last_boxed(text: str, start: int) -> str | None:
    """Contents of the last ``\\boxed{`` / ``\\fbox{`` from ``start`` whose brace group closes.

    Braces are matched right to left, once: reading each opening's group forward to its close
    read ``"\\boxed{" * n`` n squared times.

    >>> _last_boxed(r"\\boxed{1} and \\boxed{\\frac{2}{3}} then \\boxed{4", 0)
    '\\\\frac{2}{3}'
    """
    first = _BOXED.search(text, start)
    if first is None:
        return None
    opens = [m.start(1) for m in _BOXED.finditer(text, first.start())]
    k = len(opens) - 1
    closes: list[int] = []  # the '}' to the right not yet matched, the nearest last
    for j in reversed([m.start() for m in _BRACE.finditer(text, opens[0])]):
        if text[j] == "}":
            closes.append(j)
            continue
        close = closes.pop() if closes else None
        if j == opens[k]:
            if close is not None:
                return text[j + 1:close]
            k -= 1
            if k < 0:
                break
    return None


def _last_tag(text: str, start: int) -> str | None:
    """Contents of the last match of ``<answer>(.*?)</answer>`` (re.S, re.I) from ``start``: one
    forward pass, where the regex reread the rest of the text from every unclosed ``<answer>``."""
    last = None
    opening, closing = _TAG_OPEN.search, _TAG_CLOSE.search
    m = opening(text, start)
    while m is not None:
        c = closing(text, m.end())
        if c is None:
            break
        last = text[m.end():c.start()]
        m = opening(text, c.end())
    return last

_GSM = re.compile(r"####\s*([^\n]+)")
_SAYS = re.compile(r"(?:final answer|the answer)\s*(?:is|:)\s*([^\n]+)|^\s*answer\s*:\s*([^\n]+)", re.I | re.M)
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:\s*/\s*\d+)?|-?\.\d+")
# A stated answer that opens with a number is that number ("12, since 3 x 4 = 12"; "7 (seven)"); any
# other ends where an aside begins: a comma or semicolon, a parenthesis, "since", "because", ...
_LEADING_NUMBER = re.compile(r"\s*(-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+)?)(?![\w.]|,\d{3}|\.\d|\s*/\s*\d|\s*[*^+\-x×]\s*\d)")
# No leading ``\s*``: in a run of spaces it retried the rest of the run from each (n squared), and
# the text before the aside is stripped, so where the spaces before it begin does not matter.
_ASIDE = re.compile(r"(?:[,;]\s|\s\(|\s(?:since|because|as|which|so|for|given|where|when)\b|\s[-–—]\s)", re.I)


def _stated(value: str) -> str:
    """The answer a sentence states, without the reasons that follow it.

    >>> _stated("12, since 3 x 4 = 12."), _stated("7 (seven)"), _stated("1,234 apples"), _stated("3/4.")
    ('12', '7', '1,234', '3/4')
    >>> _stated("x/2, because halves"), _stated("Paris"), _stated("2 + 3 = 5"), _stated("12 x 4")
    ('x/2', 'Paris', '2 + 3 = 5', '12 x 4')
    """
    text = value.strip()
    m = _LEADING_NUMBER.match(text)
    if m and not re.match(r"\s*[=<>]", text[m.end():]):
        return m.group(1)
    cut = _ASIDE.search(text)
    if cut:
        text = text[:cut.start()]
    return text.strip().rstrip(".").strip()


def extract_answer(text: str) -> tuple[str, str] | None:
    """(answer, how it was found) or None; ``how`` is boxed | answer_tag | gsm8k | stated | last_number."""
    if not isinstance(text, str) or not text.strip():
        return None
    start = _window(text)
    boxed = _last_boxed(text, start) if "\\" in text else None
    if boxed is not None and boxed.strip():
        return boxed.strip(), "boxed"
    tag = _last_tag(text, start)
    if tag is not None and tag.strip():
        inner = tag.strip()
        nested = extract_answer(inner) if "\\boxed" in inner else None
        return (nested[0] if nested else inner), "answer_tag"
    gsm = _GSM.findall(text, start)
    if gsm and gsm[-1].strip():
        return gsm[-1].strip(), "gsm8k"
    said = _SAYS.findall(text, start)
    if said:
        val = next((a or b for a, b in reversed(said) if (a or b).strip()), "")
        stated = _stated(val)
        if stated:
            return stated, "stated"
    nums = _NUMBER.findall(text, start)
    if nums:
        return nums[-1].strip(), "last_number"
    return None


_TEXT_CMD = re.compile(r"\\(?:text|textbf|mathrm|mbox)\s*\{([^{}]*)\}")
# LaTeX that does not change a value, and what it reads as: sizing, spacing, display style and dollar
# signs go; \dfrac and \tfrac are \frac; degrees and \% are their plain selves. Longest first, so
# that ``\$`` goes whole rather than leaving its backslash.
_LATEX_PLAIN = {"\\left": "", "\\right": "", "\\!": "", "\\,": "", "\\;": "", "\\:": "", "\\ ": "",
                "\\displaystyle": "", "\\$": "", "$": "", "\\dfrac": "\\frac", "\\tfrac": "\\frac",
                "^\\circ": "", "^{\\circ}": "", "\\%": "%"}
_LATEX_NOISE = re.compile("|".join(re.escape(k) for k in sorted(_LATEX_PLAIN, key=len, reverse=True)))
_UNIT_WORD = re.compile(r"^(-?[\d.,/]+)\s*(?:[a-zA-Z][a-zA-Z .]*)$")
_THOUSANDS = re.compile(r"-?\d{1,3}(,\d{3})+(\.\d+)?")
_SPACES = re.compile(r"\s+")


def normalize(ans: str) -> str:
    """Surface normalisation shared by both modes of comparison (maths)."""
    s = str(ans).strip()
    s = _TEXT_CMD.sub(lambda m: " " + m.group(1) + " ", s)
    s = _LATEX_NOISE.sub(lambda m: _LATEX_PLAIN[m.group()], s).strip().rstrip(".").strip()
    m = _UNIT_WORD.match(s)
    if m:  # "18 dollars", "5 cm": the number is the answer
        s = m.group(1)
    if _THOUSANDS.fullmatch(s):
        s = s.replace(",", "")
    return _SPACES.sub("", s)


_DECIMAL = re.compile(r"-?\d+(\.\d+)?|-?\.\d+")
_RATIO = re.compile(r"(-?\d+)/(-?\d+)")
_FRAC = re.compile(r"^(-?)\\frac\{(-?\d+)\}\{(-?\d+)\}$|^(-?)\\frac(\d)(\d)$")


def as_number(s: str) -> Fraction | None:
    """The exact rational value of a plain number, ``a/b`` or ``\\frac{a}{b}``; None otherwise."""
    s = s.strip()
    try:
        if _DECIMAL.fullmatch(s):
            return Fraction(s)
        m = _RATIO.fullmatch(s)
        if m and int(m.group(2)) != 0:
            return Fraction(int(m.group(1)), int(m.group(2)))
        m = _FRAC.match(s)
        if m:
            sign, a, b = (m.group(1), m.group(2), m.group(3)) if m.group(2) else (m.group(4), m.group(5), m.group(6))
            if int(b) != 0:
                v = Fraction(int(a), int(b))
                return -v if sign else v
    except (ValueError, ZeroDivisionError):
        return None
    return None


def normalize_string(s: str) -> str:
    return re.sub(r"\s+", " ", str(s)).strip().strip(".!?;:\"'").strip().casefold()


_MV_CALL = threading.local()


class _CapLog(logging.Filter):
    """math-verify logs the whole text it failed to parse (a warning on every timeout): during our
    calls its lines are cut to ``_MATH_VERIFY_LOG_CHARS``."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(_MV_CALL, "active", False):
            msg = record.getMessage()
            if len(msg) > _MATH_VERIFY_LOG_CHARS:
                record.msg = f"{msg[:_MATH_VERIFY_LOG_CHARS]} [... {len(msg) - _MATH_VERIFY_LOG_CHARS} characters omitted]"
                record.args = ()
        return True


_CAP_LOG = _CapLog()


def _math_verify_equal(gold: str, answer: str) -> bool:
    if len(answer) > MATH_VERIFY_CHARS:
        return False
    for name in ("math_verify.parser", "math_verify.grader"):
        log = logging.getLogger(name)
        if _CAP_LOG not in log.filters:
            log.addFilter(_CAP_LOG)
    _MV_CALL.active = True
    try:
        return _math_verify_equal_uncapped(gold, answer)
    finally:
        _MV_CALL.active = False


def _math_verify_equal_uncapped(gold: str, answer: str) -> bool:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    main = threading.current_thread() is threading.main_thread()
    # math-verify's timeouts use signal.alarm, which only works in the main thread.
    timeout = 5 if main else None
    if not main:
        for name in ("math_verify.parser", "math_verify.grader"):
            logging.getLogger(name).setLevel(logging.ERROR)
    cfg = [LatexExtractionConfig(), ExprExtractionConfig()]

    def wrap(s: str) -> str:
        return s if "$" in s or "\\(" in s else f"${s}$"

    g = parse(wrap(gold), extraction_config=cfg, parsing_timeout=timeout)
    a = parse(wrap(answer), extraction_config=cfg, parsing_timeout=timeout)
    if not g or not a:
        return False
    return bool(verify(g, a, timeout_seconds=timeout))


def answers_match(gold: str, answer: str, mode: str = "math") -> bool:
    if mode == "string":
        return normalize_string(gold) == normalize_string(answer)
    ng, na = normalize(gold), normalize(answer)
    if ng == na:
        return True
    fg, fa = as_number(ng), as_number(na)
    if fg is not None and fa is not None:
        return fg == fa
    try:
        return _math_verify_equal(gold, answer)
    except ImportError:
        logger.warning("grpo-monitor exact_match: math-verify is not installed (pip install 'grpo-monitor[rewards]'); "
                       "comparing strings and numbers only")
        return False
    except Exception:
        return False


class ExactMatchReward:
    """TRL reward function: 1.0 when the completion's final answer equals the gold answer, else 0.0.

    ``answer_column``: the dataset column with the gold answer (default: the first present of
    ``answer``, ``solution``, ``target``, ``ground_truth``, ``final_answer``, ``reference``).
    ``mode``: ``"math"`` (normalise, numbers, math-verify) or ``"string"``.
    """

    def __init__(self, answer_column: str | None = None, mode: str = "math", name: str = "exact_match") -> None:
        if mode not in ("math", "string"):
            raise ValueError(f"mode must be 'math' or 'string', got {mode!r}")
        self.answer_column = answer_column
        self.mode = mode
        self.__name__ = name

    def gold(self, raw: Any) -> str | None:
        if raw is None:
            return None
        if isinstance(raw, (int, float)) and not isinstance(raw, bool):
            return repr(raw) if isinstance(raw, float) else str(raw)
        if isinstance(raw, (list, tuple)) and raw:
            raw = raw[0]
        text = str(raw).strip()
        if not text:
            return None
        if self.mode == "string":
            got = extract_answer(text) if ("<answer>" in text or "\\boxed" in text or "####" in text) else None
            return got[0] if got else text
        if "\\boxed" in text or "####" in text or "<answer>" in text.lower():
            got = extract_answer(text)
            return got[0] if got else None
        return text

    def score_one(self, completion: Any, gold_raw: Any) -> float | None:
        gold = self.gold(gold_raw)
        if gold is None:
            return None
        text = completion_text(completion)
        got = extract_answer(text)
        if got is None:
            # A completion that is only its answer ("Paris") marks nothing: in string mode it is the answer.
            if self.mode != "string" or not isinstance(text, str) or len(text) > 200:
                return 0.0
            got = (text, "whole")
        return 1.0 if answers_match(gold, got[0], self.mode) else 0.0

    def __call__(self, prompts: Sequence[Any] | None = None, completions: Sequence[Any] | None = None,
                 **kwargs: Any) -> list[float | None]:
        names = (self.answer_column,) if self.answer_column else GOLD_COLUMNS
        if completions and not any(n in kwargs for n in names):
            self._warn_missing(names, kwargs)
        out: list[float | None] = []
        for i, c in enumerate(completions or []):
            try:
                out.append(self.score_one(c, first_column(kwargs, names, i)))
            except Exception:  # one odd example must not kill the step
                out.append(None)
        return out

    def _warn_missing(self, names: Sequence[str], kwargs: Mapping[str, Any]) -> None:
        """Once per reward: no column holds the gold answer, so every completion scores None (TRL skips it)."""
        if getattr(self, "_warned_missing", False):
            return
        self._warned_missing = True
        given = [k for k in kwargs if k not in TRL_ARGUMENTS]
        guess = next((k for k in given if isinstance(kwargs.get(k), (list, tuple))), None)
        logger.warning("grpo-monitor %s: no gold answer: looked for the column%s %s, the dataset gives %s; every "
                       "completion scores None. Name the column: %s(answer_column=%r)%s",
                       self.__name__, "" if len(names) == 1 else "s", ", ".join(names), ", ".join(given) or "none",
                       type(self).__name__, guess or "COLUMN",
                       f" (inspect-rewards: --reference NAME={self.__name__}:{guess or 'COLUMN'})")


exact_match = ExactMatchReward()
exact_match_string = ExactMatchReward(mode="string", name="exact_match_string")
