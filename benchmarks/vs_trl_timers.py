"""Wall-clock timers the benchmark workers patch around the model's compute.

`install()` wraps, at class level (so every instance made afterwards is timed):
- `Qwen2ForCausalLM.forward` -> `gen_forward` inside a generate call, else `fwd_model`;
- `torch.Tensor.backward` -> `backward`;
- `torch.optim.AdamW.step` and `torch.nn.utils.clip_grad_norm_` -> `optim`.
Side-specific wrappers (generate, learner logprobs) use `timed(...)` / `phase(...)`.

Seconds accumulate in `TOTALS` (name -> seconds); a worker takes per-step differences with
`snapshot()`. Nested timers of the same name are not double counted (only the outermost counts).
"""

from __future__ import annotations

import contextlib
import functools
import resource
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

TOTALS: dict[str, float] = defaultdict(float)
_ACTIVE: dict[str, int] = defaultdict(int)
_PHASE: list[str] = []


@contextlib.contextmanager
def timer(name: str):
    """Add the wall time of the block to `TOTALS[name]` (outermost block only)."""
    _ACTIVE[name] += 1
    t0 = time.perf_counter()
    try:
        yield
    finally:
        _ACTIVE[name] -= 1
        if _ACTIVE[name] == 0:
            TOTALS[name] += time.perf_counter() - t0


@contextlib.contextmanager
def phase(name: str):
    """Mark the block as phase `name` (model forwards inside it are booked to `gen_forward`)."""
    _PHASE.append(name)
    try:
        yield
    finally:
        _PHASE.pop()


def timed(fn: Callable, name: str, *, in_phase: str | None = None) -> Callable:
    """`fn` wrapped in `timer(name)` (and `phase(in_phase)`); keeps the signature (`__wrapped__`)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with timer(name), (phase(in_phase) if in_phase else contextlib.nullcontext()):
            return fn(*args, **kwargs)

    return wrapper


def install() -> None:
    """Patch the model forward, backward and optimizer step timers (idempotent per process)."""
    import torch
    from transformers import Qwen2ForCausalLM

    if getattr(Qwen2ForCausalLM.forward, "_bench", False):
        return
    fwd = Qwen2ForCausalLM.forward

    @functools.wraps(fwd)
    def forward(*args: Any, **kwargs: Any) -> Any:
        with timer("gen_forward" if _PHASE and _PHASE[-1] == "generate" else "fwd_model"):
            return fwd(*args, **kwargs)

    forward._bench = True  # type: ignore[attr-defined]
    Qwen2ForCausalLM.forward = forward
    torch.Tensor.backward = timed(torch.Tensor.backward, "backward")
    torch.optim.AdamW.step = timed(torch.optim.AdamW.step, "optim")
    torch.nn.utils.clip_grad_norm_ = timed(torch.nn.utils.clip_grad_norm_, "optim")


def snapshot() -> dict[str, float]:
    """A copy of the totals so far."""
    return dict(TOTALS)


def diff(now: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    """Per-name seconds between two snapshots."""
    return {k: now[k] - before.get(k, 0.0) for k in now}


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, MiB (Linux ru_maxrss is in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def pin_threads(n: int = 1) -> None:
    """torch intra- and inter-op threads = n (call before any parallel work)."""
    import torch

    torch.set_num_threads(n)
    try:
        torch.set_num_interop_threads(n)
    except RuntimeError:  # already set, or parallel work has started
        pass
