"""A learner rank builds its shard of a Hugging Face model directory without ever holding the
whole model (torchtitan's meta-device initialisation, verl's sharded load):

    1. the model class from `config.json`, its parameters on the meta device (no memory, no
       initialisation: `params_on_meta`); buffers (e.g. rotary `inv_freq`) real, on the CPU
    2. `agentrl.learner.dist.shard` (FSDP2, per decoder layer then root): meta parameters
       stay meta, buffers move to the rank's device
    3. the local shards allocated on the device (`to_empty`; the buffers put back), and each
       filled from the safetensors file(s) one tensor at a time: the full tensor is read,
       this rank's dim-0 chunk copied in (FSDP2's `Shard(0)`: `torch.chunk` over the ranks)

Peak host memory of a rank: its shards plus the largest single tensor. A directory this cannot
read (no safetensors weights, a parameter the files do not name) gives None: the caller loads
the whole model instead.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from agentrl.learner.dist import shard


@contextlib.contextmanager
def params_on_meta() -> Iterator[None]:
    """Every `nn.Parameter` registered inside goes to the meta device (as accelerate's
    `init_empty_weights(include_buffers=False)`): a module's `torch.empty` weight is never
    touched, its initialisation runs on meta (a no-op); buffers stay real."""
    register = torch.nn.Module.register_parameter

    def on_meta(self: torch.nn.Module, name: str, param: torch.nn.Parameter | None) -> None:
        register(self, name, param)
        p = self._parameters.get(name)
        if p is not None and p.device.type != "meta":  # an already-meta one (tied) keeps its identity
            self._parameters[name] = torch.nn.Parameter(p.to("meta"), requires_grad=p.requires_grad)

    torch.nn.Module.register_parameter = on_meta  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register  # type: ignore[method-assign]


def weight_files(path: str | Path) -> dict[str, Path] | None:
    """Tensor name -> safetensors file of a model directory (`model.safetensors`, or the files
    of `model.safetensors.index.json`); None when it has neither."""
    path = Path(path)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        return {k: path / f for k, f in json.loads(index.read_text())["weight_map"].items()}
    single = path / "model.safetensors"
    if not single.is_file():
        return None
    from safetensors import safe_open

    with safe_open(str(single), framework="pt") as f:
        return {k: single for k in f.keys()}


def load_sharded_model(path: str | Path, device: torch.device, precision: str = "fp32") -> Any:
    """The float32 causal LM of directory `path`, FSDP2-sharded over the default process group
    onto `device` (module doc), or None when the directory's weights cannot be read this way.
    A collective (every rank calls it)."""
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM

    files = weight_files(path)
    if files is None:
        return None
    config = AutoConfig.from_pretrained(str(path), local_files_only=True)
    with params_on_meta():
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if not {n for n, _ in model.named_parameters()} <= set(files):
        return None
    model.eval()
    shard(model, device=device, precision=precision)
    buffers = [(mod, n, b) for mod in model.modules() for n, b in mod._buffers.items() if b is not None]
    model.to_empty(device=device)
    for mod, n, b in buffers:  # to_empty left them uninitialised
        mod._buffers[n] = b
    rank, world = dist.get_rank(), dist.get_world_size()
    for name, param in model.named_parameters():  # the sharded parameters (DTensors)
        with safe_open(str(files[name]), framework="pt") as f:  # reopened: no mapping stays resident
            full = f.get_tensor(name)
        local = param.to_local() if hasattr(param, "to_local") else param
        chunks = torch.chunk(full, world, dim=0)
        part = chunks[rank] if rank < len(chunks) else full[:0]
        with torch.no_grad():
            local.copy_(part.to(local.dtype))
        del full, chunks, part
    return model
