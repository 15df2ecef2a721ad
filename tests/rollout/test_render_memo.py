"""The renderer's memo (`agentrl.rollout.chat`, module doc): a memoised prompt or delta is the
same ids as a fresh render, is rendered once, never shared between callers, keyed so that
messages that render differently never share an entry, and bounded."""

from __future__ import annotations

import pytest

from agentrl.rollout import chat
from agentrl.rollout.chat import ChatRenderer, render_key


class Counting:
    """The real tokenizer, counting its `apply_chat_template` calls (renders)."""

    def __init__(self, tok):
        self._tok, self.renders = tok, 0

    def apply_chat_template(self, *a, **kw):
        self.renders += 1
        return self._tok.apply_chat_template(*a, **kw)

    def __getattr__(self, name):
        return getattr(self._tok, name)


OBS = [[{"role": "user", "content": "Now the last digit."}],
       [{"role": "tool", "content": "cats: 3"}],
       [{"role": "user", "content": "a <|im_end|> inside"}, {"role": "user", "content": "two"}],
       [{"role": "assistant", "content": "", "tool_calls": [
           {"type": "function", "function": {"name": "f", "arguments": {"q": 1, "z": [1, 2]}}}]},
        {"role": "tool", "content": "ok"}]]


def test_memoised_equals_fresh_and_renders_once(tiny_tokenizer):
    fresh, memo = ChatRenderer(tiny_tokenizer), ChatRenderer(Counting(tiny_tokenizer))
    for obs in OBS:
        want = fresh._delta_ids(obs)  # the un-memoised render
        first = memo.delta_ids(obs)
        n = memo.tokenizer.renders
        second = memo.delta_ids(obs)
        assert first == second == want
        assert memo.tokenizer.renders == n  # the second call rendered nothing
        second.append(-1)  # a caller's list is its own: the memo is unchanged
        assert memo.delta_ids(obs) == want
    opening = [{"role": "system", "content": "s"}, {"role": "user", "content": "Count to 42."}]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    for t in (None, tools):
        assert memo.prompt_ids(opening, t) == fresh._prompt_ids(opening, t) == memo.prompt_ids(opening, t)
    assert memo.prompt_ids(opening) != memo.prompt_ids(opening, tools)  # tools are part of the key


def test_keys_keep_types_and_order():
    """Messages that a template may render differently never share a key; non-plain ones
    (a dict subclass, an image object) are not memoised at all."""
    m = {"role": "user", "content": "x"}
    keys = {render_key([{**m, "n": v}]) for v in (1, 1.0, True, "1", (1,), [1])}
    assert len(keys) == 6
    assert render_key([{"a": 1, "b": 2}]) != render_key([{"b": 2, "a": 1}])

    class D(dict):
        pass

    assert render_key([D(m)]) is None
    assert render_key([{"role": "user", "content": "x" * chat.RENDER_KEY_CHARS}]) is None  # too long
    assert render_key([{"role": "user", "content": [{"type": "image", "image": object()}]}]) is None


def test_memo_is_bounded(tiny_tokenizer, monkeypatch):
    monkeypatch.setattr(chat, "RENDER_CACHE_SIZE", 3)
    r = ChatRenderer(tiny_tokenizer)
    outs = [r.delta_ids([{"role": "user", "content": f"obs {k}"}]) for k in range(7)]
    assert len(r._memo["delta"]) <= 3
    assert [r.delta_ids([{"role": "user", "content": f"obs {k}"}]) for k in range(7)] == outs


def test_unplain_and_failed_renders_are_not_memoised(tiny_tokenizer, monkeypatch):
    r = ChatRenderer(tiny_tokenizer)
    r.prompt_ids([{"role": "user", "content": object()}])  # not plain: rendered, not kept
    assert not r._memo["prompt"]
    real, calls = r._ids, []

    def failing_once(*a, **kw):  # a template error on the first render only (injected)
        calls.append(1)
        if len(calls) == 1:
            raise ValueError("template error")
        return real(*a, **kw)

    monkeypatch.setattr(r, "_ids", failing_once)
    msgs = [{"role": "user", "content": "hi"}]
    with pytest.raises(chat.RenderError):
        r.prompt_ids(msgs)
    assert r.prompt_ids(msgs) == ChatRenderer(tiny_tokenizer).prompt_ids(msgs)
