"""Reference rewards: completions scored per second on this machine, and the sandbox's pool against
one plain ``subprocess.run`` per completion on the same completions.

    .venv/bin/python benchmarks/rewards.py            # writes the "rewards" section of RESULTS.md
    .venv/bin/python benchmarks/rewards.py --quick    # fewer completions, prints only
    .venv/bin/python benchmarks/rewards.py --hostile  # only the 1 MB hostile completions, prints only
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.results import stamp, update_section  # noqa: E402

GOLDS = ["72", r"\frac{1}{3}", "0.5", r"2\sqrt{2}", "18", "x^2+2x+1", "1250", r"\left( 3, \frac{\pi}{2} \right)"]
ANSWERS = ["so 48 + 24 = 72.\n#### 72", r"Thus $\boxed{\dfrac{1}{3}}$.", r"\boxed{\frac{1}{2}}", r"\boxed{\sqrt{8}}",
           "It costs $18.", r"\boxed{(x+1)^2}", "It is 1,250 dollars.", r"\boxed{\left( 3, \frac{\pi}{2} \right)}"]
WRONG = ["#### 71", r"\boxed{\frac{1}{4}}", r"\boxed{0.25}", r"\boxed{3}", "It costs $19.", r"\boxed{x^2+1}", "1,249",
         r"\boxed{(3, \pi)}"]

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
          "required": ["name", "age"]}
JSONS = ['```json\n{"name": "Ada", "age": 36}\n```', 'here {"name": "Bo", "age": -1} ok', "no json",
         '{"name": "Cy", "age": 7}']

TESTS = ["assert add(1, 2) == 3", "assert add(20, 22) == 42", "assert add(-5, 5) == 0"]
CODES = ["def add(a, b):\n    return a + b\n", "def add(a, b):\n    return a - b\n",
         "def add(a, b):\n    s = 0\n    for x in (a, b):\n        s += x\n    return s\n", "def add(a, b) return"]


# Completions of about 1 MB built to make a reward's text search slow: the measured attacks on the
# regexes the references ran (quadratic: "``` " repeated was 2.4 s at 32k repetitions) and the worst
# case found for each search since.
HOSTILE_BYTES = 1 << 20
HOSTILE_LIMIT_MS = 50.0


def _fill(unit: str, tail: str = "") -> str:
    return unit * ((HOSTILE_BYTES - len(tail)) // len(unit)) + tail


HOSTILE = {
    '"``` " repeated': _fill("``` "),
    '"```\\n" repeated (a fence every 4 characters)': _fill("```\n"),
    '"```py\\n" then "``` " repeated': "```py\n" + _fill("``` "),
    '"\\boxed{" repeated': _fill("\\boxed{"),
    '"\\boxed{" repeated, then "\\boxed{72}"': _fill("\\boxed{", "\\boxed{72}"),
    '"<answer>" repeated': _fill("<answer>"),
    '"<answer>x</answer>" repeated': _fill("<answer>x</answer>"),
    '"<think>" repeated': _fill("<think>"),
    '"The answer is " repeated': _fill("The answer is "),
    '"The answer is x", 1 MB of spaces, "y"': "The answer is x" + " " * (HOSTILE_BYTES - 16) + "y",
    '"#### " repeated': _fill("#### "),
    '"1 " repeated (a number every 2 characters)': _fill("1 "),
    '"{\\"" repeated': _fill('{"'),
    '"[" repeated': _fill("["),
    '"[1," repeated': _fill("[1,"),
    '"{" repeated, then "["': _fill("{", "["),
}


def hostile_rows(repeat: int = 3) -> tuple[list[str], list[tuple[str, list[float]]]]:
    """Milliseconds per completion (best of ``repeat``) of each reference on each hostile completion."""
    import logging

    from grpo_monitor.callbacks.reward_tap import extra_signals, text_signals
    from grpo_monitor.rewards import FormatReward, exact_match, exact_match_string, json_schema
    from grpo_monitor.rewards._text import extract_code

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    refs = {
        "exact_match": lambda t: exact_match(completions=[t], answer=["72"]),
        "exact_match_string": lambda t: exact_match_string(completions=[t], answer=["72"]),
        "json_schema": lambda t: json_schema(completions=[t], schema=[SCHEMA]),
        "answer_format": FormatReward("answer_tag"),
        "think_answer_format": FormatReward("think_answer"),
        "boxed_format": FormatReward("boxed"),
        "unit_tests' code extraction": extract_code,
        "reward tap signals": lambda t: (text_signals([t]), extra_signals(["What is 8 x 9?"], [t], [[1, 2]])),
    }
    for name in ("answer_format", "think_answer_format", "boxed_format"):
        f = refs[name]
        refs[name] = lambda t, f=f: f(completions=[t])
    exact_match(completions=["\\boxed{x^2}"], answer=["72"])  # imports outside the timing
    rows = []
    for label, text in HOSTILE.items():
        cells = []
        for fn in refs.values():
            best = float("inf")
            for _ in range(repeat):
                t0 = time.perf_counter()
                fn(text)
                best = min(best, time.perf_counter() - t0)
            cells.append(best * 1000)
        rows.append((label, cells))
    return list(refs), rows


def rate(fn, n: int, repeat: int = 3) -> float:
    """Completions per second: the best of ``repeat`` timed calls on ``n`` completions."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(n)
        best = min(best, time.perf_counter() - t0)
    return n / best


class _Judge(BaseHTTPRequestHandler):
    def setup(self):
        super().setup()
        import socket

        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # headers and body go out at once

    def log_message(self, *a):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        data = json.dumps({"choices": [{"message": {"role": "assistant", "content": '{"score": 7}'}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


NAIVE_HARNESS = """
import sys
passed = 0
for t in TESTS:
    try:
        exec(t, globals())
        passed += 1
    except BaseException:
        pass
print(passed)
"""


def naive_run(code: str, tests: list[str], timeout: float) -> float:
    """The usual unsandboxed harness: one ``python -c`` per completion running the code and then each
    test in the same process, pass count printed on stdout (trivially forged; here only for speed)."""
    with tempfile.TemporaryDirectory() as d:
        try:
            r = subprocess.run([sys.executable, "-I", "-S", "-c", f"TESTS = {tests!r}\n" + code + "\n" + NAIVE_HARNESS],
                               cwd=d, capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return 0.0
    try:
        return int(r.stdout.split()[-1]) / len(tests)
    except (ValueError, IndexError):
        return 0.0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--hostile", action="store_true", help="only the hostile completions, printed")
    args = ap.parse_args()
    names, hostile = hostile_rows()
    worst = max(max(cells) for _, cells in hostile)
    hostile_lines = [f"Hostile completions of {HOSTILE_BYTES // 1024} KiB each: milliseconds per completion (best of 3) "
                     f"for each reference; the bound is {HOSTILE_LIMIT_MS:.0f} ms. Worst: **{worst:.1f} ms**"
                     + ("" if worst <= HOSTILE_LIMIT_MS else " (OVER THE BOUND)") + ".", "",
                     "| completion | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    hostile_lines += [f"| {label} | " + " | ".join(f"{c:.1f}" for c in cells) + " |" for label, cells in hostile]
    if args.hostile:
        print("\n".join(hostile_lines))
        return 0 if worst <= HOSTILE_LIMIT_MS else 1
    n_fast, n_code = (64, 16) if args.quick else (512, 64)

    from grpo_monitor.rewards import FormatReward, JudgeReward, Limits, Sandbox, SoftOverlong, UnitTestReward, exact_match, json_schema

    rows: list[tuple[str, float, str]] = []
    em_c = [(ANSWERS + WRONG)[i % 16] for i in range(n_fast)]
    em_g = [(GOLDS + GOLDS)[i % 16] for i in range(n_fast)]
    exact_match(completions=em_c[:16], answer=em_g[:16])  # math-verify and sympy imported outside the timing
    rows.append(("exact_match (GSM8K/MATH mix, half wrong: math-verify on most)",
                 rate(lambda n: exact_match(completions=em_c[:n], answer=em_g[:n]), n_fast), ""))
    plain = [f"<answer> {i % 10} </answer>" for i in range(n_fast)]
    rows.append(("exact_match (plain numbers, no math-verify)",
                 rate(lambda n: exact_match(completions=plain[:n], answer=[str(i % 10) for i in range(n)]), n_fast), ""))
    js = [JSONS[i % 4] for i in range(n_fast)]
    json_schema(completions=js[:4], schema=[SCHEMA] * 4)
    rows.append(("json_schema", rate(lambda n: json_schema(completions=js[:n], schema=[SCHEMA] * n), n_fast), ""))
    fmt = FormatReward()
    rows.append(("answer_format", rate(lambda n: fmt(completions=plain[:n]), n_fast), ""))
    ids = [[0] * (i % 40) for i in range(n_fast)]
    so = SoftOverlong(None, 32, 8)
    rows.append(("SoftOverlong (penalty alone)", rate(lambda n: so(completions=plain[:n], completion_ids=ids[:n]), n_fast), ""))

    ThreadingHTTPServer.request_queue_size = 64  # the default backlog of 5 drops concurrent connects for a second
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Judge)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    counter = [0]

    def judge_batch(n: int) -> None:
        j = JudgeReward("be right", base_url=url, concurrency=8)
        counter[0] += 1
        j(prompts=["p"] * n, completions=[f"answer {counter[0]} {i}" for i in range(n)])

    rows.append(("JudgeReward (local stub server answering at once; 8 concurrent)", rate(judge_batch, n_code * 2),
                 "the client's own overhead; a real judge's latency dominates"))
    warm = JudgeReward("be right", base_url=url)
    warm(prompts=["p"] * n_fast, completions=plain)
    rows.append(("JudgeReward, cached", rate(lambda n: warm(prompts=["p"] * n, completions=plain[:n]), n_fast), ""))
    server.shutdown()

    workers = os.cpu_count() or 1
    sb = Sandbox(Limits(wall=5.0), workers=workers)
    caps = sb.capabilities()
    ut = UnitTestReward(sandbox=sb)
    codes = [CODES[i % 4] for i in range(n_code)]
    scores_pool = ut(completions=codes, tests=[TESTS] * n_code)
    one = UnitTestReward(sandbox=Sandbox(Limits(wall=5.0), workers=1))
    cold = UnitTestReward(sandbox=Sandbox(Limits(wall=5.0), workers=workers, fork_server=False))
    scores_naive = [naive_run(c, TESTS, 5.0) for c in codes]
    contenders = {
        "pool": lambda n: ut(completions=codes[:n], tests=[TESTS] * n),
        "one": lambda n: one(completions=codes[:n], tests=[TESTS] * n),
        "cold": lambda n: cold(completions=codes[:n], tests=[TESTS] * n),
        "naive": lambda n: [naive_run(c, TESTS, 5.0) for c in codes[:n]],
    }
    one(completions=codes[:2], tests=[TESTS] * 2)  # start the fork servers outside the timing
    best = {k: 0.0 for k in contenders}
    for _ in range(3):  # interleaved rounds: the machine's load hits every contender alike
        for k, fn in contenders.items():
            best[k] = max(best[k], rate(fn, n_code, repeat=1))
    pool_rate, one_rate, cold_rate, naive_rate = best["pool"], best["one"], best["cold"], best["naive"]
    agree = scores_pool == scores_naive

    def best_ms(k: int) -> float:
        out = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            one.sandbox.run_tests(CODES[0], [{"probes": ["add(1, 2)"]}] * k)
            out = min(out, time.perf_counter() - t0)
        return out * 1000

    one_test, many = best_ms(1), best_ms(21)
    test_ms = (many - one_test) / 20
    job_ms = one_test - test_ms
    rows.append((f"unit_test_reward, sandbox pool of {workers}, fork server ({len(TESTS)} tests each)", pool_rate,
                 f"{pool_rate * len(TESTS):.0f} sandboxed test processes/s"))
    rows.append(("unit_test_reward, sandbox, 1 worker, fork server", one_rate, ""))
    rows.append((f"unit_test_reward, sandbox pool of {workers}, a fresh launcher per completion", cold_rate, ""))
    rows.append(("one plain `subprocess.run` per completion (all tests in it), no sandbox, one at a time", naive_rate,
                 f"same scores as the sandbox: {'yes' if agree else 'NO'}"))
    for s_ in (sb, one.sandbox, cold.sandbox):
        s_.close()

    lines = ["## Reference rewards (`benchmarks/rewards.py`)", "", stamp(), "",
             f"Completions scored per second (best of repeated batches of {n_fast}; unit tests: {n_code} completions "
             f"× {len(TESTS)} tests, one fresh sandboxed process per test; the four unit-test contenders in three "
             "interleaved rounds, best round each). A shared 2-core machine (load average "
             f"{os.getloadavg()[0]:.1f} at the end of this run): figures move by tens of percent between runs. "
             f"One sandboxed job (one worker, fork server warm, best of 5) costs {job_ms:.1f} ms plus {test_ms:.1f} ms "
             "per test.", "",
             "| reference | completions / s | note |", "|---|---:|---|"]
    lines += [f"| {name} | {r:,.1f} | {note} |" for name, r, note in rows]
    lines += ["", f"Sandbox pool vs one `subprocess.run` per completion (same {n_code} completions, same scores: {agree}): "
              f"**{pool_rate / naive_rate:.2f}×** the throughput with the pool of {workers} workers, "
              f"{one_rate / naive_rate:.2f}× with one worker, {cold_rate / naive_rate:.2f}× with the pool but a fresh "
              "launcher per completion (no fork server). The sandbox runs each test in its own fresh process "
              "(the plain harness runs all of a completion's tests in one, where the completion can forge the "
              "count; the sandbox's tests are then judged by a separate process). The sandbox's isolation here: "
              + ", ".join(f"{k}={v}" for k, v in caps.items() if k in ("root", "isolation", "route", "uid", "root_fs"))
              + "."]
    lines += ["", *hostile_lines]
    body = "\n".join(lines)
    print(body)
    if not args.quick:
        update_section("rewards", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
