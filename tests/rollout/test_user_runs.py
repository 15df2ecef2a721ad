"""Observations that fall back to `user` on a template that refuses two user turns in a row
(Mistral v0.3's and Gemma-3's alternation checks): each run of them is merged into one user
message, texts joined by `USER_JOIN` (docs/models.md). Two tool results of one Mistral turn
used to end the episode with "conversation roles must alternate"."""

from __future__ import annotations

import json

import pytest

from agentrl.env.base import TextEnv
from agentrl.models.families import FAMILIES, build_family_tokenizer
from agentrl.rollout.agent_loop import EpisodeSpec, run_episodes
from agentrl.rollout.chat import ChatRenderer
from agentrl.rollout.engines.base import SamplingParams
from agentrl.rollout.engines.scripted import ScriptedEngine
from agentrl.rollout.roles import USER_JOIN, merge_user_runs
from agentrl_envs.web_qa import WebQAEnv


@pytest.fixture(scope="module")
def mistral():
    return build_family_tokenizer(FAMILIES["mistral_v0_3"])


def test_merge_user_runs_values():
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "a", "name": "search"},
            {"role": "user", "content": "b"}, {"role": "assistant", "content": "x"},
            {"role": "user", "content": [{"type": "text", "text": "c"}]}, {"role": "user", "content": "d"}]
    assert merge_user_runs(msgs) == [
        {"role": "system", "content": "s"}, {"role": "user", "content": "a\n\nb"},
        {"role": "assistant", "content": "x"},
        {"role": "user", "content": [{"type": "text", "text": "c"}, {"type": "text", "text": "\n\n"},
                                     {"type": "text", "text": "d"}]}]
    assert USER_JOIN == "\n\n"
    one = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    assert merge_user_runs(one) == one


def _run(tok, renderer, env, answers, seed=0, options=None):
    it = iter(answers)
    engine = ScriptedEngine(tok, lambda prompt: next(it))
    p = SamplingParams(temperature=1.0, max_tokens=256, stop_token_ids=renderer.stop_ids)
    return run_episodes(engine, renderer, [env], [EpisodeSpec({"seed": seed, "options": options})], p)[0]


def test_two_tool_results_of_one_mistral_turn_are_answered(mistral):
    """web_qa with the `mistral` tool format, the real Mistral v0.3 template: one turn calls
    `search` twice; both results come back in ONE user turn, the episode goes on to the answer,
    the trained ids are the sampled ones (mask 1 there only) and the template drift is 0."""
    tok, r = mistral, ChatRenderer(mistral)
    env = WebQAEnv(parser="mistral")
    task = env.questions[0]
    calls = [{"name": "search", "arguments": {"query": "Velmora Instruments founder"}},
             {"name": "search", "arguments": {"query": "born in the village"}}]
    answers = ["[TOOL_CALLS] " + json.dumps(calls), f"Answer: {task['answers'][0]}"]
    tr = _run(tok, r, env, answers, options={"task": task["id"]})
    assert not tr.info.get("errors"), tr.info.get("errors")  # was: "roles must alternate"
    assert len(tr.turns) == 2 and tr.terminated and tr.turns[-1].reward == 1.0
    results = [m["content"] for m in tr.messages if m["role"] == "tool"]
    assert len(results) == 2 and results[0] != results[1]
    assert all("Velmora" in x or "village" in x for x in results) and "Error" not in "".join(results)
    # the region between the turns: end of turn, then one user turn holding both results
    between = tok.decode(tr.token_ids[tr.turns[0].end: tr.turns[1].start], skip_special_tokens=False)
    assert between == f"[INST] {results[0]}{USER_JOIN}{results[1]}[/INST]"
    assert between.count("[INST]") == 1
    # token-in/token-out: sampled ids as the sampler produced them, loss on them only
    assert tr.token_ids[tr.turns[0].start: tr.turns[0].end] == (
        tok.encode(answers[0], add_special_tokens=False) + [r.end_of_turn_id])
    sampled = {k for t in tr.turns for k in range(t.start, t.end)}
    assert [i for i, m in enumerate(tr.loss_mask) if m] == sorted(sampled)
    assert tr.info["template_drift"] is False


def test_history_template_renders_the_merged_results(mistral):
    """`rollout.history=template` renders each prompt from the messages: the same merge."""
    r = ChatRenderer(mistral, history="template")
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"},
            {"role": "assistant", "content": "call"},
            {"role": "tool", "content": "r1", "name": "search"}, {"role": "tool", "content": "r2"}]
    text = mistral.decode(r.prompt_ids(msgs), skip_special_tokens=False)
    assert text == "<s>[INST] Q[/INST] call</s>[INST] S\n\nr1\n\nr2[/INST]"


class TwoUsersEnv(TextEnv):
    """Answers the first turn with two user messages in a row, then ends."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.turn = 0
        return [{"role": "user", "content": "Start."}], {}

    def step(self, action):
        self.turn += 1
        if self.turn == 1:
            return [{"role": "user", "content": "Hint one."}, {"role": "user", "content": "Hint two."}], 0.0, False, False, {}
        return [], 1.0, True, False, {}


@pytest.mark.parametrize("name, between", [
    ("mistral_v0_3", "[INST] Hint one.\n\nHint two.[/INST]"),
    ("gemma3", "\n<start_of_turn>user\nHint one.\n\nHint two.<end_of_turn>\n<start_of_turn>model\n"),
    # (glue "\n" after the end of turn) a template that accepts users in a row keeps them apart
    ("qwen2_5", "\n<|im_start|>user\nHint one.<|im_end|>\n<|im_start|>user\nHint two.<|im_end|>\n"
                "<|im_start|>assistant\n"),
])
def test_env_sending_two_user_messages(name, between):
    tok = build_family_tokenizer(FAMILIES[name])
    r = ChatRenderer(tok)
    tr = _run(tok, r, TwoUsersEnv(), ["first", "second"])
    assert not tr.info.get("errors"), tr.info.get("errors")
    assert len(tr.turns) == 2 and tr.terminated
    got = tok.decode(tr.token_ids[tr.turns[0].end: tr.turns[1].start], skip_special_tokens=False)
    assert got == between
    assert tr.info["template_drift"] is False


def test_opening_with_two_user_messages_is_merged(mistral):
    r = ChatRenderer(mistral)
    msgs = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    assert mistral.decode(r.prompt_ids(msgs), skip_special_tokens=False) == "<s>[INST] a\n\nb[/INST]"
