"""`Algorithm`: what the training loop and the learner may ask of an algorithm.

An algorithm is a class in `agentrl/algos/<name>.py` (built by `agentrl.algos.get_algorithm`);
its config is the class `config` of `agentrl.algos.configs`. The loop and the learner read its
declared needs below instead of naming an algorithm, and call its steps in this order each
training step: `prepare` -> reference logprobs (when `needs_reference`) -> `advantages` ->
`Learner.update` (-> `loss` per micro-batch).

Tensors are `(B, T)` with a `loss_mask` of 0/1 (1 = agent-sampled token), as in
`advantages.py` and `losses.py`. This module imports no torch.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any


class Algorithm(ABC):
    """The default needs (none) and the steps every algorithm provides.

    Declared needs, read by `agentrl.train` and `agentrl.learner`:
    - `value_head`: build `Learner(value_head=True)`; `loss` then gets `values=` (B, T) (PPO).
    - `needs_teacher`: the run loads a frozen teacher (`algo.teacher_path`, distill).
    - `needs_reference(cfg)`: the batch needs `ref_logprobs` from the frozen reference.
    - `wants_vocab_logprobs(cfg)`: `loss` gets `vocab_logp=` (B, T, V), the policy's
      log-probabilities over the whole vocabulary, with gradient.
    - `idle_zero_advantage_rows(cfg)`: a row whose advantages are all 0 adds nothing to `loss`
      or its gradient, so the learner may leave it out of its forwards.
    - `turn_advantages(cfg)`: the advantages are per turn (they read the turns' rewards).
    - loop hooks of a second sampler (distill's GKD mixture; no-ops by default):
      `check_tokenizer(cfg, tok)` at start-up, `mark_mixture_rows(trajs, version)` on the
      second sampler's episodes, `mixture_metrics(trajs, success)` with the rollout metrics.
    - `norm_len(cfg)`, `entropy_coef(cfg)`, `masks_truncated(cfg)`: the settings of Dr.
      GRPO's L_max, the entropy bonus and DAPO's overlong filtering, for algorithms whose
      config has those keys (None / 0 / False otherwise). (The truncated importance weights
      read `tis_cap`, `tis_level`, `tis_mode` from the config itself: `agentrl.algos.tis`.)
    """

    name: str = ""
    config: type[Any] = object
    """Its config class (`agentrl.algos.configs`)."""
    value_head: bool = False
    needs_teacher: bool = False

    def needs_reference(self, cfg: Any) -> bool:
        """Does this algorithm with `cfg` need the frozen reference's logprobs? (No.)"""
        return False

    def wants_vocab_logprobs(self, cfg: Any) -> bool:
        """Does `loss` read `vocab_logp=` (B, T, V)? (No.)"""
        return False

    def idle_zero_advantage_rows(self, cfg: Any) -> bool:
        """Do rows with all-zero advantages add nothing to the loss? (Not declared: no.)"""
        return False

    def turn_advantages(self, cfg: Any) -> bool:
        """Are the advantages computed per turn? (No.)"""
        return False

    def norm_len(self, cfg: Any) -> int | None:
        """L_max of `agg=seq-mean-token-sum-norm` (None: the batch's padded width)."""
        return None

    def entropy_coef(self, cfg: Any) -> float:
        """Coefficient of the entropy bonus in `loss` (0: none; the entropy needs no gradient)."""
        return 0.0

    def masks_truncated(self, cfg: Any) -> bool:
        """Do rows with a turn cut by `rollout.max_tokens` get loss mask 0 (DAPO)? (No.)"""
        return False

    def check_tokenizer(self, cfg: Any, tok: Any) -> None:
        """Start-up check of the policy's tokenizer against what the algorithm loads (a
        teacher's); raises ValueError when they differ. Default: nothing to check."""
        return None

    def mark_mixture_rows(self, trajs: list[Any], policy_version: int) -> None:
        """Tag the episodes of the run's second sampler (`Loop.mixture_engine`). Default: none."""
        return None

    def mixture_metrics(self, trajs: list[Any], success: Any) -> dict[str, float]:
        """Rollout metrics per sampler of a mixed batch (`success(traj) -> bool`). Default: {}."""
        return {}

    def prepare(self, batch: dict[str, Any], learner: Any, cfg: Any) -> tuple[dict[str, Any], dict]:
        """No-grad passes before the advantages (old logprobs, values) or another batch (DPO's
        pairs); may set `ref_logprobs` itself. Default: the batch unchanged, no metrics."""
        return batch, {}

    @abstractmethod
    def advantages(self, batch: dict[str, Any], cfg: Any) -> tuple[Any, dict[str, float]]:
        """(B, T) advantages (0 off the loss mask) and metrics from the collated batch."""

    @abstractmethod
    def loss(self, logp: Any, batch: dict[str, Any], cfg: Any, *, num_tokens: float,
             num_seqs: int, entropy: Any = None, **kw: Any) -> tuple[Any, dict[str, Any]]:
        """The scalar loss of a micro-batch, normalised by its minibatch's `num_tokens` /
        `num_seqs` (so accumulated micro-batches give the minibatch's gradient). `logp` and
        `entropy` (B, T) are defined where `loss_mask` is nonzero only."""


class PolicyGradient(Algorithm):
    """Clipped policy-gradient algorithms (`configs.PolicyGradientBase`: clips, `kl_coef`,
    `entropy_coef`, `mask_truncated`)."""

    def needs_reference(self, cfg: Any) -> bool:
        """A KL penalty to the reference (`kl_coef > 0`, in the loss or in the reward)."""
        return cfg.kl_coef > 0

    def entropy_coef(self, cfg: Any) -> float:
        """`cfg.entropy_coef`."""
        return cfg.entropy_coef

    def masks_truncated(self, cfg: Any) -> bool:
        """`cfg.mask_truncated`."""
        return cfg.mask_truncated


class TokenLoss(PolicyGradient):
    """Policy-gradient algorithms whose loss sums over tokens (`configs.TokenLossBase`: `agg`,
    `norm_len`, TIS)."""

    def norm_len(self, cfg: Any) -> int | None:
        """`cfg.norm_len`."""
        return cfg.norm_len
