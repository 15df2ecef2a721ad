"""Building jobs for the server and turning its raw observations into a SandboxResult.

The only evidence of a passing test is a report line ``P <i> <token>`` carrying that test's
per-run random token (``secrets.token_hex``), which the harness writes after ``exec`` of the
test returned normally.  Exit codes, stdout and every other report line can be forged by the
solution and are used only to explain failures, never to grant a pass.
"""

from __future__ import annotations

import base64
import secrets
import signal

from .result import Limits, SandboxResult, TestOutcome


def make_job(mode: str, code: str, tests: list[str], setup: str, stdin: str,
             limits: Limits) -> dict:
    """The JSON job for the server.  ``tokens[0]`` marks 'solution ran', ``tokens[1+i]`` test i."""
    if mode not in ("tests", "code"):
        raise ValueError(f"mode must be 'tests' or 'code', got {mode!r}")
    return {
        "mode": mode, "code": code, "tests": list(tests), "setup": setup, "stdin": stdin,
        "tokens": [secrets.token_hex(16) for _ in range(len(tests) + 1)],
        "limits": limits.to_dict(),
    }


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
    for kind, rest in parse_report(base64.b64decode(raw["report"])):
        if kind == "C" and rest == tokens[0]:
            code_done = True
        elif kind in ("P", "F", "T"):
            idx, _, tail = rest.partition(" ")
            if not idx.isdigit() or int(idx) >= total:
                continue
            i = int(idx)
            if kind == "P" and tail == tokens[1 + i]:
                passed_idx.add(i)
            elif kind == "F":
                errors.setdefault(i, tail)
            elif kind == "T":
                started.append(i)
        elif kind == "R" and module_error is None:
            module_error = rest
        elif kind == "S" and syntax_error is None:
            syntax_error = rest
        elif kind == "X":
            child_error = rest
        elif kind == "D":
            done = True
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
