"""mcp_tools: tools from a real MCP server (tests/fixtures/mcp_server.py, built with the `mcp`
SDK, over stdio and streamable HTTP): listed, called, a timeout and a raising tool recorded as
tool errors with their values, a server that dies mid-episode restarted at the next episode,
bad server entries refused naming them; and 2 GRPO steps of `--env mcp_tools` on the tiny model."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("mcp")

from agentrl.env.registry import make_env  # noqa: E402
from agentrl_envs.mcp_tools import MCPToolsEnv, check_answer, load_qa_tasks  # noqa: E402
from agentrl_tools.mcp_client import parse_servers  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / "tests" / "fixtures" / "mcp_server.py"
STDIO = f"{sys.executable} {SERVER}"


def _call(name: str, args: dict) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": args})}\n</tool_call>'


@pytest.fixture
def tasks(tmp_path) -> Path:
    p = tmp_path / "tasks.jsonl"
    p.write_text('{"id": "a", "question": "What is 2 + 3?", "answer": 5, "checker": "number"}\n'
                 '{"id": "b", "question": "Name the colour of the sky.", "answers": ["blue", "azure"]}\n')
    return p


def test_the_env_lists_calls_and_records_timeouts_and_errors(tasks):
    env = make_env("mcp_tools", env_kwargs={"dataset": str(tasks), "servers": [STDIO], "timeout_s": 1.0,
                                            "tool_error_penalty": 0.25})
    obs, info = env.reset(options={"task_index": 0})
    core = env.unwrapped
    assert core.task["id"] == "a" and info["mcp_restarts"] == 0
    tool_env = env
    while not isinstance(tool_env, MCPToolsEnv):
        tool_env = tool_env.env
    schemas = {s["function"]["name"]: s["function"] for s in tool_env.tool_schemas()}
    assert sorted(schemas) == ["add", "crash", "fail", "hang", "slow"]  # list_tools -> the agent's schemas
    assert schemas["add"]["description"] == "Add two integers."
    assert schemas["add"]["parameters"]["required"] == ["a", "b"]
    assert schemas["add"]["parameters"]["properties"]["a"]["type"] == "integer"
    assert '"name": "slow"' in obs[0]["content"]  # listed in the system message (hermes)

    msgs, r, term, trunc, info = env.step(_call("add", {"a": 2, "b": 3}))
    assert msgs == [{"role": "tool", "content": "5", "name": "add"}] and r == 0.0 and not term
    t0 = time.monotonic()
    msgs, r, term, _, info = env.step(_call("slow", {"seconds": 5}))
    assert time.monotonic() - t0 < 3.0  # the 1 s tool timeout, not the tool's 5 s
    assert msgs[0]["content"] == "Error: tool 'slow' timed out after 1 s" and r == -0.25 and not term
    assert info["tool_error_kinds"] == {"timeout": 1} and info["error"] == "tool 'slow' timed out after 1 s"
    msgs, r, term, _, info = env.step(_call("fail", {"message": "boom"}))
    assert msgs[0]["content"] == "Error: Error executing tool fail: fail was asked to fail: boom"
    assert r == -0.25 and info["tool_error_kinds"] == {"timeout": 1, "tool_error": 1}
    msgs, r, *_ , info = env.step(_call("add", {"a": "x", "b": 1}))  # the server validates types
    assert "Input should be a valid integer" in msgs[0]["content"] and info["tool_errors"] == 3
    msgs, r, *_ , info = env.step(_call("add", {"a": 1}))  # required keys checked here
    assert msgs[0]["content"] == "Error: missing required argument(s) 'b' for 'add'"
    assert info["tool_error_kinds"]["bad_arguments"] == 1
    msgs, r, *_ , info = env.step(_call("add", {"a": 40, "b": 2}))  # still up after the timeout
    assert msgs[0]["content"] == "42" and info["tool_calls"] == 6 and info["tool_errors"] == 4
    assert tool_env.reference_answer() == "Answer: 5"  # the warm start's target (start-up check below)
    _, r, term, _, info = env.step("The sum is 5.\nAnswer: 5.0")
    assert term and r == 1.0 and info["answer"] == "5.0" and info["gold"] == ["5"]
    env.close()
    from agentrl.startup import env_has_reference_answers

    assert env_has_reference_answers("mcp_tools") and env_has_reference_answers("reasoning_gym:chain_sum")


def test_a_server_that_dies_mid_episode_is_a_tool_error_and_restarts(tasks):
    env = make_env("mcp_tools", env_kwargs={"dataset": str(tasks), "servers": [STDIO], "timeout_s": 5.0})
    env.reset(options={"task_index": 1})
    msgs, r, term, _, info = env.step(_call("crash", {}))
    assert not term and "closed the connection during the call (it crashed or exited)" in msgs[0]["content"]
    assert "crash: the server exits now; it is restarted at the next episode" in msgs[0]["content"]  # its stderr
    assert info["tool_error_kinds"] == {"tool_error": 1}
    msgs, *_ = env.step(_call("add", {"a": 1, "b": 1}))  # the rest of the episode: down, recorded
    assert msgs[0]["content"] == ("Error: MCP server 'mcp_server.py' is down; it is restarted at "
                                  "the next episode")
    _, r, term, _, info = env.step("Answer: the sky is blue")
    assert term and r == 0.0  # exact match after normalisation: "sky is blue" != "blue"
    _, info = env.reset(options={"task_index": 1})
    assert info["mcp_restarts"] == 1
    msgs, *_ = env.step(_call("add", {"a": 1, "b": 1}))
    assert msgs[0]["content"] == "2"
    _, r, *_ = env.step("Answer: Blue.")
    assert r == 1.0
    env.close()


@pytest.mark.slow
def test_a_hung_server_is_restarted_at_the_next_episode(tasks, monkeypatch):
    """(slow: ~12 s on 2 cores, two server starts and a kill)"""
    import agentrl_tools.mcp_client as mc

    monkeypatch.setattr(mc, "PING_TIMEOUT_S", 1.0)
    env = make_env("mcp_tools", env_kwargs={"dataset": str(tasks), "servers": [{"command": STDIO, "name": "h"}],
                                            "timeout_s": 1.0})
    env.reset(options={"task_index": 0})
    msgs, *_ , info = env.step(_call("hang", {"seconds": 60}))
    assert msgs[0]["content"] == "Error: tool 'hang' timed out after 1 s"
    msgs, *_ , info = env.step(_call("add", {"a": 1, "b": 1}))  # the server answers nothing now
    assert msgs[0]["content"] == "Error: tool 'add' timed out after 1 s"
    assert info["tool_error_kinds"] == {"timeout": 2}
    _, info = env.reset(options={"task_index": 0})  # no tool list within 1 s: restarted
    assert info["mcp_restarts"] == 1
    msgs, *_ = env.step(_call("add", {"a": 1, "b": 1}))
    assert msgs[0]["content"] == "2"
    _, info = env.reset(options={"task_index": 0})  # answered the listing: not restarted again
    assert info["mcp_restarts"] == 0
    env.close()


@pytest.mark.slow
def test_fewer_than_5_tasks_say_held_out_is_train_at_start_up(tasks, tmp_path):
    """2 tasks and no heldout file: both splits are the 2 tasks, and `startup_notes` (the
    `[run]` line, `agentrl eval`) says so, as the agent env does; from 5 tasks on, every fifth
    is held out and nothing is said (it evaluated the training tasks silently)."""
    env = MCPToolsEnv(str(tasks), [{"command": STDIO, "name": "calc"}])
    assert env.startup_notes() == [
        f"warning: held-out == train: the 2 tasks of {tasks} are both the training and the held-out "
        "tasks (every fifth task is held out from 5 tasks on); give 5 or more tasks, or "
        "env.kwargs.heldout=FILE"]
    five = tmp_path / "five.jsonl"
    five.write_text("".join(json.dumps({"question": f"q{i}", "answer": i}) + "\n" for i in range(5)))
    assert MCPToolsEnv(str(five), [{"command": STDIO, "name": "calc"}]).startup_notes() == []
    assert MCPToolsEnv(str(tasks), [{"command": STDIO, "name": "calc"}], heldout=str(five)).startup_notes() == []


def test_two_servers_with_one_tool_name_need_a_prefix(tasks):
    """(slow: two server starts, ~6 s)"""
    with pytest.raises(ValueError, match="servers 'one' and 'two' both offer a tool 'add'; give one a 'prefix'"):
        MCPToolsEnv(str(tasks), [{"command": STDIO, "name": "one"}, {"command": STDIO, "name": "two"}])
    env = MCPToolsEnv(str(tasks), [{"command": STDIO, "name": "one"}, {"command": STDIO, "name": "two", "prefix": "b_"}])
    assert [s["function"]["name"] for s in env.tool_schemas()] == [
        "add", "slow", "fail", "hang", "crash", "b_add", "b_slow", "b_fail", "b_hang", "b_crash"]
    env.reset(options={"task_index": 0})
    msgs, *_ = env.step(_call("b_add", {"a": 1, "b": 2}))
    assert msgs[0]["content"] == "3"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _http_server(port: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, str(SERVER), "--http", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while True:  # wait for the server to listen
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            assert time.monotonic() < deadline and proc.poll() is None, "the HTTP MCP server did not start"
            time.sleep(0.2)


def test_a_streamable_http_server_on_loopback(tasks):
    port = _free_port()
    proc = _http_server(port)
    try:
        url = f"http://127.0.0.1:{port}/mcp"
        env = make_env("mcp_tools", env_kwargs={"dataset": str(tasks), "servers": [{"url": url, "prefix": "m_"}]})
        env.reset(options={"task_index": 0})
        msgs, *_ = env.step(_call("m_add", {"a": 20, "b": 22}))
        assert msgs == [{"role": "tool", "content": "42", "name": "m_add"}]
        env.close()
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.slow
def test_an_http_server_that_goes_away_is_a_tool_error_and_reconnects(tasks):
    """(slow: two HTTP server starts, ~10 s)"""
    port = _free_port()
    proc = _http_server(port)
    try:
        url = f"http://127.0.0.1:{port}/mcp"
        env = make_env("mcp_tools", env_kwargs={"dataset": str(tasks), "servers": [{"url": url, "name": "web"}],
                                                "timeout_s": 3.0})
        env.reset(options={"task_index": 0})
        proc.terminate()
        proc.wait(10)
        msgs, _, term, _, info = env.step(_call("add", {"a": 1, "b": 1}))
        assert not term and msgs[0]["content"].startswith("Error: ") and info["tool_errors"] == 1
        proc = _http_server(port)  # back on the same address: the next episode reconnects
        _, info = env.reset(options={"task_index": 0})
        assert info["mcp_restarts"] == 1
        msgs, *_ = env.step(_call("add", {"a": 1, "b": 1}))
        assert msgs[0]["content"] == "2"
        env.close()
    finally:
        proc.terminate()
        proc.wait(10)


def test_bad_servers_and_tasks_are_refused_naming_them(tmp_path, tasks):
    with pytest.raises(ValueError, match=r"servers\[0\]: MCP server URL 'http://10.0.0.1:80/mcp' must be .* loopback"):
        parse_servers(["http://10.0.0.1:80/mcp"])
    with pytest.raises(ValueError, match=r"servers\[1\]: unknown key\(s\) \['port'\]"):
        parse_servers([STDIO, {"command": "x", "port": 1}])
    with pytest.raises(ValueError, match="give the MCP servers"):
        parse_servers([])
    with pytest.raises(ValueError, match="two servers are named 'a'"):
        parse_servers([{"command": "x", "name": "a"}, {"command": "y", "name": "a"}])
    [spec] = parse_servers({"command": ["python", "s.py"], "args": ["--v"], "env": {"K": 1}})
    assert spec.command == ("python", "s.py", "--v") and spec.env == (("K", "1"),) and spec.name == "s.py"
    with pytest.raises(ValueError, match=r"servers: MCP server 'nope' .* did not start"):
        MCPToolsEnv(str(tasks), [{"command": [sys.executable, "-c", "import sys; sys.exit(2)"], "name": "nope"}],
                    connect_timeout_s=20)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "answer": "a"}\n{"question": "q2"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: needs 'answer'"):
        load_qa_tasks(bad)
    bad.write_text('{"question": "q", "answer": "a", "checker": "fuzzy"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: unknown checker 'fuzzy'"):
        load_qa_tasks(bad)


@pytest.mark.parametrize("kind,answer,golds,want", [
    ("exact", "The Blue.", ["blue"], 1.0), ("exact", "blue sky", ["blue"], 0.0),
    ("contains", "it is Blue, I think", ["blue"], 1.0), ("number", "about 1,000.0 items", ["1000"], 1.0),
    ("number", "5 then 6", ["5"], 0.0), ("regex", " 42 ", ["4\\d"], 1.0), ("regex", "x42", ["4\\d"], 0.0),
])
def test_checkers(kind, answer, golds, want):
    assert check_answer(kind, answer, golds) == want


def test_two_grpo_steps_on_the_tiny_model(tmp_path, tiny_model_dir):
    """`agentrl train --env mcp_tools` as a config: 2 GRPO steps, the server started once."""
    from agentrl.config import load_config
    from agentrl.train import train

    data = tmp_path / "tasks.jsonl"
    data.write_text("\n".join(json.dumps({"id": f"t{i}", "question": f"What is {i} + 1?", "answer": i + 1,
                                          "checker": "number"}) for i in range(6)))
    cfg = load_config(overrides=[
        "env.name=mcp_tools", f"env.dataset={data}", f"env.kwargs.servers=['{STDIO}']",
        "env.kwargs.timeout_s=2", "algo.name=grpo", "train.steps=2", f"out={tmp_path / 'run'}",
        f"model.path={tiny_model_dir}", "sft.steps=0", "rollout.tasks_per_step=2", "algo.group_size=2",
        "rollout.max_tokens=16", "rollout.max_episode_tokens=8192", "train.eval_tasks=1",
        "train.eval_samples=1", "quiet=true"])
    train(cfg)
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "loss/logp_mismatch_max" in m]
    assert len(steps) == 2
    assert (tmp_path / "run" / "checkpoints" / "step_2").is_dir()


def test_a_dead_servers_stderr_is_read_to_its_end_before_the_error_is_written():
    """`StderrTail.settle`: the last line a server writes before it dies is in the tail even when
    the reader thread lags (held here by its lock, as a loaded machine delays it): settle waits
    for the end of the pipe; text() at once would miss it."""
    import subprocess
    import sys
    import threading

    from agentrl_tools.mcp_client import StderrTail

    tail = StderrTail()
    tail._lock.acquire()  # the reader cannot store what it reads until released
    subprocess.run([sys.executable, "-c", "import sys; sys.stderr.write('crash: the last line\\n')"],
                   stderr=tail.file, check=True)
    assert tail._text == ""  # (what text() would give at once)
    threading.Timer(0.3, tail._lock.release).start()
    tail.settle(timeout_s=5.0)
    assert tail.text() == "crash: the last line\n"
