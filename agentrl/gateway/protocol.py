"""The OpenAI chat-completions protocol as the gateway speaks it: the request checks
(`parse_request`), the reply of one sampled completion (`make_choice`: stop strings, tool calls
parsed with the model's tool format) and the response bodies (`completion_body`, `stream_chunks`,
`error_body`).

Request fields read: `model`, `messages` (roles system, developer, user, assistant, tool; text
content, a string or text parts; an assistant's `tool_calls`), `tools` (function schemas),
`tool_choice` ("none": calls are not parsed; "auto": parsed; "required" or a named function
`{"type": "function", "function": {"name": ...}}`: honoured by prefilling the reply with the
opening of a call in the model's tool format, `forced_prefix`, so the sampler writes the rest of
the call; it needs `tools`, and a named function must be one of them, else 400),
`parallel_tool_calls` (false: only the reply's first call is returned), `temperature`, `top_p`,
`max_tokens` / `max_completion_tokens`, `stop` (a string or up to 4), `n` (1..8), `stream`,
`stream_options.include_usage`, `seed` (`agentrl serve`: the request's sampler seed; in training
the run's seed decides), `logprobs` (the sampled tokens' logprobs), `chat_template_kwargs`.

Fields the gateway cannot honour (`UNSUPPORTED`: `response_format`, `presence_penalty`,
`frequency_penalty`, `logit_bias`, `top_logprobs`, ...) are accepted at their neutral value (SDKs
send `presence_penalty: 0`, `response_format: {"type": "text"}`) and refused with 400 naming the
field at any other. Other fields (`user`, `metadata`, `store`, ...) do not change a reply and are
ignored.
"""

from __future__ import annotations

import json
import os
import random
import re
import string
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentrl_tools.parser import ToolCall, ToolCallParser

ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_N = 8
_IDS = random.Random()  # response and tool-call ids: unique, not secret; seeded from the OS once,
# its own generator so that the ids never draw from the `random` module's (seeded) stream
os.register_at_fork(after_in_child=_IDS.seed)  # a forked process draws other ids


def _hex_id(digits: int) -> str:
    """`digits` random hex digits (a response's or a tool call's id)."""
    return f"{_IDS.getrandbits(4 * digits):0{digits}x}"


_ALNUM = string.ascii_letters + string.digits


def call_id(parser_name: str = "") -> str:
    """A fresh tool-call id: OpenAI's shape (`call_` + 24 hex digits), or for the `mistral`
    tool format 9 letters and digits, the only ids Mistral's chat template renders (it raises
    "Tool call IDs should be alphanumeric strings with length 9!" for any other, so an agent
    that sends the reply back with its tool results would be refused; vLLM's Mistral tool
    parser issues the same shape)."""
    if parser_name == "mistral":
        return "".join(_IDS.choices(_ALNUM, k=9))
    return f"call_{_hex_id(24)}"


class GatewayError(Exception):
    """A request the gateway refuses: HTTP `status`, OpenAI's error `type` and `code`."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 code: str | None = None, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type, code, param


def bad(message: str, param: str | None = None) -> GatewayError:
    """A 400 `invalid_request_error` naming the field."""
    return GatewayError(400, message, param=param)


def error_body(e: GatewayError) -> dict[str, Any]:
    """OpenAI's error shape: `{"error": {"message", "type", "param", "code"}}`."""
    return {"error": {"message": e.message, "type": e.type, "param": e.param, "code": e.code}}


@dataclass
class ChatRequest:
    """A checked chat-completions request (fields as in the module docstring)."""

    model: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    parse_calls: bool
    temperature: float | None
    top_p: float | None
    max_tokens: int | None
    stop: list[str]
    n: int
    stream: bool
    require_call: bool = False
    call_name: str | None = None
    template_kwargs: dict[str, Any] | None = None
    seed: int | None = None
    logprobs: bool = False
    stream_usage: bool = False
    one_call: bool = False


def _neutral_number(default: float) -> Callable[[Any], bool]:
    return lambda v: v is None or (type(v) in (int, float) and v == default)


UNSUPPORTED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "response_format": (lambda v: v is None or v == {"type": "text"},
                        "replies are not constrained to JSON; ask for JSON in the messages and "
                        "parse the content"),
    "presence_penalty": (_neutral_number(0), "the sampler applies no penalties"),
    "frequency_penalty": (_neutral_number(0), "the sampler applies no penalties"),
    "repetition_penalty": (_neutral_number(1), "the sampler applies no penalties"),
    "logit_bias": (lambda v: v is None or v == {}, "the sampler applies no logit bias"),
    "top_logprobs": (_neutral_number(0), "only the sampled tokens' logprobs are kept "
                                         "('logprobs': true)"),
    "top_k": (lambda v: v is None or (type(v) is int and v in (0, -1)), "the sampler has no "
                                                                        "top-k; use 'top_p'"),
    "min_p": (_neutral_number(0), "the sampler has no min-p; use 'top_p'"),
    "functions": (lambda v: v is None, "use 'tools'"),
    "function_call": (lambda v: v is None, "use 'tool_choice'"),
    "modalities": (lambda v: v is None or v == ["text"], "replies are text only"),
    "audio": (lambda v: v is None, "replies are text only"),
}
"""Request fields the gateway cannot honour: field -> (is the value neutral?, why). A neutral
value (absent, null, the API's default) is accepted; any other is refused with 400."""


def _check_unsupported(body: dict[str, Any]) -> None:
    for key, (neutral, why) in UNSUPPORTED.items():
        if key in body and not neutral(body[key]):
            raise bad(f"'{key}' {json.dumps(body[key])[:80]} is not supported by this server: "
                      f"{why}", key)


def _optional(body: dict[str, Any], key: str, kind: type, what: str) -> Any:
    """`body[key]` when it is absent or null (None) or of type `kind` (a bool is no int)."""
    v = body.get(key)
    if v is not None and (type(v) is not kind):
        raise bad(f"'{key}' must be {what}", key)
    return v


def _check_content(k: int, m: dict[str, Any]) -> None:
    c = m.get("content")
    if c is None or isinstance(c, str):
        return
    if not isinstance(c, list):
        raise bad(f"messages[{k}].content must be a string, null or a list of text parts", "messages")
    for p in c:
        if not (isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)):
            raise bad(f"messages[{k}].content: only text parts are served ({{'type': 'text', "
                      f"'text': ...}}), got {str(p)[:80]}", "messages")


_ABSENT = object()


def parse_call(c: Any, missing: Any = None, decode: bool = True) -> tuple[str, Any] | None:
    """One tool call of a chat message read as `(name, arguments)`: OpenAI's
    `{"function": {"name": str, "arguments": object or its JSON text}}` (other keys, `id` and
    `type`, ignored) or a `ToolCall`. Arguments given as text are parsed (kept as the text when
    it is not JSON, or with `decode=False`: a check of the shape only); absent ones are
    `missing`.

    Returns:
        None when `c` has no such shape: no `function` object, a name that is not a string,
        arguments present but neither a string nor an object. (The gateway refuses such a call
        with a 400, a conversation file with the line named.)
    """
    if isinstance(c, ToolCall):
        return c.name, c.arguments
    f = c.get("function") if isinstance(c, dict) else None
    if not isinstance(f, dict) or not isinstance(f.get("name"), str):
        return None
    a = f.get("arguments", _ABSENT)
    if a is _ABSENT:
        return f["name"], missing
    if isinstance(a, str) and decode:
        try:
            return f["name"], json.loads(a)
        except ValueError:
            return f["name"], a
    return (f["name"], a) if isinstance(a, (str, dict)) else None


def _check_messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise bad("'messages' must be a non-empty list", "messages")
    for k, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise bad(f"messages[{k}] must be an object with a role in {list(ROLES)}", "messages")
        _check_content(k, m)
        for c in m.get("tool_calls") or []:
            if parse_call(c, decode=False) is None:
                raise bad(f"messages[{k}].tool_calls: each call needs function.name and "
                          "function.arguments", "messages")
    return messages


def _check_tools(tools: Any) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    if not isinstance(tools, list) or not all(
            isinstance(t, dict) and t.get("type", "function") == "function"
            and isinstance(t.get("function"), dict) and isinstance(t["function"].get("name"), str)
            for t in tools):
        raise bad("'tools' must be a list of {'type': 'function', 'function': {'name': ...}}", "tools")
    return tools or None


def _number(body: dict[str, Any], key: str, lo: float, hi: float, lo_open: bool = False) -> float | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v > hi or v < lo or (lo_open and v == lo):
        raise bad(f"'{key}' must be a number in {'(' if lo_open else '['}{lo}, {hi}]", key)
    return float(v)


def parse_request(body: Any) -> ChatRequest:
    """Check a decoded request body.

    Raises:
        GatewayError: 400 naming the field that is missing or malformed.
    """
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad("'model' must be a string", "model")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)
                                   or max_tokens < 1):
        raise bad("'max_tokens' must be an integer >= 1", "max_tokens")
    n = body.get("n", 1) or 1
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_N:
        raise bad(f"'n' must be an integer in [1, {MAX_N}]", "n")
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or len(stop) > 4 or not all(isinstance(s, str) and s for s in stop):
        raise bad("'stop' must be a non-empty string or a list of at most 4", "stop")
    tools = _check_tools(body.get("tools"))
    choice, call_name = body.get("tool_choice", "auto"), None
    if isinstance(choice, dict):
        f = choice.get("function")
        if choice.get("type", "function") != "function" or not isinstance(f, dict) or \
                not isinstance(f.get("name"), str):
            raise bad("'tool_choice' as an object must be {'type': 'function', 'function': "
                      "{'name': ...}}", "tool_choice")
        call_name = f["name"]
    elif choice not in ("none", "auto", "required"):
        raise bad("'tool_choice' must be 'none', 'auto', 'required' or a function", "tool_choice")
    if (choice == "required" or call_name is not None) and not tools:
        raise bad("'tool_choice' requires a tool call but the request has no 'tools'", "tool_choice")
    if call_name is not None and call_name not in [t["function"]["name"] for t in tools or []]:
        raise bad(f"'tool_choice' names the function {call_name!r}, which is not in 'tools'", "tool_choice")
    template_kwargs = body.get("chat_template_kwargs")
    if template_kwargs is not None and not isinstance(template_kwargs, dict):
        raise bad("'chat_template_kwargs' must be an object", "chat_template_kwargs")
    _check_unsupported(body)
    seed = _optional(body, "seed", int, "an integer")
    if seed is not None and not -2**63 <= seed < 2**63:
        raise bad("'seed' must be a 64-bit integer", "seed")
    options = _optional(body, "stream_options", dict, "an object") or {}
    usage = options.get("include_usage")
    if usage is not None and not isinstance(usage, bool):
        raise bad("'stream_options.include_usage' must be a boolean", "stream_options")
    return ChatRequest(model=model, messages=_check_messages(body.get("messages")),
                       tools=tools, parse_calls=choice != "none",
                       temperature=_number(body, "temperature", 0.0, 2.0),
                       top_p=_number(body, "top_p", 0.0, 1.0, lo_open=True), max_tokens=max_tokens,
                       stop=stop, n=n, stream=bool(body.get("stream", False)),
                       require_call=choice == "required" or call_name is not None, call_name=call_name,
                       template_kwargs=template_kwargs, seed=seed,
                       logprobs=bool(_optional(body, "logprobs", bool, "a boolean")),
                       stream_usage=bool(usage),
                       one_call=_optional(body, "parallel_tool_calls", bool, "a boolean") is False)


def check_template_kwargs(asked: dict[str, Any] | None, fixed: dict[str, Any]) -> None:
    """A request's `chat_template_kwargs` (vLLM's field, e.g. `{"enable_thinking": false}` for
    Qwen3) must agree with the variables the model is served with, `fixed`: the prompt ids of a
    run are rendered with one set (and were silently rendered with it whatever a request asked).

    Raises:
        GatewayError: 400 naming the field and where the variables are set.
    """
    if asked and any(k not in fixed or fixed[k] != v for k, v in asked.items()):
        raise bad(f"'chat_template_kwargs' {json.dumps(asked)} differs from the chat template variables "
                  f"this model is served with ({json.dumps(fixed) if fixed else 'none'}); they are fixed "
                  "per run: set rollout.chat_template_kwargs (agentrl serve: --chat-template-kwargs)",
                  "chat_template_kwargs")


_NAME, _ARG = "__agentrl_name__", "__agentrl_arg__"


def forced_prefix(parser: ToolCallParser, name: str | None) -> str:
    """The opening of a tool call in `parser`'s format that a reply is prefilled with to honour
    `tool_choice`: up to the function name (`name` None: "required", any tool), or up to the
    arguments of function `name` (Hermes: `<tool_call>\n{"name": "` and
    `<tool_call>\n{"name": "add", "arguments": `). Read off `parser.format_call` of a call
    with placeholder name and arguments.

    Raises:
        GatewayError: 400 when the format's calls do not show where the name or the arguments
            start (a parser without `format_call`, or an unusual layout).
    """
    try:
        text = parser.format_call(ToolCall(name or _NAME, {_ARG: 0}))
    except Exception as e:  # noqa: BLE001 - a parser that cannot write calls
        raise bad(f"'tool_choice' cannot be honoured with this tool format ({type(e).__name__}: {e}); "
                  "use 'auto'", "tool_choice") from None
    if name is None:
        cut = text.find(_NAME)
    else:
        at = text.find(_ARG)
        cut = text.rfind("{", 0, at) if at >= 0 else -1
    if cut <= 0:
        raise bad("'tool_choice' cannot be honoured with this tool format (no place to prefill a "
                  "call); use 'auto'", "tool_choice")
    return text[:cut]


# -- one completion -------------------------------------------------------------------------------
def cut_at_stop(decode: Any, ids: list[int], text: str, stops: list[str]) -> tuple[int, str] | None:
    """Where a completion ends at the first of the `stops` strings in its `text`: `(k, text
    before the stop)`, k the fewest ids whose decoding holds it; None when no stop occurs.
    `decode(ids) -> str`. The ids after k were sampled but are dropped, as an API that stops at
    a string would never have sampled them."""
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    if not hits:
        return None
    at = min(hits)
    stop = next(s for s in stops if text.find(s) == at)
    for k in range(1, len(ids) + 1):
        if stop in decode(ids[:k])[at:]:
            return k, text[:at]
    return len(ids), text[:at]


_HERMES = re.compile(r"<tool_call>.*?(</tool_call>|$)", re.DOTALL)


def split_calls(parser: ToolCallParser, text: str) -> tuple[str | None, list[ToolCall]]:
    """The reply's content and its well-formed tool calls (`parser.parse`). Without a call the
    content is the whole text; with calls, the text without the calls (the parser's own
    `strip_calls` when it has one, else Hermes' `<tool_call>` blocks removed), None when empty.
    Malformed calls stay in the content, as text."""
    calls = [c for c in parser.parse(text) if isinstance(c, ToolCall)]
    if not calls:
        return text, []
    strip = getattr(parser, "strip_calls", None)
    content = strip(text) if callable(strip) else _HERMES.sub("", text)
    content = content.strip()
    return (content or None), calls


def reply_message(content: str | None, calls: list[ToolCall], parser_name: str = "") -> dict[str, Any]:
    """The assistant message of a reply, OpenAI's shape (tool-call ids are fresh: `call_id` of
    the tool format `parser_name`)."""
    msg: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        msg["tool_calls"] = [{"id": call_id(parser_name), "type": "function",
                              "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
                             for c in calls]
    return msg


def finish_reason(engine_reason: str, message: dict[str, Any]) -> str:
    """OpenAI's finish reason: "tool_calls" when the reply calls tools, "length" when cut by
    max_tokens, else "stop"."""
    if message.get("tool_calls"):
        return "tool_calls"
    return "length" if engine_reason == "length" else "stop"


def logprobs_body(decode: Any, ids: list[int], logprobs: list[float]) -> dict[str, Any]:
    """A choice's `logprobs` (OpenAI's shape): per sampled id (its stop token included, as
    vLLM's) the token's text (`decode([id])`), its logprob as the sampler reported it, the text's
    UTF-8 bytes, and no alternatives (`top_logprobs` is refused above 0)."""
    content = []
    for i, lp in zip(ids, logprobs):
        text = decode([i])
        content.append({"token": text, "logprob": float(lp), "bytes": list(text.encode("utf-8")),
                        "top_logprobs": []})
    return {"content": content, "refusal": None}


def completion_body(model: str, messages: list[dict[str, Any]], reasons: list[str],
                    prompt_tokens: int, completion_tokens: int,
                    logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A `chat.completion` response with one choice per reply message (and its `logprobs_body`
    when `logprobs` is given, one per message; else `"logprobs": null`)."""
    lps: list[dict[str, Any] | None] = list(logprobs) if logprobs is not None else [None] * len(messages)
    return {"id": f"chatcmpl-{_hex_id(32)}", "object": "chat.completion", "created": int(time.time()),
            "model": model,
            "choices": [{"index": i, "message": m, "finish_reason": r, "logprobs": lp}
                        for i, (m, r, lp) in enumerate(zip(messages, reasons, lps))],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}}


def stream_chunks(body: dict[str, Any], usage: bool = False) -> list[str]:
    """A complete response as server-sent events of `chat.completion.chunk`s: per choice one
    delta with the whole message (and its `logprobs`), then one with its finish reason; with
    `usage` (`stream_options.include_usage`) a last chunk with no choices and the `usage`; then
    `[DONE]`. (The reply is sampled whole first: streaming is accepted, not incremental.)"""
    head = {"id": body["id"], "object": "chat.completion.chunk", "created": body["created"],
            "model": body["model"]}
    events = []
    for c in body["choices"]:
        m = c["message"]
        delta: dict[str, Any] = {"role": "assistant", "content": m.get("content") or ""}
        if m.get("tool_calls"):
            delta["tool_calls"] = [{"index": k, **tc} for k, tc in enumerate(m["tool_calls"])]
        events.append({**head, "choices": [{"index": c["index"], "delta": delta, "finish_reason": None,
                                            "logprobs": c.get("logprobs")}]})
        events.append({**head, "choices": [{"index": c["index"], "delta": {}, "finish_reason": c["finish_reason"]}]})
    if usage:
        events.append({**head, "choices": [], "usage": body["usage"]})
    return [f"data: {json.dumps(e, ensure_ascii=False)}\n\n" for e in events] + ["data: [DONE]\n\n"]
