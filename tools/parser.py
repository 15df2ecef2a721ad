"""Parsing tool calls out of an agent's text, and rendering the tool list into a system prompt.

A parser turns one assistant turn into an ordered list of items, each a `ToolCall` (well formed)
or a `ToolCallError` (a call the agent tried to make but that cannot be run: cut-off JSON,
arguments that are not an object, ...). The order is the order in the text, so the observations
come back in the order the agent wrote the calls (case T3). An empty list means the turn contains
no tool call: it is the agent's answer.

Parsers are looked up by name in `PARSERS`; add one by implementing the `ToolCallParser`
protocol and putting an instance there.

Hermes/Qwen format (the one Qwen2.5/Qwen3 and Hermes chat templates emit)::

    <tool_call>
    {"name": "search", "arguments": {"query": "cats"}}
    </tool_call>
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
    """Decode one `{"name": ..., "arguments": ...}` object.

    `arguments` may be an object, a JSON string holding an object (parsed), or absent (`{}`);
    `parameters` is accepted as a synonym (Llama-style). Anything else is a `ToolCallError`.
    """
    try:
        obj = json.loads(payload)
    except json.JSONDecodeError as e:
        return ToolCallError(f"the tool call is not valid JSON ({e.msg} at character {e.pos})", raw)
    except RecursionError:  # "[[[[..." deeper than the interpreter's recursion limit
        return ToolCallError("the tool call's JSON is nested too deeply", raw)
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

    _think = re.compile(r"<think>.*?(</think>|$)", re.DOTALL)

    def parse(self, text: str) -> list[ParsedItem]:
        items: list[ParsedItem] = []
        for m in self._block.finditer(self._think.sub("", text)):
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


#: name -> parser instance; `ToolEnv(parser="hermes")` looks names up here.
PARSERS: dict[str, ToolCallParser] = {"hermes": HermesParser()}


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
