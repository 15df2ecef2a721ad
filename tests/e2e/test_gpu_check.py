"""The learner on an accelerator, checked against the CPU (issue 39, "The GPU check"): one GRPO
update on the device equals the CPU update in float32; bf16 stays within bf16 rounding of fp32;
gradient checkpointing gives the same gradient; one `torch.distributed` rank (world size 1, no
Ray; NCCL on CUDA) gives the in-process update; every tensor of the policy, the reference, the
value head, the batch and the optimizer state is on the device.

Marked `gpu`: on a CUDA machine `pytest -m gpu` runs them on `cuda`; without CUDA they skip.
`AGENTRL_GPU_TEST_DEVICE=cpu` runs the very same tests on the CPU (gloo for the rank), as
`benchmarks/gpu_check.sh --dry-run` does in CI, so they cannot rot between GPU loans. Each prints
one `[gpu-check]` line with its figure (`pytest -s`). Tolerances, stated: float32 device vs CPU
1e-4 relative (max |diff| / max |CPU|: another summation order); bf16 vs fp32 logprobs 5e-2 nats and
gradient 5e-2 relative (norm); checkpointing 1e-5 relative; rank vs in-process weights 1e-4 relative.
"""

from __future__ import annotations

import copy
import os

import pytest
import torch

from agentrl.algos import get_algorithm
from agentrl.config import algo_config
from agentrl.learner.local import Learner
from agentrl.models.tiny import load_model

DEVICE = os.environ.get("AGENTRL_GPU_TEST_DEVICE", "cuda")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(), reason="needs a CUDA device"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]


def _batch(seed: int = 1) -> dict:
    """6 rows of unequal length in 3 groups of 2, prompt = the first 4 tokens, GRPO advantages."""
    g = torch.Generator().manual_seed(seed)
    B, T = 6, 14
    lengths = torch.tensor([14, 9, 12, 6, 11, 8])
    pos = torch.arange(T)[None]
    attn = (pos < lengths[:, None]).long()
    ids = torch.randint(3, 200, (B, T), generator=g) * attn
    batch = {"input_ids": ids, "attention_mask": attn, "loss_mask": ((pos >= 4) & (pos < lengths[:, None])).float(),
             "lengths": lengths, "sampler_logprobs": torch.zeros(B, T), "scores": torch.tensor([1.0, 0, 1, 0, 1, 1]),
             "token_rewards": torch.zeros(B, T), "group_ids": torch.tensor([0, 0, 1, 1, 2, 2]),
             "truncated": torch.zeros(B, dtype=torch.bool)}
    batch["advantages"], _ = get_algorithm("grpo").advantages(batch, algo_config(name="grpo"))
    return batch


def _update(model_dir: str, device: str, **kw) -> tuple[dict, torch.Tensor, Learner]:
    """One GRPO update of `_batch()`; (metrics, flat gradient on the CPU, learner)."""
    torch.manual_seed(0)
    model, _ = load_model(model_dir)
    learner = Learner(model, lr=1e-3, micro_batch_size=4, grad_clip=1e9, device=device, **kw)
    cfg = algo_config(name="grpo")
    m = learner.update(_batch(), get_algorithm("grpo"), cfg)
    return m, torch.cat([p.grad.flatten().float().cpu() for p in model.parameters()]), learner


def _rel_max(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def test_update_on_the_device_equals_the_cpu_update_in_fp32(tiny_model_dir):
    m_dev, g_dev, _ = _update(tiny_model_dir, DEVICE)
    m_cpu, g_cpu, _ = _update(tiny_model_dir, "cpu")
    rel = _rel_max(g_dev, g_cpu)
    print(f"[gpu-check] fp32 update {DEVICE} vs cpu: gradient max rel diff {rel:.2e} (tolerance 1e-4), "
          f"loss {m_dev['loss']:.6f} vs {m_cpu['loss']:.6f}")
    assert rel <= 1e-4


def test_bf16_is_within_bf16_rounding_of_fp32(tiny_model_dir):
    """The logprobs and the gradient of a bf16 update against fp32 on the device. (Not the first
    step's loss: with the on-policy ratio of 1 it is the advantages' mean whatever the precision.)"""
    _, g16, l16 = _update(tiny_model_dir, DEVICE, precision="bf16")
    _, g32, l32 = _update(tiny_model_dir, DEVICE, precision="fp32")
    batch = _batch()
    mask = batch["loss_mask"].bool()
    diff = float((l16.logprobs(batch) - l32.logprobs(batch))[mask].abs().max())
    rel = float((g16 - g32).norm() / g32.norm())
    print(f"[gpu-check] bf16 vs fp32 on {DEVICE}: logprobs max |diff| {diff:.2e} nats (tolerance 5e-2), "
          f"gradient rel norm diff {rel:.2e} (tolerance 5e-2)")
    assert 0 < diff <= 5e-2 and rel <= 5e-2  # > 0: bf16 did run
    assert {p.dtype for p in l16.model.parameters()} == {torch.float32}  # master weights


def test_gradient_checkpointing_gives_the_same_gradient(tiny_model_dir):
    _, g0, _ = _update(tiny_model_dir, DEVICE, prefix_share=False)
    _, g1, learner = _update(tiny_model_dir, DEVICE, prefix_share=False, gradient_checkpointing=True)
    rel = _rel_max(g1, g0)
    print(f"[gpu-check] gradient checkpointing on {DEVICE}: gradient max rel diff {rel:.2e} (tolerance 1e-5)")
    assert rel <= 1e-5


def test_one_rank_without_ray_gives_the_in_process_update(tiny_model_dir):
    """A `LearnerRank` in this process, world size 1 (NCCL on CUDA, gloo on CPU), FSDP2-sharded:
    3 updates give the in-process learner's weights."""
    import torch.distributed as dist

    from agentrl.learner.rank import LearnerRank, free_address

    algo, cfg = get_algorithm("grpo"), algo_config(name="grpo")
    torch.manual_seed(0)
    model, _ = load_model(tiny_model_dir)
    kw = dict(lr=1e-4, grad_clip=1.0, micro_batch_size=2, prefix_share=False, use_ref=False, device=DEVICE)
    local = Learner(copy.deepcopy(model), **kw)
    rank = LearnerRank(0, 1)
    assert not dist.is_initialized()
    try:
        rank.setup(free_address(), copy.deepcopy(model), kw, seed=0)
        backend = dist.get_backend()
        for s in range(3):
            b = _batch(seed=1 + s)
            local.update(b, algo, cfg, seed=s)
            rank.update(b, algo, cfg, epochs=1, minibatches=1, seed=s)
        want, got = local.state_dict_for_engines(), rank.state_dict_for_engines()
    finally:
        rank.shutdown()
    rel = max(_rel_max(got[k].float().cpu(), want[k].float().cpu()) for k in want if not k.endswith("k_proj.bias"))
    print(f"[gpu-check] one {backend} rank (world size 1, no Ray) vs in-process: weights max rel diff "
          f"{rel:.2e} after 3 updates (tolerance 1e-4)")
    assert rel <= 1e-4


def test_every_tensor_is_on_the_device(tiny_model_dir):
    torch.manual_seed(0)
    model, _ = load_model(tiny_model_dir)
    learner = Learner(model, lr=1e-3, micro_batch_size=4, device=DEVICE, use_ref=True, value_head=True)
    seen: set[str] = set()
    model.register_forward_pre_hook(
        lambda mod, args, kwargs: seen.update(str(t.device.type) for t in (*args, *kwargs.values())
                                              if isinstance(t, torch.Tensor)), with_kwargs=True)
    cfg, ppo = algo_config(name="ppo", kl_coef=0.05), get_algorithm("ppo")
    batch, _ = ppo.prepare(_batch(), learner, cfg)  # policy, value head and reference forwards
    batch["advantages"], _ = ppo.advantages(batch, cfg)
    learner.update(batch, ppo, cfg)
    where = {
        "policy": {p.device.type for p in learner.model.parameters()},
        "reference": {p.device.type for p in learner.ref_model.parameters()},
        "value head": {p.device.type for p in learner.value_head.parameters()},
        "batch": seen,
        "optimizer state": {t.device.type for st in learner.optimizer.state.values() for t in st.values()
                            if isinstance(t, torch.Tensor) and t.dim() > 0},
    }
    print(f"[gpu-check] tensors on {DEVICE}: " + ", ".join(f"{k} {sorted(v)}" for k, v in where.items()))
    dev = torch.device(DEVICE).type
    assert all(v == {dev} for v in where.values()), where
