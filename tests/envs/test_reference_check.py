"""Issue 42, items 8 and 11, in the REAL sandbox on a small dataset file: MBPP+ Mbpp/164
(`return True` passes) and Mbpp/295 (`return 0` passes) from the shipped file, two MBPP+ tasks
no trivial solution passes, and two tasks in the built-in format, one of whose reference
solutions fails its own tests. The env counts what its guard dropped and which references fail
(`startup_notes`, the run's `[run]` line; `agentrl eval`'s line and summary), leaves the broken
reference out of the warm start, and a second load runs nothing in the sandbox (both caches)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from agentrl.config import load_config
from agentrl.sandbox import SandboxPool
from agentrl.startup import preflight
from agentrl_envs.code_datasets import load_dataset
from agentrl_envs.code_sandbox import CodeSandboxEnv

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
if not DATA.exists():
    DATA = Path("/work/shared/data")
needs = pytest.mark.skipif(shutil.which("bwrap") is None or not (DATA / "MbppPlus.jsonl.gz").exists(),
                           reason="bubblewrap or the shipped MBPP+ file (../shared/data) missing")

BROKEN = {"task_id": "custom/broken_add", "prompt": "Write add(a, b) returning a + b.", "entry_point": "add",
          "tests": ["assert add(1, 2) == 3", "assert add(2, 5) == 7"],
          "solution": "def add(a, b):\n    return a - b\n"}  # the reference fails its own tests
GOOD = {"task_id": "custom/mul", "prompt": "Write mul(a, b) returning a * b.", "entry_point": "mul",
        "tests": ["assert mul(2, 3) == 6", "assert mul(4, 5) == 20"],
        "solution": "def mul(a, b):\n    return a * b\n"}


class CountingPool:
    """A real `SandboxPool`, counting the runs asked of it (to see a cache hit run nothing)."""

    def __init__(self, pool: SandboxPool):
        self.pool, self.runs = pool, 0

    def map_tests(self, jobs):
        self.runs += len(jobs)
        return self.pool.map_tests(jobs)

    def run_tests(self, **job):
        self.runs += 1
        return self.pool.run_tests(**job)


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(workers=2, backend="bwrap") as p:
        yield p


def six_tasks(tmp_path: Path) -> Path:
    plus = [t.to_dict() for t in load_dataset(str(DATA / "MbppPlus.jsonl.gz"))
            if t.task_id in ("Mbpp/164", "Mbpp/295", "Mbpp/2", "Mbpp/3")]
    path = tmp_path / "six.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [*plus, BROKEN, GOOD]) + "\n")
    return path


@needs
def test_guard_and_reference_check_are_counted_and_cached(pool, tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTRL_CACHE_DIR", str(tmp_path / "cache"))
    path = six_tasks(tmp_path)
    first = CountingPool(pool)
    env = CodeSandboxEnv(dataset=str(path), split="train", heldout_fraction=0.0, pool=first)
    assert {t.task_id for t in env.tasks()} == {"Mbpp/2", "Mbpp/3", "custom/broken_add", "custom/mul"}
    assert env.startup_notes() == ["trivial: 2 of 6 train tasks dropped"]
    probes = first.runs
    assert probes == 6 * 8  # 8 trivial solutions per task
    assert env.reference_failures() == {"custom/broken_add": "fail"}
    assert first.runs == probes + 4  # one run per reference of the 4 train tasks, in one batch
    assert env.startup_notes() == ["trivial: 2 of 6 train tasks dropped",
                                   "references: 1 of 4 train tasks fail their tests, left out of the warm start"]
    env.reset(options={"task_id": "custom/broken_add"})
    assert env.reference_answer() is None  # left out of the warm start
    env.reset(options={"task_id": "custom/mul"})
    assert env.reference_answer() == GOOD["solution"].rstrip("\n")
    env.reset(options={"task_id": "Mbpp/2"})
    assert env.reference_answer()

    again = CountingPool(pool)  # a second load (the warm start's env): both from the disk caches
    env2 = CodeSandboxEnv(dataset=str(path), split="train", heldout_fraction=0.0, pool=again)
    env2.reset(options={"task_id": "custom/broken_add"})
    assert env2.reference_answer() is None
    assert env2.reference_failures() == {"custom/broken_add": "fail"} and env2.trivial["train"].keys() == {
        "Mbpp/164", "Mbpp/295"}
    assert again.runs == 0
    assert CodeSandboxEnv(dataset=str(path), pool=again, check_references=False).reference_failures() == {}
    assert CodeSandboxEnv(pool=again).reference_failures() == {}  # built-in tasks: not run

    # the run's start-up: preflight's notes (the `[run]` line); with sft.steps=0 no reference run
    cfg = load_config(None, ["env.kwargs.heldout_fraction=0.145"], **{"env.dataset": str(path)})
    # held out: Mbpp/3 alone (split_fraction 0.143; custom/broken_add's is 0.149)
    assert preflight(cfg) == ["trivial: 2 of 5 train tasks dropped, 0 of 1 heldout tasks flagged",
                              "references: 1 of 3 train tasks fail their tests, left out of the warm start"]
    assert preflight(cfg.model_copy(update={"sft": cfg.sft.model_copy(update={"steps": 0})})) == [
        "trivial: 2 of 5 train tasks dropped, 0 of 1 heldout tasks flagged"]


@needs
def test_eval_reports_the_trivially_passable_tasks(tmp_path, monkeypatch):
    """`agentrl eval` on the file: its `[eval]` line and summary (meta `task_notes`, in
    summary.json and summary.md) count the tasks a trivial solution passes (flagged: an
    evaluation leaves no task out)."""
    from rich.console import Console

    from agentrl.eval.cli import eval_command

    monkeypatch.setenv("AGENTRL_CACHE_DIR", str(tmp_path / "cache"))
    path = six_tasks(tmp_path)
    lines = [ln for ln in path.read_text().splitlines() if "custom/" not in ln]  # the four MBPP+ tasks
    path.write_text("\n".join(lines) + "\n")
    console = Console(file=(tmp_path / "console.txt").open("w"), width=300)
    s = eval_command(env="code_sandbox", model="reference", dataset=str(path), out=str(tmp_path / "ev"),
                     console=console)
    console.file.close()
    assert s["meta"]["task_notes"] == "trivial: 2 of 4 tasks flagged"
    assert s["overall"]["tasks"] == 4
    line = next(ln for ln in (tmp_path / "console.txt").read_text().splitlines() if ln.startswith("[eval] "))
    assert line.endswith("; trivial: 2 of 4 tasks flagged"), line
    assert "trivial: 2 of 4 tasks flagged" in (tmp_path / "ev" / "summary.md").read_text()


@needs
def test_a_timeout_is_not_cached(pool, tmp_path, monkeypatch):
    """A reference cut by its time limit (load-dependent) is left out of this warm start but
    run again next time; a failing one is cached."""
    from agentrl.sandbox import Limits
    from agentrl_envs.code_datasets import task_from_dict
    from agentrl_envs.code_sandbox import extract_code, sandbox_job
    from agentrl_envs.reference_check import check_references

    monkeypatch.setenv("AGENTRL_CACHE_DIR", str(tmp_path / "cache"))
    slow = task_from_dict({**GOOD, "task_id": "custom/slow", "time_limit": 1,
                           "solution": "import time\ndef mul(a, b):\n    time.sleep(5)\n    return a * b\n"})
    broken = task_from_dict(BROKEN)
    for runs in (2, 1):  # the second time: the timeout again, the failure from the cache
        counting = CountingPool(pool)
        got = check_references([slow, broken], counting, sandbox_job, extract_code, Limits())
        assert got == {"custom/slow": "timeout", "custom/broken_add": "fail"} and counting.runs == runs


@needs
def test_trivial_finding_is_logged_once_per_process(pool, tmp_path, monkeypatch, caplog):
    """A run makes many envs on one data file (rollout threads, evaluations, checks); the
    guard's finding on a split is one warning, not one per env (was 26 in a one-step run)."""
    import agentrl_envs.code_sandbox as cs

    monkeypatch.setenv("AGENTRL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(cs, "_WARNED", set(), raising=False)
    path = six_tasks(tmp_path)
    with caplog.at_level("WARNING", logger=cs.log.name):
        for _ in range(3):
            CodeSandboxEnv(dataset=str(path), split="train", heldout_fraction=0.0, pool=pool).tasks()
    lines = [r.getMessage() for r in caplog.records if "trivial solution" in r.getMessage()]
    assert lines == ["[env] code_sandbox train: 2 of 6 tasks pass a trivial solution, left out of "
                     "training: Mbpp/164 (return True), Mbpp/295 (return False)"]
