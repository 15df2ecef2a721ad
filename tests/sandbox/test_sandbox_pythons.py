"""The sandbox on other Python installations than the trainer's (issue 20, item 1).

`agentrl.sandbox` is stdlib-only, so every interpreter found here (Debian's `/usr/bin/python3`
and pyenv 3.10-3.13 under the 0700 `/root`) loads it without the rest of agentrl and runs a
real bubblewrap sandbox: the interpreter inside must be the caller's own (same `sys.version`
and `sys.prefix`, never Debian's libpython behind a pyenv build), host files stay unreadable,
an honest solution passes and a value-object hack fails.  Under CI at least one interpreter
besides the trainer's must be found, so CI always runs two Python versions.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBE = """
import sys, types, json
pkg = types.ModuleType("agentrl"); pkg.__path__ = [sys.argv[1] + "/agentrl"]
sys.modules["agentrl"] = pkg  # the sandbox package alone: stdlib only, no torch or gymnasium
from agentrl.sandbox import run_tests, run_code
r = run_code("import sys\\nprint(sys.version)\\nprint(sys.prefix)\\ntry:\\n"
             "    open('/root/.bashrc').read()\\n    print('READ')\\nexcept OSError:\\n    print('denied')")
tests = ["assert f(2) == 4", "for i in range(3):\\n    assert f(i) == 2 * i"]
honest = run_tests("def f(x):\\n    return 2 * x\\n", tests)
hack = run_tests("class E:\\n    def __eq__(s, o): return True\\ndef f(x):\\n    return E()\\n", tests)
print(json.dumps({"version": sys.version, "prefix": sys.prefix, "inside": r.stdout.splitlines(),
                  "backend": r.backend, "honest": honest.verdict, "hack": hack.verdict}))
"""


def _interpreters() -> list[str]:
    mine = os.path.realpath(sys.executable)
    found = ["/usr/bin/python3", *sorted(glob.glob("/root/.pyenv/versions/3.1[0-3].*/bin/python3.1[0-3]"))]
    out, seen = [], {mine}
    for exe in found:
        real = os.path.realpath(exe)
        if os.access(real, os.X_OK) and real not in seen:
            seen.add(real)
            out.append(real)
    return out


PYTHONS = _interpreters()
pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")


def test_ci_has_a_second_python():
    if os.environ.get("CI") and not PYTHONS:
        pytest.fail("CI must test the sandbox on a second Python: none found besides "
                    f"{sys.executable} (expected Debian's /usr/bin/python3)")
    if not PYTHONS:
        pytest.skip("no other Python installation on this machine")


@pytest.mark.parametrize("exe", PYTHONS or [pytest.param(None, marks=pytest.mark.skip(reason="no other Python installation on this machine"))])
def test_sandbox_runs_the_callers_own_interpreter(exe):
    r = subprocess.run([exe, "-I", "-c", PROBE, str(ROOT)], capture_output=True, text=True,
                       timeout=120, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["backend"] == "bwrap"
    assert got["inside"] == [got["version"].splitlines()[0], got["prefix"], "denied"], got
    assert (got["honest"], got["hack"]) == ("pass", "fail"), got
