"""The gateway with the real `openai` SDK against the real server on 127.0.0.1: tool calls
parsed from a scripted policy's text, the recorded ids (prefix reused, never re-tokenised),
context rewrites, every bad input of docs/agents.md in one batch beside a good run, and the
per-run tokens."""

from __future__ import annotations

import json
import os
import textwrap

import pytest

from agentrl.gateway.agents import AgentEnv, load_agent, reward_of
from agentrl.rollout.agent_loop import EpisodeSpec
from agentrl.rollout.chat import ChatRenderer
from agentrl.rollout.engines.base import SamplingParams
from agentrl.rollout.engines.scripted import ScriptedEngine

CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]

AGENTS = '''
import asyncio, json, httpx

TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]

async def tool_agent(client, task):
    msgs = [{"role": "user", "content": task["q"]}]
    r = await client.chat.completions.create(model="policy", messages=msgs, tools=TOOLS)
    m = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and m.content is None, r
    [call] = m.tool_calls
    args = json.loads(call.function.arguments)
    msgs.append(m.model_dump(exclude_none=True))
    msgs.append({"role": "tool", "tool_call_id": call.id, "content": str(args["a"] + args["b"])})
    r2 = await client.chat.completions.create(model="policy", messages=msgs, tools=TOOLS)
    assert r2.choices[0].finish_reason == "stop" and r2.usage.completion_tokens > 0
    return {"reward": float("5" in r2.choices[0].message.content), "tool": float(call.function.name == "add")}

async def rewrite_agent(client, task):
    a = await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "long story"}])
    summary = a.choices[0].message.content
    await client.chat.completions.create(model="policy", messages=[
        {"role": "system", "content": "summary: " + summary}, {"role": "user", "content": "go on"}])
    return 0.25

async def raises(client, task):
    await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
    raise RuntimeError("agent bug")

async def not_a_number(client, task):
    await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
    return "abc"

async def unknown_model(client, task):
    await client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    return 1.0

async def huge_prompt(client, task):
    await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "x" * 10_000_000}])
    return 1.0

async def bad_json(client, task):
    async with httpx.AsyncClient() as h:
        r = await h.post(f"{client.base_url}chat/completions", content=b"{not json",
                         headers={"Authorization": f"Bearer {client.api_key}"})
    assert r.status_code == 400, r.text
    r.raise_for_status()

async def never_calls(client, task):
    return 1.0

async def hangs(client, task):
    await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
    await asyncio.sleep(3600)

async def blocks(client, task):
    import time
    time.sleep(3)
    return 1.0

async def tokens(client, task):
    async with httpx.AsyncClient() as h:
        url = f"{client.base_url}chat/completions"
        body = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}
        none = await h.post(url, json=body)
        other = await h.post(url, json=body, headers={"Authorization": "Bearer not-a-run"})
        models = await h.get(f"{client.base_url}models", headers={"Authorization": f"Bearer {client.api_key}"})
    assert models.json()["data"][0]["id"] == "policy"
    r = await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
    return float(none.status_code == 401 and other.status_code == 401 and r.choices[0].message.content is not None)

def sync_agent(client, task):
    return 1.0

async def forced(client, task):
    """tool_choice: a named function (the reply is prefilled up to its arguments), then
    "required" (prefilled up to the name), then the refusals."""
    import openai
    msgs = [{"role": "user", "content": task["q"]}]
    named = {"type": "function", "function": {"name": "add"}}
    r = await client.chat.completions.create(model="policy", messages=msgs, tools=TOOLS, tool_choice=named)
    m = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls", r
    [call] = m.tool_calls
    assert call.function.name == "add" and json.loads(call.function.arguments) == {"a": 2, "b": 3}
    msgs.append(m.model_dump(exclude_none=True))
    msgs.append({"role": "tool", "tool_call_id": call.id, "content": "5"})
    r = await client.chat.completions.create(model="policy", messages=msgs, tools=TOOLS, tool_choice="required")
    [call] = r.choices[0].message.tool_calls
    assert call.function.name == "add" and json.loads(call.function.arguments) == {"a": 1, "b": 1}
    return 1.0

async def forced_bad(client, task):
    await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}],
                                         tools=TOOLS, tool_choice={"type": "function", "function": {"name": "mul"}})
    return 1.0
'''


def _policy(tok):
    """Calls the tool while no tool result is in the prompt, then answers."""
    def policy(prompt_ids):
        text = tok.decode(prompt_ids, skip_special_tokens=False)
        return "The sum is 5" if "<|im_start|>tool" in text else (CALL if "# Tools" in text else "ok")
    return policy


@pytest.fixture
def agents(tmp_path, monkeypatch):
    (tmp_path / "gw_agents.py").write_text(AGENTS)
    (tmp_path / "tasks.jsonl").write_text(json.dumps({"id": "t0", "q": "2+3?"}) + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def _run(tmp, tok, name, n=1, timeout_s=None, engine=None):
    env = AgentEnv(f"gw_agents:{name}", str(tmp / "tasks.jsonl"))
    engine = engine or ScriptedEngine(tok, _policy(tok))
    specs = [EpisodeSpec({"seed": i}, group_id=7) for i in range(n)]
    return env.run_agents(engine, ChatRenderer(tok), specs, SamplingParams(max_tokens=64),
                          max_episode_tokens=4096, seed=0, timeout_s=timeout_s)


def test_tool_call_round_trip_is_one_trajectory(agents, tiny_tokenizer):
    tok, r = tiny_tokenizer, ChatRenderer(tiny_tokenizer)
    [tr] = _run(agents, tok, "tool_agent")
    assert "error" not in tr.info, tr.info
    assert tr.info["agent_metrics"] == {"tool": 1.0} and tr.episode_return == 1.0
    t1, t2 = tr.turns
    # sampled ids as the scripted engine produced them: the text + the end of turn, mask 1
    assert tr.token_ids[t1.start:t1.end] == tok.encode(CALL, add_special_tokens=False) + [r.end_of_turn_id]
    assert tr.token_ids[t2.start:t2.end] == tok.encode("The sum is 5", add_special_tokens=False) + [r.end_of_turn_id]
    assert [i for i, m in enumerate(tr.loss_mask) if m] == [*range(t1.start, t1.end), *range(t2.start, t2.end)]
    assert (t1.reward, t2.reward) == (0.0, 1.0)
    # context between the turns: the glue, then the tool result's delta (never re-rendered)
    between = tr.token_ids[t1.end:t2.start]
    assert between == r.glue_ids + r.delta_ids([{"role": "tool", "tool_call_id": "x", "content": "5"}])
    # the opening prompt is the template's rendering of the first request with the tools
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    assert tr.token_ids[:t1.start] == r.prompt_ids([{"role": "user", "content": "2+3?"}], tools=tools)


def test_tool_choice_required_and_named_are_honoured_by_prefill(agents, tiny_tokenizer):
    tok = tiny_tokenizer
    named = '<tool_call>\n{"name": "add", "arguments": '
    anyone = '<tool_call>\n{"name": "'
    fed = []

    def policy(prompt_ids):  # writes the rest of the call it was prefilled with
        fed.append(list(prompt_ids))
        text = tok.decode(prompt_ids, skip_special_tokens=False)
        if text.endswith(named.rstrip()) or text.endswith(named):
            return '{"a": 2, "b": 3}}\n</tool_call>'
        assert text.endswith(anyone), text[-80:]
        return 'add", "arguments": {"a": 1, "b": 1}}\n</tool_call>'

    [tr] = _run(agents, tok, "forced", engine=ScriptedEngine(tok, policy))
    assert "error" not in tr.info, tr.info
    assert tr.episode_return == 1.0 and len(fed) == 2 and len(tr.turns) == 2
    for t, prefix, prompt in zip(tr.turns, (named, anyone), fed):
        pre = tok.encode(prefix, add_special_tokens=False)
        assert prompt[-len(pre):] == pre and tr.token_ids[:t.start] == prompt  # fed as context
        assert tr.loss_mask[t.start - len(pre):t.start] == [0] * len(pre)  # never trained on
        assert all(tr.loss_mask[t.start:t.end])
    assert [m["role"] for m in tr.messages] == ["user", "assistant", "tool", "assistant"]
    assert [m["tool_calls"][0]["function"]["name"] for m in tr.messages[1::2]] == ["add", "add"]
    [bad] = _run(agents, tok, "forced_bad", engine=ScriptedEngine(tok, policy))  # a clear 400, the run fails
    assert bad.info["gateway_refusals"] == ["400 invalid_request_error: 'tool_choice' names the function "
                                            "'mul', which is not in 'tools'"] and len(fed) == 2


@pytest.mark.parametrize("body,message", [
    ({"tool_choice": "required"}, "'tool_choice' requires a tool call but the request has no 'tools'"),
    ({"tool_choice": {"type": "function", "function": {"name": "add"}}},
     "'tool_choice' requires a tool call but the request has no 'tools'"),
    ({"tool_choice": {"function": "add"}, "tools": TOOLS},
     "'tool_choice' as an object must be {'type': 'function', 'function': {'name': ...}}"),
    ({"tool_choice": "any", "tools": TOOLS}, "'tool_choice' must be 'none', 'auto', 'required' or a function"),
])
def test_tool_choice_refusals(body, message):
    from agentrl.gateway.protocol import GatewayError, parse_request

    with pytest.raises(GatewayError) as e:
        parse_request({"model": "policy", "messages": [{"role": "user", "content": "hi"}], **body})
    assert e.value.status == 400 and e.value.message == message and e.value.param == "tool_choice"


def test_forced_prefix_of_every_tool_format():
    from agentrl.gateway.protocol import forced_prefix
    from agentrl_tools.parser import PARSERS, ToolCall, get_parser

    for name in PARSERS:  # the prefix is the call's own opening, up to the name / the arguments
        p = get_parser(name)
        call = p.format_call(ToolCall("add", {"a": 1}))
        assert call.startswith(forced_prefix(p, "add")) and call.startswith(forced_prefix(p, None))
        assert forced_prefix(p, "add").rstrip().endswith((':', ': "')) and forced_prefix(p, None).endswith('"')
    assert forced_prefix(get_parser("hermes"), "add") == '<tool_call>\n{"name": "add", "arguments": '


def test_context_rewrite_is_two_samples_sharing_the_reward(agents, tiny_tokenizer):
    trs = _run(agents, tiny_tokenizer, "rewrite_agent", n=2)
    assert len(trs) == 4 and [t.group_id for t in trs] == [7] * 4
    assert all(len(t.turns) == 1 and t.episode_return == 0.25 for t in trs)
    assert trs[1].messages[0]["content"].startswith("summary: ")


def test_bad_agents_end_only_their_own_run(agents, tiny_tokenizer):
    tok = tiny_tokenizer
    env = AgentEnv("gw_agents:tool_agent", str(agents / "tasks.jsonl"))
    names = ["raises", "not_a_number", "unknown_model", "huge_prompt", "bad_json", "never_calls",
             "hangs", "blocks", "tokens", "tool_agent"]
    fns = [load_agent(f"gw_agents:{n}") for n in names]

    # one batch, one agent function per spec: dispatch on the task's index
    async def dispatch(client, task):
        return await fns[task["k"]](client, task)

    env.agent = dispatch
    env._tasks = [{"id": n, "k": k, "q": "2+3?"} for k, n in enumerate(names)]
    specs = [EpisodeSpec({"options": {"task_index": k}}, group_id=k) for k in range(len(names))]
    trs = env.run_agents(ScriptedEngine(tok, _policy(tok)), ChatRenderer(tok), specs,
                         SamplingParams(max_tokens=64), max_episode_tokens=4096, seed=0, timeout_s=1.0)
    by = {t.task_id: t for t in trs}
    assert sorted(by) == sorted(names) and len(trs) == len(names)
    err = {n: by[n].info.get("error", "") for n in names}
    assert "RuntimeError: agent bug" in err["raises"] and len(by["raises"].turns) == 1
    assert "returned str 'abc'" in err["not_a_number"]
    assert "model 'gpt-4o' not found" in err["unknown_model"] and "model_not_found" in by["unknown_model"].info["gateway_refusals"][0]
    assert "413 request_too_large" in by["huge_prompt"].info["gateway_refusals"][0]
    assert "400" in err["bad_json"] and "not valid JSON" in by["bad_json"].info["gateway_refusals"][0]
    assert err["never_calls"] == "the agent never called the gateway" and by["never_calls"].turns == []
    for n in ("hangs", "blocks"):
        assert "timed out" in err[n] and by[n].info["env_timeout"] == "agent"
    assert "error" not in by["tokens"].info and by["tokens"].episode_return == 1.0
    assert "error" not in by["tool_agent"].info and by["tool_agent"].episode_return == 1.0
    for n in names:  # a failed run is recorded with reward 0 on whatever it sampled
        if err[n]:
            assert by[n].episode_return == 0.0 and by[n].info["agent_error"]


def test_agent_function_checks(agents):
    with pytest.raises(ValueError, match="is not async: define it as `async def sync_agent"):
        load_agent("gw_agents:sync_agent")
    with pytest.raises(ValueError, match="has no 'missing'"):
        load_agent("gw_agents:missing")
    with pytest.raises(ValueError, match="cannot import module 'no_such_mod'") as e:
        load_agent("no_such_mod:f")
    # what to do (`agentrl eval --model RUN` from another folder than the training's failed so)
    assert str(e.value).endswith("(modules are looked up in the current folder "
                                 f"{os.getcwd()} and on sys.path: run from the folder that holds "
                                 "no_such_mod.py, or add that folder to PYTHONPATH)"), e.value
    with pytest.raises(ValueError, match="give MODULE:FUNCTION"):
        load_agent("gw_agents")
    (agents / "bad.jsonl").write_text('{"id": 1}\n[1, 2]\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: a task must be a JSON object"):
        AgentEnv("gw_agents:tool_agent", str(agents / "bad.jsonl"))
    assert reward_of(2) == (2.0, {}) and reward_of({"reward": 1, "n": 3, "s": "x"}) == (1.0, {"n": 3.0})
    for bad in ("1", None, True, float("nan"), {"score": 1}):
        with pytest.raises(TypeError):
            reward_of(bad)


def test_agent_env_passes_the_env_checker(agents):
    from gymnasium.utils.env_checker import check_env

    import agentrl

    env = agentrl.make_env("agent", env_kwargs={"agent": "gw_agents:tool_agent",
                                                "dataset": str(agents / "tasks.jsonl")})
    check_env(env.unwrapped)
    obs, info = env.reset(seed=3)
    assert json.loads(obs[0]["content"])["q"] == "2+3?" and info["task_id"] == "t0"
    tasks = [{"id": f"t{i}"} for i in range(7)]
    (agents / "seven.jsonl").write_text("\n".join(json.dumps(t) for t in tasks))
    held = AgentEnv("gw_agents:tool_agent", str(agents / "seven.jsonl"), split="heldout").tasks()
    train = AgentEnv("gw_agents:tool_agent", str(agents / "seven.jsonl")).tasks()
    assert held == [tasks[4]] and train == tasks[:4] + tasks[5:]


def test_serve_answers_a_chat_completion(tiny_model_dir):
    import openai
    from transformers import AutoTokenizer

    from agentrl.gateway.serve import start

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    served = start(tiny_model_dir, api_key="k3y", max_tokens=8)
    try:
        assert served.url.startswith("http://127.0.0.1:")
        client = openai.OpenAI(base_url=served.url, api_key="k3y", max_retries=0)
        r = client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=5, temperature=0.0, n=2)
        assert r.object == "chat.completion" and len(r.choices) == 2
        assert 1 <= r.usage.completion_tokens <= 10 and r.choices[0].finish_reason in ("stop", "length")
        assert r.usage.prompt_tokens == len(ChatRenderer(tok).prompt_ids([{"role": "user", "content": "hi"}]))
        assert r.choices[0].message.content == r.choices[1].message.content  # greedy
        chunks = list(client.chat.completions.create(model="policy", stream=True, max_tokens=5,
                                                     messages=[{"role": "user", "content": "hi"}]))
        assert chunks[-1].choices[0].finish_reason in ("stop", "length")
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=served.url, api_key="wrong", max_retries=0).chat.completions.create(
                model="policy", messages=[{"role": "user", "content": "hi"}])
    finally:
        served.close()


def test_doc_agents_md_lists_every_bad_input():
    """docs/agents.md's failure table names every case tested above."""
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "agents.md").read_text()
    for phrase in ("raises", "not a number", "env.step_timeout_s", "model_not_found",
                   "request_too_large", "not JSON", "never calls the gateway", "401"):
        assert phrase in doc, phrase
    assert textwrap.dedent(doc)


def test_serve_reads_the_tool_format_from_the_tokenizer(tiny_tokenizer):
    """`agentrl serve` defaults to `--tool-parser auto` (the tokenizer's format, as in training)."""
    import inspect

    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from agentrl.cli import serve_cmd
    from agentrl.gateway.serve import start
    from agentrl.rollout.engines.scripted import ScriptedEngine

    t = Tokenizer(models.WordLevel({"<unk>": 0, "ok": 1, "a": 2, "b": 3}, unk_token="<unk>"))  # Llama-3.1-like
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    llama = PreTrainedTokenizerFast(tokenizer_object=t, unk_token="<unk>")
    llama.add_special_tokens({"additional_special_tokens": [
        "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|python_tag|>"]})
    llama.eos_token = "<|eot_id|>"
    llama.chat_template = ("{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n"
                           "{{ m.content }}<|eot_id|>{% endfor %}")
    default = inspect.signature(serve_cmd).parameters["tool_parser"].default
    assert default == "auto" and inspect.signature(start).parameters["tool_parser"].default == "auto"
    for tok, kw, want in ((llama, {}, ("llama3_json", "<|python_tag|> in the token")),
                          (tiny_tokenizer, {}, ("hermes", "<tool_call> in the token and chat template")),
                          (llama, {"tool_parser": "openai"}, ("openai", "--tool-parser"))):
        served = start("m", engine=ScriptedEngine(tok, lambda ids: "ok"), tokenizer=tok, **kw)
        try:
            assert (served.tool_parser, served.tool_parser_why) == want
            assert served.session.parser.name == want[0]
        finally:
            served.close()
    with pytest.raises(ValueError, match="pythonic"):
        start("m", engine=ScriptedEngine(llama, lambda ids: "ok"), tokenizer=llama, tool_parser="pythonic")


def test_serve_on_a_model_without_a_chat_template_is_one_line(tmp_path):
    """`agentrl serve --model DIR` whose tokenizer has no chat template: one line naming the
    missing chat template and where to set it, exit 2 (it was transformers' long message)."""
    from transformers import AutoTokenizer
    from typer.testing import CliRunner

    from agentrl.cli import app
    from agentrl.models.families import build_family

    d = tmp_path / "plain"
    build_family("phi3", d, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
    tok = AutoTokenizer.from_pretrained(d)
    tok.chat_template = None
    for f in d.glob("chat_template*"):
        f.unlink()
    tok.save_pretrained(d)
    assert not AutoTokenizer.from_pretrained(d).chat_template
    res = CliRunner().invoke(app, ["serve", "--model", str(d), "--port", "0"])
    assert res.exit_code == 2, res.output
    assert res.output.strip() == (
        f"serve: {d}: the tokenizer has no chat template (serve renders each request's messages with "
        "it): set chat_template in its tokenizer_config.json or add a chat_template.jinja beside it")
