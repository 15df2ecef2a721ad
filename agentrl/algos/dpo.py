"""DPO (Rafailov et al. 2023, "Direct Preference Optimization"), online from rollout groups or
offline from a preference file, against a frozen reference model.

    h    = (log pi(y_c|x) - log pi_ref(y_c|x)) - (log pi(y_r|x) - log pi_ref(y_r|x))
    loss = mean over pairs of -log sigmoid(beta * h)                          (eq. 7)

log pi(y|x) is summed over the response's agent tokens only (`sequence_logps` with the loss
mask): never over prompt tokens, and in a multi-turn episode never over observation tokens.

Online (`agentrl train --algo dpo`): the G episodes of a task form a group; its best and worst
episode by return are a pair (chosen, rejected). Groups whose valid returns are all equal (or
fewer than two) give no pair and are skipped; NaN returns are ignored. The prompt x is the
shared context before the first sampled token; a pair whose prompts differ is skipped and
counted. `prepare` turns the rollout batch into a pair batch: rows (chosen_0, rejected_0,
chosen_1, ...) with `unit_size = 2`, so the learner keeps each pair in one micro-batch.

Offline: `load_preferences(path)` reads a JSONL file of {"prompt", "chosen", "rejected"};
`preference_batch(pairs, renderer, pad_id)` renders them with the chat template into the same
pair batch. Train with

    batch = preference_batch(pairs, renderer, pad_id)
    batch["ref_logprobs"] = learner.logprobs(batch, ref=True)
    learner.update(batch, DPO(), cfg)        # Learner(..., use_ref=True)

The reference is `learner.ref_model`, the frozen copy of the starting policy (`needs_reference`).
`DPOConfig` has `beta` and the keys of every algorithm: overlong shaping changes the returns the
online pairs are chosen by; masking a row would empty a pair, and the preference loss has no
importance ratio, so the other options are not its keys.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from agentrl.algos.advantages import _check_2d as _check_same
from agentrl.algos.advantages import _float_dtype
from agentrl.algos.base import Algorithm
from agentrl.algos.configs import DPOConfig
from agentrl.algos.losses import _f
from agentrl.infra.jsonl import jsonl_rows
from agentrl.models.tokens import encode_continuation
from agentrl.types import Trajectory, collate


# -- the loss ------------------------------------------------------------------------------------
def sequence_logps(token_logps: Tensor, loss_mask: Tensor) -> Tensor:
    """Sum of per-token logprobs over response tokens only (prompt tokens never count).

    Args:
        token_logps: (B, T) log pi(token).
        loss_mask: (B, T) 0/1, 1 on response tokens.

    Returns:
        (B,) log pi(response | prompt), with gradient; 0 for a row without response tokens.

    Raises:
        ValueError: shape mismatch.
    """
    _check_same(loss_mask, token_logps=token_logps)
    return torch.where(loss_mask != 0, token_logps, 0.0).sum(dim=-1)


def dpo_loss(
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    *,
    beta: float,
    label_smoothing: float = 0.0,
) -> tuple[Tensor, dict[str, float]]:
    """Direct Preference Optimization loss over P preference pairs.

        h    = (pc - rc) - (pr - rr)        (log-ratio margin, sequence logprobs)
        loss = mean( -(1 - eps) * log sigmoid(beta * h) - eps * log sigmoid(-beta * h) )

    with eps = label_smoothing (0: the original loss; >0: conservative DPO). Implicit rewards
    are beta * (policy - ref) logps. Source: Rafailov et al. 2023, "Direct Preference
    Optimization", eq. 7.

    Args:
        policy_chosen_logps, policy_rejected_logps: (P,) sequence logprobs of the policy
            (use `sequence_logps`, response tokens only).
        ref_chosen_logps, ref_rejected_logps: (P,) the same under the frozen reference
            (detached).
        beta: > 0, strength of the implicit KL constraint.
        label_smoothing: in [0, 0.5).

    Returns:
        (loss, metrics) with `reward_margin` (mean chosen - rejected implicit reward),
        `reward_accuracy` (fraction of pairs with chosen reward > rejected), `chosen_reward`,
        `rejected_reward` (means), `dpo_loss`.

    Raises:
        ValueError: beta <= 0, label_smoothing out of range, empty or mismatched inputs.
    """
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"label_smoothing must be in [0, 0.5), got {label_smoothing}")
    shapes = {
        tuple(x.shape)
        for x in (policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps)
    }
    if len(shapes) != 1 or policy_chosen_logps.dim() != 1 or policy_chosen_logps.numel() == 0:
        raise ValueError(f"all four inputs must be the same non-empty (P,) shape, got {shapes}")
    dtype = _float_dtype(policy_chosen_logps, policy_rejected_logps)
    chosen = policy_chosen_logps.to(dtype) - ref_chosen_logps.detach().to(dtype)
    rejected = policy_rejected_logps.to(dtype) - ref_rejected_logps.detach().to(dtype)
    logits = beta * (chosen - rejected)
    losses = -(1.0 - label_smoothing) * F.logsigmoid(logits) - label_smoothing * F.logsigmoid(
        -logits
    )
    loss = losses.mean()
    with torch.no_grad():
        chosen_reward = beta * chosen
        rejected_reward = beta * rejected
        metrics = {
            "reward_margin": _f((chosen_reward - rejected_reward).mean()),
            "reward_accuracy": _f((chosen_reward > rejected_reward).float().mean()),
            "chosen_reward": _f(chosen_reward.mean()),
            "rejected_reward": _f(rejected_reward.mean()),
            "dpo_loss": _f(loss),
        }
    return loss, metrics


# -- pairs from rollout groups ------------------------------------------------------------------
def select_pairs(scores: torch.Tensor, group_ids: torch.Tensor) -> tuple[list[tuple[int, int]], int]:
    """Best vs worst episode of each group.

    Args:
        scores: (N,) episode returns; non-finite ones are ignored.
        group_ids: (N,) group of each episode.

    Returns:
        (pairs, skipped): pairs (chosen row, rejected row) in order of first appearance of the
        group; the first row wins ties for best and for worst; `skipped` counts groups with
        fewer than two valid returns or all equal.
    """
    order: dict[int, list[int]] = {}
    for i, g in enumerate(group_ids.tolist()):
        order.setdefault(g, []).append(i)
    pairs, skipped = [], 0
    s = scores.tolist()
    for rows in order.values():
        valid = [i for i in rows if s[i] == s[i] and abs(s[i]) != float("inf")]
        if len(valid) < 2:
            skipped += 1
            continue
        best = max(valid, key=lambda i: s[i])  # max/min return the first of equal keys
        worst = min(valid, key=lambda i: s[i])
        if s[best] == s[worst]:
            skipped += 1
            continue
        pairs.append((best, worst))
    return pairs, skipped


def prompt_length(loss_mask_row: torch.Tensor) -> int:
    """Tokens before the first agent token of a (T,) mask row (the row's length if none)."""
    hits = (loss_mask_row != 0).nonzero()
    return int(hits[0, 0]) if hits.numel() else int(loss_mask_row.shape[0])


def pair_batch(batch: dict[str, Any], pairs: list[tuple[int, int]]) -> dict[str, Any]:
    """Rows (c_0, r_0, c_1, r_1, ...) of every (B, ...) tensor of `batch`, trimmed to the
    longest kept row, with `unit_size = 2`. Other entries are copied."""
    rows = torch.tensor([i for p in pairs for i in p], dtype=torch.long)
    B = batch["input_ids"].shape[0]
    width = int(batch["lengths"][rows].max()) if len(rows) else 1
    out: dict[str, Any] = {}
    for k, v in batch.items():
        if isinstance(v, torch.Tensor) and v.dim() >= 1 and v.shape[0] == B:
            v = v[rows]
            if v.dim() == 2:
                v = v[:, :width]
        out[k] = v
    out["unit_size"] = 2
    return out


# -- offline preference data ----------------------------------------------------------------------
def _response_text(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    if (isinstance(value, list) and len(value) == 1 and isinstance(value[0], dict)
            and value[0].get("role") == "assistant" and isinstance(value[0].get("content"), str)):
        return value[0]["content"]
    raise ValueError(f"{where}: must be a string or a list of one assistant message")


def load_preferences(path: str | Path) -> list[dict[str, Any]]:
    """Read preference pairs from a JSONL file, one object per line:

        {"prompt": "..." | [chat messages], "chosen": "...", "rejected": "..."}

    `prompt` is a user message text or a list of chat messages ({"role", "content"}) ending
    before the assistant's answer; `chosen` / `rejected` are the answers' texts (or a list of
    one assistant message, TRL's conversational format). Blank lines are skipped.

    Returns:
        list of {"prompt": list of messages, "chosen": str, "rejected": str}.

    Raises:
        FileNotFoundError: no such file.
        ValueError: invalid JSON, a missing or mistyped field (the line number is named), or
            no pairs at all.
    """
    path = Path(path)
    out = []
    for where, row in jsonl_rows(path):
        if not isinstance(row, dict):
            raise ValueError(f"{where}: each line must be a JSON object")
        missing = [k for k in ("prompt", "chosen", "rejected") if k not in row]
        if missing:
            raise ValueError(f"{where}: missing field(s) {', '.join(missing)}")
        prompt = row["prompt"]
        if isinstance(prompt, str):
            prompt = [{"role": "user", "content": prompt}]
        elif not (isinstance(prompt, list) and prompt and all(
                isinstance(m, dict) and "role" in m and "content" in m for m in prompt)):
            raise ValueError(f"{where}: prompt must be a string or a non-empty list of "
                             "{role, content} messages")
        out.append({"prompt": prompt, "chosen": _response_text(row["chosen"], f"{where}: chosen"),
                    "rejected": _response_text(row["rejected"], f"{where}: rejected")})
    if not out:
        raise ValueError(f"{path}: no preference pairs")
    return out


def preference_batch(pairs: list[dict[str, Any]], renderer: Any, pad_id: int) -> dict[str, Any]:
    """Render preference pairs into a pair batch for `Learner.update` with this module.

    Each side is the prompt rendered with the chat template and the generation prompt
    (`renderer.prompt_ids`, loss_mask 0) followed by the answer's ids and the end-of-turn token
    (loss_mask 1), exactly as a sampled turn would be.

    Args:
        pairs: from `load_preferences` (prompt as messages, chosen/rejected texts).
        renderer: an `agentrl.rollout.chat.ChatRenderer`.
        pad_id: padding id.

    Returns:
        dict with `input_ids`, `attention_mask`, `loss_mask`, `token_rewards`, `lengths` (2P, T)
        / (2P,), rows (chosen_0, rejected_0, ...); `scores` (2P,) 1 for chosen, 0 for
        rejected; `group_ids` (2P,) the pair index; `unit_size` 2.

    Raises:
        ValueError: no pairs.
    """
    if not pairs:
        raise ValueError("preference_batch: no pairs")
    tok = renderer.tokenizer
    trajs = []
    for p in pairs:
        prompt = renderer.prompt_ids(p["prompt"])
        for text in (p["chosen"], p["rejected"]):
            ids = encode_continuation(tok, text) + [renderer.end_of_turn_id]
            tr = Trajectory()
            tr.append_context(prompt)
            tr.append_sampled(ids, [0.0] * len(ids), text=text)
            trajs.append(tr)
    batch = collate(trajs, pad_id)
    del batch["sampler_logprobs"]  # not sampled: no sampler/learner mismatch to measure
    batch["scores"] = torch.tensor([1.0, 0.0] * len(pairs))
    batch["group_ids"] = torch.arange(len(pairs)).repeat_interleave(2)
    batch["unit_size"] = 2
    return batch


# -- the algorithm interface ------------------------------------------------------------------
class DPO(Algorithm):
    """Preference pairs against the frozen reference (`needs_reference`: always)."""

    name = "dpo"
    config = DPOConfig

    def needs_reference(self, cfg: Any) -> bool:
        """Always: the loss compares the policy with the reference on each pair."""
        return True

    def prepare(self, batch: dict[str, Any], learner: Any, cfg: Any) -> tuple[dict[str, Any], dict]:
        """Turn a rollout batch into a preference-pair batch (a batch that already has
        `unit_size == 2`, e.g. from `preference_batch`, is returned as is).

        Returns:
            (pair batch, metrics `dpo_pairs`, `dpo_skipped_groups`, `dpo_prompt_mismatch`). The
            pair batch has 0 rows when no group has a best and a worst episode (no update then).
        """
        if batch.get("unit_size") == 2:
            return batch, {"dpo_pairs": batch["input_ids"].shape[0] // 2}
        pairs, skipped = select_pairs(batch["scores"], batch["group_ids"])
        kept, mismatch = [], 0
        ids, mask = batch["input_ids"], batch["loss_mask"]
        for c, r in pairs:
            pc, pr = prompt_length(mask[c]), prompt_length(mask[r])
            if pc != pr or not torch.equal(ids[c, :pc], ids[r, :pr]):
                mismatch += 1
                continue
            kept.append((c, r))
        metrics = {"dpo_pairs": len(kept), "dpo_skipped_groups": skipped,
                   "dpo_prompt_mismatch": mismatch}
        return pair_batch(batch, kept), metrics

    def advantages(self, batch: dict[str, Any], cfg: Any) -> tuple[torch.Tensor, dict[str, float]]:
        """DPO has no advantages: zeros (B, T) (kept for the common interface) and `pairs`."""
        return torch.zeros_like(batch["loss_mask"]), {"pairs": batch["input_ids"].shape[0] // 2}

    def loss(self, logp: torch.Tensor, batch: dict[str, Any], cfg: Any, *, num_tokens: float,
             num_seqs: int, entropy: torch.Tensor | None = None, **kw: Any
             ) -> tuple[torch.Tensor, dict[str, Any]]:
        """DPO loss of the pairs of one micro-batch, scaled so micro-batch losses add up to the
        minibatch's mean over pairs.

        Args:
            logp: (2P, T) current logprobs, rows (chosen_0, rejected_0, ...).
            batch: `loss_mask` (response tokens) and `ref_logprobs` (2P, T).
            cfg: DPOConfig (`beta`).
            num_seqs: rows of the whole minibatch (2 per pair).

        Returns:
            (loss, metrics) with `reward_margin`, `reward_accuracy`, `chosen_reward`,
            `rejected_reward`, `dpo_loss`.

        Raises:
            ValueError: an odd number of rows or no `ref_logprobs`.
        """
        if logp.shape[0] % 2:
            raise ValueError(f"dpo: a pair batch has an even number of rows, got {logp.shape[0]}")
        if "ref_logprobs" not in batch:
            raise ValueError("dpo: batch has no ref_logprobs (Learner(use_ref=True), "
                             "learner.logprobs(batch, ref=True))")
        mask = batch["loss_mask"]
        seq = sequence_logps(logp, mask)
        ref = sequence_logps(batch["ref_logprobs"], mask)
        total, metrics = dpo_loss(seq[0::2], seq[1::2], ref[0::2], ref[1::2], beta=cfg.beta)
        return total * (logp.shape[0] / num_seqs), metrics
