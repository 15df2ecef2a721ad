"""Agents written with the OpenAI Agents SDK (`openai-agents`, a function tool) and with LangGraph
(a StateGraph with a ToolNode over `langchain-openai`'s ChatOpenAI), trained as they are: each
runs against the gateway with a scripted policy that calls the tool (the SDK's own tool-call
round trip: one trajectory, the tool result between the two sampled turns), and (slow) 1 GRPO
step with the tiny model. The agents are tests/fixtures/agents/*.py, as docs/agents.md shows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrl.gateway.agents import AgentEnv
from agentrl.rollout.agent_loop import EpisodeSpec
from agentrl.rollout.chat import ChatRenderer
from agentrl.rollout.engines.base import SamplingParams
from agentrl.rollout.engines.scripted import ScriptedEngine

ROOT = Path(__file__).resolve().parents[2]
AGENTS = ROOT / "tests" / "fixtures" / "agents"
SDKS = [pytest.param("openai_agents_calc", "agents", id="openai-agents"),
        pytest.param("langgraph_calc", "langgraph", id="langgraph")]


@pytest.fixture
def tasks(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(AGENTS))
    p = tmp_path / "tasks.jsonl"
    p.write_text('{"id": "t0", "question": "What is 2 + 3?", "answer": 5}\n'
                 '{"id": "t1", "question": "What is 10 + 7?", "answer": 17}\n')
    return p


@pytest.mark.parametrize("module,package", SDKS)
def test_sdk_agent_calls_its_tool_through_the_gateway(module, package, tasks, tiny_tokenizer):
    pytest.importorskip(package)
    tok = tiny_tokenizer

    def policy(prompt_ids):  # calls add(a, b), then answers with the tool's result
        text = tok.decode(prompt_ids, skip_special_tokens=False)
        if "<|im_start|>tool\n" in text:
            return f"The answer is {text.rsplit('<|im_start|>tool', 1)[1].split('<|im_end|>')[0].strip()}."
        a, b = (2, 3) if "2 + 3" in text else (10, 7)
        return '<tool_call>\n' + json.dumps({"name": "add", "arguments": {"a": a, "b": b}}) + '\n</tool_call>'

    env = AgentEnv(f"{module}:run", str(tasks))
    trs = env.run_agents(ScriptedEngine(tok, policy), ChatRenderer(tok),
                         [EpisodeSpec({"options": {"task_index": i}}, group_id=i) for i in range(2)],
                         SamplingParams(max_tokens=64), max_episode_tokens=4096, seed=0, timeout_s=60)
    assert [t.task_id for t in trs] == ["t0", "t1"]
    for tr, want in zip(trs, ("5", "17")):
        assert "error" not in tr.info, tr.info
        assert tr.episode_return == 1.0 and len(tr.turns) == 2  # one conversation: one trajectory
        assert [m["role"] for m in tr.messages][-3:] == ["assistant", "tool", "assistant"]
        assert tr.messages[-2]["content"] == want and tr.messages[-1]["content"] == f"The answer is {want}."
        assert tr.messages[-3]["tool_calls"][0]["function"]["name"] == "add"
        t1, t2 = tr.turns  # the tool result sits between the sampled turns, loss mask 0
        assert sum(tr.loss_mask[t1.end:t2.start]) == 0 and all(tr.loss_mask[t2.start:t2.end])


@pytest.mark.slow
@pytest.mark.parametrize("module,package", SDKS)
def test_sdk_agent_trains_one_grpo_step(module, package, tasks, tmp_path, tiny_model_dir):
    """1 GRPO step of `--agent MODULE:run` with the tiny model (slow: ~20 s each)."""
    pytest.importorskip(package)
    from agentrl.config import load_config
    from agentrl.train import train

    cfg = load_config(overrides=[
        "env.name=agent", f"env.kwargs.agent={module}:run", f"env.dataset={tasks}", "algo.name=grpo",
        "train.steps=1", f"out={tmp_path / 'run'}", f"model.path={tiny_model_dir}", "sft.steps=0",
        "rollout.tasks_per_step=2", "algo.group_size=2", "rollout.max_tokens=16",
        "rollout.max_episode_tokens=4096", "train.eval_tasks=1", "train.eval_samples=1", "quiet=true"])
    train(cfg)
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    [step] = [m for m in metrics if "loss/logp_mismatch_max" in m]
    assert step["loss/logp_mismatch_max"] < 1e-4


@pytest.mark.parametrize("module,package", SDKS)
def test_sdk_agent_runs_of_later_batches_do_not_fail(module, package, tasks, tiny_tokenizer):
    """Each agent run has its own event loop; `ChatOpenAI` caches one HTTP client per base URL
    for the process, so the LangGraph example's runs after the first batch failed ("Event loop is
    closed", "bound to a different event loop": 2 or 3 of 4 a batch) until it brought its own."""
    pytest.importorskip(package)
    tok = tiny_tokenizer

    def policy(prompt_ids):
        text = tok.decode(prompt_ids, skip_special_tokens=False)
        if "<|im_start|>tool\n" in text:
            return "The answer is 5."
        return '<tool_call>\n' + json.dumps({"name": "add", "arguments": {"a": 2, "b": 3}}) + '\n</tool_call>'

    env = AgentEnv(f"{module}:run", str(tasks))
    for batch in range(3):
        trs = env.run_agents(ScriptedEngine(tok, policy), ChatRenderer(tok),
                             [EpisodeSpec({"options": {"task_index": 0}}, group_id=i) for i in range(4)],
                             SamplingParams(max_tokens=64), max_episode_tokens=4096, seed=batch, timeout_s=60)
        assert [(t.info.get("error"), t.episode_return) for t in trs] == [(None, 1.0)] * 4, batch
