"""Small pieces several algorithm modules share: dropping rows whose reward failed, the KL
penalty placed in the reward, and the KL / entropy terms added to a loss.

All tensors are `(B, T)` with a `loss_mask` of 0/1 (1 = agent-sampled token), as in
`advantages.py` and `losses.py`.
"""

from __future__ import annotations

from typing import Any

import torch

from agentrl.algos.kl import kl
from agentrl.algos.losses import aggregate, ppo_policy_loss
from agentrl.algos.tis import tis_weights_of


def drop_invalid_rows(batch: dict[str, Any]) -> int:
    """Zero the `loss_mask` of rows whose score is not finite (a failed reward, case R3, or an
    empty episode, case A9), in place, so they add nothing to any loss term (policy, value, KL,
    entropy). Needs `batch["scores"]` (B,); without it nothing changes.

    Returns:
        the number of rows dropped.
    """
    if "scores" not in batch:
        return 0
    ok = torch.isfinite(batch["scores"])
    batch["loss_mask"] = batch["loss_mask"] * ok[:, None].to(batch["loss_mask"].dtype)
    return int((~ok).sum())


def token_rewards(batch: dict[str, Any]) -> torch.Tensor:
    """(B, T) the env's per-token rewards (each turn's reward on its last sampled token), 0 off
    the loss mask and 0 where a reward is NaN (such rows are dropped by `drop_invalid_rows`)."""
    mask = batch["loss_mask"] != 0
    return torch.where(mask, batch["token_rewards"].float(), 0.0).nan_to_num(0.0)


def kl_penalty_rewards(batch: dict[str, Any], coef: float, kind: str = "k1") -> torch.Tensor:
    """(B, T) per-token KL shaping rewards `-coef * k_t` on agent tokens (0 elsewhere), k_t the
    estimator `kind` of `kl.kl` (`algo.kl_reward_kind`): k1_t = log pi_old(y_t) - log
    pi_ref(y_t) (the default), k2 or k3.

    The policy's logprobs are `batch["old_logprobs"]` (the weights that sampled the batch, as
    recomputed by the learner), the reference's `batch["ref_logprobs"]`. Summed over a
    sequence, k1 is the usual Monte-Carlo estimate of KL(pi || pi_ref) (Ziegler et al. 2019,
    eq. 2; Schulman 2020 for k1).

    Raises:
        KeyError: `old_logprobs` or `ref_logprobs` missing (the algorithm's `prepare` and the
            reference model provide them).
    """
    mask = batch["loss_mask"] != 0
    k = kl(batch["old_logprobs"], batch["ref_logprobs"], kind)
    return torch.where(mask, -coef * k, 0.0)


def sequence_kl(batch: dict[str, Any]) -> float:
    """Mean over non-empty rows of sum_t k1_t (old vs reference, nats per sequence); 0.0 when
    no row has an agent token."""
    mask = batch["loss_mask"] != 0
    k1 = torch.where(mask, kl(batch["old_logprobs"], batch["ref_logprobs"], "k1"), 0.0)
    rows = mask.any(dim=1)
    return float(k1.sum(dim=1)[rows].mean()) if bool(rows.any()) else 0.0


def kl_entropy_terms(logp: torch.Tensor, batch: dict[str, Any], cfg: Any, *, num_tokens: float,
                     entropy: torch.Tensor | None, kl_in_loss: bool = True
                     ) -> tuple[torch.Tensor, dict[str, float]]:
    """`kl_coef * KL(pi || pi_ref) - entropy_coef * H`, both token-means over the minibatch.

    The KL term (estimator `cfg.kl_kind`) is added when `kl_in_loss`, `cfg.kl_coef > 0` and
    `batch["ref_logprobs"]` is present; the entropy bonus when `entropy` is given and
    `cfg.entropy_coef > 0`.

    Args:
        logp: (B, T) current logprobs, with gradient.
        batch: the micro-batch (`loss_mask`, optionally `ref_logprobs`).
        cfg: the algorithm's config (`kl_coef`, `kl_kind`, `entropy_coef`).
        num_tokens: agent tokens of the whole minibatch (case L2).
        entropy: (B, T) per-token entropy, with gradient for a bonus, or None.

    Returns:
        (term, metrics): a scalar tensor (0 when neither applies) and `kl` when computed.
    """
    mask = batch["loss_mask"]
    total = logp.new_zeros(())
    metrics: dict[str, float] = {}
    if kl_in_loss and cfg.kl_coef > 0 and "ref_logprobs" in batch:
        kl_term = aggregate(kl(logp, batch["ref_logprobs"], cfg.kl_kind), mask, "token-mean",
                            num_tokens=num_tokens)
        total = total + cfg.kl_coef * kl_term
        metrics["kl"] = float(kl_term.detach())
    if entropy is not None and cfg.entropy_coef > 0:
        total = total - cfg.entropy_coef * aggregate(entropy, mask, "token-mean",
                                                     num_tokens=num_tokens)
    return total, metrics


def clipped_surrogate(logp: torch.Tensor, batch: dict[str, Any], cfg: Any, *, num_tokens: float,
                      num_seqs: int) -> tuple[torch.Tensor, dict[str, Any]]:
    """PPO's clipped surrogate of one micro-batch with the config's clips, aggregation and dual
    clip, weighted by the truncated importance weights (`tis_weights_of`) when `cfg.tis_cap` is
    set (`losses.ppo_policy_loss`). logp, `batch["old_logprobs"]`, `batch["advantages"]`,
    `batch["loss_mask"]`: (B, T); `batch["max_len"]`: the L_max of `seq-mean-token-sum-norm`.
    Returns the scalar loss and its metrics."""
    return ppo_policy_loss(
        logp, batch["old_logprobs"], batch["advantages"], batch["loss_mask"],
        clip_low=cfg.clip_low, clip_high=cfg.clip_high, agg=cfg.agg, num_tokens=num_tokens,
        num_seqs=num_seqs, max_len=batch.get("max_len"), tis_weights=tis_weights_of(batch, cfg),
        dual_clip=cfg.dual_clip)


def surrogate_loss_kl_in_reward(logp: torch.Tensor, batch: dict[str, Any], cfg: Any, *,
                                num_tokens: float, num_seqs: int,
                                entropy: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, Any]]:
    """Clipped surrogate (dual-clipped with `cfg.dual_clip`; - entropy bonus) of one
    micro-batch, for algorithms whose KL penalty is already in the reward (rloo, reinforce_pp). logp, `batch["old_logprobs"]`,
    `batch["advantages"]`, `batch["loss_mask"]` are (B, T); returns the scalar loss and metrics."""
    pg, metrics = clipped_surrogate(logp, batch, cfg, num_tokens=num_tokens, num_seqs=num_seqs)
    extra, m = kl_entropy_terms(logp, batch, cfg, num_tokens=num_tokens, entropy=entropy,
                                kl_in_loss=False)
    metrics.update(m)
    return pg + extra, metrics
