"""Role fallbacks over whole conversations (docs/models.md, "How the renderer reads a template").

A template that refuses the system role (Gemma-2: `raise_exception('System role not
supported')`) gets the system message folded into the first user message (`fold_system`:
system text, `SYSTEM_JOIN`, user text) in opening prompts, `rollout.history=template` prompts,
the history check and the drift check; `agentrl train model.path=DIR` crashed in `sft_examples`
and every episode was a reset error. An opening with two user messages on a template that
refuses users in a row (Mistral v0.3, Gemma-3) was merged by the renderer but not by the drift
check: a false 100 % `rollout/template_drift`."""

from __future__ import annotations

import json

import pytest
from test_families import ANSWERS, run_scripted
from test_user_runs import _run
from typer.testing import CliRunner

from agentrl.cli import app
from agentrl.config import load_config
from agentrl.env.base import TextEnv
from agentrl.models.families import FAMILIES, build_family, build_family_tokenizer
from agentrl.rollout.chat import ChatRenderer, render_ids
from agentrl.rollout.drift import episode_drift
from agentrl.rollout.envs import build_env
from agentrl.rollout.model_doctor import format_report, inspect_model, system_role
from agentrl.rollout.roles import SYSTEM_JOIN, USER_JOIN, fold_system, role_fallbacks
from agentrl.sft import sft_examples
from agentrl.startup_model import check_chat_template

# Mirrors the chat template published with google/gemma-2-9b-it (tokenizer_config.json), which
# tests/fixtures/chat_templates does not hold: a system message first raises, roles must alternate,
# contents are trimmed. Rendered with the Gemma-3 family tokenizer (the same control tokens).
GEMMA2 = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}"
    "{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}"
    "{% else %}{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}")


@pytest.fixture(scope="module")
def gemma2():
    tok = build_family_tokenizer(FAMILIES["gemma3"])
    tok.chat_template = GEMMA2
    return tok


def test_fold_system_values():
    assert SYSTEM_JOIN == "\n\n"
    s, u = {"role": "system", "content": "S"}, {"role": "user", "content": "U", "name": "x"}
    a = {"role": "assistant", "content": "A"}
    assert fold_system([s, u, a]) == [{"role": "user", "content": "S\n\nU"}, a]
    assert fold_system([s, {"role": "system", "content": "T"}, u]) == [{"role": "user", "content": "S\n\nT\n\nU"}]
    assert fold_system([s, a]) == [{"role": "user", "content": "S"}, a]  # no user message after it
    parts = {"role": "user", "content": [{"type": "text", "text": "U"}]}
    assert fold_system([s, parts]) == [{"role": "user", "content": [
        {"type": "text", "text": "S"}, {"type": "text", "text": "\n\n"}, {"type": "text", "text": "U"}]}]
    assert fold_system([u, a]) == [u, a]
    # the order every path tries: as is, roles as user, merged, folded, folded and merged
    t = {"role": "tool", "content": "R"}
    assert role_fallbacks([s, u, t]) == [
        [s, u, t], [s, u, {**t, "role": "user"}], [s, {"role": "user", "content": "U\n\nR"}],
        [{"role": "user", "content": "S\n\nU"}, {**t, "role": "user"}],
        [{"role": "user", "content": "S\n\nU\n\nR"}]]
    assert role_fallbacks([u, a]) == [[u, a]]


def test_gemma2_opening_is_the_template_s_rendering_of_the_folded_messages(gemma2):
    r = ChatRenderer(gemma2)
    msgs = [{"role": "system", "content": "Use the calculator."}, {"role": "user", "content": "What is 2 + 3?"}]
    with pytest.raises(Exception, match="System role not supported"):
        render_ids(gemma2, msgs, add_generation_prompt=True)
    folded = [{"role": "user", "content": "Use the calculator.\n\nWhat is 2 + 3?"}]
    ids = r.prompt_ids(msgs)
    assert ids == render_ids(gemma2, folded, add_generation_prompt=True)
    assert gemma2.decode(ids, skip_special_tokens=False) == (
        "<bos><start_of_turn>user\nUse the calculator.\n\nWhat is 2 + 3?<end_of_turn>\n<start_of_turn>model\n")
    # the messages rendered, memoised with the ids (the drift check reads them)
    assert r.prompt_render(msgs) == r.prompt_render(msgs) == (ids, folded)
    assert r.prompt_render(folded) == (ids, folded)
    # the history check runs on the folded conversation: no rewrite (was: "yes: could not be checked")
    assert r.rewrites_history is False and r.history_note == ""
    assert system_role(r) == ("refused (TemplateError: System role not supported); "
                              "agentrl folds it into the first user turn")


@pytest.mark.parametrize("history", ["exact", "template"])
def test_gemma2_episode_trains_the_sampled_ids_with_no_drift(gemma2, history):
    """The three-turn episode (system prompt, tool result, user message): the opening folded,
    the tool result as a user turn, each turn's ids as sampled, drift 0; with
    `rollout.history=template` each turn's prompt is the template's rendering of the folded
    messages so far."""
    r = ChatRenderer(gemma2, history=history)
    tr = run_scripted(gemma2, r)
    assert not tr.info.get("errors") and len(tr.turns) == 3 and tr.terminated
    assert tr.info["template_drift"] is False
    for t, answer in zip(tr.turns, ANSWERS):
        assert tr.token_ids[t.start:t.end] == gemma2.encode(answer, add_special_tokens=False) + [r.end_of_turn_id]
    conv = [{"role": "user", "content": "Use the calculator.\n\nWhat is 2 + 3?"},
            {"role": "assistant", "content": ANSWERS[0]}, {"role": "user", "content": "sum = 5"},
            {"role": "assistant", "content": ANSWERS[1]}, {"role": "user", "content": "Answer now."}]
    if history == "exact":
        assert tr.token_ids[: tr.turns[2].start] == render_ids(gemma2, conv, add_generation_prompt=True)
    else:
        assert tr.turn_prompts == [render_ids(gemma2, conv[:k], add_generation_prompt=True) for k in (1, 3, 5)]


def test_gemma2_warm_start_on_code_sandbox_and_the_start_up_check(gemma2, tmp_path):
    """What `agentrl train model.path=DIR` crashed on: code_sandbox's opening (a system message)
    in `sft_examples`; the start-up check accepts the directory and `agentrl doctor --model`
    says the history check's verdict."""
    cfg = load_config(None, ["env.name=code_sandbox", "seed=0"])
    env = build_env(cfg, "train")
    r = ChatRenderer(gemma2)
    try:
        [ex] = sft_examples(env, r, 1, seed=0)
        obs, _ = env.reset(seed=0)
    finally:
        env.close()
    assert [m["role"] for m in obs][:2] == ["system", "user"]
    folded = [{"role": "user", "content": obs[0]["content"] + SYSTEM_JOIN + obs[1]["content"]}, *obs[2:]]
    assert ex.token_ids[: ex.turns[0].start] == render_ids(gemma2, folded, add_generation_prompt=True)
    d = tmp_path / "gemma2"
    build_family("gemma3", d, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
    (d / "chat_template.jinja").write_text(GEMMA2)
    cfg = load_config(None, ["env.name=code_sandbox", f"model.path={d}", "sft.steps=0", f"out={tmp_path / 'o'}"])
    check_chat_template(cfg, d)
    rep = inspect_model(d)
    assert rep["rewrites_history"] is False
    assert "rewrites history: no" in format_report(rep)


def test_agentrl_train_on_a_gemma2_model_dir_trains_with_no_drift(tmp_path):
    """`agentrl train --env code_sandbox model.path=DIR` (DIR: a tiny Gemma-3-family model whose
    template is Gemma-2's): the warm start trains, every episode samples its turn (no reset
    error) and `rollout/template_drift` is 0."""
    d = tmp_path / "gemma2"
    build_family("gemma3", d, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
    (d / "chat_template.jinja").write_text(GEMMA2)
    out = tmp_path / "out"
    res = CliRunner().invoke(app, [
        "train", "--env", "code_sandbox", f"model.path={d}", f"out={out}", "train.steps=1", "sft.steps=1",
        "sft.batch_size=2", "rollout.tasks_per_step=2", "algo.group_size=2", "train.eval_tasks=2",
        "train.eval_samples=1", "rollout.max_tokens=16"], terminal_width=400)
    assert res.exit_code == 0, res.output
    assert "could not be checked" not in res.output and "System role" not in res.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["sft_loss_first"] > 0 and summary["eval_after"]["turns_mean"] == 1.0
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["rollout/template_drift"] for m in metrics if "rollout/template_drift" in m] == [0.0]
    eps = [json.loads(line) for line in (out / "rollouts" / "step_1.jsonl").read_text().splitlines()]
    assert len(eps) == 4 and all(e["info"]["num_turns"] == 1 and e["info"]["template_drift"] is False for e in eps)


def test_a_history_check_that_cannot_run_claims_neither(gemma2):
    """A template that refuses the folded conversation too (here: any user text with a blank
    line) leaves the history check unable to run: `rewrites_history` None, and the doctor's line
    says it could not be checked (it read "yes: could not be checked")."""
    tok = build_family_tokenizer(FAMILIES["gemma3"])
    tok.chat_template = GEMMA2.replace(
        "{% for message in messages %}",
        "{% for message in messages %}{% if '\n\n' in message['content'] %}"
        "{{ raise_exception('No blank lines') }}{% endif %}", 1)
    r = ChatRenderer(tok)
    assert r.rewrites_history is None
    assert r.history_note == "could not be checked (TemplateError: System role not supported)"
    rep = {"path": "p", "tokenizer_class": "T", "end_of_turn": (r.end_of_turn_id, "<end_of_turn>"),
           "glue": "\n", "stop": [], "rewrites_history": r.rewrites_history, "history_note": r.history_note,
           "system_role": "x", "boundary_merges": [], "tool_parser": "hermes", "tool_parser_why": "w",
           "vocabulary": {"tokenizer": 1, "verdict": "ok"}}
    assert "rewrites history: could not be checked (TemplateError: System role not supported)" in format_report(rep)


class TwoUserOpeningEnv(TextEnv):
    """An opening of a system message and two user messages; one observation; the end."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.turn = 0
        return [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Task."},
                {"role": "user", "content": "Hint."}], {}

    def step(self, action):
        self.turn += 1
        if self.turn == 1:
            return [{"role": "user", "content": "Again."}], 0.0, False, False, {}
        return [], 1.0, True, False, {}


@pytest.mark.parametrize("name, opening", [
    ("mistral_v0_3", "<s>[INST] Be brief.\n\nTask.\n\nHint.[/INST]"),  # (the system prompt: in the last user turn)
    ("gemma3", "<bos><start_of_turn>user\nBe brief.\n\nTask.\n\nHint.<end_of_turn>\n<start_of_turn>model\n"),
    ("qwen2_5", "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nTask.<|im_end|>\n"
                "<|im_start|>user\nHint.<|im_end|>\n<|im_start|>assistant\n"),  # users in a row: apart
])
def test_an_opening_with_two_user_messages_has_no_drift(name, opening):
    """Mistral v0.3 and Gemma-3 refuse two user turns in a row: the opening is merged (texts
    joined by USER_JOIN) and the drift check renders the same merge (it said "template refuses
    the messages ... roles must alternate", 100 % drift); Qwen2.5 keeps them apart."""
    tok = build_family_tokenizer(FAMILIES[name])
    r = ChatRenderer(tok)
    tr = _run(tok, r, TwoUserOpeningEnv(), ["first", "second"])
    assert not tr.info.get("errors") and len(tr.turns) == 2 and tr.terminated
    assert tok.decode(tr.token_ids[: tr.turns[0].start], skip_special_tokens=False) == opening
    assert (USER_JOIN.join(["Task.", "Hint."]) in opening) is (name != "qwen2_5")
    assert tr.info["template_drift"] is False
    assert episode_drift(r, tr) is None  # uncached, too


class ObservationEnv(TextEnv):
    """Opens with `opening`; answers the first turn with `after`, then ends."""

    def __init__(self, opening, after):
        super().__init__()
        self.opening, self.after = opening, after

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.turn = 0
        return [dict(m) for m in self.opening], {}

    def step(self, action):
        self.turn += 1
        if self.turn == 1:
            return [dict(m) for m in self.after], 0.0, False, False, {}
        return [], 1.0, True, False, {}


@pytest.mark.parametrize("template", ["gemma3", "gemma2"])
@pytest.mark.parametrize("second", ["tool", "system"])
def test_observation_ending_in_another_role_on_a_parity_template(template, second, gemma2):
    """Templates that check alternation by index parity (Gemma-2, Gemma-3) accept `[user, tool]`
    or `[user, system]` after an assistant turn as two turns, then refuse the next assistant
    turn: the episode got a `<start_of_turn>tool` turn and the drift check 100 % drift (trial 3).
    An observation must leave room for the next turn, so the fallbacks go on to one user turn:
    the texts joined, drift 0."""
    tok = gemma2 if template == "gemma2" else build_family_tokenizer(FAMILIES["gemma3"])
    r = ChatRenderer(tok)
    env = ObservationEnv([{"role": "user", "content": "Start."}],
                         [{"role": "user", "content": "More."}, {"role": second, "content": "Note."}])
    tr = _run(tok, r, env, ["first", "second"])
    assert not tr.info.get("errors"), tr.info.get("errors")
    assert len(tr.turns) == 2 and tr.terminated
    between = tok.decode(tr.token_ids[tr.turns[0].end: tr.turns[1].start], skip_special_tokens=False)
    assert between == "\n<start_of_turn>user\nMore.\n\nNote.<end_of_turn>\n<start_of_turn>model\n"
    assert tr.info["template_drift"] is False


@pytest.mark.parametrize("name", ["mistral_v0_3", "gemma3"])
def test_an_opening_of_one_system_message_keeps_its_text(name, gemma2):
    """Mistral's template moves the system text into the last user turn, so with no user message
    it rendered `<s>` alone: the text was dropped (trial 3). A dropped system message goes on
    through the fallbacks (folded: a system message no user follows renders as a user turn)."""
    tok = build_family_tokenizer(FAMILIES[name])
    r = ChatRenderer(tok)
    opening = [{"role": "system", "content": "Solve the task."}]
    assert "Solve the task." in tok.decode(r.prompt_ids(opening), skip_special_tokens=False)
    tr = _run(tok, r, ObservationEnv(opening, [{"role": "user", "content": "Again."}]), ["first", "second"])
    assert not tr.info.get("errors"), tr.info.get("errors")
    assert tr.info["template_drift"] is False
