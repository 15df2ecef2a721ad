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
import builtins
import functools
from dataclasses import dataclass, field
from typing import Any

from agentrl.infra import pyast

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
    #: if the verdict of this test is decided by its sites alone (:func:`_runner_decided`):
    #: the names whose results the sites report, which must come from the solution; else None.
    #: Such a test cannot be forged by code running next to it, so it may run in one process
    #: with the solution.
    decided_by: tuple[str, ...] | None = None


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


_BUILTIN_NAMES = frozenset(vars(builtins))


def _shadowable(value: ast.expr) -> bool:
    """May the solution define the callee of site value ``value`` even where it shadows a
    builtin (MBPP's ``assert sum([1, 2]) == 3``)?  Only a direct call ``g(...)`` whose
    arguments call nothing but builtins: where they call another name (``len(f(1))``), ``g``
    wraps the result of the solution's function, and a solution that redefines ``len`` to
    answer ``3`` must not pass."""
    if not (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)):
        return False
    inner = [n for a in (*value.args, *value.keywords) for n in ast.walk(a)
             if isinstance(n, ast.Call)]
    return all(isinstance(n.func, ast.Name) and n.func.id in _BUILTIN_NAMES for n in inner)


def _imports(tree: ast.AST) -> tuple[str, ...]:
    names: set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            names.update(a.name for a in n.names)
        elif isinstance(n, ast.ImportFrom) and n.module and not n.level:
            names.add(n.module)
    return tuple(sorted(names))


def _is_site(stmt: ast.stmt) -> bool:
    return (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
            and isinstance(stmt.value.func, ast.Constant)
            and stmt.value.func.value == PLACEHOLDER["__agentrl_expect__"])


def _inert(stmt: ast.stmt) -> bool:
    """A statement that checks nothing and runs no solution code: an import, ``pass``, a
    docstring, or a literal bound to a name (HumanEval's ``METADATA = {...}``)."""
    if isinstance(stmt, (ast.Import, ast.ImportFrom, ast.Pass)):
        return True
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
        return True
    return (isinstance(stmt, ast.Assign) and all(isinstance(t, ast.Name) for t in stmt.targets)
            and _literal(stmt.value)[0])


def bound_names(tree: ast.AST) -> set[str]:
    """Every name ``tree`` binds anywhere: assignments, definitions, imports, parameters."""
    names: set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load):
            names.add(n.id)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(n.name)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in n.names)
        elif isinstance(n, ast.arg):
            names.add(n.arg)
    return names


def _direct_call(stmt: ast.stmt) -> str | None:
    """The callee of a site whose value is a call of a bare name (``f(...)``), else None."""
    value = stmt.value.args[1]  # type: ignore[attr-defined]
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
        return value.func.id
    return None


def _runner_decided(tree: ast.Module, called: set[str]) -> tuple[str, ...] | None:
    """The names test ``tree`` (sites already replaced) expects the solution to define, if its
    verdict is decided by its sites alone; else None.

    Decided by its sites alone means: every statement of the module body is a site, an inert
    statement (:func:`_inert`), a plain function definition (no decorators, defaults or
    annotations) that the module calls and whose body holds only sites and inert statements,
    or such a call (``check(candidate)``, arguments names or constants); there is at least one
    site; and the value of every site is the result of a direct call ``g(...)`` of a name
    ``g`` that the test does not bind (at module level) or of a parameter of the function that
    holds it, which the module-level calls bind to such a name.  Those names (returned) must
    come from the solution: :func:`agentrl.sandbox.judge.make_job` still splits the run when
    one of them is a builtin or bound by the job's ``setup``.

    Then the only way through the test is to report, for every site, a value equal to the
    expected one, which the runner holds; and since the value reported is the solution's own
    result (no trusted code such as ``len`` or ``math.isclose`` computes it from that
    result), code running beside the test that reports it itself achieves nothing that a
    function returning those values could not: the one-process harness cannot be forged, with
    or without the run's tokens (docs/sandbox.md, "One-process runs").  A test with a star
    import, a walrus, ``global``/``nonlocal`` or ``match`` anywhere is never decided here
    (they bind names out of this rule's sight)."""
    if any(isinstance(n, (ast.NamedExpr, ast.Global, ast.Nonlocal, ast.Match))
           or (isinstance(n, ast.ImportFrom) and any(a.name == "*" for a in n.names))
           for n in ast.walk(tree)):
        return None  # names bound where the rule below does not look: split
    bound = bound_names(ast.Module([s for s in tree.body if not isinstance(s, ast.FunctionDef)], []))
    bound |= {s.name for s in tree.body if isinstance(s, ast.FunctionDef)}
    callees: set[str] = set()
    params: dict[str, list[str]] = {}  # function -> its positional parameters
    via: dict[str, set[int]] = {}  # function -> positions of parameters its sites call
    sites = 0
    for stmt in tree.body:
        if _is_site(stmt):
            g = _direct_call(stmt)
            if g is None or g in bound:
                return None
            callees.add(g)
            sites += 1
        elif _inert(stmt):
            continue
        elif isinstance(stmt, ast.FunctionDef):
            a = stmt.args
            plain = (not stmt.decorator_list and stmt.returns is None and not a.defaults
                     and not any(a.kw_defaults) and stmt.name in called
                     and not a.posonlyargs and not a.kwonlyargs and not a.vararg and not a.kwarg
                     and all(x.annotation is None for x in a.args))
            if not plain or not all(_is_site(b) or _inert(b) for b in stmt.body):
                return None
            names = [x.arg for x in a.args]
            local = bound_names(ast.Module([b for b in stmt.body if _inert(b)], []))
            params[stmt.name], via[stmt.name] = names, set()
            for b in stmt.body:
                if not _is_site(b):
                    continue
                g = _direct_call(b)
                if g is None or (g in local and g not in names) or (g in bound and g not in names):
                    return None
                if g in names:
                    via[stmt.name].add(names.index(g))
                else:
                    callees.add(g)
                sites += 1
        elif (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
              and isinstance(stmt.value.func, ast.Name) and stmt.value.func.id in params
              and not stmt.value.keywords
              and all(isinstance(x, (ast.Name, ast.Constant)) for x in stmt.value.args)):
            args = stmt.value.args
            if len(args) != len(params[stmt.value.func.id]):
                return None
            for k in via[stmt.value.func.id]:
                if not isinstance(args[k], ast.Name) or args[k].id in bound:
                    return None
                callees.add(args[k].id)
        else:
            return None
    return tuple(sorted(callees)) if sites else None


#: Longest test source the rewriter takes, in characters (the largest shipped test chunk,
#: MBPP+'s, is 108,516; rewriting costs ~70 us per statement, a 2.3 MB test took 29 s).
MAX_TEST_CHARS = 1 << 19


class TestTooLarge(ValueError):
    """A test source over `MAX_TEST_CHARS`: refused before any parsing."""

    __test__ = False  # not a pytest class


def rewrite_test(source: str) -> Rewritten:
    """The sandbox-side source of test ``source`` and its runner-side expectations (cached).

    A source that does not parse is returned unchanged (the harness reports its SyntaxError).

    Raises:
        TestTooLarge: ``source`` is longer than `MAX_TEST_CHARS` characters.
    """
    if len(source) > MAX_TEST_CHARS:
        raise TestTooLarge(f"test source of {len(source):,} characters is over the cap of "
                           f"{MAX_TEST_CHARS:,} (agentrl.sandbox.rewrite.MAX_TEST_CHARS)")
    return _rewrite_cached(source)


@functools.lru_cache(maxsize=8192)
def _rewrite_cached(source: str) -> Rewritten:
    return _rewrite_test(source)


def _rewrite_test(source: str) -> Rewritten:
    try:
        tree = pyast.parse(source)
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
            if _shadowable(value):
                callees.add(value.func.id)
            text = "\n".join(lines[stmt.lineno - 1:(stmt.end_lineno or stmt.lineno)]).strip()
            call = ast.Call(_name("__agentrl_expect__"), [ast.Constant(len(sites)), value], [])
            body[j] = ast.copy_location(ast.Expr(ast.copy_location(call, stmt)), stmt)
            msg = stmt.msg.value if isinstance(stmt.msg, ast.Constant) else None
            sites.append(Site(mode, expected, text[:300], msg if isinstance(msg, str) else None))
    decided = _runner_decided(tree, called)
    try:
        tree = ast.fix_missing_locations(_Plain().visit(tree))
        out = ast.unparse(tree)
        again = pyast.parse(out)
    except (ValueError, RecursionError, MemoryError, SyntaxError):
        return Rewritten(source)
    line_map = {}
    for new, old in zip(ast.walk(again), ast.walk(tree)):
        if isinstance(new, ast.stmt) and isinstance(old, ast.stmt):
            line_map.setdefault(new.lineno, old.lineno)
    return Rewritten(out, tuple(sites), _imports(tree), line_map, tuple(sorted(callees)),
                     decided)
