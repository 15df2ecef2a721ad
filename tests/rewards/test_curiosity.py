"""Curiosity bonus: hashed n-gram counts (exact values), RND over a hashing embedding, the decay
schedule, and the wrapper's split of extrinsic and intrinsic reward."""

from __future__ import annotations

import hashlib
import math
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from _reward_fixtures import ECHO_ID, EchoEnv, build_tiny_classifier
from gymnasium.utils.env_checker import check_env

from agentrl.rewards import (
    CuriosityBonus,
    CuriosityMemory,
    RNDNovelty,
    hashing_embedding,
    ngram_buckets,
)

torch.set_num_threads(1)

BIG = 1 << 20  # table size without collisions for these few n-grams


def count_bonuses(responses, **memory_kwargs):
    """Count-based bonuses of episodes of responses run through one fresh `CuriosityMemory`."""
    mem = CuriosityMemory("count", **memory_kwargs)
    out = []
    for episode in responses:
        epi = mem.new_episode()
        out.append([mem.bonus(r, epi)[0] for r in episode])
    return out


def _checked(env):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_env(env)


def test_ngram_buckets():
    h = lambda s: int.from_bytes(hashlib.blake2b(s.encode(), digest_size=8).digest(), "little")  # noqa: E731
    assert ngram_buckets("The cat, the CAT!", 2, 1000).tolist() == sorted({h("the cat") % 1000, h("cat the") % 1000})
    assert ngram_buckets("hello", 2, 1000).tolist() == [h("hello") % 1000]  # shorter than n: one gram
    assert ngram_buckets("a b c", 3, 1000).tolist() == [h("a b c") % 1000]
    assert ngram_buckets(" ... ", 2, 1000).size == 0
    assert ngram_buckets("x y x y x y", 2, BIG).size == 2  # distinct buckets only
    with pytest.raises(ValueError):
        ngram_buckets("a", 0, 10)


def test_count_bonus_exact_values():
    b = count_bonuses([["the cat sat", "the cat sat", "a dog ran", ""],
                       ["the cat sat", "the cat ran"]], coef=1.0, decay=1.0, table_size=BIG)
    # episode 1: first sight of {the cat, cat sat}: 0.5 * 1 + 0.5 * 1 = 1
    # again in the same episode: counts 2 everywhere: 1/sqrt(2) = 0.707107
    # a novel response: 1; a response with no words: 0
    assert b[0] == pytest.approx([1.0, 1 / math.sqrt(2), 1.0, 0.0])
    # episode 2 (episodic table cleared): episodic 1, global 3 -> 0.5 + 0.5 / sqrt(3) = 0.788675
    # "the cat ran": the cat (episodic 2, global 4), cat ran (1, 1):
    #   0.5 * (1/sqrt(2) + 1) / 2 + 0.5 * (1/2 + 1) / 2 = 0.426777 + 0.375 = 0.801777
    assert b[1] == pytest.approx([0.5 + 0.5 / math.sqrt(3), 0.801777], abs=1e-6)
    # a repeated response's bonus keeps shrinking; a novel one stays larger
    reps = count_bonuses([["same words here"] * 5 + ["brand new text"]], coef=1.0, decay=1.0, table_size=BIG)[0]
    assert all(x > y for x, y in zip(reps[:4], reps[1:5], strict=True)) and reps[5] == 1.0 > reps[4]
    assert reps[4] == pytest.approx(1 / math.sqrt(5))


def test_episodic_weight_and_decay():
    # only global counts: the repeat in a new episode gets 1/sqrt(2)
    b = count_bonuses([["red fox"], ["red fox"]], coef=1.0, decay=1.0, episodic_weight=0.0, table_size=BIG)
    assert b == [[1.0], [pytest.approx(1 / math.sqrt(2))]]
    # only episodic counts: a new episode forgets
    b = count_bonuses([["red fox"], ["red fox"]], coef=1.0, decay=1.0, episodic_weight=1.0, table_size=BIG)
    assert b == [[1.0], [1.0]]
    # decay: coef * decay^t on novel responses: 0.5, 0.45, 0.405
    b = count_bonuses([["one two", "three four", "five six"]], coef=0.5, decay=0.9, table_size=BIG)
    assert b[0] == pytest.approx([0.5, 0.45, 0.405])
    with pytest.raises(ValueError):
        CuriosityMemory(decay=0.0)
    with pytest.raises(ValueError, match="curiosity.method"):
        CuriosityMemory("icm")


def test_wrapper_splits_extrinsic_and_intrinsic():
    env = CuriosityBonus(EchoEnv(turns=3), coef=1.0, decay=1.0, table_size=BIG)
    env.reset(seed=0)
    _, r, _, _, info = env.step("a cat here")
    assert info["reward_components"] == {"extrinsic": 1.0, "intrinsic": 1.0} and r == 2.0
    _, r, _, _, info = env.step("a cat here")
    assert info["reward_components"]["extrinsic"] == 1.0  # the bonus never leaks into extrinsic
    assert info["reward_components"]["intrinsic"] == pytest.approx(1 / math.sqrt(2))
    assert r == pytest.approx(1.0 + 1 / math.sqrt(2)) and info["curiosity"]["novelty_count"] == pytest.approx(0.707107)
    _, r, _, _, info = env.step("no")
    assert info["reward_components"] == {"extrinsic": 0.0, "intrinsic": 1.0}
    # unseeded reset keeps the global memory; a seeded one forgets the wrapper's own memory
    env.reset()
    assert env.step("a cat here")[4]["reward_components"]["intrinsic"] == pytest.approx(0.5 + 0.5 / math.sqrt(3))
    env.reset(seed=5)
    assert env.step("a cat here")[4]["reward_components"]["intrinsic"] == 1.0


def test_wrapper_keeps_nan_and_inner_components():
    class NanEnv(EchoEnv):
        def step(self, action):
            obs, _, term, trunc, info = super().step(action)
            return obs, math.nan, term, trunc, {**info, "reward_components": {"judge": math.nan}}

    env = CuriosityBonus(NanEnv(turns=1))
    env.reset(seed=0)
    _, r, _, _, info = env.step("hello there")
    assert math.isnan(r) and math.isnan(info["reward_components"]["extrinsic"]) and "judge" in info["reward_components"]


def test_shared_memory_is_not_reset_by_one_env():
    mem = CuriosityMemory(coef=1.0, decay=1.0, table_size=BIG)
    a, b = CuriosityBonus(EchoEnv(turns=1), mem), CuriosityBonus(EchoEnv(turns=1), mem)
    a.reset(seed=0)
    a.step("green tea")
    b.reset(seed=0)  # seeded, but the memory is shared
    assert b.step("green tea")[4]["reward_components"]["intrinsic"] == pytest.approx(0.5 + 0.5 / math.sqrt(2))
    with pytest.raises(ValueError, match="shared memory"):
        CuriosityBonus(EchoEnv(), mem, coef=2.0)


def test_wrappers_pass_check_env():
    _checked(CuriosityBonus(EchoEnv()))
    _checked(CuriosityBonus(gym.make(ECHO_ID), method="both", rnd_hidden=8, rnd_out=4, embed_dim=32))
    _checked(CuriosityBonus(EchoEnv(), method="rnd", embed_dim=32))


def test_hashing_embedding():
    v = hashing_embedding("the cat sat on the mat", 64)
    assert v.shape == (64,) and v.dtype == np.float32 and np.linalg.norm(v) == pytest.approx(1.0, abs=1e-6)
    assert np.array_equal(v, hashing_embedding("The cat sat on the mat!", 64))
    assert not hashing_embedding("", 64).any()
    assert float(v @ hashing_embedding("dogs bark loudly", 64)) < 0.9


def test_rnd_repeated_shrinks_novel_larger():
    rnd = RNDNovelty(embed_dim=64, hidden=32, out_dim=16, lr=1e-2, seed=0)
    first = rnd.novelty("the cat sat on the mat")
    assert first == pytest.approx(1.0)  # normalised by the error average, which is the first error itself
    errs = [rnd.error("the cat sat on the mat")]
    for _ in range(30):
        rnd.novelty("the cat sat on the mat")
        errs.append(rnd.error("the cat sat on the mat"))
    assert errs[-1] < 0.2 * errs[0]  # the predictor learns the repeated response
    repeated = rnd.novelty("the cat sat on the mat")
    novel = rnd.novelty("quantum chromodynamics of gluon fields")
    # the error average still remembers the early, large errors: the repeated response is far
    # below it, a never-seen one near it (the predictor generalises a little to new inputs)
    assert repeated < 0.1 and novel > 0.5 and novel > 10 * repeated
    # deterministic for a seed
    a, b = RNDNovelty(embed_dim=32, seed=3), RNDNovelty(embed_dim=32, seed=3)
    seq = ["x y", "x y", "z w"]
    assert [a.novelty(s) for s in seq] == [b.novelty(s) for s in seq]


def test_rnd_and_both_through_memory():
    mem = CuriosityMemory("both", coef=1.0, decay=1.0, table_size=BIG, embed_dim=32, rnd_lr=1e-2)
    epi = mem.new_episode()
    bonus, parts = mem.bonus("hello world", epi)
    assert parts["novelty_count"] == 1.0 and parts["novelty_rnd"] == pytest.approx(1.0) and bonus == pytest.approx(1.0)
    bonus, parts = mem.bonus("hello world", epi)
    assert bonus == pytest.approx((parts["novelty_count"] + parts["novelty_rnd"]) / 2)


def test_rnd_over_a_local_model_embedding(tmp_path):
    path = build_tiny_classifier(tmp_path / "enc")
    rnd = RNDNovelty(embed=path, hidden=8, out_dim=4)
    assert rnd.embed_dim == 16 and rnd.embed("cats are nice").shape == (16,)
    assert rnd.novelty("cats are nice") == pytest.approx(1.0)
    with pytest.raises(FileNotFoundError):
        RNDNovelty(embed=str(tmp_path / "missing"))
