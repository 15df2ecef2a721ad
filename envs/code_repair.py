"""Reference repairs for the warm start of the multi-turn code job: a wrong attempt (the task's
reference solution with one small mutation), the env's real feedback on it (a sandbox run,
public tests only), and the fix (the reference solution).

Mutations (`mutants`), each one AST edit of the reference, the kind of slip a model makes:
an integer constant off by one; an arithmetic operator swapped (`+`/`-`, `*`->`+`, `//`/`%`,
`**`->`*`); a comparison loosened or tightened (`>`/`>=`, `<`/`<=`, `==`/`!=`); `max`/`min`,
`sum`->`len`, `upper`/`lower`, `startswith`/`endswith` swapped; `reverse=True`/`False` flipped.
A mutant the tests still pass is no wrong attempt: `repair_demo` skips it.
"""

from __future__ import annotations

import ast
import copy
from typing import Any

import numpy as np

from agentrl.infra import pyast

_BINOPS: dict[type, type] = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Add,
                             ast.FloorDiv: ast.Mod, ast.Mod: ast.FloorDiv, ast.Pow: ast.Mult}
_CMPOPS: dict[type, type] = {ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Lt: ast.LtE, ast.LtE: ast.Lt,
                             ast.Eq: ast.NotEq, ast.NotEq: ast.Eq}
_NAMES = {"max": "min", "min": "max", "sum": "len", "upper": "lower", "lower": "upper",
          "startswith": "endswith", "endswith": "startswith"}


def _edits(tree: ast.AST) -> list[tuple[int, str]]:
    """(node index in `ast.walk` order, kind) of every possible edit of `tree`."""
    out = []
    for i, n in enumerate(ast.walk(tree)):
        if isinstance(n, ast.Constant) and type(n.value) is int:
            out.append((i, "const"))
        elif isinstance(n, ast.BinOp) and type(n.op) in _BINOPS:
            out.append((i, "binop"))
        elif isinstance(n, ast.Compare) and type(n.ops[0]) in _CMPOPS:
            out.append((i, "cmp"))
        elif isinstance(n, ast.Name) and n.id in _NAMES and isinstance(n.ctx, ast.Load):
            out.append((i, "name"))
        elif isinstance(n, ast.Attribute) and n.attr in _NAMES:
            out.append((i, "attr"))
        elif isinstance(n, ast.keyword) and n.arg == "reverse" and isinstance(n.value, ast.Constant):
            out.append((i, "reverse"))
    return out


def _apply(tree: ast.AST, index: int, kind: str) -> ast.AST:
    tree = copy.deepcopy(tree)
    node: Any = list(ast.walk(tree))[index]
    if kind == "const":
        node.value = node.value + 1
    elif kind == "binop":
        node.op = _BINOPS[type(node.op)]()
    elif kind == "cmp":
        node.ops = [_CMPOPS[type(node.ops[0])](), *node.ops[1:]]
    elif kind == "name":
        node.id = _NAMES[node.id]
    elif kind == "attr":
        node.attr = _NAMES[node.attr]
    elif kind == "reverse":
        node.value = ast.Constant(not node.value.value)
    return tree


def mutants(solution: str, rng: np.random.Generator, limit: int = 4) -> list[str]:
    """Up to `limit` distinct one-edit mutants of `solution` (module doc), in an order drawn
    with `rng`; [] when it does not parse or offers no edit."""
    try:
        tree = pyast.parse(solution)
    except SyntaxError:
        return []
    edits = _edits(tree)
    out: list[str] = []
    for j in rng.permutation(len(edits)):
        src = ast.unparse(_apply(tree, *edits[int(j)]))
        if src not in out and src != ast.unparse(tree):
            out.append(src)
        if len(out) >= limit:
            break
    return out


def repair_demo(env: Any, rng: np.random.Generator) -> tuple[str, list[dict[str, Any]], str] | None:
    """A reference repair of `env`'s current task (a `CodeSandboxEnv` just reset, with
    `max_turns` > 1): `(wrong attempt, the env's feedback messages on it, the fix)`. The feedback
    is the env's own `step` (a real sandbox run; the public tests only). None when the task has
    no reference solution or no mutant of it fails."""
    fix = env.reference_answer()
    if not fix or env.max_turns < 2:
        return None
    for wrong in mutants(fix, rng):
        obs, _, term, trunc, info = env.step(wrong)
        if obs and not (term or trunc) and not info.get("success"):
            return wrong, obs, fix
        if term or trunc:
            return None
    return None
