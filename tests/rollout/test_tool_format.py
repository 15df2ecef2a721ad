"""`rollout.tool_parser`: `auto` picks the tool-call parser from the tokenizer (special tokens and
chat template text of each family: Qwen/Hermes, Llama-3.1/3.2, Mistral v0.3, and a template
with none, which falls back to hermes and says so); a name chooses one; `build_env` hands it
to an env whose constructor takes `parser` unless `env.kwargs.parser` is set; the embedded
model resolves to hermes without loading anything (today's runs unchanged).

The template strings are minimal snippets written here, in each family's published shape; the
real published templates are the fixtures of tests/fixtures/chat_templates/."""

from __future__ import annotations

import pytest

from agentrl.config import load_config
from agentrl.rollout.envs import build_env
from agentrl.rollout.tool_format import detect_tool_parser, resolve_tool_parser

QWEN = ("{%- if tools %}<|im_start|>system\n# Tools\n<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}"
        "</tools>\nreturn a json object within <tool_call></tool_call> XML tags{% endif %}"
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}")
LLAMA = ("{{- bos_token }}{% for m in messages %}{% if m.role == 'ipython' or m.role == 'tool' %}"
         "<|start_header_id|>ipython<|end_header_id|>\n\n{{ m.content }}<|eot_id|>{% else %}"
         "<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content }}<|eot_id|>{% endif %}{% endfor %}")
MISTRAL = ("{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}{% if tools %}[AVAILABLE_TOOLS] "
           "{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}[INST] {{ m.content }}[/INST]{% elif m.tool_calls %}"
           "[TOOL_CALLS] {{ m.tool_calls | tojson }}{{ eos_token }}{% else %}{{ m.content }}{{ eos_token }}"
           "{% endif %}{% endfor %}")
GEMMA = ("{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m.role == 'assistant' else m.role }}\n"
         "{{ m.content }}<end_of_turn>\n{% endfor %}")


def family_tokenizer(special: list[str], template: str | None, added: list[str] = ()):
    """A tokenizer with a few plain words, `special` as special tokens, `added` as added
    (non-special) tokens, and `template` as its chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    t = Tokenizer(models.WordLevel({"<unk>": 0, "hello": 1, "world": 2}, unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=t, unk_token="<unk>")
    tok.add_special_tokens({"additional_special_tokens": list(special)})
    tok.add_tokens(list(added))
    tok.chat_template = template
    return tok


LLAMA_SPECIAL = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>"]


@pytest.mark.parametrize("special, added, template, name, why", [
    (["<|im_start|>", "<|im_end|>"], ["<tool_call>", "</tool_call>"], QWEN, "hermes",
     "<tool_call> in the token and chat template"),                               # Qwen2.5 / Qwen3
    (["<|im_start|>", "<|im_end|>"], [], QWEN, "hermes", "<tool_call> in the chat template"),
    (LLAMA_SPECIAL + ["<|python_tag|>"], [], LLAMA, "llama3_json", "<|python_tag|> in the token"),  # Llama-3.1
    (LLAMA_SPECIAL, [], LLAMA, "llama3_json", "<|eot_id|> token and an ipython role"),  # no python_tag token
    (LLAMA_SPECIAL + ["<|python_tag|>"], ["<tool_call>", "</tool_call>"], LLAMA, "hermes",
     "<tool_call> in the token"),                                                 # Hermes-3-Llama-3.1
    (["[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]"], [],
     MISTRAL, "mistral", "[TOOL_CALLS] in the token and chat template"),           # Mistral v0.3
    (["<start_of_turn>", "<end_of_turn>"], [], GEMMA, "hermes", "no tool-call format recognised"),  # Gemma
    (LLAMA_SPECIAL, [], None, "hermes", "no tool-call format recognised"),        # eot_id, no ipython
], ids=["qwen", "qwen-template-only", "llama3.1", "llama-no-python_tag", "hermes3-llama", "mistral-v0.3",
        "gemma", "eot-without-ipython"])
def test_detect_tool_parser(special, added, template, name, why):
    got, reason = detect_tool_parser(family_tokenizer(special, template, added))
    assert got == name and why in reason


def test_named_templates_are_all_read():
    tok = family_tokenizer(["<|im_start|>"], None)
    tok.chat_template = {"default": GEMMA, "tool_use": "{{ '[TOOL_CALLS]' }}"}
    assert detect_tool_parser(tok)[0] == "mistral"


def test_the_embedded_tokenizer_is_hermes(tiny_tokenizer):
    assert detect_tool_parser(tiny_tokenizer) == ("hermes", "<tool_call> in the token and chat template")


def test_resolve_from_config(tmp_path):
    cfg = load_config(overrides=["env.name=web_qa"])
    assert cfg.rollout.tool_parser == "auto"
    # the embedded model: hermes, nothing loaded
    assert resolve_tool_parser(cfg) == ("hermes", "the embedded model's tool tokens <tool_call>, </tool_call>")
    family_tokenizer(LLAMA_SPECIAL + ["<|python_tag|>"], LLAMA).save_pretrained(tmp_path / "llama")
    cfg = load_config(overrides=["env.name=web_qa", f"model.path={tmp_path / 'llama'}"])
    assert resolve_tool_parser(cfg)[0] == "llama3_json"  # from the directory's tokenizer
    cfg = load_config(overrides=["env.name=web_qa", f"model.path={tmp_path / 'llama'}", "rollout.tool_parser=openai"])
    assert resolve_tool_parser(cfg) == ("openai", "rollout.tool_parser")
    with pytest.raises(Exception, match="tool_parser"):
        load_config(overrides=["rollout.tool_parser=pythonic"])


def test_build_env_passes_the_parser():
    env = build_env(load_config(overrides=["env.name=web_qa"]), "train")
    assert env.unwrapped.parser == "hermes"  # today's default, now explicit
    env = build_env(load_config(overrides=["env.name=web_qa", "rollout.tool_parser=mistral"]), "train")
    assert env.unwrapped.parser == "mistral"
    env = build_env(load_config(overrides=["env.name=web_qa", "rollout.tool_parser=mistral",
                                           "env.kwargs={parser: openai}"]), "train")
    assert env.unwrapped.parser == "openai"  # env.kwargs wins
    env = build_env(load_config(overrides=["env.name=toy", "rollout.tool_parser=mistral"]), "train")
    assert not hasattr(env.unwrapped, "parser")  # an env without tools gets nothing
