"""Issue 20 item 6: edge cases of inputs and reports (huge sources, lone surrogates, a BOM,
bytes sources, unbounded limits)."""

from __future__ import annotations

import math
import shutil

import pytest

from agentrl.sandbox import Limits, SandboxPool

bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(workers=1, backend="bwrap") as p:
        yield p


@pytest.mark.parametrize("field,value", [
    ("wall_s", math.inf), ("cpu_s", 1e308), ("wall_s", math.nan), ("memory_mb", 2 ** 60),
    ("output_bytes", 10 ** 30), ("max_procs", True), ("file_size_mb", "16"), ("wall_s", -1),
])
def test_unbounded_or_bad_limits_are_rejected_at_construction(field, value):
    with pytest.raises(ValueError, match=f"Limits.{field}"):
        Limits(**{field: value})


def test_large_finite_limits_are_accepted():
    Limits(wall_s=3e7, cpu_s=3e7, memory_mb=2 ** 40, output_bytes=2 ** 40)


@bwrap
def test_bom_and_bytes_sources_run(pool):
    assert pool.run_tests("\ufeffdef f():\n    return 1\n", ["assert f() == 1"]).verdict == "pass"
    r = pool.run_tests(b"\xef\xbb\xbfdef f():\n    return 'caf\xc3\xa9'\n", [b"assert f() == 'caf\xc3\xa9'"])
    assert r.verdict == "pass", r
    assert pool.run_code(b"print(6 * 7)").stdout == "42\n"
    with pytest.raises(TypeError, match="code must be str or bytes"):
        pool.run_tests(42, [])  # type: ignore[arg-type]


@bwrap
def test_exception_with_lone_surrogates_is_reported(pool):
    r = pool.run_tests("def f():\n    raise ValueError('bad \\ud800 value')\n", ["f()"])
    assert r.verdict == "runtime_error", r
    assert r.tests[0].error.startswith("ValueError: bad \\ud800 value"), r.tests[0].error
    r = pool.run_tests("def f():\n    raise AssertionError('\\udfff')\n", ["f()"])
    assert r.verdict == "fail" and "did not finish" not in r.tests[0].error


@bwrap
def test_source_too_big_to_compile_is_memory_limit_not_syntax_error(pool):
    code = "x = 1\n" * ((10 << 20) // 6)  # 10 MB of statements, default 512 MiB
    r = pool.run_tests(code, ["assert x == 1"], limits=Limits(wall_s=60, cpu_s=60))
    assert (r.verdict, r.error) == ("memory_limit", "memory limit of 512 MiB exceeded")
