"""The leak check of benchmarks/self_propose_vs_code.py (real sandbox): the self_propose env's
built-in tasks behave like no code_sandbox task of either split, the check finds a program that
does (hand-picked), and code_sandbox statements in prompts are caught; self_propose's own
prompts hold none."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

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


def _eval_dir(d, rates):
    """A hand-made `agentrl eval` folder: task id -> (successes c, of n = 4 samples)."""
    import json

    d.mkdir(parents=True)
    tasks = [{"task_id": t, "n": 4, "c": c, "pass@1": c / 4, "success_rate": c / 4, "reward_mean": c / 4}
             for t, c in rates.items()]
    (d / "summary.json").write_text(json.dumps({"k": [1], "overall": {"pass@1": 0.0}, "tasks": tasks}))
    return d


def test_paired_diff_by_hand(tmp_path):
    a = _eval_dir(tmp_path / "a", {"t1": 2, "t2": 0, "t3": 1})
    b = _eval_dir(tmp_path / "b", {"t1": 3, "t2": 1, "t3": 0})
    # d = (0.25, 0.25, -0.25): mean 1/12; sum of squared deviations 1/6, / (3 - 1) / 3 -> se 1/6
    d = spvc.paired_diff(a, b)
    assert d["diff"] == pytest.approx(1 / 12) and d["se"] == pytest.approx(1 / 6)
    assert (d["tasks"], d["gained"], d["lost"]) == (3, 1, 1)  # t2 gained, t3 lost
    assert spvc.paired_diff(a, tmp_path / "missing") is None


def _warm_run_dir(tmp_path, pass1):
    import json

    run = tmp_path / "warm"
    (run / "sft_model").mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({
        "sft_steps": 40, "sft_examples": {"code_sandbox": 2000, "self_propose": 1000}, "sft_loss_first": 6.5,
        "sft_loss_last": 0.5, "sft_seconds": 9.0, "eval_before": {"pass@1": pass1, "pass@1_se": 0.01}}))
    (run / "sft_metrics.jsonl").write_text("\n".join(json.dumps(r) for r in (
        {"step": 20, "sft/loss": 1.0}, {"step": 20, "sft/train_pass@1": 0.1, "sft/train_pass@4": 0.3},
        {"step": 40, "sft/train_pass@1": 0.25, "sft/train_pass@4": 0.6})))
    (run / "config.json").write_text(json.dumps({"seed": 3, "sft": {"steps": 600, "stop_pass_rate": 0.2}}))
    return run / "sft_model"


def test_warm_run_reads_the_warm_start_and_its_stop_checks(tmp_path):
    w = spvc.warm_run(_warm_run_dir(tmp_path, 0.26))
    assert w["sft_steps"] == 40 and w["sft_examples"] == {"code_sandbox": 2000, "self_propose": 1000}
    assert w["eval_before"] == {"pass@1": 0.26, "pass@1_se": 0.01}
    assert [c["step"] for c in w["stop_checks"]] == [20, 40]  # the loss row is not a check
    assert w["sft_config"] == {"steps": 600, "stop_pass_rate": 0.2} and w["seed"] == 3
    assert spvc.warm_run(tmp_path / "nowhere" / "sft_model") is None


def test_min_warm_pass1_stops_before_the_arms(tmp_path, monkeypatch):
    warm = _warm_run_dir(tmp_path, 0.004)
    monkeypatch.setattr(sys, "argv", ["spvc", "--warm", str(warm), "--min-warm-pass1", "0.2",
                                      "--out", str(tmp_path / "out"), "--no-results"])
    with pytest.raises(SystemExit, match="0.004 < --min-warm-pass1 0.2"):
        spvc.main()
    assert not (tmp_path / "out" / "code_grpo").exists()  # no arm ran


def test_buffer_programs_counts_distinct_normalised_programs():
    seed = SEED_TASKS[0].to_dict()
    mine = {"src": "def f(x):\n    # a comment\n    return x  *  2 - 7", "inputs": ["1"], "outputs": ["-5"]}
    again = {**mine, "src": "def f(x):\n    return x * 2 - 7", "inputs": ["2"]}  # same program, new input
    b = spvc.buffer_programs([seed, mine, again])
    assert b == {"tasks": 3, "distinct_programs": 2, "proposed_programs": ["def f(x):\n    return x * 2 - 7"]}


def test_verdict_counts_and_results_paths(tmp_path):
    import json

    rows = [{"verdict": "pass"}, {"verdict": "syntax_error"}, {"verdict": "pass"}, {"verdict": None}]
    (tmp_path / "results.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    assert list(spvc.verdict_counts(tmp_path).items()) == [("pass", 2), ("syntax_error", 1), ("none", 1)]
    assert [p.name for p in spvc.results_paths("")] == ["self_propose_vs_code.json", "self_propose_vs_code.md"]
    assert [p.name for p in spvc.results_paths("seed1")] == ["self_propose_vs_code_seed1.json",
                                                             "self_propose_vs_code_seed1.md"]
