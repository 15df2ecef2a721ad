"""`self_propose`: scripted episodes for each role and mode with exact rewards (real sandbox),
the learnability reward of `finish_batch`, role-aware grouping, the buffer's checkpoint state,
and a short `agentrl train` run that resumes with the buffer restored."""

from __future__ import annotations

import json

import pytest
import torch
from gymnasium.utils.env_checker import check_env

import agentrl.train as train_mod
from agentrl.algos.advantages import group_advantages
from agentrl.algos.grpo import GRPO
from agentrl.algos.shaping import build_batch
from agentrl.config import load_config
from agentrl.env.base import env_state, load_env_state
from agentrl.env.registry import make_env
from agentrl.sandbox.pool import default_pool
from agentrl.types import Trajectory, Turn
from agentrl_envs import self_propose_tasks as spt
from agentrl_envs.self_propose import SelfProposeEnv, program_novelty, role_of
from agentrl_envs.self_propose_tasks import SEED_TASKS, ParseError, Task, TaskBuffer


@pytest.fixture(scope="module")
def pool():
    """The process-wide pool, which envs made without `pool=` use too (closed at exit)."""
    return default_pool("auto")


@pytest.fixture
def env(pool):
    return SelfProposeEnv(buffer=TaskBuffer(), pool=pool, limits={"wall_s": 1.0, "cpu_s": 1.0})


def _propose(env, text):
    env.reset(options={"role": "propose"})
    return env.step(text)


def _solve(env, mode, text, task=SEED_TASKS[0], pair=0):
    env.reset(options={"role": "solve", "mode": mode, "task": task.to_dict(), "pair": pair})
    return env.step(text)


VALID = "Here it is.\n```python\ndef f(x):\n    # square minus one\n    return x * x - 1\n```\nInput: 3\nInput: -2\n"


def test_check_env_passes(pool):
    check_env(make_env("self_propose", env_kwargs={"buffer": "test-check"}).unwrapped,
              skip_render_check=True)


# -- propose ----------------------------------------------------------------------------------------
def test_valid_proposal_enters_the_buffer_with_its_outputs(env):
    obs, r, term, trunc, info = _propose(env, VALID)
    assert (obs, r, term, trunc) == ([], 0.0, True, False)  # learnability comes in finish_batch
    assert info["proposal_valid"] and info["success"] and info["error"] is None
    task = env.buffer.tasks[-1]
    assert (task.inputs, task.outputs, task.origin) == (("3", "-2"), ("8", "3"), "proposed")
    assert info["task_key"] == task.key and env.buffer.fresh == [task.key]
    assert len(env.buffer.tasks) == len(SEED_TASKS) + 1


@pytest.mark.parametrize("text, kind", [
    ("no code at all\nInput: 3", "invalid"),
    ("```python\ndef f(x):\n    return x +\n```\nInput: 3", "invalid"),            # syntax error
    ("```python\ndef f(x):\n    return x + 1\n```\n", "invalid"),                  # no input
    ("```python\ndef f(x):\n    return 1 // (x - 3)\n```\nInput: 3", "invalid"),   # raises
    ("```python\ndef f(x):\n    while True:\n        x += 1\n```\nInput: 3", "invalid"),  # timeout
    ("```python\ndef f(x):\n    return open('/etc/passwd').read()\n```\nInput: 3", "invalid"),
    ("```python\ndef f(x):\n    return {1, 2}\n```\nInput: 3", "invalid"),         # not plain data
    ("```python\ndef f(x):\n    return x\n```\nInput: 3\nInput: 'a'", "trivial"),  # identity
    ("```python\ndef f(x):\n    return 42\n```\nInput: 3", "trivial"),              # ignores x
    ("```python\ndef f(x):\n    return len(x) > 99\n```\nInput: 'ab'\nInput: 'c'", "trivial"),
])
def test_rejected_proposals_get_the_invalid_reward_and_stay_out(env, text, kind):
    n = len(env.buffer.tasks)
    _, r, term, _, info = _propose(env, text)
    assert (r, term, info["proposal_valid"], info["invalid_reason"]) == (-0.5, True, False, kind)
    assert info["error"] and len(env.buffer.tasks) == n and env.buffer.fresh == []


def test_nondeterministic_proposal_is_rejected(pool):
    env = SelfProposeEnv(buffer=TaskBuffer(), pool=pool, invalid_reward=-1.0,
                         allowed_imports=[*spt.ALLOWED_IMPORTS, "os"])
    text = "```python\nimport os\ndef f(x):\n    return x + os.urandom(8).hex()\n```\nInput: 'k'"
    _, r, _, _, info = _propose(env, text)
    assert (r, info["invalid_reason"]) == (-1.0, "nondeterministic")
    assert len(env.buffer.tasks) == len(SEED_TASKS)


def test_duplicate_proposal_is_rejected_even_reformatted(env):
    assert _propose(env, VALID)[1] == 0.0
    again = "```python\ndef f(x):\n    return (x*x) - 1   # same program\n```\nInput: 3\ninput: -2"
    _, r, _, _, info = _propose(env, again)
    assert (r, info["invalid_reason"]) == (-0.5, "duplicate")
    seed = SEED_TASKS[1]
    text = f"```python\n{seed.src}\n```\n" + "".join(f"Input: {i}\n" for i in seed.inputs)
    assert _propose(env, text)[4]["invalid_reason"] == "duplicate"  # a seed task
    assert len(env.buffer.tasks) == len(SEED_TASKS) + 1


def test_buffer_cap_drops_the_oldest_proposal_keeps_seeds():
    buf = TaskBuffer(cap=len(SEED_TASKS) + 1)
    a = Task("def f(x):\n    return x + 10", ("1",), ("11",), "proposed")
    b = Task("def f(x):\n    return x + 20", ("1",), ("21",), "proposed")
    assert buf.add(a) and buf.add(b) and not buf.add(b)
    assert buf.tasks == [*SEED_TASKS, b]
    assert buf.add(a)  # dropped, so no longer a duplicate
    with pytest.raises(ValueError, match="buffer_cap"):
        TaskBuffer(cap=2)


# -- solve ------------------------------------------------------------------------------------------
# SEED_TASKS[0]: f(x) = x*x + 3x - 1 on inputs 2, 5, -1 -> 9, 39, -3
@pytest.mark.parametrize("mode, text, reward", [
    ("deduce", "f(2) = 4 + 6 - 1.\nOutput: 9", 1.0),
    ("deduce", "9", 1.0),                     # no label: the last line
    ("deduce", "Output: 10", 0.0),
    ("deduce", "Output: 9.0", 0.0),           # plain-data comparison is type-exact
    ("deduce", "Output: True", 0.0),
    ("abduce", "Input: 2", 1.0),
    ("abduce", "Input: -5", 1.0),             # 25 - 15 - 1: another input with output 9
    ("abduce", "Input: 3", 0.0),
    ("abduce", "Input: 'a'", 0.0),            # f raises on it: a wrong input
    ("induce", "```python\ndef f(x):\n    return x ** 2 + 3 * x - 1\n```", 1.0),
    ("induce", "```python\ndef f(x):\n    return {2: 9, 5: 39}[x]\n```", 0.0),  # fails held-out -1
    ("induce", "```python\ndef f(x):\n    return abs(x * x + 3 * x - 1)\n```", 0.0),  # 3 on -1
])
def test_solve_episodes_exact_rewards(env, mode, text, reward):
    _, r, term, trunc, info = _solve(env, mode, text)
    assert (r, term, trunc, info["success"], info["mode"]) == (reward, True, False, reward == 1.0, mode)


def test_solve_prompts_show_what_each_mode_needs(env):
    t = SEED_TASKS[0]
    obs, info = env.reset(options={"role": "solve", "mode": "induce", "task": t.to_dict()})
    text = obs[1]["content"]
    assert "Input: 2\nOutput: 9" in text and "Input: 5\nOutput: 39" in text
    assert "-1" not in text and "3 * x" not in text  # held-out pair and program hidden
    assert info["group_key"] == "solve/induce" and info["task_key"] == t.key
    obs, _ = env.reset(options={"role": "solve", "mode": "abduce", "task": t.to_dict(), "pair": 1})
    assert "Output: 39" in obs[1]["content"] and "Input:" not in obs[1]["content"].split("```")[-1][:20]


def test_unparseable_solve_answers_score_zero(env):
    for mode in ("deduce", "abduce", "induce"):
        _, r, _, _, info = _solve(env, mode, "")
        assert (r, info["success"]) == (0.0, False) and info["error"]
    assert _solve(env, "deduce", "Output: " + "9" * 400)[1] == 0.0  # too long
    with pytest.raises(ParseError):
        spt.parse_value("[" * 5000)


def test_parsing_is_linear_on_pathological_answers():
    import time

    t0 = time.perf_counter()
    for text in ("```" * 100_000, "```\n" * 100_000, "Input: " * 100_000):
        with pytest.raises(ParseError):
            spt.parse_proposal(text)
    assert time.perf_counter() - t0 < 2.0


# -- the learnability reward --------------------------------------------------------------------------
def _traj(role, key, group_id, *, success=False, valid=True, reward=0.0):
    t = Trajectory(group_id=group_id)
    t.info = {"role": role, "task_key": key, "group_key": role if role == "propose" else "solve/deduce"}
    info = {"success": success, "task_key": key, "program_key": "p" if key == "k1" else "q"}
    if role == "propose":
        info["proposal_valid"] = valid
    t.turns = [Turn(0, 1, reward=reward, info=info)]
    return t


def test_finish_batch_gives_learnability_by_hand(env):
    env.buffer.fresh = ["k1"]
    p1, p2, p3 = _traj("propose", "k1", 0), _traj("propose", "k2", 0), _traj("propose", "k3", 0)
    bad = _traj("propose", None, 0, valid=False, reward=-0.5)
    solves = [_traj("solve", "k1", 1, success=s) for s in (True, False, False, False)]  # rate 1/4
    solves += [_traj("solve", "k2", 2, success=True) for _ in range(2)]                # rate 1
    env.finish_batch([p1, p2, p3, bad, *solves])
    assert p1.episode_return == 0.75 and p1.turns[0].info["solve_rate"] == 0.25
    assert p2.episode_return == 0.0 and p2.turns[0].info["learnability"] == 0.0  # always solved
    assert p3.episode_return == 0.0 and p3.turns[0].info["unscored"]             # no solver group
    assert bad.episode_return == -0.5 and [s.episode_return for s in solves] == [0.0] * 6
    assert env.buffer.fresh == []
    assert p1.info["env_stats"]["proposal_diversity"] == 2 / 3  # programs p, q, q of 3 valid


def _proposal_traj(env, text, group_id):
    """A proposer trajectory of one real episode (the sandbox runs the proposal)."""
    _, r, _, _, info = _propose(env, text)
    t = Trajectory(group_id=group_id)
    t.info = {"role": "propose", "group_key": "propose"}
    t.turns = [Turn(0, 1, reward=r, info=info)]
    return t


def test_novelty_bonus_by_hand(pool):
    """novelty = mean over the program's word bigrams b of N[b]**-0.5, N[b] = buffer programs
    holding b. Buffer: seed `return x * 3 + 1` (bigrams def f, f x, x return, return x, x 3,
    3 1), then this batch's P1 `return x * x - 1` (.., x x, x 1) and P2 `return x * x + 2`
    (.., x x, x 2). P1: the 4 shared bigrams N=3, `x x` N=2, `x 1` N=1:
    (4/sqrt(3) + 1/sqrt(2) + 1) / 6 = 0.669417976; P2 the same (order does not matter).
    novelty_coef 0.5 -> bonus 0.334708988, added to valid proposals only."""
    seed = Task("def f(x):\n    return x * 3 + 1", ("2",), ("7",))
    env = SelfProposeEnv(buffer=TaskBuffer(seeds=(seed,)), pool=pool, novelty_coef=0.5,
                         limits={"wall_s": 1.0, "cpu_s": 1.0})
    p1 = _proposal_traj(env, VALID, 0)
    p2 = _proposal_traj(env, VALID.replace("x * x - 1", "x * x + 2"), 0)
    bad = _proposal_traj(env, "no code here", 0)
    k1 = p1.turns[0].info["task_key"]
    solves = [_traj("solve", k1, 1, success=s) for s in (True, False)]  # P1 solve rate 1/2
    env.finish_batch([p1, p2, bad, *solves])
    bonus = 0.5 * (4 / 3 ** 0.5 + 2 ** -0.5 + 1) / 6
    assert bonus == pytest.approx(0.334708988, abs=1e-9)
    assert p1.episode_return == pytest.approx(0.5 + bonus, abs=1e-12)  # learnability + novelty
    assert p2.episode_return == pytest.approx(bonus, abs=1e-12) and p2.turns[0].info["unscored"]
    assert p1.turns[0].info["novelty"] == p1.turns[0].info["reward_components"]["novelty"]
    assert bad.episode_return == -0.5 and "novelty" not in bad.turns[0].info
    assert [s.episode_return for s in solves] == [0.0, 0.0]
    # a program sharing no bigram with the buffer: novelty 1
    assert program_novelty("def g(y):\n    pass", [seed.src]) == 1.0
    # the default (0) adds nothing
    env0 = SelfProposeEnv(buffer=TaskBuffer(seeds=(seed,)), pool=pool)
    q = _proposal_traj(env0, VALID, 0)
    env0.finish_batch([q])
    assert q.episode_return == 0.0 and "novelty" not in q.turns[0].info


def test_novelty_state_is_the_buffer_so_resume_restores_it(pool):
    """The bonus has no state of its own: it is computed from the buffer's programs, which the
    checkpoint's env_state carries; a restored env gives the same bonus to the same proposal."""
    kw = {"pool": pool, "novelty_coef": 1.0, "limits": {"wall_s": 1.0, "cpu_s": 1.0}}
    a = SelfProposeEnv(buffer=TaskBuffer(), **kw)
    a.finish_batch([_proposal_traj(a, VALID, 0)])
    b = SelfProposeEnv(buffer=TaskBuffer(), **kw)
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    nxt = VALID.replace("x * x - 1", "x * x + 2")
    ta, tb = _proposal_traj(a, nxt, 0), _proposal_traj(b, nxt, 0)
    a.finish_batch([ta])
    b.finish_batch([tb])
    assert ta.turns[0].info["novelty"] == tb.turns[0].info["novelty"] > 0
    fresh = SelfProposeEnv(buffer=TaskBuffer(), **kw)  # without the first proposal: more novel
    tf = _proposal_traj(fresh, nxt, 0)
    fresh.finish_batch([tf])
    assert tf.turns[0].info["novelty"] > ta.turns[0].info["novelty"]


@pytest.mark.parametrize("coef", [-0.1, float("nan"), float("inf")])
def test_bad_novelty_coef_is_refused_naming_it(coef):
    with pytest.raises(ValueError, match="novelty_coef"):
        SelfProposeEnv(buffer=TaskBuffer(), novelty_coef=coef)


def test_phases_put_proposals_first_and_slots_pick_fresh_tasks(env):
    seeds = list(range(40))
    env.propose_fraction = 0.5
    props, solves = env.batch_phases(seeds)
    assert props and solves and sorted(props + solves) == list(range(40))
    assert all(role_of(seeds[i], 0.5) == "propose" for i in props)
    assert env.reset(seed=seeds[props[0]])[1]["role"] == "propose"
    _propose(env, VALID)
    _propose(env, VALID.replace("x * x - 1", "x * x + 2"))
    fresh = sorted(env.buffer.fresh)
    for k in (0, 1):
        info = env.reset(seed=seeds[solves[0]], options={"slot": k})[1]
        assert info["task_key"] == fresh[k]
    keys = {env.reset(seed=seeds[solves[0]], options={"slot": 2})[1]["task_key"] for _ in range(3)}
    assert len(keys) == 1  # past the fresh tasks: a buffered task drawn from the seed


def test_batch_hooks_are_refused_with_rollout_workers(env):
    from agentrl.rollout.collect import check_batch_hooks

    class RemoteEngine:  # what the collector recognises as Ray rollout workers: a `run` method
        def run(self, *a, **k):
            raise AssertionError("never reached")

    with pytest.raises(ValueError, match="rollout.num_workers=0"):
        check_batch_hooks(RemoteEngine(), make_env("self_propose", env_kwargs={"buffer": env.buffer}))
    check_batch_hooks(RemoteEngine(), make_env("toy"))  # no hooks: fine
    check_batch_hooks(object(), env)                      # in-process engine: fine


def test_collector_scores_proposals_by_the_same_batch_solvers(pool, tiny_tokenizer):
    """The real collector with a scripted policy: one proposal group writes two new tasks
    (f(x) = k x + 1), the two solve groups get them (slots 0, 1) and answer right then wrong,
    so each solve rate is 1/2 and each proposal earns learnability 1 - 1/2 = 0.5."""
    from concurrent.futures import ThreadPoolExecutor

    from agentrl.rollout.chat import ChatRenderer
    from agentrl.rollout.collect import collect
    from agentrl.rollout.engines.base import SamplingParams
    from agentrl.rollout.engines.scripted import ScriptedEngine

    calls = {"propose": 0, "solve": 0}

    def policy(ids):
        prompt = tiny_tokenizer.decode(ids)
        if "Write a new small" in prompt:
            calls["propose"] += 1
            return f"```python\ndef f(x):\n    return x * {calls['propose'] + 1} + 1\n```\nInput: 2\nInput: 5"
        k = int(prompt.split("return x * ")[1].split(" ")[0])
        x = int(prompt.split("Input: ")[-1].split("\n")[0])
        calls["solve"] += 1
        return f"Output: {k * x + 1 if calls['solve'] % 2 else -999}"

    buf = TaskBuffer(seeds=())
    cfg = load_config(None, ["env.name=self_propose", "algo.group_size=2"])
    envs = [make_env("self_propose", env_kwargs={"buffer": buf, "pool": pool, "modes": ["deduce"]})
            for _ in range(6)]
    prop = next(s for s in range(100) if role_of(s, 0.5) == "propose")
    solves = [s for s in range(100) if role_of(s, 0.5) == "solve"][:2]
    renderer = ChatRenderer(tiny_tokenizer)
    params = SamplingParams(max_tokens=200, stop_token_ids=renderer.stop_ids)
    with ThreadPoolExecutor(2) as ex:
        trajs = collect(ScriptedEngine(tiny_tokenizer, policy), renderer, envs, [solves[0], prop, solves[1]],
                        2, params, cfg, ex, group_base=0, sample_seed=0)
    roles = [t.info["role"] for t in trajs]
    assert roles == ["solve", "solve", "propose", "propose", "solve", "solve"]  # seed order kept
    assert [t.group_id for t in trajs] == [0, 0, 1, 1, 2, 2]
    assert [t.episode_return for t in trajs if t.info["role"] == "propose"] == [0.5, 0.5]
    assert [t.episode_return for t in trajs if t.info["role"] == "solve"] == [1.0, 0.0, 1.0, 0.0]
    assert {t.info["task_key"] for t in trajs if t.info["role"] == "solve"} == {b.key for b in buf.tasks}
    assert buf.fresh == [] and len(buf.tasks) == 2
    assert all(t.info["env_stats"]["proposal_diversity"] == 1.0 for t in trajs)  # 2 programs / 2


# -- role-aware grouping --------------------------------------------------------------------------------
def test_role_aware_groups_never_mix_roles_or_modes():
    from agentrl.config import algo_config

    # one group id holding 2 proposals (returns 0.5, -0.5) and 2 deduce solves (1, 0), and a
    # second group id with 2 induce solves (1, 1)
    trajs = []
    for gid, key, r in [(0, "propose", 0.5), (0, "propose", -0.5), (0, "solve/deduce", 1.0),
                        (0, "solve/deduce", 0.0), (1, "solve/induce", 1.0), (1, "solve/induce", 1.0)]:
        t = Trajectory(group_id=gid)
        t.append_context([1])
        t.append_sampled([2], [-0.1], text="a")
        t.turns[-1].reward = r
        t.info["group_key"] = key
        trajs.append(t)
    batch = build_batch(trajs, pad_id=0)
    assert batch["group_ids"].tolist() == [0, 0, 1, 1, 2, 2]
    adv, stats = GRPO().advantages(batch, algo_config(name="grpo"))
    # propose group (0.5, -0.5): mean 0, unbiased std sqrt((0.25 + 0.25) / 1) = 0.70711, so
    # A = +-0.5 / (0.70711 + 1e-6) = +-0.70711; deduce group (1, 0): mean 0.5, the same std and
    # deviations; the all-equal induce group -> exactly 0
    a = 0.5 / (0.5 ** 0.5 + 1e-6)
    want = torch.tensor([a, -a, a, -a, 0.0, 0.0])
    assert torch.allclose(adv[:, -1], want, atol=1e-6)
    assert stats["num_groups"] == 3
    # mixed into one group (ids alone), the proposals' baseline would be the solves' mean
    mixed = group_advantages(batch["scores"][:4], [0, 0, 0, 0])
    assert not torch.allclose(mixed, adv[:4, -1])


# -- checkpoint state ---------------------------------------------------------------------------------------
def test_env_state_round_trip_is_exact(pool):
    a = make_env("self_propose", env_kwargs={"buffer": TaskBuffer(), "pool": pool})
    a.reset(options={"role": "propose"})
    a.step(VALID)
    state = env_state(a)
    b = make_env("self_propose", env_kwargs={"buffer": TaskBuffer(), "pool": pool})
    load_env_state(b, json.loads(json.dumps(state)))  # through JSON, as the checkpoint does
    assert env_state(b) == state and b.unwrapped.buffer.tasks == a.unwrapped.buffer.tasks
    assert b.reset(seed=5)[0] == a.reset(seed=5)[0]
    with pytest.raises(ValueError, match="load_state_dict"):
        load_env_state(make_env("toy"), state)


# -- training ---------------------------------------------------------------------------------------------
ARGS = ["env.name=self_propose", "algo.name=grpo", "sft.steps=0", "rollout.tasks_per_step=4",
        "algo.group_size=2", "train.eval_tasks=2", "train.eval_samples=1", "rollout.max_tokens=16",
        "train.eval_every=0", "train.save_every=1", "train.keep_checkpoints=0", "quiet=true"]


def test_train_two_steps_then_resume_restores_the_buffer(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    kw = "env.kwargs={propose_fraction: 0.5, buffer: e2e}"
    extra = Task("def f(x):\n    return x * 7", ("1", "2"), ("7", "14"), "proposed")
    spt.shared_buffer("e2e", 256).add(extra)  # a proposal the run's checkpoints must carry
    cfg = load_config(None, ARGS + [kw, "train.steps=2", f"model.path={tiny_model_dir}", f"out={out}"])
    train_mod.train(cfg)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "rollout/reward_mean" in r]
    assert len(steps) == 2 and all(r["env/buffer_size"] >= len(SEED_TASKS) + 1 for r in steps)
    assert any(k.startswith("rollout/propose/") or k.startswith("rollout/solve/") for k in steps[0])
    saved = json.loads((out / "checkpoints" / "step_2" / "agentrl_state.json").read_text())
    tasks = saved["env_state"]["buffer"]["tasks"]
    assert extra.to_dict() in tasks
    spt._BUFFERS.clear()  # as a fresh process: only the checkpoint knows the buffer
    cfg = load_config(None, ARGS + [kw, "train.steps=3", f"model.path={tiny_model_dir}",
                                    f"resume={out}"])
    train_mod.train(cfg)
    after = spt.shared_buffer("e2e", 256).state_dict()["tasks"]
    assert after[:len(tasks)] == tasks
