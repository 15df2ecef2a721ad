"""Building jobs for the server and turning its raw observations into a SandboxResult.

A test passes only if (1) the report has a line ``P <i> <token>`` carrying that test's per-run
random token (``secrets.token_hex``), which the harness writes after ``exec`` of the test
returned normally, and (2) every expectation site the runner holds for it (``rewrite.py``:
``assert f(x) == <literal>`` and the like) was reported (``E <i> <k> <json>``) at least once and
every reported value equals the expectation, compared here, outside the sandbox.  (2) cannot be
forged without producing the right values, whatever the solution does inside its process: the
expected values never enter the sandbox.  Exit codes, stdout and every other report line can be
forged by the solution and are used only to explain failures, never to grant a pass.
"""

from __future__ import annotations

import ast
import base64
import builtins
import json
import re
import secrets
import signal
from typing import Any

from .result import Limits, SandboxResult, TestOutcome
from .rewrite import Site, bound_names, rewrite_test


def make_job(mode: str, code: str, tests: list[str], setup: str, stdin: str,
             limits: Limits, force_split: bool = False) -> dict:
    """The JSON job for the server.  ``tokens[0]`` marks 'solution ran', ``tokens[1+i]`` test i.

    A ``tests`` job runs in two processes (``split``: the tests never share a process with
    solution code, and the tokens are per-run secrets) unless every test is decided by its
    runner-held sites alone (:func:`one_process_safe`, e.g. the built-in tasks'
    ``assert f(x) == <literal>``): then it runs in one process (1.3-2x the runs per second),
    and its tokens are plain markers, since a pass there rests on the sites only and nothing
    secret enters the process (docs/sandbox.md, "one-process runs").  ``force_split=True``
    always splits.  Raises ValueError for an unknown ``mode``, TypeError for a source that is
    neither str nor bytes.
    """
    if mode not in ("tests", "code"):
        raise ValueError(f"mode must be 'tests' or 'code', got {mode!r}")
    code, setup = source_text(code, "code"), source_text(setup, "setup")
    tests = [source_text(t, "tests[]") for t in tests]
    rewritten = [rewrite_test(t) for t in tests]
    imports = sorted({name for r in rewritten for name in r.imports})
    split = mode == "tests" and (force_split or not one_process_safe(rewritten, setup))
    return {
        "mode": mode, "split": split, "code": code, "tests": [r.source for r in rewritten],
        "setup": setup, "stdin": stdin, "imports": imports,
        "site_callees": sorted({n for r in rewritten for n in r.site_callees}),
        "setup_stubs": setup_stubs(setup),
        "tokens": ([secrets.token_hex(16) for _ in range(len(tests) + 1)] if split
                   else [f"m{i}" for i in range(len(tests) + 1)]),
        "limits": limits.to_dict(),
        # runner-only (never sent): the original tests and their expectations
        "_tests": list(tests), "_rewritten": rewritten,
    }


def setup_stubs(setup: str) -> list[str]:
    """Functions ``setup`` defines at module level with no body but a docstring, ``pass``,
    ``...`` or imports (HumanEval's prompt stubs its entry point this way; /115's has an
    ``import math``): the only setup names the
    solution may replace in a split run.  Setup functions with a real body (the prompt's
    helpers: ``encode_shift``, ``poly``) stay the setup's, since tests check answers with them."""
    try:
        tree = ast.parse(setup)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return []

    def empty(stmt: ast.stmt) -> bool:
        return isinstance(stmt, (ast.Pass, ast.Import, ast.ImportFrom)) or (
            isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant))

    return sorted(s.name for s in tree.body
                  if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))
                  and all(empty(b) for b in s.body))


def one_process_safe(rewritten: list, setup: str) -> bool:
    """May these rewritten tests run in one process with the solution?  Only if there is at
    least one, every one is decided by its runner-held sites (``Rewritten.decided_by``), and
    none of the names whose results the sites report is a builtin or bound by ``setup`` (then
    trusted code, not the solution, would compute the reported value)."""
    if not rewritten or any(r.decided_by is None for r in rewritten):
        return False
    names = {n for r in rewritten for n in r.decided_by}
    if names & set(vars(builtins)):
        return False
    try:
        tree = ast.parse(setup)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False
    # a setup of anything but plain imports may bind names in ways bound_names cannot see
    # (`from m import *`, `match ... case name`, `globals()[...] = ...`): split
    if not all(isinstance(s, ast.Import) or (isinstance(s, ast.ImportFrom)
                                             and all(a.name != "*" for a in s.names))
               for s in tree.body):
        return False
    return not names & bound_names(tree)


def source_text(src: str | bytes, what: str) -> str:
    """Python source as text: bytes are decoded as UTF-8 (undecodable bytes become U+FFFD, which
    then fails to compile like any bad character) and a leading UTF-8 BOM is dropped.  Raises
    TypeError for anything else."""
    if isinstance(src, (bytes, bytearray)):
        src = bytes(src).decode("utf-8", "replace")
    if not isinstance(src, str):
        raise TypeError(f"{what} must be str or bytes, got {type(src).__name__}")
    return src[1:] if src.startswith("\ufeff") else src


def decode_plain(v: Any) -> Any:
    """The harness's tagged JSON (``_server._enc``) -> plain Python data; ValueError if malformed."""
    if v is None or type(v) in (int, float, str, bool):
        return v
    if type(v) is list:
        return [decode_plain(x) for x in v]
    if type(v) is dict and len(v) == 1:
        (tag, x), = v.items()
        if tag == "t" and type(x) is list:
            return tuple(decode_plain(i) for i in x)
        if tag in ("s", "f") and type(x) is list:
            items = [decode_plain(i) for i in x]
            return set(items) if tag == "s" else frozenset(items)
        if tag == "d" and type(x) is list:
            return {decode_plain(k): decode_plain(val) for k, val in x}
        if tag == "b" and type(x) is str:
            return base64.b64decode(x, validate=True)
        if tag == "c" and type(x) is list and len(x) == 2:
            return complex(float(x[0]), float(x[1]))
        if tag == "r" and type(x) is list and len(x) == 3:
            return range(int(x[0]), int(x[1]), int(x[2]))
        if tag == "m":
            return _Match()
    raise ValueError("malformed plain-data encoding")


class _Match:
    """Stands for a re.Match the harness reported: truthy, equal only to itself (as Match)."""

    def __bool__(self) -> bool:
        return True


def site_holds(site: Site, body: str) -> bool:
    """Does the reported value ``body`` (tagged JSON) satisfy ``site``?  Never raises."""
    if body.startswith("!"):
        return False
    try:
        value = decode_plain(json.loads(body))
        if site.mode == "eq":
            return bool(value == site.expected)
        return bool(value) == (site.mode == "truthy")
    except Exception:  # noqa: BLE001 - malformed, too deep, unhashable...: not satisfied
        return False


_AT_LINE = re.compile(r" @L(\d+)$")


def _locate(msg: str, job: dict, i: int | None) -> str:
    """Turn the harness's ' @L<n>' (line n of rewritten test i) into the original line."""
    m = _AT_LINE.search(msg)
    if m is None:
        return msg
    msg = msg[:m.start()]
    try:
        rw = job["_rewritten"][i]
        line = job["_tests"][i].splitlines()[rw.line_map.get(int(m.group(1)), 0) - 1].strip()
        return msg + f" (at `{line[:200]}`)" if line else msg
    except (KeyError, IndexError, TypeError):
        return msg


def _unescape(s: str) -> str:
    out, i = [], 0
    while i < len(s):
        c = s[i]
        if c == "\\" and i + 1 < len(s):
            out.append("\n" if s[i + 1] == "n" else s[i + 1])
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def parse_report(data: bytes) -> list[tuple[str, str]]:
    """Report bytes -> [(kind, rest-of-line)], lines unescaped; malformed lines are skipped."""
    events = []
    for raw in data.decode("utf-8", errors="replace").split("\n"):
        if raw:
            kind, _, rest = raw.partition(" ")
            events.append((kind, _unescape(rest)))
    return events


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def judge(job: dict, raw: dict, names: list[str] | None, backend: str) -> SandboxResult:
    """Decide the verdict of one run from the server's raw result (see module docstring).

    Precedence when not every test passed: timeout > output_limit > memory_limit >
    syntax_error > runtime_error > fail.  A test that raised anything other than
    AssertionError makes the run a ``runtime_error`` (MemoryError: ``memory_limit``).
    """
    tokens = job["tokens"]
    tests = job["tests"]
    total = len(tests)
    names = list(names) if names is not None else [f"test_{i}" for i in range(total)]
    if len(names) != total:
        raise ValueError(f"names has {len(names)} entries for {total} tests")
    limits = job["limits"]
    code_done = False
    passed_idx: set[int] = set()
    errors: dict[int, str] = {}
    started: list[int] = []
    module_error = syntax_error = child_error = None
    done = False
    rewritten = job.get("_rewritten") or [None] * total
    sites_seen: dict[int, set[int]] = {}
    for kind, rest in parse_report(base64.b64decode(raw["report"])):
        if kind == "C" and rest == tokens[0]:
            code_done = True
        elif kind in ("P", "F", "T", "E"):
            idx, _, tail = rest.partition(" ")
            if not (idx.isascii() and idx.isdecimal()) or int(idx) >= total:
                continue
            i = int(idx)
            if kind == "P" and tail == tokens[1 + i]:
                passed_idx.add(i)
            elif kind == "F":
                errors.setdefault(i, _locate(tail, job, i))
            elif kind == "T":
                started.append(i)
            elif kind == "E" and rewritten[i] is not None:
                k, _, body = tail.partition(" ")
                sites = rewritten[i].sites
                if not (k.isascii() and k.isdecimal()) or int(k) >= len(sites):
                    continue
                sites_seen.setdefault(i, set()).add(int(k))
                site = sites[int(k)]
                if not site_holds(site, body):
                    why = body[1:200] if body.startswith("!") else (site.msg or "")[:500]
                    errors.setdefault(i, f"AssertionError{': ' + why if why else ''} "
                                         f"(at `{site.line}`)")
        elif kind == "R" and module_error is None:
            module_error = rest
        elif kind == "S" and syntax_error is None:
            syntax_error = rest
        elif kind == "X":
            child_error = rest
        elif kind == "D":
            done = True
    for i in list(passed_idx):  # the harness's pass only counts with every site satisfied
        sites = rewritten[i].sites if rewritten[i] is not None else ()
        missing = [k for k in range(len(sites)) if k not in sites_seen.get(i, ())]
        if i in errors or missing:
            passed_idx.discard(i)
            if missing:
                errors.setdefault(i, f"AssertionError: not reached (at `{sites[missing[0]].line}`)")
    stdout = base64.b64decode(raw["stdout"]).decode("utf-8", errors="replace")
    stderr = base64.b64decode(raw["stderr"]).decode("utf-8", errors="replace")
    sig, exit_code = raw.get("signal"), raw.get("exit_code")
    death = None
    if sig is not None:
        death = f"killed by {_signal_name(sig)}"
    elif exit_code not in (0, None):
        death = f"exited with status {exit_code}"

    outcomes = []
    for i in range(total):
        if i in passed_idx:
            outcomes.append(TestOutcome(names[i], True, None))
        elif i in errors:
            outcomes.append(TestOutcome(names[i], False, errors[i]))
        elif started and started[-1] == i:
            outcomes.append(TestOutcome(names[i], False, f"did not finish ({_stop_reason(raw, death)})"))
        else:
            outcomes.append(TestOutcome(names[i], False, "not run"))

    passed = len(passed_idx)
    err_types = [e.split(":", 1)[0].split(" ", 1)[0] for e in errors.values()]
    if module_error:
        err_types.append(module_error.split(":", 1)[0].split(" ", 1)[0])

    def result(verdict: str, error: str | None) -> SandboxResult:
        return SandboxResult(
            verdict=verdict, passed=passed, total=total, tests=outcomes, stdout=stdout,
            stderr=stderr, wall_s=float(raw.get("wall_s", 0.0)), cpu_s=float(raw.get("cpu_s", 0.0)),
            backend=backend, error=error,
        )

    if job["mode"] == "code":
        # plain execution: finishing, sys.exit(0) or any exit with status 0 is success
        ok = code_done or (exit_code == 0 and sig is None
                           and not (module_error or syntax_error or child_error))
    else:
        ok = passed == total and (total > 0 or code_done)
    if ok and not raw.get("timeout") and not raw.get("output_limit"):
        return result("pass", None)
    if child_error:
        return result("sandbox_error", f"sandbox child setup failed: {child_error}")
    if raw.get("timeout"):
        return result("timeout", f"wall time limit of {limits['wall_s']:g} s exceeded")
    if sig == signal.SIGXCPU or (sig == signal.SIGKILL and raw.get("cpu_s", 0) >= limits["cpu_s"]):
        return result("timeout", f"CPU time limit of {limits['cpu_s']:g} s exceeded")
    if raw.get("output_limit"):
        return result("output_limit", f"output exceeded {limits['output_bytes']} bytes")
    if raw.get("oom_kill"):
        return result("memory_limit", f"memory limit of {limits['memory_mb']} MiB exceeded by the "
                                      "run's processes together (a process was killed)")
    if "MemoryError" in err_types:
        return result("memory_limit", f"memory limit of {limits['memory_mb']} MiB exceeded")
    if syntax_error:
        return result("syntax_error", syntax_error)
    if module_error:
        return result("runtime_error", module_error)
    if death or not (done or (job["mode"] == "code" and code_done)):
        where = ""
        if started:
            where = f" during {names[started[-1]]}"
        elif not code_done:
            where = " while running the solution"
        reason = death or f"exited with status {exit_code}"
        return result("runtime_error", f"process {reason}{where} before the tests finished")
    first = next((o for o in outcomes if not o.passed), None)
    first_err = f"{first.name}: {first.error}" if first else None
    if any(t != "AssertionError" for t in err_types):
        return result("runtime_error", first_err)
    return result("fail", first_err)


def _stop_reason(raw: dict, death: str | None) -> str:
    if raw.get("timeout"):
        return "time limit"
    if raw.get("output_limit"):
        return "output limit"
    return death or "the process stopped"
