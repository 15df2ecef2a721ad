"""A tool agent's second call (its reply sent back with the tool result) through `agentrl
serve` on the tokenizers and published chat templates of other families than the embedded
model's: Mistral's template refuses a call without a 9-character id (the gateway issued
`call_` + 24 hex digits and dropped the id when rendering: every second call was a 400),
Gemma-3's refuses the `tool` role (a 400) and Phi-3's drops it (the model never saw the result).
The scripted policy writes a call in the family's tool format until the result is in its
prompt."""

from __future__ import annotations

import json
import re

import openai
import pytest

from agentrl.gateway.serve import start
from agentrl.models.families import FAMILIES, build_family_tokenizer
from agentrl.rollout.chat import ChatRenderer
from agentrl.rollout.engines.scripted import ScriptedEngine
from agentrl_tools.parser import ToolCall, get_parser

TOOLS = [{"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}]
RESULT = 'sum: "5"\nok'  # a quote and a newline: Llama 3.1's template JSON-quotes a tool result


@pytest.mark.parametrize("family", ["mistral_v0_3", "gemma3", "phi3", "llama3_1"])
def test_a_tool_result_reaches_the_model_through_serve(family):
    tok = build_family_tokenizer(FAMILIES[family])
    seen: list[str] = []

    def policy(prompt_ids):
        text = tok.decode(prompt_ids, skip_special_tokens=False)
        seen.append(text)
        if "sum:" in text:
            return "The sum is 5."
        return get_parser(served.tool_parser).format_call(ToolCall("add", {"a": 2, "b": 3}))

    served = start("m", engine=ScriptedEngine(tok, policy), tokenizer=tok, max_tokens=64)
    try:
        client = openai.OpenAI(base_url=served.url, api_key="k", max_retries=0)
        msgs = [{"role": "system", "content": "Use the tools."}, {"role": "user", "content": "2 + 3?"}]
        r = client.chat.completions.create(model="policy", messages=msgs, tools=TOOLS, temperature=0)
        [call] = r.choices[0].message.tool_calls
        assert json.loads(call.function.arguments) == {"a": 2, "b": 3}
        if served.tool_parser == "mistral":  # the only ids Mistral's template renders
            assert re.fullmatch(r"[A-Za-z0-9]{9}", call.id), call.id
        else:
            assert re.fullmatch(r"call_[0-9a-f]{24}", call.id), call.id
        msgs += [r.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": RESULT}]
        r2 = client.chat.completions.create(model="policy", messages=msgs, tools=TOOLS, temperature=0)
        assert r2.choices[0].message.content == "The sum is 5."
    finally:
        served.close()
    prompt = seen[-1]
    assert RESULT in prompt or json.dumps(RESULT) in prompt, prompt
    if family == "mistral_v0_3":  # the template's own tool-result format, not a user turn
        assert f'[TOOL_RESULTS] {{"content": {RESULT}, "call_id": "{call.id}"}}[/TOOL_RESULTS]' in prompt
    if family == "llama3_1":  # the ipython turn, JSON-quoted, as the template renders it
        assert f"<|start_header_id|>ipython<|end_header_id|>\n\n{json.dumps(RESULT)}<|eot_id|>" in prompt


def test_llama_tool_results_with_quotes_render_as_ipython_turns():
    """Llama 3.1's template writes a tool result `| tojson`; the renderer took a result with a
    quote or a newline for dropped and rendered it as a user turn (only `"7"` stayed ipython)."""
    tok = build_family_tokenizer(FAMILIES["llama3_1"])
    r = ChatRenderer(tok)
    for content in ("7", 'line1\nline2 "q"', '{"x": 1}'):
        text = tok.decode(r.delta_ids([{"role": "tool", "tool_call_id": "x", "content": content}]))
        assert text == (f"<|start_header_id|>ipython<|end_header_id|>\n\n{json.dumps(content)}<|eot_id|>"
                        "<|start_header_id|>assistant<|end_header_id|>\n\n"), text


def test_chat_template_kwargs_of_a_request_must_agree_with_the_served_ones(tmp_path):
    """Qwen3 served with `{"enable_thinking": false}`: a request asking the same is answered
    (the prompt ends with the empty think block), one asking otherwise is a 400 naming the
    field (it was silently rendered with thinking on); a run's config gives serve its variables."""
    from agentrl.config import Config
    from agentrl.gateway.serve import run_template_kwargs

    tok = build_family_tokenizer(FAMILIES["qwen3"])
    seen: list[str] = []

    def policy(ids):
        seen.append(tok.decode(ids, skip_special_tokens=False))
        return "hi"

    served = start("m", engine=ScriptedEngine(tok, policy), tokenizer=tok,
                   template_kwargs={"enable_thinking": False})
    try:
        client = openai.OpenAI(base_url=served.url, api_key="k", max_retries=0)
        msgs = [{"role": "user", "content": "hi"}]
        for extra in (None, {"chat_template_kwargs": {"enable_thinking": False}}):
            r = client.chat.completions.create(model="policy", messages=msgs, extra_body=extra)
            assert r.choices[0].message.content == "hi"
            assert seen[-1].endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n"), seen[-1]
        for bad in ({"enable_thinking": True}, {"other": 1}):
            with pytest.raises(openai.BadRequestError, match="differs from the chat template variables") as e:
                client.chat.completions.create(model="policy", messages=msgs, extra_body={"chat_template_kwargs": bad})
            assert e.value.body["param"] == "chat_template_kwargs"
    finally:
        served.close()
    cfg = Config.model_validate({"rollout": {"chat_template_kwargs": {"enable_thinking": False}}})
    (tmp_path / "config.json").write_text(cfg.model_dump_json())
    assert run_template_kwargs(tmp_path / "config.json") == {"enable_thinking": False}
    assert run_template_kwargs(tmp_path / "missing.json") == {}


def test_templates_that_do_not_render_tools_are_told(tiny_tokenizer):
    """Gemma-3's and Phi-3's templates have no `tools` variable: an agent's schemas never reach
    the prompt (nothing said so); `agentrl train --agent` and `agentrl serve` print
    `NO_TOOLS_NOTE` for them (`renders_tools` False)."""
    from agentrl.rollout.chat import renders_tools

    got = {f: renders_tools(ChatRenderer(build_family_tokenizer(FAMILIES[f])))
           for f in ("qwen3", "llama3_1", "mistral_v0_3", "gemma3", "phi3")}
    assert got == {"qwen3": True, "llama3_1": True, "mistral_v0_3": True, "gemma3": False, "phi3": False}
    assert renders_tools(ChatRenderer(tiny_tokenizer))  # the embedded model's template does


def test_history_template_renders_every_agent_call_afresh(tmp_path, monkeypatch):
    """`rollout.history=template` with `--agent`: each call is the template's rendering of its
    messages (Qwen3's drops the <think> block of a turn before the last user message) and its
    own sample carrying the
    run's reward; the start-up line said so while the gateway reused the sampled ids (exact)."""
    from agentrl.gateway.agents import AgentEnv
    from agentrl.gateway.record import template_messages
    from agentrl.rollout.agent_loop import EpisodeSpec
    from agentrl.rollout.engines.base import SamplingParams

    (tmp_path / "tpl_agent.py").write_text(
        "TOOLS = " + json.dumps(TOOLS) + "\n"
        "async def run(client, task):\n"
        "    msgs = [{'role': 'user', 'content': '2 + 3?'}]\n"
        "    r = await client.chat.completions.create(model='policy', messages=msgs, tools=TOOLS)\n"
        "    m = r.choices[0].message\n"
        "    msgs += [m.model_dump(exclude_none=True), {'role': 'tool', 'tool_call_id': m.tool_calls[0].id, 'content': '5'},\n"
        "             {'role': 'user', 'content': 'So?'}]\n"
        "    r = await client.chat.completions.create(model='policy', messages=msgs, tools=TOOLS)\n"
        "    return 0.5\n")
    (tmp_path / "t.jsonl").write_text(json.dumps({"id": "a"}) + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    tok = build_family_tokenizer(FAMILIES["qwen3"])
    call = get_parser("hermes").format_call(ToolCall("add", {"a": 2, "b": 3}))

    def policy(ids):
        return "It is 5." if "<tool_response>" in tok.decode(ids) else "<think>\nhmm\n</think>\n\n" + call

    env = AgentEnv("tpl_agent:run", str(tmp_path / "t.jsonl"))
    for history, samples in (("exact", 1), ("template", 2)):
        r = ChatRenderer(tok, history)
        trs = env.run_agents(ScriptedEngine(tok, policy), r, [EpisodeSpec({"seed": 0}, group_id=3)],
                             SamplingParams(max_tokens=64), max_episode_tokens=4096, seed=0, one_per_run=False)
        assert len(trs) == samples and all(t.turns[-1].reward == 0.5 and t.group_id == 3 for t in trs)
        last = trs[-1]
        prompt = last.token_ids[: last.turns[-1].start]
        assert ("hmm" in tok.decode(prompt)) == (history == "exact")
        if history == "template":
            assert [len(t.turns) for t in trs] == [1, 1]
            assert prompt == r.prompt_ids(template_messages(last.messages[:-1]), TOOLS)
