"""The embedded default model: offline tokenizer, ChatML template, tiny Qwen2, loading."""

from __future__ import annotations

import json
import unicodedata

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.models.tiny import (
    CHAT_TEMPLATE,
    build_tiny_model,
    build_tokenizer,
    chat_stop_ids,
    load_model,
    render_ids,
    render_text,
)

torch.set_num_threads(1)


def corpus() -> list[str]:
    """A small code + prose corpus: three stdlib modules' sources (far more than 512 merges)."""
    import json.encoder
    import string
    import textwrap

    return [open(m.__file__, encoding="utf-8").read() for m in (textwrap, json.encoder, string)] + [
        "The quick brown fox jumps over the lazy dog. Ünïcödé ✓ 漢字 🙂\n"
    ]


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer(corpus(), vocab_size=512)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", corpus(), vocab_size=512)


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "python",
            "description": "Run code",
            "parameters": {"type": "object", "properties": {"code": {"type": "string"}}},
        },
    }
]

TOOLS_BLOCK = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    '{"type": "function", "function": {"name": "python", "description": "Run code", '
    '"parameters": {"type": "object", "properties": {"code": {"type": "string"}}}}}'
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
)


# -- tokenizer ---------------------------------------------------------------------------------
def test_special_and_added_token_ids(tok):
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [0, 1, 2]
    # vocab 512 is reached by this corpus; the two added tokens take the last ids.
    assert len(tok) == 512
    assert tok.convert_tokens_to_ids(["<tool_call>", "</tool_call>"]) == [510, 511]
    assert tok.eos_token == tok.pad_token == "<|endoftext|>"
    assert tok.padding_side == "left"
    # <tool_call> is an added, non-special token: skip_special_tokens keeps it.
    ids = tok.encode("<|im_start|>x<tool_call>y</tool_call><|im_end|>", add_special_tokens=False)
    assert ids[0] == 1 and ids[-1] == 2 and 510 in ids and 511 in ids
    assert tok.decode(ids, skip_special_tokens=True) == "x<tool_call>y</tool_call>"


def test_vocab_too_small_raises():
    with pytest.raises(ValueError, match="vocab_size"):
        build_tokenizer(["abc"], vocab_size=260)


def test_small_corpus_gives_smaller_vocab():
    t = build_tokenizer(["ab ab ab"], vocab_size=1024)
    # 256 bytes + 3 special + a couple of merges + 2 added tokens: far below 1024.
    assert 261 <= len(t) < 300
    assert t.decode(t.encode("zz☃", add_special_tokens=False)) == "zz☃"


CODE_SAMPLES = [
    "def f(x):\n\tif x:\r\n        return {'a': [1, 2.5e-3]}  # ok\n\n\n",
    "   leading and trailing spaces   ",
    "",
    "\x00\x01\x7f control bytes and a tab\t",
    "日本語のテキスト, emoji 🙂👍🏽, Ω, ﬁ ligature, zero\u200bwidth",
    "<|im_end|> inside text and <tool_call>{\"name\": \"x\"}</tool_call>",
]


@pytest.mark.parametrize("text", CODE_SAMPLES)
def test_round_trip_code_and_unicode(tok, text):
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text


@settings(max_examples=200, deadline=None)
@given(text=st.text())
def test_round_trip_any_unicode_up_to_nfc(tok, text):
    ids = tok.encode(text, add_special_tokens=False)
    # Byte-level BPE after Qwen2's NFC normalizer: exact for NFC text, NFC of the input otherwise.
    assert tok.decode(ids) == unicodedata.normalize("NFC", text)


def test_nfc_normalization_is_applied(tok):
    decomposed = "e\u0301"  # e + combining acute accent -> é (U+00E9) under NFC
    assert tok.decode(tok.encode(decomposed, add_special_tokens=False)) == "\u00e9"


# -- chat template ----------------------------------------------------------------------------
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Add 2 and 3."},
    {"role": "assistant", "content": '<tool_call>\n{"name": "python", "arguments": {"code": "2+3"}}\n</tool_call>'},
    {"role": "tool", "content": "5"},
    {"role": "assistant", "content": "5"},
]


def test_chatml_rendering_exact(tok):
    text = render_text(tok, CONVERSATION[:4], add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nAdd 2 and 3.<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "python", "arguments": {"code": "2+3"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>tool\n5<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert render_text(tok, CONVERSATION[1:2], add_generation_prompt=False) == (
        "<|im_start|>user\nAdd 2 and 3.<|im_end|>\n"
    )


def test_tools_go_into_existing_system_prompt(tok):
    text = render_text(tok, CONVERSATION[:2], add_generation_prompt=True, tools=TOOLS)
    assert text == (
        "<|im_start|>system\nBe brief.\n\n" + TOOLS_BLOCK + "<|im_start|>user\nAdd 2 and 3.<|im_end|>\n<|im_start|>assistant\n"
    )


def test_tools_without_system_message_get_one(tok):
    text = render_text(tok, CONVERSATION[1:2], add_generation_prompt=False, tools=TOOLS)
    assert text == "<|im_start|>system\n" + TOOLS_BLOCK + "<|im_start|>user\nAdd 2 and 3.<|im_end|>\n"


def test_openai_tool_calls_and_content_parts_render(tok):
    msgs = [
        {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"type": "function", "function": {"name": "python", "arguments": '{"code": "1"}'}},
                {"type": "function", "function": {"name": "python", "arguments": {"code": "2"}}},
            ],
        },
    ]
    assert render_text(tok, msgs, add_generation_prompt=False) == (
        "<|im_start|>user\nhi there<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "python", "arguments": {"code": "1"}}\n</tool_call>'
        '\n<tool_call>\n{"name": "python", "arguments": {"code": "2"}}\n</tool_call><|im_end|>\n'
    )


def test_unknown_role_raises(tok):
    with pytest.raises(Exception, match="unknown chat role"):
        render_text(tok, [{"role": "robot", "content": "x"}], add_generation_prompt=False)


def test_render_ids_is_a_list_of_ints(tok):
    ids = render_ids(tok, CONVERSATION[:2], add_generation_prompt=True)
    assert type(ids) is list and all(type(i) is int for i in ids)
    assert ids == tok.encode(render_text(tok, CONVERSATION[:2], add_generation_prompt=True), add_special_tokens=False)
    prompt = tok.encode("<|im_start|>assistant\n", add_special_tokens=False)
    assert prompt[0] == 1 and ids[-len(prompt) :] == prompt
    # The library call itself returns a BatchEncoding in transformers 5.x; render_ids hides that.
    raw = tok.apply_chat_template(CONVERSATION[:2], tokenize=True, add_generation_prompt=True)
    plain = raw["input_ids"] if isinstance(raw, dict) or hasattr(raw, "keys") else raw
    assert list(plain) == ids


def test_render_is_additive_per_message(tok):
    # Contract 1: an observation is rendered on its own and appended; with ChatML the ids of a
    # conversation are the concatenation of the ids of its messages.
    whole = render_ids(tok, CONVERSATION, add_generation_prompt=False)
    parts = [i for m in CONVERSATION for i in render_ids(tok, [m], add_generation_prompt=False)]
    assert whole == parts


def test_stop_ids(tok):
    assert chat_stop_ids(tok) == [2, 0]  # <|im_end|>, then <|endoftext|>


def test_assistant_mask_covers_content_and_end_of_turn_only(tok):
    # Case M3: 1 on assistant content and <|im_end|>; 0 on the generation prompt, the newline
    # after <|im_end|>, and on system/user/tool turns.
    out = tok.apply_chat_template(
        CONVERSATION, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    ids, mask = out["input_ids"], out["assistant_masks"]
    masked = [i for i, m in zip(ids, mask, strict=True) if m]
    expected = []
    for m in CONVERSATION:
        if m["role"] == "assistant":
            expected += tok.encode(m["content"] + "<|im_end|>", add_special_tokens=False)
    assert masked == expected


# -- model directory --------------------------------------------------------------------------
def test_model_directory_is_a_normal_hf_dir(model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True)
    tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    cfg = model.config
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert cfg.tie_word_embeddings and model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads) == (128, 4, 4)
    assert cfg.num_key_value_heads == 2 and cfg.intermediate_size == 384
    assert cfg.vocab_size == len(tok) == 512
    assert model.dtype == torch.float32
    # 512*128 embedding (tied) + 4 layers * (q,k,v with bias; o; 3 MLP mats; 2 norms) + final norm
    per_layer = (128 * 128 + 128) + 2 * (128 * 64 + 64) + 128 * 128 + 3 * 128 * 384 + 2 * 128
    assert sum(p.numel() for p in model.parameters()) == 512 * 128 + 4 * per_layer + 128
    assert tok.chat_template == CHAT_TEMPLATE
    assert model.generation_config.eos_token_id == [2, 0]
    assert json.load(open(f"{model_dir}/config.json"))["model_type"] == "qwen2"


def test_reloaded_tokenizer_encodes_identically(model_dir, tok):
    # transformers 5.x loads a qwen2 directory with Qwen2Tokenizer, which rebuilds the pipeline
    # from vocab + merges; ours is built with the same normalizer/pre-tokenizer so ids agree.
    _, loaded = load_model(model_dir)
    for text in CODE_SAMPLES + ["e\u0301 café", "def g():\n    return 'ok'\n"]:
        assert loaded.encode(text, add_special_tokens=False) == tok.encode(text, add_special_tokens=False)
    assert render_ids(loaded, CONVERSATION, add_generation_prompt=True, tools=TOOLS) == render_ids(
        tok, CONVERSATION, add_generation_prompt=True, tools=TOOLS
    )


def test_build_is_deterministic_and_leaves_global_rng_alone(tmp_path, model_dir):
    from safetensors.torch import load_file

    torch.manual_seed(123)
    before = torch.rand(3)
    torch.manual_seed(123)
    again = build_tiny_model(tmp_path / "again", corpus(), vocab_size=512)
    assert torch.equal(torch.rand(3), before)
    a = load_file(f"{model_dir}/model.safetensors")
    b = load_file(f"{again}/model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    other = build_tiny_model(tmp_path / "other", corpus(), vocab_size=512, seed=1)
    c = load_file(f"{other}/model.safetensors")
    assert not torch.equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])


def test_saved_model_reloads_with_identical_logits(model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    model, tok = load_model(model_dir)
    ids = torch.tensor([render_ids(tok, CONVERSATION, add_generation_prompt=True)])
    with torch.no_grad():
        before = model(ids).logits
    model.save_pretrained(tmp_path / "copy")
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "copy", local_files_only=True).eval()
    with torch.no_grad():
        after = reloaded(ids).logits
    assert before.shape == (1, ids.shape[1], 512)
    assert torch.equal(before, after)


def test_odd_heads_use_full_kv_heads(tmp_path):
    path = build_tiny_model(tmp_path / "m", ["abc abd"], hidden_size=24, num_heads=3, num_layers=1, intermediate_size=32)
    model, _ = load_model(path)
    assert model.config.num_key_value_heads == 3


def test_bad_head_count_raises(tmp_path):
    with pytest.raises(ValueError, match="divisible"):
        build_tiny_model(tmp_path / "m", ["abc"], hidden_size=30, num_heads=4)


def test_load_model_sets_missing_pad_token(tmp_path, tok):
    # Any local causal-LM directory works: a Llama-architecture model whose tokenizer has no pad.
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
    )
    LlamaForCausalLM(cfg).save_pretrained(tmp_path / "llama")
    tok.save_pretrained(tmp_path / "llama")
    tcfg_path = tmp_path / "llama" / "tokenizer_config.json"
    tcfg = json.loads(tcfg_path.read_text())
    tcfg.pop("pad_token")
    tcfg_path.write_text(json.dumps(tcfg))
    model, loaded = load_model(tmp_path / "llama", dtype=torch.float32)
    assert type(model).__name__ == "LlamaForCausalLM" and not model.training
    assert loaded.pad_token == loaded.eos_token == "<|endoftext|>"


def test_load_model_missing_dir(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_model(tmp_path / "nope")
