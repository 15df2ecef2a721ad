"""Advantages and returns: pure functions over `(B, T)` tensors and a `loss_mask`.

Conventions (see docs/algorithms.md for the formulas and their sources):

- `B` rows (episodes), `T` token positions. `loss_mask[b, t] != 0` marks a token the policy
  sampled; only those tokens are time steps. Prompt, tool/env observation and padding tokens
  carry no reward, consume no discount step, and their values are never read.
- A reward sits on the last sampled token of the turn that earned it (contract 4 of
  docs/design.md). Rewards found at masked positions are ignored (so padding never adds to a
  return, case A8).
- Every per-token output is 0 where `loss_mask` is 0, and no output carries gradient.
- Group statistics use the unbiased (n - 1) standard deviation; a non-finite reward (NaN from a
  failed reward function) is excluded from its group's statistics and gets advantage 0.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "gae",
    "reward_to_go",
    "group_advantages",
    "group_stats",
    "zero_variance_mask",
    "rloo_advantages",
    "whiten",
    "expand_to_tokens",
    "outcome_token_rewards",
]

GroupIds = Tensor | Sequence[Hashable]


# -- helpers ---------------------------------------------------------------------------------
def _float_dtype(*xs: Tensor) -> torch.dtype:
    """float32, or float64 when any input is float64 (bf16/fp16 are upcast)."""
    return torch.float64 if any(x.dtype == torch.float64 for x in xs) else torch.float32


def _check_2d(loss_mask: Tensor, **tensors: Tensor) -> None:
    if loss_mask.dim() != 2:
        raise ValueError(f"loss_mask must be (B, T), got shape {tuple(loss_mask.shape)}")
    for name, x in tensors.items():
        if x.shape != loss_mask.shape:
            raise ValueError(
                f"{name} has shape {tuple(x.shape)}, loss_mask has {tuple(loss_mask.shape)}"
            )


def _check_unit(name: str, x: float) -> None:
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {x}")


def _compact(mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Permutation that moves each row's agent tokens to the front, order kept.

    Returns `(idx, mask_c, n)`: `x.gather(1, idx)` is the compacted row, `mask_c` is True on its
    first `n[b]` slots, `n` (B,) counts agent tokens per row.
    """
    keys = (~mask).to(torch.int8)
    idx = torch.sort(keys, dim=1, stable=True).indices
    n = mask.sum(dim=1)
    mask_c = torch.arange(mask.shape[1], device=mask.device)[None, :] < n[:, None]
    return idx, mask_c, n


def _scatter_back(x_c: Tensor, idx: Tensor) -> Tensor:
    return torch.zeros_like(x_c).scatter_(1, idx, x_c)


def _bootstrap(value: Tensor | float | None, b: int, like: Tensor) -> Tensor:
    if value is None:
        return torch.zeros(b, dtype=like.dtype, device=like.device)
    if isinstance(value, Tensor):
        if value.shape not in ((b,), ()):
            raise ValueError(f"bootstrap_value must have shape ({b},), got {tuple(value.shape)}")
        return value.detach().to(like.dtype).to(like.device).expand(b)
    return torch.full((b,), float(value), dtype=like.dtype, device=like.device)


# -- token-level returns ---------------------------------------------------------------------
def gae(
    rewards: Tensor,
    values: Tensor,
    loss_mask: Tensor,
    gamma: float,
    lam: float,
    *,
    bootstrap_value: Tensor | float | None = None,
) -> tuple[Tensor, Tensor]:
    """Generalized advantage estimation over the agent's tokens only.

    The agent tokens of a row, in order, are the time steps t = 0..n-1 (observation spans
    between turns are skipped, not treated as episode boundaries):

        delta_t = r_t + gamma * V_{t+1} - V_t
        A_t     = delta_t + gamma * lam * A_{t+1}
        R_t     = A_t + V_t                      (the value target)

    where V_{t+1} of the last agent token is `bootstrap_value` (0 for a terminated episode,
    V(s_T) for a truncated one, case A11). Source: Schulman et al. 2016, "High-Dimensional
    Continuous Control Using Generalized Advantage Estimation", eq. 16.

    Args:
        rewards: (B, T) per-token rewards; those at masked positions are ignored.
        values: (B, T) V(s_t) per token; read only where `loss_mask` is 1 (any value, even NaN,
            elsewhere gives the same result).
        loss_mask: (B, T) 0/1, 1 on agent-sampled tokens.
        gamma: discount per agent token, in [0, 1].
        lam: GAE lambda, in [0, 1].
        bootstrap_value: (B,) tensor, a float, or None (= 0): the value after each row's last
            agent token.

    Returns:
        (advantages, returns), both (B, T), float32 (float64 if an input is float64), 0 at
        masked positions, without gradient. A row with no agent token is all zeros.

    Raises:
        ValueError: on shape mismatch, or gamma/lam outside [0, 1].
    """
    _check_2d(loss_mask, rewards=rewards, values=values)
    _check_unit("gamma", gamma)
    _check_unit("lam", lam)
    dtype = _float_dtype(rewards, values)
    b, t_len = loss_mask.shape
    mask = loss_mask.detach() != 0
    idx, mask_c, n = _compact(mask)
    r_c = torch.where(mask_c, rewards.detach().to(dtype).gather(1, idx), 0.0)
    v_c = torch.where(mask_c, values.detach().to(dtype).gather(1, idx), 0.0)
    boot = _bootstrap(bootstrap_value, b, v_c)

    pos = torch.arange(t_len, device=loss_mask.device)[None, :]
    v_next = torch.cat([v_c[:, 1:], torch.zeros_like(v_c[:, :1])], dim=1)
    v_next = torch.where(pos == (n - 1)[:, None], boot[:, None], v_next)
    delta = torch.where(mask_c, r_c + gamma * v_next - v_c, 0.0)

    adv_c = torch.zeros_like(delta)
    running = delta.new_zeros(b)
    for t in reversed(range(int(n.max()) if b else 0)):
        running = delta[:, t] + gamma * lam * running  # slots past a row's n hold delta 0
        adv_c[:, t] = running
    ret_c = torch.where(mask_c, adv_c + v_c, 0.0)
    return _scatter_back(adv_c, idx), _scatter_back(ret_c, idx)


def reward_to_go(
    rewards: Tensor,
    loss_mask: Tensor,
    gamma: float,
    *,
    bootstrap_value: Tensor | float | None = None,
) -> Tensor:
    """Discounted return over agent tokens: G_t = r_t + gamma * G_{t+1} (cases A7, A8).

    Same time convention as `gae`: masked tokens are not time steps and their rewards are
    ignored; G after the last agent token is `bootstrap_value` (None = 0). Equal to the
    `returns` of `gae` with values 0 and lam = 1 (REINFORCE, Williams 1992).

    Args:
        rewards: (B, T) per-token rewards.
        loss_mask: (B, T) 0/1.
        gamma: discount per agent token, in [0, 1].
        bootstrap_value: (B,) tensor, float or None.

    Returns:
        (B, T) returns, 0 at masked positions, without gradient.

    Raises:
        ValueError: on shape mismatch or gamma outside [0, 1].
    """
    zeros = torch.zeros_like(rewards, dtype=_float_dtype(rewards))
    _, returns = gae(rewards, zeros, loss_mask, gamma, 1.0, bootstrap_value=bootstrap_value)
    return returns


# -- sequence-level (group) advantages -------------------------------------------------------
def _group_index(group_ids: GroupIds, n: int, device: torch.device) -> tuple[Tensor, int]:
    if isinstance(group_ids, Tensor):
        if group_ids.shape != (n,):
            raise ValueError(f"group_ids must have shape ({n},), got {tuple(group_ids.shape)}")
        _, inv = torch.unique(group_ids, return_inverse=True)
        return inv.to(device), int(inv.max()) + 1 if n else 0
    ids = list(group_ids)
    if len(ids) != n:
        raise ValueError(f"group_ids has {len(ids)} entries, rewards has {n}")
    mapping: dict[Hashable, int] = {}
    inv_list = [mapping.setdefault(g, len(mapping)) for g in ids]
    return torch.tensor(inv_list, dtype=torch.long, device=device), len(mapping)


def _group_moments(rewards: Tensor, group_ids: GroupIds) -> dict[str, Any]:
    """Per-group count, mean, unbiased std and degeneracy, in float64, NaN/inf excluded."""
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be (N,), got shape {tuple(rewards.shape)}")
    r = rewards.detach().to(torch.float64)
    inv, g = _group_index(group_ids, r.shape[0], r.device)
    valid = torch.isfinite(r)
    rv = torch.where(valid, r, 0.0)
    count = torch.zeros(g, dtype=r.dtype, device=r.device).index_add_(0, inv, valid.to(r.dtype))
    total = torch.zeros_like(count).index_add_(0, inv, rv)
    mean = total / count.clamp(min=1)
    dev = torch.where(valid, r - mean[inv], 0.0)
    var = torch.zeros_like(count).index_add_(0, inv, dev * dev) / (count - 1).clamp(min=1)
    inf = float("inf")
    rmax = torch.full_like(count, -inf).scatter_reduce(0, inv, torch.where(valid, r, -inf), "amax")
    rmin = torch.full_like(count, inf).scatter_reduce(0, inv, torch.where(valid, r, inf), "amin")
    # A group gives no signal when fewer than two valid rewards remain or all are equal; its
    # advantages are set to exactly 0 (a float mean of equal values need not equal them).
    degenerate = (count < 2) | (rmax == rmin)
    return {
        "inv": inv,
        "valid": valid,
        "count": count,
        "total": total,
        "dev": dev,
        "std": var.sqrt(),
        "degenerate": degenerate,
    }


def _out_dtype(rewards: Tensor) -> torch.dtype:
    return rewards.dtype if rewards.is_floating_point() else torch.float32


def group_advantages(
    rewards: Tensor, group_ids: GroupIds, *, scale: str = "std", eps: float = 1e-6
) -> Tensor:
    """Group-relative advantages (GRPO): A_i = (r_i - mean_g) / (std_g + eps).

    `scale="std"`: divide by the unbiased (n - 1) group std plus `eps` (GRPO, Shao et al.
    2024, "DeepSeekMath", sec. 4.1.2). `scale="none"`: mean-centring only (Dr. GRPO, Liu et
    al. 2025, "Understanding R1-Zero-Like Training").

    Non-finite rewards (NaN from a failed reward function) are excluded from their group's
    mean and std and get advantage 0 (case R3); the caller should also drop those samples from
    the loss. Groups whose valid rewards are all equal, or that have fewer than two valid
    rewards, give exactly 0, never NaN (cases A1-A3; `group_stats` counts them).

    Args:
        rewards: (N,) one scalar reward per sample.
        group_ids: (N,) tensor or sequence of hashables; samples with equal ids form a group.
        scale: "std" or "none".
        eps: added to the std.

    Returns:
        (N,) advantages in the dtype of `rewards` (float32 for integer input), computed in
        float64, without gradient.

    Raises:
        ValueError: unknown `scale`, rewards not 1-D, or group_ids of another length.
    """
    if scale not in ("std", "none"):
        raise ValueError(f"scale must be 'std' or 'none', got {scale!r}")
    g = _group_moments(rewards, group_ids)
    inv = g["inv"]
    adv = g["dev"] / (g["std"][inv] + eps) if scale == "std" else g["dev"]
    adv = torch.where(g["valid"] & ~g["degenerate"][inv], adv, 0.0)
    return adv.to(_out_dtype(rewards))


def rloo_advantages(rewards: Tensor, group_ids: GroupIds) -> Tensor:
    """REINFORCE leave-one-out advantages: A_i = r_i - mean_{j != i, j in g(i)} r_j.

    Equivalently n/(n-1) * (r_i - mean_g) (Ahmadian et al. 2024, "Back to Basics: Revisiting
    REINFORCE Style Optimization for Learning from Human Feedback in LLMs", eq. 6). The same
    exclusions as `group_advantages`: non-finite rewards are left out and get 0; groups with
    fewer than two valid rewards or all-equal rewards give exactly 0.

    Args:
        rewards: (N,) rewards.
        group_ids: (N,) tensor or sequence of hashables.

    Returns:
        (N,) advantages in the dtype of `rewards`, without gradient.

    Raises:
        ValueError: rewards not 1-D, or group_ids of another length.
    """
    g = _group_moments(rewards, group_ids)
    inv, count = g["inv"], g["count"]
    r = torch.where(g["valid"], rewards.detach().to(torch.float64), 0.0)
    baseline = (g["total"][inv] - r) / (count[inv] - 1).clamp(min=1)
    adv = torch.where(g["valid"] & ~g["degenerate"][inv], r - baseline, 0.0)
    return adv.to(_out_dtype(rewards))


def group_stats(rewards: Tensor, group_ids: GroupIds) -> dict[str, Any]:
    """Counts for logging and dynamic sampling (cases A2, A3, R3).

    Returns:
        dict with
        - `num_groups` (int);
        - `num_zero_variance_groups` (int): groups whose advantages are all 0 because their
          valid rewards are equal or fewer than two (singletons and all-failed groups
          included); DAPO's dynamic sampling drops these;
        - `num_singleton_groups` (int): groups with exactly one valid reward;
        - `num_invalid_rewards` (int): non-finite rewards (excluded from statistics);
        - `frac_zero_variance` (float): num_zero_variance_groups / num_groups (0 if none);
        - `reward_mean`, `reward_std` (float): over valid rewards (0 if fewer than 1 / 2).
        All values are Python numbers (safe to log). See `zero_variance_mask` for the samples.

    Raises:
        ValueError: rewards not 1-D, or group_ids of another length.
    """
    g = _group_moments(rewards, group_ids)
    num_groups = int(g["count"].shape[0])
    zero_var = int(g["degenerate"].sum())
    r = rewards.detach().to(torch.float64)[g["valid"]]
    return {
        "num_groups": num_groups,
        "num_zero_variance_groups": zero_var,
        "num_singleton_groups": int((g["count"] == 1).sum()),
        "num_invalid_rewards": int((~g["valid"]).sum()),
        "frac_zero_variance": zero_var / num_groups if num_groups else 0.0,
        "reward_mean": float(r.mean()) if r.numel() else 0.0,
        "reward_std": float(r.std()) if r.numel() > 1 else 0.0,
    }


def zero_variance_mask(rewards: Tensor, group_ids: GroupIds) -> Tensor:
    """(N,) bool: True for samples whose group gives no signal (all advantages 0).

    Such a group has all valid rewards equal or fewer than two valid rewards (see
    `group_stats`). DAPO's dynamic sampling (Yu et al. 2025, sec. 3.2) drops these samples and
    refills the batch.

    Raises:
        ValueError: rewards not 1-D, or group_ids of another length.
    """
    g = _group_moments(rewards, group_ids)
    return g["degenerate"][g["inv"]]


# -- normalisation and broadcasting ----------------------------------------------------------
def whiten(values: Tensor, mask: Tensor, *, shift_mean: bool = True, eps: float = 1e-8) -> Tensor:
    """Masked whitening: (x - mean) / sqrt(var + eps) over the entries where `mask` is 1.

    Mean and unbiased (n - 1) variance are taken over all valid entries of the batch together
    (as in TRL's `masked_whiten`; REINFORCE++, Hu 2025, normalises advantages this way). With
    `shift_mean=False` the mean is added back (scale only). With fewer than two valid entries
    whitening is skipped and valid entries are returned unchanged (case A5); when all valid
    entries are equal the centred values are exactly 0.

    Args:
        values: any shape, e.g. (B, T) advantages.
        mask: same shape, 0/1.
        shift_mean: centre the values (True) or only rescale them (False).
        eps: added to the variance.

    Returns:
        Same shape and dtype as `values` (statistics in float32 or wider); 0 where `mask` is 0,
        whatever `values` holds there (case A6).

    Raises:
        ValueError: if shapes differ.
    """
    if values.shape != mask.shape:
        raise ValueError(f"values {tuple(values.shape)} and mask {tuple(mask.shape)} differ")
    m = mask != 0
    x = torch.where(m, values.to(_float_dtype(values)), 0.0)
    n = int(m.sum())
    if n < 2:
        return x.to(values.dtype)
    mean = x.sum() / n
    centred = torch.where(m, x - mean, 0.0)
    var = (centred * centred).sum() / (n - 1)
    valid = x[m]
    if bool(valid.max() == valid.min()):
        centred = torch.zeros_like(centred)
    out = centred * torch.rsqrt(var + eps)
    if not shift_mean:
        out = torch.where(m, out + mean, 0.0)
    return out.to(values.dtype)


def expand_to_tokens(seq_values: Tensor, loss_mask: Tensor) -> Tensor:
    """Broadcast one value per sequence onto that sequence's agent tokens.

    Args:
        seq_values: (B,) e.g. group-relative advantages.
        loss_mask: (B, T) 0/1.

    Returns:
        (B, T): seq_values[b] where loss_mask[b, t] is 1, else 0; dtype of `seq_values`
        (float32 for integer input).

    Raises:
        ValueError: if seq_values is not (B,).
    """
    if loss_mask.dim() != 2 or seq_values.shape != loss_mask.shape[:1]:
        raise ValueError(
            f"seq_values must be (B,) and loss_mask (B, T); got {tuple(seq_values.shape)} "
            f"and {tuple(loss_mask.shape)}"
        )
    v = seq_values.to(_out_dtype(seq_values))
    return torch.where(loss_mask != 0, v[:, None], 0.0)


def outcome_token_rewards(scores: Tensor, loss_mask: Tensor) -> tuple[Tensor, Tensor]:
    """Place one outcome score per row on that row's last agent token (cases A9, A10).

    The position comes from the mask (built from generated lengths), never from token values,
    so an EOS equal to the pad id still receives the reward.

    Args:
        scores: (B,) one scalar per row.
        loss_mask: (B, T) 0/1.

    Returns:
        (token_rewards, empty): token_rewards (B, T) with scores[b] at the last position where
        loss_mask[b] is 1 and 0 elsewhere; empty (B,) bool, True for rows without agent tokens
        (their row is all zeros and their score is dropped). Exclude empty rows from group
        baselines by passing `scores.masked_fill(empty, float("nan"))` to `group_advantages`.

    Raises:
        ValueError: if scores is not (B,) or loss_mask is not (B, T).
    """
    if loss_mask.dim() != 2 or scores.shape != loss_mask.shape[:1]:
        raise ValueError(
            f"scores must be (B,) and loss_mask (B, T); got {tuple(scores.shape)} "
            f"and {tuple(loss_mask.shape)}"
        )
    m = loss_mask != 0
    pos = torch.arange(m.shape[1], device=m.device)[None, :]
    last = torch.where(m, pos, -1).amax(dim=1) if m.shape[1] else pos.new_full((m.shape[0],), -1)
    s = scores.detach().to(_out_dtype(scores))
    token_rewards = torch.where(pos == last[:, None], s[:, None], 0.0)
    return token_rewards, last < 0
