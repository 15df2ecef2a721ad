"""The learner: teacher-forced logprobs, the update loop over epochs x minibatches x
micro-batches, the frozen reference model, and checkpoints.

Logprobs are taken from `logits / temperature`, the distribution the sampler drew from, so a
policy that has not changed gives a PPO ratio of exactly 1 (case L4).

The training forward of `Learner.update` runs each group's shared prompt once and computes
lm_head and log-softmax only where the loss reads (`agentrl.learner.prefix_share`, `agentrl.learner.logprob_head`,
`agentrl.models.static_forward`; `Learner(prefix_share=True)`);
the optimizer is the fused AdamW kernel where torch has one for the parameters.

Devices and precision (`Learner(device=, precision=, gradient_checkpointing=)`, config
`train.device`, `train.precision`, `train.gradient_checkpointing`): the policy, value head and
reference model live on one device and every batch is moved there inside `logprobs` /
`update` (results come back on the batch's own device); `bf16` runs the forwards under
`torch.autocast` with float32 master weights and optimizer state, and the log-probabilities,
values and losses in float32 (logits upcast before the log-softmax). Dropout is off in every
forward (`disable_dropout`), and an optimizer step whose gradient norm is not finite is skipped
(`loss/skipped_nonfinite`; `max_nonfinite_steps` in a row raise `NonFiniteGradientError`).
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import random
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentrl.learner.checkpoints import seal
from agentrl.learner.dist import DataParallel, total_norm
from agentrl.learner.lora import is_peft
from agentrl.learner.prefix_share import prefix_share_supported, prefix_shared_logprobs


def token_logprobs(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
                   temperature: float = 1.0, with_entropy: bool = False,
                   entropy_grad: bool = False, vision: list[dict[str, Any] | None] | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Teacher-forced log-probability of every token given the tokens before it.

    Args:
        model: a causal LM returning `.logits` (B, T, V).
        input_ids: (B, T) long, right-padded.
        attention_mask: (B, T) 0/1.
        temperature: logits are divided by it (as the sampler did; 0 is treated as 1).
        with_entropy: also return the per-token entropy of the tempered distribution (nats).
        entropy_grad: keep the entropy in the autograd graph (for an entropy bonus); else it is
            computed without gradient (a metric).
        vision: per row its `Trajectory.vision` (None: no images), for a vision-language
            model: then the rows and their pixels run in one forward (`_vision_logits`) and
            the vision special tokens have probability 0, as in `VisionHFEngine`. None (a text
            batch): one batched forward, as always.

    Returns:
        logp (B, T) float32 with `logp[:, t] = log p(input_ids[:, t] | input_ids[:, :t])` and
        `logp[:, 0] = 0` (the first token has no context); entropy (B, T) or None, aligned the
        same way (entropy of the distribution that produced token t).
    """
    if vision is not None:
        logits = _vision_logits(model, input_ids, attention_mask, vision)
    else:
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
    with full_precision(logits):
        return _logp_entropy(logits, input_ids, temperature, with_entropy, entropy_grad)


def token_vocab_logprobs(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
                         temperature: float = 1.0, entropy_grad: bool = False
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`token_logprobs` with the whole next-token distribution kept, with gradient (for a loss
    over the vocabulary: distillation's exact reverse KL, `algo.distill_kl=full|topk`).

    Returns:
        (logp (B, T), entropy (B, T), vocab_logp (B, T, V)): `vocab_logp[:, t]` =
        log p(. | input_ids[:, :t]) at `temperature`, the distribution that produced token t;
        0 at t = 0. logp and entropy as `token_logprobs(with_entropy=True)`.
    """
    t = temperature if temperature and temperature > 0 else 1.0
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
    with full_precision(logits):
        lv = torch.log_softmax(logits[:, :-1].float() / t, dim=-1)
        vocab_logp = torch.cat([torch.zeros_like(lv[:, :1]), lv], dim=1)
        logp = vocab_logp.gather(-1, input_ids[:, :, None]).squeeze(-1)
        logp = torch.cat([torch.zeros_like(logp[:, :1]), logp[:, 1:]], dim=1)
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            v = vocab_logp if entropy_grad else vocab_logp.detach()
            ent = -(v.exp() * v).sum(-1)
    return logp, ent, vocab_logp


def _vision_logits(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   vision: list[dict[str, Any] | None]) -> torch.Tensor:
    """(B, T, V) float32 logits of a vision-language model for right-padded rows with their
    images, in one forward (`agentrl.models.vision_batch`: the rows' real tokens re-padded with
    an id that is no vision token, their pixels concatenated in row order, each row's own
    multimodal rotary positions), the vision special tokens set to the lowest float32
    (probability 0, as the sampler's -inf; finite so that the entropy stays finite). Padding
    positions get 0 logits (their mask is 0)."""
    from agentrl.models.vision_batch import mrope_positions, safe_pad_id, vision_batch_inputs
    from agentrl.models.vision_logprobs import vision_token_ids

    cfg = getattr(model, "config", None)
    image_id = getattr(cfg, "image_token_id", None)
    if image_id is None:
        raise ValueError("a batch with images needs a vision-language model (its config has no image_token_id)")
    banned = vision_token_ids(cfg)
    lengths = attention_mask.sum(-1).tolist()
    rows = [input_ids[i, :int(n)].tolist() for i, n in enumerate(lengths)]
    inputs = vision_batch_inputs(rows, vision, int(image_id), pad_id=safe_pad_id(banned), left_pad=False,
                                 device=input_ids.device)
    pos = mrope_positions(model, inputs)
    lg = model(**inputs, position_ids=pos).logits.float()  # (B, W, V), W = longest row
    if banned:
        lg = lg.index_fill(-1, torch.tensor(banned, device=lg.device), torch.finfo(torch.float32).min)
    lg = lg.masked_fill(inputs["attention_mask"][..., None] == 0, 0.0)
    return torch.nn.functional.pad(lg, (0, 0, 0, input_ids.shape[1] - lg.shape[1]))


def token_logprobs_values(model: Any, value_head: torch.nn.Module, input_ids: torch.Tensor,
                          attention_mask: torch.Tensor, *, temperature: float = 1.0,
                          with_entropy: bool = False, entropy_grad: bool = False
                          ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """`token_logprobs` plus the value head on the last hidden state, in the same forward.

    Returns:
        (logp, entropy, values_after): the first two as in `token_logprobs`; values_after
        (B, T) float32 with `values_after[:, t] = value_head(h_t)`, the value of the state
        after token t (context `input_ids[:, :t+1]`). The value of the state in which token t
        was sampled is `values_after[:, t-1]` (see `values_before`).
    """
    out, h = _forward_last_hidden(model, input_ids, attention_mask)
    with full_precision(out.logits):  # under bf16 autocast: logprobs and values in float32
        logp, ent = _logp_entropy(out.logits, input_ids, temperature, with_entropy, entropy_grad)
        return logp, ent, value_head(h.float()).squeeze(-1)


def _forward_last_hidden(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor
                         ) -> tuple[Any, torch.Tensor]:
    """The model's output and its decoder's last hidden state (B, T, H), after the final norm,
    from a forward hook on the decoder (`get_decoder()`). Not `output_hidden_states`: the
    transformers output recorder keys its hooks by model class, and FSDP2 swaps the classes
    of sharded modules (the hidden states then come back None)."""
    base = model.get_base_model() if is_peft(model) else model
    decoder = base.get_decoder() if hasattr(base, "get_decoder") else None
    if decoder is None or decoder is base:
        out = model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
        return out, out.hidden_states[-1]
    seen: list[torch.Tensor] = []

    def keep(_m: Any, _a: Any, o: Any) -> None:
        seen.append(o.last_hidden_state if hasattr(o, "last_hidden_state") else o[0])

    hook = decoder.register_forward_hook(keep)
    try:
        out = model(input_ids=input_ids, attention_mask=attention_mask)
    finally:
        hook.remove()
    return out, seen[-1]


def full_precision(t: torch.Tensor) -> contextlib.AbstractContextManager[Any]:
    """A region where autocast is off on `t`'s device (a no-op context when it is off already):
    the log-softmax, entropy and value head of a bf16 forward run on float32 inputs in float32."""
    dev = t.device.type
    if torch.is_autocast_enabled(dev):
        return torch.autocast(dev, enabled=False)
    return contextlib.nullcontext()


SUMMED_METRICS = frozenset({"loss", "pg_loss", "vf_loss", "kl", "distill_kl"})
"""Loss metrics that are a micro-batch's share of its minibatch's value (normalised by the
minibatch's counts, as the losses are): `Learner.update` adds them up over micro-batches (and
ranks), then averages them over optimizer steps. Other metrics are micro-batch means, averaged
weighted by agent tokens (then over steps); `*_min` and `*_max` metrics are the minimum and
maximum over the whole update."""

PRECISIONS = ("fp32", "bf16")
"""`Learner(precision=)` / `train.precision` values."""


def resolve_device(name: str | torch.device | None, *, key: str = "train.device") -> torch.device:
    """The learner's device for `auto` (CUDA when available, else CPU), `cpu`, `cuda` or
    `cuda:N`.

    Raises:
        ValueError: naming `key`, for CUDA asked for where none is available, or an unknown name.
    """
    if isinstance(name, torch.device):
        name = str(name)
    name = (name or "auto").lower()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise ValueError(f"{key}={name}: not a device; allowed: auto, cpu, cuda") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"{key}={name}: allowed: auto, cpu, cuda")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{key}={name}: no CUDA device is available (torch.cuda.is_available() "
                         f"is False); use {key}=auto or {key}=cpu")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"{key}={name}: only {torch.cuda.device_count()} CUDA device(s)")
    return dev


def disable_dropout(model: torch.nn.Module) -> int:
    """Turn dropout off in `model` whatever its config says, keeping its training mode (which
    gradient checkpointing needs): every `nn.Dropout*` module gets p = 0 and every float
    attribute named `*dropout` of a module (`attention_dropout` of Qwen2/Llama attention, read
    in training mode) is set to 0.0. The config is left as it is (checkpoints keep it).

    Log-probabilities and values must be a function of the weights: with dropout, two forwards
    of the same policy differ, so the PPO ratio of an unchanged policy is not 1 and the
    reference KL is noise. Returns how many modules or attributes were changed."""
    n = 0
    for m in model.modules():
        if isinstance(m, torch.nn.modules.dropout._DropoutNd):
            if m.p != 0.0:
                m.p, n = 0.0, n + 1
            continue
        for k, v in list(vars(m).items()):
            if k.endswith("dropout") and isinstance(v, float) and v != 0.0:
                setattr(m, k, 0.0)
                n += 1
    return n


def enable_checkpointing(model: Any) -> None:
    """Transformers' own activation (gradient) checkpointing of every decoder layer,
    non-reentrant (`activation_checkpointing_enable`, named `gradient_checkpointing_enable`
    before transformers 5.2x; a PEFT wrapper's base model)."""
    base = model.get_base_model() if is_peft(model) else model
    kw = {"use_reentrant": False}
    if hasattr(base, "activation_checkpointing_enable"):
        base.activation_checkpointing_enable(activation_checkpointing_kwargs=kw)
    else:  # pragma: no cover - older transformers
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kw)


class NonFiniteGradientError(FloatingPointError):
    """`max_nonfinite_steps` optimizer steps in a row had a NaN or infinite gradient norm."""


class NonFiniteLossError(NonFiniteGradientError):
    """The supervised warm start's loss became NaN or infinite (`agentrl.sft.sft_train`): the
    run stops before saving a diverged model."""


def _to(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """A shallow copy of `batch` with every tensor on `device` (the same tensors when they are
    there already)."""
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v
            for k, v in batch.items()}


def values_before(values_after: torch.Tensor) -> torch.Tensor:
    """(B, T) V(s_t), the value of the state in which token t was sampled, aligned like logp:
    `values_after` shifted right by one, 0 at t = 0 (keeps the gradient)."""
    return torch.cat([torch.zeros_like(values_after[:, :1]), values_after[:, :-1]], dim=1)


def _logp_entropy(logits: torch.Tensor, input_ids: torch.Tensor, temperature: float,
                  with_entropy: bool, entropy_grad: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    t = temperature if temperature and temperature > 0 else 1.0
    logits = logits[:, :-1].float()
    if t != 1.0:
        logits = logits / t
    lse = torch.logsumexp(logits, dim=-1)
    picked = logits.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    logp = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    logp[:, 1:] = picked - lse
    ent = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            lg = logits if entropy_grad else logits.detach()
            p = torch.softmax(lg, dim=-1)
            ent = torch.zeros_like(logp)
            ent[:, 1:] = (lse if entropy_grad else lse.detach()) - (p * lg).sum(-1)
    return logp, ent


def make_adamw(params: list[torch.nn.Parameter], *, lr: float, weight_decay: float
               ) -> tuple[torch.optim.AdamW, bool]:
    """`torch.optim.AdamW` with the fused kernel (`fused=True`: one kernel for all tensors, TRL's
    default `adamw_torch_fused`; on CPU since torch 2.4) when torch has one for every
    parameter's device and dtype (real floating point), else the default implementation. Same
    update to float32 rounding. Returns (optimizer, fused).

    torch checks fused support only at the first step, so it is checked here."""
    try:
        from torch.optim.optimizer import _get_fused_kernels_supported_devices

        devices = set(_get_fused_kernels_supported_devices())
    except ImportError:  # pragma: no cover - older or newer torch without the helper
        devices = {"cpu", "cuda"}
    fused = all(p.device.type in devices and torch.is_floating_point(p) for p in params)
    try:
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay,
                                 fused=True if fused else None), fused
    except (RuntimeError, TypeError):  # a torch without fused AdamW
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay), False


def _slice(batch: dict[str, Any], idx: torch.Tensor) -> dict[str, Any]:
    """Rows `idx` of every (B, ...) tensor in the batch, trimmed to the longest row."""
    width = int(batch["lengths"][idx].max())
    out: dict[str, Any] = {}
    for k, v in batch.items():
        if k == "vision":  # per-row list (`collate`)
            v = [v[i] for i in idx.tolist()]
        elif isinstance(v, torch.Tensor) and v.dim() >= 1 and v.shape[0] == batch["input_ids"].shape[0]:
            v = v[idx]
            if v.dim() == 2:
                v = v[:, :width]
        out[k] = v
    return out


class Learner:
    """Holds the policy, its optimizer and scheduler, and the frozen reference model.

    Args:
        model: the policy (a transformers causal LM), trained in place.
        lr, weight_decay, grad_clip: AdamW settings and the max global grad norm.
        temperature: the sampling temperature (logits are scaled by it).
        micro_batch_size: sequences per forward/backward.
        use_ref: keep a frozen copy as the KL reference (a PEFT/LoRA model keeps no copy: its
            base with adapters disabled is the reference).
        value_head: add a value head `torch.nn.Linear(hidden, 1)` on the policy's last hidden
            state (PPO), trained jointly with the policy by the same optimizer and saved in
            checkpoints. It starts at zero (V = 0 everywhere) so early values add no noise.
        prefix_share: the training forward of `update` uses `prefix_shared_logprobs` (each
            group's shared prompt forwarded once; lm_head, log-softmax and entropy only at
            loss positions, fused into `agentrl.learner.logprob_head.head_logprobs` when the entropy
            needs no gradient; the decoder as `agentrl.models.static_forward` for float32 Qwen2/Llama
            without LoRA) when the model supports it (`prefix_share_supported`: transformers
            decoder-only models, LoRA/PEFT-wrapped too). Not with a value head (PPO), which
            keeps the plain forward. Same losses and gradients to float32 rounding.
        compile: run that static decoder forward through `torch.compile` (inductor; see
            `agentrl.models.static_forward.forward_hidden`): tens of seconds of compiling at the first
            update, then 0.78-0.84x of the eager update time for small models on CPU. Falls
            back to eager, with a warning, if compiling fails.
        skip_zero_advantage: leave rows whose advantages are all 0 out of the update's forwards
            when the algorithm says they add nothing to its loss (`idle_zero_advantage_rows`:
            GRPO/GSPO without KL in the loss or entropy bonus, RLOO, REINFORCE++ without entropy
            bonus); the token and sequence counts that normalise the loss still include them,
            so the loss and gradient are the same to float32 rounding. Metrics computed from
            the forward (entropy, ratios, `logp_mismatch`) then cover the other rows (when
            every row of a minibatch is idle, its first row still runs, for the metrics);
            `skipped_rows_frac` reports the fraction left out.
        lr_schedule: the factor on `lr` at each optimizer step (`agentrl.learner.schedules.lr_multiplier`
            with the run's settings); None: constant. Stepped once per optimizer step, saved and
            restored with checkpoints.
        device: where the policy, value head, reference model and every batch tensor of the
            update live (`resolve_device`: `auto`, `cpu`, `cuda`); the model is moved there
            at construction, batches inside `logprobs` / `logprobs_and_values` / `update`, whose
            tensors come back on the batch's own device. None: the model's device, as given.
        precision: `fp32`, or `bf16`: the forwards (policy and reference) run under
            `torch.autocast(device_type, dtype=torch.bfloat16)`; the weights, gradients and
            AdamW state stay float32, and logprobs, entropies, values and the loss are
            computed in float32 (logits upcast before the log-softmax). The hand-written static
            decoder (and so `compile`) is float32-only: under bf16 the prefix-shared forward
            runs the transformers decoder (`fast_path_notes` says so).
        gradient_checkpointing: transformers' checkpointing (`enable_checkpointing`, non-reentrant):
            activations are recomputed in the backward, for memory. The same gradient; the
            prefix-shared forward then runs without sharing (transformers drops the cache).
        max_nonfinite_steps: an optimizer step whose global gradient norm is NaN or infinite is
            skipped (no parameter, optimizer-state or scheduler change; counted in the update's
            `skipped_nonfinite`); this many skips in a row raise `NonFiniteGradientError`
            (None: never).

    Attributes:
        algo_state: small state an algorithm keeps across steps (e.g. PPO's adaptive KL
            coefficient); saved in checkpoints.
        prefix_share: the switch above (may be changed between updates).
        fused: the optimizer is `torch.optim.AdamW(fused=True)` (False where torch has no fused
            kernel for these parameters' device and dtype: the default implementation).
        device: the learner's `torch.device`.
        nonfinite_streak: optimizer steps skipped in a row for a non-finite gradient norm.
    """

    def __init__(self, model: Any, *, lr: float, weight_decay: float = 0.0, grad_clip: float = 1.0,
                 temperature: float = 1.0, micro_batch_size: int = 16, use_ref: bool = False,
                 value_head: bool = False,
                 prefix_share: bool = True, compile: bool = False, skip_zero_advantage: bool = True,
                 lr_schedule: Callable[[int], float] | None = None,
                 device: str | torch.device | None = None, precision: str = "fp32",
                 gradient_checkpointing: bool = False, max_nonfinite_steps: int | None = None,
                 dp: DataParallel | None = None):
        if precision not in PRECISIONS:
            raise ValueError(f"precision={precision!r}; allowed: {', '.join(PRECISIONS)}")
        if device is not None:
            model.to(resolve_device(device))
        self.model = model
        self.device = next(model.parameters()).device
        self.model.train()
        disable_dropout(self.model)  # logprobs and values are a function of the weights
        self.precision = precision
        self.gradient_checkpointing = gradient_checkpointing
        if gradient_checkpointing:
            enable_checkpointing(model)
        self.max_nonfinite_steps = max_nonfinite_steps
        self.nonfinite_streak = 0
        self.grad_clip = grad_clip
        self.temperature = temperature
        self.micro_batch_size = micro_batch_size
        self.value_head: torch.nn.Module | None = None
        if value_head:
            hidden = model.config.hidden_size
            self.value_head = torch.nn.Linear(hidden, 1).to(self.device)
            torch.nn.init.zeros_(self.value_head.weight)
            torch.nn.init.zeros_(self.value_head.bias)
        self.algo_state: dict[str, Any] = {}
        self.dp = dp
        self.prefix_share = prefix_share and dp is None  # ranks: the plain transformers forward
        self.compile = compile and dp is None
        self.skip_zero_advantage = skip_zero_advantage
        self._share_ok = prefix_share_supported(model)
        self.ref_model = None
        self.reference: Any = None  # a RemoteFrozenModel (placement.reference=worker), set by the loop
        self.teacher: Any = None  # distill's teacher worker (placement.teacher=worker), set by the loop
        self.ref_seconds = 0.0
        self.lora = is_peft(model)  # LoRA: the reference is the base with adapters disabled
        if use_ref and not self.lora:
            self.ref_model = copy.deepcopy(model).eval()
            for p in self.ref_model.parameters():
                p.requires_grad_(False)
        if dp is not None:  # FSDP2: parameters become DTensor shards before the optimizer sees them
            from agentrl.learner.dist import shard

            for m in (self.model, self.ref_model, self.value_head):
                if m is not None:
                    shard(m, device=self.device)
        self.optimizer, self.fused = make_adamw(self._params(), lr=lr, weight_decay=weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_schedule or (lambda _: 1.0))
        self.optimizer_steps = 0

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The context of the learner's forwards: bf16 autocast on the learner's device, or
        nothing (fp32)."""
        if self.precision == "bf16":
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    @property
    def lr(self) -> float:
        """The learning rate of the next optimizer step."""
        return float(self.optimizer.param_groups[0]["lr"])

    def state_dict_for_engines(self) -> dict[str, torch.Tensor]:
        """The policy's weights under the plain model's names, LoRA merged
        (`agentrl.learner.lora.merged_state_dict`), for `update_weights` of the engines."""
        from agentrl.learner.lora import merged_state_dict

        return merged_state_dict(self.model)

    @property
    def static_ok(self) -> bool:
        """The prefix-shared forward may run the hand-written static decoder (and `compile` it):
        float32 compute only (under bf16 autocast the transformers decoder runs instead)."""
        return self.precision == "fp32"

    def _params(self) -> list[torch.nn.Parameter]:
        """The trained parameters: the policy's (those requiring grad) and the value head's."""
        heads = list(self.value_head.parameters()) if self.value_head is not None else []
        return [p for p in self.model.parameters() if p.requires_grad] + heads

    # -- forward passes -----------------------------------------------------------------------
    @torch.no_grad()
    def logprobs(self, batch: dict[str, Any], *, ref: bool = False) -> torch.Tensor:
        """(B, T) logprobs of the policy (or the reference) on the batch, without gradient.
        With `reference` set (a `agentrl.learner.frozen.RemoteFrozenModel`), the reference's come
        from that worker. `ref_seconds` adds up the seconds spent on reference logprobs."""
        if ref:
            t0 = time.perf_counter()
            try:
                if self.reference is not None:
                    return self.reference.logprobs(batch)
                return self._logprobs(batch, ref=True)
            finally:
                self.ref_seconds += time.perf_counter() - t0
        return self._logprobs(batch)

    def _logprobs(self, batch: dict[str, Any], *, ref: bool = False) -> torch.Tensor:
        if ref and self.ref_model is None and self.lora:
            with self.model.disable_adapter():
                return self._logprobs(batch)
        model = self.ref_model if ref else self.model
        home = batch["loss_mask"].device
        batch = _to(batch, self.device)
        out = torch.zeros_like(batch["loss_mask"])
        for idx, real in self._row_chunks(batch["input_ids"].shape[0]):
            sub = _slice(batch, idx)
            with self.autocast():
                lp, _ = token_logprobs(model, sub["input_ids"], sub["attention_mask"],
                                       temperature=self.temperature, vision=sub.get("vision"))
            if real:
                out[idx, : lp.shape[1]] = lp
        if self.dp is not None:  # every rank filled its rows, the others are 0
            self.dp.all_sum(out)
        return out.to(home)

    def _row_chunks(self, B: int) -> list[tuple[torch.Tensor, bool]]:
        """Micro-batches of rows for a no-grad pass over a (B, ...) batch: (row indices on the
        learner's device, real). In-process every row, in chunks of `micro_batch_size`; on a
        rank its dealt rows (`DataParallel.my_units`), padded with dummy chunks (row 0, real
        False: run for the collectives, discarded) to the same count on every rank."""
        rows = torch.arange(B)
        if self.dp is not None:
            rows = self.dp.my_units(rows)
        chunks = [(c.to(self.device), True) for c in torch.split(rows, self.micro_batch_size) if len(c)]
        if self.dp is not None and B:
            n = self.dp.micro_count(B, self.micro_batch_size)
            chunks += [(torch.zeros(1, dtype=torch.long, device=self.device), False)] * (n - len(chunks))
        return chunks

    @torch.no_grad()
    def logprobs_and_values(self, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor,
                                                                     torch.Tensor]:
        """Policy logprobs and value-head values in one forward pass, without gradient.

        Returns:
            logp (B, T); values (B, T), V(s_t) of the state in which token t was sampled
            (aligned like logp, 0 at t = 0); last_values (B,), the value of the state after each
            row's last agent token (0 for a row without one): the bootstrap of a truncated
            episode (case A11).

        Raises:
            ValueError: the learner has no value head, or the batch has images.
        """
        if self.value_head is None:
            raise ValueError("logprobs_and_values needs Learner(value_head=True)")
        if "vision" in batch:
            raise ValueError("a value head (ppo) on a batch with images is not supported yet "
                             "(docs/multimodal.md)")
        home = batch["loss_mask"].device
        batch = _to(batch, self.device)
        mask = batch["loss_mask"]
        logp, values, after = torch.zeros_like(mask), torch.zeros_like(mask), torch.zeros_like(mask)
        for idx, real in self._row_chunks(batch["input_ids"].shape[0]):
            sub = _slice(batch, idx)
            with self.autocast():
                lp, _, va = token_logprobs_values(self.model, self.value_head, sub["input_ids"],
                                                  sub["attention_mask"], temperature=self.temperature)
            if real:
                logp[idx, : lp.shape[1]] = lp
                values[idx, : lp.shape[1]] = values_before(va)
                after[idx, : lp.shape[1]] = va
        if self.dp is not None:
            for t in (logp, values, after):
                self.dp.all_sum(t)
        pos = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
        last = torch.where(mask != 0, pos, -1).max(dim=1).values  # last agent token, -1: none
        last_values = torch.where(last >= 0, after.gather(1, last.clamp(min=0)[:, None])[:, 0], 0.0)
        return logp.to(home), values.to(home), last_values.to(home)

    # -- the update -----------------------------------------------------------------------------
    def update(self, batch: dict[str, Any], algo: Any, cfg: Any, *, epochs: int = 1,
               minibatches: int = 1, seed: int = 0, on_policy_shortcut: bool = True
               ) -> dict[str, float]:
        """Run `epochs` x `minibatches` optimizer steps of `algo.loss` on the batch.

        `batch["old_logprobs"]` is recomputed by the learner at the start of the update (the
        PPO ratio's denominator, contract 3), unless the batch already holds them (computed by
        the algorithm's `prepare` on the same weights). With a single optimizer step and no
        importance correction the policy has not moved yet, so the same forward pass gives both
        and the extra pass is skipped (`on_policy_shortcut`).

        With `cfg.tis_cap` set, `batch["tis_weights"]` = `tis_weights(old_logprobs,
        sampler_logprobs, loss_mask, cap=tis_cap, level=cfg.tis_level, mode=cfg.tis_mode)` (Yao
        et al. 2025) is added for the loss. Each micro-batch gets `max_len` = `cfg.norm_len`
        (when set) or the batch's padded width, the L_max of `seq-mean-token-sum-norm`. The
        sampler/learner mismatch, mean |old_logprobs - sampler_logprobs| over agent tokens, is
        reported every update as `logp_mismatch`, and its largest value on an agent token as
        `logp_mismatch_max` (nats; with `model.dtype=bfloat16` the engine's bf16 gap to the
        float32 learner, every step, over every agent token).

        `batch["unit_size"]` (int, default 1) keeps consecutive rows together: rows
        `k*u .. k*u+u-1` always share a minibatch and a micro-batch (DPO pairs, u = 2).
        With a value head the loss gets `values=` (B, T) V(s_t) with gradient.

        Returns:
            metrics averaged over optimizer steps (`loss/*`, `grad_norm`, ...; how micro-batches
            and ranks combine: `SUMMED_METRICS`); {} for an
            empty batch (no optimizer step). `grad_norm` is the mean over the steps taken;
            `skipped_nonfinite` counts the steps skipped for a NaN/inf gradient norm.

        Raises:
            NonFiniteGradientError: `max_nonfinite_steps` skipped steps in a row.
        """
        from agentrl.algos.losses import tis_weights

        B = batch["input_ids"].shape[0]
        if B == 0 or not bool((batch["loss_mask"] != 0).any()):  # no agent token: no step
            return {}
        unit = int(batch.get("unit_size", 1))
        if B % unit:
            raise ValueError(f"batch of {B} rows is not a whole number of units of {unit}")
        tis = algo.tis(cfg)  # (cap, level, mode) or None
        tis_cap = tis[0] if tis is not None else None
        single = (epochs * minibatches == 1 and on_policy_shortcut and tis_cap is None
                  and "tis_weights" not in batch)
        if not single and "old_logprobs" not in batch:
            batch["old_logprobs"] = self.logprobs(batch)
        mism = [0.0, 0.0]  # sum of |old - sampler| over agent tokens, token count
        mism_max = -math.inf  # the largest |old - sampler| on an agent token
        if tis_cap is not None and "tis_weights" not in batch and "sampler_logprobs" in batch:
            batch["tis_weights"] = tis_weights(batch["old_logprobs"], batch["sampler_logprobs"],
                                               batch["loss_mask"], cap=tis_cap,
                                               level=tis[1], mode=tis[2])
        if not single and "sampler_logprobs" in batch:
            mask = batch["loss_mask"]
            gap = (batch["old_logprobs"] - batch["sampler_logprobs"]).abs()
            mism = [float((gap * mask).sum()), float(mask.sum())]
            if bool((mask != 0).any()):
                mism_max = float(gap[mask != 0].max())
        micro_rows = max(unit, self.micro_batch_size // unit * unit)
        idle = self._idle_rows(batch, algo, cfg)  # (B,) bool or None
        wants_vocab = algo.wants_vocab_logprobs(cfg)
        batch = _to(batch, self.device)  # the caller's batch keeps its tensors where they are
        gen = torch.Generator().manual_seed(seed)
        sums: dict[str, float] = {}  # additive over micro-batches (and, on ranks, over ranks)
        lows: dict[str, float] = {}  # `*_min` metrics: the minimum over micro-batches
        highs: dict[str, float] = {}  # `*_max` metrics: the maximum
        gn_sum = 0.0  # global gradient norms of the steps taken
        n_steps = n_idle = n_skipped = 0
        world = self.dp.world if self.dp is not None else 1
        for _ in range(epochs):
            n_units = B // unit
            perm = torch.randperm(n_units, generator=gen) if minibatches > 1 else torch.arange(n_units)
            for mb_units in torch.tensor_split(perm, minibatches):
                if len(mb_units) == 0:
                    continue
                mb = (mb_units[:, None] * unit + torch.arange(unit)).flatten()
                num_tokens = float(batch["loss_mask"][mb].sum())
                fwd = mb if idle is None else mb[~idle[mb]]  # the counts above keep every row
                if len(fwd) == 0:  # all idle: one row still runs, so the loss metrics exist
                    fwd = mb[:1]
                n_idle += len(mb) - len(fwd)
                fwd_tokens = float(batch["loss_mask"][fwd].sum())
                self.optimizer.zero_grad(set_to_none=True)
                for micro, real in self._micro_batches(fwd, unit, micro_rows):
                    sub = _slice(batch, micro)
                    # Dr. GRPO's L_max: the configured budget, else the padded width
                    sub["max_len"] = algo.norm_len(cfg) or batch["input_ids"].shape[1]
                    kw: dict[str, Any] = {}
                    ent_grad = algo.entropy_coef(cfg) > 0
                    with self.autocast():  # bf16: the forward; logp, values, loss in float32
                        if wants_vocab:  # a loss over the whole next-token distribution
                            if "vision" in sub:
                                raise ValueError("a loss over the vocabulary (algo.distill_kl=full|topk) "
                                                 "on a batch with images is not supported")
                            logp, ent, kw["vocab_logp"] = token_vocab_logprobs(
                                self.model, sub["input_ids"], sub["attention_mask"],
                                temperature=self.temperature, entropy_grad=ent_grad)
                        elif self.value_head is not None:
                            if "vision" in sub:
                                raise ValueError("a value head (ppo) on a batch with images is not "
                                                 "supported yet (docs/multimodal.md)")
                            logp, ent, v_after = token_logprobs_values(
                                self.model, self.value_head, sub["input_ids"], sub["attention_mask"],
                                temperature=self.temperature, with_entropy=True, entropy_grad=ent_grad)
                            kw["values"] = values_before(v_after)
                        elif self.prefix_share and self._share_ok and "vision" not in sub:
                            # logp, ent: 0 off loss positions
                            logp, ent = prefix_shared_logprobs(
                                self.model, sub["input_ids"], sub["attention_mask"], sub["loss_mask"],
                                temperature=self.temperature, with_entropy=True, entropy_grad=ent_grad,
                                static=self.static_ok, compiled=self.compile and self.static_ok)
                        else:
                            logp, ent = token_logprobs(self.model, sub["input_ids"],
                                                       sub["attention_mask"], temperature=self.temperature,
                                                       with_entropy=True, entropy_grad=ent_grad,
                                                       vision=sub.get("vision"))
                    if single:
                        sub["old_logprobs"] = logp.detach()
                    loss, m = algo.loss(logp, sub, cfg, num_tokens=max(num_tokens, 1.0),
                                        num_seqs=len(mb), entropy=ent, **kw)
                    # ranks: FSDP averages the gradient over ranks, the loss is a share of the sum
                    (loss * (world if real else 0.0)).backward()
                    if not real:  # a dummy micro-batch (collectives only): no metrics
                        continue
                    if single and "sampler_logprobs" in sub:
                        gap = (logp.detach() - sub["sampler_logprobs"]).abs()
                        mism[0] += float((gap * sub["loss_mask"]).sum())
                        mism[1] += float(sub["loss_mask"].sum())
                        if bool((sub["loss_mask"] != 0).any()):
                            mism_max = max(mism_max, float(gap[sub["loss_mask"] != 0].max()))
                    mask = sub["loss_mask"]
                    # weight of a micro-batch's means: its share of the forwarded agent tokens
                    w = float(mask.sum()) / fwd_tokens if fwd_tokens > 0 else len(micro) / len(fwd)
                    m["entropy"] = float((ent.detach() * mask).sum() / mask.sum().clamp(min=1))
                    m["loss"] = float(loss.detach())
                    for k, v in m.items():
                        v = float(v)
                        if k.endswith("_min"):
                            lows[k] = min(lows.get(k, math.inf), v)
                        elif k.endswith("_max"):
                            highs[k] = max(highs.get(k, -math.inf), v)
                        else:  # shares of the minibatch's loss terms add up; means are weighted
                            sums[k] = sums.get(k, 0.0) + v * (1.0 if k in SUMMED_METRICS else w)
                if len(fwd) < len(mb):  # idle rows' gradient is exactly 0: AdamW still steps
                    for p in self._params():
                        if p.grad is None:
                            p.grad = torch.zeros_like(p)
                gn = total_norm(torch.nn.utils.clip_grad_norm_(self._params(), self.grad_clip))
                n_steps += 1
                if not math.isfinite(gn):  # NaN/inf: no step (weights, AdamW state, lr as before)
                    self.optimizer.zero_grad(set_to_none=True)
                    n_skipped += 1
                    self.nonfinite_streak += 1
                    if self.max_nonfinite_steps is not None and \
                            self.nonfinite_streak >= self.max_nonfinite_steps:
                        raise NonFiniteGradientError(
                            f"{self.nonfinite_streak} optimizer steps in a row had a non-finite "
                            f"gradient norm ({gn}), the last after optimizer step "
                            f"{self.optimizer_steps}; stopping (train.max_nonfinite_steps="
                            f"{self.max_nonfinite_steps}). Look for NaN/inf rewards, advantages or "
                            "logprobs, or lower train.lr")
                    continue
                self.nonfinite_streak = 0
                gn_sum += gn
                self.optimizer.step()
                self.scheduler.step()
                self.optimizer_steps += 1
        if mism_max > -math.inf:
            highs["logp_mismatch_max"] = mism_max
        if self.dp is not None:  # every rank's micro-batch sums (a rank may have had none)
            tot = self.dp.reduce_floats({**sums, "__mism_abs": mism[0], "__mism_n": mism[1]})
            mism = [tot.pop("__mism_abs", 0.0), tot.pop("__mism_n", 0.0)]
            sums = tot
            lows, highs = self.dp.reduce_floats(lows, "min"), self.dp.reduce_floats(highs, "max")
        out = {k: v / max(n_steps, 1) for k, v in sums.items()}
        out.update(lows)
        out.update(highs)
        if n_steps:  # the mean gradient norm of the steps taken (NaN: none was)
            out["grad_norm"] = gn_sum / (n_steps - n_skipped) if n_skipped < n_steps else math.nan
            out["skipped_nonfinite"] = float(n_skipped)
        if idle is not None and n_steps:
            out["skipped_rows_frac"] = n_idle / max(1, B * epochs)
        if mism[1] > 0:
            out["logp_mismatch"] = mism[0] / mism[1]
        return out

    def _micro_batches(self, fwd: torch.Tensor, unit: int, micro_rows: int
                       ) -> list[tuple[torch.Tensor, bool]]:
        """The micro-batches (row indices, real) of a minibatch's forward rows `fwd` (whole
        units of `unit` rows, `micro_rows` rows per micro-batch). In-process: `fwd` in
        chunks. On a rank: its dealt units, chunked, then dummy micro-batches (the first unit,
        real False: backward with weight 0) up to the count every rank runs."""
        if self.dp is None:
            return [(m, True) for m in torch.split(fwd, micro_rows)]
        units = fwd.view(-1, unit)
        mine = self.dp.my_units(units).flatten()
        chunks = [(m, True) for m in torch.split(mine, micro_rows) if len(m)]
        n = self.dp.micro_count(len(units), micro_rows // unit)
        return chunks + [(fwd[:unit], False)] * (n - len(chunks))

    def compile_note(self) -> str:
        """One line on what `compile=True` will do for this learner ("" when it is off): that
        the decoder forward compiles at the first update, or why compiling has no effect."""
        if not self.compile:
            return ""
        from agentrl.models.static_decode import unsupported_reason

        if self.value_head is not None:
            why = "the value head (PPO) keeps the plain transformers forward"
        elif is_peft(self.model):
            why = "LoRA/PEFT adapters keep the transformers forward"
        elif not (self.prefix_share and self._share_ok):
            why = "the prefix-shared forward is off or unsupported for this model"
        elif not self.static_ok:
            why = (f"train.precision={self.precision} runs the transformers decoder under autocast "
                   "(the static decoder it compiles is float32 only)")
        elif self.gradient_checkpointing:
            why = "gradient checkpointing keeps the transformers forward"
        else:
            why = unsupported_reason(self.model, training=True) or ""
        if why:
            return f"train.compile has no effect: {why}"
        return ("the learner's decoder forward is compiled at the first update (torch.compile; "
                "about 1-2 min on 2 cores, then faster updates)")

    def fast_path_notes(self) -> list[str]:
        """One line for each fast path of the training forward that this learner's settings
        turn off (falling back to the transformers forward, which gives the right numbers):
        the static float32 decoder under bf16, prompt sharing and the static decoder under
        gradient checkpointing. [] when nothing is turned off."""
        from agentrl.models.static_forward import static_forward_supported

        shared = self.prefix_share and self._share_ok and self.value_head is None
        notes = []
        if shared and not self.static_ok and static_forward_supported(self.model):
            notes.append(f"train.precision={self.precision}: the learner's prefix-shared forward runs "
                         "the transformers decoder under autocast (the static decoder, "
                         "agentrl/models/static_forward.py, is float32 only)")
        if shared and self.gradient_checkpointing:
            notes.append("train.gradient_checkpointing: the learner's prefix-shared forward runs one "
                         "forward per micro-batch, without sharing the prompt (transformers drops the "
                         "cache while checkpointing) and without the static decoder")
        return notes

    def _idle_rows(self, batch: dict[str, Any], algo: Any, cfg: Any) -> torch.Tensor | None:
        """(B,) bool: rows the update can leave out of its forwards, or None (skip nothing).

        A row is idle when it has no agent token with a nonzero advantage and the algorithm's
        `idle_zero_advantage_rows(cfg)` says such rows add nothing to its loss or gradient (a
        GRPO group whose rewards are all equal, with no KL in the loss and no entropy bonus).
        Not with a value head (PPO trains it on every row) or units of several rows (DPO).
        """
        adv = batch.get("advantages")
        if (not self.skip_zero_advantage or adv is None or self.value_head is not None
                or int(batch.get("unit_size", 1)) != 1 or not algo.idle_zero_advantage_rows(cfg)):
            return None
        mask = batch["loss_mask"] != 0
        active = ((adv[:, None] if adv.dim() == 1 else adv) != 0) & mask
        return (~active.any(-1)).cpu()  # indexes the CPU row indices of `update` (batch on GPU too)

    # -- checkpoints ----------------------------------------------------------------------------
    def save(self, path: str | Path, tokenizer: Any, extra: dict[str, Any],
             files: dict[str, bytes] | None = None) -> Path:
        """Write a checkpoint atomically (a temp dir, fsynced, with a SHA-256 manifest, renamed
        into place: `agentrl.learner.checkpoints.seal`): the policy as a Hugging
        Face model directory (loads with `AutoModelForCausalLM.from_pretrained`; LoRA: the
        adapters, see `agentrl.learner.lora.load_checkpoint`), optimizer and
        scheduler state, RNG states, the value head (`value_head.pt`, PPO) and `algo_state`
        (`algo_state.pt`), `extra` (step, policy version, data cursor) as JSON, and `files`
        (name -> bytes, e.g. the reward wrappers' state), all covered by the manifest."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        self.model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if getattr(tokenizer, "image_processor", None) is not None:  # a vision-language policy
            tokenizer.image_processor.save_pretrained(tmp)
        torch.save({"optimizer": self.optimizer.state_dict(),
                    "scheduler": self.scheduler.state_dict(),
                    "optimizer_steps": self.optimizer_steps,
                    "torch_rng": torch.get_rng_state(),
                    "numpy_rng": np.random.get_state(),
                    "python_rng": random.getstate(),
                    "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None},
                   tmp / "trainer_state.pt")
        if self.ref_model is not None:
            torch.save(self.ref_model.state_dict(), tmp / "ref_model.pt")
        if self.value_head is not None:
            torch.save(self.value_head.state_dict(), tmp / "value_head.pt")
        torch.save(self.algo_state, tmp / "algo_state.pt")
        (tmp / "agentrl_state.json").write_text(json.dumps(extra, indent=1))
        for name, data in (files or {}).items():  # e.g. the reward wrappers' state
            (tmp / name).write_bytes(data)
        return seal(tmp, path)

    def load(self, path: str | Path) -> dict[str, Any]:
        """Restore optimizer, scheduler, RNG and reference state from `save`'s directory (the
        policy weights are loaded by the caller with `from_pretrained`), and the value head and
        `algo_state` when present. Returns `extra`.

        Raises:
            ValueError: this learner has a value head but the checkpoint has none.
        """
        path = Path(path)
        if self.value_head is not None:
            if not (path / "value_head.pt").exists():
                raise ValueError(f"{path}: checkpoint has no value head (value_head.pt); it was "
                                 "not written by a learner with a value head (PPO)")
            self.value_head.load_state_dict(torch.load(path / "value_head.pt", map_location="cpu"))
        if (path / "algo_state.pt").exists():
            self.algo_state = torch.load(path / "algo_state.pt", weights_only=False)
        st = torch.load(path / "trainer_state.pt", weights_only=False, map_location="cpu")
        if "optimizer" not in st:  # written by learner ranks (train.learner_workers >= 1)
            self._load_sharded(path)
            st["optimizer"] = self.optimizer.state_dict()
        self.optimizer.load_state_dict(st["optimizer"])
        for g in self.optimizer.param_groups:  # this learner's kernel, whichever wrote the state
            g["fused"], g["foreach"] = (True, None) if self.fused else (None, g.get("foreach"))
            for p in g["params"] if self.fused else []:  # fused keeps `step` on the param's device
                step = self.optimizer.state.get(p, {}).get("step")
                if torch.is_tensor(step):
                    self.optimizer.state[p]["step"] = step.to(p.device, torch.float32)
        self.scheduler.load_state_dict(st["scheduler"])
        self.optimizer_steps = st["optimizer_steps"]
        torch.set_rng_state(st["torch_rng"])
        np.random.set_state(st["numpy_rng"])
        random.setstate(st["python_rng"])
        if st.get("cuda_rng") is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(st["cuda_rng"])
        if self.ref_model is not None and (path / "ref_model.pt").exists():
            self.ref_model.load_state_dict(torch.load(path / "ref_model.pt", map_location="cpu"))
        return json.loads((path / "agentrl_state.json").read_text())

    def _load_sharded(self, path: Path) -> None:
        """Model, value-head, optimizer and reference state from the DCP checkpoint of learner
        ranks (`path`/dcp, `agentrl.learner.rank.LearnerRank.save`), into this unsharded
        in-process learner (DCP without a process group). The RNG states stay as `load` sets
        them (the driver's)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import (
            get_model_state_dict,
            get_state_dict,
            set_model_state_dict,
            set_state_dict,
        )

        if not (path / "dcp").is_dir():
            raise ValueError(f"{path}: no optimizer state (trainer_state.pt has none and there is "
                             "no dcp/ directory of learner ranks)")
        mods: dict[str, torch.nn.Module] = {"policy": self.model}
        if self.value_head is not None:
            mods["value_head"] = self.value_head
        container = torch.nn.ModuleDict(mods)
        msd, osd = get_state_dict(container, self.optimizer)
        state: dict[str, Any] = {"model": msd, "optim": osd}
        if self.ref_model is not None:
            state["ref"] = get_model_state_dict(self.ref_model)
        dcp.load(state, checkpoint_id=str(path / "dcp"), no_dist=True)
        set_state_dict(container, self.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
        if self.ref_model is not None:
            set_model_state_dict(self.ref_model, state["ref"])


def latest_checkpoint(out_dir: str | Path, on_skip: Callable[[Path, str], None] | None = None) -> Path | None:
    """The newest intact `OUT/checkpoints/step_N` (`agentrl.learner.checkpoints.latest_checkpoint`:
    interrupted saves and checkpoints that fail their manifest are skipped)."""
    from agentrl.learner.checkpoints import latest_checkpoint as newest

    return newest(out_dir, on_skip)
