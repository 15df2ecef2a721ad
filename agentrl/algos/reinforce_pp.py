"""REINFORCE++ (Hu 2025, "REINFORCE++: A Simple and Efficient Approach for Aligning Large
Language Models"): no critic, no group baseline; a token-level KL penalty in the reward,
discounted returns, and advantages normalised over the whole batch.

    r_t  = env reward on the last token of each turn  - kl_coef * k1_t     (every agent token)
           k1_t = log pi_old(y_t) - log pi_ref(y_t)   (`kl_reward_kind`: k2 or k3 instead)
    G_t  = r_t + gamma * G_{t+1}       over the row's agent tokens (observations are skipped,
                                       not episode boundaries; `reward_to_go`, cases A7, A8)
    A_t  = (G_t - mean(G)) / std(G)    over every agent token of the batch (`whiten`)
    loss = PPO clipped surrogate of A_t (aggregation `agg`) - entropy_coef * H

The KL is only in the reward, never in the loss. Rows whose reward failed (NaN score) or that
sampled nothing are dropped from the loss mask first, so they neither get a return nor shift
the batch statistics. `gamma` is `algo.gamma` (default 1).
"""

from __future__ import annotations

from typing import Any

import torch

from agentrl.algos.advantages import reward_to_go, whiten
from agentrl.algos.common import drop_invalid_rows, kl_penalty_rewards, sequence_kl, token_rewards
from agentrl.algos.configs import ReinforcePPConfig
from agentrl.algos.losses import masked_mean
from agentrl.algos.rloo import RLOO


def returns(batch: dict[str, Any], cfg: Any) -> torch.Tensor:
    """(B, T) discounted return-to-go of the KL-shaped per-token rewards (0 off the mask).

    Needs `token_rewards`, `loss_mask`, and with `cfg.kl_coef > 0` `old_logprobs` and
    `ref_logprobs`.
    """
    rewards = token_rewards(batch)
    if cfg.kl_coef > 0:
        rewards = rewards + kl_penalty_rewards(batch, cfg.kl_coef, cfg.kl_reward_kind)
    return reward_to_go(rewards, batch["loss_mask"], cfg.gamma)


class ReinforcePP(RLOO):
    """Batch-whitened discounted returns; RLOO's loss (the KL penalty in the reward)."""

    name = "reinforce_pp"
    config = ReinforcePPConfig

    def prepare(self, batch: dict[str, Any], learner: Any, cfg: Any) -> tuple[dict[str, Any], dict]:
        """Drop rows with a failed reward from the loss mask; with `kl_coef > 0` add
        `old_logprobs` (learner logprobs of the sampling weights) for the KL reward."""
        dropped = drop_invalid_rows(batch)
        if cfg.kl_coef > 0:
            batch["old_logprobs"] = learner.logprobs(batch)
        return batch, {"dropped_rows": dropped}

    def advantages(self, batch: dict[str, Any], cfg: Any) -> tuple[torch.Tensor, dict[str, float]]:
        """Batch-whitened returns-to-go.

        Returns:
            (B, T) advantages (0 off the mask; unchanged returns when the batch has fewer than
            two agent tokens, case A5) and metrics `return_mean`, `return_std` (+ `kl`, nats per
            sequence).
        """
        mask = batch["loss_mask"]
        ret = returns(batch, cfg)
        valid = mask != 0
        stats = {"return_mean": float(masked_mean(ret, mask)),
                 "return_std": float(ret[valid].std()) if int(valid.sum()) > 1 else 0.0}
        if cfg.kl_coef > 0:
            stats["kl"] = sequence_kl(batch)
        return whiten(ret, mask), stats
