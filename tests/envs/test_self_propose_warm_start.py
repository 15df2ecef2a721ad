"""`self_propose` reference answers for the supervised warm start: each is accepted by the env
itself (real sandbox) in every role and mode, and `agentrl train --env self_propose --algo grpo`
warm-starts on them end to end (a subprocess)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import agentrl.startup as startup
from agentrl.sandbox.pool import default_pool
from agentrl_envs.self_propose import SelfProposeEnv
from agentrl_envs.self_propose_tasks import SEED_TASKS, TaskBuffer, normalise, parse_proposal


@pytest.fixture(scope="module")
def pool():
    return default_pool("auto")


@pytest.mark.parametrize("mode", ["deduce", "abduce", "induce"])
def test_solve_reference_answers_get_reward_one(pool, mode):
    env = SelfProposeEnv(buffer=TaskBuffer(), pool=pool)
    rewards = []
    for task in SEED_TASKS:
        for pair in range(len(task.inputs)):
            env.reset(options={"role": "solve", "mode": mode, "task": task.to_dict(), "pair": pair})
            ref = env.reference_answer()
            _, r, term, _, info = env.step(ref)
            assert info["success"] and term, (ref, info)
            rewards.append(r)
    assert rewards == [1.0] * 18  # 6 seed tasks x 3 pairs
    env.reset(options={"role": "solve", "mode": "deduce", "task": SEED_TASKS[1].to_dict(), "pair": 2})
    assert env.reference_answer() == "Output: 'y'"  # x[1::2] on 'xy'


def test_propose_references_are_valid_unshown_seed_tasks(pool):
    env = SelfProposeEnv(buffer=TaskBuffer(), pool=pool)
    seed_srcs = {normalise(t.src) for t in SEED_TASKS}
    for seed in range(12):
        obs, _ = env.reset(seed=seed, options={"role": "propose"})
        ref = env.reference_answer()
        src, inputs = parse_proposal(ref)
        assert normalise(src) in seed_srcs
        assert f"```python\n{src}\n```" not in obs[1]["content"]  # not one of the prompt's examples
        _, r, _, _, info = env.step(ref)
        assert (r, info["proposal_valid"], info["success"]) == (0.0, True, True), info
    assert len(env.buffer.tasks) == len(SEED_TASKS) + 12  # every one was new to the buffer
    # 6 seed tasks x 2 rotations: once all 12 are buffered no valid reference is left
    for seed in range(12, 40):
        env.reset(seed=seed, options={"role": "propose"})
        ref = env.reference_answer()
        if ref is not None:
            assert env.step(ref)[3]["proposal_valid"]
    env.reset(seed=99, options={"role": "propose"})
    assert len(env.buffer.tasks) == len(SEED_TASKS) + 12 and env.reference_answer() is None


def test_self_propose_has_reference_answers_safety_still_has_none():
    assert startup.env_has_reference_answers("self_propose")
    assert not startup.env_has_reference_answers("safety")


def test_train_warm_starts_on_self_propose_references(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    args = ["train", "--env", "self_propose", "--algo", "grpo", "--steps", "2", "--out", str(out), "-q",
            f"model.path={tiny_model_dir}", "sft.steps=3", "sft.batch_size=4", "sft.stop_pass_rate=null",
            "sft.stop_pass_at_k=null", "rollout.tasks_per_step=4", "algo.group_size=2",
            "train.eval_tasks=2", "train.eval_samples=1", "rollout.max_tokens=16", "train.eval_every=0",
            "train.save_every=0", "log.tensorboard=false"]
    r = subprocess.run([sys.executable, "-m", "agentrl.cli", *args], capture_output=True, text=True,
                       env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    sft = [json.loads(x) for x in (out / "sft_metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in sft if "sft/loss" in row] == [0, 1, 2]
    assert (out / "sft_model" / "config.json").exists()
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len([row for row in rows if "rollout/reward_mean" in row]) == 2
    assert json.loads((out / "summary.json").read_text())["sft_steps"] == 3
