"""The benchmark's model: the peer baseline's tiny Qwen2 (build_tiny_qwen.py in the TRL probe).

A byte-level BPE tokenizer (vocab 1024 requested, 943 learned on a small fixed corpus, ChatML
template, eos = `<|im_end|>`, pad = `<|pad|>`, left padding) and a randomly initialised
`Qwen2ForCausalLM` (hidden 128, MLP 256, 2 layers, 4 heads / 2 KV heads, tied embeddings,
float32): about 417K parameters. Same code and seeds as the peer script, so the same files.
Both sides of the benchmark load this one directory.
"""

from __future__ import annotations

import random
from pathlib import Path

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _corpus() -> list[str]:
    """The peer's tokenizer training text (seeded `random`, so always the same lines)."""
    rng = random.Random(0)
    words = ("the a an and apple banana code python function return value list dict tuple "
             "assert print def class import from for while if else elif try except with as in "
             "is not or lambda yield none true false sort reverse sum max min len range string "
             "number integer float count letters vowels abracadabra alpha gamma data banana cat "
             "hat mat map filter reduce zip enumerate open read write file line word sentence").split()
    lines = []
    for _ in range(4000):
        n = rng.randint(4, 16)
        lines.append(" ".join(rng.choice(words) for _ in range(n)) + ".")
    lines += [f"def f{i}(x):\n    return x + {i}\n" for i in range(200)]
    lines += ["aaaa aaa aa a", "banana bandana cabana", "Write a function that returns the sum of a list."]
    return lines


def build_tiny_qwen(out_dir: str | Path) -> dict[str, int]:
    """Write the tokenizer and model to `out_dir` (created if missing).

    Returns:
        `{"vocab": ..., "params": ..., "eos": ..., "pad": ...}` (counts and token ids).
    """
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1024, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(_corpus(), trainer=trainer)
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|pad|>",
                                     bos_token=None, unk_token=None, model_max_length=512,
                                     padding_side="left")
    hf_tok.chat_template = CHAT_TEMPLATE
    hf_tok.save_pretrained(str(out_dir))
    cfg = Qwen2Config(vocab_size=len(hf_tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=True, bos_token_id=None, eos_token_id=hf_tok.eos_token_id,
                      pad_token_id=hf_tok.pad_token_id, torch_dtype="float32")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(cfg)
    model.generation_config.eos_token_id = hf_tok.eos_token_id
    model.generation_config.pad_token_id = hf_tok.pad_token_id
    model.save_pretrained(str(out_dir))
    return {"vocab": len(hf_tok), "params": sum(p.numel() for p in model.parameters()),
            "eos": int(hf_tok.eos_token_id), "pad": int(hf_tok.pad_token_id)}
