"""Devices of the rollout side and the GPU memory split between vLLM and a learner on one GPU.

`resolve_device` turns `auto|cpu|cuda` into a torch device: the one rule of the learner
(`agentrl.learner.local` re-exports it), the rollout side and the reward models, here because
the rollout side never imports the learner.

`engine_share` is the memory split when vLLM and the learner share one GPU: vLLM claims a
fraction of the GPU's memory at start-up (`gpu_memory_utilization`, 0.9 by default), and the
learner needs, per parameter, 4 bytes of float32 weights, 4 of gradients and 8 of AdamW moments
(16 bytes; 4 more for a float32 reference model), plus activations. The default share leaves
the learner that and a margin; a split that cannot fit is refused before anything is built, with
the figures. verl (`gpu_memory_utilization` beside FSDP) and OpenRLHF (`vllm_gpu_memory_utilization`)
set the same fraction by hand; here it is computed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

GiB = 1 << 30

LEARNER_BYTES_PER_PARAM = 16
"""float32 weights (4) + gradients (4) + AdamW `exp_avg` and `exp_avg_sq` (4 + 4)."""
REFERENCE_BYTES_PER_PARAM = 4
"""A frozen float32 reference model in the learner's process."""
ACTIVATION_MARGIN = 0.10
"""Fraction of the GPU kept for the learner's activations, the CUDA contexts and allocator slack."""
MIN_KV_CACHE_BYTES = 1 * GiB
"""The least KV cache a share must leave vLLM beside its weights (below it vLLM refuses to start
or serves a handful of sequences)."""


def resolve_device(name: str | torch.device | None, *, key: str = "train.device") -> torch.device:
    """`auto` (CUDA when available, else CPU), `cpu`, `cuda` or `cuda:N` as a torch device.

    Raises:
        ValueError: naming `key`, for CUDA asked for where none is available, or an unknown name.
    """
    name = str(name or "auto").lower()
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


@dataclass(frozen=True)
class MemorySplit:
    """How one GPU's memory is split between vLLM and the learner (bytes unless said).

    Attributes:
        gpu_bytes: the GPU's total memory.
        params: the policy's parameter count.
        learner_bytes: the learner's weights, gradients, AdamW state (and reference).
        margin_bytes: kept for activations and CUDA contexts (`ACTIVATION_MARGIN`).
        share: vLLM's `gpu_memory_utilization` (fraction of `gpu_bytes`).
        engine_weight_bytes: vLLM's copy of the weights in its dtype.
        kv_bytes: what the share leaves vLLM for its KV cache.
        fits: whether learner + margin + share fit the GPU and leave `MIN_KV_CACHE_BYTES`.
    """

    gpu_bytes: int
    params: int
    learner_bytes: int
    margin_bytes: int
    share: float
    engine_weight_bytes: int
    kv_bytes: int
    fits: bool

    def describe(self) -> str:
        """One line with the figures, in GiB."""
        g = lambda b: f"{b / GiB:.1f}"  # noqa: E731
        return (f"GPU {g(self.gpu_bytes)} GiB: learner {g(self.learner_bytes)} GiB "
                f"({self.params / 1e9:.2f}B params x {self.learner_bytes / max(self.params, 1):.0f} B), "
                f"margin {g(self.margin_bytes)} GiB, vLLM share {self.share:.2f} = "
                f"{g(self.share * self.gpu_bytes)} GiB (weights {g(self.engine_weight_bytes)}, "
                f"KV cache {g(self.kv_bytes)})")


def learner_bytes_per_param(*, reference: bool, lora: bool) -> int:
    """The learner's bytes per policy parameter: `LEARNER_BYTES_PER_PARAM` (+
    `REFERENCE_BYTES_PER_PARAM` with a float32 reference in its process); with LoRA only the
    frozen float32 weights (4: the adapters, their gradients and AdamW state are small, and the
    reference is the base model with adapters off)."""
    if lora:
        return 4
    return LEARNER_BYTES_PER_PARAM + REFERENCE_BYTES_PER_PARAM * bool(reference)


def engine_share(gpu_bytes: int, params: int, *, engine_dtype_bytes: int, learner_bytes_per_param: int,
                 share: float | None = None) -> MemorySplit:
    """The split of one GPU between vLLM and the learner.

    The learner takes `params * learner_bytes_per_param` bytes, the margin `ACTIVATION_MARGIN *
    gpu_bytes`; vLLM the rest (`share=None`: the computed default, rounded down to 0.01), or
    the `share` given. E.g. an 80 GiB GPU and a 1.5B policy with a reference: learner
    1.5e9 * 20 B = 27.9 GiB, margin 8 GiB, share floor((80 - 27.9 - 8) / 80, 0.01) = 0.55.

    Args:
        gpu_bytes: the GPU's total memory (`torch.cuda.get_device_properties(i).total_memory`).
        params: the policy's parameter count.
        engine_dtype_bytes: bytes per parameter of vLLM's weights (2 for bf16, 4 for float32).
        learner_bytes_per_param: the learner's bytes per parameter (`learner_bytes_per_param`:
            20 for full fine-tuning with a float32 reference in the learner's process).
        share: vLLM's fraction, when set by hand (`rollout.gpu_memory_utilization`).

    Returns:
        the `MemorySplit` (`fits` False when the learner, the margin and vLLM's share exceed
        the GPU, or the share leaves vLLM less than `MIN_KV_CACHE_BYTES` beside its weights).

    Raises:
        ValueError: non-positive `gpu_bytes` or `params`, or `share` outside (0, 1].
    """
    if gpu_bytes <= 0 or params <= 0:
        raise ValueError(f"gpu_bytes ({gpu_bytes}) and params ({params}) must be positive")
    if share is not None and not 0 < share <= 1:
        raise ValueError(f"share {share} must be in (0, 1]")
    learner = params * learner_bytes_per_param
    margin = int(ACTIVATION_MARGIN * gpu_bytes)
    if share is None:
        share = max(0.0, int(100 * (gpu_bytes - learner - margin) / gpu_bytes) / 100)
    weights = params * engine_dtype_bytes
    kv = int(share * gpu_bytes) - weights
    fits = learner + margin + share * gpu_bytes <= gpu_bytes and kv >= MIN_KV_CACHE_BYTES
    return MemorySplit(gpu_bytes, params, learner, margin, share, weights, kv, fits)


def check_engine_share(split: MemorySplit, *, key: str = "rollout.gpu_memory_utilization") -> None:
    """Refuse a split that does not fit (`MemorySplit.fits`), with its figures and what to change.

    Raises:
        ValueError: naming `key`, the figures and the fixes.
    """
    if split.fits:
        return
    raise ValueError(
        f"vLLM and the learner do not fit on one GPU: {split.describe()}. The learner needs "
        f"{LEARNER_BYTES_PER_PARAM} bytes per parameter (float32 weights, gradients, AdamW) and "
        f"{REFERENCE_BYTES_PER_PARAM} more for a reference, vLLM its weights plus at least "
        f"{MIN_KV_CACHE_BYTES / GiB:.0f} GiB of KV cache. Fix: a smaller {key} (when set by hand), "
        "a smaller model, placement.reference=worker, LoRA (model.lora_r), or the learner on GPUs "
        "of its own (train.learner_workers with train.learner_gpus=1)")
