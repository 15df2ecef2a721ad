"""Batches in flight on a Ray rollout worker (slow: a local Ray cluster of its own, because the
cluster of `test_ray_workers.py` is fully reserved by that module's 2 workers).

In async mode a worker actor is threaded (`max_concurrency = batches_in_flight + 2`): two `run`
calls (two batches in flight) proceed at once, one generating while the other's envs wait.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from test_ray_workers import TESTS_DIR, in_process, make_cfg, make_specs, params_of, push

from agentrl.rollout.chat import ChatRenderer
from agentrl.rollout.workers import RolloutPool, worker_concurrency


@pytest.fixture(scope="module")
def ray_cluster():
    import ray  # a core dependency: never skipped
    from ray.job_config import JobConfig

    from agentrl.rollout.workers import ensure_ray

    ensure_ray(None, num_cpus=2, job_config=JobConfig(code_search_path=[TESTS_DIR]))
    yield ray
    ray.shutdown()


def test_worker_concurrency_follows_the_mode():
    assert worker_concurrency(make_cfg()) == 1  # sync: Ray's default, one call at a time
    assert worker_concurrency(make_cfg(mode="async", batches_in_flight=2)) == 4
    assert worker_concurrency(make_cfg(mode="async", batches_in_flight=1)) == 3


@pytest.mark.slow
def test_async_worker_runs_two_batches_in_flight(ray_cluster, tiny_model_dir, tmp_path):
    """`rollout.mode=async`, `batches_in_flight=2`, one worker: two concurrent `run` calls each
    return exactly what an in-process run with the pushed weights gives (greedy), and together
    take far less than twice one call (envs wait 0.25 s per step; a serial actor, as in sync
    mode, measured 2.0x)."""
    from agentrl.rollout.engines.make import load_tokenizer

    renderer = ChatRenderer(load_tokenizer(tiny_model_dir))
    faults = tmp_path / "faults"
    faults.mkdir()
    (faults / "delay").write_text("0.25")
    cfg = make_cfg(num_workers=1, mode="async", batches_in_flight=2)
    cfg.env.kwargs = {"fault_dir": str(faults), "driver_pid": os.getpid()}
    pool = RolloutPool(cfg, tiny_model_dir)
    try:
        sd, version = push(pool, tiny_model_dir, 1.5)
        specs_a, specs_b = make_specs(2, 2), make_specs(2, 2, base=50)
        p = params_of(renderer, 0.0)
        pool.run(specs_a, p, seed=1)  # warm-up
        t0 = time.perf_counter()
        one = pool.run(specs_a, p, seed=1)
        single = time.perf_counter() - t0
        with ThreadPoolExecutor(2) as ex:
            t0 = time.perf_counter()
            fa, fb = ex.submit(pool.run, specs_a, p, 1), ex.submit(pool.run, specs_b, p, 2)
            a, b = fa.result(), fb.result()
            both = time.perf_counter() - t0
        print(f"one run {single:.2f} s, two concurrent runs {both:.2f} s")
        assert single >= 1.0  # 2 turns x (4 episodes on 2 env threads) x 0.25 s
        assert both < 1.5 * single, (both, single)
        want = in_process(tiny_model_dir, specs_a, 0.0, 1, state_dict=sd)
        assert [t.token_ids for t in a] == [t.token_ids for t in one] == [t.token_ids for t in want]
        assert [t.group_id for t in b] == [s.group_id for s in specs_b]
        assert [t.token_ids for t in b] == [t.token_ids for t in want]  # same tasks, greedy
        assert {t.policy_version for t in a + b} == {version}
    finally:
        pool.shutdown()
