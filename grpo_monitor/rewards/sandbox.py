"""Run model-written code in a sandbox, one fresh process tree per job, many jobs in parallel.

Each job is one ``python -I -S`` launcher (``_sandbox_child.py``) in its own session and process
group. One isolation policy (see that module and docs/REWARDS.md for the threat model): new mount,
network, PID and IPC namespaces, entered directly as root with ``CAP_SYS_ADMIN`` and inside a new
user namespace otherwise; a new root holding only read-only system and interpreter directories and
a fresh tmpfs working directory; an unprivileged uid of its own per worker slot where the machine
grants one; no capabilities, ``no_new_privs`` and a seccomp filter (no socket but those of the families the
caller allows, none by default; no memory file, no new namespace); ``RLIMIT_CPU``/``AS``/``FSIZE``/``NPROC``/``NOFILE``; the memory of all the job's
processes counted against one limit; a wall-clock limit after which the whole tree is killed;
stdout/stderr kept to a bounded head; an empty environment; a supervisor that ignores every signal the
job could send it. What comes back is read within a size and a nesting bound: a completion that
writes something else fails its own test, nothing more. Where no isolation can be had the job
is refused (``SandboxRefused``) unless the caller asked for ``isolation="none"``.
``Sandbox.capabilities()`` says what this machine grants.

A test's checks run in a third process, the judge (``Sandbox.verdicts``), under a memory limit and
killed past a time limit: never beside the completion, and never in the trainer.
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
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from grpo_monitor.rewards import _sandbox_child as _child

logger = logging.getLogger(__name__)

CHILD = _child.__file__
# Unprivileged uids for the sandboxed code: one per worker slot, so a fork bomb in one job cannot
# use up the process count (RLIMIT_NPROC is per uid) of the job beside it. No passwd entry needed.
UID_BASE = 200_000
_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}


@dataclasses.dataclass(frozen=True)
class Limits:
    wall: float = 5.0  # seconds before the whole process tree is killed
    cpu: int = 4  # seconds of CPU per process
    memory: int = 1 << 30  # bytes: all the job's processes together, and each one's address space (RLIMIT_AS)
    fsize: int = 16 << 20  # largest file the code may write, bytes
    nproc: int = 32  # processes of the sandbox's uid
    nofile: int = 64
    tmpfs: int = 64 << 20  # the working directory's size
    output: int = 64 << 10  # head of stdout/stderr kept
    result: int = 1 << 20  # the values the code reports
    verdict: float = 1.0  # seconds the judge may spend on one test's checks

    def as_job(self) -> dict[str, Any]:
        return {"wall": self.wall, "cpu": self.cpu, "as": self.memory, "fsize": self.fsize, "nproc": self.nproc,
                "nofile": self.nofile, "tmpfs": self.tmpfs, "output": self.output, "result": self.result}


class SandboxRefused(RuntimeError):
    """No isolation can be had on this machine, and the caller did not ask for ``isolation="none"``."""


ISOLATIONS = ("full", "none")


@dataclasses.dataclass
class JobResult:
    status: str  # exit | signal | timeout | memory | error | refused | lost
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


class Sandbox:
    """A pool of sandboxed jobs. ``run(code, probes)`` runs one; ``map`` runs many in parallel.

    ``isolation="full"`` (the default) isolates every job as described above or refuses it;
    ``isolation="none"`` runs the code without namespaces, new root or seccomp filter, with
    resource limits and its own session only: unsafe, for machines that grant no isolation and
    code that is trusted anyway. ``hide``: paths kept out of the code's view even where they lie
    inside a directory it sees (default: the trainer's home and working directory).
    ``socket_families``: the address families (``socket.AF_INET``, ...) the code may open a socket
    of; none by default (a Unix stream socket pair is always allowed, a Unix socket never)."""

    def __init__(self, limits: Limits | None = None, workers: int | None = None, isolation: str = "full",
                 hide: Sequence[str] | None = None, fork_server: bool = True,
                 socket_families: Sequence[int] = ()) -> None:
        if isolation not in ISOLATIONS:
            raise ValueError(f"isolation={isolation!r}: expected one of {', '.join(map(repr, ISOLATIONS))}")
        self.limits = limits or Limits()
        self.workers = max(1, int(workers or min(8, os.cpu_count() or 1)))
        self.isolation = isolation
        self.hide = list(hide) if hide is not None else _hidden_paths()
        self.socket_families = sorted({int(f) for f in socket_families})
        self._slots: queue.Queue[int] = queue.Queue()
        base = UID_BASE + (os.getpid() % 4096) * 64
        for i in range(self.workers):
            self._slots.put(base + i % 64)
        self.fork_server = fork_server
        self._server: subprocess.Popen[bytes] | None = None
        self._server_sock: str | None = None
        self._server_failed = False
        self._pool: ThreadPoolExecutor | None = None
        self._judge = _Judge()
        self._lock = threading.Lock()
        self._warned: set[str] = set()

    def __getstate__(self) -> dict[str, Any]:  # picklable for TRL's rollout workers: no pool, no queue
        return {"limits": self.limits, "workers": self.workers, "isolation": self.isolation, "hide": self.hide,
                "fork_server": self.fork_server, "socket_families": self.socket_families}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["limits"], state["workers"], state.get("isolation", "full"), state["hide"],  # type: ignore[misc]
                      state.get("fork_server", True), state.get("socket_families", ()))

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="grpo-sandbox")
            return self._pool

    def run_tests(self, code: str, tests: Sequence[dict[str, Any]], limits: Limits | None = None) -> list[JobResult]:
        """Run ``code`` once per test, each in a fresh process of one sandbox. A test is
        ``{"probes": [...], "setup": "...", "args": [...]}`` (evaluate the probe expressions after
        the code and the setup, with ``__grpo_arg_<i>`` bound to the decoded ``args[i]``; with
        ``"calls": True``, what a probe raises is its answer, ``{"raised": name}``) or
        ``{"stdin": "..."}`` (feed it stdin, keep its stdout). ``limits.wall`` is per test.
        Raises ``SandboxRefused`` where the job cannot be isolated."""
        results, refused = self._run_tests(code, tests, limits)
        if refused:
            raise SandboxRefused(refused)
        return results

    def _run_tests(self, code: str, tests: Sequence[dict[str, Any]], limits: Limits | None) -> tuple[list[JobResult], str]:
        lim = limits or self.limits
        if not tests:
            return [], ""
        if self.isolation == "none" and "none" not in self._warned:
            self._warned.add("none")
            logger.warning("grpo-monitor sandbox: isolation='none': model-written code runs without isolation (unsafe: "
                           "it can read what the trainer's user can, reach the network and signal its processes)")
        uid = self._slots.get()
        try:
            job = {"code": code, "tests": [{"probes": list(t.get("probes") or []), "setup": t.get("setup") or "",
                                            "stdin": t.get("stdin"), "args": list(t.get("args") or []),
                                            "calls": bool(t.get("calls"))} for t in tests],
                   "limits": lim.as_job(), "uid": uid, "gid": uid, "isolation": self.isolation, "hide": self.hide,
                   "socket_families": self.socket_families}
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

    def verdicts(self, tests: Sequence[dict[str, Any]], limits: Limits | None = None) -> list[bool]:
        """Whether each test passed: ``{"setup", "checks", "values"}``, the checks (expressions over the
        probe values, as ``_sandbox_child.verdict`` binds them) evaluated by the judge on the encoded
        values the sandbox reported. A check that fails, raises, runs out of memory or past
        ``limits.verdict`` seconds did not pass; so does one whose setup calls the solution (use
        ``judge`` for those)."""
        return [rep.get("ok") is True for rep in self.judge(tests, limits)]

    def judge(self, requests: Sequence[dict[str, Any]], limits: Limits | None = None) -> list[dict[str, Any]]:
        """The judge's answer to each request (``_sandbox_child.judge_request``): ``{"ok": bool}``,
        with ``need`` where the setup calls the solution and a call has no answer yet, or
        ``{"ok": True, "values": [...]}`` for a request of ``args``. A request that fails, runs
        out of memory or past ``limits.verdict`` seconds answers ``{"ok": False}``."""
        lim = limits or self.limits
        return self._judge.run(requests, lim)

    def _launch(self, job: dict[str, Any], lim: Limits) -> tuple[list[JobResult], str]:
        n = len(job["tests"])
        workdir = None
        try:
            if self.isolation == "none":  # no new root: the tests work in a private folder on disk
                import tempfile

                workdir = tempfile.mkdtemp(prefix="grpo-sandbox-")
                if os.getuid() == 0:
                    os.chmod(workdir, 0o711)
                job["workdir"] = workdir
            timeout = n * (lim.wall + 2) + 30
            data = json.dumps(job).encode("utf-8")
            bound = _reply_bound(n, lim)
            rep = self._via_server(data, timeout, bound) if self.fork_server else None
            if rep is None:
                proc = subprocess.Popen([sys.executable, "-I", "-S", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, start_new_session=True, close_fds=True, cwd="/",
                                        env=_ENV)
                try:
                    out, err = proc.communicate(data, timeout=timeout)
                except subprocess.TimeoutExpired:
                    self._killpg(proc.pid)
                    proc.communicate()
                    return [JobResult(status="timeout", error="launcher did not answer")] * n, ""
                except BaseException:
                    self._killpg(proc.pid)
                    raise
                if proc.returncode != 0 or not out:
                    msg = f"launcher exit {proc.returncode}: {err.decode(errors='replace')[-300:]}"
                    return [JobResult(status="error", error=msg)] * n, ""
                rep = _child.loads_bounded(out, bound)
                if not isinstance(rep, dict):
                    return [JobResult(status="error", error="unreadable launcher report")] * n, ""
        finally:
            if workdir:
                import shutil

                shutil.rmtree(workdir, ignore_errors=True)
        caps = rep.get("caps") or {}
        results = rep.get("results")
        if rep.get("status") == "refused":
            why = " ".join(str(rep.get("error") or "no reason given").split())
            msg = (f"grpo-monitor sandbox: refusing to run model-written code: no isolation on this machine ({why}); "
                   "allow unprivileged user namespaces or run as root, or pass Sandbox(isolation='none') to run it "
                   "unisolated (unsafe)")
            return [JobResult(status="refused", error=msg, caps=caps)] * n, msg
        if rep.get("status") != "ok" or not isinstance(results, list) or len(results) != n:
            self._warn_once_error(str(rep.get("error")))
            return [JobResult(status="error", error=str(rep.get("error", "no results")), caps=caps)] * n, ""
        return [self._result(r, caps, lim) for r in results], ""

    @staticmethod
    def _result(rep: dict[str, Any], caps: dict[str, Any], lim: Limits | None = None) -> JobResult:
        res = JobResult(status=rep.get("status", "lost"), code=rep.get("code"), stdout=rep.get("stdout", ""),
                        stderr=rep.get("stderr", ""), caps=caps)
        raw = rep.get("result") or ""
        if rep.get("result_truncated"):
            res.error = "result too large"
        elif raw:
            # Written by the completion: any size up to the limit, any nesting.
            payload = _child.loads_bounded(raw, 4 * (lim or Limits()).result)
            if payload is None:
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
                proc = subprocess.Popen([sys.executable, "-I", "-S", CHILD, "--serve", path, json.dumps(self.hide)], stdin=subprocess.PIPE,
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

    def _via_server(self, data: bytes, timeout: float, bound: int) -> dict[str, Any] | None:
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
            chunks, size = [], 0
            while True:
                b = sock.recv(1 << 20)
                if not b:
                    break
                size += len(b)
                if size > bound:
                    raise ValueError("the launcher's report is past its bound")
                chunks.append(b)
            rep = _child.loads_bounded(b"".join(chunks), bound)
            if not isinstance(rep, dict):
                raise ValueError("unreadable launcher report")
            return rep
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

    def capabilities(self) -> dict[str, Any]:
        """What this machine grants: runs one empty job and returns its report (with ``refused``, the
        reason, where the job could not be isolated)."""
        res = self._run_tests("pass", [{"probes": []}], None)[0][0]
        return res.caps | ({"refused": res.error} if res.status == "refused" else {})

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
        self._judge.close()


# -- the judge ------------------------------------------------------------------------------------------


class _Judge:
    """The third process (``_sandbox_child.py --judge``): one test's checks per line, answered under an
    address-space limit; killed, and the test failed, when it takes longer than ``Limits.verdict``.
    Started on first use, again after a kill."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._memory = 0
        self._buf = b""
        self._lock = threading.Lock()

    def run(self, tests: Sequence[dict[str, Any]], lim: Limits) -> list[dict[str, Any]]:
        with self._lock:
            return [self._one(t, lim) for t in tests]

    def _one(self, test: dict[str, Any], lim: Limits) -> dict[str, Any]:
        if self._proc is None or self._proc.poll() is not None or self._memory != lim.memory:
            self.close()
            self._memory = lim.memory
            self._proc = subprocess.Popen([sys.executable, "-I", "-S", CHILD, "--judge", str(lim.memory)],
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                          start_new_session=True, close_fds=True, cwd="/", env=_ENV)
            self._buf = b""
            if self._line(20, 64) != b"ready":  # its start does not count against a test's time
                self.close()
                return {"ok": False}
        proc = self._proc
        assert proc.stdin is not None
        try:
            proc.stdin.write(json.dumps(test).encode() + b"\n")
            proc.stdin.flush()
        except OSError:
            self.close()
            return {"ok": False}
        # Its answers carry values built from the completion's (the arguments of a call it needs).
        bound = 4 * lim.result + 4096
        line = self._line(lim.verdict, bound)
        if line is None:
            self.close()
            return {"ok": False}
        rep = _child.loads_bounded(line, bound)
        return rep if isinstance(rep, dict) else {"ok": False}

    def _line(self, timeout: float, bound: int) -> bytes | None:
        """The judge's next line, or None when it has none within ``timeout`` seconds or ``bound``
        bytes, or died."""
        import select

        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk or len(self._buf) + len(chunk) > bound + 1:
                return None
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line

    def close(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            for f in (self._proc.stdin, self._proc.stdout):
                try:
                    f.close()  # type: ignore[union-attr]
                except OSError:
                    pass
            self._proc = None


def _reply_bound(n: int, lim: Limits) -> int:
    """The most a launcher's report on ``n`` tests can hold: each test's result and heads of
    stdout/stderr, as JSON strings (up to six bytes a byte), and a little more."""
    return n * (6 * (lim.result + 2 * lim.output) + 4096) + 65536


# -- values ---------------------------------------------------------------------------------------

ValueDecodeError = _child.ValueDecodeError
decode_value = _child.decode  # the plain Python value a probe reported; never runs code


_default: Sandbox | None = None
_default_lock = threading.Lock()


def default_sandbox() -> Sandbox:
    global _default
    with _default_lock:
        if _default is None:
            _default = Sandbox()
        return _default
