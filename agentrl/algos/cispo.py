"""CISPO (MiniMax et al. 2025, "MiniMax-M1", arXiv 2506.13585, sec. 3.1): GRPO's
group-relative advantages with a clipped, stop-gradient importance weight on the
log-probability of every token instead of PPO's clipped surrogate.

    A_i   = (R_i - mean_group(R)) / (std_group(R) + eps)           (as GRPO; `scale`)
    r_t   = pi_theta(y_t) / pi_old(y_t)
    J     = E[ 1/sum_i |o_i| * sum_i sum_t sg(clip(r_t, 1 - eps_low, 1 + eps_high)) * A_i
               * log pi_theta(y_t) ]                                              (eq. 4-5)
    loss  = -J (aggregation `agg`; the paper's 1/sum|o_i| is `token-mean`)
            + kl_coef * KL(pi || pi_ref) (token-mean, `kl_kind`) - entropy_coef * H

PPO/GRPO zero the gradient of a token whose ratio left the clip range (after the first
off-policy step, often the rare "reflective" tokens); CISPO keeps every token's gradient and
only bounds its weight.

Defaults (`CISPOConfig`; a value the user set wins): `clip_low=1.0`, i.e. no
lower bound on the weight, as the paper ("we did not impose a lower bound on the IS weight by
setting eps_low^IS to a large value; instead, we only tuned eps_high^IS"). The paper does not
publish its eps_high; the global `clip_high=0.28` (DAPO's clip-higher) is kept, as Trinity-RFT's
CISPO does. With one optimizer step per batch (the default) r = 1 and CISPO is REINFORCE with
the group baseline; the weight matters with `update_epochs`/`minibatches` > 1 or a stale
(async) sampler.

Options: per-turn groups (`turn_advantages`), GiGPO's step-level credit (`turn_credit=gigpo`,
as grpo), truncated IS (`tis_cap`, `tis_level`,
`tis_mode`), the overlong shaping and masking of the training loop.
"""

from __future__ import annotations

from typing import Any

import torch

from agentrl.algos.common import kl_entropy_terms
from agentrl.algos.configs import CISPOConfig
from agentrl.algos.grpo import GRPO
from agentrl.algos.losses import cispo_policy_loss
from agentrl.algos.tis import tis_weights_of


class CISPO(GRPO):
    """GRPO's group-relative advantages (per episode, per turn, or GiGPO's step-level credit)
    and idle rows; CISPO's loss."""

    name = "cispo"
    config = CISPOConfig

    def loss(self, logp: torch.Tensor, batch: dict[str, Any], cfg: Any, *, num_tokens: float,
             num_seqs: int, entropy: torch.Tensor | None = None, **kw: Any
             ) -> tuple[torch.Tensor, dict[str, Any]]:
        """CISPO loss (+ KL to the reference, - entropy bonus) of one micro-batch.

        Args:
            logp: (B, T) current logprobs, with gradient.
            batch: `old_logprobs`, `advantages`, `loss_mask` (B, T); `tis_weights`, `max_len`,
                `ref_logprobs` when present.
            cfg: CISPOConfig (`clip_low`, `clip_high`, `agg`, `kl_coef`, `kl_kind`, `entropy_coef`).
            num_tokens, num_seqs: counts of the whole minibatch (case L2).

        Returns:
            (loss, metrics) as `losses.cispo_policy_loss` (+ `kl`).
        """
        pg, metrics = cispo_policy_loss(
            logp, batch["old_logprobs"], batch["advantages"], batch["loss_mask"],
            clip_low=cfg.clip_low, clip_high=cfg.clip_high, agg=cfg.agg, num_tokens=num_tokens,
            num_seqs=num_seqs, max_len=batch.get("max_len"), tis_weights=tis_weights_of(batch, cfg))
        extra, m = kl_entropy_terms(logp, batch, cfg, num_tokens=num_tokens, entropy=entropy)
        metrics.update(m)
        return pg + extra, metrics
