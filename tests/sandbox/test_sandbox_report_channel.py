"""Issue 42, items 4, 7 and 13, on the REAL bubblewrap sandbox: what the solution writes to the
report pipe of a one-process run or of `run_code` cannot forge an infrastructure error, crash
the runner or turn a crash into a pass; an OOM kill inside the run is never a pass; and the
sandbox shows no host details (no third-party packages, a fixed hostname, a neutral pid 1).
"""

from __future__ import annotations

import base64
import shutil
import socket
import sys

import pytest

from agentrl.sandbox import Limits, SandboxPool
from agentrl.sandbox import cgroup as run_cgroup
from agentrl.sandbox.backends import SANDBOX_HOSTNAME
from agentrl.sandbox.judge import judge, make_job

bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")

F = "def f(x):\n    return x + 1\n"
TESTS = ["assert f(1) == 2", "assert f(2) == 3"]  # runner-decided: one process
BIG = "9" * 5000


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(workers=1, backend="bwrap") as p:
        yield p


def _write_report(*lines: str, then: str = "") -> str:
    body = "".join(f"os.write(3, {(line + chr(10)).encode()!r})\n" for line in lines)
    return "import os\n" + body + then


# -- item 4: forged report lines --------------------------------------------------------------

@bwrap
@pytest.mark.parametrize("mode", ["tests", "code"])
def test_a_forged_setup_failure_is_not_a_sandbox_error(pool, mode):
    code = _write_report("X child setup failed: forged", then=F + "os._exit(70)\n")
    r = (pool.run_tests(code, TESTS) if mode == "tests" else pool.run_code(code))
    assert r.verdict == "runtime_error" and "sandbox" not in (r.error or ""), r
    assert "exited with status 70" in r.error
    # written without dying: the forged line is ignored and the honest rest decides
    code = _write_report("X child setup failed: forged", then=F)
    assert pool.run_tests(code, TESTS).verdict == "pass"
    assert pool.run_code(code).verdict == "pass"


@bwrap
def test_the_status_channel_is_closed_before_job_code_runs(pool):
    r = pool.run_code("import os\nprint(sorted(int(x) for x in os.listdir('/proc/self/fd')))")
    fds = eval(r.stdout)  # noqa: S307 - a list of ints printed by the sandbox
    assert 7 not in fds and fds[:4] == [0, 1, 2, 3], fds  # 3: the report pipe; the listdir fd


@bwrap
@pytest.mark.parametrize("line", [f"P {BIG} m1", f"E {BIG} 0 2", f"E 0 {BIG} 2", f"T {BIG}",
                                  f"F 0 AssertionError @L{BIG}", f"F {BIG} x"],
                         ids=["P", "E-test", "E-site", "T", "F-line", "F-test"])
def test_a_huge_report_index_never_raises(pool, line):
    r = pool.run_tests(_write_report(line, then=F), TESTS)
    if line.startswith("F 0"):  # a failure the solution reports about itself: its own doing
        assert r.verdict == "fail" and r.passed == 1 and r.tests[0].error.startswith("AssertionError @L999"), r
    else:  # ignored; the honest run decides
        assert r.verdict == "pass" and r.passed == 2, r
    r = pool.run_tests(_write_report(line, then="def f(x):\n    return 0\n"), TESTS)
    assert r.verdict == "fail", r
    r = pool.run_code(_write_report(line, then="print('hi')\n"))
    assert r.verdict == "pass" and r.stdout == "hi\n", r


@bwrap
@pytest.mark.parametrize("crash", ["os._exit(3)", "os.kill(os.getpid(), 9)", "raise SystemExit(2)"])
def test_run_code_done_marker_then_crash_is_not_a_pass(pool, crash):
    r = pool.run_code(_write_report("C m0", "D", then=crash + "\n"))
    assert r.verdict == "runtime_error", r


def test_only_the_status_pipe_makes_a_sandbox_error():
    j = make_job("code", "", [], "", "", Limits())
    raw = {"stdout": "", "stderr": "", "report": base64.b64encode(b"X forged\n").decode(),
           "exit_code": 70, "signal": None, "timeout": False, "output_limit": False}
    assert judge(j, raw, None, "b").verdict == "runtime_error"
    raw["setup_error"] = "X child setup failed: OSError(24)"
    r = judge(j, raw, None, "b")
    assert r.verdict == "sandbox_error" and r.error == "sandbox child setup failed: child setup failed: OSError(24)"


# -- item 7: an OOM kill inside the run --------------------------------------------------------

def test_oom_kill_turns_a_pass_into_memory_limit():
    j = make_job("tests", "", ["r = f(1)\nassert r == 1"], "", "", Limits(memory_mb=64))
    report = f"C {j['tokens'][0]}\nT 0\nP 0 {j['tokens'][1]}\nD\n"
    raw = {"stdout": "", "stderr": "", "report": base64.b64encode(report.encode()).decode(),
           "exit_code": 0, "signal": None, "timeout": False, "output_limit": False}
    assert judge(j, raw, None, "b").verdict == "pass"
    r = judge(j, {**raw, "oom_kill": True}, None, "b")
    assert r.verdict == "memory_limit" and "64 MiB" in r.error and r.passed == 1
    jc = make_job("code", "", [], "", "", Limits())
    rawc = {**raw, "report": base64.b64encode(b"C m0\nD\n").decode(), "oom_kill": True}
    assert judge(jc, rawc, None, "b").verdict == "memory_limit"


# a helper process is OOM-killed by the run's cgroup while the solution's own answer is right
OOM_HELPER = ("import os, time\nkids = []\nfor i in range(4):\n    pid = os.fork()\n"
              "    if pid == 0:\n        b = bytearray(90 << 20)\n"
              "        for j in range(0, len(b), 4096):\n            b[j] = 1\n"
              "        time.sleep(0.5)\n        os._exit(0)\n    kids.append(pid)\n"
              "for pid in kids:\n    os.waitpid(pid, 0)\n" + F)


@bwrap
@pytest.mark.skipif(run_cgroup.create() is None,
                    reason="no writable cgroup here: no OOM killer per run (rlimit fallback, docs/sandbox.md)")
def test_a_real_cgroup_oom_kill_is_not_a_pass(pool):
    r = pool.run_tests(OOM_HELPER, TESTS, limits=Limits(memory_mb=200, wall_s=30, cpu_s=30))
    assert r.verdict == "memory_limit" and "killed" in r.error, r
    assert r.passed == 2  # the tests themselves passed: only the OOM kill fails the run
    r = pool.run_code(OOM_HELPER, limits=Limits(memory_mb=200, wall_s=30, cpu_s=30))
    assert r.verdict == "memory_limit", r


# -- item 13: no host details inside ----------------------------------------------------------

@bwrap
@pytest.mark.parametrize("module", ["torch", "numpy", "pytest"])
def test_host_packages_are_not_importable_inside(pool, module):
    __import__(module)  # installed on the host
    code = ("import sys, glob\n"
            "sys.path += glob.glob(sys.prefix + '/lib/python3*/site-packages')\n"
            "sys.path += glob.glob('/usr/lib/python3*/dist-packages')\n"
            "sys.path += glob.glob('/usr/local/lib/python3*/*-packages')\n"
            f"import {module}\n")
    r = pool.run_code(code)
    assert r.verdict == "runtime_error" and f"No module named '{module}'" in r.error, r
    r = pool.run_code("import sys, glob\nprint(any('-packages' in p for p in sys.path),"
                      " glob.glob(sys.prefix + '/lib/python3*/site-packages/*'))")
    assert r.stdout == "False []\n", r


@bwrap
def test_hostname_and_pid_1_name_no_host_detail(pool):
    r = pool.run_code("import socket\nprint(socket.gethostname())\n"
                      "print(open('/proc/1/cmdline', 'rb').read().split(b'\\0')[0].decode())")
    name, exe = r.stdout.split()
    assert name == SANDBOX_HOSTNAME != socket.gethostname()
    assert exe == "/sandbox/bin/python3" and sys.base_prefix not in exe
