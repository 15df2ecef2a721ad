"""Reward shaping and sample masking applied to the collated batch before any algorithm sees
it: DAPO's overlong reward shaping and overlong filtering (Yu et al. 2025, "DAPO: An
Open-Source LLM Reinforcement Learning System at Scale", arXiv 2503.14476, sec. 3.4).

Overlong shaping (eq. 13), with L_max = the per-turn token budget (`rollout.max_tokens`),
L_cache = `algo.overlong_buffer` and p = `algo.overlong_penalty`, for a turn of L sampled tokens:

    R_length(L) = 0                                  L <= L_max - L_cache
                = p * ((L_max - L_cache) - L) / L_cache     L_max - L_cache < L <= L_max
                = -p                                 L > L_max

added to that turn's reward (on its last sampled token) and so to the episode's return. The
paper applies it to the one response of a single-turn task; here every turn is a response, so
each turn is shaped against the per-turn budget.

Overlong filtering (`algo.mask_truncated`, sec. 3.4 "overlong filtering"): the loss mask of a
sample with a turn cut by the token budget (its finish reason is `length`) is zeroed, so a
truncated answer is neither rewarded nor punished for its text; it still counts in its
group's statistics (its turns, kept in `sampled_mask`, in the per-turn and anchor-state groups
of `turn_advantages` and `turn_credit=gigpo` too).

DAPO's dynamic sampling (`algo.dynamic_sampling`, sec. 3.2, `filter_groups`) and the batch the
algorithms read (`build_batch`) live here too.

Order in the training loop (`agentrl.train.update`): dynamic sampling first (it judges groups
by their unshaped returns), then `build_batch`, then this (`shape_batch`), then the algorithm's
`prepare` and advantages. The
rollout metrics (`rollout/reward_mean`, ...) are of the unshaped rewards; `adv/...` of the
shaped ones.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from agentrl.algos.advantages import zero_variance_mask
from agentrl.algos.turns import step_advantages, turn_group_advantages, turn_index
from agentrl.types import Trajectory, collate

DYNAMIC_SAMPLING_MAX_ROUNDS = 3
"""Most refill collections per step of dynamic sampling (DAPO's `max_num_gen_batches`)."""


def overlong_penalty(lengths: Tensor, max_tokens: int, buffer: int, penalty: float = 1.0) -> Tensor:
    """DAPO's soft overlong punishment R_length (eq. 13) of responses of `lengths` tokens.

    Args:
        lengths: (...) sampled tokens per response (int or float).
        max_tokens: L_max, the budget (>= 1).
        buffer: L_cache, the length of the penalty zone before L_max (1 <= buffer <= max_tokens).
        penalty: p >= 0, the penalty at L >= L_max.

    Returns:
        (...) float32 penalties in [-p, 0].

    Raises:
        ValueError: buffer outside [1, max_tokens] or penalty < 0.
    """
    if not 1 <= buffer <= max_tokens:
        raise ValueError(f"overlong_buffer must be in [1, max_tokens={max_tokens}], got {buffer}")
    if penalty < 0:
        raise ValueError(f"overlong_penalty must be >= 0, got {penalty}")
    free = max_tokens - buffer
    frac = ((free - lengths.to(torch.float32)) / buffer).clamp(min=-1.0, max=0.0)
    return penalty * frac


def turn_lengths(loss_mask: Tensor) -> tuple[Tensor, Tensor]:
    """Sampled tokens of each turn (a maximal run of agent tokens, `turns.turn_index`).

    Returns:
        (lengths (B, K) long, last (B, K) long): the token count of turn k of row b and the
        position of its last token; K = the most turns of any row; both 0 / -1 where row b has
        no turn k.
    """
    turn = turn_index(loss_mask)
    b, t_len = loss_mask.shape
    k_max = int(turn.max()) + 1 if turn.numel() and int(turn.max()) >= 0 else 0
    width = max(k_max, 1)
    m = turn >= 0
    idx = turn.clamp(min=0)
    lengths = torch.zeros(b, width, dtype=torch.long).scatter_add_(1, idx, m.long())
    pos = torch.arange(t_len).expand(b, t_len)
    last = torch.full((b, width), -1, dtype=torch.long).scatter_reduce_(
        1, idx, torch.where(m, pos, -1), "amax")
    return lengths[:, :k_max], last[:, :k_max]


def apply_overlong_shaping(batch: dict[str, Any], max_tokens: int, buffer: int,
                           penalty: float) -> dict[str, float]:
    """Add `overlong_penalty` of each turn's length to its reward, in place: on the turn's last
    sampled token of `batch["token_rewards"]` (B, T) and summed into `batch["scores"]` (B,)
    (a NaN score, a failed reward, stays NaN).

    Returns:
        metrics `overlong_penalty_mean` (mean over rows of the summed penalty) and
        `overlong_turn_frac` (share of turns in the penalty zone).
    """
    lengths, last = turn_lengths(batch["loss_mask"])
    pen = overlong_penalty(lengths, max_tokens, buffer, penalty)
    pen = torch.where(last >= 0, pen, 0.0)
    rows, turns = (last >= 0).nonzero(as_tuple=True)
    rew = batch["token_rewards"].clone()
    rew[rows, last[rows, turns]] += pen[rows, turns].to(rew.dtype)
    batch["token_rewards"] = rew
    batch["scores"] = batch["scores"] + pen.sum(dim=1).to(batch["scores"].dtype)
    n_turns = int((last >= 0).sum())
    return {"overlong_penalty_mean": float(pen.sum(dim=1).mean()) if pen.shape[0] else 0.0,
            "overlong_turn_frac": float((pen < 0).sum()) / n_turns if n_turns else 0.0}


def mask_length_truncated(batch: dict[str, Any], cut: Tensor) -> int:
    """Zero the loss mask of the rows flagged in `cut` (B,) bool, in place (overlong filtering).
    The mask before, the turns of every row, is kept as `batch["sampled_mask"]`: the turn-level
    advantages (`turns.turn_mask`) still count the masked rows' turns in their groups'
    statistics, as the episode advantages count their returns.

    Returns:
        the number of rows masked.
    """
    batch.setdefault("sampled_mask", batch["loss_mask"])
    keep = (~cut.to(torch.bool)).to(batch["loss_mask"].dtype)
    batch["loss_mask"] = batch["loss_mask"] * keep[:, None]
    return int(cut.sum())


def shape_batch(batch: dict[str, Any], trajs: list[Any], cfg: Any, max_tokens: int, *,
                mask_truncated: bool) -> dict[str, float]:
    """Apply the configured shaping to a batch collated from `trajs` (same order), in place:
    overlong shaping when `cfg.overlong_buffer > 0`, overlong filtering when `mask_truncated`
    (the algorithm's `masks_truncated(cfg)`; dpo's config has no `mask_truncated`). Does
    nothing (and returns {}) when both are off.

    Args:
        batch: from `build_batch(trajs, ...)`.
        trajs: the trajectories (their turns' `finish_reason`).
        cfg: the algorithm's config (`overlong_buffer`, `overlong_penalty`).
        max_tokens: `rollout.max_tokens`.

    Returns:
        metrics (logged under `rollout/`).
    """
    metrics: dict[str, float] = {}
    if cfg.overlong_buffer > 0:
        metrics.update(apply_overlong_shaping(batch, max_tokens, cfg.overlong_buffer,
                                              cfg.overlong_penalty))
    if mask_truncated:
        cut = torch.tensor([any(t.finish_reason == "length" for t in tr.turns) for tr in trajs],
                           dtype=torch.bool)
        metrics["masked_truncated"] = float(mask_length_truncated(batch, cut))
    return metrics


def group_keys(trajs: list[Trajectory]) -> list[int]:
    """The advantage group of each trajectory: its `group_id` split further by the env's
    `info["group_key"]` (e.g. `self_propose`'s role and mode), so that episodes of different
    roles or modes never share a baseline even under one `group_id`. Returns ints numbered
    0, 1, ... in order of first appearance."""
    ids: dict[tuple[int, Any], int] = {}
    return [ids.setdefault((t.group_id, t.info.get("group_key")), len(ids)) for t in trajs]


def build_batch(trajs: list[Trajectory], pad_id: int) -> dict[str, Any]:
    """Collate trajectories and attach `scores` (B,) episode returns, `group_ids` (B,)
    (`group_keys`: role-aware) and `truncated` (B,). A NaN return (a failed reward) stays NaN, and an episode that sampled no
    token gets NaN (case A9): both are excluded from group statistics and get advantage 0.
    Rows another sampler played (`info["sampler"]`, e.g. distill's GKD mixture tags the
    teacher's `"teacher"`) get `<sampler>_rows` (B,) bool, e.g. `teacher_rows`."""
    batch = collate(trajs, pad_id)
    batch["scores"] = torch.tensor(
        [t.episode_return if t.num_sampled > 0 else float("nan") for t in trajs], dtype=torch.float32)
    batch["group_ids"] = torch.tensor(group_keys(trajs), dtype=torch.long)
    batch["truncated"] = torch.tensor([t.truncated for t in trajs], dtype=torch.bool)
    for s in sorted({str(t.info["sampler"]) for t in trajs if t.info.get("sampler")}):
        batch[f"{s}_rows"] = torch.tensor([t.info.get("sampler") == s for t in trajs], dtype=torch.bool)
    return batch


def flat_groups(trajs: list[Trajectory], cfg: Any = None) -> list[bool]:
    """Per trajectory: does its group carry no gradient? Its episode returns are all equal or
    fewer than two are valid (`zero_variance_mask`), and, under a turn-level credit of `cfg`,
    every turn-level advantage of its episodes is 0 too: a group whose episodes all return the
    same can still differ in the discounted returns of the turns of one anchor state (GiGPO,
    `cfg.turn_credit == "gigpo"`, Feng et al. 2025, sec. 4.2: a pass at attempt 1 and one at
    attempt 3 of the same task, gamma < 1) or in the returns-to-go of one turn (per-turn
    groups, `cfg.turn_advantages`: turn rewards that sum alike along different paths), and is
    then trained on. Episodes sampled with `rollout.history=template` (`turn_prompts`) have
    no turn-level signal beyond their returns: each of their turns is trained as a sample
    carrying the episode's return (`agentrl.rollout.agent_loop.turn_samples`).

    Args:
        trajs: the episodes (any order; groups by `group_keys`).
        cfg: the algorithm's config, or None (episode returns only).
    """
    if not trajs:
        return []
    scores = torch.tensor([t.episode_return if t.num_sampled > 0 else float("nan") for t in trajs])
    keys = group_keys(trajs)
    flat = zero_variance_mask(scores, keys).tolist()
    gigpo = getattr(cfg, "turn_credit", "episode") == "gigpo"
    if not (gigpo or getattr(cfg, "turn_advantages", False)) or not any(flat):
        return flat
    if any(t.turn_prompts for t in trajs):  # history=template: every turn sample carries its
        return flat  # episode's return (`turn_samples`), so equal returns leave no turn signal
    b = build_batch(trajs, pad_id=0)  # the pad id is never part of a turn's state
    if gigpo:
        adv = step_advantages(b["input_ids"], b["token_rewards"], b["loss_mask"], keys,
                              gamma=cfg.gamma, scale="none")
    else:
        adv = turn_group_advantages(b["token_rewards"], b["loss_mask"], keys, scale="none")
    signal = {k for k, s in zip(keys, (adv != 0).any(dim=1).tolist()) if s}
    return [f and k not in signal for f, k in zip(flat, keys)]


def dynamic_sampling(trajs: list[Trajectory], more: Callable[[int], list[Trajectory]], want: int, *,
                     max_rounds: int = DYNAMIC_SAMPLING_MAX_ROUNDS, cfg: Any = None
                     ) -> tuple[list[Trajectory], int]:
    """DAPO dynamic sampling (Yu et al. 2025, sec. 3.2): keep only the groups that carry a
    gradient (`flat_groups`: groups with all-equal or fewer than two valid returns carry none,
    unless, under the turn-level credit `cfg` names, their turn-level advantages do) and call
    `more(round)` for fresh groups until `want` trajectories are kept or `max_rounds` refills
    were made. Whole groups are kept, in order, up to `want` episodes.

    Returns:
        (kept trajectories, refill rounds used). Fewer than `want` (possibly none: then the
        step makes no update) when the refills run out.
    """
    def informative(ts: list[Trajectory]) -> list[Trajectory]:
        return [t for t, d in zip(ts, flat_groups(ts, cfg)) if not d]

    kept, rounds = informative(trajs), 0
    while len(kept) < want and rounds < max_rounds:
        rounds += 1
        kept += informative(more(rounds))
    groups: dict[Any, list[Trajectory]] = {}
    for t in kept:
        groups.setdefault((t.group_id, t.info.get("group_key")), []).append(t)
    out: list[Trajectory] = []
    for g in groups.values():
        if len(out) + len(g) > want:
            break
        out += g
    return out, rounds


def filter_groups(trajs: list[Trajectory], more: Callable[[int], list[Trajectory]], cfg: Any,
                  want: int) -> tuple[list[Trajectory], dict[str, float]]:
    """The groups a step trains on: with `cfg.dynamic_sampling` (AlgoConfig), `dynamic_sampling`
    (refills from `more(round)`, up to `want` episodes) and its metric `refill_rounds` (logged
    under `rollout/`); otherwise `trajs` as they are and no metric."""
    if not cfg.dynamic_sampling:
        return trajs, {}
    trajs, rounds = dynamic_sampling(trajs, more, want, cfg=cfg)
    return trajs, {"refill_rounds": rounds}
