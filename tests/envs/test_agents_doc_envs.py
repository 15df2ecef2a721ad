"""docs/agents.md's examples of the MCP env and reasoning-gym, as written there: the files and
command-line overrides taken from the page, an episode played through the env they configure,
and (slow) the page's `agentrl train` commands run for 2 steps (reasoning-gym: then its `agentrl
eval`). The Agents SDK and LangGraph examples are tests/fixtures/agents/*.py, checked to be the
page's text here and run by tests/gateway/test_agent_sdks.py."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.config import load_config
from agentrl.rollout.envs import build_env

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "agents.md").read_text()
SMALL = ["--steps", "2", "rollout.tasks_per_step=2", "algo.group_size=2", "rollout.max_tokens=16",
         "rollout.max_episode_tokens=4096", "train.eval_tasks=1", "train.eval_samples=1", "sft.steps=0"]


def _block(lang: str, needle: str) -> str:
    [b] = [b for b in re.findall(rf"```{lang}\n(.*?)```", DOC, flags=re.S) if needle in b]
    return b


def _command(needle: str) -> list[str]:
    """The page's `agentrl ...` command line containing `needle`, split as a shell would."""
    text = _block("bash", needle).replace("\\\n", " ")
    [line] = [x for x in text.splitlines() if needle in x and x.startswith("agentrl train")]
    return shlex.split(line)


def _config(argv: list[str], **flags: str):
    """The config the command's `--env`, `--dataset` and overrides give."""
    env = argv[argv.index("--env") + 1]
    overrides = [a for a in argv if "=" in a and not a.startswith("-")]
    extra = [f"env.dataset={flags['dataset']}"] if "dataset" in flags else []
    return load_config(overrides=[f"env.name={env}", *extra, *overrides])


def _cli_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {
        "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / ".pp")])}


def test_the_sdk_examples_are_the_tested_files():
    for name in ("openai_agents_calc.py", "langgraph_calc.py"):
        assert (ROOT / "tests" / "fixtures" / "agents" / name).read_text().rstrip() in DOC, name


def _mcp_example(tmp: Path) -> list[str]:
    (tmp / "calc_server.py").write_text(_block("python", 'MCPServer("calc")'))
    (tmp / "mcp_tasks.jsonl").write_text(_block("jsonl", '"m0"'))
    return _command("--env mcp_tools")


def test_mcp_doc_example_plays_an_episode(tmp_path, monkeypatch):
    pytest.importorskip("mcp")
    argv = _mcp_example(tmp_path)
    monkeypatch.chdir(tmp_path)  # the server command runs from the user's folder
    cfg = _config(argv, dataset=argv[argv.index("--dataset") + 1])
    assert cfg.env.kwargs["servers"] == ["python calc_server.py"] and cfg.env.kwargs["timeout_s"] == 5
    cfg.env.kwargs["servers"] = [f"{sys.executable} calc_server.py"]  # this interpreter's `python`
    env = build_env(cfg, "train")
    obs, info = env.reset(options={"task_index": 1})
    assert obs[-1]["content"] == "What is 10 + 7?" and '"name": "add"' in obs[0]["content"]
    msgs, *_ = env.step('<tool_call>\n{"name": "add", "arguments": {"a": 10, "b": 7}}\n</tool_call>')
    assert msgs == [{"role": "tool", "content": "17", "name": "add"}]
    _, r, term, _, info = env.step("10 + 7 = 17.\nAnswer: 17")
    assert term and r == 1.0 and info["tool_calls"] == 1 and info["tool_errors"] == 0
    env.close()


@pytest.mark.slow
def test_mcp_doc_command_trains(tmp_path):
    """The page's `agentrl train --env mcp_tools ...` (2 steps, small), run from the folder
    holding calc_server.py (~60 s on 2 cores)."""
    pytest.importorskip("mcp")
    argv = _mcp_example(tmp_path)
    cmd = [sys.executable, "-m", "agentrl.cli", *argv[1:], "--out", "run", *SMALL]
    cmd[cmd.index("--steps") + 1] = "2"
    env = _cli_env() | {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert (tmp_path / "run" / "checkpoints" / "step_2").is_dir()


def test_reasoning_gym_doc_example_plays_an_episode():
    pytest.importorskip("reasoning_gym")
    argv = _command("--env reasoning_gym:basic_arithmetic")
    cfg = _config(argv)
    assert cfg.env.kwargs["config"] == {"max_terms": 3, "max_digits": 2}
    env = build_env(cfg, "heldout")
    obs, info = env.reset(options={"task_index": 0})
    core = env.unwrapped
    assert info["task_id"] == "basic_arithmetic/heldout/0" and core.entry["metadata"]["num_terms"] <= 3
    _, r, term, _, info = env.step(f"<answer>{core.entry['answer']}</answer>")
    assert term and r == 1.0


@pytest.mark.slow
def test_reasoning_gym_doc_commands_train_and_eval(tmp_path):
    """The page's train command (2 steps, small), then its eval command on the run (~60 s)."""
    pytest.importorskip("reasoning_gym")
    argv = _command("--env reasoning_gym:basic_arithmetic")
    cmd = [sys.executable, "-m", "agentrl.cli", *argv[1:], "--out", "run", *SMALL,
           "env.kwargs.heldout_size=4"]
    cmd[cmd.index("--steps") + 1] = "2"
    r = subprocess.run(cmd, cwd=tmp_path, env=_cli_env(), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    text = _block("bash", "agentrl eval --env reasoning_gym").replace("\\\n", " ")
    [line] = [x for x in text.splitlines() if x.startswith("agentrl eval")]
    ev = shlex.split(line.replace("runs/latest", "run"))
    r = subprocess.run([sys.executable, "-m", "agentrl.cli", *ev[1:], "--out", "ev", "--samples", "1",
                        "--max-tasks", "2", "--max-tokens", "16", "env.kwargs.heldout_size=4"],
                       cwd=tmp_path, env=_cli_env(), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    summary = json.loads((tmp_path / "ev" / "summary.json").read_text())
    assert summary["meta"]["samples"] == 1 and "pass@1" in summary["overall"]
