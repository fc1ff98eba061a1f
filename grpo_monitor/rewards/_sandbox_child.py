"""The sandbox's launcher: runs as ``python -I -S _sandbox_child.py`` with a job on stdin.

Standard library only, never imported by the trainer. One job is one completion and its tests:

* **L** (this script, root or the trainer's user): reads the job, enters new mount/network/PID
  namespaces where the kernel allows, makes ``/tmp`` a fresh read-only tmpfs, hides the trainer's
  home and working directory, forks **A**, and prints A's report as one JSON line.
* **A** (PID 1 of the new PID namespace, trusted, stays privileged): dies with L
  (``PR_SET_PDEATHSIG``), mounts a private ``/proc`` and runs the tests one after another. Per
  test: a fresh tmpfs working directory, fresh memory files for stdin/stdout/stderr, and a fresh
  fork **B**, given at most ``wall`` seconds; then A kills every other process in the namespace
  (``kill(-1)`` from PID 1 reaches only the namespace) and reaps them, so nothing a test started
  (a daemon, a fork bomb) sees the next test or outlives the job.
* **B** (untrusted): its own process group, resource limits, an unprivileged uid (root is exempt
  from ``RLIMIT_NPROC``), ``no_new_privs``, an empty environment; runs the completion's code, then
  evaluates the test's probe expressions and writes their values, as tagged JSON, to a pipe.

B cannot forge a *pass*: it only reports values, and the trainer compares them with expectations
that never enter this process tree. A fresh fork of the launcher per test costs a millisecond; the
interpreter start and the namespaces are paid once per completion.
"""

import ctypes
import json
import os
import resource
import select
import signal
import sys
import time

CLONE_NEWNS = 0x00020000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38

_libc = ctypes.CDLL(None, use_errno=True)


def _check(rc):
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def _unshare(flags):
    _check(_libc.unshare(ctypes.c_int(flags)))


def _mount(source, target, fstype, flags, data=None):
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    _check(_libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)))


def _prctl(option, arg):
    _check(_libc.prctl(ctypes.c_int(option), ctypes.c_ulong(arg), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)))


# -- values: exact built-in types only, so an object that claims equality with anything cannot pass ---


def encode(v, depth=0):
    if depth > 50:
        raise ValueError("nested too deep")
    t = type(v)
    if v is None:
        return ["n"]
    if t is bool:
        return ["b", v]
    if t is int:
        return ["i", hex(v)]
    if t is float:
        return ["f", v.hex()]
    if t is complex:
        return ["c", v.real.hex(), v.imag.hex()]
    if t is str:
        return ["s", v]
    if t is bytes:
        return ["y", v.hex()]
    if t in (list, tuple, set, frozenset):
        return [{list: "l", tuple: "t", set: "S", frozenset: "F"}[t], [encode(x, depth + 1) for x in v]]
    if t is dict:
        return ["d", [[encode(k, depth + 1), encode(x, depth + 1)] for k, x in v.items()]]
    raise TypeError(f"a {t.__name__} is not plain data")


# -- B: the untrusted process ----------------------------------------------------------------------


def _run_untrusted(job, test, wfd):
    import builtins
    import io

    for name in ("exit", "quit"):  # site's helpers, absent under -S; programs end with them
        if not hasattr(builtins, name):
            setattr(builtins, name, sys.exit)
    stdio = test.get("stdin") is not None
    # A stdin program runs as a script (its `if __name__ == "__main__"` block included); a module
    # under test does not run its demo block, which might wait for input.
    ns = {"__name__": "__main__" if stdio else "__solution__", "__builtins__": builtins}
    if stdio:
        sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, closefd=False)), encoding="utf-8")
    payload = {"ok": False}
    try:
        exec(compile(job.get("code", ""), "<completion>", "exec"), ns)
        if not stdio:
            if test.get("setup"):
                exec(compile(test["setup"], "<test setup>", "exec"), ns)
            values = []
            for expr in test.get("probes", []):
                values.append(encode(eval(compile(expr, "<test>", "eval"), ns)))
            payload = {"ok": True, "values": values}
        else:
            payload = {"ok": True}
    except SystemExit as exc:
        # A program reading stdin may end with exit(0); in probe mode no value was produced.
        payload = {"ok": stdio and exc.code in (None, 0), "error": "SystemExit"}
    except BaseException as exc:  # KeyboardInterrupt included: no value, no pass
        try:
            payload = {"ok": False, "error": type(exc).__name__ + ": " + str(exc)[:300]}
        except BaseException:
            payload = {"ok": False, "error": "unprintable exception"}
    try:
        sys.stdout.flush()
    except BaseException:
        pass
    data = json.dumps(payload).encode()
    view = memoryview(data)
    while view:
        view = view[os.write(wfd, view):]


def _become_untrusted(job, wfd, stdin_fd, out_fd, err_fd, workdir):
    os.setpgid(0, 0)
    os.dup2(stdin_fd, 0)
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    os.closerange(3, wfd)
    os.closerange(wfd + 1, 1 << 16)
    lim = job["limits"]
    for res, val in ((resource.RLIMIT_CORE, 0), (resource.RLIMIT_CPU, int(lim["cpu"])),
                     (resource.RLIMIT_AS, int(lim["as"])), (resource.RLIMIT_FSIZE, int(lim["fsize"])),
                     (resource.RLIMIT_NPROC, int(lim["nproc"])), (resource.RLIMIT_NOFILE, int(lim["nofile"]))):
        resource.setrlimit(res, (val, val))
    os.chdir(workdir)
    uid, gid = job.get("uid"), job.get("gid")
    if os.getuid() == 0 and uid is not None:
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
        if os.getuid() != uid or os.geteuid() != uid:
            os._exit(125)
    _prctl(PR_SET_NO_NEW_PRIVS, 1)
    os.environ.clear()
    os.environ.update({"HOME": workdir, "TMPDIR": workdir, "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})
    sys.stdout = open(1, "w", encoding="utf-8", errors="replace", closefd=False)
    sys.stderr = open(2, "w", encoding="utf-8", errors="replace", closefd=False)


# -- A: init of the PID namespace, runs the tests one after another --------------------------------


def _kill_uid(uid):
    """Without a PID namespace: kill every process of the sandbox's own uid until none is left."""
    for _ in range(200):
        found = False
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                if os.stat("/proc/" + name).st_uid == uid:
                    with open(f"/proc/{name}/stat", "rb") as fh:
                        if fh.read().rsplit(b")", 1)[-1].split()[0] == b"Z":
                            continue  # already dead; its new parent reaps it
                    found = True
                    os.kill(int(name), signal.SIGKILL)
            except OSError:
                pass
        if not found:
            return


def _kill_all_but_me(caps, job, child):
    """Nothing a test started may see the next test: kill the test's whole tree and reap it."""
    if caps.get("pid"):
        # PID 1 of the namespace: kill(-1) reaches every other process in it, and nothing outside.
        while True:
            try:
                os.kill(-1, signal.SIGKILL)
            except OSError:
                pass
            try:
                os.waitpid(-1, 0)
            except ChildProcessError:
                return
    else:
        if job.get("uid") is not None and os.getuid() == 0:
            _kill_uid(job["uid"])
        else:
            try:
                os.killpg(child, signal.SIGKILL)
            except OSError:
                pass
        try:
            os.waitpid(child, 0)
        except ChildProcessError:
            pass


def _fresh_workdir(caps, job, n):
    uid, gid = job.get("uid"), job.get("gid")
    if caps.get("mount"):
        path = "/tmp/w"
        opts = f"size={int(job['limits']['tmpfs'])},mode=700"
        if uid is not None and os.getuid() == 0:
            opts += f",uid={uid},gid={gid}"
        _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, opts)
        return path
    path = os.path.join(job["workdir"], f"t{n}")
    os.mkdir(path, 0o700)
    if uid is not None and os.getuid() == 0:
        os.chown(path, uid, gid)
    return path


def _drop_workdir(caps, path):
    if caps.get("mount"):
        try:
            _check(_libc.umount2(path.encode(), ctypes.c_int(2)))  # MNT_DETACH
        except OSError:
            pass


def _one_test(job, test, caps, n):
    lim = job["limits"]
    workdir = _fresh_workdir(caps, job, n)
    stdin_fd = os.memfd_create("stdin")
    os.write(stdin_fd, (test.get("stdin") or "").encode("utf-8"))
    os.lseek(stdin_fd, 0, os.SEEK_SET)
    out_fd, err_fd = os.memfd_create("stdout"), os.memfd_create("stderr")
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            os.close(r)
            _become_untrusted(job, w, stdin_fd, out_fd, err_fd, workdir)
            _run_untrusted(job, test, w)
        finally:
            os._exit(0)
    os.close(w)
    os.close(stdin_fd)
    rep = {"status": "timeout"}
    limit = int(lim["result"])
    chunks, total = [], 0
    pidfd = os.pidfd_open(child)
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    poller.register(r, select.POLLIN)
    deadline = time.monotonic() + float(lim["wall"])
    exited = eof = False
    # Until B exits (its report is in the pipe by then); whatever it left running is killed next.
    while not exited:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        for fd, _ in poller.poll(int(left * 1000) + 1):
            if fd == r:
                b = os.read(r, 65536)
                if not b:
                    eof = True
                    poller.unregister(r)
                else:
                    if total < limit:
                        chunks.append(b[: limit - total])
                    total += len(b)
            elif fd == pidfd and not exited:
                _, st = os.waitpid(child, 0)
                exited = True
                poller.unregister(pidfd)
                rep = ({"status": "signal", "code": os.WTERMSIG(st)} if os.WIFSIGNALED(st)
                       else {"status": "exit", "code": os.WEXITSTATUS(st)})
    _kill_all_but_me(caps, job, child)
    os.close(pidfd)
    if not eof:
        while True:  # every writer is dead now: drain what they left
            b = os.read(r, 65536)
            if not b:
                break
            if total < limit:
                chunks.append(b[: limit - total])
            total += len(b)
    os.close(r)
    out_limit = int(lim["output"])
    stdout, out_over = _head(out_fd, out_limit)
    stderr, err_over = _head(err_fd, out_limit)
    os.close(out_fd)
    os.close(err_fd)
    _drop_workdir(caps, workdir)
    rep.update({"result": b"".join(chunks).decode("utf-8", "replace"), "result_truncated": total > limit,
                "stdout": stdout.decode("utf-8", "replace"), "stdout_truncated": out_over,
                "stderr": stderr.decode("utf-8", "replace"), "stderr_truncated": err_over})
    return rep


def _supervise(job, caps, parent, sw):
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() not in (parent, 0):  # 0: PID 1 of a new namespace sees no parent; L is alive (it waits for us)
        os._exit(0)
    if caps.get("pid") and caps.get("mount"):
        try:
            _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        except OSError:
            pass
    results = [_one_test(job, t, caps, n) for n, t in enumerate(job.get("tests", []))]
    data = json.dumps(results).encode()
    view = memoryview(data)
    while view:
        view = view[os.write(sw, view):]
    os._exit(0)  # as PID 1 of the namespace, this kills whatever is left in it


def _head(fd, limit):
    try:
        size = os.fstat(fd).st_size
        return os.pread(fd, min(size, limit), 0), size > limit
    except OSError:
        return b"", False


# -- L ----------------------------------------------------------------------------------------------


def _isolate(job, caps):
    want = job.get("isolate", {})
    flags = [(CLONE_NEWNS, "mount"), (CLONE_NEWNET, "net"), (CLONE_NEWPID, "pid")]
    for flag, name in flags:
        if want.get(name, True):
            try:
                _unshare(flag)
                caps[name] = True
            except OSError as exc:
                caps[name] = False
                caps[name + "_error"] = exc.strerror
        else:
            caps[name] = False
    workdir = job.get("workdir")
    if not caps.get("mount"):
        return workdir
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    # /tmp: root's and read-only to the code; each test gets a fresh tmpfs at /tmp/w (see _fresh_workdir).
    _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
    os.mkdir("/tmp/.h", 0o700)
    os.mkdir("/tmp/w", 0o755)
    workdir = "/tmp/w"
    for shared in ("/var/tmp", "/dev/shm", "/run/lock", "/dev/mqueue"):
        if os.path.isdir(shared) and not os.path.islink(shared):
            try:
                _mount("tmpfs", shared, "tmpfs", MS_NOSUID | MS_NODEV | MS_RDONLY, "size=4k")
            except OSError:
                pass
    keep = [os.path.realpath(k) for k in job.get("keep", []) if os.path.isdir(k)]
    for n, hide in enumerate(job.get("hide", [])):
        hide = os.path.realpath(hide)
        if hide in ("/", "/tmp") or hide.startswith("/tmp/") or not os.path.isdir(hide):
            continue
        inside = [k for k in keep if k == hide or k.startswith(hide + "/")]
        stash = []
        for m, k in enumerate(inside):
            spot = f"/tmp/.h/keep{n}-{m}"
            os.mkdir(spot)
            _mount(k, spot, None, MS_BIND | MS_REC)
            stash.append((k, spot))
        try:
            _mount("tmpfs", hide, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,mode=755")
        except OSError:
            continue
        for k, spot in stash:
            os.makedirs(k, mode=0o755, exist_ok=True)
            _mount(spot, k, None, MS_BIND | MS_REC)
            try:
                _mount(None, k, None, MS_REMOUNT | MS_BIND | MS_RDONLY)
            except OSError:
                pass
        caps.setdefault("hidden", []).append(hide)
    return workdir


def run_job(job):
    caps = {"root": os.getuid() == 0}
    out = {"caps": caps}
    try:
        _isolate(job, caps)
        sr, sw = os.pipe()
        parent = os.getpid()
        a = os.fork()
        if a == 0:
            try:
                os.close(sr)
                _supervise(job, caps, parent, sw)
            except BaseException as exc:
                try:
                    os.write(sw, json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode())
                except BaseException:
                    pass
            finally:
                os._exit(0)
        os.close(sw)
        chunks = []
        while True:
            b = os.read(sr, 1 << 20)
            if not b:
                break
            chunks.append(b)
        os.waitpid(a, 0)
        got = json.loads(b"".join(chunks).decode()) if chunks else {"error": "the supervisor reported nothing"}
        if isinstance(got, dict):
            out.update({"status": "error", "error": got.get("error", "?")})
        else:
            out.update({"status": "ok", "results": got})
    except Exception as exc:
        out.update({"status": "error", "error": f"{type(exc).__name__}: {exc}"})
    return out


def _handle(conn):
    conn.sendall(f"{os.getpid()}\n".encode())
    chunks = []
    while True:
        b = conn.recv(1 << 20)
        if not b:
            break
        chunks.append(b)
    out = run_job(json.loads(b"".join(chunks).decode("utf-8")))
    conn.sendall(json.dumps(out).encode())
    conn.close()


def serve(path):
    """Fork server: the interpreter and its imports are paid once; each connection is one job, run
    by a fresh fork in its own session. Exits when the trainer closes our stdin (it died or closed)."""
    import socket

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # jobs reap themselves
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    os.chmod(path, 0o600)
    srv.listen(64)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    poller = select.poll()
    poller.register(srv.fileno(), select.POLLIN)
    poller.register(0, select.POLLIN | select.POLLHUP)
    while True:
        for fd, ev in poller.poll():
            if fd == 0:
                if not os.read(0, 4096):
                    os._exit(0)
                continue
            conn, _ = srv.accept()
            pid = os.fork()
            if pid == 0:
                try:
                    srv.close()
                    os.close(0)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    os.setsid()
                    _handle(conn)
                finally:
                    os._exit(0)
            conn.close()


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--serve":
        serve(sys.argv[2])
        return
    out = run_job(json.loads(sys.stdin.buffer.read().decode("utf-8")))
    sys.stdout.write(json.dumps(out))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
