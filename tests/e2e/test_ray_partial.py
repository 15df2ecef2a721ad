"""Partial rollouts on Ray rollout workers (`rollout.partial` with `rollout.num_workers > 0`, HF
engine): a push reaches a worker while its `run` generates (the actor is threaded), is staged and
lands at the engine's next token boundary; the row goes on from its prefix with the new weights.
Checked against the in-process partial path with the switch at the same position (same ids, same
logprobs, versions per token), on a worker in this process and on a real local Ray cluster (its
own: `test_ray_workers.py`'s is fully reserved by that module's workers); and a training run with
two Ray workers.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
from test_ray_workers import TESTS_DIR, make_cfg, make_specs, perturbed_state_dict

from agentrl.config import load_config
from agentrl.rollout.agent_loop import run_episodes
from agentrl.rollout.chat import ChatRenderer
from agentrl.rollout.engines.base import SamplingParams
from agentrl.rollout.engines.hf import HFEngine
from agentrl.rollout.source import AsyncSource
from agentrl.rollout.worker_weights import catch_up
from agentrl.rollout.workers import RolloutPool, RolloutWorker
from agentrl.types import Trajectory

AT = 5  # the push lands at the 5th token boundary: tokens 0-4 by version 0, the rest by version 1
PARAMS = SamplingParams(temperature=1.0, max_tokens=32, stop_token_ids=[])  # 2 turns x 32 tokens


def partial_cfg(**rollout):
    return make_cfg(mode="async", partial=True, **rollout)


def switched_in_process(model_dir: str, sd: dict | None, seed: int) -> list[Trajectory]:
    """The in-process partial path: `run_episodes` on one HF engine whose `weight_poll` loads
    `sd` as version 1 at its AT-th call (None: no switch)."""
    engine = HFEngine(model_dir, torch_threads=1)
    calls = [0]

    def poll() -> bool:
        calls[0] += 1
        if calls[0] != AT or sd is None:
            return False
        engine.update_weights(sd, 1)
        return True

    engine.weight_poll = poll
    renderer = ChatRenderer(engine.tokenizer)
    specs = make_specs(1, 1)
    from test_ray_workers import CountEnv

    return run_episodes(engine, renderer, [CountEnv() for _ in specs], specs, PARAMS,
                        max_episode_tokens=256, seed=seed)


def check_switched(got: list[Trajectory], model_dir: str, sd: dict, seed: int) -> None:
    """`got` (one episode, two turns of 32 tokens) is what the in-process path samples with the
    switch at boundary AT: nothing sampled twice or lost, versions 0 then 1."""
    want = switched_in_process(model_dir, sd, seed)
    (tr,), (ref,) = got, want
    assert tr.token_ids == ref.token_ids and tr.loss_mask == ref.loss_mask
    assert tr.sampler_logprobs == pytest.approx(ref.sampler_logprobs, abs=2e-4)
    assert tr.sampled_versions() == ref.sampled_versions() == [0] * AT + [1] * (2 * 32 - AT)
    assert tr.oldest_version == 0 and tr.num_sampled == 64
    (plain,) = switched_in_process(model_dir, None, seed)
    assert plain.token_ids != tr.token_ids  # the switch changed the tokens: the check can fail


def test_staged_pushes_land_in_order_newest_wins(tiny_model_dir):
    """A worker with `stage_pushes`: a push while no generate runs loads at once; pushes while
    a generate holds the engine lock are staged (the newest wins, an older one arriving late is
    ignored) and loaded by `load_staged` (the engine's `weight_poll`) or by `catch_up`."""
    w = RolloutWorker(partial_cfg(), tiny_model_dir, stage_pushes=True)
    assert w.engine.weight_poll == w.staged.load_staged
    sds = {v: perturbed_state_dict(tiny_model_dir, 1.0 + v) for v in (1, 2, 3, 4)}
    w.update_weights(sds[1], 1, push_id=1)
    assert (w.engine.policy_version, w.push_id) == (1, 1)
    held, release = threading.Event(), threading.Event()

    def generating() -> None:  # holds the engine lock as a generate call does
        with w._lock:
            held.set()
            release.wait(30)

    t = threading.Thread(target=generating)
    t.start()
    assert held.wait(30)
    for v in (3, 2):  # 2 arrives after 3: never loaded
        assert w.update_weights(sds[v], v, push_id=v) < 5.0  # returns without waiting for the lock
    assert (w.engine.policy_version, w.push_id, w.staged.newest()) == (1, 1, 3)
    release.set()
    t.join()
    assert w.staged.load_staged() and not w.staged.load_staged()
    assert (w.engine.policy_version, w.push_id) == (3, 3)
    name, p = next((k, v) for k, v in w.engine.model.state_dict().items() if v.is_floating_point())
    assert p.equal(sds[3][name])
    w.update_weights(sds[1], 1, push_id=1)  # an older push: ignored
    assert w.engine.policy_version == 3
    held.clear(), release.clear()
    t = threading.Thread(target=generating)
    t.start()
    assert held.wait(30)
    w.update_weights(sds[4], 4, push_id=4)
    release.set()
    t.join()
    catch_up(w, [4, 4, None])  # the pool's newest push is staged: loaded, nothing fetched
    assert (w.engine.policy_version, w.push_id) == (4, 4)


def test_push_during_a_worker_generate_lands_at_the_token_boundary(tiny_model_dir):
    """A worker in this process generates a 32-token turn; at its AT-th token boundary another
    thread pushes (the pool's call to the worker): the push is staged, not loaded by the pusher
    (the generating thread holds the engine lock), and the boundary's `load_staged` loads it.
    The episode equals the in-process partial path with the switch there."""
    w = RolloutWorker(partial_cfg(), tiny_model_dir, stage_pushes=True)
    sd = perturbed_state_dict(tiny_model_dir, 3.0)
    calls, staged_only = [0], []

    def poll() -> bool:
        calls[0] += 1
        if calls[0] == AT:
            pusher = threading.Thread(target=w.update_weights, args=(sd, 1), kwargs={"push_id": 1})
            pusher.start()
            pusher.join(30)
            staged_only.append(w.engine.policy_version == 0 and w.staged.newest() == 1)
        return w.staged.load_staged()

    w.engine.weight_poll = poll
    got = w.run(make_specs(1, 1), PARAMS, seed=4)
    assert staged_only == [True] and (w.engine.policy_version, w.push_id) == (1, 1)
    check_switched(got, tiny_model_dir, sd, 4)


def test_push_through_source_applies_in_the_pushing_thread():
    """`AsyncSource(push_through=True)`: `push_weights` hands the weights on at once, from the
    learner's thread, and the staleness gate counts the version as held."""
    import torch

    applied: list[tuple[int, str]] = []
    src = AsyncSource(lambda s: [], lambda sd, v: applied.append((v, threading.current_thread().name)),
                      start=0, version=0, max_staleness=0, end=0, push_through=True)
    try:
        src.push_weights({"w": torch.zeros(1)}, 1)
        assert applied == [(1, threading.current_thread().name)] and src._version == 1
    finally:
        src.close()


# -- a real local Ray cluster ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ray_cluster():
    import ray
    from ray.job_config import JobConfig

    from agentrl.rollout.workers import ensure_ray

    ensure_ray(None, num_cpus=2, job_config=JobConfig(code_search_path=[TESTS_DIR]))
    yield ray
    ray.shutdown()


class SwitchWorker(RolloutWorker):
    """A Ray worker whose engine, at its AT-th token boundary while it holds no push, writes
    `fault_dir/at_boundary` and waits (30 s at most) until a push is staged, then loads it there
    with the worker's own `load_staged`: the push lands at a known position, whatever the timing."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.calls = 0
        self.engine.weight_poll = self._poll

    def _poll(self) -> bool:
        self.calls += 1
        if self.calls == AT and self.push_id == 0:
            Path(self.cfg.env.kwargs["fault_dir"], "at_boundary").write_text(str(os.getpid()))
            deadline = time.monotonic() + 30
            while self.staged.newest() == self.push_id and time.monotonic() < deadline:
                time.sleep(0.01)
        return self.staged.load_staged()


@pytest.mark.slow
def test_push_during_a_ray_worker_run_lands_at_the_token_boundary(ray_cluster, tiny_model_dir, tmp_path):
    """`RolloutPool.update_weights` while the pool's `run` generates on a Ray worker: the actor
    takes the push during `run` (threaded), stages it and loads it at the token boundary; the
    episode equals the in-process partial path with the switch there, and the worker holds
    the push afterwards (policy version 1). Killed and restarted by Ray (the model directory's
    weights), the worker loads the pool's push before its next run: every token by version 1."""
    cfg = partial_cfg(num_workers=1)
    cfg.env.kwargs = {"fault_dir": str(tmp_path), "driver_pid": os.getpid()}
    pool = RolloutPool(cfg, tiny_model_dir, worker_cls=SwitchWorker)
    try:
        sd = perturbed_state_dict(tiny_model_dir, 3.0)
        out: list = []
        runner = threading.Thread(target=lambda: out.append(pool.run(make_specs(1, 1), PARAMS, seed=4)))
        runner.start()
        deadline = time.monotonic() + 120
        while not (tmp_path / "at_boundary").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert (tmp_path / "at_boundary").exists(), "the worker never reached the token boundary"
        pool.update_weights(sd, 1)  # returns once staged: the worker is generating
        runner.join(120)
        assert pool.policy_versions() == [1]
        check_switched(out[0], tiny_model_dir, sd, 4)
        pid = ray_cluster.get(pool.workers[0].ready.remote())["pid"]
        ray_cluster.kill(pool.workers[0], no_restart=False)
        (again,) = pool.run(make_specs(1, 1, base=7), PARAMS, seed=5)
        assert ray_cluster.get(pool.workers[0].ready.remote())["pid"] != pid  # restarted
        assert set(again.sampled_versions()) == {1} and pool.policy_versions() == [1]
    finally:
        pool.shutdown()


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_async_partial_run_bounds_the_oldest_token(workers, request, tmp_path):
    """A real async run with partial rollouts (K=2, two batches in flight), in this process
    and on two Ray workers: every episode's token versions are non-decreasing, its oldest
    token is at most K versions behind the learner that trains on it and none is newer than
    the learner, the per-token metrics are logged and nothing is dropped. (Where the pushes
    land depends on timing.)"""
    from agentrl.train import train

    if workers:
        request.getfixturevalue("ray_cluster")
    tiny = ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=64",
            "sft.steps=0", "rollout.tasks_per_step=2", "algo.group_size=2", "train.eval_tasks=2",
            "train.eval_samples=1", "rollout.max_tokens=24", "train.log_rollouts_every=1", "quiet=true",
            "env.name=toy", "train.steps=5", "rollout.mode=async", "rollout.partial=true",
            "train.max_staleness=2", "rollout.batches_in_flight=2", f"rollout.num_workers={workers}",
            f"out={tmp_path / 'p'}"]
    train(load_config(None, tiny))
    rows = [json.loads(x) for x in (tmp_path / "p" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "rollout/staleness_tokens_max" in r]
    assert len(steps) == 5
    assert all(r["rollout/staleness_tokens_max"] <= 2 and r["rollout/dropped_stale"] == 0 for r in steps)
    assert all(r["rollout/staleness_tokens_mean"] <= r["rollout/staleness_tokens_max"] for r in steps)
    for step in range(1, 6):  # rollouts/step_<k>.jsonl: the batch the learner at version k - 1 trained on
        for line in (tmp_path / "p" / "rollouts" / f"step_{step}.jsonl").read_text().splitlines():
            tr = Trajectory.from_dict(json.loads(line))
            vs = tr.sampled_versions()
            assert vs == sorted(vs) and tr.policy_version <= vs[0]
            assert step - 1 - 2 <= tr.oldest_version and vs[-1] <= step - 1
            assert workers == 0 or tr.info["rollout_worker"] in (0, 1)
