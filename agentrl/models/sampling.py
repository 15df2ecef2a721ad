"""Per-row random streams and the token sampler of `HFEngine` (and its compiled decode tick).

`row_uniforms` gives each output row its own counter-based stream of uniform draws (so a row's
tokens do not depend on the other rows of a batch); `sample_next` turns a batch of next-token
logits and one draw per row into tokens and their sampler logprobs. Both are plain torch ops,
so `StaticDecoder.step_sample` can compile them into one graph with the decode step.
"""

from __future__ import annotations

import torch

_M64 = (1 << 64) - 1


def _int64(x: int) -> int:
    """The int64 with the same 64 bits as the unsigned `x mod 2**64`."""
    x &= _M64
    return x - (1 << 64) if x >= 1 << 63 else x


_GOLDEN = 0x9E3779B97F4A7C15  # splitmix64's increment, 2**64 / golden ratio
_MIX1 = _int64(0xBF58476D1CE4E5B9)
_MIX2 = _int64(0x94D049BB133111EB)
UNIFORM_BLOCK = 32
"""Decode steps whose uniforms `HFEngine` computes at once (one vectorised hash per block)."""


def row_uniforms(seeds: torch.Tensor, step: int | torch.Tensor) -> torch.Tensor:
    """Uniform draws in [0, 1) that are a pure function of (row seed, step): row b's draw at
    decode step `step` (0-based), whatever other rows are in the batch.

    SplitMix64 (Steele, Lea, Flood 2014, "Fast splittable pseudorandom number generators";
    Java's `SplittableRandom`), its output number `step` from state `seed`:

        z = seed + (step + 1) * 0x9E3779B97F4A7C15
        z = (z ^ (z >>> 30)) * 0xBF58476D1CE4E5B9
        z = (z ^ (z >>> 27)) * 0x94D049BB133111EB
        z = z ^ (z >>> 31)
        u = (z >>> 11) / 2**53          (the top 53 bits)

    with unsigned 64-bit arithmetic (mod 2**64) and `>>>` the logical right shift. Computed on
    int64 tensors: two's-complement addition and multiplication wrap to the same 64 bits as
    unsigned ones, and `>>` on int64 is arithmetic (sign-extending), so each `>>>` is `>>`
    followed by a mask of the low 64 - shift bits.

    Args:
        seeds: (B,) int64 row seeds (any 64-bit pattern).
        step: decode step, >= 0; or an int64 tensor of steps broadcastable with `seeds` (e.g.
            seeds (B, 1) and steps (1, S) give the (B, S) draws of S steps at once, the same
            values as S calls).

    Returns:
        float64 in [0, 1), multiples of 2**-53: (B,), or the broadcast shape of the tensors.
    """
    if isinstance(step, torch.Tensor):
        z = seeds + (step + 1) * _int64(_GOLDEN)
    else:
        z = seeds + _int64((step + 1) * _GOLDEN)
    z = (z ^ ((z >> 30) & ((1 << 34) - 1))) * _MIX1
    z = (z ^ ((z >> 27) & ((1 << 37) - 1))) * _MIX2
    z = z ^ ((z >> 31) & ((1 << 33) - 1))
    return ((z >> 11) & ((1 << 53) - 1)).to(torch.float64) / float(1 << 53)


def sample_next(
    logits: torch.Tensor,
    temperature: float,
    top_p: float,
    uniform: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row and return it with its sampler logprob.

    Inverse-CDF sampling: row b takes the first token whose cumulative probability exceeds
    `uniform[b] * total` (`searchsorted` on the cumulative sum over the vocabulary, in id
    order; over probability-sorted tokens with top-p). This is several times faster than
    `torch.multinomial` on CPU, exact up to float32 rounding of the cumulative sum, and lets
    the caller give each row its own random stream. A zero-probability token is never returned
    (the scaled draw is capped just below the total).

    Args:
        logits: (B, V) float32 next-token logits.
        temperature: 0 = greedy (argmax, logprob under T = 1); else logits are divided by it.
        top_p: nucleus mass: sample among the most likely tokens whose cumulative probability
            (under `logits / T`) first reaches `top_p`, the token that crosses it included
            (Holtzman et al. 2020, "The Curious Case of Neural Text Degeneration").
        uniform: (B,) draws from U[0, 1), one per row (may be None when greedy).

    Returns:
        `(tokens, logprobs)`, both (B,): int64 ids and float32 `log_softmax(logits / T)` at
        them over the full vocabulary (before top-p).
    """
    if temperature == 0:
        tokens = logits.argmax(dim=-1)
        logp = logits.log_softmax(dim=-1)
        return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)
    if uniform is None:
        raise ValueError("sampling with temperature > 0 needs `uniform` draws")
    z = logits / temperature if temperature != 1.0 else logits
    m = z.amax(dim=-1, keepdim=True)
    e = torch.exp(z - m)  # unnormalised probabilities, max 1
    order = None
    if top_p < 1.0:
        probs, order = (e / e.sum(dim=-1, keepdim=True)).sort(dim=-1, descending=True)
        mass_before = probs.cumsum(dim=-1) - probs
        probs = probs.masked_fill(mass_before >= top_p, 0.0)
    else:
        probs = e
    cdf = probs.cumsum(dim=-1)  # unnormalised: the draw is scaled by the total instead
    top = cdf[:, -1:]
    # u * total can round up to total: capping it at the largest float below the total makes the
    # first cdf entry above it exist and exceed the entry before it, so the token picked has
    # probability > 0 (no branch on the data, which `torch.compile` keeps in one graph).
    u = torch.minimum(uniform.to(cdf.dtype)[:, None] * top, torch.nextafter(top, torch.zeros_like(top)))
    # The clamp only matters for non-finite logits (NaN compares false: the search runs off the
    # end); the caller sees their NaN logprob instead of an index error.
    picks = torch.searchsorted(cdf, u, right=True).clamp_(max=cdf.shape[-1] - 1)
    tokens = (order.gather(-1, picks) if order is not None else picks).squeeze(-1)
    # log_softmax(z) at the token: z - max - log(sum exp(z - max))
    total = top.squeeze(-1) if order is None else e.sum(dim=-1)
    logp = z.gather(-1, tokens[:, None]).squeeze(-1) - m.squeeze(-1) - total.log()
    return tokens, logp
