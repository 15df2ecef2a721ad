"""Issue 20 item 3-5: nothing of a run reaches the next run of the same worker, a run's TOTAL
memory and process count are capped, and pid 1 survives every signal the solution can send.

All on the real bubblewrap sandbox, one worker (so consecutive runs share it).
"""

from __future__ import annotations

import shutil
import signal

import pytest

from agentrl.sandbox import Limits, SandboxPool
from agentrl.sandbox import cgroup as run_cgroup

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(workers=1, backend="bwrap") as p:
        yield p


LIBC = "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
# what a run can see of earlier runs: /tmp entries other than its own work dir, POSIX queues,
# and keys in the uid's keyrings (user keyring search by description)
LOOK = LIBC + (
    "rt = ctypes.CDLL('librt.so.1', use_errno=True)\n"
    "tmp = sorted(set(os.listdir('/tmp')) - {os.path.basename(os.getcwd())})\n"
    "mq = rt.mq_open(b'/agentrl_q', os.O_RDWR, 0, None)\n"
    "key = libc.syscall(250, 10, ctypes.c_long(-4), b'user', b'agentrl_key', 0)\n"
    "print(tmp, os.listdir('/dev/mqueue'), mq, key)\n"
)
NOTHING = "[] [] -1 -1\n"

ATTACKS = {
    # deeper than PATH_MAX (4096): 6000 levels of 200-character names, the last one mode 000
    "deep_tree": ("import os\nos.chdir('/tmp')\nfor i in range(6000):\n    os.mkdir('d' * 200)\n"
                  "    os.chdir('d' * 200)\nopen('marker', 'w').write('x' * 4096)\nos.chmod('.', 0)\n"
                  "print('built')\n"),
    # many inodes, hidden names, a 0-mode directory, a file with no permissions
    "many_inodes": ("import os\nos.makedirs('/tmp/.h/\\n x')\nfor i in range(20000):\n"
                    "    open(f'/tmp/.h/\\n x/{i}', 'w').close()\n"
                    "open('/tmp/.h/locked', 'w').write('x')\nos.chmod('/tmp/.h/locked', 0)\n"
                    "os.chmod('/tmp/.h', 0)\nprint('built')\n"),
    # the whole tmpfs, until ENOSPC
    "fill_space": ("import os\nn = 0\ntry:\n    while True:\n"
                   "        with open(f'/tmp/f{n}', 'wb') as fh:\n            fh.write(b'x' * (8 << 20))\n"
                   "        n += 1\nexcept OSError as e:\n    assert e.errno == 28, e\nprint('built')\n"),
    # a POSIX message queue in the worker's IPC namespace
    "mqueue": (LIBC + "rt = ctypes.CDLL('librt.so.1', use_errno=True)\n"
               "assert rt.mq_open(b'/agentrl_q', os.O_CREAT | os.O_RDWR, 0o600, None) >= 0\n"
               "print('built')\n"),
    # a key in the user keyring (and one in the session keyring)
    "keyring": (LIBC + "for ring in (-4, -3):\n"
                "    k = libc.syscall(248, b'user', b'agentrl_key', b'secret', 6, ctypes.c_long(ring))\n"
                "    assert k > 0, ctypes.get_errno()\nprint('built')\n"),
    # a SysV message queue (already removed before issue 20; kept as a regression)
    "sysv_msg": (LIBC + "assert libc.msgget(0x1234, 0o1666) >= 0\nprint('built')\n"),
}


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_nothing_of_a_run_reaches_the_next(pool, attack):
    r = pool.run_code(ATTACKS[attack], limits=Limits(wall_s=30, cpu_s=30))
    assert r.verdict == "pass" and r.stdout == "built\n", r
    after = pool.run_code(LOOK)
    assert after.verdict == "pass" and after.stdout == NOTHING, (attack, after)
    if attack == "sysv_msg":
        after = pool.run_code(LIBC + "print(libc.msgget(0x1234, 0o666))")
        assert after.stdout == "-1\n"
    # an honest run that needs the whole /tmp still has it (space and inodes came back)
    honest = pool.run_tests("def f():\n    with open('/tmp/big', 'wb') as fh:\n"
                            "        fh.write(b'x' * (100 << 20))\n    return 1\n",
                            ["assert f() == 1"], limits=Limits(file_size_mb=128, wall_s=30))
    assert honest.verdict == "pass", honest
    assert pool.restarts == 0


def test_a_tree_that_cannot_be_wiped_in_time_restarts_the_sandbox(monkeypatch):
    """The wipe gives up at its deadline; the worker is then restarted (a fresh tmpfs)."""
    from agentrl.sandbox import backends

    # a 50 ms wipe budget (the only injected fault: the real server's source, one constant)
    monkeypatch.setattr(backends, "SERVER_SOURCE",
                        backends.SERVER_SOURCE.replace(b"WIPE_S = 2.0", b"WIPE_S = 0.05"))
    code = ("import os\nos.chdir('/tmp')\nfor i in range(20000):\n    os.mkdir('d')\n"
            "    os.chdir('d')\nprint('built')\n")
    with SandboxPool(workers=1, backend="bwrap") as p:
        r = p.run_code(code, limits=Limits(wall_s=30, cpu_s=30))
        assert r.stdout == "built\n", r
        assert p.run_code(LOOK).stdout == NOTHING
        assert p.restarts == 1


# -- C: pid 1 ignores every catchable signal ---------------------------------------------------

SIGNALS = sorted(s for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP))


def test_signals_to_pid_1_do_not_disturb_the_server(pool):
    code = ("import os, time\n"
            f"for s in {[int(s) for s in SIGNALS]}:\n"
            "    os.kill(1, s)\n"
            "time.sleep(0.3)\ndef f():\n    return 1\n")
    before = pool.restarts
    for _ in range(2):
        r = pool.run_tests(code, ["assert f() == 1"])
        assert r.verdict == "pass", r
    assert pool.restarts == before
    # the run still gets Python's usual dispositions: SIGINT -> KeyboardInterrupt, SIGPIPE
    # ignored, SIGTERM default (dies)
    r = pool.run_code("import signal as s\nprint(s.getsignal(s.SIGINT) is s.default_int_handler, "
                      "s.getsignal(s.SIGPIPE) == s.SIG_IGN, s.getsignal(s.SIGTERM) == s.SIG_DFL, "
                      "s.getsignal(s.SIGUSR1) == s.SIG_DFL)")
    assert r.stdout == "True True True True\n", r


def test_a_run_gets_python_s_dispositions_whatever_the_trainer_inherited():
    """A trainer started with SIGINT ignored (a shell's background job, `nohup ... &`) does not
    hand that to the code it tests: the run's SIGINT is still KeyboardInterrupt."""
    import subprocess
    import sys

    prog = ("from agentrl.sandbox import SandboxPool\n"
            "with SandboxPool(workers=1, backend='bwrap') as p:\n"
            "    r = p.run_code('import signal as s\\nprint(s.getsignal(s.SIGINT) is s.default_int_handler, '\n"
            "                   's.getsignal(s.SIGPIPE) == s.SIG_IGN, s.getsignal(s.SIGHUP) == s.SIG_DFL)')\n"
            "print(repr(r.stdout))\n")

    def ignore() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    out = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=120,
                         preexec_fn=ignore)
    assert out.stdout.strip() == repr("True True True\n"), out.stderr[-2000:]


# -- B: a run's total memory and process count --------------------------------------------------

cgroups = pytest.mark.skipif(run_cgroup.create() is None,
                             reason="no writable cgroup here (rlimit fallback, docs/sandbox.md)")

FORK_AND_TOUCH = ("import os, time\nkids = []\nfor i in range({n}):\n    pid = os.fork()\n"
                  "    if pid == 0:\n        b = bytearray({mb} << 20)\n"
                  "        for j in range(0, len(b), 4096):\n            b[j] = 1\n"
                  "        time.sleep(1)\n        os._exit(0)\n    kids.append(pid)\n"
                  "ok = 0\nfor pid in kids:\n    _, st = os.waitpid(pid, 0)\n"
                  "    ok += os.WIFEXITED(st) and os.WEXITSTATUS(st) == 0\n"
                  "print('survivors', ok)\ndef f():\n    return ok\n")


@cgroups
@pytest.mark.parametrize("n, mb, cap", [(7, 100, 256), pytest.param(7, 400, 512, marks=pytest.mark.slow)])
def test_total_memory_of_all_processes_is_capped(pool, n, mb, cap):
    """n processes touching mb MiB each under memory_mb=cap: at most cap // mb hold theirs at
    once; the run is reported as memory_limit (the per-process RLIMIT_AS alone let 7 x 400 MiB
    reach 2096 MiB under memory_mb=512)."""
    r = pool.run_tests(FORK_AND_TOUCH.format(n=n, mb=mb), [f"assert f() == {n}"],
                       limits=Limits(memory_mb=cap, wall_s=60, cpu_s=60))
    assert r.verdict == "memory_limit" and "together" in r.error, r
    survivors = int(r.stdout.split()[-1])
    assert survivors < n
    # under a cap that fits them all, the same program passes
    ok = pool.run_tests(FORK_AND_TOUCH.format(n=2, mb=mb), ["assert f() == 2"],
                        limits=Limits(memory_mb=2 * mb + 64, wall_s=60, cpu_s=60))
    assert ok.verdict == "pass", ok


@cgroups
def test_process_count_is_capped_per_run(pool):
    code = ("import os, time\nn = 0\ntry:\n    for i in range(50):\n        if os.fork() == 0:\n"
            "            time.sleep(2)\n            os._exit(0)\n        n += 1\nexcept OSError:\n"
            "    pass\nprint(n)\n")
    r = pool.run_code(code, limits=Limits(max_procs=5, wall_s=10))
    assert r.stdout == "4\n", r  # the run's own process + 4 children = max_procs
