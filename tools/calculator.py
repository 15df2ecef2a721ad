"""`calculator`: safe arithmetic by walking the expression's `ast` (no `eval`).

Allowed: int and float literals, `+ - * / // % **`, unary `+ -`, parentheses, the constants
`pi`, `e`, `tau`, and the functions `abs round min max sqrt exp log log10 log2 sin cos tan
floor ceil`. Everything else (names, attributes, strings, comprehensions, `^`, ...) is refused.
Results whose size could exhaust memory or time are refused before they are computed: an integer
result longer than `MAX_INT_BITS` bits (about 3,000 decimal digits), e.g. `9**99999`.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import Any

from agentrl_tools.registry import ToolError, tool

MAX_EXPRESSION_CHARS = 1000
MAX_INT_BITS = 10_000

Number = int | float

_CONSTANTS: dict[str, float] = {"pi": math.pi, "e": math.e, "tau": math.tau}
_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "abs": abs, "round": round, "min": min, "max": max, "sqrt": math.sqrt, "exp": math.exp,
    "log": math.log, "log10": math.log10, "log2": math.log2, "sin": math.sin, "cos": math.cos,
    "tan": math.tan, "floor": math.floor, "ceil": math.ceil,
}
_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def _bits(x: Number) -> float:
    """Bits needed for the integer part of |x| (log2, at least 1)."""
    return max(1.0, math.log2(abs(x))) if x else 1.0


def _check_size(op: type, a: Number, b: Number) -> None:
    """Refuse integer products and powers whose result would exceed MAX_INT_BITS bits.

    A product of integers has at most bits(a) + bits(b) bits; a power a**b has about
    b * log2|a| bits (for |a| > 1, b > 0).
    """
    if not (isinstance(a, int) and isinstance(b, int)):
        return
    if op is ast.Mult and a.bit_length() + b.bit_length() > MAX_INT_BITS:
        raise ToolError(f"result too large (more than {MAX_INT_BITS} bits)")
    if op is ast.Pow and b > 0 and abs(a) > 1 and b * _bits(a) > MAX_INT_BITS:
        raise ToolError(f"exponent too large: {a}**{b} would have more than {MAX_INT_BITS} bits")


def _eval(node: ast.AST) -> Number:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int | float):
            raise ToolError(f"only numbers are allowed, got {node.value!r}")
        return node.value
    if isinstance(node, ast.Name):
        if node.id in _CONSTANTS:
            return _CONSTANTS[node.id]
        raise ToolError(f"unknown name {node.id!r}; constants: {', '.join(_CONSTANTS)}")
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp):
        if isinstance(node.op, ast.BitXor):
            raise ToolError("'^' is not a power operator here; write a**b")
        if type(node.op) not in _BINARY:
            raise ToolError(f"operator {type(node.op).__name__} is not allowed")
        a, b = _eval(node.left), _eval(node.right)
        _check_size(type(node.op), a, b)
        if isinstance(node.op, ast.Pow) and a == 0 and b < 0:
            raise ToolError("division by zero (0 raised to a negative power)")
        return _BINARY[type(node.op)](a, b)
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in _FUNCTIONS:
            shown = node.func.id if isinstance(node.func, ast.Name) else ast.unparse(node.func)
            raise ToolError(f"unknown function {shown!r}; functions: {', '.join(_FUNCTIONS)}")
        if node.keywords:
            raise ToolError("keyword arguments are not allowed")
        return _FUNCTIONS[node.func.id](*[_eval(a) for a in node.args])
    raise ToolError(f"{type(node).__name__} is not allowed in an arithmetic expression")


def evaluate(expression: str) -> Number:
    """Value of an arithmetic expression (see the module docstring for what is allowed).

    Raises:
        ToolError: syntax error, disallowed construct, division by zero, a result too large,
            a math domain error, or a result that is not finite.
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as e:
        raise ToolError(f"invalid expression: {e.msg}") from None
    except (RecursionError, MemoryError, ValueError):
        raise ToolError("invalid expression: too deeply nested") from None
    try:
        value = _eval(tree)
    except ZeroDivisionError:
        raise ToolError("division by zero") from None
    except OverflowError:
        raise ToolError("result too large") from None
    except RecursionError:
        raise ToolError("expression too deeply nested") from None
    except (ValueError, TypeError) as e:
        raise ToolError(f"math error: {e}") from None
    if isinstance(value, complex):
        raise ToolError("the result is a complex number")
    if isinstance(value, float) and not math.isfinite(value):
        raise ToolError("the result is not a finite number")
    return value


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression and return the result.

    Supports + - * / // % ** and parentheses, the constants pi, e and tau, and the functions
    abs, round, min, max, sqrt, exp, log, log10, log2, sin, cos, tan, floor and ceil.

    Args:
        expression: the expression, in Python syntax, e.g. "(3 + 4) * 2**10 / 7".
    """
    return repr(evaluate(expression))
