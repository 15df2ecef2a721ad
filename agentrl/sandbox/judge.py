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
from dataclasses import dataclass, field
from typing import Any

from agentrl.infra import pyast

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
        tree = pyast.parse(setup)
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
        tree = pyast.parse(setup)
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


_AT_LINE = re.compile(r" @L(\d{1,9})$")


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


@dataclass
class _Report:
    """What the harness's report lines say (each line can be forged by the solution but `P`
    with its token and the `E` values compared against the sites)."""

    code_done: bool = False
    passed_idx: set[int] = field(default_factory=set)
    errors: dict[int, str] = field(default_factory=dict)
    started: list[int] = field(default_factory=list)
    sites_seen: dict[int, set[int]] = field(default_factory=dict)
    module_error: str | None = None
    syntax_error: str | None = None
    child_error: str | None = None
    done: bool = False


def judge(job: dict, raw: dict, names: list[str] | None, backend: str) -> SandboxResult:
    """Decide the verdict of one run from the server's raw result (see module docstring).

    Precedence when not every test passed: timeout > output_limit > memory_limit >
    syntax_error > runtime_error > fail.  A test that raised anything other than
    AssertionError makes the run a ``runtime_error`` (MemoryError: ``memory_limit``).

    Raises:
        ValueError: ``names`` does not have one entry per test.
    """
    total = len(job["tests"])
    names = list(names) if names is not None else [f"test_{i}" for i in range(total)]
    if len(names) != total:
        raise ValueError(f"names has {len(names)} entries for {total} tests")
    rewritten = job.get("_rewritten") or [None] * total
    rep = _read_report(job, raw, rewritten)
    _drop_unreached_passes(rep, rewritten)
    stdout = base64.b64decode(raw["stdout"]).decode("utf-8", errors="replace")
    stderr = base64.b64decode(raw["stderr"]).decode("utf-8", errors="replace")
    sig, exit_code = raw.get("signal"), raw.get("exit_code")
    death = None
    if sig is not None:
        death = f"killed by {_signal_name(sig)}"
    elif exit_code not in (0, None):
        death = f"exited with status {exit_code}"
    outcomes = _outcomes(rep, names, raw, death)
    verdict, error = _verdict(job, raw, rep, names, outcomes, death)
    return SandboxResult(
        verdict=verdict, passed=len(rep.passed_idx), total=total, tests=outcomes, stdout=stdout,
        stderr=stderr, wall_s=float(raw.get("wall_s", 0.0)), cpu_s=float(raw.get("cpu_s", 0.0)),
        backend=backend, error=error,
    )


def _read_report(job: dict, raw: dict, rewritten: list) -> _Report:
    """The report lines of ``raw["report"]``, read into a `_Report`; lines naming no test of
    the job, or carrying a wrong token, are ignored."""
    tokens, total = job["tokens"], len(job["tests"])
    rep = _Report()
    for kind, rest in parse_report(base64.b64decode(raw["report"])):
        if kind == "C" and rest == tokens[0]:
            rep.code_done = True
        elif kind in ("P", "F", "T", "E"):
            idx, _, tail = rest.partition(" ")
            if not _small_index(idx) or int(idx) >= total:
                continue
            i = int(idx)
            if kind == "P" and tail == tokens[1 + i]:
                rep.passed_idx.add(i)
            elif kind == "F":
                rep.errors.setdefault(i, _locate(tail, job, i))
            elif kind == "T":
                rep.started.append(i)
            elif kind == "E" and rewritten[i] is not None:
                _read_site(rep, i, tail, rewritten[i].sites)
        elif kind == "R" and rep.module_error is None:
            rep.module_error = rest
        elif kind == "S" and rep.syntax_error is None:
            rep.syntax_error = rest
        elif kind == "D":
            rep.done = True
    # a child's own setup failure comes on its status pipe, closed before job code runs (an
    # ``X`` line in the report is the solution's writing, never a sandbox fault: ignored)
    setup_error = raw.get("setup_error")
    if isinstance(setup_error, str) and setup_error.startswith("X "):
        rep.child_error = setup_error[2:]
    return rep


def _small_index(text: str) -> bool:
    """A report index the runner reads: 1-9 ASCII digits (a 5,000-digit one made ``int()``
    raise ValueError, past Python's digit limit, out of a function documented never to)."""
    return 0 < len(text) <= 9 and text.isascii() and text.isdecimal()


def _read_site(rep: _Report, i: int, tail: str, sites: list[Site]) -> None:
    """An ``E <i> <k> <json>`` line: site k of test i reached, with an error for test i when
    the reported value does not satisfy the site."""
    k, _, body = tail.partition(" ")
    if not _small_index(k) or int(k) >= len(sites):
        return
    rep.sites_seen.setdefault(i, set()).add(int(k))
    site = sites[int(k)]
    if not site_holds(site, body):
        why = body[1:200] if body.startswith("!") else (site.msg or "")[:500]
        rep.errors.setdefault(i, f"AssertionError{': ' + why if why else ''} "
                                 f"(at `{site.line}`)")


def _drop_unreached_passes(rep: _Report, rewritten: list) -> None:
    """The harness's pass only counts with every site satisfied: a passed test with an error
    or a site never reported is not passed."""
    for i in list(rep.passed_idx):
        sites = rewritten[i].sites if rewritten[i] is not None else ()
        missing = [k for k in range(len(sites)) if k not in rep.sites_seen.get(i, ())]
        if i in rep.errors or missing:
            rep.passed_idx.discard(i)
            if missing:
                rep.errors.setdefault(i, f"AssertionError: not reached (at `{sites[missing[0]].line}`)")


def _outcomes(rep: _Report, names: list[str], raw: dict, death: str | None) -> list[TestOutcome]:
    """One `TestOutcome` per test: passed, its error, did not finish (the last started), or
    not run."""
    outcomes = []
    for i in range(len(names)):
        if i in rep.passed_idx:
            outcomes.append(TestOutcome(names[i], True, None))
        elif i in rep.errors:
            outcomes.append(TestOutcome(names[i], False, rep.errors[i]))
        elif rep.started and rep.started[-1] == i:
            outcomes.append(TestOutcome(names[i], False, f"did not finish ({_stop_reason(raw, death)})"))
        else:
            outcomes.append(TestOutcome(names[i], False, "not run"))
    return outcomes


def _verdict(job: dict, raw: dict, rep: _Report, names: list[str], outcomes: list[TestOutcome],
             death: str | None) -> tuple[str, str | None]:
    """(verdict, error) of the run, in the precedence of `judge`."""
    limits, total = job["limits"], len(names)
    sig, exit_code = raw.get("signal"), raw.get("exit_code")
    module_error, syntax_error, child_error = rep.module_error, rep.syntax_error, rep.child_error
    err_types = [e.split(":", 1)[0].split(" ", 1)[0] for e in rep.errors.values()]
    if module_error:
        err_types.append(module_error.split(":", 1)[0].split(" ", 1)[0])
    if job["mode"] == "code":
        # plain execution: finishing, sys.exit(0) or any exit with status 0 is success; the
        # exit status comes from the server (waitpid), never from a report line the solution
        # could write (``C m0`` then a crash was a pass)
        ok = exit_code == 0 and sig is None and not (module_error or syntax_error or child_error)
    else:
        ok = len(rep.passed_idx) == total and (total > 0 or rep.code_done)
    if ok and not (raw.get("timeout") or raw.get("output_limit") or raw.get("oom_kill")):
        return "pass", None
    if child_error:
        return "sandbox_error", f"sandbox child setup failed: {child_error}"
    if raw.get("timeout"):
        return "timeout", f"wall time limit of {limits['wall_s']:g} s exceeded"
    if sig == signal.SIGXCPU or (sig == signal.SIGKILL and raw.get("cpu_s", 0) >= limits["cpu_s"]):
        return "timeout", f"CPU time limit of {limits['cpu_s']:g} s exceeded"
    if raw.get("output_limit"):
        return "output_limit", f"output exceeded {limits['output_bytes']} bytes"
    if raw.get("oom_kill"):
        return "memory_limit", (f"memory limit of {limits['memory_mb']} MiB exceeded by the "
                                "run's processes together (a process was killed)")
    if "MemoryError" in err_types:
        return "memory_limit", f"memory limit of {limits['memory_mb']} MiB exceeded"
    if syntax_error:
        return "syntax_error", syntax_error
    if module_error:
        return "runtime_error", module_error
    if death or not (rep.done or (job["mode"] == "code" and rep.code_done)):
        where = ""
        if rep.started:
            where = f" during {names[rep.started[-1]]}"
        elif not rep.code_done:
            where = " while running the solution"
        reason = death or f"exited with status {exit_code}"
        return "runtime_error", f"process {reason}{where} before the tests finished"
    first = next((o for o in outcomes if not o.passed), None)
    first_err = f"{first.name}: {first.error}" if first else None
    if any(t != "AssertionError" for t in err_types):
        return "runtime_error", first_err
    return "fail", first_err


def _stop_reason(raw: dict, death: str | None) -> str:
    if raw.get("timeout"):
        return "time limit"
    if raw.get("output_limit"):
        return "output limit"
    return death or "the process stopped"
