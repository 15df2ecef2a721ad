"""Prefix sharing in the learner's training forward: each group's shared prompt is run once.

A GRPO batch holds G episodes per task, so G rows begin with the same prompt. The plain forward
(`agentrl.learner.forward.token_logprobs`) recomputes that prompt G times, and computes lm_head,
log-softmax and entropy at every position although the loss reads only the agent's tokens.
`prefix_shared_logprobs` returns the same logprobs and entropies at every position the loss
reads (and the same gradients, to float32 rounding) with less work:

- Row b's *prefix* is its tokens before its first loss position p_b (the prompt; in a
  multi-turn episode, the common opening up to the agent's first turn). Rows whose prefixes
  are identical (same length, same ids; anywhere in the micro-batch) form a group.
- One forward runs each distinct prefix once (left-padded, with gradient, filling a KV cache).
  The cache rows are repeated for the rows of each group (an index-select, which autograd
  differentiates: a prefix's activations get the sum of its rows' gradients, as in the
  unshared computation), and a second forward runs every row's continuation, tokens
  [p_b, len_b), on top of it with the row's own position ids. The logit that predicts token
  p_b is the prefix's last one.
- lm_head, log-softmax and entropy run only at the positions where the loss mask is nonzero.
  When the model is a decoder plus a plain linear lm_head (`decoder_and_head`, checked once per
  model) and the entropy needs no gradient, the decoder's (N, E) hidden states at those
  positions go to `agentrl.learner.logprob_head.head_logprobs` (lm_head, log-softmax, entropy and their
  backward in one chunked function); otherwise the model's logits there are gathered into one
  (N, V) block.

Loss positions may be interleaved with tokens the loss ignores (multi-turn episodes: the env's
messages between agent turns are part of the continuation and forwarded, but get no lm_head
work beyond the model's own and no log-softmax). When sharing saves nothing (no two rows have
the same prefix, or the padded prefixes plus continuations are more tokens than the rows
themselves) or the rows are not right-padded, one plain forward is run instead, with logits
only from the micro-batch's first loss column on (`logits_to_keep`). Rows without a loss
position are left out of the forwards (their outputs are 0).
"""

from __future__ import annotations

import inspect
import weakref
from typing import Any

import torch

from agentrl.learner.logprob_head import head_logprobs
from agentrl.learner.lora import is_peft
from agentrl.models.static_forward import forward_hidden, static_forward_supported
from agentrl.models.tiny import cache_kwarg, new_cache


def _base_model(model: Any) -> Any:
    """The transformers model under a PEFT wrapper (the model itself otherwise)."""
    return model.get_base_model() if is_peft(model) else model


def _cache_kw(model: Any) -> str:
    """The cache argument's name (PEFT wrappers pass either through **kwargs)."""
    return cache_kwarg(_base_model(model))


def prefix_share_supported(model: Any) -> bool:
    """True when `prefix_shared_logprobs` can run `model`: a transformers decoder-only model (or
    a PEFT adapter wrapper of one, LoRA and the like, not prompt learning) whose forward takes
    `position_ids`, a cache (`cache` or `past_key_values`) and `logits_to_keep`, with full
    attention in every layer (a sliding-window cache could drop prefix tokens)."""
    try:
        from transformers import PreTrainedModel
    except ImportError:  # pragma: no cover - transformers is a dependency
        return False
    if is_peft(model):
        cfg = getattr(model, "active_peft_config", None)
        if cfg is None or getattr(cfg, "is_prompt_learning", True):
            return False
    base = _base_model(model)
    if not isinstance(base, PreTrainedModel):
        return False
    cfg = base.config
    if getattr(cfg, "is_encoder_decoder", False):
        return False
    if any(t != "full_attention" for t in (getattr(cfg, "layer_types", None) or [])):
        return False
    if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True):
        return False
    params = inspect.signature(base.forward).parameters
    return ("position_ids" in params and "logits_to_keep" in params
            and ("cache" in params or "past_key_values" in params))


def shared_prefix_groups(input_ids: torch.Tensor, prefix_len: torch.Tensor) -> list[int]:
    """Group index of each row: rows whose first `prefix_len[b]` ids are identical (same length,
    same ids) share a group; groups are numbered in order of first appearance.

    Args:
        input_ids: (B, T) long.
        prefix_len: (B,) long, each row's prefix length.

    Returns:
        B ints, e.g. [0, 0, 0, 1, 1, 1] for two groups of three consecutive rows.
    """
    seen: dict[tuple[int, ...], int] = {}
    return [seen.setdefault(tuple(row[:n]), len(seen))
            for row, n in zip(input_ids.tolist(), prefix_len.tolist())]


def _checkpointing(model: Any) -> bool:
    """Activation (gradient) checkpointing is on: transformers then drops the cache in training."""
    base = _base_model(model)
    return base.training and any(getattr(m, "gradient_checkpointing", False) is True
                                 for m in base.modules())


def _new_cache(model: Any) -> Any:
    return new_cache(_base_model(model))


_SPLIT: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def decoder_and_head(model: Any) -> tuple[Any, torch.nn.Linear] | None:
    """The model split into its decoder (ids -> final hidden states) and a plain `nn.Linear`
    lm_head, when `head(decoder(x).last_hidden_state)` is exactly the model's logits; else None
    (a wrapped or scaled head: LoRA on lm_head, logit soft-capping or scaling, ...).

    Checked on a 3-token input in eval mode (max difference at most 1e-5 of the logits' scale)
    once per model, and again when its lm_head or decoder module was replaced since (e.g.
    `resize_token_embeddings`, an adapter injected on lm_head); `prefix_shared_logprobs` then
    computes the logprobs from the hidden states with `agentrl.learner.logprob_head.head_logprobs`.
    """
    base = _base_model(model)
    try:
        head, decoder = base.get_output_embeddings(), base.get_decoder()
    except (AttributeError, NotImplementedError):  # transformers' accessors for models that
        head = decoder = None                      # have no decoder / output embedding
    seen = _SPLIT.get(model)
    if seen is not None and seen[0] is decoder and seen[1] is head:
        return seen[2]  # checked before, and lm_head / decoder are still the same modules
    split = None
    if type(head) is torch.nn.Linear and decoder is not None and decoder is not base:
        modes = {m: m.training for m in base.modules()}
        base.eval()
        try:
            with torch.no_grad():
                ids = torch.arange(3, device=head.weight.device)[None] % head.weight.shape[0]
                want = model(input_ids=ids).logits.float()
                got = head(decoder(input_ids=ids).last_hidden_state).float()
            if got.shape == want.shape and float((got - want).abs().max()) <= 1e-5 * max(
                    1.0, float(want.abs().max())):
                split = (decoder, head)
        except (TypeError, ValueError, AttributeError):
            split = None
        finally:
            for m, mode in modes.items():  # each module's own mode, as the user left it
                m.training = mode
    _SPLIT[model] = (decoder, head, split)
    return split

Chunk = tuple[torch.Tensor, torch.Tensor]
"""(outputs, cols): logits (R, L, V), or hidden states (R, L, E) for the fused head, and the
(R, L) token columns they predict."""


def prefix_shared_logprobs(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                           loss_mask: torch.Tensor, *, temperature: float = 1.0,
                           with_entropy: bool = False, entropy_grad: bool = False,
                           share: bool = True, static: bool = True, compiled: bool = False
                           ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`token_logprobs` at the positions the loss reads, each group's shared prefix run once.

    Args:
        model: a model for which `prefix_share_supported` is True.
        input_ids: (B, T) long; attention_mask: (B, T) 0/1; loss_mask: (B, T), nonzero where
            the loss reads the token. Rows right-padded, as the learner's batches are (other
            paddings are accepted and get the single-forward path).
        temperature: logits are divided by it (0 is treated as 1).
        with_entropy: also return the entropy of the tempered distribution (nats).
        entropy_grad: keep the entropy in the autograd graph (an entropy bonus).
        share: False always takes the single-forward path (logits from the first loss column).
        static: run the decoder as `agentrl.models.static_forward.forward_hidden` when the model
            supports it (float32 Qwen2/Llama without LoRA, with the fused head); False: always
            the transformers forward.
        compiled: the static forward runs through `torch.compile` (`forward_hidden(compiled=)`).

    Returns:
        logp (B, T) float32 and entropy (B, T) or None: at every position where `loss_mask` is
        nonzero (but column 0, which has no context) equal to `token_logprobs`'s, 0 elsewhere.
    """
    t = temperature if temperature and temperature > 0 else 1.0
    real = attention_mask != 0
    has = (loss_mask != 0) & real
    has[:, 0] = False  # position 0 has no logit
    rows, p, len_r, groups, any_active = _forward_rows(input_ids, real, has, share)
    use_share = _sharing_pays(model, groups, p, len_r)

    split = None if entropy_grad else decoder_and_head(model)
    fast = (split is not None and static and static_forward_supported(model)
            and not _checkpointing(model))  # checkpointing is for memory: keep its forward

    chunks = None
    if use_share:
        chunks = _shared_prefix_chunks(model, split, fast, compiled, input_ids, rows, p, len_r,
                                       groups, attention_mask.dtype)
    if chunks is None:
        chunks = [_single_forward_chunk(model, split, fast, compiled, input_ids, attention_mask,
                                        real, rows, p, any_active)]
    picked, r_all, c_all = _picked_positions(chunks, rows, has)
    if split is not None:
        return _fused_head_logprobs(picked, split[1], input_ids, r_all, c_all, t, with_entropy)
    return _logits_logprobs(picked, input_ids, r_all, c_all, t, with_entropy, entropy_grad)


def _forward_rows(input_ids: torch.Tensor, real: torch.Tensor, has: torch.Tensor, share: bool
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int], bool]:
    """The rows to forward (those with a loss position; all B when none has one), as (R,)
    indices; each one's first loss column p (R,) (>= 1 if any) and length (R,); the groups of
    rows with the same prefix (`shared_prefix_groups`; [] when sharing is off, impossible or
    there is nothing to read); and whether any row has a loss position."""
    B, T = input_ids.shape
    dev = input_ids.device
    active = has.any(-1)
    any_active = bool(active.any())
    rows = active.nonzero().squeeze(-1) if any_active else torch.arange(B, device=dev)
    lengths = real.sum(-1)
    right_padded = bool(torch.equal(real, torch.arange(T, device=dev)[None] < lengths[:, None]))
    p = has[rows].float().argmax(-1)  # first loss column of each forwarded row (>= 1 if any)
    groups: list[int] = []
    if share and right_padded and any_active:
        groups = shared_prefix_groups(input_ids[rows], p)
    return rows, p, lengths[rows], groups, any_active


def _sharing_pays(model: Any, groups: list[int], p: torch.Tensor, len_r: torch.Tensor) -> bool:
    """Sharing runs fewer tokens than the rows themselves (distinct prefixes, left-padded to the
    longest, plus every row's continuation), and activation checkpointing is off (transformers
    drops the cache then)."""
    n_groups, R = (max(groups) + 1 if groups else 0), len(p)
    P = int(p.max()) if R else 0
    Lc = int((len_r - p).max()) if R else 0
    return (bool(groups) and n_groups < R and n_groups * P + R * (Lc - 1) < R * int(len_r.max())
            and not _checkpointing(model))


def _run(net: Any, split: Any, **kw: Any) -> torch.Tensor:
    """`net`'s hidden states (the fused head's decoder) or logits (the whole model)."""
    out = net(**kw)
    return out.last_hidden_state if split is not None else out.logits


def _left_padded_prefixes(input_ids: torch.Tensor, rows: torch.Tensor, p: torch.Tensor,
                          groups: list[int], mask_dtype: torch.dtype
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each group's prefix once, left-padded so that every prefix ends at column P - 1:
    ids, attention mask and position ids, each (n_groups, P)."""
    dev = input_ids.device
    n_groups, P = max(groups) + 1, int(p.max())
    lead = [groups.index(g) for g in range(n_groups)]
    pre_ids = torch.zeros((n_groups, P), dtype=torch.long, device=dev)
    pre_mask = torch.zeros((n_groups, P), dtype=mask_dtype, device=dev)
    for i, r in enumerate(lead):
        pr = int(p[r])
        pre_ids[i, P - pr:] = input_ids[rows[r], :pr]
        pre_mask[i, P - pr:] = 1
    pre_pos = (pre_mask.cumsum(-1) - 1).clamp(min=0)
    return pre_ids, pre_mask, pre_pos


def _shared_prefix_chunks(model: Any, split: Any, fast: bool, compiled: bool,
                          input_ids: torch.Tensor, rows: torch.Tensor, p: torch.Tensor,
                          len_r: torch.Tensor, groups: list[int], mask_dtype: torch.dtype
                          ) -> list[Chunk] | None:
    """Two forwards: each distinct prefix once (filling a KV cache), then every row's
    continuation on top of its group's cache rows. None when the model did not fill the cache
    (then no sharing)."""
    dev, T = input_ids.device, input_ids.shape[1]
    net = split[0] if split is not None else model
    P, Lc = int(p.max()), int((len_r - p).max())
    g_idx = torch.tensor(groups, dtype=torch.long, device=dev)
    pre_ids, pre_mask, pre_pos = _left_padded_prefixes(input_ids, rows, p, groups, mask_dtype)
    chunks: list[Chunk] = []
    if fast:
        hid, kv = forward_hidden(model, pre_ids, pre_pos, pre_mask, compiled=compiled)
        chunks.append((hid[:, -1:][g_idx], p[:, None]))  # predicts token p_b
    else:
        cache = _new_cache(model)
        kw = {cache_kwarg(net) if split is not None else _cache_kw(model): cache}
        keep = {} if split is not None else {"logits_to_keep": 1}
        out = _run(net, split, input_ids=pre_ids, attention_mask=pre_mask, position_ids=pre_pos,
                   use_cache=True, **keep, **kw)
        chunks.append((out[:, -1:][g_idx], p[:, None]))  # predicts token p_b
        if cache.get_seq_length() != P:  # the model did not fill the cache: no sharing
            return None
    if Lc > 1:
        cols = p[:, None] + torch.arange(Lc - 1, device=dev)[None]  # inputs p_b .. p_b+Lc-2
        valid = cols < len_r[:, None]
        cont = torch.where(valid, input_ids[rows].gather(1, cols.clamp(max=T - 1)), 0)
        mask = torch.cat([pre_mask[g_idx], valid.to(pre_mask.dtype)], dim=1)  # (R, P + Lc - 1)
        if fast:  # each row's prefix keys and values: an index (autograd sums the rows' grads)
            out2, _ = forward_hidden(model, cont, cols, mask, [(k[g_idx], v[g_idx]) for k, v in kv],
                                     compiled=compiled)
        else:
            cache.batch_select_indices(g_idx)  # differentiable: keys[g_idx], values[g_idx]
            out2 = _run(net, split, input_ids=cont, attention_mask=mask, position_ids=cols,
                        use_cache=True, **kw)
        chunks.append((out2, cols + 1))  # the output at column c predicts token c + 1
    return chunks


def _single_forward_chunk(model: Any, split: Any, fast: bool, compiled: bool,
                          input_ids: torch.Tensor, attention_mask: torch.Tensor,
                          real: torch.Tensor, rows: torch.Tensor, p: torch.Tensor,
                          any_active: bool) -> Chunk:
    """One plain forward of the rows, outputs kept from the first loss column on."""
    dev = input_ids.device
    net = split[0] if split is not None else model
    width = int(real[rows].cumsum(-1).argmax(-1).max()) + 1  # last real column + 1
    start = int(p.min()) if any_active else width - 1
    start = min(max(start, 1), max(width - 1, 1))
    keep = {} if split is not None else {"logits_to_keep": width - start + 1}
    if fast:  # position ids 0..width-1, as the transformers forward without position_ids
        out, _ = forward_hidden(model, input_ids[rows, :width],
                                torch.arange(width, device=dev)[None].expand(len(rows), -1),
                                attention_mask[rows, :width], compiled=compiled)
    else:
        out = _run(net, split, input_ids=input_ids[rows, :width],
                   attention_mask=attention_mask[rows, :width], **keep)
    out = out[:, start - 1: width - 1] if split is not None else out[:, :-1]
    cols = torch.arange(start, start + out.shape[1], device=dev)[None].expand(len(rows), -1)
    return out, cols  # predicts tokens start .. width-1


def _picked_positions(chunks: list[Chunk], rows: torch.Tensor, has: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The outputs at the positions the loss reads, concatenated over the chunks: (N, V) or
    (N, E), with their rows (N,) and columns (N,) in the batch."""
    T = has.shape[1]
    picked, tr, tc = [], [], []
    for states, cols in chunks:
        c = cols.clamp(max=T - 1)
        sel = (cols < T) & has[rows[:, None], c]
        ri, ji = sel.nonzero(as_tuple=True)
        picked.append(states[ri, ji])
        tr.append(rows[ri])
        tc.append(cols[ri, ji])
    return torch.cat(picked), torch.cat(tr), torch.cat(tc)


def _fused_head_logprobs(hidden: torch.Tensor, head: torch.nn.Linear, input_ids: torch.Tensor,
                         r_all: torch.Tensor, c_all: torch.Tensor, t: float, with_entropy: bool
                         ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(N, E) hidden states -> (B, T) logprobs and entropies, in one function (`head_logprobs`)."""
    B, T = input_ids.shape
    dev = input_ids.device
    logp = torch.zeros((B, T), dtype=torch.float32, device=dev)
    lp, e = head_logprobs(hidden, head, input_ids[r_all, c_all], temperature=t)
    logp = logp.index_put((r_all, c_all), lp)
    ent = (torch.zeros((B, T), dtype=torch.float32, device=dev).index_put((r_all, c_all), e)
           if with_entropy else None)
    return logp, ent


def _logits_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, r_all: torch.Tensor,
                     c_all: torch.Tensor, t: float, with_entropy: bool, entropy_grad: bool
                     ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(N, V) logits (only the positions the loss reads) -> (B, T) logprobs and entropies."""
    B, T = input_ids.shape
    dev = input_ids.device
    logp = torch.zeros((B, T), dtype=torch.float32, device=dev)
    lg = logits.float()
    if t != 1.0:
        lg = lg / t
    lse = torch.logsumexp(lg, dim=-1)
    lp = lg.gather(-1, input_ids[r_all, c_all][:, None]).squeeze(-1) - lse
    logp = logp.index_put((r_all, c_all), lp)
    ent = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            x = lg if entropy_grad else lg.detach()
            e = (lse if entropy_grad else lse.detach()) - (torch.softmax(x, dim=-1) * x).sum(-1)
            ent = torch.zeros((B, T), dtype=torch.float32, device=dev).index_put((r_all, c_all), e)
    return logp, ent
