"""Every model family (issue 38) on a Ray rollout worker: the family's tiny random-weight model
with its published chat template, the multi-turn tool episode of `tests/rollout/test_families.py`
(`ToolTurnsEnv`: a tool result, a user message, an answer), 2 GRPO steps with
`rollout.num_workers=1`. Slow: one local Ray cluster (started once for the module, shared by the
families; each family's `train` starts and ends its own worker actor on it).

The env is built inside the worker from the config (`env.name="test_families:ToolTurnsEnv"`);
the cluster gets `tests/rollout` on its Python path.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from agentrl.models.families import FAMILIES, build_family

ROLLOUT_TESTS = str(Path(__file__).resolve().parents[1] / "rollout")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ray_cluster():
    import ray
    from ray.job_config import JobConfig

    from agentrl.infra.cluster import ensure_ray

    added = ROLLOUT_TESTS not in sys.path
    if added:  # the driver builds the env too (eval, env checks at start-up)
        sys.path.insert(0, ROLLOUT_TESTS)
    t0 = time.perf_counter()
    ensure_ray(None, num_cpus=2, job_config=JobConfig(code_search_path=[ROLLOUT_TESTS]))
    print(f"ray.init: {time.perf_counter() - t0:.1f} s")
    yield ray
    ray.shutdown()
    if added:
        sys.path.remove(ROLLOUT_TESTS)


@pytest.mark.parametrize("name,history", [(n, "exact") for n in FAMILIES]
                         + [("qwen3", "template"), ("deepseek_r1_distill", "template")])
def test_two_grpo_steps_on_a_ray_worker_per_family(name, history, ray_cluster, tmp_path):
    """`train` with `rollout.num_workers=1`: every episode comes from worker 0 (step 2's from the
    weights pushed after step 1, policy version 1); the learner's logprobs of the recorded ids
    equal the worker's sampler logprobs (`loss/logp_mismatch` < 1e-4 at both steps: the trained
    ids are the sampled ids, on the same weights); the loss mask is 1 on exactly the sampled
    turns (`exact`: one row per episode, its 3 turns; `template`: one row per turn, its prompt
    the template's rendering, mask 0); no episode's ids drift from the template's rendering
    (`rollout/template_drift` == 0, every episode checked); the update moves the weights."""
    from safetensors.torch import load_file

    from agentrl.config import load_config
    from agentrl.train import train

    model = build_family(name, tmp_path / "model")
    out = tmp_path / "run"
    cfg = load_config(None, [
        "env.name=test_families:ToolTurnsEnv", "sft.steps=0", "rollout.tasks_per_step=2",
        "algo.group_size=2", "rollout.max_tokens=6", "train.steps=2", "train.eval_tasks=1",
        "train.eval_samples=1", "train.log_rollouts_every=1", "train.save_every=2",
        "rollout.num_workers=1", f"rollout.history={history}", f"model.path={model}", f"out={out}", "quiet=true"])
    train(cfg)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").open() if '"rollout/reward_mean"' in x]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["loss/logp_mismatch"] < 1e-4, (r["step"], r["loss/logp_mismatch"])
        assert r["rollout/template_drift"] == 0.0
    for step in (1, 2):
        trajs = [json.loads(x) for x in (out / "rollouts" / f"step_{step}.jsonl").open()]
        assert len(trajs) == (4 if history == "exact" else 12)
        for t in trajs:
            assert t["info"]["rollout_worker"] == 0 and t["policy_version"] == step - 1
            if history == "exact":
                assert len(t["turns"]) == 3 and not t["turn_prompts"]
            else:
                assert len(t["turns"]) == 1 and t["info"]["episode_turns"] == 3 and t["turns"][0]["start"] > 0
            sampled = sorted(k for u in t["turns"] for k in range(u["start"], u["end"]))
            assert [k for k, m in enumerate(t["loss_mask"]) if m] == sampled
            assert t["info"]["template_drift"] is False or t["info"]["template_drift"] == 0
            assert "template_drift_error" not in t["info"]
    before = load_file(f"{model}/model.safetensors")
    after = load_file(next((out / "checkpoints" / "step_2").rglob("*.safetensors")))
    assert [k for k in before if k in after and not (before[k] == after[k]).all()]
