"""Tasks of `self_propose`: parsing answers, plain-data values, the sandbox harness, the buffer.

Everything here runs in the trusted parent except `HARNESS`, which runs in the sandbox. Values
that cross from the sandbox (or from an answer) are *text*, parsed here with
`ast.literal_eval` and checked to be plain data; equality is the equality of their canonical
text (`canon`), so `1 == 1.0 == True` never makes a wrong answer right.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import math
import threading
from typing import Any

from agentrl.infra import pyast

#: Most characters of a proposed program, of one input or output literal, inputs per task.
MAX_SOURCE_CHARS = 2000
MAX_VALUE_CHARS = 300
MAX_INPUTS = 6
#: Modules a program may import (pure computation; no I/O, no clock, no randomness source).
ALLOWED_IMPORTS = frozenset({"math", "itertools", "functools", "collections", "string", "re",
                             "operator", "heapq", "bisect"})
#: Names a program may not use (I/O, dynamic code, introspection of the harness).
FORBIDDEN_NAMES = frozenset({"open", "input", "print", "exec", "eval", "compile", "__import__",
                             "globals", "locals", "vars", "breakpoint", "exit", "quit", "help",
                             "getattr", "setattr", "delattr", "memoryview"})


class ParseError(ValueError):
    """An answer or value that does not follow the documented format (the message says why)."""


# -- plain data ------------------------------------------------------------------------------------
def canon(value: Any, _depth: int = 0) -> str:
    """The canonical text of a plain-data value: None, bool, int, finite float, str, and
    lists / tuples / dicts of them (dict items sorted by their keys' canonical text), nested at
    most 20 deep. The same function runs in the sandbox (`HARNESS` embeds its source) and here.

    Raises:
        ParseError (ValueError): any other type (exact type check: subclasses are refused), a
            non-finite float, or nesting deeper than 20.
    """
    t = type(value)
    if _depth > 20:
        raise ParseError("value nested more than 20 deep")
    if value is None or t is bool or t is int or t is str:
        return repr(value)
    if t is float:
        if not math.isfinite(value):
            raise ParseError("non-finite float")
        return repr(value)
    if t is list or t is tuple:
        inner = ", ".join(canon(v, _depth + 1) for v in value)
        if t is tuple:
            return "(" + inner + ("," if len(value) == 1 else "") + ")"
        return "[" + inner + "]"
    if t is dict:
        items = sorted((canon(k, _depth + 1), canon(v, _depth + 1)) for k, v in value.items())
        return "{" + ", ".join(f"{k}: {v}" for k, v in items) + "}"
    raise ParseError(f"not plain data: {t.__name__}")


def parse_value(text: str) -> str:
    """Parse a Python literal written by the agent (or printed by the sandbox) into canonical
    text (`canon`). Linear in `len(text)`, which is capped at `MAX_VALUE_CHARS`.

    Raises:
        ParseError: too long, not a literal, or not plain data.
    """
    text = text.strip()
    if not text:
        raise ParseError("empty value")
    if len(text) > MAX_VALUE_CHARS:
        raise ParseError(f"value longer than {MAX_VALUE_CHARS} characters")
    try:
        value = ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as e:
        raise ParseError(f"not a Python literal: {type(e).__name__}") from None
    out = canon(value)
    if len(out) > MAX_VALUE_CHARS:
        raise ParseError(f"value longer than {MAX_VALUE_CHARS} characters")
    return out


# -- answers -----------------------------------------------------------------------------------
def split_fences(text: str) -> tuple[list[tuple[str, str]], list[str]]:
    """One pass over the lines of `text`: the fenced blocks as (tag, code) and the lines outside
    any fence. A fence is a line starting with three backticks; an unclosed final fence runs to
    the end. Linear time (each line is looked at once)."""
    blocks: list[tuple[str, str]] = []
    outside: list[str] = []
    tag: str | None = None
    body: list[str] = []
    for line in text.split("\n"):
        if line.lstrip().startswith("```"):
            if tag is None:
                tag, body = line.lstrip()[3:].strip().lower(), []
            else:
                blocks.append((tag, "\n".join(body)))
                tag = None
        elif tag is None:
            outside.append(line)
        else:
            body.append(line)
    if tag is not None:
        blocks.append((tag, "\n".join(body)))
    return blocks, outside


def labelled(lines: list[str], label: str) -> list[str]:
    """The rest of each line that starts (after spaces) with `label:` (case-insensitive)."""
    n = len(label) + 1
    key = label.lower() + ":"
    return [ln.strip()[n:] for ln in lines if ln.strip()[:n].lower() == key]


def parse_program(text: str, allowed: frozenset[str] | set[str] = ALLOWED_IMPORTS) -> str:
    """The program of an answer: the last fenced block tagged python/py (or untagged); it may
    import only modules of `allowed` (top-level names).

    Raises:
        ParseError: no block, too long, a syntax error, no top-level `def f(x)` with exactly one
            positional parameter, an import outside `ALLOWED_IMPORTS`, or a forbidden name.
    """
    blocks, _ = split_fences(text)
    code = [c for tag, c in blocks if tag in ("", "python", "py", "python3")]
    if not code:
        raise ParseError("no ```python block")
    src = code[-1].strip("\n")
    if len(src) > MAX_SOURCE_CHARS:
        raise ParseError(f"program longer than {MAX_SOURCE_CHARS} characters")
    try:
        tree = pyast.parse(src)
    except (SyntaxError, ValueError, MemoryError, RecursionError) as e:
        raise ParseError(f"program does not parse: {type(e).__name__}") from None
    f = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "f"]
    if not f:
        raise ParseError("no top-level `def f(x):`")
    a = f[-1].args
    if len(a.posonlyargs) + len(a.args) != 1 or a.vararg or a.kwarg or a.kwonlyargs:
        raise ParseError("f must take exactly one positional parameter")
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            bad = [m for m in mods if m.split(".")[0] not in allowed]
            if bad:
                raise ParseError(f"import of {bad[0]!r} is not allowed")
        elif isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
            raise ParseError(f"name {node.id!r} is not allowed")
        elif isinstance(node, ast.Attribute) and node.attr.startswith("__"):
            raise ParseError("dunder attributes are not allowed")
        elif isinstance(node, ast.Name) and node.id.startswith("__"):
            raise ParseError("dunder names are not allowed")
    return src


def parse_proposal(text: str, allowed: frozenset[str] | set[str] = ALLOWED_IMPORTS) -> tuple[str, list[str]]:
    """A proposal: a ```python block defining `f(x)`, then 1..`MAX_INPUTS` lines
    `Input: <literal>` outside the block. Returns (program, canonical inputs).

    Raises:
        ParseError: see `parse_program` and `parse_value`; no `Input:` line; too many inputs.
    """
    src = parse_program(text, allowed)
    _, outside = split_fences(text)
    raw = labelled(outside, "input")
    if not raw:
        raise ParseError("no `Input:` line")
    if len(raw) > MAX_INPUTS:
        raise ParseError(f"more than {MAX_INPUTS} inputs")
    return src, [parse_value(r) for r in raw]


def parse_labelled_value(text: str, label: str) -> str:
    """The value of a solve answer: the last `<label>: <literal>` line outside code fences, or,
    without one, the last non-empty line. Returns canonical text.

    Raises:
        ParseError: nothing to parse, or see `parse_value`.
    """
    _, outside = split_fences(text)
    found = labelled(outside, label)
    if found:
        return parse_value(found[-1])
    rest = [ln for ln in outside if ln.strip()]
    if not rest:
        raise ParseError(f"no `{label.capitalize()}:` line")
    return parse_value(rest[-1])


def arg_unused(src: str) -> bool:
    """True when `f`'s parameter is never read in its body (a constant function)."""
    tree = pyast.parse(src)
    f = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "f"][-1]
    a = f.args
    name = (a.posonlyargs + a.args)[0].arg
    return not any(isinstance(n, ast.Name) and n.id == name for b in f.body for n in ast.walk(b))


def trivial_reason(src: str, inputs: list[str], outputs: list[str]) -> str | None:
    """Why a valid, deterministic task is trivial, or None. Trivial: `f` never reads its
    parameter; every output equals its input; every output is None; or two or more distinct
    inputs all give the same output."""
    if arg_unused(src):
        return "f ignores its input (constant function)"
    if all(i == o for i, o in zip(inputs, outputs)):
        return "output equals input"
    if all(o == "None" for o in outputs):
        return "f returns None"
    if len(set(inputs)) > 1 and len(set(outputs)) == 1:
        return "the same output for every input (constant on its inputs)"
    return None


def normalise(src: str) -> str:
    """Source without comments or formatting (`ast.unparse`), for duplicate detection."""
    return ast.unparse(pyast.parse(src))


def task_key(src: str, inputs: list[str]) -> str:
    """The identity of a task: SHA-256 (16 hex digits) of its normalised source and inputs."""
    return hashlib.sha256((normalise(src) + "\0" + "\0".join(inputs)).encode()).hexdigest()[:16]


def docstring(src: str) -> str | None:
    """`f`'s docstring (its first line), or None."""
    tree = pyast.parse(src)
    f = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "f"][-1]
    doc = ast.get_docstring(f)
    return doc.strip().split("\n")[0] if doc else None


# -- the sandbox harness -------------------------------------------------------------------------
MARK = "@@SELF_PROPOSE_OUT@@"
_CANON_SRC = '''
def _canon(value, _depth=0, _type=type, _repr=repr, _fin=__import__("math").isfinite):
    t = _type(value)
    if _depth > 20:
        raise ValueError("value nested more than 20 deep")
    if value is None or t is bool or t is int or t is str:
        return _repr(value)
    if t is float:
        if not _fin(value):
            raise ValueError("non-finite float")
        return _repr(value)
    if t is list or t is tuple:
        inner = ", ".join([_canon(v, _depth + 1) for v in value])
        if t is tuple:
            return "(" + inner + ("," if len(value) == 1 else "") + ")"
        return "[" + inner + "]"
    if t is dict:
        items = sorted([(_canon(k, _depth + 1), _canon(v, _depth + 1)) for k, v in value.items()])
        return "{" + ", ".join([k + ": " + v for k, v in items]) + "}"
    raise ValueError("not plain data: " + t.__name__)
'''


def harness(src: str, inputs: list[str]) -> str:
    """The program run in the sandbox: defines the canonicaliser and the writer first, then
    executes `src` in its own namespace and prints one line per input, `MARK` followed by the
    canonical output or `!ErrorName`. The parent reads only those lines (`read_outputs`)."""
    return (
        "import os as _os, ast as _ast\n_w = _os.write\n" + _CANON_SRC
        + f"_ns = {{'__name__': 'task'}}\nexec(compile({src!r}, '<program>', 'exec'), _ns)\n"
        + "_f = _ns['f']\n"
        + f"for _s in {inputs!r}:\n"
        + "    try:\n        _o = _canon(_f(_ast.literal_eval(_s)))\n"
        + "    except Exception as _e:\n        _o = '!' + type(_e).__name__\n"
        + f"    _w(1, ('\\n{MARK}' + _o + '\\n').encode())\n")


def read_outputs(stdout: str, n: int) -> list[str] | None:
    """The `n` outputs printed by `harness` (canonical text, or `!ErrorName`), re-parsed here
    as plain data; None when the run did not print exactly `n` of them or one is not plain
    data."""
    outs = [ln[len(MARK):] for ln in stdout.split("\n") if ln.startswith(MARK)]
    if len(outs) != n:
        return None
    res = []
    for o in outs:
        if o.startswith("!"):
            res.append(o if o[1:].isidentifier() else "!Error")
            continue
        try:
            res.append(parse_value(o))
        except ParseError:
            return None
    return res


# -- tasks and the buffer ----------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Task:
    """A buffered task: program `src` defining `f(x)`, canonical `inputs` and `outputs`."""

    src: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    origin: str = "seed"  # "seed" or "proposed"

    @property
    def key(self) -> str:
        return task_key(self.src, list(self.inputs))

    def to_dict(self) -> dict[str, Any]:
        return {"src": self.src, "inputs": list(self.inputs), "outputs": list(self.outputs),
                "origin": self.origin}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Task:
        return Task(str(d["src"]), tuple(d["inputs"]), tuple(d["outputs"]), str(d.get("origin", "seed")))


def _seed(src: str, inputs: list[Any], outputs: list[Any]) -> Task:
    return Task(src, tuple(canon(i) for i in inputs), tuple(canon(o) for o in outputs))


#: Built-in tasks the buffer starts from (outputs computed by hand; tests re-run them).
SEED_TASKS: tuple[Task, ...] = (
    _seed("def f(x):\n    return x * x + 3 * x - 1", [2, 5, -1], [9, 39, -3]),
    _seed("def f(x):\n    return x[1::2]", ["abc", "hello", "xy"], ["b", "el", "y"]),
    _seed("def f(x):\n    return sum(v for v in x if v % 2 == 0)", [[1, 2, 3, 4], [5, 7], [6]], [6, 0, 6]),
    _seed("def f(x):\n    return len(x) - len(set(x))", ["banana", "abc", "aaaa"], [3, 0, 3]),
    _seed("def f(x):\n    return [v * v for v in x]", [[1, 2, 3], [], [-2]], [[1, 4, 9], [], [4]]),
    _seed("def f(x):\n    return x.count('a') + x.count('b')", ["banana", "Abba", "xyz"], [4, 3, 0]),
)
#: Held-out tasks for evaluation (deduce mode); never in the buffer.
HELDOUT_TASKS: tuple[Task, ...] = (
    _seed("def f(x):\n    return x * x - 3", [4, 0], [13, -3]),
    _seed("def f(x):\n    return x[0] + x[-1]", [[1, 2, 3], [4]], [4, 8]),
    _seed("def f(x):\n    return ''.join(sorted(x))", ["cab", "ba"], ["abc", "ab"]),
    _seed("def f(x):\n    return max(x) - min(x)", [[3, 9, 1], [5]], [8, 0]),
)


class TaskBuffer:
    """The tasks the proposer sees as examples and the solver is given: the seed tasks, then
    valid proposals in order, at most `cap` in all (the oldest *proposed* task is dropped
    first; seed tasks stay). `fresh` holds the keys added since the last `finish_batch` (the
    tasks solve groups are given first). Thread-safe."""

    def __init__(self, cap: int = 256, seeds: tuple[Task, ...] = SEED_TASKS):
        if cap < len(seeds):
            raise ValueError(f"buffer_cap: must be >= the {len(seeds)} seed tasks, got {cap}")
        self.cap = int(cap)
        self.lock = threading.RLock()
        self.tasks: list[Task] = list(seeds)
        self.keys: set[str] = {t.key for t in self.tasks}
        self.fresh: list[str] = []
        self.assigned: dict[int, str] = {}

    def add(self, task: Task) -> bool:
        """Append `task` unless its key is already here (False: a duplicate)."""
        with self.lock:
            if task.key in self.keys:
                return False
            self.tasks.append(task)
            self.keys.add(task.key)
            self.fresh.append(task.key)
            while len(self.tasks) > self.cap:
                i = next(i for i, t in enumerate(self.tasks) if t.origin != "seed")
                self.keys.discard(self.tasks.pop(i).key)
            return True

    def get(self, key: str) -> Task | None:
        with self.lock:
            return next((t for t in self.tasks if t.key == key), None)

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state: the tasks in order, the cap and the fresh keys."""
        with self.lock:
            return {"cap": self.cap, "tasks": [t.to_dict() for t in self.tasks],
                    "fresh": list(self.fresh)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace the contents with `state_dict()`'s (the cap stays this buffer's)."""
        with self.lock:
            self.tasks = [Task.from_dict(d) for d in state["tasks"]]
            self.keys = {t.key for t in self.tasks}
            self.fresh = [k for k in state.get("fresh", []) if k in self.keys]
            self.assigned = {}


_BUFFERS: dict[str, TaskBuffer] = {}
_BUFFERS_LOCK = threading.Lock()


def shared_buffer(name: str, cap: int) -> TaskBuffer:
    """The process-wide buffer `name` (made on first use), shared by every env copy that
    names it: the run's train envs share one."""
    with _BUFFERS_LOCK:
        if name not in _BUFFERS:
            _BUFFERS[name] = TaskBuffer(cap)
        return _BUFFERS[name]
