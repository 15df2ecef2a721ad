"""Logprobs and entropies of chosen tokens straight from hidden states, in one autograd function.

The learner reads `log softmax(lm_head(h) / T)` only at the token each position chose. Done with
plain torch ops that is: the lm_head GEMM, a gather of the loss positions out of the (B, L, V)
logits, logsumexp, a softmax and a product for the entropy, and in the backward the gather's
scatter into a zero (B, L, V) tensor, the logsumexp backward and two GEMMs; about ten passes over
an (N, V) block. `head_logprobs` computes the same values from the (N, E) hidden states of the
loss positions only:

    z = (h W^T + b) / T                      (rows in chunks of CHUNK_ROWS, each in cache)
    lse = logsumexp(z),  p = softmax(z)      (one exp pass, p kept for the backward)
    logp = z[target] - lse,  entropy = lse - sum(p * z)

and the backward of `logp` in closed form, dlogp/dz = onehot(target) - p:

    G = (g / T) (onehot - p),   dh = G W,   dW = G^T h,   db = sum_rows G

(the cross-entropy gradient; e.g. Liger Kernel's fused linear cross-entropy does the same on
GPUs). The entropy is returned without gradient (an entropy bonus takes the plain path), and the
backward is not differentiable again (`once_differentiable`: `create_graph=True` raises).
Memory: p is kept for the backward, N x V floats, as the plain path keeps its logits.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

CHUNK_ROWS = 256
"""Rows of one lm_head chunk (256 x 943 floats, about 1 MB for the benchmark's model)."""
PAD_VOCAB = 16
"""The forward GEMM runs on the weight padded with zero rows to a multiple of this many
(measured with MKL on this CPU, 512 x 128 rows x columns: 37 GFLOPS for 943 columns, 69 for 944;
vocabularies of real models are multiples of 16 already and are not copied)."""


class _HeadLogprob(torch.autograd.Function):
    """(hidden (N, E), weight (V, E), bias (V,) or None, targets (N,), inv_t) -> logp (N,),
    entropy (N,) (no gradient)."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                targets: torch.Tensor, inv_t: float) -> tuple[torch.Tensor, torch.Tensor]:
        n = hidden.shape[0]
        logp = torch.empty(n, dtype=torch.float32, device=hidden.device)
        ent = torch.empty(n, dtype=torch.float32, device=hidden.device)
        probs = []
        vocab = weight.shape[0]
        pad = -vocab % PAD_VOCAB  # GEMM kernels are slow for odd widths: pad with zero rows
        w = F.pad(weight, (0, 0, 0, pad)) if pad else weight
        b = F.pad(bias, (0, pad)) if pad and bias is not None else bias
        for s in range(0, n, CHUNK_ROWS):
            z = F.linear(hidden[s:s + CHUNK_ROWS], w, b)[:, :vocab].float()
            if inv_t != 1.0:
                z.mul_(inv_t)
            m = z.amax(-1, keepdim=True)
            e = torch.exp(z - m)
            total = e.sum(-1, keepdim=True)
            lse = (m + total.log()).squeeze(-1)
            logp[s:s + CHUNK_ROWS] = z.gather(-1, targets[s:s + CHUNK_ROWS, None]).squeeze(-1) - lse
            p = e.div_(total)
            ent[s:s + CHUNK_ROWS] = lse - (p * z).sum(-1)
            probs.append(p)
        ctx.save_for_backward(hidden, weight, targets, *probs)
        ctx.inv_t = inv_t
        ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    @once_differentiable  # the closed form is not itself differentiated: a double backward raises
    def backward(ctx: Any, g_logp: torch.Tensor, g_ent: torch.Tensor | None
                 ) -> tuple[torch.Tensor | None, ...]:
        hidden, weight, targets, *probs = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        grad_b = torch.zeros(weight.shape[0], dtype=torch.float32, device=weight.device) if need_b else None
        g = g_logp.float() * ctx.inv_t
        for i, p in enumerate(probs):
            s = i * CHUNK_ROWS
            gs = g[s:s + CHUNK_ROWS, None]
            G = p * -gs  # out of place: a retained graph can run its backward again
            G.scatter_add_(-1, targets[s:s + CHUNK_ROWS, None], gs)
            if grad_h is not None:
                grad_h[s:s + CHUNK_ROWS] = (G.to(weight.dtype) @ weight).to(hidden.dtype)
            if grad_w is not None:
                grad_w.addmm_(G.t(), hidden[s:s + CHUNK_ROWS].float())
            if grad_b is not None:
                grad_b += G.sum(0)
        return (grad_h, None if grad_w is None else grad_w.to(weight.dtype),
                None if grad_b is None else grad_b.to(weight.dtype), None, None)


def head_logprobs(hidden: torch.Tensor, head: torch.nn.Linear, targets: torch.Tensor, *,
                  temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Logprob and entropy of `head`'s tempered distribution at each row's target token.

    Args:
        hidden: (N, E) final hidden states (after the model's last norm), with gradient.
        head: the output projection (`nn.Linear`, E -> V; bias optional).
        targets: (N,) long token ids, in [0, V).
        temperature: logits are divided by it (0 or less is treated as 1).

    Returns:
        `(logp, entropy)`, both (N,) float32: `log_softmax(head(h) / T)[target]` (differentiable
        w.r.t. `hidden`, `head.weight` and `head.bias`) and the entropy of `softmax(head(h) / T)`
        in nats (no gradient). Same values as the plain torch ops to float32 rounding.
    """
    t = temperature if temperature and temperature > 0 else 1.0
    if hidden.shape[0] == 0:
        z = hidden.new_zeros(0, dtype=torch.float32)
        return z + 0 * hidden.sum(), z
    return _HeadLogprob.apply(hidden, head.weight, head.bias, targets, 1.0 / t)
