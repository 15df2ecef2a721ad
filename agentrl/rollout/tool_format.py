"""Which tool-call format a run's envs parse (`rollout.tool_parser`): a name chooses a parser of
`agentrl_tools.parser.PARSERS`; `auto` picks it from the policy's tokenizer, its chat template
text and its special tokens, the way the model writes calls at inference:

- `<tool_call>` (a token of the vocabulary, or in the template): `hermes` (Qwen2.5, Qwen3,
  Hermes; also Hermes-tuned Llamas, whose vocabulary has `<|python_tag|>` too, so this is
  looked at first);
- `[TOOL_CALLS]`: `mistral`;
- `<|python_tag|>`, or `<|eot_id|>` with an `ipython` role in the template: `llama3_json`;
- anything else: `hermes`, with a start-up line saying the format was not recognised.

The embedded model (no `model.path`) has Hermes tool tokens (`agentrl.models.tiny.TOOL_TOKENS`),
so `auto` is `hermes` there without loading anything, as before this option existed.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentrl.config import Config

FALLBACK = "hermes"


def template_text(tokenizer: Any) -> str:
    """The tokenizer's chat template as one string (all named templates joined when it has
    several, e.g. `default` and `tool_use`; "" when it has none)."""
    t = getattr(tokenizer, "chat_template", None)
    if isinstance(t, dict):
        return "\n".join(str(v) for v in t.values())
    if isinstance(t, list):  # the serialised form: [{"name": ..., "template": ...}, ...]
        return "\n".join(str(x.get("template", "")) if isinstance(x, dict) else str(x) for x in t)
    return t or ""


def token_texts(tokenizer: Any) -> set[str]:
    """The texts of the tokenizer's added and special tokens (where control tokens such as
    `<tool_call>`, `<|python_tag|>` and `[TOOL_CALLS]` live)."""
    out: set[str] = set(getattr(tokenizer, "all_special_tokens", []) or [])
    get_added = getattr(tokenizer, "get_added_vocab", None)
    if callable(get_added):
        out.update(get_added())
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    out.update(str(t) for t in decoder.values())
    return out


def detect_tool_parser(tokenizer: Any) -> tuple[str, str]:
    """(parser name, why) for a tokenizer: see the module docstring for the rules, in order.

    Args:
        tokenizer: a Hugging Face tokenizer (anything with `chat_template` and the added-token
            accessors; missing ones count as empty).

    Returns:
        a `PARSERS` name and a short reason naming the token or template text that decided it
        (the fallback says that nothing was recognised).
    """
    template, tokens = template_text(tokenizer), token_texts(tokenizer)

    def found(s: str) -> str | None:
        where = [w for w, ok in (("token", s in tokens), ("chat template", s in template)) if ok]
        return f"{s} in the {' and '.join(where)}" if where else None

    for marker, name in (("<tool_call>", "hermes"), ("[TOOL_CALLS]", "mistral"), ("<|python_tag|>", "llama3_json")):
        why = found(marker)
        if why:
            return name, why
    if "<|eot_id|>" in tokens and "ipython" in template:
        return "llama3_json", "<|eot_id|> token and an ipython role in the chat template"
    return FALLBACK, ("no tool-call format recognised in the tokenizer (no <tool_call>, [TOOL_CALLS] "
                      "or <|python_tag|> token or template text); using hermes (set rollout.tool_parser "
                      "to choose another)")


@lru_cache(maxsize=8)
def _detect_dir(path: str) -> tuple[str, str]:
    from transformers import AutoTokenizer  # deferred: heavy, and only for a model directory

    return detect_tool_parser(AutoTokenizer.from_pretrained(path, local_files_only=True))


def resolve_tool_parser(cfg: Config, tokenizer: Any = None) -> tuple[str, str]:
    """(parser name, why) of a run: `rollout.tool_parser` when it names one; for `auto`,
    `detect_tool_parser` on `tokenizer` (or the tokenizer of `model.path`, loaded once per
    process), and `hermes` for the embedded model (no `model.path`: it has Hermes tool tokens).
    """
    return tool_parser_for(cfg.rollout.tool_parser, tokenizer, cfg.model.path)


def tool_parser_for(setting: str, tokenizer: Any = None, model_path: Any = None,
                    source: str = "rollout.tool_parser") -> tuple[str, str]:
    """(parser name, why) for a tool-format setting (`resolve_tool_parser`'s rule, for callers
    without a config: `agentrl sft`'s examples, `agentrl serve`): `setting` when it names a
    parser (why: `source`, where it was set); for `auto`, `detect_tool_parser` on `tokenizer`,
    else on the tokenizer of the directory `model_path`, else `hermes` (the embedded model).
    """
    if setting != "auto":
        return setting, source
    if tokenizer is not None:
        return detect_tool_parser(tokenizer)
    if model_path is None:
        return FALLBACK, "the embedded model's tool tokens <tool_call>, </tool_call>"
    return _detect_dir(str(model_path))
