"""The tool-call formats besides Hermes (tests/tools/test_tools.py has Hermes' cases T1-T4):
Llama-3.1/3.2 JSON (`{"name", "parameters"}` as the whole message or after `<|python_tag|>`),
Mistral `[TOOL_CALLS]`, and OpenAI `{"tool_calls": [...]}`: each on well-formed input with
hand-written expected calls, several calls in one message, and malformed input (an error item,
never an exception), and each through `ToolEnv`, where a malformed call is a recorded `parse`
error for that turn with the format's own reminder."""

from __future__ import annotations

import random

import pytest

from agentrl.env.base import TextEnv
from agentrl_envs.tool_env import ToolEnv
from agentrl_tools.parser import (
    PARSERS,
    Llama3JsonParser,
    MistralParser,
    OpenAIJsonParser,
    ToolCall,
    ToolCallError,
    get_parser,
)

llama, mistral, openai = Llama3JsonParser(), MistralParser(), OpenAIJsonParser()
CATS = ToolCall("search", {"q": "cats"})
CALC = ToolCall("calc", {"expr": "6*7"})


# -- Llama 3.1 / 3.2 JSON -------------------------------------------------------------------------
@pytest.mark.parametrize("text, expected", [
    ('{"name": "search", "parameters": {"q": "cats"}}', [CATS]),            # the whole message
    ('  {"name": "search", "arguments": {"q": "cats"}}\n', [CATS]),         # "arguments" too
    ('{"parameters": {"q": "cats"}, "name": "search"}', [CATS]),            # keys in any order
    ('<|python_tag|>{"name": "search", "parameters": {"q": "cats"}}<|eom_id|>', [CATS]),
    ('Let me look.<|python_tag|>{"name": "search", "parameters": {"q": "cats"}}', [CATS]),
    ('{"name": "search", "parameters": {"q": "cats"}}; {"name": "calc", "parameters": {"expr": "6*7"}}',
     [CATS, CALC]),                                                          # ";"-separated
    ('[{"name": "search", "parameters": {"q": "cats"}}, {"name": "calc", "parameters": {"expr": "6*7"}}]',
     [CATS, CALC]),                                                          # an array
    ('<think>{"name": "calc", "parameters": {}}</think>{"name": "search", "parameters": {"q": "cats"}}',
     [CATS]),                                                                # reasoning is not a call
    ('{"name": "search", "parameters": "{\\"q\\": \\"cats\\"}"}<|eot_id|>', [CATS]),
])
def test_llama3_json_calls(text, expected):
    assert llama.parse(text) == expected


@pytest.mark.parametrize("text", [
    "The answer is 42.", '{"answer": 42}', '[1, 2, 3]', '{"name": "Paris"}',  # JSON answers
    'I would call {"name": "search", "parameters": {}} but no.', "",
])
def test_llama3_json_answers_are_not_calls(text):
    assert llama.parse(text) == []


@pytest.mark.parametrize("text, message", [
    ('{"name": "search", "parameters": {"q": "ca', "not valid JSON"),        # cut off
    ('<|python_tag|>brave_search.call(query="cats")', "not valid JSON"),      # built-in form
    ('<|python_tag|>', "followed by no tool call"),
    ('{"name": "search", "parameters": [1, 2]}', "must be a JSON object of named arguments, got an array"),
    ('<|python_tag|>{"parameters": {}}', 'no "name" string'),
])
def test_llama3_json_malformed_is_one_error_item(text, message):
    [item] = llama.parse(text)
    assert isinstance(item, ToolCallError) and message in item.message


# -- Mistral [TOOL_CALLS] -------------------------------------------------------------------------
@pytest.mark.parametrize("text, expected", [
    ('[TOOL_CALLS] [{"name": "search", "arguments": {"q": "cats"}}]', [CATS]),
    ('[TOOL_CALLS] [{"name": "search", "arguments": {"q": "cats"}, "id": "a1b2c3d4e"}, '
     '{"name": "calc", "arguments": {"expr": "6*7"}, "id": "f5g6h7i8j"}]</s>', [CATS, CALC]),
    ('[TOOL_CALLS] {"name": "search", "arguments": {"q": "cats"}}', [CATS]),      # one object
    ('[TOOL_CALLS]search[ARGS]{"q": "cats"}[TOOL_CALLS]calc[ARGS]{"expr": "6*7"}', [CATS, CALC]),
    ('[TOOL_CALLS]search[CALL_ID]a1b2c3d4e[ARGS]{"q": "cats"}', [CATS]),
    ('Sure. [TOOL_CALLS] [{"name": "search", "arguments": "{\\"q\\": \\"cats\\"}"}]', [CATS]),
    ("No tools needed: 42.", []),
    ('[{"name": "search", "arguments": {"q": "cats"}}]', []),  # without the token: an answer
])
def test_mistral_calls(text, expected):
    assert mistral.parse(text) == expected


@pytest.mark.parametrize("text, message, name", [
    ('[TOOL_CALLS] [{"name": "search", "argu', "not valid JSON", None),
    ("[TOOL_CALLS]", "followed by no tool call", None),
    ('[TOOL_CALLS] [{"name": "search", "arguments": 7}]', "got a int", "search"),
    ('[TOOL_CALLS]search[ARGS]{"q": ', "not valid JSON", "search"),
    ('[TOOL_CALLS] ["search"]', "must be a JSON object", None),
])
def test_mistral_malformed_is_one_error_item(text, message, name):
    [item] = mistral.parse(text)
    assert isinstance(item, ToolCallError) and message in item.message and item.name == name


# -- OpenAI {"tool_calls": [...]} -----------------------------------------------------------------
@pytest.mark.parametrize("text, expected", [
    ('{"tool_calls": [{"id": "call_1", "type": "function", "function": '
     '{"name": "search", "arguments": "{\\"q\\": \\"cats\\"}"}}]}', [CATS]),   # arguments a string
    ('{"tool_calls": [{"type": "function", "function": {"name": "search", "arguments": {"q": "cats"}}},'
     ' {"type": "function", "function": {"name": "calc", "arguments": {"expr": "6*7"}}}]}', [CATS, CALC]),
    ('Searching.\n```json\n{"tool_calls": [{"function": {"name": "search", "arguments": {"q": "cats"}}}]}\n```',
     [CATS]),
    ('{"tool_calls": [{"name": "search", "arguments": {"q": "cats"}}]}', [CATS]),  # flat element
    ('{"tool_calls": []}', []), ("It is 42.", []), ('{"answer": 42}', []),
])
def test_openai_calls(text, expected):
    assert openai.parse(text) == expected


@pytest.mark.parametrize("text, message", [
    ('{"tool_calls": [{"type": "function", "function": {"name": "se', "not valid JSON"),
    ('{"tool_calls": {"name": "search"}}', '"tool_calls" must be a JSON array'),
    ('{"tool_calls": [{"type": "code_interpreter"}]}', "type 'code_interpreter' is not supported"),
    ('{"tool_calls": [{"function": {"name": "search", "arguments": "{q: cats}"}}]}',
     "string that is not valid JSON"),
    ('{"tool_calls": [{"function": {"arguments": "{}"}}]}', 'no "name" string'),
])
def test_openai_malformed_is_one_error_item(text, message):
    [item] = openai.parse(text)
    assert isinstance(item, ToolCallError) and message in item.message


# -- all formats ------------------------------------------------------------------------------------
def test_registry_round_trips_and_never_raises():
    assert sorted(PARSERS) == ["hermes", "llama3_json", "mistral", "openai"]
    call = ToolCall("search", {"q": "naïve", "k": [1, {"x": None}]})
    rng = random.Random(0)
    alphabet = ['<tool_call>', '</tool_call>', '<|python_tag|>', '[TOOL_CALLS]', '[ARGS]', '{', '}', '[',
                ']', '"name"', '"tool_calls"', '"function"', '"parameters"', '"arguments"', ':', ',', ';',
                '"x"', '1', ' ', '<think>', '</think>', '\\', '"', '<|eom_id|>', '</s>']
    for name, p in PARSERS.items():
        assert get_parser(name) is p and p.parse(p.format_call(call)) == [call]
        assert p.format_call(call) in p.format_tools([{"type": "function", "function": {"name": "search"}}]) \
            or '"search"' in p.format_tools([{"type": "function", "function": {"name": "search"}}])
        for _ in range(300):
            text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
            assert all(isinstance(i, ToolCall | ToolCallError) for i in p.parse(text))
        p.parse("[" * 100_000)  # deeper than the recursion limit: no exception


class SixTimesSeven(TextEnv):
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return [{"role": "user", "content": "6*7?"}], {}

    def step(self, action):
        return [], float("42" in action), True, False, {}


def calc(expr: str) -> str:
    """Evaluate.

    Args:
        expr: the expression.
    """
    return str(eval(expr, {"__builtins__": {}}))  # noqa: S307 - the tests' own expressions


@pytest.mark.parametrize("name, bad", [
    ("llama3_json", '{"name": "calc", "parameters": {"expr": '),
    ("mistral", '[TOOL_CALLS] [{"name": "calc", "arguments": {"expr": '),
    ("openai", '{"tool_calls": [{"function": {"name": "calc", "arguments": "{\\"expr\\": '),
])
def test_each_format_through_tool_env(name, bad):
    env = ToolEnv(SixTimesSeven(), [calc], parser=name)
    msgs, _ = env.reset(seed=0)
    assert msgs[0]["role"] == "system" and '"calc"' in msgs[0]["content"]
    p = get_parser(name)
    two = {"llama3_json": '{"name": "calc", "parameters": {"expr": "6*7"}}; '
                          '{"name": "calc", "parameters": {"expr": "1+1"}}',
           "mistral": '[TOOL_CALLS] [{"name": "calc", "arguments": {"expr": "6*7"}}, '
                      '{"name": "calc", "arguments": {"expr": "1+1"}}]',
           "openai": '{"tool_calls": [{"function": {"name": "calc", "arguments": "{\\"expr\\": \\"6*7\\"}"}}, '
                     '{"function": {"name": "calc", "arguments": {"expr": "1+1"}}}]}'}[name]
    obs, r, term, trunc, info = env.step(two)
    assert [m["content"] for m in obs] == ["42", "2"] and not term and info["step_tool_calls"] == 2
    obs, r, term, trunc, info = env.step(bad)  # a recorded parse error, the episode goes on
    assert len(obs) == 1 and obs[0]["content"].startswith("Error: the tool call is not valid JSON")
    assert obs[0]["content"].endswith(p.error_hint) and info["tool_error_kinds"] == {"parse": 1}
    assert not term and info["error"]
    obs, r, term, trunc, info = env.step("It is 42.")
    assert term and r == 1.0 and info["tool_calls"] == 3 and info["tool_errors"] == 1
