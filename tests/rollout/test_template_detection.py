"""Auto-detection on the published templates (issue 38): for every chat template kept in
tests/fixtures/chat_templates/, with its family's tokenizer (`build_family_tokenizer`: the
family's special tokens), `rollout.tool_parser=auto` picks the model's own tool-call format and
the renderer's history check says whether (and how) the template rewrites history. A fixture
added without a row here fails `test_every_fixture_has_a_row`."""

from __future__ import annotations

import pytest

from agentrl.models.families import FAMILIES, TEMPLATE_DIR, build_family_tokenizer
from agentrl.rollout.chat import ChatRenderer
from agentrl.rollout.tool_format import detect_tool_parser

THINK = "drops the <think> blocks"
MOVED = "renders an earlier assistant turn or the system prompt differently"

# template file: (tool parser, why contains, rewrites history, note contains, note lacks)
TABLE = {
    "qwen2_5.jinja": ("hermes", "<tool_call> in the token and chat template", False, "", None),
    "qwen3.jinja": ("hermes", "<tool_call> in the token and chat template", True, THINK, MOVED),
    "llama3_1.jinja": ("llama3_json", "<|python_tag|> in the token and chat template", False, "", None),
    "llama3_2.jinja": ("llama3_json", "<|python_tag|> in the token", False, "", None),
    "mistral_v0_3.jinja": ("mistral", "[TOOL_CALLS] in the token and chat template", True, MOVED, THINK),
    "gemma3.jinja": ("hermes", "no tool-call format recognised", False, "", None),
    "phi3.jinja": ("hermes", "no tool-call format recognised", False, "", None),
    # R1's own tool tokens (<｜tool▁calls▁begin｜>) have no parser: the fallback, said so
    "deepseek_r1_distill.jinja": ("hermes", "no tool-call format recognised", True, THINK, None),
}
FAMILY_OF = {f.template: f for f in FAMILIES.values()}


def test_every_fixture_has_a_row():
    assert sorted(p.name for p in TEMPLATE_DIR.glob("*.jinja")) == sorted(TABLE)
    assert sorted(FAMILY_OF) == sorted(TABLE)


@pytest.fixture(scope="module")
def toks():
    return {name: build_family_tokenizer(FAMILY_OF[name]) for name in TABLE}


@pytest.mark.parametrize("template", sorted(TABLE))
def test_tool_format_and_history_policy_detection(template, toks):
    parser, why, rewrites, note, lacks = TABLE[template]
    tok = toks[template]
    assert tok.chat_template == (TEMPLATE_DIR / template).read_text(encoding="utf-8")
    got, reason = detect_tool_parser(tok)
    assert got == parser and why in reason
    r = ChatRenderer(tok)
    assert r.rewrites_history is rewrites
    assert note in r.history_note and (lacks is None or lacks not in r.history_note)
    assert (r.history_note == "") is (not rewrites)


@pytest.mark.parametrize("thinking", [True, False])
def test_qwen3_rewrites_history_with_thinking_on_and_off(thinking, toks):
    """`enable_thinking=false` puts an empty think block in the generation prompt; earlier
    turns' think blocks are still dropped: the history check says so either way."""
    r = ChatRenderer(toks["qwen3.jinja"], template_kwargs={"enable_thinking": thinking})
    assert r.rewrites_history and THINK in r.history_note
