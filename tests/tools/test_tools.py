"""Tools: schemas from typed functions, argument validation, the Hermes tool-call parser
(cases T1-T4), the ToolEnv wrapper (errors become observations, never exceptions), and the
built-in tools calculator, search, fetch and python."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Literal

import pytest

from agentrl.env.base import TextEnv
from agentrl.infra.corpus_server import make_documents, serve_corpus
from agentrl_envs.tool_env import ToolEnv
from agentrl_tools.calculator import calculator, evaluate
from agentrl_tools.executor import ToolRunner, add_system_text, call_with_timeout, format_result
from agentrl_tools.fetch import fetch_text, host_allowed, html_to_text, make_fetch_tool
from agentrl_tools.parser import HermesParser, ToolCall, ToolCallError, get_parser, parse_tool_calls
from agentrl_tools.registry import ToolArgumentError, ToolError, ToolSet, parse_docstring, tool
from agentrl_tools.search import SearchIndex, format_hits, make_search_tool

# ---------------------------------------------------------------------------------------------
# schemas and validation
# ---------------------------------------------------------------------------------------------


def lookup(city: str, days: int = 3, metric: bool = True, scale: float | None = None,
           tags: list[str] | None = None, mode: Literal["fast", "slow"] = "fast") -> str:
    """Look up the weather.

    Returns the forecast as text.

    Args:
        city: the city name,
            as written locally.
        days (int): days ahead.
        metric: use metric units.
        scale: optional scale factor.
        tags: labels.
        mode: speed.

    Returns:
        text.
    """
    return f"{city}:{days}"


def test_schema_from_signature_and_docstring():
    t = tool(lookup)
    assert t.schema == {"type": "function", "function": {
        "name": "lookup",
        "description": "Look up the weather. Returns the forecast as text.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "the city name, as written locally."},
            "days": {"type": "integer", "description": "days ahead.", "default": 3},
            "metric": {"type": "boolean", "description": "use metric units.", "default": True},
            "scale": {"type": ["number", "null"], "description": "optional scale factor.", "default": None},
            "tags": {"type": ["array", "null"], "items": {"type": "string"}, "description": "labels.",
                     "default": None},
            "mode": {"enum": ["fast", "slow"], "description": "speed.", "default": "fast"},
        }, "required": ["city"]}}}
    assert t(city="Oslo", days=2) == "Oslo:2"  # the Tool still calls like the function
    renamed = tool(name="weather", description="Weather.")(lookup)
    assert renamed.name == "weather" and renamed.description == "Weather."


def test_schema_rejects_untyped_varargs():
    def bad(*args: int) -> int:
        return 0

    with pytest.raises(TypeError, match="args"):
        tool(bad)


def test_parse_docstring_without_args_section():
    assert parse_docstring("Just one line.") == ("Just one line.", {})
    assert parse_docstring(None) == ("", {})


def test_validate_coerces_only_safe_cases():
    t = tool(lookup)
    assert t.validate({"city": "Oslo", "days": 2.0}) == {"city": "Oslo", "days": 2}
    assert t.validate({"city": "Oslo", "scale": 2}) == {"city": "Oslo", "scale": 2.0}
    assert t.validate({"city": "Oslo", "scale": None}) == {"city": "Oslo", "scale": None}
    cases = [
        ({"city": "Oslo", "days": "2"}, "lookup.days must be integer, got string '2'"),
        ({"city": "Oslo", "days": 2.5}, "lookup.days must be integer, got number 2.5"),
        ({"city": "Oslo", "days": True}, "lookup.days must be integer, got boolean True"),
        ({"city": 5}, "lookup.city must be string, got integer 5"),
        ({"city": "Oslo", "tags": ["a", 1]}, "lookup.tags[1] must be string, got integer 1"),
        ({"city": "Oslo", "mode": "medium"}, "lookup.mode must be one of ['fast', 'slow'], got 'medium'"),
        ({"days": 1}, "missing required argument(s) 'city' for 'lookup'"),
        ({"city": "Oslo", "town": "x"}, "unknown argument(s) 'town' for 'lookup'; expected: city, days"),
        ([1, 2], "arguments of 'lookup' must be a JSON object, got array"),
    ]
    for args, msg in cases:
        with pytest.raises(ToolArgumentError) as e:
            t.validate(args)
        assert str(e.value).startswith(msg), (args, str(e.value))


def test_toolset_rejects_duplicates_and_lists_schemas():
    ts = ToolSet([lookup, calculator])
    assert ts.names == ["lookup", "calculator"]
    assert [s["function"]["name"] for s in ts.schemas()] == ["lookup", "calculator"]
    with pytest.raises(ValueError, match="duplicate tool name 'calculator'"):
        ts.add(calculator)


# ---------------------------------------------------------------------------------------------
# parser: cases T1-T4 and friends
# ---------------------------------------------------------------------------------------------

T1 = '<tool_call>{"name":"search","arguments":{"q":"cats"}}</tool_call>'


def test_t1_one_call():
    assert parse_tool_calls(T1) == [ToolCall("search", {"q": "cats"})]
    # surrounding prose and the multi-line layout the Qwen template teaches
    text = 'Let me look.\n<tool_call>\n{"name": "search", "arguments": {"q": "cats"}}\n</tool_call>'
    assert parse_tool_calls(text) == [ToolCall("search", {"q": "cats"})]


@pytest.mark.parametrize("text", [
    '<tool_call>{"name":"search","argum',                          # generation cut off
    '<tool_call>{"name":"search","arguments":{"q":"cats"}</tool_call>',  # JSON cut, tag closed
])
def test_t2_cut_off_json_is_one_error_item(text):
    [item] = parse_tool_calls(text)
    assert isinstance(item, ToolCallError)
    assert "cut off" in item.message or "not valid JSON" in item.message


def test_t3_two_calls_in_order():
    text = T1 + "\n" + '<tool_call>{"name":"search","arguments":{"q":"dogs"}}</tool_call>'
    assert parse_tool_calls(text) == [ToolCall("search", {"q": "cats"}), ToolCall("search", {"q": "dogs"})]


def test_t4_array_arguments_are_an_error():
    [item] = parse_tool_calls('<tool_call>{"name":"search","arguments":[1,2]}</tool_call>')
    assert item == ToolCallError("the arguments of 'search' must be a JSON object of named arguments, "
                                 "got an array", item.raw, "search")


def test_arguments_as_json_string_are_parsed():
    text = '<tool_call>{"name":"search","arguments":"{\\"q\\": \\"cats\\"}"}</tool_call>'
    assert parse_tool_calls(text) == [ToolCall("search", {"q": "cats"})]
    [bad] = parse_tool_calls('<tool_call>{"name":"search","arguments":"{q: cats}"}</tool_call>')
    assert isinstance(bad, ToolCallError) and "string that is not valid JSON" in bad.message


def test_other_malformed_calls_and_no_call():
    assert parse_tool_calls("The answer is 4.") == []
    assert parse_tool_calls('<tool_call>{"name":"search"}</tool_call>') == [ToolCall("search", {})]
    for text, msg in [('<tool_call>[1]</tool_call>', "must be a JSON object"),
                      ('<tool_call>{"arguments":{}}</tool_call>', "no \"name\"")]:
        [item] = parse_tool_calls(text)
        assert isinstance(item, ToolCallError) and msg in item.message
    # a call inside reasoning is not a call
    assert parse_tool_calls("<think>maybe " + T1 + "</think>Answer: 4") == []


def test_parser_never_raises_on_garbage():
    import random

    rng = random.Random(0)
    alphabet = ['<tool_call>', '</tool_call>', '{', '}', '"name"', ':', '"arguments"', '[', ']',
                '"x"', ',', '1', ' ', '<think>', '</think>', '\\', '"']
    for _ in range(500):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        items = parse_tool_calls(text)
        assert all(isinstance(i, ToolCall | ToolCallError) for i in items)


def test_format_call_round_trips_and_registry_of_parsers():
    p = get_parser("hermes")
    call = ToolCall("search", {"q": "naïve"})
    assert p.parse(p.format_call(call)) == [call]
    assert isinstance(p, HermesParser)
    with pytest.raises(ValueError, match="unknown 'pythonic'; known: hermes, llama3_json, mistral, openai"):
        get_parser("pythonic")


# ---------------------------------------------------------------------------------------------
# ToolEnv around a trivial env
# ---------------------------------------------------------------------------------------------


class SixTimesSeven(TextEnv):
    """One question; any answer ends the episode, reward 1 if it contains 42."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "6*7?"}], {"task_id": "m"}

    def step(self, action):
        ok = "42" in action
        return [], float(ok), True, False, {"correct": ok}


def search(q: str) -> str:
    """Search for q.

    Args:
        q: the query.
    """
    return f"results for {q}"


def make_env(**kw):
    return ToolEnv(SixTimesSeven(), [search, calculator], **kw)


def test_tool_env_reset_renders_tools_into_system_message():
    env = make_env()
    obs, info = env.reset(seed=0)
    assert obs[1] == {"role": "user", "content": "6*7?"}
    system = obs[0]["content"]
    assert system.startswith("Be brief.\n\n# Tools\n")
    assert json.dumps(tool(search).schema) in system and "<tool_call>" in system
    assert info == {"task_id": "m", "tools_in_prompt": True}
    # the other way: schemas for the chat template, system message untouched
    obs, info = make_env(tools_in_prompt=False).reset(seed=0)
    assert obs[0] == {"role": "system", "content": "Be brief."}
    assert [s["function"]["name"] for s in info["tools"]] == ["search", "calculator"]


def test_tool_env_calculator_then_answer():
    env = make_env(tool_call_penalty=0.1)
    env.reset(seed=0)
    obs, r, term, trunc, info = env.step(
        '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>')
    assert obs == [{"role": "tool", "content": "42", "name": "calculator"}]
    assert (r, term, trunc) == (pytest.approx(-0.1), False, False)
    assert info["tool_calls"] == 1 and info["tool_errors"] == 0
    obs, r, term, trunc, info = env.step("It is 42.")
    assert (obs, r, term, trunc) == ([], 1.0, True, False)
    assert info["correct"] is True and info["tool_calls"] == 1


def test_t1_to_t4_through_tool_env():
    env = make_env()
    env.reset(seed=0)
    # T1
    obs, r, term, _, info = env.step(T1)
    assert obs == [{"role": "tool", "content": "results for cats", "name": "search"}]
    assert not term and info["tool_errors"] == 0
    # T2: an error observation, the episode goes on, counted
    obs, r, term, trunc, info = env.step('<tool_call>{"name":"search","arguments":{"q":"ca')
    assert len(obs) == 1 and obs[0]["role"] == "tool" and obs[0]["content"].startswith(
        "Error: the tool call is cut off (no closing </tool_call>); its JSON is incomplete; write each call as")
    assert (r, term, trunc) == (0.0, False, False)
    assert info["tool_errors"] == 1 and info["tool_error_kinds"] == {"parse": 1}
    assert info["error"].startswith("the tool call is cut off")
    # T3: both run, in order
    obs, *_ = env.step(T1 + '<tool_call>{"name":"search","arguments":{"q":"dogs"}}</tool_call>')
    assert [m["content"] for m in obs] == ["results for cats", "results for dogs"]
    # T4: not executed, error observation
    obs, r, term, _, info = env.step('<tool_call>{"name":"search","arguments":[1,2]}</tool_call>')
    assert obs == [{"role": "tool", "name": "search", "content":
                    "Error: the arguments of 'search' must be a JSON object of named arguments, got an array"
                    '; write each call as <tool_call>{"name": <tool-name>, "arguments": {<name>: <value>, ...}}'
                    "</tool_call>"}]
    assert not term and info["tool_errors"] == 2 and info["tool_calls"] == 5


def test_unknown_tool_wrong_types_and_string_arguments():
    env = make_env(tool_error_penalty=0.5)
    env.reset(seed=0)
    obs, r, *_ , info = env.step('<tool_call>{"name":"browse","arguments":{}}</tool_call>')
    assert obs[0]["content"] == "Error: unknown tool 'browse'; available tools: search, calculator"
    assert r == -0.5
    obs, *_ , info = env.step('<tool_call>{"name":"search","arguments":{"q":7}}</tool_call>')
    assert obs[0]["content"] == "Error: search.q must be string, got integer 7"
    obs, *_ , info = env.step('<tool_call>{"name":"search","arguments":"{\\"q\\":\\"owls\\"}"}</tool_call>')
    assert obs[0]["content"] == "results for owls"
    assert info["tool_error_kinds"] == {"unknown_tool": 1, "bad_arguments": 1}


def test_max_tool_calls_then_told_to_answer():
    env = make_env(max_tool_calls=2)
    env.reset(seed=0)
    obs, *_ = env.step(T1 * 3)
    assert [m["content"] for m in obs] == [
        "results for cats", "results for cats",
        "Error: tool call limit reached (2 per episode); give your final answer without calling a tool"]
    obs, *_ , info = env.step(T1)
    assert obs[0]["content"].startswith("Error: tool call limit reached")
    assert info["tool_error_kinds"] == {"limit": 2}
    _, r, term, _, _ = env.step("42")
    assert (r, term) == (1.0, True)
    env.reset(seed=0)  # counters start again
    obs, *_ = env.step(T1)
    assert obs[0]["content"] == "results for cats"


def test_tool_timeout_and_exceptions_become_observations():
    release = threading.Event()

    def slow(x: int) -> str:
        """Hangs until released."""
        release.wait(10)
        return "late"

    def broken(x: int) -> str:
        """Always fails."""
        raise KeyError("boom")

    def refuses(x: int) -> str:
        """Reports a failure."""
        raise ToolError("no such record")

    env = ToolEnv(SixTimesSeven(), [slow, broken, refuses], timeout_s=0.2)
    env.reset(seed=0)
    t0 = time.perf_counter()
    calls = "".join(f'<tool_call>{{"name":"{n}","arguments":{{"x":1}}}}</tool_call>'
                    for n in ("slow", "broken", "refuses"))
    obs, r, term, trunc, info = env.step(calls)
    release.set()
    assert time.perf_counter() - t0 < 2.0
    assert [m["content"] for m in obs] == ["Error: tool 'slow' timed out after 0.2 s",
                                           "Error: tool 'broken' failed: KeyError: 'boom'",
                                           "Error: no such record"]
    assert info["tool_error_kinds"] == {"timeout": 1, "tool_error": 2} and not term


def test_call_with_timeout_passes_values_and_errors():
    assert call_with_timeout(lambda a, b: a + b, {"a": 1, "b": 2}, 1.0) == 3
    with pytest.raises(ZeroDivisionError):
        call_with_timeout(lambda: 1 / 0, {}, 1.0)


def test_non_str_results_and_truncation():
    assert format_result({"a": [1, 2]}, 100) == '{"a": [1, 2]}'
    assert format_result("x" * 12, 10) == "x" * 10 + "\n[... 2 more characters truncated]"
    runner = ToolRunner([search], max_output_chars=5)
    turn = runner.handle(T1)
    assert turn.messages[0]["content"] == "resul\n[... 11 more characters truncated]"


def test_add_system_text():
    assert add_system_text([{"role": "user", "content": "q"}], "T") == [
        {"role": "system", "content": "T"}, {"role": "user", "content": "q"}]
    msgs = [{"role": "system", "content": "S"}]
    assert add_system_text(msgs, "T") == [{"role": "system", "content": "S\n\nT"}]
    assert msgs == [{"role": "system", "content": "S"}]  # not modified in place


def test_tool_env_survives_random_actions():
    env = make_env()
    env.reset(seed=0)
    env.action_space.seed(0)
    for _ in range(50):
        obs, r, term, trunc, info = env.step(env.action_space.sample())
        if term:
            env.reset()


# ---------------------------------------------------------------------------------------------
# calculator
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("expr,value", [
    ("2 + 3 * 4", 14),
    ("(3 + 4) * 2**10 / 7", 1024.0),   # 7 * 1024 / 7
    ("7 / 2", 3.5),
    ("7 // 2", 3),
    ("-7 % 3", 2),                      # Python's modulo takes the sign of the divisor
    ("-2**2", -4),                      # ** binds tighter than unary minus
    ("2 ** -1", 0.5),
    ("sqrt(16) + abs(-3)", 7.0),
    ("max(1, 5, 3) - min(4, 2)", 3),
    ("round(2.675, 2)", 2.67),          # binary float: 2.675 is 2.67499999...
    ("floor(pi)", 3),
    ("log(e)", 1.0),
    ("1e3 + 0.5", 1000.5),
    ("2**1000 % 1000", 376),            # 2^1000 = ...376
])
def test_calculator_values(expr, value):
    assert evaluate(expr) == value
    assert calculator(expression=expr) == repr(value)


@pytest.mark.parametrize("expr,msg", [
    ("1 / 0", "division by zero"),
    ("5 % 0", "division by zero"),
    ("0 ** -1", "division by zero"),
    ("9 ** 99999", "exponent too large"),
    ("2 ** 100000", "exponent too large"),
    ("(10**3000) * (10**3000)", "result too large"),
    ("10.0 ** 400", "result too large"),
    ("exp(1000)", "result too large"),
    ("sqrt(-1)", "math error"),
    ("2 ^ 3", "write a**b"),
    ("__import__('os').system('echo hi')", "unknown function"),
    ("(1).__class__", "Attribute is not allowed"),
    ("x + 1", "unknown name 'x'"),
    ("'a' * 3", "only numbers are allowed"),
    ("True + 1", "only numbers are allowed"),
    ("[1, 2]", "List is not allowed"),
    ("lambda: 1", "Lambda is not allowed"),
    ("1 +", "invalid expression"),
    ("1 < 2", "Compare is not allowed"),
    ("round(2.5, ndigits=1)", "keyword arguments"),
    ("(-8) ** 0.5", "complex"),
    ("1" * 1001, "longer than 1000"),
])
def test_calculator_refuses(expr, msg):
    t0 = time.perf_counter()
    with pytest.raises(ToolError, match=msg.replace("(", r"\(").replace("*", r"\*")):
        evaluate(expr)
    assert time.perf_counter() - t0 < 0.5  # refused before computing anything huge


@pytest.mark.parametrize("expr,value", [
    ("round(1, -10**7)", 0),             # took 7 s holding the GIL (10**(10**7) was formed)
    ("round(1, -10**8)", 0),             # minutes
    ("round(-10**3000, -10**9)", 0),
    ("round(6 * 10**3000 + 7, -3000)", 6 * 10**3000),
    ("round(15, -1)", 20),               # the builtin's half-to-even, unchanged
    ("round(25, -1)", 20),
    ("round(10**3010, -3011)", 0),
    ("round(1234, 2)", 1234),
    ("round(1.5, -10**7)", 0.0),
    ("round(1.23456, 10**30)", 1.23456),  # ndigits clamped: the float no longer changes
    ("round(-1.5, -10**9)", -0.0),
    ("(-1) ** (10**3000)", 1),           # a 10,000-bit exponent of a unit base: cheap
    ("0 ** (10**3000)", 0),
    ("2 ** -(10**3)", 2.0 ** -1000),
    ("10**3000 // 7**1000 % 10", (10**3000 // 7**1000) % 10),
    ("-" * 500 + "1" * 499, int("1" * 499)),  # 500 unary minuses: even
])
def test_calculator_adversarial_values_are_cheap(expr, value):
    """Every expression answers within its bound (generous: the worst took 7 s before)."""
    t0 = time.perf_counter()
    got = evaluate(expr)
    assert time.perf_counter() - t0 < 0.5
    assert got == value and type(got) is type(value)


@pytest.mark.parametrize("expr", [
    "round(1, 2, 3)", "round(1.5, 0.5)", "round(6 * 10**3010, -3011)", "2.0 ** (10**3000)",
    "2 ** -(10**3000)", "sqrt(10**3000)", "(2**5000) * (2**5001)", "9**9**9", "exp(10**3000)",
    "10**3000 / 3", "floor(1e308 * 10)", "round(1e308 * 10 - 1e308 * 10)", "log(0)",
    "(" * 400 + "1" + ")" * 400,
])
def test_calculator_adversarial_refusals_are_cheap(expr):
    t0 = time.perf_counter()
    with pytest.raises(ToolError):
        evaluate(expr)
    assert time.perf_counter() - t0 < 0.5


def test_calculator_over_its_bound_is_a_recorded_tool_error_not_a_frozen_run():
    """Through the ToolEnv: the call returns at once, as a penalised tool error."""
    env = ToolEnv(SixTimesSeven(), [calculator], timeout_s=2)
    env.reset(seed=0)
    t0 = time.perf_counter()
    obs, _, _, _, info = env.step(
        '<tool_call>{"name": "calculator", "arguments": {"expression": "round(1, -10**8)"}}</tool_call>'
        '<tool_call>{"name": "calculator", "arguments": {"expression": "9 ** 99999"}}</tool_call>')
    assert time.perf_counter() - t0 < 1.0
    assert obs[0]["content"] == "0"
    assert obs[1]["content"].startswith("Error: exponent too large")
    assert info["tool_error_kinds"] == {"tool_error": 1}


def test_calculator_deep_nesting_is_an_error_not_a_crash():
    with pytest.raises(ToolError):
        evaluate("(" * 300 + "1" + ")" * 300)


# ---------------------------------------------------------------------------------------------
# search
# ---------------------------------------------------------------------------------------------

DOCS = make_documents([
    {"id": "cats", "title": "Cats", "text": "Cats are small mammals. Cats purr when they are happy."},
    {"id": "dogs", "title": "Dogs", "text": "Dogs bark at night. A dog may chase cats."},
    {"id": "owls", "title": "Owls", "text": "Owls hunt at night."},
])


def test_search_ranks_with_bm25_and_picks_snippets():
    index = SearchIndex(DOCS)
    hits = index.search("cats", k=5)
    # "cats" appears twice in a 9-word doc vs once in "Dogs": BM25 ranks Cats first
    assert [h.doc.slug for h in hits] == ["cats", "dogs"]
    assert hits[0].score > hits[1].score > 0
    assert hits[1].snippet == "A dog may chase cats."  # the sentence with the query word
    assert [h.doc.slug for h in index.search("night owls")] == ["owls", "dogs"]
    assert index.search("zebra") == [] and index.search("the of and") == []


def test_search_tool_output_format_and_errors():
    t = make_search_tool(SearchIndex(DOCS), lambda d: f"http://h/doc/{d.slug}")
    assert t(query="owls") == "[1] Owls\nURL: http://h/doc/owls\nOwls hunt at night."
    assert t(query="cats", k=1) == "[1] Cats\nURL: http://h/doc/cats\nCats are small mammals."
    assert t(query="zebra") == "No results for 'zebra'."
    with pytest.raises(ToolError, match="k must be between 1 and 10"):
        t(query="cats", k=0)
    with pytest.raises(ToolError, match="empty"):
        t(query="  ")
    assert format_hits([], str, "q") == "No results for 'q'."
    t0 = time.perf_counter()
    with pytest.raises(ToolError, match="longer than 1000 characters"):
        t(query="cats " * 20_000)  # the search's cost grows with the query: bounded
    assert time.perf_counter() - t0 < 0.5


def test_long_snippets_are_cut():
    docs = make_documents([{"title": "Long", "text": "word " * 100 + "end."}])
    [hit] = SearchIndex(docs, snippet_chars=20).search("word")
    assert hit.snippet == "word word word wo..."


# ---------------------------------------------------------------------------------------------
# fetch
# ---------------------------------------------------------------------------------------------


def test_html_to_text():
    page = ("<html><head><title>T</title><style>p{color:red}</style></head><body>"
            "<h1>Title &amp; more</h1><script>var x=1;</script>"
            "<p>First   para\n  line.</p><p>Second<br>line</p>"
            "<ul><li>one</li><li>two</li></ul><div>tail <b>bold</b></div></body></html>")
    assert html_to_text(page) == "Title & more\n\nFirst para line.\n\nSecond\nline\n\n- one\n\n- two\n\ntail bold"


@pytest.mark.parametrize("url,allowed,ok", [
    ("http://127.0.0.1:8000/doc/a", ["127.0.0.1"], True),
    ("http://127.0.0.1:8000/doc/a", ["127.0.0.1:8000"], True),
    ("http://127.0.0.1:8001/doc/a", ["127.0.0.1:8000"], False),
    ("http://LOCALHOST/x", ["localhost:80"], True),
    ("https://en.wikipedia.org/wiki/X", ["*.wikipedia.org"], True),
    ("https://wikipedia.org.evil.com/", ["*.wikipedia.org", "wikipedia.org"], False),
    ("http://127.0.0.1.evil.com/", ["127.0.0.1"], False),
    ("http://user@evil.com/", ["user"], False),
    ("file:///etc/passwd", ["127.0.0.1", ""], False),
    ("ftp://127.0.0.1/x", ["127.0.0.1"], False),
    ("http://[::1]:9000/x", ["::1"], True),
    ("http://[::1]:9000/x", ["[::1]:9000"], True),
    ("http://127.0.0.1:99999/x", ["127.0.0.1"], False),
    ("not a url", ["127.0.0.1"], False),
])
def test_host_allow_list(url, allowed, ok):
    assert host_allowed(url, allowed) is ok


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        routes = {
            "/page": (200, "text/html", b"<html><body><h1>Hi</h1><p>Hello there.</p></body></html>"),
            "/plain": (200, "text/plain; charset=utf-8", "caf\u00e9\n".encode()),
            "/big": (200, "text/plain", b"a" * 5000),
            "/image": (200, "image/png", b"\x89PNG"),
        }
        if self.path == "/out":
            self.send_response(302)
            self.send_header("Location", "http://example.invalid/secret")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.path == "/in":
            self.send_response(301)
            self.send_header("Location", "/page")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        status, ctype, body = routes.get(self.path, (404, "text/plain", b"nope"))
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


@pytest.fixture(scope="module")
def web():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_fetch_html_plain_and_redirects(web):
    hosts = ["127.0.0.1"]
    assert fetch_text(f"{web}/page", hosts) == "Hi\n\nHello there."
    assert fetch_text(f"{web}/plain", hosts) == "caf\u00e9"
    assert fetch_text(f"{web}/in", hosts) == "Hi\n\nHello there."  # relative redirect, same host


def test_fetch_refusals(web):
    hosts = ["127.0.0.1"]
    with pytest.raises(ToolError, match=r"fetching 'http://example.invalid/secret' is not allowed"):
        fetch_text(f"{web}/out", hosts)  # an allowed host cannot redirect elsewhere
    with pytest.raises(ToolError, match="not allowed"):
        fetch_text("http://example.com/", hosts)
    with pytest.raises(ToolError, match=r"HTTP 404 for"):
        fetch_text(f"{web}/missing", hosts)
    with pytest.raises(ToolError, match="cannot read content type 'image/png'"):
        fetch_text(f"{web}/image", hosts)
    with pytest.raises(ToolError, match="too many redirects"):
        fetch_text(f"{web}/in", hosts, max_redirects=0)


def test_fetch_size_caps(web):
    assert fetch_text(f"{web}/big", ["127.0.0.1"], max_bytes=100, max_chars=1000) == \
        "a" * 100 + "\n[page cut at 100 bytes]"
    assert fetch_text(f"{web}/big", ["127.0.0.1"], max_chars=10) == \
        "a" * 10 + "\n[... 4990 more characters truncated]"


def test_fetch_connection_refused_is_a_tool_error():
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    with pytest.raises(ToolError, match="failed: ConnectError"):
        fetch_text(f"http://127.0.0.1:{port}/", ["127.0.0.1"], timeout_s=2)


def test_fetch_tool_over_the_corpus_server():
    server, _, base = serve_corpus(DOCS)
    try:
        fetch = make_fetch_tool(["127.0.0.1"])
        assert fetch(url=f"{base}/doc/owls") == "Owls\n\nOwls hunt at night."
        assert fetch.schema["function"]["parameters"]["required"] == ["url"]
    finally:
        server.shutdown()
        server.server_close()


# ---------------------------------------------------------------------------------------------
# python (runs in the sandbox)
# ---------------------------------------------------------------------------------------------


def test_python_tool_runs_code_in_the_sandbox():
    from agentrl_tools.python_tool import python

    assert python.schema["function"]["parameters"]["required"] == ["code"]
    assert python(code="print(6 * 7)") == "42"
    assert python(code='import sys\nsys.stderr.write("warn\\n")\nprint(1)') == "1\n[stderr]\nwarn"
    assert python(code='print("a")\nraise ValueError("v")').startswith("a\n[verdict: runtime_error] ")


def test_format_sandbox_result():
    from agentrl.sandbox import SandboxResult
    from agentrl_tools.python_tool import format_sandbox_result

    r = SandboxResult(verdict="timeout", passed=0, total=0, stdout="partial\n",
                      error="wall time limit of 5 s exceeded")
    assert format_sandbox_result(r) == "partial\n[verdict: timeout] wall time limit of 5 s exceeded"
    assert format_sandbox_result(SandboxResult(verdict="pass", passed=0, total=0)) == "[no output]"


def test_python_tool_through_tool_env():
    from agentrl_tools.python_tool import python

    env = ToolEnv(SixTimesSeven(), [python])
    env.reset(seed=0)
    obs, *_ = env.step('<tool_call>{"name":"python","arguments":{"code":"print(sum(range(10)))"}}</tool_call>')
    assert obs == [{"role": "tool", "content": "45", "name": "python"}]
