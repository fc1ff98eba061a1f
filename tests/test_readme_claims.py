"""What the README states about the suite and the demo holds: the number of tests it gives for its latest
measurement is the number ``make test`` (``pytest -q``) collects, and the timings it quotes are the ones
``benchmarks/readme_timings.py`` measured and wrote to ``benchmarks/RESULTS.md``."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# "... for the suite (2,493 tests in 997 s) on ...": the latest measurement is the one stated first.
MEASURED = re.compile(r"\((\d[\d,]*) tests in (\d[\d,.]*) s\)")
DEMO = re.compile(r"`make demo` took (\d[\d.]*)–(\d[\d.]*) s")


def readme() -> str:
    return (ROOT / "README.md").read_text(encoding="utf-8")


def section(name: str) -> str:
    text = (ROOT / "benchmarks" / "RESULTS.md").read_text(encoding="utf-8")
    found = re.search(rf"<!-- {name}:begin -->(.*?)<!-- {name}:end -->", text, re.S)
    assert found, f"benchmarks/RESULTS.md has no {name} section (python benchmarks/readme_timings.py)"
    return found.group(1)


def collected() -> int:
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
                         capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return sum(1 for line in out.stdout.splitlines() if "::" in line)


def test_the_readme_states_the_number_of_tests_the_suite_collects():
    stated = MEASURED.search(readme())
    assert stated, "README.md states no measured test count"
    assert int(stated.group(1).replace(",", "")) == collected()


def test_the_readme_quotes_the_measured_suite_and_demo_timings():
    suite = MEASURED.search(readme())
    measured = re.search(r"\*\*(\d[\d,]*) tests in (\d[\d,]*) s\*\*", section("readme-suite"))
    assert suite and measured
    assert suite.group(2).replace(",", "") == measured.group(2).replace(",", ""), (suite.group(0), measured.group(0))
    demo = DEMO.search(readme())
    timed = re.search(r"\*\*(\d[\d.]*)–(\d[\d.]*) s\*\* wall", section("readme-demo"))
    assert demo and timed
    assert demo.groups() == timed.groups(), (demo.group(0), timed.group(0))
