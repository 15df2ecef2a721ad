"""Policy and value losses: pure functions over `(B, T)` tensors.

The KL estimators are in `kl.py`, the truncated importance weights in `tis.py`, log-probabilities
and entropy from logits in `logits.py`, the DPO loss in `dpo.py`.

Conventions (see docs/algorithms.md):

- `loss_mask[b, t] != 0` marks a token the policy sampled; every loss, KL and metric is taken
  over those tokens only, and values at masked positions (any value, even NaN) never reach a
  loss or a gradient.
- Log-probabilities are natural-log per token; ratios and KL are computed in float32 (bf16 and
  fp16 are upcast; float64 stays float64).
- Losses are minimised. Each `*_loss` returns `(loss, metrics)`: a 0-dim tensor and a dict of
  Python floats (the caller prefixes keys, e.g. `loss/clipfrac`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from agentrl.algos.advantages import _check_2d as _check_same
from agentrl.algos.advantages import _float_dtype

__all__ = [
    "AGG_MODES",
    "masked_mean",
    "aggregate",
    "ppo_policy_loss",
    "gspo_policy_loss",
    "cispo_policy_loss",
    "value_loss",
]

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
LOGRATIO_CLAMP = 20.0
"""|log-ratio| and |ref - logp| are clamped to this before `exp` (exp(20) ~ 4.9e8)."""

Count = int | float | Tensor


# -- helpers ---------------------------------------------------------------------------------
def _per_token(advantages: Tensor, loss_mask: Tensor) -> Tensor:
    """(B,) or (B, T) advantages as (B, T)."""
    if advantages.shape == loss_mask.shape:
        return advantages
    if advantages.shape == loss_mask.shape[:1]:
        return advantages[:, None].expand_as(loss_mask)
    raise ValueError(
        f"advantages must be (B,) or (B, T) = {tuple(loss_mask.shape)}, "
        f"got {tuple(advantages.shape)}"
    )


def _denominator(count: Count, like: Tensor) -> Tensor:
    return torch.as_tensor(count, dtype=like.dtype, device=like.device).clamp(min=1)


def _f(x: Tensor) -> float:
    return float(x.detach())


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of `x` over entries where `mask` is nonzero; 0 (not NaN) when there are none.

    Args:
        x: any shape.
        mask: broadcastable to `x`, 0/1 (nonzero counts as 1).
        dim: reduce this dimension only, or all (None).

    Returns:
        0-dim tensor (dim=None) or `x` reduced over `dim`. Values of `x` at masked entries
        never reach the result or its gradient.
    """
    m = (mask != 0).expand_as(x) if mask.shape != x.shape else mask != 0
    total = torch.where(m, x, 0.0)
    if dim is None:
        return total.sum() / m.sum().clamp(min=1)
    return total.sum(dim) / m.sum(dim).clamp(min=1)


# -- aggregation -----------------------------------------------------------------------------
def aggregate(
    loss: Tensor,
    loss_mask: Tensor,
    mode: str,
    *,
    num_tokens: Count | None = None,
    num_seqs: Count | None = None,
    max_len: int | None = None,
) -> Tensor:
    """Reduce a per-token loss to a scalar over agent tokens.

    Modes (M = loss_mask, L = loss):
    - `token-mean`: sum(L*M) / N_tok, N_tok = `num_tokens` or sum(M). Each token weighs the
      same (DAPO, Yu et al. 2025, sec. 3.3).
    - `seq-mean-token-mean`: mean over sequences of each sequence's token mean; the number of
      sequences is `num_seqs` or the number of rows with at least one agent token (all-masked
      rows contribute nothing). The original GRPO aggregation (Shao et al. 2024).
    - `seq-mean-token-sum-norm`: sum(L*M) / (N_seq * L_max), N_seq = `num_seqs` or B (all
      rows), L_max = `max_len` or T. A constant normaliser (Dr. GRPO, Liu et al. 2025). Pass
      `max_len` (the generation budget), otherwise the result depends on padding width.

    Micro-batching: pass the counts of the whole optimizer batch as `num_tokens` / `num_seqs`
    (and the same `max_len`) to every micro-batch; then the sum of the micro-batch losses, and
    of their gradients, equals the full-batch value (case L2). Under data parallelism whose
    all-reduce averages gradients, multiply the loss by the world size.

    Args:
        loss: (B, T) per-token loss (values at masked positions are ignored).
        loss_mask: (B, T) 0/1.
        mode: one of AGG_MODES.
        num_tokens: global agent-token count (token-mean).
        num_seqs: global sequence count (seq modes).
        max_len: L_max for seq-mean-token-sum-norm.

    Returns:
        0-dim tensor; 0 (not NaN) when no token is valid.

    Raises:
        ValueError: unknown mode or shape mismatch.
    """
    _check_same(loss_mask, loss=loss)
    m = loss_mask != 0
    masked = torch.where(m, loss, 0.0)
    if mode == "token-mean":
        n_tok = m.sum() if num_tokens is None else num_tokens
        return masked.sum() / _denominator(n_tok, masked)
    if mode == "seq-mean-token-mean":
        tokens = m.sum(dim=-1)
        seq = masked.sum(dim=-1) / tokens.clamp(min=1)
        n_seq = (tokens > 0).sum() if num_seqs is None else num_seqs
        return seq.sum() / _denominator(n_seq, masked)
    if mode == "seq-mean-token-sum-norm":
        b, t_len = loss_mask.shape
        n_seq = b if num_seqs is None else num_seqs
        length = t_len if max_len is None else max_len
        return masked.sum() / (_denominator(n_seq, masked) * max(length, 1))
    raise ValueError(f"unknown aggregation {mode!r}; allowed: {', '.join(AGG_MODES)}")


# -- policy losses ---------------------------------------------------------------------------
def _logratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    dtype = _float_dtype(logp, old_logp)
    lp = torch.where(mask, logp.to(dtype), 0.0)
    old = torch.where(mask, old_logp.detach().to(dtype), 0.0)
    return lp - old


def _ratio_stats(ratio: Tensor, valid: Tensor) -> dict[str, float]:
    """`ratio_mean`, `ratio_min`, `ratio_max` of `ratio` where the bool `valid` (same shape) is
    set: the policy losses' ratio metrics; 1.0 each when nothing is valid."""
    if not bool(valid.any()):
        return {"ratio_mean": 1.0, "ratio_min": 1.0, "ratio_max": 1.0}
    return {"ratio_mean": _f(masked_mean(ratio, valid)), "ratio_min": _f(ratio[valid].min()),
            "ratio_max": _f(ratio[valid].max())}


def _check_clip(clip_low: float, clip_high: float) -> None:
    if not 0.0 <= clip_low < 1.0:
        raise ValueError(f"clip_low must be in [0, 1), got {clip_low}")
    if clip_high < 0.0:
        raise ValueError(f"clip_high must be >= 0, got {clip_high}")


def ppo_policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    agg: str = "token-mean",
    num_tokens: Count | None = None,
    num_seqs: Count | None = None,
    max_len: int | None = None,
    tis_weights: Tensor | None = None,
    dual_clip: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Clipped surrogate policy loss, per token, aggregated over agent tokens.

        r_t  = exp(logp_t - old_logp_t)
        l_t  = max(-A_t * r_t, -A_t * clip(r_t, 1 - clip_low, 1 + clip_high))
        dual clip (A_t < 0 only): l_t = min(l_t, -A_t * dual_clip)
        loss = aggregate(w_t * l_t)         w_t = tis_weights (1 if None)

    Sources: Schulman et al. 2017, "Proximal Policy Optimization Algorithms", eq. 7;
    asymmetric clip-higher: DAPO (Yu et al. 2025), sec. 3.1; dual clip: Ye et al. 2020,
    "Mastering Complex Control in MOBA Games with Deep RL", eq. 5; truncated IS: Yao et al.
    2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training".

    The log-ratio is computed in float32 and clamped to [-20, 20] before exp. `old_logp`,
    `advantages` and `tis_weights` are detached.

    Args:
        logp: (B, T) current log pi(token), with gradient.
        old_logp: (B, T) log pi_old(token) recomputed at the start of the update.
        advantages: (B, T) per token, or (B,) per sequence (broadcast over its tokens).
        loss_mask: (B, T) 0/1.
        clip_low, clip_high: the ratio is clipped to [1 - clip_low, 1 + clip_high].
        agg, num_tokens, num_seqs, max_len: passed to `aggregate`.
        tis_weights: (B, T) truncated importance weights (see `tis_weights`), or None.
        dual_clip: c > 1 bounding the loss of negative-advantage tokens at -A*c, or None.

    Returns:
        (loss, metrics). metrics (floats, over agent tokens): `clipfrac` (fraction of tokens
        where the clipped term is the active one, i.e. zero gradient), `approx_kl` (mean of
        (r - 1) - log r, a k3 estimate of KL(pi_old || pi)), `ratio_mean`, `ratio_min`,
        `ratio_max` (1.0 when no token is valid), `pg_loss`, and `dual_clipfrac` when dual_clip.

    Raises:
        ValueError: shape mismatch, clip_low outside [0, 1), clip_high < 0, dual_clip <= 1,
            unknown agg.
    """
    _check_same(loss_mask, logp=logp, old_logp=old_logp)
    _check_clip(clip_low, clip_high)
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
    m = loss_mask != 0
    logratio = _logratio(logp, old_logp, m).clamp(-LOGRATIO_CLAMP, LOGRATIO_CLAMP)
    ratio = torch.exp(logratio)
    adv = torch.where(m, _per_token(advantages, loss_mask).detach().to(ratio.dtype), 0.0)

    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    pg = torch.maximum(unclipped, clipped)
    metrics: dict[str, float] = {}
    if dual_clip is not None:
        bound = -adv * dual_clip
        dual_active = (adv < 0) & (pg > bound) & m
        pg = torch.where(adv < 0, torch.minimum(pg, bound), pg)
        metrics["dual_clipfrac"] = _f(masked_mean(dual_active.float(), m))
    if tis_weights is not None:
        _check_same(loss_mask, tis_weights=tis_weights)
        pg = pg * tis_weights.detach().to(pg.dtype)
    loss = aggregate(pg, loss_mask, agg, num_tokens=num_tokens, num_seqs=num_seqs, max_len=max_len)

    with torch.no_grad():
        metrics.update(
            clipfrac=_f(masked_mean((clipped > unclipped).float(), m)),
            approx_kl=_f(masked_mean(ratio - 1.0 - logratio, m)),
            **_ratio_stats(ratio, m),
            pg_loss=_f(loss),
        )
    return loss, metrics


def gspo_policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    *,
    clip_low: float,
    clip_high: float,
    num_seqs: Count | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Group Sequence Policy Optimization: one clipped term per sequence.

        s_i  = exp( (1/|y_i|) * sum_t M_it * (logp_it - old_logp_it) )
        l_i  = max(-A_i * s_i, -A_i * clip(s_i, 1 - clip_low, 1 + clip_high))
        loss = (1/N) * sum_i l_i        over the N sequences with at least one agent token

    Source: Zheng et al. 2025, "Group Sequence Policy Optimization", eq. 5-7. The paper's clip
    ranges are small (clip_low 3e-4, clip_high 4e-4) because s_i is a length-normalised ratio.
    The gradient reaches every agent token of a sequence with weight 1/|y_i|.

    Args:
        logp, old_logp: (B, T) current and old log pi(token).
        advantages: (B,) per sequence, or (B, T) per token, in which case each row's mean over
            its agent tokens is used (equal to the sequence's value when the advantages were
            broadcast with `expand_to_tokens`).
        loss_mask: (B, T) 0/1.
        clip_low, clip_high: the sequence ratio is clipped to [1 - clip_low, 1 + clip_high].
        num_seqs: global number of non-empty sequences under micro-batching (default: local).

    Returns:
        (loss, metrics) with `clipfrac` (fraction of sequences clipped), `ratio_mean`,
        `ratio_min`, `ratio_max` (sequence ratios; 1.0 when none), `approx_kl` (token-level,
        as in `ppo_policy_loss`), `pg_loss`.

    Raises:
        ValueError: shape mismatch or clip values out of range.
    """
    _check_same(loss_mask, logp=logp, old_logp=old_logp)
    _check_clip(clip_low, clip_high)
    m = loss_mask != 0
    logratio = _logratio(logp, old_logp, m)
    tokens = m.sum(dim=-1)
    has_tokens = tokens > 0
    seq_logratio = (logratio.sum(dim=-1) / tokens.clamp(min=1)).clamp(
        -LOGRATIO_CLAMP, LOGRATIO_CLAMP
    )
    ratio = torch.exp(seq_logratio)
    if advantages.shape == loss_mask.shape:
        adv = masked_mean(advantages.detach().to(ratio.dtype), m, dim=-1)
    elif advantages.shape == loss_mask.shape[:1]:
        adv = advantages.detach().to(ratio.dtype)
    else:
        raise ValueError(
            f"advantages must be (B,) or (B, T) = {tuple(loss_mask.shape)}, "
            f"got {tuple(advantages.shape)}"
        )
    adv = torch.where(has_tokens, adv, 0.0)
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_seq = torch.where(has_tokens, torch.maximum(unclipped, clipped), 0.0)
    n_seq = has_tokens.sum() if num_seqs is None else num_seqs
    loss = per_seq.sum() / _denominator(n_seq, per_seq)

    with torch.no_grad():
        token_ratio = torch.exp(logratio.clamp(-LOGRATIO_CLAMP, LOGRATIO_CLAMP))
        metrics = {
            "clipfrac": _f(masked_mean((clipped > unclipped).float(), has_tokens)),
            "approx_kl": _f(masked_mean(token_ratio - 1.0 - logratio, m)),
            **_ratio_stats(ratio, has_tokens),
            "pg_loss": _f(loss),
        }
    return loss, metrics


def cispo_policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    *,
    clip_low: float = 1.0,
    clip_high: float = 0.28,
    agg: str = "token-mean",
    num_tokens: Count | None = None,
    num_seqs: Count | None = None,
    max_len: int | None = None,
    tis_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """CISPO: REINFORCE with a clipped, stop-gradient importance weight on every token.

        r_t  = exp(logp_t - old_logp_t)
        w_t  = sg(clip(r_t, 1 - clip_low, 1 + clip_high))
        l_t  = -w_t * A_t * logp_t
        loss = aggregate(v_t * l_t)        v_t = tis_weights (1 if None)

    Source: MiniMax et al. 2025, "MiniMax-M1: Scaling Test-Time Compute Efficiently with
    Lightning Attention" (arXiv 2506.13585), sec. 3.1, eq. 4-5:
    J(theta) = E[ 1/sum_i |o_i| * sum_i sum_t sg(r^_it) A^_it log pi_theta(o_it | q, o_i,<t) ],
    r^_it = clip(r_it, 1 - eps_low^IS, 1 + eps_high^IS). Unlike the PPO surrogate no token's
    gradient is dropped: a clipped weight only scales it. The paper sets no lower bound
    ("setting eps_low^IS to a large value"): `clip_low=1.0` makes the lower bound 0, which a
    ratio never goes below. Its gradient is -w_t * A_t * d logp_t; the value depends on logp
    itself and is not comparable to a surrogate's.

    Args:
        logp: (B, T) current log pi(token), with gradient.
        old_logp: (B, T) log pi_old(token) (detached).
        advantages: (B, T) per token, or (B,) per sequence.
        loss_mask: (B, T) 0/1.
        clip_low: in [0, 1]; 1 = no lower bound on the weight.
        clip_high: >= 0; the weight is at most 1 + clip_high.
        agg, num_tokens, num_seqs, max_len: passed to `aggregate` (the paper: token-mean).
        tis_weights: (B, T) sampler/learner importance weights, or None.

    Returns:
        (loss, metrics): `clipfrac` (fraction of agent tokens whose weight was clipped, above or
        below), `clipfrac_high`, `approx_kl`, `ratio_mean`, `ratio_min`, `ratio_max` (1.0 when
        no token is valid), `pg_loss`.

    Raises:
        ValueError: shape mismatch, clip_low outside [0, 1], clip_high < 0, unknown agg.
    """
    _check_same(loss_mask, logp=logp, old_logp=old_logp)
    if not 0.0 <= clip_low <= 1.0:
        raise ValueError(f"clip_low must be in [0, 1] (1: no lower bound), got {clip_low}")
    if clip_high < 0.0:
        raise ValueError(f"clip_high must be >= 0, got {clip_high}")
    m = loss_mask != 0
    logratio = _logratio(logp, old_logp, m).clamp(-LOGRATIO_CLAMP, LOGRATIO_CLAMP)
    ratio = torch.exp(logratio)
    weight = ratio.clamp(1.0 - clip_low, 1.0 + clip_high).detach()
    adv = torch.where(m, _per_token(advantages, loss_mask).detach().to(ratio.dtype), 0.0)
    lp = torch.where(m, logp.to(ratio.dtype), 0.0)
    pg = -weight * adv * lp
    if tis_weights is not None:
        _check_same(loss_mask, tis_weights=tis_weights)
        pg = pg * tis_weights.detach().to(pg.dtype)
    loss = aggregate(pg, loss_mask, agg, num_tokens=num_tokens, num_seqs=num_seqs, max_len=max_len)
    with torch.no_grad():
        metrics = {
            "clipfrac": _f(masked_mean((weight != ratio).float(), m)),
            "clipfrac_high": _f(masked_mean((ratio > 1.0 + clip_high).float(), m)),
            "approx_kl": _f(masked_mean(ratio - 1.0 - logratio, m)),
            **_ratio_stats(ratio, m),
            "pg_loss": _f(loss),
        }
    return loss, metrics


# -- value loss ------------------------------------------------------------------------------
def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    loss_mask: Tensor,
    *,
    clip: float | None = None,
    agg: str = "token-mean",
    num_tokens: Count | None = None,
    num_seqs: Count | None = None,
    max_len: int | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Masked (optionally clipped) squared error of the value head.

        plain:   l_t = 0.5 * (V_t - R_t)^2
        clipped: V'_t = old_V_t + clip(V_t - old_V_t, -clip, clip)
                 l_t = 0.5 * max((V_t - R_t)^2, (V'_t - R_t)^2)

    Source: the PPO implementation of Schulman et al. 2017 (OpenAI baselines `ppo2`, as in
    CleanRL); 0.5 is the usual factor.

    Args:
        values: (B, T) current value predictions, with gradient.
        old_values: (B, T) values at rollout time (detached).
        returns: (B, T) value targets, e.g. `gae(...)[1]` (detached).
        loss_mask: (B, T) 0/1.
        clip: clip range (absolute, in reward units) or None for the plain loss.
        agg, num_tokens, num_seqs, max_len: passed to `aggregate`.

    Returns:
        (loss, metrics) with `clipfrac` (fraction of tokens where the clipped error is the
        larger one), `value_mean`, `return_mean`, `vf_loss`.

    Raises:
        ValueError: shape mismatch, clip <= 0, unknown agg.
    """
    _check_same(loss_mask, values=values, old_values=old_values, returns=returns)
    if clip is not None and clip <= 0:
        raise ValueError(f"value clip must be > 0 or None, got {clip}")
    m = loss_mask != 0
    dtype = _float_dtype(values, old_values, returns)
    v = torch.where(m, values.to(dtype), 0.0)
    ret = torch.where(m, returns.detach().to(dtype), 0.0)
    err = (v - ret) ** 2
    clipped_active = torch.zeros_like(m)
    if clip is not None:
        old = torch.where(m, old_values.detach().to(dtype), 0.0)
        v_clipped = old + (v - old).clamp(-clip, clip)
        err_clipped = (v_clipped - ret) ** 2
        clipped_active = (err_clipped > err) & m
        err = torch.maximum(err, err_clipped)
    loss = aggregate(
        0.5 * err, loss_mask, agg, num_tokens=num_tokens, num_seqs=num_seqs, max_len=max_len
    )
    with torch.no_grad():
        metrics = {
            "clipfrac": _f(masked_mean(clipped_active.float(), m)),
            "value_mean": _f(masked_mean(v, m)),
            "return_mean": _f(masked_mean(ret, m)),
            "vf_loss": _f(loss),
        }
    return loss, metrics
