"""int8 copies of frozen models: torch's dynamic quantization of the Linear layers, on CPU."""

from __future__ import annotations

import torch

from agentrl.config import int8_unavailable

REFERENCE_DTYPES = ("float32", "bfloat16", "int8")
"""`placement.reference_dtype` / `teacher_dtype` / `reward_model_dtype` values: `int8` is torch's dynamic
int8 quantization of the Linear layers, on CPU only, where `agentrl.config.int8_unavailable()` is None."""


def quantize_int8(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of `model` (float32, on CPU) whose `nn.Linear` layers are dynamically quantized to
    int8: weights int8, symmetric, one scale per output channel (`per_channel_dynamic_qconfig`);
    activations quantized to 8 bits per call from their observed range, the matmul in int8 with
    int32 accumulation, the output float32 (torch `quantize_dynamic`, the fbgemm / x86 kernels).
    Embeddings, norms, rotary and the softmax stay float32. A tied output head (`lm_head`
    sharing the embedding) becomes an int8 copy of the embedding; the embedding stays float32.
    Deprecation warnings of `torch.ao.quantization` (torch >= 2.10) are silenced here only.

    Raises:
        RuntimeError: the platform has no int8 path (`int8_unavailable`'s reason)."""
    why = int8_unavailable()
    if why is not None:
        raise RuntimeError(why)
    import warnings

    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    with warnings.catch_warnings():
        # torch >= 2.10: "torch.ao.quantization is deprecated" (DeprecationWarning) and
        # "torch.quantize_per_channel ... are deprecated" (UserWarning)
        warnings.filterwarnings("ignore", message=r"(?s).*torch\.(ao\.quantization|quantize_per).*deprecated")
        q = quantize_dynamic(model.float().cpu(), {torch.nn.Linear: per_channel_dynamic_qconfig},
                             dtype=torch.qint8, inplace=False)
    return q
