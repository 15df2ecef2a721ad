"""The leak check of benchmarks/self_propose_vs_code.py (real sandbox): the self_propose env's
built-in tasks behave like no code_sandbox task of either split, the check finds a program that
does (hand-picked), and code_sandbox statements in prompts are caught; self_propose's own
prompts hold none."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import self_propose_vs_code as spvc  # noqa: E402

from agentrl.sandbox.pool import default_pool  # noqa: E402
from agentrl_envs.code_sandbox import CodeSandboxEnv  # noqa: E402
from agentrl_envs.self_propose import SelfProposeEnv  # noqa: E402
from agentrl_envs.self_propose_tasks import HELDOUT_TASKS, SEED_TASKS, TaskBuffer  # noqa: E402


@pytest.fixture(scope="module")
def space():
    return spvc.code_space()


@pytest.fixture(scope="module")
def pool():
    return default_pool("auto")


def test_code_space_covers_both_splits(space):
    splits = {t["split"] for t in space["tasks"]}
    assert splits == {"train", "heldout"}
    # a_muladd k=3 j=1 with argument x: hidden-test inputs -5, 0, 3, 10, 71 -> 3x + 1
    t = next(t for t in space["tasks"] if t["key"] == "a_muladd/j=1,k=3/x")
    assert [space["inputs"]["int"][i] for i in t["idx"]] == ["-5", "0", "3", "10", "71"]
    assert t["outputs"] == ["-14", "1", "10", "31", "214"]


def test_builtin_self_propose_tasks_behave_like_no_code_task(space, pool):
    for task in (*SEED_TASKS, *HELDOUT_TASKS):
        assert spvc.behaviour_matches(task.src, space, pool) == [], task.src


def test_a_code_task_in_disguise_is_found(space, pool):
    # 3x + 1 is a_muladd k=3 j=1 for each of the 4 int argument names (all 4 keys in train)
    hits = spvc.behaviour_matches("def f(y):\n    return 1 + y * 3", space, pool)
    assert sorted(h["key"] for h in hits) == [f"a_muladd/j=1,k=3/{a}" for a in ("a", "n", "num", "x")]
    # x[::-1] reverses strings (s_rev) and lists (l_rev): 8 keys, in both splits
    hits = spvc.behaviour_matches("def f(x):\n    return x[::-1]", space, pool)
    assert {h["key"].split("/")[0] for h in hits} == {"s_rev", "l_rev"} and len(hits) == 8
    assert {h["split"] for h in hits} == {"train", "heldout"}
    assert spvc.behaviour_matches("def f(x):\n    return 1 / 0", space, pool) == []


def test_leak_check_on_self_propose_prompts_and_a_code_prompt(pool):
    env = SelfProposeEnv(buffer=TaskBuffer(), pool=pool)
    prompts = []
    for opts in ({"role": "propose"}, *({"role": "solve", "mode": m} for m in ("deduce", "abduce", "induce"))):
        prompts.append(env.reset(seed=3, options=opts)[0][1]["content"])
    buffer = [t.to_dict() for t in env.buffer.tasks]
    clean = spvc.leak_check(prompts, buffer, pool)
    assert clean["ok"] and clean["statement_prompts"] == 0 and clean["builtin_matches"] == []
    assert clean["programs_checked"] == len(SEED_TASKS) + len(HELDOUT_TASKS)
    code_prompt = CodeSandboxEnv(split="heldout").reset(seed=0)[0][-1]["content"]
    proposed = {"src": "def f(x):\n    return x[::-1]", "inputs": ["'ab'"], "outputs": ["'ba'"],
                "origin": "proposed"}
    dirty = spvc.leak_check([*prompts, code_prompt], [*buffer, proposed], pool)
    assert dirty["statement_prompts"] == 1 and not dirty["ok"]
    assert [m["program"] for m in dirty["proposed_matches"]] == ["def f(x):\n    return x[::-1]"]


def test_group_counts_of_logged_episodes(tmp_path):
    """Successes per group over every step and at the first step (steps sorted by number, not
    by name: step_10 after step_2)."""
    import json

    def ep(group, ok):
        return json.dumps({"info": {"group_key": group}, "turns": [{"info": {"success": ok}}]})

    d = tmp_path / "rollouts"
    d.mkdir()
    (d / "step_2.jsonl").write_text("\n".join([ep("propose", False), ep("propose", True),
                                               ep("solve/deduce", False)]))
    (d / "step_10.jsonl").write_text("\n".join([ep("propose", True), ep("solve/deduce", True),
                                                json.dumps({"turns": []})]))  # an empty episode: skipped
    assert spvc.group_counts(tmp_path) == {
        "propose": {"episodes": 3, "success": 2, "first_step_episodes": 2, "first_step_success": 1},
        "solve/deduce": {"episodes": 2, "success": 1, "first_step_episodes": 1, "first_step_success": 0}}
