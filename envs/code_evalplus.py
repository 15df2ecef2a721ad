"""EvalPlus (HumanEval+, MBPP+) tests as sandbox snippets: MBPP+'s JSON inputs decoded back to
Python values, and the diff tests that compare an answer's output with the canonical solution's
on every input (split from `code_datasets`, which builds `CodeTask`s from records with them).

Comparison follows EvalPlus (`evalplus/eval/__init__.py::unsafe_execute`, v0.1.x); the
special oracles and the per-task decoders are described in `code_datasets`' module doc.
"""

from __future__ import annotations

import json
from typing import Any


def _tup(x: Any) -> tuple:
    return tuple(x)


def _all_tuples(x: Any) -> Any:
    return tuple(_all_tuples(i) for i in x) if isinstance(x, list) else x


# MBPP+ task number -> how its JSON inputs become Python values (EvalPlus v0.1.0,
# `evalplus/data/mbpp.py::mbpp_deserialize_inputs`). Each function maps one argument list.
MBPP_PLUS_DECODERS: dict[int, Any] = {}
for _n in (2, 116, 132, 143, 222, 261, 273, 394, 399, 421, 424, 429, 470, 560, 579, 596, 616,
           630, 726, 740, 744, 809):
    MBPP_PLUS_DECODERS[_n] = lambda inp: [_tup(a) for a in inp]
for _n in (63, 64, 70, 94, 120, 237, 272, 299, 400, 409, 417, 438, 473, 614, 780):
    MBPP_PLUS_DECODERS[_n] = lambda inp: [[_tup(x) for x in a] for a in inp]
for _n in (75, 413, 444, 753):
    MBPP_PLUS_DECODERS[_n] = lambda inp: [[_tup(x) for x in inp[0]], inp[1]]
for _n in (106, 750):
    MBPP_PLUS_DECODERS[_n] = lambda inp: [inp[0], _tup(inp[1])]
for _n in (250, 405, 446, 617, 720, 763, 808):
    MBPP_PLUS_DECODERS[_n] = lambda inp: [_tup(inp[0]), inp[1]]
for _n in (259, 401, 445):
    MBPP_PLUS_DECODERS[_n] = lambda inp: [tuple(_tup(x) for x in a) for a in inp]
for _n in (580, 615, 791):
    MBPP_PLUS_DECODERS[_n] = _all_tuples
# EvalPlus turns an empty item into `{}` (a dict) here, not `set()`; kept for fidelity.
MBPP_PLUS_DECODERS[115] = lambda inp: [[set(i) if isinstance(i, list) and i else {} for i in inp[0]]]
MBPP_PLUS_DECODERS[124] = lambda inp: [float(inp[0]), complex(inp[1])]
MBPP_PLUS_DECODERS[252] = lambda inp: [complex(inp[0])]
MBPP_PLUS_DECODERS[278] = lambda inp: [tuple(_tup(i) if isinstance(i, list) else i for i in inp[0])]
MBPP_PLUS_DECODERS[307] = lambda inp: [_tup(inp[0]), inp[1], inp[2]]
MBPP_PLUS_DECODERS[722] = lambda inp: [{k: _tup(v) for k, v in inp[0].items()}, *inp[1:]]

# Comparison modes of EvalPlus's special oracles, by entry point.
MBPP_PLUS_MODES = {
    **dict.fromkeys(("similar_elements", "find_char_long", "common_in_nested_lists",
                     "extract_singly", "larg_nnum", "intersection_array", "find_dissimilar",
                     "Diff"), "set"),
    **dict.fromkeys(("check_str", "text_match_three", "text_starta_endb"), "not_none"),
    "are_equivalent": "or_true",
    "sum_div": "or_zero",
}
HUMANEVAL_PLUS_MODES = {"find_zero": "poly_root"}


def _encode(x: Any) -> Any:
    """Python value -> JSON value with tuples/sets/complex tagged (decoded by `_DIFF_HELPERS`)."""
    if isinstance(x, tuple):
        return {"__tuple__": [_encode(i) for i in x]}
    if isinstance(x, (set, frozenset)):
        return {"__set__": [_encode(i) for i in x]}
    if isinstance(x, complex):
        return {"__complex__": [x.real, x.imag]}
    if isinstance(x, list):
        return [_encode(i) for i in x]
    if isinstance(x, dict):
        return {k: _encode(v) for k, v in x.items()}
    return x


# Source of one diff test. Everything lives inside one function that is deleted afterwards, so
# the test adds no names to the solution namespace and does not depend on names the solution
# may have shadowed (the canonical solution runs in its own namespace).
_DIFF_TEMPLATE = '''
def __agentrl_diff():
    import copy, json, math

    def dec(o):
        if isinstance(o, list):
            return [dec(i) for i in o]
        if isinstance(o, dict):
            if len(o) == 1:
                k, v = next(iter(o.items()))
                if k == "__tuple__":
                    return tuple(dec(i) for i in v)
                if k == "__set__":
                    return set(dec(i) for i in v)
                if k == "__complex__":
                    return complex(v[0], v[1])
            return {{k: dec(v) for k, v in o.items()}}
        return o

    def is_floats(x):
        if isinstance(x, float):
            return True
        if isinstance(x, (list, tuple)) and x:
            return all(isinstance(i, float) for i in x)
        return False

    def close(a, b, atol, rtol=1e-7):
        if isinstance(b, (list, tuple)):
            return isinstance(a, (list, tuple)) and len(a) == len(b) and all(
                close(x, y, atol, rtol) for x, y in zip(a, b))
        if isinstance(a, (int, float)) and isinstance(b, (int, float)):
            if math.isnan(a) or math.isnan(b):
                return math.isnan(a) and math.isnan(b)
            return a == b or abs(a - b) <= atol + rtol * abs(b)
        return a == b

    def same(out, exp, inp):
        mode, atol = {mode!r}, {atol!r}
        if mode == "or_true":
            return out == exp or out is True
        if mode == "set":
            return set(out) == set(exp)
        if mode == "not_none":
            exp = exp is not None
            return out == exp if isinstance(out, bool) else exp == (out is not None)
        if mode == "or_zero":
            return out == exp or out == 0
        if mode == "poly_root":
            xs = inp[0]
            return abs(sum(c * math.pow(out, i) for i, c in enumerate(xs))) <= atol
        exact = out == exp
        if atol == 0 and is_floats(exp):
            atol = 1e-6
        if not exact and atol != 0:
            return close(out, exp, atol)
        return bool(exact)

    ns = {{"__name__": "__agentrl_reference__"}}
    exec({reference!r}, ns)
    ref = ns[{entry!r}]
    cand = globals()[{entry!r}]
    for i, inp in enumerate(dec(json.loads({inputs!r}))):
        exp = ref(*copy.deepcopy(inp))
        out = cand(*copy.deepcopy(inp))
        if not same(out, exp, inp):
            raise AssertionError("{entry}(*{kind}_input[%d]) returned %.120r, expected %.120r"
                                 % ({offset} + i, out, exp))

__agentrl_diff()
del __agentrl_diff
'''


def _chunks(n: int, max_chunks: int) -> list[tuple[int, int]]:
    """Split range(n) into at most `max_chunks` contiguous, nearly equal (start, stop) parts."""
    k = min(n, max_chunks)
    bounds = [round(i * n / k) for i in range(k + 1)] if k else []
    return [(bounds[i], bounds[i + 1]) for i in range(k)]


def diff_tests(entry: str, reference: str, kind: str, inputs: list[Any], atol: float,
               mode: str, max_chunks: int) -> tuple[list[str], list[str]]:
    """The diff tests of `inputs` (`kind`: `base` or `plus`) in at most `max_chunks` snippets,
    each comparing `entry`'s output with `reference`'s by `mode` (`exact`, `set`, `not_none`,
    `or_true`, `or_zero`, `poly_root`) at `atol`; returns (tests, their names `kind[a:b]`)."""
    tests, names = [], []
    for a, b in _chunks(len(inputs), max_chunks):
        data = json.dumps(_encode(inputs[a:b]))
        tests.append(_DIFF_TEMPLATE.format(mode=mode, atol=float(atol), reference=reference,
                                           entry=entry, inputs=data, kind=kind, offset=a))
        names.append(f"{kind}[{a}:{b}]")
    return tests, names
