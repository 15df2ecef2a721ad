"""`--env reasoning_gym:NAME` with the real reasoning-gym package: its generator's tasks, its
scorer as the reward, held-out tasks (disjoint seeds) never in training even where the task space
repeats questions, clear errors; 2 GRPO steps on basic_arithmetic with the tiny model."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("reasoning_gym")

from agentrl.env.registry import make_env, resolve_env_id  # noqa: E402

SMALL = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "operators": ["+"],
         "allow_parentheses": False, "allow_negation": False}  # 100 questions: repeats are certain


def test_tasks_and_reward_are_reasoning_gyms():
    import reasoning_gym as rg

    env = make_env("reasoning_gym:basic_arithmetic", env_kwargs={"seed": 3, "size": 40, "heldout_size": 5})
    assert resolve_env_id("reasoning_gym:basic_arithmetic") == "reasoning_gym/basic_arithmetic-v0"
    obs, info = env.reset(options={"task_index": 7})
    want = rg.create_dataset("basic_arithmetic", seed=3, size=40)[7]  # item 7 of the training set
    assert obs[1] == {"role": "user", "content": want["question"]} and info["task_id"] == "basic_arithmetic/train/7"
    assert "<answer>" in obs[0]["content"]
    _, r, term, _, info = env.step(f"Thinking... <answer>{want['answer']}</answer>")
    assert term and r == 1.0 and info["answer"] == want["answer"] and info["gold"] == want["answer"]
    env.reset(options={"task_index": 7})
    _, r, *_ = env.step(want["answer"])  # no answer tag: reasoning-gym's scorer gives 0
    assert r == 0.0
    held = make_env("reasoning_gym:basic_arithmetic", env_kwargs={"seed": 3, "size": 40, "heldout_size": 5,
                                                                  "split": "heldout"})
    obs, info = held.reset(options={"task_index": 2})
    assert obs[1]["content"] == rg.create_dataset("basic_arithmetic", seed=43, size=5)[2]["question"]
    assert info["task_id"] == "basic_arithmetic/heldout/2"
    assert len(held.unwrapped.eval_tasks()) == 5


def test_heldout_tasks_are_never_trained_on():
    kw = {"seed": 0, "size": 300, "heldout_size": 30, "config": SMALL}
    train = make_env("reasoning_gym:basic_arithmetic", env_kwargs=kw)
    held = make_env("reasoning_gym:basic_arithmetic", env_kwargs={**kw, "split": "heldout"})
    heldout = set()
    for j in range(30):
        obs, _ = held.reset(options={"task_index": j})
        heldout.add(obs[1]["content"])
    core = train.unwrapped
    raw = [core.train_ds[i]["question"] for i in range(300)]
    assert sum(q in heldout for q in raw) > 10  # the generator repeats them: the test can fail
    seen = set()
    for s in range(400):  # training draws, and every index evaluation could ask for
        obs, _ = train.reset(seed=s)
        seen.add(obs[1]["content"])
    for i in range(300):
        obs, _ = train.reset(options={"task_index": i})
        seen.add(obs[1]["content"])
    assert not seen & heldout and len(seen) > 20


def test_bad_names_and_configs_are_refused():
    with pytest.raises(ValueError, match="no such reasoning-gym dataset; similar: basic_arithmetic"):
        make_env("reasoning_gym:basic_arithmatic")
    with pytest.raises(ValueError, match="config {'foo': 1} refused: TypeError"):
        make_env("reasoning_gym:basic_arithmetic", env_kwargs={"config": {"foo": 1}})
    with pytest.raises(ValueError, match="every training question is also a held-out question"):
        make_env("reasoning_gym:basic_arithmetic", env_kwargs={
            "size": 30, "heldout_size": 400, "config": {**SMALL, "max_digits": 1}}).reset(seed=0)


def test_two_grpo_steps_on_the_tiny_model(tmp_path, tiny_model_dir):
    """`agentrl train --env reasoning_gym:basic_arithmetic` as a config: 2 GRPO steps."""
    from agentrl.config import load_config
    from agentrl.train import train

    cfg = load_config(overrides=[
        "env.name=reasoning_gym:basic_arithmetic", "env.kwargs.size=100", "env.kwargs.heldout_size=4",
        "algo.name=grpo", "train.steps=2", f"out={tmp_path / 'run'}", f"model.path={tiny_model_dir}",
        "sft.steps=0", "rollout.tasks_per_step=2", "algo.group_size=2", "rollout.max_tokens=16",
        "rollout.max_episode_tokens=4096", "train.eval_tasks=2", "train.eval_samples=1", "quiet=true"])
    train(cfg)
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len([m for m in metrics if "loss/logp_mismatch_max" in m]) == 2
    assert (tmp_path / "run" / "checkpoints" / "step_2").is_dir()


def test_the_bare_name_points_to_the_prefix():
    """`--env reasoning_gym` (no dataset): the unknown-env error says how to name one."""
    with pytest.raises(ValueError, match=r"reasoning-gym's datasets: 'reasoning_gym:NAME' "
                                         r"\(e\.g\. reasoning_gym:basic_arithmetic\)$"):
        resolve_env_id("reasoning_gym")
