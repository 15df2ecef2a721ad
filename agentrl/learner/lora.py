"""LoRA through PEFT: wrap the policy, give the engine merged weights, load and merge adapter
checkpoints.

With `model.lora_r > 0` the learner trains only the adapter matrices A (r, in) and B (out, r)
of each target linear layer; the layer computes `W x + (alpha / r) * B A x` (Hu et al. 2021,
"LoRA: Low-Rank Adaptation of Large Language Models", eq. 3). The frozen base weights are the
KL reference (`with model.disable_adapter():`), so no second copy of the model is kept.
A checkpoint then holds the adapters (`adapter_config.json`, `adapter_model.safetensors`),
whose config names the base model directory; `merge_checkpoint` writes `W + (alpha / r) B A`
as a plain Hugging Face model.

peft is an optional dependency (`pip install 'agentrl[lora]'`); it is imported only here and
only when LoRA is used.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import torch

from agentrl.models.tiny import load_model


def is_peft(model: Any) -> bool:
    """True for a PEFT-wrapped model (it has adapters that can be disabled)."""
    return hasattr(model, "peft_config") and hasattr(model, "disable_adapter")


def wrap_lora(model: Any, *, r: int, alpha: int, target_modules: str | list[str],
              base_path: str | Path, seed: int = 0) -> Any:
    """Wrap `model` with fresh LoRA adapters; only adapter parameters require grad.

    Args:
        model: a transformers causal LM (its weights become the frozen base).
        r: adapter rank (>= 1).
        alpha: scaling numerator (the update is `alpha / r * B @ A`).
        target_modules: module names, or `"all-linear"` (every linear layer but the head).
        base_path: directory holding exactly these base weights; recorded in the adapter config
            (as an absolute path) so that a checkpoint can be reloaded and merged.
        seed: seed of the adapters' initialisation (A ~ Kaiming-uniform, B = 0, so the wrapped
            model starts equal to the base model); the global torch RNG is left untouched.

    Returns:
        a `peft.PeftModel`.

    Raises:
        ImportError: peft is not installed.
        ValueError: `r < 1`, or (from peft) no module matches `target_modules`.
    """
    if r < 1:
        raise ValueError(f"LoRA rank must be >= 1, got {r}")
    from peft import LoraConfig, get_peft_model

    targets = target_modules if isinstance(target_modules, str) else list(target_modules)
    config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0, target_modules=targets,
                        bias="none", task_type="CAUSAL_LM",
                        base_model_name_or_path=str(Path(base_path).resolve()))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        wrapped = get_peft_model(model, config)
    wrapped.peft_config["default"].base_model_name_or_path = str(Path(base_path).resolve())
    return wrapped


@torch.no_grad()
def merged_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """The policy's weights under the names of the plain (unwrapped) model.

    For a PEFT model every LoRA layer's weight is `W + (alpha / r) * B @ A` (computed in a new
    tensor; the model is not modified, so merging never perturbs the base weights by rounding);
    adapter tensors are left out. A plain model's `state_dict()` is returned as is.
    """
    if not is_peft(model):
        return model.state_dict()
    from peft.tuners.lora import LoraLayer

    inner = model.get_base_model()
    layers: dict[str, Any] = {n: m for n, m in inner.named_modules() if isinstance(m, LoraLayer)}
    out: dict[str, torch.Tensor] = {}
    for k, v in inner.state_dict().items():
        if ".lora_" in k:
            continue
        out[k.replace(".base_layer.", ".")] = v
    for name, layer in layers.items():
        w = layer.get_base_layer().weight
        for a in layer.active_adapters:
            if a in layer.lora_A:
                w = w + layer.get_delta_weight(a).to(w.dtype)
        out[f"{name}.weight"] = w.detach()
    return out


def merge_lora_state(state: dict[str, torch.Tensor], inner: Any) -> dict[str, torch.Tensor]:
    """`merged_state_dict` from a full state dict of a PEFT model's base (`inner`, the
    `get_base_model()` module, whose LoRA layers give the scalings): every LoRA layer's weight
    becomes `W + scaling * B @ A` (transposed for `fan_in_fan_out` layers), the adapter tensors
    are dropped and `.base_layer.` leaves the names. For gathered weights of a sharded model
    (`agentrl.learner.rank`), where the module's own tensors are shards."""
    from peft.tuners.lora import LoraLayer

    out = {k.replace(".base_layer.", "."): v for k, v in state.items() if ".lora_" not in k}
    for name, layer in inner.named_modules():
        if not isinstance(layer, LoraLayer):
            continue
        w = state[f"{name}.base_layer.weight"]
        for a in layer.active_adapters:
            if a not in layer.lora_A:
                continue
            delta = state[f"{name}.lora_B.{a}.weight"] @ state[f"{name}.lora_A.{a}.weight"]
            if getattr(layer, "fan_in_fan_out", False):
                delta = delta.T
            w = w + (delta * layer.scaling[a]).to(w.dtype)
        out[f"{name}.weight"] = w
    return out


def plain_copy(model: Any) -> Any:
    """A plain transformers model with the policy's (merged) weights, for the engine."""
    if not is_peft(model):
        return copy.deepcopy(model)
    merged = copy.deepcopy(model).merge_and_unload()
    merged.load_state_dict(merged_state_dict(model), strict=False)
    return merged


def load_checkpoint(path: str | Path) -> tuple[Any, Any]:
    """Load a checkpoint directory: a full model, or LoRA adapters on their base model.

    Returns:
        `(model, tokenizer)`; for adapters a trainable `PeftModel` whose base weights come from
        the directory named in `adapter_config.json` (`base_model_name_or_path`), or from the
        directory of that name in the checkpoint's run directory (a run moved elsewhere).

    Raises:
        FileNotFoundError: the directory, or the adapters' base model directory, is missing.
    """
    path = Path(path)
    cfg_file = path / "adapter_config.json"
    if not cfg_file.exists():
        return load_model(path)
    from peft import PeftModel

    named = json.loads(cfg_file.read_text()).get("base_model_name_or_path") or ""
    # as recorded, or (a run directory that was moved) next to OUT/checkpoints/
    cands = [Path(named), path.parent.parent / Path(named).name] if named else []
    base_path = next((c for c in cands if c.is_dir()), None)
    if base_path is None:
        raise FileNotFoundError(f"{path}: the adapters' base model {named!r} is not a directory")
    base, tok = load_model(base_path)
    return PeftModel.from_pretrained(base, str(path), is_trainable=True), tok


def merge_checkpoint(ckpt: str | Path, out: str | Path) -> Path:
    """Merge a LoRA checkpoint's adapters into its base model and save a plain Hugging Face
    model directory (weights, config, tokenizer) at `out`.

    Raises:
        ValueError: `ckpt` holds full weights, not adapters (nothing to merge).
        FileNotFoundError: as `load_checkpoint`.
    """
    if not (Path(ckpt) / "adapter_config.json").exists():
        raise ValueError(f"{ckpt} is not a LoRA checkpoint (no adapter_config.json): it already "
                         "holds full weights")
    model, tok = load_checkpoint(ckpt)
    merged = model.merge_and_unload()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    merged.save_pretrained(out)
    tok.save_pretrained(out)
    return out
