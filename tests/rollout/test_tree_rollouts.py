"""Tree rollouts (`rollout.branch`, `EpisodeSpec.trunk`): the episodes of a group that share a
trunk take one sampled first turn and go on apart; their second turns then share GiGPO's anchor
state, so a repair is compared with the other repairs of the same attempt."""

from __future__ import annotations

import pytest
import torch
import yaml

from agentrl.algos.turns import discounted_turn_returns, step_advantages, turn_states
from agentrl.config import Config, ConfigError, load_config
from agentrl.env.base import TextEnv
from agentrl.rollout.agent_loop import EpisodeSpec, run_episodes
from agentrl.rollout.chat import ChatRenderer
from agentrl.rollout.collect import group_specs
from agentrl.rollout.engines.base import SamplingParams
from agentrl.rollout.engines.hf import HFEngine
from agentrl.rollout.workers import RolloutWorker
from agentrl.types import collate


class RepairEnv(TextEnv):
    """Two turns: the feedback on the first answer is a function of that answer only (its
    length), the second answer is rewarded 1 when its length is even."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.n = int(self.np_random.integers(10, 100))
        self.turn = 0
        return [{"role": "user", "content": f"Count to {self.n}."}], {"task_id": f"count-{self.n}"}

    def step(self, action):
        self.turn += 1
        if self.turn == 1:
            return [{"role": "user", "content": f"{len(action)} characters: try again."}], 0.0, False, False, {}
        return [], float(len(action) % 2 == 0), True, False, {}


class Counting(HFEngine):
    """The HF engine, recording how many rows each generate call sampled."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.rows: list[int] = []

    def generate(self, prompts, params, **kw):
        self.rows.append(len(prompts))
        return super().generate(prompts, params, **kw)


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return Counting(tiny_model_dir, torch_threads=1)


def run(engine, specs, seed=7, envs=None):
    r = ChatRenderer(engine.tokenizer)
    p = SamplingParams(temperature=1.0, max_tokens=8, stop_token_ids=r.stop_ids)
    engine.rows.clear()
    return run_episodes(engine, r, envs or [RepairEnv() for _ in specs], specs, p,
                        max_episode_tokens=256, seed=seed)


def first(tr):
    t = tr.turns[0]
    return tr.token_ids[t.start:t.end], tr.sampler_logprobs[t.start:t.end]


def test_group_specs_trunks():
    specs = group_specs([5, 6], 4, 10, branch=2)
    assert [(s.reset_kwargs["seed"], s.group_id, s.trunk) for s in specs] == [
        (5, 10, 0), (5, 10, 0), (5, 10, 1), (5, 10, 1), (6, 11, 0), (6, 11, 0), (6, 11, 1), (6, 11, 1)]
    assert [s.trunk for s in group_specs([5], 3, 0)] == [None] * 3
    assert [s.reset_kwargs for s in group_specs([5], 2, 0, 2, options=lambda j: {"slot": j})] == [
        {"seed": 5, "options": {"slot": 0}}] * 2
    with pytest.raises(ValueError, match="must divide the group size 4"):
        group_specs([5], 4, 0, branch=3)


def test_branches_share_the_first_turn_then_sample_apart(engine):
    """2 tasks x 4 episodes, branch 2: the first generate call samples 4 rows (one per trunk),
    each trunk's two episodes hold the same first-turn ids and logprobs and the same feedback,
    and their second turns are sampled apart (T=1, seeded)."""
    trajs = run(engine, group_specs([1000, 1001], 4, 0, branch=2))
    assert engine.rows[0] == 4 and engine.rows[1] == 8
    for a in range(0, 8, 2):
        b = a + 1
        assert first(trajs[a]) == first(trajs[b])
        assert trajs[b].info.get("shared_first_turn") and not trajs[a].info.get("shared_first_turn")
        ta, tb = trajs[a].turns, trajs[b].turns
        assert trajs[a].token_ids[ta[0].end:ta[1].start] == trajs[b].token_ids[tb[0].end:tb[1].start]
    firsts = {tuple(first(t)[0]) for t in trajs}
    assert len(firsts) == 4  # four distinct first turns
    seconds = {tuple(t.token_ids[t.turns[1].start:t.turns[1].end]) for t in trajs}
    assert len(seconds) > 4  # the branches went apart
    # without trunks every episode samples its first turn
    plain = run(engine, group_specs([1000, 1001], 4, 0))
    assert engine.rows[0] == 8 and len({tuple(first(t)[0]) for t in plain}) == 8


def test_a_branch_with_another_opening_prompt_samples_its_own(engine):
    """Sharing needs equal opening ids: an env whose prompt is not a function of its reset
    kwargs gives each episode its own first turn."""

    class Drifting(RepairEnv):
        count = 0

        def reset(self, *, seed=None, options=None):
            obs, info = super().reset(seed=seed, options=options)
            Drifting.count += 1
            return [{"role": "user", "content": f"Count to {self.n + Drifting.count}."}], info

    specs = group_specs([1000], 4, 0, branch=2)
    trajs = run(engine, specs, envs=[Drifting() for _ in specs])
    assert engine.rows[0] == 4 and not any(t.info.get("shared_first_turn") for t in trajs)


def test_shared_anchor_states_give_the_repairs_their_own_advantage(engine):
    """GiGPO's step-level advantage of a second turn: with trunks, the two continuations of a
    first attempt form one anchor group (equal states): A^S = (R - mean) / (std + eps) over the
    pair is opposite for the two, positive for the higher return and 0 when they are equal;
    without trunks a second-turn state recurs only when two attempts got equal feedback, and
    A^S is 0 on the states seen once."""
    for branch in (2, 1):
        trajs = run(engine, group_specs([1000, 1001, 1002], 4, 0, branch=branch), seed=3)
        b = collate(trajs, pad_id=0)
        gids = [t.group_id for t in trajs]
        adv = step_advantages(b["input_ids"], b["token_rewards"], b["loss_mask"], gids, gamma=1.0)
        states = turn_states(b["input_ids"], b["loss_mask"])
        rets, _ = discounted_turn_returns(b["token_rewards"], b["loss_mask"], 1.0)
        mask = b["loss_mask"] != 0
        second = []  # (state key, return, A^S on the second turn's tokens)
        for i, tr in enumerate(trajs):
            t = tr.turns[1]
            a = adv[i, t.start:t.end]
            assert torch.all(a == a[0])  # one advantage per turn
            second.append(((gids[i], states[i][1]), float(rets[i, 1]), float(a[0])))
        assert mask.any()
        keys = [k for k, _, _ in second]
        if branch == 1:  # independent attempts share a state only when their feedback is equal
            assert all(a == 0.0 for k, _, a in second if keys.count(k) == 1)
            assert any(keys.count(k) == 1 for k in keys)
            continue
        pairs = [second[i:i + 2] for i in range(0, len(second), 2)]
        assert all(p[0][0] == p[1][0] for p in pairs)  # the branches share the second turn's state
        for (_, ra, aa), (_, rb, ab) in pairs:
            assert aa == pytest.approx(-ab)
            assert (aa > 0) == (ra > rb) and (aa == 0) == (ra == rb)
        assert any(ra != rb for (_, ra, _), (_, rb, _) in pairs)  # the test saw a real comparison


def test_a_shard_with_trunks_samples_as_the_whole_batch(tiny_model_dir, engine):
    """A rollout worker running the second shard with the first shard's specs (`before`) gives
    exactly what one call over the batch gives: followers are not counted as openings."""
    cfg = Config.model_validate({
        "env": {"name": "test_tree_rollouts:RepairEnv"},
        "rollout": {"max_tokens": 8, "max_episode_tokens": 256, "env_threads": 2, "torch_threads": 1}})
    w = RolloutWorker(cfg, tiny_model_dir, env_factory=lambda split: RepairEnv())
    specs = group_specs([1000, 1000, 1001], 4, 0, branch=2)  # a task repeated across the shards
    want = run(engine, specs, seed=4)
    p = SamplingParams(temperature=1.0, max_tokens=8, stop_token_ids=w.renderer.stop_ids)
    head, tail = specs[:4], specs[4:]
    got = w.run(head, p, 4) + w.run(tail, p, 4, before=head)
    assert [t.token_ids for t in got] == [t.token_ids for t in want]
    assert sum(w.opening_counts(specs).values()) == 6


def test_config_checks_branch(tmp_path):
    ok = Config.model_validate({"env": {"name": "code_sandbox", "max_turns": 3}, "rollout": {"branch": 2}})
    assert ok.rollout.branch == 2
    bad = [({"env": {"name": "code_sandbox", "max_turns": 3}, "rollout": {"branch": 3}}, "must divide algo.group_size"),
           ({"env": {"name": "code_sandbox", "max_turns": 1}, "rollout": {"branch": 2}}, "needs a multi-turn run"),
           ({"env": {"name": "code_sandbox", "max_turns": 2}, "rollout": {"branch": 0}}, "branch")]
    for data, msg in bad:
        p = tmp_path / "c.yaml"
        p.write_text(yaml.safe_dump(data))
        with pytest.raises(ConfigError, match=msg):
            load_config(p)


def test_config_takes_the_registered_turn_limit():
    """A multi-turn env by registration (web_qa, mcp_tools: `register_env(max_turns=8)`) or by
    `env.kwargs.max_turns` (code_sandbox's attempts) takes a branch without `env.max_turns`; a
    registered limit of one turn, or none (code_sandbox without `max_turns`), is refused as
    `env.max_turns=1` is. Config validation has no registry (the layout keeps config from
    importing env): it refuses explicit limits only, and `agentrl train` passes the registered
    one (`branch_turns_error(cfg, registered_turn_limit(env))`, tested below)."""
    from agentrl.config import branch_turns_error
    from agentrl.env.registry import register_env, registered_turn_limit

    def error(data):
        cfg = Config.model_validate({**data, "rollout": {"branch": 2}})  # passes validation
        return branch_turns_error(cfg, registered_turn_limit(cfg.env.name))

    for data in ({"env": {"name": "web_qa"}}, {"env": {"name": "mcp_tools"}},
                 {"env": {"name": "code_sandbox", "kwargs": {"max_turns": 3}}}):
        assert error(data) is None
    register_env("test/OneTurnTree-v0", RepairEnv, short_name="test_one_turn_tree", max_turns=1)
    assert "needs a multi-turn run" in error({"env": {"name": "test_one_turn_tree"}})
    assert "got None" in error({"env": {"name": "code_sandbox"}})
    with pytest.raises(ValueError, match="needs a multi-turn run"):
        Config.model_validate({"env": {"name": "web_qa", "max_turns": 1}, "rollout": {"branch": 2}})


ONE_TURN_MODULE = """
from agentrl import TextEnv, register_env


class Say(TextEnv):
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return [{"role": "user", "content": "Say hi."}], {}

    def step(self, action):
        return [], 1.0, True, False, {}


register_env("{name}/Say-v0", "{name}:Say", short_name="{name}", max_turns={turns})
"""


@pytest.mark.parametrize("turns", [1, 3])
def test_an_env_registered_by_import_is_checked_once_imported(tmp_path, monkeypatch, turns):
    """An env that `--import` registers is not known when the config is validated: it passes
    there, and `agentrl train` checks its registered limit once the module is imported (with 3
    turns it was refused as "got None"; with 1 it is refused before OUT is written)."""
    from typer.testing import CliRunner

    from agentrl.cli import app

    name = f"tree_import_{turns}"
    (tmp_path / f"{name}.py").write_text(ONE_TURN_MODULE.replace("{name}", name).replace("{turns}", str(turns)))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_config(None, ["rollout.branch=2", f"env.name={name}"]).rollout.branch == 2
    out = tmp_path / "run"
    r = CliRunner().invoke(app, ["train", "--import", name, "--env", name, "--out", str(out),
                                 "rollout.branch=2", "sft.steps=0", "model.path=/nonexistent"])
    flat = " ".join(r.output.split())
    if turns == 1:
        assert r.exit_code == 2 and "needs a multi-turn run" in flat and "got 1" in flat, flat
    else:
        assert "needs a multi-turn run" not in flat and "model.path" in flat, flat
    assert not out.exists()


def test_config_refuses_a_branch_with_the_users_agent(tmp_path):
    """`--agent` (env `agent`) with a branch is a config error at start-up, before OUT is
    written, with or without `env.max_turns` (it was a traceback from the first training batch,
    after the model was built and evaluated, or a misleading "needs a multi-turn run")."""
    from typer.testing import CliRunner

    from agentrl.cli import app

    for extra in ([], ["env.max_turns=3"]):
        with pytest.raises(ConfigError, match="the user's agent samples its own turns"):
            load_config(None, ["rollout.branch=2", "env.name=agent", *extra])
    out = tmp_path / "run"
    r = CliRunner().invoke(app, ["train", "--agent", "calc_agent:solve", "--dataset", str(tmp_path / "t.jsonl"),
                                 "--out", str(out), "rollout.branch=2", "env.max_turns=3"])
    assert r.exit_code == 2 and "the user's agent samples its own turns" in " ".join(r.output.split())
    assert not out.exists()


def test_an_episode_spec_without_trunk_is_unchanged():
    assert EpisodeSpec({"seed": 1}).trunk is None


def test_show_names_the_episodes_that_share_a_first_turn(engine, tmp_path):
    """`agentrl show` of a tree rollout's episode names the episodes holding its first turn
    (the one that sampled it first); an episode of a run without branches gets no such line."""
    import io
    import json

    from rich.console import Console

    from agentrl.log.show import show_episode

    engine.tokenizer.save_pretrained(tmp_path / "base_model")
    (tmp_path / "rollouts").mkdir()
    for step, branch in ((1, 2), (2, 1)):
        trajs = run(engine, group_specs([1000], 4, 0, branch=branch))
        (tmp_path / "rollouts" / f"step_{step}.jsonl").write_text(
            "".join(json.dumps(t.to_dict()) + "\n" for t in trajs))
    for step, index, want in ((1, 3, "episodes 2, 3 hold the same first turn, sampled once by episode 2"),
                              (1, 0, "episodes 0, 1 hold the same first turn, sampled once by episode 0"),
                              (2, 1, None)):
        buf = io.StringIO()
        show_episode(tmp_path, step, index, Console(file=buf, width=300, color_system=None), plain=True)
        if want:
            assert want in buf.getvalue()
        else:
            assert "first turn shared" not in buf.getvalue()


def test_collect_independent_samples_every_episode_apart(engine):
    """`collect_independent` (the warm start's checks and policy-repair episodes) ignores a
    config's `rollout.branch`: with branch 2, 3 tasks x 4 samples on 4 envs run as 3 calls of
    one task, every episode samples its own first turn (4 rows in each call's first generate),
    group-major; the call starting at task index s samples with `sample_seed + s`."""
    from concurrent.futures import ThreadPoolExecutor

    from agentrl.rollout.collect import collect, collect_independent

    cfg = Config.model_validate({"env": {"name": "code_sandbox", "max_turns": 3}, "rollout": {"branch": 2}})
    r = ChatRenderer(engine.tokenizer)
    seeds = [1000, 1001, 1002]
    with ThreadPoolExecutor(2) as pool:
        engine.rows.clear()
        got = collect_independent(engine, r, [RepairEnv() for _ in range(4)], seeds, 4, cfg, pool,
                                  temperature=1.0, sample_seed=50)
        rows = list(engine.rows)
        one = cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={"branch": 1})})
        p = SamplingParams(temperature=1.0, top_p=one.rollout.top_p, max_tokens=one.rollout.max_tokens,
                           stop_token_ids=r.stop_ids)
        want = collect(engine, r, [RepairEnv() for _ in range(4)], seeds[1:2], 4, p, one, pool,
                       group_base=0, sample_seed=51)
    assert len(got) == 12 and rows == [4, 4] * 3  # per call: 4 first turns, then 4 second turns
    assert [t.task_id for t in got] == [t.task_id for t in got[::4] for _ in range(4)]
    assert len({t.task_id for t in got}) == 3
    assert not any(t.info.get("shared_first_turn") for t in got)
    assert len({tuple(first(t)[0]) for t in got}) == 12  # twelve first turns sampled apart
    assert [t.token_ids for t in got[4:8]] == [t.token_ids for t in want]
