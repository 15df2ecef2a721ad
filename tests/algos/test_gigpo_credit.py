"""GiGPO's credit on the multi-turn code-repair job (issue 40), by hand: tree rollouts
(`rollout.branch=2`) with the env's per-turn rewards (`code_sandbox`: 1 for a pass, 0 for a
failure, `turn_penalty` subtracted from every turn after the first), the shared first turn's
advantages, and DAPO's dynamic sampling keeping the groups GiGPO has a signal in.

The group used throughout: G = 4 episodes of one task, branch 2 (two first attempts, each
continued twice). Token ids: prompt [1, 2]; attempt A [10] fails and gets feedback [7, 8];
attempt B [20] passes. A's continuations: A1 repairs at once ([11]); A2 fails again ([12],
feedback [7, 9]) and passes at its third attempt ([13]). B's two episodes end after B.
"""

from __future__ import annotations

import pytest
import torch

from agentrl.algos import get_algorithm
from agentrl.algos.shaping import dynamic_sampling, filter_groups
from agentrl.config import algo_config
from agentrl.env.base import TextEnv
from agentrl.types import Trajectory, collate

PROMPT = [1, 2]


def _episode(gid, turns):
    """`turns`: (sampled ids, reward, feedback ids or None) per attempt."""
    tr = Trajectory(group_id=gid)
    tr.append_context(PROMPT)
    for ids, reward, feedback in turns:
        tr.append_sampled(ids, [-1.0] * len(ids), reward=reward)
        if feedback is not None:
            tr.append_context(feedback)
    return tr


def _tree_group(penalty=0.0, gid=0):
    a1 = _episode(gid, [([10], 0.0, [7, 8]), ([11], 1.0 - penalty, None)])
    a2 = _episode(gid, [([10], 0.0, [7, 8]), ([12], -penalty, [7, 9]), ([13], 1.0 - penalty, None)])
    b = [_episode(gid, [([20], 1.0, None)]) for _ in range(2)]
    return [a1, a2, *b]


def _batch(trajs):
    from agentrl.algos.shaping import build_batch

    return build_batch(trajs, pad_id=0)


def _turn_values(adv, trajs):
    """The advantage of each turn, checking it is one value on all of the turn's tokens and 0 on
    every other token."""
    out = []
    for i, tr in enumerate(trajs):
        row = []
        for t in tr.turns:
            a = adv[i, t.start:t.end]
            assert torch.all(a == a[0])
            row.append(float(a[0]))
        off = torch.ones(adv.shape[1], dtype=torch.bool)
        for t in tr.turns:
            off[t.start:t.end] = False
        assert torch.all(adv[i][off] == 0)
        out.append(row)
    return out


def test_tree_rollout_without_turn_penalty_by_hand():
    """Every episode passes (returns 1, 1, 1, 1): A^E = 0 for all, the credit is GiGPO's step
    advantage alone (gamma 0.95, omega 1, std):
      discounted returns: A1 (0.95, 1); A2 (0.9025, 0.95, 1); B1, B2 (1)
      anchor "prompt" (turn 0 of all four): [0.95, 0.9025, 1, 1], mean 0.963125, std 0.0467874
        -> [-0.280518, -1.295727, 0.788122, 0.788122]
      anchor [7, 8] (the repairs of attempt A, A1 and A2 turn 1): [1, 0.95] -> [0.707107, -0.707107]
      anchor [7, 9] (A2 turn 2): seen once -> 0
    The shared first turn A is trained in both its episodes: its tokens get -0.280518 in A1 and
    -1.295727 in A2, together 2 x their mean (-0.788122), the opposite of B's 2 x 0.788122."""
    trajs = _tree_group()
    cfg = algo_config(turn_credit="gigpo")  # the job's credit: GiGPO's gamma 0.95, omega 1
    assert (cfg.gamma, cfg.step_weight, cfg.scale) == (0.95, 1.0, "std")
    adv, stats = get_algorithm("grpo").advantages(_batch(trajs), cfg)
    got = _turn_values(adv, trajs)
    exp = [[-0.280518, 0.707087], [-1.295727, -0.707087, 0.0], [0.788122], [0.788122]]
    for g, e in zip(got, exp):
        assert g == pytest.approx(e, abs=1e-5)
    assert stats["num_zero_variance_groups"] == 1  # the episode returns are flat ...
    assert stats["step_adv_abs_mean"] > 0  # ... the step returns are not
    assert got[0][0] + got[1][0] == pytest.approx(-(got[2][0] + got[3][0]), abs=1e-6)


def test_tree_rollout_with_turn_penalty_by_hand():
    """turn_penalty 0.2 (the env subtracts it from turns 2 and 3): rewards A1 (0, 0.8), A2
    (0, -0.2, 0.8), B (1); returns 0.8, 0.6, 1, 1.
      A^E: mean 0.85, std 0.191485 -> [-0.261115, -1.305576, 0.783345, 0.783345]
      discounted returns: A1 (0.76, 0.8); A2 (0.532, 0.56, 0.8); B (1)
      anchor prompt: [0.76, 0.532, 1, 1], mean 0.823, std 0.224580 -> [-0.280523, -1.295749,
        0.788136, 0.788136]
      anchor [7, 8]: [0.8, 0.56] -> [0.707103, -0.707103]; anchor [7, 9]: 0
    A = A^E + A^S on each turn's tokens."""
    trajs = _tree_group(penalty=0.2)
    assert [tr.episode_return for tr in trajs] == pytest.approx([0.8, 0.6, 1.0, 1.0])
    adv, _ = get_algorithm("gigpo").advantages(_batch(trajs), algo_config(name="gigpo"))
    ae = [-0.261115, -1.305576, 0.783345, 0.783345]
    exp = [[ae[0] - 0.280523, ae[0] + 0.707103], [ae[1] - 1.295749, ae[1] - 0.707103, ae[1]],
           [ae[2] + 0.788136], [ae[3] + 0.788136]]
    for g, e in zip(_turn_values(adv, trajs), exp):
        assert g == pytest.approx(e, abs=1e-5)


def test_edge_cases_single_turn_masked_rows_and_no_turns():
    """T = 1: one anchor (the prompt), A^S = A^E, so A = (1 + omega) A^E exactly; a row whose
    loss mask is all 0 (overlong filtering) gets 0 and does not break the others; a batch
    without any agent token gives zeros."""
    trajs = [_episode(0, [([20], r, None)]) for r in (1.0, 0.0, 0.0)]
    b = _batch(trajs)
    cfg = algo_config(name="gigpo", step_weight=0.5)
    adv, _ = get_algorithm("gigpo").advantages(b, cfg)
    # returns [1, 0, 0]: mean 1/3, std 0.577350 -> A^E [1.154699, -0.577350, -0.577350]; x 1.5
    assert adv[:, 2].tolist() == pytest.approx([1.732049, -0.866025, -0.866025], abs=1e-5)
    b["loss_mask"][1] = 0
    adv, _ = get_algorithm("gigpo").advantages(b, cfg)
    assert torch.all(adv[1] == 0) and adv[0, 2] > 0
    b["loss_mask"][:] = 0
    adv, _ = get_algorithm("gigpo").advantages(b, cfg)
    assert torch.all(adv == 0)


def test_dynamic_sampling_keeps_groups_with_a_step_level_signal():
    """DAPO's dynamic sampling drops the groups that carry no gradient. Under GiGPO a group
    whose episode returns are equal still has one when its discounted step returns differ
    within an anchor state (the tree group above: every episode passes, at attempts 1, 2 and
    3); a group where every episode passes at once has none under either credit."""
    informative = _tree_group(gid=0)
    flat = [_episode(1, [([20], 1.0, None)]) for _ in range(4)]

    def more(r):  # no refills
        return []

    kept, _ = dynamic_sampling(informative + flat, more, want=8, cfg=algo_config(turn_credit="gigpo"))
    assert [t.group_id for t in kept] == [0, 0, 0, 0]
    kept, _ = dynamic_sampling(informative + flat, more, want=8)  # episode credit: both flat
    assert kept == []
    kept, m = filter_groups(informative + flat, more, algo_config(name="gigpo", dynamic_sampling=True), 4)
    assert [t.group_id for t in kept] == [0, 0, 0, 0] and m == {"refill_rounds": 0}
    kept, _ = filter_groups(informative + flat, more, algo_config(dynamic_sampling=True), 4)
    assert kept == []


def test_dynamic_sampling_keeps_groups_with_a_per_turn_signal():
    """Per-turn groups (`turn_advantages`): turn rewards (0.25, 0.75) and (0.5, 0.5) both return
    1, so the episode advantages and turn 0's returns-to-go (1, 1) are flat, but turn 1's (0.75,
    0.5) are not: the group is kept. Episode credit drops it."""
    pair = [_episode(0, [([10], 0.25, [7, 8]), ([11], 0.75, None)]),
            _episode(0, [([12], 0.5, [7, 9]), ([13], 0.5, None)])]
    per_turn = algo_config(turn_advantages=True, dynamic_sampling=True)
    adv, _ = get_algorithm("grpo").advantages(_batch(pair), per_turn)
    # turn 1 (position 5): returns [0.75, 0.5], std 0.176777 -> [0.707103, -0.707103]; turn 0: 0
    assert adv[:, 2].tolist() == [0.0, 0.0] and adv[:, 5].tolist() == pytest.approx([0.707103, -0.707103], abs=1e-5)
    kept, _ = filter_groups(pair, lambda r: [], per_turn, 2)
    assert len(kept) == 2
    assert filter_groups(pair, lambda r: [], algo_config(dynamic_sampling=True), 2)[0] == []


def test_collated_rows_hold_the_turns_rewards():
    """The env's per-turn rewards reach the advantages on each turn's last sampled token."""
    trajs = _tree_group(penalty=0.2)
    rew = collate(trajs, pad_id=0)["token_rewards"]
    assert rew[1].tolist() == pytest.approx([0, 0, 0, 0, 0, -0.2, 0, 0, 0.8])


def test_overlong_filtered_rows_still_count_in_the_turn_statistics():
    """`algo.mask_truncated`: a row with a turn cut by the token budget gets loss mask 0 but
    still counts in its group's statistics, the anchor states' and per-turn groups' too.
    One task, three single-turn episodes, returns [1, 0, 0], the second cut ("length"):
      A^E (all three) = [1.154699, -0.577350, -0.577350]; the turn-0 anchor (the prompt) and
      the turn-0 group hold the same three returns, so A^S = A^E and the per-turn advantage is
      A^E: gigpo (omega 0.5) gives 1.5 A^E = [1.732049, 0, -0.866025] (row 1 masked); per-turn
      groups give [1.154699, 0, -0.577350]. (Before: the cut row left the anchor group, whose
      two returns [1, 0] gave A^S = +-0.707107.)"""
    from agentrl.algos.shaping import shape_batch

    trajs = [_episode(0, [([20], r, None)]) for r in (1.0, 0.0, 0.0)]
    trajs[1].turns[0].finish_reason = "length"
    for cfg, exp in ((algo_config(name="gigpo", step_weight=0.5, mask_truncated=True),
                      [1.732049, 0.0, -0.866025]),
                     (algo_config(turn_advantages=True, mask_truncated=True), [1.154699, 0.0, -0.577350])):
        b = _batch(trajs)
        assert shape_batch(b, trajs, cfg, max_tokens=8, mask_truncated=True) == {"masked_truncated": 1.0}
        adv, _ = get_algorithm(cfg.name).advantages(b, cfg)
        assert adv[:, 2].tolist() == pytest.approx(exp, abs=1e-5)
        assert torch.all(adv[b["loss_mask"] == 0] == 0)


def test_gamma_outside_the_unit_interval_is_refused():
    """GiGPO's discount (and PPO's, REINFORCE++'s) must be in [0, 1]: a gamma of 1.5 made later
    rewards weigh more than near ones and was used as given."""
    from agentrl.algos.turns import discounted_turn_returns

    for kw in ({"name": "gigpo", "gamma": 1.5}, {"turn_credit": "gigpo", "gamma": -0.5},
               {"name": "ppo", "gamma": 2.0}):
        with pytest.raises(ValueError, match="gamma"):
            algo_config(**kw)
    b = _batch(_tree_group())
    with pytest.raises(ValueError, match=r"gamma must be in \[0, 1\]"):
        discounted_turn_returns(b["token_rewards"], b["loss_mask"], 1.5)
    assert algo_config(name="gigpo", gamma=0.0).gamma == 0.0


def test_gae_lambda_outside_the_unit_interval_is_refused_at_start_up():
    """PPO's GAE lambda, like gamma, must be in [0, 1]: a lambda of 1.5 passed the config and
    failed only at the first update (`advantages.gae`), after the evaluation before RL."""
    for lam in (1.5, -0.1, float("nan")):
        with pytest.raises(ValueError, match="algo.lam"):
            algo_config(name="ppo", lam=lam)
    assert algo_config(name="ppo", lam=1.0).lam == 1.0


def test_anchor_stats_show_whether_repairs_share_a_state():
    """The tree group: turns (row, k) with anchors prompt x4 (A1 0, A2 0, B1 0, B2 0), [7, 8] x2
    (A1 1, A2 1), [7, 9] x1 (A2 2): 7 turns, sizes 4,4,4,4,2,2,1 -> mean 21/7 = 3.0; later turns
    (k >= 1): A1 1, A2 1 anchored, A2 2 alone -> 2/3. Without branching (four distinct first
    attempts and feedbacks) no later turn shares a state: 0, and the mean size is that of the
    prompt group's 4 turns and the later turns' 1s."""
    from agentrl.algos.turns import anchor_stats

    cfg = algo_config(turn_credit="gigpo")
    _, stats = get_algorithm("grpo").advantages(_batch(_tree_group()), cfg)
    assert stats["step_group_size_mean"] == pytest.approx(3.0)
    assert stats["later_turns_anchored_frac"] == pytest.approx(2 / 3)
    flat = [_episode(0, [([10 + i], 0.0, [7, 8 + i]), ([20 + i], 1.0, None)]) for i in range(4)]
    _, stats = get_algorithm("grpo").advantages(_batch(flat), cfg)
    assert stats["later_turns_anchored_frac"] == 0.0
    assert stats["step_group_size_mean"] == pytest.approx((4 * 4 + 4 * 1) / 8)
    # single-turn episodes: no later turn, no key
    _, stats = get_algorithm("grpo").advantages(_batch([_episode(0, [([20], 1.0, None)])] * 2), cfg)
    assert "later_turns_anchored_frac" not in stats and stats["step_group_size_mean"] == 2.0
    assert anchor_stats([], []) == {}


def test_dynamic_sampling_under_template_history_drops_groups_with_equal_returns():
    """`rollout.history=template`: each turn becomes its own sample carrying the episode's
    return (`turn_samples`), so GiGPO's step returns are the episode returns and gamma plays no
    part: the tree group (every episode returns 1) has A^E = A^S = 0 on every turn sample and
    carries no gradient. Dynamic sampling drops it (it was kept: its discounted returns of the
    exact history, 1 vs 0.95^2 at the first anchor, were read as a step-level signal)."""
    from agentrl.rollout.agent_loop import turn_samples

    def templated(trajs):
        for tr in trajs:  # each turn sampled from the ids before it (the rendering, here exact)
            tr.turn_prompts = [list(tr.token_ids[:t.start]) for t in tr.turns]
        return trajs

    cfg = algo_config(name="gigpo", dynamic_sampling=True)
    group = templated(_tree_group())
    adv, _ = get_algorithm("gigpo").advantages(_batch(turn_samples(group)), cfg)
    assert torch.all(adv == 0)
    assert filter_groups(group, lambda r: [], cfg, 4)[0] == []
    # a group whose returns differ is kept, and the exact-history tree group still is
    mixed = templated([_episode(2, [([20], r, None)]) for r in (1.0, 0.0)])
    assert len(filter_groups(mixed, lambda r: [], cfg, 2)[0]) == 2
    assert len(filter_groups(_tree_group(), lambda r: [], cfg, 4)[0]) == 4


class FlatEnv(TextEnv):
    """One turn, reward 1 whatever the answer: every group scores alike."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return [{"role": "user", "content": "Say hi."}], {"task_id": f"t{seed}"}

    def step(self, action):
        return [], 1.0, True, False, {}


def test_a_step_where_dynamic_sampling_kept_no_group_says_so(tmp_path, tiny_model_dir):
    """Every group flat after the refills: the update is skipped and the warning says that
    dynamic sampling dropped the groups (it said "0 episodes, 0 with an env error", as if
    nothing had been sampled)."""
    from rich.console import Console

    from agentrl.config import load_config
    from agentrl.train import train

    cfg = load_config(None, ["env.name=test_gigpo_credit:FlatEnv", "sft.steps=0", "rollout.tasks_per_step=1",
                             "algo.group_size=2", "algo.dynamic_sampling=true", "train.steps=1",
                             "train.eval_tasks=1", "train.eval_samples=1", "rollout.max_tokens=4",
                             f"model.path={tiny_model_dir}", f"out={tmp_path / 'run'}"])
    console = Console(width=400, record=True)
    train(cfg, console=console)
    text = " ".join(console.export_text().split())
    assert ("update skipped: the batch has no trainable tokens (dynamic sampling (algo.dynamic_sampling) "
            "kept no group: 2 episodes sampled, 3 refill rounds, in every group the episodes scored alike)") in text
