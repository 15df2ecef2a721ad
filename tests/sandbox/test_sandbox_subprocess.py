"""The last-resort ``subprocess`` backend: same verdicts and cleanup, plus its loud warning.

It is not isolated, so nothing here tries to escape or fork-bomb (as root, RLIMIT_NPROC is
not enforced outside a sandbox).
"""

from __future__ import annotations

import logging
import os

import psutil
import pytest

from agentrl.sandbox import Limits, SandboxPool, backends

DOUBLE = "def f(x):\n    return 2 * x\n"
TESTS = ["assert f(2) == 4", "assert f(3) == 6"]


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(workers=1, backend="subprocess") as p:
        yield p


def test_warns_once_that_it_is_not_isolated(caplog, monkeypatch):
    monkeypatch.setattr(backends, "_warned_unisolated", False)
    with caplog.at_level(logging.WARNING, logger="agentrl.sandbox.backends"):
        SandboxPool(workers=1, backend="subprocess").close()
        SandboxPool(workers=1, backend="subprocess").close()
    warnings = [r for r in caplog.records if "NOT isolated" in r.getMessage()]
    assert len(warnings) == 1


def test_verdicts(pool):
    assert pool.run_tests(DOUBLE, TESTS).verdict == "pass"
    r = pool.run_tests(DOUBLE.replace("2 * x", "x"), TESTS)
    assert r.verdict == "fail" and r.passed == 0
    r = pool.run_tests("while True: pass\n" + DOUBLE, TESTS, limits=Limits(wall_s=1.0))
    assert r.verdict == "timeout"
    assert pool.run_tests("import os; os._exit(0)\n" + DOUBLE, TESTS).verdict == "runtime_error"
    r = pool.run_tests("while True: print('A' * 1000)\n", [], limits=Limits(wall_s=2.0))
    assert r.verdict == "output_limit" and len(r.stdout) <= 1 << 20
    assert r.backend == "subprocess"


def test_leftover_processes_are_killed(pool):
    code = ("import os, subprocess\nsubprocess.Popen(['setsid', 'sleep', '304'])\n"
            "if os.fork() == 0:\n    os.setsid()\n    import time; time.sleep(305)\n" + DOUBLE)
    assert pool.run_tests(code, TESTS).verdict == "pass"
    (server,) = pool.host_pids
    assert psutil.Process(server).children(recursive=True) == []


def test_each_run_gets_a_fresh_private_directory(pool):
    first = pool.run_code("import os\nopen('f', 'w').write('x')\nprint(os.getcwd())")
    second = pool.run_code("import os\nprint(os.listdir('.'), os.path.exists(%r))"
                           % (first.stdout.strip() + "/f"))
    assert first.verdict == "pass" and second.stdout == "[] False\n"
    assert not first.stdout.startswith(os.getcwd())
