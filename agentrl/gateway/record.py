"""One agent run's gateway calls, recorded as token ids exactly as sampled, and the trajectories
they make (contract 1: the policy's ids are never re-tokenised).

Every call of a run is a node of a tree. A call whose messages start with an earlier call's
messages followed by that call's reply (the conversation extended: tool results, a new user
message) is that call's child: its prompt ids are the parent's ids (its prompt and its sampled
reply, as sampled), the template's closing of the reply (`ChatRenderer.close_turn`) and the
delta of the new messages (`ChatRenderer.delta_ids`). Any other call (the context rewritten: a
summary, a new system prompt, other tools) is a new root, rendered from its messages. Each leaf
is one trajectory (the chain root -> leaf): loss_mask 1 on the sampled ids of every call on it,
the sampler's logprobs kept, the run's reward on its last turn (docs/agents.md).

Messages are compared in a canonical form (`norm_message`): role, text, tool calls (name and
parsed arguments), a tool message's `tool_call_id`; what SDKs add to an echoed reply (`refusal`,
`annotations`, `audio`) is ignored.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any

from agentrl.gateway.protocol import parse_call
from agentrl.rollout.chat import ChatRenderer
from agentrl.types import Trajectory

Message = dict[str, Any]


def content_text(content: Any) -> str:
    """The text of a message's `content`: a string as it is, None as "", a list of parts as its
    text parts joined (`{"type": "text", "text": ...}`)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content
                       if isinstance(p, dict) and p.get("type") == "text")
    return str(content)


def _calls(m: Message) -> list[tuple[Any, Any]]:
    """`(name, arguments)` of each of `m`'s tool calls (`parse_call`; `(None, None)` for one of
    no call's shape, which the gateway refuses before recording)."""
    return [parse_call(c) or (None, None) for c in m.get("tool_calls") or []]


_NORM = json.JSONEncoder(sort_keys=True, ensure_ascii=False)  # `json.dumps(x, sort_keys=True,
# ensure_ascii=False)`, made once (dumps makes an encoder a call when given options)


def norm_message(m: Message) -> str:
    """A canonical JSON string of chat message `m`, for comparing conversations: role, content
    text, tool calls `(name, arguments as an object)` and a tool message's `tool_call_id`."""
    role, content = m.get("role"), m.get("content")
    if type(content) is str and role != "tool" and not m.get("tool_calls"):
        return _NORM.encode([role, content, [], None])  # the common case of the line below
    extra = m.get("tool_call_id") if role == "tool" else None
    return _NORM.encode([role, content_text(content), _calls(m), extra])


def template_messages(messages: list[Message]) -> list[Message]:
    """`messages` as chat templates take them: content as text, `developer` as `system`, tool
    calls as `{"type": "function", "function": {"name", "arguments": dict}}` (Hugging Face
    templates expect the arguments as an object) with the call's `id` when it has one (Mistral's
    template refuses a call without a 9-character id), `tool_call_id` / `name` kept."""
    out = []
    for m in messages:
        role = "system" if m.get("role") == "developer" else m.get("role")
        t: Message = {"role": role, "content": content_text(m.get("content"))}
        calls = _calls(m)
        if calls:
            ids = [c.get("id") if isinstance(c, dict) else None for c in m["tool_calls"]]
            t["tool_calls"] = [{"type": "function", "function": {"name": n, "arguments": a}}
                               | ({"id": i} if isinstance(i, str) else {})
                               for (n, a), i in zip(calls, ids)]
        for k in ("tool_call_id", "name"):
            if m.get(k) is not None:
                t[k] = m[k]
        out.append(t)
    return out


def tools_key(tools: list[dict] | None) -> str:
    """The identity of a call's tool list (a call with other tools rewrites the system prompt)."""
    return json.dumps(tools, sort_keys=True) if tools else "[]"


@dataclass
class CallNode:
    """One sampled reply of one call (a call with `n` choices makes `n` sibling nodes).

    Attributes:
        conv: `norm_message` of the call's messages, then of this reply.
        tools: `tools_key` of the call.
        context_ids: ids the call put before sampling: a root's whole prompt; a child's
            closing of its parent's reply + the delta of its new messages (all loss_mask 0).
        full_ids: the call's prompt ids followed by `sampled`.
        sampled, logprobs: the ids the engine sampled (as kept: cut at a stop string) and its
            logprob of each.
        finish_reason: "stop" | "length"; text: the reply's text; messages: the call's messages
            and the reply (the transcript); version: the engine's policy version when sampled.
    """

    conv: list[str]
    tools: str
    context_ids: list[int]
    full_ids: list[int]
    sampled: list[int]
    logprobs: list[float]
    finish_reason: str
    text: str
    messages: list[Message]
    version: int
    parent: CallNode | None = None
    children: int = 0


@dataclass
class Prepared:
    """A call ready to sample: the node it extends (None: a new root), its messages' canonical
    forms, the ids it adds (`context_ids`) and the whole prompt (`prompt_ids`)."""

    parent: CallNode | None
    conv: list[str]
    tools: str
    context_ids: list[int]
    prompt_ids: list[int]
    messages: list[Message]
    forced: str = ""  # text the reply was prefilled with (its ids end context_ids): tool_choice


class PromptTooLong(ValueError):
    """A call's prompt leaves no room to sample under the run's token limit."""


@dataclass
class RunRecord:
    """The calls of one agent run, thread-safe (the server records from its worker threads).

    Args:
        renderer: the policy's chat renderer.
        max_prompt_tokens: the most ids a prompt may have (`rollout.max_episode_tokens` - 1).
    """

    renderer: ChatRenderer
    max_prompt_tokens: int
    nodes: list[CallNode] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def _parent(self, conv: list[str], tools: str) -> CallNode | None:
        """The recorded reply whose conversation is the longest prefix of `conv` (same tools)."""
        best = None
        with self.lock:
            for node in self.nodes:
                k = len(node.conv)
                if node.tools == tools and k <= len(conv) and conv[:k] == node.conv and \
                        (best is None or k > len(best.conv)):
                    best = node
        return best

    def prepare(self, messages: list[Message], tools: list[dict] | None) -> Prepared:
        """The prompt ids of a call: the ids of the conversation it extends (never re-rendered)
        and the delta of its new messages, or its messages rendered afresh (always, with the
        renderer's `history` "template").

        Raises:
            PromptTooLong: the prompt has more than `max_prompt_tokens` ids.
            Whatever the chat template raises on the messages (an unknown role).
        """
        conv = [norm_message(m) for m in messages]
        key = tools_key(tools)
        r = self.renderer
        # rollout.history=template: every call is rendered afresh by the template (what the model
        # sees at inference) and is its own sample, carrying the run's reward like any other
        parent = None if r.history == "template" else self._parent(conv, key)
        if parent is not None:
            delta = template_messages(messages[len(parent.conv):])
            ctx = r.close_turn(parent.sampled) + r.delta_ids(delta)
            prompt = parent.full_ids + ctx
        else:
            ctx = r.prompt_ids(template_messages(messages), tools=tools or None)
            prompt = ctx
        if len(prompt) > self.max_prompt_tokens:
            raise PromptTooLong(f"the prompt has {len(prompt)} tokens; the most this run allows "
                                f"is {self.max_prompt_tokens} (rollout.max_episode_tokens - 1)")
        return Prepared(parent, conv, key, list(ctx), list(prompt), list(messages))

    def record(self, prep: Prepared, sampled: list[int], logprobs: list[float], finish_reason: str,
               text: str, reply: Message, version: int) -> CallNode:
        """Record one sampled reply of a prepared call; returns its node."""
        node = CallNode(conv=prep.conv + [norm_message(reply)], tools=prep.tools,
                        context_ids=prep.context_ids, full_ids=prep.prompt_ids + list(sampled),
                        sampled=list(sampled), logprobs=list(logprobs), finish_reason=finish_reason,
                        text=text, messages=prep.messages + [reply], version=version,
                        parent=prep.parent)
        with self.lock:
            if prep.parent is not None:
                prep.parent.children += 1
            self.nodes.append(node)
        return node

    def trajectories(self, reward: float, *, group_id: int = 0, task_id: str = "",
                     info: dict[str, Any] | None = None) -> list[Trajectory]:
        """One trajectory per leaf (a reply no later call extended), in call order: the chain
        root -> leaf, context ids with loss_mask 0, sampled ids with 1 and their logprobs,
        `reward` on the last turn, `terminated`. `policy_version` is the oldest on the chain.

        Raises:
            AssertionError: a chain's ids differ from the ids its last call was fed and sampled
                (a bug: contract 1).
        """
        with self.lock:
            leaves = [n for n in self.nodes if n.children == 0]
        out = []
        for leaf in leaves:
            chain: list[CallNode] = []
            node: CallNode | None = leaf
            while node is not None:
                chain.append(node)
                node = node.parent
            chain.reverse()
            tr = Trajectory(group_id=group_id, task_id=task_id, terminated=True,
                            policy_version=min(n.version for n in chain), info=dict(info or {}))
            for n in chain:
                tr.append_context(n.context_ids)
                tr.append_sampled(n.sampled, n.logprobs, [n.version] * len(n.sampled), text=n.text,
                                  finish_reason=n.finish_reason,
                                  info={"call": self.nodes.index(n)})
            assert tr.token_ids == leaf.full_ids, "gateway: a chain's ids differ from its calls' ids"
            tr.turns[-1].reward = float(reward)
            tr.messages = [dict(m) for m in leaf.messages]
            tr.info["num_turns"] = len(tr.turns)
            tr.validate()
            out.append(tr)
        return out
