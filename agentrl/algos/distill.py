"""On-policy distillation (Agarwal et al. 2024, "On-Policy Distillation of Language Models:
Learning from Self-Generated Mistakes" (GKD), arXiv 2306.13649; Lu & Thinking Machines 2025,
"On-Policy Distillation"): the student samples, a frozen teacher scores the student's own
tokens, and the per-token reverse-KL signal is the advantage.

    A_t  = distill_coef * (log pi_teacher(y_t | y_<t) - log pi_student(y_t | y_<t))
           + distill_reward_coef * A^GRPO_i              (the env reward, optional, as GRPO)
    loss = clipped surrogate of A_t (as GRPO; aggregation `agg`) [+ KL, - entropy bonus]

Sum over a sampled sequence, -(log pi_student - log pi_teacher) is a one-sample estimate of
-KL(pi_student || pi_teacher) (the reverse KL, mode seeking); with the policy gradient on
per-token advantages (no discounting, no return-to-go, as the Thinking Machines recipe) each
token is pushed toward what the teacher would have said in that context. `log pi_student` is
`old_logprobs`, the learner's own logprobs of the sampling weights; both use the rollout
temperature. A teacher equal to the student gives exactly 0.

The teacher (`algo.teacher_path`, a local Hugging Face directory with the policy's tokenizer)
is frozen, in eval mode, dropout off. Inline (`placement.teacher=inline`) it is loaded once per
process on the learner's device and its forward runs in `prepare` without gradient; on a worker
(`placement.teacher=worker`) it is a `agentrl.placement.RemoteFrozenModel` set as
`learner.teacher` by the training loop, which starts its logprobs as soon as a batch is sampled
(the reference worker's pipeline), and `prepare` takes the result. Both compute
`agentrl.placement.frozen_logprobs` (the same micro-batches, trimmed the same way), so the two
are equal (bit for bit in float32 on CPU, tested).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from agentrl.algos import grpo
from agentrl.algos.advantages import expand_to_tokens, group_advantages, group_stats

OPTIONS = ("dual_clip", "tis_cap", "overlong_buffer", "mask_truncated")

_TEACHERS: dict[tuple[str, str], Any] = {}


def load_teacher(path: str | Path, device: str | torch.device = "cpu") -> Any:
    """The frozen teacher at `path` on `device` (loaded once per process and device; eval mode,
    no gradient, dropout off).

    Raises:
        FileNotFoundError: `path` is not a directory (from `agentrl.model.load_model`).
    """
    key = (str(Path(path).resolve()), str(device))
    if key not in _TEACHERS:
        from agentrl.learner import disable_dropout
        from agentrl.model import load_model

        model, _ = load_model(path)
        model.requires_grad_(False)
        disable_dropout(model)
        _TEACHERS[key] = model.to(device).eval()
    return _TEACHERS[key]


def check_teacher_tokenizer(path: str | Path, tok: Any) -> None:
    """Refuse a teacher whose tokenizer is not the student's `tok` (the same vocabulary: token
    string -> id), since per-token log-probabilities are compared by id.

    Raises:
        ValueError: the teacher's directory has no tokenizer, or its vocabulary differs (names
            `algo.teacher_path`).
    """
    from transformers import AutoTokenizer

    try:
        theirs = AutoTokenizer.from_pretrained(str(path)).get_vocab()
    except (OSError, ValueError) as e:
        raise ValueError(f"algo.teacher_path={path}: no tokenizer to compare with the policy's "
                         f"({e})") from None
    if theirs != tok.get_vocab():
        raise ValueError(f"algo.teacher_path={path}: the teacher's tokenizer is not the policy's "
                         f"({len(theirs)} vs {len(tok.get_vocab())} tokens, or other ids): "
                         "distillation compares log-probabilities token id by token id")


@torch.no_grad()
def teacher_logprobs(teacher: Any, batch: dict[str, Any], *, temperature: float = 1.0,
                     micro_batch_size: int = 16) -> torch.Tensor:
    """(B, T) float32 log pi_teacher of every token of `batch["input_ids"]` given those before
    it, 0 at t = 0 and on padding, on the batch's device: `agentrl.placement.frozen_logprobs`
    of the inline `teacher` model (what a teacher worker computes).

    Args:
        teacher: the frozen teacher (`load_teacher`).
        batch: `input_ids`, `attention_mask` (B, T), `lengths` (B,).
        temperature: the sampler's (logits / temperature).
        micro_batch_size: rows per forward.

    Raises:
        ValueError: a token id is outside the teacher's vocabulary (another tokenizer; names
            `algo.teacher_path`).
    """
    from agentrl.placement import frozen_logprobs

    try:
        out = frozen_logprobs(teacher, batch["input_ids"], batch["attention_mask"], batch["lengths"],
                              temperature=temperature, micro_batch_size=micro_batch_size)
    except ValueError as e:
        raise ValueError(f"algo.teacher_path: {e}") from None
    return out.to(batch["input_ids"].device)


def prepare(batch: dict[str, Any], learner: Any, cfg: Any) -> tuple[dict[str, Any], dict]:
    """`old_logprobs` (the student, learner forward) and `teacher_logprobs` (B, T): from the
    teacher worker when `learner.teacher` is set (`placement.teacher=worker`; a prefetched
    result of the same rows when the loop started one), else from the inline teacher.

    Returns:
        the batch and `reverse_kl` (mean over agent tokens of log pi_student - log pi_teacher).
    """
    batch["old_logprobs"] = learner.logprobs(batch)
    remote = getattr(learner, "teacher", None)
    if remote is not None:
        batch["teacher_logprobs"] = remote.logprobs(batch)
    else:
        teacher = load_teacher(cfg.teacher_path, getattr(learner, "device", "cpu"))
        batch["teacher_logprobs"] = teacher_logprobs(
            teacher, batch, temperature=float(getattr(learner, "temperature", 1.0)),
            micro_batch_size=int(getattr(learner, "micro_batch_size", 16)))
    m = batch["loss_mask"] != 0
    gap = (batch["old_logprobs"] - batch["teacher_logprobs"])[m]
    return batch, {"reverse_kl": float(gap.mean()) if gap.numel() else 0.0}


def advantages(batch: dict[str, Any], cfg: Any) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token teacher signal (+ the env reward's group advantage when
    `cfg.distill_reward_coef > 0`).

    Args:
        batch: `loss_mask`, `old_logprobs`, `teacher_logprobs` (B, T); `scores`, `group_ids`
            (B,).
        cfg: AlgoConfig (`distill_coef`, `distill_reward_coef`, `scale`).

    Returns:
        (B, T) float32 advantages (0 off the mask) and the group metrics of the env reward plus
        `reverse_kl`.
    """
    mask = batch["loss_mask"] != 0
    signal = torch.where(mask, batch["teacher_logprobs"].float() - batch["old_logprobs"].float(), 0.0)
    adv = cfg.distill_coef * signal
    if cfg.distill_reward_coef > 0:
        env = group_advantages(batch["scores"], batch["group_ids"], scale=cfg.scale)
        adv = adv + cfg.distill_reward_coef * expand_to_tokens(env, batch["loss_mask"]).float()
    stats = group_stats(batch["scores"], batch["group_ids"])
    stats["reverse_kl"] = float(-signal[mask].mean()) if bool(mask.any()) else 0.0
    return adv, stats


#: GRPO's clipped surrogate (+ KL, - entropy) on the per-token advantages
loss = grpo.loss
idle_zero_advantage_rows = grpo.idle_zero_advantage_rows
