"""Where the learner gets its batches: synchronously (collect, then train: exactly on-policy) or
from asynchronous actors (background threads that keep sampling with the weights they have,
OpenRLHF/IMPALA/PipelineRL style) with bounded staleness.

Several batches in flight (`batches_in_flight`, one actor thread each): while batch `s`'s
episodes wait on their envs (a sandbox run, a judge, a tool call), batch `s+1`'s episodes
generate. All actor threads share one engine; the engine is entered by one call at a time
(`LockedEngine`: a lock around each `generate` and each `update_weights`), so a weight update
lands between two generate calls of a batch that is in flight. Every token's sampler logprob is
recorded by the engine, and a trajectory records the policy version the engine held when its
episode started: the oldest version that sampled any of its tokens, so the staleness the learner
measures is an upper bound.

Bounded staleness is enforced at the source: batch `s` is sampled only once the actor holds
policy version `>= s - max_staleness` (weights are pushed every `sync_every` learner steps).
Batch `s` therefore cannot start before the learner has trained on batch `s - max_staleness - 1`,
so while the learner trains on batch `t`, at most `max_staleness` batches (`t+1 ... t+K`) can be
sampling: two batches in flight during updates need `max_staleness >= 2`.
With `max_staleness=0` and `sync_every=1` batch `s` is sampled with exactly version `s`, one
batch at a time whatever `batches_in_flight` is, so the asynchronous pipeline produces the same
batches, and hence the same updates, as the synchronous loop on the same seed. The learner also
drops (and counts) any trajectory older than `max_staleness` versions, so the bound holds even
for a source that misbehaves.

Exactly-once: actor threads claim batch indices in order, each once; finished batches go to an
in-order reorder buffer and the learner takes `s, s+1, ...` each exactly once, in order; a
batch is never re-sampled or skipped (a rollout worker restart re-issues its in-flight episodes
inside the batch, see `agentrl.rollout.workers`).

Partial rollouts (`rollout.partial=true`, in-process HF or vLLM engine): the engine also polls for
pushed weights at every token boundary (`AsyncSource.poll_weights` as the engine's
`weight_poll`: `HFEngine`'s after every decode step, `VLLMEngine`'s after every vLLM step), so a
push lands inside a running `generate` call: its unfinished rows stop after the token just
sampled, the new weights are loaded, and they resume from the same prefix, re-prefilled (AReaL,
SkyRL, PipelineRL style). Each token records the version that sampled it
(`Trajectory.token_versions`), the learner measures staleness per token and
`train.max_staleness` bounds a trajectory's oldest token (`Trajectory.oldest_version`).
On Ray rollout workers (HF engine) the engine is in another process: the source hands each push
to the workers at once (`push_through`), and each worker stages it and loads it at its engine's
next token boundary (`agentrl.rollout.worker_weights`).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from agentrl.types import Trajectory

RunBatch = Callable[[int], list[Trajectory]]  # batch index -> trajectories
ApplyWeights = Callable[[dict[str, Any], int], None]  # (state_dict, version) -> None


class LockedEngine:
    """An engine entered by one call at a time: `generate` and `update_weights` hold `lock`.

    Several batches in flight share one engine through it; a weight update waits for the
    running `generate` call and lands before the next one. Everything else (`policy_version`,
    `tokenizer`, `model`, ...) is the wrapped engine's.

    Args:
        engine: the engine (`agentrl.rollout.engines.base.Engine`).
        lock: the lock to hold (default: a new `threading.RLock`); an `RLock` lets a caller
            that holds it for longer (evaluation) call `generate` inside.
    """

    def __init__(self, engine: Any, lock: Any = None) -> None:
        self.engine = engine
        self.lock = lock if lock is not None else threading.RLock()

    def generate(self, prompts: list[list[int]], params: Any, **kw: Any) -> list[Any]:
        """The wrapped engine's `generate` (prompt token ids -> `len(prompts) * params.n`
        completions; `kw`: e.g. `images=` for a vision engine), holding `lock`; blocks while
        another call holds it."""
        with self.lock:
            return self.engine.generate(prompts, params, **kw)

    def update_weights(self, state_dict: dict[str, Any], version: int) -> Any:
        """The wrapped engine's `update_weights`, holding `lock` (so it lands between two
        `generate` calls). Raises what the engine raises (bad keys or shapes)."""
        with self.lock:
            return self.engine.update_weights(state_dict, version)

    @property
    def policy_version(self) -> int:
        """The wrapped engine's policy version."""
        return self.engine.policy_version

    @policy_version.setter
    def policy_version(self, v: int) -> None:
        self.engine.policy_version = v

    def __getattr__(self, name: str) -> Any:
        if name in ("engine", "lock"):  # not set yet (e.g. during unpickling)
            raise AttributeError(name)
        return getattr(self.engine, name)


class Leases:
    """A free list of per-batch resources (e.g. a set of env instances and the thread pool that
    steps them), so that batches in flight never share one: `with leases.lease() as item:`.
    A new item is made with `make()` when none is free; items are reused afterwards.

    Args:
        make: builds one item.
        items: items to start with (the first is leased first).
    """

    def __init__(self, make: Callable[[], Any], items: tuple[Any, ...] | list[Any] = ()) -> None:
        self.make = make
        self.items: list[Any] = list(items)  # every item ever made, for shutdown
        self._free: list[Any] = list(reversed(self.items))
        self._lock = threading.Lock()

    def fill(self, n: int) -> None:
        """Make items until there are at least `n` (e.g. one per batch in flight, at start-up,
        so that they are built in a deterministic order)."""
        with self._lock:
            while len(self.items) < n:
                item = self.make()
                self.items.append(item)
                self._free.insert(0, item)

    @contextmanager
    def lease(self) -> Iterator[Any]:
        """Hold a free item (made if none is free) for the `with` block; it is free again after."""
        with self._lock:
            item = self._free.pop() if self._free else None
        if item is None:
            item = self.make()
            with self._lock:
                self.items.append(item)
        try:
            yield item
        finally:
            with self._lock:
                self._free.append(item)


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
    """`batches_in_flight` actor threads that sample batches `start, start+1, ...` ahead of the
    learner, with bounded staleness.

    Each actor thread claims the next batch index (in order, each once), waits at the staleness
    gate for it (batch `s` needs version `>= s - max_staleness`), loads the newest pushed weights
    if there are any, samples the batch and puts it in an in-order reorder buffer; the learner
    takes `s, s+1, ...` from it. An exception in a batch is handed to the learner when it asks
    for that batch (no batch after it is claimed any more).

    Args:
        run_batch: samples batch `s` with the weights the engine holds (called by several
            threads at once when `batches_in_flight > 1`: it must not share envs between calls,
            and its engine must serialize `generate` and `update_weights`, see `LockedEngine`).
        apply_weights: loads weights into the engine. Called from an actor thread, one call at a
            time and in push order; with batches in flight it must not race a running
            `generate` (hold the engine's lock).
        start: first batch index; version: the policy version the engine holds at start.
        max_staleness: batch `s` waits until the actor holds version `>= s - max_staleness`.
        queue_size: backpressure: a batch is claimed only while fewer than
            `queue_size + batches_in_flight` batches are claimed and not yet taken by the learner
            (finished and waiting, or sampling), which bounds memory.
        batches_in_flight: actor threads, i.e. most batches sampling at once.
        end: no batch index `>= end` is sampled (None: no end), so that no work is wasted at the
            end of training.
        push_through: `push_weights` calls `apply_weights` at once, in the pushing thread,
            instead of leaving the push for an actor thread: for engines that take a push while
            they generate (Ray rollout workers with partial rollouts stage it and load it at
            their next token boundary), so that it reaches them inside the running batch.

    Attributes:
        history: one record per sampled batch, in the order they finished: `batch`, `version`
            (held when it started), `start`/`end` (`time.perf_counter()`), `actor` (thread
            index), `error` (bool). The last 10,000 are kept.
    """

    def __init__(self, run_batch: RunBatch, apply_weights: ApplyWeights, *, start: int,
                 version: int, max_staleness: int, queue_size: int = 2, batches_in_flight: int = 1,
                 end: int | None = None, push_through: bool = False):
        if batches_in_flight < 1:
            raise ValueError(f"batches_in_flight must be >= 1, got {batches_in_flight}")
        self.run_batch = run_batch
        self.apply_weights = apply_weights
        self.max_staleness = max_staleness
        self.queue_size = max(1, queue_size)
        self.batches_in_flight = batches_in_flight
        self.end = end
        self.push_through = push_through
        self._cond = threading.Condition()
        self._apply_lock = threading.Lock()  # weights are applied one push at a time, in order
        self._pending: tuple[dict[str, Any], int] | None = None
        self._version = version
        self._stop = False
        self._failed = False
        self._next = start  # next batch index to claim
        self._want = start  # next batch index the learner takes
        self._ready: dict[int, Any] = {}  # finished batches (or their exception) by index
        self._sampling: set[int] = set()
        self.rollout_idle_s = 0.0
        self.history: deque[dict[str, Any]] = deque(maxlen=10_000)
        self._threads = [threading.Thread(target=self._loop, args=(i,), name=f"agentrl-actor-{i}",
                                          daemon=True) for i in range(batches_in_flight)]
        for t in self._threads:
            t.start()

    # -- actor threads ---------------------------------------------------------------------------
    def _apply(self, state_dict: dict[str, Any], version: int) -> None:
        """`apply_weights` and record `version` as held (the caller holds `_apply_lock`)."""
        self.apply_weights(state_dict, version)
        with self._cond:
            self._version = max(self._version, version)
            self._cond.notify_all()

    def _take_weights(self) -> None:
        """Apply the newest pushed weights, if any (outside `_cond`: loading may wait for a
        running generate call; `_apply_lock` keeps pushes in order)."""
        with self._apply_lock:
            with self._cond:
                pending, self._pending = self._pending, None
            if pending is not None:
                self._apply(*pending)

    def poll_weights(self) -> bool:
        """Partial rollouts (`rollout.partial`): the engine's `weight_poll`, called by the
        generating actor thread at each token boundary (holding the engine's lock). Applies the
        newest pushed weights now, if any, and returns whether it did; False at once when
        nothing is pending or another thread is applying weights (that thread waits for the
        engine's lock, which this one holds: blocking here would deadlock)."""
        if self._pending is None or self._stop:  # the common case: one unlocked read per token
            return False
        if not self._apply_lock.acquire(blocking=False):
            return False
        try:
            with self._cond:
                pending, self._pending = self._pending, None
            if pending is None:
                return False
            self._apply(*pending)
            return True
        finally:
            self._apply_lock.release()

    def _claim(self) -> int | None:
        """The next batch index, once backpressure allows; None when stopping."""
        with self._cond:
            while not (self._stop or self._failed) and \
                    self._next - self._want >= self.queue_size + self.batches_in_flight:
                self._cond.wait()
            if self._stop or self._failed or (self.end is not None and self._next >= self.end):
                return None
            s = self._next
            self._next += 1
            return s

    def _gate(self, s: int) -> bool:
        """Wait until the actor holds weights fresh enough for batch `s` (loading the newest
        pushed ones); False when stopping."""
        need = s - self.max_staleness
        while True:
            with self._cond:
                while not self._stop and self._version < need and \
                        (self._pending is None or self._pending[1] < need):
                    self._cond.wait()
                if self._stop:
                    return False
            self._take_weights()
            with self._cond:
                if self._version >= need:
                    return True

    def _loop(self, actor: int) -> None:
        while True:
            t0 = time.perf_counter()
            s = self._claim()
            if s is None:
                return
            try:
                if not self._gate(s):
                    return
                with self._cond:
                    version = self._version
                    self._sampling.add(s)
                    self.rollout_idle_s += time.perf_counter() - t0
                t_start = time.perf_counter()
                item: Any = self.run_batch(s)
            except BaseException as e:  # noqa: BLE001 - handed to the learner, which raises it
                item = e
                version = self._version
                t_start = time.perf_counter()
            failed = isinstance(item, BaseException)
            with self._cond:
                self.history.append({"batch": s, "version": version, "start": t_start,
                                     "end": time.perf_counter(), "actor": actor, "error": failed})
                self._sampling.discard(s)
                self._ready[s] = item
                self._failed = self._failed or failed
                self._cond.notify_all()
            if failed:
                return

    # -- the learner's side ----------------------------------------------------------------------
    def next_batch(self, step: int) -> tuple[list[Trajectory], dict[str, float]]:
        """Block until batch `step` is ready; returns it with source metrics:
        `perf/learner_idle_s` (seconds waited), `perf/rollout_idle_s` (seconds the actor threads
        waited at the staleness gate or for backpressure since the last call, summed over
        threads), `async/queue_depth` (finished batches waiting when called),
        `async/batches_in_flight` (batches sampling when batch `step` was taken).

        Raises:
            RuntimeError: batches asked for out of order (a bug), the actor failed on this batch
                (chained), or every actor thread stopped without producing it.
        """
        t0 = time.perf_counter()
        with self._cond:
            if step != self._want:
                raise RuntimeError(f"async source: expected batch {self._want}, got {step}")
            depth = float(len(self._ready))
            while step not in self._ready:
                if not any(t.is_alive() for t in self._threads):
                    raise RuntimeError(f"rollout actor stopped before batch {step}")
                self._cond.wait(timeout=1.0)
            item = self._ready.pop(step)
            self._want = step + 1
            in_flight = float(len(self._sampling))
            idle, self.rollout_idle_s = self.rollout_idle_s, 0.0
            self._cond.notify_all()  # backpressure: a batch may be claimed now
        waited = time.perf_counter() - t0
        if isinstance(item, BaseException):
            raise RuntimeError("rollout actor failed") from item
        return item, {"perf/learner_idle_s": waited, "perf/rollout_idle_s": idle,
                      "async/queue_depth": depth, "async/batches_in_flight": in_flight}

    def push_weights(self, state_dict: dict[str, Any], version: int) -> None:
        """Hand the actors a copy of the weights; the next actor thread to pass its staleness
        gate loads them (between two generate calls of any batch in flight). With
        `push_through`: `apply_weights` now, in this thread (no copy: it must copy or send them)."""
        if self.push_through:
            with self._apply_lock:
                self._apply(state_dict, version)
            return
        copy = {k: v.detach().clone() for k, v in state_dict.items()}
        with self._cond:
            self._pending = (copy, version)
            self._cond.notify_all()

    def close(self) -> None:
        """Stop the actor threads (each after its current batch) and wait for them."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        for t in self._threads:
            t.join(timeout=60)
