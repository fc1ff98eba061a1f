"""The sandbox's processes, standard library only: ``python -I -S _sandbox_child.py``.

**Launcher** (a job on stdin, or ``--serve PATH``: a fork server forking one launcher per job).
One job is one completion and its tests, run by these processes:

* **L** (the launcher, as the trainer's user): enters new mount, network, PID and IPC namespaces
  itself where it may (root with ``CAP_SYS_ADMIN``); otherwise forks **C**, which enters them
  inside a new user namespace (``CLONE_NEWUSER``: root without ``CAP_SYS_ADMIN``, or any user the
  kernel lets create one) while L writes its uid/gid maps. Where neither works the job is refused,
  unless the trainer asked for ``isolation="none"``. L prints the job's report as one JSON line.
* **A** (PID 1 of the new PID namespace, trusted): dies with its parent (``PR_SET_PDEATHSIG``),
  ignores every signal it can (nothing in the job can interrupt it), builds the code's filesystem (a new root holding read-only binds of the system directories and
  the interpreter's, a few device nodes, a private ``/proc`` and an empty ``/tmp``) and pivots into
  it, then runs the tests one after another. Per test: a fresh tmpfs working directory, fresh
  memory files for stdin/stdout/stderr, a fresh fork **B** given at most ``wall`` seconds while A
  counts the memory of every process in the namespace; then A kills every other process in the
  namespace (``kill(-1)`` from PID 1 reaches only the namespace) and reaps them.
* **B** (untrusted): its own process group, resource limits, an unprivileged uid where one can be
  had, no capabilities, ``no_new_privs``, a seccomp filter (no socket but of the families the
  trainer allows, none by default; no memory the count cannot see, no new namespace), an empty
  environment; runs the completion's code, evaluates the test's probe expressions on the inputs
  the judge evaluated (passed by value) and writes their values, as tagged JSON, to a pipe.

**Judge** (``--judge MEMORY``): the third process. Reads one test per line (its setup code, its
checks and the values B reported) and answers whether the checks hold, or which calls into the
solution the setup's code needs answered first (B makes them, from their arguments), or the
values of a test's inputs; under an address-space limit; the trainer kills it past a time limit. So a check never runs beside the completion, and a
value built to be expensive to compare costs the judge, not the trainer.

B cannot forge a *pass*: it only reports values, and the judge compares them with expectations
that never enter this process tree.
"""

import array
import builtins
import ctypes
import functools
import itertools
import json
import os
import re
import resource
import select
import signal
import struct
import sys
import time

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
NAMESPACES = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, PR_CAP_AMBIENT = 1, 4, 38, 22, 47
CAP_SETGID, CAP_SETUID = 6, 7
AT_FDCWD, AT_RECURSIVE = -100, 0x8000
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID = 1, 2

# What the code sees of the machine: these, read-only (symbolic links stay links), and the
# directories the interpreter loads from.
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc/ld.so.cache", "/etc/localtime")
DEVICES = ("null", "zero", "full", "random", "urandom")

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


def _write(path, text):
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


# -- the machine: syscall numbers and the seccomp filter -------------------------------------------------

# x86_64 and aarch64 (asm-generic); elsewhere the filter cannot be built and isolation is refused.
_ARCH = {
    "x86_64": {"audit": 0xC000003E, "x32": True, "pivot_root": 155, "mount_setattr": 442, "socket": 41,
               "socketpair": 53, "clone": 56, "clone3": 435,
               "deny": {"unshare": 272, "setns": 308, "io_uring_setup": 425, "io_uring_enter": 426,
                        "io_uring_register": 427, "keyctl": 250, "add_key": 248, "request_key": 249,
                        "memfd_create": 319, "memfd_secret": 447, "shmget": 29, "msgget": 68, "mq_open": 240}},
    "aarch64": {"audit": 0xC00000B7, "x32": False, "pivot_root": 41, "mount_setattr": 442, "socket": 198,
                "socketpair": 199, "clone": 220, "clone3": 435,
                "deny": {"unshare": 97, "setns": 268, "io_uring_setup": 425, "io_uring_enter": 426,
                         "io_uring_register": 427, "keyctl": 219, "add_key": 217, "request_key": 218,
                         "memfd_create": 279, "memfd_secret": 447, "shmget": 194, "msgget": 186, "mq_open": 180}},
}.get(os.uname().machine)

_RET_ALLOW, _RET_KILL = 0x7FFF0000, 0x80000000
_EPERM, _ENOSYS = 0x00050000 | 1, 0x00050000 | 38


# Socket families the code may open with ``socket()``: none. Its network namespace holds only a down
# loopback, so an internet socket reaches nothing, while a family the network namespace does not
# cover (``AF_VSOCK`` to the hypervisor, ``AF_NETLINK``, ``AF_ALG``, ...) would reach the host.
SOCKET_FAMILIES = ()
AF_UNIX = 1


@functools.lru_cache(maxsize=8)
def seccomp_program(families=SOCKET_FAMILIES):
    """The filter B runs under, as the bytes of a ``sock_filter`` array (None on an unknown machine).

    Denied: ``socket()`` of any family but those in ``families`` (none by default; ``AF_UNIX`` is
    never allowed: a filesystem socket is reachable by path from any namespace), a socket pair but
    a Unix stream one (asyncio's self-pipe; a datagram pair could ``sendto`` a path), io_uring (it
    would issue these calls unseen), new namespaces (``unshare``, ``setns``, ``clone`` with a
    namespace flag; ``clone3``, whose flags it cannot read, answers ENOSYS and the C library falls
    back to ``clone``), memory the supervisor cannot count (memory files, SysV shared memory and
    message queues, POSIX message queues), and the kernel keyrings (shared by a uid across
    namespaces). Another architecture than the machine's (i386 ``socketcall`` or x32 calls on
    x86_64) ends the process."""
    if _ARCH is None:
        return None
    families = sorted({int(f) for f in families} - {AF_UNIX})
    # (code, jt, jf, k) with jt/jf as labels, resolved below.
    ld_arch, ld_nr, ld_arg0, ld_arg1 = (0x20, 0, 0, 4), (0x20, 0, 0, 0), (0x20, 0, 0, 16), (0x20, 0, 0, 24)
    prog = [ld_arch, (0x15, None, "kill", _ARCH["audit"]), ld_nr]
    if _ARCH["x32"]:
        prog.append((0x35, "enosys", None, 0x40000000))  # x32 calls carry bit 30
    for nr in sorted(_ARCH["deny"].values()):
        prog.append((0x15, "eperm", None, nr))
    prog += [(0x15, "enosys", None, _ARCH["clone3"]), (0x15, "socket", None, _ARCH["socket"]),
             (0x15, "socketpair", None, _ARCH["socketpair"]), (0x15, "clone", None, _ARCH["clone"]),
             "allow",
             # the kernel reads the family as an int: the low half of the argument is all it sees
             "socket:", ld_arg0, *[(0x15, "allow", None, f) for f in families], (0x06, 0, 0, _EPERM),
             "socketpair:", ld_arg0, (0x15, None, "eperm", AF_UNIX), ld_arg1, (0x54, 0, 0, 0xF),
             (0x15, "allow", "eperm", 1),  # SOCK_STREAM
             "clone:", ld_arg0,
             (0x45, "eperm", "allow", CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER
              | CLONE_NEWPID | CLONE_NEWNET),
             "allow:", (0x06, 0, 0, _RET_ALLOW), "eperm:", (0x06, 0, 0, _EPERM), "enosys:", (0x06, 0, 0, _ENOSYS),
             "kill:", (0x06, 0, 0, _RET_KILL)]
    prog = [(0x06, 0, 0, _RET_ALLOW) if p == "allow" else p for p in prog]
    labels, insns = {}, []
    for p in prog:
        if isinstance(p, str):
            labels[p[:-1]] = len(insns)
        else:
            insns.append(p)
    out = b""
    for pc, (code, jt, jf, k) in enumerate(insns):
        rel = lambda t: 0 if t is None else (t if isinstance(t, int) else labels[t] - pc - 1)  # noqa: E731
        out += struct.pack("=HBBI", code, rel(jt), rel(jf), k)
    return out


class _Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


_prctl5 = ctypes.CDLL(None, use_errno=True).prctl
_prctl5.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


class _Confinement:
    """B's last steps before the code runs, prepared by A so that B, a fresh fork per test, only
    makes the calls: no capability (none now; with ``no_new_privs``, none after an exec either,
    whatever the uid, so root of a user namespace keeps none), ``no_new_privs``, the seccomp filter."""

    def __init__(self, program):
        self._filter = ctypes.create_string_buffer(program, len(program))
        self._fprog = _Fprog(len(program) // 8, ctypes.addressof(self._filter))
        self._header = ctypes.create_string_buffer(struct.pack("=Ii", 0x20080522, 0), 8)  # capability v3, this process
        self._sets = ctypes.create_string_buffer(24)  # effective, permitted, inheritable: empty
        self._capset = _libc.capset

    def apply(self):
        _check(_prctl5(PR_CAP_AMBIENT, 4, 0, 0, 0))  # PR_CAP_AMBIENT_CLEAR_ALL
        _check(self._capset(self._header, self._sets))
        _check(_prctl5(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))
        _check(_prctl5(PR_SET_SECCOMP, 2, ctypes.addressof(self._fprog), 0, 0))  # SECCOMP_MODE_FILTER


def _mapped(path, ident):
    try:
        with open(path) as fh:
            return any(int(a) <= ident < int(a) + int(n) for a, _, n in (ln.split() for ln in fh if ln.strip()))
    except (OSError, ValueError):
        return False


def _may_become(uid, gid):
    """Whether this process can give B the job's own uid: root with CAP_SETUID and CAP_SETGID, in a
    user namespace that maps that uid (a container's root may map none beyond its own range)."""
    return (uid is not None and os.geteuid() == 0 and _has_caps(CAP_SETUID, CAP_SETGID)
            and _mapped("/proc/self/uid_map", uid) and _mapped("/proc/self/gid_map", gid))


def _has_caps(*caps):
    try:
        with open("/proc/self/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"CapEff:"):
                    eff = int(line.split()[1], 16)
                    return all(eff >> c & 1 for c in caps)
    except (OSError, ValueError):
        pass
    return False


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


class ValueDecodeError(ValueError):
    pass


def decode(enc, depth=0):
    """The plain Python value a probe reported (see ``encode``); never runs code."""
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
            items = [decode(x, depth + 1) for x in enc[1]]
            return {"l": list, "t": tuple, "S": set, "F": frozenset}[tag](items)
        if tag == "d" and isinstance(enc[1], list):
            return {decode(k, depth + 1): decode(v, depth + 1) for k, v in enc[1]}
    except (TypeError, ValueError, IndexError, OverflowError) as exc:
        raise ValueDecodeError(str(exc)) from None
    raise ValueDecodeError(f"unknown tag {tag!r}")


# -- the judge ------------------------------------------------------------------------------------------

PROBE_PREFIX = "__grpo_probe_"
ARG_PREFIX = "__grpo_arg_"  # an input the judge evaluated, passed into the sandbox by value


_compiled = {}


def _code(src, mode):
    key = (src, mode)
    if key not in _compiled:
        if len(_compiled) > 4096:
            _compiled.clear()
        _compiled[key] = compile(src, "<test setup>" if mode == "exec" else "<test>", mode)
    return _compiled[key]


class _Need(BaseException):
    """A call into the solution not answered yet. Not an ``Exception``: setup code catching
    ``Exception`` around the call must not take it for the solution's."""


class _Unpassable(BaseException):
    """A call into the solution whose arguments are not plain data: it cannot be made."""


class _Calls:
    """The setup code's calls into the solution, answered by the sandbox (``answers``: pairs of a
    call ``[path, args, kwargs]``, encoded, and its value or ``{"raised": name}``); ``need`` collects
    the calls not answered yet, ``unpassable`` says one could not be made."""

    def __init__(self, answers):
        self.answers = {}
        for call, entry in answers or ():
            self.answers[json.dumps(call)] = entry
        self.need = []
        self.unpassable = False

    def call(self, path, args, kwargs):
        try:
            call = [path, encode(list(args)), encode(dict(kwargs))]
        except (TypeError, ValueError):
            self.unpassable = True
            raise _Unpassable(path) from None
        key = json.dumps(call)
        if key not in self.answers:
            if call not in self.need:
                self.need.append(call)
            raise _Need(path)
        entry = self.answers[key]
        if isinstance(entry, dict):
            name = entry.get("raised")
            cls = getattr(builtins, name, None) if isinstance(name, str) else None
            if isinstance(cls, type) and issubclass(cls, Exception):
                raise cls(f"raised by the solution's {path}")
            raise Exception(f"{name} raised by the solution's {path}")
        return decode(entry)


class _Remote:
    """A name of the solution's, as the judge's setup code sees it: calling it asks the sandbox."""

    __slots__ = ("_path", "_calls")

    def __init__(self, path, calls):
        object.__setattr__(self, "_path", path)
        object.__setattr__(self, "_calls", calls)

    def __getattr__(self, name):
        if name.startswith("__") or not name.isidentifier():
            raise AttributeError(name)
        return _Remote(f"{self._path}.{name}", self._calls)

    def __call__(self, *args, **kwargs):
        return self._calls.call(self._path, args, kwargs)

    def __repr__(self):
        return f"<the solution's {self._path}>"


def judge_request(req):
    """One request to the judge. ``{"setup", "args", "remote"}``: the values of a test's inputs
    (expressions over the setup's names), encoded. ``{"setup", "checks", "values", "remote",
    "answers"}``: whether the checks hold with the probes bound to ``values``; where the setup's
    code calls the solution (``remote`` names it) and a call has no answer yet, ``need`` lists the
    calls to make in the sandbox and ask again with."""
    if "args" in req:
        ns = {"__builtins__": builtins}
        calls = _Calls(())
        for name in req.get("remote") or ():
            ns[name] = _Remote(name, calls)
        exec(_code(req["setup"], "exec"), ns)
        return {"ok": True, "values": [encode(eval(_code(a, "eval"), ns)) for a in req["args"]]}
    return _checks(req["setup"], req["checks"], [decode(v) for v in req["values"]], req.get("remote"),
                   req.get("answers"))


def _checks(setup, checks, values, remote, answers):
    calls = _Calls(answers)
    ns = {"__builtins__": builtins}
    for name in remote or ():
        ns[name] = _Remote(name, calls)
    try:
        exec(_code(setup, "exec"), ns)
        for i, v in enumerate(values):
            ns[f"{PROBE_PREFIX}{i}"] = v
        ok = all(bool(eval(_code(c, "eval"), ns)) for c in checks)
    except (_Need, _Unpassable):
        ok = False
    if calls.need and not calls.unpassable:  # caught or not, a call without its answer decides nothing
        return {"ok": False, "need": calls.need}
    return {"ok": ok is True and not calls.unpassable}


def verdict(setup, checks, values, remote=(), answers=()):
    """Whether every check holds with the probes bound to ``values`` (decoded), after the setup."""
    return _checks(setup, checks, values, remote, answers)["ok"]


def judge(memory):
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    for line in sys.stdin.buffer:
        try:
            rep = judge_request(json.loads(line))
        except BaseException as exc:  # MemoryError included: a check that cannot be evaluated did not pass
            rep = {"ok": False, "error": type(exc).__name__}
        sys.stdout.write(json.dumps(rep) + "\n")
        sys.stdout.flush()


# -- what comes back from the sandbox ------------------------------------------------------------------

_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKETS = re.compile(r'[^\[\]{}]+')
_STEPS = bytes.maketrans(b"[]{}", b"\x01\xff\x01\xff")  # +1 and -1 as signed bytes
MAX_DEPTH = 128


def loads_bounded(data, max_bytes, max_depth=MAX_DEPTH):
    """JSON written on the sandbox's side, or None where it is longer than ``max_bytes``, nested
    deeper than ``max_depth`` or not JSON. The nesting is measured on the brackets outside strings
    before anything is parsed (the parser recurses per level), in time linear in the length."""
    if len(data) > max_bytes:
        return None
    if isinstance(data, (bytes, bytearray)):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError:
            return None
    skeleton = _NOT_BRACKETS.sub("", _JSON_STRING.sub("", data))
    if skeleton.count("[") + skeleton.count("{") > max_depth:
        steps = array.array("b", skeleton.encode("ascii").translate(_STEPS))
        if max(itertools.accumulate(steps)) > max_depth:
            return None
    try:
        return json.loads(data)
    except (ValueError, RecursionError, MemoryError):
        return None


# -- B: the untrusted process ----------------------------------------------------------------------


def _run_untrusted(job, test, wfd):
    import io

    for name in ("exit", "quit"):  # site's helpers, absent under -S; programs end with them
        if not hasattr(builtins, name):
            setattr(builtins, name, sys.exit)
    me = os.getpid()
    stdio = test.get("stdin") is not None
    # A stdin program runs as a script (its `if __name__ == "__main__"` block included); a module
    # under test does not run its demo block, which might wait for input.
    ns = {"__name__": "__main__" if stdio else "__solution__", "__builtins__": builtins}
    if stdio:
        sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, closefd=False)), encoding="utf-8")
    payload = {"ok": False}
    try:
        # Decoded before the code runs, which may patch the builtins decode uses; bound apart from
        # the code's globals, in the probes' own scope.
        inputs = {f"{ARG_PREFIX}{i}": decode(v) for i, v in enumerate(test.get("args") or ())}
        exec(compile(job.get("code", ""), "<completion>", "exec"), ns)
        if not stdio:
            if test.get("setup"):
                exec(compile(test["setup"], "<test setup>", "exec"), ns)
            values = []
            for expr in test.get("probes", []):
                code = compile(expr, "<test>", "eval")
                if test.get("calls"):  # a call the judge's setup code made: what it raised is an answer too
                    try:
                        value = eval(code, ns, inputs)
                    except Exception as exc:
                        values.append({"raised": str(type(exc).__name__)[:100]})
                        continue
                    values.append(encode(value))
                else:
                    values.append(encode(eval(code, ns, inputs)))
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
    if os.getpid() != me:  # a process the code forked, come out of it: only B reports
        os._exit(0)
    data = json.dumps(payload).encode()
    view = memoryview(data)
    while view:
        view = view[os.write(wfd, view):]


def _become_untrusted(job, wfd, stdin_fd, out_fd, err_fd, workdir):
    for sig, handler in job.get("_signals", {}).items():  # the code gets an interpreter's usual handlers
        signal.signal(sig, handler)
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
    ident = job.get("_as")
    if ident is not None:
        uid, gid = ident
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
        if os.getuid() != uid or os.geteuid() != uid:
            os._exit(125)
        _check(_prctl5(PR_SET_DUMPABLE, 1, 0, 0, 0))  # a uid change made it undumpable: A reads its PSS again
    if job["isolation"] == "full":
        job["_confine"].apply()
    else:
        _prctl(PR_SET_NO_NEW_PRIVS, 1)
    os.environ.clear()
    os.environ.update({"HOME": workdir, "TMPDIR": workdir, "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})
    sys.stdout = open(1, "w", encoding="utf-8", errors="replace", closefd=False)
    sys.stderr = open(2, "w", encoding="utf-8", errors="replace", closefd=False)


# -- A: init of the PID namespace, runs the tests one after another --------------------------------


_PAGE = os.sysconf("SC_PAGE_SIZE")


def _kb(data, key):
    i = data.find(key)
    if i < 0:
        return 0
    return int(data[i + len(key):data.index(b"kB", i)]) << 10


def job_memory(limit):
    """Memory of every process in this PID namespace but A. First each one's resident set (cheap,
    and an upper bound: it also holds the pages of the interpreter's files); where that sum is over
    ``limit``, the anonymous and shared memory each holds as its proportional share (PSS), so pages
    a fork shares with its parent count once (a process whose PSS cannot be read counts its
    resident anonymous and shared memory)."""
    pages = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit() and pid != "1":
            try:
                with open(f"/proc/{pid}/statm", "rb") as fh:
                    pages[pid] = int(fh.read().split()[1])
            except (OSError, IndexError, ValueError):
                continue
    total = sum(pages.values()) * _PAGE
    if total <= limit:
        return total
    total = 0
    for pid in pages:
        try:
            with open(f"/proc/{pid}/status", "rb") as fh:
                status = fh.read()
        except OSError:
            continue
        resident = _kb(status, b"RssAnon:") + _kb(status, b"RssShmem:")
        try:
            with open(f"/proc/{pid}/smaps_rollup", "rb") as fh:
                data = fh.read()
        except OSError:
            data = b""
        if b"Pss_Anon:" in data:
            total += min(resident, _kb(data, b"Pss_Anon:") + _kb(data, b"Pss_Shmem:"))
        else:  # unreadable, or a kernel before 5.9 that splits no PSS by kind
            total += resident
    return total


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


def _kill_all_but_me(job, child):
    """Nothing a test started may see the next test: kill the test's whole tree and reap it."""
    if job["isolation"] == "full":
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
        if job.get("_as") is not None:
            _kill_uid(job["_as"][0])
        else:
            try:
                os.killpg(child, signal.SIGKILL)
            except OSError:
                pass
        try:
            os.waitpid(child, 0)
        except ChildProcessError:
            pass


def _fresh_workdir(job, n):
    ident = job.get("_as")
    if job["isolation"] == "full":
        path = "/tmp/w"
        opts = f"size={int(job['limits']['tmpfs'])},mode=700"
        if ident is not None:
            opts += f",uid={ident[0]},gid={ident[1]}"
        _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, opts)
        return path
    path = os.path.join(job["workdir"], f"t{n}")
    os.mkdir(path, 0o700)
    if ident is not None:
        os.chown(path, *ident)
    return path


def _drop_workdir(job, path):
    if job["isolation"] == "full":
        try:
            _check(_libc.umount2(path.encode(), ctypes.c_int(MNT_DETACH)))
        except OSError:
            pass


POLL = 0.01  # seconds between two counts of the job's memory


def _one_test(job, test, n):
    lim = job["limits"]
    workdir = _fresh_workdir(job, n)
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
    memory = int(lim["as"]) if job["isolation"] == "full" else None
    chunks, total = [], 0
    pidfd = os.pidfd_open(child)
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    poller.register(r, select.POLLIN)
    deadline = time.monotonic() + float(lim["wall"])
    counted = time.monotonic()
    exited = eof = False
    # Until B exits (its report is in the pipe by then); whatever it left running is killed next.
    while not exited:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        for fd, _ in poller.poll(int(min(left, POLL) * 1000) + 1):
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
        # Every POLL seconds, and once more when B has exited (what it forked may still hold memory).
        if memory is not None and (exited or time.monotonic() - counted >= POLL):
            counted = time.monotonic()
            if job_memory(memory) > memory:
                rep = {"status": "memory"}
                break
    _kill_all_but_me(job, child)
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
    if rep["status"] == "memory":
        chunks, total = [], 0  # what it reported while over its memory does not count
    out_limit = int(lim["output"])
    stdout, out_over = _head(out_fd, out_limit)
    stderr, err_over = _head(err_fd, out_limit)
    os.close(out_fd)
    os.close(err_fd)
    _drop_workdir(job, workdir)
    rep.update({"result": b"".join(chunks).decode("utf-8", "replace"), "result_truncated": total > limit,
                "stdout": stdout.decode("utf-8", "replace"), "stdout_truncated": out_over,
                "stderr": stderr.decode("utf-8", "replace"), "stderr_truncated": err_over})
    return rep


def _head(fd, limit):
    try:
        size = os.fstat(fd).st_size
        return os.pread(fd, min(size, limit), 0), size > limit
    except OSError:
        return b"", False


class _Refused(Exception):
    pass


def _step(what, fn, *args):
    try:
        return fn(*args)
    except OSError as exc:
        raise _Refused(f"{what}: {exc.strerror}") from None


def _syscall(name, *args):
    _check(_libc.syscall(ctypes.c_long(_ARCH[name]), *args))


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64), ("propagation", ctypes.c_uint64),
                ("userns_fd", ctypes.c_uint64)]


def _read_only(path, recursive=True):
    attr = _MountAttr(MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID, 0, 0, 0)
    try:
        _syscall("mount_setattr", ctypes.c_int(AT_FDCWD), path.encode(), ctypes.c_uint(AT_RECURSIVE if recursive else 0),
                 ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)))
    except OSError as exc:
        if exc.errno != 38:  # ENOSYS: before Linux 5.12, the top mount only, keeping the flags it is locked with
            raise
        st = os.statvfs(path)
        keep = (MS_NODEV if st.f_flag & os.ST_NODEV else 0) | (MS_NOEXEC if st.f_flag & os.ST_NOEXEC else 0)
        _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | keep)


@functools.lru_cache(maxsize=1)
def _interpreter_paths():
    """Where this interpreter loads from: its module path and the directories of its shared objects,
    parents first. Read once per fork server (a millisecond and a half)."""
    out = {os.path.realpath(p) for p in sys.path if os.path.isdir(p)}
    lib = os.path.join(sys.base_prefix, "lib")
    if os.path.isdir(lib):
        out.add(os.path.realpath(lib))
    try:
        with open("/proc/self/maps") as fh:
            for line in fh:
                parts = line.split(None, 5)
                path = parts[5].strip() if len(parts) == 6 else ""
                name = os.path.basename(path)
                if path.startswith("/") and (name.endswith(".so") or ".so." in name) and os.path.exists(path):
                    out.add(os.path.dirname(os.path.realpath(path)))
    except OSError:
        pass
    return tuple(sorted(out, key=len))


@functools.lru_cache(maxsize=8)
def _root_plan(hide):
    """What the new root holds, as steps (the host's paths resolved once per fork server):
    ``("link", path, target)``, ``("bind", path)`` (read-only, the host's path at the same place),
    ``("hide", path)``. The trainer's ``hide`` paths are hidden where they lie inside what is shown."""
    plan, exposed = [], []

    def expose(path, follow):
        if not os.path.lexists(path):
            return
        if os.path.islink(path) and not follow:
            plan.append(("link", path, os.readlink(path)))
            return
        real = os.path.realpath(path)
        if not any(real == e or real.startswith(e + "/") for e in exposed):
            plan.append(("bind", real))
            exposed.append(real)

    for path in SYSTEM_PATHS:
        expose(path, False)
    for path in hide:
        real = os.path.realpath(path)
        if os.path.isdir(real) and any(real.startswith(e + "/") for e in exposed):
            plan.append(("hide", real))
    for path in _interpreter_paths():  # after the hidden paths: the interpreter may lie inside one
        expose(path, True)
    return tuple(plan)


def _new_root(job, caps):
    """Build the code's filesystem on a tmpfs and pivot into it (see the module docstring)."""
    os.umask(0o022)  # the directories made for binds must let the code's uid through
    _step("make the mounts private", _mount, None, "/", None, MS_REC | MS_PRIVATE)
    root = "/tmp"  # a directory every system has; the tmpfs mounted on it becomes "/"
    _step("mount the new root", _mount, "tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
    for kind, path, *rest in _root_plan(tuple(job.get("hide", ()))):
        dst = root + path
        if kind == "link":
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            os.symlink(rest[0], dst)
        elif kind == "hide":
            _step(f"hide {path}", _mount, "tmpfs", dst, "tmpfs", MS_NOSUID | MS_NODEV | MS_RDONLY, "size=4k")
        else:
            if os.path.isdir(path):
                os.makedirs(dst, exist_ok=True)
            else:
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                open(dst, "w").close()
            _step(f"bind {path}", _mount, path, dst, None, MS_BIND | MS_REC)
            _step(f"make {path} read-only", _read_only, dst)
    os.mkdir(root + "/dev")
    for name in DEVICES:
        open(f"{root}/dev/{name}", "w").close()
        _step(f"bind /dev/{name}", _mount, f"/dev/{name}", f"{root}/dev/{name}", None, MS_BIND)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{root}/dev/{name}")
    os.mkdir(root + "/proc")
    os.makedirs(root + "/tmp/w")
    _step("mount a private /proc", _mount, "proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.chdir(root)
    try:
        _syscall("pivot_root", b".", b".")
        _check(_libc.umount2(b".", ctypes.c_int(MNT_DETACH)))  # the old root, stacked on the new one
        caps["root_fs"] = "pivot_root"
    except OSError:  # pivot_root refuses an initramfs root: the new root becomes / by chroot instead
        _step("chroot into the new root", os.chroot, ".")
        caps["root_fs"] = "chroot"
    os.chdir("/")
    _step("make the new root read-only", _read_only, "/", False)


# Signals A ignores. The kernel delivers to PID 1 of a namespace, from inside it, only the signals
# it has a handler for, so with these ignored (and SIGKILL, SIGSTOP and SIGCHLD left at their
# defaults, which the kernel drops) nothing in the job can interrupt A, even where B has A's uid
# (a user namespace of an ordinary user maps that one uid only). SIGCHLD keeps its default: ignoring
# it would reap B before A can read its status.
_UNCATCHABLE = {signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD}


def _ignore_signals():
    """Ignore every catchable signal; returns the previous handlers, for B to restore."""
    saved = {}
    for sig in signal.valid_signals():
        if sig in _UNCATCHABLE:
            continue
        try:
            prev = signal.signal(sig, signal.SIG_IGN)
        except (OSError, ValueError):  # the C library's own real-time signals
            continue
        if prev is not signal.SIG_IGN and prev != signal.SIG_IGN:
            saved[sig] = signal.SIG_DFL if prev is None else prev
    return saved


def _supervise(job, caps, parent, sw):
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    job["_signals"] = _ignore_signals()
    if os.getppid() not in (parent, 0):  # 0: PID 1 of a new namespace sees no parent; its parent is alive (it waits for us)
        os._exit(0)
    try:
        if job["isolation"] == "full":
            program = seccomp_program(tuple(sorted(int(f) for f in job.get("socket_families") or ())))
            if program is None:
                raise _Refused(f"no seccomp filter for this machine ({os.uname().machine})")
            job["_confine"] = _Confinement(program)
            _new_root(job, caps)
        out = {"results": [_one_test(job, t, n) for n, t in enumerate(job.get("tests", []))], "caps": caps}
    except _Refused as exc:
        out = {"refused": str(exc), "caps": caps}
    except BaseException as exc:
        out = {"error": f"{type(exc).__name__}: {exc}", "caps": caps}
    data = json.dumps(out).encode()
    view = memoryview(data)
    while view:
        view = view[os.write(sw, view):]
    os._exit(0)  # as PID 1 of the namespace, this kills whatever is left in it


# -- L and C ----------------------------------------------------------------------------------------


def _maps(pid, job, caps):
    """Write C's uid and gid maps from L: with CAP_SETUID and CAP_SETGID, root inside is L's user and
    uid 1 inside is the job's own unprivileged uid outside; without, only L's user is mapped."""
    uid, gid = os.geteuid(), os.getegid()
    if _may_become(job.get("uid"), job.get("gid")):
        _write(f"/proc/{pid}/uid_map", f"0 {uid} 1\n1 {job['uid']} 1\n")
        _write(f"/proc/{pid}/gid_map", f"0 {gid} 1\n1 {job['gid']} 1\n")
        return {"route": "user namespace", "uid": "own", "_as": [1, 1]}
    _write(f"/proc/{pid}/setgroups", "deny")
    _write(f"/proc/{pid}/uid_map", f"0 {uid} 1\n")
    _write(f"/proc/{pid}/gid_map", f"0 {gid} 1\n")
    return {"route": "user namespace", "uid": "the trainer's", "_as": None}


def _user_namespace(job, caps):
    """Fork C into new user, mount, network, PID and IPC namespaces. In C: returns 0. In L: C's pid,
    or raises _Refused with the kernel's reason."""
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    c = os.fork()
    if c == 0:
        os.close(r1)
        os.close(w2)
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        try:
            _unshare(CLONE_NEWUSER | NAMESPACES)
            os.write(w1, b"ok")
        except OSError as exc:
            os.write(w1, exc.strerror.encode())
            os._exit(0)
        os.close(w1)
        got = os.read(r2, 4096)
        os.close(r2)
        if not got:
            os._exit(0)
        info = json.loads(got)
        job["_as"] = info.pop("_as")
        caps.update(info)
        return 0
    os.close(w1)
    os.close(r2)
    msg = os.read(r1, 256).decode(errors="replace")
    os.close(r1)
    try:
        if msg != "ok":
            raise _Refused(f"unshare(CLONE_NEWUSER): {msg}")
        try:
            info = _maps(c, job, caps)
        except OSError as exc:
            raise _Refused(f"uid map of the user namespace: {exc.strerror}") from None
        os.write(w2, json.dumps(info).encode())
    except _Refused:
        os.close(w2)
        os.waitpid(c, 0)
        raise
    os.close(w2)
    return c


def _report(sr):
    chunks = []
    while True:
        b = os.read(sr, 1 << 20)
        if not b:
            break
        chunks.append(b)
    return json.loads(b"".join(chunks).decode()) if chunks else {"error": "the supervisor reported nothing"}


def run_job(job):
    caps = {"root": os.getuid() == 0, "isolation": "none" if job.get("isolation") == "none" else "full"}
    job["isolation"] = caps["isolation"]
    job["_as"] = [job["uid"], job["gid"]] if _may_become(job.get("uid"), job.get("gid")) else None
    try:
        sr, sw = os.pipe()
        keeper = None  # C, where a child holds the namespaces
        if job["isolation"] == "full":
            try:
                _unshare(NAMESPACES)
                caps.update({"route": "root", "uid": "own" if job["_as"] else "the trainer's"})
            except OSError as exc:
                first = f"unshare(mount, net, pid, ipc) as uid {os.getuid()}: {exc.strerror}"
                try:
                    keeper = _user_namespace(job, caps)
                except _Refused as why:
                    os.close(sr)
                    os.close(sw)
                    return {"status": "refused", "error": f"{first}; {why}", "caps": caps}
        if keeper in (None, 0):  # this process forks A: L itself, or C inside its user namespace
            parent = os.getpid()
            a = os.fork()
            if a == 0:
                os.close(sr)
                _supervise(job, caps, parent, sw)
            if keeper == 0:  # C: A reports to L through the pipe they share
                os.close(sr)
                os.close(sw)
                os.waitpid(a, 0)
                os._exit(0)
        os.close(sw)
        got = _report(sr)
        os.close(sr)
        os.waitpid(a if keeper is None else keeper, 0)
    except Exception as exc:
        return {"status": "error", "error": f"{type(exc).__name__}: {exc}", "caps": caps}
    caps = got.get("caps", caps)
    if "refused" in got:
        return {"status": "refused", "error": got["refused"], "caps": caps}
    if "error" in got:
        return {"status": "error", "error": got["error"], "caps": caps}
    return {"status": "ok", "results": got["results"], "caps": caps}


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


def serve(path, hide):
    """Fork server: the interpreter, its imports and the new root's plan (for the trainer's ``hide``
    paths) are paid once; each connection is one job, run by a fresh fork in its own session. Exits
    when the trainer closes our stdin (it died or closed)."""
    import socket

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # jobs reap themselves
    _root_plan(tuple(hide)), seccomp_program()
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
                if not os.read(0, 4096):  # the trainer closed us or died: take the socket's folder along
                    try:
                        os.unlink(path)
                        os.rmdir(os.path.dirname(path))
                    except OSError:
                        pass
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
    if len(sys.argv) == 4 and sys.argv[1] == "--serve":
        serve(sys.argv[2], json.loads(sys.argv[3]))
        return
    if len(sys.argv) == 3 and sys.argv[1] == "--judge":
        judge(int(sys.argv[2]))
        return
    out = run_job(json.loads(sys.stdin.buffer.read().decode("utf-8")))
    sys.stdout.write(json.dumps(out))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
