"""Issue 20 B and C: ``auto`` never runs code unisolated, and the sandbox runs the trainer's own
interpreter (same version, same prefix and stdlib) even when it lives under a 0700 home."""

from __future__ import annotations

import os
import shutil
import sys

import pytest

from agentrl.sandbox import SandboxPool
from agentrl.sandbox import pool as pool_mod
from agentrl.sandbox.backends import BackendError, _traversable_parents

bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")
DOUBLE = "def f(x):\n    return 2 * x\n"


def test_auto_refuses_instead_of_falling_back_to_subprocess(monkeypatch):
    monkeypatch.setattr(pool_mod, "probe", lambda name: None if name == "subprocess"
                        else f"{name} is broken here")
    with pytest.raises(BackendError) as e:
        pool_mod.resolve_backend("auto")
    msg = str(e.value)
    assert "apt-get install bubblewrap" in msg and "pip install docker" in msg
    assert "bwrap: bwrap is broken here" in msg and "backend='subprocess'" in msg
    assert pool_mod.resolve_backend("subprocess") == "subprocess"  # only when named


def test_auto_never_lists_subprocess_as_a_choice():
    assert "subprocess" not in pool_mod.ISOLATED_BACKENDS
    assert pool_mod.ISOLATED_BACKENDS[0] == "bwrap"


@pytest.mark.parametrize("backend", ["subprocess", pytest.param("bwrap", marks=bwrap)])
def test_runs_are_marked_unisolated_exactly_on_the_subprocess_backend(backend):
    """A run on the named `subprocess` backend is marked unisolated, in the result and in the
    env's info; a bubblewrap run is not."""
    from agentrl_envs.code_sandbox import CodeSandboxEnv

    with SandboxPool(workers=1, backend=backend) as p:
        r = p.run_tests(DOUBLE, ["assert f(2) == 4"])
        assert r.verdict == "pass" and r.unisolated is (backend == "subprocess")
        env = CodeSandboxEnv(pool=p)
        env.reset(seed=0)
        assert env.step("def f(): pass")[4]["unisolated"] is (backend == "subprocess")


def test_parents_of_a_bound_prefix_are_made_traversable():
    assert _traversable_parents("/root/.pyenv/versions/3.11.7") == [
        "--perms", "0755", "--dir", "/root", "--perms", "0755", "--dir", "/root/.pyenv",
        "--perms", "0755", "--dir", "/root/.pyenv/versions"]
    assert _traversable_parents("/opt") == []


@bwrap
def test_sandbox_runs_the_trainers_own_interpreter():
    with SandboxPool(workers=1, backend="bwrap") as p:
        code = ("import os, sys\nprint(sys.version)\nprint(sys.prefix)\n"
                "print(os.path.dirname(os.__file__))\n")
        r = p.run_code(code)
    assert r.verdict == "pass", r
    version, prefix, stdlib = r.stdout.splitlines()
    assert version == sys.version
    assert prefix == os.path.realpath(sys.base_prefix)
    assert os.path.realpath(stdlib) == os.path.realpath(os.path.dirname(os.__file__))


def test_code_env_without_an_isolated_backend_fails_at_construction(monkeypatch):
    """With no isolated backend, `CodeSandboxEnv()` (backend auto) raises BackendError when it
    is made, i.e. at a run's start-up, instead of turning every step into a 0-reward
    sandbox_error; naming `backend="subprocess"` still works."""
    import agentrl.sandbox.pool as pool_mod
    from agentrl.sandbox.backends import BackendError
    from agentrl_envs.code_sandbox import CodeSandboxEnv

    monkeypatch.setattr(pool_mod, "probe", lambda name: None if name == "subprocess" else f"{name}: missing")
    with pytest.raises(BackendError, match="apt-get install bubblewrap"):
        CodeSandboxEnv()
    assert CodeSandboxEnv(backend="subprocess").backend == "subprocess"
