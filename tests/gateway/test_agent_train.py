"""`--agent` trains: a two-call agent (with a tool) through the real gateway and the real `openai`
SDK, 2 GRPO steps on the tiny model. Checked against what the engine was fed and sampled
(a pass-through spy on `generate`) and what the algorithm computed (a spy on `advantages`):
the trained ids are the sampled ids, the loss mask covers only them, the agent's rewards are the
group-relative advantages."""

from __future__ import annotations

import json

import pytest
import torch

import agentrl.run
from agentrl.algos.grpo import GRPO
from agentrl.config import load_config

AGENT = '''
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]

async def agent(client, task):
    msgs = [{"role": "user", "content": task["q"]}]
    r = await client.chat.completions.create(model="policy", messages=msgs, tools=TOOLS, max_tokens=6)
    m = r.choices[0].message
    msgs.append(m.model_dump(exclude_none=True))
    calls = m.tool_calls or []
    for c in calls:
        msgs.append({"role": "tool", "tool_call_id": c.id, "content": "42"})
    if not calls:
        msgs.append({"role": "user", "content": "Use the tool."})
    r2 = await client.chat.completions.create(model="policy", messages=msgs, tools=TOOLS, max_tokens=6)
    text = (m.content or "") + (r2.choices[0].message.content or "")
    return {"reward": len(text) / 10.0, "tool_calls": float(len(calls))}
'''


class Spy:
    """The engine, passed through; every generate call's prompts and completions kept."""

    def __init__(self, engine):
        self.engine, self.calls = engine, []

    def generate(self, prompts, params, **kw):
        outs = self.engine.generate(prompts, params, **kw)
        n = params.n
        for i, p in enumerate(prompts):
            for c in outs[i * n:(i + 1) * n]:
                self.calls.append((list(p), list(c.token_ids), list(c.logprobs)))
        return outs

    def __getattr__(self, name):
        return getattr(self.__dict__["engine"], name)


def test_agent_trains_two_grpo_steps(tmp_path, monkeypatch, tiny_model_dir):
    (tmp_path / "train_agent.py").write_text(AGENT)
    (tmp_path / "tasks.jsonl").write_text("\n".join(json.dumps({"id": f"t{i}", "q": f"{i}+1?"})
                                                    for i in range(10)))
    monkeypatch.syspath_prepend(str(tmp_path))
    spies, seen = [], []
    make = agentrl.run.rollout_engine
    monkeypatch.setattr(agentrl.run, "rollout_engine", lambda *a, **k: spies.append(Spy(make(*a, **k))) or spies[-1])
    adv = GRPO.advantages

    def advantages(self, batch, cfg):
        out = adv(self, batch, cfg)
        seen.append(({k: v.clone() for k, v in batch.items() if isinstance(v, torch.Tensor)}, out[0].clone()))
        return out

    monkeypatch.setattr(GRPO, "advantages", advantages)
    cfg = load_config(overrides=[
        "env.name=agent", "env.kwargs.agent=train_agent:agent", f"env.dataset={tmp_path / 'tasks.jsonl'}",
        "algo.name=grpo", "train.steps=2", f"out={tmp_path / 'run'}", f"model.path={tiny_model_dir}",
        "sft.steps=0", "rollout.tasks_per_step=2", "algo.group_size=3", "rollout.max_episode_tokens=2048",
        "train.eval_tasks=1", "train.eval_samples=1", "quiet=true"])
    from agentrl.train import train

    train(cfg)
    [spy] = spies
    sampled: dict[tuple, list] = {}  # prompt -> its completions (the runs of a group share prompts)
    for p, ids, lps in spy.calls:
        sampled.setdefault(tuple(p), []).append((ids, lps))
    assert len(seen) == 2
    for batch, a in seen:
        assert batch["input_ids"].shape[0] == 6  # 2 tasks x 3 runs, one conversation each
        for b in range(6):
            ids = batch["input_ids"][b][batch["attention_mask"][b] > 0].tolist()
            mask = batch["loss_mask"][b][batch["attention_mask"][b] > 0].tolist()
            # every run of sampled ids is one generate completion, fed exactly the ids before it
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
            assert len(spans) == 2, "two calls: two sampled turns"
            for s, e in spans:
                lp = batch["sampler_logprobs"][b][batch["attention_mask"][b] > 0][s:e]
                assert any(ids[s:e] == got and torch.allclose(lp, torch.tensor(lps), atol=1e-6)
                           for got, lps in sampled[tuple(ids[:s])])
            assert sum(mask) == sum(e - s for s, e in spans)
        # the agent's reward reaches the advantages: (R - mean_group) / (std_group + eps) on the mask
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
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "loss/logp_mismatch_max" in m]
    assert len(steps) == 2 and all(m["loss/logp_mismatch_max"] < 1e-4 for m in steps)


def test_the_agent_env_takes_the_runs_tool_format(tmp_path, monkeypatch):
    """`rollout.tool_parser` (a name, or auto from the tokenizer) reaches the `--agent` env as
    for a tool env; `env.kwargs.tool_parser` still wins (a new user found it ignored)."""
    from agentrl.rollout.envs import build_env

    (tmp_path / "fmt_agent.py").write_text("async def agent(client, task):\n    return 0.0\n")
    (tmp_path / "tasks.jsonl").write_text("\n".join(json.dumps({"id": f"t{i}", "q": "?"}) for i in range(6)))
    monkeypatch.syspath_prepend(str(tmp_path))
    base = ["env.name=agent", "env.kwargs.agent=fmt_agent:agent", f"env.dataset={tmp_path / 'tasks.jsonl'}"]
    for extra, want in ((["rollout.tool_parser=mistral"], "mistral"),
                        ([], "hermes"),  # auto on the embedded model: its Hermes tool tokens
                        (["rollout.tool_parser=mistral", "env.kwargs.tool_parser=openai"], "openai")):
        env = build_env(load_config(overrides=base + extra), split="train")
        assert type(env.unwrapped.parser).__name__.lower().startswith(want[:5]), (extra, env.unwrapped.parser)
        env.close()


def test_too_few_agent_tasks_warn_that_held_out_is_train(tmp_path, monkeypatch):
    """`--agent` with fewer than 5 tasks (and no env.kwargs.heldout file): the held-out split
    is the training tasks, and the run's start-up notes (its `[run]` line; `agentrl eval`'s
    line) say so; 5 tasks hold one out and say nothing (a new user saw held-out figures of the
    tasks they trained on, without a word)."""
    from agentrl.eval.cli import task_notes
    from agentrl.rollout.envs import build_env
    from agentrl.startup import preflight

    (tmp_path / "few_agent.py").write_text("async def agent(client, task):\n    return 0.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for n in (2, 5):
        path = tmp_path / f"tasks{n}.jsonl"
        path.write_text("\n".join(json.dumps({"id": f"t{i}"}) for i in range(n)))
        cfg = load_config(overrides=["env.name=agent", "env.kwargs.agent=few_agent:agent", f"env.dataset={path}",
                                     "sft.steps=0"])
        train, held = (build_env(cfg, split=s).unwrapped for s in ("train", "heldout"))
        notes = preflight(cfg)
        if n == 2:
            assert train.tasks() == held.tasks() == [{"id": "t0"}, {"id": "t1"}]
            assert notes == [f"warning: held-out == train: the 2 tasks of {path} are both the training and "
                             "the held-out tasks (every fifth task is held out from 5 tasks on); give 5 or "
                             "more tasks, or env.kwargs.heldout=FILE"]
            assert task_notes(held) == notes[0]
        else:
            assert held.tasks() == [{"id": "t4"}] and len(train.tasks()) == 4
            assert notes == [] and task_notes(held) is None
    path.write_text("\n".join(json.dumps({"id": f"t{i}"}) for i in range(2)))  # a held-out file: no warning
    cfg = load_config(overrides=["env.name=agent", "env.kwargs.agent=few_agent:agent", f"env.dataset={path}",
                                 f"env.kwargs.heldout={path}", "sft.steps=0"])
    assert preflight(cfg) == []


def test_the_agent_envs_splits_are_train_heldout_and_all(tmp_path, monkeypatch):
    """8 tasks: `heldout` is t4, `train` the other 7, `all` (the default of `agentrl eval
    --dataset`) all 8 (a new user's `eval --split all` scored the 7 training tasks labelled
    `all`); `test` means heldout, and an unknown split is refused naming it."""
    from agentrl.gateway.agents import AgentEnv

    (tmp_path / "split_agent.py").write_text("async def agent(client, task):\n    return 0.0\n")
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(json.dumps({"id": f"t{i}"}) for i in range(8)))
    monkeypatch.syspath_prepend(str(tmp_path))

    def ids(split):
        return [t["id"] for t in AgentEnv("split_agent:agent", str(path), split=split).tasks()]

    assert ids("heldout") == ids("test") == ["t4"]
    assert ids("train") == ["t0", "t1", "t2", "t3", "t5", "t6", "t7"]
    assert ids("all") == [f"t{i}" for i in range(8)]
    with pytest.raises(ValueError, match="unknown split 'dev'"):
        ids("dev")
