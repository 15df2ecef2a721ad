"""Turn-level group advantages for multi-turn episodes (an option of the group algorithms).

A *turn* is a maximal run of agent tokens (`loss_mask` 1) of a row: the sampled span of one
assistant message, its end-of-turn token included. Two turns are always separated by context
tokens (template glue, the observation, the next generation prompt), which have mask 0.

With per-turn groups, turn k of every episode in a GRPO group forms its own group: its
"reward" is the return-to-go from turn k (the sum of the rewards of turns k, k+1, ...; each
turn's reward sits on its last sampled token), normalised against the turn-k returns of the
other episodes of the group that reached turn k. Later rewards still flow back to earlier turns
(the return-to-go is not reset at observations); what changes is the baseline: episodes are
compared turn by turn instead of as wholes. A single-turn episode gets exactly its GRPO
advantage.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from agentrl.algos.advantages import GroupIds, expand_to_tokens, group_advantages, group_stats


def turn_mask(batch: dict[str, Any]) -> Tensor:
    """(B, T): the mask the turns of a batch are read from: `batch["sampled_mask"]` (every
    sampled token, kept by overlong filtering, `shaping.mask_length_truncated`, before it
    zeroed rows of `loss_mask`) when present, else `batch["loss_mask"]`. Turn-level statistics
    count a filtered row's turns as the episode statistics count its return; its advantages
    are then zeroed by the loss mask."""
    return batch.get("sampled_mask", batch["loss_mask"])


def turn_index(loss_mask: Tensor) -> Tensor:
    """(B, T) long: the 0-based index of the turn each agent token belongs to, -1 elsewhere.

    Example: mask [[0,1,1,0,0,1,0]] -> [[-1,0,0,-1,-1,1,-1]].

    Raises:
        ValueError: loss_mask not (B, T).
    """
    if loss_mask.dim() != 2:
        raise ValueError(f"loss_mask must be (B, T), got shape {tuple(loss_mask.shape)}")
    m = loss_mask != 0
    prev = torch.cat([torch.zeros_like(m[:, :1]), m[:, :-1]], dim=1)
    starts = m & ~prev
    return torch.where(m, torch.cumsum(starts.long(), dim=1) - 1, -1)


def turn_returns(token_rewards: Tensor, loss_mask: Tensor) -> tuple[Tensor, Tensor]:
    """Per-turn undiscounted return-to-go.

    Args:
        token_rewards: (B, T) rewards; those at masked positions are ignored; a NaN reward of a
            turn makes the returns of that turn and all earlier turns NaN (excluded later).
        loss_mask: (B, T) 0/1.

    Returns:
        (returns (B, K), exists (B, K) bool), K = the most turns of any row (0 if none):
        returns[b, k] = sum of the rewards of turns k.. of row b; exists marks real turns
        (returns are 0 where not).
    """
    turn = turn_index(loss_mask)
    b = loss_mask.shape[0]
    k_max = max(int(turn.max()) + 1, 0) if turn.numel() else 0
    m = turn >= 0
    idx = turn.clamp(min=0)
    r = torch.where(m, token_rewards.to(torch.float64), 0.0)
    width = max(k_max, 1)  # scatter needs a slot for index 0 even when no row has a turn
    per_turn = torch.zeros(b, width, dtype=torch.float64, device=r.device).scatter_add_(1, idx, r)
    counts = torch.zeros(b, width, dtype=torch.long, device=r.device).scatter_add_(1, idx, m.long())
    per_turn, exists = per_turn[:, :k_max], counts[:, :k_max] > 0
    returns = per_turn.flip(1).cumsum(1).flip(1)
    return torch.where(exists, returns, 0.0), exists


def turn_group_advantages(token_rewards: Tensor, loss_mask: Tensor, group_ids: GroupIds, *,
                          scale: str = "std", eps: float = 1e-6) -> Tensor:
    """Group-relative advantages computed per turn, broadcast onto each turn's tokens.

    Turn k of the episodes of group g forms the group (g, k); within it the returns-to-go of
    `turn_returns` are normalised with `group_advantages` (mean-centred, divided by the
    unbiased std + eps when `scale="std"`; NaN returns excluded and given 0; constant or
    singleton groups give exactly 0).

    Args:
        token_rewards: (B, T) per-token rewards (`batch["token_rewards"]`).
        loss_mask: (B, T) 0/1.
        group_ids: (B,) tensor or sequence of hashables.
        scale: "std" or "none".
        eps: added to the std.

    Returns:
        (B, T) float32 advantages, 0 on masked tokens, without gradient.

    Raises:
        ValueError: shape mismatch or unknown scale.
    """
    if token_rewards.shape != loss_mask.shape:
        raise ValueError(f"token_rewards {tuple(token_rewards.shape)} != loss_mask "
                         f"{tuple(loss_mask.shape)}")
    returns, exists = turn_returns(token_rewards, loss_mask)
    gids = group_ids.tolist() if isinstance(group_ids, Tensor) else list(group_ids)
    if len(gids) != loss_mask.shape[0]:
        raise ValueError(f"group_ids has {len(gids)} entries, batch has {loss_mask.shape[0]} rows")
    rows, turns = exists.nonzero(as_tuple=True)
    adv_turn = torch.zeros_like(returns)
    if rows.numel():
        keys = [(gids[r], k) for r, k in zip(rows.tolist(), turns.tolist())]
        adv_turn[rows, turns] = group_advantages(returns[rows, turns], keys, scale=scale, eps=eps)
    turn = turn_index(loss_mask)
    if adv_turn.shape[1] == 0:
        return torch.zeros(loss_mask.shape, dtype=torch.float32, device=loss_mask.device)
    adv = adv_turn.gather(1, turn.clamp(min=0))
    return torch.where(turn >= 0, adv, 0.0).to(torch.float32)


# -- GiGPO's step-level credit (agentrl/algos/gigpo.py has the formulas and sources) -----------
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

    Raises:
        ValueError: gamma outside [0, 1].
    """
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
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
    return _step_advantages(input_ids, token_rewards, loss_mask, group_ids, gamma=gamma, scale=scale)[0]


def anchor_stats(keys: list[tuple[Any, ...]], turns: list[int]) -> dict[str, float]:
    """How much step-level credit the anchor groups can give (verl-agent logs the mean step
    group size): `step_group_size_mean`, the mean over turns of the number of turns in the
    turn's anchor group (1: a state nobody else reached, so A^S = 0), and
    `later_turns_anchored_frac`, the share of turns after the first (k >= 1: repairs on
    code_repair) whose anchor group has another turn (absent when there is none).

    Args:
        keys: one anchor key (group id, state) per turn.
        turns: each turn's index in its episode (0 for the first), aligned with `keys`.
    """
    if not keys:
        return {}
    size: dict[Any, int] = {}
    for k in keys:
        size[k] = size.get(k, 0) + 1
    out = {"step_group_size_mean": sum(size[k] for k in keys) / len(keys)}
    later = [size[k] > 1 for k, t in zip(keys, turns) if t >= 1]
    if later:
        out["later_turns_anchored_frac"] = sum(later) / len(later)
    return out


def _step_advantages(input_ids: Tensor, token_rewards: Tensor, loss_mask: Tensor, group_ids: GroupIds, *,
                     gamma: float, scale: str = "std") -> tuple[Tensor, dict[str, float]]:
    """`step_advantages` and the `anchor_stats` of its anchor groups."""
    gids = group_ids.tolist() if isinstance(group_ids, Tensor) else list(group_ids)
    if len(gids) != loss_mask.shape[0]:
        raise ValueError(f"group_ids has {len(gids)} entries, batch has {loss_mask.shape[0]} rows")
    returns, exists = discounted_turn_returns(token_rewards, loss_mask, gamma)
    if returns.shape[1] == 0:
        return torch.zeros(loss_mask.shape, dtype=torch.float32), {}
    states = turn_states(input_ids, loss_mask)
    rows, turns = exists.nonzero(as_tuple=True)
    keys = [(gids[r], states[r][k]) for r, k in zip(rows.tolist(), turns.tolist())]
    adv_turn = torch.zeros_like(returns)
    adv_turn[rows, turns] = group_advantages(returns[rows, turns], keys, scale=scale)
    turn = turn_index(loss_mask)
    adv = adv_turn.gather(1, turn.clamp(min=0))
    return torch.where(turn >= 0, adv, 0.0).to(torch.float32), anchor_stats(keys, turns.tolist())


def gigpo_advantages(batch: dict[str, Any], cfg: Any, *, scale: str | None = None
               ) -> tuple[torch.Tensor, dict[str, float]]:
    """GiGPO's advantages (`agentrl.algos.gigpo`): A^E + step_weight * A^S on agent tokens.

    Args:
        batch: `scores` (B,) (NaN excluded), `group_ids` (B,), `input_ids`, `loss_mask`,
            `token_rewards` (B, T); `sampled_mask` (B, T) when overlong filtering zeroed rows
            (`turn_mask`: their turns still count in the anchor groups).
        cfg: AlgoConfig (`scale`, `gamma`, `step_weight`).
        scale: overrides `cfg.scale` ("std" | "none"; dr_grpo's `turn_credit=gigpo` passes
            "none").

    Returns:
        (B, T) advantages (0 off the mask) and the group metrics plus `step_adv_abs_mean`
        (mean |A^S| over agent tokens) and `anchor_stats` (`step_group_size_mean`,
        `later_turns_anchored_frac`).
    """
    scale = scale or cfg.scale
    m = batch["loss_mask"] != 0
    ep = expand_to_tokens(group_advantages(batch["scores"], batch["group_ids"], scale=scale), m)
    step, anchors = _step_advantages(batch["input_ids"], batch["token_rewards"], turn_mask(batch),
                                     batch["group_ids"], gamma=cfg.gamma, scale=scale)
    step = torch.where(m, step, 0.0)
    stats = {**group_stats(batch["scores"], batch["group_ids"]), **anchors}
    stats["step_adv_abs_mean"] = float(step[m].abs().mean()) if bool(m.any()) else 0.0
    return ep.to(torch.float32) + cfg.step_weight * step, stats
