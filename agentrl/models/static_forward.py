"""The learner's training forward of Llama-family models (Qwen2, Llama) as plain torch ops.

`prefix_share.prefix_shared_logprobs` needs the final hidden states of a batch of rows, with
gradient, optionally on top of a shared prefix's keys and values. The transformers forward
spends part of its time outside arithmetic (mask creation, per-module hooks and output capture,
`DynamicCache` bookkeeping); `forward_hidden` runs the same math on the model's own parameters
(gradients reach them through autograd):

    h = embed[ids]
    per layer:  x = rms_norm(h) ; q, k, v = x @ [Wq; Wk; Wv]^T (+ bias)   (one product)
                RoPE(q, k) at `positions` (the model's own rotary module)
                keys, values = [past | k, v]           (past: the prefix's, per row)
                o = sdpa(q, keys, values, additive mask, grouped-query heads)
                h += o @ Wo^T ; x = rms_norm(h) ; h += down(silu(gate(x)) * up(x))
    return rms_norm(h)

Masking: query i sees every real past key and the real current keys j <= i. Blocked scores get
the float32 minimum added (not -inf), so a padding query that sees no real key gets finite
garbage, as in transformers' eager attention, and no NaN reaches the gradients.

Measured on the TRL benchmark's model (`benchmarks/learner_update.py --arms head,static,compiled`,
1 thread): 0.95-0.98x the update time of the transformers forward, 0.78-0.84x of that with
`compiled=True` (`train.compile`), for the 8x8x64 and the 2x4x32 batch (0.85-0.88x and no gain
while every dim was compiled as dynamic; now only the rows and lengths are). Tried and slower
there: attention as two batched matrix products (1.08x: the CPU flash kernel wins at 64 rows x
87 keys) and one fused gate/up product (its 512-wide GEMM ran at half the speed of two 256-wide).

Used only when `static_decode.unsupported_reason(model, training=True)` is None: a float32 Qwen2
or Llama with plain `nn.Linear` projections (no LoRA), SiLU, full attention, a static RoPE and
attention dropout 0 (see that function). Results agree with the transformers forward to float32
rounding (tests: `tests/learner/test_learner.py`, the prefix-sharing cases with both forwards).

Shapes: R rows, L new tokens per row, S past tokens, E hidden, H query heads, K key/value heads,
D head dim.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from agentrl.models.static_decode import (
    call_compiled,
    cat_bias,
    mark_dynamic,
    unsupported_reason,
)


def static_forward_supported(model: Any) -> bool:
    """True when `forward_hidden` computes what `model.model(...)` computes in training mode."""
    return unsupported_reason(model, training=True) is None


def _rope(model: Any, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin), each (R, L, D), from the model's rotary module at `positions` (R, L)."""
    base = model.model
    n = int(positions.max()) + 1 if positions.numel() else 1
    pos = torch.arange(n, device=positions.device)[None]
    with torch.no_grad():
        cos, sin = base.rotary_emb(base.embed_tokens.weight[:1][None], pos)  # (1, n, D)
    return cos[0][positions], sin[0][positions]


COMPILE_BACKEND = "inductor"
"""`torch.compile` backend of `forward_hidden(..., compiled=True)` (tests use "eager")."""
_COMPILED: dict[str, Any] = {}


def forward_hidden(model: Any, ids: torch.Tensor, positions: torch.Tensor, key_mask: torch.Tensor,
                   past: list[tuple[torch.Tensor, torch.Tensor]] | None = None, *,
                   compiled: bool = False
                   ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
    """Final hidden states of `ids` after `past`, and this call's keys and values.

    Args:
        model: a causal LM with `static_forward_supported(model)`.
        ids: (R, L) long token ids.
        positions: (R, L) long position ids (RoPE).
        key_mask: (R, S + L) bool or 0/1: which past and current keys are real tokens.
        past: per layer (keys, values), each (R, K, S, D) (post-RoPE keys, as a cache holds
            them), or None (S = 0).
        compiled: run the layers through `torch.compile` (inductor: fused C++ kernels for the
            forward and the backward), with the rows, lengths and past lengths marked dynamic
            and the weights' shapes static; compiled once per process and shape family (the
            first call with and without `past`, and once more each for a single row or group,
            whose size-1 dim specialises), each first call taking tens of seconds on 2
            cores for the TRL benchmark's model. Same math; float32 rounding may differ.

    Returns:
        `(hidden, kv)`: hidden (R, L, E) after the final norm; kv per layer the (R, K, L, D)
        keys and values of the L new tokens (with gradient), to be a later call's `past`.
    """
    cos, sin = _rope(model, positions)
    real = key_mask.bool()
    if not compiled:
        return _layers(model, ids, cos, sin, real, past)
    for t in (ids, cos, sin, real):  # rows and lengths vary; the weights' shapes stay static
        mark_dynamic(t, 0, 1)
    for k, v in past or ():
        mark_dynamic(k, 0, 2)
        mark_dynamic(v, 0, 2)
    return call_compiled(_COMPILED, COMPILE_BACKEND,
                         lambda: torch.compile(_layers, dynamic=None, backend=COMPILE_BACKEND),
                         _layers, (model, ids, cos, sin, real, past),
                         "train.compile: torch.compile of the learner forward")


def _layers(model: Any, ids: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, real: torch.Tensor,
            past: list[tuple[torch.Tensor, torch.Tensor]] | None
            ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
    """`forward_hidden` after the RoPE lookup: cos, sin (R, L, D); real (R, S + L) bool."""
    base = model.model
    R, L = ids.shape
    S = past[0][0].shape[2] if past else 0
    allowed = torch.ones((L, S + L), dtype=torch.bool, device=ids.device).tril(S)  # causal
    blocked = ~(allowed[None] & real[:, None, :])  # (R, L, S + L)
    bias = torch.zeros(blocked.shape, dtype=torch.float32, device=ids.device)
    bias = bias.masked_fill_(blocked, torch.finfo(torch.float32).min)[:, None]  # (R, 1, L, S + L)
    cos, sin = cos[:, :, None], sin[:, :, None]  # (R, L, 1, D)
    h = F.embedding(ids, base.embed_tokens.weight)
    kv_out: list[tuple[torch.Tensor, torch.Tensor]] = []
    for li, layer in enumerate(base.layers):
        at, mlp = layer.self_attn, layer.mlp
        d = at.head_dim
        n_q, n_kv = at.q_proj.weight.shape[0] // d, at.k_proj.weight.shape[0] // d
        x = F.rms_norm(h, (h.shape[-1],), layer.input_layernorm.weight,
                       layer.input_layernorm.variance_epsilon)
        w = torch.cat([at.q_proj.weight, at.k_proj.weight, at.v_proj.weight])
        qkv = F.linear(x, w, cat_bias([at.q_proj, at.k_proj, at.v_proj], detach=False))  # (R, L, (H + 2K) D)
        qk = qkv[..., : (n_q + n_kv) * d].view(R, L, n_q + n_kv, d)
        half = d // 2
        qk = qk * cos + torch.cat((-qk[..., half:], qk[..., :half]), dim=-1) * sin  # RoPE
        q = qk[:, :, :n_q].transpose(1, 2)  # (R, H, L, D)
        k = qk[:, :, n_q:].transpose(1, 2)  # (R, K, L, D)
        v = qkv[..., (n_q + n_kv) * d:].view(R, L, n_kv, d).transpose(1, 2)
        kv_out.append((k, v))
        if past:
            k = torch.cat([past[li][0], k], dim=2)
            v = torch.cat([past[li][1], v], dim=2)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=float(at.scaling),
                                           enable_gqa=n_kv != n_q)  # (R, H, L, D)
        o = o.transpose(1, 2).reshape(R, L, n_q * d)
        h = h + at.o_proj(o)
        x = F.rms_norm(h, (h.shape[-1],), layer.post_attention_layernorm.weight,
                       layer.post_attention_layernorm.variance_epsilon)
        h = h + mlp.down_proj(F.silu(mlp.gate_proj(x)) * mlp.up_proj(x))
    h = F.rms_norm(h, (h.shape[-1],), base.norm.weight, base.norm.variance_epsilon)
    return h, kv_out
