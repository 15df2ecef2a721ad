"""The user's env and agent modules in another process (a Ray worker, whose current folder and
`sys.path` may differ from the driver's): the driver names the folder it found each module in
(`module_folder`, `user_module_folders`), the worker adds it to `sys.path` (`add_folders`), and
one it still cannot import is one line naming the key, the module and the process
(`unimportable`). A fresh Python process with another current folder stands in for the worker
here; tests/e2e/test_agent_ray.py runs it on real Ray workers (slow)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from agentrl.config import load_config
from agentrl.env.registry import module_folder
from agentrl.rollout.envs import user_module_folders, user_modules

ROOT = Path(__file__).resolve().parents[2]


def _tree(base: Path) -> None:
    """`top.py`, package `pkg.sub.mod`, namespace package `ns.inner.x` under `base`."""
    for rel in ("top.py", "pkg/__init__.py", "pkg/sub/__init__.py", "pkg/sub/mod.py", "ns/inner/x.py"):
        (base / rel).parent.mkdir(parents=True, exist_ok=True)
        (base / rel).write_text("async def solve(client, task):\n    return 1.0\n")


def test_the_folder_a_module_was_found_in(tmp_path, monkeypatch):
    base = tmp_path / "mods"
    _tree(base)
    monkeypatch.syspath_prepend(str(base))
    for name in ("top", "pkg", "pkg.sub", "pkg.sub.mod", "ns", "ns.inner", "ns.inner.x"):
        assert module_folder(name) == str(base), name
    assert module_folder("nope_not_a_module") is None and module_folder("nope_not_a_module.x") is None
    assert module_folder("sys") is None  # built in: no folder
    cfg = load_config(None, ["env.name=agent", "env.kwargs.agent=pkg.sub.mod:solve", "env.imports=[top]"])
    assert user_modules(cfg) == [("env.imports", "top"), ("env.kwargs.agent", "pkg.sub.mod")]
    assert user_module_folders(cfg) == [str(base)]  # once
    cfg = load_config(None, ["env.name=ns.inner.x:Env"])
    assert user_modules(cfg) == [("env.name", "ns.inner.x")]
    assert user_modules(load_config(None, ["env.name=reasoning_gym:leg_counting"])) == []


WORKER = """
import json, sys
from agentrl.rollout.envs import add_folders, unimportable
mods = [("env.kwargs.agent", "pkg.sub.mod"), ("env.imports", "top")]
before = unimportable(mods, "rollout worker 0")
add_folders(sys.argv[1:])
print(json.dumps([before, unimportable(mods, "rollout worker 0")]))
"""


def test_a_process_that_does_not_find_the_modules_imports_them_from_the_drivers_folders(tmp_path):
    """Without the folder the worker names each module it cannot import in one line; with the
    driver's folder added it imports them all."""
    base = tmp_path / "mods"
    _tree(base)
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    r = subprocess.run([sys.executable, "-c", WORKER, str(base)], cwd=elsewhere, capture_output=True,
                       text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})
    assert r.returncode == 0, r.stderr
    before, after = json.loads(r.stdout.splitlines()[-1])
    assert before == ["env.kwargs.agent: rollout worker 0 cannot import module 'pkg.sub.mod' "
                      "(ModuleNotFoundError: No module named 'pkg')",
                      "env.imports: rollout worker 0 cannot import module 'top' "
                      "(ModuleNotFoundError: No module named 'top')"]
    assert after == []
