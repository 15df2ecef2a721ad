"""Proposed speed-ups of agentrl's training path, applied by monkeypatching so the benchmark can
measure them before anyone edits the library (see proposed_patches.md for the diffs).

No patch is pending now (`PATCHES` is empty). `apply([...])` installs the named ones in this
process (`"all"`: every one); `ENABLED[name] = False` turns an installed patch off again, so one
process can alternate with and without it.

The engine-side patches measured here before are in the library too: `fast_decode` is
`agentrl/models/static_decode.py` (`StaticDecoder`), used by `HFEngine` by default
(`HFEngine(..., static_decode=False)` is the transformers decode; `benchmarks/decode_step.py`
times both), and `fast_sync` is `HFEngine.update_weights` (direct `Tensor.copy_` after the
checks, without the cached plan the patch kept).

The learner-side patches measured here before (`prefix_share`, `logits_from_loss`,
`fused_adamw`) are now in the library: `agentrl/learner/prefix_share.py` with
`Learner(prefix_share=True)` (config `train.prefix_share`) and the fused AdamW of
`agentrl.learner.optim.make_adamw`; `benchmarks/learner_update.py` times the update with prefix
sharing on and off.
"""

from __future__ import annotations

import functools
from typing import Any

PATCHES: tuple[str, ...] = ()
APPLIED = {"prefix_share": "agentrl/learner/prefix_share.py, Learner(prefix_share=True)",
           "logits_from_loss": "agentrl/learner/prefix_share.py (subsumed by prefix_share)",
           "fused_adamw": "agentrl.learner.optim.make_adamw",
           "fast_decode": "agentrl/models/static_decode.py, HFEngine(static_decode=True)",
           "fast_sync": "agentrl.rollout.engines.hf.HFEngine.update_weights"}
"""Patches proposed here before and now in the library (name -> where)."""


_ORIG: dict[str, Any] = {}
ENABLED: dict[str, bool] = {}
"""name -> whether an installed patch is active (default True); the benchmark flips these per
step for in-process A/B measurements."""


def _switch(name: str, new: Any, old: Any) -> Any:
    """A function that calls `new` while `ENABLED[name]` (default True), else `old`."""

    @functools.wraps(new)
    def call(*args: Any, **kwargs: Any) -> Any:
        return (new if ENABLED.get(name, True) else old)(*args, **kwargs)

    return call


def apply(names: list[str]) -> list[str]:
    """Install the named patches in this process; returns the installed names.

    Raises:
        ValueError: an unknown name (allowed: PATCHES or "all").
    """
    names = [n for n in names if n]
    if "all" in names:
        names = list(PATCHES)
    done = [f"{n} ({APPLIED[n]})" for n in names if n in APPLIED]
    if done:
        raise ValueError(f"already applied in the library: {', '.join(done)}")
    bad = [n for n in names if n not in PATCHES]
    if bad:
        raise ValueError(f"unknown patches {bad}; allowed: {', '.join(PATCHES)}, all")
    return names


__all__ = ["APPLIED", "ENABLED", "PATCHES", "apply"]
