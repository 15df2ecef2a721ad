"""Per-episode template drift (issue 38, `agentrl.rollout.drift`): every family's published
template renders a multi-turn tool episode exactly as the agent loop built it (history the
template rewrites by policy, Qwen3's and R1's dropped `<think>` blocks and Mistral's moved system
prompt, is not drift), while a template altered after sampling and a tokenizer that merges the
generation prompt with the sampled text are reported at the first differing position."""

from __future__ import annotations

import time

import pytest
from test_families import run_scripted

from agentrl.log.steps import rollout_metrics
from agentrl.models.families import FAMILIES, build_family_tokenizer
from agentrl.rollout.chat import ChatRenderer
from agentrl.rollout.drift import drift_line, episode_drift

NAMES = list(FAMILIES)


@pytest.fixture(scope="module")
def toks():
    return {n: build_family_tokenizer(FAMILIES[n]) for n in NAMES}


@pytest.mark.parametrize("name", NAMES)
def test_every_family_renders_its_episodes_without_drift(name, toks):
    """The agent loop records `template_drift: False` for a three-turn episode (system prompt,
    tool result, user message; the second answer thinks) of every family: Qwen3 and R1 drop the
    first turns' `<think>` when re-rendering, Mistral moves the system prompt, Gemma/Phi-3/Mistral
    render the tool result as a user turn, all as the renderer does or by policy."""
    r = ChatRenderer(toks[name])
    tr = run_scripted(toks[name], r)
    assert len(tr.turns) == 3 and tr.info["template_drift"] is False
    if name in ("qwen3", "deepseek_r1_distill", "mistral_v0_3"):
        assert r.rewrites_history  # ... and yet no drift: rewritten history is policy


def test_qwen3_without_thinking_and_template_history_mode_have_no_drift(toks):
    tok = toks["qwen3"]
    off = ChatRenderer(tok, template_kwargs={"enable_thinking": False})
    assert run_scripted(tok, off).info["template_drift"] is False
    templ = ChatRenderer(tok, history="template")
    tr = run_scripted(tok, templ)
    assert len(tr.turn_prompts) == 3 and tr.info["template_drift"] is False


def test_template_altered_after_sampling_is_drift_at_the_changed_token():
    """Qwen2.5's template renders a tool result as a `user` turn; changed to a `tool` turn after
    the episode was sampled, the region after turn 0 differs at its fourth id: end of turn
    (turns[0].end - 1), glue "\\n" (+0), `<|im_start|>` (+1), then `tool` instead of `user` (+2)."""
    tok = build_family_tokenizer(FAMILIES["qwen2_5"])
    r = ChatRenderer(tok)
    tr = run_scripted(tok, r)
    assert episode_drift(r, tr) is None
    assert tok.chat_template.count("'<|im_start|>user'") == 1  # the tool branch's
    tok.chat_template = tok.chat_template.replace("'<|im_start|>user'", "'<|im_start|>tool'")
    assert "<|im_start|>tool" in tok.chat_template
    d = episode_drift(r, tr)
    assert d is not None and d["turn"] == 0 and d["where"] == "after turn"
    t0 = tr.turns[0]
    assert d["position"] == t0.end + 2
    assert tr.token_ids[t0.end - 1: t0.end + 2] == [r.end_of_turn_id, *tok.encode("\n<|im_start|>")]
    assert tok.decode(tr.token_ids[d["position"]]) == "user"
    assert d["got"][0] == tr.token_ids[d["position"]]
    assert tok.decode(d["expected"]).startswith("tool")
    assert d["got_text"][:3] == ["\n", "<|im_start|>", "user"] and d["expected_text"][:2] == ["\n", "<|im_start|>"]


def test_generation_prompt_merging_with_the_sampled_text_is_drift(toks):
    """Qwen2.5's generation prompt ends with "\\n"; a turn that starts with "\\n" is, in the
    template's rendering, one "\\n\\n" token (this tokenizer has that merge) where the episode has
    two: drift at the generation prompt's "\\n", the last id before the turn (turns[0].start - 1)."""
    tok = toks["qwen2_5"]
    nn = tok.convert_tokens_to_ids("ĊĊ")
    assert isinstance(nn, int) and tok.encode("\n\n") == [nn]
    tr = run_scripted(tok, ChatRenderer(tok), answers=["\nhello", "fine", "done"])
    d = tr.info["template_drift"]
    t0 = tr.turns[0]
    assert d["turn"] == 0 and d["where"] == "generation prompt / sampled text"
    assert d["position"] == t0.start - 1
    assert tr.token_ids[t0.start - 1: t0.start + 1] == tok.encode("\n") * 2
    assert d["expected"][0] == nn and d["got"][:2] == tok.encode("\n") * 2
    ok = run_scripted(tok, ChatRenderer(tok), answers=["hello", "fine", "done"])
    m = rollout_metrics([tr, ok], lambda t: False)
    assert m["rollout/template_drift"] == 0.5  # one of the two episodes drifts


def test_episodes_without_turns_are_not_checked_and_the_check_is_cheap(toks):
    """A failed reset (no turns) carries no `template_drift` (no metric when nothing was
    checked); the check of a three-turn episode takes a few milliseconds (bound 50 ms, a shared
    2-core machine)."""
    from agentrl.types import Trajectory

    assert "rollout/template_drift" not in rollout_metrics([Trajectory()], lambda t: False)
    tok = toks["llama3_1"]
    r = ChatRenderer(tok)
    tr = run_scripted(tok, r)
    t0 = time.perf_counter()
    for _ in range(5):
        assert episode_drift(r, tr) is None
    assert (time.perf_counter() - t0) / 5 < 0.05


def test_the_training_loop_says_where_the_first_drift_is(toks):
    """`drift_line`: the count over the checked episodes and the first difference, said once
    per run by the training loop; None when no episode drifts."""
    tok = toks["qwen2_5"]
    ok = run_scripted(tok, ChatRenderer(tok), answers=["hello", "fine", "done"])
    assert drift_line([ok]) is None
    bad = run_scripted(tok, ChatRenderer(tok), answers=["\nhello", "fine", "done"])
    line = drift_line([ok, bad])
    p = bad.turns[0].start - 1
    assert line.startswith("[template] 1 of 2 episodes' ids differ from the chat template's rendering")
    assert (f"first: generation prompt / sampled text, turn 0, position {p}: template ['assistant', '\\n\\n', "
            "'hel', 'lo'] vs episode ['assistant', '\\n', '\\n', 'hel', 'lo']") in line


def test_show_prints_the_episode_s_drift(tmp_path, toks):
    """`agentrl show` of a saved episode that drifted names the place (from its info)."""
    import io
    import json

    from rich.console import Console

    from agentrl.log.show import show_episode

    tok = toks["qwen2_5"]
    bad = run_scripted(tok, ChatRenderer(tok), answers=["\nhello", "fine", "done"])
    tok.save_pretrained(tmp_path / "base_model")
    (tmp_path / "rollouts").mkdir()
    (tmp_path / "rollouts" / "step_1.jsonl").write_text(json.dumps(bad.to_dict()) + "\n")
    buf = io.StringIO()
    show_episode(tmp_path, 1, 0, Console(file=buf, width=300, color_system=None), plain=True)
    p = bad.turns[0].start - 1
    assert (f"template drift: generation prompt / sampled text, turn 0, position {p}: template "
            "['assistant', '\\n\\n', 'hel', 'lo'] vs episode ['assistant', '\\n', '\\n', 'hel', 'lo']") in buf.getvalue()
