"""GRPO (Shao et al. 2024, DeepSeekMath) with the DAPO clip-higher (Yu et al. 2025) and the
Dr. GRPO preset (Liu et al. 2025: no std scaling, length-unbiased aggregation).

advantage_i = (R_i - mean_group(R)) / (std_group(R) + eps)   (std: unbiased; `scale="none"`
drops the division), broadcast onto the episode's agent tokens. The loss is the PPO clipped
surrogate with separate low/high clips, plus `kl_coef * KL(pi || pi_ref)` per token.

Options (keys of `GRPOConfig`; Dr. GRPO is the class `DrGRPO`, its config fixing the scale and the
aggregation):
- dual clip (`cfg.dual_clip`): negative-advantage tokens' loss bounded by -A * c;
- per-turn groups (`cfg.turn_advantages`): turn k of the episodes of a group is normalised against the other episodes' turn k (`turns.py`);
- GiGPO's step-level credit (`cfg.turn_credit="gigpo"`): the advantages of `gigpo.py`
  (episode + `step_weight` x anchor-state advantages), so `--algo grpo algo.turn_credit=gigpo`
  is `--algo gigpo`;
- dynamic sampling (`cfg.dynamic_sampling`, DAPO): groups without signal are dropped and the
  batch refilled by the training loop (`agentrl.algos.shaping.dynamic_sampling`);
- truncated importance sampling (`cfg.tis_cap`, `tis_level`, `tis_mode`): `tis.tis_weights_of`
  weighs the per-token loss here from the old and sampler logprobs;
- Dr. GRPO's L_max (`cfg.norm_len`): `Learner.update` passes it as `max_len`.
"""

from __future__ import annotations

from typing import Any

import torch

from agentrl.algos.advantages import expand_to_tokens, group_advantages, group_stats
from agentrl.algos.base import TokenLoss
from agentrl.algos.common import clipped_surrogate
from agentrl.algos.configs import DrGRPOConfig, GRPOConfig
from agentrl.algos.kl import kl
from agentrl.algos.losses import aggregate
from agentrl.algos.turns import gigpo_advantages, turn_group_advantages, turn_mask


class GRPO(TokenLoss):
    """Group-relative advantages and PPO's clipped surrogate (+ KL in the loss)."""

    name = "grpo"
    config = GRPOConfig

    def advantages(self, batch: dict[str, Any], cfg: Any) -> tuple[torch.Tensor, dict[str, float]]:
        """Group-relative advantages on agent tokens.

        Args:
            batch: needs `scores` (B,) episode returns (NaN = failed reward, excluded), `group_ids`
                (B,), `loss_mask` (B, T).
            cfg: GRPOConfig (`scale`; `turn_advantages`: per-turn groups, which also need
                `token_rewards` (B, T); `turn_credit="gigpo"`: `turns.gigpo_advantages`, which
                also needs `input_ids` and `token_rewards` (B, T) and reads `gamma`,
                `step_weight`); both read the turns from `sampled_mask` when overlong
                filtering left one (`turns.turn_mask`).

        Returns:
            advantages (B, T) (0 off the loss mask) and group metrics.
        """
        if cfg.turn_credit == "gigpo":
            return gigpo_advantages(batch, cfg, scale=cfg.scale)
        stats = group_stats(batch["scores"], batch["group_ids"])
        if cfg.turn_advantages:  # turns of overlong-filtered rows count in the turn groups
            adv = turn_group_advantages(batch["token_rewards"], turn_mask(batch),
                                        batch["group_ids"], scale=cfg.scale)
            return torch.where(batch["loss_mask"] != 0, adv, 0.0), stats
        adv = group_advantages(batch["scores"], batch["group_ids"], scale=cfg.scale)
        return expand_to_tokens(adv, batch["loss_mask"]), stats

    def turn_advantages(self, cfg: Any) -> bool:
        """Per-turn groups (`turn_advantages`) or GiGPO's step-level credit (`turn_credit`)."""
        return cfg.turn_advantages or cfg.turn_credit == "gigpo"

    def loss(self, logp: torch.Tensor, batch: dict[str, Any], cfg: Any, *, num_tokens: float,
             num_seqs: int, entropy: torch.Tensor | None = None, **kw: Any
             ) -> tuple[torch.Tensor, dict[str, Any]]:
        """Clipped surrogate (+ KL to the reference) of one micro-batch; logp/old_logprobs (B, T)."""
        mask = batch["loss_mask"]
        pg, metrics = clipped_surrogate(logp, batch, cfg, num_tokens=num_tokens, num_seqs=num_seqs)
        total = pg
        if cfg.kl_coef > 0 and "ref_logprobs" in batch:
            k = kl(logp, batch["ref_logprobs"], cfg.kl_kind)
            kl_term = aggregate(k, mask, "token-mean", num_tokens=num_tokens)
            total = total + cfg.kl_coef * kl_term
            metrics["kl"] = float(kl_term.detach())
        if entropy is not None and cfg.entropy_coef > 0:
            total = total - cfg.entropy_coef * aggregate(entropy, mask, "token-mean", num_tokens=num_tokens)
        return total, metrics

    def idle_zero_advantage_rows(self, cfg: Any) -> bool:
        """True when a row whose advantages are all 0 adds nothing to this loss or its gradient:
        no KL term in the loss (`kl_coef == 0`) and no entropy bonus; the learner then leaves
        such rows out of its forwards (`Learner(skip_zero_advantage=True)`)."""
        return cfg.kl_coef == 0 and cfg.entropy_coef == 0


class DrGRPO(GRPO):
    """The Dr. GRPO preset: `DrGRPOConfig` fixes `scale="none"` and
    `agg="seq-mean-token-sum-norm"`."""

    name = "dr_grpo"
    config = DrGRPOConfig
