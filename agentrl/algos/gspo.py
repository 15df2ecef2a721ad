"""GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization"): GRPO's group-relative
advantages with a *sequence-level* importance ratio.

    A_i  = (R_i - mean_group(R)) / (std_group(R) + eps)          (as GRPO; `scale="none"`: no std)
    s_i  = exp( mean over the agent tokens of row i of (logp - old_logp) )
    loss = mean_i max(-A_i s_i, -A_i clip(s_i, 1 - clip_low, 1 + clip_high))    (eq. 5-7)
         + kl_coef * KL(pi || pi_ref) (token-mean, estimator `kl_kind`) - entropy_coef * H

Clip ranges. s_i is a length-normalised ratio, so it moves far less than a token ratio; the
paper clips it to [1 - 3e-4, 1 + 4e-4]: `GSPOConfig`'s defaults of `clip_low` and `clip_high`
(explicit values are kept). With the default single optimizer
step per batch the ratio is exactly 1 and no clip binds; the paper splits each batch into 4
minibatches (`algo.minibatches=4`), where the small ranges matter.

Truncated importance sampling (`tis_cap`) is not supported: the per-token TIS weights have no
place in a one-term-per-sequence loss; `GSPOConfig` has no such key (the schema refuses it).
"""

from __future__ import annotations

from typing import Any

import torch

from agentrl.algos.advantages import expand_to_tokens, group_advantages, group_stats
from agentrl.algos.base import PolicyGradient
from agentrl.algos.common import kl_entropy_terms
from agentrl.algos.configs import GSPOConfig
from agentrl.algos.losses import gspo_policy_loss


class GSPO(PolicyGradient):
    """Group-relative advantages, a sequence-level clipped ratio. No per-token options: TIS and
    the dual clip have no place in a one-term-per-sequence loss, per-turn groups none in a
    sequence ratio (`GSPOConfig` has none of their keys)."""

    name = "gspo"
    config = GSPOConfig

    def advantages(self, batch: dict[str, Any], cfg: Any) -> tuple[torch.Tensor, dict[str, float]]:
        """Group-relative advantages (as GRPO), broadcast onto agent tokens.

        Args:
            batch: `scores` (B,) (NaN excluded), `group_ids` (B,), `loss_mask` (B, T).
            cfg: GSPOConfig (`scale`).

        Returns:
            (B, T) advantages, 0 off the loss mask, and group metrics.
        """
        adv = group_advantages(batch["scores"], batch["group_ids"], scale=cfg.scale)
        stats = group_stats(batch["scores"], batch["group_ids"])
        return expand_to_tokens(adv, batch["loss_mask"]), stats

    def loss(self, logp: torch.Tensor, batch: dict[str, Any], cfg: Any, *, num_tokens: float,
             num_seqs: int, entropy: torch.Tensor | None = None, **kw: Any
             ) -> tuple[torch.Tensor, dict[str, Any]]:
        """Sequence-level clipped surrogate (+ KL, - entropy bonus) of one micro-batch.

        Args:
            logp: (B, T) current logprobs; `batch["old_logprobs"]`, `batch["advantages"]` (B, T).
            num_seqs: sequences of the whole minibatch: each sequence's term is divided by it, so
                micro-batch losses add up to the minibatch mean (rows without agent tokens count).
            num_tokens: agent tokens of the minibatch (for the KL and entropy token-means).

        Returns:
            (loss, metrics) with `clipfrac` (fraction of sequences clipped), `ratio_*`, `approx_kl`.
        """
        mask = batch["loss_mask"]
        pg, metrics = gspo_policy_loss(logp, batch["old_logprobs"], batch["advantages"], mask,
                                       clip_low=cfg.clip_low, clip_high=cfg.clip_high,
                                       num_seqs=num_seqs)
        extra, m = kl_entropy_terms(logp, batch, cfg, num_tokens=num_tokens, entropy=entropy)
        metrics.update(m)
        return pg + extra, metrics

    def idle_zero_advantage_rows(self, cfg: Any) -> bool:
        """True when a row whose advantages are all 0 adds nothing to this loss or its gradient:
        no KL term in the loss (`kl_coef == 0`) and no entropy bonus."""
        return cfg.kl_coef == 0 and cfg.entropy_coef == 0
