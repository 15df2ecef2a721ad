"""Public and hidden tests of a coding task: what a multi-turn agent may see, and what only
the reward counts (DESIGN contract 9).

A task's tests (`CodeTask.tests`) are all run for the reward, unchanged. A deterministic part
of them, the *public* tests, is also run on a failed attempt to write the feedback the agent
reads; the others, the *hidden* tests, never reach the agent: not their source, not their
values, not the output the agent's code prints while they run.

The rule (`public_tests`), one for every source:

1. The task's tests are read as a list of *test units*, in order:
   - a snippet that defines `check(candidate)` and calls it (HumanEval, HumanEval+'s first
     test): each top-level statement of `check`'s body that contains an `assert` is one unit
     (a `for` loop of asserts is one unit; `assert True, "..."` is none); its other statements (imports, assignments,
     helper functions) are the prelude of the units after them;
   - an EvalPlus diff test (HumanEval+, MBPP+: the canonical solution's outputs on
     `base_input` / `plus_input`) is no unit: always hidden;
   - any other snippet (a built-in task's or MBPP's `assert f(...) == ...`) is one unit.
2. With `n` units, the first `m = min(n - 1, max(1, floor(PUBLIC_FRACTION * n)))` are public
   (`m = 0` for `n <= 1`: a task with one test has no public test), so at least one unit is
   always hidden. `PUBLIC_FRACTION = 0.4`: 2 of the built-in tasks' 5 asserts, 1 of MBPP's 3
   (the one its prompt already shows), 2-4 of HumanEval's 5-10 check statements.
3. A public `check` keeps its prelude statements that the public units need (imports always;
   assignments and definitions whose names the kept statements use, transitively) and drops
   the rest, so a hidden unit's data (e.g. a list of inputs only a hidden loop reads) is not
   even executed in the public run.

A task record may name its public tests itself: `meta["public_tests"]` (a list of snippets,
taken as given).
"""

from __future__ import annotations

import ast
import warnings
from dataclasses import dataclass

from agentrl.infra import pyast
from agentrl_envs.code_datasets import CodeTask

PUBLIC_FRACTION = 0.4
"""Share of a task's test units that are public (rounded down; at least 1 and at most n - 1)."""

_DIFF_MARK = "def __agentrl_diff():"


@dataclass(frozen=True)
class TestSplit:
    """The public tests of a task and their names (hidden: every other test, and the rest of
    each check function). `units` and `public_units` count test units (module doc)."""

    __test__ = False  # not a pytest class

    tests: list[str]
    names: list[str] | None
    units: int
    public_units: int


def public_count(n: int) -> int:
    """Public units of a task with `n` test units: `min(n - 1, max(1, floor(0.4 n)))`, 0 for
    n <= 1. E.g. 1 -> 0, 2 -> 1, 3 -> 1, 5 -> 2, 7 -> 2, 10 -> 4."""
    if n <= 1:
        return 0
    return min(n - 1, max(1, int(PUBLIC_FRACTION * n)))


def _parse(src: str) -> ast.Module | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return pyast.parse(src)
    except SyntaxError:
        return None


def _check_function(tree: ast.Module) -> ast.FunctionDef | None:
    """The top-level `def check(...)` of a test snippet that also calls `check(...)`."""
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"), None)
    calls = any(isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)
                and isinstance(n.value.func, ast.Name) and n.value.func.id == "check" for n in tree.body)
    return fn if fn is not None and calls else None


def _has_assert(node: ast.AST) -> bool:
    """Does `node` hold an assert that tests something (HumanEval's `assert True, "..."`
    markers do not count)?"""
    return any(isinstance(n, ast.Assert) and not (isinstance(n.test, ast.Constant) and n.test.value is True)
               for n in ast.walk(node))


def _units(test: str) -> int:
    """Test units of one snippet: 0 for a diff test, the check's assert statements for a check
    snippet, else 1."""
    if _DIFF_MARK in test:
        return 0
    tree = _parse(test)
    fn = _check_function(tree) if tree is not None else None
    if fn is None:
        return 1
    return sum(_has_assert(s) for s in fn.body)


def _names_used(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _bound_names(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def _public_check(test: str, keep: int) -> str:
    """`test` (a check snippet) with only the first `keep` assert statements of `check` and the
    prelude statements they need (module doc, rule 3); the lines of dropped statements are
    removed, every other line is kept verbatim."""
    tree = _parse(test)
    assert tree is not None
    fn = _check_function(tree)
    assert fn is not None
    asserts = [s for s in fn.body if _has_assert(s)]
    kept_tests = asserts[:keep]
    prelude = [s for s in fn.body if not _has_assert(s)]
    need = set().union(*(_names_used(s) for s in kept_tests)) if kept_tests else set()
    kept: set[int] = {id(s) for s in kept_tests}
    changed = True
    while changed:  # keep what the kept statements use, transitively
        changed = False
        for s in prelude:
            if id(s) in kept:
                continue
            if isinstance(s, (ast.Import, ast.ImportFrom)) or _bound_names(s) & need:
                kept.add(id(s))
                need |= _names_used(s)
                changed = True
    lines = test.splitlines(keepends=True)
    drop: set[int] = set()
    for s in fn.body:
        if id(s) not in kept:
            drop.update(range(s.lineno - 1, (s.end_lineno or s.lineno)))
    if not any(id(s) in kept for s in fn.body):  # an empty body would not compile
        first = fn.body[0]
        indent = lines[first.lineno - 1][:first.col_offset]
        lines[first.lineno - 1] = indent + "pass\n"
        drop.discard(first.lineno - 1)
    return "".join(line for i, line in enumerate(lines) if i not in drop)


def public_tests(task: CodeTask) -> TestSplit:
    """The public tests of `task` by the module's rule (or `task.meta["public_tests"]`).

    Returns:
        A `TestSplit`: the public snippets in order, their names (the task's own names for
        whole snippets, None when the task has none), the task's test units and how many are
        public. The hidden tests are everything of `task.tests` not in the public snippets.
    """
    given = task.meta.get("public_tests") if isinstance(task.meta, dict) else None
    if given is not None:
        tests = [str(t) for t in given]
        return TestSplit(tests, None, len(task.tests), len(tests))
    counts = [_units(t) for t in task.tests]
    n = sum(counts)
    m = public_count(n)
    out: list[str] = []
    names: list[str] = []
    left = m
    for i, (test, c) in enumerate(zip(task.tests, counts, strict=True)):
        if left <= 0:
            break
        if c == 0:
            continue
        tree = _parse(test)
        if tree is not None and _check_function(tree) is not None:
            take = min(left, c)
            out.append(test if take == c else _public_check(test, take))
            left -= take
        else:
            out.append(test)
            left -= 1
        names.append(task.test_names[i] if task.test_names else f"test_{i}")
    return TestSplit(out, names if task.test_names else None, n, m)


def hidden_units(task: CodeTask) -> int:
    """Hidden test units of `task` (its units minus the public ones; diff tests not counted)."""
    s = public_tests(task)
    return s.units - s.public_units
