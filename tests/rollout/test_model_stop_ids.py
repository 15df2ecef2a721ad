"""A model's own eos ids stop sampling (probe defect): Llama-3.1's generation_config.json lists
`<|end_of_text|>`, `<|eom_id|>` and `<|eot_id|>`, vLLM and transformers' `generate` stop at
each, and the renderer's stop ids (every engine's `stop_token_ids`: training rollouts, `agentrl
eval`, `agentrl serve`) held only `<|eot_id|>`: a turn that sampled `<|eom_id|>` ran on to
max_tokens. The embedded model's stop ids are unchanged."""

from __future__ import annotations

import json

import httpx
import pytest
import torch

from agentrl.config import Config
from agentrl.models.families import build_family
from agentrl.models.tiny import build_tiny_model, generation_eos_ids, load_model
from agentrl.rollout.chat import renderer_for
from agentrl.rollout.engines.make import load_processor, make_engine

SIZES = dict(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return build_family("llama3_1", tmp_path_factory.mktemp("llama3_1") / "m", **SIZES)


def test_generation_eos_ids_reads_an_int_a_list_or_config_json(tmp_path):
    assert generation_eos_ids("") == [] and generation_eos_ids(tmp_path / "absent") == []
    assert generation_eos_ids(tmp_path) == []  # neither file
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 7}))
    assert generation_eos_ids(tmp_path) == [7]  # no generation_config.json: config.json's
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"eos_token_id": [5, 6]}}))
    assert generation_eos_ids(tmp_path) == [5, 6]
    gen = tmp_path / "generation_config.json"
    gen.write_text(json.dumps({"eos_token_id": [128001, 128008, 128009, 128008]}))
    assert generation_eos_ids(tmp_path) == [128001, 128008, 128009]  # the file wins, once each
    gen.write_text(json.dumps({"eos_token_id": 2}))
    assert generation_eos_ids(tmp_path) == [2]
    gen.write_text(json.dumps({"bos_token_id": 1}))
    assert generation_eos_ids(tmp_path) == []  # a generation config without eos: none
    gen.write_text("{not json")
    assert generation_eos_ids(tmp_path) == []


def test_llama_3_1_stop_ids_hold_eom_and_end_of_text_however_it_is_loaded(llama):
    _, tok = load_model(llama)
    vocab = tok.get_vocab()
    eot, eom, end = vocab["<|eot_id|>"], vocab["<|eom_id|>"], vocab["<|end_of_text|>"]
    assert set(json.load(open(f"{llama}/generation_config.json"))["eos_token_id"]) == {eot, eom, end}
    # the trainer's policy (load_model), `rollout.num_workers > 0` / vLLM (load_processor), a
    # worker's, `agentrl eval`'s and `agentrl serve`'s hf engine (make_engine)
    for t in (tok, load_processor(llama), make_engine(Config(), llama)[1]):
        r = renderer_for(t)
        assert r.end_of_turn_id == eot and r.stop_ids[0] == eot
        assert set(r.stop_ids) == {eot, eom, end}, r.stop_ids  # was [eot]


def test_serve_judge_stops_at_the_model_eos_ids_too(llama):
    from agentrl.rewards.serve_judge import ChatModel

    chat = ChatModel(llama)
    vocab = chat.tokenizer.get_vocab()
    assert set(chat.stop_ids) == {vocab[t] for t in ("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>")}


def test_the_embedded_model_stop_ids_are_unchanged(tmp_path):
    d = build_tiny_model(tmp_path / "m", ["hello world, a tiny corpus"] * 20, vocab_size=300,
                         hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
    _, tok = load_model(d)
    r = renderer_for(tok)
    assert r.stop_ids == [tok.convert_tokens_to_ids("<|im_end|>"), tok.eos_token_id]
    assert set(generation_eos_ids(d)) == set(r.stop_ids)


def _always_eom(src: str, dst) -> str:
    """`src`'s model made to sample `<|eom_id|>` after any prompt: every layer's output
    projections zeroed (the hidden state is the input embedding), embedding column 0 set to 1
    for every token and to 10 for `<|eom_id|>` (tied embeddings: its logit is ~10x the others')."""
    model, tok = load_model(src)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        emb = model.get_input_embeddings().weight
        emb[:, 0] = 1.0
        emb[tok.convert_tokens_to_ids("<|eom_id|>"), 0] = 10.0
    model.save_pretrained(dst)
    tok.save_pretrained(dst)
    return str(dst)


def test_serve_stops_a_llama_3_1_reply_at_eom_id(llama, tmp_path):
    """`agentrl serve`'s hf engine on a model that samples `<|eom_id|>` first: the reply is that
    one token, finish "stop" (it sampled `<|eom_id|>` max_tokens times, finish "length")."""
    from agentrl.gateway.serve import start

    d = _always_eom(llama, tmp_path / "eom")
    served = start(d, max_tokens=8)
    try:
        r = httpx.post(f"{served.url}/chat/completions", timeout=60,
                       json={"model": "policy", "messages": [{"role": "user", "content": "hi"}]})
    finally:
        served.close()
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["finish_reason"] == "stop", body
    assert body["usage"]["completion_tokens"] == 1 and body["choices"][0]["message"]["content"] == ""
