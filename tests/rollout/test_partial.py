"""Partial rollouts (`rollout.partial`): a weight push lands at a token boundary of a running
generation, which resumes from its prefix with the new weights. Checked against a reference
decoder written independently of the engine (a full forward per token, no KV cache, the weights
switched at given positions): same ids, same logprobs, versions per token at the switch
positions; per-token staleness and the `max_staleness` bound on the oldest token."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch

from agentrl.config import ConfigError, load_config
from agentrl.models.sampling import row_uniforms, sample_next
from agentrl.models.tiny import chat_stop_ids, load_model, render_ids
from agentrl.rollout.agent_loop import turn_samples
from agentrl.rollout.engines.base import SamplingParams, row_seeds
from agentrl.rollout.engines.hf import HFEngine
from agentrl.rollout.source import AsyncSource, LockedEngine
from agentrl.rollout.stages import drop_stale
from agentrl.types import Trajectory

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def weights(tiny_model_dir):
    """Three weight sets: A (the model's), B and C (A plus seeded noise, far enough apart that
    they sample other tokens)."""
    model, _ = load_model(tiny_model_dir)
    a = {k: v.detach().clone() for k, v in model.state_dict().items()}
    out = [a]
    for seed in (1, 2):
        g = torch.Generator().manual_seed(seed)
        out.append({k: v + 0.5 * v.std().nan_to_num(0.0) * torch.randn(v.shape, generator=g)
                    if v.is_floating_point() and v.numel() > 1 else v.clone() for k, v in a.items()})
    return out


@pytest.fixture(scope="module")
def prompts(tiny_model_dir):
    _, tok = load_model(tiny_model_dir)
    return [render_ids(tok, [{"role": "user", "content": "Write a Python function."}], add_generation_prompt=True),
            render_ids(tok, [{"role": "user", "content": "cats"}], add_generation_prompt=True),
            tok.encode("def add_seven(x):", add_special_tokens=False)], chat_stop_ids(tok)


def reference(model, weights, switches, prompt, seed, params):
    """Tokens, logprobs and versions of one row decoded token by token with a full forward (no
    cache), version v's weights from position `switches[v - 1]` on, the row's draws
    `row_uniforms(seed, t)`: what an engine with those weight switches produces."""
    ids, lps, vers, loaded = [], [], [], None
    for t in range(params.max_tokens):
        v = sum(t >= p for p in switches)
        if v != loaded:
            model.load_state_dict(weights[v])
            loaded = v
        with torch.no_grad():
            logits = model(torch.tensor([prompt + ids])).logits[:, -1].float()
        u = None if params.temperature == 0 else row_uniforms(torch.tensor([seed]), t)
        tok, lp = sample_next(logits, params.temperature, params.top_p, u)
        ids.append(int(tok[0]))
        lps.append(float(lp[0]))
        vers.append(v)
        if ids[-1] in params.stop_token_ids:
            break
    return ids, lps, vers


class Switches:
    """A `weight_poll` that loads version v's weights at its `at[v - 1]`-th call, i.e. after the
    token at position `at[v - 1] - 1` (one call per decode step: call k follows token k - 1)."""

    def __init__(self, engine, weights, at, change=True):
        self.engine, self.weights, self.at, self.change, self.calls = engine, weights, list(at), change, 0

    def __call__(self) -> bool:
        self.calls += 1
        if self.calls not in self.at:
            return False
        if self.change:
            v = self.at.index(self.calls) + 1
            self.engine.update_weights(self.weights[v], v)
        return True


@pytest.mark.parametrize("static, temperature, top_p", [(True, 1.0, 1.0), (False, 1.0, 1.0), (True, 0.8, 0.9)])
def test_interrupted_twice_equals_switches_at_those_positions(tiny_model_dir, weights, prompts, static,
                                                              temperature, top_p):
    prompt_list, stop = prompts
    params = SamplingParams(temperature=temperature, top_p=top_p, max_tokens=20, stop_token_ids=stop, n=2, seed=123)
    engine = HFEngine(tiny_model_dir, torch_threads=1, static_decode=static)
    engine.update_weights(weights[0], 0)
    p1, p2 = 5, 12
    engine.weight_poll = Switches(engine, weights, [p1, p2])
    outs = engine.generate(prompt_list, params)
    assert engine.policy_version == 2
    model, _ = load_model(tiny_model_dir)
    seeds = row_seeds(prompt_list, params.n, params.seed)
    differs = 0
    for r, out in enumerate(outs):
        ids, lps, vers = reference(model, weights, [p1, p2], prompt_list[r // params.n], seeds[r], params)
        assert out.token_ids == ids, r  # nothing sampled twice, nothing lost
        assert out.logprobs == pytest.approx(lps, abs=2e-4), r  # the new weights' logprobs after a switch
        assert out.versions == vers == [0] * min(len(ids), p1) + [1] * max(0, min(len(ids), p2) - p1) \
            + [2] * max(0, len(ids) - p2), r
        assert out.finish_reason == ("stop" if ids[-1] in stop else "length")
        plain, _, _ = reference(model, weights, [], prompt_list[r // params.n], seeds[r], params)
        differs += plain != ids
    assert differs >= 3  # the switches changed the tokens: the check can fail
    assert sum(len(o.token_ids) > p2 for o in outs) >= 2  # rows went through both switches


class Kill(Exception):
    """The process dies inside an interrupted generation."""


def test_killed_interrupted_generation_regenerates_from_its_seed(tiny_model_dir, weights, prompts):
    """A generation killed after its first switch is regenerated from the checkpoint's weights
    (A) and the same seed: with the switches at the same positions it gives the reference's
    tokens, on a fresh engine and on the killed one (nothing of the killed call is kept)."""
    prompt_list, stop = prompts
    params = SamplingParams(max_tokens=16, stop_token_ids=stop, n=2, seed=5)
    p1, p2 = 4, 9
    killed = HFEngine(tiny_model_dir, torch_threads=1)
    killed.update_weights(weights[0], 0)
    switches = Switches(killed, weights, [p1])

    def dies() -> bool:
        if switches.calls == p1 + 2:
            raise Kill()
        return switches()

    killed.weight_poll = dies
    with pytest.raises(Kill):
        killed.generate(prompt_list, params)
    assert killed.policy_version == 1
    model, _ = load_model(tiny_model_dir)
    seeds = row_seeds(prompt_list, params.n, params.seed)
    want = [reference(model, weights, [p1, p2], prompt_list[r // 2], seeds[r], params)[:2] for r in range(6)]
    fresh = HFEngine(tiny_model_dir, torch_threads=1)
    for engine in (fresh, killed):  # resumed: the checkpoint's weights, version 0
        engine.update_weights(weights[0], 0)
        engine.weight_poll = Switches(engine, weights, [p1, p2])
        outs = engine.generate(prompt_list, params)
        assert [o.token_ids for o in outs] == [ids for ids, _ in want]
        for o, (_, lps) in zip(outs, want):
            assert o.logprobs == pytest.approx(lps, abs=2e-4)


def test_interruption_without_new_weights_changes_nothing(tiny_model_dir, prompts):
    """Stopping and re-prefilling with the same weights gives the uninterrupted tokens."""
    prompt_list, stop = prompts
    params = SamplingParams(max_tokens=24, stop_token_ids=stop, n=2, seed=7)
    engine = HFEngine(tiny_model_dir, torch_threads=1)
    plain = engine.generate(prompt_list, params)
    engine.weight_poll = Switches(engine, None, [1, 6, 7, 23], change=False)
    cut = engine.generate(prompt_list, params)
    for a, b in zip(plain, cut):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
        assert b.versions == a.versions == [0] * len(a.token_ids)


def test_async_push_lands_mid_generation(tiny_model_dir, weights, prompts):
    """The real pipeline: an actor thread generates through `LockedEngine`, the learner pushes
    while it is at its first token boundary, `AsyncSource.poll_weights` applies the push inside
    the running call (the engine lock is re-entered, no deadlock) and the rest of the row is
    sampled by version 1."""
    prompt_list, stop = prompts
    params = SamplingParams(max_tokens=16, stop_token_ids=[], seed=11)
    hf = HFEngine(tiny_model_dir, torch_threads=1)
    hf.update_weights(weights[0], 0)
    engine = LockedEngine(hf)
    at_boundary, pushed = threading.Event(), threading.Event()

    def poll() -> bool:
        if not at_boundary.is_set():
            at_boundary.set()
            assert pushed.wait(30)
        return src.poll_weights()

    def run_batch(s):
        (c,) = engine.generate([prompt_list[0]], params)
        tr = Trajectory(policy_version=0)
        tr.append_context(prompt_list[0])
        tr.append_sampled(c.token_ids, c.logprobs, c.versions)
        return [tr]

    hf.weight_poll = poll
    src = AsyncSource(run_batch, engine.update_weights, start=0, version=0, max_staleness=1, end=1)
    try:
        assert at_boundary.wait(30)
        src.push_weights(weights[1], 1)
        pushed.set()
        (tr,), _ = src.next_batch(0)
    finally:
        src.close()
    model, _ = load_model(tiny_model_dir)
    ids, lps, vers = reference(model, weights, [1], prompt_list[0], row_seeds([prompt_list[0]], 1, 11)[0], params)
    assert tr.token_ids[len(prompt_list[0]):] == ids
    assert tr.sampler_logprobs[len(prompt_list[0]):] == pytest.approx(lps, abs=2e-4)
    assert tr.sampled_versions() == vers == [0] + [1] * 15
    assert tr.oldest_version == 0 and hf.policy_version == 1


def _traj(versions_per_turn, start_version):
    tr = Trajectory(policy_version=start_version)
    for vs in versions_per_turn:
        tr.append_context([1, 2])
        tr.append_sampled([3] * len(vs), [-0.5] * len(vs), vs)
    return tr


def test_staleness_per_token_and_oldest_token_bound():
    """Learner at version 6, max_staleness 2: an episode whose oldest token is version 3 is
    dropped even though most of its tokens are fresh; one that started at version 3 but
    sampled its first token with version 4 is kept (staleness is the tokens', not the start's)."""
    old = _traj([[3, 5], [6, 6]], 3)  # oldest token: 6 - 3 = 3 > 2
    fresh = _traj([[4, 4, 5]], 3)  # started at 3, tokens from 4 on: 2
    legacy = Trajectory(policy_version=5, token_ids=[1, 3], loss_mask=[0, 1], sampler_logprobs=[0.0, -1.0])
    lp = SimpleNamespace(version=6, cfg=SimpleNamespace(train=SimpleNamespace(max_staleness=2)))
    m: dict[str, float] = {}
    kept = drop_stale(lp, [old, fresh, legacy], m)
    assert kept == [fresh, legacy]
    tokens = [3, 1, 0, 0, 2, 2, 1, 1]  # per sampled token: old's four, fresh's three, legacy's one
    assert m["rollout/staleness_tokens_mean"] == pytest.approx(sum(tokens) / 8)
    assert m["rollout/staleness_tokens_max"] == 3.0
    assert m["rollout/staleness_max"] == 3.0 and m["rollout/dropped_stale"] == 1.0
    assert (m["async/staleness_1"], m["async/staleness_2"], m["async/staleness_3"]) == (1.0, 1.0, 1.0)
    assert old.token_versions == [-1, -1, 3, 5, -1, -1, 6, 6] and legacy.sampled_versions() == [5]


def test_versions_follow_turn_samples_and_serialisation():
    tr = _traj([[2, 3], [3]], 2)
    tr.turn_prompts = [[1, 2], [1, 2, 3, 3, 1, 2]]
    first, second = turn_samples([tr])
    assert first.sampled_versions() == [2, 3] and second.sampled_versions() == [3]
    assert Trajectory.from_dict(tr.to_dict()).token_versions == tr.token_versions
    with pytest.raises(ValueError, match="versions"):
        tr.append_sampled([1], [0.0], [1, 2])
    tr.token_versions.pop()
    with pytest.raises(ValueError, match="token_versions"):
        tr.validate()


def test_partial_config_needs_async_and_an_hf_engine_or_an_in_process_vllm():
    for extra in (["rollout.mode=sync"], ["rollout.mode=async", "rollout.engine=vllm", "rollout.num_workers=1"],
                  ["rollout.mode=sync", "rollout.num_workers=2"]):
        with pytest.raises(ConfigError, match="rollout.partial"):
            load_config(None, ["rollout.partial=true", "train.max_staleness=1", *extra])
    assert load_config(None, ["rollout.partial=true", "rollout.mode=async", "train.max_staleness=1"]).rollout.partial
    assert load_config(None, ["rollout.partial=true", "rollout.mode=async", "rollout.num_workers=2",
                              "train.max_staleness=1"]).rollout.partial  # Ray workers, HF engine
    assert load_config(None, ["rollout.partial=true", "rollout.mode=async", "rollout.engine=vllm",
                              "train.max_staleness=1"]).rollout.partial
    assert load_config(None, []).rollout.partial is False


def test_an_episode_s_policy_version_is_its_oldest_token_s(tiny_model_dir, weights):
    """A push that lands after an episode began but before its first token (another batch in
    flight loaded it at one of its token boundaries; here the env's reset stands in for that
    thread): the episode's `policy_version` is the version that sampled its first, oldest token,
    not the engine's version when the episode was set up (it read 0 with tokens [1, 1, ...])."""
    from agentrl.env.base import TextEnv
    from agentrl.rollout.agent_loop import EpisodeSpec, run_episodes
    from agentrl.rollout.chat import ChatRenderer

    hf = HFEngine(tiny_model_dir, torch_threads=1)

    class PushOnReset(TextEnv):
        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            hf.update_weights(weights[1], version=1)
            return [{"role": "user", "content": "Write a Python function."}], {"task_id": "t0"}

        def step(self, action):
            return [], 0.0, True, False, {}

    _, tok = load_model(tiny_model_dir)
    r = ChatRenderer(tok)
    (tr,) = run_episodes(hf, r, [PushOnReset()], [EpisodeSpec(reset_kwargs={})],
                         SamplingParams(temperature=1.0, max_tokens=8, stop_token_ids=r.stop_ids),
                         max_episode_tokens=256, seed=0)
    assert tr.num_sampled > 0 and set(tr.sampled_versions()) == {1}
    assert tr.policy_version == tr.oldest_version == 1
