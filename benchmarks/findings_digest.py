"""Every finding (and each detector's state at every step) over every labelled synthetic case, as JSON:
the check that a change made for speed changed no behaviour. Per case: the detectors' own findings, their states,
the detectors switched off, and the findings as the diagnosis leaves them (``core.diagnosis``: what users see).

    python benchmarks/findings_digest.py OUT.json [--only id,id] [--seeds 2]
    diff <(python -m json.tool A.json) <(python -m json.tool B.json)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from grpo_monitor.detectors import ALL_DETECTORS  # noqa: E402
from grpo_monitor.fixtures.synthetic import CASES, generate  # noqa: E402
from grpo_monitor.core.diagnosis import Diagnosis  # noqa: E402
from grpo_monitor.core.engine import Engine  # noqa: E402


def digest(only: set[str] | None, seeds: int) -> dict[str, list]:
    classes = [c for c in ALL_DETECTORS if not only or c.id in only]
    out: dict[str, list] = {}
    for name in CASES:
        for ls in (1, 10):
            for seed in range(seeds):
                run = generate(name, seed=seed, logging_steps=ls)
                dets = [c() for c in classes]
                # Detector behaviour alone: the cost and forecast annotations are left off (they are checked
                # by their own tests and reported by benchmarks/detection.py).
                eng = Engine(run.context, dets, annotators=())
                diagnosis = Diagnosis(run.context)
                states, diagnosed = [], []
                for step, m in run.steps:
                    raised = eng.update(step, m, run.samples.get(step, []))
                    diagnosed += diagnosis.review(raised, step, m, eng)
                    states.append([d.state for d in dets])
                out[f"{name}/{ls}/{seed}"] = [[f.to_dict() for f in eng.findings], states, sorted(eng.disabled),
                                              [f.to_dict() for f in diagnosed]]
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--only", default="")
    p.add_argument("--seeds", type=int, default=2)
    a = p.parse_args()
    only = {x for x in a.only.split(",") if x} or None
    Path(a.out).write_text(json.dumps(digest(only, a.seeds), sort_keys=True, default=str))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
