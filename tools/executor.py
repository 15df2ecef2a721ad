"""Running the tool calls of one agent turn: parse, validate, execute with a timeout, and turn
every outcome (result or error) into a `{"role": "tool", ...}` message. Nothing raises.

`ToolRunner` is shared by the `ToolEnv` wrapper and envs that offer tools themselves (web_qa),
so that both count calls and errors the same way:

- `tool_calls`: call attempts this episode (well-formed or not; each counts against
  `max_tool_calls`);
- `tool_errors`: attempts that produced an error observation, by kind in `tool_error_kinds`:
  `parse` (cut-off/invalid JSON, arguments not an object), `unknown_tool`, `bad_arguments`,
  `tool_error` (the tool raised), `timeout`, `limit` (over `max_tool_calls`).
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from agentrl_tools.parser import ToolCall, ToolCallError, ToolCallParser, get_parser
from agentrl_tools.registry import Tool, ToolArgumentError, ToolError, ToolSet

Message = dict[str, Any]


class ToolTimeout(Exception):
    """A tool call ran past its time limit."""


def call_with_timeout(fn: Callable[..., Any], kwargs: dict[str, Any], timeout_s: float | None) -> Any:
    """`fn(**kwargs)` in a daemon thread, waiting at most `timeout_s` seconds.

    A daemon thread (not a pool worker) is used so that a call that never returns cannot block
    later calls or the interpreter's exit; it is abandoned, not killed (Python threads cannot be
    killed), so tools that can hang should also bound their own work (the python tool's sandbox
    and fetch's HTTP timeout do).

    Raises:
        ToolTimeout: the call did not finish in time.
        Exception: whatever `fn` raised.
    """
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn(**kwargs)
        except BaseException as e:  # noqa: BLE001 - reported to the caller below
            box["error"] = e

    t = threading.Thread(target=target, daemon=True, name=f"tool-{getattr(fn, '__name__', 'call')}")
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        raise ToolTimeout(f"timed out after {timeout_s:g} s")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def format_result(value: Any, max_chars: int) -> str:
    """A tool's return value as observation text: str as is, anything else as JSON; longer than
    `max_chars` characters is cut with a note of how much was dropped."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    if len(text) > max_chars:
        text = text[:max_chars] + f"\n[... {len(text) - max_chars} more characters truncated]"
    return text


@dataclass
class ToolTurn:
    """Outcome of a turn that made tool calls: the observations and this turn's counts."""

    messages: list[Message]
    n_calls: int
    errors: list[str] = field(default_factory=list)
    error_kinds: list[str] = field(default_factory=list)

    @property
    def n_errors(self) -> int:
        return len(self.errors)


class ToolRunner:
    """Parses a turn's tool calls and runs them, in order, with per-call timeouts.

    Args:
        tools: the tools offered (Tool objects or typed functions).
        parser: tool-call format, a name in `agentrl_tools.parser.PARSERS` or an instance.
        max_tool_calls: call attempts allowed per episode; later ones are refused, all of a
            turn's with one message telling the agent to answer.
        timeout_s: wall-clock limit per call, seconds (None: no limit).
        max_output_chars: observation text longer than this is truncated.

    Raises:
        ValueError: unknown parser, duplicate tool names, max_tool_calls < 0.
    """

    def __init__(self, tools: Iterable[Tool | Callable[..., Any]], *, parser: str | ToolCallParser = "hermes",
                 max_tool_calls: int = 8, timeout_s: float | None = 10.0, max_output_chars: int = 8000):
        if max_tool_calls < 0:
            raise ValueError(f"max_tool_calls must be >= 0, got {max_tool_calls}")
        self.tools = tools if isinstance(tools, ToolSet) else ToolSet(tools)
        self.parser = get_parser(parser)
        self.max_tool_calls = max_tool_calls
        self.timeout_s = timeout_s
        self.max_output_chars = max_output_chars
        self.reset()

    def reset(self) -> None:
        """Zero the episode counters."""
        self.n_calls = 0
        self.error_kinds: Counter[str] = Counter()

    def schemas(self) -> list[dict[str, Any]]:
        return self.tools.schemas()

    def system_prompt(self) -> str:
        """Tool list and calling convention for the system message."""
        return self.parser.format_tools(self.schemas())

    def stats(self) -> dict[str, Any]:
        """Episode counters for `info`: tool_calls, tool_errors, tool_error_kinds."""
        return {"tool_calls": self.n_calls, "tool_errors": sum(self.error_kinds.values()),
                "tool_error_kinds": dict(self.error_kinds)}

    def handle(self, text: str) -> ToolTurn | None:
        """Run the tool calls in `text`; None when it makes none (the text is an answer)."""
        try:
            items = self.parser.parse(text)
        except Exception as e:  # a buggy custom parser must not end the run
            items = [ToolCallError(f"the tool call could not be parsed ({type(e).__name__}: {e})")]
        if not items:
            return None
        turn = ToolTurn(messages=[], n_calls=len(items))
        allowed = max(0, min(len(items), self.max_tool_calls - self.n_calls))
        for item in items[:allowed]:
            self.n_calls += 1
            kind: str | None
            if isinstance(item, ToolCallError):
                content, kind = item.message + getattr(self.parser, "error_hint", ""), "parse"
            else:
                content, kind = self._run(item)
            msg: Message = {"role": "tool", "content": content if kind is None else f"Error: {content}"}
            if item.name:
                msg["name"] = item.name
            turn.messages.append(msg)
            if kind is not None:
                self.error_kinds[kind] += 1
                turn.errors.append(content)
                turn.error_kinds.append(kind)
        if allowed < len(items):
            self._refuse(turn, items[allowed:])
        return turn

    def _refuse(self, turn: ToolTurn, items: list[ToolCall | ToolCallError]) -> None:
        """The calls past `max_tool_calls`: each counts as a `limit` error, and all of them get
        ONE observation message (20,000 calls in a turn made 20,000 messages; issue 42)."""
        self.n_calls += len(items)
        content = (f"tool call limit reached ({self.max_tool_calls} per episode); "
                   "give your final answer without calling a tool")
        if len(items) > 1:
            content += f" ({len(items)} calls of this turn were not run)"
        msg: Message = {"role": "tool", "content": f"Error: {content}"}
        if len(items) == 1 and items[0].name:
            msg["name"] = items[0].name
        turn.messages.append(msg)
        self.error_kinds["limit"] += len(items)
        turn.errors.extend([content] * len(items))
        turn.error_kinds.extend(["limit"] * len(items))

    def _run(self, call: ToolCall) -> tuple[str, str | None]:
        """(observation text, error kind or None) of one well-formed call."""
        if call.name not in self.tools:
            return (f"unknown tool {call.name!r}; available tools: {', '.join(self.tools.names)}",
                    "unknown_tool")
        t = self.tools[call.name]
        try:
            kwargs = t.validate(call.arguments)
        except ToolArgumentError as e:
            return str(e), "bad_arguments"
        try:
            value = call_with_timeout(t.fn, kwargs, self.timeout_s)
        except ToolTimeout as e:
            return f"tool {call.name!r} {e}", "timeout"
        except ToolError as e:
            return str(e), "tool_error"
        except Exception as e:  # noqa: BLE001 - any tool failure is an observation
            return f"tool {call.name!r} failed: {type(e).__name__}: {e}", "tool_error"
        try:
            return format_result(value, self.max_output_chars), None
        except Exception as e:  # noqa: BLE001 - an unprintable result
            return f"tool {call.name!r} returned an unprintable result ({type(e).__name__})", "tool_error"


def add_system_text(messages: list[Message], text: str) -> list[Message]:
    """Messages with `text` appended to the system message (one is prepended if there is none)."""
    out = [dict(m) for m in messages]
    if out and out[0].get("role") == "system":
        out[0]["content"] = f"{out[0]['content']}\n\n{text}" if out[0]["content"] else text
    else:
        out.insert(0, {"role": "system", "content": text})
    return out
