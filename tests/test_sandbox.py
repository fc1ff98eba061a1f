"""The unit-test reward's sandbox under attack, and the harness under reward hacking.

Every attack is a completion submitted to the unit-test reward. Each must earn 0 or the tests'
honest share, leave this process unharmed, write nothing outside its sandbox, read no secret,
reach no listener and leave no process behind. Limits are small so the suite stays fast.
"""

from __future__ import annotations

import os
import socket
import subprocess
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


def need(caps, *names):
    """Skip an attack whose containment needs isolation this machine does not grant (docs/REWARDS.md
    says what is relied on instead); the fork bomb is never run without it."""
    missing = [n for n in names if not caps.get(n)]
    if missing:
        pytest.skip(f"this machine grants no {', '.join(missing)} isolation to the sandbox")


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
    if not caps.get("root"):
        pytest.skip(f"not root: the sandbox runs with reduced isolation here ({caps})")
    # As root the kernel grants every namespace the sandbox asks for; say so loudly if that changes.
    assert caps.get("net") and caps.get("pid") and caps.get("mount"), caps


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


# -- attacks -----------------------------------------------------------------------------------------


def test_infinite_loop(reward):
    t0 = time.monotonic()
    assert score(reward, "while True:\n    pass\n" + GOOD) == 0.0
    assert time.monotonic() - t0 < LIMITS.wall * 3 + 10  # three tests, two workers, each cut at the wall limit


def test_fork_bomb(caps, reward):
    need(caps, "root", "pid")
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    assert reward(completions=[bomb], tests=[TESTS[:1]]) == [0.0]


def test_ten_gigabyte_allocation(reward):
    assert score(reward, "x = bytearray(10 << 30)\n" + GOOD) == 0.0
    assert score(reward, "try:\n    x = bytearray(10 << 30)\nexcept MemoryError:\n    x = None\n" + GOOD) == 1.0


def test_one_gigabyte_write(caps, reward, tmp_path):
    need(caps, "mount")
    write = "f = open('big.bin', 'wb')\nfor _ in range(1024):\n    f.write(b'x' * (1 << 20))\n"
    assert score(reward, write + GOOD) == 0.0  # the write fails at the file-size limit, the module with it
    ignore = "try:\n" + "".join(
        "    " + ln + "\n" for ln in write.splitlines()) + "except OSError:\n    pass\n"
    assert score(reward, ignore + GOOD) == 1.0  # the failed write caught: the honest part still counts


def test_writing_outside_the_working_directory(caps, reward, tmp_path):
    need(caps, "root", "mount")
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
    need(caps, "root", "mount")
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
    need(caps, "net")
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
    need(caps, "root", "pid")
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
    need(caps, "root", "pid")
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
    need(caps, "mount")
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
