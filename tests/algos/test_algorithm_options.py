"""Issue #24: CISPO, GiGPO, DAPO overlong shaping / filtering, and the options reachable from
the config (dual clip, sequence-level and masked TIS, the KL estimator in the reward, Dr. GRPO's
constant normaliser, refusing options an algorithm would ignore). Hand-computed values in the
comments; the learning tests of the new algorithms are in `test_algorithms_learn.py` (slow,
parametrised over `ALGORITHMS`)."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.algos import ALGORITHMS, get_algorithm, reinforce_pp
from agentrl.algos.configs import algorithms_with
from agentrl.algos.losses import cispo_policy_loss
from agentrl.algos.shaping import (
    apply_overlong_shaping,
    overlong_penalty,
    shape_batch,
    turn_lengths,
)
from agentrl.algos.tis import tis_weights, tis_weights_of
from agentrl.algos.turns import discounted_turn_returns, turn_states
from agentrl.config import ConfigError, algo_config, load_config
from agentrl.types import Trajectory


def t(x):
    return torch.tensor(x, dtype=torch.float32)


# -- CISPO -----------------------------------------------------------------------------------------
def _cispo_inputs():
    # ratios r = [0.5, 1.1, 1.5]: below, inside and above the clip range; A = 2 on every token
    logp = torch.log(t([[0.5, 1.1, 1.5, 3.0]])).requires_grad_(True)  # the 4th is padding
    old = torch.zeros(1, 4)
    mask = t([[1, 1, 1, 0]])
    return logp, old, torch.full((1, 4), 2.0), mask


def test_cispo_weights_below_inside_above_the_clip_by_hand():
    logp, old, adv, mask = _cispo_inputs()
    loss, m = cispo_policy_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.28)
    # w = sg(clip(r, 0.8, 1.28)) = [0.8, 1.1, 1.28]; l = -w * A * logp
    #   = [-0.8*2*ln 0.5, -1.1*2*ln 1.1, -1.28*2*ln 1.5] = [1.109035, -0.209682, -1.037991]
    # token-mean: -0.138638 / 3 = -0.046213
    assert loss.item() == pytest.approx(-0.046213, abs=1e-5)
    assert m["clipfrac"] == pytest.approx(2 / 3) and m["clipfrac_high"] == pytest.approx(1 / 3)
    loss.backward()
    # d/dlogp_t = -w_t * A / 3: every token keeps a gradient, the clipped ones included (PPO's
    # surrogate would give the third token 0)
    assert torch.allclose(logp.grad, t([[-0.533333, -0.733333, -0.853333, 0.0]]), atol=1e-5)


def test_cispo_paper_default_has_no_lower_bound():
    cfg = algo_config(name="cispo")
    assert (cfg.clip_low, cfg.clip_high) == (1.0, 0.28)  # CISPOConfig: eps_low disabled
    logp, old, adv, mask = _cispo_inputs()
    cispo = get_algorithm("cispo")
    loss, m = cispo.loss(logp, {"old_logprobs": old, "advantages": adv, "loss_mask": mask}, cfg,
                         num_tokens=3, num_seqs=1)
    # w = [0.5, 1.1, 1.28] (0.5 is not raised): l = [0.693147, -0.209682, -1.037991] -> -0.184842
    assert loss.item() == pytest.approx(-0.184842, abs=1e-5)
    assert m["clipfrac"] == pytest.approx(1 / 3)
    loss.backward()
    assert torch.allclose(logp.grad, t([[-1 / 3, -0.733333, -0.853333, 0.0]]), atol=1e-5)
    with pytest.raises(ValueError, match="clip_low"):
        cispo_policy_loss(logp, old, adv, mask, clip_low=1.5)


def test_cispo_aggregation_and_tis_weights():
    logp, old, adv, mask = _cispo_inputs()
    w = t([[1.0, 0.5, 2.0, 0.0]])
    loss, _ = cispo_policy_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.28,
                                agg="seq-mean-token-sum-norm", max_len=10, tis_weights=w)
    # (1.109035 - 0.5 * 0.209682 - 2 * 1.037991) / (1 * 10) = -1.071788 / 10 = -0.107179
    assert loss.item() == pytest.approx(-0.107179, abs=1e-5)


def test_cispo_advantages_are_grpo_and_at_ratio_one_gradient_is_reinforce():
    cispo, grpo = get_algorithm("cispo"), get_algorithm("grpo")
    batch = {"scores": t([1, 0, 0, 0]), "group_ids": torch.tensor([0, 0, 0, 0]),
             "loss_mask": torch.ones(4, 2)}
    a1, _ = cispo.advantages(batch, algo_config(name="cispo"))
    a2, _ = grpo.advantages(batch, algo_config(name="grpo"))
    assert torch.equal(a1, a2)
    # one optimizer step: old = logp, r = 1, w = 1 -> gradient -A/N per token (GRPO's too)
    logp = t([[-1.0, -2.0], [-0.5, -0.1], [-3.0, -1.0], [-0.2, -0.2]]).requires_grad_(True)
    b = dict(batch, advantages=a1, old_logprobs=logp.detach())
    cispo.loss(logp, b, algo_config(name="cispo"), num_tokens=8,
               num_seqs=4)[0].backward()
    g1 = logp.grad.clone()
    logp.grad = None
    grpo.loss(logp, b, algo_config(name="grpo"), num_tokens=8, num_seqs=4)[0].backward()
    assert torch.allclose(g1, -a1 / 8) and torch.allclose(g1, logp.grad)


# -- dual clip, TIS, KL in the reward, Dr. GRPO's normaliser ---------------------------------------
def test_dual_clip_from_the_config_by_hand():
    grpo = get_algorithm("grpo")
    # tokens: (A=-1, r=5), (A=-1, r=2), (A=+1, r=5); clip range [0.8, 1.28]
    logp = torch.log(t([[5.0, 2.0, 5.0]]))
    batch = {"old_logprobs": torch.zeros(1, 3), "advantages": t([[-1, -1, 1]]),
             "loss_mask": torch.ones(1, 3)}
    plain, _ = grpo.loss(logp, batch, algo_config(), num_tokens=3, num_seqs=1)
    # max(-A r, -A clip(r)) = [5, 2, -1.28] -> 5.72 / 3 = 1.906667
    assert plain.item() == pytest.approx(1.906667, abs=1e-5)
    cfg = load_config(None, ["algo.dual_clip=3"]).algo
    dual, m = grpo.loss(logp, batch, cfg, num_tokens=3, num_seqs=1)
    # A < 0 bounded by -A * 3 = 3: [3, 2, -1.28] -> 3.72 / 3 = 1.24
    assert dual.item() == pytest.approx(1.24, abs=1e-5)
    assert m["dual_clipfrac"] == pytest.approx(1 / 3)
    rloo = get_algorithm("rloo")  # the shared surrogate of rloo / reinforce_pp reads it too
    dual2, _ = rloo.loss(logp, batch, load_config(None, ["algo.name=rloo", "algo.dual_clip=3"]).algo,
                         num_tokens=3, num_seqs=1)
    assert dual2.item() == pytest.approx(1.24, abs=1e-5)
    with pytest.raises(ConfigError, match="dual_clip"):
        load_config(None, ["algo.dual_clip=0.5"])


def test_dual_clip_doc_names_exactly_the_algorithms_whose_loss_reads_it(tmp_path):
    """docs/config.md (the field's docstring) listed grpo, dr_grpo, rloo, reinforce_pp, ppo and
    left out gigpo and distill, whose losses are grpo's. Each algorithm whose config has
    dual_clip gives the hand-computed 1.24 of the test above with c = 3 (1.906667 without)."""
    logp = torch.log(t([[5.0, 2.0, 5.0]]))
    batch = {"old_logprobs": torch.zeros(1, 3), "advantages": t([[-1, -1, 1]]),
             "loss_mask": torch.ones(1, 3), "returns": torch.zeros(1, 3), "old_values": torch.zeros(1, 3)}
    reads = set()
    for name in ALGORITHMS:
        algo = get_algorithm(name)
        if "dual_clip" not in algo.config.model_fields:
            continue
        teacher = {"teacher_path": str(tmp_path)} if name == "distill" else {}  # not loaded by the loss
        cfg = algo_config(name=name, dual_clip=3.0, clip_low=0.2, clip_high=0.28,
                                              kl_coef=0.0, entropy_coef=0.0, **teacher)
        kw = {"values": torch.zeros(1, 3)} if name == "ppo" else {}
        dual, _ = algo.loss(logp, batch, cfg, num_tokens=3, num_seqs=1, **kw)
        assert dual.item() == pytest.approx(1.24, abs=1e-5), name  # dr_grpo: 3.72 / (1 seq x width 3)
        reads.add(name)
    assert reads == {"grpo", "dr_grpo", "gigpo", "rloo", "reinforce_pp", "ppo", "distill"}
    listed = set(algorithms_with("dual_clip"))  # the algorithms whose config has the key
    assert listed == reads


def test_tis_sequence_level_and_mask_mode_by_hand():
    mask = t([[1, 1, 0], [1, 1, 1]])
    sampler = torch.zeros(2, 3)
    learner = t([[0.5, 0.5, 9.0], [1.0, -0.5, -0.4]])  # 9.0 is padding: never read
    cap = 2.0
    # token: rho = [[e^.5, e^.5], [e^1, e^-.5, e^-.4]] = [[1.648721, 1.648721], [2.718282, ...]]
    w = tis_weights(learner, sampler, mask, cap=cap)
    assert torch.allclose(w, t([[1.648721, 1.648721, 0], [2.0, 0.606531, 0.670320]]), atol=1e-5)
    w = tis_weights(learner, sampler, mask, cap=cap, mode="mask")  # 2.718 > 2: that token drops
    assert torch.allclose(w, t([[1.648721, 1.648721, 0], [0.0, 0.606531, 0.670320]]), atol=1e-5)
    # sequence: row 0 e^(0.5 + 0.5) = 2.718282 > 2, row 1 e^(1 - 0.5 - 0.4) = e^0.1 = 1.105171
    w = tis_weights(learner, sampler, mask, cap=cap, level="sequence")
    assert torch.allclose(w, t([[2.0, 2.0, 0], [1.105171] * 3]), atol=1e-5)
    w = tis_weights(learner, sampler, mask, cap=cap, level="sequence", mode="mask")
    assert torch.allclose(w, t([[0.0, 0.0, 0], [1.105171] * 3]), atol=1e-5)
    with pytest.raises(ValueError, match="mode"):
        tis_weights(learner, sampler, mask, cap=cap, mode="clip")


def test_tis_level_and_mode_reach_the_learner(tiny_model_dir):
    from agentrl.algos.shaping import build_batch
    from agentrl.learner.local import Learner
    from agentrl.models.tiny import load_model

    model, _ = load_model(tiny_model_dir)
    learner = Learner(model, lr=1e-3, micro_batch_size=4)
    batch = build_batch(_trajs(), pad_id=0)
    true = learner.logprobs(batch)
    mask = batch["loss_mask"]
    # sampler 0.5 nats lower on every token of row 0 (2 tokens: sequence ratio e^1 = 2.718 > 2),
    # 0.1 lower on row 1 (3 tokens: e^0.3 = 1.349859); rows 2, 3 exact (ratio 1)
    shift = t([0.5, 0.1, 0.0, 0.0])[:, None]
    batch["sampler_logprobs"] = torch.where(mask != 0, true - shift, 0.0)
    cfg = load_config(None, ["algo.tis_cap=2", "algo.tis_level=sequence", "algo.tis_mode=mask"]).algo
    grpo = get_algorithm("grpo")
    batch["advantages"], _ = grpo.advantages(batch, cfg)
    learner.update(batch, grpo, cfg)
    w = tis_weights_of({**batch, "old_logprobs": true}, cfg)  # what grpo.loss weighed with
    assert torch.all(w[0] == 0)  # masked: the whole row drops out
    assert torch.allclose(w[1][mask[1] != 0], torch.tensor(math.exp(0.3)), atol=1e-4)
    assert torch.allclose(w[2:][mask[2:] != 0], torch.tensor(1.0), atol=1e-4)


def test_kl_estimator_in_the_reward_from_the_config():
    rloo = get_algorithm("rloo")
    mask = t([[0, 1, 1], [0, 1, 0]])
    old = t([[0, -1.0, -2.0], [0, -1.0, 0]])
    ref = t([[0, -1.5, -1.8], [0, -1.0, 0]])  # d = ref - old = [_, -0.5, 0.2]
    base = {"scores": t([1, 0]), "group_ids": torch.tensor([0, 0]), "loss_mask": mask,
            "old_logprobs": old, "ref_logprobs": ref, "token_rewards": t([[0, 0, 1], [0, 0, 0]])}
    # k1 = -d = [0.5, -0.2] (sum 0.3); k2 = d^2/2 = [0.125, 0.02] (sum 0.145)
    # rloo, kl_coef 1: R = [1 - sum k, 0], A0 = R0 - R1
    a1, _ = rloo.advantages(dict(base), algo_config(name="rloo", kl_coef=1.0))
    assert a1[0, 1].item() == pytest.approx(0.7, abs=1e-6)  # default: k1 as before
    a2, _ = rloo.advantages(dict(base), algo_config(name="rloo", kl_coef=1.0, kl_reward_kind="k2"))
    assert a2[0, 1].item() == pytest.approx(0.855, abs=1e-6)
    # reinforce_pp, gamma 1, kl_coef 1, k3 = e^d - d - 1 = [0.106531, 0.021403]
    r3 = reinforce_pp.returns(dict(base), algo_config(name="reinforce_pp", kl_coef=1.0, kl_reward_kind="k3"))
    # G = [_, -0.106531 + (1 - 0.021403), 1 - 0.021403] = [_, 0.872066, 0.978597]
    assert torch.allclose(r3[0], t([0, 0.872066, 0.978597]), atol=1e-5)


def test_dr_grpo_constant_normaliser_from_the_config(tiny_model_dir):
    from agentrl.algos.shaping import build_batch
    from agentrl.learner.local import Learner
    from agentrl.models.tiny import load_model

    model, _ = load_model(tiny_model_dir)
    learner = Learner(model, lr=1e-3, micro_batch_size=4)
    dr = get_algorithm("dr_grpo")
    for norm_len, expect_len in ((None, None), (64, 64)):
        batch = build_batch(_trajs(), pad_id=0)
        width = batch["input_ids"].shape[1]  # 3 + 5 + 1 = 9 (prompt and glue included)
        mask = batch["loss_mask"]
        batch["advantages"] = torch.where(torch.arange(4)[:, None] == 0, mask, 0.0)  # A = 1, row 0
        cfg = algo_config(name="dr_grpo", norm_len=norm_len)
        m = learner.update(batch, dr, cfg)
        # one step, r = 1: loss = -sum(A M) / (N_seq * L_max) = -2 / (4 * L_max)
        length = expect_len or width
        assert width == 9 and m["loss"] == pytest.approx(-2 / (4 * length), abs=1e-6)


def test_options_an_algorithm_would_ignore_are_refused():
    for name in ("gspo", "rloo", "reinforce_pp", "ppo", "dpo", "gigpo"):
        with pytest.raises(ValueError, match=r"algo.turn_advantages=True is not supported by "
                                             rf"algo.name={name}; supported by: grpo, dr_grpo, cispo"):
            algo_config(name=name, turn_advantages=True)  # refused by the schema
    for name in ("grpo", "dr_grpo", "cispo"):
        algo_config(name=name, turn_advantages=True)
    with pytest.raises(ValueError, match="algo.dual_clip=3.0 is not supported by algo.name=gspo"):
        algo_config(name="gspo", dual_clip=3.0)
    with pytest.raises(ValueError, match="algo.tis_cap"):
        algo_config(name="dpo", tis_cap=2.0)
    with pytest.raises(ValueError, match="algo.mask_truncated"):
        algo_config(name="dpo", mask_truncated=True)
    for name in ("grpo", "gspo", "rloo", "ppo", "dpo", "cispo", "gigpo"):  # defaults pass
        algo_config(name=name)


def test_train_refuses_an_ignored_option_at_start_up(tmp_path):
    from agentrl.run import set_up

    with pytest.raises(ValueError, match="turn_advantages"):  # the schema refuses it first
        set_up(load_config(None, ["algo.name=ppo", "algo.turn_advantages=true", f"out={tmp_path / 'r'}"]))
    assert not (tmp_path / "r").exists()  # nothing written before the error


# -- DAPO overlong shaping and filtering -----------------------------------------------------------
def test_overlong_penalty_by_hand():
    # L_max 8, L_cache 4: free up to 4 tokens, then linear to -1 at 8 (DAPO eq. 13)
    pen = overlong_penalty(torch.tensor([3, 4, 5, 6, 8, 9]), 8, 4)
    assert torch.allclose(pen, t([0, 0, -0.25, -0.5, -1.0, -1.0]))
    assert torch.allclose(overlong_penalty(torch.tensor([6]), 8, 4, 0.5), t([-0.25]))
    with pytest.raises(ValueError, match="overlong_buffer"):
        overlong_penalty(torch.tensor([1]), 8, 9)
    with pytest.raises(ConfigError, match="overlong_buffer"):
        load_config(None, ["algo.overlong_buffer=200", "rollout.max_tokens=96"])


def test_overlong_shaping_puts_each_turn_penalty_on_its_last_token():
    # row 0: turns of 6 and 3 tokens; row 1: one turn of 8 tokens; row 2: failed reward (NaN)
    mask = torch.zeros(3, 14)
    mask[0, 1:7] = 1
    mask[0, 9:12] = 1
    mask[1, 2:10] = 1
    mask[2, 1:3] = 1
    lengths, last = turn_lengths(mask)
    assert lengths.tolist() == [[6, 3], [8, 0], [2, 0]] and last.tolist() == [[6, 11], [9, -1], [2, -1]]
    rew = torch.zeros(3, 14)
    rew[0, 11] = 1.0
    batch = {"loss_mask": mask, "token_rewards": rew, "scores": t([1.0, 0.0, float("nan")])}
    m = apply_overlong_shaping(batch, max_tokens=8, buffer=4, penalty=1.0)
    # row 0: turn 0 (6 tokens) -0.5 on position 6, turn 1 (3 tokens) 0; row 1: -1 on position 9
    assert batch["token_rewards"][0, 6] == -0.5 and batch["token_rewards"][0, 11] == 1.0
    assert batch["token_rewards"][1, 9] == -1.0 and batch["token_rewards"].abs().sum() == 2.5
    assert batch["scores"][:2].tolist() == [0.5, -1.0] and math.isnan(batch["scores"][2])
    assert m["overlong_turn_frac"] == pytest.approx(2 / 4)
    assert m["overlong_penalty_mean"] == pytest.approx(-0.5)


def _traj(group, n_tokens, reason, reward):
    tr = Trajectory(group_id=group)
    tr.append_context([1, 2])
    tr.append_sampled([3] * n_tokens, [-1.0] * n_tokens, reward=reward, finish_reason=reason)
    return tr


def test_mask_truncated_and_shaping_in_the_batch():
    from agentrl.algos.shaping import build_batch

    trajs = [_traj(0, 4, "length", 1.0), _traj(0, 2, "stop", 0.0), _traj(0, 3, "stop", 1.0)]
    batch = build_batch(trajs, pad_id=0)
    before = batch["loss_mask"].clone()
    cfg = algo_config(overlong_buffer=2, mask_truncated=True)
    m = shape_batch(batch, trajs, cfg, max_tokens=4, mask_truncated=get_algorithm("grpo").masks_truncated(cfg))
    # budget 4, buffer 2: lengths 4, 2, 3 -> penalties -1, 0, -0.5
    assert batch["scores"].tolist() == [0.0, 0.0, 0.5]
    assert m["masked_truncated"] == 1.0
    assert batch["loss_mask"][0].sum() == 0 and torch.equal(batch["loss_mask"][1:], before[1:])
    # off (the defaults): nothing changes
    batch2 = build_batch(trajs, pad_id=0)
    assert shape_batch(batch2, trajs, algo_config(), max_tokens=4, mask_truncated=False) == {}
    assert batch2["scores"].tolist() == [1.0, 0.0, 1.0]


# -- GiGPO -----------------------------------------------------------------------------------------
def _gigpo_batch():
    # one group, 3 episodes of 2 one-token turns: prompt [1, 2] | turn 0 | observation | turn 1
    # episodes 0 and 1 see the same observation [7, 8] before turn 1 (an anchor state),
    # episode 2 sees [9, 9]; turn rewards (0, 1), (0, 0), (0.5, 1)
    ids = torch.tensor([[1, 2, 10, 7, 8, 11], [1, 2, 10, 7, 8, 12], [1, 2, 13, 9, 9, 14]])
    mask = t([[0, 0, 1, 0, 0, 1]] * 3)
    rew = t([[0, 0, 0, 0, 0, 1], [0, 0, 0, 0, 0, 0], [0, 0, 0.5, 0, 0, 1]])
    return {"input_ids": ids, "loss_mask": mask, "token_rewards": rew,
            "scores": t([1, 0, 1.5]), "group_ids": torch.tensor([0, 0, 0])}


def test_gigpo_anchor_states_and_discounted_turn_returns():
    b = _gigpo_batch()
    states = turn_states(b["input_ids"], b["loss_mask"])
    assert states == [[(1, 2), (7, 8)], [(1, 2), (7, 8)], [(1, 2), (9, 9)]]
    ret, exists = discounted_turn_returns(b["token_rewards"], b["loss_mask"], 0.5)
    # row 0: [0 + 0.5 * 1, 1]; row 2: [0.5 + 0.5 * 1, 1]
    assert ret.tolist() == [[0.5, 1.0], [0.0, 0.0], [1.0, 1.0]] and exists.all()


def test_gigpo_advantages_by_hand():
    gigpo = get_algorithm("gigpo")
    cfg = algo_config(name="gigpo", gamma=1.0, step_weight=0.5)
    adv, stats = gigpo.advantages(_gigpo_batch(), cfg)
    # episode level: scores [1, 0, 1.5], mean 0.833333, std sqrt(1.166667 / 2) = 0.763763
    #   A^E = [0.218218, -1.091089, 0.872872]
    # step level, turn 0: all three share the prompt state; returns [1, 0, 1.5] -> = A^E
    # step level, turn 1: anchor [7, 8] = rows 0, 1, returns [1, 0] -> [0.707107, -0.707107];
    #   row 2's state [9, 9] is seen once -> 0
    # A = A^E + 0.5 * A^S:
    #   turn 0: 1.5 * A^E = [0.327327, -1.636634, 1.309307]
    #   turn 1: [0.218218 + 0.353553, -1.091089 - 0.353553, 0.872872] = [0.571771, -1.444642, 0.872872]
    exp = t([[0, 0, 0.327327, 0, 0, 0.571771], [0, 0, -1.636634, 0, 0, -1.444642],
             [0, 0, 1.309307, 0, 0, 0.872872]])
    assert torch.allclose(adv, exp, atol=1e-5)
    assert stats["num_groups"] == 1
    # step_weight 0: plain GRPO
    grpo_adv, _ = get_algorithm("grpo").advantages(_gigpo_batch(), algo_config())
    adv0, _ = gigpo.advantages(_gigpo_batch(), algo_config(name="gigpo", step_weight=0.0))
    assert torch.allclose(adv0, grpo_adv)


def test_gigpo_defaults_and_groups_stay_apart():
    gigpo = get_algorithm("gigpo")
    assert algo_config(name="gigpo").gamma == 0.95  # the paper's gamma
    b = _gigpo_batch()
    b["group_ids"] = torch.tensor([0, 1, 0])  # rows 0 and 1 share a state but not a task
    cfg = algo_config(name="gigpo", gamma=1.0, step_weight=1.0)
    adv, _ = gigpo.advantages(b, cfg)
    # group 1 is a singleton: 0 everywhere; group 0 = rows 0, 2, scores [1, 1.5]:
    #   A^E = [-0.707107, 0.707107] (std 0.353553); turn 0 the same; turn 1 states differ -> 0
    assert torch.all(adv[1] == 0)
    assert torch.allclose(adv[0, [2, 5]], t([-1.414214, -0.707107]), atol=1e-5)
    assert torch.allclose(adv[2, [2, 5]], t([1.414214, 0.707107]), atol=1e-5)


# per-turn groups on the 3-episode, 2-turn batch (`_gigpo_batch`), by hand:
#   turn 0 returns-to-go [1, 0, 1.5]: std = A^E = [0.218218, -1.091089, 0.872872];
#     none = R - mean = [0.166667, -0.833333, 0.666667]
#   turn 1 returns [1, 0, 1], mean 2/3, std sqrt(1/3) = 0.577350:
#     std [0.577350, -1.154701, 0.577350]; none [0.333333, -0.666667, 0.333333]
PER_TURN = {"std": ([0.218218, -1.091089, 0.872872], [0.577350, -1.154701, 0.577350]),
            "none": ([0.166667, -0.833333, 0.666667], [0.333333, -0.666667, 0.333333])}


def _per_turn_expected(scale):
    t0, t1 = PER_TURN[scale]
    return t([[0, 0, a, 0, 0, b] for a, b in zip(t0, t1)])


def _algo_cfg(name, tmp_path, **kw):
    extra = {"teacher_path": str(tmp_path)} if name == "distill" else {}
    return algo_config(name=name, **extra, **kw)


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_every_algorithm_uses_or_refuses_turn_advantages(name, tmp_path):
    """Issue #24: `algo.turn_advantages` is never silently ignored. An algorithm that lists it in
    its config really computes per-turn group advantages (hand values above); every other one
    refuses it, in its config's schema and so at the start of `agentrl train` (nothing
    written)."""
    algo = get_algorithm(name)
    if "turn_advantages" in algo.config.model_fields:
        cfg = _algo_cfg(name, tmp_path, turn_advantages=True)
        assert algo.turn_advantages(cfg)
        adv, _ = algo.advantages(_gigpo_batch(), cfg)
        scale = "none" if name == "dr_grpo" else "std"
        assert torch.allclose(adv, _per_turn_expected(scale), atol=1e-5)
        episode, _ = algo.advantages(_gigpo_batch(), _algo_cfg(name, tmp_path))
        assert not torch.allclose(adv, episode)  # it changed something
        return
    assert algorithms_with("turn_advantages") == ["grpo", "dr_grpo", "cispo"]
    with pytest.raises(ValueError, match=rf"algo.turn_advantages=True is not supported by "
                                         rf"algo.name={name}; supported by: grpo, dr_grpo, cispo"):
        _algo_cfg(name, tmp_path, turn_advantages=True)
    over = [f"algo.name={name}", "algo.turn_advantages=true", f"out={tmp_path / 'r'}"]
    if name == "distill":
        over.append(f"algo.teacher_path={tmp_path}")
    with pytest.raises(ConfigError, match=r"config error: algo.turn_advantages=True"):
        load_config(None, over)
    assert not (tmp_path / "r").exists()


def test_turn_credit_gigpo_on_grpo_is_gigpo():
    """`--algo grpo algo.turn_credit=gigpo` resolves to GiGPO's settings and gives GiGPO's
    advantages (hand values of `test_gigpo_advantages_by_hand`); dr_grpo's has no std."""
    gigpo, grpo = get_algorithm("gigpo"), get_algorithm("grpo")
    cfg = load_config(None, ["algo.turn_credit=gigpo"]).algo
    assert cfg.gamma == 0.95 and algo_config(name="gigpo").gamma == 0.95
    assert algo_config(turn_credit="gigpo", gamma=1.0).gamma == 1.0  # set: kept
    assert algo_config().gamma == 1.0  # episode credit: unchanged
    cispo = algo_config(name="cispo", turn_credit="gigpo")
    assert (cispo.gamma, cispo.clip_low) == (0.95, 1.0)  # GiGPO's gamma under CISPO's own defaults
    kw = {"gamma": 1.0, "step_weight": 0.5}
    adv, stats = grpo.advantages(_gigpo_batch(), algo_config(turn_credit="gigpo", **kw))
    exp = t([[0, 0, 0.327327, 0, 0, 0.571771], [0, 0, -1.636634, 0, 0, -1.444642],
             [0, 0, 1.309307, 0, 0, 0.872872]])
    assert torch.allclose(adv, exp, atol=1e-5) and stats["step_adv_abs_mean"] > 0
    ref, _ = gigpo.advantages(_gigpo_batch(), algo_config(name="gigpo", **kw))
    assert torch.equal(adv, ref)
    c_adv, _ = get_algorithm("cispo").advantages(_gigpo_batch(),
                                                 algo_config(name="cispo", turn_credit="gigpo", **kw))
    assert torch.equal(c_adv, ref)
    # dr_grpo: A^E = R - mean = [1/6, -5/6, 2/3]; turn 1 anchor [7, 8]: [0.5, -0.5], row 2: 0
    #   turn 0: 1.5 A^E = [0.25, -1.25, 1.0]; turn 1: A^E + 0.5 A^S = [0.416667, -1.083333, 0.666667]
    d_adv, _ = grpo.advantages(_gigpo_batch(), algo_config(name="dr_grpo", turn_credit="gigpo", **kw))
    assert torch.allclose(d_adv, t([[0, 0, 0.25, 0, 0, 0.416667], [0, 0, -1.25, 0, 0, -1.083333],
                                    [0, 0, 1.0, 0, 0, 0.666667]]), atol=1e-5)


def test_turn_credit_refused_where_it_would_be_ignored_or_contradicts(tmp_path):
    for name in ("gspo", "rloo", "reinforce_pp", "ppo", "dpo", "distill"):
        with pytest.raises(ValueError, match=rf"algo.turn_credit='gigpo' is not supported by "
                                             rf"algo.name={name}; supported by: grpo, dr_grpo, "
                                             rf"cispo, gigpo"):
            _algo_cfg(name, tmp_path, turn_credit="gigpo")
    algo_config(name="gigpo", turn_credit="gigpo")
    with pytest.raises(ConfigError, match="algo.turn_credit=gigpo and algo.turn_advantages=true"):
        load_config(None, ["algo.turn_credit=gigpo", "algo.turn_advantages=true"])
    with pytest.raises(ConfigError, match="algo.turn_credit=episode with algo.name=gigpo"):
        load_config(None, ["algo.name=gigpo", "algo.turn_credit=episode"])
    with pytest.raises(ConfigError, match="algo.turn_credit"):
        load_config(None, ["algo.turn_credit=step"])


# -- helpers -------------------------------------------------------------------------------------
def _trajs(n=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        tr = Trajectory(group_id=i // 2)
        tr.append_context(torch.randint(3, 50, (3,), generator=g).tolist())
        tr.append_sampled(torch.randint(3, 50, (2 + i,), generator=g).tolist(), [-3.0] * (2 + i),
                          reward=float(i % 2))
        tr.append_context([5])
        tr.terminated = True
        out.append(tr)
    return out


# -- on-policy distillation ------------------------------------------------------------------------
def test_distill_advantages_by_hand_on_three_tokens():
    distill = get_algorithm("distill")
    # one row, 3 sampled tokens after a prompt token
    batch = {"loss_mask": t([[0, 1, 1, 1]]), "old_logprobs": t([[0, -1.5, -1.0, -0.5]]),
             "teacher_logprobs": t([[-9.0, -1.0, -2.0, -0.5]]),  # -9: the prompt, never read
             "scores": t([1.0]), "group_ids": torch.tensor([0])}
    cfg = algo_config(name="distill", teacher_path=".", distill_coef=2.0)
    adv, stats = distill.advantages(batch, cfg)
    # log p_teacher - log p_student = [0.5, -1.0, 0.0]; x 2 = [1, -2, 0]
    assert adv.tolist() == [[0.0, 1.0, -2.0, 0.0]]
    assert stats["reverse_kl"] == pytest.approx(0.5 / 3)  # mean of [-0.5, 1.0, 0.0]
    # mixed with the env reward: two rows of one group, scores [1, 0] -> A^GRPO = [0.707107, -0.707107]
    b2 = {"loss_mask": t([[0, 1, 1, 1], [0, 1, 0, 0]]),
          "old_logprobs": t([[0, -1.5, -1.0, -0.5], [0, -1.0, 0, 0]]),
          "teacher_logprobs": t([[0, -1.0, -2.0, -0.5], [0, -1.0, 0, 0]]),
          "scores": t([1.0, 0.0]), "group_ids": torch.tensor([0, 0])}
    adv, _ = distill.advantages(b2, algo_config(name="distill", teacher_path=".",
                                               distill_reward_coef=0.5))
    exp = t([[0, 0.5 + 0.353553, -1.0 + 0.353553, 0.353553], [0, -0.353553, 0, 0]])
    assert torch.allclose(adv, exp, atol=1e-5)


def test_distill_teacher_equal_to_student_gives_zero_signal(tiny_model_dir):
    from agentrl.algos.shaping import build_batch
    from agentrl.learner.frozen import inline_teacher
    from agentrl.learner.local import Learner
    from agentrl.models.tiny import load_model

    distill = get_algorithm("distill")
    model, _ = load_model(tiny_model_dir)
    learner = Learner(model, lr=1e-3, micro_batch_size=4)
    cfg = load_config(None, ["algo.name=distill", f"algo.teacher_path={tiny_model_dir}"]).algo
    learner.teacher = inline_teacher(cfg.teacher_path, learner)  # as run.build sets it
    batch, m = distill.prepare(build_batch(_trajs(), pad_id=0), learner, cfg)
    adv, stats = distill.advantages(batch, cfg)
    assert torch.all(adv == 0) and m["reverse_kl"] == 0 and stats["reverse_kl"] == 0
    # a different teacher (the student after one update) gives a nonzero signal on agent tokens
    # only
    batch["advantages"] = torch.where(batch["loss_mask"] != 0, 1.0, 0.0)
    learner.update(batch, get_algorithm("grpo"), algo_config())
    batch2, _ = distill.prepare(build_batch(_trajs(), pad_id=0), learner, cfg)
    adv2, _ = distill.advantages(batch2, cfg)
    assert adv2.abs().sum() > 0 and torch.all(adv2[batch2["loss_mask"] == 0] == 0)


def test_distill_config_needs_a_teacher_directory(tmp_path):
    with pytest.raises(ConfigError, match="teacher_path"):
        load_config(None, ["algo.name=distill"])
    with pytest.raises(ConfigError, match="teacher model directory not found"):
        load_config(None, ["algo.name=distill", f"algo.teacher_path={tmp_path / 'nope'}"])
