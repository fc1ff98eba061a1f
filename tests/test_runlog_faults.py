"""The run log under what the machine does to it: a disk that fills (and frees), a file system that
refuses a write part-way, folders the user may not enter, structures nested too deep to walk.

The disk is a real tmpfs of a few hundred kilobytes, filled by a real file, so every failure is
the kernel's ENOSPC; a file system failing part-way is a real file-size limit (RLIMIT_FSIZE)."""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from grpo_monitor import analyze
from grpo_monitor.core.runlog import RUN_FILE, read_run, samples_file
from grpo_monitor.core.runlog_writer import RunWriter

ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def tmpfs(path: Path, size: str):
    """A real, small file system at ``path`` (unmounted after)."""
    if os.geteuid() != 0:
        pytest.skip(f"mounting a tmpfs needs root (CAP_SYS_ADMIN); these tests run as uid {os.geteuid()}")
    path.mkdir(parents=True, exist_ok=True)
    out = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, text=True)
    if out.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {out.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(fs: Path) -> Path:
    """Take every free page of the file system ``fs``: whatever writes next gets ENOSPC."""
    filler = fs / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        while True:
            os.write(fd, b"x" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    return filler


def step_metrics(s: int) -> dict[str, float]:
    return {"entropy": 1.0 - s / 1000, "reward": s / 100, **{f"pad/{i}": float(i) for i in range(40)}}


def samples_of(s: int) -> list[dict]:
    return [{"step": s, "rank": 0, "index": i, "group": i // 4, "length": s + i, "truncated": False,
             "rewards": {"f": float(i)}, "correct": None, "completion": "c" * 300} for i in range(8)]


def check_whole(log, steps: range) -> list[int]:
    """Every record read is whole and right; returns the steps recorded."""
    assert log.skipped.count == 0 and not log.warnings
    recorded = [r["step"] for r in log.steps]
    assert set(recorded) <= set(steps)
    for r in log.steps:
        assert r["metrics"] == step_metrics(r["step"])
    by_step = log.samples_by_step()
    for s, rows in by_step.items():
        assert rows == [{"type": "sample", **x} for x in samples_of(s)]
    return recorded


def test_disk_full_then_freed_loses_only_what_was_written_meanwhile(tmp_path):
    with tmpfs(tmp_path / "fs", "1m") as fs:
        errors = []
        w = RunWriter(fs / "run", on_error=lambda component, exc: errors.append((component, exc.errno)))
        w.header(run_id="r", config={"max_steps": 60})
        filler = None
        for s in range(1, 61):
            if s == 15:
                filler = fill(fs)
            if s == 40:
                filler.unlink()  # space frees
            w.step(s, step_metrics(s), time=float(s))
            w.samples(samples_of(s))
        w.write({"type": "summary", "step": 60, "metrics": {"train_runtime": 1.0}})
        w.close()
        log = read_run(fs / "run")
        recorded = check_whole(log, range(1, 61))
        assert set(range(1, 15)) | set(range(40, 61)) <= set(recorded)
        assert all(len(log.samples_by_step().get(s, [])) == 8 for s in range(40, 61))
        assert log.summary is not None and not (fs / "run" / ".grpo-monitor-reserve").exists()
        assert errors and all(e == ("run log", errno.ENOSPC) for e in errors) and len(errors) <= 2  # once per file
        [r] = analyze(fs / "run").runs
        lost = r.not_written
        assert lost["disk_full"] and not lost["ongoing"] and lost["steps"] == 60 - len(recorded) > 0
        assert 15 <= lost["first_step"] and lost["last_step"] < 40
        assert r.steps == len(recorded) and r.steps_logged == 60
        assert r.status == "incomplete" and r.status_note.startswith("the disk filled: ")
        assert f"the log holds {len(recorded)} of the 60 steps logged" in r.status_note


def test_disk_full_to_the_end_is_counted_in_the_room_the_reserve_left(tmp_path):
    with tmpfs(tmp_path / "fs", "512k") as fs:
        w = RunWriter(fs / "run", on_error=lambda component, exc: None)
        w.header(run_id="r", config={"max_steps": 40})
        for s in range(1, 41):
            if s == 13:
                fill(fs)
            w.step(s, step_metrics(s), time=float(s))
        w.write({"type": "summary", "step": 40, "metrics": {}})
        w.close()
        log = read_run(fs / "run", samples=False)
        recorded = check_whole(log, range(1, 41))
        assert set(range(1, 13)) <= set(recorded) and log.summary is None
        doc = analyze(fs / "run").to_dict()["runs"][0]
        assert doc["steps"] == len(recorded) and doc["steps_logged"] == 40
        assert doc["not_written"]["records"] == {"step": 40 - len(recorded), "summary": 1}
        assert doc["not_written"]["ongoing"] and not doc["not_written"]["uncounted"]
        assert doc["verdict"] == "incomplete" and "the disk filled" in doc["status_note"]
        assert "the final summary" in doc["status_note"] and "still failed when the run ended" in doc["status_note"]


# Writes steps 1-5, then lowers the process's file-size limit so that step 6 is written part-way
# (the kernel's EFBIG after a short write), tries steps 6-10 under it, raises it, writes 11-15.
PART_WAY = textwrap.dedent("""
    import os, resource, signal, sys
    from grpo_monitor.core.runlog import RUN_FILE
    from grpo_monitor.core.runlog_writer import RunWriter
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
    run = sys.argv[1]
    w = RunWriter(run, on_error=lambda component, exc: print("reported", exc.errno))
    w.header(run_id="r")
    metrics = lambda s: {"entropy": s / 10, **{f"pad/{i}": float(i) for i in range(20)}}
    for s in range(1, 6):
        w.step(s, metrics(s), time=float(s))
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    limit = os.path.getsize(os.path.join(run, RUN_FILE)) + 100
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    for s in range(6, 11):
        w.step(s, metrics(s), time=float(s))
        with open(os.path.join(run, RUN_FILE), "rb") as fh:
            print("whole", fh.read().endswith(b"\\n"))
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    for s in range(11, 16):
        w.step(s, metrics(s), time=float(s))
    w.close()
""")


def test_a_write_that_fails_part_way_is_cut_back_before_the_next_append(tmp_path):
    out = subprocess.run([sys.executable, "-c", PART_WAY, str(tmp_path)], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines() == [f"reported {errno.EFBIG}"] + ["whole True"] * 5
    log = read_run(tmp_path)
    assert [r["step"] for r in log.steps] == [*range(1, 6), *range(11, 16)]
    assert log.skipped.count == 0 and not log.warnings  # no fragment was ever followed by a record
    [note] = [n for n in log.notes if n.get("kind") == "write_failed"]
    assert note["lost"] == {"step": 5} and (note["first_step"], note["last_step"]) == (6, 10)
    assert note["error"] == os.strerror(errno.EFBIG) and note["disk_full"] is False and note["ongoing"] is False


# -- real training on a disk that fills ----------------------------------------------------------


def train_on_a_filling_disk(tmp_path: Path, fs: Path, steps: int, fill_at: int, free_at: int | None):
    import transformers
    from transformers import TrainerCallback

    from grpo_monitor.app.demo import build_trainer, demo_config
    from grpo_monitor.callbacks import attach

    class Disk(TrainerCallback):
        filler: Path | None = None

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == fill_at:
                self.filler = fill(fs)
            if state.global_step == free_at and self.filler is not None:
                self.filler.unlink()

    transformers.logging.set_verbosity_error()
    trainer = build_trainer(demo_config(tmp_path / "trainer", steps, disable_tqdm=True))  # checkpoints off the tmpfs
    attach(trainer, fs / "run")
    trainer.add_callback(Disk())
    trainer.train()
    return trainer


def summary_text(run_dir: Path) -> str:
    from grpo_monitor.app.demo import print_summary

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        print_summary(run_dir, 1.0)
    return buf.getvalue()


def test_training_on_a_disk_that_fills_and_frees_keeps_every_record_it_could_write(tmp_path, quiet_monitor_logs):
    with tmpfs(tmp_path / "fs", "768k") as fs:
        trainer = train_on_a_filling_disk(tmp_path, fs, steps=30, fill_at=8, free_at=20)
        assert trainer.state.global_step == 30
        log = read_run(fs / "run")
        assert log.skipped.count == 0 and not log.warnings
        recorded = [r["step"] for r in log.steps]
        assert set(range(1, 8)) | set(range(21, 31)) <= set(recorded) and log.summary is not None
        by_step = log.samples_by_step()
        assert all(len(by_step[s]) == len(by_step[1]) > 0 for s in range(21, 31))  # samples after the gap, whole
        said = [r.getMessage() for r in quiet_monitor_logs.records if "run log failed" in r.getMessage()]
        assert len(said) == 1 and "No space left on device" in said[0]
        text = summary_text(fs / "run")
        assert "demo: 30 steps of GRPO" in text and "not in the run log: the disk filled: " in text
        assert f"the log holds {len(recorded)} of the 30 steps logged" in text
        [r] = analyze(fs / "run").runs
        assert (r.steps, r.steps_logged) == (len(recorded), 30) and r.not_written["disk_full"]
        assert "the disk filled" in r.status_note


def test_training_on_a_disk_that_stays_full_says_how_much_is_missing(tmp_path, quiet_monitor_logs):
    with tmpfs(tmp_path / "fs", "768k") as fs:
        trainer = train_on_a_filling_disk(tmp_path, fs, steps=20, fill_at=6, free_at=None)
        assert trainer.state.global_step == 20
        log = read_run(fs / "run")
        recorded = [r["step"] for r in log.steps]
        assert set(range(1, 6)) <= set(recorded) and len(recorded) < 20 and log.summary is None
        text = summary_text(fs / "run")
        assert "demo: 20 steps of GRPO" in text and "the disk filled" in text and "the final summary" in text
        out = subprocess.run([sys.executable, "-m", "grpo_monitor", "analyze", str(fs / "run")],
                             capture_output=True, text=True, cwd=ROOT)
        assert out.returncode in (1, 3), out.stderr  # incomplete (3), unless a finding came first (1)
        assert "the disk filled" in out.stdout and f"the log holds {len(recorded)} of the 20 steps logged" in out.stdout


# -- a folder the user cannot enter, a structure nested too deep ----------------------------------


@pytest.fixture
def locked(tmp_path):
    """A run directory inside a folder the test's user cannot enter, and how to run as that user."""
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: no way to run the commands as a user the folder shuts out")
        as_user = ["setpriv", "--reuid", "nobody", "--regid", "nogroup", "--clear-groups"]
    else:
        as_user = []  # this user already cannot enter a folder of mode 000
    base = Path(tempfile.mkdtemp(prefix="grpo-locked-", dir="/tmp"))
    os.chmod(base, 0o755)
    run = base / "locked" / "run"
    w = RunWriter(run)
    w.header(run_id="r", config={})
    w.step(1, {"entropy": 0.5}, time=1.0)
    w.close()
    os.chmod(base / "locked", 0o700 if as_user else 0o000)
    yield base, run, as_user
    os.chmod(base / "locked", 0o755)
    shutil.rmtree(base)


def run_as(as_user, *args, **kwargs):
    env = dict(os.environ, PYTHONWARNINGS="ignore", HOME="/tmp")
    return subprocess.run([*as_user, sys.executable, "-m", "grpo_monitor", *args], capture_output=True, text=True,
                          cwd="/tmp", env=env, **kwargs)


@pytest.mark.parametrize("target", ["run", "folder", "above"])
@pytest.mark.parametrize("verb", ["analyze", "watch"])
def test_a_folder_the_user_cannot_enter_is_one_line_and_exit_2(locked, verb, target):
    base, run, as_user = locked
    path = {"run": run, "folder": run.parent, "above": base}[target]
    if verb == "watch" and target == "above":
        path = base / "locked"  # watch takes one run; a folder above a locked one is a folder like any other
    out = run_as(as_user, verb, str(path), timeout=60)
    assert "Traceback" not in out.stderr and "Error:" not in out.stderr, out.stderr
    if verb == "analyze" and target == "above":
        # A folder of runs: the one it cannot enter is listed as skipped, not an error, and nothing else is there.
        assert out.returncode == 2 and "cannot be entered" in out.stdout + out.stderr
        return
    assert out.returncode == 2 and out.stdout == ""
    assert len(out.stderr.strip().splitlines()) == 1 and str(path) in out.stderr and "ermission denied" in out.stderr


WAIT_SCRIPT = textwrap.dedent("""
    import asyncio, sys
    from textual.widgets import Static
    from grpo_monitor.app.dashboard import WatchApp

    async def main():
        app = WatchApp(sys.argv[1], poll_interval=0.05, wait=True)
        async with app.run_test(size=(160, 40)) as pilot:
            await pilot.pause(1.0)
            print(app.is_running, app.screen.query_one("#run-header", Static).visual.plain.replace("\\n", " "))

    asyncio.run(main())
""")


def test_watch_wait_on_a_folder_the_user_cannot_enter_says_so_on_screen(locked):
    pytest.importorskip("textual")
    base, run, as_user = locked
    env = dict(os.environ, PYTHONWARNINGS="ignore", HOME="/tmp")
    out = subprocess.run([*as_user, sys.executable, "-c", WAIT_SCRIPT, str(run)], capture_output=True, text=True,
                         cwd=ROOT, env=env, timeout=120)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-3000:]
    alive, head = out.stdout.strip().split(" ", 1)
    assert alive == "True" and "waiting for" in head and "cannot read (Permission denied)" in head


def deep_json(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_a_deep_structure_never_gives_a_traceback(tmp_path):
    """A header nested 100,000 deep leaves no run to show: one line, exit 2. A sample nested so
    deep costs that sample: the run is analysed and the report says which line was left out."""
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / RUN_FILE).write_text('{"type":"header","schema":1,"config":' + deep_json(100_000) + "}\n")
    out = run_as([], "watch", str(bad), timeout=60)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert out.stderr.strip().splitlines() == [
        f"grpo-monitor: {bad / RUN_FILE}: not a run this tool reads (line 1: corrupt record (nested too deeply))"]
    run = tmp_path / "run"
    w = RunWriter(run)
    w.header(run_id="r", config={})
    for s in range(1, 4):
        w.step(s, {"entropy": 0.5, "reward": 0.1}, time=float(s))
    w.close()
    with open(run / samples_file(0), "w") as fh:
        fh.write('{"type":"sample","step":2,"index":0,"rewards":{"f":' + deep_json(100_000) + "}}\n")
    out = run_as([], "analyze", str(run), "--json", timeout=60)
    assert out.returncode != 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    doc = json.loads(out.stdout)["runs"][0]
    assert doc["steps"] == 3 and doc["skipped_records"]["count"] == 1
    assert doc["skipped_records"]["where"] == [f"{run / samples_file(0)}:1: corrupt record (nested too deeply)"]


def test_unusable_input_exits_2_in_every_verb(locked):
    base, run, as_user = locked
    config = base / "locked" / "grpo.yaml"
    cases = {
        "demo": ["demo", "--steps", "1", "--run-dir", str(base / "locked" / "new")],
        "lint": ["lint", str(config)],
        "supervise": ["supervise", "--run-dir", str(base / "locked" / "sup"), "--", sys.executable, "-c", "pass"],
        "inspect-rewards": ["inspect-rewards", "--auto", "--dataset", str(config), "--reward-funcs", "x:y"],
    }
    for verb, args in cases.items():
        out = run_as(as_user, *args, timeout=120)
        assert out.returncode == 2, (verb, out.returncode, out.stderr[-1500:])
        assert "Traceback" not in out.stderr, (verb, out.stderr[-1500:])
