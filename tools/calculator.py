"""`calculator`: safe arithmetic by walking the expression's `ast` (no `eval`).

Allowed: int and float literals, `+ - * / // % **`, unary `+ -`, parentheses, the constants
`pi`, `e`, `tau`, and the functions `abs round min max sqrt exp log log10 log2 sin cos tan
floor ceil`. Everything else (names, attributes, strings, comprehensions, `^`, ...) is refused.
Cost bounds (the evaluator runs in the caller's process, and CPython's big-integer arithmetic
holds the GIL, so a timeout thread could not stop it; every operation is therefore checked before
it runs, so that no expression of at most `MAX_EXPRESSION_CHARS` characters costs more than a few
milliseconds or more than a few KiB):

- `*` of two integers and `**` with an integer result are refused when the result would be longer
  than `MAX_INT_BITS` bits (about 3,000 decimal digits): `9**99999`, `(2**9999)*(2**9999)`;
  the bound is checked from the operands' bit lengths, before multiplying.
- `round(x, n)`: an integer `x` with `-n` above its digit count is 0 (computed without forming
  `10**-n`, which for `round(1, -10**7)` alone takes seconds); a float `x` takes `n` clamped to
  [-400, 400] (beyond +-323 a float's rounding no longer changes, so the result is the same).
- `+ - // %`, `abs min max floor ceil` never give a result longer than their operands (plus one
  bit), so with operands bounded as above they are cheap; the float functions convert big
  integers to float first (an `OverflowError`, reported as "result too large").
- The parser itself is bounded by the expression length; a too deeply nested expression is
  refused.
There are no strings, sequences, comprehensions, `factorial` or 3-argument `pow`, so no repeat
counts or other size arguments exist to abuse.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import Any

from agentrl.infra import pyast
from agentrl_tools.registry import ToolError, tool

MAX_EXPRESSION_CHARS = 1000
MAX_INT_BITS = 10_000

Number = int | float

#: |ndigits| beyond which rounding a float no longer changes (CPython's NDIGITS_MAX is ~323)
_FLOAT_NDIGITS = 400


def _round(*args: Number) -> Number:
    """`round(x)` / `round(x, ndigits)` with its cost bounded (see the module docstring); same
    results as the builtin.

    Raises:
        TypeError: not 1 or 2 arguments, or a float `ndigits`.
    """
    if not 1 <= len(args) <= 2:
        raise TypeError(f"round() takes 1 or 2 arguments ({len(args)} given)")
    x, ndigits = args[0], (args[1] if len(args) == 2 else None)
    if ndigits is None or not isinstance(ndigits, int):
        return round(x) if ndigits is None else round(x, ndigits)  # a float ndigits: TypeError
    if isinstance(x, float):
        return round(x, max(-_FLOAT_NDIGITS, min(_FLOAT_NDIGITS, ndigits)))
    if ndigits >= 0:
        return x  # rounding an integer to >= 0 decimals leaves it unchanged
    # |x| < 10**d with d = floor(bits * log10(2)) + 1, so 10**-ndigits >= 10**(d+1) > 2|x|: 0
    if -ndigits > int(x.bit_length() * math.log10(2)) + 1:
        return 0
    return round(x, ndigits)


_CONSTANTS: dict[str, float] = {"pi": math.pi, "e": math.e, "tau": math.tau}
_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "abs": abs, "round": _round, "min": min, "max": max, "sqrt": math.sqrt, "exp": math.exp,
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
    if "\x00" in expression:
        raise ToolError("invalid expression: it contains a NUL character")
    bad = next((c for c in expression if "\ud800" <= c <= "\udfff"), None)
    if bad is not None:
        raise ToolError(f"invalid expression: it contains a lone surrogate (U+{ord(bad):04X}), "
                        "which is not text")
    try:
        tree = pyast.parse(expression.strip(), mode="eval")
    except SyntaxError as e:
        raise ToolError(f"invalid expression: {e.msg}") from None
    except (RecursionError, MemoryError):
        raise ToolError("invalid expression: too deeply nested") from None
    except ValueError as e:  # anything else the parser refuses as input
        raise ToolError(f"invalid expression: {e}") from None
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
