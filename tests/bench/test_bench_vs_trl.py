"""Tests of the TRL side-by-side benchmark's pieces (benchmarks/vs_trl*.py): reward, env, model,
summary statistics, and that every proposed patch computes what the code it replaces computes."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import vs_trl  # noqa: E402
import vs_trl_patches as patches  # noqa: E402
from vs_trl_env import N_PROMPTS, FracAEnv, frac_a, prompt_text  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from vs_trl_model import build_tiny_qwen

    from agentrl.models.tiny import load_model

    d = tmp_path_factory.mktemp("tiny_qwen")
    info = build_tiny_qwen(d)
    model, tok = load_model(d)
    return info, model, tok


# -- reward and env ----------------------------------------------------------------------------
def test_frac_a_hand_values():
    assert frac_a("banana") == 0.5  # 3 of 6 characters
    assert frac_a("aaaa") == 1.0
    assert frac_a("xyz") == 0.0
    assert frac_a("") == 0.0  # empty answer: 0, not a division by zero
    assert frac_a("A a") == pytest.approx(1 / 3)  # only lower-case 'a' counts


def test_env_prompts_are_the_peer_set_and_seeded():
    env = FracAEnv()
    obs, info = env.reset(seed=123)
    assert len(obs) == 1 and obs[0]["role"] == "user"
    i = int(info["task_id"])
    assert 0 <= i < N_PROMPTS and obs[0]["content"] == prompt_text(i)
    assert env.reset(seed=123)[0] == obs  # same seed, same prompt
    assert prompt_text(13) == "Write about banana number 13."  # topics[13 % 12] = banana
    msgs, r, term, trunc, _ = env.step("banana")
    assert (msgs, r, term, trunc) == ([], 0.5, True, False)


def test_model_matches_the_peer_baseline(tiny):
    info, model, tok = tiny
    assert info == {"vocab": 943, "params": 416768, "eos": 2, "pad": 3}  # peer script's figures
    assert tok.eos_token == "<|im_end|>" and model.config.num_hidden_layers == 2


# -- summary statistics -------------------------------------------------------------------------
def _step(sec, tok=10, **kw):
    return {"sec": sec, "wall_s": sec, "cpu_s": sec / 2, "gen_tokens": tok, **kw}


def test_summarize_drops_warmup_and_takes_medians():
    runs = [{"steps": [_step(9.0), _step(1.0, gen_forward=0.5), _step(3.0, gen_forward=0.5)],
             "peak_rss_mb": 100.0, "process_s": 5.0},
            {"steps": [_step(9.0), _step(2.0, gen_forward=0.5)], "peak_rss_mb": 120.0, "process_s": 7.0}]
    s = vs_trl.summarize(runs, warmup=1)
    assert s["n_steps"] == 3  # the two 9.0 s warm-up steps are dropped
    assert s["median_step_s"] == 2.0  # median of 1, 3, 2
    assert s["median_cpu_s"] == 1.0
    assert s["tokens_per_s"] == pytest.approx(30 / 6.0)  # 30 tokens in 6 s
    assert s["peak_rss_mb"] == 120.0
    # overhead = (sec - compute) / sec: 0.5/1, 2.5/3, 1.5/2 -> median 0.75
    assert s["overhead_frac"] == pytest.approx(0.75)


# -- proposed patches compute the same thing ----------------------------------------------------
def test_shared_prefix_groups():
    from agentrl.learner.prefix_share import shared_prefix_groups

    ids = torch.tensor([[5, 6, 7, 1], [5, 6, 8, 2], [5, 9, 7, 1], [5, 9, 7, 3]])
    # rows 0-1 share [5, 6]; row 2 differs; row 3 shares [5, 9] with row 2
    assert shared_prefix_groups(ids, torch.tensor([2, 2, 2, 2])) == [0, 0, 1, 1]
    assert shared_prefix_groups(ids, torch.tensor([2, 3, 3, 3])) == [0, 1, 2, 2]


def _generate(engine, prompts, temperature):
    from agentrl.rollout.engines.base import SamplingParams

    # 60 stop ids (about 6% of the vocabulary): most sampled rows stop early, some run to the cap
    p = SamplingParams(temperature=temperature, max_tokens=24, stop_token_ids=list(range(100, 160)), seed=7)
    return engine.generate(prompts, p)


def test_static_decoder_matches_transformers_decode(tiny):
    """The library's static decode (formerly the fast_decode patch) on the benchmark's model."""
    from agentrl.rollout.engines.hf import HFEngine

    _, model, tok = tiny
    engine = HFEngine(model, tok, static_decode=False)
    prompts = [tok.encode(f"<|im_start|>user\nWrite about cat number {i}.{' More.' * i}<|im_end|>\n"
                          "<|im_start|>assistant\n") for i in range(3)]
    prompts = [p for p in prompts for _ in range(3)]  # groups, different prompt lengths (padding)
    ref = {t: _generate(engine, prompts, t) for t in (0.0, 1.0)}
    engine = HFEngine(model, tok)
    assert engine.static_decode_reason is None
    for t in (0.0, 1.0):
        new = _generate(engine, prompts, t)
        assert [c.token_ids for c in new] == [c.token_ids for c in ref[t]]
        assert [c.finish_reason for c in new] == [c.finish_reason for c in ref[t]]
        for a, b in zip(new, ref[t]):
            assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-5
    reasons = {c.finish_reason for c in new}
    assert reasons == {"stop", "length"}  # rows finished early (compaction ran) and at the cap


def test_static_decoder_refuses_unsupported_models(tiny):
    from agentrl.models.static_decode import static_decoder_supported

    _, model, _ = tiny
    assert static_decoder_supported(model)
    bf16 = type(model)(model.config).to(torch.bfloat16).eval()
    assert not static_decoder_supported(bf16)  # only float32 is supported


def _batch(tok_rows):
    T = max(len(r) for r, _ in tok_rows)
    B = len(tok_rows)
    ids = torch.full((B, T), 3)
    am = torch.zeros(B, T, dtype=torch.long)
    lm = torch.zeros(B, T)
    for b, (r, p) in enumerate(tok_rows):
        ids[b, : len(r)] = r
        am[b, : len(r)] = 1
        lm[b, p: len(r)] = 1
    return ids, am, lm


@pytest.mark.parametrize("which", ["prefix_share", "single_forward"])
def test_learner_prefix_share_matches_token_logprobs(tiny, which):
    """The library's `prefix_shared_logprobs` (formerly the prefix_share / logits_from_loss
    patches) on the benchmark's model (grouped-query attention): both of its paths."""
    from agentrl.learner.forward import token_logprobs
    from agentrl.learner.prefix_share import prefix_shared_logprobs

    _, model, _ = tiny
    model.train()
    g = torch.Generator().manual_seed(0)
    rows = []
    for plen in (9, 12):  # two groups of 3 with different prompt lengths and completion lengths
        prompt = torch.randint(4, 900, (plen,), generator=g)
        for c in (7, 11, 4):
            rows.append((torch.cat([prompt, torch.randint(4, 900, (c,), generator=g)]), plen))
    ids, am, lm = _batch(rows)
    out = {}
    for name in ("ref", which):
        model.zero_grad()
        if name == "ref":
            lp, ent = token_logprobs(model, ids, am, temperature=0.7, with_entropy=True)
        else:  # share=False: one plain forward, logits from the first loss column on
            lp, ent = prefix_shared_logprobs(model, ids, am, lm, temperature=0.7, with_entropy=True,
                                             share=which == "prefix_share")
        (lp * lm).sum().backward()
        out[name] = ((lp * lm).detach(), (ent * lm).detach(),
                     torch.cat([p.grad.flatten() for p in model.parameters()]))
    ref, new = out["ref"], out[which]
    assert torch.allclose(new[0], ref[0], atol=1e-5)
    assert torch.allclose(new[1], ref[1], atol=1e-5)
    assert torch.allclose(new[2], ref[2], atol=1e-6 * float(ref[2].abs().max()) * 10)
    model.zero_grad()
    model.eval()


def test_update_weights_copies_weights_and_still_validates(tiny):
    """The library's update_weights (formerly the fast_sync patch): direct copies, tied
    lm_head omitted, bad keys rejected without changing anything."""
    import copy

    from agentrl.rollout.engines.hf import HFEngine

    _, model, tok = tiny
    engine = HFEngine(copy.deepcopy(model), tok)
    sd = {k: v + 1.0 for k, v in model.state_dict().items() if k != "lm_head.weight"}  # tied: omitted
    engine.update_weights(sd, 1)
    engine.update_weights({k: v * 2 for k, v in sd.items()}, 2)
    own = engine.model.state_dict()
    assert all(torch.equal(own[k], v * 2) for k, v in sd.items()) and engine.policy_version == 2
    assert torch.equal(own["lm_head.weight"], own["model.embed_tokens.weight"])
    with pytest.raises(KeyError):
        engine.update_weights({"nope": torch.zeros(1)}, 3)
    assert engine.policy_version == 2


def test_apply_rejects_unknown_and_conflicting_patches():
    with pytest.raises(ValueError, match="unknown"):
        patches.apply(["warp_drive"])
    for name in ("prefix_share", "logits_from_loss", "fused_adamw", "fast_decode", "fast_sync"):
        with pytest.raises(ValueError, match="already applied in the library"):
            patches.apply([name])
    assert math.isnan(vs_trl._med([]))


def test_compile_variants_and_their_baselines():
    from types import SimpleNamespace

    import vs_trl_ours

    cmd = vs_trl.worker_cmd("ours-compile", "M", (2, 4, 32), 3, 1e-3, 0)
    assert cmd[1].endswith("vs_trl_ours.py") and "--compile" in cmd
    cmd = vs_trl.worker_cmd("trl-compile", "M", (2, 4, 32), 3, 1e-3, 0)
    assert cmd[1].endswith("vs_trl_trl.py") and "--compile" in cmd
    assert "--compile" not in vs_trl.worker_cmd("ours", "M", (2, 4, 32), 3, 1e-3, 0)
    both = {"trl": {}, "trl-compile": {}, "ours": {}, "ours-compile": {}}
    assert vs_trl.baseline_of("ours-compile", both) == "trl-compile"
    assert vs_trl.baseline_of("ours", both) == "trl"
    assert vs_trl.baseline_of("ours-compile", {"trl": {}, "ours-compile": {}}) == "trl"
    assert vs_trl.baseline_of("ours", {"ours": {}}) is None
    args = SimpleNamespace(model="M", prompts=2, gens=4, max_tokens=32, lr=1e-3, steps=3, seed=0,
                           compile=True)
    overrides = vs_trl_ours.ours_overrides(args, "/tmp/x")
    assert "train.compile=true" in overrides and "rollout.compile=true" in overrides
    from agentrl.config import load_config

    assert load_config(None, overrides).rollout.compile
