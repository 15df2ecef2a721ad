"""GiGPO (Feng et al. 2025, "Group-in-Group Policy Optimization for LLM Agent Training",
arXiv 2505.10978): GRPO's episode-level group advantage plus a step-level advantage from
*anchor states*, states that recur across the episodes of a group.

For the episodes i of a group (the same task, `group_id`), each with turns k = 0, 1, ...:

    A^E_i   = (R_i - mean_group(R)) / (std_group(R) + eps)                     (sec. 4.1)
    R_ik    = sum_{j >= k} gamma^(j-k) r_ij     the discounted return from turn k (turn rewards)
    A^S_ik  = (R_ik - mean_{anchor}(R)) / (std_{anchor}(R) + eps)               (sec. 4.2)
              over the turns (i', k') of the group whose state equals that of (i, k)
    A_ik    = A^E_i + omega * A^S_ik          on every token of turn k of episode i   (eq. 9)
    loss    = clipped surrogate of A (as GRPO) + kl_coef * KL(pi || pi_ref) - entropy_coef * H

The state of turn k is what the agent saw last before it: the token ids of the context span
between turn k-1 and turn k (for k = 0 the prompt, shared by the whole group, so turn 0 always
forms one anchor group). Token ids are compared exactly (contract 1: observations are rendered
alone and appended, so an equal observation is equal ids). A state seen once, or whose returns
are all equal, gives A^S = 0 (as a singleton or flat GRPO group). `scale="none"` drops both std
divisions. omega is `algo.step_weight` (paper: 1), gamma `algo.gamma` (`GiGPOConfig`'s default:
the paper's 0.95).

The same advantages are an option of grpo, dr_grpo and cispo, `algo.turn_credit=gigpo`
(`GRPO.advantages` calls `turns.gigpo_advantages`, which is `GiGPO.advantages`; the code lives
in `turns.py`): `--algo grpo algo.turn_credit=gigpo` is this
algorithm (same defaults, same run; `--algo gigpo` has `turn_credit=gigpo` always).

For single-turn episodes A^S_i0 = A^E_i exactly (all turn-0 states are the prompt, and one
turn's return is its reward), so the advantage is (1 + omega) A^E.

Rows whose loss mask overlong filtering zeroed (`algo.mask_truncated`) keep their turns in the
anchor groups (`turns.turn_mask`), as their returns stay in A^E's group; DAPO's dynamic
sampling keeps a group whose returns are equal when its A^S is not all 0
(`shaping.flat_groups`). The reference implementation is verl-agent's `core_gigpo.py`
(`compute_gigpo_outcome_advantage`); it differs from this on a group with one valid episode
(there A^E = R; here 0, as every GRPO group). Hand-computed cases: tests/algos/test_gigpo_credit.py
and tests/algos/test_algorithm_options.py.
"""

from __future__ import annotations

from typing import Any

import torch

from agentrl.algos.configs import GiGPOConfig
from agentrl.algos.grpo import GRPO
from agentrl.algos.turns import gigpo_advantages


class GiGPO(GRPO):
    """A^E + step_weight * A^S (`turns.gigpo_advantages`); GRPO's clipped surrogate (+ KL,
    - entropy) on the combined advantages."""

    name = "gigpo"
    config = GiGPOConfig

    def advantages(self, batch: dict[str, Any], cfg: Any) -> tuple[torch.Tensor, dict[str, float]]:
        """Episode + step-level (anchor-state) advantages on agent tokens (`turns.gigpo_advantages`:
        needs `scores`, `group_ids` (B,), `input_ids`, `token_rewards`, `loss_mask` (B, T))."""
        return gigpo_advantages(batch, cfg)

    def turn_advantages(self, cfg: Any) -> bool:
        """Always: the step-level advantages read the turns' rewards."""
        return True
