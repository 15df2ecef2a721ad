"""Algorithm modules (`agentrl/algos/*.py`): `advantages` / `loss` / `prepare` on small
hand-built batches with hand-computed values, the learner hooks they need (value head, TIS,
pairs kept together, checkpoints), and dynamic sampling.

Learning tests (each algorithm raises the reward of the toy env) are in
`test_algorithms_learn.py` (slow)."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch

from agentrl.algos import ALGORITHMS, get_algorithm
from agentrl.algos import dpo as dpo_mod
from agentrl.algos import ppo as ppo_mod
from agentrl.algos import reinforce_pp as rpp_mod
from agentrl.algos.configs import ALGO_CONFIGS
from agentrl.algos.tis import tis_weights_of
from agentrl.algos.turns import turn_group_advantages, turn_index, turn_returns
from agentrl.config import algo_config, load_config
from agentrl.learner.local import Learner
from agentrl.models.tiny import load_model
from agentrl.types import Trajectory

gspo, ppo, rloo, reinforce_pp, dpo = (get_algorithm(n) for n in ("gspo", "ppo", "rloo", "reinforce_pp", "dpo"))


def ns(**kw):
    """An algorithm's config as a namespace, to set fields the config does not define (yet)."""
    fields = ALGO_CONFIGS[kw.get("name", "grpo")].model_fields
    base = algo_config(**{k: v for k, v in kw.items() if k in fields}).model_dump()
    base.update(kw)
    return SimpleNamespace(**base)


def t(x):
    return torch.tensor(x, dtype=torch.float32)


# -- the table and its hooks -----------------------------------------------------------------------
def test_every_algorithm_module_has_the_interface():
    for name in ALGORITHMS:
        mod = get_algorithm(name)
        assert callable(mod.advantages) and callable(mod.loss), name
    assert dpo.needs_reference(algo_config(name="dpo"))  # DPO always needs the reference
    assert not ppo.needs_reference(algo_config(name="ppo"))
    assert ppo.needs_reference(algo_config(name="ppo", kl_coef=0.1))
    assert ppo.value_head and not gspo.value_head
    assert get_algorithm("distill").needs_teacher and not ppo.needs_teacher


def test_algorithm_defaults_fill_only_unset_fields():
    c = algo_config(name="gspo")
    assert (c.clip_low, c.clip_high) == (3e-4, 4e-4)  # the GSPO paper's ranges
    c = load_config(None, ["algo.name=gspo", "algo.clip_low=0.2"]).algo
    assert (c.clip_low, c.clip_high) == (0.2, 4e-4)  # an explicit value (even = default) is kept
    c = algo_config(name="ppo", minibatches=1)
    assert (c.update_epochs, c.minibatches) == (2, 1)
    g = algo_config(name="grpo")
    assert (g.clip_low, g.update_epochs) == (0.2, 1)  # grpo: the shared defaults
    assert algo_config(name="gspo").clip_low == 3e-4


# -- GSPO ----------------------------------------------------------------------------------------
def _gspo_batch():
    mask = t([[1, 1, 0], [1, 1, 1]])
    old = torch.zeros(2, 3)
    logp = t([[0.1, 0.3, 5.0], [0.0, 0.0, 0.3]])  # 5.0 is padding: never read
    adv = t([[1, 1, 0], [-1, -1, -1]])  # broadcast per-sequence advantages [1, -1]
    return logp, {"loss_mask": mask, "old_logprobs": old, "advantages": adv}


def test_gspo_sequence_ratio_and_clip_by_hand():
    logp, batch = _gspo_batch()
    logp.requires_grad_(True)
    cfg = algo_config(name="gspo", clip_low=0.2, clip_high=0.2)
    loss, m = gspo.loss(logp, batch, cfg, num_tokens=5, num_seqs=2)
    # row 0: s = exp(mean(0.1, 0.3)) = exp(0.2) = 1.221403 > 1.2, A = 1 -> clipped term -1.2
    # row 1: s = exp(mean(0, 0, 0.3)) = exp(0.1) = 1.105171, A = -1 -> max(1.105171, 1.105171)
    # loss = (-1.2 + 1.105171) / 2 = -0.0474145
    assert loss.item() == pytest.approx(-0.0474145, abs=1e-6)
    assert m["clipfrac"] == pytest.approx(0.5)
    assert m["ratio_max"] == pytest.approx(1.221403, abs=1e-6)
    loss.backward()
    # row 0 is clipped: no gradient; row 1: d/dlogp_t = -A * s / |y| / N = 1.105171 / 3 / 2
    assert torch.allclose(logp.grad[0], torch.zeros(3))
    assert torch.allclose(logp.grad[1], torch.full((3,), 1.105171 / 6), atol=1e-6)


def test_gspo_paper_clip_defaults():
    logp, batch = _gspo_batch()
    cfg = algo_config(name="gspo")
    loss, m = gspo.loss(logp, batch, cfg, num_tokens=5, num_seqs=2)
    # row 0 clipped at 1 + 4e-4: -1.0004; row 1 (A < 0) unclipped 1.105171
    # loss = (-1.0004 + 1.105171) / 2 = 0.0523855
    assert loss.item() == pytest.approx(0.0523855, abs=1e-6)


def test_gspo_rejects_tis():
    with pytest.raises(ValueError, match="algo.tis_cap=2.0 is not supported by algo.name=gspo"):
        algo_config(name="gspo", tis_cap=2.0)  # the schema refuses it


def test_gspo_advantages_match_grpo():
    batch = {"scores": t([1, 0, 0, 0]), "group_ids": torch.tensor([0, 0, 0, 0]),
             "loss_mask": torch.ones(4, 2)}
    adv, stats = gspo.advantages(batch, algo_config(name="gspo"))
    # case A1: [1.5, -0.5, -0.5, -0.5] on every agent token
    assert torch.allclose(adv[:, 0], t([1.5, -0.5, -0.5, -0.5]), atol=1e-5)
    assert torch.equal(adv[:, 0], adv[:, 1])


# -- RLOO ----------------------------------------------------------------------------------------
def test_rloo_leave_one_out_by_hand():
    batch = {"scores": t([1, 0, 0, 1, 0.3, float("nan")]),
             "group_ids": torch.tensor([0, 0, 0, 0, 1, 1]), "loss_mask": torch.ones(6, 2)}
    adv, stats = rloo.advantages(batch, algo_config(name="rloo"))
    # r0: 1 - mean(0, 0, 1) = 2/3; r1: 0 - mean(1, 0, 1) = -2/3; ...
    # group 1: one valid reward left (NaN excluded) -> 0 for both
    assert torch.allclose(adv[:, 0], t([2 / 3, -2 / 3, -2 / 3, 2 / 3, 0, 0]), atol=1e-6)
    assert adv[:4, 0].sum().abs() < 1e-6
    assert stats["num_zero_variance_groups"] == 1 and stats["num_invalid_rewards"] == 1


def test_rloo_kl_in_the_reward():
    mask = t([[0, 1, 1], [0, 1, 0], [0, 1, 0], [0, 1, 0]])
    old = t([[0, -1.0, -1.0], [0, -1, 0], [0, -1, 0], [0, -1, 0]])
    ref = t([[0, -1.1, -1.1], [0, -1, 0], [0, -1, 0], [0, -1, 0]])  # row 0: k1 sum 0.2
    batch = {"scores": t([1, 0, 0, 1]), "group_ids": torch.tensor([0, 0, 0, 0]),
             "loss_mask": mask, "old_logprobs": old, "ref_logprobs": ref}
    adv, stats = rloo.advantages(batch, algo_config(name="rloo", kl_coef=0.5))
    # R = [1 - 0.5 * 0.2, 0, 0, 1] = [0.9, 0, 0, 1]
    # A0 = 0.9 - (0 + 0 + 1)/3 = 0.566667; A1 = A2 = 0 - (0.9 + 0 + 1)/3 = -0.633333;
    # A3 = 1 - (0.9 + 0 + 0)/3 = 0.7
    assert torch.allclose(adv[:, 1], t([0.566667, -0.633333, -0.633333, 0.7]), atol=1e-5)
    assert adv[0, 0] == 0  # the prompt token gets nothing
    assert stats["kl"] == pytest.approx(0.05, abs=1e-6)  # mean over 4 rows of [0.2, 0, 0, 0]


# -- REINFORCE++ -----------------------------------------------------------------------------------
def test_reinforce_pp_kl_shaped_returns_by_hand():
    mask = t([[0, 1, 1, 1]])
    batch = {"loss_mask": mask, "token_rewards": t([[0, 0, 0, 1]]),
             "old_logprobs": t([[0, -1.0, -2.0, -0.5]]),
             "ref_logprobs": t([[0, -1.5, -1.8, -0.6]])}  # k1 = old - ref = [_, 0.5, -0.2, 0.1]
    cfg = algo_config(name="reinforce_pp", kl_coef=0.1, gamma=0.5)
    ret = rpp_mod.returns(batch, cfg)
    # r = [_, -0.05, 0.02, 1 - 0.01] = [_, -0.05, 0.02, 0.99]
    # G3 = 0.99; G2 = 0.02 + 0.5 * 0.99 = 0.515; G1 = -0.05 + 0.5 * 0.515 = 0.2075
    assert torch.allclose(ret, t([[0, 0.2075, 0.515, 0.99]]), atol=1e-6)
    adv, stats = reinforce_pp.advantages(batch, cfg)
    # whitened over the 3 agent tokens: mean 0.570833, unbiased std
    # sqrt((0.363333^2 + 0.055833^2 + 0.419167^2) / 2) = 0.394227
    # -> [-0.363333, -0.055833, 0.419167] / 0.394227 = [-0.921634, -0.141627, 1.063263]
    assert torch.allclose(adv, t([[0, -0.921634, -0.141627, 1.063263]]), atol=1e-5)
    assert stats["return_mean"] == pytest.approx(0.570833, abs=1e-5)


def test_reinforce_pp_observation_is_not_a_time_step_and_nan_rows_drop():
    # case A7 through the module: tool observation in the middle, gamma 0.5 -> [0.5, _, 1.0]
    batch = {"loss_mask": t([[1, 0, 1], [1, 1, 0]]), "token_rewards": t([[0, 0, 1], [0, float("nan"), 0]]),
             "scores": t([1, float("nan")])}
    _, m = reinforce_pp.prepare(batch, None, algo_config(name="reinforce_pp"))
    assert m["dropped_rows"] == 1 and batch["loss_mask"][1].sum() == 0
    ret = rpp_mod.returns(batch, algo_config(name="reinforce_pp", gamma=0.5))
    assert torch.allclose(ret, t([[0.5, 0, 1.0], [0, 0, 0]]))
    adv, _ = reinforce_pp.advantages(batch, algo_config(name="reinforce_pp", gamma=0.5))
    # whitened over the two valid tokens [0.5, 1.0]: mean 0.75, std 0.353553 -> -/+0.707107
    assert torch.allclose(adv, t([[-0.707107, 0, 0.707107], [0, 0, 0]]), atol=1e-5)
    assert torch.isfinite(adv).all()


# -- PPO -----------------------------------------------------------------------------------------
def test_ppo_value_clipping_by_hand():
    mask = t([[1, 1]])
    values = t([[1.5, 0.9]]).requires_grad_(True)
    batch = {"loss_mask": mask, "old_logprobs": torch.zeros(1, 2), "advantages": torch.zeros(1, 2),
             "old_values": t([[1.0, 1.0]]), "returns": t([[2.0, 0.0]])}
    cfg = algo_config(name="ppo", value_clip=0.2, vf_coef=0.5)
    loss, m = ppo.loss(torch.zeros(1, 2), batch, cfg, num_tokens=2, num_seqs=1, values=values)
    # token 0: (1.5 - 2)^2 = 0.25; clipped V' = 1.0 + clip(0.5, +-0.2) = 1.2, (1.2 - 2)^2 = 0.64
    #          -> max 0.64, 0.5 * 0.64 = 0.32
    # token 1: V' = 0.9 (inside the clip): 0.5 * 0.81 = 0.405
    # vf = (0.32 + 0.405) / 2 = 0.3625; A = 0 -> pg 0; loss = 0.5 * 0.3625 = 0.18125
    assert m["vf_loss"] == pytest.approx(0.3625, abs=1e-6)
    assert loss.item() == pytest.approx(0.18125, abs=1e-6)
    assert m["vf_clipfrac"] == pytest.approx(0.5)
    loss.backward()
    # token 0: the clipped branch is active and V' does not depend on V -> 0;
    # token 1: vf_coef * (V - R) / N = 0.5 * 0.9 / 2 = 0.225
    assert torch.allclose(values.grad, t([[0.0, 0.225]]), atol=1e-6)
    unclipped, _ = ppo.loss(torch.zeros(1, 2), batch, algo_config(name="ppo", value_clip=None),
                            num_tokens=2, num_seqs=1, values=values)
    # plain MSE: 0.5 * (0.25 + 0.81) / 2 = 0.265, times vf_coef 0.5 = 0.1325
    assert unclipped.item() == pytest.approx(0.1325, abs=1e-6)


def test_ppo_policy_clipping_and_entropy_by_hand():
    mask = t([[1, 1]])
    logp = t([[math.log(1.5), math.log(0.5)]])  # ratios 1.5 and 0.5 against old 0
    batch = {"loss_mask": mask, "old_logprobs": torch.zeros(1, 2), "advantages": t([[1.0, 1.0]]),
             "old_values": torch.zeros(1, 2), "returns": torch.zeros(1, 2)}
    cfg = algo_config(name="ppo", clip_low=0.2, clip_high=0.2, vf_coef=0.0, entropy_coef=0.1)
    loss, m = ppo.loss(logp, batch, cfg, num_tokens=2, num_seqs=1, values=torch.zeros(1, 2),
                       entropy=t([[2.0, 4.0]]))
    # token 0: max(-1.5, -1.2) = -1.2 (clipped); token 1: max(-0.5, -0.8) = -0.5 (unclipped)
    # pg = (-1.2 - 0.5) / 2 = -0.85; entropy bonus -0.1 * mean(2, 4) = -0.3 -> -1.15
    assert loss.item() == pytest.approx(-1.15, abs=1e-6)
    assert m["clipfrac"] == pytest.approx(0.5)


def test_ppo_needs_values():
    with pytest.raises(ValueError, match="value_head"):
        ppo.loss(torch.zeros(1, 1), {"loss_mask": torch.ones(1, 1)}, algo_config(name="ppo"),
                 num_tokens=1, num_seqs=1)


def test_ppo_gae_bootstraps_only_truncated_episodes():
    """Case A11 through the module: last reward 1.0, V_old 0.3, V(next) = 0.5, gamma 1."""
    batch = {"loss_mask": t([[0, 1], [0, 1]]), "token_rewards": t([[0, 1], [0, 1]]),
             "old_values": t([[0, 0.3], [0, 0.3]]), "bootstrap_values": t([0.5, 0.0]),
             "truncated": torch.tensor([True, False])}
    cfg = algo_config(name="ppo", gamma=1.0, lam=0.95)
    adv, stats = ppo.advantages(batch, cfg)
    # truncated: return 1 + 0.5 = 1.5 (delta 1.2); terminated: return 1.0 (delta 0.7)
    assert torch.allclose(batch["returns"], t([[0, 1.5], [0, 1.0]]))
    assert stats["adv_mean_raw"] == pytest.approx((1.2 + 0.7) / 2, abs=1e-6)
    # whitened over the two agent tokens: [1.2, 0.7] -> -/+ 0.707107 ... sign: 1.2 is above
    assert torch.allclose(adv, t([[0, 0.707107], [0, -0.707107]]), atol=1e-5)


def test_ppo_gae_with_kl_in_the_reward_and_observation_span():
    # mask [1, 0, 1]: the middle token is an observation (not a time step; its value 100 unused)
    batch = {"loss_mask": t([[1, 0, 1]]), "token_rewards": t([[0, 0, 1]]),
             "old_values": t([[0.5, 100.0, 0.2]]), "bootstrap_values": t([0.0]),
             "truncated": torch.tensor([False]), "kl_coef": 0.1,
             "old_logprobs": t([[-1.0, 0, -1.0]]), "ref_logprobs": t([[-2.0, 0, -1.0]])}
    ppo.advantages(batch, algo_config(name="ppo", gamma=1.0, lam=1.0))
    # shaped rewards: token 0: -0.1 * (-1 - -2) = -0.1; token 2: 1 - 0 = 1
    # lam = 1: returns are the reward-to-go: [0.9, _, 1.0]
    assert torch.allclose(batch["returns"], t([[0.9, 0, 1.0]]), atol=1e-6)


def test_adaptive_kl_controller_by_hand():
    # e = clip(12/6 - 1, -0.2, 0.2) = 0.2 -> 0.1 * (1 + 0.2 * 100 / 10000) = 0.1002
    assert ppo_mod.adaptive_kl_coef(0.1, 12.0, 6.0, 10_000, 100) == pytest.approx(0.1002)
    # e = clip(3/6 - 1) = -0.2 -> 0.0998
    assert ppo_mod.adaptive_kl_coef(0.1, 3.0, 6.0, 10_000, 100) == pytest.approx(0.0998)
    # e = 6.6/6 - 1 = 0.1 -> 0.1 * (1 + 0.1 * 0.01) = 0.1001
    assert ppo_mod.adaptive_kl_coef(0.1, 6.6, 6.0, 10_000, 100) == pytest.approx(0.1001)
    with pytest.raises(ValueError):
        ppo_mod.adaptive_kl_coef(0.1, 1.0, 0.0, 10_000, 1)


# -- learner hooks on the tiny model -------------------------------------------------------------
def _trajs(n=4, seed=0, rewards=None, truncated=None):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        tr = Trajectory(group_id=i // 2)
        tr.append_context(torch.randint(3, 50, (3,), generator=g).tolist())
        r = float(i % 2) if rewards is None else rewards[i]
        tr.append_sampled(torch.randint(3, 50, (2 + i,), generator=g).tolist(), [-3.0] * (2 + i),
                          reward=r)
        tr.append_context([5])  # template glue after the turn
        tr.truncated = bool(truncated[i]) if truncated else False
        tr.terminated = not tr.truncated
        out.append(tr)
    return out


def test_value_head_values_and_truncation_bootstrap(tiny_model_dir):
    from agentrl.algos.shaping import build_batch
    from agentrl.learner.forward import token_logprobs_values

    model, _ = load_model(tiny_model_dir)
    learner = Learner(model, lr=1e-3, value_head=True, micro_batch_size=3)
    assert torch.all(learner.value_head.weight == 0)  # V = 0 at the start
    torch.nn.init.normal_(learner.value_head.weight, std=0.5)
    batch = build_batch(_trajs(truncated=[1, 0, 1, 0]), pad_id=0)
    logp, values, last = learner.logprobs_and_values(batch)
    with torch.no_grad():
        _, _, v_after = token_logprobs_values(model, learner.value_head, batch["input_ids"],
                                              batch["attention_mask"])
    for b in range(4):
        idx = batch["loss_mask"][b].nonzero()[:, 0]
        # V(s_t) of agent token t is the head on position t - 1; the bootstrap is the head on the
        # last agent token (the state after it)
        assert torch.allclose(values[b, idx], v_after[b, idx - 1], atol=1e-5)
        assert last[b].item() == pytest.approx(v_after[b, idx[-1]].item(), abs=1e-5)
    batch, m = ppo.prepare(batch, learner, algo_config(name="ppo"))
    assert torch.allclose(batch["bootstrap_values"], torch.where(batch["truncated"], last, 0.0))
    assert batch["bootstrap_values"][1] == 0 and batch["bootstrap_values"][0] != 0


def test_ppo_update_trains_the_value_head_and_checkpoints_it(tiny_model_dir, tiny_tokenizer, tmp_path):
    from agentrl.algos.shaping import build_batch

    model, _ = load_model(tiny_model_dir)
    cfg = algo_config(name="ppo", kl_coef=0.05)
    learner = Learner(model, lr=1e-2, value_head=True, use_ref=True, micro_batch_size=2)
    batch = build_batch(_trajs(), pad_id=0)
    batch, pm = ppo.prepare(batch, learner, cfg)
    assert pm["kl_coef"] == 0.05 and pm["kl"] == pytest.approx(0.0, abs=1e-5)  # policy == ref
    # KL 0 < target -> beta shrinks: 0.05 * (1 - 0.2 * 4 / 10000)
    assert learner.algo_state["kl_coef"] == pytest.approx(0.05 * (1 - 0.2 * 4 / 10_000))
    batch["advantages"], _ = ppo.advantages(batch, cfg)
    m = learner.update(batch, ppo, cfg, epochs=cfg.update_epochs, minibatches=cfg.minibatches)
    assert learner.optimizer_steps == 4 and math.isfinite(m["loss"]) and m["vf_loss"] > 0
    assert learner.value_head.weight.abs().sum() > 0  # the head moved off zero
    p = learner.save(tmp_path / "step_1", tiny_tokenizer, {"step": 1, "policy_version": 1})
    model2, _ = load_model(str(p))
    other = Learner(model2, lr=1e-2, value_head=True, use_ref=True)
    other.load(p)
    assert torch.equal(other.value_head.weight, learner.value_head.weight)
    assert other.algo_state == learner.algo_state
    with pytest.raises(ValueError, match="value head"):  # a checkpoint without a head
        Learner(load_model(tiny_model_dir)[0], lr=1e-3, value_head=True).load(
            Learner(load_model(tiny_model_dir)[0], lr=1e-3).save(
                tmp_path / "plain", tiny_tokenizer, {"step": 0, "policy_version": 0}))


def test_ppo_kl_in_the_loss(tiny_model_dir):
    from agentrl.algos.shaping import build_batch

    model, _ = load_model(tiny_model_dir)
    cfg = ns(name="ppo", kl_coef=0.1, kl_in_reward=False)
    learner = Learner(model, lr=1e-2, value_head=True, use_ref=True)
    batch = build_batch(_trajs(), pad_id=0)
    batch, pm = ppo.prepare(batch, learner, cfg)
    assert "kl_coef" not in batch and "kl_coef" not in pm  # not in the reward
    batch["ref_logprobs"] = learner.logprobs(batch, ref=True)
    batch["advantages"], _ = ppo.advantages(batch, cfg)
    m = learner.update(batch, ppo, cfg, epochs=2, minibatches=1)
    assert "kl" in m and m["kl"] >= 0  # k3 in the loss: 0 on the first step, > 0 after


def test_tis_weights_and_mismatch_in_the_update(tiny_model_dir):
    from agentrl.algos.shaping import build_batch

    model, _ = load_model(tiny_model_dir)
    learner = Learner(model, lr=1e-3, micro_batch_size=2)
    batch = build_batch(_trajs(), pad_id=0)
    true = learner.logprobs(batch)
    mask = batch["loss_mask"]
    # the sampler reported logprobs 0.5 lower on every agent token, 1.0 higher on row 0
    batch["sampler_logprobs"] = torch.where(mask != 0, true - 0.5, 0.0)
    batch["sampler_logprobs"][0] = torch.where(mask[0] != 0, true[0] + 1.0, 0.0)
    cfg = algo_config(name="grpo", tis_cap=1.5)
    grpo = get_algorithm("grpo")
    batch["advantages"], _ = grpo.advantages(batch, cfg)
    m = learner.update(batch, grpo, cfg)
    assert "old_logprobs" not in batch  # one step: the update's own forward gave them
    w = tis_weights_of({**batch, "old_logprobs": true}, cfg)  # what grpo.loss weighed with
    # rows 1-3: min(exp(0.5), 1.5) = 1.5 (capped); row 0: exp(-1) = 0.367879; 0 off the mask
    assert torch.allclose(w[1:][mask[1:] != 0], torch.tensor(1.5))
    assert torch.allclose(w[0][mask[0] != 0], torch.tensor(math.exp(-1.0)), atol=1e-5)
    assert torch.all(w[mask == 0] == 0) and not w.requires_grad
    n0, n = float(mask[0].sum()), float(mask.sum())
    assert m["logp_mismatch"] == pytest.approx((1.0 * n0 + 0.5 * (n - n0)) / n, abs=1e-4)
    assert m["logp_mismatch_max"] == pytest.approx(1.0, abs=1e-4)  # row 0's +1.0
    # without TIS the mismatch is still measured (single-step shortcut path)
    batch2 = build_batch(_trajs(), pad_id=0)
    true2 = learner.logprobs(batch2)  # the weights the update's forward will see
    batch2["advantages"], _ = grpo.advantages(batch2, algo_config(name="grpo"))
    m2 = learner.update(batch2, grpo, algo_config(name="grpo"))
    assert m2["logp_mismatch"] > 0  # sampler logprobs of _trajs are a constant -3.0
    gap2 = (true2 + 3.0).abs()[batch2["loss_mask"] != 0]
    assert m2["logp_mismatch"] == pytest.approx(float(gap2.mean()), abs=1e-4)
    assert m2["logp_mismatch_max"] == pytest.approx(float(gap2.max()), abs=1e-4)


def test_tis_update_with_one_forward_equals_the_recomputed_old_logprobs(tiny_model_dir):
    """With one optimizer step and TIS (`tis_cap`), the update takes `old_logprobs` from its own
    forward (one learner forward per micro-batch), and its step, loss and mismatch equal the
    path that recomputes them first (`on_policy_shortcut=False`, two forwards)."""
    import copy

    from agentrl.algos.shaping import build_batch

    grpo = get_algorithm("grpo")
    model, _ = load_model(tiny_model_dir)
    results = []
    for shortcut in (True, False):
        learner = Learner(copy.deepcopy(model), lr=1e-2, micro_batch_size=2)
        calls: list[int] = []
        learner.model.get_input_embeddings().register_forward_hook(lambda *a, c=calls: c.append(1))
        batch = build_batch(_trajs(rewards=[1.0, 0.0, 0.0, 1.0]), pad_id=0)
        # sampler logprobs: the learner's own -0.3 (rows 0-1) and +0.9 (rows 2-3): weights
        # exp(0.3) = 1.35 and exp(-0.9) = 0.41 under the cap 1.5
        with torch.no_grad():
            true = learner.logprobs(batch)
        calls.clear()
        shift = t([[-0.3], [-0.3], [0.9], [0.9]])
        batch["sampler_logprobs"] = torch.where(batch["loss_mask"] != 0, true + shift, 0.0)
        cfg = algo_config(name="grpo", tis_cap=1.5)
        batch["advantages"], _ = grpo.advantages(batch, cfg)
        m = learner.update(batch, grpo, cfg, on_policy_shortcut=shortcut)
        results.append((m, [p.detach().clone() for p in learner.model.parameters()], len(calls)))
    (m1, p1, n1), (m2, p2, n2) = results
    assert (n1, n2) == (2, 4)  # 4 rows in micro-batches of 2: one forward each, or two
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(p1, p2))
    assert any(not torch.equal(a, b) for a, b in zip(p1, model.parameters()))  # it stepped
    for key in ("loss", "logp_mismatch", "logp_mismatch_max"):
        assert m1[key] == pytest.approx(m2[key], abs=1e-5), key
    mask = batch["loss_mask"]
    n01, n = float(mask[:2].sum()), float(mask.sum())
    assert m1["logp_mismatch"] == pytest.approx((0.3 * n01 + 0.9 * (n - n01)) / n, abs=1e-4)


# -- per-turn group advantages -------------------------------------------------------------------
def test_turn_group_advantages_by_hand():
    # rows: two turns (rewards 1, 2), one turn (reward 3), two turns (rewards 1, 0); one group
    mask = t([[0, 1, 1, 0, 0, 1, 0], [0, 1, 0, 0, 0, 0, 0], [0, 1, 0, 1, 0, 0, 0]])
    rew = t([[0, 0, 1, 0, 0, 2, 0], [0, 3, 0, 0, 0, 0, 0], [0, 1, 0, 0, 0, 0, 0]])
    assert turn_index(mask)[0].tolist() == [-1, 0, 0, -1, -1, 1, -1]
    ret, exists = turn_returns(rew, mask)
    assert ret.tolist() == [[3, 2], [3, 0], [1, 0]] and exists.tolist() == [[1, 1], [1, 0], [1, 1]]
    adv = turn_group_advantages(rew, mask, torch.tensor([0, 0, 0]))
    # turn 0 returns [3, 3, 1]: mean 7/3, std 1.154701 -> [0.57735, 0.57735, -1.154701]
    # turn 1 returns [2, 0] (row 1 has no turn 1): mean 1, std 1.414214 -> [0.707107, -0.707107]
    exp = t([[0, 0.57735, 0.57735, 0, 0, 0.707107, 0], [0, 0.57735, 0, 0, 0, 0, 0],
             [0, -1.154701, 0, -0.707107, 0, 0, 0]])
    assert torch.allclose(adv, exp, atol=1e-5)
    grpo = get_algorithm("grpo")
    batch = {"scores": t([3, 3, 1]), "group_ids": torch.tensor([0, 0, 0]), "loss_mask": mask,
             "token_rewards": rew}
    adv2, _ = grpo.advantages(batch, ns(name="grpo", turn_advantages=True))
    assert torch.allclose(adv2, exp, atol=1e-5)


def test_turn_advantages_equal_grpo_for_single_turn_episodes():
    g = torch.Generator().manual_seed(0)
    mask = torch.zeros(6, 5)
    mask[:, 1:4] = 1
    scores = torch.randint(0, 3, (6,), generator=g).float()
    rew = torch.zeros(6, 5)
    rew[:, 3] = scores
    gid = torch.tensor([0, 0, 0, 1, 1, 1])
    grpo = get_algorithm("grpo")
    a1, _ = grpo.advantages({"scores": scores, "group_ids": gid, "loss_mask": mask},
                            algo_config(name="grpo"))
    a2 = turn_group_advantages(rew, mask, gid)
    assert torch.allclose(a1, a2, atol=1e-6)


# -- dynamic sampling --------------------------------------------------------------------------------
def _group(gid, rewards):
    out = []
    for r in rewards:
        tr = Trajectory(group_id=gid)
        tr.append_context([1, 2])
        tr.append_sampled([3], [-1.0], reward=r)
        out.append(tr)
    return out


def test_dynamic_sampling_drops_flat_groups_and_refills():
    from agentrl.algos.shaping import dynamic_sampling

    first = _group(0, [1, 1]) + _group(1, [0, 1]) + _group(2, [0, 0])
    calls = []

    def more(r):
        calls.append(r)
        return _group(10 + r, [1, 0]) + _group(20 + r, [0.5, 0.5])

    kept, rounds = dynamic_sampling(first, more, want=6)
    # 1 informative group kept, each refill adds one: 2 rounds to reach 3 groups (6 episodes)
    assert rounds == 2 and calls == [1, 2]
    assert [t.group_id for t in kept] == [1, 1, 11, 11, 12, 12]
    kept, rounds = dynamic_sampling(first, lambda r: _group(30 + r, [1, 1]), want=6, max_rounds=3)
    assert rounds == 3 and [t.group_id for t in kept] == [1, 1]  # refills ran out
    kept, rounds = dynamic_sampling(_group(0, [0, 1]) + _group(1, [1, 0]), more, want=2)
    assert rounds == 0 and [t.group_id for t in kept] == [0, 0]  # whole groups, up to `want`


def test_empty_batch_makes_no_update(tiny_model_dir):
    from agentrl.algos.shaping import build_batch

    model, _ = load_model(tiny_model_dir)
    learner = Learner(model, lr=1e-3)
    grpo = get_algorithm("grpo")
    batch = build_batch([], pad_id=0)
    batch["advantages"], _ = grpo.advantages(batch, algo_config(name="grpo"))
    assert learner.update(batch, grpo, algo_config(name="grpo")) == {}
    assert learner.optimizer_steps == 0


# -- DPO -----------------------------------------------------------------------------------------
def test_dpo_pair_selection():
    nan = float("nan")
    scores = t([1, 0, 0.5, 1, 1, nan, 2, 0, 0.7])
    gid = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 3])
    pairs, skipped = dpo_mod.select_pairs(scores, gid)
    # group 0: best row 0 (1.0), worst row 1 (0.0); group 1 tied -> skipped;
    # group 2: NaN ignored, best row 6 (2.0), worst row 7 (0.0); group 3 singleton -> skipped
    assert pairs == [(0, 1), (6, 7)] and skipped == 2
    # ties for best and worst go to the first row
    assert dpo_mod.select_pairs(t([1, 1, 0, 0]), torch.zeros(4, dtype=torch.long)) == ([(0, 2)], 0)


def test_dpo_loss_by_hand_on_response_tokens_only():
    mask = t([[0, 1, 1], [0, 1, 0]])  # token 0: prompt; row 1 token 2: padding
    logp = t([[-9.0, -1.0, -2.0], [-9.0, -3.0, -5.0]]).requires_grad_(True)
    ref = t([[-7.0, -1.5, -2.0], [-4.0, -2.0, -6.0]])
    batch = {"loss_mask": mask, "ref_logprobs": ref}
    loss, m = dpo.loss(logp, batch, algo_config(name="dpo", beta=0.1), num_tokens=3, num_seqs=2)
    # chosen: pi -3, ref -3.5; rejected: pi -3, ref -2 -> h = 0.5 - (-1) = 1.5
    # loss = -log sigmoid(0.1 * 1.5) = log(1 + exp(-0.15)) = 0.620957
    assert loss.item() == pytest.approx(0.620957, abs=1e-6)
    assert m["reward_margin"] == pytest.approx(0.15, abs=1e-6) and m["reward_accuracy"] == 1.0
    loss.backward()
    # d/dlogp: -beta * (1 - sigmoid(0.15)) = -0.1 * 0.462570 on chosen tokens, +0.046257 on the
    # rejected response token, 0 on the prompt and padding
    g = 0.1 * (1 - 1 / (1 + math.exp(-0.15)))
    assert torch.allclose(logp.grad, t([[0, -g, -g], [0, g, 0]]), atol=1e-6)
    # a micro-batch holding 1 of the minibatch's 2 pairs contributes half
    half, _ = dpo.loss(logp, batch, algo_config(name="dpo", beta=0.1), num_tokens=3, num_seqs=4)
    assert half.item() == pytest.approx(0.620957 / 2, abs=1e-6)
    with pytest.raises(ValueError, match="even"):
        dpo.loss(logp[:1], {"loss_mask": mask[:1], "ref_logprobs": ref[:1]},
                 algo_config(name="dpo"), num_tokens=1, num_seqs=1)


def test_dpo_prepare_builds_pairs_from_groups():
    from agentrl.algos.shaping import build_batch

    prompt = [7, 8, 9]
    trajs = []
    for gid, rewards in enumerate([[0.0, 1.0, 0.5], [1.0, 1.0, 1.0]]):
        for i, r in enumerate(rewards):
            tr = Trajectory(group_id=gid)
            tr.append_context(prompt)
            tr.append_sampled([10 + i] * (i + 1), [-1.0] * (i + 1), reward=r)
            trajs.append(tr)
    odd = Trajectory(group_id=5)  # same group, different prompt: the pair is skipped
    odd.append_context([7, 8, 1])
    odd.append_sampled([3], [-1.0], reward=1.0)
    odd2 = Trajectory(group_id=5)
    odd2.append_context(prompt)
    odd2.append_sampled([4], [-1.0], reward=0.0)
    batch = build_batch(trajs + [odd, odd2], pad_id=0)
    pb, m = dpo.prepare(batch, None, algo_config(name="dpo"))
    assert m == {"dpo_pairs": 1, "dpo_skipped_groups": 1, "dpo_prompt_mismatch": 1}
    assert pb["unit_size"] == 2 and pb["input_ids"].shape == (2, 5)  # trimmed to 3 + 2 tokens
    assert pb["scores"].tolist() == [1.0, 0.0]  # chosen = row 1 (reward 1), rejected = row 0
    assert pb["input_ids"][0].tolist() == [7, 8, 9, 11, 11]
    assert pb["loss_mask"][0].tolist() == [0, 0, 0, 1, 1] and pb["loss_mask"][1].tolist() == [0, 0, 0, 1, 0]
    adv, stats = dpo.advantages(pb, algo_config(name="dpo"))
    assert adv.shape == pb["loss_mask"].shape and stats["pairs"] == 1


def test_load_preferences_and_errors(tmp_path):
    p = tmp_path / "prefs.jsonl"
    p.write_text(json.dumps({"prompt": "Say hi.", "chosen": "hi", "rejected": "bye"}) + "\n\n"
                 + json.dumps({"prompt": [{"role": "system", "content": "s"},
                                          {"role": "user", "content": "u"}],
                               "chosen": [{"role": "assistant", "content": "a"}],
                               "rejected": "b"}) + "\n")
    pairs = dpo_mod.load_preferences(p)
    assert pairs[0] == {"prompt": [{"role": "user", "content": "Say hi."}], "chosen": "hi",
                        "rejected": "bye"}
    assert pairs[1]["chosen"] == "a" and pairs[1]["prompt"][0]["role"] == "system"
    bad = tmp_path / "bad.jsonl"
    for text, msg in [('{"prompt": "x", "chosen": "y"}', "line|:1: missing field"),
                      ("not json", ":1: invalid JSON"),
                      ('{"prompt": 3, "chosen": "y", "rejected": "z"}', "prompt must"),
                      ('{"prompt": "x", "chosen": 5, "rejected": "z"}', "chosen: must"),
                      ("\n", "no preference pairs")]:
        bad.write_text(text)
        with pytest.raises(ValueError, match=msg.split("|")[-1]):
            dpo_mod.load_preferences(bad)


def test_offline_dpo_batch_and_training(tiny_model_dir, tiny_tokenizer, tmp_path):
    from agentrl.rollout.chat import ChatRenderer

    renderer = ChatRenderer(tiny_tokenizer)
    pairs = [{"prompt": [{"role": "user", "content": "Write add_seven"}],
              "chosen": "def add_seven(x):\n    return x + 7", "rejected": "cats"},
             {"prompt": [{"role": "user", "content": "The capital of France"}],
              "chosen": "Paris", "rejected": "search"}]
    batch = dpo_mod.preference_batch(pairs, renderer, pad_id=0)
    assert batch["unit_size"] == 2 and batch["input_ids"].shape[0] == 4
    for i, p in enumerate(pairs):
        c, r = 2 * i, 2 * i + 1
        n_prompt = len(renderer.prompt_ids(p["prompt"]))
        # the prompt is shared and masked; the answer + end-of-turn are the response tokens
        assert torch.equal(batch["input_ids"][c, :n_prompt], batch["input_ids"][r, :n_prompt])
        assert batch["loss_mask"][c, :n_prompt].sum() == 0
        n_chosen = len(tiny_tokenizer.encode(p["chosen"], add_special_tokens=False)) + 1
        assert batch["loss_mask"][c].sum() == n_chosen
        assert batch["input_ids"][c, n_prompt + n_chosen - 1] == renderer.end_of_turn_id
    model, _ = load_model(tiny_model_dir)
    learner = Learner(model, lr=3e-3, use_ref=True, micro_batch_size=1)  # 1 -> whole pairs
    batch["ref_logprobs"] = learner.logprobs(batch, ref=True)
    cfg = algo_config(name="dpo", beta=0.5)
    batch["advantages"], _ = dpo.advantages(batch, cfg)
    first = learner.update(batch, dpo, cfg)
    assert first["dpo_loss"] == pytest.approx(math.log(2), abs=1e-5)  # policy == reference
    # two minibatches of one pair each, micro-batches of one pair (dpo.loss raises on a split pair)
    for _ in range(5):
        last = learner.update(batch, dpo, cfg, minibatches=2)
    assert last["dpo_loss"] < first["dpo_loss"] - 0.05 and last["reward_accuracy"] == 1.0
