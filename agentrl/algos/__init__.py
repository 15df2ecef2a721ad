"""Algorithms: one small module each, picked by `--algo` from this visible table.

Every algorithm module provides
- `advantages(batch, cfg) -> (advantages (B, T), metrics)`: token-level advantages from the
  collated batch (`scores` (B,), `group_ids` (B,), `loss_mask`, `token_rewards`, ...);
- `loss(logp, batch, cfg, *, num_tokens, num_seqs, entropy=None) -> (loss, metrics)`: the
  scalar loss of a micro-batch, normalised by the global `num_tokens` / `num_seqs` of its
  minibatch so that accumulated micro-batches give the full-batch gradient (case L2).
The pure tensor functions they are built from live in `advantages.py` and `losses.py`.
"""

from __future__ import annotations

import importlib
from types import ModuleType

ALGORITHMS: dict[str, str] = {
    "grpo": "agentrl.algos.grpo",
    "dr_grpo": "agentrl.algos.grpo",  # preset: scale="none", agg="seq-mean-token-sum-norm"
    "gspo": "agentrl.algos.gspo",
    "rloo": "agentrl.algos.rloo",
    "reinforce_pp": "agentrl.algos.reinforce_pp",
    "ppo": "agentrl.algos.ppo",
    "dpo": "agentrl.algos.dpo",
}


def get_algorithm(name: str) -> ModuleType:
    """Import the module of algorithm `name`.

    Raises:
        ValueError: unknown name (the message lists the allowed ones).
    """
    if name not in ALGORITHMS:
        raise ValueError(f"algo: unknown algorithm {name!r}; allowed: {', '.join(ALGORITHMS)}")
    return importlib.import_module(ALGORITHMS[name])
