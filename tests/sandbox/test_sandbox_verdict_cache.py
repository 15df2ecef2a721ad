"""The pool's verdict cache (`SandboxPool(cache_size=...)`, `run_tests(..., cache=True)`): the
same job is judged once, its twins (asked later, or at the same time from other threads) get
that verdict; what may differ next time (a sandbox failure, a load-dependent timeout) or is large
is not kept. Real bwrap sandbox; runs are counted by wrapping the pool's own `_run`."""

from __future__ import annotations

import shutil
import threading

import pytest

from agentrl.sandbox import Limits, SandboxPool, SandboxResult, TestOutcome
from agentrl.sandbox.pool import CACHE_MAX_OUTPUT, cacheable, job_key

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")

DOUBLE = "def f(x):\n    return 2 * x\n"
WRONG = "def f(x):\n    return x + 2\n"
TESTS = ["assert f(2) == 4", "assert f(3) == 6"]


def counting(pool: SandboxPool) -> list[int]:
    """Count the pool's real runs (`_run` calls) in the returned one-item list."""
    runs = [0]
    inner = pool._run

    def run(job, names):
        runs[0] += 1
        return inner(job, names)

    pool._run = run  # type: ignore[method-assign]
    return runs


@pytest.fixture
def pool():
    with SandboxPool(workers=2, backend="bwrap", cache_size=16) as p:
        yield p


def test_twin_answered_from_cache_with_same_verdict(pool):
    runs = counting(pool)
    first = pool.run_tests(WRONG, TESTS, cache=True)
    second = pool.run_tests(WRONG, TESTS, cache=True)
    assert runs[0] == 1 and pool.cache_hits == 1
    assert (first.verdict, first.passed, first.total) == ("fail", 1, 2)
    assert not first.cached and second.cached
    assert [(t.name, t.passed, t.error) for t in second.tests] == [(t.name, t.passed, t.error) for t in first.tests]
    second.tests[1].passed = True  # a caller's edit does not reach the cache
    assert not pool.run_tests(WRONG, TESTS, cache=True).tests[1].passed


def test_anything_that_decides_the_verdict_is_in_the_key(pool):
    runs = counting(pool)
    pool.run_tests(DOUBLE, TESTS, cache=True)
    pool.run_tests(DOUBLE + "\n", TESTS, cache=True)  # another source
    pool.run_tests(DOUBLE, TESTS[:1], cache=True)  # other tests
    pool.run_tests(DOUBLE, TESTS, names=["a", "b"], cache=True)  # other names
    pool.run_tests(DOUBLE, TESTS, limits=Limits(wall_s=4.0), cache=True)  # other limits
    pool.run_tests(DOUBLE, TESTS, setup="X = 1", cache=True)  # other setup
    pool.run_tests(DOUBLE, TESTS, force_split=True, cache=True)  # split run
    pool.run_tests(DOUBLE, TESTS, cache=True, cache_scope=7)  # another scope (a reset seed)
    pool.run_tests(DOUBLE, TESTS, cache=True, cache_scope="7")  # a str scope is another scope
    assert runs[0] == 9 and pool.cache_hits == 0
    assert pool.run_tests(DOUBLE.encode(), TESTS, cache=True).cached  # bytes run as the same text
    assert pool.run_tests(DOUBLE, TESTS, cache=True, cache_scope=7).cached  # the same scope


def test_cache_false_runs_and_leaves_the_cache_alone(pool):
    runs = counting(pool)
    assert not pool.run_tests(DOUBLE, TESTS).cached  # the default: no cache
    assert not pool.run_tests(DOUBLE, TESTS).cached
    assert runs[0] == 2 and not pool._cache
    pool.run_tests(DOUBLE, TESTS, cache=True)
    assert not pool.run_tests(DOUBLE, TESTS, cache=False).cached and runs[0] == 4


def test_concurrent_twins_run_once():
    slow = "import time\ntime.sleep(0.4)\n" + DOUBLE
    with SandboxPool(workers=2, backend="bwrap", cache_size=8) as pool:
        runs = counting(pool)
        out: list[SandboxResult] = []
        threads = [threading.Thread(target=lambda: out.append(pool.run_tests(slow, TESTS, cache=True)))
                   for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert runs[0] == 1 and pool.cache_hits == 3
        assert sorted(r.cached for r in out) == [False, True, True, True]
        assert {r.verdict for r in out} == {"pass"}
        assert not pool._inflight


def test_twins_of_an_uncacheable_run_run_side_by_side():
    """A twin waits for the run in flight; when that verdict is not kept (here a timeout of a
    program that sleeps: it may pass next time) the waiting twins run together, not one after
    another (3 twins of a 1 s run took 3 s in a row, which a group of 8 slow answers turned
    into a step past the agent loop's step timeout)."""
    sleeper = "import time\ntime.sleep(30)\n" + DOUBLE
    limits = Limits(wall_s=1.0, cpu_s=1.0)
    with SandboxPool(workers=3, backend="bwrap", cache_size=8, retry_starved=False) as pool:
        inner, lock, active, most = pool._run, threading.Lock(), [0], [0]

        def run(job, names):  # the most runs at once
            with lock:
                active[0] += 1
                most[0] = max(most[0], active[0])
            try:
                return inner(job, names)
            finally:
                with lock:
                    active[0] -= 1

        pool._run = run  # type: ignore[method-assign]
        out: list[SandboxResult] = []
        threads = [threading.Thread(target=lambda: out.append(pool.run_tests(sleeper, TESTS, limits=limits,
                                                                             cache=True)))
                   for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert [r.verdict for r in out] == ["timeout"] * 3 and not any(r.cached for r in out)
        assert most[0] == 2  # the first alone, then its two waiting twins together
        assert not pool._inflight and not pool._cache


def test_sandbox_error_is_run_again(pool):
    inner, runs = pool._run, [0]

    def failing_once(job, names):  # injects the sandbox's own failure, once
        runs[0] += 1
        if runs[0] == 1:
            return SandboxResult("sandbox_error", 0, len(job["tests"]), error="injected")
        return inner(job, names)

    pool._run = failing_once
    assert pool.run_tests(DOUBLE, TESTS, cache=True).verdict == "sandbox_error"
    again = pool.run_tests(DOUBLE, TESTS, cache=True)
    assert (again.verdict, again.cached, runs[0]) == ("pass", False, 2)
    assert pool.run_tests(DOUBLE, TESTS, cache=True).cached


def test_a_raising_run_frees_its_twins(pool):
    def boom(job, names):
        raise RuntimeError("injected")

    pool._run = boom
    with pytest.raises(RuntimeError):
        pool.run_tests(DOUBLE, TESTS, cache=True)
    assert not pool._inflight and not pool._cache


def test_least_recently_used_is_evicted():
    with SandboxPool(workers=1, backend="bwrap", cache_size=2) as pool:
        runs = counting(pool)
        a, b, c = (f"def f(x):\n    return 2 * x  # {i}\n" for i in range(3))
        pool.run_tests(a, TESTS, cache=True)
        pool.run_tests(b, TESTS, cache=True)
        pool.run_tests(a, TESTS, cache=True)  # a is now the most recent
        pool.run_tests(c, TESTS, cache=True)  # evicts b
        assert runs[0] == 3 and len(pool._cache) == 2
        assert pool.run_tests(a, TESTS, cache=True).cached
        assert not pool.run_tests(b, TESTS, cache=True).cached and runs[0] == 4


def test_cpu_bound_timeout_is_cached_and_large_output_is_not(pool):
    limits = Limits(wall_s=1.0, cpu_s=1.0)
    loop = "while True:\n    pass\n" + DOUBLE
    first = pool.run_tests(loop, TESTS, limits=limits, cache=True)
    assert first.verdict == "timeout" and first.cpu_s >= 0.8
    assert pool.run_tests(loop, TESTS, limits=limits, cache=True).cached
    loud = f"print('x' * {CACHE_MAX_OUTPUT})\n" + DOUBLE
    assert pool.run_tests(loud, TESTS, cache=True).verdict == "pass"
    assert not pool.run_tests(loud, TESTS, cache=True).cached
    # no output, but 40 failing tests with 490-character messages: ~33 000 characters of error text
    many = [f"assert f({i}) == -1, '{'x' * 490}'" for i in range(40)]
    wordy = pool.run_tests(DOUBLE, many, cache=True)
    assert wordy.verdict == "fail" and not wordy.stdout + wordy.stderr
    assert not pool.run_tests(DOUBLE, many, cache=True).cached


def test_cacheable_by_hand():
    lim = Limits(wall_s=2.0, cpu_s=5.0)  # a run could use at most min(2, 5) = 2 CPU seconds

    def res(verdict, cpu_s=0.0, stdout=""):
        return SandboxResult(verdict, 0, 1, stdout=stdout, cpu_s=cpu_s)

    assert cacheable(res("fail"), lim) and cacheable(res("memory_limit"), lim)
    assert not cacheable(res("sandbox_error"), lim)
    assert cacheable(res("timeout", cpu_s=1.6), lim)  # 0.8 x 2 s: a CPU-bound loop
    assert not cacheable(res("timeout", cpu_s=1.59), lim)  # slept, blocked or starved
    assert cacheable(res("pass", stdout="x" * CACHE_MAX_OUTPUT), lim)
    assert not cacheable(res("pass", stdout="x" * (CACHE_MAX_OUTPUT + 1)), lim)
    wordy = SandboxResult("fail", 0, 1, tests=[TestOutcome("t", False, "x" * CACHE_MAX_OUTPUT)])
    assert not cacheable(wordy, lim)  # the error texts count too


def test_job_key_and_bad_arguments():
    lim = Limits()
    assert job_key(DOUBLE, TESTS, "", None, lim, False) == job_key(DOUBLE.encode(), TESTS, "", None, lim, False)
    assert job_key("\ufeff" + DOUBLE, TESTS, "", None, lim, False) == job_key(DOUBLE, TESTS, "", None, lim, False)
    assert job_key(DOUBLE, TESTS, "", None, lim, False) != job_key(DOUBLE, TESTS, "", None, lim, True)
    with pytest.raises(TypeError, match="code must be str or bytes"):
        job_key(5, TESTS, "", None, lim, False)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="cache_scope"):
        job_key(DOUBLE, TESTS, "", None, lim, False, 1.5)  # type: ignore[arg-type]
    assert job_key(DOUBLE, TESTS, "", None, lim, False, None) == job_key(DOUBLE, TESTS, "", None, lim, False)
    with pytest.raises(ValueError, match="cache_size"):
        SandboxPool(workers=1, backend="bwrap", cache_size=-1)
