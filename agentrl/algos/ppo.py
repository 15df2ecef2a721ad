"""PPO (Schulman et al. 2017) for LLM agents, as in RLHF (Ziegler et al. 2019; Ouyang et al.
2022): a value head on the policy backbone, token-level GAE over the agent's tokens, clipped
policy and value losses, an entropy bonus, and a KL penalty to the frozen reference.

Per step (each agent token is a time step; observation tokens are not, case A4/A7):

    r_t   = env reward on the last token of each turn  [- beta * k1_t, KL in the reward]
    A, R  = gae(r, V_old, loss_mask, gamma, lam, bootstrap = V(s_T) if truncated else 0)
    A     = whiten(A) over the batch's agent tokens
    loss  = clipped surrogate(A) + vf_coef * value_loss(V, V_old, R, clip=value_clip)
            - entropy_coef * H  [+ kl_coef * KL(pi || pi_ref), KL in the loss]

then `update_epochs` passes of `minibatches` optimizer steps over the batch.

Value head. `Learner(value_head=True)` adds `torch.nn.Linear(hidden, 1)` on the policy's last
hidden state, trained jointly with the policy by the same optimizer (its gradient reaches the
shared backbone, scaled by `vf_coef`). V(s_t) for agent token t is the head on the hidden state
of position t-1 (the state in which token t was sampled).

Bootstrap at truncation (case A11). For an episode cut by a turn or token limit the value
after its last agent token is `last_values` = the head on the hidden state of the last agent
token: the value of the context up to and including the final sampled token. The true next
state would also hold the env's reply and the next generation prompt, which a truncated
episode never received; we approximate V(s_T) by the value before them. Terminated episodes
bootstrap with 0.

KL penalty (`kl_coef > 0`). By default in the reward (`kl_in_reward`, as Ziegler et al. and
InstructGPT): each agent token gets -beta * k1_t, k1_t = log pi_old(y_t) - log pi_ref(y_t), and
beta follows the adaptive controller of Ziegler et al. 2019 (sec. 2.2):

    e = clip(KL / kl_target - 1, -0.2, 0.2),    beta <- beta * (1 + e * n / kl_horizon)

with KL the batch mean of sum_t k1_t (nats per sequence) and n the number of sequences;
`kl_target=None` keeps beta = kl_coef fixed. beta is kept in `learner.algo_state` (saved in
checkpoints). `algo.kl_reward_kind` replaces k1 by k2 or k3 in the reward. With
`kl_in_reward=False` the KL (estimator `kl_kind`) is a token-mean term of the loss instead.

`PPOConfig` defaults to several optimizer steps per batch (PPO's sample reuse:
`update_epochs=2`, `minibatches=2`).
"""

from __future__ import annotations

from typing import Any

import torch

from agentrl.algos.advantages import gae, whiten
from agentrl.algos.base import TokenLoss
from agentrl.algos.common import (
    clipped_surrogate,
    drop_invalid_rows,
    kl_entropy_terms,
    kl_penalty_rewards,
    sequence_kl,
    token_rewards,
)
from agentrl.algos.configs import PPOConfig
from agentrl.algos.losses import masked_mean, value_loss


def adaptive_kl_coef(coef: float, current_kl: float, target: float, horizon: float,
                     n_steps: int) -> float:
    """One update of the adaptive KL controller (Ziegler et al. 2019, sec. 2.2; TRL's
    `AdaptiveKLController`).

        e = clip(current_kl / target - 1, -0.2, 0.2);   coef * (1 + e * n_steps / horizon)

    Args:
        coef: the current coefficient beta (>= 0).
        current_kl: the observed KL (nats per sequence).
        target: the KL aimed at (> 0).
        horizon: how many sequences the controller takes to move beta by a factor ~e (> 0).
        n_steps: sequences in this batch.

    Returns:
        the new coefficient.

    Raises:
        ValueError: target or horizon <= 0.
    """
    if target <= 0 or horizon <= 0:
        raise ValueError(f"kl_target and kl_horizon must be > 0, got {target}, {horizon}")
    err = min(max(current_kl / target - 1.0, -0.2), 0.2)
    return coef * (1.0 + err * n_steps / horizon)


def _kl_in_reward(cfg: Any) -> bool:
    return cfg.kl_coef > 0 and bool(cfg.kl_in_reward)


class PPO(TokenLoss):
    """A value head (`value_head`), GAE, clipped policy and value losses, the adaptive KL."""

    name = "ppo"
    config = PPOConfig
    value_head = True

    def prepare(self, batch: dict[str, Any], learner: Any, cfg: Any) -> tuple[dict[str, Any], dict]:
        """One no-grad forward of the sampling weights: `old_logprobs`, `old_values` (B, T) and
        `bootstrap_values` (B,) (V after the last agent token for truncated rows, 0 otherwise).
        Rows with a failed reward are dropped from the loss mask. With the KL in the reward also
        `ref_logprobs` and `kl_coef` (the controller's beta for this batch), and the controller
        steps.

        Raises:
            ValueError: the learner has no value head.
        """
        metrics: dict[str, float] = {"dropped_rows": drop_invalid_rows(batch)}
        logp, values, last = learner.logprobs_and_values(batch)
        batch["old_logprobs"], batch["old_values"] = logp, values
        batch["bootstrap_values"] = torch.where(batch["truncated"], last, 0.0)
        if _kl_in_reward(cfg):
            batch["ref_logprobs"] = learner.logprobs(batch, ref=True)
            beta = float(learner.algo_state.get("kl_coef", cfg.kl_coef))
            batch["kl_coef"] = beta
            seq_kl = sequence_kl(batch)
            target = cfg.kl_target
            if target is not None:
                n = int((batch["loss_mask"] != 0).any(dim=1).sum())
                learner.algo_state["kl_coef"] = adaptive_kl_coef(
                    beta, seq_kl, target, cfg.kl_horizon, n)
            metrics.update(kl_coef=beta, kl=seq_kl)
        return batch, metrics

    def advantages(self, batch: dict[str, Any], cfg: Any) -> tuple[torch.Tensor, dict[str, float]]:
        """GAE over agent tokens with the truncation bootstrap, whitened over the batch.

        Also sets `batch["returns"]` (B, T), the value targets R = A + V_old (before whitening).

        Args:
            batch: `token_rewards`, `loss_mask`, `old_values` (B, T), `bootstrap_values` (B,)
                (from `prepare`); with the KL in the reward `kl_coef`, `old_logprobs`,
                `ref_logprobs`.
            cfg: AlgoConfig (`gamma`, `lam`).

        Returns:
            (B, T) advantages (0 off the mask) and metrics `return_mean`, `value_mean`,
            `adv_mean_raw`.
        """
        mask = batch["loss_mask"]
        rewards = token_rewards(batch)
        if "kl_coef" in batch:
            rewards = rewards + kl_penalty_rewards(batch, batch["kl_coef"], cfg.kl_reward_kind)
        adv, ret = gae(rewards, batch["old_values"], mask, cfg.gamma, cfg.lam,
                       bootstrap_value=batch["bootstrap_values"])
        batch["returns"] = ret
        stats = {"return_mean": float(masked_mean(ret, mask)),
                 "value_mean": float(masked_mean(batch["old_values"], mask)),
                 "adv_mean_raw": float(masked_mean(adv, mask))}
        return whiten(adv, mask), stats

    def loss(self, logp: torch.Tensor, batch: dict[str, Any], cfg: Any, *, num_tokens: float,
             num_seqs: int, entropy: torch.Tensor | None = None,
             values: torch.Tensor | None = None, **kw: Any) -> tuple[torch.Tensor, dict[str, Any]]:
        """Clipped surrogate + vf_coef * (clipped) value loss - entropy bonus [+ KL in the loss].

        Args:
            logp: (B, T) current logprobs (with gradient).
            batch: micro-batch with `old_logprobs`, `advantages`, `old_values`, `returns`,
                `loss_mask` (and `ref_logprobs` for a KL in the loss, `tis_weights` when set).
            values: (B, T) current V(s_t) with gradient (passed by `Learner.update`).
            num_tokens, num_seqs: counts of the whole minibatch (case L2).

        Returns:
            (loss, metrics): policy metrics (`clipfrac`, `approx_kl`, ...) and `vf_loss`,
            `vf_clipfrac`, `value_mean`, `return_mean` (+ `kl`).

        Raises:
            ValueError: `values` is None (the learner needs `value_head=True`).
        """
        if values is None:
            raise ValueError("ppo.loss needs values=: build the Learner with value_head=True")
        mask = batch["loss_mask"]
        pg, metrics = clipped_surrogate(logp, batch, cfg, num_tokens=num_tokens, num_seqs=num_seqs)
        vf, vm = value_loss(values, batch["old_values"], batch["returns"], mask,
                            clip=cfg.value_clip, num_tokens=num_tokens)
        extra, m = kl_entropy_terms(logp, batch, cfg, num_tokens=num_tokens, entropy=entropy,
                                    kl_in_loss=not _kl_in_reward(cfg))
        metrics.update(m)
        metrics.update(vf_loss=vm["vf_loss"], vf_clipfrac=vm["clipfrac"],
                       value_mean=vm["value_mean"], return_mean=vm["return_mean"])
        return pg + cfg.vf_coef * vf + extra, metrics
