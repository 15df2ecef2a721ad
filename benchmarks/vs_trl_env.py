"""The benchmark's task: one-turn prompts 'Write about {topic} number {i}.' (the 64 prompts of
the TRL peer script), rewarded by the fraction of characters of the answer that are 'a'."""

from __future__ import annotations

from typing import Any

from agentrl.env.base import TextEnv

TOPICS = ["apple", "banana", "code", "python", "list", "string", "number", "cat",
          "data", "file", "word", "sum"]
N_PROMPTS = 64


def prompt_text(i: int) -> str:
    """Prompt i (0 <= i < 64) of the shared prompt set."""
    return f"Write about {TOPICS[i % len(TOPICS)]} number {i}."


def frac_a(text: str) -> float:
    """Reward: count('a') / len(text), 0.0 for an empty text. E.g. 'banana' -> 3/6 = 0.5."""
    return text.count("a") / max(1, len(text))


class FracAEnv(TextEnv):
    """Single turn: a user prompt from the shared set (picked by the reset seed), reward
    `frac_a(answer)`, then the episode ends."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        i = int(self.np_random.integers(N_PROMPTS))
        return [{"role": "user", "content": prompt_text(i)}], {"task_id": str(i)}

    def step(self, action: str):
        return [], frac_a(action), True, False, {}
