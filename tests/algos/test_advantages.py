"""Advantages and returns: cases A1-A11 and R3 of shared/cases/CASES.md, a slow reference loop
for GAE, and property tests."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.algos.advantages import (
    expand_to_tokens,
    gae,
    group_advantages,
    group_stats,
    outcome_token_rewards,
    reward_to_go,
    rloo_advantages,
    whiten,
    zero_variance_mask,
)

torch.set_num_threads(1)
NAN = float("nan")


def t(x, dtype=torch.float32):
    return torch.tensor(x, dtype=dtype)


# -- slow reference ---------------------------------------------------------------------------
def gae_reference(rewards, values, mask, gamma, lam, bootstrap):
    """Per-row backward loop in float64 over the original positions, skipping masked ones."""
    b, t_len = len(rewards), len(rewards[0])
    adv = [[0.0] * t_len for _ in range(b)]
    ret = [[0.0] * t_len for _ in range(b)]
    for i in range(b):
        next_value, running = float(bootstrap[i]), 0.0
        for j in reversed(range(t_len)):
            if not mask[i][j]:
                continue
            r, v = float(rewards[i][j]), float(values[i][j])
            delta = r + gamma * next_value - v
            running = delta + gamma * lam * running
            adv[i][j], ret[i][j] = running, running + v
            next_value = v
    return torch.tensor(adv, dtype=torch.float64), torch.tensor(ret, dtype=torch.float64)


# -- GAE ------------------------------------------------------------------------------------
def test_a4_masked_value_never_leaks():
    # agent tokens 0,1; slot 2 is masked with value 100.
    # delta_1 = 1 + 1*0 (bootstrap) - 0 = 1      -> A_1 = 1
    # delta_0 = 0 + 1*V_1 - V_0 = 0               -> A_0 = 0 + 0.95 * 1 = 0.95
    adv, ret = gae(t([[0, 1, 0]]), t([[0, 0, 100]]), t([[1, 1, 0]]), 1.0, 0.95)
    assert torch.allclose(adv, t([[0.95, 1.0, 0.0]]), atol=1e-6)
    assert torch.allclose(ret, t([[0.95, 1.0, 0.0]]), atol=1e-6)
    # any value (even NaN/inf) at the masked slot gives the same
    for garbage in (NAN, float("inf"), -1e30):
        adv2, ret2 = gae(t([[0, 1, 0]]), t([[0, 0, garbage]]), t([[1, 1, 0]]), 1.0, 0.95)
        assert torch.equal(adv2, adv) and torch.equal(ret2, ret)


def test_a5_one_token_episode():
    # A = 1 + 0 - 0.3 = 0.7; return = A + V = 1.0
    adv, ret = gae(t([[1.0]]), t([[0.3]]), t([[1]]), 1.0, 0.95)
    assert adv.item() == pytest.approx(0.7, abs=1e-6)
    assert ret.item() == pytest.approx(1.0, abs=1e-6)
    # whitening one valid token is skipped: unchanged, no NaN
    w = whiten(adv, t([[1]]))
    assert w.item() == pytest.approx(0.7, abs=1e-6)


def test_a11_truncation_bootstraps():
    # TD target (lam = 0: A = delta, return = r + gamma * V_next).
    # truncated: 1.0 + 1 * 0.5 = 1.5; terminated: 1.0 + 0 = 1.0
    rewards, values, mask = (
        t([[0.0, 1.0], [0.0, 1.0]]),
        t([[0.2, 0.4], [0.2, 0.4]]),
        t([[1, 1]] * 2),
    )
    _, ret = gae(rewards, values, mask, 1.0, 0.0, bootstrap_value=t([0.5, 0.0]))
    assert ret[0, 1].item() == pytest.approx(1.5)
    assert ret[1, 1].item() == pytest.approx(1.0)
    # default (None) is terminated
    _, ret_none = gae(rewards[1:], values[1:], mask[1:], 1.0, 0.0)
    assert torch.equal(ret_none, ret[1:])


def test_bootstrap_reaches_last_agent_token_across_trailing_padding():
    # agent tokens at 0 and 2; slot 1 an observation, slot 3 padding. gamma=0.9, lam=1.
    # last agent token (slot 2): delta = 0 + 0.9*2.0 - 1.0 = 0.8 -> A = 0.8
    # slot 0: delta = 1 + 0.9*V(slot 2) - 0.5 = 1.4 -> A = 1.4 + 0.9*0.8 = 2.12
    adv, ret = gae(
        t([[1.0, 7.0, 0.0, 7.0]]),
        t([[0.5, 9.0, 1.0, 9.0]]),
        t([[1, 0, 1, 0]]),
        0.9,
        1.0,
        bootstrap_value=2.0,
    )
    assert torch.allclose(adv, t([[2.12, 0.0, 0.8, 0.0]]), atol=1e-6)
    assert torch.allclose(ret, t([[2.62, 0.0, 1.8, 0.0]]), atol=1e-6)


def test_multi_turn_rewards_flow_back_across_observation_spans():
    # two turns [agent, agent | obs, obs | agent, agent]; turn rewards 1 and 2 on turn ends.
    # gamma = 0.5, lam = 1, values 0 -> A = discounted return over the 4 agent tokens:
    # compact rewards [0, 1, 0, 2]: G = [0 + .5*(1 + .5*(0 + .5*2)), 1 + .5*(.5*2), .5*2, 2]
    #                                 = [0.75, 1.5, 1.0, 2.0]
    rewards = t([[0, 1, 0, 0, 0, 2]])
    mask = t([[1, 1, 0, 0, 1, 1]])
    adv, _ = gae(rewards, torch.zeros_like(rewards), mask, 0.5, 1.0)
    assert torch.allclose(adv, t([[0.75, 1.5, 0, 0, 1.0, 2.0]]))


@pytest.mark.parametrize("seed", range(6))
def test_gae_matches_slow_loop(seed):
    g = torch.Generator().manual_seed(seed)
    b, t_len = 5, 23
    rewards = torch.randn(b, t_len, generator=g, dtype=torch.float64)
    values = torch.randn(b, t_len, generator=g, dtype=torch.float64)
    mask = (torch.rand(b, t_len, generator=g) < 0.6).to(torch.float64)
    mask[0] = 0  # an all-masked row
    mask[1, -4:] = 0  # trailing padding
    rewards = rewards * mask  # the contract: rewards only on agent tokens
    boot = torch.randn(b, generator=g, dtype=torch.float64)
    gamma, lam = [(0.99, 0.95), (1.0, 1.0), (0.5, 0.0), (0.9, 0.7), (1.0, 0.95), (0.0, 0.5)][seed]
    adv, ret = gae(rewards, values, mask, gamma, lam, bootstrap_value=boot)
    ref_adv, ref_ret = gae_reference(
        rewards.tolist(), values.tolist(), mask.tolist(), gamma, lam, boot.tolist()
    )
    assert adv.dtype == torch.float64
    assert torch.allclose(adv, ref_adv, atol=1e-10)
    assert torch.allclose(ret, ref_ret, atol=1e-10)
    assert torch.all(adv[mask == 0] == 0) and torch.all(ret[mask == 0] == 0)


def test_gae_float32_close_to_reference():
    g = torch.Generator().manual_seed(7)
    rewards, values = torch.randn(3, 40, generator=g), torch.randn(3, 40, generator=g)
    mask = (torch.rand(3, 40, generator=g) < 0.5).float()
    rewards = rewards * mask
    adv, ret = gae(rewards, values, mask, 0.99, 0.95)
    ref_adv, ref_ret = gae_reference(
        rewards.tolist(), values.tolist(), mask.tolist(), 0.99, 0.95, [0.0] * 3
    )
    assert adv.dtype == torch.float32
    assert torch.allclose(adv.double(), ref_adv, atol=1e-5)
    assert torch.allclose(ret.double(), ref_ret, atol=1e-5)


def test_gae_ignores_rewards_on_masked_positions_and_has_no_grad():
    values = torch.zeros(1, 4, requires_grad=True)
    adv, ret = gae(t([[1.0, 5.0, 2.0, 9.0]]), values, t([[1, 0, 1, 0]]), 1.0, 1.0)
    # only rewards 1 (slot 0) and 2 (slot 2) count: A = [3, 0, 2, 0]
    assert torch.equal(adv, t([[3.0, 0, 2.0, 0]]))
    assert not adv.requires_grad and not ret.requires_grad


def test_gae_edge_shapes_and_errors():
    # T = 1, all-masked rows, bf16 input (upcast to float32)
    adv, ret = gae(t([[2.0], [3.0]]), t([[1.0], [1.0]]), t([[0], [0]]), 1.0, 0.95)
    assert torch.equal(adv, torch.zeros(2, 1)) and torch.equal(ret, torch.zeros(2, 1))
    adv, _ = gae(t([[1.0, 1.0]]).bfloat16(), t([[0.0, 0.0]]).bfloat16(), t([[1, 1]]), 1.0, 1.0)
    assert adv.dtype == torch.float32 and torch.equal(adv, t([[2.0, 1.0]]))
    empty = torch.zeros(0, 5)
    assert gae(empty, empty, empty, 1.0, 1.0)[0].shape == (0, 5)
    with pytest.raises(ValueError, match="gamma"):
        gae(t([[1.0]]), t([[0.0]]), t([[1]]), 1.5, 0.9)
    with pytest.raises(ValueError, match="lam"):
        gae(t([[1.0]]), t([[0.0]]), t([[1]]), 1.0, -0.1)
    with pytest.raises(ValueError, match="values"):
        gae(t([[1.0]]), t([[0.0, 1.0]]), t([[1]]), 1.0, 1.0)
    with pytest.raises(ValueError, match="bootstrap"):
        gae(t([[1.0]]), t([[0.0]]), t([[1]]), 1.0, 1.0, bootstrap_value=t([1.0, 2.0]))


# -- reward-to-go ---------------------------------------------------------------------------
def test_a7_observation_span_consumes_no_discount():
    # agent rewards [0, 1] with gamma 0.5: G = [0 + 0.5 * 1, 1] = [0.5, 1.0]
    ret = reward_to_go(t([[0, 0, 1]]), t([[1, 0, 1]]), 0.5)
    assert torch.allclose(ret, t([[0.5, 0.0, 1.0]]))


def test_a8_padding_never_adds_to_a_return():
    # G = [1.5 + 1.0, 1.0]; the 2.0s sit on padding and are ignored
    ret = reward_to_go(t([[1.5, 1.0, 2.0, 2.0]]), t([[1, 1, 0, 0]]), 1.0)
    assert torch.equal(ret, t([[2.5, 1.0, 0.0, 0.0]]))


def test_reward_to_go_bootstrap():
    # truncated with V(next) = 0.5, gamma 1: G = [1 + 0.5, ...]
    ret = reward_to_go(t([[0.0, 1.0]]), t([[1, 1]]), 1.0, bootstrap_value=t([0.5]))
    assert torch.allclose(ret, t([[1.5, 1.5]]))


# -- outcome reward placement ---------------------------------------------------------------
def test_a9_empty_response_flagged_and_excluded_from_baseline():
    lengths = torch.tensor([0, 3, 2])
    mask = (torch.arange(4)[None, :] < lengths[:, None]).float()
    scores = t([10.0, 0.5, 1.5])
    rewards, empty = outcome_token_rewards(scores, mask)
    assert torch.equal(rewards[0], torch.zeros(4))
    assert torch.equal(rewards[1], t([0, 0, 0.5, 0]))
    assert torch.equal(rewards[2], t([0, 1.5, 0, 0]))
    assert empty.tolist() == [True, False, False]
    # baseline over the two valid rewards: mean 1, std sqrt(0.5) -> [0, -0.7071, 0.7071]
    adv = group_advantages(scores.masked_fill(empty, NAN), [0, 0, 0])
    assert torch.allclose(adv, t([0.0, -1 / math.sqrt(2), 1 / math.sqrt(2)]), atol=1e-5)


def test_a10_reward_on_eos_even_when_eos_equals_pad():
    # tokens [t0, t1, EOS, PAD, PAD] with EOS == PAD: the position comes from the mask
    rewards, empty = outcome_token_rewards(t([1.0]), t([[1, 1, 1, 0, 0]]))
    assert torch.equal(rewards, t([[0, 0, 1.0, 0, 0]])) and not empty.any()


# -- group advantages -----------------------------------------------------------------------
def test_a1_grpo_group():
    # mean 0.25, unbiased var = (0.75^2 + 3 * 0.25^2) / 3 = 0.25, std 0.5
    # -> (1 - .25)/.5 = 1.5, (0 - .25)/.5 = -0.5
    adv = group_advantages(t([1.0, 0, 0, 0]), torch.tensor([3, 3, 3, 3]))
    assert torch.allclose(adv, t([1.5, -0.5, -0.5, -0.5]), atol=1e-5)


def test_a2_constant_groups_exact_zero_and_counted():
    rewards = torch.cat([t([1.0] * 4), t([0.1] * 8), t([0.7] * 8)])
    ids = [0] * 4 + [1] * 8 + [2] * 8
    for scale in ("std", "none"):
        adv = group_advantages(rewards, ids, scale=scale)
        assert torch.equal(adv, torch.zeros(20))  # exact, not 1e-9
        assert torch.equal(rloo_advantages(rewards, ids), torch.zeros(20))
    stats = group_stats(rewards, ids)
    assert stats["num_groups"] == 3 and stats["num_zero_variance_groups"] == 3
    assert stats["frac_zero_variance"] == 1.0
    assert zero_variance_mask(rewards, ids).all()
    # float64 [0.1]*3: the float mean is 0.1 + 1.4e-17, yet the advantages are exactly 0
    r64 = torch.full((3,), 0.1, dtype=torch.float64)
    for scale in ("std", "none"):
        assert torch.equal(group_advantages(r64, [0, 0, 0], scale=scale), torch.zeros(3).double())
    assert torch.equal(rloo_advantages(r64, [0, 0, 0]), torch.zeros(3).double())


def test_a3_singleton_group():
    rewards, ids = t([0.8, 1.0, 0.0]), ["a", "b", "b"]
    adv = group_advantages(rewards, ids)
    assert adv[0].item() == 0.0 and not torch.isnan(adv).any()
    assert rloo_advantages(rewards, ids)[0].item() == 0.0
    stats = group_stats(rewards, ids)
    assert stats["num_singleton_groups"] == 1 and stats["num_zero_variance_groups"] == 1
    assert zero_variance_mask(rewards, ids).tolist() == [True, False, False]


def test_r3_failed_reward_excluded():
    # valid [1, 0, 1]: mean 2/3, unbiased std = sqrt(((1/3)^2 * 2 + (2/3)^2) / 2) = sqrt(1/3)
    # -> (1/3)/0.57735 = 0.5774, (-2/3)/0.57735 = -1.1547; the failed sample gets 0
    rewards = t([1.0, NAN, 0.0, 1.0])
    adv = group_advantages(rewards, [0, 0, 0, 0])
    assert torch.allclose(adv, t([0.5774, 0.0, -1.1547, 0.5774]), atol=1e-4)
    stats = group_stats(rewards, [0, 0, 0, 0])
    assert stats["num_invalid_rewards"] == 1 and stats["num_zero_variance_groups"] == 0
    # all failed: zeros, counted as zero-variance
    adv = group_advantages(t([NAN, NAN]), [0, 0])
    assert torch.equal(adv, torch.zeros(2))
    assert group_stats(t([NAN, NAN]), [0, 0])["num_zero_variance_groups"] == 1


def test_scale_none_is_mean_centring():
    # Dr. GRPO: [1, 0, 0, 0] - 0.25
    adv = group_advantages(t([1.0, 0, 0, 0]), [0] * 4, scale="none")
    assert torch.allclose(adv, t([0.75, -0.25, -0.25, -0.25]))
    with pytest.raises(ValueError, match="scale"):
        group_advantages(t([1.0]), [0], scale="max")
    with pytest.raises(ValueError, match="entries"):
        group_advantages(t([1.0, 2.0]), [0])


def test_interleaved_groups_and_dtypes():
    # groups need not be contiguous; float64 stays float64; ints give float32
    rewards = torch.tensor([1.0, 5.0, 0.0, 3.0], dtype=torch.float64)
    adv = group_advantages(rewards, torch.tensor([0, 1, 0, 1]))
    assert adv.dtype == torch.float64
    # group 0: [1, 0] mean .5 std .7071 -> +-0.7071 ; group 1: [5, 3] mean 4 std 1.4142
    assert torch.allclose(
        adv, torch.tensor([0.7071, 0.7071, -0.7071, -0.7071], dtype=torch.float64), atol=1e-4
    )
    assert group_advantages(torch.tensor([1, 0]), [0, 0]).dtype == torch.float32


def test_rloo_values():
    # [1, 0, 0, 0]: 1 - mean(0,0,0) = 1 ; 0 - mean(1,0,0) = -1/3
    adv = rloo_advantages(t([1.0, 0, 0, 0]), [0] * 4)
    assert torch.allclose(adv, t([1.0, -1 / 3, -1 / 3, -1 / 3]))
    # a failed reward is left out of the other samples' baselines: [2, x, 0] -> [2, 0, -2]
    adv = rloo_advantages(t([2.0, NAN, 0.0]), [0] * 3)
    assert torch.allclose(adv, t([2.0, 0.0, -2.0]))


group_data = st.lists(
    st.tuples(
        st.integers(0, 4),
        st.one_of(st.floats(-100, 100, allow_nan=False, width=32), st.just(NAN)),
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=60, deadline=None)
@given(group_data, st.sampled_from(["std", "none", "rloo"]))
def test_property_group_advantages_sum_to_zero(data, scale):
    ids = [g for g, _ in data]
    rewards = torch.tensor([r for _, r in data], dtype=torch.float64)
    if scale == "rloo":
        adv = rloo_advantages(rewards, ids)
    else:
        adv = group_advantages(rewards, ids, scale=scale)
    assert torch.isfinite(adv).all()
    assert torch.all(adv[torch.isnan(rewards)] == 0)
    for g in set(ids):
        sel = torch.tensor([i == g for i in ids])
        assert abs(adv[sel].sum().item()) < 1e-6 * max(1.0, adv[sel].abs().max().item())


# -- whitening and broadcasting -------------------------------------------------------------
def test_a6_masked_whitening():
    # valid [1, 2, 3]: mean 2, unbiased var 1 -> [-1, 0, 1]; the masked slot gives 0
    for garbage in (999.0, -5.0, NAN, float("inf")):
        w = whiten(t([[1, 2, 3, garbage]]), t([[1, 1, 1, 0]]))
        assert torch.allclose(w, t([[-1.0, 0.0, 1.0, 0.0]]), atol=1e-6)


def test_whiten_options_and_edges():
    # shift_mean=False keeps the mean: [-1, 0, 1] + 2
    w = whiten(t([[1, 2, 3, 4]]), t([[1, 1, 1, 0]]), shift_mean=False)
    assert torch.allclose(w, t([[1.0, 2.0, 3.0, 0.0]]), atol=1e-6)
    # equal values: exactly zero, no blow-up through 1/sqrt(eps)
    assert torch.equal(whiten(t([[0.1] * 8]), torch.ones(1, 8)), torch.zeros(1, 8))
    # no valid entry: zeros; bf16 keeps its dtype
    assert torch.equal(whiten(t([[3.0, 4.0]]), t([[0, 0]])), torch.zeros(1, 2))
    assert whiten(t([[1.0, 3.0]]).bfloat16(), t([[1, 1]])).dtype == torch.bfloat16
    with pytest.raises(ValueError):
        whiten(t([[1.0]]), t([[1, 1]]))


def test_expand_to_tokens():
    out = expand_to_tokens(t([1.5, -2.0]), t([[0, 1, 1], [1, 0, 0]]))
    assert torch.equal(out, t([[0, 1.5, 1.5], [-2.0, 0, 0]]))
    with pytest.raises(ValueError):
        expand_to_tokens(t([1.0]), t([[1, 1], [1, 1]]))
