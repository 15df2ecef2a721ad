"""One-token decode steps of Llama-family models (Qwen2, Llama) on a preallocated KV cache.

`HFEngine` prefills a chunk of prompts with the transformers forward, then hands the filled
cache to a `StaticDecoder`, which runs every further token as a few dozen torch ops per layer
on the model's own weights instead of one transformers forward per token. For small models on
CPU the transformers forward is mostly per-module Python and dispatch (output capture, mask
creation, `DynamicCache.update` with `torch.cat`, rotary embedding, GQA expansion), so this
cuts the time per step 1.5-2.5x (`benchmarks/decode_step.py`, CPU time, 1 thread: the TRL
benchmark's 417K-parameter model 3.8 -> 1.5 ms at batch 8, 7.2 -> 4.5 ms at batch 64); for
large models both are dominated by the same matrix products.

What one step computes (the model's eval-mode forward for one new token per row, same math as
transformers' sdpa/eager attention; results agree to float32 rounding):

    h = embed[token]
    per layer:  x = rms_norm(h) ; q, k, v = x @ [Wq; Wk; Wv]^T (+ bias) ; RoPE(q, k) at the row's
                position ; k, v written to cache column `col` ; o = softmax(q K^T * scale + pad
                bias) V over columns [0, col] ; h += o @ Wo^T ; x = rms_norm(h) ;
                g, u = x @ [Wgate; Wup]^T ; h += (silu(g) * u) @ Wdown^T
    logits = rms_norm(h) @ W_lm_head^T

Used only when `unsupported_reason(model)` is None: a float32 `qwen2` or `llama` causal LM in
eval mode with plain `nn.Linear` projections (no LoRA/quantized layers), SiLU MLP, full
attention in every layer (no sliding window), sdpa or eager attention, and a RoPE whose
frequencies do not depend on the sequence length (`default`, `linear`, `llama3`). Anything else
(bf16/fp16 weights, other architectures, dynamic/YaRN RoPE, ...) keeps the transformers path.
Half precision is left out on purpose: there the order of roundings matters (transformers
rounds the normalised activations before multiplying by the RMSNorm weight, and its attention
kernels accumulate differently), so the two paths would not give the same tokens.
Memory: the fused q/k/v and gate/up matrices are kept as copies (`DecoderWeights`).

Shapes: B = rows in the batch, C = cache capacity (prompt width + max new tokens),
H = query heads, K = key/value heads (H % K == 0), D = head dim, E = hidden size, V = vocab.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from agentrl.models.sampling import sample_next

SUPPORTED_MODEL_TYPES = ("qwen2", "llama")
STATIC_ROPE_TYPES = ("default", "linear", "llama3")
"""RoPE types whose frequencies are fixed at model construction (no dependence on length)."""


def unsupported_reason(model: Any, *, training: bool = False) -> str | None:
    """Why `StaticDecoder` cannot run `model` exactly, or None when it can (see module doc).

    With `training=True`, the same for the learner's `agentrl.models.static_forward`: the model may
    be in training mode, but its attention dropout must be 0 (the forward has no dropout)."""
    cfg = getattr(model, "config", None)
    if cfg is None:
        return "the model has no config"
    model_type = getattr(cfg, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        return f"model_type {model_type!r} is not one of {SUPPORTED_MODEL_TYPES}"
    if getattr(cfg, "hidden_act", None) != "silu":
        return f"hidden_act {getattr(cfg, 'hidden_act', None)!r} is not 'silu'"
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in STATIC_ROPE_TYPES:
        return f"rope_type {rope_type!r} is not one of {STATIC_ROPE_TYPES}"
    layer_types = getattr(cfg, "layer_types", None) or ["full_attention"]
    if any(t != "full_attention" for t in layer_types):
        return "not every layer has full attention (sliding window)"
    attn = getattr(cfg, "_attn_implementation", None)
    if attn not in ("sdpa", "eager", None):
        return f"attention implementation {attn!r} is not sdpa or eager"
    if getattr(cfg, "pretraining_tp", 1) > 1:
        return "pretraining_tp > 1"
    if training:
        if float(getattr(cfg, "attention_dropout", 0.0) or 0.0) != 0.0:
            return "attention_dropout is not 0"
    elif getattr(model, "training", False):
        return "the model is in training mode (dropout)"
    dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
    if dtypes != {torch.float32}:
        return f"parameter dtypes {sorted(map(str, dtypes))} are not float32"
    base = getattr(model, "model", None)
    if base is None or not all(hasattr(base, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb")):
        return "the model has no `model.{embed_tokens, layers, norm, rotary_emb}`"
    if len(base.layers) != getattr(cfg, "num_hidden_layers", len(base.layers)):
        return "num_hidden_layers differs from the number of layers"
    if type(model.get_output_embeddings()) is not nn.Linear:
        return "the output embedding is not a plain nn.Linear"
    for layer in base.layers:
        at, mlp = layer.self_attn, layer.mlp
        projections = (at.q_proj, at.k_proj, at.v_proj, at.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)
        if any(type(m) is not nn.Linear for m in projections):
            return "a projection is not a plain nn.Linear (LoRA, quantized, ...)"
        if any(getattr(n, "variance_epsilon", None) is None
               for n in (layer.input_layernorm, layer.post_attention_layernorm)):
            return "a layer norm is not an RMSNorm with `variance_epsilon`"
    return None


def static_decoder_supported(model: Any) -> bool:
    """True when `StaticDecoder` computes exactly what the model's forward computes."""
    return unsupported_reason(model) is None


def cache_kv(cache: Any, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(keys, values) of `layer` in a transformers `DynamicCache` (5.x `layers`, 4.x lists),
    each (rows, K, width, D)."""
    if hasattr(cache, "layers"):
        return cache.layers[layer].keys, cache.layers[layer].values
    return cache.key_cache[layer], cache.value_cache[layer]


class DecoderWeights:
    """The tensors one decode step reads, taken from a supported model.

    q/k/v and gate/up weights (and biases) are concatenated into one matrix each, so a layer
    runs 4 matrix products instead of 7; these are copies (about the size of the attention
    and MLP input weights), every other tensor is the model's own. `stale()` tells when the
    model's weights changed since (an in-place update bumps a tensor's version counter,
    a replaced tensor has another storage): build a new `DecoderWeights` then. (Writes through
    `tensor.data` bypass the version counter and are not seen.)

    Args:
        model: a model with `unsupported_reason(model) is None`.
    """

    def __init__(self, model: Any) -> None:
        base = model.model
        head = model.get_output_embeddings()
        self.embed: torch.Tensor = base.embed_tokens.weight  # (V, E)
        self.norm_w: torch.Tensor = base.norm.weight
        self.norm_eps: float = base.norm.variance_epsilon
        self.head_w: torch.Tensor = head.weight  # (V, E), the embeddings when tied
        self.head_b: torch.Tensor | None = head.bias
        self._rotary = base.rotary_emb
        self._rope: tuple[torch.Tensor, torch.Tensor] | None = None
        sources = [self.embed, self.norm_w, self.head_w, self._rotary.inv_freq]
        self.layers: list[tuple[Any, ...]] = []
        for layer in base.layers:
            at, mlp = layer.self_attn, layer.mlp
            d = at.head_dim
            lin = (at.q_proj, at.k_proj, at.v_proj, at.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)
            sources += [m.weight for m in lin] + [m.bias for m in lin if m.bias is not None]
            sources += [layer.input_layernorm.weight, layer.post_attention_layernorm.weight]
            self.layers.append((
                layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon,
                _cat([at.q_proj.weight, at.k_proj.weight, at.v_proj.weight]),
                cat_bias([at.q_proj, at.k_proj, at.v_proj]),
                at.q_proj.weight.shape[0] // d, at.k_proj.weight.shape[0] // d, d, float(at.scaling),
                at.o_proj.weight, at.o_proj.bias,
                layer.post_attention_layernorm.weight, layer.post_attention_layernorm.variance_epsilon,
                _cat([mlp.gate_proj.weight, mlp.up_proj.weight]), cat_bias([mlp.gate_proj, mlp.up_proj]),
                mlp.down_proj.weight, mlp.down_proj.bias,
            ))
        if self.head_b is not None:
            sources.append(self.head_b)
        self._sources = sources
        self._stamp = _stamp(sources)

    def stale(self) -> bool:
        """True when a weight of the model was modified in place or replaced since building
        (or when the weights are inference tensors, which have no version counter)."""
        return self._stamp is None or _stamp(self._sources) != self._stamp

    def rope(self, positions: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin), each (>= positions, D): the model's own rotary embedding at position ids
        0..positions-1 (attention scaling of `linear`/`llama3` RoPE included), cached."""
        if self._rope is None or self._rope[0].shape[0] < positions:
            n = max(positions, 2 * self._rope[0].shape[0] if self._rope is not None else 0)
            pos = torch.arange(n, device=self.embed.device)[None]
            cos, sin = self._rotary(self.embed[:1][None], pos)  # (1, n, D)
            self._rope = (cos[0], sin[0])
        return self._rope


def _cat(ws: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([w.detach() for w in ws])


def cat_bias(mods: list[nn.Linear], *, detach: bool = True) -> torch.Tensor | None:
    """The biases of `mods` concatenated, (sum of out_features,), zeros for a module without
    one; None when none has a bias. `detach=False` keeps them in the autograd graph (the
    learner's `agentrl.models.static_forward`); the decoder keeps detached copies."""
    if all(m.bias is None for m in mods):
        return None
    return torch.cat([(m.bias.detach() if detach else m.bias) if m.bias is not None
                      else m.weight.new_zeros(m.weight.shape[0]) for m in mods])


def _stamp(tensors: list[torch.Tensor]) -> tuple[tuple[int, int], ...] | None:
    if any(t.is_inference() for t in tensors):
        return None
    return tuple((t.data_ptr(), t._version) for t in tensors)


class StaticDecoder:
    """Decode state of one batch: preallocated KV buffers and the padding bias, plus `step`.

    Args:
        weights: `DecoderWeights` of the model that filled `cache`.
        cache: the transformers cache of the prefill of the distinct (left-padded) prompts;
            layer i holds (P, K, W, D) keys and values, W = prompt width.
        prefill_mask: (P, W) 0/1 attention mask of the prefill (0 on left padding).
        expand: (B,) long: the prefill row each decode row continues (repeats for n > 1).
        capacity: C, cache columns to allocate (W + max new tokens); also the number of RoPE
            positions available (a row's position is at most its column).

    Memory: 2 x layers x B x K x C x D floats (the same as the transformers cache at the end).
    """

    def __init__(self, weights: DecoderWeights, cache: Any, prefill_mask: torch.Tensor,
                 expand: torch.Tensor, capacity: int) -> None:
        self.w = weights
        self.cos, self.sin = weights.rope(capacity)
        self.k: list[torch.Tensor] = []  # per layer (B, K, C, D)
        self.v: list[torch.Tensor] = []
        for i in range(len(weights.layers)):
            keys, values = cache_kv(cache, i)
            width = keys.shape[2]
            kbuf = keys.new_empty((len(expand), keys.shape[1], capacity, keys.shape[3]))
            vbuf = values.new_empty((len(expand), values.shape[1], capacity, values.shape[3]))
            kbuf[:, :, :width] = keys[expand]
            vbuf[:, :, :width] = values[expand]
            self.k.append(kbuf)
            self.v.append(vbuf)
        # (B, 1, 1, C) additive attention bias: -inf on each row's left padding, 0 elsewhere
        # (columns >= W are new tokens, real for every row still in the batch).
        width = prefill_mask.shape[1]
        self.bias = torch.zeros((len(expand), 1, 1, capacity), dtype=self.k[0].dtype, device=expand.device)
        self.bias[:, 0, 0, :width].masked_fill_(prefill_mask[expand] == 0, float("-inf"))
        self._marked = False  # dynamic-dim hints given to torch.compile (`step_sample`)

    def select(self, keep: torch.Tensor) -> None:
        """Keep only the batch rows `keep` ((B',) long, in order): finished rows are dropped."""
        self.k = [k[keep] for k in self.k]
        self.v = [v[keep] for v in self.v]
        self.bias = self.bias[keep]
        self._marked = False

    def step(self, tokens: torch.Tensor, pos: torch.Tensor, col: int) -> torch.Tensor:
        """Feed one token per row and return the next-token logits.

        Args:
            tokens: (B,) long ids.
            pos: (B,) long position ids of these tokens (each row's count of real tokens so far).
            col: the cache column they fill, the same for every row (prompts are left-padded
                to one width); attention reads columns [0, col].

        Returns:
            (B, V) float32 logits.
        """
        return decode_logits(self, tokens, pos, col)

    def step_sample(self, tokens: torch.Tensor, pos: torch.Tensor, col: int, temperature: float,
                    top_p: float, uniform: torch.Tensor | None, *, compiled: bool = False
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`step`, then `sampling.sample_next` on its logits: the next token of every row and
        its sampler logprob, both (B,) (int64, float32). Same arguments as the two.

        With `compiled=True` both run as one `torch.compile` graph (`HFEngine(compile=True)`):
        fused C++ kernels instead of ~100 dispatched torch ops per token. Compiled once per
        process with dynamic batch size, column and capacity (a new temperature, top-p or
        model, and a one-row batch, can add a graph; past dynamo's limit of 8 graphs it runs
        eagerly, with torch's warning); if compiling fails it warns once and runs eagerly
        from then on. Non-finite logits are not a compile failure: their NaN logprobs reach
        the caller (`HFEngine.generate` raises on them).
        Same math as eager; float32 rounding may differ (a near-tie can flip a token).
        """
        if not compiled:
            return _tick(self, tokens, pos, col, temperature, top_p, uniform)
        if not self._marked:  # new buffers (construction, `select`): hint their dynamic dims
            self._mark_dynamic()
        args = (self, mark_dynamic(tokens), mark_dynamic(pos), col, temperature, top_p,
                None if uniform is None else mark_dynamic(uniform))
        return call_compiled(_COMPILED, COMPILE_BACKEND, _build_tick, _tick, args,
                             "rollout.compile: torch.compile of the decode step")

    def _mark_dynamic(self) -> None:
        """Tell `torch.compile` that the batch and capacity dims of the buffers vary."""
        for t in self.k + self.v:
            mark_dynamic(t, 0, 2)
        mark_dynamic(self.bias, 0, 3)
        mark_dynamic(self.cos, 0)
        mark_dynamic(self.sin, 0)
        self._marked = True


COMPILE_BACKEND = "inductor"
"""`torch.compile` backend of `StaticDecoder.step_sample(..., compiled=True)` (tests may use "eager")."""
COMPILE_OPTIONS: dict[str, dict[str, Any]] = {"inductor": {"cpp_wrapper": True}}
"""Backend options: inductor's C++ wrapper runs a step's kernels from one C++ function instead of
Python (`benchmarks/decode_step.py --compile`)."""
_COMPILED: dict[str, Any] = {}


def mark_dynamic(t: torch.Tensor, *dims: int) -> torch.Tensor:
    """`t` with `dims` (default 0) marked as varying for `torch.compile`
    (`torch._dynamo.maybe_mark_dynamic`: a hint, not a constraint; a size-1 dim stays
    specialised). Also used by the learner's compiled forward (`agentrl.models.static_forward`)."""
    for d in dims or (0,):
        torch._dynamo.maybe_mark_dynamic(t, d)
    return t


def call_compiled(store: dict[str, Any], key: str, build: Callable[[], Callable[..., Any]],
                  eager: Callable[..., Any], args: tuple[Any, ...], what: str) -> Any:
    """`eager(*args)` computed by its `torch.compile` version, `build()`, made once into
    `store[key]` (per process). If the compiled call raises (no C++ compiler, an inductor bug,
    ...), `store["failed"]` records why, a `RuntimeWarning` starting with `what` says so once,
    and `eager` runs, now and from then on. Used by the decode step (`rollout.compile`) and the
    learner's forward (`train.compile`, `agentrl.models.static_forward`)."""
    if store.get("failed"):
        return eager(*args)
    fn = store.get(key)
    if fn is None:
        fn = store[key] = build()
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 - any failure of the compiled path: run eagerly
        store["failed"] = f"{type(e).__name__}: {e}"
        warnings.warn(f"{what} failed, running it eagerly from now on ({store['failed'][:300]})",
                      RuntimeWarning, stacklevel=3)
        return eager(*args)


def _build_tick() -> Callable[..., Any]:
    """`_tick` through `torch.compile` (`COMPILE_BACKEND`, `COMPILE_OPTIONS`).

    Dynamic dims: the batch (B) and cache capacity (C) of the tensors (`mark_dynamic` hints) and
    the column argument `decode_col` (named in `torch.compiler.config.dynamic_sources`, so the
    first compile is already general in it). The weights' shapes stay static, which lets
    inductor emit fixed-size vectorised loops: about 0.5x eager time per token at batch 8,
    against 0.8x with `dynamic=True` (every dim symbolic)."""
    cfg = torch.compiler.config
    sources = [s for s in (cfg.dynamic_sources or "").split(",") if s]
    if "L['decode_col']" not in sources:
        cfg.dynamic_sources = ",".join([*sources, "L['decode_col']"])
    return torch.compile(_tick, dynamic=None, backend=COMPILE_BACKEND,
                         options=COMPILE_OPTIONS.get(COMPILE_BACKEND))


def _tick(dec: StaticDecoder, tokens: torch.Tensor, pos: torch.Tensor, decode_col: int, temperature: float,
          top_p: float, uniform: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    return sample_next(decode_logits(dec, tokens, pos, decode_col), temperature, top_p, uniform)


def decode_logits(dec: StaticDecoder, tokens: torch.Tensor, pos: torch.Tensor, col: int) -> torch.Tensor:
    """`StaticDecoder.step` as a plain function of the decoder state (what `torch.compile`
    traces): writes the new keys/values into column `col` of `dec`'s buffers and returns the
    (B, V) float32 logits."""
    B = tokens.shape[0]
    w = dec.w
    h = F.embedding(tokens, w.embed)  # (B, E)
    cos, sin = dec.cos[pos][:, None], dec.sin[pos][:, None]  # (B, 1, D)
    bias = dec.bias[..., : col + 1]  # (B, 1, 1, L), L = col + 1
    for li, (w_in, eps_in, qkv_w, qkv_b, n_q, n_kv, d, scale, o_w, o_b, w_post, eps_post,
             gu_w, gu_b, dn_w, dn_b) in enumerate(w.layers):
        x = F.rms_norm(h, (h.shape[-1],), w_in, eps_in)
        qkv = F.linear(x, qkv_w, qkv_b)  # (B, (H + 2K) D)
        qk = qkv[:, : (n_q + n_kv) * d].view(B, n_q + n_kv, d)
        half = d // 2
        qk = qk * cos + torch.cat((-qk[..., half:], qk[..., :half]), dim=-1) * sin  # RoPE
        kc, vc = dec.k[li], dec.v[li]
        kc.select(2, col).copy_(qk[:, n_q:])  # select/copy_, not `kc[:, :, col] =`: under
        vc.select(2, col).copy_(qkv[:, (n_q + n_kv) * d:].view(B, n_kv, d))  # compile, col stays symbolic
        q = qk[:, :n_q].reshape(B, n_kv, n_q // n_kv, d)  # query heads grouped by KV head
        scores = torch.matmul(q, kc[:, :, : col + 1].transpose(-1, -2)).mul_(scale).add_(bias)
        o = torch.matmul(scores.softmax(dim=-1), vc[:, :, : col + 1])  # (B, K, H/K, D)
        h = h + F.linear(o.reshape(B, n_q * d), o_w, o_b)
        x = F.rms_norm(h, (h.shape[-1],), w_post, eps_post)
        g, u = F.linear(x, gu_w, gu_b).chunk(2, dim=-1)
        h = h + F.linear(F.silu(g) * u, dn_w, dn_b)
    h = F.rms_norm(h, (h.shape[-1],), w.norm_w, w.norm_eps)
    return F.linear(h, w.head_w, w.head_b).float()
