"""A scripted policy behind the engine interface: answers come from a Python function instead
of a model. Used for scripted-policy tests of envs and masks, and by the evaluation harness to
feed reference solutions through exactly the path a model's answers take.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agentrl.models.tokens import encode_continuation
from agentrl.rollout.engines.base import Completion, SamplingParams


class ScriptedEngine:
    """Engine whose completions are `policy(prompt_ids) -> str`, tokenized as text that follows
    the prompt (`encode_continuation`: what a model emits after its generation prompt, no "▁" of
    a SentencePiece-style tokenizer's text start) and closed with the
    first stop token of the request (finish reason "stop"), each token with logprob 0.0.

    Args:
        tokenizer: the tokenizer that encodes the answers.
        policy: maps a prompt (token ids) to the answer text; may keep its own state.
    """

    def __init__(self, tokenizer: Any, policy: Callable[[list[int]], str]):
        self.tokenizer = tokenizer
        self.policy = policy
        self.policy_version = 0

    accepts_images = True
    """Images (`images=`) are accepted and ignored: the policy sees the prompt ids only."""

    def generate(self, prompts: list[list[int]], params: SamplingParams,
                 images: Any = None) -> list[Completion]:
        out = []
        for p in prompts:
            for _ in range(params.n):
                ids = encode_continuation(self.tokenizer, self.policy(p))
                if params.stop_token_ids and len(ids) < params.max_tokens:
                    ids, finish = ids + [params.stop_token_ids[0]], "stop"
                else:
                    ids, finish = ids[: params.max_tokens], "length"
                out.append(Completion(ids, [0.0] * len(ids), finish))
        return out

    def update_weights(self, state_dict: dict[str, Any], version: int) -> None:
        self.policy_version = version
