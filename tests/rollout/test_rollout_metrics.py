"""The training loop's reward metrics say what was sampled: `rollout/reward_mean` and
`rollout/reward_std` are the raw statistics of the step's episodes (NaN when every reward is
NaN; every episode even when dynamic sampling drops groups), and the algorithm's group
statistics are logged under their own names (`adv/reward_mean`, `adv/num_groups`, ...), over the
groups the advantages were computed from."""

from __future__ import annotations

import json

import pytest

from agentrl.config import load_config
from agentrl.env.base import TextEnv


class ParityEnv(TextEnv):
    """One turn: reward 1 when the answer has an odd number of characters, else 0 (NaN for
    every answer with `nan=True`); `info["success"]` is reward 1."""

    def __init__(self, nan: bool = False):
        self.nan = nan

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.n = int(self.np_random.integers(100))
        return [{"role": "user", "content": f"Write {self.n} characters."}], {"task_id": f"parity/{self.n}"}

    def step(self, action):
        reward = float("nan") if self.nan else float(len(action) % 2)
        return [], reward, True, False, {"success": reward == 1.0}


def _train(tmp_path, model_dir, *extra: str) -> list[dict]:
    from agentrl.train import train

    out = tmp_path / "run"
    train(load_config(None, [
        "env.name=test_rollout_metrics:ParityEnv", "sft.steps=0", "rollout.tasks_per_step=4",
        "algo.group_size=2", "rollout.max_tokens=8", "train.eval_tasks=2", "train.eval_samples=1",
        f"model.path={model_dir}", f"out={out}", "quiet=true", *extra]))
    return [json.loads(x) for x in (out / "metrics.jsonl").open() if '"rollout/pass_rate"' in x]


@pytest.mark.filterwarnings("ignore:.*reward is a NaN value")
def test_all_nan_rewards_log_nan_not_zero(tiny_model_dir, tmp_path):
    [row] = _train(tmp_path, tiny_model_dir, "env.kwargs={nan: true}", "train.steps=1")
    assert row["rollout/reward_mean"] is None and row["rollout/reward_std"] is None  # NaN -> null
    assert row["rollout/nan_rewards"] == 8
    # the advantages saw no valid reward: group_stats' 0.0 and its count, under their own names
    assert row["adv/reward_mean"] == 0.0 and row["adv/num_invalid_rewards"] == 8
    assert row["adv/num_groups"] == 4 and row["adv/num_zero_variance_groups"] == 4


def test_dynamic_sampling_keeps_the_raw_rollout_statistics(tiny_model_dir, tmp_path):
    """Binary rewards, groups of 2: a group dynamic sampling keeps has one 0 and one 1, so the
    advantages' reward mean is exactly 0.5, while the raw mean over every sampled episode is the
    raw pass rate (success is reward 1)."""
    rows = _train(tmp_path, tiny_model_dir, "train.steps=3", "algo.dynamic_sampling=true")
    assert len(rows) == 3
    for r in rows:
        assert r["rollout/reward_mean"] == r["rollout/pass_rate"]
        assert r["rollout/nan_rewards"] == 0 and r["rollout/reward_std"] is not None
        if r["adv/num_groups"] > 0:
            assert r["adv/reward_mean"] == 0.5 and r["adv/num_zero_variance_groups"] == 0
    assert any(r["rollout/reward_mean"] != 0.5 for r in rows)  # the two differ on this seed
