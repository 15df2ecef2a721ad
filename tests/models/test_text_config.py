"""The embedded VLM's text model is configured as the embedded text model (`tiny_config`): the
same vocabulary, sizes, key/value heads, tied embeddings and special ids, and the same error
for a hidden size the heads do not divide."""

from __future__ import annotations

import pytest

from agentrl.models.tiny import tiny_config
from agentrl.models.vlm import build_vlm_tokenizer, tiny_vlm_config

FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
          "num_key_value_heads", "max_position_embeddings", "tie_word_embeddings", "bos_token_id",
          "eos_token_id", "pad_token_id")


@pytest.fixture(scope="module")
def tok():
    return build_vlm_tokenizer(["a cat sat on a mat", "2 + 3 = 5"] * 10, vocab_size=400)


@pytest.mark.parametrize("sizes", [dict(), dict(hidden_size=96, num_heads=3, num_layers=2, intermediate_size=64,
                                                max_position_embeddings=512)])
def test_the_vlm_text_model_is_the_text_model(tok, sizes):
    text, vlm = tiny_config(tok, **sizes), tiny_vlm_config(tok, **sizes)
    assert {f: getattr(vlm.text_config, f) for f in FIELDS} == {f: getattr(text, f) for f in FIELDS}
    assert (vlm.eos_token_id, vlm.pad_token_id, vlm.bos_token_id) == (text.eos_token_id, text.pad_token_id, None)
    assert text.num_key_value_heads == (sizes.get("num_heads", 4) // 2 if sizes.get("num_heads", 4) % 2 == 0
                                        else sizes["num_heads"])


def test_heads_must_divide_the_hidden_size(tok):
    for make in (tiny_config, tiny_vlm_config):
        with pytest.raises(ValueError, match=r"^hidden_size 100 is not divisible by num_heads 3$"):
            make(tok, hidden_size=100, num_heads=3, vision_width=30) if make is tiny_vlm_config else \
                make(tok, hidden_size=100, num_heads=3)
