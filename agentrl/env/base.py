"""Text environments: a `gymnasium.Env` whose actions are the agent's text and whose
observations are chat messages, and registration through Gymnasium's own registry.

Contract (docs/design.md):
- `reset(seed=None, options=None) -> (messages, info)`: the opening messages
  (`[{"role": "system"|"user", "content": str | parts}, ...]`; parts are text and image parts,
  `ChatMessages`). `options={"task": ...}` picks a task.
- `step(action: str) -> (messages, reward, terminated, truncated, info)`: `messages` are the new
  messages that follow the agent's turn (a `user` feedback or `tool` results; `[]` when the
  episode ends). `reward` is the scalar reward of that agent turn.
- A step never raises for bad agent output: errors become `info["error"]` with a penalty.

Registration: `agentrl.env.registry`; content checks: `agentrl.env.content`.
"""

from __future__ import annotations

import string
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from agentrl.env.content import content_error
from agentrl.types import Message


class ChatMessages(spaces.Space):
    """Observation space: a list of chat messages, each a dict with str `role` and `content`.

    `content` is a str, or a list of parts as in the OpenAI / Hugging Face chat formats:
    `{"type": "text", "text": str}` and `{"type": "image", "image": img}`, where `img` is a
    PIL image or an `(H, W, 3)` uint8 numpy array (`is_image`). `contains` is False for any
    other shape of content; `content_error` says what is wrong.
    """

    ROLES = ("system", "user", "assistant", "tool")

    def __init__(self, seed: int | None = None):
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def sample(self, mask: Any = None, probability: Any = None) -> list[Message]:
        n = int(self.np_random.integers(1, 3))
        return [{"role": "user", "content": f"message {int(self.np_random.integers(1e6))}"} for _ in range(n)]

    def contains(self, x: Any) -> bool:
        return isinstance(x, list) and all(
            isinstance(m, dict) and m.get("role") in self.ROLES and content_error(m.get("content")) is None
            for m in x
        )

    def __repr__(self) -> str:
        return "ChatMessages()"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, ChatMessages)


class AgentText(spaces.Space):
    """Action space: any str of at most `max_length` characters; samples random printable text."""

    def __init__(self, max_length: int = 100_000, seed: int | None = None):
        self.max_length = max_length
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        chars = np.array(list(string.printable))
        n = int(self.np_random.integers(0, 64))
        return "".join(self.np_random.choice(chars, size=n))

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"AgentText({self.max_length})"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, AgentText) and other.max_length == self.max_length


class TextEnv(gym.Env):
    """Base class of agentrl's text environments.

    Subclasses implement `reset` and `step` (Gymnasium signatures, str actions, message-list
    observations). Use `self.np_random` (seeded by `super().reset(seed=seed)`) for every random
    choice, never the global `random` (case G1). Put `info["task_id"]` in the reset info.
    """

    metadata: dict[str, Any] = {"render_modes": []}
    observation_space = ChatMessages()
    action_space = AgentText()

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        return [], {}


# -- env state in checkpoints ---------------------------------------------------------------------
def env_state(env: Any) -> dict[str, Any] | None:
    """The state a checkpoint keeps for `env` (wrappers allowed): its unwrapped env's
    `state_dict()` (JSON-able, e.g. `self_propose`'s task buffer), or None when it has none.
    The training loop stores it as `env_state` in the checkpoint's `agentrl_state.json`."""
    fn = getattr(getattr(env, "unwrapped", env), "state_dict", None)
    return fn() if callable(fn) else None


def load_env_state(env: Any, state: dict[str, Any]) -> None:
    """Restore `env_state(env)`'s `state` into `env` (on resume).

    Raises:
        ValueError: the env has no `load_state_dict` (the checkpoint came from another env).
    """
    fn = getattr(getattr(env, "unwrapped", env), "load_state_dict", None)
    if not callable(fn):
        raise ValueError(f"checkpoint has env_state but env {type(env).__name__} cannot load it "
                         "(no load_state_dict): was it written by another env?")
    fn(state)
