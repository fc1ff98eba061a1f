"""The log readers on the largest shapes a foreign log takes: a CSV 100,000 columns wide and a notebook whose
progress table has a million rows, each at three sizes to show that time and memory grow linearly.

Each file is read by ``load_source`` in a fresh process: the time of the read alone and the peak RSS it adds to
the interpreter with its imports loaded (the process's peak RSS, ``VmHWM``, before and after). Before the readers
were made linear, a 100k-column CSV took 110 s (a list was searched once per column) and a 1M-row notebook
table 183 s and 676 MB (a Python call per HTML tag).

    python benchmarks/reader_worst_cases.py
    python benchmarks/reader_worst_cases.py --small --no-results   # a quick look, RESULTS.md untouched
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.results import stamp, update_section  # noqa: E402

# The peak RSS of this process image: /proc's VmHWM starts afresh at exec, where getrusage's ru_maxrss keeps the
# parent's peak at the fork (the parent has just built a 170 MB notebook).
CHILD = """
import json, resource, sys, time
from grpo_monitor.readers import load_source
def rss():
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
before = rss()
t = time.perf_counter()
src = load_source(sys.argv[1])
took = time.perf_counter() - t
print(json.dumps({"s": took, "added_mb": rss() - before, "rss_mb": rss(), "steps": len(src.steps),
                  "metrics": len(src.metric_names()), "warnings": len(src.warnings)}))
"""


def wide_csv(path: Path, columns: int, rows: int = 3) -> None:
    with open(path, "w") as fh:
        fh.write("step," + ",".join(f"m{i}" for i in range(columns)) + "\n")
        for s in range(1, rows + 1):
            fh.write(f"{s}," + ",".join("0.5" for _ in range(columns)) + "\n")


def long_notebook(path: Path, rows: int) -> None:
    """The transformers progress table as a notebook's ``text/html`` output, one row per logged step."""
    head = ("<table border=\"1\" class=\"dataframe\">\n  <thead>\n <tr style=\"text-align: left;\">\n"
            + "".join(f"      <th>{h}</th>\n" for h in ["Step", "Training Loss", "reward", "reward_std",
                                                        "completions / mean_length", "kl"])
            + "    </tr>\n  </thead>\n  <tbody>\n")
    body = "".join(f"    <tr>\n      <td>{i}</td>\n      <td>{0.001 * i:.6f}</td>\n      <td>{(i % 100) / 100:.6f}</td>\n"
                   f"      <td>0.250000</td>\n      <td>{100 + i % 50}.500000</td>\n      <td>0.000{i % 10}</td>\n    </tr>\n"
                   for i in range(1, rows + 1))
    html = head + body + "  </tbody>\n</table><p>"
    doc = {"cells": [{"cell_type": "code", "source": ["trainer.train()"], "outputs": [
        {"output_type": "display_data", "data": {"text/html": [html], "text/plain": ["<IPython.core.display.HTML object>"]},
         "metadata": {}}]}], "nbformat": 4, "nbformat_minor": 5, "metadata": {}}
    path.write_text(json.dumps(doc))


def measure(path: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, cwd=ROOT, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="a tenth of the sizes")
    ap.add_argument("--no-results", action="store_true", help="print only; leave RESULTS.md as it is")
    args = ap.parse_args()
    scale = 10 if args.small else 1
    cases = [("CSV", "columns", n // scale, wide_csv, "wide.csv") for n in (25_000, 50_000, 100_000)]
    cases += [("notebook table", "rows", n // scale, long_notebook, "long.ipynb") for n in (250_000, 500_000, 1_000_000)]
    lines = []
    with tempfile.TemporaryDirectory(prefix="reader-worst-") as d:
        for kind, unit, n, make, name in cases:
            path = Path(d) / f"{n}-{name}"
            make(path, n)
            size = path.stat().st_size
            got = measure(path)
            path.unlink()
            per = got["s"] / n * 1e6
            lines.append((kind, unit, n, size, got, per))
            print(f"{kind:15} {n:>9,} {unit:7} {size / 1e6:7.1f} MB  {got['s']:7.2f} s  {per:6.2f} us/{unit[:-1]}  "
                  f"+{got['added_mb']:.0f} MB (peak {got['rss_mb']:.0f} MB)  steps={got['steps']} metrics={got['metrics']}")
    table = ["| file | size | read | per " + "unit | peak RSS added | peak RSS | read as |", "|---|---|---|---|---|---|---|"]
    for kind, unit, n, size, got, per in lines:
        table.append(f"| {kind}, {n:,} {unit} | {size / 1e6:.1f} MB | {got['s']:.2f} s | {per:.2f} µs per {unit[:-1]} | "
                     f"{got['added_mb']:.0f} MB | {got['rss_mb']:.0f} MB | {got['steps']:,} steps × {got['metrics']:,} metrics |")
    ratios = []
    for kind in ("CSV", "notebook table"):
        rows = [x for x in lines if x[0] == kind]
        t = [x[4]["s"] for x in rows]
        m = [x[4]["added_mb"] for x in rows]
        ratios.append(f"{kind}: doubling the size took the time ×{t[1] / t[0]:.2f} then ×{t[2] / t[1]:.2f}, the memory "
                      f"×{m[1] / max(m[0], 1e-9):.2f} then ×{m[2] / max(m[1], 1e-9):.2f} (linear: ×2)")
    body = "\n".join([
        "## Readers on their worst shapes (`benchmarks/reader_worst_cases.py`)", "", stamp(), "",
        "`load_source` in a fresh process per file; \"added\" is the peak RSS above the interpreter with its imports. "
        "Before: a 100k-column CSV took 110 s (a list searched once per column), a 1M-row notebook table 183 s and "
        "676 MB (a Python call per HTML tag).", "", *table, "", *(f"- {r}" for r in ratios)])
    print(body)
    if not args.no_results:
        update_section("reader_worst_cases", body)


if __name__ == "__main__":
    main()
