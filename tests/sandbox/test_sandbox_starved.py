"""Verdicts that do not depend on the machine's load: a run that the wall-clock limit stopped
while it was starved of CPU runs once more (`agentrl.sandbox.pool.starved_timeout`).

Starvation is injected with SIGSTOP on the run's processes (a stopped process, like one that
waits for a core on a loaded machine, accrues wall time and no CPU): load itself cannot be
made to starve one run reliably. Everything else is the real bwrap sandbox.
"""

from __future__ import annotations

import shutil
import threading
import time

import psutil
import pytest

from agentrl.sandbox import Limits, SandboxPool
from agentrl.sandbox.pool import STARVED_CPU_SHARE, fresh_tokens, starved_timeout

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")

SLOW_DOUBLE = "import time\ntime.sleep(0.2)\ndef f(x):\n    return 2 * x\n"
TESTS = ["assert f(2) == 4", "assert f(3) == 6"]
LIMITS = Limits(wall_s=1.0, cpu_s=1.0)


def _descendants(pool: SandboxPool) -> set[int]:
    out = set()
    for pid in pool.host_pids:
        try:
            out |= {c.pid for c in psutil.Process(pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            pass
    return out


def _stall_next_run(pool: SandboxPool, hold_s: float) -> threading.Thread:
    """Start a thread that SIGSTOPs the processes of the pool's next run as soon as they
    appear, holds them `hold_s` seconds (past the wall limit), then SIGCONTs what is left."""
    idle = _descendants(pool)  # the servers (and their bwrap parents)

    def stall() -> None:
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            new = [psutil.Process(p) for p in _descendants(pool) - idle if psutil.pid_exists(p)]
            if new:
                for p in new:
                    p.suspend()
                time.sleep(hold_s)
                for p in new:
                    try:
                        p.resume()
                    except psutil.NoSuchProcess:  # killed at the wall limit, as expected
                        pass
                return
            time.sleep(0.002)

    t = threading.Thread(target=stall, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize("retry", [True, False])
def test_a_starved_run_is_run_again_and_passes(retry):
    with SandboxPool(workers=1, backend="bwrap", retry_starved=retry) as pool:
        assert pool.run_tests(SLOW_DOUBLE, TESTS, limits=LIMITS).verdict == "pass"  # warm
        t = _stall_next_run(pool, hold_s=LIMITS.wall_s + 1.0)
        r = pool.run_tests(SLOW_DOUBLE, TESTS, limits=LIMITS)
        t.join()
        if retry:  # the stalled first run timed out; the second, not stalled, passed
            assert (r.verdict, r.passed, r.retried, pool.starved_retries) == ("pass", 2, True, 1)
        else:  # the verdict of before: the load decided it
            assert (r.verdict, r.retried, pool.starved_retries) == ("timeout", False, 0)
            assert r.error == "wall time limit of 1 s exceeded"


def test_sleepers_time_out_twice_cpu_limited_loops_once():
    with SandboxPool(workers=1, backend="bwrap") as pool:
        r = pool.run_code("import time; time.sleep(30)", limits=Limits(wall_s=0.5))
        assert (r.verdict, r.retried, pool.starved_retries) == ("timeout", True, 1)
        r = pool.run_tests("while True: pass\n", [], limits=Limits(wall_s=10.0, cpu_s=1.0))
        assert r.verdict == "timeout" and "CPU" in r.error and not r.retried
        assert pool.starved_retries == 1


def test_starved_timeout_hand_values():
    lim = {"wall_s": 2.0, "cpu_s": 5.0}  # room: min(2, 5) = 2 s, starved below 0.1 * 2 = 0.2 s
    assert STARVED_CPU_SHARE == 0.1
    assert starved_timeout({"timeout": True, "cpu_s": 0.1}, lim)
    assert not starved_timeout({"timeout": True, "cpu_s": 0.2}, lim)
    assert not starved_timeout({"timeout": False, "cpu_s": 0.0}, lim)  # no wall-clock timeout
    assert starved_timeout({"timeout": True, "cpu_s": 0.0, "exit_code": None}, lim)  # unanswered
    lim = {"wall_s": 10.0, "cpu_s": 1.0}  # room 1 s: starved below 0.1 s
    assert starved_timeout({"timeout": True, "cpu_s": 0.05}, lim)
    assert not starved_timeout({"timeout": True, "cpu_s": 0.15}, lim)


def test_fresh_tokens_renews_split_secrets_only():
    split = {"split": True, "tokens": ["a" * 32, "b" * 32], "code": "x"}
    again = fresh_tokens(split)
    assert len(again["tokens"]) == 2 and all(len(t) == 32 for t in again["tokens"])
    assert set(again["tokens"]).isdisjoint(split["tokens"]) and again["code"] == "x"
    one = {"split": False, "tokens": ["m0", "m1"]}
    assert fresh_tokens(one) is one
