"""The ratio metrics of the policy losses (PPO, CISPO: per token; GSPO: per sequence): the mean,
min and max of the importance ratio over what counts (agent tokens; sequences with agent
tokens), exactly 1.0 each when nothing counts, and the metric keys in their logged order."""

from __future__ import annotations

import pytest
import torch

from agentrl.algos.losses import (
    LOGRATIO_CLAMP,
    cispo_policy_loss,
    gspo_policy_loss,
    ppo_policy_loss,
)

torch.set_num_threads(1)


def _inputs(seed: int, empty: bool):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(3, 5, generator=g) * 3
    old = logp + (torch.rand(3, 5, generator=g) - 0.5)
    adv = torch.randn(3, 5, generator=g)
    mask = (torch.rand(3, 5, generator=g) > 0.3).float()
    mask[1] = 0  # a row without agent tokens
    if empty:
        mask.zero_()
    return logp, old, adv, mask


def _want(ratio: torch.Tensor, valid: torch.Tensor) -> dict[str, float]:
    if not bool(valid.any()):
        return {"ratio_mean": 1.0, "ratio_min": 1.0, "ratio_max": 1.0}
    r = ratio[valid]
    return {"ratio_mean": float(r.mean()), "ratio_min": float(r.min()), "ratio_max": float(r.max())}


@pytest.mark.parametrize("empty", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ratio_metrics_of_each_policy_loss(seed, empty):
    logp, old, adv, mask = _inputs(seed, empty)
    m = mask != 0
    token_ratio = torch.exp((logp - old).clamp(-LOGRATIO_CLAMP, LOGRATIO_CLAMP))
    tokens = m.sum(-1)
    seq_ratio = torch.exp(torch.where(m, logp - old, 0.0).sum(-1) / tokens.clamp(min=1))
    for fn, kw, ratio, valid, keys in (
            (ppo_policy_loss, {"dual_clip": 3.0}, token_ratio, m,
             ["dual_clipfrac", "clipfrac", "approx_kl", "ratio_mean", "ratio_min", "ratio_max", "pg_loss"]),
            (ppo_policy_loss, {}, token_ratio, m,
             ["clipfrac", "approx_kl", "ratio_mean", "ratio_min", "ratio_max", "pg_loss"]),
            (cispo_policy_loss, {}, token_ratio, m,
             ["clipfrac", "clipfrac_high", "approx_kl", "ratio_mean", "ratio_min", "ratio_max", "pg_loss"]),
            (gspo_policy_loss, {"clip_low": 0.2, "clip_high": 0.2}, seq_ratio, tokens > 0,
             ["clipfrac", "approx_kl", "ratio_mean", "ratio_min", "ratio_max", "pg_loss"])):
        _, metrics = fn(logp, old, adv, mask, **kw)
        assert list(metrics) == keys, fn.__name__
        got = {k: metrics[k] for k in ("ratio_mean", "ratio_min", "ratio_max")}
        want = _want(ratio, valid)
        if empty:
            assert got == want  # exactly 1.0
        else:
            assert got == pytest.approx(want, rel=1e-6), fn.__name__
