"""Algorithms: one small module each, picked by `--algo` from this visible table.

Every algorithm module provides
- `advantages(batch, cfg) -> (advantages (B, T), metrics)`: token-level advantages from the
  collated batch (`scores` (B,), `group_ids` (B,), `loss_mask`, `token_rewards`, ...);
- `loss(logp, batch, cfg, *, num_tokens, num_seqs, entropy=None) -> (loss, metrics)`: the
  scalar loss of a micro-batch, normalised by the global `num_tokens` / `num_seqs` of its
  minibatch so that accumulated micro-batches give the full-batch gradient (case L2).
  `logp` and `entropy` (B, T) are defined where `loss_mask` is nonzero; elsewhere they are 0
  (the learner computes them only there, `Learner(prefix_share=True)`), so a loss reads them
  through the mask only.
The pure tensor functions they are built from live in `advantages.py` and `losses.py`.

Optional module-level hooks (absent = the default in brackets); `agentrl.train.train` reads
them, in this order each step: `build_batch` -> `prepare` -> reference logprobs ->
`advantages` -> `Learner.update` (-> `loss`):
- `DEFAULTS: dict` [{}]: values for `AlgoConfig` fields the user did not set (pydantic's
  `model_fields_set`), applied once by `resolve_config` (e.g. GSPO's small clip ranges).
- `NEEDS_REF: bool` [False]: the algorithm always needs `batch["ref_logprobs"]` (DPO). With
  `kl_coef > 0` every algorithm gets them (`needs_reference`).
- `VALUE_HEAD: bool` [False]: build `Learner(value_head=True)`; `loss` is then called with
  `values=` (B, T) V(s_t) with gradient (PPO).
- `idle_zero_advantage_rows(cfg) -> bool` [False]: rows whose advantages are all 0 add nothing
  to `loss` or its gradient under this config (a pure policy-gradient loss: no KL in the loss,
  no entropy bonus), so the learner may leave them out of its forwards (GRPO, GSPO, RLOO,
  REINFORCE++; `train.skip_zero_advantage`).
- `wants_vocab_logprobs(cfg) -> bool` [False]: `loss` is called with `vocab_logp=` (B, T, V),
  the policy's log-probabilities over the whole vocabulary at each position, with gradient
  (`agentrl.learner.local.token_vocab_logprobs`; distill's `distill_kl=full|topk`).
- `OPTIONS: tuple[str, ...]` [()]: the optional `AlgoConfig` features (keys of `OPTIONAL`) the
  algorithm supports; `check_options` refuses the others at start-up when they are switched on,
  so no option is silently ignored.
- `prepare(batch, learner, cfg) -> (batch, metrics)` [identity]: no-grad forward passes an
  algorithm needs before its advantages (old logprobs for a KL in the reward, PPO's old values
  and bootstrap values) or a different batch (online DPO's preference pairs). It may set
  `ref_logprobs` itself; train then does not recompute them.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

ALGORITHMS: dict[str, str] = {
    "grpo": "agentrl.algos.grpo",
    "dr_grpo": "agentrl.algos.grpo",  # preset: scale="none", agg="seq-mean-token-sum-norm"
    "gspo": "agentrl.algos.gspo",
    "rloo": "agentrl.algos.rloo",
    "reinforce_pp": "agentrl.algos.reinforce_pp",
    "ppo": "agentrl.algos.ppo",
    "dpo": "agentrl.algos.dpo",
    "cispo": "agentrl.algos.cispo",
    "gigpo": "agentrl.algos.gigpo",
    "distill": "agentrl.algos.distill",
}

OPTIONAL: dict[str, Any] = {
    "turn_advantages": False,
    "turn_credit": "episode",
    "dual_clip": None,
    "tis_cap": None,
    "overlong_buffer": 0,
    "mask_truncated": False,
}
"""Optional features of `AlgoConfig` and the value that means "off". An algorithm supports the
ones in its module's `OPTIONS`; `check_options` refuses a switched-on one it does not."""


def get_algorithm(name: str) -> ModuleType:
    """Import the module of algorithm `name`.

    Raises:
        ValueError: unknown name (the message lists the allowed ones).
    """
    if name not in ALGORITHMS:
        raise ValueError(f"algo: unknown algorithm {name!r}; allowed: {', '.join(ALGORITHMS)}")
    return importlib.import_module(ALGORITHMS[name])


def needs_reference(algo: ModuleType, cfg: Any) -> bool:
    """Does `algo` with `cfg` need the frozen reference model (`ref_logprobs`)?

    True when the module sets `NEEDS_REF = True` (DPO) or `cfg.kl_coef > 0` (a KL penalty,
    in the loss or in the reward).
    """
    return bool(getattr(algo, "NEEDS_REF", False)) or getattr(cfg, "kl_coef", 0.0) > 0


def check_options(algo: ModuleType, cfg: Any) -> None:
    """Refuse optional features (`OPTIONAL`) that `cfg` switches on and the algorithm does not
    support (its `OPTIONS`), so that none is silently ignored.

    Raises:
        ValueError: naming the key, the algorithm, and the algorithms that support it.
    """
    supported = getattr(algo, "OPTIONS", ())
    for key, off in OPTIONAL.items():
        value = getattr(cfg, key, off)
        if value == off or key in supported:
            continue
        others = [n for n in ALGORITHMS if key in getattr(get_algorithm(n), "OPTIONS", ())]
        raise ValueError(f"algo.{key}={value!r} is not supported by algo.name={cfg.name}; "
                         f"supported by: {', '.join(others) or 'none'} (or set algo.{key}={off!r})")


def resolve_config(algo: ModuleType, cfg: Any) -> Any:
    """`cfg` with the algorithm's `DEFAULTS` filled into the fields the user did not set.

    A field counts as set when it is in pydantic's `cfg.model_fields_set` (given in a YAML file,
    an override or a keyword), so an explicit value equal to the global default is kept.
    With `turn_credit=gigpo` GiGPO's `DEFAULTS` (its gamma) are filled in too, under the
    algorithm's own, so that `--algo grpo algo.turn_credit=gigpo` resolves to `--algo gigpo`'s
    settings. Objects without `model_fields_set` (e.g. a `SimpleNamespace` in tests) are
    returned as is.

    Returns:
        a copy of `cfg` (the input is not modified), or `cfg` itself when nothing changes.
    """
    defaults = dict(getattr(algo, "DEFAULTS", {}))
    if getattr(cfg, "turn_credit", "episode") == "gigpo":  # GiGPO's credit brings GiGPO's gamma
        defaults = {**get_algorithm("gigpo").DEFAULTS, **defaults}
    fields_set = getattr(cfg, "model_fields_set", None)
    if not defaults or fields_set is None:
        return cfg
    update = {k: v for k, v in defaults.items() if k not in fields_set}
    return cfg.model_copy(update=update) if update else cfg
