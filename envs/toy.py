"""`toy`: a trivially learnable single-turn env for learning tests and demos.

The user asks the agent to say one word from `WORDS`; the reward is 1.0 when the answer
contains that word (case-insensitive, as a whole word), else 0.0. One turn, then `terminated`.
"""

from __future__ import annotations

import re
from typing import Any

from agentrl.env.base import TextEnv

WORDS = ("apple", "river", "stone", "cloud")


class ToyEnv(TextEnv):
    """Say the target word. Args: `words`: the vocabulary targets are drawn from."""

    def __init__(self, words: tuple[str, ...] | list[str] = WORDS):
        if not words:
            raise ValueError("words: need at least one target word")
        self.words = tuple(words)
        self.target: str | None = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        options = options or {}
        self.target = str(options.get("task") or self.words[int(self.np_random.integers(len(self.words)))])
        obs = [{"role": "user", "content": f"Say the word {self.target}."}]
        return obs, {"task_id": f"toy/{self.target}"}

    def reference_answer(self) -> str | None:
        """The ideal answer (for a supervised warm start)."""
        return self.target

    def step(self, action: str):
        if self.target is None:
            raise RuntimeError("ToyEnv: call reset() before step()")
        text = action if isinstance(action, str) else ""
        hit = re.search(rf"\b{re.escape(self.target)}\b", text, re.I) is not None
        info = {"task_id": f"toy/{self.target}", "success": hit}
        if not isinstance(action, str):
            info["error"] = f"action must be a str, got {type(action).__name__}"
        return [], float(hit), True, False, info
