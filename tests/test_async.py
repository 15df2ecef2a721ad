"""Asynchronous actor-learner: the staleness bound, K=0 equals the synchronous loop, exactly-once
batches, and actor failures surface in the learner."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from agentrl.config import load_config
from agentrl.rollout.source import AsyncSource, SyncSource
from agentrl.trajectory import Trajectory

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
    from agentrl.learner import latest_checkpoint
    from agentrl.model import load_model
    from agentrl.train import train

    cfg = load_config(None, TINY + [f"out={tmp_path / name}", "env.name=toy", "train.steps=3"] + extra)
    summary = train(cfg)
    model, _ = load_model(latest_checkpoint(tmp_path / name))
    return summary, {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.slow
def test_async_k0_equals_sync(tmp_path):
    """With max_staleness=0 the actor samples batch s with version s: same updates as sync."""
    _, w_sync = _final_weights(tmp_path, "sync", [])
    _, w_async = _final_weights(tmp_path, "async", ["rollout.mode=async", "train.max_staleness=0"])
    for k in w_sync:
        assert torch.allclose(w_sync[k], w_async[k], atol=1e-6), k
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
