"""`parse`: `ast.parse` under one process-wide lock, for every parse of Python source in the
trainer's process (the sandbox runner's test rewriter and judge, the code envs' datasets, test
splits, repair mutations and self-proposed tasks, the calculator tool).

CPython 3.11 before 3.11.8 keeps the AST converter's recursion-depth counter per interpreter,
not per thread (CPython gh-106905): `ast.parse` in two threads at once (env threads stepping
sandbox runs, a thread pool checking references, tool calls) can raise `SystemError: AST constructor
recursion depth mismatch` on valid source, which surfaced as a sandbox_error on an honest
solution (issue 42) and as a failed dataset load in a test. A lock held only by some callers
does not help: every caller in this process must take the same one, so no module parses
source any other way (`tests/test_layout.py` checks)."""

from __future__ import annotations

import ast
import threading
from typing import Any

LOCK = threading.Lock()
"""Held for the duration of one `ast.parse` call (parsing is fast: the rest of a caller's work
runs unlocked)."""


def parse(source: str, filename: str = "<unknown>", **kwargs: Any) -> Any:
    """`ast.parse(source, filename, **kwargs)` under `LOCK`: an `ast.Module` (an
    `ast.Expression` with `mode="eval"`).

    Raises:
        SyntaxError, ValueError, RecursionError: as `ast.parse` does.
    """
    with LOCK:
        return ast.parse(source, filename, **kwargs)
