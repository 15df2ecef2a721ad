"""Whole-request time limits and reply-size caps for the judge client and the fetch tool (#21
item 3), against a real HTTP server on 127.0.0.1 that misbehaves on purpose: it drips its
headers or its body one byte every 0.25 s, sends a huge body (with or without a
Content-Length, generated chunk by chunk, never held in memory), or a chat completion whose
`content` is not a string."""

from __future__ import annotations

import json
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from agentrl.infra.http_deadline import (
    DeadlineExceeded,
    ReplyTooLarge,
    fresh_connection_limits,
    request_with_deadline,
)
from agentrl.rewards.judge import JudgeClient
from agentrl_tools.fetch import fetch_text
from agentrl_tools.registry import ToolError

DRIP_S = 0.25
SLACK_S = 1.0  # connection set-up, thread wake-up, a loaded 2-core machine
HUGE = 150 * 1024 * 1024
CONTENTS = {"true": True, "int": 7, "float": 7.5, "list": ["Score: 7"], "null": None,
            "object": {"text": "Score: 7"}}


def _completion(content) -> bytes:
    return json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                                    "finish_reason": "stop"}]}).encode()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def _drip(self, data: bytes) -> None:
        try:
            for i in range(len(data)):
                self.wfile.write(data[i:i + 1])
                self.wfile.flush()
                time.sleep(DRIP_S)
        except OSError:
            pass  # the client gave up: what the test wants

    def _huge(self, with_length: bool) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if with_length:
            self.send_header("Content-Length", str(HUGE))
        else:
            self.send_header("Connection", "close")
        self.end_headers()
        chunk = b" " * 65536
        try:
            for _ in range(HUGE // len(chunk)):
                self.wfile.write(chunk)
        except OSError:
            pass
        self.server.huge_done = True

    def _send(self, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self._route()

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(n)
        self._route()

    def _route(self):
        path = self.path.split("/")[1]
        if self.path.endswith("/models"):
            self._send(json.dumps({"data": [{"id": "m"}]}).encode())
        elif path == "drip_body":
            body = _completion("Score: 7") * 50
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.flush()
            self._drip(body)
        elif path == "drip_headers":
            self._drip(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Pad: " + b"a" * 400)
        elif path == "huge_length":
            self._huge(with_length=True)
        elif path == "huge_stream":
            self._huge(with_length=False)
        elif path == "content":
            self._send(_completion(CONTENTS[self.path.split("/")[2]]))
        elif path == "ok":
            self._send(_completion("Score: 7"))
        elif path == "page":
            self._send(b"<p>hello</p>", "text/html")
        else:
            self.send_error(404)


@pytest.fixture(scope="module")
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


MSGS = [{"role": "user", "content": "What is 2 + 2?"}]


def _judge(url: str, **kw) -> JudgeClient:
    return JudgeClient(url, **{"model": "m", "max_retries": 0, "backoff": 0.01, **kw})


@pytest.mark.parametrize("behaviour", ["drip_body", "drip_headers"])
def test_judge_timeout_bounds_the_whole_request(server, behaviour):
    """A server that drips one byte every 0.25 s: each read succeeds within httpx's per-read
    timeout, so before the fix a 2 s call lasted as long as the server liked (89 s seen)."""
    c = _judge(f"{server}/{behaviour}", timeout=1.5)
    t0 = time.monotonic()
    r = c.judge(MSGS, "4")
    took = time.monotonic() - t0
    assert took < 1.5 + SLACK_S, took
    assert r.error_kind == "timeout" and math.isnan(r.reward) and r.attempts == 1
    assert "no complete reply within 1.5 s" in r.error


def test_judge_retries_each_get_their_own_limit(server):
    c = _judge(f"{server}/drip_body", timeout=0.6, max_retries=1)
    t0 = time.monotonic()
    r = c.judge(MSGS, "4")
    assert time.monotonic() - t0 < 2 * 0.6 + 0.01 + SLACK_S
    assert r.error_kind == "timeout" and r.attempts == 2


@pytest.mark.parametrize("behaviour", ["huge_length", "huge_stream"])
def test_judge_refuses_a_huge_reply_early(server, behaviour):
    """150 MB: refused from its Content-Length, or as soon as the body passes the cap; the
    client never buffers more than the cap (peak traced allocations stay far below 150 MB)."""
    import tracemalloc

    c = _judge(f"{server}/{behaviour}", timeout=20, max_reply_bytes=1 << 20)
    tracemalloc.start()
    t0 = time.monotonic()
    try:
        r = c.judge(MSGS, "4")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.monotonic() - t0 < 5
    assert r.error_kind == "bad_response" and "1048576-byte cap" in r.error and math.isnan(r.reward)
    assert peak < 16 * 1024 * 1024, peak


@pytest.mark.parametrize("content", list(CONTENTS))
def test_judge_content_that_is_not_a_string_is_a_bad_response(server, content):
    """`true` scored 10/10 before (its str() is a verdict word); a number scored itself."""
    r = _judge(f"{server}/content/{content}").judge(MSGS, "4")
    assert r.error_kind == "bad_response" and math.isnan(r.score) and math.isnan(r.reward)
    assert "not a string" in r.error


def test_judge_still_scores_a_normal_reply(server):
    r = _judge(f"{server}/ok").judge(MSGS, "4")
    assert r.ok and r.score == 7.0 and r.attempts == 1


def test_judge_keeps_environment_proxies(monkeypatch, server):
    """The client still reads HTTP(S)_PROXY / NO_PROXY (httpx trust_env): with a proxy set in
    the environment and 127.0.0.1 exempted, the request goes straight to the server."""
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    c = _judge(f"{server}/ok")
    assert c._http._trust_env
    assert c.judge(MSGS, "4").score == 7.0
    monkeypatch.delenv("NO_PROXY")
    c = _judge(f"{server}/ok")  # now through the (dead) proxy: a connect error, not a hang
    assert c.judge(MSGS, "4").error_kind == "connect"


def test_request_with_deadline_directly(server):
    with httpx.Client(limits=fresh_connection_limits()) as client:
        t0 = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            request_with_deadline(client, "GET", f"{server}/drip_headers", timeout_s=0.8, max_bytes=100)
        assert time.monotonic() - t0 < 0.8 + SLACK_S
        with pytest.raises(ReplyTooLarge, match="over the 1000-byte cap"):
            request_with_deadline(client, "GET", f"{server}/huge_length", timeout_s=5, max_bytes=1000)
        r = request_with_deadline(client, "GET", f"{server}/huge_stream", timeout_s=5, max_bytes=1000,
                                  truncate=True)
        assert r.truncated and len(r.content) == 1000 and r.status_code == 200
        r = request_with_deadline(client, "GET", f"{server}/ok", timeout_s=5, max_bytes=1000)
        assert json.loads(r.content)["choices"][0]["message"]["content"] == "Score: 7"


@pytest.mark.parametrize("behaviour", ["drip_body", "drip_headers"])
def test_fetch_timeout_bounds_the_whole_fetch(server, behaviour):
    t0 = time.monotonic()
    with pytest.raises(ToolError, match="took longer than 1.2 s"):
        fetch_text(f"{server}/{behaviour}", ["127.0.0.1"], timeout_s=1.2)
    assert time.monotonic() - t0 < 1.2 + SLACK_S


def test_fetch_cuts_a_huge_page(server):
    t0 = time.monotonic()
    text = fetch_text(f"{server}/huge_stream", ["127.0.0.1"], timeout_s=10, max_bytes=5000)
    assert text.endswith("[page cut at 5000 bytes]") and time.monotonic() - t0 < 5
    assert fetch_text(f"{server}/page", ["127.0.0.1"]) == "hello"
