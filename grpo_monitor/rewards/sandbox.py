"""Run model-written code in a sandbox, one fresh process tree per job, many jobs in parallel.

Each job is one ``python -I -S`` launcher (``_sandbox_child.py``) in its own session and process
group. It isolates the code it runs (see that module and docs/REWARDS.md for the threat model):
new mount, network and PID namespaces where the kernel allows; a fresh tmpfs working directory;
the trainer's home and working directory hidden; an unprivileged uid of its own per worker slot;
``RLIMIT_CPU``/``AS``/``FSIZE``/``NPROC``/``NOFILE``; a wall-clock limit after which the whole tree
is killed; stdout/stderr kept to a bounded head; an empty environment. ``Sandbox.capabilities()``
says which of these this machine grants.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

CHILD = str(Path(__file__).with_name("_sandbox_child.py"))
# Unprivileged uids for the sandboxed code: one per worker slot, so a fork bomb in one job cannot
# use up the process count (RLIMIT_NPROC is per uid) of the job beside it. No passwd entry needed.
UID_BASE = 200_000
_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}


@dataclasses.dataclass(frozen=True)
class Limits:
    wall: float = 5.0  # seconds before the whole process tree is killed
    cpu: int = 4  # seconds of CPU per process
    memory: int = 1 << 30  # address space (RLIMIT_AS), bytes
    fsize: int = 16 << 20  # largest file the code may write, bytes
    nproc: int = 32  # processes of the sandbox's uid
    nofile: int = 64
    tmpfs: int = 64 << 20  # the working directory's size
    output: int = 64 << 10  # head of stdout/stderr kept
    result: int = 1 << 20  # the values the code reports

    def as_job(self) -> dict[str, Any]:
        return {"wall": self.wall, "cpu": self.cpu, "as": self.memory, "fsize": self.fsize, "nproc": self.nproc,
                "nofile": self.nofile, "tmpfs": self.tmpfs, "output": self.output, "result": self.result}


@dataclasses.dataclass
class JobResult:
    status: str  # exit | signal | timeout | error | lost
    code: int | None = None
    ok: bool = False  # the code ran and every probe produced a value
    values: list[Any] | None = None  # encoded probe values (decode with ``decode_value``)
    error: str = ""
    stdout: str = ""
    stderr: str = ""
    caps: dict[str, Any] = dataclasses.field(default_factory=dict)


def _hidden_paths() -> list[str]:
    out = []
    for p in (os.path.expanduser("~"), "/root", "/home", os.getcwd()):
        rp = os.path.realpath(p)
        if rp not in out and rp != "/":
            out.append(rp)
    return out


def _kept_paths() -> list[str]:
    # The standard library, so the code can import it when its directory is inside a hidden one.
    return [os.path.realpath(os.path.dirname(os.__file__))]


class Sandbox:
    """A pool of sandboxed jobs. ``run(code, probes)`` runs one; ``map`` runs many in parallel."""

    def __init__(self, limits: Limits | None = None, workers: int | None = None, isolate: dict[str, bool] | None = None,
                 hide: Sequence[str] | None = None, fork_server: bool = True) -> None:
        self.limits = limits or Limits()
        self.workers = max(1, int(workers or min(8, os.cpu_count() or 1)))
        self.isolate = dict(isolate or {})
        self.hide = list(hide) if hide is not None else _hidden_paths()
        self._slots: queue.Queue[int] = queue.Queue()
        base = UID_BASE + (os.getpid() % 4096) * 64
        for i in range(self.workers):
            self._slots.put(base + i % 64)
        self.fork_server = fork_server
        self._server: subprocess.Popen[bytes] | None = None
        self._server_sock: str | None = None
        self._server_failed = False
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._warned: set[str] = set()

    def __getstate__(self) -> dict[str, Any]:  # picklable for TRL's rollout workers: no pool, no queue
        return {"limits": self.limits, "workers": self.workers, "isolate": self.isolate, "hide": self.hide,
                "fork_server": self.fork_server}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["limits"], state["workers"], state["isolate"], state["hide"],  # type: ignore[misc]
                      state.get("fork_server", True))

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="grpo-sandbox")
            return self._pool

    def run_tests(self, code: str, tests: Sequence[dict[str, Any]], limits: Limits | None = None) -> list[JobResult]:
        """Run ``code`` once per test, each in a fresh process of one sandbox. A test is
        ``{"probes": [...], "setup": "..."}`` (evaluate the probe expressions after the code) or
        ``{"stdin": "..."}`` (feed it stdin, keep its stdout). ``limits.wall`` is per test."""
        lim = limits or self.limits
        if not tests:
            return []
        uid = self._slots.get()
        try:
            job = {"code": code, "tests": [{"probes": list(t.get("probes") or []), "setup": t.get("setup") or "",
                                            "stdin": t.get("stdin")} for t in tests],
                   "limits": lim.as_job(), "uid": uid, "gid": uid, "isolate": self.isolate, "hide": self.hide,
                   "keep": _kept_paths()}
            return self._launch(job, lim)
        finally:
            self._slots.put(uid)

    def run(self, code: str, probes: Sequence[str] = (), setup: str = "", stdin: str | None = None,
            limits: Limits | None = None) -> JobResult:
        """One test: ``code`` then the probes (or, with ``stdin``, its stdout)."""
        return self.run_tests(code, [{"probes": list(probes), "setup": setup, "stdin": stdin}], limits)[0]

    def map(self, jobs: Sequence[dict[str, Any]]) -> list[list[JobResult]]:
        """``run_tests(**job)`` for every job, ``workers`` at a time, results in order."""
        return list(self._executor().map(lambda j: self.run_tests(**j), jobs))

    def _launch(self, job: dict[str, Any], lim: Limits) -> list[JobResult]:
        n = len(job["tests"])
        workdir = None
        try:
            if os.getuid() != 0 or self.isolate.get("mount", True) is False:
                import tempfile

                workdir = tempfile.mkdtemp(prefix="grpo-sandbox-")
                if os.getuid() == 0:
                    os.chmod(workdir, 0o711)
                job["workdir"] = workdir
            timeout = n * (lim.wall + 2) + 30
            data = json.dumps(job).encode("utf-8")
            rep = self._via_server(data, timeout) if self.fork_server else None
            if rep is None:
                proc = subprocess.Popen([sys.executable, "-I", "-S", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, start_new_session=True, close_fds=True, cwd="/",
                                        env=_ENV)
                try:
                    out, err = proc.communicate(data, timeout=timeout)
                except subprocess.TimeoutExpired:
                    self._killpg(proc.pid)
                    proc.communicate()
                    return [JobResult(status="timeout", error="launcher did not answer")] * n
                except BaseException:
                    self._killpg(proc.pid)
                    raise
                if proc.returncode != 0 or not out:
                    msg = f"launcher exit {proc.returncode}: {err.decode(errors='replace')[-300:]}"
                    return [JobResult(status="error", error=msg)] * n
                rep = json.loads(out.decode("utf-8"))
        finally:
            if workdir:
                import shutil

                shutil.rmtree(workdir, ignore_errors=True)
        caps = rep.get("caps") or {}
        self._warn_weaker(caps)
        results = rep.get("results")
        if rep.get("status") != "ok" or not isinstance(results, list) or len(results) != n:
            self._warn_once_error(str(rep.get("error")))
            return [JobResult(status="error", error=str(rep.get("error", "no results")), caps=caps)] * n
        return [self._result(r, caps) for r in results]

    @staticmethod
    def _result(rep: dict[str, Any], caps: dict[str, Any]) -> JobResult:
        res = JobResult(status=rep.get("status", "lost"), code=rep.get("code"), stdout=rep.get("stdout", ""),
                        stderr=rep.get("stderr", ""), caps=caps)
        raw = rep.get("result") or ""
        if rep.get("result_truncated"):
            res.error = "result too large"
        elif raw:
            try:
                payload = json.loads(raw)
            except ValueError:
                payload = None
                res.error = "unreadable result"
            if isinstance(payload, dict):
                res.ok = payload.get("ok") is True
                vals = payload.get("values")
                res.values = vals if isinstance(vals, list) else None
                res.error = str(payload.get("error") or "")[:300]
        return res

    def _warn_once_error(self, msg: str) -> None:
        if "error:" + msg[:40] not in self._warned:
            self._warned.add("error:" + msg[:40])
            logger.warning("grpo-monitor sandbox: a job failed before running its tests: %s", msg)

    # -- the fork server ---------------------------------------------------------------------------

    def _server_path(self) -> str | None:
        """Start the fork server once (the launcher with its imports loaded, forking one child per
        job); None when it cannot start, and jobs then start their own launcher."""
        with self._lock:
            if self._server is not None and self._server.poll() is None:
                return self._server_sock
            if self._server_failed:
                return None
            import select
            import tempfile

            d = tempfile.mkdtemp(prefix="grpo-sandbox-srv-")
            os.chmod(d, 0o700)
            path = os.path.join(d, "s")
            try:
                proc = subprocess.Popen([sys.executable, "-I", "-S", CHILD, "--serve", path], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True,
                                        close_fds=True, cwd="/", env=_ENV)
                ready = select.select([proc.stdout], [], [], 20)[0] and proc.stdout.readline().strip() == b"ready"
            except OSError:
                ready = False
                proc = None
            if not ready:
                if proc is not None:
                    proc.kill()
                    proc.wait()
                self._server_failed = True
                logger.warning("grpo-monitor sandbox: the fork server did not start; each job starts its own launcher")
                return None
            self._server, self._server_sock = proc, path
            return path

    def _via_server(self, data: bytes, timeout: float) -> dict[str, Any] | None:
        import socket

        path = self._server_path()
        if path is None:
            return None
        pid = None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(10)
            sock.connect(path)
            head = b""
            while not head.endswith(b"\n"):
                b = sock.recv(32)
                if not b:
                    return None
                head += b
            pid = int(head)
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
            sock.settimeout(timeout)
            chunks = []
            while True:
                b = sock.recv(1 << 20)
                if not b:
                    break
                chunks.append(b)
            return json.loads(b"".join(chunks).decode("utf-8"))
        except (OSError, ValueError):
            if pid is not None:
                self._killpg(pid)  # the job's session: its launcher; its supervisor follows (parent-death signal)
            return None
        finally:
            sock.close()

    @staticmethod
    def _killpg(pid: int) -> None:
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass

    def _warn_weaker(self, caps: dict[str, Any]) -> None:
        missing = [n for n in ("mount", "net", "pid") if caps.get(n) is False and self.isolate.get(n, True)]
        if not caps.get("root"):
            missing.append("uid")
        key = ",".join(missing)
        if missing and key not in self._warned:
            self._warned.add(key)
            logger.warning("grpo-monitor sandbox: running without %s isolation on this machine (%s); see docs/REWARDS.md",
                           ", ".join(missing), {k: v for k, v in caps.items() if k.endswith("_error")})

    def capabilities(self) -> dict[str, Any]:
        """What this machine grants: runs one empty job and returns its report."""
        return self.run("pass").caps

    def close(self) -> None:
        with self._lock:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None
            if self._server is not None:
                self._server.stdin.close()  # the server exits when its stdin closes
                try:
                    self._server.wait(5)
                except subprocess.TimeoutExpired:
                    self._server.kill()
                    self._server.wait()
                import shutil

                shutil.rmtree(os.path.dirname(self._server_sock or "/nonexistent/x"), ignore_errors=True)
                self._server = None


# -- values ---------------------------------------------------------------------------------------


class ValueDecodeError(ValueError):
    pass


def decode_value(enc: Any, depth: int = 0) -> Any:
    """The plain Python value a probe reported (see ``_sandbox_child.encode``); never runs code."""
    if depth > 60 or not isinstance(enc, list) or not enc or not isinstance(enc[0], str):
        raise ValueDecodeError("malformed value")
    tag = enc[0]
    try:
        if tag == "n":
            return None
        if tag == "b" and isinstance(enc[1], bool):
            return enc[1]
        if tag == "i":
            return int(enc[1], 16)
        if tag == "f":
            return float.fromhex(enc[1])
        if tag == "c":
            return complex(float.fromhex(enc[1]), float.fromhex(enc[2]))
        if tag == "s" and isinstance(enc[1], str):
            return enc[1]
        if tag == "y":
            return bytes.fromhex(enc[1])
        if tag in ("l", "t", "S", "F") and isinstance(enc[1], list):
            items = [decode_value(x, depth + 1) for x in enc[1]]
            return {"l": list, "t": tuple, "S": set, "F": frozenset}[tag](items)
        if tag == "d" and isinstance(enc[1], list):
            return {decode_value(k, depth + 1): decode_value(v, depth + 1) for k, v in enc[1]}
    except (TypeError, ValueError, IndexError, OverflowError) as exc:
        raise ValueDecodeError(str(exc)) from None
    raise ValueDecodeError(f"unknown tag {tag!r}")


_default: Sandbox | None = None
_default_lock = threading.Lock()


def default_sandbox() -> Sandbox:
    global _default
    with _default_lock:
        if _default is None:
            _default = Sandbox()
        return _default
