"""`StaticDecoder` (agentrl/models/static_decode.py) against the transformers decode
path of `HFEngine`: same tokens and logprobs (greedy and seeded sampling, padding, n > 1 with a
shared prefill, rows stopping at different steps, chunking), for the tiny default model
(Qwen2, GQA, tied embeddings) and for models with the other variants (no GQA, untied output
layer, q/k/v and MLP biases, linearly scaled RoPE); the fallback for unsupported models; and
that weight changes reach the decoder."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from agentrl.models.static_decode import (
    DecoderWeights,
    StaticDecoder,
    static_decoder_supported,
    unsupported_reason,
)
from agentrl.rollout.engines.base import SamplingParams
from agentrl.rollout.engines.hf import HFEngine

torch.set_num_threads(1)

VOCAB = 300


def qwen2_untied_mha():
    """Qwen2 (q/k/v biases), as many KV heads as query heads, untied lm_head."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(1)
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=False)
    return random_biases(Qwen2ForCausalLM(cfg).eval())


def random_biases(model):
    """Biases drawn from N(0, 0.5^2) (they are initialised to zero)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.normal_(0, 0.5)
    return model


def llama_biased_gqa():
    """Llama with attention and MLP biases, 4 query heads on 2 KV heads, untied, RoPE scaled
    linearly (factor 2), head_dim 8 != hidden / heads."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(2)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=48, intermediate_size=80, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, attention_bias=True,
                      mlp_bias=True, tie_word_embeddings=False,
                      rope_scaling={"rope_type": "linear", "factor": 2.0})
    return random_biases(LlamaForCausalLM(cfg).eval())


@pytest.fixture(scope="module")
def tiny_model(tiny_model_dir):
    from agentrl.models.tiny import load_model

    return load_model(tiny_model_dir)[0]


@pytest.fixture(scope="module", params=["tiny_qwen2_gqa_tied", "qwen2_untied_mha", "llama_biased_gqa"])
def model(request, tiny_model):
    if request.param == "tiny_qwen2_gqa_tied":
        return tiny_model
    return {"qwen2_untied_mha": qwen2_untied_mha, "llama_biased_gqa": llama_biased_gqa}[request.param]()


def prompts_for(vocab: int) -> list[list[int]]:
    """Prompts of lengths 3..11 (left padding), one repeated (shared prefill)."""
    g = torch.Generator().manual_seed(0)
    ps = [torch.randint(5, vocab, (n,), generator=g).tolist() for n in (3, 7, 11, 5)]
    return ps + [ps[1]]


def compare(model, params: SamplingParams, prompts, **engine_kw):
    on = HFEngine(model, static_decode=True, **engine_kw)
    off = HFEngine(model, static_decode=False, **engine_kw)
    assert on.static_decode_reason is None and off.static_decode_reason == "static_decode=False"
    a, b = on.generate(prompts, params), off.generate(prompts, params)
    assert [c.token_ids for c in a] == [c.token_ids for c in b]
    assert [c.finish_reason for c in a] == [c.finish_reason for c in b]
    for x, y in zip(a, b):
        assert max(abs(u - v) for u, v in zip(x.logprobs, y.logprobs)) < 1e-5
    return a


def test_supported_models(model):
    assert unsupported_reason(model) is None and static_decoder_supported(model)


@pytest.mark.parametrize("temperature, top_p", [(0.0, 1.0), (1.0, 1.0), (0.7, 0.9)])
def test_same_tokens_as_transformers_decode(model, temperature, top_p):
    vocab = model.config.vocab_size
    prompts = prompts_for(vocab)
    p = SamplingParams(temperature=temperature, top_p=top_p, max_tokens=20, n=3, seed=11)
    outs = compare(model, p, prompts)
    assert len(outs) == 15 and all(len(o.token_ids) == 20 for o in outs)
    if temperature > 0:
        assert len({tuple(o.token_ids) for o in outs[:3]}) > 1  # the n copies differ


def test_rows_stopping_at_different_steps_and_chunking(model):
    """Stops on ~8% of the vocabulary: rows end at different steps (the decoder's rows are
    compacted), some run to the cap; max_batch=4 splits the 15 rows into 4 chunks."""
    vocab = model.config.vocab_size
    stops = list(range(5, 5 + vocab // 12))
    p = SamplingParams(temperature=1.0, max_tokens=24, n=3, seed=4, stop_token_ids=stops)
    outs = compare(model, p, prompts_for(vocab), max_batch=4)
    lengths = {len(o.token_ids) for o in outs}
    assert {o.finish_reason for o in outs} == {"stop", "length"} and len(lengths) > 3
    greedy = SamplingParams(temperature=0.0, max_tokens=24, stop_token_ids=stops)
    compare(model, greedy, prompts_for(vocab), max_batch=2)


def test_step_logits_equal_the_model_forward(tiny_model):
    """Decoder logits after a prefill equal the full (unpadded, uncached) forward's logits at
    every new position, with left padding and two rows continuing one prefill row."""
    from transformers import DynamicCache

    model = tiny_model
    prompts = [[5, 6, 7, 8, 9], [10, 11]]
    width, new = 5, 6
    ids = torch.tensor([prompts[0], [0, 0, 0] + prompts[1]])
    mask = torch.tensor([[1] * 5, [0, 0, 0, 1, 1]])
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    expand = torch.tensor([0, 1, 1])
    conts = torch.tensor([[20, 21, 22, 23, 24, 25], [30, 31, 32, 33, 34, 35], [40, 41, 42, 43, 44, 45]])
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        model(input_ids=ids, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True)
        dec = StaticDecoder(DecoderWeights(model), cache, mask, expand, width + new)
        for t in range(new):
            logits = dec.step(conts[:, t], torch.tensor([5, 2, 2]) + t, width + t)
            for r in range(3):
                full = prompts[int(expand[r])] + conts[r, : t + 1].tolist()
                want = model(torch.tensor([full])).logits[0, -1]
                assert torch.allclose(logits[r], want, atol=1e-5), (r, t)


def test_weight_changes_reach_the_decoder(tiny_model_dir):
    """`update_weights` and in-place edits (an optimizer step) both rebuild the fused weights."""
    from agentrl.models.tiny import load_model

    model = load_model(tiny_model_dir)[0]
    on, off = HFEngine(model, static_decode=True), HFEngine(load_model(tiny_model_dir)[0], static_decode=False)
    greedy = SamplingParams(temperature=0.0, max_tokens=12)
    prompts = prompts_for(model.config.vocab_size)
    before = on.generate(prompts, greedy)
    assert [c.token_ids for c in before] == [c.token_ids for c in off.generate(prompts, greedy)]
    weights = on._decoder_weights
    assert weights is not None and not weights.stale()
    sd = {k: v * 1.5 for k, v in model.state_dict().items()}
    on.update_weights(sd, 1)
    off.update_weights(sd, 1)
    after = on.generate(prompts, greedy)
    assert [c.token_ids for c in after] != [c.token_ids for c in before]
    assert [c.token_ids for c in after] == [c.token_ids for c in off.generate(prompts, greedy)]
    assert on._decoder_weights is not weights
    with torch.no_grad():  # in place, as an optimizer would
        for (_, p), (_, q) in zip(model.named_parameters(), off.model.named_parameters()):
            p.mul_(0.5)
            q.mul_(0.5)
    assert on._decoder_weights.stale()
    assert ([c.token_ids for c in on.generate(prompts, greedy)]
            == [c.token_ids for c in off.generate(prompts, greedy)])


class LoraLikeLinear(nn.Linear):
    """An nn.Linear subclass (as adapters and quantized layers are): not plain."""


@pytest.mark.parametrize("change, reason", [
    ("bf16", "float32"),
    ("sliding", "sliding"),
    ("gelu", "hidden_act"),
    ("dynamic_rope", "rope_type"),
    ("subclassed_linear", "plain nn.Linear"),
    ("training", "training"),
])
def test_unsupported_models_fall_back_to_transformers(change, reason):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    kw: dict = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                    num_attention_heads=2, num_key_value_heads=1)
    if change == "sliding":
        kw.update(use_sliding_window=True, sliding_window=4, max_window_layers=1)
    if change == "gelu":
        kw.update(hidden_act="gelu")
    if change == "dynamic_rope":
        kw.update(rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    torch.manual_seed(3)
    model = Qwen2ForCausalLM(Qwen2Config(**kw)).eval()
    if change == "bf16":
        model = model.to(torch.bfloat16)
    if change == "subclassed_linear":
        old = model.model.layers[1].mlp.up_proj
        new = LoraLikeLinear(old.in_features, old.out_features, bias=False)
        new.weight = old.weight
        model.model.layers[1].mlp.up_proj = new
    engine = HFEngine(model)
    if change == "training":
        model.train()
    assert reason in engine.static_decode_reason and not static_decoder_supported(model)
    calls = []
    forward = engine._forward
    engine._forward = lambda *a: calls.append(1) or forward(*a)
    outs = engine.generate([[5, 6, 7], [8, 9]], SamplingParams(temperature=1.0, max_tokens=6, seed=0))
    assert [len(o.token_ids) for o in outs] == [6, 6]
    assert len(calls) == 6  # the prefill and 5 decode steps ran the transformers forward
    assert engine._decoder_weights is None


# -- the learner's training forward (agentrl/models/static_forward.py) ---------------------------------
def test_training_forward_equals_the_transformers_forward(model):
    """`forward_hidden` on left-padded prefixes, then continuations on the prefixes' keys and
    values (rows index their prefix, as in prefix sharing): the hidden states equal the
    transformers forward of the whole rows, and so do the gradients of a loss on them."""
    from agentrl.models.static_forward import forward_hidden, static_forward_supported

    model.train()
    try:
        assert static_forward_supported(model)
        assert "training" in unsupported_reason(model)  # the decoder still needs eval mode
        g = torch.Generator().manual_seed(0)
        pre = [torch.randint(3, VOCAB, (n,), generator=g) for n in (5, 3)]
        cont = [torch.randint(3, VOCAB, (n,), generator=g) for n in (4, 6, 2)]
        src = [0, 1, 0]  # continuation row -> its prefix
        P, Lc = 5, 6
        pre_ids = torch.zeros((2, P), dtype=torch.long)
        pre_mask = torch.zeros((2, P), dtype=torch.long)
        for i, pr in enumerate(pre):  # left-padded
            pre_ids[i, P - len(pr):], pre_mask[i, P - len(pr):] = pr, 1
        pre_pos = (pre_mask.cumsum(-1) - 1).clamp(min=0)
        ids = torch.zeros((3, Lc), dtype=torch.long)
        valid = torch.zeros((3, Lc), dtype=torch.long)
        for r, c in enumerate(cont):  # right-padded
            ids[r, : len(c)], valid[r, : len(c)] = c, 1
        plen = torch.tensor([len(pre[s]) for s in src])
        pos = plen[:, None] + torch.arange(Lc)[None]
        idx = torch.tensor(src)
        w = torch.randn(3, Lc, model.config.hidden_size, generator=g) * valid[..., None]

        def grads():
            out = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
            model.zero_grad(set_to_none=True)
            return out

        hp, kv = forward_hidden(model, pre_ids, pre_pos, pre_mask)
        h, _ = forward_hidden(model, ids, pos, torch.cat([pre_mask[idx], valid], 1),
                              [(k[idx], v[idx]) for k, v in kv])
        (h * w).sum().backward()
        g_static = grads()
        refs = []
        for s, c in zip(src, cont):  # each row alone, unpadded
            full = torch.cat([pre[s], c])[None]
            refs.append(model.model(input_ids=full).last_hidden_state[0, len(pre[s]):])
        loss = sum((ref * w[r, : len(ref)]).sum() for r, ref in enumerate(refs))
        loss.backward()
        g_ref = grads()
        for r, ref in enumerate(refs):
            assert torch.allclose(h[r, : len(ref)], ref, atol=1e-4, rtol=0)
        for i, pr in enumerate(pre):
            ref = model.model(input_ids=pr[None]).last_hidden_state[0]
            assert torch.allclose(hp[i, P - len(pr):], ref.detach(), atol=1e-4, rtol=0)
        model.zero_grad(set_to_none=True)
        assert torch.isfinite(g_static).all()
        assert float((g_static - g_ref).abs().max()) <= 1e-4 * float(g_ref.abs().max())
    finally:
        model.eval()
