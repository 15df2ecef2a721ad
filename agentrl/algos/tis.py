"""Truncated importance sampling: weights correcting the sampler/learner mismatch (case L5).

`tis_weights` is the pure function over `(B, T)` tensors; `tis_weights_of` picks the weights a
loss multiplies in for a (micro-)batch from the algorithm's config (`tis_cap`, `tis_level`,
`tis_mode`).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from agentrl.algos.advantages import _check_2d as _check_same
from agentrl.algos.losses import _logratio


def tis_weights(
    learner_logp: Tensor,
    sampler_logp: Tensor,
    loss_mask: Tensor,
    *,
    cap: float,
    level: str = "token",
    mode: str = "truncate",
) -> Tensor:
    """Truncated importance-sampling weights correcting sampler/learner mismatch (case L5).

        token:    rho_t = exp(learner_t - sampler_t)
        sequence: rho_b = exp(sum_t M_bt * (learner_bt - sampler_bt)), on every agent token of
                  row b
        truncate: w = min(rho, cap)
        mask:     w = rho if rho <= cap else 0   (the token, or the whole row, drops out)

    `learner_logp` is log pi_old as recomputed by the trainer, `sampler_logp` what the
    inference engine reported for the same tokens. Source: Yao et al. 2025, "Your Efficient RL
    Framework Secretly Brings You Off-Policy RL Training" (truncated IS, Ionides 2008); masked
    IS: the IcePop mask of Ling Team 2025 ("Every Step Evolves", arXiv 2510.18855), upper bound
    only.

    The log-ratio is capped at log(cap) before exp, so weights are finite; they are detached.

    Args:
        learner_logp, sampler_logp: (B, T) per-token logprobs.
        loss_mask: (B, T) 0/1.
        cap: > 0, the truncation C.
        level: "token" or "sequence".
        mode: "truncate" or "mask".

    Returns:
        (B, T) float32 weights without gradient; 0 at masked positions.

    Raises:
        ValueError: cap <= 0, unknown level or mode, shape mismatch.
    """
    _check_same(loss_mask, learner_logp=learner_logp, sampler_logp=sampler_logp)
    if not cap > 0:
        raise ValueError(f"cap must be > 0, got {cap}")
    if level not in ("token", "sequence"):
        raise ValueError(f"level must be 'token' or 'sequence', got {level!r}")
    if mode not in ("truncate", "mask"):
        raise ValueError(f"mode must be 'truncate' or 'mask', got {mode!r}")
    m = loss_mask != 0
    with torch.no_grad():
        logratio = _logratio(learner_logp.detach(), sampler_logp, m)
        if level == "sequence":
            logratio = logratio.sum(dim=-1, keepdim=True).expand_as(logratio)
        w = torch.exp(logratio.clamp(max=math.log(cap)))
        if mode == "mask":
            w = torch.where(logratio > math.log(cap), 0.0, w)
        return torch.where(m, w, 0.0)


def tis_weights_of(batch: dict[str, Any], cfg: Any) -> Tensor | None:
    """The truncated importance weights a loss multiplies in, for a (micro-)batch: its
    `tis_weights` when it has them, else `tis_weights(old_logprobs, sampler_logprobs, loss_mask,
    cap=cfg.tis_cap, level=cfg.tis_level, mode=cfg.tis_mode)` when `cfg.tis_cap` is set and the
    batch has `sampler_logprobs`; else None. (B, T) float32 without gradient, or None."""
    if "tis_weights" in batch:
        return batch["tis_weights"]
    cap = getattr(cfg, "tis_cap", None)
    if cap is None or "sampler_logprobs" not in batch:
        return None
    return tis_weights(batch["old_logprobs"], batch["sampler_logprobs"], batch["loss_mask"], cap=cap,
                       level=getattr(cfg, "tis_level", "token"), mode=getattr(cfg, "tis_mode", "truncate"))
