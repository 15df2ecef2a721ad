"""Red team (issue 20 A): reward hacks against the code sandbox's verdict, on the REAL sandbox.

Every attack in ``_redteam_attacks.ATTACKS`` is submitted through ``CodeSandboxEnv.step`` on a
built-in task and on HumanEval, HumanEval+, MBPP (sanitized) and MBPP+ tasks, and must get
reward 0 while the task's reference solution gets 1; the same attacks must also fail tests whose
expectations are computed inside the run (which, before the tests and the solution ran in two
processes, a solution reading the run's token could forge).  docs/sandbox.md has the threat
model and the tables of verdicts before and after each change.
"""

from __future__ import annotations

import base64
import shutil
from pathlib import Path

import pytest
from _redteam_attacks import ATTACKS

from agentrl.sandbox import Limits, SandboxPool
from agentrl.sandbox.judge import decode_plain, judge, make_job
from agentrl.sandbox.rewrite import rewrite_test
from agentrl_envs.code_datasets import load_dataset
from agentrl_envs.code_sandbox import CodeSandboxEnv

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")
DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
if not DATA.is_dir():
    DATA = Path("/work/shared/data")
DATASET_TASKS = {"humaneval": ("HumanEval.jsonl.gz", "HumanEval/0"),
                 "humaneval+": ("HumanEvalPlus.jsonl.gz", "HumanEval/0"),
                 "mbpp_sanitized": ("mbpp_sanitized.json", "Mbpp/2"),
                 "mbpp+": ("MbppPlus.jsonl.gz", "Mbpp/2")}


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(workers=2, backend="bwrap") as p:
        yield p


@pytest.fixture(scope="module")
def tasks():
    out = {"builtin": CodeSandboxEnv().tasks("train")[0],
           "builtin_list": CodeSandboxEnv(families=["list"]).tasks("train")[0]}
    for key, (name, tid) in DATASET_TASKS.items():
        if (DATA / name).exists():
            out[key] = next(t for t in load_dataset(str(DATA / name)) if t.task_id == tid)
    return out


def _step(pool, task, code):
    env = CodeSandboxEnv(pool=pool)
    env.reset(options={"task": task})
    _, reward, _, _, info = env.step(code)
    return reward, info


TASK_KEYS = ["builtin", "builtin_list", *DATASET_TASKS]


@pytest.mark.parametrize("key", TASK_KEYS)
def test_reference_solution_still_passes(pool, tasks, key):
    if key not in tasks:
        pytest.skip(f"{key}: data file missing")
    task = tasks[key]
    reward, info = _step(pool, task, task.solution)
    assert (reward, info["verdict"]) == (1.0, "pass"), info


@pytest.mark.parametrize("attack", sorted(ATTACKS))
@pytest.mark.parametrize("key", TASK_KEYS)
def test_attack_gets_no_reward(pool, tasks, key, attack):
    if key not in tasks:
        pytest.skip(f"{key}: data file missing")
    task = tasks[key]
    reward, info = _step(pool, task, ATTACKS[attack].replace("{entry}", task.entry_point))
    assert reward == 0.0 and info["verdict"] != "pass", (attack, key, info)


# -- the in-process layer where the runner holds no expectation --------------------------------

EQ = ("class E:\n    def __eq__(s, o): return True\n    def __ne__(s, o): return False\n"
      "    def __lt__(s, o): return True\n    def __sub__(s, o): return 0\n"
      "    def __abs__(s): return 0\n    def __bool__(s): return False\n    __hash__ = None\n")


@pytest.mark.parametrize("test", [
    "assert abs(f(1) - 2) < 1e-6",            # arithmetic on the result
    "for i in range(2):\n    assert f(i) == i + 1",  # computed expectation (stays inside)
    "xs = [0]\nf(xs)\nassert xs == [1]",      # an object planted in an argument
    "xs = [0, 0]\nf(xs)\nfor i in range(1):\n    assert not xs[1]",  # __bool__ of a planted object
    "xs = [0]\nf(xs)\nassert 0 < xs[0] < 2",  # chained comparison
    "import math\nassert math.isclose(f(1), 2)",
])
def test_value_objects_fail_where_the_check_stays_in_the_sandbox(pool, test):
    code = EQ + "import math\nmath.isclose = lambda *a, **k: True\n" \
                "def f(x):\n    if type(x) is list:\n        x[:] = [E()] * len(x)\n    return E()\n"
    r = pool.run_tests(code, [test], limits=Limits(wall_s=5))
    assert r.verdict != "pass" and r.passed == 0, (test, r)
    honest = "def f(x):\n    if type(x) is list:\n        x[0] = 1\n    return x + 1 if type(x) is int else 2\n"
    assert pool.run_tests(honest, [test]).verdict == "pass", test


def test_honest_values_of_every_plain_type_pass(pool):
    code = ("import collections, re\n"
            "def f(k):\n    return {'t': (1, 2.5, 'x'), 's': {1, 2}, 'fs': frozenset({3}),\n"
            "        'b': b'\\x00\\xff', 'c': 1 + 2j, 'n': None, 'l': [True, [1.5]],\n"
            "        'od': collections.OrderedDict(a=1), 'dd': collections.defaultdict(int, b=2),\n"
            "        'cnt': collections.Counter('aab'), 'r': range(3), 'u': 'caf\\u00e9\\ud800',\n"
            "        'inf': float('inf'), 'big': 10 ** 40}[k]\n"
            "def m(s):\n    return re.match('a', s)\n")
    tests = ["assert f('t') == (1, 2.5, 'x')", "assert f('s') == {1, 2}",
             "assert f('fs') == frozenset({3})", "assert f('b') == b'\\x00\\xff'",
             "assert f('c') == 1 + 2j", "assert f('n') == None", "assert f('l') == [1, [1.5]]",
             "assert f('od') == {'a': 1}", "assert f('dd') == {'b': 2}",
             "assert f('cnt') == {'a': 2, 'b': 1}", "assert f('r') == range(3)",
             "assert f('u') == 'caf\\u00e9\\ud800'", "assert f('inf') == float('inf')",
             "assert f('big') == 10 ** 40", "assert m('abc')", "assert not m('xyz')",
             "assert list(map(int, '12')) == [1, 2]", "assert type(f('n')) == type(None)"]
    r = pool.run_tests(code, tests)
    assert r.verdict == "pass", [(t.name, t.error) for t in r.tests if not t.passed]


# -- the runner side: expectations never enter the sandbox, reports cannot grant them ----------

def test_expected_values_are_not_sent_into_the_sandbox():
    job = make_job("tests", "def f(x): return x", ["assert f(1) == 987654321",
                                                   "def check(c):\n    assert c(2) == 'SECRET'\ncheck(f)"],
                   "", "", Limits())
    wire = {k: v for k, v in job.items() if not k.startswith("_")}
    assert "987654321" not in repr(wire) and "SECRET" not in repr(wire)
    assert [len(r.sites) for r in job["_rewritten"]] == [1, 1]


def test_a_forged_pass_token_without_the_expected_value_fails():
    job = make_job("tests", "", ["assert f(1) == 2"], "", "", Limits())
    tok = job["tokens"]

    def run(report: str):
        raw = {"report": base64.b64encode(report.encode()).decode(), "stdout": "", "stderr": "",
               "exit_code": 0, "signal": None, "timeout": False, "output_limit": False}
        return judge(job, raw, None, "bwrap")

    assert run(f"C {tok[0]}\nT 0\nE 0 0 2\nP 0 {tok[1]}\nD\n").verdict == "pass"
    assert run(f"C {tok[0]}\nT 0\nP 0 {tok[1]}\nD\n").verdict == "fail"  # site never reported
    r = run(f"C {tok[0]}\nT 0\nE 0 0 2\nE 0 0 3\nP 0 {tok[1]}\nD\n")  # one wrong value
    assert r.verdict == "fail" and "assert f(1) == 2" in r.tests[0].error
    assert run(f"C {tok[0]}\nT 0\nE 0 0 {{\"x\":1}}\nP 0 {tok[1]}\nD\n").verdict == "fail"


def test_rewrite_maps_lines_back_for_errors(pool):
    src = "x = 1\n\nassert x + 1 == 3\nassert f(\n  2) == 5\n"
    rw = rewrite_test(src)
    assert [(s.line, s.expected) for s in rw.sites] == [("assert f(\n  2) == 5", 5)]
    new = next(n for n, line in enumerate(rw.source.splitlines(), 1) if "x + 1" in line)
    assert rw.line_map[new] == 3
    r = pool.run_tests("def f(x):\n    return 4\n", [src])
    assert r.verdict == "fail" and r.tests[0].error == "AssertionError (at `assert x + 1 == 3`)"
    r = pool.run_tests("def f(x):\n    return 4\n", [src.replace("3", "2")])
    assert r.tests[0].error == "AssertionError (at `assert f(\n  2) == 5`)"


def test_decode_plain_is_strict():
    assert decode_plain({"t": [1, {"s": [2]}]}) == (1, {2})
    for bad in ({"x": 1}, {"t": 1}, {"a": 1, "b": 2}, {"b": "!!"}):
        with pytest.raises(ValueError):
            decode_plain(bad)


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_attacks_fail_on_tests_without_runner_held_expectations(pool, attack):
    """Tests whose expectation is computed in the run (no layer-1 site): before the split into
    a test process and a solution process, reading the token (gc, frames) forged these."""
    code = ATTACKS[attack].replace("{entry}", "f")
    tests = ["assert f(2) == 2 * 2",                              # computed expectation
             "for i in range(3):\n    assert f(i) == i * 2",        # in a loop
             "import math\nassert math.isclose(f(1.5), 3.0)",      # tolerance
             "def ref(x):\n    return 2 * x\nassert all(f(x) == ref(x) for x in range(4))",
             "assert abs(f(0.5) - 1.0) < 1e-9",                      # arithmetic
             "assert isclose(f(1.5), 3.0)"]                          # a name setup imported
    setup = "from math import isclose\n"
    for test in tests:
        r = pool.run_tests(code, [test], setup=setup)
        assert r.verdict != "pass" and r.passed == 0, (attack, test, r)
        honest = pool.run_tests("def f(x):\n    return 2 * x\n", [test], setup=setup)
        assert honest.verdict == "pass", test


def test_tokens_and_tests_never_reach_the_solution_process():
    """The solution's process scans all of its writable memory (ctypes; its /proc/self/mem is
    not readable, the process is non-dumpable) for 32-hex-digit strings:
    the run's tokens (held by the test program) are never among them, nor a marker only the
    tests contain; a marker in the solution's own source is (the scan works)."""
    from agentrl.sandbox.worker import Worker

    code = ("import ctypes, re\nMINE = 'abcdef0123456789' * 2\n"
            "def f(x):\n    found = set()\n"
            "    with open('/proc/self/maps') as m:\n"
            "        for line in m:\n"
            "            lo, hi = (int(v, 16) for v in line.split()[0].split('-'))\n"
            "            if not line.split()[1].startswith('rw'):\n                continue\n"
            "            found.update(re.findall(rb'[0-9a-f]{32}', ctypes.string_at(lo, hi - lo)))\n"
            "    print(sorted(s.decode() for s in found))\n    return x\n")
    test_marker = "fedcba9876543210" * 2
    w = Worker("bwrap")
    try:
        for _ in range(2):  # a second run of the same worker: not the first's tests either
            # (earlier runs' tokens can linger in the server's freed report buffers, hence in
            # the solution's process; they are never valid again, every run has fresh ones)
            job = make_job("tests", code, [f"assert f(1) == 1\nassert '{test_marker}'"] * 3,
                           "", "", Limits(wall_s=20, cpu_s=20))
            raw = w.run(job, 40)
            out = base64.b64decode(raw["stdout"]).decode()
            assert "abcdef0123456789" * 2 in out, out[:300]
            assert test_marker not in out
            assert not [t for t in job["tokens"] if t in out], (_, out[:200])
            assert judge(job, raw, None, "bwrap").verdict == "pass"
    finally:
        w.shutdown()


@pytest.mark.parametrize("key", ["humaneval", "humaneval+"])
@pytest.mark.parametrize("tid, cheat", [
    ("HumanEval/50", "def encode_shift(s):\n    return s\n\ndef decode_shift(s):\n    return s\n"),
    ("HumanEval/38", "def encode_cyclic(s):\n    return s\n\ndef decode_cyclic(s):\n    return s\n"),
    ("HumanEval/32", "def poly(xs, x):\n    return 0.0\n\ndef find_zero(xs):\n    return 0.0\n"),
])
def test_prompt_helpers_the_tests_use_cannot_be_replaced(pool, key, tid, cheat):
    """Found by a red-team review: the solution could redefine the prompt's helpers that the
    tests check answers with (identity encode/decode, a zero `poly`) and pass; only the
    setup's stubs (the entry point) may be replaced now."""
    name = DATASET_TASKS[key][0]
    if not (DATA / name).exists():
        pytest.skip(f"{key}: data file missing")
    task = next(t for t in load_dataset(str(DATA / name)) if t.task_id == tid)
    reward, info = _step(pool, task, cheat)
    assert reward == 0.0 and info["verdict"] != "pass", info
    assert _step(pool, task, task.solution)[0] == 1.0
