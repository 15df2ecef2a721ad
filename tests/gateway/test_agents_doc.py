"""docs/agents.md's example agent, as written there: through the gateway with a scripted policy
that calls its tool (the tool path end to end), and (slow) `agentrl train --agent` then
`agentrl eval --agent` on the CLI with the embedded model."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.gateway.agents import AgentEnv
from agentrl.rollout.agent_loop import EpisodeSpec
from agentrl.rollout.chat import ChatRenderer
from agentrl.rollout.engines.base import SamplingParams
from agentrl.rollout.engines.scripted import ScriptedEngine

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "agents.md").read_text()


def _example(tmp: Path) -> Path:
    [code] = [b for b in re.findall(r"```python\n(.*?)```", DOC, flags=re.S) if "async def solve" in b]
    [tasks] = [b for b in re.findall(r"```jsonl\n(.*?)```", DOC, flags=re.S) if '"id": "t0"' in b]
    (tmp / "calc_agent.py").write_text(code)
    (tmp / "tasks.jsonl").write_text(tasks)
    return tmp / "tasks.jsonl"


def test_doc_agent_calls_its_tool_through_the_gateway(tmp_path, monkeypatch, tiny_tokenizer):
    tasks = _example(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    tok = tiny_tokenizer

    def policy(prompt_ids):  # calls add(2, 3) (or 10 + 7), then answers with the tool's result
        text = tok.decode(prompt_ids, skip_special_tokens=False)
        if "<|im_start|>tool\n" in text:
            return f"The answer is {text.rsplit('<|im_start|>tool', 1)[1].split('<|im_end|>')[0].strip()}."
        a, b = (2, 3) if "2 + 3" in text else (10, 7)
        return '<tool_call>\n' + json.dumps({"name": "add", "arguments": {"a": a, "b": b}}) + '\n</tool_call>'

    env = AgentEnv("calc_agent:solve", str(tasks))
    trs = env.run_agents(ScriptedEngine(tok, policy), ChatRenderer(tok),
                         [EpisodeSpec({"options": {"task_index": i}}, group_id=i) for i in range(2)],
                         SamplingParams(max_tokens=64), max_episode_tokens=4096, seed=0, timeout_s=30)
    assert [t.task_id for t in trs] == ["t0", "t1"]
    for tr, want in zip(trs, ("5", "17")):
        assert "error" not in tr.info, tr.info
        assert tr.episode_return == 1.0 and len(tr.turns) == 2 and tr.info["agent_metrics"] == {"calls": 5.0}
        assert tr.messages[-1]["content"] == f"The answer is {want}."
        assert tr.messages[3] == {"role": "tool", "tool_call_id": tr.messages[2]["tool_calls"][0]["id"],
                                  "content": want}


@pytest.mark.slow
def test_doc_commands_train_and_eval(tmp_path):
    """The doc's `agentrl train --agent` (2 steps, small) and `agentrl eval --agent` as a user
    runs them, from the folder holding calc_agent.py (about 100 s on 2 cores: the embedded model is built first)."""
    _example(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {
        "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / ".pp")])}
    small = ["rollout.tasks_per_step=2", "algo.group_size=2", "rollout.max_tokens=16",
             "rollout.max_episode_tokens=1024", "train.eval_tasks=1", "train.eval_samples=2"]
    r = subprocess.run([sys.executable, "-m", "agentrl.cli", "train", "--agent", "calc_agent:solve",
                        "--dataset", "tasks.jsonl", "--algo", "grpo", "--steps", "2", "--out", "run", *small],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert (tmp_path / "run" / "checkpoints" / "step_2").is_dir()
    r = subprocess.run([sys.executable, "-m", "agentrl.cli", "eval", "--agent", "calc_agent:solve",
                        "--dataset", "tasks.jsonl", "--model", "run", "--out", "ev", "--samples", "2",
                        "--max-tokens", "16", "--max-episode-tokens", "1024"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    summary = json.loads((tmp_path / "ev" / "summary.json").read_text())
    assert summary["meta"]["samples"] == 2 and "pass@1" in summary["overall"]
    r = subprocess.run([sys.executable, "-m", "agentrl.cli", "train", "--agent", "calc_agent:sync",
                        "--dataset", "tasks.jsonl", "--out", "bad"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 2 and "calc_agent:sync" in r.stdout, r.stdout + r.stderr
