"""`--agent` on vLLM (slow; the vLLM stage, .ci/vllm): the real `openai` SDK two-call agent of
tests/gateway/test_agent_train.py trains 2 GRPO steps, its gateway sampling from vLLM in the
driver (a `RolloutPool` of 0 workers), and from vLLM inside one Ray rollout worker (the gateway
runs in the worker). Checked against what vLLM was fed and sampled (a pass-through spy on
`VLLMEngine.generate`; in the worker, installed by the agent's module when the worker imports
it, one JSON line per completion with the pid): the trained ids are the sampled ids fed exactly
the ids before them, the loss mask covers only them, the sampler's logprobs are kept; and the
learner's logprobs of them match vLLM's (logp mismatch < 1e-4)."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest
import torch

from agentrl.algos.grpo import GRPO
from agentrl.config import load_config

pytestmark = pytest.mark.slow

if importlib.util.find_spec("vllm") is not None:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

_spec = importlib.util.spec_from_file_location(
    "agent_train_source", Path(__file__).resolve().parents[1] / "gateway" / "test_agent_train.py")
_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_mod)


def test_agent_trains_two_grpo_steps_on_vllm(tmp_path, monkeypatch):
    if os.environ.get("AGENTRL_REQUIRE_VLLM") != "1":
        pytest.importorskip("vllm", reason="vLLM is not installed (docs/scale_out.md)")
    (tmp_path / "vllm_agent.py").write_text(_mod.AGENT)
    (tmp_path / "tasks.jsonl").write_text("\n".join(json.dumps({"id": f"t{i}", "q": f"{i}+1?"})
                                                    for i in range(10)))
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = _seen_batches(monkeypatch)
    from agentrl.rollout.engines.vllm import VLLMEngine
    from agentrl.train import train

    calls, engines, generate = [], set(), VLLMEngine.generate

    def spy(self, prompts, params, **kw):
        engines.add(self)
        outs = generate(self, prompts, params, **kw)
        for i, p in enumerate(prompts):
            for c in outs[i * params.n:(i + 1) * params.n]:
                calls.append((tuple(p), list(c.token_ids), list(c.logprobs)))
        return outs

    monkeypatch.setattr(VLLMEngine, "generate", spy)

    try:
        _train(train, tmp_path)
    finally:
        for e in engines:  # before the next module of the vLLM stage builds its engine
            e.close()
    assert len(engines) == 1, "one in-process vLLM engine sampled every call"
    _check(seen, calls, tmp_path / "run")


_ray_spec = importlib.util.spec_from_file_location("agent_ray_source", Path(__file__).with_name("test_agent_ray.py"))
_ray_mod = importlib.util.module_from_spec(_ray_spec)
_ray_spec.loader.exec_module(_ray_mod)
SPY = _ray_mod.spy("agentrl.rollout.engines.vllm", "VLLMEngine")


def test_agent_trains_two_grpo_steps_on_a_vllm_ray_worker(tmp_path, monkeypatch):
    """The same 2 steps with vLLM inside one Ray rollout worker (`rollout.num_workers=1`): the
    worker's gateway samples every call (none in this process), with the same checks."""
    if os.environ.get("AGENTRL_REQUIRE_VLLM") != "1":
        pytest.importorskip("vllm", reason="vLLM is not installed (docs/scale_out.md)")
    import ray
    from ray.job_config import JobConfig

    from agentrl.rollout.workers import ensure_ray
    from agentrl.train import train

    calls_path = tmp_path / "calls.jsonl"
    (tmp_path / "vllm_ray_agent.py").write_text(f"CALLS = {str(calls_path)!r}\n" + SPY + _mod.AGENT)
    (tmp_path / "tasks.jsonl").write_text("\n".join(json.dumps({"id": f"t{i}", "q": f"{i}+1?"})
                                                    for i in range(10)))
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = _seen_batches(monkeypatch)
    ours = not ray.is_initialized()
    if ours:
        ensure_ray(None, num_cpus=2, job_config=JobConfig(code_search_path=[str(tmp_path)]))
    try:
        _train(train, tmp_path, ["rollout.num_workers=1"], module="vllm_ray_agent")
    finally:
        if ours and ray.is_initialized():
            ray.shutdown()
    rows = [json.loads(x) for x in calls_path.read_text().splitlines()]
    pids = {r[0] for r in rows}
    assert os.getpid() not in pids and len(pids) == 1, "the worker sampled every call, the driver none"
    _check(seen, [(tuple(p), ids, lps) for _, p, ids, lps in rows], tmp_path / "run")


def _seen_batches(monkeypatch) -> list[dict]:
    """The tensors of each batch GRPO computes advantages for (a pass-through wrapper)."""
    seen: list[dict] = []
    adv = GRPO.advantages

    def advantages(self, batch, cfg):
        out = adv(self, batch, cfg)
        seen.append({k: v.clone() for k, v in batch.items() if isinstance(v, torch.Tensor)})
        return out

    monkeypatch.setattr(GRPO, "advantages", advantages)
    return seen


def _check(seen: list[dict], calls: list[tuple], run: Path) -> None:
    """Each of the 2 batches: 6 conversations of two sampled turns, each turn = ids vLLM sampled
    fed exactly the ids before it, with its logprobs; the mask on them only; mismatch < 1e-4."""
    sampled: dict[tuple, list] = {}
    for p, ids, lps in calls:
        sampled.setdefault(tuple(p), []).append((ids, lps))
    assert len(seen) == 2
    for batch in seen:
        assert batch["input_ids"].shape[0] == 6  # 2 tasks x 3 runs, one conversation each
        for b in range(6):
            live = batch["attention_mask"][b] > 0
            ids, mask = batch["input_ids"][b][live].tolist(), batch["loss_mask"][b][live].tolist()
            spans = [(s, e) for s, e in _spans(mask)]
            assert len(spans) == 2, "two calls: two sampled turns"
            for s, e in spans:
                lp = batch["sampler_logprobs"][b][live][s:e]
                assert any(ids[s:e] == got and torch.allclose(lp, torch.tensor(lps), atol=1e-6)
                           for got, lps in sampled[tuple(ids[:s])])
            assert sum(mask) == sum(e - s for s, e in spans)
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "loss/logp_mismatch_max" in m]
    assert len(steps) == 2 and all(m["loss/logp_mismatch_max"] < 1e-4 for m in steps), steps


def _spans(mask):
    spans, t = [], 0
    while t < len(mask):
        if mask[t]:
            e = t
            while e < len(mask) and mask[e]:
                e += 1
            spans.append((t, e))
            t = e
        else:
            t += 1
    return spans


def _train(train, tmp_path, extra=(), module="vllm_agent"):
    """2 GRPO steps of the agent on an embedded model, sampled by vLLM (in this process unless
    `extra` says otherwise)."""
    train(load_config(overrides=[
        "env.name=agent", f"env.kwargs.agent={module}:agent", f"env.dataset={tmp_path / 'tasks.jsonl'}",
        "algo.name=grpo", "train.steps=2", f"out={tmp_path / 'run'}", "model.hidden_size=128",
        "model.num_layers=2", "model.num_heads=2", "model.intermediate_size=256", "sft.steps=0",
        "rollout.engine=vllm", "rollout.tasks_per_step=2", "algo.group_size=3",
        "rollout.max_episode_tokens=1024", "train.eval_tasks=1", "train.eval_samples=1", "quiet=true",
        "rollout.torch_threads=1", "train.torch_threads=1", "log.tensorboard=false", *extra]))
