"""Issue 42, item 8: the reward-hacking guard probes tasks with trivial solutions in the REAL
sandbox, on the shipped MBPP+ file and on MBPP (sanitized): tasks a constant or the first
argument passes are found (Mbpp/164 `return True`, Mbpp/295 `return 0`, Mbpp/404 first
argument on MBPP's own tests), left out of training, and the result is cached."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from agentrl.sandbox import SandboxPool
from agentrl_envs.code_datasets import load_dataset
from agentrl_envs.code_sandbox import CodeSandboxEnv, sandbox_job
from agentrl_envs.trivial_probe import PROBES, probe_tasks

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
if not DATA.exists():
    DATA = Path("/work/shared/data")
needs = pytest.mark.skipif(shutil.which("bwrap") is None or not (DATA / "MbppPlus.jsonl.gz").exists(),
                           reason="bubblewrap or the shipped MBPP+ file (../shared/data) missing")


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(workers=2, backend="bwrap") as p:
        yield p


@needs
@pytest.mark.slow  # 16 s: MBPP+'s big tests, 40 sandbox runs
def test_trivially_passable_mbpp_tasks_are_found_and_cached(pool, tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTRL_CACHE_DIR", str(tmp_path))
    plus = {t.task_id: t for t in load_dataset(str(DATA / "MbppPlus.jsonl.gz"))}
    tasks = [plus[i] for i in ("Mbpp/164", "Mbpp/295", "Mbpp/2", "Mbpp/404")]
    t0 = time.perf_counter()
    found = probe_tasks(tasks, pool, sandbox_job)
    cold = time.perf_counter() - t0
    assert found == {"Mbpp/164": ["return True"], "Mbpp/295": ["return False", "return 0"]}
    assert len(list((tmp_path / "trivial_probe").glob("*.json"))) == 4
    t0 = time.perf_counter()
    assert probe_tasks(tasks, pool, sandbox_job) == found  # from the cache: no sandbox run
    assert time.perf_counter() - t0 < 0.2 * cold
    # MBPP's own tests of 404 (minimum of two numbers) are passed by the first argument
    sanitized = {t.task_id: t for t in load_dataset(str(DATA / "mbpp_sanitized.json"))}
    t404 = next(t for k, t in sanitized.items() if k.endswith("/404"))
    assert probe_tasks([t404], pool, sandbox_job)[t404.task_id] == ["return first argument"]
    assert len(PROBES) == 8


@needs
def test_env_leaves_trivial_tasks_out_of_training_or_flags_them(pool, tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTRL_CACHE_DIR", str(tmp_path))
    plus = [t for t in load_dataset(str(DATA / "MbppPlus.jsonl.gz"))
            if t.task_id in ("Mbpp/164", "Mbpp/295", "Mbpp/2", "Mbpp/3")]
    path = tmp_path / "four.jsonl"
    path.write_text("\n".join(json.dumps(t.to_dict()) for t in plus) + "\n")
    env = CodeSandboxEnv(dataset=str(path), split="all", pool=pool, trivial_tasks="flag")
    assert {t.task_id for t in env.tasks("all")} == {"Mbpp/164", "Mbpp/295", "Mbpp/2", "Mbpp/3"}
    assert set(env.trivial["all"]) == {"Mbpp/164", "Mbpp/295"}
    _, info = env.reset(options={"task_id": "Mbpp/164"})
    assert info["trivial"] == ["return True"]
    train = CodeSandboxEnv(dataset=str(path), split="train", heldout_fraction=0.0, pool=pool)
    assert train.trivial_mode == "drop"
    assert {t.task_id for t in train.tasks()} == {"Mbpp/2", "Mbpp/3"}
    assert set(train.trivial["train"]) == {"Mbpp/164", "Mbpp/295"}
    assert CodeSandboxEnv(pool=pool).trivial_mode == "off"  # built-in tasks: main job unchanged
    with pytest.raises(ValueError, match="trivial_tasks"):
        CodeSandboxEnv(pool=pool, trivial_tasks="maybe")
