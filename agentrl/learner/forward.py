"""Teacher-forced forward math of the learner: log-probabilities, entropies, values and the
full next-token distribution of a batch's rows, and the training forwards `Learner.update`
chooses among (plain, value head, prefix-shared, vocabulary); the forward's settings on a model
(dropout off, activation checkpointing) and the batch's rows (`slice_rows`, `minibatch_rows`,
`forward_rows`, `to_device`).

Logprobs are taken from `logits / temperature`, the distribution the sampler drew from, so a
policy that has not changed gives a PPO ratio of exactly 1 (case L4). Under bf16 autocast the
log-softmax, entropy and value head run on float32 inputs in float32 (`full_precision`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from agentrl.learner.lora import is_peft
from agentrl.learner.prefix_share import prefix_shared_logprobs
from agentrl.models.vision_batch import mrope_positions, safe_pad_id, vision_batch_inputs
from agentrl.models.vision_logprobs import vision_token_ids


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


def precision_autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager[Any]:
    """The context of a training forward at `precision` (`train.precision`) on `device`:
    bf16 autocast (`torch.autocast(device.type, dtype=torch.bfloat16)`: float32 master
    weights, matmuls in bfloat16), or nothing for `fp32`."""
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def full_precision(t: torch.Tensor) -> contextlib.AbstractContextManager[Any]:
    """A region where autocast is off on `t`'s device (a no-op context when it is off already):
    the log-softmax, entropy and value head of a bf16 forward run on float32 inputs in float32."""
    dev = t.device.type
    if torch.is_autocast_enabled(dev):
        return torch.autocast(dev, enabled=False)
    return contextlib.nullcontext()


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


def checkpointing_enabled(model: Any) -> bool:
    """Whether transformers' activation checkpointing is on for `model` (a PEFT wrapper's
    base): `is_activation_checkpointing`, named `is_gradient_checkpointing` before
    transformers 5.2x."""
    base = model.get_base_model() if is_peft(model) else model
    if hasattr(type(base), "is_activation_checkpointing"):
        return bool(base.is_activation_checkpointing)
    return bool(base.is_gradient_checkpointing)


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


def to_device(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """A shallow copy of `batch` with every tensor on `device` (the same tensors when they are
    there already)."""
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v
            for k, v in batch.items()}


def slice_rows(batch: dict[str, Any], idx: torch.Tensor) -> dict[str, Any]:
    """Rows `idx` of every (B, ...) tensor in the batch, trimmed to the longest row (at least one
    position: rows that are all empty episodes, e.g. a group whose agent runs never sampled, keep
    one padding position, attention and loss_mask 0, as they have in a wider micro-batch)."""
    width = max(1, int(batch["lengths"][idx].max()))
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


def minibatch_rows(n_units: int, unit: int, minibatches: int, gen: torch.Generator) -> list[torch.Tensor]:
    """The row indices of each minibatch of one epoch: `n_units` units of `unit` consecutive rows,
    shuffled by `gen` (when `minibatches > 1`) and split into `minibatches` parts (empty ones
    left out)."""
    perm = torch.randperm(n_units, generator=gen) if minibatches > 1 else torch.arange(n_units)
    return [(u[:, None] * unit + torch.arange(unit)).flatten()
            for u in torch.tensor_split(perm, minibatches) if len(u)]


def forward_rows(mb: torch.Tensor, idle: torch.Tensor | None) -> torch.Tensor:
    """The rows of minibatch `mb` that the forward needs: those not `idle`; its first row when
    every row is idle (so that the loss metrics exist)."""
    fwd = mb if idle is None else mb[~idle[mb]]
    return fwd if len(fwd) else mb[:1]


TrainForward = Callable[[dict[str, Any], bool], tuple[torch.Tensor, torch.Tensor, dict[str, Any]]]
"""A training forward of one micro-batch: `(rows, entropy_grad) -> (logp (B, T), entropy (B, T),
the loss's extra keywords)`, with gradient; `rows` is a `slice_rows` of the batch, and
`entropy_grad` keeps the entropy in the graph (an entropy bonus)."""


def plain_forward(model: Any, temperature: float) -> TrainForward:
    """`token_logprobs` with the entropy (a vision-language batch's images included)."""
    def forward(sub: dict[str, Any], entropy_grad: bool) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        logp, ent = token_logprobs(model, sub["input_ids"], sub["attention_mask"], temperature=temperature,
                                   with_entropy=True, entropy_grad=entropy_grad, vision=sub.get("vision"))
        return logp, ent, {}
    return forward


def values_forward(model: Any, value_head: torch.nn.Module, temperature: float) -> TrainForward:
    """`token_logprobs_values`: the loss gets `values=` (B, T) V(s_t) with gradient (PPO)."""
    def forward(sub: dict[str, Any], entropy_grad: bool) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        logp, ent, v_after = token_logprobs_values(
            model, value_head, sub["input_ids"], sub["attention_mask"], temperature=temperature,
            with_entropy=True, entropy_grad=entropy_grad)
        return logp, ent, {"values": values_before(v_after)}
    return forward


def prefix_shared_forward(model: Any, temperature: float, *, static: bool, compiled: bool) -> TrainForward:
    """`prefix_shared_logprobs` (each group's prompt forwarded once; logp and entropy 0 off the
    loss positions), on the static decoder when `static`, compiled when `compiled`."""
    def forward(sub: dict[str, Any], entropy_grad: bool) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        logp, ent = prefix_shared_logprobs(
            model, sub["input_ids"], sub["attention_mask"], sub["loss_mask"], temperature=temperature,
            with_entropy=True, entropy_grad=entropy_grad, static=static, compiled=compiled)
        return logp, ent, {}
    return forward


def vocab_forward(model: Any, temperature: float) -> TrainForward:
    """`token_vocab_logprobs`: the loss gets `vocab_logp=` (B, T, V) with gradient (a loss over
    the whole next-token distribution)."""
    def forward(sub: dict[str, Any], entropy_grad: bool) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        logp, ent, vocab_logp = token_vocab_logprobs(model, sub["input_ids"], sub["attention_mask"],
                                                     temperature=temperature, entropy_grad=entropy_grad)
        return logp, ent, {"vocab_logp": vocab_logp}
    return forward
