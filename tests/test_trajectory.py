"""Trajectory building and collation: masks from lengths (M1, M2), rewards on the last sampled
token (A9, A10), padding never trained."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.algos.shaping import build_batch
from agentrl.types import Trajectory, collate


def traj(prompt, sampled, reward, group=0):
    t = Trajectory(group_id=group)
    t.append_context(prompt)
    t.append_sampled(sampled, [-0.5] * len(sampled), reward=reward)
    return t


def test_m1_mask_comes_from_lengths_not_token_values():
    # eos = pad = 2; completion [11, 12, 2] then padding with 2s: mask [1, 1, 1, 0, 0]
    t = Trajectory()
    t.append_sampled([11, 12, 2], [-1.0, -1.0, -1.0])
    b = collate([t], pad_id=2, pad_to=5)
    assert b["input_ids"].tolist() == [[11, 12, 2, 2, 2]]
    assert b["loss_mask"].tolist() == [[1, 1, 1, 0, 0]]
    assert b["attention_mask"].tolist() == [[1, 1, 1, 0, 0]]


def test_m2_second_eos_id_ends_turn_and_padding_is_zero():
    # eos ids {2, 7}, pad 0: completion [11, 7] then pad -> mask [1, 1, 0, 0]
    t = Trajectory()
    t.append_sampled([11, 7], [-1.0, -1.0], finish_reason="stop")
    b = collate([t], pad_id=0, pad_to=4)
    assert b["loss_mask"].tolist() == [[1, 1, 0, 0]]
    assert t.turns[0].finish_reason == "stop"


def test_a10_outcome_reward_on_eos_not_padding():
    t = Trajectory()
    t.append_sampled([5, 6, 2], [-1.0] * 3, reward=1.0)  # [t0, t1, EOS]
    b = collate([t], pad_id=0, pad_to=5)  # [t0, t1, EOS, PAD, PAD]
    assert b["token_rewards"].tolist() == [[0.0, 0.0, 1.0, 0.0, 0.0]]


def test_a9_empty_response_gets_no_token_reward_and_no_baseline_share():
    # batch width 4, response lengths [0, 3], scores [10, 0.5]
    empty = Trajectory(group_id=0)
    empty.append_context([9])
    empty.append_sampled([], [], reward=10.0)
    full = Trajectory(group_id=0)
    full.append_context([9])
    full.append_sampled([4, 5, 2], [-1.0] * 3, reward=0.5)
    b = build_batch([empty, full], pad_id=0)
    rows = collate([empty, full], pad_id=0, pad_to=4)["token_rewards"]
    assert rows[0].tolist() == [0.0, 0.0, 0.0, 0.0]
    assert rows[1].tolist() == [0.0, 0.0, 0.0, 0.5]
    assert empty.info["dropped_reward"] == 10.0  # flagged
    assert math.isnan(float(b["scores"][0])) and float(b["scores"][1]) == 0.5


def test_multi_turn_rewards_sit_on_each_turns_last_token():
    t = Trajectory()
    t.append_context([1, 1])
    t.append_sampled([3, 4], [-1.0, -1.0], reward=0.25)
    t.append_context([8, 8, 8])  # an observation
    t.append_sampled([5, 2], [-1.0, -1.0], reward=1.0)
    assert t.token_rewards() == [0, 0, 0, 0.25, 0, 0, 0, 0, 1.0]
    assert t.loss_mask == [0, 0, 1, 1, 0, 0, 0, 1, 1]
    assert t.sampler_logprobs == [0, 0, -1, -1, 0, 0, 0, -1, -1]
    assert t.episode_return == 1.25


def test_validate_catches_turns_without_trained_tokens():
    t = traj([1, 2], [3], 1.0)
    t.loss_mask = [0, 0, 0]  # corrupted: an assistant turn that would never be trained (M3)
    with pytest.raises(ValueError, match="loss_mask sums to 0"):
        t.validate()
    with pytest.raises(ValueError, match="logprobs"):
        Trajectory().append_sampled([1, 2], [0.0])


def test_collate_shapes_and_roundtrip():
    a, b = traj([1], [2, 3], 1.0), traj([1, 1, 1], [2], 0.0)
    batch = collate([a, b], pad_id=0)
    assert batch["input_ids"].shape == (2, 4)
    assert batch["lengths"].tolist() == [3, 4]
    assert torch.equal(batch["sampler_logprobs"][0], torch.tensor([0.0, -0.5, -0.5, 0.0]))
    assert Trajectory.from_dict(a.to_dict()) == a
