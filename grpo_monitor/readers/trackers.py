"""Trackers' local runs, read without network.

* ``wandb``: a W&B run directory (``wandb/run-*/`` or ``offline-run-*/``, synced or not), its
  ``run-<id>.wandb`` transaction log, or the ``wandb/`` folder (its latest run). The log is a
  LevelDB-style record stream of W&B's own protobuf ``Record`` messages, parsed with the ``wandb``
  package's schema; where it is missing or unreadable, ``files/wandb-history.jsonl`` or the final
  ``files/wandb-summary.json`` stand in, with a warning.
* ``trackio``: trackio's local SQLite database (``<TRACKIO_DIR>/<project>.db``; ``TRACKIO_DIR``
  defaults to ``$HF_HOME/trackio``), or that folder when it holds one project. Read with the
  standard library's ``sqlite3``, read-only.
"""

from __future__ import annotations

import sqlite3
import struct
import zlib
from pathlib import Path
from typing import Any

from grpo_monitor.core.jsonparse import loads
from grpo_monitor.core.metrics import SUMMARY_KEYS
from grpo_monitor.readers._base import Normalizer, Probe, Reader, Source, SourceError, StepTable, as_step, finish, guess_context

WANDB_MAGIC = b":W&B"
SQLITE_MAGIC = b"SQLite format 3\x00"
INSTALL_HINT = "pip install 'grpo-monitor[trackers]'"

_BLOCK = 32768
_HEADER = 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


# ------------------------------------------------------------------------------------ W&B


def find_wandb_file(p: Path) -> Path | None:
    """The ``.wandb`` log of a run directory, of the newest run of a ``wandb/`` folder, or None."""
    if p.is_file():
        return p if p.suffix == ".wandb" else None
    found = sorted(p.glob("*.wandb"))
    if found:
        return found[-1]
    run = newest_wandb_run(p)
    if run is not None:
        found = sorted(run.glob("*.wandb"))
        return found[-1] if found else None
    return None


def wandb_runs(p: Path) -> list[Path]:
    """The run directories of a ``wandb/`` folder, oldest first (``latest-run`` is a link to one of them)."""
    runs = [d for d in p.glob("*run-*") if d.is_dir() and not d.is_symlink()
            and (d.name.startswith("run-") or d.name.startswith("offline-run-"))]
    # run-YYYYMMDD_HHMMSS-<id>: the name sorts by start time.
    return sorted(runs, key=lambda d: d.name.split("run-", 1)[1])


def newest_wandb_run(p: Path) -> Path | None:
    latest = p / "latest-run"
    if latest.is_dir():
        return latest.resolve()
    runs = wandb_runs(p)
    return runs[-1] if runs else None


def looks_like_wandb_dir(p: Path) -> bool:
    if any(p.glob("*.wandb")) or (p / "files" / "wandb-summary.json").is_file():
        return True
    return newest_wandb_run(p) is not None


def wandb_records(path: Path, data: bytes, warnings: list[str]) -> list[bytes]:
    """The payloads of a W&B transaction log (the LevelDB log format: 32 KiB blocks, 7-byte
    record headers of CRC-32, length and type; the file opens with ``:W&B``, a magic and a version)."""
    if data[:4] != WANDB_MAGIC:
        raise SourceError(path, "not a W&B run log (no ':W&B' header)")
    if len(data) < _HEADER:
        raise SourceError(path, f"a W&B run log cut off in its {_HEADER}-byte header")
    out: list[bytes] = []
    pos = _HEADER
    pending: list[bytes] | None = None
    bad = 0
    n = len(data)
    while pos + _HEADER <= n:
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER:  # a block's tail too short for a header is padding
            pos += left
            continue
        crc, length, kind = struct.unpack_from("<IHB", data, pos)
        start = pos + _HEADER
        end = start + length
        if kind == 0 and length == 0:  # zero padding / preallocated tail
            pos += left
            continue
        if end > n or length > left - _HEADER or kind not in (_FULL, _FIRST, _MIDDLE, _LAST):
            bad += 1
            break
        chunk = data[start:end]
        if zlib.crc32(chunk, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF != crc:
            bad += 1
            pending = None
            pos = end
            continue
        if kind == _FULL:
            out.append(chunk)
            pending = None
        elif kind == _FIRST:
            pending = [chunk]
        elif pending is not None:
            pending.append(chunk)
            if kind == _LAST:
                out.append(b"".join(pending))
                pending = None
        pos = end
    if bad or pending:
        warnings.append(f"{path}: the W&B log ends in a torn or corrupt record; read what came before it")
    return out


def _wandb_pb():
    try:
        from wandb.proto import wandb_internal_pb2
    except ImportError as exc:
        raise SourceError(None, f"reading a W&B run needs the 'trackers' extra: {INSTALL_HINT} ({exc})") from None
    return wandb_internal_pb2


def _json_value(text: str) -> Any:
    try:
        return loads(text)
    except (ValueError, RecursionError):
        return None


def read_wandb(p: Path) -> Source:
    log = find_wandb_file(p)
    run_dir = log.parent if log is not None else (newest_wandb_run(p) or p)
    src = Source(path=p, format="wandb")
    failed: SourceError | None = None
    rows: list[dict[str, Any]] | None = None
    config: dict[str, Any] = {}
    if log is not None:
        src.meta["wandb_file"] = str(log)
        try:
            rows, config = _wandb_history(log, log.read_bytes(), src.warnings)
        except SourceError as exc:
            failed = exc
            src.warnings.append(f"{log}: {exc.what}; falling back to the run's files/")
    if not rows:
        rows = _wandb_files(run_dir, src)
    if not rows and failed is not None:
        raise SourceError(p, failed.what)
    if not rows:
        raise SourceError(p, "a W&B run with no logged history (its .wandb log holds no metrics, and there is no "
                             "files/wandb-history.jsonl or files/wandb-summary.json)")
    if log is not None and p.is_dir() and log.parent != p and len(wandb_runs(p)) > 1:
        src.warnings.append(f"{p}: {len(wandb_runs(p))} W&B runs here; read the latest, {run_dir.name} "
                            "(`grpo-monitor analyze` of the folder reports each)")
    table = StepTable()
    norm = Normalizer(drop=SUMMARY_KEYS)
    rows = _on_trainer_axis(p, _without_own_keys(rows), src)
    for rec in rows:
        step = _wandb_step(rec)
        if step is None:
            continue
        table.add(step, norm({k: v for k, v in rec.items() if not k.startswith("_") and _scalar(v)}))
    if not len(table):
        raise SourceError(p, "a W&B run whose history rows have no step")
    finish(src, table, "rows")
    src.context = tracker_context(src, config)
    if src.context.config.get("logging_steps"):
        src.meta["logging_steps"] = src.context.logging_steps
    return src


# The monitor's own writes into a tracker's run (its findings tables, the verdict): not the run's metrics.
OWN_PREFIX = "grpo_monitor/"


def _without_own_keys(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows without the monitor's own keys; a row that held nothing else goes (it is no step of training)."""
    out = []
    for r in rows:
        if not any(k.startswith(OWN_PREFIX) for k in r):
            out.append(r)
            continue
        kept = {k: v for k, v in r.items() if not k.startswith(OWN_PREFIX)}
        if any(not k.startswith("_") and k not in _TRAINER_STEPS for k in kept):
            out.append(kept)
    return out


def tracker_context(src: Source, config: dict[str, Any]) -> Any:
    """What the trainer's config, as the tracker holds it (every ``GRPOConfig`` field beside the
    model's config), tells the detectors and the recommendations: the same as the run log's header."""
    from grpo_monitor.core.model_config import moe_facts

    config = {k: v for k, v in config.items() if not str(k).startswith("_")}
    ctx = guess_context(src.metric_names(), as_step(config.get("logging_steps")), [s for s, _ in src.steps])
    ctx.config = config
    if config.get("model_type") or config.get("architectures"):
        try:
            ctx.model = moe_facts(config)
        except Exception:  # a config the model reader does not know: no model facts, as before
            ctx.model = {}
    return ctx


_TRAINER_STEPS = ("train/global_step", "global_step", "trainer/global_step")


def _on_trainer_axis(path: Path, rows: list[dict[str, Any]], src: Source) -> list[dict[str, Any]]:
    """Where the trainer logged its own step with its metrics, the rows without it (TRL's
    ``profiling/*`` timings, logged straight to the tracker) are on another axis (W&B's call
    counter): they are set aside, and the source says so."""
    timings = [_only_timings(r) for r in rows]
    if any(timings):
        # TRL logs its profiling timings straight to the tracker, several rows per step, stamped
        # with the last step the trainer logged (W&B's step_sync): not metrics of any one step.
        src.meta["timing_rows_set_aside"] = sum(timings)
        src.warnings.append(f"{path}: {sum(timings)} row(s) of profiling timings logged outside the trainer's "
                            "steps set aside")
        rows = [r for r, t in zip(rows, timings) if not t]
    has = [any(k in r for k in _TRAINER_STEPS) for r in rows]
    if not any(has) or all(has):
        return rows
    aside = [r for r, h in zip(rows, has) if not h]
    names: dict[str, None] = {}
    for r in aside:
        for k in r:
            if not k.startswith("_"):
                names.setdefault(k.split(":", 1)[0], None)
    shown = ", ".join(list(names)[:3]) + (", ..." if len(names) > 3 else "")
    src.meta["rows_set_aside"] = len(aside)
    src.warnings.append(f"{path}: {len(aside)} row(s) logged without the trainer's step ({shown}) set aside")
    return [r for r, h in zip(rows, has) if h]


def _only_timings(row: dict[str, Any]) -> bool:
    keys = [k for k in row if not k.startswith("_") and k not in _TRAINER_STEPS]
    return bool(keys) and all(k.startswith("profiling/") for k in keys)


def _scalar(v: Any) -> bool:
    return v is None or isinstance(v, (int, float, str)) and not isinstance(v, bool)


def _wandb_step(rec: dict[str, Any]) -> int | None:
    for key in ("train/global_step", "global_step", "trainer/global_step", "step", "_step"):
        if key in rec:
            s = as_step(rec[key])
            if s is not None:
                return s
    return None


def _wandb_history(log: Path, data: bytes, warnings: list[str]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    pb = _wandb_pb()
    rows: list[dict[str, Any]] = []
    config: dict[str, Any] = {}
    undecodable = 0
    for payload in wandb_records(log, data, warnings):
        rec = pb.Record()
        try:
            rec.ParseFromString(payload)
        except Exception:  # protobuf's DecodeError: a record this version cannot read
            undecodable += 1
            continue
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            row: dict[str, Any] = {}
            for item in rec.history.item:
                key = item.key or "/".join(item.nested_key)
                row[key] = _json_value(item.value_json)
            if rec.history.HasField("step") and "_step" not in row:
                row["_step"] = rec.history.step.num
            rows.append(row)
        elif kind == "config":
            for item in rec.config.update:
                key = item.key or "/".join(item.nested_key)
                value = _json_value(item.value_json)
                # W&B stores each config value as {"value": ..., "desc": ...}
                config[key] = value.get("value") if isinstance(value, dict) and "value" in value else value
    if undecodable:
        warnings.append(f"{log}: {undecodable} record(s) this wandb version cannot decode were skipped")
    return rows, config


def _wandb_files(run_dir: Path, src: Source) -> list[dict[str, Any]]:
    files = run_dir / "files"
    history = files / "wandb-history.jsonl"
    if history.is_file():
        rows = []
        for line in history.read_bytes().splitlines():
            obj = _json_value(line.decode("utf-8", "replace")) if line.strip() else None
            if isinstance(obj, dict):
                rows.append(obj)
        if rows:
            src.warnings.append(f"{history}: read the run's history file")
            return rows
    summary = files / "wandb-summary.json"
    if summary.is_file():
        obj = _json_value(summary.read_bytes().decode("utf-8", "replace"))
        if isinstance(obj, dict) and obj:
            src.warnings.append(f"{summary}: only the run's final summary could be read (one point, no history)")
            return [obj]
    return []


# -------------------------------------------------------------------------------- trackio


def trackio_databases(p: Path) -> list[Path]:
    return sorted(d for d in p.glob("*.db") if d.is_file() and _is_sqlite(d))


def _is_sqlite(p: Path) -> bool:
    try:
        with open(p, "rb") as fh:
            return fh.read(16) == SQLITE_MAGIC
    except OSError:
        return False


def read_trackio(p: Path, run: str | None = None) -> Source:
    db = p
    if p.is_dir():
        dbs = trackio_databases(p)
        if not dbs:
            raise SourceError(p, "no trackio project database (*.db) in this folder")
        if len(dbs) > 1:
            names = ", ".join(d.stem for d in dbs[:8])
            raise SourceError(p, f"{len(dbs)} trackio projects here ({names}); name one: {p}/<project>.db")
        db = dbs[0]
    src = Source(path=db, format="trackio")
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise SourceError(db, f"cannot open the SQLite database ({exc})") from None
    try:
        rows, configs = _trackio_rows(db, conn)
    except sqlite3.DatabaseError as exc:
        raise SourceError(db, f"not a readable trackio database ({exc})") from None
    finally:
        conn.close()
    if not rows:
        raise SourceError(db, "the trackio project has no logged metrics")
    runs: dict[str, int] = {}
    for run_name, _, _ in rows:
        runs[run_name] = runs.get(run_name, 0) + 1
    chosen = run if run is not None else rows[-1][0]  # the run logged last
    if chosen not in runs:
        raise SourceError(db, f"no run {chosen!r} in the project (runs: {', '.join(list(runs)[:8])})")
    if len(runs) > 1:
        src.warnings.append(f"{db}: {len(runs)} runs in the project; read {chosen!r}, the one logged last")
    src.meta.update(trackio_run=chosen, trackio_project=db.stem)
    table = StepTable()
    norm = Normalizer(drop=SUMMARY_KEYS)
    records = []
    unreadable = 0
    for run_name, step, metrics in rows:
        if run_name != chosen:
            continue
        obj = _json_value(metrics) if isinstance(metrics, (str, bytes)) else None
        if not isinstance(obj, dict):
            unreadable += 1
            continue
        obj = dict(obj)
        obj.setdefault("_step", step)
        records.append(obj)
    if unreadable:
        src.warnings.append(f"{db}: {unreadable} metric row(s) of run {chosen!r} are not JSON objects; skipped")
    for obj in _on_trainer_axis(db, _without_own_keys(records), src):
        s = _wandb_step(obj)
        if s is None:
            continue
        table.add(s, norm({k: v for k, v in obj.items() if not k.startswith("_") and _scalar(v)}))
    if not len(table):
        raise SourceError(db, f"the trackio run {chosen!r} has no readable metric rows")
    finish(src, table, "rows")
    src.context = tracker_context(src, configs.get(chosen) or {})
    return src


def _trackio_rows(db: Path, conn: sqlite3.Connection) -> tuple[list[tuple[str, Any, Any]], dict[str, dict[str, Any]]]:
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if "metrics" not in tables:
        raise SourceError(db, "an SQLite database without trackio's 'metrics' table")
    rows = [(str(r[0]), r[1], r[2]) for r in conn.execute("SELECT run_name, step, metrics FROM metrics ORDER BY id")]
    configs: dict[str, dict[str, Any]] = {}
    if "configs" in tables:
        for name, config in conn.execute("SELECT run_name, config FROM configs"):
            obj = _json_value(config) if isinstance(config, (str, bytes)) else None
            if isinstance(obj, dict):
                configs[str(name)] = obj
    return rows, configs




class WandbReader(Reader):
    name = "wandb"
    formats = ("wandb",)
    describes = "W&B run"
    folder_holds = "W&B run"

    def sniff(self, probe: Probe) -> str | None:
        if probe.is_dir:
            return "wandb" if looks_like_wandb_dir(probe.path) else None
        return "wandb" if probe.head.startswith(WANDB_MAGIC) else None

    def one_run(self, folder: Path) -> bool:
        # A wandb/ folder of several runs is a folder of runs, each one read on its own.
        return looks_like_wandb_dir(folder) and len(wandb_runs(folder)) < 2

    def read(self, probe: Probe, fmt: str) -> Source:
        return read_wandb(probe.path)


class TrackioReader(Reader):
    name = "trackio"
    formats = ("trackio",)
    describes = "trackio database"
    folder_holds = "trackio database"

    def sniff(self, probe: Probe) -> str | None:
        if probe.is_dir:
            return "trackio" if trackio_databases(probe.path) else None
        return "trackio" if probe.head.startswith(SQLITE_MAGIC) else None

    def one_run(self, folder: Path) -> bool:
        return bool(trackio_databases(folder))

    def read(self, probe: Probe, fmt: str) -> Source:
        return read_trackio(probe.path)
