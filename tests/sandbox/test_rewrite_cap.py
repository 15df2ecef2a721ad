"""Issue 42, item 12: the test rewriter refuses a test over its size cap at once, and a big
test being rewritten does not hold other threads' rewrites (only `ast.parse` is serialised)."""

from __future__ import annotations

import threading
import time

import pytest

from agentrl.sandbox import Limits
from agentrl.sandbox.judge import make_job
from agentrl.sandbox.rewrite import MAX_TEST_CHARS, TestTooLarge, rewrite_test
from agentrl_envs.code_datasets import CodeTask
from agentrl_envs.code_sandbox import CodeSandboxEnv


def _big(n: int, salt: str = "") -> str:
    return "".join(f"assert f({i}) == {i + 1}{salt}\n" for i in range(n))


def test_a_2_3_mb_test_is_refused_at_once():
    big = _big(95_000)
    assert len(big) > 2_300_000
    t0 = time.perf_counter()
    with pytest.raises(TestTooLarge, match="over the cap of 524,288"):
        rewrite_test(big)
    with pytest.raises(ValueError, match="over the cap"):
        make_job("tests", "def f(x):\n    return x + 1\n", ["assert f(1) == 2", big], "", "", Limits())
    assert time.perf_counter() - t0 < 0.5
    ok = _big(100)
    assert len(rewrite_test(ok).sites) == 100  # under the cap: rewritten as before
    assert len("x" * MAX_TEST_CHARS) == MAX_TEST_CHARS and rewrite_test("x" * MAX_TEST_CHARS).source


def test_the_env_records_a_too_large_test_as_a_sandbox_error():
    task = CodeTask(task_id="big", prompt="f", entry_point="f", tests=[_big(95_000)],
                    solution="def f(x):\n    return x + 1\n")
    env = CodeSandboxEnv()
    env.reset(options={"task": task})
    _, reward, _, _, info = env.step("def f(x):\n    return x + 1\n")
    assert info["verdict"] == "sandbox_error" and "over the cap" in info["error"], info
    assert reward == 0.0


def test_a_big_rewrite_does_not_hold_a_small_one():
    big = _big(3_000, salt=" ")  # ~70 KB, under the cap; fresh source (not cached)
    times: dict[str, float] = {}

    def run(name: str, src: str) -> None:
        t0 = time.perf_counter()
        rewrite_test(src)
        times[name] = time.perf_counter() - t0
        times[name + "_end"] = time.perf_counter()

    a = threading.Thread(target=run, args=("big", big))
    a.start()
    time.sleep(0.15)  # the big one is under way
    run("small", "assert f(7) == 8  # small, fresh\n")
    a.join()
    assert times["small_end"] < times["big_end"], times  # done while the big one still ran
    assert times["small"] < 0.25 * times["big"], times
    print(f"big rewrite {times['big']:.2f} s, small one meanwhile {times['small'] * 1e3:.1f} ms")
