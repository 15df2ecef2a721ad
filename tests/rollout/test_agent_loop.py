"""Token-in/token-out agent loop: exact ids, masks (M3, M4), rewards on the last sampled token,
turn limits, and failing envs recorded instead of raised."""

from __future__ import annotations

import gymnasium as gym
import pytest

from agentrl.env.base import TextEnv
from agentrl.rollout.agent_loop import EpisodeSpec, run_episodes
from agentrl.rollout.chat import ChatRenderer, render_ids
from agentrl.rollout.engines.base import SamplingParams
from agentrl.rollout.engines.scripted import ScriptedEngine


class EchoToolEnv(TextEnv):
    """Turn 1: the agent calls a tool -> a tool message; turn 2: the final answer ends it."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.turn = 0
        return [{"role": "user", "content": "find cats"}], {"task_id": "t0"}

    def step(self, action):
        self.turn += 1
        if self.turn == 1:
            return [{"role": "tool", "content": "cats: 3"}], 0.0, False, False, {}
        return [], 1.0 if "3" in action else 0.0, True, False, {"success": "3" in action}


class BrokenEnv(TextEnv):
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return [{"role": "user", "content": "hi"}], {}

    def step(self, action):
        raise RuntimeError("env exploded")


class ForeverEnv(TextEnv):
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return [{"role": "user", "content": "again"}], {}

    def step(self, action):
        return [{"role": "user", "content": "again"}], 0.5, False, False, {}


def scripted(tok, answers):
    it = iter(answers)
    return ScriptedEngine(tok, lambda prompt: next(it))


def params(r):
    return SamplingParams(temperature=1.0, max_tokens=64, stop_token_ids=r.stop_ids)


def test_multi_turn_ids_and_mask_match_chat_template(tiny_tokenizer):
    """M3: the trajectory's ids are exactly the ChatML rendering of the conversation, and the
    mask is 1 only on the sampled assistant content + <|im_end|> (not on the generation prompt,
    the newline glue, the tool or user turns)."""
    tok = tiny_tokenizer
    r = ChatRenderer(tok)
    call = '<tool_call>{"name": "search", "arguments": {"q": "cats"}}</tool_call>'
    eng = scripted(tok, [call, "there are 3"])
    [tr] = run_episodes(eng, r, [EchoToolEnv()], [EpisodeSpec({"seed": 0})], params(r))
    msgs = [{"role": "user", "content": "find cats"}, {"role": "assistant", "content": call},
            {"role": "tool", "content": "cats: 3"}, {"role": "assistant", "content": "there are 3"}]
    full = render_ids(tok, msgs, add_generation_prompt=False)
    assert tr.token_ids == full[:len(tr.token_ids)]
    assert full[len(tr.token_ids):] == r.glue_ids  # only the final newline glue is not rendered
    assert tr.messages == msgs
    im_end = r.end_of_turn_id
    sampled = [t for t, m in zip(tr.token_ids, tr.loss_mask) if m]
    expected = (tok.encode(call, add_special_tokens=False) + [im_end]
                + tok.encode("there are 3", add_special_tokens=False) + [im_end])
    assert sampled == expected
    assert tr.num_sampled == len(expected)
    # the reward of the final turn sits on its last sampled token (its <|im_end|>)
    rew = tr.token_rewards()
    assert rew[tr.turns[1].end - 1] == 1.0 and sum(rew) == 1.0
    assert tr.terminated and not tr.truncated
    # the generation prompt `<|im_start|>assistant\n` before each turn is context
    gen_prompt = render_ids(tok, msgs[:1], add_generation_prompt=True)[-3:]
    t0 = tr.turns[0].start
    assert tr.token_ids[t0 - 3:t0] == gen_prompt and tr.loss_mask[t0 - 3:t0] == [0, 0, 0]


def test_history_is_never_rerendered(tiny_tokenizer):
    """M4: the next turn's context is the previous context + sampled ids + delta, so it is a
    prefix-extension of what the sampler saw, whatever the template does to history."""
    tok = tiny_tokenizer
    r = ChatRenderer(tok)
    seen = []

    def policy(prompt):
        seen.append(list(prompt))
        return "<think>x</think>answer"

    eng = ScriptedEngine(tok, policy)
    env = gym.wrappers.TimeLimit(ForeverEnv(), 3)
    [tr] = run_episodes(eng, r, [env], [EpisodeSpec({"seed": 0})], params(r))
    assert len(seen) == 3
    for a, b in zip(seen, seen[1:]):
        assert b[:len(a)] == a
    assert tr.token_ids[:len(seen[-1])] == seen[-1]


def test_turn_limit_truncates_and_rewards_add_up(tiny_tokenizer):
    r = ChatRenderer(tiny_tokenizer)
    eng = ScriptedEngine(tiny_tokenizer, lambda p: "no")
    env = gym.wrappers.TimeLimit(gym.wrappers.TimeLimit(ForeverEnv(), 3), 10)  # G2: 3 wins
    [tr] = run_episodes(eng, r, [env], [EpisodeSpec({"seed": 0})], params(r))
    assert len(tr.turns) == 3 and tr.truncated and not tr.terminated
    assert tr.episode_return == pytest.approx(1.5)


def test_max_episode_tokens_truncates(tiny_tokenizer):
    r = ChatRenderer(tiny_tokenizer)
    eng = ScriptedEngine(tiny_tokenizer, lambda p: "no")
    [tr] = run_episodes(eng, r, [ForeverEnv()], [EpisodeSpec({"seed": 0})], params(r),
                        max_episode_tokens=60)
    assert tr.truncated and tr.info["truncated_by"] == "max_episode_tokens"
    assert len(tr.token_ids) <= 60 + 20  # at most one observation delta past the cap


def test_failing_env_is_recorded_not_raised(tiny_tokenizer):
    r = ChatRenderer(tiny_tokenizer)
    eng = ScriptedEngine(tiny_tokenizer, lambda p: "hello")
    trajs = run_episodes(eng, r, [BrokenEnv(), EchoToolEnv()],
                         [EpisodeSpec({"seed": 0}, 0), EpisodeSpec({"seed": 0}, 1)], params(r),
                         error_reward=-1.0)
    bad, good = trajs
    assert bad.terminated and bad.turns[0].reward == -1.0
    assert "env exploded" in bad.info["errors"][0]
    assert len(good.turns) == 2  # the other episode of the batch is unaffected


def test_truncated_turn_is_closed_with_end_of_turn(tiny_tokenizer):
    """A turn cut by max_tokens gets an <|im_end|> appended as context (mask 0)."""
    r = ChatRenderer(tiny_tokenizer)
    eng = ScriptedEngine(tiny_tokenizer, lambda p: "a b c d e f g h i j k l m n o p")
    env = gym.wrappers.TimeLimit(ForeverEnv(), 2)
    p = SamplingParams(max_tokens=4, stop_token_ids=r.stop_ids)
    [tr] = run_episodes(eng, r, [env], [EpisodeSpec({"seed": 0})], p)
    t0 = tr.turns[0]
    assert t0.finish_reason == "length" and t0.end - t0.start == 4
    assert tr.token_ids[t0.end] == r.end_of_turn_id and tr.loss_mask[t0.end] == 0
