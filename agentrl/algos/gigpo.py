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
divisions. omega is `algo.step_weight` (paper: 1), gamma `algo.gamma` (`DEFAULTS`: the paper's
0.95 when the user did not set it).

The same advantages are an option of grpo, dr_grpo and cispo, `algo.turn_credit=gigpo`
(`grpo.advantages` calls `advantages` here): `--algo grpo algo.turn_credit=gigpo` is this
algorithm (same defaults, same run; `--algo gigpo` has `turn_credit=gigpo` always).

For single-turn episodes A^S_i0 = A^E_i up to the discount (all turn-0 states are the prompt),
so the advantage is (1 + omega) A^E.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from agentrl.algos import grpo
from agentrl.algos.advantages import GroupIds, expand_to_tokens, group_advantages, group_stats
from agentrl.algos.turns import turn_index

DEFAULTS = {"gamma": 0.95}
"""Feng et al. 2025, sec. 5.1 (discount of the step returns)."""

OPTIONS = ("turn_credit", "dual_clip", "tis_cap", "overlong_buffer", "mask_truncated")


def turn_states(input_ids: Tensor, loss_mask: Tensor) -> list[list[tuple[int, ...]]]:
    """The state of each turn: the ids of the context tokens just before it.

    Args:
        input_ids: (B, T) token ids.
        loss_mask: (B, T) 0/1.

    Returns:
        per row, one tuple per turn: `input_ids[b, e:s]` where s is the turn's first token and
        e the end of the previous turn (0 for the first turn).
    """
    m = (loss_mask != 0).tolist()
    ids = input_ids.tolist()
    out: list[list[tuple[int, ...]]] = []
    for row, mrow in zip(ids, m):
        states, prev_end, t = [], 0, 0
        while t < len(mrow):
            if mrow[t]:
                states.append(tuple(row[prev_end:t]))
                while t < len(mrow) and mrow[t]:
                    t += 1
                prev_end = t
            else:
                t += 1
        out.append(states)
    return out


def discounted_turn_returns(token_rewards: Tensor, loss_mask: Tensor, gamma: float) -> tuple[Tensor, Tensor]:
    """R_k = sum_{j >= k} gamma^(j - k) r_j over the turns of each row (r_j: the sum of turn j's
    rewards on its tokens; rewards at masked positions are ignored).

    Returns:
        (returns (B, K) float64, exists (B, K) bool); 0 where a row has no turn k.
    """
    turn = turn_index(loss_mask)
    b = loss_mask.shape[0]
    k_max = int(turn.max()) + 1 if turn.numel() and int(turn.max()) >= 0 else 0
    width = max(k_max, 1)
    m = turn >= 0
    r = torch.where(m, token_rewards.to(torch.float64), 0.0)
    per_turn = torch.zeros(b, width, dtype=torch.float64).scatter_add_(1, turn.clamp(min=0), r)
    counts = torch.zeros(b, width, dtype=torch.long).scatter_add_(1, turn.clamp(min=0), m.long())
    per_turn, exists = per_turn[:, :k_max], counts[:, :k_max] > 0
    ret = torch.zeros_like(per_turn)
    acc = torch.zeros(b, dtype=torch.float64)
    for k in range(k_max - 1, -1, -1):
        acc = torch.where(exists[:, k], per_turn[:, k] + gamma * acc, 0.0)
        ret[:, k] = acc
    return ret, exists


def step_advantages(input_ids: Tensor, token_rewards: Tensor, loss_mask: Tensor,
                    group_ids: GroupIds, *, gamma: float, scale: str = "std") -> Tensor:
    """(B, T) float32 step-level advantages A^S of each turn's tokens (0 off the mask): the
    discounted turn returns normalised within anchor groups (group id, state).

    Raises:
        ValueError: group_ids of another length than the batch.
    """
    gids = group_ids.tolist() if isinstance(group_ids, Tensor) else list(group_ids)
    if len(gids) != loss_mask.shape[0]:
        raise ValueError(f"group_ids has {len(gids)} entries, batch has {loss_mask.shape[0]} rows")
    returns, exists = discounted_turn_returns(token_rewards, loss_mask, gamma)
    if returns.shape[1] == 0:
        return torch.zeros(loss_mask.shape, dtype=torch.float32)
    states = turn_states(input_ids, loss_mask)
    rows, turns = exists.nonzero(as_tuple=True)
    keys = [(gids[r], states[r][k]) for r, k in zip(rows.tolist(), turns.tolist())]
    adv_turn = torch.zeros_like(returns)
    adv_turn[rows, turns] = group_advantages(returns[rows, turns], keys, scale=scale)
    turn = turn_index(loss_mask)
    adv = adv_turn.gather(1, turn.clamp(min=0))
    return torch.where(turn >= 0, adv, 0.0).to(torch.float32)


def advantages(batch: dict[str, Any], cfg: Any, *, scale: str | None = None
               ) -> tuple[torch.Tensor, dict[str, float]]:
    """A^E + step_weight * A^S on agent tokens.

    Args:
        batch: `scores` (B,) (NaN excluded), `group_ids` (B,), `input_ids`, `loss_mask`,
            `token_rewards` (B, T).
        cfg: AlgoConfig (`scale`, `gamma`, `step_weight`).
        scale: overrides `cfg.scale` ("std" | "none"; dr_grpo's `turn_credit=gigpo` passes
            "none").

    Returns:
        (B, T) advantages (0 off the mask) and the group metrics plus `step_adv_abs_mean`
        (mean |A^S| over agent tokens).
    """
    scale = scale or cfg.scale
    ep = expand_to_tokens(group_advantages(batch["scores"], batch["group_ids"], scale=scale),
                          batch["loss_mask"])
    step = step_advantages(batch["input_ids"], batch["token_rewards"], batch["loss_mask"],
                           batch["group_ids"], gamma=cfg.gamma, scale=scale)
    stats = group_stats(batch["scores"], batch["group_ids"])
    m = batch["loss_mask"] != 0
    stats["step_adv_abs_mean"] = float(step[m].abs().mean()) if bool(m.any()) else 0.0
    return ep.to(torch.float32) + cfg.step_weight * step, stats


#: GRPO's clipped surrogate (+ KL, - entropy) on the combined advantages
loss = grpo.loss
idle_zero_advantage_rows = grpo.idle_zero_advantage_rows
