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
is frozen, in eval mode, dropout off. `prepare` reads it as `learner.teacher`, which the run's
builder sets (`agentrl.learner.frozen.make_teacher`): inline (`placement.teacher=inline`) an
`agentrl.learner.frozen.InlineFrozenModel`, loaded once per process on the learner's device, its
forward run in `prepare` without gradient; on a worker (`placement.teacher=worker`) a
`agentrl.learner.frozen.RemoteFrozenModel`, whose logprobs the training loop starts as soon as a
batch is sampled (the reference worker's pipeline), and `prepare` takes the result. Both compute
`agentrl.learner.frozen.frozen_logprobs` (the same micro-batches, trimmed the same way), so the two
are equal (bit for bit in float32 on CPU, tested).

`algo.distill_kl` picks the teacher signal:
- `sampled` (the default, above): the one-sample estimate as a per-token advantage.
- `full`: the exact per-token reverse KL at the student's sampled prefixes y_<t,

      KL_t = sum_v p_s(v | y_<t) (log p_s(v | y_<t) - log p_t(v | y_<t))

  computed from both models' whole next-token distributions and added to the loss,
  `distill_coef * token-mean(KL_t)`, differentiated through p_s (GKD, Agarwal et al. 2024,
  the generalized JSD at beta -> 1, i.e. the reverse KL, on student samples, lambda = 1;
  MiniLLM, Gu et al. 2024, the per-step reverse KL). No sampling variance: every token of the
  vocabulary is scored at every sampled position. The sampled prefixes are data (no gradient
  through the sampling), as in GKD. The env reward, when `distill_reward_coef > 0`, stays the
  clipped surrogate of its GRPO advantage.
- `topk`: KL_t over k + 1 outcomes, the teacher's `distill_topk` most likely tokens K_t and
  one bucket for all the others, p(rest) = 1 - sum_{v in K_t} p(v):

      KL^k_t = sum_{v in K_t} p_s(v) (log p_s(v) - log p_t(v)) + p_s(rest) (log p_s(rest) - log p_t(rest))

  a lower bound of KL_t (merging outcomes cannot raise a KL: the log-sum inequality), equal to
  it when k = V; what a teacher that sends only its top k per position allows.

- `forward`: the forward KL at the same prefixes, sum_v p_t(v) (log p_t(v) - log p_s(v)),
  added to the loss the same way: cross-entropy to the teacher's soft next-token labels at the
  student's own prefixes (GKD's beta = 0 end, Agarwal et al. 2024; mode covering, where the
  reverse KL is mode seeking).

GKD's mixture (`algo.distill_teacher_fraction` = 1 - lambda, Agarwal et al. 2024, arXiv
2306.13649, Algorithm 1 and sec. 3.1): of each step's `rollout.tasks_per_step` tasks,
n_T = round(fraction x tasks_per_step) are played by the teacher (an in-process hf engine with
the teacher's weights, built by `agentrl.run.teacher_engine`: algos import no engine; the episodes run through the same agent loop, so the
teacher's tokens are kept exactly as it sampled them and their loss_mask covers its generated
tokens only) and the other tasks by the student. The loss is the same token-level divergence
D (`distill_kl`) on both kinds of rows, averaged over all agent tokens:

    L = (1 / N) sum_{rows i} sum_{agent tokens t of i} D(p_t(. | y^i_<t) || p_s(. | y^i_<t))

where y^i is the student's sample (on-policy, GKD's lambda share) or the teacher's (GKD's
"fixed dataset" of teacher outputs, here sampled fresh). With `distill_kl=forward`, on a
teacher row D = sum_v p_t(v) (log p_t(v) - log p_s(v)): cross-entropy to the teacher's soft
labels along its own sequences (word- and sequence-level KD, Kim & Rush 2016), the signal a
random student gets where its own samples score nothing. GKD draws the batch's source once per
step (u ~ U(0, 1) <= lambda); here a fixed share of every step's tasks is the teacher's (the
same mixture in expectation, with less variance between steps). The teacher's rows carry
`batch["teacher_rows"]` (B,) bool; their sampler log-probabilities (the teacher engine's) are
kept as `teacher_sampler_logprobs` and replaced by the student's in `sampler_logprobs`, so that
the learner's sampler/learner mismatch metrics and TIS weights read student rows only;
`rollout/teacher_sampler_gap` is mean |teacher engine's logprob - inline teacher's logprob| over
the teacher's tokens (~1e-6 in float32: the same tokens, the same weights). `sampled` is refused
with a teacher fraction (its policy gradient is on-policy), and so are the env reward and the
setups the teacher engine does not run in (`AlgoConfig.distill_teacher_fraction`).

`full`, `topk` and `forward` run the inline teacher (`placement.teacher=worker` is refused at start-up:
the worker returns sampled-token log-probabilities only) and keep a (B, T, V) or (B, T, k)
teacher tensor in the batch.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentrl.algos.advantages import expand_to_tokens, group_advantages, group_stats
from agentrl.algos.configs import DistillConfig
from agentrl.algos.grpo import GRPO
from agentrl.algos.losses import aggregate


def embedding_rows(path: str | Path) -> int | None:
    """The `vocab_size` (embedding rows) of a model directory's config.json (its `text_config`'s
    for a vision-language model); None when it cannot be read."""
    try:
        c = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    v = c.get("vocab_size", (c.get("text_config") or {}).get("vocab_size"))
    return int(v) if isinstance(v, int) else None


def check_teacher_tokenizer(path: str | Path, tok: Any) -> None:
    """Refuse a teacher whose tokenizer is not the student's `tok` (the same vocabulary: token
    string -> id), since per-token log-probabilities are compared by id. The models' embedding
    rows are not compared: a teacher with padding rows beyond the tokenizer (Qwen2.5-7B's 152,064
    for 0.5B's 151,936, the same tokenizer) is accepted, its padding rows sliced off
    (`agentrl.learner.frozen.InlineFrozenModel.vocab_logprobs`, `common_vocab`).

    Raises:
        ValueError: the teacher's directory has no tokenizer, its vocabulary differs (names
            `algo.teacher_path` and both tokenizers' sizes), or its model has fewer embedding
            rows than its tokenizer has tokens.
    """
    from transformers import AutoTokenizer

    try:
        theirs = AutoTokenizer.from_pretrained(str(path)).get_vocab()
    except (OSError, ValueError) as e:
        raise ValueError(f"algo.teacher_path={path}: no tokenizer to compare with the policy's "
                         f"({e})") from None
    if theirs != tok.get_vocab():
        raise ValueError(f"algo.teacher_path={path}: the teacher's tokenizer is not the policy's "
                         f"(the teacher's has {len(theirs)} tokens, the policy's {len(tok.get_vocab())}"
                         f"{'' if len(theirs) != len(tok.get_vocab()) else ', with other ids'}): "
                         "distillation compares log-probabilities token id by token id")
    rows = embedding_rows(path)
    if rows is not None and rows < len(tok):
        raise ValueError(f"algo.teacher_path={path}: the teacher's model has {rows} embedding rows, "
                         f"fewer than the {len(tok)} tokens of its tokenizer")


def common_vocab(student_logp: torch.Tensor, teacher_width: int) -> torch.Tensor:
    """The student's (B, T, V_s) log-probabilities over the teacher's V_t ids: unchanged when
    V_s = V_t; when the student's embedding matrix has padding rows beyond the tokenizer
    (V_s > V_t, the teacher's distribution being over the tokenizer's ids, see
    `agentrl.learner.frozen.frozen_vocab_logprobs`), those rows are sliced off and the rest
    renormalised (= log_softmax of the sliced logits), with gradient.

    Raises:
        ValueError: V_s < V_t (the student cannot score some of the teacher's tokens), naming both.
    """
    v_s = student_logp.shape[-1]
    if v_s == teacher_width:
        return student_logp
    if v_s < teacher_width:
        raise ValueError(f"the teacher's distribution covers {teacher_width} token ids, the student's "
                         f"logits only {v_s}: the two do not share a tokenizer")
    s = student_logp[..., :teacher_width]
    return s - s.logsumexp(-1, keepdim=True)


def full_reverse_kl(student_logp: torch.Tensor, teacher_logp: torch.Tensor) -> torch.Tensor:
    """Exact reverse KL per position, KL(p_s || p_t) = sum_v p_s(v) (log p_s(v) - log p_t(v))
    (GKD, Agarwal et al. 2024; MiniLLM, Gu et al. 2024), with gradient through `student_logp`.

    Args:
        student_logp, teacher_logp: (B, T, V) log-probabilities over the vocabulary (rows that
            are all 0, e.g. t = 0 or padding, give finite garbage: read the result through a mask).

    Returns:
        (B, T) KL in nats (>= 0; 0, and 0 gradient, where the two distributions are equal).
    """
    return (student_logp.exp() * (student_logp - teacher_logp.to(student_logp.dtype))).sum(-1)


def full_forward_kl(student_logp: torch.Tensor, teacher_logp: torch.Tensor) -> torch.Tensor:
    """Exact forward KL per position, KL(p_t || p_s) = sum_v p_t(v) (log p_t(v) - log p_s(v)),
    with gradient through `student_logp` (d/dz_s = p_s - p_t: cross-entropy to the teacher's
    soft labels); GKD's beta = 0 end on student samples (Agarwal et al. 2024, sec. 3). Shapes
    and masking as `full_reverse_kl`.

    Returns:
        (B, T) nats (>= 0; 0, and 0 gradient, where the two distributions are equal).
    """
    t = teacher_logp.to(student_logp.dtype)
    return (t.exp() * (t - student_logp)).sum(-1)


def topk_reverse_kl(student_logp: torch.Tensor, teacher_topk_logp: torch.Tensor,
                    teacher_topk_ids: torch.Tensor, *, eps: float = 1e-12) -> torch.Tensor:
    """Reverse KL per position over the teacher's top k tokens plus one bucket for the rest:
    sum_{v in K} p_s(v) (log p_s(v) - log p_t(v)) + p_s(rest) (log p_s(rest) - log p_t(rest)),
    p(rest) = 1 - sum_{v in K} p(v) (clamped at `eps`). A lower bound of `full_reverse_kl` (the
    log-sum inequality), equal to it (up to `eps`) when K is the whole vocabulary.

    Args:
        student_logp: (B, T, V) the student's log-probabilities, with gradient.
        teacher_topk_logp, teacher_topk_ids: (B, T, k) the teacher's k largest log-probabilities
            and their token ids.

    Returns:
        (B, T) nats.
    """
    ids = teacher_topk_ids.to(student_logp.device)
    s_k = student_logp.gather(-1, ids)
    t_k = teacher_topk_logp.to(student_logp)
    head = (s_k.exp() * (s_k - t_k)).sum(-1)
    s_rest = (1 - s_k.exp().sum(-1)).clamp(min=eps)
    t_rest = (1 - t_k.exp().sum(-1)).clamp(min=eps)
    return head + s_rest * (s_rest.log() - t_rest.log())


def teacher_task_count(fraction: float, tasks_per_step: int) -> int:
    """n_T = round(fraction x tasks_per_step), the tasks of a step the teacher plays (GKD's
    1 - lambda share; Python's round, halves to even: 0.5 x 3 -> 2, 0.5 x 5 -> 2)."""
    return int(round(fraction * tasks_per_step))


def check_tokenizer(cfg: Any, tok: Any) -> None:
    """`Distill.check_tokenizer`, before any work: the teacher (`cfg.teacher_path`, AlgoConfig) has the policy's
    tokenizer `tok` (per-token log-probabilities are compared by id; `check_teacher_tokenizer`).

    Raises:
        ValueError: the tokenizers differ (the loop reports it as a config error).
    """
    check_teacher_tokenizer(cfg.teacher_path, tok)


def mark_mixture_rows(trajs: list[Any], policy_version: int) -> None:
    """`Distill.mark_mixture_rows`: for the episodes of the run's second sampler (GKD's mixture: the teacher's
    engine, `agentrl.rollout.stages.Loop.mixture_engine`): tag them `info["sampler"] = "teacher"`
    (read by `agentrl.algos.shaping.build_batch` into `batch["teacher_rows"]`) and set
    `policy_version` to the student's current one, so that the staleness filter
    (`train.max_staleness`), which bounds how far behind the student's weights a sample is,
    never drops the frozen teacher's."""
    for t in trajs:
        t.info["sampler"] = "teacher"
        t.policy_version = policy_version


def mixture_metrics(trajs: list[Any], success: Callable[[Any], bool]) -> dict[str, float]:
    """`Distill.mixture_metrics`, with the rollout metrics: with GKD's mixture (rows tagged by
    `mark_mixture_rows`), `rollout/teacher_reward_mean` and `rollout/teacher_pass_rate` over the
    teacher's episodes and `rollout/student_...` over the student's (`success(traj)`: did it
    solve its task); {} without teacher rows."""
    teach = [t.info.get("sampler") == "teacher" for t in trajs]
    if not any(teach):
        return {}
    m: dict[str, float] = {}
    for name, sel in (("teacher", True), ("student", False)):
        ts = [t for t, k in zip(trajs, teach) if k == sel]
        r = [t.episode_return for t in ts if t.episode_return == t.episode_return]
        m[f"rollout/{name}_reward_mean"] = float(np.mean(r)) if r else float("nan")
        m[f"rollout/{name}_pass_rate"] = float(np.mean([success(t) for t in ts])) if ts else float("nan")
    return m


class Distill(GRPO):
    """On-policy distillation: the teacher's signal as per-token advantages (`sampled`) or a KL
    term of the loss (`full`, `topk`, `forward`), on GRPO's clipped surrogate."""

    name = "distill"
    config = DistillConfig
    needs_teacher = True

    def turn_advantages(self, cfg: Any) -> bool:
        """No: per-token teacher signals (+ the episode's env advantage)."""
        return False

    def check_tokenizer(self, cfg: Any, tok: Any) -> None:
        """The teacher has the policy's tokenizer (`check_tokenizer`)."""
        check_tokenizer(cfg, tok)

    def mark_mixture_rows(self, trajs: list[Any], policy_version: int) -> None:
        """The teacher's episodes of GKD's mixture (`mark_mixture_rows`)."""
        mark_mixture_rows(trajs, policy_version)

    def mixture_metrics(self, trajs: list[Any], success: Any) -> dict[str, float]:
        """Teacher and student rollout metrics of GKD's mixture (`mixture_metrics`)."""
        return mixture_metrics(trajs, success)

    def wants_vocab_logprobs(self, cfg: Any) -> bool:
        """The learner passes the student's (B, T, V) log-probabilities to `loss` (`full`, `topk`)."""
        return cfg.distill_kl != "sampled"

    def prepare(self, batch: dict[str, Any], learner: Any, cfg: Any) -> tuple[dict[str, Any], dict]:
        """`old_logprobs` (the student, learner forward) and `teacher_logprobs` (B, T) from
        `learner.teacher` (the run's builder sets it: `agentrl.learner.frozen.make_teacher`): the
        teacher worker (`placement.teacher=worker`; a prefetched result of the same rows when the
        loop started one) or the inline teacher, which with `distill_kl=full|topk|forward` also
        gives its whole next-token distributions (`teacher_vocab_logprobs` (B, T, V), or
        `teacher_topk_logprobs` and `teacher_topk_ids` (B, T, k)).

        With GKD's mixture (`batch["teacher_rows"]`, (B,) bool, from `agentrl.algos.shaping.build_batch`):
        the teacher rows' `sampler_logprobs` (the teacher engine's) move to
        `teacher_sampler_logprobs` and are replaced by the student's `old_logprobs`, so the learner's
        mismatch metrics and TIS weights read student rows only.

        Returns:
            the batch and `reverse_kl` (mean over the student's agent tokens of log pi_student -
            log pi_teacher); with teacher rows also `teacher_rows` (their count),
            `forward_kl_teacher_rows` (mean over their agent tokens of log pi_teacher -
            log pi_student, a one-sample forward KL) and `teacher_sampler_gap` (mean |teacher
            engine's logprob - inline teacher's| there, nats).

        Raises:
            ValueError: `learner.teacher` is not set; a teacher worker with `distill_kl` other
                than `sampled`; a token id outside the teacher's vocabulary.
        """
        batch["old_logprobs"] = learner.logprobs(batch)
        teacher = learner.teacher
        if teacher is None:
            raise ValueError("algo.name=distill: learner.teacher is not set (the run's builder sets it: "
                             "agentrl.learner.frozen.make_teacher)")
        mode = cfg.distill_kl
        if mode != "sampled":  # full, forward: (B, T, V); topk: (B, T, k)
            out = teacher.vocab_logprobs(batch, topk=cfg.distill_topk if mode == "topk" else None)
            batch["teacher_logprobs"] = out.pop("logprobs")
            batch.update({f"teacher_{k}": v for k, v in out.items()})
        else:
            batch["teacher_logprobs"] = teacher.logprobs(batch)
        m = batch["loss_mask"] != 0
        stats: dict[str, float] = {}
        rows = batch.get("teacher_rows")
        if rows is not None and bool(rows.any()):  # GKD's mixture: the teacher's own samples
            trow = rows.to(m.device)[:, None] & m
            batch["teacher_sampler_logprobs"] = batch["sampler_logprobs"].clone()
            batch["sampler_logprobs"] = torch.where(rows[:, None].to(m.device), batch["old_logprobs"].to(
                batch["sampler_logprobs"]), batch["sampler_logprobs"])
            fwd = (batch["teacher_logprobs"] - batch["old_logprobs"])[trow]  # one-sample forward KL
            stats["forward_kl_teacher_rows"] = float(fwd.mean()) if fwd.numel() else 0.0
            sgap = (batch["teacher_sampler_logprobs"] - batch["teacher_logprobs"])[trow].abs()
            stats["teacher_sampler_gap"] = float(sgap.mean()) if sgap.numel() else 0.0
            stats["teacher_rows"] = float(rows.sum())
            m = m & ~rows.to(m.device)[:, None]
        gap = (batch["old_logprobs"] - batch["teacher_logprobs"])[m]  # the student's own rows
        stats["reverse_kl"] = float(gap.mean()) if gap.numel() else 0.0
        return batch, stats

    def advantages(self, batch: dict[str, Any], cfg: Any) -> tuple[torch.Tensor, dict[str, float]]:
        """Per-token teacher signal (+ the env reward's group advantage when
        `cfg.distill_reward_coef > 0`).

        Args:
            batch: `loss_mask`, `old_logprobs`, `teacher_logprobs` (B, T); `scores`, `group_ids`
                (B,).
            cfg: AlgoConfig (`distill_coef`, `distill_reward_coef`, `scale`).

        Returns:
            (B, T) float32 advantages (0 off the mask) and the group metrics of the env reward plus
            `reverse_kl` (over the student's rows when `batch["teacher_rows"]` is given).
        """
        mask = batch["loss_mask"] != 0
        signal = torch.where(mask, batch["teacher_logprobs"].float() - batch["old_logprobs"].float(), 0.0)
        if batch.get("teacher_rows") is not None:  # `reverse_kl` over the student's own rows
            mask = mask & ~batch["teacher_rows"].to(mask.device)[:, None]
        # full / topk: the teacher signal is the KL term of `loss`, not an advantage
        adv = cfg.distill_coef * signal if not self.wants_vocab_logprobs(cfg) else torch.zeros_like(signal)
        if cfg.distill_reward_coef > 0:
            env = group_advantages(batch["scores"], batch["group_ids"], scale=cfg.scale)
            adv = adv + cfg.distill_reward_coef * expand_to_tokens(env, batch["loss_mask"]).float()
        stats = group_stats(batch["scores"], batch["group_ids"])
        stats["reverse_kl"] = float(-signal[mask].mean()) if bool(mask.any()) else 0.0
        return adv, stats

    def loss(self, logp: torch.Tensor, batch: dict[str, Any], cfg: Any, *, num_tokens: float,
             num_seqs: int, entropy: torch.Tensor | None = None,
             vocab_logp: torch.Tensor | None = None, **kw: Any) -> tuple[torch.Tensor, dict[str, Any]]:
        """GRPO's clipped surrogate (+ KL to the reference, - entropy) on the per-token advantages;
        with `distill_kl=full|topk` plus `distill_coef * token-mean(KL_t)` over agent tokens
        (`full_reverse_kl` / `topk_reverse_kl` of `vocab_logp` (B, T, V) against the batch's
        `teacher_vocab_logprobs` / `teacher_topk_*`), normalised by the minibatch's `num_tokens`.
        The KL term covers every agent token, the teacher's rows of GKD's mixture included (the same
        formula at the teacher's own prefixes)."""
        total, metrics = super().loss(logp, batch, cfg, num_tokens=num_tokens, num_seqs=num_seqs,
                                         entropy=entropy)
        if not self.wants_vocab_logprobs(cfg):
            return total, metrics
        if vocab_logp is None:
            raise ValueError(f"algo.distill_kl={cfg.distill_kl}: the loss needs the student's vocab_logp")
        W = vocab_logp.shape[1]
        if cfg.distill_kl == "full":
            tv = batch["teacher_vocab_logprobs"][:, :W]
            k = full_reverse_kl(common_vocab(vocab_logp, tv.shape[-1]), tv)
        elif cfg.distill_kl == "forward":
            tv = batch["teacher_vocab_logprobs"][:, :W]
            k = full_forward_kl(common_vocab(vocab_logp, tv.shape[-1]), tv)
        else:
            k = topk_reverse_kl(vocab_logp, batch["teacher_topk_logprobs"][:, :W], batch["teacher_topk_ids"][:, :W])
        mask = batch["loss_mask"][:, :W]
        k = torch.where(mask != 0, k, 0.0)  # t = 0 and padding rows are all-0 "distributions"
        kl_term = aggregate(k, mask, "token-mean", num_tokens=num_tokens)
        metrics["distill_kl"] = float(kl_term.detach())
        return total + cfg.distill_coef * kl_term, metrics

    def idle_zero_advantage_rows(self, cfg: Any) -> bool:
        """As GRPO's, but never with `distill_kl=full|topk` (their signal is in the loss, not the
        advantages)."""
        return super().idle_zero_advantage_rows(cfg) and not self.wants_vocab_logprobs(cfg)
