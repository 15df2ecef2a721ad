"""One-process runs (issue 20, throughput): a ``run_tests`` job whose every test is decided by
runner-held sites runs the tests in the solution's process; every other job is split in two.

The rule (``rewrite._runner_decided``, ``judge.one_process_safe``) is checked on hand-made
tests; the attacks of ``_redteam_attacks`` and attacks aimed at the one-process harness itself
(reports written straight to its report pipe, its reporting function patched through ``gc``)
get no pass on the REAL sandbox; and honest verdicts are the same in one process and in two
on built-in tasks.
"""

from __future__ import annotations

import shutil

import pytest
from _redteam_attacks import ATTACKS

from agentrl.sandbox import Limits, SandboxPool
from agentrl.sandbox.judge import make_job, one_process_safe
from agentrl.sandbox.rewrite import rewrite_test
from agentrl_envs.code_sandbox import CodeSandboxEnv

bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")

HUMANEVAL_STYLE = ("METADATA = {'author': 'x'}\n\ndef check(candidate):\n"
                   "    assert candidate(1) == 2\n    assert not candidate(0)\n\ncheck(f)\n")


@pytest.mark.parametrize("test, setup, names, safe", [
    ("assert f(1) == 2", "", ("f",), True),
    ("assert f(1) == 2, 'message'", "", ("f",), True),
    ("assert f(1) == 2\nassert not g(3)\nassert g(4)", "", ("f", "g"), True),
    (HUMANEVAL_STYLE, "", ("f",), True),
    ("def check(c):\n    assert c(1) == 2\ncheck(f)\ncheck(g)", "", ("f", "g"), True),
    ("assert f([1, 2], g(3)) == 2", "", ("f",), True),  # arguments: the solution picks f's result
    ("import math\nassert f(1) == 2", "", ("f",), True),
    # trusted code computes the reported value from the solution's result: split
    ("assert len(f(1)) == 3", "", ("len",), False),
    ("assert sorted(f(1)) == [1]", "", ("sorted",), False),
    ("assert h(f(1)) == True", "def h(x):\n    return x\n", ("h",), False),
    ("assert f(1) == 2", "from fractions import Fraction as f", ("f",), False),
    ("def check(c):\n    assert c(1) == 2\ncheck(len)", "", ("len",), False),
    ("import math\nassert math.isclose(f(1), 2)", "", None, False),
    ("assert f(1)[0] == 2", "", None, False),
    # anything but sites and inert statements can fail the test: split
    ("assert f(2) == 2 * 2", "", None, False),
    ("for i in range(3):\n    assert f(i) == i", "", None, False),
    ("x = f(1)\nassert x == 3", "", None, False),
    ("assert abs(f(1) - 2) < 1e-6", "", None, False),
    ("def f(x):\n    return 1\nassert f(1) == 1", "", None, False),  # the test binds f
    ("def check(c):\n    assert c(1) == 2\n    for i in range(2):\n        assert c(i) == i\n"
     "check(f)", "", None, False),
    ("def check(c=f(1)):\n    assert c(1) == 2\ncheck(f)", "", None, False),
    ("@staticmethod\ndef check(c):\n    assert c(1) == 2\ncheck(f)", "", None, False),
    ("check(f)\ndef check(c):\n    assert c(1) == 2", "", None, False),  # call before def
    ("from math import isclose", "", None, False),  # no site at all
    ("assert f(1) == 2", "import (", ("f",), False),  # setup that does not parse
    # found by a red-team review: names bound out of the rule's sight (a star import, `match`,
    # `globals()`, a walrus) let the solution stand in for trusted code
    ("assert isclose(f(0.5), 0.5)", "from math import *", ("isclose",), False),
    ("assert isclose(f(0.5), 0.5)", "import math\nmatch math.isclose:\n    case isclose:\n        pass",
     ("isclose",), False),
    ("assert isclose(f(0.5), 0.5)", "import math\nglobals()['isclose'] = math.isclose", ("isclose",), False),
    ("assert f(1) == 2", "import math\nfrom math import sqrt", ("f",), True),
    ("from math import *\nassert isclose(f(0.5), 0.5)", "", None, False),
    ("import operator\ndef check(candidate):\n    assert candidate((same := operator.eq) and 1) == 1\n"
     "    assert same(candidate(2), 4)\ncheck(square)", "", None, False),
])
def test_which_tests_may_run_in_one_process(test, setup, names, safe):
    rw = rewrite_test(test)
    assert rw.decided_by == names
    assert one_process_safe([rw], setup) is safe


def test_one_unsafe_test_splits_the_whole_job():
    job = make_job("tests", "", ["assert f(1) == 2", "assert f(2) == 2 * 2"], "", "", Limits())
    assert job["split"] is True
    assert all(len(t) == 32 for t in job["tokens"])  # per-run secrets
    job = make_job("tests", "", ["assert f(1) == 2", "assert f(2) == 4"], "", "", Limits())
    assert job["split"] is False
    assert job["tokens"] == ["m0", "m1", "m2"]  # plain markers: nothing secret in one process
    assert make_job("tests", "", ["assert f(1) == 2"], "", "", Limits(), True)["split"] is True
    assert make_job("tests", "", [], "", "", Limits())["split"] is True
    assert make_job("code", "print(1)", [], "", "", Limits())["split"] is False


def test_builtin_tasks_run_in_one_process():
    env = CodeSandboxEnv()
    for task in env.tasks("train")[:50] + env.tasks("test")[:50]:
        job = make_job("tests", task.solution, list(task.tests), task.setup or "", "", Limits())
        assert job["split"] is False, task.tests


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(workers=2, backend="bwrap") as p:
        yield p


# Attacks on the one-process harness itself: it shares the process, so the solution can reach
# its report pipe, its frames and its functions.
_REPORT_ALL = ("import os\n"
               "def {entry}(*a, **k):\n"
               "    for i in range(8):\n"
               "        for s in range(8):\n"
               "            for v in ('true', '0', '1', '\"\"', '[]', 'null'):\n"
               "                os.write(3, f'E {{i}} {{s}} {{v}}\\n'.encode())\n"
               "        os.write(3, f'P {{i}} m{{i + 1}}\\n'.encode())\n"
               "    os.write(3, b'C m0\\nD\\n')\n"
               "    os._exit(0)\n")
_PATCH_REPORTER = ("import gc\n"
                   "for o in gc.get_objects():\n"
                   "    if type(o).__name__ == 'function' and o.__name__ == '_rep_expect':\n"
                   "        _orig = o.__code__\n"
                   "        o.__defaults__ = (1 << 18,)\n"
                   "        o.__globals__['_enc'] = lambda v, *a, **k: True\n"
                   "def {entry}(*a, **k):\n    return None\n")
ONE_PROCESS_ATTACKS = {**ATTACKS, "report_every_value": _REPORT_ALL,
                       "patch_reporter_encoding": _PATCH_REPORTER}


@bwrap
@pytest.mark.parametrize("attack", sorted(ONE_PROCESS_ATTACKS))
def test_attacks_get_no_pass_in_one_process(pool, attack):
    """Built-in tasks (one process) of several families: the reference passes, no attack does."""
    env = CodeSandboxEnv(pool=pool)
    for task in env.tasks("train")[:3]:
        job = make_job("tests", task.solution, list(task.tests), "", "", Limits())
        assert job["split"] is False
        env.reset(options={"task": task})
        code = ONE_PROCESS_ATTACKS[attack].replace("{entry}", task.entry_point)
        _, reward, _, _, info = env.step(code)
        assert reward == 0.0 and info["verdict"] != "pass", (attack, task.entry_point, info)


@bwrap
def test_truthy_sites_cannot_be_forged_with_a_trusted_wrapper(pool):
    """`assert math.isclose(f(1), 2)` reports isclose's result, so it runs split: a solution
    that patches math.isclose (or writes reports) fails; the honest one passes."""
    tests = ["import math\nassert math.isclose(f(1.0), 2.0)", "assert len(f([1, 2])) == 2"]
    cheat = ("import math, builtins, os\nmath.isclose = lambda *a, **k: True\n"
             "builtins.len = lambda *a: 2\n"
             "def f(x):\n    os.write(3, b'E 0 0 true\\nP 0 m1\\nE 1 0 2\\nP 1 m2\\nD\\n')\n"
             "    return None\n")
    assert make_job("tests", cheat, tests, "", "", Limits())["split"] is True
    r = pool.run_tests(cheat, tests)
    assert r.verdict != "pass" and r.passed == 0, r
    honest = "def f(x):\n    return 2 * x if type(x) is float else x\n"
    assert pool.run_tests(honest, tests).verdict == "pass"


@bwrap
def test_one_process_and_two_processes_agree_on_honest_and_wrong_solutions(pool):
    """The same verdict and pass count either way, on references and on wrong answers."""
    env = CodeSandboxEnv()
    tasks = env.tasks("train")[:20]
    wrong = ["def {e}(*a, **k):\n    return None\n", "def {e}(*a, **k):\n    return 0\n",
             "def {e}(*a, **k):\n    raise ValueError('no')\n", "def {e}(*a:\n"]
    for task in tasks:
        for code in [task.solution] + [w.replace("{e}", task.entry_point) for w in wrong]:
            one = pool.run_tests(code, list(task.tests))
            two = pool.run_tests(code, list(task.tests), force_split=True)
            assert (one.verdict, one.passed) == (two.verdict, two.passed), (code, one, two)
        assert pool.run_tests(task.solution, list(task.tests)).verdict == "pass"


@bwrap
@pytest.mark.parametrize("test", ["assert len(f(1)) == 3", "assert sorted(f(1)) == [1]",
                                  "def check(c):\n    assert len(c(1)) == 3\ncheck(f)"])
def test_a_redefined_builtin_around_the_result_does_not_pass(pool, test):
    """Found while building one-process runs: the split run let a solution redefine a builtin
    that a site calls (allowed for MBPP's `sum` task) also where the builtin wraps the result of
    the solution's function, so `def len(x): return 3` passed `assert len(f(1)) == 3`."""
    cheat = "def len(x):\n    return 3\ndef sorted(x):\n    return [1]\ndef f(x):\n    return None\n"
    assert pool.run_tests(cheat, [test]).verdict != "pass"
    honest = "def f(x):\n    return [1, 2, 3] if x == 1 else None\n"
    assert pool.run_tests(honest, [test.replace("sorted(f(1)) == [1]", "sorted(f(1)) == [1, 2, 3]")]).verdict == "pass"


@bwrap
def test_a_task_named_like_a_builtin_still_works(pool):
    """MBPP's `sum`-style task: the solution defines the builtin's name, the site calls it."""
    code = "def sum(xs):\n    t = 0\n    for x in xs:\n        t += 2 * x\n    return t\n"
    assert pool.run_tests(code, ["assert sum([1, 2]) == 6", "assert sum(list(range(3))) == 6"]).verdict == "pass"


@bwrap
@pytest.mark.parametrize("setup, test", [
    ("from math import *", "assert isclose(f(0.5), 0.479425538604203)"),
    ("import math\nglobals()['isclose'] = math.isclose", "assert isclose(f(0.5), 0.479425538604203)"),
    ("", "from math import *\nassert isclose(f(0.5), 0.479425538604203)"),
])
def test_a_solution_cannot_stand_in_for_a_trusted_predicate(pool, setup, test):
    """The red-team review's one-process passes (a fake `isclose` defined by the solution,
    with `math.__all__` emptied so a star import in the test binds nothing): now split, fail."""
    cheat = "import math\nmath.__all__ = []\ndef f(x):\n    return 123.0\ndef isclose(*a, **k):\n    return True\n"
    assert pool.run_tests(cheat, [test], setup=setup).verdict != "pass"
    assert pool.run_tests("import math\ndef f(x):\n    return math.sin(x)\n", [test], setup=setup).verdict == "pass"


def test_a_report_line_with_a_non_ascii_digit_is_skipped_not_a_crash():
    """`'\u00b2'.isdigit()` is True but `int('\u00b2')` raises: the judge must skip the line."""
    import base64

    from agentrl.sandbox.judge import judge

    job = make_job("tests", "", ["assert f(1) == 2"], "", "", Limits())
    report = "C m0\nT 0\nE \u00b2 0 1\nE 0 \u00b2 1\nE 0 0 2\nP 0 m1\nD\n"
    raw = {"report": base64.b64encode(report.encode()).decode(), "stdout": "", "stderr": "",
           "exit_code": 0, "signal": None, "timeout": False, "output_limit": False}
    assert judge(job, raw, None, "bwrap").verdict == "pass"
