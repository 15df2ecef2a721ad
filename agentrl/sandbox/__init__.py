"""Hermetic execution of untrusted Python: ``run_tests`` for judging, ``run_code`` for tools.

Backends (``auto`` picks the first *isolated* one that works, else raises): ``bwrap``
(bubblewrap namespaces, the default), ``docker`` (through the ``docker`` SDK when an engine is
reachable), ``subprocess`` (rlimits only, not isolated: only when named, logs a warning, and its
results are marked ``unisolated``).  Tests are rewritten so that verdicts never trust objects
the solution built (docs/sandbox.md, "Reward hacking").  Every run happens in a fresh child forked by a warm
server inside the sandbox; see docs/sandbox.md for the security model and known gaps.
"""

from __future__ import annotations

from .pool import SandboxPool, available_backends, default_pool
from .result import VERDICTS, Limits, SandboxResult, TestOutcome

__all__ = [
    "Limits", "TestOutcome", "SandboxResult", "SandboxPool", "VERDICTS",
    "run_tests", "run_code", "available_backends",
]


def run_tests(code: str, tests: list[str], *, setup: str = "", names: list[str] | None = None,
              limits: Limits | None = None, backend: str = "auto") -> SandboxResult:
    """Run ``setup``, then the solution ``code``, then each test snippet, in a fresh sandbox.

    code: the solution's Python source, ``str`` or UTF-8 ``bytes`` (executed as module
      ``solution``; an ``if __name__ == "__main__":`` block does not run).
    tests: Python sources, each executed after the solution in a copy of its namespace with
      pristine builtins, e.g. ``'assert f(2) == 4'`` or a HumanEval ``def check(candidate):
      ...`` followed by ``check(f)``.  A test passes iff it ran to its end and every
      expectation the runner holds for it (``assert f(x) == <literal>`` and the like) was
      reported with the expected value (docs/sandbox.md, "Reward hacking").
    setup: source run first in the solution's namespace (imports, helpers).
    names: one display name per test (default ``test_0``, ``test_1``, ...).
    limits: resource limits (default ``Limits()``); backend: ``auto``/``bwrap``/``docker``/
      ``subprocess``.

    Returns a SandboxResult.  Never raises for anything the solution does; an infrastructure
    failure gives verdict ``sandbox_error``.  Raises ValueError for bad arguments (unknown or
    unavailable backend, ``names`` of the wrong length), TypeError for a source that is not
    str/bytes, and BackendError when ``auto`` finds no isolated backend.
    """
    return default_pool(backend).run_tests(code, tests, setup=setup, names=names, limits=limits)


def run_code(code: str, *, stdin: str = "", limits: Limits | None = None,
             backend: str = "auto") -> SandboxResult:
    """Execute ``code`` as ``__main__`` with ``stdin`` (text) in a fresh sandbox.

    For the agent's python tool, not for judging: verdict ``pass`` when the program ran to the
    end or exited with status 0, otherwise runtime_error / syntax_error / timeout /
    memory_limit / output_limit; stdout and stderr are captured (capped at
    ``limits.output_bytes``).  ``passed``/``total`` are 0.  Never raises for anything the code
    does.
    """
    return default_pool(backend).run_code(code, stdin=stdin, limits=limits)
