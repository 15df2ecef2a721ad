"""Where the learner gets its batches: synchronously (collect, then train: exactly on-policy) or
from an asynchronous actor (a background thread that keeps sampling with the weights it has,
OpenRLHF/IMPALA style) with bounded staleness.

Bounded staleness is enforced at the source: batch `s` is sampled only once the actor holds
policy version `>= s - max_staleness` (weights are pushed every `sync_every` learner steps).
With `max_staleness=0` and `sync_every=1` the actor samples batch `s` with exactly version `s`,
so the asynchronous pipeline produces the same batches, and hence the same updates, as the
synchronous loop on the same seed. The learner also drops (and counts) any trajectory older
than `max_staleness` versions, so the bound holds even for a source that misbehaves.

Exactly-once: batch indices are produced in order, each once, and consumed in order; a batch
is never re-sampled or skipped (a rollout worker restart re-issues its in-flight episodes inside
the batch, see `agentrl.rollout.workers`).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from agentrl.trajectory import Trajectory

RunBatch = Callable[[int], list[Trajectory]]  # batch index -> trajectories
ApplyWeights = Callable[[dict[str, Any], int], None]  # (state_dict, version) -> None


class SyncSource:
    """Collect batch `s` when the learner asks for it, with the current weights."""

    def __init__(self, run_batch: RunBatch, apply_weights: ApplyWeights):
        self.run_batch = run_batch
        self.apply_weights = apply_weights

    def next_batch(self, step: int) -> tuple[list[Trajectory], dict[str, float]]:
        """Trajectories of batch `step` and source metrics (`perf/learner_idle_s`: seconds the
        learner waited, here the whole rollout)."""
        t0 = time.perf_counter()
        trajs = self.run_batch(step)
        return trajs, {"perf/learner_idle_s": time.perf_counter() - t0, "async/queue_depth": 0.0}

    def push_weights(self, state_dict: dict[str, Any], version: int) -> None:
        """Give the actor the learner's weights (applied at once)."""
        self.apply_weights(state_dict, version)

    def close(self) -> None:
        pass


class AsyncSource:
    """An actor thread that samples batches `start, start+1, ...` ahead of the learner.

    Args:
        run_batch: samples batch `s` with the weights the actor holds.
        apply_weights: loads weights into the actor's engine (called only from the actor thread,
            between batches, so it never races a generation).
        start: first batch index; version: the policy version the actor holds at start.
        max_staleness: batch `s` waits until the actor holds version `>= s - max_staleness`.
        queue_size: most finished batches waiting for the learner (backpressure).
    """

    def __init__(self, run_batch: RunBatch, apply_weights: ApplyWeights, *, start: int,
                 version: int, max_staleness: int, queue_size: int = 2):
        self.run_batch = run_batch
        self.apply_weights = apply_weights
        self.max_staleness = max_staleness
        self.queue: queue.Queue = queue.Queue(maxsize=max(1, queue_size))
        self._cond = threading.Condition()
        self._pending: tuple[dict[str, Any], int] | None = None
        self._version = version
        self._stop = False
        self._next = start
        self.rollout_idle_s = 0.0
        self._thread = threading.Thread(target=self._loop, name="agentrl-actor", daemon=True)
        self._thread.start()

    def _take_weights(self) -> None:
        if self._pending is not None:
            sd, v = self._pending
            self._pending = None
            self.apply_weights(sd, v)
            self._version = v

    def _loop(self) -> None:
        while True:
            s = self._next
            t0 = time.perf_counter()
            with self._cond:
                # wait for weights fresh enough for batch s (the staleness bound)
                while not self._stop and (self._pending is None or self._pending[1] < s - self.max_staleness) \
                        and self._version < s - self.max_staleness:
                    self._cond.wait()
                if self._stop:
                    return
                self._take_weights()
            self.rollout_idle_s += time.perf_counter() - t0
            try:
                item: Any = self.run_batch(s)
            except BaseException as e:  # noqa: BLE001 - handed to the learner, which raises it
                item = e
            t0 = time.perf_counter()
            while not self._stop:
                try:
                    self.queue.put((s, item), timeout=0.1)
                    break
                except queue.Full:
                    continue
            self.rollout_idle_s += time.perf_counter() - t0
            self._next = s + 1
            if isinstance(item, BaseException):
                return

    def next_batch(self, step: int) -> tuple[list[Trajectory], dict[str, float]]:
        """Block until batch `step` is ready; returns it with source metrics.

        Raises:
            RuntimeError: batches arrived out of order (a bug), or the actor failed (chained).
        """
        depth = float(self.queue.qsize())
        t0 = time.perf_counter()
        s, item = self.queue.get()
        waited = time.perf_counter() - t0
        if isinstance(item, BaseException):
            raise RuntimeError("rollout actor failed") from item
        if s != step:
            raise RuntimeError(f"async source: expected batch {step}, got {s}")
        idle, self.rollout_idle_s = self.rollout_idle_s, 0.0
        return item, {"perf/learner_idle_s": waited, "perf/rollout_idle_s": idle,
                      "async/queue_depth": depth}

    def push_weights(self, state_dict: dict[str, Any], version: int) -> None:
        """Hand the actor a copy of the weights; it loads them before its next batch."""
        copy = {k: v.detach().clone() for k, v in state_dict.items()}
        with self._cond:
            self._pending = (copy, version)
            self._cond.notify_all()

    def close(self) -> None:
        """Stop the actor (after its current batch) and wait for it."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(timeout=60)
