"""The inference-engine interface that the HF (CPU) and vLLM engines implement.

Engines are token-in, token-out: they take prompt token ids and return the sampled ids with
the sampler's logprob of each, computed from `logits / temperature` over the full vocabulary
(before top-p filtering), which is what the learner recomputes (case L4).

Seeded calls give every output row its own seed (`row_seeds`), a function of the call's seed, the
row's prompt ids and how many identical prompts came before it in the call (plus, when the call
is one shard of a larger batch, how many came before it in the earlier shards:
`SamplingParams.seed_offsets`); both engines draw a row's random numbers from its seed alone, so
a row samples the same tokens whatever other rows share the call (in-process or split over
rollout workers).
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence
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
    seed_offsets: per prompt, how many rows with the same ids count before this call's for
        `row_seeds` (None: none). A rollout worker running one shard of a batch passes the
        earlier shards' counts, so that its rows get the seeds of one call over the batch.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 256
    stop_token_ids: list[int] = field(default_factory=list)
    n: int = 1
    seed: int | None = None
    seed_offsets: list[int] | None = None


@dataclass
class Completion:
    """One sampled completion: `token_ids` (stop token included), `logprobs` (same length,
    natural log, under `logits / temperature`), `finish_reason` ("stop" | "length"), and
    `versions`: the policy version that sampled each token (same length), or None when the
    engine does not say (the caller then takes the version it held before the call). Equality
    compares the sample (ids, logprobs, finish reason), not the versions."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    versions: list[int] | None = field(default=None, compare=False)


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


def prompt_key(ids: Sequence[int]) -> bytes:
    """The identity of a prompt for counting repeats: its ids as int64 bytes."""
    return array("q", ids).tobytes()


def row_seeds(prompts: Sequence[Sequence[int]], n: int, seed: int | None,
              offsets: Sequence[int] | None = None) -> list[int | None]:
    """Per-row sampler seeds for `len(prompts) * n` rows (prompt-major), independent of batching.

    Row (i, j) gets `blake2b(seed, k, ids of prompt i) mod 2**63`, where k counts the earlier rows
    of the call with the same prompt ids, plus `offsets[i]` (so the n samples of a prompt, and
    repeated prompts of a group, all differ). Two calls that contain the same prompt at the same
    occurrence give it the same seed, whatever else they contain; so one batch split into calls
    gives every row the seed of the whole batch in one call when each call's `offsets` count the
    prompt's rows in the calls before it.

    Returns:
        `len(prompts) * n` seeds in [0, 2**63), or all None when `seed` is None.

    Raises:
        ValueError: `offsets` of another length than `prompts`, or negative.
    """
    if offsets is not None and (len(offsets) != len(prompts) or min(offsets, default=0) < 0):
        raise ValueError(f"offsets: need {len(prompts)} counts >= 0 (one per prompt), got {list(offsets)[:8]}")
    if seed is None:
        return [None] * (len(prompts) * n)
    seen: dict[bytes, int] = {}
    out: list[int | None] = []
    for i, p in enumerate(prompts):
        key = prompt_key(p)
        for _ in range(n):
            k = seen.get(key, 0)
            seen[key] = k + 1
            k += 0 if offsets is None else int(offsets[i])
            h = hashlib.blake2b(digest_size=8)
            h.update(int(seed).to_bytes(16, "little", signed=True))
            h.update(k.to_bytes(8, "little"))
            h.update(key)
            out.append(int.from_bytes(h.digest(), "little") & (2**63 - 1))
    return out
