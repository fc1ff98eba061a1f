"""Rubric-as-reward: a judge model scores each completion against a rubric.

The judge is any OpenAI-compatible chat-completions endpoint (``vllm serve``, ``trl vllm-serve``, a
hosted API) reached with the standard library, or a local callable (``local_judge`` wraps a
transformers model). The judge is asked for ``{"score": <0..scale>, "reason": "..."}``; the score
is read from that JSON, else from "score: 7" / "7/10", and scaled to 0..1.

Failures never reach the trainer: a timeout, an HTTP error, a refused connection or an unreadable
answer is retried ``retries`` times with backoff, then scored None (TRL skips a None). Requests
run ``concurrency`` at a time; scores are cached by (rubric, prompt, completion).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import threading
import time
import urllib.error
import urllib.request
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from grpo_monitor.rewards._text import completion_text

logger = logging.getLogger(__name__)

SYSTEM = ("You are a strict grader. Score the response against the rubric. Reply with one JSON object and "
          "nothing else: {\"score\": <number from 0 to %(scale)s>, \"reason\": \"<one sentence>\"}.")
USER = "Rubric:\n%(rubric)s\n\nPrompt:\n%(prompt)s\n\nResponse:\n%(completion)s"

_JSON_OBJ = re.compile(r"\{[^{}]*\}", re.S)
_SCORE_WORD = re.compile(r"score\"?\s*[:=]\s*\"?(-?\d+(?:\.\d+)?)", re.I)
# ``(?<!\d)``: a search retried every suffix of a run of digits, each to the run's end (n squared on
# "1" * n); a suffix matches only where the whole run does, which is found first.
_OUT_OF = re.compile(r"(-?(?<!\d)\d+(?:\.\d+)?)\s*/\s*(\d+(?:\.\d+)?)")


class JudgeError(Exception):
    pass


def parse_score(text: str, scale: float) -> float | None:
    """The judge's score scaled to 0..1, or None when the answer holds no score in range."""
    if not isinstance(text, str):
        return None
    raw: float | None = None
    for m in reversed(_JSON_OBJ.findall(text)):
        try:
            obj = json.loads(m)
        except ValueError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("score"), (int, float)) and not isinstance(obj["score"], bool):
            raw = float(obj["score"])
            break
        if isinstance(obj, dict) and isinstance(obj.get("score"), str):
            try:
                raw = float(obj["score"])
                break
            except ValueError:
                continue
    if raw is None:
        m = _SCORE_WORD.search(text)
        if m:
            raw = float(m.group(1))
    if raw is None:
        m2 = _OUT_OF.search(text)
        if m2 and float(m2.group(2)) > 0:
            raw = float(m2.group(1)) / float(m2.group(2)) * scale
    if raw is None or raw != raw or not 0 <= raw <= scale:
        return None
    return raw / scale


def _prompt_text(prompt: Any) -> str:
    if isinstance(prompt, list):
        return "\n".join(f"{m.get('role', '?')}: {m.get('content', '')}" for m in prompt if isinstance(m, dict))
    return "" if prompt is None else str(prompt)


class JudgeReward:
    """TRL reward function scoring completions against ``rubric`` with a judge model.

    Give ``base_url`` (e.g. ``http://127.0.0.1:8000/v1``) and ``model`` for an OpenAI-compatible
    server (``api_key`` or the ``api_key_env`` variable for a bearer token), or ``generate``: a
    callable taking chat messages and returning the judge's text (see ``local_judge``).
    ``rubric_column``: read the rubric per example from that column instead.
    """

    def __init__(self, rubric: str | None = None, *, base_url: str | None = None, model: str | None = None,
                 generate: Callable[[list[dict[str, str]]], str] | None = None, api_key: str | None = None,
                 api_key_env: str = "OPENAI_API_KEY", rubric_column: str | None = None, scale: float = 10.0,
                 timeout: float = 30.0, retries: int = 2, backoff: float = 0.5, concurrency: int = 8,
                 max_tokens: int = 256, temperature: float = 0.0, cache_size: int = 100_000,
                 name: str = "rubric_judge") -> None:
        if (base_url is None) == (generate is None):
            raise ValueError("give exactly one of base_url (an OpenAI-compatible server) or generate (a local judge)")
        if rubric is None and rubric_column is None:
            raise ValueError("give a rubric or a rubric_column")
        self.rubric, self.rubric_column = rubric, rubric_column
        self.base_url = base_url.rstrip("/") if base_url else None
        self.model, self.generate = model, generate
        self.api_key, self.api_key_env = api_key, api_key_env
        self.scale, self.timeout, self.retries, self.backoff = float(scale), float(timeout), int(retries), float(backoff)
        self.concurrency, self.max_tokens, self.temperature = max(1, int(concurrency)), int(max_tokens), float(temperature)
        self.cache_size = int(cache_size)
        self.__name__ = name
        self._cache: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._warned: set[str] = set()
        self.stats = {"requests": 0, "cache_hits": 0, "failures": 0, "retries": 0}

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_cache", "_lock", "_pool", "_warned")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._cache, self._lock, self._pool, self._warned = OrderedDict(), threading.Lock(), None, set()

    # -- one request ----------------------------------------------------------------------------

    def messages(self, rubric: str, prompt: Any, completion: Any) -> list[dict[str, str]]:
        return [{"role": "system", "content": SYSTEM % {"scale": f"{self.scale:g}"}},
                {"role": "user", "content": USER % {"rubric": rubric, "prompt": _prompt_text(prompt),
                                                     "completion": completion_text(completion)}}]

    def _ask_http(self, messages: list[dict[str, str]]) -> str:
        body = json.dumps({"model": self.model or "default", "messages": messages, "max_tokens": self.max_tokens,
                           "temperature": self.temperature}).encode()
        headers = {"Content-Type": "application/json"}
        key = self.api_key or os.environ.get(self.api_key_env)
        if key:
            headers["Authorization"] = f"Bearer {key}"
        req = urllib.request.Request(f"{self.base_url}/chat/completions", data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:  # noqa: S310 (the user's own endpoint)
                data = json.loads(resp.read(4 << 20).decode("utf-8", "replace"))
        except urllib.error.HTTPError as exc:
            raise JudgeError(f"HTTP {exc.code}") from None
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            raise JudgeError(f"unreachable or timed out ({getattr(exc, 'reason', exc)})") from None
        except ValueError:
            raise JudgeError("answer is not JSON") from None
        try:
            return str(data["choices"][0]["message"]["content"])
        except (KeyError, IndexError, TypeError):
            raise JudgeError("answer has no choices[0].message.content") from None

    def _score_uncached(self, rubric: str, prompt: Any, completion: Any) -> float | None:
        messages = self.messages(rubric, prompt, completion)
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                self.stats["retries"] += 1
                time.sleep(self.backoff * (2 ** (attempt - 1)))
            self.stats["requests"] += 1
            try:
                text = self.generate(messages) if self.generate is not None else self._ask_http(messages)
            except JudgeError as exc:
                last = str(exc)
                continue
            except Exception as exc:
                last = f"{type(exc).__name__}: {exc}"
                continue
            score = parse_score(text, self.scale)
            if score is not None:
                return score
            last = f"no score in the judge's answer ({text[:80]!r})"
        self.stats["failures"] += 1
        self._warn_once(last)
        return None

    def _key(self, rubric: str, prompt: Any, completion: Any) -> str:
        blob = json.dumps([rubric, _prompt_text(prompt), completion_text(completion)], ensure_ascii=False)
        return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()

    def score_one(self, rubric: str, prompt: Any, completion: Any) -> float | None:
        key = self._key(rubric, prompt, completion)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                self.stats["cache_hits"] += 1
                return self._cache[key]
        score = self._score_uncached(rubric, prompt, completion)
        if score is not None:  # a failure is not remembered: the next step asks again
            with self._lock:
                self._cache[key] = score
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
        return score

    def _warn_once(self, msg: str) -> None:
        kind = re.sub(r"\d+", "N", msg)[:60]
        if kind not in self._warned and len(self._warned) < 20:
            self._warned.add(kind)
            logger.warning("grpo-monitor %s: judge failed after %d tries: %s (scored None)", self.__name__,
                           self.retries + 1, msg)

    def __call__(self, prompts: Sequence[Any] | None = None, completions: Sequence[Any] | None = None,
                 **kwargs: Any) -> list[float | None]:
        completions = list(completions or [])
        prompts = list(prompts or [None] * len(completions))
        rubrics = kwargs.get(self.rubric_column) if self.rubric_column else None

        def one(i: int) -> float | None:
            try:
                rubric = rubrics[i] if isinstance(rubrics, (list, tuple)) and i < len(rubrics) else self.rubric
                if not rubric:
                    return None
                return self.score_one(str(rubric), prompts[i] if i < len(prompts) else None, completions[i])
            except Exception as exc:
                self._warn_once(f"{type(exc).__name__}: {exc}")
                return None

        if len(completions) <= 1 or self.concurrency == 1:
            return [one(i) for i in range(len(completions))]
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="grpo-judge")
            pool = self._pool
        return list(pool.map(one, range(len(completions))))


def local_judge(model: Any, tokenizer: Any, max_new_tokens: int = 128) -> Callable[[list[dict[str, str]]], str]:
    """A ``generate`` callable for ``JudgeReward`` from a transformers causal LM and its tokenizer."""
    lock = threading.Lock()  # one generate at a time on one model

    def generate(messages: list[dict[str, str]]) -> str:
        import torch

        if getattr(tokenizer, "chat_template", None):
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        else:
            text = "\n\n".join(m["content"] for m in messages) + "\n\n"
        enc = tokenizer(text, return_tensors="pt", add_special_tokens=False)
        with lock, torch.no_grad():
            out = model.generate(**enc.to(model.device), max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id)
        return tokenizer.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)

    return generate
