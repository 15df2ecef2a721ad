"""Weight pushes on a Ray rollout worker: loaded between two generate calls, or, with partial
rollouts (`rollout.partial` on Ray workers, HF engine), staged and loaded at the engine's next
token boundary.

Without partial rollouts a push waits for the worker's engine lock (`RolloutWorker._lock`,
held by each `generate` call) and lands between two generate calls. With them the push is
staged instead (`StagedPushes`: the newest push wins, an older or repeated one is ignored, so
pushes land in order) and the worker's call returns at once; the staged push is loaded

- by the engine's `weight_poll` at the next token boundary of a running `generate` (in the
  generating thread, which holds the lock): the call's unfinished rows stop after the token
  just sampled and resume from their prefix, re-prefilled with the new weights, each token
  recording the version that sampled it, as in one process (`agentrl.rollout.engines.hf`);
- at once, by the pushing call, when no `generate` holds the lock (the envs are stepping or
  the worker is idle), so the next token is sampled by the new weights;
- by a `run` that catches up on the pool's newest push before it starts (`catch_up`: a worker
  restarted by Ray holds the model directory's weights), waiting for the lock as the
  in-process staleness gate does.

In one process (`agentrl.rollout.source.AsyncSource.poll_weights`) a push that arrives while no
generate runs waits for the next token boundary or the next batch's gate instead: the same
positions for a push that arrives during a generate call, one token earlier otherwise.
`push_id` (the pool's count of pushes) says which push the engine holds, so a restarted worker
knows it missed one even when the version number did not change.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any


class StagedPushes:
    """A worker's pushes with partial rollouts: staged by `push`, loaded by `load_staged`
    (made the engine's `weight_poll` here) at a token boundary, or at once when no generate runs.

    Args:
        worker: the `RolloutWorker`: its `engine` (`update_weights(state_dict, version)`),
            `_lock` (the engine lock, an `RLock` held by each generate call) and `push_id` (the
            push the engine holds, set here when one is loaded) are used at call time.
    """

    def __init__(self, worker: Any) -> None:
        self.worker = worker
        self._staged: tuple[dict[str, Any], int, int] | None = None  # (state dict, version, push id)
        self._mutex = threading.Lock()
        worker.engine.weight_poll = self.load_staged

    def newest(self) -> int:
        """The push id of the newest push held or staged."""
        staged = self._staged
        return max(int(self.worker.push_id), -1 if staged is None else staged[2])

    def push(self, state_dict: dict[str, Any], version: int, push_id: int) -> float:
        """Stage push `push_id` (ignored unless newer than every push held or staged) and load
        it now if no generate call holds the engine lock; returns the seconds taken."""
        t0 = time.perf_counter()
        with self._mutex:
            if push_id > self.newest():
                self._staged = (state_dict, int(version), int(push_id))
        if self.worker._lock.acquire(blocking=False):  # no generate runs: load it now
            try:
                self.load_staged()
            finally:
                self.worker._lock.release()
        return time.perf_counter() - t0

    def load_staged(self) -> bool:
        """Load the staged push, if any, into the engine; returns whether one was loaded. The
        engine's `weight_poll`: the caller holds the engine lock (the generating thread does)."""
        with self._mutex:
            staged, self._staged = self._staged, None
        if staged is None:
            return False
        state_dict, version, push_id = staged
        self.worker.engine.update_weights(state_dict, version)
        self.worker.push_id = push_id
        return True


def catch_up(worker: Any, weights: Sequence[Any] | None) -> None:
    """Before a `run`: load the pool's newest push `weights` (`[push_id, version,
    object_ref_of_state_dict]`, see `RolloutWorker.run`) when the worker neither holds nor has
    staged it (a restarted actor starts from the model directory; the object is fetched only
    then), and a push still staged (`worker.staged`); waits for the engine lock (between two
    generate calls of the runs in flight), as the in-process staleness gate does."""
    staged = worker.staged
    need = weights is not None and int(weights[0]) > (worker.push_id if staged is None else staged.newest())
    if not need and (staged is None or staged.newest() == worker.push_id):
        return  # never go back to older ones
    import ray

    sd = ray.get(weights[2]) if need and weights is not None else None
    with worker._lock:
        if sd is not None and weights is not None and int(weights[0]) > worker.push_id:
            worker.update_weights(sd, int(weights[1]), push_id=int(weights[0]))  # unless a run loaded it
        if staged is not None:
            staged.load_staged()
