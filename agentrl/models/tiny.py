"""The embedded default model: an offline byte-level BPE tokenizer with a ChatML template and a
tiny Qwen2 causal LM, saved as a normal Hugging Face model directory; plus loading of any local
Hugging Face causal-LM directory and the chat helpers the agent loop uses.

Nothing here touches the network: the tokenizer is trained with the `tokenizers` library on
texts the caller gives (e.g. the env's training prompts and reference solutions), and the model
is randomly initialised from a `Qwen2Config`. torch and transformers are imported inside the
functions, so importing this module is cheap and has no side effects.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase, PreTrainedTokenizerFast

EOS_TOKEN = "<|endoftext|>"
"""End of text: eos and pad of the base model (as in Qwen2)."""
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
"""End of a chat turn: the token the sampler stops at in chat."""
SPECIAL_TOKENS = (EOS_TOKEN, IM_START, IM_END)
"""Special tokens, ids 0, 1, 2 in the embedded tokenizer."""
TOOL_TOKENS = ("<tool_call>", "</tool_call>")
"""Added (not special) tokens: kept by `decode(skip_special_tokens=True)`, like Qwen2.5's."""

# Qwen2's pre-tokenizer split: letters with one leading non-letter, single digits, punctuation
# runs, newline runs and whitespace runs (so code indentation gets its own tokens).
_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# ChatML, as Qwen2.5's template: tools (OpenAI-style schemas) go into the system prompt; every
# message renders as `<|im_start|>{role}\n{content}<|im_end|>\n`; an assistant message's
# `tool_calls` (OpenAI style) render after its content inside <tool_call></tool_call>. The
# `{% generation %}` block marks assistant content + <|im_end|> for
# `return_assistant_tokens_mask=True` (the newline after <|im_end|> is template glue, case M3).
CHAT_TEMPLATE = r"""
{%- set tools_header = '# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>' -%}
{%- set tools_footer = '\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>' -%}
{%- macro render_content(content) -%}
{%- if content is none -%}
{%- elif content is string -%}{{ content }}
{%- else -%}{%- for part in content -%}{%- if part['type'] == 'text' -%}{{ part['text'] }}{%- endif -%}{%- endfor -%}
{%- endif -%}
{%- endmacro -%}
{%- set ns = namespace(start=0) -%}
{%- if tools -%}
{{- '<|im_start|>system\n' -}}
{%- if messages and messages[0]['role'] == 'system' -%}
{{- render_content(messages[0]['content']) + '\n\n' -}}
{%- set ns.start = 1 -%}
{%- endif -%}
{{- tools_header -}}
{%- for tool in tools -%}{{- '\n' + (tool | tojson) -}}{%- endfor -%}
{{- tools_footer + '<|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages[ns.start:] -%}
{%- if message['role'] not in ['system', 'user', 'assistant', 'tool'] -%}
{{- raise_exception('unknown chat role ' ~ message['role'] ~ ': allowed are system, user, assistant, tool') -}}
{%- endif -%}
{{- '<|im_start|>' + message['role'] + '\n' -}}
{%- if message['role'] == 'assistant' -%}
{%- generation -%}
{{- render_content(message['content']) -}}
{%- if message['tool_calls'] is defined and message['tool_calls'] -%}
{%- for call in message['tool_calls'] -%}
{%- if call['function'] is defined -%}{%- set call = call['function'] -%}{%- endif -%}
{%- if loop.first and not message['content'] -%}{{- '<tool_call>\n' -}}{%- else -%}{{- '\n<tool_call>\n' -}}{%- endif -%}
{{- '{"name": "' + call['name'] + '", "arguments": ' -}}
{%- if call['arguments'] is string -%}{{- call['arguments'] -}}{%- else -%}{{- call['arguments'] | tojson -}}{%- endif -%}
{{- '}\n</tool_call>' -}}
{%- endfor -%}
{%- endif -%}
{{- '<|im_end|>' -}}
{%- endgeneration -%}
{{- '\n' -}}
{%- else -%}
{{- render_content(message['content']) + '<|im_end|>\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
""".strip()

# End-of-turn tokens of common chat formats, checked by `chat_stop_ids` on any tokenizer.
_END_OF_TURN_TOKENS = (IM_END, "<|eot_id|>", "<end_of_turn>", "<|end|>")


def build_tokenizer(texts: Iterable[str], vocab_size: int = 1024) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer offline on `texts` and wrap it for transformers.

    The pre-tokenizer is Qwen2's (regex split, then GPT-2 byte-level mapping), so any unicode
    string round-trips: `decode(encode(s)) == s`. Special tokens `<|endoftext|>` (ids 0: eos and
    pad), `<|im_start|>` (1), `<|im_end|>` (2); added tokens `<tool_call>`, `</tool_call>` take
    the last two ids. The ChatML `CHAT_TEMPLATE` is attached.

    Args:
        texts: training corpus (any iterable of str; consumed once).
        vocab_size: total size including the 256 byte tokens, the 3 special and 2 added
            tokens. The result is smaller when the corpus runs out of merges.

    Returns:
        A `PreTrainedTokenizerFast` (in transformers 5.x an alias of `TokenizersBackend`) with
        `padding_side="left"`.

    Raises:
        ValueError: if `vocab_size` < 261 (256 bytes + 5 special/added tokens).
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    n_fixed = 256 + len(SPECIAL_TOKENS) + len(TOOL_TOKENS)
    if vocab_size < n_fixed:
        raise ValueError(f"vocab_size must be >= {n_fixed} (256 bytes + 5 special tokens), got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_SPLIT_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(TOOL_TOKENS),
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    hf.add_tokens(list(TOOL_TOKENS))
    hf.chat_template = CHAT_TEMPLATE
    return hf


def chat_stop_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Token ids that end an assistant turn: the end-of-turn token (`<|im_end|>` for ChatML;
    also `<|eot_id|>`, `<end_of_turn>`, `<|end|>` when the tokenizer has them) then eos.

    Returns:
        Distinct ids, end-of-turn first. Empty only if the tokenizer has none of them.
    """
    ids: list[int] = []
    vocab = tokenizer.get_vocab()
    for token in _END_OF_TURN_TOKENS:
        if token in vocab:
            ids.append(vocab[token])
    if tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    return list(dict.fromkeys(ids))


def generation_eos_ids(path: str | Path) -> list[int]:
    """The ids model directory `path` generates up to: `eos_token_id` (an int or a list) of its
    `generation_config.json`, or, without that file, of its `config.json` (or the latter's
    `text_config`), as vLLM and transformers' `generate` read them (Llama-3.1 lists
    `<|end_of_text|>`, `<|eom_id|>` and `<|eot_id|>`: 128001, 128008, 128009).

    Returns:
        Distinct non-negative ids in the file's order; [] when `path` is empty or not a
        directory, neither file is there, one does not parse, or it names no eos id.
    """
    if not path or not Path(path).is_dir():
        return []
    gen, cfg = Path(path) / "generation_config.json", Path(path) / "config.json"
    try:
        if gen.is_file():
            eos = json.loads(gen.read_text()).get("eos_token_id")
        elif cfg.is_file():
            data = json.loads(cfg.read_text())
            eos = data.get("eos_token_id", (data.get("text_config") or {}).get("eos_token_id"))
        else:
            return []
    except (OSError, ValueError, AttributeError):  # unreadable, not JSON, not an object
        return []
    ids = eos if isinstance(eos, list) else [eos]
    return list(dict.fromkeys(int(i) for i in ids if type(i) is int and i >= 0))


def render_text(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[dict[str, Any]],
    *,
    add_generation_prompt: bool,
    tools: Sequence[dict[str, Any]] | None = None,
) -> str:
    """Render `messages` (and `tools`, OpenAI-style schemas) with the tokenizer's chat template.

    Raises:
        jinja2 / transformers errors from the template (e.g. an unknown role in ours).
    """
    text = tokenizer.apply_chat_template(
        list(messages),
        tools=list(tools) if tools else None,
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
    )
    assert isinstance(text, str)
    return text


def render_ids(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[dict[str, Any]],
    *,
    add_generation_prompt: bool,
    tools: Sequence[dict[str, Any]] | None = None,
) -> list[int]:
    """Token ids of `messages` rendered with the chat template, always a plain `list[int]`.

    transformers 5.x `apply_chat_template(tokenize=True)` returns a `BatchEncoding` (dict) by
    default, 4.x a list; this renders text and encodes it without adding special tokens, which
    is what `apply_chat_template` does internally, and is the same on both.
    """
    text = render_text(tokenizer, messages, add_generation_prompt=add_generation_prompt, tools=tools)
    return list(tokenizer.encode(text, add_special_tokens=False))


def tiny_config(
    tokenizer: PreTrainedTokenizerBase,
    *,
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    intermediate_size: int = 384,
    max_position_embeddings: int = 2048,
) -> Any:
    """The `Qwen2Config` of the embedded default for `tokenizer` (vocab = `len(tokenizer)`).

    Tied input/output embeddings, grouped-query attention with `num_heads // 2` key/value heads
    (all `num_heads` when odd), float32, eos = [<|im_end|>, <|endoftext|>], pad = <|endoftext|>.

    Raises:
        ValueError: if `hidden_size` is not divisible by `num_heads`.
    """
    from transformers import Qwen2Config

    return Qwen2Config(**text_config_fields(tokenizer, hidden_size=hidden_size, num_layers=num_layers,
                                            num_heads=num_heads, intermediate_size=intermediate_size,
                                            max_position_embeddings=max_position_embeddings),
                       dtype="float32")


def text_config_fields(tokenizer: PreTrainedTokenizerBase, *, hidden_size: int, num_layers: int,
                       num_heads: int, intermediate_size: int, max_position_embeddings: int
                       ) -> dict[str, Any]:
    """The text model's config fields of the embedded models (`tiny_config`, and the text part
    of `agentrl.models.vlm.tiny_vlm_config`): vocab = `len(tokenizer)`, tied embeddings,
    `num_heads // 2` key/value heads (all `num_heads` when odd), no BOS, eos = the chat's stop
    ids (`chat_stop_ids`), pad = the tokenizer's.

    Raises:
        ValueError: if `hidden_size` is not divisible by `num_heads`.
    """
    if hidden_size % num_heads:
        raise ValueError(f"hidden_size {hidden_size} is not divisible by num_heads {num_heads}")
    return dict(vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=intermediate_size,
                num_hidden_layers=num_layers, num_attention_heads=num_heads,
                num_key_value_heads=num_heads // 2 if num_heads % 2 == 0 else num_heads,
                max_position_embeddings=max_position_embeddings, tie_word_embeddings=True,
                bos_token_id=None, eos_token_id=chat_stop_ids(tokenizer), pad_token_id=tokenizer.pad_token_id)


def build_tiny_model(
    out_dir: str | Path,
    texts: Iterable[str],
    *,
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    intermediate_size: int = 384,
    vocab_size: int = 1024,
    seed: int = 0,
    max_position_embeddings: int = 2048,
    init_std: float | None = None,
) -> str:
    """Build the embedded default model and save it as a Hugging Face model directory.

    Trains the tokenizer on `texts` (`build_tokenizer`), builds a randomly initialised
    `Qwen2ForCausalLM` (`tiny_config`; defaults give 0.92 M parameters with vocab 1024),
    and writes `config.json`, `generation_config.json`, `model.safetensors`, `tokenizer.json`,
    `tokenizer_config.json` and `chat_template.jinja` to `out_dir` (created if missing), so that
    `AutoModelForCausalLM.from_pretrained(out_dir)` / `AutoTokenizer.from_pretrained(out_dir)`
    load it offline. Same `texts` and `seed` give the same files. The global torch RNG is left
    as it was. `init_std` (None: the config's 0.02) is the `initializer_range`: the standard
    deviation of the normal initialisation of the weight matrices and the embedding.

    Returns:
        `str(out_dir)`.

    Raises:
        ValueError: bad sizes (see `build_tokenizer`, `tiny_config`).
    """
    from transformers import Qwen2ForCausalLM

    tokenizer = build_tokenizer(texts, vocab_size=vocab_size)
    config = tiny_config(
        tokenizer,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
    )
    if init_std is not None:
        config.initializer_range = float(init_std)
    return save_initialised(Qwen2ForCausalLM, config, tokenizer, seed, out_dir)


def save_initialised(model_cls: Any, config: Any, tokenizer: PreTrainedTokenizerBase, seed: int,
                     out_dir: str | Path, *also: Any) -> str:
    """Initialise `model_cls(config)` (float32) from `seed` (the global torch RNG is left as it
    was), set its generation config to the chat's stop ids (`chat_stop_ids`), the pad id and no
    BOS, and save it, `tokenizer` and each of `also` (e.g. an image processor) with
    `save_pretrained` to `out_dir` (created if missing): the end of `build_tiny_model` and
    `build_tiny_vlm`.

    Returns:
        `str(out_dir)`.
    """
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_cls(config).float()
    model.generation_config.eos_token_id = chat_stop_ids(tokenizer)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = None
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for part in (model, tokenizer, *also):
        part.save_pretrained(out)
    return str(out)


def weight_rows(path: str | Path) -> dict[str, int]:
    """Rows of the input embedding (`embedding`) and of an untied output head (`lm_head`) of
    the model directory `path`, from its safetensors headers (`{}` without safetensors files).

    Raises:
        ValueError: a safetensors file whose header does not parse, naming the file.
    """
    from safetensors import SafetensorError, safe_open

    rows: dict[str, int] = {}
    for f in sorted(Path(path).glob("*.safetensors")):
        try:
            with safe_open(str(f), framework="pt") as st:
                for key in st.keys():
                    if key.endswith(("embed_tokens.weight", "wte.weight", "word_embeddings.weight")):
                        rows["embedding"] = int(st.get_slice(key).get_shape()[0])
                    elif key.endswith("lm_head.weight"):
                        rows["lm_head"] = int(st.get_slice(key).get_shape()[0])
        except (SafetensorError, OSError) as e:
            raise ValueError(f"{f} is not a readable safetensors file ({e}): a truncated or "
                             "interrupted copy?") from None
    return rows


def config_vocab_size(path: str | Path) -> int | None:
    """`vocab_size` of `path`/config.json (or of its `text_config`); None without either."""
    f = Path(path) / "config.json"
    if not f.is_file():
        return None
    cfg = json.loads(f.read_text())
    size = cfg.get("vocab_size") or (cfg.get("text_config") or {}).get("vocab_size")
    return None if size is None else int(size)


def check_weights_readable(path: str | Path) -> None:
    """Parse the header of every `*.safetensors` file in directory `path` (the header only, not
    the tensors: cheap for any size), that there is one at all, and compare the embedding and
    output-head rows with
    config.json's `vocab_size`, so that a truncated or foreign file, or weights saved after a
    resize without updating config.json, is one clear error instead of a `SafetensorError` or a
    "size mismatch" `RuntimeError` traceback from inside transformers.

    Raises:
        ValueError: naming the file and the parser's message, or the config's vocab_size and
            the tensor's rows.
    """
    if not weight_files(path):
        raise ValueError(f"{path} holds no weights (no *.safetensors or pytorch_model*.bin file): "
                         "an interrupted copy, or a tokenizer-only folder?")
    problem = rows_mismatch(path, weight_rows(path), config_vocab_size(path))
    if problem:
        raise ValueError(problem)


def weight_files(path: str | Path) -> list[Path]:
    """The weight files of model directory `path` (`*.safetensors`, `pytorch_model*.bin`)."""
    p = Path(path)
    return sorted([*p.glob("*.safetensors"), *p.glob("pytorch_model*.bin")])


def rows_mismatch(path: str | Path, rows: dict[str, int], vocab_size: int | None) -> str | None:
    """What is wrong when a weight's rows (`weight_rows`) differ from config.json's
    `vocab_size` (transformers refuses to load such weights), or None."""
    for name, n in rows.items():
        if vocab_size is not None and n != vocab_size:
            return (f"{Path(path) / 'config.json'} says vocab_size {vocab_size} but the weights' "
                    f"{name} has {n} rows: the weights do not fit the config (an embedding resized "
                    "without saving config.json?); fix vocab_size or the weights")
    return None


def tokenizer_overflow(path: str | Path, tokenizer: Any) -> str | None:
    """What is wrong when `tokenizer` (of model directory `path`) has ids the model has no
    embedding row for (config.json's `vocab_size` or the weights' rows below `len(tokenizer)`):
    the first such token (qwen's `<tool_call>`, ...) is an `IndexError` inside the embedding.
    None otherwise; rows beyond the tokenizer are padding (many Hugging Face models), fine.
    The message is `overflow_message`'s: `agentrl doctor --model`, `agentrl train`'s start-up
    check and `load_model` (`agentrl serve`, `agentrl eval`) all print it."""
    sizes = [n for n in (config_vocab_size(path), *weight_rows(path).values()) if n is not None]
    if not sizes or min(sizes) >= len(tokenizer):
        return None
    return overflow_message(path, tokenizer, min(sizes))


def overflow_message(path: str | Path, tokenizer: Any, rows: int) -> str:
    """The one wording of a tokenizer with ids past the model's `rows` embedding rows: the
    largest id (`len(tokenizer) - 1`), the rows, the first ids without a row and their tokens,
    and the fix."""
    n = len(tokenizer)
    past = ", ".join(map(str, tokenizer.convert_ids_to_tokens(list(range(rows, min(n, rows + 3))))))
    return (f"{path}: the tokenizer's ids go up to {n - 1} but the model has {rows} embedding rows: "
            f"ids {rows}-{n - 1} ({past}{', ...' if n - rows > 3 else ''}) have none; use the tokenizer "
            f"saved with these weights, or resize the embedding to {n} rows "
            f"(model.resize_token_embeddings({n}), then save_pretrained)")


def load_model(
    path: str | Path, *, dtype: torch.dtype | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a local Hugging Face causal-LM directory (ours or a real one) offline, in eval mode.

    Args:
        path: directory with config, weights and tokenizer files.
        dtype: parameter dtype (default float32).

    Returns:
        `(model, tokenizer)`; the tokenizer's pad token is set to its eos (or, failing that,
        unk) token when it has none, and its padding side is left.

    Raises:
        FileNotFoundError: if `path` is not a directory.
        OSError / ValueError: from transformers, if the directory is not a causal-LM model;
            ValueError naming a weights file whose safetensors header does not parse
            (`check_weights_readable`), or a tokenizer with ids past the embedding rows
            (`tokenizer_overflow`: `agentrl serve`/`eval` would crash on the first such token).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not Path(path).is_dir():
        raise FileNotFoundError(f"model directory not found: {path}")
    check_weights_readable(path)
    dtype = torch.float32 if dtype is None else dtype
    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    problem = tokenizer_overflow(path, tokenizer)
    if problem:
        raise ValueError(problem)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token if tokenizer.eos_token is not None else tokenizer.unk_token
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, local_files_only=True)
    model.eval()
    return model, tokenizer


def new_cache(model: Any) -> Any:
    """An empty transformers `DynamicCache` for `model` (a transformers model, not a PEFT
    wrapper); transformers < 4.56 takes no `config` argument."""
    from transformers import DynamicCache

    try:
        return DynamicCache(config=model.config)
    except TypeError:
        return DynamicCache()


def cache_kwarg(model: Any) -> str:
    """Name of the cache argument of `model.forward` (a transformers model): transformers 5.x
    renamed `past_key_values` to `cache`."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
