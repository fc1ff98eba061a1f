"""The timings the README states, measured: ``make demo`` from a warm ``.venv`` (three runs: wall and CPU
seconds) and the suite's own line (``N passed in S s``) from a log of ``make test``.

    python benchmarks/readme_timings.py --demo                 # times the demo three times
    python benchmarks/readme_timings.py --suite-log test.log   # records the suite's count and time

Each writes its section of ``benchmarks/RESULTS.md``; ``tests/test_readme_claims.py`` checks the README
quotes these numbers.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.results import stamp, update_section  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEMO = ["-m", "grpo_monitor", "demo", "--scenario", "sudden_collapse", "--auto-restart", "--max-restarts", "1"]
# pytest's closing line: "2704 passed, 3 skipped in 997.12s (0:16:37)"
SUITE_LINE = re.compile(r"(?:(\d+) failed, )?(\d+) passed(?:, (\d+) skipped)?[^\n]* in ([\d.]+)s")


def time_demo(runs: int = 3) -> list[tuple[float, float]]:
    out = []
    for i in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run([sys.executable, *DEMO, "--run-dir", f"/tmp/readme-timings-demo-{os.getpid()}-{i}"],
                       cwd=ROOT, check=True, capture_output=True)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        out.append((wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)))
    return out


def demo_section(times: list[tuple[float, float]]) -> str:
    walls, cpus = [w for w, _ in times], [c for _, c in times]
    load = os.getloadavg()[0]
    return (f"## make demo\n\n{stamp()} · load average {load:.1f} at the end\n\n"
            f"`make demo` from a warm `.venv` and model cache, {len(times)} runs: "
            f"**{min(walls):.1f}–{max(walls):.1f} s** wall, {min(cpus):.0f}–{max(cpus):.0f} s of CPU.\n")


def suite_section(log: Path, note: str = "") -> str:
    text = log.read_text(encoding="utf-8", errors="replace")
    found = SUITE_LINE.findall(text)
    if not found:
        raise SystemExit(f"{log}: no pytest closing line ('N passed in S s')")
    failed, passed, skipped, seconds = found[-1]
    total = int(failed or 0) + int(passed) + int(skipped or 0)
    return (f"## make test\n\n{stamp()}\n\nThe suite from a fresh clone (`.ci/run`): "
            f"**{total:,} tests in {float(seconds):,.0f} s** ({passed} passed"
            + (f", {skipped} skipped" if skipped else "") + (f", {failed} failed" if failed else "") + ").\n"
            + (f"\n{note}\n" if note else ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--demo", action="store_true", help="time the demo three times")
    ap.add_argument("--suite-log", type=Path, help="a log of the suite's run to read its closing line from")
    ap.add_argument("--note", default="", help="a sentence on the run, kept beside its numbers")
    opts = ap.parse_args()
    if not opts.demo and not opts.suite_log:
        ap.error("give --demo, --suite-log FILE or both")
    if opts.demo:
        body = demo_section(time_demo())
        update_section("readme-demo", body)
        print(body)
    if opts.suite_log:
        body = suite_section(opts.suite_log, opts.note)
        update_section("readme-suite", body)
        print(body)


if __name__ == "__main__":
    main()
