"""Losses: cases L1-L5 of shared/cases/CASES.md, hand-computed PPO/GSPO/value/DPO values, and
property tests."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.algos.dpo import dpo_loss, sequence_logps
from agentrl.algos.kl import kl
from agentrl.algos.logits import entropy_from_logits, logprobs_from_logits
from agentrl.algos.losses import (
    AGG_MODES,
    aggregate,
    gspo_policy_loss,
    masked_mean,
    ppo_policy_loss,
    value_loss,
)
from agentrl.algos.tis import tis_weights

torch.set_num_threads(1)
NAN = float("nan")


def t(x, dtype=torch.float32):
    return torch.tensor(x, dtype=dtype)


L1_LOSS = [[2, 2, 2, 2, 2, 6, 5, 3, 2, 4], [10, 3, 4, 5, 2, 3, 4, 1, 1, 3]]
L1_MASK = [[1, 1, 1, 1, 1, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0, 0, 0, 0, 0]]


# -- aggregation ----------------------------------------------------------------------------
def test_l1_aggregation_modes():
    loss, mask = t(L1_LOSS), t(L1_MASK)
    # token-mean: (5*2 + 10) / 6 = 3.333333
    assert aggregate(loss, mask, "token-mean").item() == pytest.approx(10 / 3, abs=1e-6)
    # seq-mean-token-mean: (mean(2,2,2,2,2) + mean(10)) / 2 = (2 + 10) / 2 = 6
    assert aggregate(loss, mask, "seq-mean-token-mean").item() == pytest.approx(6.0)
    # Dr. GRPO: (10 + 10) / (2 * 10) = 1
    assert aggregate(loss, mask, "seq-mean-token-sum-norm").item() == pytest.approx(1.0)
    assert aggregate(loss, mask, "seq-mean-token-sum-norm", max_len=20).item() == pytest.approx(0.5)
    # an all-masked third row adds nothing to the seq-mean (not (2 + 10 + 0) / 3), but counts
    # as a row for the Dr. GRPO normaliser: 20 / (3 * 10)
    loss3, mask3 = torch.cat([loss, loss[:1]]), torch.cat([mask, torch.zeros(1, 10)])
    assert aggregate(loss3, mask3, "seq-mean-token-mean").item() == pytest.approx(6.0)
    assert aggregate(loss3, mask3, "seq-mean-token-sum-norm").item() == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="unknown aggregation"):
        aggregate(loss, mask, "sum")


@pytest.mark.parametrize("mode", AGG_MODES)
def test_l2_micro_batches_match_full_batch(mode):
    loss_values, mask = t(L1_LOSS), t(L1_MASK)
    w_full = torch.ones(2, 10, requires_grad=True)
    full = aggregate(w_full * loss_values, mask, mode)
    full.backward()

    # two micro-batches of one row; row 1 is cut to width 4 (another padding width)
    w_micro = torch.ones(2, 10, requires_grad=True)
    kw = {"num_tokens": 6, "num_seqs": 2, "max_len": 10}
    part0 = aggregate(w_micro[:1] * loss_values[:1], mask[:1], mode, **kw)
    part1 = aggregate(w_micro[1:, :4] * loss_values[1:, :4], mask[1:, :4], mode, **kw)
    (part0 + part1).backward()
    assert (part0 + part1).item() == pytest.approx(full.item(), abs=1e-6)
    assert torch.allclose(w_micro.grad, w_full.grad, atol=1e-7)
    if mode == "token-mean":
        assert (part0 + part1).item() == pytest.approx(3.333333, abs=1e-6)
        # d/dw of sum(w * L * M) / 6 = L * M / 6
        assert torch.allclose(w_full.grad, loss_values * mask / 6)


def test_l2_ppo_micro_batches_match_full_batch():
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(4, 7, generator=g) * 2
    old = logp + 0.3 * torch.randn(4, 7, generator=g)
    adv = torch.randn(4, 7, generator=g)
    mask = (torch.rand(4, 7, generator=g) < 0.7).float()
    mask[3] = 0  # an all-masked row
    n_tok = mask.sum()
    x_full = logp.clone().requires_grad_(True)
    full, _ = ppo_policy_loss(x_full, old, adv, mask)
    full.backward()
    x_micro = logp.clone().requires_grad_(True)
    total = sum(
        ppo_policy_loss(
            x_micro[i : i + 2], old[i : i + 2], adv[i : i + 2], mask[i : i + 2], num_tokens=n_tok
        )[0]
        for i in (0, 2)
    )
    total.backward()
    assert total.item() == pytest.approx(full.item(), abs=1e-6)
    assert torch.allclose(x_micro.grad, x_full.grad, atol=1e-7)


def test_all_masked_rows_give_no_nan():
    loss = t(
        [[NAN, 1.0], [3.0, float("inf")]],
    ).requires_grad_(True)
    mask = t([[0, 0], [1, 0]])
    for mode in AGG_MODES:
        out = aggregate(loss, mask, mode)
        assert torch.isfinite(out)
    zero_mask = torch.zeros(2, 2)
    for mode in AGG_MODES:
        out = aggregate(loss, zero_mask, mode)
        out.backward()
        assert out.item() == 0.0 and torch.isfinite(loss.grad).all()
        loss.grad = None


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 4),
    st.integers(1, 6),
    st.integers(1, 5),
    st.integers(0, 2**31 - 1),
)
def test_property_aggregate_invariant_to_padding_width(b, t_len, extra, seed):
    g = torch.Generator().manual_seed(seed)
    loss = torch.randn(b, t_len, generator=g, dtype=torch.float64)
    mask = (torch.rand(b, t_len, generator=g) < 0.6).double()
    pad_loss = torch.cat([loss, 1e6 * torch.randn(b, extra, generator=g, dtype=torch.float64)], 1)
    pad_mask = torch.cat([mask, torch.zeros(b, extra, dtype=torch.float64)], 1)
    for mode in AGG_MODES:
        a = aggregate(loss, mask, mode, max_len=16)
        c = aggregate(pad_loss, pad_mask, mode, max_len=16)
        assert torch.allclose(a, c, atol=1e-12), mode


def test_masked_mean():
    x = t([[1.0, 2.0, NAN], [4.0, 5.0, 6.0]])
    m = t([[1, 1, 0], [0, 0, 0]])
    assert masked_mean(x, m).item() == pytest.approx(1.5)
    assert torch.equal(masked_mean(x, m, dim=-1), t([1.5, 0.0]))
    assert masked_mean(x, torch.zeros(2, 3)).item() == 0.0
    assert masked_mean(x, t([1.0, 0.0, 0.0])).item() == pytest.approx(2.5)  # broadcast mask


# -- KL -------------------------------------------------------------------------------------
def test_l3_kl_estimators():
    logp, ref = t([-1.0]), t([-2.0])
    # d = ref - logp = -1: k1 = 1, k2 = 0.5, k3 = e^-1 + 1 - 1 = 0.367879
    assert kl(logp, ref, "k1").item() == pytest.approx(1.0)
    assert kl(logp, ref, "k2").item() == pytest.approx(0.5)
    k3 = kl(logp, ref, "k3").item()
    assert k3 == pytest.approx(0.367879, abs=1e-6)
    assert k3 != pytest.approx(0.718282, abs=1e-3)  # e^1 - 1 - 1: the swapped sign
    with pytest.raises(ValueError, match="k4"):
        kl(logp, ref, "k4")


def test_kl_upcasts_and_stays_finite():
    logp = t([-1.0, -0.001, -50.0, 0.0, -float("inf"), -float("inf")]).bfloat16()
    ref = t([-2.0, -0.002, 0.0, -60.0, -1.0, -float("inf")]).bfloat16()
    k3 = kl(logp, ref, "k3")
    assert k3.dtype == torch.float32
    assert torch.isfinite(k3).all() and (k3 >= 0).all()
    # d = 50 is clamped to 20: exp(20) - 21; d = -60 -> -20: exp(-20) + 19
    assert k3[2].item() == pytest.approx(math.exp(20) - 21, rel=1e-5)
    assert k3[3].item() == pytest.approx(math.exp(-20) + 19, rel=1e-5)
    assert k3[5].item() == 0.0  # both impossible
    assert kl(logp, ref, "k1")[5].item() == 0.0
    # gradient of k3 wrt logp = 1 - exp(d): at d = -1, 1 - e^-1 = 0.632121
    lp = t([-1.0]).requires_grad_(True)
    kl(lp, t([-2.0]), "k3").sum().backward()
    assert lp.grad.item() == pytest.approx(1 - math.exp(-1), abs=1e-6)


logprob = st.one_of(st.floats(-1e4, 0.0, allow_nan=False, width=32), st.just(-float("inf")))


@settings(max_examples=100, deadline=None)
@given(logprob, logprob)
def test_property_k3_nonnegative_and_finite(a, b):
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        k3 = kl(torch.tensor([a], dtype=dtype), torch.tensor([b], dtype=dtype), "k3")
        assert torch.isfinite(k3).all() and k3.item() >= 0.0
    if math.isfinite(a) and math.isfinite(b):
        assert math.isfinite(kl(t([a]), t([b]), "k1").item())
        assert kl(t([a]), t([b]), "k2").item() >= 0.0


@settings(max_examples=100, deadline=None)
@given(st.floats(-1e6, 1e6, allow_nan=False), st.floats(-1e6, 1e6, allow_nan=False))
def test_property_k3_any_real(a, b):
    k3 = kl(t([a]), t([b]), "k3")
    assert torch.isfinite(k3).all() and k3.item() >= 0.0


# -- PPO ------------------------------------------------------------------------------------
def test_ppo_clipping_by_hand():
    # clip 0.2 both sides; old logp -1, logp = -1 + log r; slot 4 is padding with garbage.
    # A=+1, r=1.5: max(-1.5, -1.2) = -1.2   clipped (zero gradient)
    # A=+1, r=0.5: max(-0.5, -0.8) = -0.5   not clipped (a positive advantage never clips low)
    # A=-1, r=1.5: max( 1.5,  1.2) =  1.5   not clipped
    # A=-1, r=0.5: max( 0.5,  0.8) =  0.8   clipped
    # token-mean: (-1.2 - 0.5 + 1.5 + 0.8) / 4 = 0.15 ; clipfrac 2/4
    ratios = t([[1.5, 0.5, 1.5, 0.5, 1.0]])
    old = torch.full((1, 5), -1.0)
    old[0, 4] = NAN
    logp = (old + ratios.log()).detach().requires_grad_(True)
    old.requires_grad_(True)  # old logprobs and advantages never get a gradient
    adv = t([[1.0, 1.0, -1.0, -1.0, 1e9]])
    mask = t([[1, 1, 1, 1, 0]])
    loss, m = ppo_policy_loss(logp, old, adv, mask)
    assert loss.item() == pytest.approx(0.15, abs=1e-6)
    assert m["clipfrac"] == pytest.approx(0.5)
    # approx_kl = mean((r - 1) - log r) = (2*(0.5 - 0.405465) + 2*(-0.5 + 0.693147)) / 4
    assert m["approx_kl"] == pytest.approx(0.143841, abs=1e-5)
    assert m["ratio_mean"] == pytest.approx(1.0)
    assert m["ratio_min"] == pytest.approx(0.5) and m["ratio_max"] == pytest.approx(1.5)
    loss.backward()
    # d/dlogp of -A r / 4 = -A r / 4: slot 1 -> -0.5/4 = -0.125, slot 2 -> 1.5/4 = 0.375
    assert torch.allclose(logp.grad, t([[0.0, -0.125, 0.375, 0.0, 0.0]]), atol=1e-6)
    assert old.grad is None


def test_ppo_inside_clip_and_clip_higher():
    # A=+1, r=1.1 inside [0.8, 1.2]: loss -1.1, gradient -1.1
    logp = t([[math.log(1.1)]]).requires_grad_(True)
    loss, m = ppo_policy_loss(logp, t([[0.0]]), t([[1.0]]), t([[1]]))
    loss.backward()
    assert loss.item() == pytest.approx(-1.1) and m["clipfrac"] == 0.0
    assert logp.grad.item() == pytest.approx(-1.1)
    # A=+1, r=1.25: clipped at 1.2 with clip_high 0.2 (-1.2), free with 0.28 (-1.25)
    lp = t([[math.log(1.25)]])
    assert ppo_policy_loss(lp, t([[0.0]]), t([[1.0]]), t([[1]]))[0].item() == pytest.approx(-1.2)
    loss, m = ppo_policy_loss(lp, t([[0.0]]), t([[1.0]]), t([[1]]), clip_high=0.28)
    assert loss.item() == pytest.approx(-1.25) and m["clipfrac"] == 0.0
    # clip_low 0.1, A=-1, r=0.85: max(0.85, 0.9) = 0.9
    loss, _ = ppo_policy_loss(
        t([[math.log(0.85)]]), t([[0.0]]), t([[-1.0]]), t([[1]]), clip_low=0.1
    )
    assert loss.item() == pytest.approx(0.9)


def test_ppo_dual_clip_and_sequence_advantages():
    # A=-1, r=5: max(5, 1.2) = 5 -> dual clip 3: min(5, 3) = 3 ; A=-1, r=2: 2 < 3 stays 2
    # A=+1, r=5: -1.2 (dual clip only touches negative advantages). mean = (3 + 2 - 1.2)/3
    logp = t([[math.log(5.0), math.log(2.0)], [math.log(5.0), 0.0]])
    adv_seq = t([-1.0, 1.0])  # (B,) broadcast over each row's tokens
    mask = t([[1, 1], [1, 0]])
    loss, m = ppo_policy_loss(logp, torch.zeros(2, 2), adv_seq, mask, dual_clip=3.0)
    assert loss.item() == pytest.approx((3 + 2 - 1.2) / 3, abs=1e-6)
    assert m["dual_clipfrac"] == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="dual_clip"):
        ppo_policy_loss(logp, torch.zeros(2, 2), adv_seq, mask, dual_clip=0.5)
    with pytest.raises(ValueError, match="advantages"):
        ppo_policy_loss(logp, torch.zeros(2, 2), t([1.0, 2.0, 3.0]), mask)
    with pytest.raises(ValueError, match="clip_low"):
        ppo_policy_loss(logp, torch.zeros(2, 2), adv_seq, mask, clip_low=1.0)


def test_ppo_tis_weights_scale_each_token():
    # r = 1 everywhere, A = 1: per-token -1, weights [1, 2, 1] -> mean(-1, -2, -1) = -4/3
    zeros = torch.zeros(1, 3)
    w = t([[1.0, 2.0, 1.0]])
    loss, _ = ppo_policy_loss(zeros, zeros, torch.ones(1, 3), torch.ones(1, 3), tis_weights=w)
    assert loss.item() == pytest.approx(-4 / 3)


def test_ppo_all_masked_is_finite():
    logp = t([[-1.0, NAN]]).requires_grad_(True)
    loss, m = ppo_policy_loss(logp, t([[-1.0, -1.0]]), t([[1.0, 1.0]]), t([[0, 0]]))
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(logp.grad, torch.zeros(1, 2))
    assert all(math.isfinite(v) for v in m.values())


def test_l4_trainer_logprobs_use_sampling_temperature():
    logits, token, temp = t([[2.0, 1.0, 0.0]]), torch.tensor([0]), 0.6
    sampler = torch.log_softmax(logits / temp, dim=-1)[:, 0]  # what the engine reported
    learner = logprobs_from_logits(logits, token, temperature=temp)
    _, m = ppo_policy_loss(learner[None], sampler[None], t([[1.0]]), t([[1]]))
    assert m["ratio_mean"] == 1.0  # exactly
    raw = logprobs_from_logits(logits, token)
    # softmax([3.33, 1.67, 0])[0] = 0.8166 vs softmax([2, 1, 0])[0] = 0.6652: 0.8166/0.6652
    assert math.exp((sampler - raw).item()) == pytest.approx(1.2276, abs=1e-4)
    with pytest.raises(ValueError, match="temperature"):
        logprobs_from_logits(logits, token, temperature=0.0)


# -- GSPO -----------------------------------------------------------------------------------
def test_gspo_by_hand():
    # row 0: log-ratios [0.1, 0.3] -> mean 0.2, s = e^0.2 = 1.221403, A=+1
    #        max(-1.221403, -1.2) = -1.2 (clipped, zero gradient)
    # row 1: log-ratios [-0.1, 0.0] (+ a padded 5.0) -> mean -0.05, s = 0.951229, A=-1
    #        max(0.951229, 0.951229) = 0.951229 (inside the clip)
    # row 2: no agent token, excluded.  loss = (-1.2 + 0.951229) / 2 = -0.1243855
    old = torch.zeros(3, 3)
    logp = t([[0.1, 0.3, 0.0], [-0.1, 0.0, 5.0], [0.7, 0.7, 0.7]]).requires_grad_(True)
    mask = t([[1, 1, 0], [1, 1, 0], [0, 0, 0]])
    loss, m = gspo_policy_loss(logp, old, t([1.0, -1.0, 9.0]), mask, clip_low=0.2, clip_high=0.2)
    assert loss.item() == pytest.approx(-0.1243855, abs=1e-6)
    assert m["clipfrac"] == pytest.approx(0.5)
    assert m["ratio_mean"] == pytest.approx((1.221403 + 0.951229) / 2, abs=1e-5)
    loss.backward()
    # row 1: d/dlogp_t of (1/2) * (-A) * exp(mean) = 0.5 * s * 1/2 = 0.237807 on its 2 tokens
    expected = t([[0, 0, 0], [0.237807, 0.237807, 0], [0, 0, 0]])
    assert torch.allclose(logp.grad, expected, atol=1e-6)
    # per-token advantages (as broadcast by expand_to_tokens) give the same loss
    adv_tok = t([[1.0, 1.0, 0.0], [-1.0, -1.0, 0.0], [0.0, 0.0, 0.0]])
    loss_tok, _ = gspo_policy_loss(logp, old, adv_tok, mask, clip_low=0.2, clip_high=0.2)
    assert loss_tok.item() == pytest.approx(loss.item())


def test_gspo_differs_from_token_ratio():
    # one sequence, log-ratios [0.5, -0.5], A=+1, clip 0.2: GSPO s = e^0 = 1 -> loss -1
    # (token-level PPO would clip 1.6487 to 1.2 and take 0.6065: mean(-1.2, -0.6065))
    logp, mask = t([[0.5, -0.5]]), t([[1, 1]])
    loss, m = gspo_policy_loss(logp, torch.zeros(1, 2), t([1.0]), mask, clip_low=0.2, clip_high=0.2)
    assert loss.item() == pytest.approx(-1.0) and m["clipfrac"] == 0.0
    ppo, _ = ppo_policy_loss(logp, torch.zeros(1, 2), t([1.0]), mask)
    assert ppo.item() == pytest.approx((-1.2 - math.exp(-0.5)) / 2, abs=1e-6)
    # all rows empty: 0, no NaN
    loss, m = gspo_policy_loss(
        logp, torch.zeros(1, 2), t([1.0]), torch.zeros(1, 2), clip_low=0.2, clip_high=0.2
    )
    assert loss.item() == 0.0 and all(math.isfinite(v) for v in m.values())


# -- value loss -----------------------------------------------------------------------------
def test_value_loss_clipping_by_hand():
    # token 0: old 1.0, V 1.5, R 2.0, clip 0.2 -> V' = 1.2
    #          max((1.5-2)^2, (1.2-2)^2) = max(0.25, 0.64) = 0.64 -> 0.5 * 0.64 = 0.32 (clipped)
    # token 1: old 1.0, V 1.5, R 1.0 -> max(0.25, 0.04) = 0.25 -> 0.125
    # token-mean: (0.32 + 0.125) / 2 = 0.2225
    values = t([[1.5, 1.5, 7.0]]).requires_grad_(True)
    old, ret, mask = t([[1.0, 1.0, NAN]]), t([[2.0, 1.0, NAN]]), t([[1, 1, 0]])
    loss, m = value_loss(values, old, ret, mask, clip=0.2)
    assert loss.item() == pytest.approx(0.2225)
    assert m["clipfrac"] == pytest.approx(0.5)
    loss.backward()
    # token 0 clipped -> 0; token 1: 0.5 * 2 * (1.5 - 1.0) / 2 = 0.25
    assert torch.allclose(values.grad, t([[0.0, 0.25, 0.0]]))
    # plain: 0.5 * (0.25 + 0.25) / 2 = 0.125
    plain, m = value_loss(values, old, ret, mask)
    assert plain.item() == pytest.approx(0.125) and m["clipfrac"] == 0.0
    assert m["value_mean"] == pytest.approx(1.5) and m["return_mean"] == pytest.approx(1.5)
    with pytest.raises(ValueError, match="clip"):
        value_loss(values, old, ret, mask, clip=0.0)


# -- DPO ------------------------------------------------------------------------------------
def test_dpo_by_hand():
    # pair 0: chosen log-ratio -1 - (-2) = 1, rejected -3 - (-2) = -1, h = 2, beta h = 0.2
    #         loss = -log sigmoid(0.2) = log(1 + e^-0.2) = 0.598139
    # pair 1: chosen -5 - (-2) = -3, rejected -1 - (-2) = 1, h = -4, beta h = -0.4
    #         loss = log(1 + e^0.4) = 0.913015
    # mean 0.755577; rewards: chosen [0.1, -0.3], rejected [-0.1, 0.1]; margins [0.2, -0.4]
    pc = t([-1.0, -5.0]).requires_grad_(True)
    pr, rc, rr = t([-3.0, -1.0]), t([-2.0, -2.0]), t([-2.0, -2.0])
    loss, m = dpo_loss(pc, pr, rc, rr, beta=0.1)
    assert loss.item() == pytest.approx(0.755577, abs=1e-6)
    assert m["reward_margin"] == pytest.approx(-0.1)
    assert m["reward_accuracy"] == pytest.approx(0.5)
    assert m["chosen_reward"] == pytest.approx(-0.1) and m["rejected_reward"] == pytest.approx(0.0)
    loss.backward()
    # d/dpc_0 = -beta * (1 - sigmoid(0.2)) / 2 = -0.1 * 0.450166 / 2 = -0.0225083
    assert pc.grad[0].item() == pytest.approx(-0.0225083, abs=1e-6)
    # conservative DPO, pair 0, eps 0.1: 0.9 * 0.598139 + 0.1 * log(1 + e^0.2) = 0.618139
    ls, _ = dpo_loss(pc[:1], pr[:1], rc[:1], rr[:1], beta=0.1, label_smoothing=0.1)
    assert ls.item() == pytest.approx(0.618139, abs=1e-6)
    with pytest.raises(ValueError, match="beta"):
        dpo_loss(pc, pr, rc, rr, beta=0.0)
    with pytest.raises(ValueError, match="shape"):
        dpo_loss(pc, pr[:1], rc, rr, beta=0.1)


def test_sequence_logps_skip_prompt_tokens():
    # chosen: prompt [-5, -5] + response [-1, -2]; rejected: prompt [-5] + response [-3] + pad
    token_logps = t([[-5.0, -5.0, -1.0, -2.0], [-5.0, -3.0, -9.0, NAN]])
    mask = t([[0, 0, 1, 1], [0, 1, 0, 0]])
    assert torch.equal(sequence_logps(token_logps, mask), t([-3.0, -3.0]))


# -- truncated importance sampling ----------------------------------------------------------
def test_l5_truncated_is_weights():
    # exp([0, 2, 0]) = [1, 7.389, 1] capped at 2 -> [1, 2, 1]
    learner = t([[-1.0, -1.0, -0.5, 0.0]]).requires_grad_(True)
    sampler = t([[-1.0, -3.0, -0.5, NAN]])
    mask = t([[1, 1, 1, 0]])
    w = tis_weights(learner, sampler, mask, cap=2.0)
    assert torch.allclose(w, t([[1.0, 2.0, 1.0, 0.0]]))
    assert not w.requires_grad and w.grad_fn is None
    # sequence level: sum of log-ratios = 2 -> min(e^2, 2) = 2 on every agent token
    ws = tis_weights(learner, sampler, mask, cap=2.0, level="sequence")
    assert torch.allclose(ws, t([[2.0, 2.0, 2.0, 0.0]]))
    # sampler more confident than learner: exp(-1) = 0.3679, not truncated below
    w = tis_weights(t([[-2.0]]), t([[-1.0]]), t([[1]]), cap=2.0)
    assert w.item() == pytest.approx(math.exp(-1))
    # huge log-ratio: capped without overflow
    assert tis_weights(t([[0.0]]), t([[-1e4]]), t([[1]]), cap=3.0).item() == pytest.approx(3.0)
    with pytest.raises(ValueError, match="cap"):
        tis_weights(learner, sampler, mask, cap=0.0)
    with pytest.raises(ValueError, match="level"):
        tis_weights(learner, sampler, mask, cap=2.0, level="turn")


# -- entropy --------------------------------------------------------------------------------
def test_entropy_from_logits():
    # uniform over 2: ln 2; a -inf logit contributes nothing
    logits = t([[0.0, 0.0, -float("inf")], [1000.0, 0.0, 0.0], [1.0, 2.0, 3.0]])
    logits.requires_grad_(True)
    h = entropy_from_logits(logits)
    assert h[0].item() == pytest.approx(math.log(2))
    assert h[1].item() == pytest.approx(0.0, abs=1e-6)
    # softmax([1,2,3]) = [.0900, .2447, .6652]: -sum p ln p = 0.21676 + 0.34448 + 0.27116 = 0.832396
    assert h[2].item() == pytest.approx(0.832396, abs=1e-5)
    h.sum().backward()
    assert torch.isfinite(logits.grad).all()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 5, 11, generator=g)
    ref = torch.distributions.Categorical(logits=x).entropy()
    assert torch.allclose(entropy_from_logits(x), ref, atol=1e-6)
    assert entropy_from_logits(x.bfloat16()).dtype == torch.float32


# -- device ---------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_functions_run_on_cuda_and_match_cpu():
    from agentrl.algos.advantages import gae, group_advantages, rloo_advantages, whiten

    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(3, 6, generator=g)
    old = logp + 0.1 * torch.randn(3, 6, generator=g)
    adv = torch.randn(3, 6, generator=g)
    mask = (torch.rand(3, 6, generator=g) < 0.7).float()
    rewards = t([1.0, 0.0, NAN, 1.0, 0.5, 0.5])
    ids = torch.tensor([0, 0, 0, 0, 1, 1])

    def run(dev):
        x = [a.to(dev) for a in (logp, old, adv, mask)]
        out = [
            ppo_policy_loss(*x, dual_clip=3.0)[0],
            gspo_policy_loss(*x, clip_low=0.2, clip_high=0.2)[0],
            value_loss(x[0], x[1], x[2], x[3], clip=0.2)[0],
            kl(x[0], x[1], "k3"),
            tis_weights(x[0], x[1], x[3], cap=2.0, level="sequence"),
            entropy_from_logits(x[2]),
            *gae(x[2], x[0], x[3], 0.99, 0.95, bootstrap_value=x[0][:, 0]),
            whiten(x[2], x[3]),
            group_advantages(rewards.to(dev), ids.to(dev)),
            rloo_advantages(rewards.to(dev), ids.to(dev)),
        ]
        out += [aggregate(x[2], x[3], mode, max_len=8) for mode in AGG_MODES]
        return out

    for a, b in zip(run("cpu"), run("cuda"), strict=True):
        assert b.device.type == "cuda"
        assert torch.allclose(a, b.cpu(), atol=1e-5)
