"""Entropy and log-probabilities from logits, in float32, as the sampler computes them."""

from __future__ import annotations

import torch
from torch import Tensor

from agentrl.algos.advantages import _float_dtype


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of softmax(logits) over the last dimension, numerically stable.

    H = -sum_v p_v log p_v with log p = logits - logsumexp(logits); entries with p = 0
    (logit -inf, e.g. a masked vocabulary entry) contribute 0, also to the gradient. Computed in
    float32 (bf16/fp16 upcast). Divide logits by the sampling temperature first if the entropy
    of the sampling distribution is wanted.

    Args:
        logits: (..., V).

    Returns:
        (...) entropy in nats.
    """
    x = logits.to(_float_dtype(logits))
    logp = torch.log_softmax(x, dim=-1)
    p = torch.exp(logp)
    safe_logp = torch.where(torch.isfinite(logp), logp, 0.0)
    return -(p * safe_logp).sum(dim=-1)


def logprobs_from_logits(logits: Tensor, token_ids: Tensor, *, temperature: float = 1.0) -> Tensor:
    """log softmax(logits / temperature)[token], as the sampler computes it (case L4).

    The engines report logprobs of `logits / temperature` over the full vocabulary (before
    top-p), so the trainer must use the same temperature or the PPO ratio is off by a constant
    factor even with unchanged weights.

    Args:
        logits: (..., V).
        token_ids: (...) long, the tokens whose logprobs are wanted.
        temperature: > 0.

    Returns:
        (...) float32 logprobs (float64 for float64 logits).

    Raises:
        ValueError: temperature <= 0 or shape mismatch.
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if logits.shape[:-1] != token_ids.shape:
        raise ValueError(
            f"logits {tuple(logits.shape)} do not match token_ids {tuple(token_ids.shape)}"
        )
    x = logits.to(_float_dtype(logits)) / temperature
    return torch.log_softmax(x, dim=-1).gather(-1, token_ids.unsqueeze(-1)).squeeze(-1)
