"""Rollout workers: sharding by group, the in-process pool, and a real local Ray cluster (started
once for this module) with 2 HF-engine workers: same trajectories as in-process, weight pushes
with policy versions, and a worker killed in the middle of a step.

The envs below are built inside the Ray workers from the config (`env.name =
"test_ray_workers:CountEnv"`); the cluster gets this folder on its Python path.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

from agentrl.config import Config
from agentrl.env.base import TextEnv
from agentrl.rollout.agent_loop import EpisodeSpec, run_episodes
from agentrl.rollout.chat import ChatRenderer
from agentrl.rollout.engines.base import SamplingParams
from agentrl.rollout.engines.hf import HFEngine
from agentrl.rollout.stages import pool_health
from agentrl.rollout.workers import RolloutPool, RolloutWorker, shard_specs

TESTS_DIR = str(Path(__file__).resolve().parent)


class CountEnv(TextEnv):
    """Two agent turns: the task is a number from the seed; reward 0.1 per character of the
    first answer (capped at 1), then 1 if the second answer contains the number's last digit.

    Fault injection (Ray workers only; in the test process a fault raises instead):
    if the file `fault_dir/exit` exists, the first step to claim it (an atomic rename) ends its
    worker's process with `os._exit`; if `fault_dir/delay` exists, every step first sleeps that
    many seconds (so that a step is long enough to be interrupted from outside). With
    `hang_n`, the first step of the task numbered `hang_n` sleeps 30 s (a hung env), and an
    instance that hung raises if it is ever reset or stepped again.
    """

    def __init__(self, fault_dir: str | None = None, driver_pid: int = -1, hang_n: int = -1):
        self.fault_dir, self.driver_pid, self.hang_n = fault_dir, driver_pid, hang_n
        self.hung = False

    def _not_hung(self) -> None:
        if self.hung:
            raise RuntimeError("an env instance that hung was used again")

    def reset(self, *, seed=None, options=None):
        self._not_hung()
        super().reset(seed=seed)
        self.n = int(self.np_random.integers(10, 100))
        self.turn = 0
        return [{"role": "user", "content": f"Count to {self.n}."}], {"task_id": f"count-{self.n}"}

    def _faults(self) -> None:
        d = Path(self.fault_dir)
        if (d / "delay").exists():
            time.sleep(float((d / "delay").read_text()))
        if (d / "exit").exists():
            if os.getpid() == self.driver_pid:
                raise RuntimeError("fault injection must run in a Ray worker")
            try:
                os.rename(d / "exit", d / f"exited.{os.getpid()}")
            except FileNotFoundError:
                return  # another worker claimed it
            os._exit(17)

    def step(self, action):
        self._not_hung()
        if self.fault_dir:
            self._faults()
        if self.n == self.hang_n and self.turn == 0:
            self.hung = True
            time.sleep(30.0)
        self.turn += 1
        if self.turn == 1:
            return ([{"role": "user", "content": "Now the last digit."}],
                    min(1.0, 0.1 * len(action)), False, False, {})
        return [], float(str(self.n % 10) in action), True, False, {}


def make_cfg(**rollout) -> Config:
    return Config.model_validate({
        "env": {"name": "test_ray_workers:CountEnv"},
        "rollout": {"max_tokens": 8, "max_episode_tokens": 256, "env_threads": 2,
                    "torch_threads": 1, **rollout},
    })


def make_specs(n_tasks: int, group_size: int, base: int = 0) -> list[EpisodeSpec]:
    return [EpisodeSpec({"seed": 1000 + j}, group_id=base + j)
            for j in range(n_tasks) for _ in range(group_size)]


def repeated_task_specs() -> list[EpisodeSpec]:
    """5 groups of 2 whose tasks repeat: A, B, C, A (the same seed) and A' (another seed that
    gives A's number, hence A's prompt). Sharded over 2 workers, A, B, C run on worker 0 and
    A, A' on worker 1."""
    env = CountEnv()

    def number(seed: int) -> int:
        env.reset(seed=seed)
        return env.n

    a = 1000
    a2 = next(s for s in range(a + 1, a + 2000) if number(s) == number(a))
    others = [s for s in range(a + 1, a + 50) if number(s) != number(a)]
    b, c = others[0], next(s for s in others if number(s) != number(others[0]))
    return [EpisodeSpec({"seed": s}, group_id=j) for j, s in enumerate((a, b, c, a, a2)) for _ in range(2)]


def params_of(renderer: ChatRenderer, temperature: float = 1.0) -> SamplingParams:
    return SamplingParams(temperature=temperature, max_tokens=8, stop_token_ids=renderer.stop_ids)


def perturbed_state_dict(model_dir: str, scale: float) -> dict[str, torch.Tensor]:
    """The model's weights with every floating tensor multiplied by `scale`."""
    from agentrl.models.tiny import load_model

    model, _ = load_model(model_dir)
    return {k: (v * scale if v.is_floating_point() else v) for k, v in model.state_dict().items()}


def in_process(model_dir: str, specs, temperature: float, seed: int, state_dict=None):
    """What `rollout.num_workers=0` runs: `run_episodes` on one in-process HF engine."""
    engine = HFEngine(model_dir, torch_threads=1)
    if state_dict is not None:
        engine.update_weights(state_dict, 1)
    renderer = ChatRenderer(engine.tokenizer)
    envs = [CountEnv() for _ in specs]
    return run_episodes(engine, renderer, envs, specs, params_of(renderer, temperature),
                        max_episode_tokens=256, seed=seed)


# -- sharding (pure) --------------------------------------------------------------------------------
def test_shard_specs_keeps_groups_and_balances():
    # 5 groups of 2 -> group starts 0,2,4,6,8; shard = start*2//10 -> 0,0,0,1,1
    specs = make_specs(5, 2)
    assert shard_specs(specs, 2) == [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9]]
    # 4 groups of 3 into 3 shards: starts 0,3,6,9 -> 0*3//12=0, 9//12=0, 18//12=1, 27//12=2
    assert shard_specs(make_specs(4, 3), 3) == [[0, 1, 2, 3, 4, 5], [6, 7, 8], [9, 10, 11]]
    # fewer groups than shards: the extra shards are empty
    assert shard_specs(make_specs(1, 4), 3) == [[0, 1, 2, 3], [], []]
    # a group whose members are not adjacent still lands in one shard, in order: groups
    # 7 -> [0, 2] (start 0, shard 0), 8 -> [1] (start 2, 2*2//4 = 1), 9 -> [3] (start 3, 6//4 = 1)
    mixed = [EpisodeSpec({}, group_id=g) for g in (7, 8, 7, 9)]
    assert shard_specs(mixed, 2) == [[0, 2], [1, 3]]
    assert shard_specs([], 2) == [[], []]
    assert shard_specs(specs, 1) == [list(range(10))]
    with pytest.raises(ValueError, match="num_shards"):
        shard_specs(specs, 0)


def test_hf_engine_honours_the_call_seed(tiny_model_dir):
    """The same prompts, params and seed give the same samples; another seed gives others."""
    engine = HFEngine(tiny_model_dir, torch_threads=1)
    r = ChatRenderer(engine.tokenizer)
    prompt = r.prompt_ids([{"role": "user", "content": "Count to 42."}])
    p = SamplingParams(temperature=1.0, max_tokens=12, n=4, seed=5)
    a = engine.generate([prompt], p)
    b = engine.generate([prompt], p)
    c = engine.generate([prompt], SamplingParams(temperature=1.0, max_tokens=12, n=4, seed=6))
    assert [x.token_ids for x in a] == [x.token_ids for x in b]
    assert [x.token_ids for x in a] != [x.token_ids for x in c]
    assert len({tuple(x.token_ids) for x in a}) > 1  # the n samples differ from each other


def test_in_process_pool_equals_run_episodes(tiny_model_dir):
    """`RolloutPool(num_workers=0)` is `run_episodes` on the same engine, envs and seed."""
    cfg = make_cfg()
    pool = RolloutPool(cfg, tiny_model_dir, num_workers=0, env_factory=lambda split: CountEnv())
    specs = make_specs(3, 2)
    got = pool.run(specs, params_of(pool._local.renderer), seed=11)
    want = in_process(tiny_model_dir, specs, 1.0, 11)
    assert [t.token_ids for t in got] == [t.token_ids for t in want]
    assert [t.group_id for t in got] == [0, 0, 1, 1, 2, 2]
    sd = perturbed_state_dict(tiny_model_dir, 1.5)
    pool.update_weights(sd, 3)
    assert pool.policy_versions() == [3] and pool.stats["sync_s"] > 0
    after = pool.run(specs, params_of(pool._local.renderer), seed=11)
    assert {t.policy_version for t in after} == {3}
    assert [t.token_ids for t in after] == [t.token_ids for t in in_process(
        tiny_model_dir, specs, 1.0, 11, state_dict=sd)]


def test_a_shard_given_the_earlier_shards_samples_as_the_whole_batch(tiny_model_dir):
    """A worker that runs the second shard of a batch with the first shard's specs (`before`)
    gives its rows the sampling seeds of the whole batch in one call, so the two shards together
    are exactly `run_episodes` over the batch, at T=1, where a task repeats in other groups
    (the same seed, and another seed with the same prompt). Without them the repeated task's
    group would replay the first group's samples token for token."""
    w = RolloutWorker(make_cfg(), tiny_model_dir, env_factory=lambda split: CountEnv())
    specs = repeated_task_specs()
    p = params_of(w.renderer, 1.0)
    want = in_process(tiny_model_dir, specs, 1.0, 4)
    assert len({tuple(t.token_ids) for t in want}) == len(specs)  # in one call: all differ
    head, tail = specs[:6], specs[6:]
    got = w.run(head, p, 4) + w.run(tail, p, 4, before=head)
    assert [t.token_ids for t in got] == [t.token_ids for t in want]
    for a, b in zip(got, want):
        assert a.sampler_logprobs == pytest.approx(b.sampler_logprobs, abs=1e-5)
    alone = w.run(tail, p, 4)  # the bug this fixes: the shard counted on its own
    assert alone[0].token_ids == want[0].token_ids and alone[1].token_ids == want[1].token_ids


def test_opening_counts_match_the_first_generate_call(tiny_model_dir):
    """`opening_counts` counts each opening prompt as `run_episodes` puts it in its first
    generate call: one probe reset per distinct reset kwargs, repeats counted."""
    from agentrl.rollout.engines.base import prompt_key

    w = RolloutWorker(make_cfg(), tiny_model_dir, env_factory=lambda split: CountEnv())
    specs = repeated_task_specs()
    counts = w.opening_counts(specs)
    want: dict[bytes, int] = {}
    for tr in in_process(tiny_model_dir, specs, 0.0, 1):
        key = prompt_key(tr.token_ids[: tr.turns[0].start])
        want[key] = want.get(key, 0) + 1
    assert counts == want and sorted(counts.values()) == [2, 2, 6]  # A x3 groups, B, C


def test_worker_builds_envs_from_config_with_shared_reward_wrappers(tiny_model_dir):
    """Without `env_factory` a worker builds its envs with `build_env(cfg, split, rewards)`,
    one `RewardWrappers` per worker: the curiosity wrapper's components show in every turn."""
    cfg = make_cfg()
    cfg.env.wrappers = ["curiosity"]
    w = RolloutWorker(cfg, tiny_model_dir)
    specs = make_specs(2, 2)
    trajs = w.run(specs, params_of(w.renderer, 1.0), seed=2)
    assert len(trajs) == 4 and all(len(t.turns) == 2 for t in trajs)
    assert all("reward_components" in turn.info for t in trajs for turn in t.turns)
    assert len(w.envs("train", 4)) == 4 and w._rewards is not None


# -- a real local Ray cluster -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def ray_cluster():
    import ray  # a core dependency: never skipped
    from ray.job_config import JobConfig

    from agentrl.rollout.workers import ensure_ray

    t0 = time.perf_counter()
    ensure_ray(None, num_cpus=2, job_config=JobConfig(code_search_path=[TESTS_DIR]))
    print(f"ray.init: {time.perf_counter() - t0:.1f} s")
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def fault_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("faults")


@pytest.fixture(scope="module")
def pool2(ray_cluster, tiny_model_dir, fault_dir):
    """2 Ray workers (1 CPU each: the whole test cluster) on `CountEnv` with fault injection."""
    cfg = make_cfg(num_workers=2)
    cfg.env.kwargs = {"fault_dir": str(fault_dir), "driver_pid": os.getpid()}
    pool = RolloutPool(cfg, tiny_model_dir)
    yield pool
    pool.shutdown()


def push(pool: RolloutPool, model_dir: str, scale: float) -> tuple[dict, int]:
    """Push the model's weights times `scale` as the next version; returns (state dict, version)."""
    sd = perturbed_state_dict(model_dir, scale)
    pool.update_weights(sd, pool.version + 1)
    return sd, pool.version


@pytest.fixture(scope="module")
def renderer(tiny_model_dir):
    from agentrl.rollout.engines.make import load_tokenizer

    return ChatRenderer(load_tokenizer(tiny_model_dir))


@pytest.mark.slow
def test_ray_workers_reward_state_round_trip(ray_cluster, tiny_model_dir, renderer):
    """2 Ray workers (0.1 CPU each): each worker's state comes back to it. It runs before the
    tests that use `pool2`, whose 2 workers hold the test cluster's 2 CPUs until the module
    ends (a worker asking for more would wait forever)."""
    check_reward_state_round_trip(
        lambda: RolloutPool(wrapped_cfg(num_workers=2, worker_cpus=0.1), tiny_model_dir), renderer)


@pytest.mark.slow
def test_two_workers_match_in_process(pool2, renderer, tiny_model_dir):
    """2 Ray workers give exactly the in-process token ids, one trajectory per spec, in spec
    order, each group on one worker: greedy, and sampled (T=1) on the same seed, since the HF
    engine draws each row's random numbers from its own seed (call seed, prompt ids, occurrence
    of the prompt in the call), not from a stream shared by the rows of a call."""
    sd, version = push(pool2, tiny_model_dir, 1.0)
    specs = make_specs(5, 2)
    got = pool2.run(specs, params_of(renderer, 0.0), seed=3)
    want = in_process(tiny_model_dir, specs, 0.0, 3, state_dict=sd)
    assert len(got) == len(specs) == 10
    assert [t.token_ids for t in got] == [t.token_ids for t in want]
    assert [t.loss_mask for t in got] == [t.loss_mask for t in want]
    for a, b in zip(got, want):
        assert a.sampler_logprobs == pytest.approx(b.sampler_logprobs, abs=1e-5)
    assert [t.group_id for t in got] == [s.group_id for s in specs]
    assert [t.task_id for t in got] == [t.task_id for t in want]
    assert {t.policy_version for t in got} == {version}
    by_group: dict[int, set] = {}
    for t in got:
        by_group.setdefault(t.group_id, set()).add(t.info["rollout_worker"])
    assert all(len(w) == 1 for w in by_group.values())  # groups stay together
    assert {t.info["rollout_worker"] for t in got} == {0, 1}  # both workers worked
    # the template drift check runs on the workers and comes back with each episode
    assert [t.info["template_drift"] for t in got] == [t.info["template_drift"] for t in want]

    sampled = pool2.run(specs, params_of(renderer, 1.0), seed=3)
    want_sampled = in_process(tiny_model_dir, specs, 1.0, 3, state_dict=sd)
    assert len(sampled) == 10 and all(t.num_sampled > 0 for t in sampled)
    assert [t.token_ids for t in sampled] == [t.token_ids for t in want_sampled]
    assert [t.loss_mask for t in sampled] == [t.loss_mask for t in want_sampled]
    for a, b in zip(sampled, want_sampled):
        assert a.sampler_logprobs == pytest.approx(b.sampler_logprobs, abs=1e-5)
    assert [t.token_ids for t in sampled] != [t.token_ids for t in got]
    assert len({tuple(t.token_ids) for t in sampled[:2]}) == 2  # a group's two episodes differ


@pytest.mark.slow
def test_two_workers_sample_as_in_process_when_a_task_repeats_across_workers(
        pool2, ray_cluster, renderer, tiny_model_dir):
    """T=1, a task that appears in groups on both workers (the same seed, and another seed with
    the same prompt): 2 Ray workers give exactly the in-process trajectories, and no two
    episodes are byte-identical; a worker that counted its shard alone would replay worker 0's
    group of that task token for token."""
    sd, version = push(pool2, tiny_model_dir, 1.0)
    specs = repeated_task_specs()
    p = params_of(renderer, 1.0)
    got = pool2.run(specs, p, seed=4)
    want = in_process(tiny_model_dir, specs, 1.0, 4, state_dict=sd)
    assert [t.info["rollout_worker"] for t in got] == [0] * 6 + [1] * 4
    assert [t.task_id for t in got][6:] == [want[0].task_id] * 4  # task A on worker 1
    assert [t.token_ids for t in got] == [t.token_ids for t in want]
    for a, b in zip(got, want):
        assert a.sampler_logprobs == pytest.approx(b.sampler_logprobs, abs=1e-5)
    assert len({tuple(t.token_ids) for t in got}) == len(specs)
    alone = ray_cluster.get(pool2.workers[1].run.remote(specs[6:], p, 4))
    assert alone[0].token_ids == want[0].token_ids


@pytest.mark.slow
def test_a_hung_env_step_on_a_worker_times_out_and_its_env_is_replaced(ray_cluster, tiny_model_dir,
                                                                      renderer):
    """A `RolloutWorker` actor with `env.step_timeout_s=1`: the group whose task hangs in its
    first step (30 s) ends after ~1 s as two recorded, zero-reward failures, the other groups
    play both turns, and the next batch on the same worker never touches the hung env
    instances (they would raise). (An actor of 0 CPUs: pool2's workers hold the cluster's 2.)"""
    specs = make_specs(3, 2)
    env = CountEnv()
    env.reset(seed=specs[2].reset_kwargs["seed"])
    cfg = make_cfg()
    cfg.env.kwargs = {"hang_n": env.n}
    cfg.env.step_timeout_s = 1.0
    worker = ray_cluster.remote(RolloutWorker).options(num_cpus=0).remote(cfg, tiny_model_dir)
    try:
        ray_cluster.get(worker.ready.remote())
        t0 = time.perf_counter()
        trajs = ray_cluster.get(worker.run.remote(specs, params_of(renderer, 1.0), 2))
        took = time.perf_counter() - t0
        assert took < 15.0, f"the batch waited for the hung step ({took:.1f} s)"
        for t in trajs[2:4]:
            assert t.info["env_timeout"] == "step" and t.info["errors"] == ["step timed out after 1 s"]
            assert len(t.turns) == 1 and t.turns[0].reward == 0.0 and t.terminated
        for t in trajs[:2] + trajs[4:]:
            assert len(t.turns) == 2 and "errors" not in t.info and "env_timeout" not in t.info
        again = ray_cluster.get(worker.run.remote(specs[:2] + specs[4:], params_of(renderer, 1.0), 3))
        assert all(len(t.turns) == 2 and "errors" not in t.info for t in again)  # slots 2, 3: fresh envs
    finally:
        ray_cluster.kill(worker)


@pytest.mark.slow
def test_one_worker_matches_in_process_when_sampling(pool2, ray_cluster, renderer, tiny_model_dir):
    """T=1, all specs on one worker actor: the worker's batch is the in-process batch, so every
    sampled id and logprob agrees (the engine is seeded per call)."""
    sd, version = push(pool2, tiny_model_dir, 1.0)
    specs = make_specs(3, 2)
    got = ray_cluster.get(pool2.workers[1].run.remote(specs, params_of(renderer, 1.0), 21))
    want = in_process(tiny_model_dir, specs, 1.0, 21, state_dict=sd)
    assert [t.token_ids for t in got] == [t.token_ids for t in want]
    for a, b in zip(got, want):
        assert a.sampler_logprobs == pytest.approx(b.sampler_logprobs, abs=1e-5)


@pytest.mark.slow
def test_weight_push_changes_outputs_and_versions(pool2, renderer, tiny_model_dir):
    _, v1 = push(pool2, tiny_model_dir, 1.0)
    specs = make_specs(2, 2)
    before = pool2.run(specs, params_of(renderer, 0.0), seed=5)
    assert {t.policy_version for t in before} == {v1}
    sd, v2 = push(pool2, tiny_model_dir, 3.0)
    assert v2 == v1 + 1
    assert 0 < pool2.stats["sync_s"] < 60 and pool2.stats["put_s"] <= pool2.stats["sync_s"]
    assert pool2.policy_versions() == [v2, v2]
    after = pool2.run(specs, params_of(renderer, 0.0), seed=5)
    assert {t.policy_version for t in after} == {v2}
    assert [t.token_ids for t in after] != [t.token_ids for t in before]
    # the pushed weights are exactly what an in-process engine with them samples
    want = in_process(tiny_model_dir, specs, 0.0, 5, state_dict=sd)
    assert [t.token_ids for t in after] == [t.token_ids for t in want]


@pytest.mark.slow
def test_worker_exits_mid_step_is_restarted_and_step_completes(pool2, ray_cluster, renderer,
                                                               tiny_model_dir, fault_dir):
    """A worker's first env step ends its process (`os._exit`) in the middle of the step. Ray
    restarts the actor (with the model directory's weights), the pool re-issues its shard, the
    restarted worker loads the pushed weights first, and the step returns every trajectory with
    the ids an in-process run with the pushed weights gives; the next step needs no re-issue.
    The push reuses version 0 (as SFT weights pushed before RL would), so a worker that compared
    version numbers instead of pushes would wrongly keep its initial weights."""
    sd = perturbed_state_dict(tiny_model_dir, 2.0)
    version = 0
    pool2.update_weights(sd, version)
    pids = [ray_cluster.get(w.ready.remote())["pid"] for w in pool2.workers]
    reissued = pool2.stats["reissued"]
    (fault_dir / "exit").write_text("")
    specs = make_specs(4, 2)
    trajs = pool2.run(specs, params_of(renderer, 0.0), seed=9)
    exited = [int(p.name.split(".")[1]) for p in fault_dir.glob("exited.*")]
    assert len(exited) == 1 and exited[0] in pids  # a worker process really exited
    assert pool2.stats["reissued"] == reissued + 1
    assert len(trajs) == len(specs)
    assert all(t.turns and t.terminated for t in trajs)
    assert {t.policy_version for t in trajs} == {version}
    assert [t.group_id for t in trajs] == [s.group_id for s in specs]
    new_pids = [ray_cluster.get(w.ready.remote())["pid"] for w in pool2.workers]
    assert set(pids) - set(new_pids) == set(exited)  # exactly that actor was restarted
    want = in_process(tiny_model_dir, specs, 0.0, 9, state_dict=sd)
    assert [t.token_ids for t in trajs] == [t.token_ids for t in want]
    nxt = pool2.run(make_specs(2, 2, base=100), params_of(renderer, 0.0), seed=10)
    assert len(nxt) == 4 and pool2.stats["reissued"] == reissued + 1
    assert pool2.policy_versions() == [version, version]


@pytest.mark.slow
def test_ray_kill_mid_step_with_restart(pool2, ray_cluster, renderer, tiny_model_dir, fault_dir):
    """`ray.kill(no_restart=False)` of a worker 0.5 s into a step of >= 1.8 s (per worker: 6
    episodes x 2 turns x 0.3 s on 2 env threads): the step still returns every trajectory, all
    sampled by the pushed weights."""
    import threading

    _, version = push(pool2, tiny_model_dir, 0.5)
    reissued = pool2.stats["reissued"]
    (fault_dir / "delay").write_text("0.3")
    killer = threading.Timer(0.5, lambda: ray_cluster.kill(pool2.workers[1], no_restart=False))
    killer.start()
    try:
        trajs = pool2.run(make_specs(6, 2, base=200), params_of(renderer, 1.0), seed=1)
    finally:
        killer.join()
        (fault_dir / "delay").unlink()
    assert len(trajs) == 12 and all(t.num_sampled > 0 for t in trajs)
    assert pool2.stats["reissued"] == reissued + 1
    assert {t.policy_version for t in trajs} == {version}
    assert pool2.policy_versions() == [version, version]



# -- the reward wrappers' state: gathered from the workers, pushed back on resume (#21 item 10) ---
WRAPPED = {"wrappers": ["safety", "curiosity"],
           "wrapper_kwargs": {"safety": {"method": "lagrangian", "lr": 0.5, "budget": 0.0, "update_every": 3},
                              "curiosity": {"method": "both", "coef": 1.0, "decay": 0.9, "embed_dim": 64,
                                            "rnd_hidden": 16, "rnd_out": 8}}}


def wrapped_cfg(**rollout) -> Config:
    cfg = make_cfg(env_threads=1, **rollout)  # one env thread: the shared state's order is fixed
    cfg.env.wrappers, cfg.env.wrapper_kwargs = WRAPPED["wrappers"], WRAPPED["wrapper_kwargs"]
    return cfg


def turn_rewards(trajs) -> list[tuple[float, float, float]]:
    return [(t.reward, t.info["reward_components"]["intrinsic"], t.info["lagrange_multiplier"])
            for tr in trajs for t in tr.turns]


def check_reward_state_round_trip(make_pool, renderer) -> None:
    """A pool that sampled one batch hands its workers' reward state to a new pool; both then
    sample the next batch with the same rewards, a pool that was not given it with others."""
    from agentrl.learner.checkpoints import pack_state, unpack_state

    a = make_pool()
    try:
        a.run(make_specs(2, 2), params_of(renderer, 1.0), seed=5)
        states = a.reward_states()
        assert len(states) == max(1, a.num_workers) and all(s["curiosity"]["t"] > 0 for s in states)
        import tempfile

        with tempfile.TemporaryDirectory() as d:  # through the checkpoint file, as train does
            f = Path(d) / "reward_state.safetensors"
            f.write_bytes(pack_state({"workers": states}))
            saved = unpack_state(f)["workers"]
        want = turn_rewards(a.run(make_specs(2, 2, base=10), params_of(renderer, 1.0), seed=6))
    finally:
        a.shutdown()
    b = make_pool()
    try:
        assert b.load_reward_states(saved) == []
        assert turn_rewards(b.run(make_specs(2, 2, base=10), params_of(renderer, 1.0), seed=6)) == want
        assert b.load_reward_states(saved[:1] * (len(saved) + 1))[0].startswith(
            "the reward wrappers start from their initial state: the checkpoint holds the state of")
    finally:
        b.shutdown()
    c = make_pool()
    try:
        assert turn_rewards(c.run(make_specs(2, 2, base=10), params_of(renderer, 1.0), seed=6)) != want
    finally:
        c.shutdown()


def test_in_process_pool_reward_state_round_trip(tiny_model_dir, renderer):
    check_reward_state_round_trip(lambda: RolloutPool(wrapped_cfg(), tiny_model_dir), renderer)


@pytest.mark.slow
def test_a_worker_ray_gave_up_on_shows_in_the_pools_health(pool2, ray_cluster, renderer, tiny_model_dir):
    """Ray gives up on a worker (`ray.kill(no_restart=True)`, as after `rollout.max_restarts`
    restarts): its shard goes to the other worker and `pool_health` says so (the run's metrics
    `rollout/workers_alive` and `rollout/reissued`, and a `[workers]` line; a user saw only
    Ray's raylet line). pool2's last test: it leaves the pool one worker short."""
    reissued = pool2.stats["reissued"]
    assert pool_health(pool2) == {"rollout/workers_alive": 2.0, "rollout/reissued": reissued}
    ray_cluster.kill(pool2.workers[1], no_restart=True)
    trajs = pool2.run(make_specs(2, 2, base=300), params_of(renderer, 1.0), seed=2)
    assert len(trajs) == 4 and all(t.num_sampled > 0 for t in trajs)
    assert pool_health(pool2) == {"rollout/workers_alive": 1.0, "rollout/reissued": reissued + 1}
    assert pool_health(RolloutPool(make_cfg(num_workers=0), tiny_model_dir)) == {}  # no Ray workers
