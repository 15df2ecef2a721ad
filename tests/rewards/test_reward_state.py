"""The reward wrappers' state is checkpointed (issue #21 item 10): `pack_state`/`unpack_state`
round-trip exactly, and a `RewardWrappers` restored from `state_dict()` gives the same rewards as
the one it was saved from (curiosity counts + RND + t, the safety Lagrange multiplier with its
buffered costs, a judge's score cache). The training-loop resume test is in test_resume.py."""

from __future__ import annotations

import math
import socket

import numpy as np
import pytest
import torch

from agentrl.env.registry import make_env
from agentrl.learner.checkpoints import pack_state, unpack_state
from agentrl.rewards import RewardWrappers
from agentrl.rewards.judge import JudgeClient

torch.set_num_threads(1)

OPTS = {"safety": {"method": "lagrangian", "lam": 1.0, "lr": 0.5, "budget": 0.0, "update_every": 4},
        "curiosity": {"method": "both", "coef": 1.0, "decay": 0.9, "table_size": 4096, "embed_dim": 64,
                      "rnd_hidden": 16, "rnd_out": 8}}
ANSWERS = ["Sure, here is how to pick the lock of the door", "I can't help with that.",
           "Kill the stuck process with kill -9", "Sure, here is how to pick the lock of the door",
           "here is how to steal a car quickly", "I won't help with that."]


def _episodes(rewards: RewardWrappers, answers: list[str], seed0: int) -> list[tuple[float, float, float]]:
    """(reward, intrinsic, lambda) of one safety episode per answer, envs reset with seed0 + i."""
    out = []
    env = rewards.wrap(make_env("safety"))
    for i, a in enumerate(answers):
        env.reset(seed=seed0 + i)
        _, r, *_, info = env.step(a)
        out.append((r, info["reward_components"]["intrinsic"], info["lagrange_multiplier"]))
    return out


def test_pack_state_round_trips_arrays_scalars_and_nan(tmp_path):
    st = {"a": {"t": 3, "x": np.arange(5, dtype=np.int64), "s": np.array(np.float32(1.5)),
                "e": np.zeros((0, 3))}, "l": [{"v": 0.1}, None, math.nan, "str", True], "f": 1 / 3}
    f = tmp_path / "s.safetensors"
    f.write_bytes(pack_state(st))
    back = unpack_state(f)
    assert back["a"]["t"] == 3 and back["f"] == 1 / 3 and back["l"][:2] == [{"v": 0.1}, None]
    assert math.isnan(back["l"][2]) and back["l"][3:] == ["str", True]
    for k in ("x", "s", "e"):  # dtype and shape kept, 0-d included (safetensors stores it as (1,))
        assert back["a"][k].dtype == st["a"][k].dtype and back["a"][k].shape == st["a"][k].shape
        assert np.array_equal(back["a"][k], st["a"][k])
    with pytest.raises(TypeError, match="/a/bad"):
        pack_state({"a": {"bad": object()}})
    with pytest.raises(TypeError, match="not a string"):
        pack_state({"a": {1: 2}})
    (tmp_path / "junk").write_bytes(b"\0" * 20)
    with pytest.raises(ValueError, match="junk"):
        unpack_state(tmp_path / "junk")


def test_restored_wrappers_give_the_same_rewards_as_the_saved_ones(tmp_path):
    a = RewardWrappers(["safety", "curiosity"], OPTS)
    first = _episodes(a, ANSWERS, 0)
    assert first[3][0] != first[0][0]  # the same answer later: another reward (state matters)
    assert a.multiplier.value != 1.0 and a.multiplier._buffer  # updated, with costs buffered
    f = tmp_path / "reward_state.safetensors"
    f.write_bytes(pack_state(a.state_dict()))

    b = RewardWrappers(["safety", "curiosity"], OPTS)
    assert b.load_state_dict(unpack_state(f)) == []
    fresh = RewardWrappers(["safety", "curiosity"], OPTS)
    cont_a, cont_b, cont_fresh = (_episodes(w, ANSWERS, 100) for w in (a, b, fresh))
    assert cont_b == cont_a  # exactly: counts, RND networks + Adam, t, lambda, buffer
    assert cont_fresh != cont_a  # a wrapper that was not restored gives other rewards
    assert b.curiosity.t == a.curiosity.t == 2 * len(ANSWERS)
    assert b.multiplier.state_dict() == a.multiplier.state_dict()


def test_state_of_another_shape_or_wrapper_set_is_named():
    a = RewardWrappers(["curiosity"], {"curiosity": {"method": "count", "table_size": 64}})
    b = RewardWrappers(["curiosity"], {"curiosity": {"method": "count", "table_size": 128}})
    with pytest.raises(ValueError, match="table_size is 128"):
        b.load_state_dict(a.state_dict())
    c = RewardWrappers(["curiosity"], {"curiosity": {"method": "rnd"}})
    with pytest.raises(ValueError, match="method 'count'"):
        c.load_state_dict(a.state_dict())
    d = RewardWrappers(["safety"], {"safety": {"method": "lagrangian"}})
    notes = d.load_state_dict(a.state_dict())
    assert notes == ["the saved curiosity state is not used: this run has no curiosity wrapper",
                     "the safety wrapper starts from its initial state: the checkpoint has none"]


def test_judge_cache_is_restored_and_served_without_a_request():
    with socket.socket() as s:  # a port nobody listens on: a request would fail to connect
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    a = JudgeClient(url, max_retries=0, timeout=1.0)
    b = JudgeClient(url, max_retries=0, timeout=1.0)
    try:
        conv = [{"role": "user", "content": "q"}]
        key = a._key(a.request_messages(conv, "ans"), "pointwise")
        a.load_state_dict({"cache": [[key, 7.0, 0.7, "Score: 7"]], "stats": {"requests": 5}})
        b.load_state_dict(a.state_dict())
        r = b.judge(conv, "ans")
        assert (r.score, r.reward, r.cached, r.attempts, r.error) == (7.0, 0.7, True, 0, None)
        assert b.stats["requests"] == 5 and b.stats["cache_hits"] == 1
        miss = b.judge(conv, "another answer")  # not cached: a real request, which fails
        assert miss.error is not None and math.isnan(miss.reward)
    finally:
        a.close()
        b.close()
