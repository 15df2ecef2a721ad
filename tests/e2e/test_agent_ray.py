"""`--agent` on Ray rollout workers (slow: a local Ray cluster of its own). Each worker runs the
gateway beside its own hf engine for its shard of the batch's runs; the agent is the real
`openai` SDK two-call agent of tests/gateway/test_agent_train.py.

What the engines were fed and sampled is recorded inside the workers by a pass-through wrapper
of `HFEngine.generate` that the agent's module installs when a worker imports it (the workers'
engines are out of reach of the test process), one JSON line per completion with the pid.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from agentrl.algos.grpo import GRPO
from agentrl.config import load_config
from agentrl.rollout.agent_loop import EpisodeSpec
from agentrl.rollout.collect import check_batch_hooks
from agentrl.rollout.engines.base import SamplingParams

_spec = importlib.util.spec_from_file_location(
    "agent_train_source", Path(__file__).resolve().parents[1] / "gateway" / "test_agent_train.py")
_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_mod)
AGENT = _mod.AGENT  # the real `openai` SDK two-call agent with a tool

def spy(module: str, cls: str) -> str:
    """Source that wraps `module.cls.generate` (an engine class) in a pass-through recorder: one
    JSON line per completion, [pid, prompt ids, sampled ids, logprobs], appended to the file
    named by the global `CALLS` (installed once per process, when a worker imports it)."""
    return f'''
import asyncio, json, os, threading
from {module} import {cls}

_generate, _lock = {cls}.generate, threading.Lock()

def _recorded(self, prompts, params, **kw):
    outs = _generate(self, prompts, params, **kw)
    with _lock, open(CALLS, "a") as f:
        for i, p in enumerate(prompts):
            for c in outs[i * params.n:(i + 1) * params.n]:
                f.write(json.dumps([os.getpid(), list(p), list(c.token_ids), list(c.logprobs)]) + "\\n")
    return outs

if getattr({cls}.generate, "__name__", "") != "_recorded":
    {cls}.generate = _recorded
'''


SPY = spy("agentrl.rollout.engines.hf", "HFEngine")

FAULTY = '''
async def faulty(client, task):
    if task["mode"] == "raise":
        await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}],
                                             max_tokens=3)
        raise RuntimeError("the agent broke")
    if task["mode"] == "hang":
        await asyncio.sleep(120)
    return await agent(client, task)
'''


@pytest.fixture(scope="module")
def agent_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("ray_agent")
    (d / "ray_agent.py").write_text(f"CALLS = {str(d / 'calls.jsonl')!r}\n" + SPY + AGENT + FAULTY)
    return d


@pytest.fixture(scope="module")
def ray_cluster(agent_dir):
    import ray
    from ray.job_config import JobConfig

    from agentrl.rollout.workers import ensure_ray

    ensure_ray(None, num_cpus=2, job_config=JobConfig(code_search_path=[str(agent_dir)]))
    yield ray
    ray.shutdown()


def _calls(agent_dir):
    path = agent_dir / "calls.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    path.unlink(missing_ok=True)
    return rows


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


def _train_on_workers(agent_dir, tmp_path, monkeypatch, model_dir, steps, extra=()):
    """`steps` GRPO steps of the two-call agent, 2 groups of 3 runs per step on 2 Ray workers;
    returns what GRPO computed advantages from (batch tensors, advantages) per step, and every
    completion the workers' engines sampled ([pid, prompt ids, ids, logprobs])."""
    monkeypatch.syspath_prepend(str(agent_dir))
    (tmp_path / "tasks.jsonl").write_text("\n".join(json.dumps({"id": f"t{i}", "q": f"{i}+1?"})
                                                    for i in range(10)))
    seen = []
    adv = GRPO.advantages

    def advantages(self, batch, cfg):
        out = adv(self, batch, cfg)
        seen.append(({k: v.clone() for k, v in batch.items() if isinstance(v, torch.Tensor)}, out[0].clone()))
        return out

    monkeypatch.setattr(GRPO, "advantages", advantages)
    _calls(agent_dir)
    cfg = load_config(overrides=[
        "env.name=agent", "env.kwargs.agent=ray_agent:agent", f"env.dataset={tmp_path / 'tasks.jsonl'}",
        "algo.name=grpo", f"train.steps={steps}", f"out={tmp_path / 'run'}", f"model.path={model_dir}",
        "sft.steps=0", "rollout.tasks_per_step=2", "algo.group_size=3", "rollout.max_episode_tokens=2048",
        "rollout.num_workers=2", "train.eval_tasks=1", "train.eval_samples=1", "quiet=true", *extra])
    from agentrl.train import train

    train(cfg)
    return seen, _calls(agent_dir)


def _check_batches(seen, calls, steps):
    """Every completion sampled in a worker process (both workers, not the driver); each batch's
    6 conversations: the trained ids are the sampled ids fed exactly the ids before them, the
    loss mask covers only them, the logprobs are the sampler's; the rewards reach the
    advantages (group-normalised)."""
    pids = {pid for pid, *_ in calls}
    assert os.getpid() not in pids and len(pids) == 2, "both workers sampled, the driver did not"
    sampled: dict[tuple, list] = {}
    for _, p, ids, lps in calls:
        sampled.setdefault(tuple(p), []).append((ids, lps))
    assert len(seen) == steps
    for batch, a in seen:
        assert batch["input_ids"].shape[0] == 6  # 2 tasks x 3 runs, one conversation each
        for b in range(6):
            live = batch["attention_mask"][b] > 0
            ids, mask = batch["input_ids"][b][live].tolist(), batch["loss_mask"][b][live].tolist()
            spans = _spans(mask)
            assert len(spans) == 2, "two calls: two sampled turns"
            for s, e in spans:
                lp = batch["sampler_logprobs"][b][live][s:e]
                assert any(ids[s:e] == got and torch.allclose(lp, torch.tensor(lps), atol=1e-6)
                           for got, lps in sampled[tuple(ids[:s])])
            assert sum(mask) == sum(e - s for s, e in spans)
        scores, groups = batch["scores"], batch["group_ids"]
        for g in groups.unique():
            rows = (groups == g).nonzero().flatten()
            r = scores[rows]
            want = (r - r.mean()) / (r.std() + 1e-6)
            for k, row in enumerate(rows):
                m = batch["loss_mask"][row] > 0
                assert torch.allclose(a[row][m], want[k].expand(int(m.sum())), atol=1e-4)
                assert (a[row][~m] == 0).all()
        assert a.abs().sum() > 0 and scores.min() >= 0


@pytest.mark.slow
def test_agent_trains_two_grpo_steps_on_two_ray_workers(ray_cluster, agent_dir, tmp_path, monkeypatch,
                                                        tiny_model_dir):
    """2 GRPO steps, 2 groups of 3 runs on 2 workers (one group each): `_check_batches`, and
    logp mismatch < 1e-4 (on-policy)."""
    seen, calls = _train_on_workers(agent_dir, tmp_path, monkeypatch, tiny_model_dir, 2)
    _check_batches(seen, calls, 2)
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "loss/logp_mismatch_max" in m]
    assert len(steps) == 2 and all(m["loss/logp_mismatch_max"] < 1e-4 for m in steps)


@pytest.mark.slow
def test_agent_trains_async_on_two_ray_workers(ray_cluster, agent_dir, tmp_path, monkeypatch,
                                               tiny_model_dir):
    """Async mode (`rollout.mode=async`, `train.max_staleness=1`, 2 batches in flight): 3 steps
    on 2 workers with `_check_batches`; every trajectory's policy version is at most 1 behind
    the learner's at its update, and a batch sampled on older weights shows it."""
    seen, calls = _train_on_workers(agent_dir, tmp_path, monkeypatch, tiny_model_dir, 3,
                                    ["rollout.mode=async", "train.max_staleness=1",
                                     "rollout.batches_in_flight=2"])
    _check_batches(seen, calls, 3)
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "rollout/staleness_max" in m]
    assert len(steps) == 3 and all(0 <= m["rollout/staleness_max"] <= 1 for m in steps), steps
    assert any(m["rollout/staleness_max"] == 1 for m in steps), "async: some batch sampled ahead"


@pytest.mark.slow
def test_a_raising_or_hanging_agent_on_a_worker_ends_only_its_run(ray_cluster, agent_dir, tmp_path,
                                                                  monkeypatch, tiny_model_dir):
    """One worker, three runs of one batch: the agent that raises and the one that hangs past
    `env.step_timeout_s` are recorded errors of their own runs (reward 0); the third trains as
    usual. The same hook passes `check_batch_hooks` with vLLM in the workers too (run in
    tests/e2e/test_agent_vllm.py), and an env with other batch hooks is refused on workers."""
    from agentrl.rollout.envs import build_env
    from agentrl.rollout.workers import RolloutPool

    monkeypatch.syspath_prepend(str(agent_dir))
    (tmp_path / "tasks.jsonl").write_text("\n".join(json.dumps({"id": m, "q": "1+1?", "mode": m})
                                                    for m in ("ok", "raise", "hang")))
    cfg = load_config(overrides=[
        "env.name=agent", "env.kwargs.agent=ray_agent:faulty", f"env.dataset={tmp_path / 'tasks.jsonl'}",
        f"model.path={tiny_model_dir}", "sft.steps=0", "rollout.num_workers=1", "env.step_timeout_s=3"])
    pool = RolloutPool(cfg, tiny_model_dir)
    try:
        env = build_env(cfg, split="train")
        check_batch_hooks(pool, env)  # Ray workers with the hf engine: accepted
        specs = [EpisodeSpec({"options": {"task_index": i}}, group_id=i) for i in range(3)]
        trs = pool.run(specs, SamplingParams(max_tokens=6, temperature=1.0), seed=3, one_per_run=True)
        calls = _calls(agent_dir)
        assert [t.task_id for t in trs] == ["ok", "raise", "hang"]
        ok, raised, hung = trs
        assert "error" not in ok.info and ok.info["agent_calls"] == 2 and ok.episode_return >= 0
        sampled = {(tuple(p), tuple(ids)) for _, p, ids, _ in calls}
        spans = _spans(ok.loss_mask)
        assert len(spans) == 2 and all((tuple(ok.token_ids[:s]), tuple(ok.token_ids[s:e])) in sampled
                                       for s, e in spans)
        assert "the agent broke" in raised.info["error"] and raised.episode_return == 0.0
        assert hung.info["env_timeout"] == "agent" and hung.episode_return == 0.0
        assert {t.info["rollout_worker"] for t in trs} == {0}
        cfg.rollout.engine = "vllm"
        check_batch_hooks(pool, env)  # vLLM in the workers: accepted (the gateway is in each)

        class Phased:
            def run_agents(self):
                pass

            def batch_phases(self):
                pass

        with pytest.raises(ValueError, match="rollout.engine=hf"):
            check_batch_hooks(pool, Phased())
        env.close()
    finally:
        pool.shutdown()


def test_agents_run_on_every_pool_and_other_batch_hooks_are_refused():
    """`--agent` on a `RolloutPool`: Ray workers (hf or vLLM in each) and in-process vLLM (0
    workers) pass; a 0-worker hf pool, and an env with other batch hooks on any pool, are
    refused naming the settings."""
    from agentrl.gateway.agents import AgentEnv

    env = SimpleNamespace(unwrapped=SimpleNamespace(run_agents=AgentEnv.run_agents))
    phased = SimpleNamespace(unwrapped=SimpleNamespace(run_agents=AgentEnv.run_agents, batch_phases=None))

    def pool(n, engine):
        return SimpleNamespace(run=None, num_workers=n, cfg=SimpleNamespace(rollout=SimpleNamespace(engine=engine)))

    with pytest.raises(ValueError, match="rollout.num_workers=0 and rollout.engine=hf"):
        check_batch_hooks(pool(0, "hf"), env)
    for n, engine in ((1, "hf"), (2, "hf"), (0, "vllm"), (1, "vllm"), (2, "vllm")):
        check_batch_hooks(pool(n, engine), env)
        with pytest.raises(ValueError, match="batch_phases"):
            check_batch_hooks(pool(n, engine), phased)


@pytest.mark.slow
def test_an_agent_module_only_the_driver_finds_runs_on_the_workers(ray_cluster, tmp_path, monkeypatch,
                                                                   tiny_model_dir):
    """The agent's module on the driver's `sys.path` only (not the workers' current folder, nor
    the cluster's code search path): the workers get the folder the driver found it in and
    import it; a module no worker can import (its file gone after the driver imported it) is
    one line naming the key, the module and the worker, when the pool starts (it was Ray's
    tracebacks at the first step, labelled env.kwargs)."""
    import sys

    from agentrl.config import ConfigError
    from agentrl.rollout.workers import RolloutPool

    folder = tmp_path / "driver_only"
    folder.mkdir()
    (folder / "driver_only_agent.py").write_text(AGENT)
    (folder / "gone_agent.py").write_text(AGENT)
    monkeypatch.syspath_prepend(str(folder))
    (tmp_path / "tasks.jsonl").write_text(json.dumps({"id": "t0", "q": "1+1?"}))
    base = [f"env.dataset={tmp_path / 'tasks.jsonl'}", "env.name=agent", f"model.path={tiny_model_dir}",
            "sft.steps=0", "rollout.num_workers=1"]
    pool = RolloutPool(load_config(overrides=[*base, "env.kwargs.agent=driver_only_agent:agent"]), tiny_model_dir)
    try:
        trs = pool.run([EpisodeSpec({"options": {"task_index": 0}}, group_id=0)],
                       SamplingParams(max_tokens=6, temperature=1.0), seed=0, one_per_run=True)
        assert "error" not in trs[0].info and trs[0].info["agent_calls"] == 2, trs[0].info
    finally:
        pool.shutdown()
    import gone_agent  # noqa: F401 - imported here, then its file goes

    (folder / "gone_agent.py").unlink()
    try:
        cfg = load_config(overrides=[*base, "env.kwargs.agent=gone_agent:agent"])
        with pytest.raises(ConfigError) as e:
            RolloutPool(cfg, tiny_model_dir)
        assert str(e.value).startswith("config error: env.kwargs.agent: rollout worker 0 (pid ")
        assert "cannot import module 'gone_agent' (ModuleNotFoundError: No module named 'gone_agent')" \
            in str(e.value) and "\n" not in str(e.value), str(e.value)
    finally:
        sys.modules.pop("gone_agent", None)
