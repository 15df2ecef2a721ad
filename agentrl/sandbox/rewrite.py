"""Rewriting test snippets (in the trusted runner) so that verdicts do not trust solution objects.

Two things happen to every test source before it is sent into the sandbox:

1. **Expectations move out of the sandbox.**  An *unconditional* ``assert A == L`` (also
   ``L == A``, ``assert A`` and ``assert not A`` where ``A`` contains a call) whose ``L`` is a
   literal (``ast.literal_eval``) becomes ``__agentrl_expect__(k, A)``: the harness only
   reports the plain-data value of ``A`` for *site* ``k`` and the runner compares it with ``L``,
   which never enters the sandbox.  Unconditional means a statement of the test's module body or
   of the body of a module-level function the test calls at module level (HumanEval's
   ``check(candidate)``), so an honest run reports every site at least once.
2. **Everything else compares plain data.**  Every other comparison becomes
   ``__agentrl_cmp__(op, a, b)`` (chains: ``__agentrl_chain__((op, ...), a, b, ...)``), every
   other ``assert T`` becomes ``assert __agentrl_truth__(T)`` and every ``not X`` becomes
   ``not __agentrl_truth__(X)``; the harness's helpers accept exact built-in types only
   (``type(x) is int``...), so ``__eq__``/``__bool__`` of solution objects are never called.
   ``is``/``is not`` are left alone (identity cannot be faked).

The helper names are turned into constants of the compiled code inside the sandbox, so that
rebinding them in the test's globals changes nothing.  Statement line numbers of the rewritten
source are mapped back to the original for error messages (``line_map``).
"""

from __future__ import annotations

import ast
import functools
import threading
from dataclasses import dataclass, field
from typing import Any

HELPERS = ("__agentrl_expect__", "__agentrl_cmp__", "__agentrl_chain__", "__agentrl_truth__")
#: How the rewritten source calls helper ``h``: a string constant, ``'\x00agentrl:h'(...)``,
#: that the harness replaces in the compiled code objects by the helper itself.
PLACEHOLDER = {h: "\x00agentrl:" + h.strip("_") for h in HELPERS}
_OPS = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=",
        ast.In: "in", ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not"}


@dataclass(frozen=True)
class Site:
    """One expectation held by the runner: ``mode`` is ``eq`` (value == expected), ``truthy``
    or ``falsy``; ``line`` is the original source line (for the error message)."""

    mode: str
    expected: Any
    line: str
    msg: str | None = None


@dataclass(frozen=True)
class Rewritten:
    """A rewritten test: ``source`` (sent to the sandbox), the runner-side ``sites``, the
    modules it imports (preloaded and restored by the harness) and ``line_map`` (rewritten
    statement line -> original line)."""

    source: str
    sites: tuple[Site, ...] = ()
    imports: tuple[str, ...] = ()
    line_map: dict[int, int] = field(default_factory=dict)
    #: names called directly as a site's value (``assert sum(1, 2) == 3`` -> ``sum``): the
    #: solution may define these even where they shadow a builtin (MBPP's ``sum`` task), since
    #: the runner checks the value itself
    site_callees: tuple[str, ...] = ()


def _name(helper: str) -> ast.Constant:
    return ast.Constant(PLACEHOLDER[helper])


#: Pure built-ins an expected value may be built with (``set((4, 5))``, ``float('inf')``).
_CONSTRUCTORS = {"set": set, "frozenset": frozenset, "tuple": tuple, "list": list,
                 "dict": dict, "sorted": sorted, "float": float, "int": int, "str": str,
                 "complex": complex, "bool": bool, "bytes": bytes}


def _evaluate(node: ast.AST) -> Any:
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in _CONSTRUCTORS and not node.keywords
            and not any(isinstance(a, ast.Starred) for a in node.args)):
        return _CONSTRUCTORS[node.func.id](*[_evaluate(a) for a in node.args])
    return ast.literal_eval(node)


def _literal(node: ast.AST) -> tuple[bool, Any]:
    """(True, value) if ``node`` is a literal or a constructor call of literals (evaluated
    here, in the runner; a test that shadows ``set`` & co. is not expected)."""
    try:
        return True, _evaluate(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError, OverflowError):
        return False, None


def _has_call(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Call) for n in ast.walk(node))


class _Plain(ast.NodeTransformer):
    """Comparisons, asserts and ``not`` through the plain-data helpers (see module docstring)."""

    def visit_Compare(self, node: ast.Compare) -> ast.AST:
        self.generic_visit(node)
        ops = [_OPS[type(op)] for op in node.ops]
        if all(op in ("is", "is not") for op in ops):
            return node
        if len(ops) == 1:
            call = ast.Call(_name("__agentrl_cmp__"),
                            [ast.Constant(ops[0]), node.left, node.comparators[0]], [])
        else:
            call = ast.Call(_name("__agentrl_chain__"),
                            [ast.Tuple([ast.Constant(o) for o in ops], ast.Load()), node.left,
                             *node.comparators], [])
        return ast.copy_location(call, node)

    def visit_Assert(self, node: ast.Assert) -> ast.AST:
        self.generic_visit(node)
        node.test = ast.copy_location(ast.Call(_name("__agentrl_truth__"), [node.test], []),
                                      node.test)
        return node

    def visit_UnaryOp(self, node: ast.UnaryOp) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.op, ast.Not):
            node.operand = ast.copy_location(
                ast.Call(_name("__agentrl_truth__"), [node.operand], []), node.operand)
        return node


def _as_site(node: ast.Assert) -> tuple[str, Any, ast.expr] | None:
    """(mode, expected, value expression) if ``node`` is an expectation the runner can hold."""
    t = node.test
    if isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], ast.Eq):
        for value, other in ((t.left, t.comparators[0]), (t.comparators[0], t.left)):
            ok, expected = _literal(other)
            if ok and not _literal(value)[0] and _has_call(value):
                return "eq", expected, value
        return None
    if isinstance(t, ast.UnaryOp) and isinstance(t.op, ast.Not) and isinstance(t.operand, ast.Call):
        return "falsy", None, t.operand
    if isinstance(t, ast.Call):
        return "truthy", None, t
    return None


def _imports(tree: ast.AST) -> tuple[str, ...]:
    names: set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            names.update(a.name for a in n.names)
        elif isinstance(n, ast.ImportFrom) and n.module and not n.level:
            names.add(n.module)
    return tuple(sorted(names))


_AST_LOCK = threading.Lock()
"""Serialises the runner's `ast` work: CPython 3.11 before 3.11.8 keeps the AST converter's
recursion-depth counter per interpreter, so `ast.parse` in two threads at once (env threads
stepping sandbox runs) can raise `SystemError: AST constructor recursion depth mismatch`
(CPython gh-106905), which surfaced as a sandbox_error on an honest solution."""


@functools.lru_cache(maxsize=8192)
def rewrite_test(source: str) -> Rewritten:
    """The sandbox-side source of test ``source`` and its runner-side expectations (cached;
    one rewrite at a time, `_AST_LOCK`).

    A source that does not parse is returned unchanged (the harness reports its SyntaxError).
    """
    with _AST_LOCK:
        return _rewrite_test(source)


def _rewrite_test(source: str) -> Rewritten:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return Rewritten(source)
    lines = source.splitlines()
    called = {s.value.func.id for s in tree.body
              if isinstance(s, ast.Expr) and isinstance(s.value, ast.Call)
              and isinstance(s.value.func, ast.Name)}
    bodies = [tree.body] + [s.body for s in tree.body
                            if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))
                            and s.name in called]
    sites: list[Site] = []
    callees: set[str] = set()
    for body in bodies:
        for j, stmt in enumerate(body):
            found = _as_site(stmt) if isinstance(stmt, ast.Assert) else None
            if found is None:
                continue
            mode, expected, value = found
            if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
                callees.add(value.func.id)
            text = "\n".join(lines[stmt.lineno - 1:(stmt.end_lineno or stmt.lineno)]).strip()
            call = ast.Call(_name("__agentrl_expect__"), [ast.Constant(len(sites)), value], [])
            body[j] = ast.copy_location(ast.Expr(ast.copy_location(call, stmt)), stmt)
            msg = stmt.msg.value if isinstance(stmt.msg, ast.Constant) else None
            sites.append(Site(mode, expected, text[:300], msg if isinstance(msg, str) else None))
    try:
        tree = ast.fix_missing_locations(_Plain().visit(tree))
        out = ast.unparse(tree)
        again = ast.parse(out)
    except (ValueError, RecursionError, MemoryError, SyntaxError):
        return Rewritten(source)
    line_map = {}
    for new, old in zip(ast.walk(again), ast.walk(tree)):
        if isinstance(new, ast.stmt) and isinstance(old, ast.stmt):
            line_map.setdefault(new.lineno, old.lineno)
    return Rewritten(out, tuple(sites), _imports(tree), line_map, tuple(sorted(callees)))
