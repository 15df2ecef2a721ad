"""The gateway's per-call shortcuts keep its answers and records the same: chat completions
answered on the raw ASGI messages send exactly Starlette's `JSONResponse` bytes and headers
(success, errors, streaming), the other paths still go through Starlette, ids come from the
gateway's own generator (never the seeded `random` stream), the canonical form of a plain
message and the renderer's direct decode equal the general ones, agent threads are reused."""

from __future__ import annotations

import json
import random
import re
import threading
import time

import httpx
import pytest
from starlette.responses import JSONResponse

from agentrl.gateway import protocol
from agentrl.gateway.agents import _Workers
from agentrl.gateway.record import _calls, content_text, norm_message
from agentrl.gateway.server import Gateway, Session
from agentrl.rollout.chat import ChatRenderer
from agentrl.rollout.engines.scripted import ScriptedEngine
from agentrl_tools.parser import get_parser

REPLY = 'héllo ✓ "q" \\ <b>'
MSGS = [{"role": "user", "content": "hi"}]


@pytest.fixture
def served(tiny_tokenizer):
    """A gateway with one live run, its session driven on a thread; yields (gateway, run)."""
    gw = Gateway()
    s = Session(ScriptedEngine(tiny_tokenizer, lambda ids: REPLY), ChatRenderer(tiny_tokenizer),
                get_parser("hermes"), model_names=["policy"], max_episode_tokens=512, max_tokens=64, seed=0)
    run = gw.open_run(s)
    stop = threading.Event()
    t = threading.Thread(target=s.drive, args=(stop.is_set,), daemon=True)
    t.start()
    yield gw, run
    stop.set()
    t.join(timeout=10)
    gw.close()


def _same_as_starlette(r: httpx.Response) -> None:
    want = JSONResponse(r.json(), status_code=r.status_code)
    assert r.content == want.body  # the same encoding: compact, non-ASCII kept, byte for byte
    assert r.headers["content-type"] == "application/json"
    assert int(r.headers["content-length"]) == len(r.content)


def test_answers_are_starlettes_bytes(served):
    gw, run = served
    auth = {"Authorization": f"Bearer {run.token}"}
    with httpx.Client(base_url=gw.url, timeout=60) as h:
        a = h.post("/chat/completions", json={"model": "policy", "messages": MSGS}, headers=auth)
        b = h.post("/chat/completions", json={"model": "policy", "messages": MSGS}, headers=auth)
        for r in (a, b):
            assert r.status_code == 200, r.text
            _same_as_starlette(r)
            assert r.json()["choices"][0]["message"]["content"] == REPLY
            assert re.fullmatch(r"chatcmpl-[0-9a-f]{32}", r.json()["id"])
        assert a.json()["id"] != b.json()["id"]
        assert "héllo ✓".encode() in a.content  # not \u-escaped
        # errors: the same OpenAI error bodies, status and headers
        for r, status, code in (
                (h.post("/chat/completions", json={"model": "policy", "messages": MSGS},
                        headers={"Authorization": "Bearer nope"}), 401, "invalid_api_key"),
                (h.post("/chat/completions", content=b"{not json", headers=auth), 400, None),
                (h.post("/chat/completions", json={"model": "gpt-x", "messages": MSGS}, headers=auth),
                 404, "model_not_found")):
            assert r.status_code == status, r.text
            _same_as_starlette(r)
            assert r.json()["error"]["code"] == code
        # streamed: server-sent events through Starlette's StreamingResponse
        s = h.post("/chat/completions", json={"model": "policy", "messages": MSGS, "stream": True}, headers=auth)
        assert s.status_code == 200 and s.headers["content-type"].startswith("text/event-stream")
        events = [x[len("data: "):] for x in s.text.split("\n\n") if x]
        assert events[-1] == "[DONE]"
        assert json.loads(events[0])["choices"][0]["delta"]["content"] == REPLY
        # everything else: Starlette's routing as before
        assert h.get("/chat/completions", headers=auth).status_code == 405
        assert h.post("/nothing", headers=auth).status_code == 404
        models = h.get("/models", headers=auth)
        assert models.status_code == 200 and [m["id"] for m in models.json()["data"]] == ["policy"]
    assert run.calls == 3 and run.record is not None and len(run.record.nodes) == 3


def test_ids_never_draw_from_the_random_module():
    random.seed(7)
    want = [random.random() for _ in range(3)]
    random.seed(7)
    ids = {protocol._hex_id(32) for _ in range(100)}
    msg = protocol.reply_message(None, [protocol.ToolCall("add", {"a": 1})])
    assert [random.random() for _ in range(3)] == want
    assert len(ids) == 100 and all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)
    assert re.fullmatch(r"call_[0-9a-f]{24}", msg["tool_calls"][0]["id"])


@pytest.mark.parametrize("m", [
    {"role": "user", "content": "é\u2028 \"x\""}, {"role": "assistant", "content": "x", "tool_calls": []},
    {"role": "developer", "content": "s", "refusal": None, "annotations": []}, {"content": "no role"},
    {"role": "tool", "content": "5", "tool_call_id": "c1"},
    {"role": "assistant", "content": None,
     "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": '{"b": 1, "a": 2}'}}]},
    {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}])
def test_canonical_form_of_plain_messages_is_the_general_one(m):
    role = m.get("role")
    general = json.dumps([role, content_text(m.get("content")), _calls(m),
                          m.get("tool_call_id") if role == "tool" else None], sort_keys=True, ensure_ascii=False)
    assert norm_message(m) == general


def test_direct_decode_equals_the_tokenizers(tiny_tokenizer):
    r = ChatRenderer(tiny_tokenizer)
    rng = random.Random(0)
    for _ in range(300):
        ids = [rng.randrange(len(tiny_tokenizer)) for _ in range(rng.randrange(0, 40))]
        if rng.random() < 0.3:
            ids.append(r.stop_ids[0])
        kept = ids[:-1] if ids and ids[-1] in r.stop_ids else ids
        assert r.decode_action(ids) == tiny_tokenizer.decode(kept, skip_special_tokens=False)


def test_agent_threads_are_reused_and_a_blocked_one_is_left_alone():
    """`_Workers`: a second batch runs on the first batch's threads; a run that blocks keeps its
    thread while the next run gets another; an idle thread ends after `idle_s`."""
    w = _Workers(idle_s=0.5)

    def batch(n: int, fn=None) -> list[int]:
        idents, done, together = [], threading.Semaphore(0), threading.Barrier(n)

        def job():  # the batch's runs overlap, as agent runs do
            idents.append(threading.get_ident())
            together.wait(10)
            if fn is not None:
                fn()
            done.release()

        for _ in range(n):
            w.run(job)
        for _ in range(n):
            assert done.acquire(timeout=10)
        return idents

    first = batch(3)
    time.sleep(0.05)  # the threads are back in the idle list
    assert len(set(first)) == 3 and set(batch(3)) == set(first)
    release = threading.Event()
    blocked = threading.Thread(target=batch, args=(1, lambda: release.wait(10)), daemon=True)
    blocked.start()
    time.sleep(0.2)
    others = batch(3)  # two idle threads and a new one: the blocked thread is not handed a run
    assert len(set(others)) == 3 and len(set(others) & set(first)) == 2
    release.set()
    blocked.join(10)
    time.sleep(1.5)  # past idle_s: the idle threads have ended
    assert not w._idle and not [t for t in threading.enumerate() if t.ident in set(first) | set(others)]
