"""Plays the training process, as whichever user runs it, for tests/test_sandbox.py.

``python tests/sandbox_escapes.py UNIX_SOCKET`` (its working directory a folder of its own) puts a
secret in its environment, in a file in its working directory and in one in /tmp, listens on
127.0.0.1, starts a process of its own user, then scores an honest and a wrong solution with the
unit-test reward and runs completions that try to escape: read the secrets (also through
``/proc/<pid>/environ``), reach the TCP listener and the world-connectable Unix socket, write to
/tmp, kill every process it may (``kill(-1)``), leave a process behind, and hold more memory than
the job's limit across six processes or in memory files. The last line of its stdout is a JSON
report of what each attempt achieved; the test says what must hold.

``python tests/sandbox_escapes.py --holes`` runs, as the same user, the holes an attack trial
found instead (``HOLES``): expected values riding into the sandbox with a setup statement that
binds an input, a deeply nested result blanking the batch, the job signalling its supervisor
(PID 1), a setup helper that calls the solution, and socket families the job does not need.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from grpo_monitor.rewards.sandbox import Limits, Sandbox, decode_value  # noqa: E402
from grpo_monitor.rewards.unit_tests import UnitTestReward  # noqa: E402

LIMITS = Limits(wall=3.0, cpu=2, memory=256 << 20, fsize=8 << 20, nproc=16)
TESTS = ["assert add(1, 2) == 3", "assert add(20, 22) == 42"]

ESCAPE = """
import glob, os, signal, socket, time
found = {{}}
def leak(name, paths):
    for p in paths:
        try:
            data = open(p, "rb").read().decode(errors="replace")
        except OSError:
            continue
        if "s3cr3t-" in data:
            found[name] = data[data.index("s3cr3t-"):][:19]
            return
    found[name] = None
found["env"] = os.environ.get("GRPO_ESCAPE_SECRET")
leak("secret_file", [{secret_file!r}])
leak("tmp_secret", [{tmp_secret!r}])
leak("environ", ["/proc/{trainer}/environ"] + glob.glob("/proc/*/environ"))
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=1).sendall(b"escaped")
    found["tcp"] = True
except OSError:
    found["tcp"] = False
found["unix"] = False
try:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(1)
    s.connect({unix!r})
    s.sendall(b"escaped")
    found["unix"] = True
except OSError:
    pass
try:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    a.sendto(b"escaped", {unix!r})
    found["unix"] = True
except OSError:
    pass
try:
    open({tmp_write!r}, "w").write("escaped")
except OSError:
    pass
try:
    os.kill(-1, signal.SIGKILL)
except OSError:
    pass
if os.fork() == 0:
    import ctypes
    os.setsid()
    ctypes.CDLL(None).prctl(15, {tag!r}.encode(), 0, 0, 0)  # PR_SET_NAME: /proc/<pid>/comm names it
    time.sleep(60)
    os._exit(0)
def report():
    return found
"""

# Six processes of 64 MiB each (the job's limit is 256 MiB, each process's address space too).
PROCESSES = """
import os, time
def hold(n):
    r, w = os.pipe()
    for _ in range(n - 1):
        if os.fork() == 0:
            block = b"x" * (64 << 20)
            os.write(w, b"1")
            time.sleep(60)
            os._exit(0)
    block = b"x" * (64 << 20)
    got = 0
    while got < n - 1:
        got += len(os.read(r, 64))
    return n * len(block)
"""

# Memory files of 8 MiB each (the largest file the code may write) outside the address space.
MEMFD = """
import os
def hold(n):
    held, fds = 0, []
    for i in range(n):
        try:
            fd = os.memfd_create(f"m{i}")
            os.write(fd, b"x" * (8 << 20))
        except OSError:
            break
        fds.append(fd)
        held += 8 << 20
    return held
"""


# -- the attack trial's holes -------------------------------------------------------------------------

SQUARE = "def sq(v):\n    return v * v\n"
# Returns the answer for its input where it finds that answer within its reach: its globals, any
# object in the process (the job included), the frames above it. ANSWERS maps each input to its
# answer's digits reversed, so that its own code holds none of them; the needle is built at run
# time, a string, which no object list holds.
SEEKER = """
import gc, sys
def _seek(v):
    needle = ANSWERS.get(v, "1-")[::-1]
    places = [globals()] + gc.get_objects()
    frame = sys._getframe().f_back
    while frame is not None:
        places += [frame.f_globals, frame.f_locals]
        frame = frame.f_back
    for obj in places:
        try:
            if needle in repr(obj):
                return int(needle)
        except Exception:
            pass
    return -1
def sq(v):
    return _seek(v)
"""
# Setups binding an input with its answer, in every form the trial found: one statement binding
# both, a list of (input, output) pairs, a dict of inputs to outputs, the tests as one string,
# starred unpacking. ANSWERS: the answers the seeker looks for (it knows what to look for).
# The numbers are rare enough that finding one's digits anywhere means it was brought in.
LEAKS = {
    "tuple_assignment": (["assert sq(x) == expected"], "x, expected = 4099, 16801801"),
    "list_of_cases": (["assert sq(cases[0][0]) == cases[0][1]", "assert sq(cases[1][0]) == cases[1][1]"],
                      "cases = [(4099, 16801801), (5113, 26142769)]"),
    "dict_of_answers": (["assert sq(min(d)) == d[min(d)]"], "d = {4099: 16801801}"),
    "tests_as_one_string": ("x, want = 4099, 16801801\nassert sq(x) == want", ""),
    "starred": (["assert sq(x) == rest[0]"], "x, *rest = 4099, 16801801"),
}
LEAKED = repr({4099: str(16801801)[::-1], 5113: str(26142769)[::-1]})
# A completion writing a deeply nested JSON document to its result pipe, then leaving.
DEEP = ("import os\nfor fd in range(3, 64):\n    try:\n        os.write(fd, b'[' * 200000 + b']' * 200000)\n"
        "    except OSError:\n        pass\nos._exit(0)\n")
# Every signal a process may send, to PID 1 (the supervisor: also its parent) and to all it may
# reach, before an honest solution.
SIGNALS = """
import os, signal
sent = {}
for sig in sorted(signal.valid_signals()):
    for pid in (1, os.getppid()):
        try:
            os.kill(pid, sig)
            sent[int(sig)] = "sent"
        except OSError as exc:
            sent.setdefault(int(sig), exc.strerror)
for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    try:
        os.kill(-1, sig)
    except OSError:
        pass
def add(a, b):
    return a + b
"""
HELPER_SETUP = "def check(x):\n    return solve(x) == 16801801"
HELPER_SOLUTIONS = {"honest": "def solve(x):\n    return x * x\n", "wrong": "def solve(x):\n    return x + 1\n",
                    "seeker": SEEKER.replace("def sq(v)", "def solve(v)").replace("ANSWERS", LEAKED)}
FAMILIES = """
import errno, socket
def families():
    out = {}
    for name in ("AF_INET", "AF_INET6", "AF_NETLINK", "AF_PACKET", "AF_VSOCK", "AF_ALG", "AF_UNIX", "AF_TIPC",
                 "AF_BLUETOOTH", "AF_CAN", "AF_RDS", "AF_KEY", "AF_QIPCRTR"):
        fam = getattr(socket, name, None)
        if fam is None:
            continue
        for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_RAW, socket.SOCK_SEQPACKET):
            try:
                socket.socket(fam, kind).close()
                out[name] = "allowed"
                break
            except OSError as exc:
                out.setdefault(name, errno.errorcode.get(exc.errno, str(exc.errno)))
    return out
"""


def holes(sb: Sandbox) -> dict[str, object]:
    reward = UnitTestReward(sandbox=sb)
    out: dict[str, object] = {}
    leaks = {}
    for name, (tests, setup) in LEAKS.items():
        seeker = SEEKER.replace("ANSWERS", LEAKED)
        leaks[name] = reward(completions=[SQUARE, seeker], tests=[tests] * 2, test_setup_code=[setup] * 2)
    out["expected_values"] = leaks
    try:
        res = sb.run(DEEP, probes=["1"])
        run = {"ok": res.ok, "status": res.status, "error": res.error}
    except Exception as exc:  # what the trainer would see raised
        run = {"raised": f"{type(exc).__name__}: {exc}"[:200]}
    out["deep_result"] = {"batch": reward(completions=[SQUARE, DEEP, SQUARE], tests=[["assert sq(3) == 9"]] * 3),
                          "run": run}
    res = sb.run(SIGNALS, probes=["sent", "add(1, 2)"])
    out["signals"] = {"score": reward(completions=[SIGNALS], tests=[TESTS])[0],
                      "run": {"ok": res.ok, "status": res.status, "error": res.error,
                              "sent": decode_value(res.values[0]) if res.ok else None}}
    out["helper"] = {name: reward(completions=[code], tests=[["assert check(4099)"]], test_setup_code=[HELPER_SETUP])[0]
                     for name, code in HELPER_SOLUTIONS.items()}
    res = sb.run(FAMILIES, probes=["families()"])
    out["socket_families"] = decode_value(res.values[0]) if res.ok else f"{res.status}: {res.error}"
    return out


def main() -> None:
    if sys.argv[1:] == ["--holes"]:
        sb = Sandbox(LIMITS, workers=2)
        try:
            report = {"uid": os.getuid(), "caps": sb.capabilities(), "holes": holes(sb)}
        finally:
            sb.close()
        print(json.dumps(report, default=str))
        return
    unix_path = sys.argv[1]
    tag = uuid.uuid4().hex[:12]
    secret = "s3cr3t-" + tag
    os.environ["GRPO_ESCAPE_SECRET"] = secret
    secret_file = os.path.abspath("secret.txt")
    tmp_secret = f"/tmp/grpo-escape-secret-{tag}"
    for p in (secret_file, tmp_secret):
        with open(p, "w") as fh:
            fh.write(secret)
        os.chmod(p, 0o600)
    tmp_write = f"/tmp/grpo-escape-{tag}"

    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    received: list[bytes] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            received.append(conn.recv(64) or b"<connected>")
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    sentinel = subprocess.Popen(["sleep", "60"])
    sb = Sandbox(LIMITS, workers=1)
    report: dict[str, object] = {"uid": os.getuid(), "caps": sb.capabilities()}
    try:
        reward = UnitTestReward(sandbox=sb)
        report["honest"] = reward(completions=["def add(a, b):\n    return a + b\n"], tests=[TESTS])[0]
        report["wrong"] = reward(completions=["def add(a, b):\n    return a - b\n"], tests=[TESTS])[0]
        code = ESCAPE.format(secret_file=secret_file, tmp_secret=tmp_secret, trainer=os.getpid(),
                             port=srv.getsockname()[1], unix=unix_path, tmp_write=tmp_write, tag=tag)
        res = sb.run(code, probes=["report()"])
        report["escape"] = decode_value(res.values[0]) if res.ok else f"{res.status}: {res.error}"
        for name, code in (("processes", PROCESSES), ("memfd", MEMFD)):
            res = sb.run(code, probes=[f"hold({6 if name == 'processes' else 60})"])
            report[name] = {"status": res.status, "held": decode_value(res.values[0]) if res.ok else None}
    finally:
        sb.close()
    time.sleep(0.5)
    left = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/comm") as fh:
                if fh.read().strip() == tag:
                    left.append(int(pid))
        except OSError:
            pass
    report.update({"left_behind": left, "tmp_written": os.path.exists(tmp_write), "tcp_received": len(received),
                   "sentinel_alive": sentinel.poll() is None})
    sentinel.kill()
    sentinel.wait()
    for p in (tmp_secret, tmp_write):
        try:
            os.unlink(p)
        except OSError:
            pass
    print(json.dumps(report, default=str))


if __name__ == "__main__":
    main()
