"""The `algo` section of the config: one class per algorithm, a discriminated union on `name`.

A user sees only the keys of the algorithm they chose (`agentrl config --reference --algo
cispo`); a key the algorithm does not read (`algo.vf_coef` with grpo, `algo.tis_cap` with gspo)
is refused by the schema, naming the key and the algorithms that have it. Keys more than one
algorithm reads sit in small shared bases (`AlgoBase`, `PolicyGradientBase`, ...); each
algorithm's own defaults are its class's defaults (GSPO's clips, CISPO's `clip_low`, PPO's
epochs and minibatches, GiGPO's gamma), so a value the user set always wins.

This module imports no torch (`agentrl.config` parses the command line before the heavy
imports); the algorithms' code is in `agentrl/algos/<name>.py` (`agentrl.algos.get_algorithm`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

SECTION = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_assignment=True,
                     allow_inf_nan=False)  # a float key must be finite (`train.lr=inf` is refused)
"""The pydantic settings of every config section (`agentrl.config`)."""

GIGPO_GAMMA = 0.95
"""GiGPO's discount of the step returns (Feng et al. 2025, sec. 5.1), also the default gamma of
`turn_credit=gigpo` on grpo, dr_grpo and cispo."""


class _Mixin(BaseModel):
    """Keys a few algorithms share (their field docstrings are the reference's text)."""

    model_config = SECTION


class AlgoBase(BaseModel):
    """Keys every algorithm reads: rollout groups, the update's epochs and minibatches, DAPO
    dynamic sampling and overlong shaping."""

    model_config = SECTION

    name: str
    """Algorithm: one of grpo, dr_grpo, gspo, rloo, reinforce_pp, ppo, dpo, cispo, gigpo, distill (docs/algorithms.md has the table of formulas, defaults and the keys each reads; `agentrl config --reference --algo NAME` lists its keys)."""
    group_size: int = Field(default=8, ge=1)
    """Episodes per task (G) for group-relative algorithms."""
    update_epochs: int = Field(default=1, ge=1)
    """Passes over each batch."""
    minibatches: int = Field(default=1, ge=1)
    """Optimizer steps per epoch (the batch is split into this many minibatches)."""
    dynamic_sampling: bool = False
    """Drop the groups that carry no gradient from the batch and refill it (DAPO dynamic sampling): groups whose episode returns are all equal, except, under `turn_credit=gigpo` or `turn_advantages`, those with a nonzero turn-level advantage (`shaping.flat_groups`)."""
    overlong_buffer: int = Field(default=0, ge=0)
    """DAPO overlong reward shaping (Yu et al. 2025, eq. 13): a turn of L sampled tokens gets `-overlong_penalty * min(1, (L - (max_tokens - buffer)) / buffer)` added to its reward when L > `rollout.max_tokens` - buffer (0: off). Applied before the advantages, for every algorithm."""
    overlong_penalty: float = Field(default=1.0, ge=0)
    """Largest overlong penalty (a turn that used all of `rollout.max_tokens`); DAPO uses 1."""


class PolicyGradientBase(AlgoBase):
    """Keys of the clipped policy-gradient algorithms (all but dpo)."""

    clip_low: float = Field(default=0.2, ge=0.0)
    """PPO ratio clip below: ratio >= 1 - clip_low."""
    clip_high: float = Field(default=0.28, ge=0.0)
    """PPO ratio clip above (clip-higher, DAPO): ratio <= 1 + clip_high."""
    kl_coef: float = Field(default=0.0, ge=0.0)
    """Coefficient of the KL penalty to the frozen reference (0: no reference model)."""
    entropy_coef: float = 0.0
    """Entropy bonus coefficient."""
    mask_truncated: bool = False
    """DAPO overlong filtering: samples with a turn cut by `rollout.max_tokens` (finish reason `length`) get loss mask 0 (they still count in their group's statistics)."""


class TokenLossBase(PolicyGradientBase):
    """Keys of the algorithms whose loss is a sum over tokens (all but gspo and dpo)."""

    agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = "token-mean"
    """Loss aggregation over tokens and sequences."""
    norm_len: int | None = Field(default=None, ge=1)
    """L_max of `agg=seq-mean-token-sum-norm` (Dr. GRPO's constant normaliser): a generation budget in tokens, e.g. `rollout.max_tokens` x turns. None: the padded width of the batch (prompt included), which changes from batch to batch."""
    tis_cap: float | None = Field(default=None, gt=0)
    """Truncated importance sampling cap C for the sampler/learner gap (None: off): the per-token policy loss is multiplied by a weight from w = pi_learner / pi_sampler (Yao et al. 2025)."""
    tis_level: Literal["token", "sequence"] = "token"
    """With `tis_cap`: the ratio w per token, or per sequence (the product of the row's token ratios, on each of its tokens)."""
    tis_mode: Literal["truncate", "mask"] = "truncate"
    """With `tis_cap`: `truncate` uses min(w, C); `mask` uses w where w <= C and 0 (the token, or the whole sequence at `tis_level=sequence`, drops out) where w > C (masked importance sampling, as IcePop)."""


class _DualClip(_Mixin):
    dual_clip: float | None = Field(default=None, gt=1)
    """Dual-clip c > 1 (Ye et al. 2020): the clipped surrogate of a token with negative advantage is bounded by -A * c (None: off)."""


class _GroupScale(_Mixin):
    scale: Literal["std", "none"] = "std"
    """Group advantage scaling: divide by group std (`std`, GRPO) or not (`none`, Dr. GRPO)."""


class _KLInLoss(_Mixin):
    kl_kind: Literal["k1", "k2", "k3"] = "k3"
    """KL estimator of a KL term in the loss (Schulman's k1, k2, k3). The KL put in the reward (rloo, reinforce_pp, ppo) has its own key, `kl_reward_kind`."""


class _KLInReward(_Mixin):
    kl_reward_kind: Literal["k1", "k2", "k3"] = "k1"
    """KL estimator of the per-token KL penalty put in the reward: `-kl_coef * k_t` on every agent token. k1 (the default) is log pi_old - log pi_ref, as Ziegler et al. 2019."""


class _Gamma(_Mixin):
    gamma: float = Field(default=1.0, ge=0.0, le=1.0)
    """Discount of the returns (PPO, REINFORCE++, GiGPO's step returns), in [0, 1]."""


class _StepCredit(_Gamma):
    step_weight: float = Field(default=1.0, ge=0)
    """GiGPO: weight omega of the step-level (anchor-state) advantage: A = A_episode + omega * A_step (Feng et al. 2025)."""


class _TurnCredit(_StepCredit):
    turn_advantages: bool = False
    """Group-relative advantages per turn (multi-turn episodes) instead of per episode."""
    turn_credit: Literal["episode", "gigpo"] = "episode"
    """Credit assignment: `episode` (the group advantage of the episode, or per turn with `turn_advantages`) or `gigpo`: GiGPO's step-level credit, A = A_episode + step_weight * A_step over anchor states (docs/algorithms.md), reading `step_weight`, `gamma` (default then GiGPO's 0.95) and `scale`; `--algo grpo algo.turn_credit=gigpo` is the same run as `--algo gigpo` (tested)."""

    @model_validator(mode="before")
    @classmethod
    def _gigpo_gamma(cls, data: Any) -> Any:
        """GiGPO's credit brings GiGPO's gamma when the user did not set one."""
        if isinstance(data, dict) and data.get("turn_credit") == "gigpo" and "gamma" not in data:
            data = {**data, "gamma": GIGPO_GAMMA}
        return data

    @model_validator(mode="after")
    def _one_turn_credit(self) -> Any:
        if self.turn_credit == "gigpo" and self.turn_advantages:
            raise ValueError("algo.turn_credit=gigpo and algo.turn_advantages=true are two credit "
                             "assignments of turns: set one of them")
        return self


class GRPOConfig(_TurnCredit, _DualClip, _KLInLoss, _GroupScale, TokenLossBase):
    """grpo: group-relative advantages, PPO's clipped surrogate (+ KL in the loss)."""

    name: Literal["grpo"] = "grpo"
    """The algorithm: `--algo grpo` (`algo.name=grpo`)."""


class DrGRPOConfig(_TurnCredit, _DualClip, _KLInLoss, TokenLossBase):
    """dr_grpo: GRPO without std scaling and with the length-unbiased aggregation (fixed)."""

    name: Literal["dr_grpo"] = "dr_grpo"
    """The algorithm: `--algo dr_grpo` (`algo.name=dr_grpo`)."""
    scale: Literal["none"] = "none"
    """Dr. GRPO: no std scaling of the group advantage (fixed)."""
    agg: Literal["seq-mean-token-sum-norm"] = "seq-mean-token-sum-norm"
    """Dr. GRPO: the length-unbiased aggregation, a sum over tokens divided by `norm_len` (fixed)."""


class CISPOConfig(_TurnCredit, _KLInLoss, _GroupScale, TokenLossBase):
    """cispo: group-relative advantages, a clipped stop-gradient IS weight on each token's logprob."""

    name: Literal["cispo"] = "cispo"
    """The algorithm: `--algo cispo` (`algo.name=cispo`)."""
    clip_low: float = Field(default=1.0, ge=0.0)
    """CISPO: lower clip of the IS weight; 1.0 = no lower bound (MiniMax-M1, sec. 3.1)."""


class GiGPOConfig(_StepCredit, _DualClip, _KLInLoss, _GroupScale, TokenLossBase):
    """gigpo: GRPO's episode advantage plus a step-level advantage over anchor states."""

    name: Literal["gigpo"] = "gigpo"
    """The algorithm: `--algo gigpo` (`algo.name=gigpo`)."""
    gamma: float = Field(default=GIGPO_GAMMA, ge=0.0, le=1.0)
    """Discount of the step returns (Feng et al. 2025, sec. 5.1: 0.95), in [0, 1]."""
    turn_credit: Literal["gigpo"] = "gigpo"
    """GiGPO is step-level credit, always (`algo.name=grpo` has episode-level advantages)."""

    @model_validator(mode="before")
    @classmethod
    def _step_level_only(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("turn_credit") == "episode":
            raise ValueError("algo.turn_credit=episode with algo.name=gigpo: GiGPO is step-level credit "
                             "(use algo.name=grpo for episode-level advantages)")
        return data


class GSPOConfig(_KLInLoss, _GroupScale, PolicyGradientBase):
    """gspo: group-relative advantages, a sequence-level clipped ratio (no per-token options)."""

    name: Literal["gspo"] = "gspo"
    """The algorithm: `--algo gspo` (`algo.name=gspo`)."""
    clip_low: float = Field(default=3e-4, ge=0.0)
    """GSPO: clip of the sequence ratio below (Zheng et al. 2025, sec. 5.1: 3e-4)."""
    clip_high: float = Field(default=4e-4, ge=0.0)
    """GSPO: clip of the sequence ratio above (Zheng et al. 2025, sec. 5.1: 4e-4)."""


class RLOOConfig(_DualClip, _KLInReward, TokenLossBase):
    """rloo: leave-one-out baseline, KL to the reference in the reward."""

    name: Literal["rloo"] = "rloo"
    """The algorithm: `--algo rloo` (`algo.name=rloo`)."""


class ReinforcePPConfig(_Gamma, _DualClip, _KLInReward, TokenLossBase):
    """reinforce_pp: batch-whitened discounted returns, KL to the reference in the reward."""

    name: Literal["reinforce_pp"] = "reinforce_pp"
    """The algorithm: `--algo reinforce_pp` (`algo.name=reinforce_pp`)."""


class PPOConfig(_Gamma, _DualClip, _KLInReward, _KLInLoss, TokenLossBase):
    """ppo: a value head, GAE, clipped policy and value losses, an adaptive KL controller."""

    name: Literal["ppo"] = "ppo"
    """The algorithm: `--algo ppo` (`algo.name=ppo`)."""
    update_epochs: int = Field(default=2, ge=1)
    """Passes over each batch (PPO's sample reuse: 2)."""
    minibatches: int = Field(default=2, ge=1)
    """Optimizer steps per epoch (the batch is split into this many minibatches; PPO: 2)."""
    lam: float = Field(default=0.95, ge=0.0, le=1.0)
    """GAE lambda, in [0, 1]."""
    vf_coef: float = 0.5
    """Value loss coefficient."""
    value_clip: float | None = 0.2
    """Value clipping range (None: plain MSE)."""
    kl_in_reward: bool = True
    """Put the KL penalty in the per-token reward (True) or in the loss (False)."""
    kl_target: float | None = 6.0
    """Adaptive KL controller target (Ziegler et al. 2019); None keeps kl_coef fixed."""
    kl_horizon: int = Field(default=10000, ge=1)
    """Adaptive KL controller horizon (samples)."""


class DPOConfig(AlgoBase):
    """dpo: preference pairs (best vs worst of a group, or a file) against the frozen reference."""

    name: Literal["dpo"] = "dpo"
    """The algorithm: `--algo dpo` (`algo.name=dpo`)."""
    beta: float = 0.1
    """DPO beta."""


class DistillConfig(_DualClip, _KLInLoss, _GroupScale, TokenLossBase):
    """distill: on-policy distillation from a frozen teacher (+ the env reward as GRPO)."""

    name: Literal["distill"] = "distill"
    """The algorithm: `--algo distill` (`algo.name=distill`)."""
    teacher_path: str
    """Local Hugging Face model directory of the frozen teacher (same tokenizer as the policy; required). Its log-probabilities of the student's own sampled tokens give the per-token advantage log p_teacher - log p_student."""
    distill_coef: float = Field(default=1.0, gt=0)
    """Weight of the teacher signal: A_t = distill_coef * (log p_teacher(y_t) - log p_student(y_t)) + distill_reward_coef * A_env."""
    distill_reward_coef: float = Field(default=0.0, ge=0)
    """Weight of the env reward's group-relative advantage (as GRPO) mixed into the teacher signal (0: pure on-policy distillation)."""
    distill_kl: Literal["sampled", "full", "topk", "forward"] = "sampled"
    """The teacher signal. `sampled`: the one-sample reverse KL as a per-token advantage, log p_teacher(y_t) - log p_student(y_t) on the sampled token (Thinking Machines 2025). `full`: the exact per-token reverse KL over the vocabulary at the student's sampled prefixes, sum_v p_s(v) (log p_s(v) - log p_t(v)), added to the loss x distill_coef (GKD, Agarwal et al. 2024; no sampling variance). `topk`: the same over the teacher's `distill_topk` most likely tokens plus one bucket for the rest (a lower bound of `full`, equal at k = vocab). `forward`: the forward KL at the same prefixes, sum_v p_t(v) (log p_t(v) - log p_s(v)) (GKD's beta = 0: cross-entropy to the teacher's soft labels). `full`, `topk` and `forward` need `placement.teacher=inline`."""
    distill_topk: int = Field(default=32, ge=1)
    """k of `distill_kl=topk` (the teacher's k most likely tokens at each position)."""
    distill_teacher_fraction: float = Field(default=0.0, ge=0, le=1)
    """GKD's mixture (Agarwal et al. 2024, arXiv 2306.13649, Algorithm 1 with lambda = 1 - this): round(fraction x `rollout.tasks_per_step`) of each step's tasks are played by the teacher (its own samples through an in-process hf engine, tokens kept as sampled), the others by the student; the token-level `distill_kl` (full, topk or forward) is applied at every agent token of both, so on the teacher's rows `forward` is cross-entropy to its soft labels along its own sequences (sequence-level KD). 0: pure on-policy distillation. Needs `distill_kl` other than sampled, `distill_reward_coef=0`, `placement.teacher=inline`, `rollout.mode=sync`, the in-process hf engine (`rollout.num_workers=0`, `rollout.engine=hf`), `train.learner_workers=0` and no `dynamic_sampling`: each is refused at start-up otherwise."""

    @model_validator(mode="before")
    @classmethod
    def _needs_a_teacher(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("teacher_path") is None:
            raise ValueError("algo.name=distill needs algo.teacher_path (a local Hugging Face model "
                             "directory)")
        return data

    @field_validator("teacher_path")
    @classmethod
    def _teacher_is_a_directory(cls, v: str) -> str:
        if not Path(v).is_dir():
            raise ValueError(f"teacher model directory not found: {v!r} (a local Hugging Face model directory)")
        return v


ALGO_CONFIGS: dict[str, type[AlgoBase]] = {
    "grpo": GRPOConfig, "dr_grpo": DrGRPOConfig, "gspo": GSPOConfig, "rloo": RLOOConfig,
    "reinforce_pp": ReinforcePPConfig, "ppo": PPOConfig, "dpo": DPOConfig, "cispo": CISPOConfig,
    "gigpo": GiGPOConfig, "distill": DistillConfig,
}
"""Algorithm name -> its config class (the members of `AlgoConfig`)."""

AlgoConfig = Annotated[GRPOConfig | DrGRPOConfig | GSPOConfig | RLOOConfig | ReinforcePPConfig | PPOConfig | DPOConfig | CISPOConfig | GiGPOConfig | DistillConfig,
                       Field(discriminator="name")]
"""The `algo` section: the config class of `name` (pydantic's discriminated union)."""


def algorithms_with(key: str) -> list[str]:
    """The algorithm names whose config has `key` (for error messages)."""
    return [n for n, c in ALGO_CONFIGS.items() if key in c.model_fields]


def refused_algo_key(key: str, value: Any, name: str) -> str:
    """The message for an `algo` key that algorithm `name`'s config does not have."""
    others = algorithms_with(key)
    if not others:
        return (f"algo.{key}: unknown key; allowed with algo.name={name}: "
                f"{', '.join(ALGO_CONFIGS[name].model_fields)}")
    return (f"algo.{key}={value!r} is not supported by algo.name={name}; supported by: "
            f"{', '.join(others)} (`agentrl config --reference --algo {name}` lists its keys)")


def saved_algo_keys(base: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """`base` (a saved config) without the `algo` keys that the run's algorithm (`given`'s
    `algo.name`, else the saved one) does not have: a config saved before the algorithm
    configs were split carries every algorithm's keys, each at the value its algorithm ignored."""
    saved = base.get("algo")
    if not isinstance(saved, dict):
        return base
    name = (given.get("algo") or {}).get("name", saved.get("name", "grpo"))
    fields = ALGO_CONFIGS[name].model_fields if name in ALGO_CONFIGS else saved
    base["algo"] = {k: v for k, v in saved.items() if k in fields}
    return base
