"""An OpenAI tool call is read the same way wherever it comes in: a conversation file for
`agentrl sft` (`agentrl.offline.load_conversations`: strict, the arguments an object or its JSON
text), a gateway request (`protocol.parse_request`: the name a string, the arguments a string or
an object) and the gateway's record (`record.norm_message` / `template_messages`: the arguments
parsed, kept as text when not JSON); an offline conversation is handed to the chat template as
the gateway hands its messages; `sft`'s `auto` tool format is `rollout.tool_parser`'s rule; and
`serve` reads a run's chat template variables from its config.json."""

from __future__ import annotations

import json
import re

import pytest

from agentrl.config import Config
from agentrl.gateway.protocol import GatewayError, parse_request
from agentrl.gateway.record import _calls, norm_message, template_messages
from agentrl.gateway.serve import run_template_kwargs
from agentrl.models.families import FAMILIES, build_family_tokenizer
from agentrl.offline import conversation_examples, load_conversations
from agentrl.rollout.chat import ChatRenderer
from agentrl.rollout.tool_format import detect_tool_parser
from agentrl_tools.parser import ToolCall

OFFLINE_ERR = "each tool call needs function.name and function.arguments (an object or its JSON text)"
GATEWAY_ERR = "messages[1].tool_calls: each call needs function.name and function.arguments"

# (call, what offline reads: a ToolCall or None = refused, gateway accepts, what the record reads)
CALLS = [
    ({"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}},
     ToolCall("f", {"a": 1}), True, ("f", {"a": 1})),
    ({"function": {"name": "f", "arguments": {"a": 1}}}, ToolCall("f", {"a": 1}), True, ("f", {"a": 1})),
    ({"function": {"name": "f"}}, ToolCall("f", {}), True, ("f", None)),
    ({"function": {"name": "f", "arguments": "x("}}, None, True, ("f", "x(")),
    ({"function": {"name": "f", "arguments": "[1]"}}, None, True, ("f", [1])),
    ({"function": {"name": "f", "arguments": ""}}, None, True, ("f", "")),
    ({"function": {"name": "f", "arguments": None}}, None, False, None),
    ({"function": {"name": "f", "arguments": [1]}}, None, False, None),
    ({"function": {"name": 5, "arguments": "{}"}}, None, False, None),
    ({"function": {"arguments": "{}"}}, None, False, None),
    ({"function": "f"}, None, False, None),
    ({"name": "f", "arguments": "{}"}, None, False, None),
    ("f", None, False, None),
]


def _offline(tmp_path, call):
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "q"},
                                             {"role": "assistant", "content": None, "tool_calls": [call]}]}) + "\n")
    return load_conversations(path)[0][1]


@pytest.mark.parametrize("call,offline,gateway,record", CALLS)
def test_a_call_is_read_alike_by_sft_the_gateway_and_the_record(tmp_path, call, offline, gateway, record):
    if offline is None:
        with pytest.raises(ValueError, match=re.escape("c.jsonl:1: message 1: " + OFFLINE_ERR)):
            _offline(tmp_path, call)
    else:
        m = _offline(tmp_path, call)
        assert m == {"role": "assistant", "content": "", "tool_calls": [offline]}
    body = {"model": "policy", "messages": [{"role": "user", "content": "q"},
                                            {"role": "assistant", "content": None, "tool_calls": [call]}]}
    if not gateway:
        with pytest.raises(GatewayError, match=re.escape(GATEWAY_ERR)) as e:
            parse_request(body)
        assert e.value.status == 400 and e.value.param == "messages"
        return
    msgs = parse_request(body).messages
    assert msgs is body["messages"]  # checked, not rewritten
    assert _calls(msgs[1]) == [record]
    assert norm_message(msgs[1]) == json.dumps(["assistant", "", [list(record)], None], sort_keys=True,
                                               ensure_ascii=False)
    want = {"type": "function", "function": {"name": record[0], "arguments": record[1]}}
    if isinstance(call, dict) and "id" in call:
        want["id"] = call["id"]
    assert template_messages(msgs)[1] == {"role": "assistant", "content": "", "tool_calls": [want]}


def test_offline_messages_reach_the_template_as_the_gateway_s_do(tmp_path):
    """What `conversation_examples` renders for a context: tool calls as
    `{"type": "function", "function": {"name", "arguments": dict}}` (no id), every other message
    and key as loaded."""
    path = tmp_path / "c.jsonl"
    row = {"messages": [
        {"role": "system", "content": "s"}, {"role": "user", "content": "2 + 3?"},
        {"role": "assistant", "content": "let me", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}},
            {"function": {"name": "now"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "5"},
        {"role": "tool", "content": "noon"},
        {"role": "assistant", "content": "It is 5 at noon."}]}
    path.write_text(json.dumps(row) + "\n")
    [conv] = load_conversations(path)
    seen = []

    class Renderer(ChatRenderer):
        def prompt_ids(self, messages, tools=None):
            seen.append(messages)
            return super().prompt_ids(messages, tools)

    tok = build_family_tokenizer(FAMILIES["qwen3"])
    conversation_examples([conv], Renderer(tok))
    assert seen[-1] == [
        {"role": "system", "content": "s"}, {"role": "user", "content": "2 + 3?"},
        {"role": "assistant", "content": "let me", "tool_calls": [
            {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}},
            {"type": "function", "function": {"name": "now", "arguments": {}}}]},
        {"role": "tool", "content": "5", "tool_call_id": "call_1"},
        {"role": "tool", "content": "noon"}]


@pytest.mark.parametrize("family", ["qwen3", "llama3_1", "mistral_v0_3"])
def test_sft_auto_tool_format_is_the_tokenizer_s(tmp_path, family):
    """`conversation_examples(..., "auto")` writes calls in `detect_tool_parser`'s format; a
    named format is used as named."""
    tok = build_family_tokenizer(FAMILIES[family])
    r = ChatRenderer(tok)
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"messages": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": None,
         "tool_calls": [{"function": {"name": "add", "arguments": {"a": 2}}}]}]}) + "\n")
    convs = load_conversations(path)
    auto = conversation_examples(convs, r)
    named = conversation_examples(convs, r, detect_tool_parser(tok)[0])
    assert [t.token_ids for t in auto] == [t.token_ids for t in named]
    other = "llama3_json" if detect_tool_parser(tok)[0] != "llama3_json" else "hermes"
    assert auto[0].turns[-1].text != conversation_examples(convs, r, other)[0].turns[-1].text


def test_a_run_s_template_variables_come_from_its_config_json(tmp_path):
    f = tmp_path / "config.json"
    cfg = Config.model_validate({"rollout": {"chat_template_kwargs": {"enable_thinking": False, "x": [1]}}})
    f.write_text(cfg.model_dump_json(indent=1))
    assert run_template_kwargs(f) == {"enable_thinking": False, "x": [1]}
    assert run_template_kwargs(str(f)) == {"enable_thinking": False, "x": [1]}
    f.write_text(Config().model_dump_json())
    assert run_template_kwargs(f) == {}
    for text in ("{}", "[]", "{not json", "", '{"rollout": null}'):
        f.write_text(text)
        assert run_template_kwargs(f) == {}, text
    assert run_template_kwargs(tmp_path / "missing.json") == {}
    assert run_template_kwargs(tmp_path) == {}  # a directory
