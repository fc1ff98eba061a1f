"""The field-failure coverage map: every catalogued report mapped once, in its class, to checks that exist."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import field_coverage as fc  # noqa: E402
from tests.conftest import SHARED  # noqa: E402

CATALOGUE = SHARED / "FIELD-FAILURES.md"


def catalogue() -> dict[int, str]:
    """Report number -> class, read from the catalogue's section 1 tables."""
    text = CATALOGUE.read_text(encoding="utf-8")
    section = text[text.index("## 1."):text.index("## 2.")]
    out: dict[int, str] = {}
    cls = None
    for line in section.splitlines():
        head = re.match(r"### (K\d+)\.", line)
        if head:
            cls = head.group(1)
            continue
        row = re.match(r"\|\s*(\d+)\s*\|", line)
        if row and cls:
            out[int(row.group(1))] = cls
    return out


def test_the_map_holds_120_distinct_reports_each_with_a_class_and_a_verdict():
    assert sorted(fc.REPORTS) == list(range(1, 121))
    for n, (cls, signature, catchers) in fc.REPORTS.items():
        assert cls in fc.CLASS_NAMES and signature.strip(), n
        if isinstance(catchers, str):
            assert catchers.startswith("not covered: ") and len(catchers) > len("not covered: ") + 10, n
        else:
            assert catchers and len(set(catchers)) == len(catchers), n


def test_at_least_100_reports_are_covered():
    covered = sum(fc.covered(n) for n in fc.REPORTS)
    assert covered >= 100 and covered + sum(not fc.covered(n) for n in fc.REPORTS) == 120


@pytest.mark.skipif(not CATALOGUE.is_file(), reason="../shared/FIELD-FAILURES.md is not available")
def test_classes_match_the_catalogue():
    cat = catalogue()
    assert len(cat) == 120
    assert {n: c for n, (c, _, _) in fc.REPORTS.items()} == cat
    per_class = Counter(cat.values())
    assert {c: t for c, (t, _) in fc.counts().items()} == dict(per_class)


def test_every_named_detector_and_check_exists():
    assert fc.missing_ids() == {}, "named but not found: " + "; ".join(
        f"{c} (#{', #'.join(map(str, ns))})" for c, ns in fc.missing_ids().items())


def test_the_script_validates_before_it_writes(tmp_path):
    # --check never writes; its exit status is the validation's.
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "field_coverage.py"), "--check"],
                         capture_output=True, text=True)
    assert f"covered {sum(fc.covered(n) for n in fc.REPORTS)} of 120" in out.stdout
    assert out.returncode == (1 if fc.missing_ids() else 0)
    assert ("MISSING:" in out.stderr) == bool(fc.missing_ids())
    table = fc.table()
    assert table.count("\n| ") >= 120 + 19 and "| 118 | K18 |" in table
