"""Issue 42, items 14 and 16: a turn of 20,000 tool calls makes one message for every call past
`max_tool_calls`; a NUL or lone surrogate in a calculator expression and a control character
in a fetched URL are clear tool errors (not "too deeply nested", not `httpx.InvalidURL`)."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agentrl.env.base import TextEnv
from agentrl_envs.tool_env import ToolEnv
from agentrl_tools.calculator import calculator, evaluate
from agentrl_tools.fetch import fetch_text, make_fetch_tool
from agentrl_tools.registry import ToolError


class Ask(TextEnv):
    def _reset(self, seed, options):
        return [{"role": "user", "content": "6*7?"}], {}

    def _step(self, action):
        return [], float("42" in action), True, False, {}


CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'
LIMIT = ("Error: tool call limit reached (8 per episode); give your final answer without "
         "calling a tool")


def test_20000_tool_calls_make_one_message_past_the_limit():
    env = ToolEnv(Ask(), [calculator], max_tool_calls=8, tool_error_penalty=0.5)
    env.reset(seed=0)
    t0 = time.perf_counter()
    obs, reward, term, _, info = env.step(CALL * 20_000)
    took = time.perf_counter() - t0
    assert len(obs) == 9 and [m["content"] for m in obs[:8]] == ["42"] * 8
    assert obs[8] == {"role": "tool", "content": LIMIT + " (19992 calls of this turn were not run)"}
    assert info["tool_calls"] == 20_000 and info["step_tool_errors"] == 19_992
    assert info["tool_error_kinds"] == {"limit": 19_992} and reward == pytest.approx(-0.5 * 19_992)
    assert not term and took < 10, took
    obs, *_ = env.step(CALL)  # the next turn: one refused call, one message
    assert obs == [{"role": "tool", "content": LIMIT, "name": "calculator"}]
    obs, *_ = env.step(CALL * 3)
    assert obs == [{"role": "tool", "content": LIMIT + " (3 calls of this turn were not run)"}]


def test_calls_up_to_the_limit_in_one_turn_all_run():
    env = ToolEnv(Ask(), [calculator], max_tool_calls=8)
    env.reset(seed=0)
    obs, *_ = env.step(CALL * 8)
    assert [m["content"] for m in obs] == ["42"] * 8


@pytest.mark.parametrize("expr,msg", [
    ("1+\x002", "invalid expression: it contains a NUL character"),
    ("\x00", "invalid expression: it contains a NUL character"),
    ("1+\ud800", "invalid expression: it contains a lone surrogate (U+D800), which is not text"),
    ("\udfff*2", "invalid expression: it contains a lone surrogate (U+DFFF), which is not text"),
])
def test_calculator_nul_and_surrogates_are_named(expr, msg):
    with pytest.raises(ToolError) as e:
        evaluate(expr)
    assert str(e.value) == msg and "nested" not in msg


class _Page(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        if self.path == "/tab":  # a redirect to a URL with a control character
            self.send_response(302)
            self.send_header("Location", "/a\tb")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = b"ok"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


@pytest.fixture(scope="module")
def web():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("tail,char", [("/a\tb", "\\t"), ("/a\rb", "\\r"), ("/a\nb", "\\n"),
                                       ("/\x00", "\\x00"), ("/\x7f", "\\x7f")])
def test_fetch_control_characters_are_a_tool_error(web, tail, char):
    with pytest.raises(ToolError, match=r"invalid URL .* control character '" + char.replace("\\", "\\\\")):
        fetch_text(web + tail, ["127.0.0.1"])
    assert fetch_text(web + "/ok", ["127.0.0.1"]) == "ok"


def test_fetch_tool_through_env_never_raises(web):
    env = ToolEnv(Ask(), [make_fetch_tool(["127.0.0.1"])])
    env.reset(seed=0)
    call = '<tool_call>{"name": "fetch", "arguments": {"url": "URL"}}</tool_call>'
    for k, url in enumerate((web + "/a\\tb", web + "/a\\rb")):
        obs, _, _, _, info = env.step(call.replace("URL", url))
        assert obs[0]["content"].startswith("Error: invalid URL") and info["tool_error_kinds"]["tool_error"] == k + 1
    # a redirect to such a URL: httpx refuses the Location header; a tool error too
    obs, _, _, _, info = env.step(call.replace("URL", web + "/tab"))
    assert obs[0]["content"].startswith("Error: fetching") and "URL" in obs[0]["content"]
    assert info["tool_error_kinds"]["tool_error"] == 3
