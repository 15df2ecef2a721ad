"""The code sandbox on the real backend (bubblewrap): cases S1-S6, verdicts, isolation, pool.

Nothing is mocked: every test runs untrusted code in a real sandbox.  When ``bwrap`` is not
installed the bwrap tests are skipped (.ci/run installs it); when it is installed it must work.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time

import psutil
import pytest

from agentrl.sandbox import (
    Limits,
    SandboxPool,
    SandboxResult,
    TestOutcome,
    available_backends,
    run_code,
    run_tests,
)

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")

CASE_LIMITS = Limits(wall_s=2.0, memory_mb=512)  # CASES.md: timeout 2 s, memory 512 MiB
DOUBLE = "def f(x):\n    return 2 * x\n"
DOUBLE_TESTS = ["assert f(2) == 4", "assert f(3) == 6"]


@pytest.fixture(scope="module")
def pool():
    p = SandboxPool(workers=2, backend="bwrap", limits=CASE_LIMITS)
    # warm both workers so that timing assertions measure runs, not sandbox start-up
    assert [r.verdict for r in p.map_tests([{"code": DOUBLE, "tests": DOUBLE_TESTS}] * 2)] == [
        "pass", "pass"]
    yield p
    pids = p.host_pids
    p.close()
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def sandbox_processes(pool: SandboxPool) -> list[psutil.Process]:
    """Every host process inside the pool's sandboxes (only the server when idle)."""
    procs = []
    for pid in pool.host_pids:
        procs += psutil.Process(pid).children(recursive=True)
    return procs


def assert_idle_and_clean(pool: SandboxPool) -> None:
    """Each idle sandbox holds exactly its server (pid 1 inside): no leftovers, no zombies."""
    procs = sandbox_processes(pool)
    names = [p.name() for p in procs]
    assert all(p.status() != psutil.STATUS_ZOMBIE for p in procs), names
    assert len(procs) == len(pool.host_pids) and all(n.startswith("python") for n in names), names


def test_bwrap_is_the_default_backend():
    assert available_backends()[0] == "bwrap"
    assert "subprocess" in available_backends()


# ---------------------------------------------------------------- cases S1-S6 (CASES.md)


def test_s1_infinite_loop_times_out_and_worker_survives(pool):
    restarts = pool.restarts
    t0 = time.monotonic()
    r = pool.run_tests("while True: pass\n" + DOUBLE, DOUBLE_TESTS, limits=CASE_LIMITS)
    elapsed = time.monotonic() - t0
    assert r.verdict == "timeout" and r.passed == 0 and r.pass_fraction == 0.0
    assert elapsed < 3.0, elapsed
    assert pool.run_tests(DOUBLE, DOUBLE_TESTS).verdict == "pass"
    assert pool.restarts == restarts  # the warm server itself was never touched


def test_s2_huge_product_is_stopped_from_outside(pool):
    code = "import itertools; x = list(itertools.product(range(10), repeat=9))\n" + DOUBLE
    t0 = time.monotonic()
    r = pool.run_tests(code, DOUBLE_TESTS, limits=CASE_LIMITS)
    assert r.verdict in ("timeout", "memory_limit"), r
    assert r.passed == 0
    assert time.monotonic() - t0 < 3.5


def test_s3_background_process_is_killed_after_the_run(pool):
    code = "import subprocess\nsubprocess.Popen(['sleep', '300'])\n" + DOUBLE
    r = pool.run_tests(code, DOUBLE_TESTS, limits=CASE_LIMITS)
    assert r.verdict == "pass" and r.passed == 2  # the tests did run
    assert_idle_and_clean(pool)
    assert not [p for p in psutil.process_iter(["cmdline", "uids"])
                if p.info["cmdline"] == ["sleep", "300"] and p.info["uids"]
                and p.info["uids"].real >= 610_000]


def test_s3_escaped_session_and_double_fork_are_killed(pool):
    code = (
        "import os, subprocess\n"
        "subprocess.Popen(['setsid', 'sh', '-c', 'sleep 301 & sleep 302'])\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        import time; time.sleep(303)\n"
        "    os._exit(0)\n" + DOUBLE
    )
    r = pool.run_tests(code, DOUBLE_TESTS, limits=CASE_LIMITS)
    assert r.verdict == "pass"
    assert_idle_and_clean(pool)


@pytest.mark.parametrize("exit_stmt", ["import sys; sys.exit(0)", "import os; os._exit(0)",
                                       "raise SystemExit(0)"])
def test_s4_clean_exit_before_tests_is_never_a_pass(pool, exit_stmt):
    r = pool.run_tests(DOUBLE + exit_stmt + "\n", DOUBLE_TESTS, limits=CASE_LIMITS)
    assert r.verdict != "pass" and r.passed == 0 and r.pass_fraction == 0.0
    assert r.verdict == "runtime_error"
    assert all(not t.passed for t in r.tests)


def test_s5_output_flood_is_capped(pool):
    rss0 = psutil.Process().memory_info().rss
    r = pool.run_tests('while True: print("A" * 1000)\n' + DOUBLE, DOUBLE_TESTS,
                       limits=CASE_LIMITS)
    assert r.verdict in ("output_limit", "timeout")
    assert r.verdict == "output_limit"  # 1 MiB is printed in well under 2 s
    assert r.passed == 0
    assert len(r.stdout.encode()) <= CASE_LIMITS.output_bytes
    assert len(r.stdout) > 900_000  # what was printed before the cap is kept
    assert psutil.Process().memory_info().rss - rss0 < 64 << 20


def test_s6_runaway_recursion_with_raised_limit_is_a_runtime_error(pool):
    restarts = pool.restarts
    code = "import sys\nsys.setrecursionlimit(10**7)\ndef g(n):\n    return g(n + 1)\n"
    r = pool.run_tests(code, ["assert g(0) == 1"], limits=CASE_LIMITS)
    assert r.verdict == "runtime_error", r
    assert r.passed == 0
    assert "RecursionError" in r.tests[0].error
    # C-level recursion overflows the real stack: a crash, still a runtime error
    code = ("import sys, functools\nsys.setrecursionlimit(10**7)\n"
            "@functools.lru_cache(None)\ndef g(n):\n    return g(n + 1)\n")
    r = pool.run_tests(code, ["assert g(0) == 1"], limits=CASE_LIMITS)
    assert r.verdict == "runtime_error", r
    assert pool.run_tests(DOUBLE, DOUBLE_TESTS).verdict == "pass"
    assert pool.restarts == restarts


# ---------------------------------------------------------------- fake passes (S4 and more)

FORGERIES = {
    "print_fake_report": DOUBLE.replace("2 * x", "x") + "print('P 0 deadbeef'); print('D')\n",
    "write_fake_report_fd": (
        DOUBLE.replace("2 * x", "x")
        + "import os\nfor fd in range(3, 20):\n"
          "    try: os.write(fd, b'P 0 x\\nP 1 x\\nD\\n')\n"
          "    except OSError: pass\n"
    ),
    "patch_builtins_abs": (
        "import builtins\nbuiltins.abs = lambda x: 0\n"
        "builtins.AssertionError = type('Nope', (Exception,), {})\n"
        "def f(x):\n    return 0\n"
    ),
    "redefine_check": (
        "def check(candidate):\n    return True\ndef f(x):\n    return 0\n"
    ),
    "exit_inside_function": "import os\ndef f(x):\n    os._exit(0)\n",
    "sys_exit_inside_function": "import sys\ndef f(x):\n    sys.exit(0)\n",
    "patch_exec_and_os_write": (
        "import builtins, os\nbuiltins.exec = lambda *a, **k: None\n"
        "os.write = lambda fd, b: len(b)\ndef f(x):\n    return 0\n"
    ),
    "settrace_in_function": (
        "import sys\ndef f(x):\n    sys.settrace(lambda *a: None)\n    return 0\n"
    ),
}
CHECK_TESTS = [
    "def check(candidate):\n    assert abs(candidate(2) - 4) < 1e-9\n    assert candidate(3) == 6\n"
    "check(f)\n",
    "assert f(5) == 10",
]


@pytest.mark.parametrize("name", sorted(FORGERIES))
def test_forged_passes_never_count(pool, name):
    r = pool.run_tests(FORGERIES[name], CHECK_TESTS, limits=CASE_LIMITS)
    assert r.verdict != "pass", r
    assert r.passed == 0, r
    assert pool.run_tests(DOUBLE, CHECK_TESTS).verdict == "pass"


def test_solution_cannot_kill_its_server(pool):
    restarts = pool.restarts
    code = ("import os, signal\nfor sig in (signal.SIGKILL, signal.SIGSTOP, signal.SIGTERM):\n"
            "    os.kill(1, sig)\n" + DOUBLE)
    assert pool.run_tests(code, DOUBLE_TESTS, limits=CASE_LIMITS).verdict == "pass"
    assert pool.restarts == restarts
    assert_idle_and_clean(pool)


def test_server_killed_from_outside_is_restarted_and_the_job_retried(pool):
    restarts = pool.restarts
    code = "import time\ntime.sleep(0.6)\n" + DOUBLE
    def kill_all():  # a run's processes die with their server while we go through the list
        for p in sandbox_processes(pool):
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()

    killer = threading.Timer(0.3, kill_all)
    killer.start()
    results = pool.map_tests([{"code": code, "tests": DOUBLE_TESTS}] * 2)
    killer.join()
    assert [r.verdict for r in results] == ["pass", "pass"]
    assert pool.restarts == restarts + 2
    assert_idle_and_clean(pool)


def test_broken_backend_gives_sandbox_error(monkeypatch):
    from agentrl.sandbox import backends

    def fail(tmpfs_mb):  # injected fault: the sandbox cannot be started
        raise backends.BackendError("injected: cannot start")

    with SandboxPool(workers=1, backend="bwrap") as p:
        monkeypatch.setitem(backends.STARTERS, "bwrap", fail)
        r = p.run_tests(DOUBLE, DOUBLE_TESTS)
    assert r.verdict == "sandbox_error" and r.passed == 0 and r.total == 2
    assert "injected" in r.error


# ---------------------------------------------------------------- verdicts


def test_pass_and_per_test_outcomes(pool):
    r = pool.run_tests(DOUBLE, ["assert f(1) == 2", "assert f(2) == 5", "f(None + 1)"],
                       names=["one", "two", "three"])
    assert isinstance(r, SandboxResult) and r.backend == "bwrap"
    assert (r.passed, r.total) == (1, 3)
    assert r.pass_fraction == pytest.approx(1 / 3)
    assert r.tests[0] == TestOutcome("one", True, None)
    assert r.tests[1].error == "AssertionError (at `assert f(2) == 5`)"
    assert r.tests[2].error.startswith("TypeError: unsupported operand")
    assert r.verdict == "runtime_error"  # a test raised something other than AssertionError
    assert r.wall_s > 0 and r.cpu_s > 0


def test_fail_verdict_with_assertion_message(pool):
    r = pool.run_tests(DOUBLE, ["assert f(2) == 4", "assert f(3) == 7, 'f(3) should be 7'"])
    assert r.verdict == "fail" and (r.passed, r.total) == (1, 2)
    assert r.tests[1].error == "AssertionError: f(3) should be 7 (at `assert f(3) == 7, 'f(3) should be 7'`)"
    assert r.error.startswith("test_1: AssertionError")


def test_timeout_inside_a_test_keeps_earlier_passes(pool):
    code = "def f(x):\n    while x == 3:\n        pass\n    return 2 * x\n"
    r = pool.run_tests(code, ["assert f(2) == 4", "assert f(3) == 6", "assert f(4) == 8"],
                       limits=Limits(wall_s=1.0))
    assert r.verdict == "timeout" and r.passed == 1
    assert r.tests[1].error == "did not finish (time limit)"
    assert r.tests[2].error == "not run"


def test_cpu_limit_is_a_timeout(pool):
    r = pool.run_tests("while True: pass\n", [], limits=Limits(wall_s=10.0, cpu_s=1.0))
    assert r.verdict == "timeout" and "CPU" in r.error


def test_memory_limit(pool):
    r = pool.run_tests("x = bytearray(600 * 2**20)\n" + DOUBLE, DOUBLE_TESTS,
                       limits=Limits(memory_mb=256))
    assert r.verdict == "memory_limit" and r.passed == 0


def test_syntax_error(pool):
    r = pool.run_tests("def f(x)\n    return x\n", DOUBLE_TESTS)
    assert r.verdict == "syntax_error" and r.passed == 0
    assert r.error.startswith("SyntaxError")


def test_runtime_error_at_module_level(pool):
    r = pool.run_tests(DOUBLE + "raise ValueError('boom')\n", DOUBLE_TESTS)
    assert r.verdict == "runtime_error" and r.error == "ValueError: boom"


def test_syntax_error_in_a_test_only_fails_that_test(pool):
    r = pool.run_tests(DOUBLE, ["assert f(2) == 4", "assert f(2) =="])
    assert r.passed == 1 and r.tests[1].error.startswith("SyntaxError in test")


def test_no_tests_passes_when_the_solution_runs(pool):
    assert pool.run_tests(DOUBLE, []).verdict == "pass"
    assert pool.run_tests(DOUBLE, []).pass_fraction == 1.0
    assert pool.run_tests("1/0", []).verdict == "runtime_error"


def test_setup_runs_before_the_solution(pool):
    r = pool.run_tests("def f(x):\n    return math.sqrt(x)\n", ["assert f(16) == 4.0"],
                       setup="import math")
    assert r.verdict == "pass"


def test_humaneval_style_check(pool):
    prompt = 'def add(x: int, y: int):\n    """Add two numbers."""\n'
    test = (
        "METADATA = {'author': 'jt', 'dataset': 'test'}\n\n\n"
        "def check(candidate):\n    assert candidate(0, 1) == 1\n"
        "    assert candidate(2, 3) == 5\n    assert candidate(7, 5) == 12\n"
    )
    good = pool.run_tests(prompt + "    return x + y\n", [test + "\ncheck(add)\n"])
    bad = pool.run_tests(prompt + "    return x - y\n", [test + "\ncheck(add)\n"])
    assert good.verdict == "pass"
    assert bad.verdict == "fail" and "candidate(0, 1) == 1" in bad.tests[0].error


def test_output_is_captured(pool):
    r = pool.run_tests(DOUBLE + "print('hello')\nimport sys; print('warn', file=sys.stderr)\n",
                       DOUBLE_TESTS)
    assert r.verdict == "pass" and r.stdout == "hello\n" and r.stderr == "warn\n"


def test_main_block_does_not_run_in_tests_mode(pool):
    r = pool.run_tests(DOUBLE + "if __name__ == '__main__':\n    print(input())\n", DOUBLE_TESTS)
    assert r.verdict == "pass" and r.stdout == ""


def test_names_must_match_tests(pool):
    with pytest.raises(ValueError, match="names"):
        pool.run_tests(DOUBLE, DOUBLE_TESTS, names=["only one"])


# ---------------------------------------------------------------- run_code


def test_run_code_stdin_stdout(pool):
    r = pool.run_code("import sys\nprint(sum(int(x) for x in sys.stdin.read().split()))\n",
                      stdin="1 2 3\n4\n")
    assert r.verdict == "pass" and r.stdout == "10\n" and (r.passed, r.total) == (0, 0)


def test_run_code_verdicts(pool):
    assert pool.run_code("import sys; sys.exit(0)").verdict == "pass"
    r = pool.run_code("import sys; sys.exit(3)")
    assert r.verdict == "runtime_error" and r.error == "SystemExit: 3"
    r = pool.run_code("print(1)\nraise KeyError('k')")
    assert r.verdict == "runtime_error" and r.stdout == "1\n" and "KeyError" in r.error
    assert pool.run_code("print(1").verdict == "syntax_error"
    assert pool.run_code("import time; time.sleep(5)", limits=Limits(wall_s=0.5)).verdict == "timeout"


def test_module_level_functions_use_the_default_pool():
    r = run_tests(DOUBLE, DOUBLE_TESTS, backend="bwrap")
    assert r.verdict == "pass" and r.backend == "bwrap"
    assert run_code("print(40 + 2)", backend="bwrap").stdout == "42\n"


# ---------------------------------------------------------------- isolation

PROBE = """
import os, socket, sys
out = {}
def attempt(name, fn):
    try:
        out[name] = ('ok', fn())
    except BaseException as e:
        out[name] = ('err', type(e).__name__)
attempt('passwd', lambda: open('/etc/passwd').read())
attempt('root', lambda: os.listdir('/root'))
attempt('project', lambda: open(%(project)r).read())
attempt('write_usr', lambda: open('/usr/x', 'w').write('x'))
attempt('write_root', lambda: open('/x', 'w').write('x'))
attempt('write_tmp', lambda: open('/tmp/x', 'w').write('x'))
attempt('net', lambda: socket.create_connection(('1.1.1.1', 53), timeout=1))
attempt('ifaces', lambda: [n for _, n in socket.if_nameindex()])
attempt('pids', lambda: sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))
attempt('uid', os.getuid)
attempt('userns', lambda: os.system('unshare -r true 2>/dev/null'))
print(repr(out))
print(repr(dict(os.environ)))
"""


def test_isolation(pool, monkeypatch):
    monkeypatch.setenv("AGENTRL_SECRET_TOKEN", "hunter2")
    with SandboxPool(workers=1, backend="bwrap") as fresh:  # started with the secret in env
        r = fresh.run_code(PROBE % {"project": os.path.abspath(__file__)})
    assert r.verdict == "pass", r
    res_line, env_line = r.stdout.strip().splitlines()
    res, env = eval(res_line), eval(env_line)  # noqa: S307 - our own repr output
    assert res["passwd"] == ("err", "FileNotFoundError")  # no /etc at all
    assert res["root"][0] == "err" or res["root"][1] in ([], [".pyenv"])
    assert res["project"] == ("err", "FileNotFoundError")
    assert res["write_usr"] == ("err", "OSError")  # read-only file system
    assert res["write_root"] == ("err", "OSError")
    assert res["write_tmp"][0] == "ok"
    assert res["net"][0] == "err"
    assert res["ifaces"] == ("ok", ["lo"])
    pids = res["pids"][1]
    assert len(pids) == 2 and pids[0] == 1  # only the server (pid 1) and this run
    assert res["uid"][1] != 0
    assert res["userns"] == ("ok", 256)  # unshare fails: no nested user namespaces
    assert "AGENTRL_SECRET_TOKEN" not in env and "hunter2" not in r.stdout
    assert set(env) <= {"PATH", "HOME", "TMPDIR", "LANG", "OMP_NUM_THREADS",
                        "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"}


def test_runs_do_not_see_each_other(pool):
    writer = (
        "import os, ctypes\nopen('/tmp/left_behind', 'w').write('x')\n"
        "open('here', 'w').write('x')\n"
        "libc = ctypes.CDLL(None)\nassert libc.shmget(4242, 4096, 0o1666) >= 0\n"
    )
    reader = (
        "import os, ctypes\nlibc = ctypes.CDLL(None)\n"
        "print(os.path.exists('/tmp/left_behind'), os.listdir('.'), libc.shmget(4242, 0, 0))\n"
    )
    w1 = pool.run_code(writer)
    assert w1.verdict == "pass", w1
    for _ in range(2):  # whichever worker runs next, nothing is left
        r = pool.run_code(reader)
        assert r.stdout == "False [] -1\n", r


def test_fork_bomb_is_contained(pool):
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    host_before = len(psutil.pids())
    r = pool.run_tests(bomb + DOUBLE, DOUBLE_TESTS, limits=Limits(wall_s=1.5, max_procs=16))
    assert r.verdict != "pass" and r.passed == 0
    assert len(psutil.pids()) < host_before + 40
    assert_idle_and_clean(pool)
    assert pool.run_tests(DOUBLE, DOUBLE_TESTS).verdict == "pass"


def test_process_limit(pool):
    code = (
        "import subprocess\nprocs = []\n"
        "try:\n    for _ in range(20):\n        procs.append(subprocess.Popen(['sleep', '5']))\n"
        "except OSError:\n    pass\nprint(len(procs))\n"
    )
    r = pool.run_code(code, limits=Limits(max_procs=5))
    assert r.verdict == "pass" and r.stdout == "4\n"  # 5 processes including itself


def test_file_size_limit(pool):
    r = pool.run_code("open('big', 'wb').write(b'x' * (3 << 20))", limits=Limits(file_size_mb=1))
    assert r.verdict == "runtime_error" and "File too large" in r.error


# ---------------------------------------------------------------- the pool


def test_map_tests_keeps_order(pool):
    jobs = [{"code": f"def f(x):\n    return {k} * x\n", "tests": ["assert f(1) == 2"]}
            for k in (2, 3, 2, 2, 5, 2)]
    verdicts = [r.verdict for r in pool.map_tests(jobs)]
    assert verdicts == ["pass", "fail", "pass", "pass", "fail", "pass"]


def test_pool_is_thread_safe(pool):
    results: list[str] = []
    lock = threading.Lock()

    def work(k: int) -> None:
        for j in range(3):
            r = pool.run_tests(f"def f(x):\n    return x + {k * 10 + j}\n",
                               [f"assert f(0) == {k * 10 + j}"])
            with lock:
                results.append(r.verdict)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == ["pass"] * 15
    assert_idle_and_clean(pool)


def test_closed_pool_leaves_no_process():
    p = SandboxPool(workers=2, backend="bwrap")
    p.map_tests([{"code": DOUBLE, "tests": DOUBLE_TESTS}] * 2)
    pids = p.host_pids
    inner = [c.pid for pid in pids for c in psutil.Process(pid).children(recursive=True)]
    assert len(pids) == 2 and len(inner) == 2
    p.close()
    for pid in pids + inner:
        assert not psutil.pid_exists(pid)
    with pytest.raises(RuntimeError, match="closed"):
        p.run_tests(DOUBLE, DOUBLE_TESTS)


def test_bad_arguments():
    with pytest.raises(ValueError, match="backend"):
        SandboxPool(backend="qemu")
    with pytest.raises(ValueError, match="wall_s"):
        Limits(wall_s=0)
