"""Language mixing: completions drifting into another script than their prompt's (Logic-RL's
Chinese-English switching, multilingual gibberish before a collapse).

Invisible in scalar metrics, so it is read from the completions. The reward tap records, per
completion, ``other_script``: the share of its letters written in a script other than the prompt's
dominant one (Latin, Cyrillic, Greek, Arabic, Hebrew, Indic, Thai, Hangul, CJK), measured on an
evenly strided sample of the whole text, so the cost per completion is bounded. Logs without the
number fall back to the recorded prompt and completion excerpts; logs with neither leave the
detector nothing to judge.

Each logged step gives the share of completions that mix (``other_script`` at or above
``mixed_at``). The verdict is relative to the run's own early share: a translation task or a
multilingual dataset whose answers are in another script from step 1 has a high early share and
never rises from it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from grpo_monitor.detectors.base import Assessment, Detector, Metrics, Sample, check_float, check_int, finite
from grpo_monitor.detectors.signals import fair_sample
from grpo_monitor.detectors.stats import Window, mad_sigma, median


def _block_scripts() -> dict[int, str]:
    """Script of each 128-codepoint block holding letters (a block is ``codepoint >> 7``)."""
    table: dict[int, str] = {}

    def put(lo: int, hi: int, name: str) -> None:
        for b in range(lo >> 7, (hi >> 7) + 1):
            table.setdefault(b, name)

    put(0x0000, 0x024F, "latin")
    put(0x1E00, 0x1EFF, "latin")
    put(0x0370, 0x03FF, "greek")
    put(0x1F00, 0x1FFF, "greek")
    put(0x0400, 0x052F, "cyrillic")
    put(0x0590, 0x05FF, "hebrew")
    put(0x0600, 0x077F, "arabic")
    put(0x0900, 0x0DFF, "indic")
    put(0x0E00, 0x0E7F, "thai")
    put(0x1100, 0x11FF, "hangul")
    put(0xAC00, 0xD7AF, "hangul")
    put(0x3040, 0x30FF, "cjk")  # kana: Japanese mixes it with Han characters
    put(0x3400, 0x4DBF, "cjk")
    put(0x4E00, 0x9FFF, "cjk")
    put(0xF900, 0xFAFF, "cjk")
    put(0x20000, 0x2FFFF, "cjk")
    return table


_SCRIPTS = _block_scripts()
_ASCII_LETTER = re.compile(r"[A-Za-z]")


def script_counts(text: str, max_chars: int = 256) -> dict[str, int]:
    """Letters per script in an evenly strided sample of at most ``max_chars`` characters of ``text``.

    >>> script_counts("Hello world")
    {'latin': 10}
    >>> sorted(script_counts("答案是 42, so the answer").items())
    [('cjk', 3), ('latin', 11)]
    """
    if text.isascii():  # the common case, decided in C
        letters = sum(1 for c in text[:: max(1, len(text) // max_chars)] if c.isalpha())
        return {"latin": letters} if letters else {}
    counts: dict[str, int] = {}
    scripts = _SCRIPTS
    for c in text[:: max(1, len(text) // max_chars)]:
        if c.isalpha():
            s = scripts.get(ord(c) >> 7)
            if s is not None:
                counts[s] = counts.get(s, 0) + 1
    return counts


def dominant_script(text: str) -> str | None:
    """The script most of the text's letters are written in (None: no letters).

    >>> dominant_script("Сколько будет 2+2?"), dominant_script("2 + 2 = ?")
    ('cyrillic', None)
    """
    counts = script_counts(text)
    return max(counts, key=lambda k: (counts[k], k)) if counts else None


def other_script_share(completion: str, script: str | None) -> float | None:
    """Share of the completion's letters written in another script than ``script`` (None when
    either has no letters).

    >>> other_script_share("The answer is 4.", "latin"), other_script_share("答案是 four", "latin")
    (0.0, 0.429)
    """
    if script is None:
        return None
    if script == "latin" and completion.isascii():
        return 0.0 if _ASCII_LETTER.search(completion) else None
    counts = script_counts(completion)
    n = sum(counts.values())
    if not n:
        return None
    return round(1.0 - counts.get(script, 0) / n, 3)


def sample_other_script(sample: Mapping[str, Any]) -> float | None:
    """The tap's ``other_script``, else measured on the recorded prompt and completion excerpts."""
    if "other_script" in sample:
        return finite(sample.get("other_script"))
    prompt, completion = sample.get("prompt"), sample.get("completion")
    if isinstance(prompt, str) and isinstance(completion, str):
        return other_script_share(completion, dominant_script(prompt))
    return None


class LanguageMixing(Detector):
    """A rising share of completions written partly in another script than their prompt.

    Parameters: ``mixed_at`` (a completion mixes when at least this share of its letters is in
    another script), ``rise`` (the mixing share must exceed the run's early share by at least this
    much), ``critical_share`` (a mixing share this high, risen by twice ``rise``, is critical),
    ``baseline_points`` (logged points with samples whose median is the early share),
    ``min_samples`` (measurable completions a step needs), ``max_samples`` (completions read per step).

    >>> det = LanguageMixing()
    >>> found = []
    >>> for step in range(1, 41):
    ...     mixed = 0 if step < 20 else 16
    ...     rows = [{"group": i // 8, "other_script": 0.6 if i < mixed else 0.0} for i in range(32)]
    ...     found += det.update(step, {"reward": 0.5}, rows)
    >>> [(f.severity, f.step, f.onset_step) for f in found]
    [('critical', 21, 20)]
    """

    id = "language_mixing"
    variant = None
    requires = (("samples",),)

    def __init__(self, mixed_at: float = 0.2, rise: float = 0.15, critical_share: float = 0.4, baseline_points: int = 5,
                 min_samples: int = 8, max_samples: int = 256) -> None:
        self.mixed_at = check_float("mixed_at", mixed_at, 0.0, 1.0, low_open=True)
        self.rise = check_float("rise", rise, 0.0, 1.0, low_open=True, high_open=True)
        self.critical_share = check_float("critical_share", critical_share, 0.0, 1.0, low_open=True)
        self.baseline_points = check_int("baseline_points", baseline_points, 1)
        self.min_samples = check_int("min_samples", min_samples, 1)
        self.max_samples = check_int("max_samples", max_samples, 1)
        super().__init__()

    def _reset_state(self) -> None:
        self.first: list[float] = []
        self.base: float | None = None
        self.spread = 0.0
        self.base_step: int | None = None
        self.shares = Window(16)
        self.above_since: int | None = None

    def _share(self, samples: Sequence[Sample]) -> tuple[float, int] | None:
        n = mixed = 0
        limit = self.mixed_at
        scripts: dict[str, str | None] = {}  # a group's completions share their prompt: read it once
        for s in fair_sample(samples, self.max_samples):
            if type(s) is not dict and not isinstance(s, Mapping):
                continue
            if "other_script" in s:
                v = finite(s.get("other_script"))
            else:
                prompt, completion = s.get("prompt"), s.get("completion")
                if not isinstance(prompt, str) or not isinstance(completion, str):
                    continue
                script = scripts.get(prompt, "")
                if script == "":
                    script = scripts[prompt] = dominant_script(prompt)
                v = other_script_share(completion, script)
            if v is None:
                continue
            n += 1
            mixed += v >= limit
        return (mixed / n, n) if n >= self.min_samples else None

    def assess(self, step: int, metrics: Metrics, samples: Sequence[Sample]) -> Assessment | None:
        if not samples:
            return None
        got = self._share(samples)
        if got is None:
            return None
        share, n = got
        if self.base is None:
            self.first.append(share)
            if len(self.first) >= self.baseline_points:
                self.base = median(self.first)
                self.spread = mad_sigma(self.first, self.base)
                self.base_step = step
                self.first = []
            return Assessment(warming_up=True, evidence={"mixed_share": finite(share), "completions": n})
        self.shares.push(step, share)
        k = self.clock.points(3, 2)
        recent = self.shares.recent_median(k) or 0.0
        line = self.base + max(self.rise, 4.0 * self.spread)
        if share >= self.base + 0.5 * (line - self.base):
            if self.above_since is None:
                self.above_since = step
        else:
            self.above_since = None
        ev: dict[str, Any] = {
            "mixed_share": finite(share),
            "recent_mixed_share": finite(recent),
            "early_mixed_share": finite(self.base),
            "early_until_step": self.base_step,
            "threshold": finite(line),
            "mixed_at": self.mixed_at,
            "completions": n,
            "persist_points": k,
        }
        level = 0
        if len(self.shares) >= k and recent >= line:
            level = 1
            if recent >= self.critical_share and recent >= self.base + 2 * self.rise:
                level = 2
            ev["advice"] = ("Completions are switching into another script than their prompts: add a language-"
                            "consistency reward (the share of the answer in the prompt's language), state the "
                            "answer language in the system prompt, and check the data for mixed-language prompts.")
        return Assessment(level=level, evidence=ev, onset_step=self.above_since if level else None)

    def _message(self, severity: str, evidence: Mapping[str, Any]) -> str:
        return (f"Language mixing: {evidence.get('recent_mixed_share')} of recent completions write at least "
                f"{evidence.get('mixed_at')} of their letters in another script than their prompt, against "
                f"{evidence.get('early_mixed_share')} early in the run. Add a language-consistency reward or state the "
                "answer language in the prompt.")
