"""Per-token KL estimators between the policy and a frozen reference (Schulman 2020).

Pure function over tensors of any shape; reduce the result with `losses.aggregate` or
`losses.masked_mean` over the loss mask.
"""

from __future__ import annotations

import torch
from torch import Tensor

from agentrl.algos.advantages import _float_dtype
from agentrl.algos.losses import LOGRATIO_CLAMP


def kl(logp: Tensor, ref_logp: Tensor, kind: str) -> Tensor:
    """Per-token KL(pi || pi_ref) estimators for tokens sampled from pi (Schulman 2020).

    With d = ref_logp - logp (= log(pi_ref / pi)):
    - `k1` = -d (unbiased, high variance, can be negative);
    - `k2` = d^2 / 2 (biased, low variance, >= 0);
    - `k3` = exp(d) - d - 1 (unbiased, low variance, >= 0).
    Source: J. Schulman, "Approximating KL Divergence", 2020 (http://joschu.net/blog/kl-approx.html).

    Computed in float32 (bf16/fp16 upcast). Where both logprobs are -inf d is 0. For k3, d is
    clamped to [-20, 20] before use, so k3 is finite and >= 0 for every non-NaN input
    (its gradient is 0 beyond the clamp); k1 and k2 are not clamped (finite for finite input).
    NaN input gives NaN.

    Args:
        logp: (...) log pi(token) of the policy being trained.
        ref_logp: (...) log pi_ref(token) of the reference, same shape.
        kind: "k1", "k2" or "k3".

    Returns:
        (...) per-token estimate; reduce it with `aggregate` / `masked_mean`.

    Raises:
        ValueError: unknown kind or shape mismatch.
    """
    if kind not in ("k1", "k2", "k3"):
        raise ValueError(f"unknown KL estimator {kind!r}; allowed: k1, k2, k3")
    if logp.shape != ref_logp.shape:
        raise ValueError(f"logp {tuple(logp.shape)} and ref_logp {tuple(ref_logp.shape)} differ")
    dtype = _float_dtype(logp, ref_logp)
    lp, rp = logp.to(dtype), ref_logp.to(dtype)
    both_impossible = torch.isneginf(lp) & torch.isneginf(rp)
    d = torch.where(both_impossible, 0.0, rp - lp)
    if kind == "k1":
        return -d
    if kind == "k2":
        return 0.5 * d * d
    d = d.clamp(-LOGRATIO_CLAMP, LOGRATIO_CLAMP)
    return (torch.expm1(d) - d).clamp(min=0.0)  # clamp: a rounding guard only
