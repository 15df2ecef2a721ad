"""Proposed speed-ups of agentrl's training path, applied by monkeypatching so the benchmark can
measure them before anyone edits the library (see proposed_patches.md for the diffs).

- `fast_decode`: HFEngine decodes with `StaticDecoder` (below) instead of one transformers
  forward per token. Prefill is unchanged (one transformers forward with a `DynamicCache`);
  its keys/values are copied once into preallocated (rows, kv_heads, width + max_new, head_dim)
  buffers, then each new token runs through a hand-written Llama/Qwen2 decoder step on the
  model's own weights (q/k/v and gate/up projections concatenated once per generate call).
  Same math as transformers' sdpa path; results agree to float32 rounding.
- `logits_from_loss`: the learner computes logits (lm_head, log-softmax, entropy) only from
  the first position any row trains on, not over the prompt (`logits_to_keep`).
- `fused_adamw`: the learner's AdamW uses the fused kernel (`fused=True`, CPU and CUDA).
- `fast_sync`: `HFEngine.update_weights` copies tensors directly (`Tensor.copy_`) into
  precomputed (source name, target tensor) pairs instead of `load_state_dict(strict=False)`.

`apply(["fast_decode", ...])` installs them in this process (`"all"`: every one but
`logits_from_loss`, which `prefix_share` subsumes); `ENABLED[name] = False` turns an installed
patch off again (all but `fused_adamw`), so one process can alternate with and without it.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F

from agentrl.rollout.engines.base import Completion, SamplingParams
from agentrl.rollout.engines.hf import COMPACT_FRACTION, sample_next

PATCHES = ("fast_decode", "logits_from_loss", "prefix_share", "fused_adamw", "fast_sync")

_ROPE_STATIC = ("default", "linear", "llama3")


# -- fast decode --------------------------------------------------------------------------------
def static_decoder_supported(model: Any) -> bool:
    """True when `StaticDecoder` computes exactly what the model's forward computes: a float32
    Qwen2 or Llama causal LM, SiLU MLP, full attention in every layer (no sliding window), a
    RoPE whose frequencies do not depend on the sequence length, sdpa or eager attention."""
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "model_type", None) not in ("qwen2", "llama"):
        return False
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    layer_types = getattr(cfg, "layer_types", None) or ["full_attention"]
    return (getattr(cfg, "hidden_act", None) == "silu"
            and rope.get("rope_type", rope.get("type", "default")) in _ROPE_STATIC
            and all(t == "full_attention" for t in layer_types)
            and getattr(cfg, "_attn_implementation", "sdpa") in ("sdpa", "eager", None)
            and next(model.parameters()).dtype == torch.float32
            and not getattr(cfg, "pretraining_tp", 1) > 1)


def _cache_kv(cache: Any, i: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer i's (keys, values) of a transformers DynamicCache (5.x `layers`, 4.x lists)."""
    if hasattr(cache, "layers"):
        return cache.layers[i].keys, cache.layers[i].values
    return cache.key_cache[i], cache.value_cache[i]


class StaticDecoder:
    """One-token decode steps of a Llama-family model with a preallocated KV cache.

    Args:
        model: a model for which `static_decoder_supported` is True (weights read, not copied,
            except q/k/v and gate/up, concatenated here: build one per generate call).
        cache: the transformers cache filled by the prefill of the distinct prompts.
        expand: (rows,) long, the prefill row each decode row continues.
        capacity: cache columns (prompt width + max new tokens).
        positions: max position id + 1 the decode will use (for the RoPE table).
    """

    def __init__(self, model: Any, cache: Any, expand: torch.Tensor, capacity: int, positions: int):
        base = model.model
        self.embed = base.embed_tokens.weight
        self.norm_w, self.norm_eps = base.norm.weight, base.norm.variance_epsilon
        head = model.get_output_embeddings()
        self.head_w, self.head_b = head.weight, head.bias
        dev = self.embed.device
        pos = torch.arange(positions, device=dev)[None]
        cos, sin = base.rotary_emb(self.embed[:1][None], pos)  # (1, P, D): the model's own RoPE
        self.cos, self.sin = cos[0], sin[0]
        self.layers = []
        self.k, self.v = [], []
        for i, layer in enumerate(base.layers):
            at, mlp = layer.self_attn, layer.mlp
            qkv_w = torch.cat([at.q_proj.weight, at.k_proj.weight, at.v_proj.weight])
            qkv_b = (torch.cat([at.q_proj.bias, at.k_proj.bias, at.v_proj.bias])
                     if at.q_proj.bias is not None else None)
            gu_w = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])
            if mlp.gate_proj.bias is not None:  # Llama mlp_bias=True
                gu_b = torch.cat([mlp.gate_proj.bias, mlp.up_proj.bias])
            else:
                gu_b = None
            n_q = at.q_proj.weight.shape[0] // at.head_dim
            n_kv = at.k_proj.weight.shape[0] // at.head_dim
            self.layers.append((layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon,
                                qkv_w, qkv_b, n_q, n_kv, at.head_dim, at.scaling,
                                at.o_proj.weight, at.o_proj.bias,
                                layer.post_attention_layernorm.weight,
                                layer.post_attention_layernorm.variance_epsilon,
                                gu_w, gu_b, mlp.down_proj.weight, mlp.down_proj.bias))
            keys, values = _cache_kv(cache, i)
            width = keys.shape[2]
            kbuf = keys.new_zeros((len(expand), keys.shape[1], capacity, keys.shape[3]))
            vbuf = values.new_zeros((len(expand), values.shape[1], capacity, values.shape[3]))
            kbuf[:, :, :width] = keys[expand]
            vbuf[:, :, :width] = values[expand]
            self.k.append(kbuf)
            self.v.append(vbuf)

    def select(self, keep: torch.Tensor) -> None:
        """Keep only batch rows `keep` (finished rows dropped)."""
        self.k = [k[keep] for k in self.k]
        self.v = [v[keep] for v in self.v]

    def step(self, tokens: torch.Tensor, pos: torch.Tensor, col: int, mask: torch.Tensor) -> torch.Tensor:
        """Feed one token per row.

        Args:
            tokens: (B,) ids. pos: (B,) their position ids. col: the cache column they fill
                (the same for every row: prompts are left-padded). mask: (B, >= col + 1) 0/1,
                real tokens of each row's context (this token included).

        Returns:
            (B, V) float32 next-token logits.
        """
        B = tokens.shape[0]
        h = F.embedding(tokens, self.embed)
        cos, sin = self.cos[pos][:, None], self.sin[pos][:, None]  # (B, 1, D)
        # additive attention bias: 0 on each row's real tokens, -inf on its left padding
        bias = torch.zeros(mask[:, None, None, : col + 1].shape, dtype=h.dtype, device=h.device)
        bias.masked_fill_(mask[:, None, None, : col + 1] == 0, float("-inf"))
        for li, (w_in, eps_in, qkv_w, qkv_b, n_q, n_kv, d, scale, o_w, o_b, w_post, eps_post,
                 gu_w, gu_b, dn_w, dn_b) in enumerate(self.layers):
            x = F.rms_norm(h, (h.shape[-1],), w_in, eps_in)
            qkv = F.linear(x, qkv_w, qkv_b)
            qk = qkv[:, : (n_q + n_kv) * d].view(B, n_q + n_kv, d)
            half = d // 2
            qk = qk * cos + torch.cat((-qk[..., half:], qk[..., :half]), dim=-1) * sin
            kc, vc = self.k[li], self.v[li]
            kc[:, :, col] = qk[:, n_q:]
            vc[:, :, col] = qkv[:, (n_q + n_kv) * d:].view(B, n_kv, d)
            q = qk[:, :n_q].reshape(B, n_kv, n_q // n_kv, d)  # query heads grouped by KV head
            scores = torch.matmul(q, kc[:, :, : col + 1].transpose(-1, -2)).mul_(scale).add_(bias)
            o = torch.matmul(scores.softmax(dim=-1), vc[:, :, : col + 1])
            h = h + F.linear(o.reshape(B, n_q * d), o_w, o_b)
            x = F.rms_norm(h, (h.shape[-1],), w_post, eps_post)
            g, u = F.linear(x, gu_w, gu_b).chunk(2, dim=-1)
            h = h + F.linear(F.silu(g) * u, dn_w, dn_b)
        h = F.rms_norm(h, (h.shape[-1],), self.norm_w, self.norm_eps)
        return F.linear(h, self.head_w, self.head_b).float()


def fast_generate_chunk(self: Any, prompts: list[list[int]], src: list[int], params: SamplingParams,
                        generator: torch.Generator | None) -> list[Completion]:
    """`HFEngine._generate_chunk` with the decode loop on `StaticDecoder` (falls back to the
    original method when the model is not supported). Marked `# changed` where it differs."""
    if not static_decoder_supported(self._model):  # changed
        return _ORIG["_generate_chunk"](self, prompts, src, params, generator)
    dev, max_new = self.device, params.max_tokens
    lengths = torch.tensor([len(p) for p in prompts], device=dev)
    width = int(lengths.max())
    ids = torch.full((len(prompts), width), self._pad_id, dtype=torch.long, device=dev)
    mask = torch.zeros((len(prompts), width + max_new), dtype=torch.long, device=dev)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p):] = 1
    pos = (mask[:, :width].cumsum(-1) - 1).clamp(min=0)
    cache = self._new_cache()
    logits = self._forward(ids, mask[:, :width], pos, cache)
    next_pos = lengths  # changed: (B,) not (B, 1)
    expand = torch.tensor(src, dtype=torch.long, device=dev)  # changed
    logits, mask, next_pos = logits[expand], mask[expand], next_pos[expand]
    dec = StaticDecoder(self._model, cache, expand, width + max_new, width + max_new)  # changed
    del cache

    n_rows = len(src)
    out_tokens = torch.zeros((n_rows, max_new), dtype=torch.long, device=dev)
    out_logprobs = torch.zeros((n_rows, max_new), dtype=torch.float32, device=dev)
    out_len = torch.full((n_rows,), max_new, dtype=torch.long, device=dev)
    stopped = torch.zeros(n_rows, dtype=torch.bool, device=dev)
    stop_ids = torch.tensor(sorted(set(params.stop_token_ids)), dtype=torch.long, device=dev)
    rows = torch.arange(n_rows, device=dev)
    alive = torch.ones(n_rows, dtype=torch.bool, device=dev)

    for t in range(max_new):
        uniform = None
        if params.temperature > 0:
            uniform = torch.rand(n_rows, generator=generator, device=dev)[rows]
        tokens, logprobs = sample_next(logits, params.temperature, params.top_p, uniform)
        out_tokens[rows, t] = tokens
        out_logprobs[rows, t] = logprobs
        if stop_ids.numel():
            hit = torch.isin(tokens, stop_ids) & alive
            if bool(hit.any()):
                out_len[rows[hit]] = t + 1
                stopped[rows[hit]] = True
                alive &= ~hit
        n_alive = int(alive.sum())
        if n_alive == 0 or t == max_new - 1:
            break
        if len(rows) - n_alive >= max(1, int(COMPACT_FRACTION * len(rows))):
            keep = alive.nonzero().squeeze(-1)
            dec.select(keep)  # changed
            rows, alive, mask, next_pos = rows[keep], alive[keep], mask[keep], next_pos[keep]
            tokens = tokens[keep]
        mask[:, width + t] = 1
        logits = dec.step(tokens, next_pos, width + t, mask)  # changed
        next_pos = next_pos + 1

    tok_lists = out_tokens.tolist()
    lp_lists = out_logprobs.tolist()
    lens = out_len.tolist()
    reasons = ["stop" if s else "length" for s in stopped.tolist()]
    return [Completion(token_ids=tok_lists[r][: lens[r]], logprobs=lp_lists[r][: lens[r]],
                       finish_reason=reasons[r]) for r in range(n_rows)]


# -- learner: logits only where the loss looks ------------------------------------------------
def token_logprobs_from(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
                        temperature: float = 1.0, with_entropy: bool = False,
                        entropy_grad: bool = False, start: int = 1
                        ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`agentrl.learner.token_logprobs` computing logits only for the tokens at positions
    >= `start` (1 <= start < T): `logits_to_keep = T - start + 1` (the model's lm_head runs on
    the last positions only). Positions < `start` get logp 0 and entropy 0. With `start=1` it is
    `token_logprobs`."""
    t = temperature if temperature and temperature > 0 else 1.0
    T = input_ids.shape[1]
    keep = T - start + 1
    logits = model(input_ids=input_ids, attention_mask=attention_mask,
                   logits_to_keep=keep).logits[:, :-1].float()
    if t != 1.0:
        logits = logits / t
    lse = torch.logsumexp(logits, dim=-1)
    picked = logits.gather(-1, input_ids[:, start:, None]).squeeze(-1)
    logp = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    logp[:, start:] = picked - lse
    ent = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            lg = logits if entropy_grad else logits.detach()
            p = torch.softmax(lg, dim=-1)
            ent = torch.zeros_like(logp)
            ent[:, start:] = (lse if entropy_grad else lse.detach()) - (p * lg).sum(-1)
    return logp, ent


def first_loss_position(loss_mask: torch.Tensor) -> int:
    """Smallest column (>= 1) where any row has a nonzero loss mask; 1 if none. (B, T) -> int."""
    cols = (loss_mask != 0).any(dim=0).nonzero()
    return max(1, int(cols[0])) if len(cols) else 1


def _logprobs_with_mask(learner_mod: Any) -> None:
    """Make the learner pass the start of the loss to `token_logprobs` (wraps `_slice`, which
    the learner calls right before each forward, to remember the micro-batch's loss mask)."""
    orig_slice = learner_mod._slice
    state: dict[str, Any] = {}

    def _slice(batch, idx):
        sub = orig_slice(batch, idx)
        state["start"] = first_loss_position(sub["loss_mask"])
        return sub

    def token_logprobs(model, input_ids, attention_mask, **kw):
        start = min(state.pop("start", 1), input_ids.shape[1] - 1)
        return token_logprobs_from(model, input_ids, attention_mask, start=max(start, 1), **kw)

    learner_mod._slice = _slice
    learner_mod.token_logprobs = _switch("logits_from_loss", token_logprobs, learner_mod.token_logprobs)


# -- learner: prompt computed once per group --------------------------------------------------
def shared_prefix_groups(input_ids: torch.Tensor, prefix_len: torch.Tensor) -> list[int]:
    """Group index of each row: consecutive rows with the same prefix length and the same ids
    before it share a group. (B, T), (B,) -> list of B ints (0, 0, 0, 1, 1, ...)."""
    out: list[int] = []
    lead = 0
    for b in range(input_ids.shape[0]):
        pb = int(prefix_len[b])
        if out and int(prefix_len[lead]) == pb and torch.equal(input_ids[lead, :pb], input_ids[b, :pb]):
            out.append(out[-1])
        else:
            lead = b
            out.append(out[-1] + 1 if out else 0)
    return out


def prefix_shared_logprobs(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                           loss_mask: torch.Tensor, *, temperature: float = 1.0,
                           with_entropy: bool = False, entropy_grad: bool = False
                           ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`token_logprobs` on the tokens the loss uses, with each group's shared prompt run once.

    Row b's prefix is its tokens before its first loss position p_b (its prompt); consecutive
    rows with the same prefix form a group. One forward runs the distinct prefixes (left-padded,
    with a cache and gradient), the cache rows are repeated for the group's rows, and a second
    forward runs every row's continuation [p_b, len_b) on top of it. The logprob of token p_b
    comes from the prefix's last position. Gradients are those of the unshared computation
    (the prefix's activations are reused, so their gradients add up over the group).

    Args:
        input_ids, attention_mask, loss_mask: (B, T), right-padded (as `collate` makes them).

    Returns:
        logp, entropy (B, T) like `token_logprobs` at every position >= p_b of each row's real
        tokens; 0 before p_b and on padding (positions the loss never reads).
    """
    from transformers import DynamicCache

    t = temperature if temperature and temperature > 0 else 1.0
    B, T = input_ids.shape
    dev = input_ids.device
    lengths = attention_mask.sum(-1)
    has = loss_mask != 0
    first = torch.where(has.any(-1), has.float().argmax(-1), lengths - 1)
    p = torch.minimum(first, lengths - 1).clamp(min=1)  # prefix length of each row
    groups = shared_prefix_groups(input_ids, p)
    g_idx = torch.tensor(groups, dtype=torch.long, device=dev)
    lead = [groups.index(g) for g in range(groups[-1] + 1)]
    P = int(p[lead].max())
    pre_ids = torch.zeros((len(lead), P), dtype=torch.long, device=dev)
    pre_mask = torch.zeros((len(lead), P), dtype=attention_mask.dtype, device=dev)
    for i, b in enumerate(lead):
        pb = int(p[b])
        pre_ids[i, P - pb:] = input_ids[b, :pb]
        pre_mask[i, P - pb:] = 1
    pre_pos = (pre_mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache(config=model.config)
    kw = {_cache_kw(model): cache}
    out = model(input_ids=pre_ids, attention_mask=pre_mask, position_ids=pre_pos, use_cache=True,
                logits_to_keep=1, **kw)
    first_logits = out.logits[:, -1][g_idx]  # (B, V): predicts token p_b
    Lc = int((lengths - p).max())
    cols = p[:, None] + torch.arange(Lc, device=dev)[None]  # (B, Lc) positions of the continuation
    valid = cols < lengths[:, None]
    cont_ids = torch.where(valid, input_ids.gather(1, cols.clamp(max=T - 1)), 0)
    if Lc > 1:
        cache.batch_select_indices(g_idx)
        full_mask = torch.cat([pre_mask[g_idx], valid.to(pre_mask.dtype)], dim=1)
        out2 = model(input_ids=cont_ids[:, :-1], attention_mask=full_mask[:, : P + Lc - 1],
                     position_ids=cols[:, :-1], use_cache=True, **kw)
        logits = torch.cat([first_logits[:, None], out2.logits], dim=1)  # (B, Lc, V)
    else:
        logits = first_logits[:, None]
    logits = logits.float()
    if t != 1.0:
        logits = logits / t
    lse = torch.logsumexp(logits, dim=-1)
    lp = (logits.gather(-1, cont_ids[..., None]).squeeze(-1) - lse) * valid
    logp = torch.zeros((B, T + Lc), dtype=torch.float32, device=dev).scatter(1, cols, lp)[:, :T]
    ent = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            lg = logits if entropy_grad else logits.detach()
            e = ((lse if entropy_grad else lse.detach()) - (torch.softmax(lg, -1) * lg).sum(-1)) * valid
            ent = torch.zeros((B, T + Lc), dtype=torch.float32, device=dev).scatter(1, cols, e)[:, :T]
    return logp, ent


def _cache_kw(model: Any) -> str:
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _prefix_share(learner_mod: Any) -> None:
    """The learner's forwards use `prefix_shared_logprobs` (wraps `_slice` to see the mask)."""
    orig_slice = learner_mod._slice
    state: dict[str, Any] = {}

    def _slice(batch, idx):
        sub = orig_slice(batch, idx)
        state["loss_mask"] = sub["loss_mask"]
        return sub

    def token_logprobs(model, input_ids, attention_mask, **kw):
        return prefix_shared_logprobs(model, input_ids, attention_mask, state.pop("loss_mask"), **kw)

    learner_mod._slice = _slice
    learner_mod.token_logprobs = _switch("prefix_share", token_logprobs, learner_mod.token_logprobs)


# -- learner: fused AdamW ---------------------------------------------------------------------
def _fused_adamw(learner_mod: Any) -> None:
    init = learner_mod.Learner.__init__

    def __init__(self, model, **kw):
        init(self, model, **kw)
        g = self.optimizer.param_groups[0]
        params = self._params() if hasattr(self, "_params") else [p for p in model.parameters()
                                                                  if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=g["lr"], weight_decay=g["weight_decay"], fused=True)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda _: 1.0)

    learner_mod.Learner.__init__ = __init__


# -- engine: direct weight copy -----------------------------------------------------------------
def fast_update_weights(self: Any, state_dict: dict[str, Any], version: int) -> None:
    """`HFEngine.update_weights` with the key/shape checks done once per key set, then plain
    `copy_` into the model's tensors (same result as `load_state_dict(strict=False)`)."""
    keys = tuple(state_dict)
    plan = getattr(self, "_sync_plan", None)
    if plan is None or plan[0] != keys or any(tuple(state_dict[k].shape) != s for k, s in plan[2]):
        _ORIG["update_weights"](self, state_dict, version)  # validates (raises on bad input)
        own = self._model.state_dict()
        self._sync_plan = (keys, [(k, own[k]) for k in keys], [(k, tuple(own[k].shape)) for k in keys])
        return
    with torch.no_grad():
        for k, dst in plan[1]:
            dst.copy_(state_dict[k])
    self.policy_version = int(version)


_ORIG: dict[str, Any] = {}
ENABLED: dict[str, bool] = {}
"""name -> whether an installed patch is active (default True); the benchmark flips these per
step for in-process A/B measurements."""


def _switch(name: str, new: Any, old: Any) -> Any:
    """A function that calls `new` while `ENABLED[name]` (default True), else `old`."""

    @functools.wraps(new)
    def call(*args: Any, **kwargs: Any) -> Any:
        return (new if ENABLED.get(name, True) else old)(*args, **kwargs)

    return call


def apply(names: list[str]) -> list[str]:
    """Install the named patches in this process; returns the installed names.

    Raises:
        ValueError: an unknown name (allowed: PATCHES or "all").
    """
    import agentrl.learner as learner_mod
    from agentrl.rollout.engines.hf import HFEngine

    names = [n for n in names if n]
    if "all" in names:
        names = [n for n in PATCHES if n != "logits_from_loss"]
    bad = [n for n in names if n not in PATCHES]
    if bad:
        raise ValueError(f"unknown patches {bad}; allowed: {', '.join(PATCHES)}, all")
    if "logits_from_loss" in names and "prefix_share" in names:
        raise ValueError("logits_from_loss and prefix_share both replace the learner's logprobs: pick one")
    if "fast_decode" in names:
        _ORIG["_generate_chunk"] = HFEngine._generate_chunk
        HFEngine._generate_chunk = _switch("fast_decode", fast_generate_chunk, HFEngine._generate_chunk)
    if "logits_from_loss" in names:
        _logprobs_with_mask(learner_mod)
    if "prefix_share" in names:
        _prefix_share(learner_mod)
    if "fused_adamw" in names:
        _fused_adamw(learner_mod)
    if "fast_sync" in names:
        _ORIG["update_weights"] = HFEngine.update_weights
        HFEngine.update_weights = _switch("fast_sync", fast_update_weights, HFEngine.update_weights)
    return names


__all__ = ["PATCHES", "StaticDecoder", "apply", "fast_generate_chunk", "fast_update_weights",
           "first_loss_position", "static_decoder_supported", "token_logprobs_from"]
