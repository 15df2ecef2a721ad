"""Parsing tool calls out of an agent's text, and rendering the tool list into a system prompt.

A parser turns one assistant turn into an ordered list of items, each a `ToolCall` (well formed)
or a `ToolCallError` (a call the agent tried to make but that cannot be run: cut-off JSON,
arguments that are not an object, ...). The order is the order in the text, so the observations
come back in the order the agent wrote the calls (case T3). An empty list means the turn contains
no tool call: it is the agent's answer.

Parsers are looked up by name in `PARSERS`; add one by implementing the `ToolCallParser`
protocol and putting an instance there.

The formats (`PARSERS` names; docs/tools.md has the details and which model emits which):

- `hermes` (Hermes, Qwen2.5, Qwen3)::

      <tool_call>
      {"name": "search", "arguments": {"query": "cats"}}
      </tool_call>

- `llama3_json` (Llama-3.1/3.2): the whole message, or after `<|python_tag|>`, ``;``-separated::

      {"name": "search", "parameters": {"query": "cats"}}

- `mistral` (Mistral v0.3; also the later `[TOOL_CALLS]name[ARGS]{...}`)::

      [TOOL_CALLS] [{"name": "search", "arguments": {"query": "cats"}}]

- `openai` (the chat-completions message's `tool_calls`, `arguments` a JSON string or object)::

      {"tool_calls": [{"type": "function", "function": {"name": "search",
                                                        "arguments": "{\\"query\\": \\"cats\\"}"}}]}

Each parser also has `error_hint`, the format reminder appended to a parse error's message.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Protocol

JSON = dict[str, Any]


@dataclass(frozen=True)
class ToolCall:
    """A well-formed call: tool name and arguments (a dict; not yet checked against a schema)."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ToolCallError:
    """A call the agent attempted that cannot be run; `message` is shown to the agent."""

    message: str
    raw: str = ""
    name: str | None = None


ParsedItem = ToolCall | ToolCallError


class ToolCallParser(Protocol):
    """What `ToolEnv`/`ToolRunner` need from a tool-call format."""

    def parse(self, text: str) -> list[ParsedItem]:
        """Tool calls in `text`, in order; `[]` when the text makes no call."""

    def format_tools(self, schemas: list[JSON]) -> str:
        """System-prompt text that lists the tools and says how to call them."""

    def format_call(self, call: ToolCall) -> str:
        """The text an agent writes to make `call` (for scripted policies and examples)."""


def call_from_json(payload: str, raw: str = "") -> ParsedItem:
    """Decode one `{"name": ..., "arguments": ...}` object (see `call_from_obj`).

    `arguments` may be an object, a JSON string holding an object (parsed), or absent (`{}`);
    `parameters` is accepted as a synonym (Llama-style). Anything else is a `ToolCallError`.
    """
    try:
        obj = json.loads(payload)
    except json.JSONDecodeError as e:
        return ToolCallError(f"the tool call is not valid JSON ({e.msg} at character {e.pos})", raw)
    except RecursionError:  # "[[[[..." deeper than the interpreter's recursion limit
        return ToolCallError("the tool call's JSON is nested too deeply", raw)
    return call_from_obj(obj, raw)


def call_from_obj(obj: Any, raw: str = "") -> ParsedItem:
    """One decoded call object `{"name": str, "arguments" | "parameters": object | JSON string}`
    as a `ToolCall`, or a `ToolCallError` saying what is wrong with it (not an object, no
    name, arguments that are not an object)."""
    if not isinstance(obj, dict):
        return ToolCallError("the tool call must be a JSON object with \"name\" and \"arguments\"", raw)
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return ToolCallError("the tool call has no \"name\" string", raw)
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except RecursionError:
            return ToolCallError(f"the arguments of {name!r} are nested too deeply", raw, name)
        except json.JSONDecodeError as e:
            return ToolCallError(f"the arguments of {name!r} are a string that is not valid JSON "
                                 f"({e.msg} at character {e.pos})", raw, name)
    if args is None:
        args = {}
    if not isinstance(args, dict):
        kind = "an array" if isinstance(args, list) else f"a {type(args).__name__}"
        return ToolCallError(f"the arguments of {name!r} must be a JSON object of named "
                             f"arguments, got {kind}", raw, name)
    return ToolCall(name, args)


class HermesParser:
    """`<tool_call>{json}</tool_call>` blocks (Hermes, Qwen2.5, Qwen3).

    A `<tool_call>` without its closing tag (the generation was cut off) is an error item, so
    the turn is not mistaken for a final answer. Calls inside `<think>...</think>` (reasoning)
    are ignored.
    """

    name = "hermes"
    _block = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)
    error_hint = ('; write each call as <tool_call>{"name": <tool-name>, "arguments": {<name>: <value>, '
                  '...}}</tool_call>')

    def parse(self, text: str) -> list[ParsedItem]:
        items: list[ParsedItem] = []
        for m in self._block.finditer(strip_think(text)):
            body, closed = m.group(1).strip(), bool(m.group(2))
            if not closed:
                items.append(ToolCallError(
                    "the tool call is cut off (no closing </tool_call>)"
                    + ("" if _is_json(body) else "; its JSON is incomplete"), m.group(0)))
                break
            items.append(call_from_json(body, m.group(0)))
        return items

    def format_tools(self, schemas: list[JSON]) -> str:
        lines = "\n".join(json.dumps(s, ensure_ascii=False) for s in schemas)
        return ("# Tools\n\n"
                "You may call one or more functions to assist with the user query.\n\n"
                "You are provided with function signatures within <tools></tools> XML tags:\n"
                f"<tools>\n{lines}\n</tools>\n\n"
                "For each function call, return a json object with function name and arguments "
                "within <tool_call></tool_call> XML tags:\n"
                "<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n"
                "</tool_call>")

    def format_call(self, call: ToolCall) -> str:
        payload = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)
        return f"<tool_call>\n{payload}\n</tool_call>"


def _is_json(s: str) -> bool:
    try:
        json.loads(s)
    except (json.JSONDecodeError, RecursionError):
        return False
    return True


_THINK = re.compile(r"<think>.*?(</think>|$)", re.DOTALL)


def strip_think(text: str) -> str:
    """`text` without its `<think>...</think>` blocks (an unclosed one runs to the end): calls
    written while reasoning are not calls."""
    return _THINK.sub("", text)


def decode_values(text: str, seps: str = "") -> tuple[list[Any], str | None]:
    """The JSON values written one after another in `text` (whitespace, and any character of
    `seps`, between them), and an error message for the first one that does not decode (None
    when all do). Values decoded before the error are returned too."""
    dec = json.JSONDecoder()
    values: list[Any] = []
    i, n = 0, len(text)
    while True:
        while i < n and (text[i].isspace() or text[i] in seps):
            i += 1
        if i >= n:
            return values, None
        try:
            value, i = dec.raw_decode(text, i)
        except json.JSONDecodeError as e:
            return values, f"the tool call is not valid JSON ({e.msg} at character {e.pos})"
        except RecursionError:
            return values, "the tool call's JSON is nested too deeply"
        values.append(value)


def _calls_of(values: list[Any], raw: str) -> list[ParsedItem]:
    """Call items of decoded values: an object is one call, an array one call per element."""
    items: list[ParsedItem] = []
    for v in values:
        items.extend(call_from_obj(c, raw) for c in (v if isinstance(v, list) else [v]))
    return items


def _json_tools(schemas: list[JSON]) -> str:
    return "\n\n".join(json.dumps(s, ensure_ascii=False, indent=4) for s in schemas)


class Llama3JsonParser:
    """Llama-3.1/3.2 JSON tool calls: the whole message is `{"name": ..., "parameters": {...}}`
    (`"arguments"` is accepted too), or it follows `<|python_tag|>`; several calls are
    separated by `;` (or written as a JSON array).

    Without `<|python_tag|>` a message is a call only when it is JSON made of such objects
    (each with "name" and "parameters" or "arguments"), or when it starts as one and does not
    decode (`{"name": ...` cut off: an error item); any other message, JSON answers such as
    `{"name": "Paris"}` included, is an answer. After `<|python_tag|>` everything is call
    text: what does not decode to call objects (e.g. Llama's built-in
    `brave_search.call(query=...)` form) is an error item. A trailing `<|eom_id|>`/`<|eot_id|>`
    is ignored; calls inside `<think>...</think>` are too.
    """

    name = "llama3_json"
    PYTHON_TAG = "<|python_tag|>"
    _starts_as_call = re.compile(r'\s*\[?\s*\{\s*"name"\s*:')
    _end = re.compile(r"(\s*(<\|eom_id\|>|<\|eot_id\|>))+\s*$")
    error_hint = ('; write a call as the whole message: {"name": <tool-name>, "parameters": '
                  '{<name>: <value>, ...}} (several separated by ";")')

    def parse(self, text: str) -> list[ParsedItem]:
        text = self._end.sub("", strip_think(text))
        tagged = self.PYTHON_TAG in text
        payload = text.split(self.PYTHON_TAG, 1)[1] if tagged else text
        values, err = decode_values(payload, seps=";")
        if not tagged:
            if err is None and values and all(_is_call_value(v) for v in values):
                return _calls_of(values, payload.strip())
            if err is None or not self._starts_as_call.match(payload):
                return []  # prose, or JSON that is not a call: an answer
        if err is not None:
            return [ToolCallError(err, payload.strip())]
        if not values:
            return [ToolCallError("<|python_tag|> is followed by no tool call", text)]
        return _calls_of(values, payload.strip())

    def format_tools(self, schemas: list[JSON]) -> str:
        return ("You have access to the following functions. To call a function, respond with "
                "only a JSON object in the format "
                '{"name": function name, "parameters": dictionary of argument name and its value}. '
                "Do not use variables.\n\n" + _json_tools(schemas))

    def format_call(self, call: ToolCall) -> str:
        return json.dumps({"name": call.name, "parameters": call.arguments}, ensure_ascii=False)


def _is_call_value(v: Any) -> bool:
    """Is `v` a call object (a dict with "name" and "parameters"/"arguments") or a non-empty
    array of them?"""
    objs = v if isinstance(v, list) and v else [v]
    return all(isinstance(o, dict) and "name" in o and ("parameters" in o or "arguments" in o)
               for o in objs)


class MistralParser:
    """Mistral `[TOOL_CALLS]` calls: v0.3's `[TOOL_CALLS] [{"name": ..., "arguments": {...}},
    ...]` (a JSON array, or one object; an `"id"` key is ignored), and the later tokenizers'
    `[TOOL_CALLS]name[ARGS]{...}` (optionally `name[CALL_ID]id[ARGS]{...}`), one call per
    `[TOOL_CALLS]`. Text without `[TOOL_CALLS]` is an answer; text after it that does not
    decode is an error item. A trailing `</s>` is ignored, and calls inside
    `<think>...</think>`.
    """

    name = "mistral"
    TOKEN = "[TOOL_CALLS]"
    error_hint = ('; write the calls as [TOOL_CALLS] [{"name": <tool-name>, "arguments": '
                  '{<name>: <value>, ...}}, ...]')

    def parse(self, text: str) -> list[ParsedItem]:
        text = strip_think(text)
        items: list[ParsedItem] = []
        for seg in text.split(self.TOKEN)[1:]:
            seg = seg.strip().removesuffix("</s>").strip()
            if "[ARGS]" in seg:
                head, _, args = seg.partition("[ARGS]")
                values, err = decode_values(args)
                if err is not None or len(values) != 1:
                    items.append(ToolCallError(err or "the tool call's [ARGS] hold no single JSON object",
                                               seg, head.split("[CALL_ID]")[0].strip() or None))
                    continue
                items.append(call_from_obj({"name": head.split("[CALL_ID]")[0].strip(),
                                            "arguments": values[0]}, seg))
                continue
            values, err = decode_values(seg)
            if err is not None:
                items.append(ToolCallError(err, seg))
            elif not values:
                items.append(ToolCallError("[TOOL_CALLS] is followed by no tool call", seg))
            else:
                items.extend(_calls_of(values, seg))
        return items

    def format_tools(self, schemas: list[JSON]) -> str:
        return ("You can call the functions below. To call them, answer with [TOOL_CALLS] followed "
                'by a JSON array of calls: [TOOL_CALLS] [{"name": <function-name>, "arguments": '
                "<args-json-object>}, ...]\n\nFunctions:\n" + _json_tools(schemas))

    def format_call(self, call: ToolCall) -> str:
        payload = json.dumps([{"name": call.name, "arguments": call.arguments}], ensure_ascii=False)
        return f"{self.TOKEN} {payload}"


class OpenAIJsonParser:
    """OpenAI chat-completions JSON: `{"tool_calls": [{"id": ..., "type": "function",
    "function": {"name": ..., "arguments": "<JSON string>" | {...}}}, ...]}`, the object
    anywhere in the message (prose or a ```json fence around it is ignored). An element without
    `"function"` but with `"name"` is read as the call itself. `{"tool_calls": []}` and text
    without the object are answers; an object that does not decode, a `tool_calls` that is not
    an array, or a `type` other than `function` are error items. Calls inside
    `<think>...</think>` are ignored.
    """

    name = "openai"
    _start = re.compile(r'\{\s*"tool_calls"\s*:')
    error_hint = ('; write the calls as {"tool_calls": [{"type": "function", "function": {"name": '
                  '<tool-name>, "arguments": {<name>: <value>, ...}}}, ...]}')

    def parse(self, text: str) -> list[ParsedItem]:
        text = strip_think(text)
        m = self._start.search(text)
        if m is None:
            return []
        raw = text[m.start():]
        values, err = decode_values(raw)
        if not values:
            return [ToolCallError(err or "the tool call is not valid JSON", raw)]
        calls = values[0].get("tool_calls") if isinstance(values[0], dict) else None
        if not isinstance(calls, list):
            return [ToolCallError('"tool_calls" must be a JSON array of calls', raw)]
        return [self._one(c, raw) for c in calls]

    @staticmethod
    def _one(c: Any, raw: str) -> ParsedItem:
        if not isinstance(c, dict):
            return call_from_obj(c, raw)
        if c.get("type", "function") != "function":
            return ToolCallError(f"tool call type {c.get('type')!r} is not supported (only \"function\")", raw)
        fn = c.get("function", c)
        return call_from_obj(fn, raw)

    def format_tools(self, schemas: list[JSON]) -> str:
        return ("You can call the functions below. To call them, answer with only a JSON object: "
                '{"tool_calls": [{"type": "function", "function": {"name": <function-name>, '
                '"arguments": <args-json-string>}}, ...]}\n\nFunctions:\n' + _json_tools(schemas))

    def format_call(self, call: ToolCall) -> str:
        args = json.dumps(call.arguments, ensure_ascii=False)
        return json.dumps({"tool_calls": [{"type": "function", "function": {"name": call.name, "arguments": args}}]},
                          ensure_ascii=False)


#: name -> parser instance; `ToolEnv(parser="hermes")` looks names up here.
PARSERS: dict[str, ToolCallParser] = {"hermes": HermesParser(), "llama3_json": Llama3JsonParser(),
                                      "mistral": MistralParser(), "openai": OpenAIJsonParser()}


def get_parser(parser: str | ToolCallParser) -> ToolCallParser:
    """A parser by name (see `PARSERS`) or the instance itself.

    Raises:
        ValueError: unknown name, listing the known ones.
    """
    if not isinstance(parser, str):
        return parser
    try:
        return PARSERS[parser]
    except KeyError:
        raise ValueError(f"tool parser: unknown {parser!r}; known: {', '.join(sorted(PARSERS))}") from None


def parse_tool_calls(text: str, parser: str | ToolCallParser = "hermes") -> list[ParsedItem]:
    """Tool calls in `text` with the named parser (see `HermesParser.parse`)."""
    return get_parser(parser).parse(text)
