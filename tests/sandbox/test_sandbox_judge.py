"""Verdict logic of the sandbox (pure: hand-built server observations, no processes)."""

from __future__ import annotations

import base64
import signal

import pytest

from agentrl.sandbox import Limits, SandboxResult
from agentrl.sandbox.judge import judge, make_job, parse_report


def b64(s: str) -> str:
    return base64.b64encode(s.encode()).decode()


def raw(report: str = "", *, stdout: str = "", exit_code=0, sig=None, timeout=False,
        output_limit=False, cpu_s=0.01) -> dict:
    return {"stdout": b64(stdout), "stderr": b64(""), "report": b64(report),
            "exit_code": exit_code, "signal": sig, "timeout": timeout,
            "output_limit": output_limit, "wall_s": 0.02, "cpu_s": cpu_s, "clean": True}


def job(n_tests: int = 2, mode: str = "tests") -> dict:
    # a test without runner-held expectations (`assert f(1) == 1` would be one: its pass also
    # needs an `E` report, tested in test_sandbox_redteam.py): only the tokens decide here
    j = make_job(mode, "def f(x): return x", ["r = f(1)\nassert r == 1"] * n_tests, "", "",
                 Limits(wall_s=2.0, cpu_s=2.0))
    return j


def passes(j: dict, *idx: int) -> str:
    lines = [f"C {j['tokens'][0]}"]
    for i in idx:
        lines += [f"T {i}", f"P {i} {j['tokens'][1 + i]}"]
    return "\n".join(lines) + "\n"


def test_tokens_are_random_per_run_and_per_test():
    a, b = job(3), job(3)
    assert len(a["tokens"]) == 4 and len(set(a["tokens"])) == 4
    assert not set(a["tokens"]) & set(b["tokens"])
    assert all(len(t) == 32 for t in a["tokens"])  # 16 random bytes, hex


def test_parse_report_unescapes_and_skips_blank_lines():
    data = b"F 0 AssertionError: a\\nb\n\nF 1 back\\\\slash\nD\n"
    assert parse_report(data) == [("F", "0 AssertionError: a\nb"), ("F", "1 back\\slash"),
                                  ("D", "")]


def test_all_tokens_valid_is_a_pass():
    j = job(2)
    r = judge(j, raw(passes(j, 0, 1) + "D\n"), None, "bwrap")
    assert isinstance(r, SandboxResult)
    assert (r.verdict, r.passed, r.total, r.error) == ("pass", 2, 2, None)
    assert r.pass_fraction == 1.0 and [t.name for t in r.tests] == ["test_0", "test_1"]


def test_wrong_token_duplicates_and_out_of_range_indices_do_not_count():
    j = job(2)
    report = (passes(j, 0) + "P 1 " + "0" * 32 + "\n"  # forged token for test 1
              + f"P 0 {j['tokens'][1]}\n"               # test 0 reported twice
              + f"P 2 {j['tokens'][1]}\nP x y\nD\n")      # no test 2; garbage
    r = judge(j, raw(report), None, "bwrap")
    assert (r.verdict, r.passed) == ("fail", 1)
    assert r.pass_fraction == 0.5  # 1 / 2


def test_token_of_another_test_does_not_count():
    j = job(2)
    report = passes(j, 0) + f"P 1 {j['tokens'][1]}\nD\n"  # test 0's token used for test 1
    assert judge(j, raw(report), None, "bwrap").passed == 1


def test_clean_exit_without_reports_is_a_runtime_error_not_a_pass():
    j = job(2)
    r = judge(j, raw("", exit_code=0), None, "bwrap")
    assert (r.verdict, r.passed) == ("runtime_error", 0)
    assert r.error == "process exited with status 0 while running the solution before the tests finished"
    assert [t.error for t in r.tests] == ["not run", "not run"]


def test_assertion_failures_are_fail_other_exceptions_runtime_error():
    j = job(2)
    fail = passes(j, 0) + "T 1\nF 1 AssertionError (at `assert f(1) == 2`)\nD\n"
    r = judge(j, raw(fail), ["a", "b"], "bwrap")
    assert (r.verdict, r.passed) == ("fail", 1)
    assert r.error == "b: AssertionError (at `assert f(1) == 2`)"
    crash = passes(j, 0) + "T 1\nF 1 TypeError: bad operand\nD\n"
    assert judge(j, raw(crash), None, "bwrap").verdict == "runtime_error"


def test_precedence_timeout_over_output_over_memory():
    j = job(2)
    mem = passes(j, 0) + "T 1\nF 1 MemoryError\n"
    assert judge(j, raw(mem + "D\n"), None, "b").verdict == "memory_limit"
    assert judge(j, raw(mem, output_limit=True), None, "b").verdict == "output_limit"
    r = judge(j, raw(mem, output_limit=True, timeout=True, exit_code=None, sig=9), None, "b")
    assert r.verdict == "timeout" and r.error == "wall time limit of 2 s exceeded"
    assert r.passed == 1 and r.tests[1].error == "MemoryError"


def test_cpu_limit_signals_are_timeouts():
    j = job(1)
    r = judge(j, raw("T 0\n", exit_code=None, sig=int(signal.SIGXCPU)), None, "b")
    assert r.verdict == "timeout" and "CPU" in r.error
    assert r.tests[0].error == "did not finish (killed by SIGXCPU)"
    r = judge(j, raw("T 0\n", exit_code=None, sig=int(signal.SIGKILL), cpu_s=2.5), None, "b")
    assert r.verdict == "timeout"
    r = judge(j, raw("T 0\n", exit_code=None, sig=int(signal.SIGSEGV)), None, "b")
    assert r.verdict == "runtime_error"
    assert r.error == "process killed by SIGSEGV during test_0 before the tests finished"


def test_syntax_and_module_errors():
    j = job(1)
    r = judge(j, raw("S SyntaxError: invalid syntax\n"), None, "b")
    assert (r.verdict, r.error) == ("syntax_error", "SyntaxError: invalid syntax")
    r = judge(j, raw("R ValueError: boom\n"), None, "b")
    assert (r.verdict, r.error) == ("runtime_error", "ValueError: boom")
    r = judge(j, raw("R MemoryError\n"), None, "b")
    assert r.verdict == "memory_limit"


def test_all_passed_then_killed_is_still_a_pass():
    # every test was reported with its token before the process died: the tests did pass
    j = job(1)
    assert judge(j, raw(passes(j, 0), exit_code=None, sig=9), None, "b").verdict == "pass"


def test_no_tests_needs_the_solution_token():
    j = job(0)
    assert judge(j, raw(passes(j) + "D\n"), None, "b").verdict == "pass"
    assert judge(j, raw("C forged\nD\n"), None, "b").verdict == "fail"  # forged: not a pass


def test_code_mode_exit_status_zero_is_success():
    j = job(0, mode="code")
    assert judge(j, raw("", exit_code=0), None, "b").verdict == "pass"
    assert judge(j, raw("", exit_code=1), None, "b").verdict == "runtime_error"
    assert judge(j, raw("S SyntaxError: x\n", exit_code=0), None, "b").verdict == "syntax_error"


def test_names_must_match():
    with pytest.raises(ValueError, match="names"):
        judge(job(2), raw(""), ["only"], "b")


def test_pass_fraction_without_tests():
    assert SandboxResult("pass", 0, 0).pass_fraction == 1.0
    assert SandboxResult("runtime_error", 0, 0).pass_fraction == 0.0
    assert SandboxResult("fail", 3, 4).pass_fraction == 0.75  # 3 / 4


def test_limits_validation():
    assert Limits().to_dict() == {"wall_s": 5.0, "cpu_s": 5.0, "memory_mb": 512, "max_procs": 32,
                                  "file_size_mb": 16, "output_bytes": 1 << 20}
    for field in ("wall_s", "cpu_s", "memory_mb", "max_procs", "file_size_mb", "output_bytes"):
        with pytest.raises(ValueError, match=field):
            Limits(**{field: 0})
    with pytest.raises(ValueError, match="mode"):
        make_job("shell", "", [], "", "", Limits())
