"""`agentrl sft` on conversations in OpenAI's shape (an assistant message with `tool_calls` and a
null or empty content, a `tool` message with its `tool_call_id`, the row's `tools`), on the
tokenizers and templates of Qwen3 (Hermes calls) and Llama 3.1 (JSON calls): the target is the
call in the model's tool format, which the gateway parses back (it was the empty content: the
model was taught to answer a tool-call position with nothing), and the context holds the tool
schemas the template renders (they were ignored)."""

from __future__ import annotations

import json

import pytest

from agentrl.models.families import FAMILIES, build_family_tokenizer
from agentrl.offline import conversation_examples, load_conversations
from agentrl.rollout.chat import ChatRenderer
from agentrl_tools.parser import ToolCall, get_parser

TOOLS = [{"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}]
CALL = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
ROW = {"tools": TOOLS, "messages": [
    {"role": "user", "content": "2 + 3?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": "5"},
    {"role": "assistant", "content": "It is 5."}]}


@pytest.mark.parametrize("family,fmt", [("qwen3", "hermes"), ("llama3_1", "llama3_json")])
def test_tool_calls_are_trained_in_the_model_s_tool_format(tmp_path, family, fmt):
    tok = build_family_tokenizer(FAMILIES[family])
    r = ChatRenderer(tok)
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps(ROW) + "\n")
    [conv] = load_conversations(path)
    first, second = conversation_examples([conv], r)
    call_text = get_parser(fmt).format_call(ToolCall("add", {"a": 2, "b": 3}))
    target = tok.encode(call_text, add_special_tokens=False) + [r.end_of_turn_id]
    ctx = r.prompt_ids([ROW["messages"][0]], TOOLS)
    assert first.token_ids == ctx + target and first.loss_mask == [0] * len(ctx) + [1] * len(target)
    assert '"name": "add"' in tok.decode(ctx)  # the schemas are in the context
    [back] = get_parser(fmt).parse(tok.decode(target[:-1]))
    assert (back.name, back.arguments) == ("add", {"a": 2, "b": 3})
    # the second target's context holds the call and the result as the template renders them
    ctx2 = tok.decode(second.token_ids[: second.loss_mask.index(1)])
    assert '"a": 2' in ctx2 and "5" in ctx2.split('"a": 2')[-1]


def test_malformed_tool_calls_are_refused_naming_the_line(tmp_path):
    bad = {"messages": [{"role": "user", "content": "x"},
                        {"role": "assistant", "content": None, "tool_calls": [{"function": {"arguments": "{}"}}]}]}
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps(ROW) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(ValueError, match=r"c.jsonl:2: message 1: each tool call needs function.name"):
        load_conversations(path)
    path.write_text(json.dumps({**ROW, "tools": "add"}) + "\n")
    with pytest.raises(ValueError, match=r"c.jsonl:1: tools must be a list"):
        load_conversations(path)
