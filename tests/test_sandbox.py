"""The unit-test reward's sandbox under attack, and the harness under reward hacking.

Every attack is a completion submitted to the unit-test reward. Each must earn 0 or the tests'
honest share, leave this process unharmed, write nothing outside its sandbox, read no secret,
reach no listener and leave no process behind. Limits are small so the suite stays fast.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from grpo_monitor.rewards.sandbox import UID_BASE, Limits, Sandbox
from grpo_monitor.rewards.unit_tests import SplitTest, UnsplittableTestError, UnitTestReward

ROOT = Path(__file__).resolve().parents[1]
LIMITS = Limits(wall=3.0, cpu=2, memory=512 << 20, fsize=8 << 20, nproc=16, output=16 << 10)
TESTS = ["assert add(1, 2) == 3", "assert add(20, 22) == 42", "assert add(-5, 5) == 0"]
GOOD = "def add(a, b):\n    return a + b\n"


@pytest.fixture(scope="module")
def sandbox():
    sb = Sandbox(LIMITS, workers=2)
    yield sb
    sb.close()


@pytest.fixture
def reward(sandbox):
    return UnitTestReward(sandbox=sandbox)


@pytest.fixture(scope="module")
def caps(sandbox):
    return sandbox.capabilities()


def need(caps):
    """Skip an attack where this machine grants the sandbox no isolation (it then refuses every job;
    test_refuses_where_no_isolation_is_possible covers that)."""
    if caps.get("refused"):
        pytest.skip(f"this machine grants the sandbox no isolation: {caps['refused']}")


def sandbox_processes() -> list[int]:
    """Processes owned by any sandbox uid, read from /proc."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid >= UID_BASE:
                    out.append(int(name))
            except OSError:
                pass
    return out


@pytest.fixture(autouse=True)
def nothing_left_behind():
    yield
    assert sandbox_processes() == [], "a sandboxed process outlived its reward call"


def score(reward, code, tests=TESTS, **cols):
    return reward(prompts=["p"], completions=[code], tests=[tests], **cols)[0]


def test_capabilities_here(caps):
    need(caps)
    assert caps["isolation"] == "full", caps
    if os.getuid() == 0:
        # As root the kernel grants the namespaces directly and the code its own uid; say so loudly if that changes.
        assert (caps["route"], caps["uid"]) == ("root", "own"), caps


def test_honest_solutions_get_their_share(reward):
    assert score(reward, GOOD) == 1.0
    assert score(reward, "```python\n" + GOOD + "```") == 1.0
    assert score(reward, "def add(a, b):\n    return 3 if a == 1 else 0\n") == pytest.approx(2 / 3)
    assert score(reward, "def add(a, b) return") == 0.0  # a syntax error
    assert reward(completions=[[{"role": "assistant", "content": GOOD}]], tests=[TESTS]) == [1.0]


def test_assert_forms_and_stdio_tests(reward):
    tests = ["import math\nassert math.isclose(half(3), 1.5)", "assert half(4) == 2 and half(0) == 0",
             "assert isinstance(half(2), float)", "assert sorted(pair(1)) == [1, 2]", "assert pair(5)[0] == 5",
             "assert half(1) is not None", "assert {half(2): 'x'} == {1.0: 'x'}"]
    code = "def half(x):\n    return x / 2\ndef pair(x):\n    return (x, x + 1)\n"
    assert score(reward, code, tests) == 1.0
    io_tests = [{"input": "3\n", "output": "6\n"}, {"input": "10", "output": "20"}, {"input": "1", "output": "3"}]
    assert score(reward, "n = int(input())\nprint(n * 2)", io_tests) == pytest.approx(2 / 3)
    script = "import sys\ndef main():\n    print(int(sys.stdin.read()) * 2)\n    exit(0)\nif __name__ == '__main__':\n    main()\n"
    assert score(reward, script, io_tests) == pytest.approx(2 / 3)  # run as a script; exit(0) is a clean end
    assert score(reward, "print(6)\nraise SystemExit(1)", io_tests[:1]) == 0.0
    assert score(reward, GOOD, "assert add(1, 2) == 3\nassert add(2, 2) == 5") == 0.5  # one string of asserts


def test_the_standard_library_still_works_under_the_filter(reward):
    # Threads (clone3 answers ENOSYS, the C library falls back to clone), asyncio's stream socket
    # pair, a fork, a pipe, a temporary file in the working directory, the C extensions and ctypes.
    code = """
import asyncio, concurrent.futures, ctypes, json, os, tempfile, threading, zlib
def add(a, b):
    box = []
    t = threading.Thread(target=lambda: box.append(a))
    t.start(); t.join()
    async def twice():
        return await asyncio.sleep(0, result=box[0])
    x = asyncio.run(twice())
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        y = pool.submit(lambda: b).result()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(w, b"1")
        os._exit(0)
    os.waitpid(pid, 0)
    with tempfile.NamedTemporaryFile(dir=".") as fh:
        fh.write(zlib.compress(json.dumps([x, y]).encode()))
    return x + y + int(os.read(r, 1)) - 1 + ctypes.c_int(0).value
"""
    assert score(reward, code) == 1.0


def test_unscorable_examples_are_none(reward):
    assert reward(completions=[GOOD], tests=[None]) == [None]
    assert reward(completions=[GOOD]) == [None]
    # a test whose verdict would run beside the completion is refused, not trusted
    assert score(reward, GOOD, ["assert all(add(i, 0) == i for i in range(3))"]) is None
    with pytest.raises(UnsplittableTestError):
        SplitTest("assert (lambda: add(1, 1))() == 2")
    with pytest.raises(UnsplittableTestError):
        SplitTest("x = add(1, 1)\nassert x == 2")


def test_split_keeps_verdict_logic_out_of_the_sandbox():
    t = SplitTest("assert add(1, 2) == 3 and not add(0, 0)")
    assert t.probes == ["add(1, 2)", "add(0, 0)"]
    assert t.verdict([3, 0]) is True and t.verdict([3, 1]) is False
    t2 = SplitTest("assert math.isclose(f(x), 2.0)", "import math\nx = 4")
    assert t2.probes == ["f(x)"]


@pytest.mark.parametrize("test, setup", [
    ("assert sq(x) == expected", "x, expected = 4099, 16801801"),
    ("assert sq(cases[0][0]) == cases[0][1]", "cases = [(4099, 16801801), (5113, 26142769)]"),
    ("assert sq(min(d)) == d[min(d)]", "d = {4099: 16801801}"),
    ("assert sq(x) == rest[0]", "x, *rest = 4099, 16801801"),
    ("assert sq(*xs) == want", "import sys\nsys.setrecursionlimit(10 ** 4)\nxs, want = [4099], 16801801"),
])
def test_only_a_calls_inputs_enter_the_sandbox(test, setup):
    t = SplitTest(test, setup)
    shipped = json.dumps({"probes": t.sandbox_probes, "setup": t.sandbox_setup})
    assert "16801801" not in shipped and "26142769" not in shipped, shipped
    assert all(isinstance(st, (ast.Import, ast.Expr)) for st in ast.parse(t.sandbox_setup).body), t.sandbox_setup
    assert t.args is None and t.arg_sources  # evaluated by the judge, passed by value


# -- attacks -----------------------------------------------------------------------------------------


def test_infinite_loop(reward):
    t0 = time.monotonic()
    assert score(reward, "while True:\n    pass\n" + GOOD) == 0.0
    assert time.monotonic() - t0 < LIMITS.wall * 3 + 10  # three tests, two workers, each cut at the wall limit


def test_fork_bomb(caps, reward):
    need(caps)
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    assert reward(completions=[bomb], tests=[TESTS[:1]]) == [0.0]


def test_ten_gigabyte_allocation(reward):
    assert score(reward, "x = bytearray(10 << 30)\n" + GOOD) == 0.0
    assert score(reward, "try:\n    x = bytearray(10 << 30)\nexcept MemoryError:\n    x = None\n" + GOOD) == 1.0


def test_one_gigabyte_write(caps, reward, tmp_path):
    need(caps)
    write = "f = open('big.bin', 'wb')\nfor _ in range(1024):\n    f.write(b'x' * (1 << 20))\n"
    assert score(reward, write + GOOD) == 0.0  # the write fails at the file-size limit, the module with it
    ignore = "try:\n" + "".join(
        "    " + ln + "\n" for ln in write.splitlines()) + "except OSError:\n    pass\n"
    assert score(reward, ignore + GOOD) == 1.0  # the failed write caught: the honest part still counts


def test_writing_outside_the_working_directory(caps, reward, tmp_path):
    need(caps)
    tag = uuid.uuid4().hex
    targets = [f"/tmp/grpo-attack-{tag}", f"/var/tmp/grpo-attack-{tag}", f"/dev/shm/grpo-attack-{tag}",
               str(tmp_path / f"attack-{tag}"), str(ROOT / f"attack-{tag}"), f"/root/attack-{tag}",
               f"../attack-{tag}", f"/attack-{tag}"]
    code = "import os\nfor p in %r:\n    try:\n        open(p, 'w').write('pwned')\n    except OSError:\n        pass\n" % targets
    assert score(reward, code + GOOD) == 1.0
    for p in targets:
        if not p.startswith(".."):
            assert not os.path.exists(p), p
    assert not any(n.endswith(tag) for n in os.listdir("/tmp"))


def test_environment_secret_is_unreadable(caps, reward, monkeypatch, tmp_path):
    need(caps)
    secret = "s3cr3t-" + uuid.uuid4().hex
    monkeypatch.setenv("GRPO_SANDBOX_SECRET", secret)
    (tmp_path / "token").write_text(secret)
    code = f"""
import os, glob
found = os.environ.get("GRPO_SANDBOX_SECRET", "")
for path in ["/proc/{os.getpid()}/environ", "/proc/1/environ", {str(tmp_path / 'token')!r}] + glob.glob("/proc/*/environ"):
    try:
        data = open(path, "rb").read().decode(errors="replace")
    except OSError:
        continue
    if "s3cr3t-" in data:
        found = data[data.index("s3cr3t-"):][:39]
def leak():
    return found
print(found)
"""
    assert score(reward, code, [f"assert leak() == {secret!r}"]) == 0.0


def test_socket_to_a_local_listener_gets_nothing(caps, reward):
    need(caps)
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.2)
    port = srv.getsockname()[1]
    received: list[bytes] = []
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            received.append(conn.recv(1024) or b"<connected>")
            conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    code = f"""
import socket
ok = False
for host in ("127.0.0.1", "localhost", "0.0.0.0"):
    try:
        s = socket.create_connection((host, {port}), timeout=1)
        s.sendall(b"exfiltrated")
        ok = True
    except OSError:
        pass
def reached():
    return ok
"""
    try:
        assert score(reward, code, ["assert reached() is True"]) == 0.0
    finally:
        stop.set()
        t.join(2)
        srv.close()
    assert received == []


def test_killing_its_parent(caps, reward):
    need(caps)
    sentinel = subprocess.Popen(["sleep", "30"])
    try:
        code = f"""
import os, signal
for pid in (os.getppid(), {os.getpid()}, {sentinel.pid}, 1, -1):
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
try:
    os.killpg(0, signal.SIGKILL)
except OSError:
    pass
""" + GOOD
        got = score(reward, code)
        assert got in (0.0, 1.0)  # killing its own group ends it; anything else it cannot reach
        assert sentinel.poll() is None  # a process of the trainer's user survives
    finally:
        sentinel.kill()
        sentinel.wait()


def test_flooding_stdout(reward, sandbox):
    flood = "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n"
    assert score(reward, flood + GOOD) == 0.0
    res = sandbox.run(flood)
    assert len(res.stdout) <= LIMITS.output
    assert not res.ok  # stopped by the file-size limit on its output (EFBIG: Python ignores SIGXFSZ)


def test_daemonised_child_is_gone(caps, reward):
    need(caps)
    tag = uuid.uuid4().hex
    code = f"""
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(1.0)
        for p in ("/tmp/daemon-{tag}", "late-{tag}"):
            try:
                open(p, "w").write("still here")
            except OSError:
                pass
        time.sleep(60)
    os._exit(0)
""" + GOOD
    assert score(reward, code) == 1.0
    assert sandbox_processes() == []
    time.sleep(1.5)
    assert not os.path.exists(f"/tmp/daemon-{tag}")


def test_training_process_unharmed(reward):
    import resource

    limits = {r: resource.getrlimit(r) for r in (resource.RLIMIT_AS, resource.RLIMIT_NPROC, resource.RLIMIT_FSIZE,
                                                 resource.RLIMIT_CPU, resource.RLIMIT_NOFILE)}
    env, cwd, pgid, uid = dict(os.environ), os.getcwd(), os.getpgid(0), os.getuid()
    hostile = ("import os, signal, resource\nresource.setrlimit(resource.RLIMIT_NOFILE, (3, 3))\n"
               "os.environ.clear()\nos.chdir('/')\nos.setuid(0) if hasattr(os, 'setuid') else None\n")
    assert score(reward, hostile + GOOD) == 0.0  # setuid(0) fails for the sandbox's uid: the module dies
    assert {r: resource.getrlimit(r) for r in limits} == limits
    assert (dict(os.environ), os.getcwd(), os.getpgid(0), os.getuid()) == (env, cwd, pgid, uid)


# -- reward hacking ------------------------------------------------------------------------------------

HACKS = {
    "exit_early_0": "import os\nos._exit(0)\n",
    "sys_exit_0": "import sys\nsys.exit(0)\n",
    "exit_in_the_test": "import os\ndef add(a, b):\n    os._exit(0)\n",
    "system_exit_in_the_test": "def add(a, b):\n    raise SystemExit(0)\n",
    "fake_pass_summary": ("print('test_add PASSED\\n===== 3 passed in 0.01s =====\\nOK')\n"
                          "import sys\nsys.stderr.write('Ran 3 tests\\n\\nOK\\n')\ndef add(a, b):\n    return None\n"),
    "patch_the_runner": ("import sys\nm = sys.modules['__main__']\nm.encode = lambda v, depth=0: ['b', True]\n"
                         "m._run_untrusted = lambda job, fd: None\ndef add(a, b):\n    return None\n"),
    "patch_json_dumps": ("import json\njson.dumps = lambda *a, **k: '{\"ok\": true, \"values\": [[\"b\", true]]}'\n"
                         "def add(a, b):\n    return None\n"),
    "patch_builtins": ("import builtins\nbuiltins.bool = lambda *a: True\nbuiltins.all = lambda *a: True\n"
                       "builtins.AssertionError = type('Nope', (Exception,), {})\n"
                       "builtins.eval = lambda *a, **k: True\ndef add(a, b):\n    return None\n"),
    "always_equal": "class E:\n    def __eq__(self, other):\n        return True\n    __hash__ = object.__hash__\ndef add(a, b):\n    return E()\n",
    "int_subclass": "class I(int):\n    def __eq__(self, other):\n        return True\n    __hash__ = int.__hash__\ndef add(a, b):\n    return I(0)\n",
    "forge_the_result_pipe": ("import os\nfor fd in range(3, 256):\n    try:\n"
                              "        os.write(fd, b'{\"ok\": true, \"values\": [[\"b\", true]]}')\n"
                              "    except OSError:\n        pass\nos._exit(0)\n"),
    "overwrite_tests": ("import glob, os\nfor p in glob.glob('/**/test*.py', recursive=True)[:50]:\n    try:\n"
                        "        open(p, 'w').write('assert True')\n    except OSError:\n        pass\n"
                        "def add(a, b):\n    return None\n"),
    "settrace_and_atexit": ("import sys, atexit, os\nsys.settrace(lambda *a: None)\n"
                            "atexit.register(lambda: os.write(1, b'3 passed'))\ndef add(a, b):\n    return None\n"),
}


@pytest.mark.parametrize("name", sorted(HACKS))
def test_reward_hacks_earn_nothing(reward, name):
    assert score(reward, HACKS[name]) == 0.0


def test_expected_values_never_enter_the_sandbox(reward):
    code = """
import gc, sys
def search():
    needle = str(int("98765432") * 10 + 1)  # built at run time, local: only the harness could bring it in
    places = gc.get_objects() + [sys.argv, {k: repr(v) for k, v in sys.modules.items()}]
    frame = sys._getframe().f_back
    while frame is not None:
        places.append(frame.f_locals)
        frame = frame.f_back
    for obj in places:
        try:
            if needle in repr(obj):
                return int(needle)
        except Exception:
            pass
    return None
found = search()
def add(a, b):
    return found
"""
    assert score(reward, code, ["assert add(1, 2) == 987654321"]) == 0.0


def test_the_trainers_files_are_hidden(caps, reward):
    need(caps)
    first_line = (ROOT / "pyproject.toml").read_text().splitlines()[0]
    code = f"""
def leak():
    for p in ({str(ROOT / 'pyproject.toml')!r}, "/root/.bashrc"):
        try:
            return open(p).read().splitlines()[0]
        except OSError:
            pass
    return None
"""
    assert score(reward, code, [f"assert leak() == {first_line!r}"]) == 0.0


def test_parallel_pool_scores_a_batch_in_order(reward):
    comps = [GOOD, "def add(a, b):\n    return a + b if a > 0 else 1\n", HACKS["always_equal"], GOOD]
    assert reward(completions=comps, tests=[TESTS] * 4) == [1.0, pytest.approx(2 / 3), 0.0, 1.0]


# -- the verdict outside the completion's reach ---------------------------------------------------------

# A completion patching the library function the test judges with, and scoring nothing unless it
# truly computes the answer. The tests do not import the module: the solution was expected to.
LIBRARY_PATCHES = {
    "math_isclose": ("import math\nmath.isclose = lambda *a, **k: True\ndef area(r):\n    return 0\n",
                     "import math\ndef area(r):\n    return math.pi * r * r\n",
                     "assert math.isclose(area(2), 12.566, rel_tol=1e-3)"),
    "operator_eq": ("import operator\noperator.eq = lambda *a: True\ndef add(a, b):\n    return None\n", GOOD,
                    "assert operator.eq(add(1, 2), 3)"),
    "re_fullmatch": ("import re\nre.fullmatch = lambda *a, **k: True\ndef pad(n):\n    return ''\n",
                     "def pad(n):\n    return f'{n:03d}'\n", "assert re.fullmatch(r'\\d{3}', pad(5))"),
}


@pytest.mark.parametrize("name", sorted(LIBRARY_PATCHES))
def test_a_patched_library_never_judges(reward, name):
    forged, honest, test = LIBRARY_PATCHES[name]
    assert score(reward, forged, [test]) == 0.0
    assert score(reward, honest, [test]) == 1.0


def test_setup_values_and_subscripts_stay_out_of_the_sandbox(reward):
    # The expected value sits in the setup code: the solution must not find it in its globals.
    reader = "def add(a, b):\n    return globals().get('expected')\n"
    assert score(reward, reader, ["assert add(1, 2) == expected"], test_setup_code=["expected = 987654321"]) == 0.0
    assert score(reward, GOOD, ["assert add(1, 2) == expected"], test_setup_code=["expected = 3"]) == 1.0
    # An object answering any index with the right value: the index is taken in the trainer, on data.
    fake = "class Any:\n    def __getitem__(self, i):\n        return 5\ndef pair(x):\n    return Any()\n"
    assert score(reward, fake, ["assert pair(5)[0] == 5"]) == 0.0
    assert score(reward, "def pair(x):\n    return (x, x + 1)\n", ["assert pair(5)[0] == 5"]) == 1.0


def test_setup_column_as_a_list_of_lines(reward):
    setup = ["import math", "r = 2"]
    test = ["assert math.isclose(area(r), 12.566, rel_tol=1e-3)"]
    honest = "import math\ndef area(r):\n    return math.pi * r * r\n"
    assert score(reward, honest, test, test_setup_code=[setup]) == 1.0
    assert score(reward, honest, test, test_setup_code=[repr(setup)]) == 1.0  # the list, stored as its text
    assert score(reward, LIBRARY_PATCHES["math_isclose"][0], test, test_setup_code=[setup]) == 0.0


def test_the_comparison_is_bounded_in_memory_and_time(reward):
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10
    t0 = time.monotonic()
    # The check `'x' * 3e9 == 'xxx'` would build a 3 GB string wherever it ran.
    assert score(reward, "def f(n):\n    return 3 * 10**9\n", ["assert 'x' * f(1) == 'xxx'"]) == 0.0
    # 9 ** 9 ** 9 has 369 million digits: minutes of CPU wherever it ran.
    assert score(reward, "def f(n):\n    return 9\n", ["assert f(1) ** f(1) ** f(1) > 0"]) == 0.0
    assert (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10) - peak < 256 << 20
    assert time.monotonic() - t0 < 30
    assert score(reward, "def f(n):\n    return 3\n", ["assert 'x' * f(1) == 'xxx'"]) == 1.0  # the judge came back


# -- memory per job ------------------------------------------------------------------------------------

MEMORY = Limits(wall=5.0, cpu=4, memory=256 << 20, fsize=8 << 20, nproc=16)


def _held(sandbox, code, probe):
    from grpo_monitor.rewards.sandbox import decode_value

    res = sandbox.run(code, probes=[probe], limits=MEMORY)
    return res, (decode_value(res.values[0]) if res.ok else None)


def test_memory_is_counted_over_all_the_jobs_processes(sandbox):
    from tests.sandbox_escapes import PROCESSES

    res, held = _held(sandbox, PROCESSES, "hold(6)")
    assert held is None and res.status == "memory", (res.status, held)
    res, held = _held(sandbox, PROCESSES, "hold(2)")  # 128 MiB in two processes: under the limit
    assert held == 2 * (64 << 20), (res.status, res.error)


def test_memory_files_count_too(sandbox):
    from tests.sandbox_escapes import MEMFD

    res, held = _held(sandbox, MEMFD, "hold(60)")  # 480 MiB of memory files, outside any address space
    assert held is None or held <= MEMORY.memory, (res.status, held)


# -- Unix sockets --------------------------------------------------------------------------------------


@pytest.fixture
def run_socket():
    """A world-connectable Unix socket under /run, as systemd and many daemons leave them."""
    if not os.access("/run", os.W_OK):
        pytest.skip("creating a socket under /run needs root")
    path = f"/run/grpo-sandbox-{uuid.uuid4().hex[:12]}.sock"
    received: list[bytes] = []
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    os.chmod(path, 0o777)
    srv.listen(8)
    dgram = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    dgram.bind(path + ".d")
    os.chmod(path + ".d", 0o777)
    stop = threading.Event()

    def serve():
        srv.settimeout(0.2)
        dgram.settimeout(0.2)
        while not stop.is_set():
            for s in (srv, dgram):
                try:
                    if s is srv:
                        conn, _ = s.accept()
                        received.append(conn.recv(64) or b"<connected>")
                        conn.close()
                    else:
                        received.append(s.recv(64))
                except OSError:
                    pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield path, received
    stop.set()
    t.join(2)
    srv.close()
    dgram.close()
    for p in (path, path + ".d"):
        os.unlink(p)


def test_unix_sockets_are_unreachable(reward, run_socket):
    path, received = run_socket
    code = f"""
import socket
ok = []
for kind, target in ((socket.SOCK_STREAM, {path!r}), (socket.SOCK_DGRAM, {path + '.d'!r})):
    try:
        s = socket.socket(socket.AF_UNIX, kind)
        s.settimeout(1)
        s.connect(target)
        s.send(b"escaped")
        ok.append(target)
    except OSError:
        pass
try:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    a.sendto(b"escaped", {path + '.d'!r})
    ok.append("socketpair")
except OSError:
    pass
def reached():
    return ok
"""
    assert score(reward, code, ["assert reached() != []"]) == 0.0
    time.sleep(0.3)
    assert received == []


def test_the_filter_denies_what_it_says(caps, sandbox):
    need(caps)
    from grpo_monitor.rewards.sandbox import decode_value

    code = """
import ctypes, errno, os, socket
def denied():
    out = {}
    for name, call in (("unix socket", lambda: socket.socket(socket.AF_UNIX)),
                       ("unix datagram pair", lambda: socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)),
                       ("memfd", lambda: os.memfd_create("m"))):
        try:
            call()
            out[name] = "allowed"
        except OSError as exc:
            out[name] = errno.errorcode[exc.errno]
    libc = ctypes.CDLL(None, use_errno=True)
    out["new user namespace"] = "allowed" if libc.unshare(0x10000000) == 0 else errno.errorcode[ctypes.get_errno()]
    out["stream pair"] = len(socket.socketpair())
    return out
"""
    res = sandbox.run(code, probes=["denied()"])
    assert res.ok, res
    assert decode_value(res.values[0]) == {"unix socket": "EPERM", "unix datagram pair": "EPERM", "memfd": "EPERM",
                                           "new user namespace": "EPERM", "stream pair": 2}


def test_socket_families_are_denied_unless_allowed(caps, sandbox):
    need(caps)
    from grpo_monitor.rewards.sandbox import decode_value
    from tests.sandbox_escapes import FAMILIES

    res = sandbox.run(FAMILIES, probes=["families()"])
    assert res.ok, res
    got = decode_value(res.values[0])
    assert got and set(got.values()) == {"EPERM"}, got  # AF_VSOCK included: it reaches the host from any namespace
    opened = Sandbox(LIMITS, workers=1, socket_families=[socket.AF_INET])
    try:
        res = opened.run(FAMILIES, probes=["families()"])
    finally:
        opened.close()
    assert res.ok, res
    got = decode_value(res.values[0])
    assert got["AF_INET"] == "allowed" and got["AF_VSOCK"] == "EPERM" and got["AF_UNIX"] == "EPERM", got


# -- one isolation policy, whoever runs it ---------------------------------------------------------------

IDENTITIES = {
    "root": [],
    "root_without_cap_sys_admin": ["setpriv", "--inh-caps=-sys_admin", "--bounding-set=-sys_admin", "--"],
    "nobody": ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"],
}


def _unsearchable(uid: int, path: str) -> list[str]:
    """Directories above ``path`` that ``uid`` may not search."""
    out = []
    for d in reversed(Path(os.path.realpath(path)).parents):
        st = d.stat()
        if st.st_uid != uid and not st.st_mode & 0o001:
            out.append(str(d))
    return out


def _as_identity(name: str) -> tuple[list[str], str, dict[str, str]]:
    """The command prefix that runs a process as ``name``, its home, its environment."""
    if os.getuid() != 0:
        pytest.skip("running the sandbox as root, as root without CAP_SYS_ADMIN and as nobody needs root")
    prefix = IDENTITIES[name]
    if prefix and not shutil.which(prefix[0]):
        pytest.skip(f"{prefix[0]} is not installed")
    if name == "nobody":
        # The training process must be able to start this interpreter again. Where it lies under a
        # folder nobody may not search (pyenv under /root), a private mount namespace shows nobody
        # that one path: an empty tmpfs on the folder, the interpreter's subfolder bound back in.
        blocked = sorted({d for p in (sys.executable, os.__file__) for d in _unsearchable(65534, p)})
        if len(blocked) > 1:
            pytest.skip(f"the interpreter lies under several folders nobody may not search: {blocked}")
        if blocked:
            top = blocked[0]
            sub = Path(os.path.realpath(sys.executable)).relative_to(top).parts[0]
            if Path(os.path.realpath(os.__file__)).relative_to(top).parts[0] != sub:
                pytest.skip(f"the interpreter and its standard library lie in two places under {top}")
            show = (f'S=$(mktemp -d) && mount --bind {top}/{sub} "$S" && mount -t tmpfs -o mode=755 tmpfs {top} && '
                    f'mkdir {top}/{sub} && mount --move "$S" {top}/{sub} && exec "$@"')
            prefix = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", show, "sh"] + prefix
    home = tempfile.mkdtemp(prefix="grpo-escape-home-")
    os.chmod(home, 0o700)
    if name == "nobody":
        os.chown(home, 65534, 65534)
    env = {"PATH": "/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8"}
    probe = subprocess.run(prefix + [sys.executable, "-c", "import subprocess, sys, grpo_monitor.rewards.sandbox\n"
                                     "subprocess.run([sys.executable, '-I', '-S', '-c', 'pass'], check=True)"],
                           cwd=home, env=env | {"PYTHONPATH": str(ROOT)}, capture_output=True, text=True)
    if probe.returncode != 0:
        shutil.rmtree(home, ignore_errors=True)
        pytest.skip(f"{sys.executable} cannot run as {name}: {probe.stderr.strip()[-300:]}")
    return prefix, home, env


@pytest.mark.parametrize("identity", sorted(IDENTITIES))
def test_isolation_holds_as(identity, run_socket):
    path, received = run_socket
    prefix, home, env = _as_identity(identity)
    try:
        proc = subprocess.run(prefix + [sys.executable, str(ROOT / "tests" / "sandbox_escapes.py"), path], cwd=home,
                              env=env, capture_output=True, text=True, timeout=180)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0 and lines, f"the training process did not finish (exit {proc.returncode}): {proc.stderr[-800:]}"
    rep = json.loads(lines[-1])
    assert (rep["honest"], rep["wrong"]) == (1.0, 0.0), rep
    assert isinstance(rep["escape"], dict), rep
    assert rep["escape"] == {"env": None, "secret_file": None, "tmp_secret": None, "environ": None, "tcp": False,
                             "unix": False}, rep
    assert (rep["tmp_written"], rep["tcp_received"], rep["left_behind"], rep["sentinel_alive"]) == (False, 0, [], True), rep
    assert received == []
    assert rep["processes"]["status"] == "memory" and rep["processes"]["held"] is None, rep
    assert rep["memfd"]["held"] is None or rep["memfd"]["held"] <= 256 << 20, rep


_HOLES: dict[str, dict] = {}


def _holes_as(identity: str) -> dict:
    """The attack trial's holes, tried once per identity by ``sandbox_escapes.py --holes``."""
    if identity not in _HOLES:
        prefix, home, env = _as_identity(identity)
        try:
            proc = subprocess.run(prefix + [sys.executable, str(ROOT / "tests" / "sandbox_escapes.py"), "--holes"],
                                  cwd=home, env=env, capture_output=True, text=True, timeout=180)
        finally:
            shutil.rmtree(home, ignore_errors=True)
        lines = proc.stdout.strip().splitlines()
        assert proc.returncode == 0 and lines, f"the training process did not finish (exit {proc.returncode}): {proc.stderr[-800:]}"
        _HOLES[identity] = json.loads(lines[-1])
        assert not _HOLES[identity]["caps"].get("refused"), _HOLES[identity]["caps"]
    return _HOLES[identity]["holes"]


@pytest.mark.parametrize("identity", sorted(IDENTITIES))
def test_expected_values_stay_out_of_the_sandbox_as(identity):
    # An honest square and a completion that returns whatever answer it finds in its reach.
    got = _holes_as(identity)["expected_values"]
    assert got == {name: [1.0, 0.0] for name in got} and len(got) == 5, got


@pytest.mark.parametrize("identity", sorted(IDENTITIES))
def test_a_deeply_nested_result_fails_only_its_own_completion_as(identity):
    got = _holes_as(identity)["deep_result"]
    assert got["batch"] == [1.0, 0.0, 1.0], got
    assert got["run"] == {"ok": False, "status": "exit", "error": "unreadable result"}, got


@pytest.mark.parametrize("identity", sorted(IDENTITIES))
def test_the_supervisor_ignores_the_jobs_signals_as(identity):
    got = _holes_as(identity)["signals"]
    assert got["score"] == 1.0, got
    assert got["run"]["ok"] and got["run"]["status"] == "exit", got


@pytest.mark.parametrize("identity", sorted(IDENTITIES))
def test_a_setup_helper_calls_the_solution_as(identity):
    # setup `def check(x): return solve(x) == 16801801`, test `assert check(4099)`
    assert _holes_as(identity)["helper"] == {"honest": 1.0, "wrong": 0.0, "seeker": 0.0}


@pytest.mark.parametrize("identity", sorted(IDENTITIES))
def test_socket_families_are_denied_as(identity):
    got = _holes_as(identity)["socket_families"]
    assert isinstance(got, dict) and "AF_VSOCK" in got and set(got.values()) == {"EPERM"}, got


def test_refuses_where_no_isolation_is_possible(tmp_path):
    """A user namespace that may create no user namespace, its root without capabilities: nothing
    isolates. The sandbox refuses, in one line, until asked to run unisolated."""
    if not (shutil.which("unshare") and shutil.which("setpriv")):
        pytest.skip("unshare and setpriv are needed to build a machine without isolation")
    script = tmp_path / "refuse.py"
    script.write_text(f"""
import logging, sys
sys.path.insert(0, {str(ROOT)!r})
logging.basicConfig(level=logging.WARNING, format="%(message)s")
from grpo_monitor.rewards.sandbox import Sandbox, SandboxRefused
from grpo_monitor.rewards.unit_tests import UnitTestReward
reward = UnitTestReward(sandbox=Sandbox(workers=1))
try:
    reward(completions=[{GOOD!r}], tests=[{TESTS!r}])
    print("RAN")
except SandboxRefused as exc:
    print("REFUSED " + str(exc))
unsafe = UnitTestReward(sandbox=Sandbox(workers=1, isolation="none"))
print("NONE", unsafe(completions=[{GOOD!r}], tests=[{TESTS!r}]))
""")
    inner = f"exec setpriv --inh-caps=-all --bounding-set=-all -- {sys.executable} {script}"
    cmd = ["unshare", "--user", "--map-root-user", "sh", "-c",
           f"echo 0 > /proc/sys/user/max_user_namespaces && {inner}"]
    probe = subprocess.run(cmd[:3] + ["true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"this machine grants no user namespace to build the test in: {probe.stderr.strip()}")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    out = proc.stdout.splitlines()
    refused = [ln for ln in out if ln.startswith("REFUSED ")]
    assert refused and "RAN" not in out, (proc.stdout, proc.stderr[-800:])
    assert "isolation='none'" in refused[0] and "\n" not in refused[0]
    assert "NONE [1.0]" in out, (proc.stdout, proc.stderr[-800:])
    assert "unsafe" in proc.stderr.lower()
