"""Algorithms: one small file each, picked by `--algo` from this visible table.

An algorithm is a class (`agentrl.algos.base.Algorithm`) in `agentrl/algos/<name>.py` with
its steps, `prepare(batch, learner, cfg)`, `advantages(batch, cfg)` and `loss(logp, batch,
cfg, ...)`, and its declared needs (reference logprobs, a value head, a teacher, vocabulary
logprobs, idle zero-advantage rows, turn advantages), which the loop and the learner read
instead of naming an algorithm. Its config is a class of `agentrl.algos.configs` (the `algo`
section of the config, a union keyed on `algo.name`; torch-free). The pure tensor functions
they are built from live in `advantages.py`, `losses.py`, `kl.py`, `tis.py`, `logits.py`, `turns.py` and `shaping.py`.

This module imports no torch: an algorithm's file is imported by `get_algorithm`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentrl.algos.base import Algorithm

ALGORITHMS: dict[str, str] = {
    "grpo": "agentrl.algos.grpo:GRPO",
    "dr_grpo": "agentrl.algos.grpo:DrGRPO",  # preset: scale="none", agg="seq-mean-token-sum-norm"
    "gspo": "agentrl.algos.gspo:GSPO",
    "rloo": "agentrl.algos.rloo:RLOO",
    "reinforce_pp": "agentrl.algos.reinforce_pp:ReinforcePP",
    "ppo": "agentrl.algos.ppo:PPO",
    "dpo": "agentrl.algos.dpo:DPO",
    "cispo": "agentrl.algos.cispo:CISPO",
    "gigpo": "agentrl.algos.gigpo:GiGPO",
    "distill": "agentrl.algos.distill:Distill",
}
"""Algorithm name -> `module:Class` (its config: `agentrl.algos.configs.ALGO_CONFIGS`)."""


def get_algorithm(name: str) -> Algorithm:
    """An instance of algorithm `name` (its module imported on first use).

    Raises:
        ValueError: unknown name (the message lists the allowed ones).
    """
    if name not in ALGORITHMS:
        raise ValueError(f"algo: unknown algorithm {name!r}; allowed: {', '.join(ALGORITHMS)}")
    module, _, cls = ALGORITHMS[name].partition(":")
    return getattr(importlib.import_module(module), cls)()
