"""Asynchronous actor-learner: the staleness bound, K=0 equals the synchronous loop, exactly-once
batches, and actor failures surface in the learner."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from agentrl.config import load_config
from agentrl.rollout.source import AsyncSource, SyncSource
from agentrl.types import Trajectory

TINY = ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2",
        "model.intermediate_size=64", "sft.steps=0", "rollout.tasks_per_step=2",
        "algo.group_size=2", "train.eval_tasks=2", "train.eval_samples=1", "rollout.max_tokens=8",
        "train.log_rollouts_every=0", "quiet=true", "train.lr=1e-2"]


class Actor:
    """Records which policy version sampled each batch."""

    def __init__(self, delay=0.0):
        self.version = 0
        self.sampled: list[tuple[int, int]] = []
        self.delay = delay

    def run_batch(self, s):
        time.sleep(self.delay)
        self.sampled.append((s, self.version))
        return [Trajectory(policy_version=self.version, task_id=str(s))]

    def apply(self, sd, v):
        self.version = v


@pytest.mark.parametrize("K, sync_every", [(0, 1), (1, 1), (2, 3), (3, 2)])
def test_staleness_bound_and_exactly_once(K, sync_every):
    actor = Actor(delay=0.001)
    src = AsyncSource(actor.run_batch, actor.apply, start=0, version=0, max_staleness=K, queue_size=4)
    version = 0
    for step in range(12):
        trajs, m = src.next_batch(step)
        assert [t.task_id for t in trajs] == [str(step)]  # in order, once
        assert version - trajs[0].policy_version <= K  # never older than K versions
        time.sleep(0.002)  # "training"
        version += 1
        if (step + 1) % sync_every == 0:
            src.push_weights({"w": torch.zeros(1)}, version)
    src.close()
    batches = [s for s, _ in actor.sampled]
    assert batches[:12] == list(range(12))  # nothing lost, nothing duplicated
    assert all(s - v <= K for s, v in actor.sampled)


def test_k0_actor_waits_for_each_version():
    actor = Actor()
    actor.version = 5  # resumed at step 5 with policy version 5
    src = AsyncSource(actor.run_batch, actor.apply, start=5, version=5, max_staleness=0)
    for step in range(5, 9):
        trajs, _ = src.next_batch(step)
        assert trajs[0].policy_version == step
        src.push_weights({"w": torch.zeros(1)}, step + 1)
    src.close()


def test_actor_failure_reaches_the_learner():
    def boom(s):
        raise ValueError("env pool died")

    src = AsyncSource(boom, lambda sd, v: None, start=0, version=0, max_staleness=1)
    with pytest.raises(RuntimeError, match="rollout actor failed") as e:
        src.next_batch(0)
    assert isinstance(e.value.__cause__, ValueError)
    src.close()


# -- several batches in flight ------------------------------------------------------------------
def _intervals(src):
    return {r["batch"]: (r["start"], r["end"]) for r in src.history}


def test_two_batches_in_flight_overlap():
    """batches_in_flight=2, K=2: every batch samples alongside another one (their intervals
    overlap by most of a batch), never more than 2 at once, and 8 batches of 0.2 s take about
    half the sequential time."""
    actor = Actor(delay=0.2)
    t0 = time.perf_counter()
    src = AsyncSource(actor.run_batch, actor.apply, start=0, version=0, max_staleness=2,
                      queue_size=2, batches_in_flight=2, end=8)
    version, seen = 0, []
    for step in range(8):
        trajs, m = src.next_batch(step)
        seen.append(trajs[0].task_id)
        version += 1
        src.push_weights({"w": torch.zeros(1)}, version)
    wall = time.perf_counter() - t0
    src.close()
    assert seen == [str(s) for s in range(8)]
    iv = _intervals(src)
    assert sorted(iv) == list(range(8))  # `end`: nothing sampled past the last step
    def overlap(a, b):
        return min(iv[a][1], iv[b][1]) - max(iv[a][0], iv[b][0])

    best = [max(overlap(s, o) for o in iv if o != s) for s in range(8)]
    assert all(o > 0.1 for o in best), best  # every batch sampled alongside another one
    edges = sorted([(a, 1) for a, _ in iv.values()] + [(b, -1) for _, b in iv.values()],
                   key=lambda e: (e[0], e[1]))
    live, peak = 0, 0
    for _, d in edges:
        live += d
        peak = max(peak, live)
    assert peak == 2
    assert wall < 0.75 * 8 * 0.2, wall  # sequential: 1.6 s; two in flight: ~0.8 s


def test_one_batch_in_flight_never_overlaps():
    actor = Actor(delay=0.02)
    src = AsyncSource(actor.run_batch, actor.apply, start=0, version=0, max_staleness=3,
                      batches_in_flight=1, end=6)
    for step in range(6):
        src.next_batch(step)
        src.push_weights({}, step + 1)
    src.close()
    iv = _intervals(src)
    assert all(iv[s][1] <= iv[s + 1][0] for s in range(5))


@pytest.mark.parametrize("n, K, queue_size, sync_every", [(2, 2, 1, 1), (3, 3, 2, 2), (3, 1, 1, 1),
                                                           (4, 0, 2, 1)])
def test_random_delays_order_exactly_once_and_staleness(n, K, queue_size, sync_every):
    """Random sampling and training times: the learner gets 0..N-1 in order, each sampled once,
    every batch sampled with version >= s - K, and never more than queue_size + n batches
    claimed ahead of the learner."""
    import random

    rng = random.Random(n * 100 + K)
    lock = threading.Lock()
    sampled: list[tuple[int, int]] = []
    state = {"version": 0, "want": 0, "ahead_max": 0}

    def run_batch(s):
        with lock:
            v = state["version"]
            sampled.append((s, v))
            state["ahead_max"] = max(state["ahead_max"], s - state["want"] + 1)
        time.sleep(rng.uniform(0, 0.01))
        return [Trajectory(policy_version=v, task_id=str(s))]

    def apply(sd, v):
        with lock:
            assert v >= state["version"]  # pushes land in order
            state["version"] = v

    N = 25
    src = AsyncSource(run_batch, apply, start=0, version=0, max_staleness=K, queue_size=queue_size,
                      batches_in_flight=n, end=N)
    version = 0
    for step in range(N):
        trajs, m = src.next_batch(step)
        with lock:
            state["want"] = step + 1
        assert [t.task_id for t in trajs] == [str(step)]
        assert version - trajs[0].policy_version <= K
        assert 0 <= m["async/batches_in_flight"] <= n
        time.sleep(rng.uniform(0, 0.01))
        version += 1
        if (step + 1) % sync_every == 0:
            src.push_weights({"w": torch.zeros(1)}, version)
    src.close()
    assert sorted(s for s, _ in sampled) == list(range(N))  # exactly once, none past `end`
    assert all(v >= s - K for s, v in sampled)
    assert all(r["version"] >= r["batch"] - K for r in src.history)
    assert state["ahead_max"] <= queue_size + n
    assert not any(t.is_alive() for t in src._threads)


def test_backpressure_bounds_batches_ahead():
    actor = Actor()
    src = AsyncSource(actor.run_batch, actor.apply, start=0, version=0, max_staleness=100,
                      queue_size=2, batches_in_flight=3)
    time.sleep(0.3)  # the learner takes nothing
    assert sorted(s for s, _ in actor.sampled) == list(range(5))  # queue_size + batches_in_flight
    src.next_batch(0)
    time.sleep(0.1)
    assert sorted(s for s, _ in actor.sampled) == list(range(6))
    src.close()


def test_failure_in_one_actor_thread_reaches_learner_and_close_stops_all():
    """Batch 3 raises while other threads sample: the learner gets 0, 1, 2 in order, then the
    error (chained); no batch after it is claimed; close() ends every thread."""
    def run_batch(s):
        time.sleep(0.02 if s != 3 else 0.005)
        if s == 3:
            raise ValueError("env pool died")
        return [Trajectory(task_id=str(s))]

    src = AsyncSource(run_batch, lambda sd, v: None, start=0, version=0, max_staleness=5,
                      batches_in_flight=3, queue_size=2)
    for step in range(3):
        trajs, _ = src.next_batch(step)
        assert trajs[0].task_id == str(step)
    with pytest.raises(RuntimeError, match="rollout actor failed") as e:
        src.next_batch(3)
    assert isinstance(e.value.__cause__, ValueError)
    src.close()
    assert not any(t.is_alive() for t in src._threads)
    assert max(r["batch"] for r in src.history) <= 3 + 2  # claims stopped after the failure


def test_close_stops_threads_waiting_at_the_gate():
    actor = Actor()
    src = AsyncSource(actor.run_batch, actor.apply, start=0, version=0, max_staleness=0,
                      batches_in_flight=3)
    src.next_batch(0)  # batch 1 waits for version 1, which never comes
    time.sleep(0.05)
    t0 = time.perf_counter()
    src.close()
    assert time.perf_counter() - t0 < 1.0
    assert not any(t.is_alive() for t in src._threads)
    assert [s for s, _ in actor.sampled] == [0]


class FakeEngine:
    """Generate sleeps; records whether a weight update ever lands inside a generate call."""

    def __init__(self):
        self.policy_version = 0
        self.busy = 0
        self.overlaps = 0
        self.calls: list[tuple[str, int, float]] = []  # (who, version, time)

    def generate(self, prompts, params):
        self.busy += 1
        if self.busy > 1:
            self.overlaps += 1
        self.calls.append((threading.current_thread().name, self.policy_version, time.perf_counter()))
        time.sleep(0.01)
        self.busy -= 1
        return []

    def update_weights(self, sd, v):
        if self.busy:
            self.overlaps += 1
        self.policy_version = v


def test_locked_engine_interleaves_batches_per_generate_call():
    """Two batches in flight on one LockedEngine: generate calls never overlap, weight updates
    land only between calls, and batch B generates while batch A waits on its "envs"."""
    from agentrl.rollout.source import LockedEngine

    engine = LockedEngine(FakeEngine())

    def run_batch(s):
        v0 = engine.policy_version
        for _ in range(4):  # 4 turns: generate, then the env waits 20 ms
            engine.generate([[1]], None)
            time.sleep(0.02)
        return [Trajectory(policy_version=v0, task_id=str(s))]

    src = AsyncSource(run_batch, engine.update_weights, start=0, version=0, max_staleness=2,
                      batches_in_flight=2, end=6)
    for step in range(6):
        src.next_batch(step)
        src.push_weights({}, step + 1)
    src.close()
    fake = engine.engine
    assert fake.overlaps == 0
    names = [c[0] for c in fake.calls]
    switches = sum(a != b for a, b in zip(names, names[1:]))
    assert switches >= 6, names  # the two actor threads' generate calls interleave
    versions = [c[1] for c in fake.calls]
    assert versions == sorted(versions) and versions[-1] >= 3  # weights only move forward


def test_sync_source_applies_weights_immediately():
    actor = Actor()
    src = SyncSource(actor.run_batch, actor.apply)
    src.push_weights({}, 3)
    trajs, m = src.next_batch(0)
    assert trajs[0].policy_version == 3 and m["perf/learner_idle_s"] >= 0


def test_async_config_validation():
    from agentrl.config import ConfigError

    with pytest.raises(ConfigError, match="max_staleness"):
        load_config(None, ["rollout.mode=async", "rollout.sync_every=3", "train.max_staleness=1"])


def _final_weights(tmp_path, name, extra):
    from agentrl.learner.checkpoints import latest_checkpoint
    from agentrl.models.tiny import load_model
    from agentrl.train import train

    cfg = load_config(None, TINY + [f"out={tmp_path / name}", "env.name=toy", "train.steps=3"] + extra)
    summary = train(cfg)
    model, _ = load_model(latest_checkpoint(tmp_path / name))
    return summary, {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.slow
def test_async_k0_equals_sync(tmp_path):
    """With max_staleness=0 the actor samples batch s with version s: same updates as sync,
    and the final evaluation sees the final weights in both modes (it once evaluated the
    async engine's stale version: a push is applied only when an actor starts a batch)."""
    s_sync, w_sync = _final_weights(tmp_path, "sync", [])
    s_async, w_async = _final_weights(tmp_path, "async", ["rollout.mode=async", "train.max_staleness=0",
                                                          "rollout.batches_in_flight=2"])
    for k in w_sync:
        assert torch.allclose(w_sync[k], w_async[k], atol=1e-6), k
    assert s_sync["eval_after"]["policy_version"] == s_async["eval_after"]["policy_version"] == 3
    for key in ("pass@1", "reward_mean", "tokens_mean"):  # reward_mean: absent when it is pass@1
        assert s_async["eval_after"].get(key) == s_sync["eval_after"].get(key), key
    assert threading.active_count() < 50


@pytest.mark.slow
def test_async_run_respects_staleness_in_metrics(tmp_path):
    import json

    _final_weights(tmp_path, "a2", ["rollout.mode=async", "train.max_staleness=1", "rollout.sync_every=2"])
    rows = [json.loads(x) for x in (tmp_path / "a2" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "rollout/staleness_max" in r]
    assert len(steps) == 3
    assert all(r["rollout/staleness_max"] <= 1 and r["rollout/dropped_stale"] == 0 for r in steps)
    assert all("perf/learner_idle_s" in r for r in steps)


@pytest.mark.slow
def test_async_two_batches_in_flight_run(tmp_path):
    """A real run with 2 batches in flight (K=2) on the in-process engine: every step's batch
    arrives within the bound, nothing is dropped, the new metrics are logged."""
    import json

    _final_weights(tmp_path, "a3", ["rollout.mode=async", "train.max_staleness=2",
                                    "rollout.batches_in_flight=2", "train.steps=4"])
    rows = [json.loads(x) for x in (tmp_path / "a3" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "rollout/staleness_max" in r]
    assert len(steps) == 4
    assert all(r["rollout/staleness_max"] <= 2 and r["rollout/dropped_stale"] == 0 for r in steps)
    assert all(0 <= r["async/batches_in_flight"] <= 2 for r in steps)
    assert [r["perf/loop_s"] for r in steps] == sorted(r["perf/loop_s"] for r in steps)
    assert threading.active_count() < 50


def test_actor_threads_are_capped_at_max_staleness_plus_one():
    """With version v only batches v .. v + K can pass the staleness gate, so more than K + 1
    actor threads would only wait (and hold env sets): the defaults (K=0, 2 in flight) give 1
    thread, and no warning on every async run."""
    from agentrl.config import Config
    from agentrl.rollout.stages import actor_threads

    def threads(bif: int | None, k: int) -> int:
        ro = {"mode": "async", **({} if bif is None else {"batches_in_flight": bif})}
        return actor_threads(Config.model_validate({"rollout": ro, "train": {"max_staleness": k}}))

    assert [threads(None, 0), threads(2, 1), threads(3, 1), threads(1, 5), threads(4, 2), threads(2, 4)] == \
        [1, 2, 2, 1, 3, 2]
