"""benchmarks/verdict_cache.py: tasks rebuilt from their ids, recorded steps loaded, and a small
batch stepped with and without the cache (real sandbox)."""

from __future__ import annotations

import json
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import verdict_cache as vc  # noqa: E402

from agentrl_envs import code_tasks  # noqa: E402


def test_task_from_id_rebuilds_builtin_tasks():
    for task in code_tasks.generate_tasks("train", n=40, seed=3) + code_tasks.generate_tasks("heldout", n=10):
        again = vc.task_from_id(task.task_id)
        assert (again.task_id, again.tests, again.prompt) == (task.task_id, task.tests, task.prompt)
    assert vc.task_from_id("HumanEval/0") is None
    assert vc.task_from_id("gen/no_such/k=1/x/f") is None


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")
def test_load_and_step_a_recorded_batch(tmp_path):
    from agentrl.sandbox import SandboxPool

    t1, t2 = code_tasks.generate_tasks("train", n=2, seed=1)
    right1 = f"```python\n{t1.solution}```"
    rows = [{"task_id": t1.task_id, "group_id": 0, "turns": [{"text": right1}]},
            {"task_id": t1.task_id, "group_id": 0, "turns": [{"text": right1}]},
            {"task_id": t2.task_id, "group_id": 1, "turns": [{"text": "no code here"}]},
            {"task_id": "HumanEval/0", "group_id": 2, "turns": [{"text": "x"}]}]
    path = tmp_path / "step_1.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tasks, answers, groups, skipped = vc.load_step(path)
    assert ([t.task_id for t in tasks], groups, skipped) == ([t1.task_id, t1.task_id, t2.task_id], [0, 0, 1], 1)
    with SandboxPool(workers=1, backend="auto") as pool, ThreadPoolExecutor(2) as threads:
        _, every = vc.step_batch(pool, threads, tasks, answers, groups, cache=False, spread=False)
        _, cached = vc.step_batch(pool, threads, tasks, answers, groups, cache=True, spread=True)
        assert pool.cache_hits == 1  # the second right answer
    assert every == cached
    assert [(r, v, p) for r, v, p, _ in every] == [(1.0, "pass", len(t1.tests))] * 2 + [(0.0, "syntax_error", 0)]


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")  # main opens a pool
def test_a_step_that_differs_in_any_repeat_fails_the_check(tmp_path, monkeypatch):
    """The check compares every repeat's steps (it compared the last repeat's only): a batch
    whose cached arm differs in the first of two repeats exits 1. The stepping is replaced by
    one that reports such a batch (no sandbox run)."""
    t1, = code_tasks.generate_tasks("train", n=1, seed=1)
    (tmp_path / "step_1.jsonl").write_text(json.dumps(
        {"task_id": t1.task_id, "group_id": 0, "turns": [{"text": "x"}]}) + "\n")
    calls = [0]

    def step_batch(pool, threads, tasks, answers, groups, cache, spread):
        calls[0] += 1  # call 1 warms up; calls 2-4 are repeat 1's arms, 5-7 repeat 2's
        return 0.1, [(1.0 if calls[0] == 3 else 0.0, "fail", 0, "[]")]

    monkeypatch.setattr(vc, "step_batch", step_batch)
    with pytest.raises(SystemExit) as e:
        vc.main(["--rollouts", str(tmp_path), "--steps", "1", "--workers", "1", "--repeats", "2",
                 "--json", str(tmp_path / "o.json"), "--md", str(tmp_path / "o.md")])
    assert e.value.code == 1 and calls[0] == 7
    assert json.loads((tmp_path / "o.json").read_text())["rows"][0]["same_steps"] is False
