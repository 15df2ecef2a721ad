"""The learner's optimizer: AdamW (the fused kernel where torch has one), restoring its state
whichever kernel wrote it, and the errors of non-finite training (an optimizer step whose
gradient norm is NaN or infinite is skipped by `Learner.update`; too many in a row stop the run).
"""

from __future__ import annotations

from typing import Any

import torch

try:
    from torch.optim.optimizer import _get_fused_kernels_supported_devices
except ImportError:  # pragma: no cover - older or newer torch without the helper
    _get_fused_kernels_supported_devices = None


class NonFiniteGradientError(FloatingPointError):
    """`max_nonfinite_steps` optimizer steps in a row had a NaN or infinite gradient norm."""


class NonFiniteLossError(NonFiniteGradientError):
    """The supervised warm start's loss became NaN or infinite (`agentrl.sft.sft_train`): the
    run stops before saving a diverged model."""


def make_adamw(params: list[torch.nn.Parameter], *, lr: float, weight_decay: float
               ) -> tuple[torch.optim.AdamW, bool]:
    """`torch.optim.AdamW` with the fused kernel (`fused=True`: one kernel for all tensors, TRL's
    default `adamw_torch_fused`; on CPU since torch 2.4) when torch has one for every
    parameter's device and dtype (real floating point), else the default implementation. Same
    update to float32 rounding. Returns (optimizer, fused).

    torch checks fused support only at the first step, so it is checked here."""
    if _get_fused_kernels_supported_devices is not None:
        devices = set(_get_fused_kernels_supported_devices())
    else:  # pragma: no cover
        devices = {"cpu", "cuda"}
    fused = all(p.device.type in devices and torch.is_floating_point(p) for p in params)
    try:
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay,
                                 fused=True if fused else None), fused
    except (RuntimeError, TypeError):  # a torch without fused AdamW
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay), False


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict[str, Any], *, fused: bool) -> None:
    """Load `state` (an AdamW `state_dict`, written by the fused kernel or not) into `optimizer`,
    keeping this optimizer's kernel: `fused` (then each parameter's `step` on its device, as
    the fused kernel keeps it) or the default one."""
    optimizer.load_state_dict(state)
    for g in optimizer.param_groups:
        g["fused"], g["foreach"] = (True, None) if fused else (None, g.get("foreach"))
        for p in g["params"] if fused else []:
            step = optimizer.state.get(p, {}).get("step")
            if torch.is_tensor(step):
                optimizer.state[p]["step"] = step.to(p.device, torch.float32)
