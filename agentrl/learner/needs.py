"""What the learner reads of an algorithm and its config: each need read in one place.

The algorithm object arrives from the caller (`Learner.update(batch, algo, cfg)`,
`make_learner(cfg, algo, ...)`); the learner imports no algorithm. Today an algorithm is a
module whose optional names declare its needs (`agentrl.algos` lists them); these functions
read them, with the default when a name is absent.
"""

from __future__ import annotations

from typing import Any


def value_head(algo: Any) -> bool:
    """The loss takes `values=` from a value head on the policy (`VALUE_HEAD`, PPO)."""
    return bool(getattr(algo, "VALUE_HEAD", False))


def reference(algo: Any, cfg: Any) -> bool:
    """The algorithm needs the frozen reference's logprobs: it always does (`NEEDS_REF`, DPO)
    or `cfg.kl_coef > 0` (a KL penalty in the loss or the reward)."""
    return bool(getattr(algo, "NEEDS_REF", False)) or getattr(cfg, "kl_coef", 0.0) > 0


def vocab_logprobs(algo: Any, cfg: Any) -> bool:
    """The loss takes `vocab_logp=` (B, T, V), the whole next-token distribution
    (`wants_vocab_logprobs(cfg)`; distill's `distill_kl=full|topk`)."""
    hook = getattr(algo, "wants_vocab_logprobs", None)
    return bool(hook(cfg)) if hook is not None else False


def idle_zero_advantage_rows(algo: Any, cfg: Any) -> bool:
    """Rows whose advantages are all 0 add nothing to the loss or its gradient under `cfg`
    (`idle_zero_advantage_rows(cfg)`), so the update may leave them out of its forwards."""
    hook = getattr(algo, "idle_zero_advantage_rows", None)
    return hook is not None and bool(hook(cfg))


def importance_correction(cfg: Any) -> bool:
    """The loss corrects the sampler/learner mismatch (`cfg.tis_cap`): it needs
    `old_logprobs` from a forward before the update's first step."""
    return getattr(cfg, "tis_cap", None) is not None
