"""HFEngine: sampler logprobs vs teacher forcing (case L4), padding, stops (M1/M2), n, seeds,
per-row random streams independent of the batch, weight updates; `sample_next` on
hand-computed distributions; `row_uniforms` against a pure-Python SplitMix64."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.models.tiny import build_tiny_model, chat_stop_ids, render_ids
from agentrl.rollout.engines.base import Completion, SamplingParams, row_seeds
from agentrl.rollout.engines.hf import HFEngine, check_params, row_uniforms, sample_next

torch.set_num_threads(1)


def corpus() -> list[str]:
    """Three stdlib modules' sources: enough text for a 512-token BPE vocabulary."""
    import json.encoder
    import string
    import textwrap

    return [open(m.__file__, encoding="utf-8").read() for m in (textwrap, json.encoder, string)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", corpus(), vocab_size=512)


@pytest.fixture(scope="module")
def engine(model_dir):
    return HFEngine(model_dir, torch_threads=1)


@pytest.fixture(scope="module")
def prompts(engine):
    tok = engine.tokenizer
    return [
        render_ids(tok, [{"role": "user", "content": "Write a function that adds two numbers."}], add_generation_prompt=True),
        render_ids(tok, [{"role": "user", "content": "hi"}], add_generation_prompt=True),
        tok.encode("def wrap(text, width=70):\n    ", add_special_tokens=False),
    ]


def teacher_forced_logprobs(model, prompt: list[int], completion: list[int], temperature: float):
    """log_softmax(logits / T) of the full unpadded sequence at the completion's tokens, and
    the argmax at each completion position (what the learner recomputes)."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    logp = (logits / temperature).log_softmax(-1)
    target = torch.tensor(completion)
    return logp.gather(-1, target[:, None]).squeeze(-1), logits.argmax(-1)


# -- sample_next: hand-computed values ------------------------------------------------------
L4_LOGITS = torch.tensor([[2.0, 1.0, 0.0]])


def test_l4_logprob_uses_tempered_logits():
    # softmax([2,1,0] / 0.6) = [0.81663, 0.15424, 0.02913]; cumulative [0.81663, 0.97087, 1.0]
    tok, lp = sample_next(L4_LOGITS, 0.6, 1.0, torch.tensor([0.0]))
    assert tok.tolist() == [0]
    assert lp.item() == pytest.approx(-0.202573, abs=1e-5)  # log 0.81663; raw log_softmax: -0.407606
    # u = 0.9 falls in (0.81663, 0.97087] -> token 1, logprob log 0.15424 = -1.869240
    tok, lp = sample_next(L4_LOGITS, 0.6, 1.0, torch.tensor([0.9]))
    assert tok.tolist() == [1] and lp.item() == pytest.approx(-1.869240, abs=1e-5)
    # u = 0.99 > 0.97087 -> token 2, logprob -3.535906
    tok, lp = sample_next(L4_LOGITS, 0.6, 1.0, torch.tensor([0.99]))
    assert tok.tolist() == [2] and lp.item() == pytest.approx(-3.535906, abs=1e-5)
    # The ratio a learner with raw logits would see: exp(-0.202573 + 0.407606) = 1.2276 (case L4).
    assert math.exp(-0.202573 + 0.407606) == pytest.approx(1.2276, abs=1e-4)


def test_greedy_logprob_uses_temperature_one():
    tok, lp = sample_next(L4_LOGITS, 0.0, 1.0, None)
    assert tok.tolist() == [0] and lp.item() == pytest.approx(-0.407606, abs=1e-5)  # log_softmax([2,1,0])[0]


def test_top_p_keeps_the_crossing_token_and_reports_full_vocab_logprob():
    logits = torch.log(torch.tensor([[0.2, 0.5, 0.3]]))  # sorted: 0.5 (id 1), 0.3 (id 2), 0.2 (id 0)
    # top_p 0.6: mass before each sorted token [0, 0.5, 0.8] -> keep ids 1, 2 (0.5 < 0.6 crosses).
    # Kept mass 0.8; u = 0.7 -> 0.56 > 0.5 -> id 2; logprob over the full vocab: log 0.3.
    tok, lp = sample_next(logits, 1.0, 0.6, torch.tensor([0.7]))
    assert tok.tolist() == [2] and lp.item() == pytest.approx(math.log(0.3), abs=1e-6)
    # u close to 1 never reaches the filtered id 0.
    tok, _ = sample_next(logits, 1.0, 0.6, torch.tensor([0.9999999]))
    assert tok.tolist() == [2]
    # top_p 0.45: the first token alone (0.5) reaches it -> always id 1. (At exactly 0.5 the
    # float32 softmax gives 0.49999997 and the boundary would decide by rounding.)
    tok, lp = sample_next(logits.expand(3, 3), 1.0, 0.45, torch.tensor([0.0, 0.5, 0.9999999]))
    assert tok.tolist() == [1, 1, 1] and lp[0].item() == pytest.approx(math.log(0.5), abs=1e-6)


def test_zero_probability_tokens_are_never_sampled():
    logits = torch.tensor([[0.0, -math.inf, 0.0, -math.inf]]).expand(6, 4)
    # The last draw is the largest `row_uniforms` gives (float64); in float32 it rounds to 1, so
    # u * total == total, past every cdf entry: the cap below the total still picks id 2.
    u = torch.tensor([0.0, 0.49999, 0.5, 0.9999999, 1.0 - 2**-24, 1.0 - 2**-53], dtype=torch.float64)
    tok, lp = sample_next(logits, 1.0, 1.0, u)
    assert tok.tolist() == [0, 0, 2, 2, 2, 2]
    assert torch.allclose(lp, torch.full((6,), math.log(0.5)))


def test_non_finite_logits_give_an_in_range_token_with_a_nan_logprob():
    # NaN compares false, so the search runs off the end; the pick is clamped to the vocabulary
    # and the NaN logprob tells the caller (HFEngine.generate raises on it).
    logits = torch.tensor([[0.0, float("nan"), 1.0], [float("nan")] * 3, [-math.inf] * 3])
    tok, lp = sample_next(logits, 1.0, 1.0, torch.tensor([0.3, 0.5, 0.9], dtype=torch.float64))
    assert all(0 <= t < 3 for t in tok.tolist()) and torch.isnan(lp).all()


def test_sample_frequencies_follow_tempered_softmax():
    gen = torch.Generator().manual_seed(0)
    logits = L4_LOGITS.expand(20000, 3)
    tok, _ = sample_next(logits, 0.6, 1.0, torch.rand(20000, generator=gen))
    freq = torch.bincount(tok, minlength=3).float() / 20000
    # expected [0.81663, 0.15424, 0.02913]; 4 standard errors of 20000 draws is < 0.011
    assert torch.allclose(freq, torch.tensor([0.81663, 0.15424, 0.02913]), atol=0.011)


def test_sampling_needs_uniform_draws():
    with pytest.raises(ValueError, match="uniform"):
        sample_next(L4_LOGITS, 1.0, 1.0, None)


@pytest.mark.parametrize(
    "kw, field",
    [({"temperature": -0.1}, "temperature"), ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"),
     ({"max_tokens": 0}, "max_tokens"), ({"n": 0}, "n")],
)
def test_bad_params_raise(kw, field):
    with pytest.raises(ValueError, match=field):
        check_params(SamplingParams(**kw))


# -- row_uniforms: the per-row counter-based stream -------------------------------------------
M64 = (1 << 64) - 1


def splitmix64_uniform(seed: int, step: int) -> float:
    """Reference: SplitMix64's output number `step` (0-based) from state `seed`, on Python ints
    mod 2**64, top 53 bits / 2**53."""
    z = (seed + (step + 1) * 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    z ^= z >> 31
    return (z >> 11) / 2**53


def test_row_uniforms_equal_the_reference_hash():
    # SplitMix64 from state 0 starts 0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4 (Vigna's splitmix64.c)
    assert splitmix64_uniform(0, 0) == (0xE220A8397B1DCDAF >> 11) / 2**53
    assert splitmix64_uniform(0, 1) == (0x6E789E6AA1B965F4 >> 11) / 2**53
    seeds = [0, 1, 42, 2**62 + 12345, 2**63 - 1, -1, -(2**63), -987654321987654321]
    t = torch.tensor(seeds, dtype=torch.int64)
    for step in (0, 1, 2, 17, 1000, 2**31 + 5):
        got = row_uniforms(t, step)
        assert got.dtype == torch.float64 and got.shape == (len(seeds),)
        assert got.tolist() == [splitmix64_uniform(s & M64, step) for s in seeds], step
    # a tensor of steps gives a (rows, steps) block of the same values
    steps = torch.tensor([0, 1, 2, 17, 1000, 2**31 + 5])
    block = row_uniforms(t[:, None], steps[None])
    assert torch.equal(block, torch.stack([row_uniforms(t, int(s)) for s in steps], dim=1))


def test_row_uniforms_statistics():
    """10^5 draws (1000 row seeds x 100 steps): in [0, 1), mean 1/2, uniform by a
    Kolmogorov-Smirnov bound, no correlation between steps of a row or neighbouring seeds."""
    seeds = torch.arange(1000, dtype=torch.int64) * 7 + 3  # close seeds: the worst case for a hash
    u = torch.stack([row_uniforms(seeds, t) for t in range(100)], dim=1)  # (row, step)
    x = u.flatten()
    n = x.numel()
    assert bool((x >= 0).all()) and bool((x < 1).all())
    assert abs(float(x.mean()) - 0.5) < 5 * (1 / 12 / n) ** 0.5  # 5 standard errors
    xs = x.sort().values
    i = torch.arange(1, n + 1, dtype=torch.float64)
    ks = float(torch.maximum(i / n - xs, xs - (i - 1) / n).max())
    assert ks < 1.95 / n**0.5  # KS critical value at alpha = 0.001
    c = u - 0.5
    lag_step = float((c[:, 1:] * c[:, :-1]).mean() * 12)
    lag_seed = float((c[1:] * c[:-1]).mean() * 12)
    assert abs(lag_step) < 0.02 and abs(lag_seed) < 0.02  # correlation; 1 s.e. ~ 0.003


# -- engine against teacher forcing ---------------------------------------------------------
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_sampler_logprobs_equal_teacher_forced(engine, prompts, temperature):
    outs = engine.generate(prompts, SamplingParams(temperature=temperature, max_tokens=24, n=2, seed=1))
    assert len(outs) == 6
    for k, out in enumerate(outs):
        assert len(out.token_ids) == len(out.logprobs) == 24 and out.finish_reason == "length"
        ref, _ = teacher_forced_logprobs(engine.model, prompts[k // 2], out.token_ids, temperature)
        assert torch.allclose(torch.tensor(out.logprobs), ref, atol=1e-4), (k, (torch.tensor(out.logprobs) - ref).abs().max())


def test_greedy_equals_teacher_forced_argmax(engine, prompts):
    outs = engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=24))
    for prompt, out in zip(prompts, outs, strict=True):
        ref_lp, argmax = teacher_forced_logprobs(engine.model, prompt, out.token_ids, 1.0)
        assert out.token_ids == argmax.tolist()
        assert torch.allclose(torch.tensor(out.logprobs), ref_lp, atol=1e-4)


def test_left_padding_invariance(engine, prompts):
    short, long_ = prompts[1], prompts[0]
    assert len(short) < len(long_)
    greedy = SamplingParams(temperature=0.0, max_tokens=16)
    alone = engine.generate([short], greedy)[0]
    padded = engine.generate([long_, short], greedy)[1]  # short is left-padded in this batch
    assert padded.token_ids == alone.token_ids
    assert torch.allclose(torch.tensor(padded.logprobs), torch.tensor(alone.logprobs), atol=1e-5)
    # And the padded prefill's last logits equal the unpadded ones.
    w = len(long_)
    ids = torch.tensor([long_, [0] * (w - len(short)) + short])
    mask = torch.tensor([[1] * w, [0] * (w - len(short)) + [1] * len(short)])
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        batched = engine._forward(ids, mask, pos, engine._new_cache())
        single = engine.model(torch.tensor([short])).logits[0, -1]
    assert torch.allclose(batched[1], single, atol=1e-5)


# -- stops and lengths (cases M1, M2) -------------------------------------------------------
def test_stop_token_is_kept_and_ends_the_row(engine, prompts):
    greedy = SamplingParams(temperature=0.0, max_tokens=20)
    free = engine.generate(prompts, greedy)
    # Stop on the token each row produces at step 3 (first occurrence may be earlier).
    stops = sorted({free[k].token_ids[3] for k in range(len(prompts))})
    outs = engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=20, stop_token_ids=stops))
    for f, o in zip(free, outs, strict=True):
        first = min(i for i, t in enumerate(f.token_ids) if t in stops)
        assert o.token_ids == f.token_ids[: first + 1]  # stop token included, nothing after it
        assert o.token_ids[-1] in stops and o.finish_reason == "stop"
        assert len(o.logprobs) == len(o.token_ids)
        assert torch.allclose(torch.tensor(o.logprobs), torch.tensor(f.logprobs[: first + 1]), atol=1e-5)


def test_rows_ending_at_different_steps_in_one_batch(engine):
    # 8 rows: rows whose first greedy token is a stop end at step 1 (the batch drops them and
    # keeps going); the others run to max_tokens -> 'length' unless they meet a stop later.
    tok = engine.tokenizer
    texts = ["a", "b = 1", "def f", "import os", "x", "return", "class A:", "print("]
    batch = [tok.encode(t, add_special_tokens=False) for t in texts]
    greedy = SamplingParams(temperature=0.0, max_tokens=12)
    free = engine.generate(batch, greedy)
    stops = [free[0].token_ids[0], free[1].token_ids[0]]
    outs = engine.generate(batch, SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=stops))
    n_stop = 0
    for f, o in zip(free, outs, strict=True):
        hits = [i for i, t in enumerate(f.token_ids) if t in stops]
        if hits:
            n_stop += 1
            assert o.token_ids == f.token_ids[: hits[0] + 1] and o.finish_reason == "stop"
        else:
            assert o.token_ids == f.token_ids and o.finish_reason == "length"
    assert n_stop >= 2


def test_max_tokens_gives_length(engine, prompts):
    for m in (1, 5):
        outs = engine.generate(prompts, SamplingParams(max_tokens=m, seed=0))
        assert all(len(o.token_ids) == m and o.finish_reason == "length" for o in outs)


def test_stop_at_the_last_allowed_token_is_stop(engine, prompts):
    first = engine.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=1))[0].token_ids[0]
    out = engine.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=1, stop_token_ids=[first]))[0]
    assert out.token_ids == [first] and out.finish_reason == "stop"


def test_chat_stop_ids_end_a_turn(engine, prompts):
    stops = chat_stop_ids(engine.tokenizer)
    outs = engine.generate(prompts, SamplingParams(max_tokens=64, n=4, seed=3, stop_token_ids=stops))
    for o in outs:
        assert all(t not in stops for t in o.token_ids[:-1])
        assert (o.finish_reason == "stop") == (o.token_ids[-1] in stops)


# -- n, seeds, duplicates -------------------------------------------------------------------
def test_n_samples_are_prompt_major(engine, prompts):
    greedy = SamplingParams(temperature=0.0, max_tokens=8, n=3)
    outs = engine.generate(prompts[:2], greedy)
    a = engine.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=8))[0]
    b = engine.generate(prompts[1:2], SamplingParams(temperature=0.0, max_tokens=8))[0]
    assert a.token_ids != b.token_ids
    assert [o.token_ids for o in outs] == [a.token_ids] * 3 + [b.token_ids] * 3
    # Sampled: each of the n completions is scored under its own prompt.
    outs = engine.generate(prompts[:2], SamplingParams(max_tokens=8, n=3, seed=5))
    for k, o in enumerate(outs):
        ref, _ = teacher_forced_logprobs(engine.model, prompts[k // 3], o.token_ids, 1.0)
        assert torch.allclose(torch.tensor(o.logprobs), ref, atol=1e-4)
    assert len({tuple(o.token_ids) for o in outs[:3]}) > 1  # the copies are sampled independently


def test_seed_reproducibility(engine, prompts):
    sp = SamplingParams(max_tokens=16, n=2, seed=42)
    first = engine.generate(prompts, sp)
    assert engine.generate(prompts, sp) == first
    other = engine.generate(prompts, SamplingParams(max_tokens=16, n=2, seed=43))
    assert [o.token_ids for o in other] != [o.token_ids for o in first]
    unseeded = engine.generate(prompts, SamplingParams(max_tokens=16))
    assert all(isinstance(o, Completion) and len(o.token_ids) == 16 for o in unseeded)


@pytest.mark.parametrize("static_decode", [True, False])
def test_a_row_does_not_depend_on_the_other_rows(model_dir, prompts, static_decode):
    """Seeded sampling: the same prompt gives the same completion alone, in a bigger batch with
    other prompts (another batch size, other padding), after other prompts, and in chunks of
    max_batch rows; its k-th occurrence in a call samples like the k-th of n samples."""
    eng = HFEngine(model_dir, static_decode=static_decode)
    small = HFEngine(model_dir, max_batch=2, static_decode=static_decode)
    target = prompts[2]
    p = SamplingParams(temperature=1.0, max_tokens=40, seed=9)  # > UNIFORM_BLOCK steps
    alone = eng.generate([target], p)[0]
    extra = [[7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22]] * 3
    calls = {
        "batch": eng.generate([prompts[0], target, prompts[1]], p)[1],
        "last": eng.generate([prompts[0], prompts[1], *extra, target], p)[-1],
        "chunked": small.generate([prompts[1], prompts[0], target, *extra], p)[2],
    }
    for name, out in calls.items():
        assert out.token_ids == alone.token_ids, name
        assert out.logprobs == pytest.approx(alone.logprobs, abs=1e-5), name
    n3 = eng.generate([target], SamplingParams(temperature=1.0, max_tokens=40, seed=9, n=3))
    assert n3[0].token_ids == alone.token_ids
    repeated = small.generate([target, prompts[0], target, target], p)
    assert [o.token_ids for o in repeated[::2] + repeated[3:]] == [o.token_ids for o in n3]
    assert len({tuple(o.token_ids) for o in n3}) == 3
    # with stops: rows leave the batch at different steps, the others keep their streams
    stops = sorted({t for o in n3 for t in o.token_ids[2:5]})
    ps = SamplingParams(temperature=1.0, max_tokens=40, seed=9, stop_token_ids=stops)
    alone_s = eng.generate([target], ps)[0]
    mixed = eng.generate([prompts[0], prompts[1], target, *extra], ps)
    assert mixed[2].token_ids == alone_s.token_ids
    assert {o.finish_reason for o in mixed} == {"stop", "length"}


def test_row_seeds_are_pinned():
    """The per-row seeds are the sampling streams of every seeded run (the README's figures
    too): these values were computed before `offsets` existed and must never change."""
    assert row_seeds([[5, 6, 7], [5, 6, 7], [9], [5, 6, 7]], 2, 123) == [
        3668488521384233798, 2720786097151273331, 2345416275365171719, 8284067296692576853,
        3270702148656965864, 7425079888793867167, 1005500221761028966, 2965656215608167837]
    assert row_seeds([[5, 6, 7], [9]], 1, -4) == [8852023014053074334, 5888904672102419008]
    assert row_seeds([[5, 6, 7], [9]], 1, None) == [None, None]


def test_row_seed_offsets_continue_the_count_of_an_earlier_call():
    """A call split in two gives the rows of the second part the seeds of the whole call when
    its `offsets` count each prompt's rows (n per prompt) in the first part."""
    batch = [[5, 6, 7], [9], [5, 6, 7], [5, 6, 7], [9], [4]]
    whole = row_seeds(batch, 2, 11)
    head, tail = batch[:3], batch[3:]
    before = {tuple(p): 2 * sum(tuple(q) == tuple(p) for q in head) for p in tail}  # rows, n=2
    assert row_seeds(tail, 2, 11, [before[tuple(p)] for p in tail]) == whole[6:]
    assert row_seeds(tail, 2, 11) != whole[6:]  # counted alone, the repeats restart at 0
    with pytest.raises(ValueError, match="offsets"):
        row_seeds(tail, 1, 11, [0])
    with pytest.raises(ValueError, match="offsets"):
        row_seeds(tail, 1, 11, [0, -1, 0])


def test_seed_offsets_reach_the_sampler(engine, prompts):
    """`SamplingParams.seed_offsets`: the second occurrence of a prompt, given offset 1 alone,
    samples what it samples after the first in one call."""
    p = SamplingParams(temperature=1.0, max_tokens=12, seed=3)
    pair = engine.generate([prompts[0], prompts[0]], p)
    second = engine.generate([prompts[0]], SamplingParams(temperature=1.0, max_tokens=12, seed=3,
                                                          seed_offsets=[1]))
    assert second[0].token_ids == pair[1].token_ids != pair[0].token_ids


def test_duplicate_prompts_and_chunking(model_dir, prompts):
    # max_batch=4 splits 3 prompts x n=2 plus duplicates into chunks; every row stays correct.
    small = HFEngine(model_dir, max_batch=4)
    batch = [prompts[0], prompts[1], prompts[0], prompts[2]]
    outs = small.generate(batch, SamplingParams(max_tokens=10, n=2, seed=7, temperature=0.8))
    assert len(outs) == 8
    for k, o in enumerate(outs):
        ref, _ = teacher_forced_logprobs(small.model, batch[k // 2], o.token_ids, 0.8)
        assert torch.allclose(torch.tensor(o.logprobs), ref, atol=1e-4)
    greedy = small.generate(batch, SamplingParams(temperature=0.0, max_tokens=10))
    assert greedy[0] == greedy[2]


def test_empty_and_invalid_prompts(engine):
    assert engine.generate([], SamplingParams()) == []
    with pytest.raises(ValueError, match="empty"):
        engine.generate([[5], []], SamplingParams())
    with pytest.raises(ValueError, match="outside"):
        engine.generate([[5, 512]], SamplingParams())
    with pytest.raises(ValueError, match="top_p"):
        engine.generate([[5]], SamplingParams(top_p=0))


# -- weights --------------------------------------------------------------------------------
def test_update_weights_changes_outputs_and_version(model_dir, tmp_path, prompts):
    from agentrl.models.tiny import load_model

    eng = HFEngine(model_dir)
    greedy = SamplingParams(temperature=0.0, max_tokens=12)
    before = eng.generate(prompts, greedy)
    other_dir = build_tiny_model(tmp_path / "other", corpus(), vocab_size=512, seed=1)
    other, _ = load_model(other_dir)
    eng.update_weights(other.state_dict(), version=3)
    assert eng.policy_version == 3
    after = eng.generate(prompts, greedy)
    assert [o.token_ids for o in after] != [o.token_ids for o in before]
    assert after == HFEngine(other_dir).generate(prompts, greedy)
    # Tied lm_head may be left out of the state dict.
    sd = {k: v for k, v in other.state_dict().items() if k != "lm_head.weight"}
    eng.update_weights(sd, version=4)
    assert eng.policy_version == 4 and eng.generate(prompts, greedy) == after


def test_bad_state_dict_changes_nothing(model_dir, prompts):
    eng = HFEngine(model_dir)
    greedy = SamplingParams(temperature=0.0, max_tokens=6)
    before = eng.generate(prompts, greedy)
    sd = {k: torch.zeros_like(v) for k, v in eng.model.state_dict().items()}
    with pytest.raises(KeyError, match="unexpected"):
        eng.update_weights({**sd, "extra.weight": torch.zeros(1)}, version=1)
    with pytest.raises(KeyError, match="missing"):
        eng.update_weights({k: v for k, v in sd.items() if "layers.0.mlp" not in k}, version=1)
    with pytest.raises(ValueError, match="shape"):
        eng.update_weights({**sd, "model.norm.weight": torch.zeros(3)}, version=1)
    assert eng.policy_version == 0 and eng.generate(prompts, greedy) == before


def test_engine_accepts_a_model_object(model_dir, prompts):
    from agentrl.models.tiny import load_model

    model, tok = load_model(model_dir)
    eng = HFEngine(model, tok)
    assert eng.model is model and eng.tokenizer is tok and not model.training
    by_path = HFEngine(model_dir)
    greedy = SamplingParams(temperature=0.0, max_tokens=8)
    assert eng.generate(prompts, greedy) == by_path.generate(prompts, greedy)


def test_record_stops_marks_stopped_rows_in_place():
    """Slots 0 and 2 of 3 (output rows 4 and 1) sample a stop token at t=2: their rows get
    length 3 and `stopped`, slot 1 stays alive; no stop ids or no hit: None, nothing changed."""
    from agentrl.rollout.engines.hf import record_stops

    alive = torch.tensor([True, True, True])
    rows = torch.tensor([4, 0, 1])
    out_len = torch.full((5,), 9)
    stopped = torch.zeros(5, dtype=torch.bool)
    assert record_stops(torch.tensor([7, 6, 7]), torch.tensor([], dtype=torch.long), alive, rows,
                        out_len, stopped, 2) is None
    assert record_stops(torch.tensor([5, 6, 5]), torch.tensor([7]), alive, rows, out_len, stopped, 2) is None
    assert alive.all() and not stopped.any() and (out_len == 9).all()
    assert record_stops(torch.tensor([7, 6, 7]), torch.tensor([7, 8]), alive, rows, out_len, stopped, 2) == 1
    assert alive.tolist() == [False, True, False]
    assert out_len.tolist() == [9, 3, 9, 9, 3] and stopped.tolist() == [False, True, False, False, True]
    # a finished slot that samples a stop token again is not counted twice
    assert record_stops(torch.tensor([7, 6, 7]), torch.tensor([7]), alive, rows, out_len, stopped, 3) is None
    assert out_len.tolist() == [9, 3, 9, 9, 3]


def test_check_finite_logprobs_counts_only_returned_tokens():
    """A NaN past a row's length is ignored; a NaN or -inf at a returned token raises, naming
    the engine and how many rows."""
    import pytest

    from agentrl.rollout.engines.hf import check_finite_logprobs

    lp = torch.tensor([[-0.1, float("nan")], [-0.2, -0.3], [float("-inf"), -0.1]])
    check_finite_logprobs(lp[:2], torch.tensor([1, 2]), "X")  # row 0's NaN is past its 1 token
    with pytest.raises(FloatingPointError, match=r"^X.generate: .* in 2 of 3 rows"):
        check_finite_logprobs(lp, torch.tensor([2, 2, 1]), "X")
