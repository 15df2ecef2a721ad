"""`ToolEnv`: give any text env tool use.

Each agent turn is parsed for tool calls. A turn with calls is answered by the tool results
(`{"role": "tool", ...}` messages, in call order) with reward `-(tool_call_penalty * calls +
tool_error_penalty * errors)` and `terminated=False`; the inner env does not see it. A turn
without a call goes to the inner env's `step` unchanged (it is the agent's answer).

Turn limits: a Gymnasium `TimeLimit` *inside* the wrapper (e.g. the one `gym.make` adds for a
registered `max_turns`) counts only answer turns; wrap the ToolEnv in `TimeLimit` to count every
turn, tool turns included.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import gymnasium as gym

from agentrl_tools.executor import ToolRunner, add_system_text
from agentrl_tools.parser import ToolCallParser
from agentrl_tools.registry import Tool


def tool_info(runner: ToolRunner, tools_in_prompt: bool) -> dict[str, Any]:
    """Reset-info entries describing the tools: `tools_in_prompt`, and `tools` (the
    OpenAI-style schemas, which the agent loop passes to the chat template as `tools=`) only
    when the schemas are *not* already in the system message, so that a template that renders
    tools (Qwen's, the embedded model's) never lists them twice.
    """
    info: dict[str, Any] = {"tools_in_prompt": tools_in_prompt}
    if not tools_in_prompt:
        info["tools"] = runner.schemas()
    return info


class ToolEnv(gym.Wrapper):
    """Wrap a text env so that the agent can call tools before answering.

    Args:
        env: the inner text env (its `step` receives the agent's answer turns).
        tools: Tool objects or typed functions (see `agentrl_tools.registry.tool`).
        parser: tool-call format, a name in `agentrl_tools.parser.PARSERS` or an instance.
        max_tool_calls: call attempts allowed per episode; beyond it each call is answered with
            an error telling the agent to answer without tools.
        timeout_s: wall-clock limit per tool call, seconds.
        tool_call_penalty: reward subtracted per call attempt (>= 0).
        tool_error_penalty: reward subtracted per failed call (>= 0).
        tools_in_prompt: list the tools in the system message, in the tool-call format's own
            layout (`parser.format_tools`: for hermes the text Qwen's template renders). When False they are exposed as `info["tools"]`
            for the chat template instead.
        max_output_chars: tool output longer than this is truncated.

    Info (every step): `tool_calls`, `tool_errors`, `tool_error_kinds` (episode totals);
    on a tool turn also `step_tool_calls`, `step_tool_errors` and, when a call failed,
    `error` (the first failure's message).

    Raises:
        ValueError: negative penalties, or see `ToolRunner`.
    """

    def __init__(self, env: gym.Env, tools: Iterable[Tool | Callable[..., Any]], *,
                 parser: str | ToolCallParser = "hermes", max_tool_calls: int = 8,
                 timeout_s: float | None = 10.0, tool_call_penalty: float = 0.0,
                 tool_error_penalty: float = 0.0, tools_in_prompt: bool = True,
                 max_output_chars: int = 8000):
        super().__init__(env)
        if tool_call_penalty < 0 or tool_error_penalty < 0:
            raise ValueError("tool_call_penalty and tool_error_penalty must be >= 0")
        self.runner = ToolRunner(tools, parser=parser, max_tool_calls=max_tool_calls,
                                 timeout_s=timeout_s, max_output_chars=max_output_chars)
        self.tool_call_penalty = tool_call_penalty
        self.tool_error_penalty = tool_error_penalty
        self.tools_in_prompt = tools_in_prompt

    def tool_schemas(self) -> list[dict[str, Any]]:
        """OpenAI-style schemas of the offered tools."""
        return self.runner.schemas()

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        messages, info = self.env.reset(seed=seed, options=options)
        self.runner.reset()
        if self.tools_in_prompt:
            messages = add_system_text(messages, self.runner.system_prompt())
        return messages, {**info, **tool_info(self.runner, self.tools_in_prompt)}

    def step(self, action: str):
        turn = self.runner.handle(action)
        if turn is None:
            messages, reward, terminated, truncated, inner_info = self.env.step(action)
            return messages, reward, terminated, truncated, {**inner_info, **self.runner.stats()}
        reward = 0.0 - (self.tool_call_penalty * turn.n_calls + self.tool_error_penalty * turn.n_errors)
        info: dict[str, Any] = {**self.runner.stats(), "step_tool_calls": turn.n_calls,
                                "step_tool_errors": turn.n_errors}
        if turn.errors:
            info["error"] = turn.errors[0]
        return turn.messages, float(reward), False, False, info
