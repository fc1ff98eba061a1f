"""What the README states about the suite holds: the number of tests it gives for its latest measurement
is the number ``make test`` (``pytest -q``) collects."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# "... for the suite (2,493 tests in 997 s) on ...": the latest measurement is the one stated first.
MEASURED = re.compile(r"\((\d[\d,]*) tests in \d[\d,.]* s\)")


def collected() -> int:
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
                         capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return sum(1 for line in out.stdout.splitlines() if "::" in line)


def test_the_readme_states_the_number_of_tests_the_suite_collects():
    stated = MEASURED.search((ROOT / "README.md").read_text(encoding="utf-8"))
    assert stated, "README.md states no measured test count"
    assert int(stated.group(1).replace(",", "")) == collected()
