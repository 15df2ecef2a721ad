"""RLOO (Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style Optimization for
Learning from Human Feedback in LLMs"): REINFORCE with a leave-one-out baseline over the k
samples of a prompt.

    R_i  = score_i - kl_coef * sum_t k1_t           (KL to the reference in the reward, eq. 1;
                                                    k1_t = log pi_old(y_t) - log pi_ref(y_t);
                                                    `kl_reward_kind` picks k2 or k3 instead)
    A_i  = R_i - mean_{j != i in group} R_j          (eq. 6; = n/(n-1) (R_i - mean_group R))
    loss = clipped surrogate of A_i on every agent token (aggregation `agg`) - entropy_coef * H

The paper's loss is plain REINFORCE, -A_i log pi(y_i). With one optimizer step per batch (the
default) the clipped surrogate's ratio is 1 and its gradient is exactly REINFORCE's (spread
over tokens by `agg`); with several epochs or minibatches the clip acts as a trust region, as
in TRL's and OpenRLHF's RLOO. Failed rewards (NaN) and groups without signal give 0.
"""

from __future__ import annotations

from typing import Any

import torch

from agentrl.algos.advantages import expand_to_tokens, group_stats, rloo_advantages
from agentrl.algos.base import TokenLoss
from agentrl.algos.common import kl_penalty_rewards, sequence_kl, surrogate_loss_kl_in_reward
from agentrl.algos.configs import RLOOConfig


class RLOO(TokenLoss):
    """Leave-one-out baseline; the KL penalty in the reward."""

    name = "rloo"
    config = RLOOConfig

    def prepare(self, batch: dict[str, Any], learner: Any, cfg: Any) -> tuple[dict[str, Any], dict]:
        """With `kl_coef > 0`: `batch["old_logprobs"]` (learner logprobs of the sampling weights),
        needed for the KL in the reward (the reference logprobs follow from the training loop)."""
        if cfg.kl_coef > 0:
            batch["old_logprobs"] = learner.logprobs(batch)
        return batch, {}

    def advantages(self, batch: dict[str, Any], cfg: Any) -> tuple[torch.Tensor, dict[str, float]]:
        """Leave-one-out advantages on agent tokens.

        Args:
            batch: `scores` (B,) (NaN = failed, excluded), `group_ids` (B,), `loss_mask` (B, T);
                with `cfg.kl_coef > 0` also `old_logprobs` and `ref_logprobs` (B, T).
            cfg: RLOOConfig (`kl_coef`, `kl_reward_kind`).

        Returns:
            (B, T) advantages (0 off the mask) and group metrics (+ `kl`, nats per sequence).
        """
        scores = batch["scores"].to(torch.float64)
        stats = group_stats(batch["scores"], batch["group_ids"])
        if cfg.kl_coef > 0:
            scores = scores + kl_penalty_rewards(batch, cfg.kl_coef, cfg.kl_reward_kind).sum(
                dim=1).to(torch.float64)
            stats["kl"] = sequence_kl(batch)
        adv = rloo_advantages(scores, batch["group_ids"]).to(torch.float32)
        return expand_to_tokens(adv, batch["loss_mask"]), stats

    def loss(self, logp: torch.Tensor, batch: dict[str, Any], cfg: Any, *, num_tokens: float,
             num_seqs: int, entropy: torch.Tensor | None = None, **kw: Any
             ) -> tuple[torch.Tensor, dict[str, Any]]:
        """Clipped surrogate (- entropy bonus); the KL penalty is already in the reward."""
        return surrogate_loss_kl_in_reward(logp, batch, cfg, num_tokens=num_tokens,
                                           num_seqs=num_seqs, entropy=entropy)

    def idle_zero_advantage_rows(self, cfg: Any) -> bool:
        """True when a row whose advantages are all 0 adds nothing to this loss or its gradient:
        the KL penalty is in the reward (so in the advantages), so only an entropy bonus would."""
        return cfg.entropy_coef == 0
