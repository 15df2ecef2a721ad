"""The inference-engine interface that the HF (CPU) and vLLM engines implement.

Engines are token-in, token-out: they take prompt token ids and return the sampled ids with
the sampler's logprob of each, computed from `logits / temperature` over the full vocabulary
(before top-p filtering), which is what the learner recomputes (case L4).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class SamplingParams:
    """Sampling settings for one `generate` call.

    temperature: softmax temperature; 0 means greedy (logprobs then use temperature 1).
    top_p: nucleus sampling mass in (0, 1].
    max_tokens: most new tokens per completion.
    stop_token_ids: ids that end a completion; the stop token is included in the output.
    n: completions per prompt (outputs are prompt-major: prompt 0's n first).
    seed: seed of this call's sampler, for reproducibility (None: engine state).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 256
    stop_token_ids: list[int] = field(default_factory=list)
    n: int = 1
    seed: int | None = None


@dataclass
class Completion:
    """One sampled completion: `token_ids` (stop token included), `logprobs` (same length,
    natural log, under `logits / temperature`), `finish_reason` ("stop" | "length")."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str


class Engine(Protocol):
    """What the agent loop needs from an inference engine."""

    policy_version: int

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        """Sample `params.n` completions for each prompt (token ids); returns
        `len(prompts) * params.n` completions, prompt-major."""
        ...

    def update_weights(self, state_dict: dict[str, Any], version: int) -> None:
        """Load new policy weights (a full state dict of tensors) and set `policy_version`."""
        ...
