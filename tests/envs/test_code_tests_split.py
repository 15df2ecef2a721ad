"""Public and hidden tests of code tasks (envs/code_tests_split.py), the multi-turn feedback
built from the public ones only, and the attack of issue 40: a policy that answers from a
lookup table of the feedback's asserts scores 0 once the reward counts hidden tests."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from agentrl.sandbox.pool import default_pool
from agentrl_envs import code_tasks
from agentrl_envs.code_datasets import CodeTask, load_dataset, task_from_dict
from agentrl_envs.code_sandbox import CodeSandboxEnv, sandbox_job
from agentrl_envs.code_tests_split import public_count, public_tests

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"

# A HumanEval-style check: a prelude import, 5 test units (one a loop over data only it
# reads), and an `assert True` marker that is no unit.
CHECK = '''METADATA = {}


def check(candidate):
    import math
    assert True, "marker"
    big = [1000003, 2000003]
    pairs = [(40, 41)]
    for a, b in pairs:
        assert candidate(a) == b
    assert candidate(2) == 3
    assert candidate(5) == 6
    for x in big:
        assert candidate(x) == x + 1
    assert candidate(77777) == 77778
'''
PUBLIC_CHECK = '''METADATA = {}


def check(candidate):
    import math
    pairs = [(40, 41)]
    for a, b in pairs:
        assert candidate(a) == b
    assert candidate(2) == 3
'''
INC = {"task_id": "HumanEval/9001", "entry_point": "inc",
       "prompt": 'def inc(x: int) -> int:\n    """x plus one."""\n',
       "canonical_solution": "    return x + 1\n", "test": CHECK}


@pytest.fixture(scope="module")
def pool():
    return default_pool("auto")


def test_public_count_rule():
    assert [public_count(n) for n in range(1, 13)] == [0, 1, 1, 1, 2, 2, 2, 3, 3, 4, 4, 4]


def test_builtin_tasks_show_their_first_two_asserts():
    for t in code_tasks.generate_tasks("heldout", 30, 0):
        s = public_tests(t)
        assert (s.units, s.public_units, s.names) == (5, 2, None)
        assert s.tests == t.tests[:2]


def test_check_function_keeps_needed_prelude_only():
    t = task_from_dict(INC)
    s = public_tests(t)
    assert (s.units, s.public_units, s.names) == (5, 2, ["check"])
    assert s.tests == [PUBLIC_CHECK + "\n\ncheck(inc)\n"]
    assert t.tests == [CHECK + "\n\ncheck(inc)\n"]  # the reward's tests: unchanged


def test_one_test_has_no_public_tests_and_diff_tests_are_hidden():
    one = task_from_dict({"prompt": "p", "entry_point": "f", "tests": ["assert f(1) == 2"]})
    assert public_tests(one).tests == []
    plus = task_from_dict({"task_id": "Mbpp/9", "prompt": "Halve.", "entry_point": "halve",
                           "canonical_solution": "def halve(x):\n    return x / 2\n",
                           "assertion": "assert halve(2) == 1\nassert halve(4) == 2\nassert halve(8) == 4",
                           "base_input": [[2]], "plus_input": [[6]], "atol": 0})
    s = public_tests(plus)
    assert len(plus.tests) == 5 and (s.units, s.public_units) == (3, 1)
    assert s.tests == ["assert halve(2) == 1"] and s.names == ["assert 1"]
    given = CodeTask("x", "p", "f", ["assert f(1) == 2", "assert f(2) == 3"],
                     meta={"public_tests": ["assert f(0) == 1"]})
    assert public_tests(given).tests == ["assert f(0) == 1"]


def test_humaneval_public_tests_pass_with_the_canonical_solution(pool):
    """Every real HumanEval task's public snippet compiles, runs and passes with the reference
    (4 tasks with a single check statement have none); no hidden statement's text is in it."""
    tasks = load_dataset("humaneval")
    jobs, none = [], 0
    for t in tasks:
        s = public_tests(t)
        if not s.tests:
            none += 1
            continue
        assert 1 <= s.public_units < s.units
        job = sandbox_job(t, t.solution)
        job["tests"], job["names"] = s.tests, s.names
        jobs.append(job)
    assert none == 4 and len(jobs) == 160
    assert {r.verdict for r in pool.map_tests(jobs)} == {"pass"}


# -- the attack and the no-leak check --------------------------------------------------------

_ASSERT = re.compile(r"assert (\w+)\((.*?)\) == (.+?)`")


def lookup_answer(name: str, texts: list[str]) -> str:
    """The lookup-table policy: every `assert name(args) == expected` it has read, as a table."""
    table = {}
    for text in texts:
        for fn, args, exp in _ASSERT.findall(text):
            if fn == name:
                table[repr(ast.literal_eval(f"({args},)"))] = exp
    body = ", ".join(f"{k!r}: {v}" for k, v in table.items())
    return f"def {name}(*a):\n    return {{{body}}}.get(repr(a))"


def run_lookup_policy(env: CodeSandboxEnv, task: CodeTask) -> tuple[float, list[str]]:
    obs, _ = env.reset(options={"task": task})
    seen = [m["content"] for m in obs]
    total = 0.0
    while True:
        obs, r, term, trunc, _ = env.step(lookup_answer(task.entry_point, seen))
        total += r
        seen += [m["content"] for m in obs]
        if term or trunc:
            return total, seen


def test_lookup_policy_scores_zero_on_hidden_tests(pool):
    """The attack of issue 40 on 15 held-out tasks with 6 attempts: it reads the public
    asserts and passes them (checked), and scores 0, since the reward counts the hidden tests.
    Control: when every test is public (the old feedback), the same policy scores 1.0.
    6 attempts: a leak of one hidden assert per failed attempt would be learnt too (2 public
    and 3 hidden asserts read, then a pass), where 4 attempts ran out before the pass."""
    env = CodeSandboxEnv(split="heldout", max_turns=6, pool=pool)
    tasks = env.tasks()[:15]
    for t in tasks:
        ret, seen = run_lookup_policy(env, t)
        assert ret == 0.0, t.task_id
        assert "the public tests pass, but hidden tests fail" in seen[-1]
    t = tasks[0]
    every = CodeTask(**{**t.__dict__, "meta": {**t.meta, "public_tests": list(t.tests)}})
    env6 = CodeSandboxEnv(max_turns=6, pool=pool)
    assert run_lookup_policy(env6, every)[0] == 1.0


def _hidden_literals(task: CodeTask, allowed: str) -> set[str]:
    """The text of every literal (argument or expected value) of the task's hidden asserts that
    is not in `allowed` (the prompt and the public tests) and is long enough to be telling."""
    hidden = [t for t in task.tests if t not in public_tests(task).tests]
    out = set()
    for t in hidden:
        node = ast.parse(t).body[0]
        assert isinstance(node, ast.Assert) and isinstance(node.test, ast.Compare)
        call = node.test.left
        assert isinstance(call, ast.Call)
        for n in [*call.args, *node.test.comparators]:
            s = ast.unparse(n)
            if len(s) >= 3 and s not in allowed:
                out.add(s)
    return out


ADVERSARIES = {
    "wrong": "def {f}(*a):\n    return None",
    "print_args": "def {f}(*a):\n    print('ARGS', a)\n    return 0",
    "raise_args": "def {f}(*a):\n    raise ValueError(repr(a))",
    "reference_off_by_one": None,  # the reference, made wrong by + 1 on the result
    "public_lookup": None,  # answers the public asserts from a table, printing its arguments
}


def adversary_answer(kind: str, task: CodeTask, public: list[str]) -> str:
    """The answer of adversary `kind` (`ADVERSARIES`) to `task` with public tests `public`.
    `public_lookup` passes the public tests and fails the hidden ones on every built-in task,
    so that the feedback of a run where only hidden tests fail is checked on every task."""
    if kind == "reference_off_by_one":
        return task.solution.replace("    return ", "    return 1 + ", 1)
    if kind == "public_lookup":
        table = lookup_answer(task.entry_point, [f"{p}`" for p in public])
        return table.replace("    return ", "    print('ARGS', a)\n    return ", 1)
    return ADVERSARIES[kind].format(f=task.entry_point)


def test_no_hidden_test_reaches_any_observation(pool):
    """Across 25 held-out built-in tasks and five adversarial policies (a wrong answer, one
    that prints its arguments, one that raises them, a mutated reference, one that passes the
    public tests only and prints its arguments), with 2 attempts: no hidden assert's text and
    no hidden literal appears in any observation (prompt or feedback); the public assertion
    does appear (so the check can see one), and every task's feedback says that only hidden
    tests fail at least once (so the check sees that case on every task)."""
    env = CodeSandboxEnv(split="heldout", max_turns=2, pool=pool)
    tasks = env.tasks()[:25]
    shown_public = hidden_only = 0
    for t in tasks:
        public = public_tests(t).tests
        secret = _hidden_literals(t, t.prompt + "\n".join(public))
        hidden_src = [x for x in t.tests if x not in public]
        for kind in ADVERSARIES:
            answer = adversary_answer(kind, t, public)
            obs, _ = env.reset(options={"task": t})
            texts = [m["content"] for m in obs]
            for _ in range(2):
                obs, _, term, trunc, _ = env.step(answer)
                texts += [m["content"] for m in obs]
                if term or trunc:
                    break
            joined = "\n".join(texts)
            assert not any(h in joined for h in hidden_src), (t.task_id, kind)
            leaked = [s for s in secret if s in joined]
            assert not leaked, (t.task_id, kind, leaked)
            shown_public += any(p in joined for p in public)
            hidden_only += kind == "public_lookup" and "the public tests pass, but hidden tests fail" in joined
    assert shown_public >= 25  # the feedback quotes public asserts
    assert hidden_only == 25


def test_check_task_feedback_shows_public_assert_only(pool):
    env = CodeSandboxEnv(max_turns=2, pool=pool)
    env.reset(options={"task": INC})
    obs, r, *_ = env.step("def inc(x):\n    print('got', x)\n    return x + 1 if x == 40 else x")
    text = obs[0]["content"]
    assert r == 0.0
    assert "assert candidate(2) == 3" in text  # the first failing public assert
    for secret in ("1000003", "2000003", "77777", "x + 1"):
        assert secret not in text
    assert "got 40" in text and "got 2" in text  # the public run's output


# One-process runs (the built-in tasks: every test decided by runner-held sites) share the
# solution's process with the harness, so the solution can write the report's lines itself:
# an `S` line turns the run of every test into a `syntax_error` whose reason it wrote, while
# it prints the arguments of every test, hidden ones included.
FORGE_SYNTAX_ERROR = '''import os
def {f}(*a):
    os.write(3, ("S forged " + repr(a) + "\\n").encode())
    print("ARGS", a)
    return None
'''


def test_a_forged_syntax_error_shows_the_public_run_only(pool):
    """The feedback after a run of every test whose verdict is `syntax_error` quotes a run of
    the public tests alone, like every other verdict: no hidden argument (e.g. `[2, 8, 6, 4]`,
    the third input of held-out task 0, not in its prompt or its 2 public asserts) reaches
    the agent, while the public ones do. A real syntax error reads as before."""
    env = CodeSandboxEnv(split="heldout", max_turns=2, pool=pool)
    for t in env.tasks()[:3]:
        public = public_tests(t).tests
        secret = _hidden_literals(t, t.prompt + "\n".join(public))
        assert secret, t.task_id
        env.reset(options={"task": t})
        obs, r, _, _, info = env.step(FORGE_SYNTAX_ERROR.format(f=t.entry_point))
        text = obs[0]["content"]
        assert (r, info["verdict"]) == (0.0, "syntax_error")  # the run of every test, forged
        assert not [s for s in secret if s in text], (t.task_id, text)
        assert "ARGS" in text  # the public run's output
    assert "[2, 8, 6, 4]" in str(env.tasks()[0].tests[2])
    env.reset(options={"task": env.tasks()[0]})
    obs, *_ = env.step("def answer(xs) return xs")
    assert obs[0]["content"] == ("Your code failed: SyntaxError: expected ':' (<solution>, line 1)\n"
                                 "Fix the function and answer with the complete code.")
