"""The run-log readers on files no run should leave, and on an ordinary long one.

- A 2 GB sparse ``run.jsonl`` (one hole: no newline, no record): ``read_run`` in a fresh process,
  its time and the peak RSS it adds to the interpreter, and ``grpo-monitor analyze`` on it end to
  end (a fresh process: interpreter start and imports included). Target: rejected "no header
  record" in well under a second and under 100 MB.
- A 2 GB sparse samples file beside a valid run: the samples index (``SampleIndex.scan``), the same.
- An ordinary 100,000-step ``run.jsonl``: ``read_run`` as it streams the file a chunk at a time,
  against reading it whole and splitting it (what the reader did before it streamed), best of 3.

Each measurement runs in its own process, so its peak RSS is its own. Results go to the
``runlog_faults`` section of benchmarks/RESULTS.md.

    python benchmarks/runlog_faults.py
    python benchmarks/runlog_faults.py --no-results
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.results import stamp, update_section  # noqa: E402

SPARSE = 2 << 30
TARGET_S, TARGET_MB = 1.0, 100.0

# Runs in a fresh process: the RSS before the read (imports done) and the peak after it.
CHILD = """
import json, resource, sys, time
from grpo_monitor.core.runlog import RunLogError, iter_records, parse_line, read_run
from grpo_monitor.core.sample_index import SampleIndex
from pathlib import Path
what, path = sys.argv[1], sys.argv[2]
rss = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
before = rss()
t = time.perf_counter()
if what == "read_run":
    try:
        n = len(read_run(path, samples=False).steps)
        said = f"{n} steps"
    except RunLogError as exc:
        said = str(exc)
elif what == "index":
    idx = SampleIndex(path)
    idx.scan(final=True)
    said = f"steps {idx.steps()}, {idx.count} samples, warnings {idx.warnings}"
elif what == "whole":  # read_run before it streamed: the file read whole and split, then the same records kept
    from grpo_monitor.core.runlog import RunLog
    log = RunLog(path=Path(path))
    data = (Path(path) / "run.jsonl").read_bytes()
    lines = data.split(b"\\n")
    del data
    for i, line in enumerate(lines, 1):
        if line.strip():
            log.add(parse_line(line, str(i)))
    del lines
    dedup = {rec["step"]: rec for rec in log.steps}
    log.steps = [dedup[s] for s in sorted(dedup)]
    said = f"{len(log.steps)} steps"
print(json.dumps({"s": time.perf_counter() - t, "rss_before_mb": before, "rss_peak_mb": rss(), "said": said}))
"""


def child(what: str, path: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, what, str(path)], capture_output=True, text=True, cwd=ROOT, check=True)
    return json.loads(out.stdout)


def cli_analyze(path: Path) -> dict:
    import resource

    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "grpo_monitor", "analyze", str(path)], capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return {"s": wall, "rss_peak_mb": peak, "code": out.returncode, "said": out.stderr.strip()}


def write_long_run(d: Path, steps: int) -> None:
    from grpo_monitor.core.runlog_writer import RunWriter

    w = RunWriter(d)
    w.header(run_id="long", config={"logging_steps": 1}, model={})
    batch = []
    for s in range(1, steps + 1):
        batch.append({"type": "step", "step": s, "time": float(s),
                      "metrics": {f"m{i}": s * 0.001 + i for i in range(30)}})
        if len(batch) == 1000:
            w.write(*batch)
            batch = []
    w.write(*batch)
    w.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=100_000)
    p.add_argument("--no-results", action="store_true")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="runlog-faults-") as tmp:
        base = Path(tmp)
        sparse_run = base / "sparse"
        sparse_run.mkdir()
        with open(sparse_run / "run.jsonl", "wb") as fh:
            fh.truncate(SPARSE)
        sparse_samples = base / "samples"
        write_long_run(sparse_samples, 10)
        with open(sparse_samples / "samples.rank0.jsonl", "wb") as fh:
            fh.truncate(SPARSE)
        long_run = base / "long"
        write_long_run(long_run, args.steps)
        size_mb = (long_run / "run.jsonl").stat().st_size / 1e6

        rows = {"read_run": child("read_run", sparse_run), "index": child("index", sparse_samples)}
        cli = cli_analyze(sparse_run)
        streamed = [child("read_run", long_run) for _ in range(3)]
        whole = [child("whole", long_run) for _ in range(3)]

    def added(r: dict) -> float:
        return r["rss_peak_mb"] - r["rss_before_mb"]

    def met(ok: bool) -> str:
        return "met" if ok else "**missed**"

    r, i = rows["read_run"], rows["index"]
    lines = [
        "## Run-log readers on bad files (`benchmarks/runlog_faults.py`)",
        "",
        stamp(),
        "",
        f"Sparse files of {SPARSE / 2**30:.0f} GiB (all one hole: no newline, no record). Each in a fresh process; "
        "\"added\" is the peak RSS above the interpreter with its imports.",
        "",
        "| file | reader | time | peak RSS added | peak RSS | says | target |",
        "|---|---|---|---|---|---|---|",
        f"| `run.jsonl` | `read_run` | {r['s'] * 1e3:.1f} ms | {added(r):.1f} MB | {r['rss_peak_mb']:.0f} MB | {r['said']} "
        f"| < {TARGET_S:.0f} s, < {TARGET_MB:.0f} MB: {met(r['s'] < TARGET_S and added(r) < TARGET_MB)} |",
        f"| `run.jsonl` | `grpo-monitor analyze` (whole process) | {cli['s']:.2f} s | — | {cli['rss_peak_mb']:.0f} MB "
        f"| exit {cli['code']}: `{cli['said']}` | the read within it: above |",
        f"| `samples.rank0.jsonl` | `SampleIndex.scan` | {i['s'] * 1e3:.1f} ms | {added(i):.1f} MB | {i['rss_peak_mb']:.0f} MB "
        f"| {i['said']} | < {TARGET_S:.0f} s, < {TARGET_MB:.0f} MB: {met(i['s'] < TARGET_S and added(i) < TARGET_MB)} |",
        "",
        f"An ordinary `run.jsonl` of {args.steps:,} steps × 30 metrics ({size_mb:.0f} MB), best of 3:",
        "",
        "| reading | time | peak RSS added |",
        "|---|---|---|",
        f"| streamed a chunk at a time (`read_run`) | {min(x['s'] for x in streamed):.2f} s | "
        f"{min(added(x) for x in streamed):.0f} MB |",
        f"| read whole and split, the same records kept (before it streamed) | {min(x['s'] for x in whole):.2f} s | "
        f"{min(added(x) for x in whole):.0f} MB |",
    ]
    body = "\n".join(lines) + "\n"
    print(body)
    if not args.no_results:
        update_section("runlog_faults", body)


if __name__ == "__main__":
    main()
