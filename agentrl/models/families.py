"""Tiny random-weight models of real model families, with the families' own chat templates.

For each family (`FAMILIES`): a model built from transformers' own config class of that
architecture (Qwen2, Qwen3, Llama, Mistral, Gemma3 text, Phi3), a few hundred thousand
parameters, and an offline byte-level BPE tokenizer that carries the family's real special
tokens (bos / eos / pad, end of turn, tool and thinking tokens, with the same special or
non-special role as in the published tokenizer) and its published chat template (the files in
`tests/fixtures/chat_templates/`, sources in `SOURCES.md` there). `build_family(name, dir)`
writes a normal Hugging Face model directory, so `model.path=DIR` loads it the way it loads a
user's model. Nothing is downloaded: the tokenizer's merges are learned from a small built-in
corpus, so its ids differ from the real model's (the special-token strings and roles do not).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl.models.tiny import _SPLIT_REGEX

TEMPLATE_DIR = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "chat_templates"
"""Where the published chat templates are kept (a source checkout's test fixtures)."""


@dataclass(frozen=True)
class Family:
    """One model family: its architecture, special tokens and chat template.

    Attributes:
        name: the family's key in `FAMILIES`.
        arch: transformers config / model pair: `qwen2`, `qwen3`, `llama`, `mistral`,
            `gemma3_text`, `phi3`.
        template: file name of its chat template in `TEMPLATE_DIR`.
        special: special tokens (control tokens: `special=True`, skipped by
            `decode(skip_special_tokens=True)`), in id order from 0.
        added: added non-special tokens (kept by decode), e.g. Qwen's `<tool_call>`, `<think>`.
        bos, eos, pad: the tokenizer's bos (None: none), eos and pad tokens.
        end_of_turn: the token that closes an assistant turn in the template.
        stop: extra tokens the generation config stops at (besides end_of_turn and eos).
    """

    name: str
    arch: str
    template: str
    special: tuple[str, ...]
    bos: str | None
    eos: str
    pad: str
    end_of_turn: str
    added: tuple[str, ...] = ()
    stop: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)


_QWEN_SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
                 "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>",
                 "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
                 "<|image_pad|>", "<|video_pad|>")
_QWEN_ADDED = ("<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
               "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>")
_LLAMA_SPECIAL = ("<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                  "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>",
                  "<|reserved_special_token_2|>", "<|start_header_id|>", "<|end_header_id|>",
                  "<|eom_id|>", "<|eot_id|>", "<|python_tag|>")
_R1 = "｜"  # fullwidth vertical line, as in DeepSeek's tokens
_R1_SPECIAL = tuple(f"<{_R1}{t}{_R1}>" for t in (
    "begin▁of▁sentence", "end▁of▁sentence", "▁pad▁", "User", "Assistant", "tool▁calls▁begin",
    "tool▁calls▁end", "tool▁call▁begin", "tool▁call▁end", "tool▁outputs▁begin",
    "tool▁outputs▁end", "tool▁output▁begin", "tool▁output▁end", "tool▁sep"))

FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("qwen2_5", "qwen2", "qwen2_5.jinja", _QWEN_SPECIAL, None, "<|im_end|>", "<|endoftext|>",
           "<|im_end|>", added=_QWEN_ADDED, stop=("<|endoftext|>",)),
    Family("qwen3", "qwen3", "qwen3.jinja", _QWEN_SPECIAL, None, "<|im_end|>", "<|endoftext|>",
           "<|im_end|>", added=_QWEN_ADDED + ("<tool_response>", "</tool_response>", "<think>",
                                             "</think>"), stop=("<|endoftext|>",)),
    Family("llama3_1", "llama", "llama3_1.jinja", _LLAMA_SPECIAL, "<|begin_of_text|>", "<|eot_id|>",
           "<|finetune_right_pad_id|>", "<|eot_id|>", stop=("<|end_of_text|>", "<|eom_id|>")),
    Family("llama3_2", "llama", "llama3_2.jinja", _LLAMA_SPECIAL, "<|begin_of_text|>", "<|eot_id|>",
           "<|finetune_right_pad_id|>", "<|eot_id|>", stop=("<|end_of_text|>", "<|eom_id|>")),
    Family("mistral_v0_3", "mistral", "mistral_v0_3.jinja",
           ("<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]",
            "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[control_8]"),
           "<s>", "</s>", "<unk>", "</s>"),
    Family("gemma3", "gemma3_text", "gemma3.jinja",
           ("<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>",
            "<start_of_image>", "<end_of_image>", "<image_soft_token>"),
           "<bos>", "<eos>", "<pad>", "<end_of_turn>"),
    Family("phi3", "phi3", "phi3.jinja",
           ("<unk>", "<s>", "</s>", "<|endoftext|>", "<|assistant|>", "<|placeholder1|>",
            "<|placeholder2|>", "<|placeholder3|>", "<|placeholder4|>", "<|system|>", "<|end|>",
            "<|placeholder5|>", "<|placeholder6|>", "<|user|>"),
           "<s>", "<|endoftext|>", "<|endoftext|>", "<|end|>", stop=("<|endoftext|>",)),
    Family("deepseek_r1_distill", "qwen2", "deepseek_r1_distill.jinja", _R1_SPECIAL,
           _R1_SPECIAL[0], _R1_SPECIAL[1], _R1_SPECIAL[2], _R1_SPECIAL[1],
           added=("<think>", "</think>", "<|im_start|>", "<|im_end|>")),
)}
"""The families `build_family` knows, by name."""

_CORPUS = (
    "You are a helpful assistant. Answer the question, call a tool when it helps.\n",
    "The quick brown fox jumps over the lazy dog. 0123456789 + - * / = ( ) [ ] { } < > | ! ? ,",
    'def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n{"name": "add", "arguments": {"a": 1}}\n',
    "user assistant system tool ipython model think observation result reward answer value\n",
    "Tool output: 42. The count is 7. All tests passed. Error: division by zero.\n",
)


def chat_template(family: Family) -> str:
    """The text of `family`'s published chat template (read from `TEMPLATE_DIR`).

    Raises:
        FileNotFoundError: the fixture is missing (an installed package without the tests).
    """
    return (TEMPLATE_DIR / family.template).read_text(encoding="utf-8")


def _with_family_tokens(hf: Any, family: Family, template: str) -> Any:
    """`hf` with `family`'s special tokens (those not bos / eos / pad), its added tokens and its
    chat template `template`: the last steps of both tokenizer builders."""
    hf.add_special_tokens({"additional_special_tokens": [t for t in family.special
                                                         if t not in (family.bos, family.eos, family.pad)]})
    if family.added:
        hf.add_tokens(list(family.added))
    hf.chat_template = template
    return hf


def build_family_tokenizer(family: Family, vocab_size: int = 640) -> Any:
    """An offline byte-level BPE tokenizer with `family`'s special and added tokens and chat
    template (`PreTrainedTokenizerFast`, left padding).

    Special tokens take ids 0.. in `family.special` order; the BPE vocabulary follows; the added
    non-special tokens take the last ids. Merges are learned from a small built-in corpus plus
    the template's own text.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    template = chat_template(family)
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_SPLIT_REGEX), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(family.added),
                                  special_tokens=list(family.special),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator([*_CORPUS, template], trainer=trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=family.bos, eos_token=family.eos,
                                 pad_token=family.pad, unk_token=None, padding_side="left",
                                 clean_up_tokenization_spaces=False)
    return _with_family_tokens(hf, family, template)


_METASPACE_CORPUS = (
    "def solve(xs):\n    return sorted(xs)\n",
    "for i in range(len(xs)):\n    if xs[i] > 0:\n        total += xs[i]\nreturn total\n",
    "Traceback (most recent call last):\n  File \"main.py\", line 3, in <module>\nNameError: name 'x'\n",
)


def build_metaspace_tokenizer(family: Family, vocab_size: int = 900) -> Any:
    """An offline SentencePiece-style tokenizer with `family`'s special tokens and chat template:
    a BPE model with byte fallback behind a `Metaspace` pre-tokenizer (`prepend_scheme="first"`:
    a space before the *text*, "▁" for spaces, no split), the decoder of the published Mistral
    v0.3 / Llama-2 (`legacy=False`) / Phi-3 tokenizers, as a `LlamaTokenizerFast` (`legacy=False`,
    bos added by `encode` with special tokens, left padding). The published tokenizers of those
    families are of this kind; `build_family_tokenizer`'s are byte-level BPE.

    Special tokens take ids 0.. in `family.special` order, then the 256 byte tokens
    (`<0x00>`..), then the BPE vocabulary learned from a small built-in corpus plus the template.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import LlamaTokenizerFast

    template = chat_template(family)
    tok = Tokenizer(models.BPE(unk_token="<unk>" if "<unk>" in family.special else None,
                               fuse_unk=True, byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    alphabet = list("\n\t ▁") + [chr(c) for c in range(33, 127)]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size,
                                  special_tokens=[*family.special, *(f"<0x{i:02X}>" for i in range(256))],
                                  initial_alphabet=alphabet, show_progress=False)
    tok.train_from_iterator([*_CORPUS, *_METASPACE_CORPUS, template], trainer=trainer)
    if family.bos:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{family.bos} $A", pair=f"{family.bos} $A {family.bos} $B",
            special_tokens=[(family.bos, tok.token_to_id(family.bos))])
    hf = LlamaTokenizerFast(tokenizer_object=tok, bos_token=family.bos, eos_token=family.eos,
                            unk_token="<unk>" if "<unk>" in family.special else None,
                            pad_token=family.pad, add_bos_token=bool(family.bos), add_eos_token=False,
                            legacy=False, padding_side="left", clean_up_tokenization_spaces=False)
    return _with_family_tokens(hf, family, template)


TOKENIZER_KINDS = ("byte_level", "metaspace")
"""`build_family(tokenizer=...)`: byte-level BPE (`build_family_tokenizer`) or SentencePiece-style
(`build_metaspace_tokenizer`)."""


def family_config(family: Family, tokenizer: Any, *, hidden_size: int = 64, num_layers: int = 2,
                  num_heads: int = 4, intermediate_size: int = 128) -> Any:
    """The transformers config of `family`'s architecture at a tiny size (vocab =
    `len(tokenizer)`, float32, eos = end of turn + eos + `family.stop`)."""
    import transformers as tf

    vocab = tokenizer.get_vocab()
    eos = list(dict.fromkeys(vocab[t] for t in (family.end_of_turn, family.eos, *family.stop)))
    common = dict(vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=intermediate_size,
                  num_hidden_layers=num_layers, num_attention_heads=num_heads,
                  num_key_value_heads=num_heads // 2, max_position_embeddings=2048,
                  bos_token_id=vocab[family.bos] if family.bos else None, eos_token_id=eos,
                  pad_token_id=vocab[family.pad], tie_word_embeddings=True)
    cls = {"qwen2": tf.Qwen2Config, "qwen3": tf.Qwen3Config, "llama": tf.LlamaConfig,
           "mistral": tf.MistralConfig, "gemma3_text": tf.Gemma3TextConfig, "phi3": tf.Phi3Config}[family.arch]
    if family.arch in ("qwen3", "gemma3_text"):
        common["head_dim"] = hidden_size // num_heads
    if family.arch == "gemma3_text":
        common.update(sliding_window=64, query_pre_attn_scalar=hidden_size // num_heads)
    if family.arch == "phi3":
        common.update(original_max_position_embeddings=2048)
    config = cls(**common)
    config.dtype = "float32"
    return config


def _model_class(arch: str) -> Any:
    import transformers as tf

    return {"qwen2": tf.Qwen2ForCausalLM, "qwen3": tf.Qwen3ForCausalLM, "llama": tf.LlamaForCausalLM,
            "mistral": tf.MistralForCausalLM, "gemma3_text": tf.Gemma3ForCausalLM,
            "phi3": tf.Phi3ForCausalLM}[arch]


def build_family(name: str, out_dir: str | Path, *, seed: int = 0, tokenizer: str = "byte_level",
                 **sizes: int) -> str:
    """Write a tiny random-weight model of family `name` with its tokenizer and published chat
    template to `out_dir`, loadable by `agentrl.models.tiny.load_model` / `model.path=DIR`.

    Args:
        name: a key of `FAMILIES`.
        out_dir: directory to write (created).
        seed: torch seed of the initial weights (the global RNG is left as it was).
        tokenizer: `byte_level` (default) or `metaspace` (`TOKENIZER_KINDS`).
        sizes: `family_config` size overrides (hidden_size, num_layers, num_heads,
            intermediate_size).

    Returns:
        `str(out_dir)`.

    Raises:
        KeyError: `name` is not a family (the message lists them).
    """
    import torch

    if name not in FAMILIES:
        raise KeyError(f"unknown model family {name!r}; known: {', '.join(FAMILIES)}")
    if tokenizer not in TOKENIZER_KINDS:
        raise KeyError(f"unknown tokenizer kind {tokenizer!r}; known: {', '.join(TOKENIZER_KINDS)}")
    family = FAMILIES[name]
    tok = (build_metaspace_tokenizer if tokenizer == "metaspace" else build_family_tokenizer)(family)
    config = family_config(family, tok, **sizes)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = _model_class(family.arch)(config).float()
    gen = model.generation_config
    gen.eos_token_id, gen.pad_token_id, gen.bos_token_id = config.eos_token_id, config.pad_token_id, config.bos_token_id
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)
