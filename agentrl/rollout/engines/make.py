"""Every inference engine of agentrl is built here, by `make_engine`: from a live model (the
trainer's in-process engine, the warm start's checks, the distillation teacher's sampler) or
from a model directory (a Ray rollout worker, `agentrl eval`), text or vision-language, Hugging
Face or vLLM. `load_processor` gives a directory's tokenizer (with its image processor).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from agentrl.config import Config
from agentrl.infra.devices import (
    MemorySplit,
    check_engine_share,
    engine_share,
    learner_bytes_per_param,
    resolve_device,
)
from agentrl.models.vision_logprobs import vision_token_ids
from agentrl.models.vlm import is_vlm_dir, load_vlm
from agentrl.rollout.engines.base import Engine
from agentrl.rollout.engines.hf import HFEngine, check_materialised
from agentrl.rollout.engines.hf_vision import VisionHFEngine


def load_tokenizer(path: str | Path) -> Any:
    """The tokenizer of a local model directory, set up as `agentrl.models.tiny.load_model` does
    (pad token = eos when missing, left padding), without loading the weights."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token if tok.eos_token is not None else tok.unk_token
    tok.padding_side = "left"
    return tok


def load_processor(path: str | Path) -> Any:
    """`load_tokenizer(path)`, carrying the image processor as `tokenizer.image_processor` when
    `path` is a vision-language directory (`agentrl.models.vlm.is_vlm_dir`)."""
    tok = load_tokenizer(path)
    if is_vlm_dir(path):
        from transformers import AutoImageProcessor

        tok.image_processor = AutoImageProcessor.from_pretrained(str(path), local_files_only=True)
    return tok


def rollout_device(cfg: Config, *, worker_gpus: float | None = None) -> torch.device:
    """The hf engine's device (`rollout.device`).

    `auto`: in the driver process (`worker_gpus=None`) CPU with `train.device=cpu`, else CUDA
    when available (the learner's choice, so a GPU run samples on its GPU); in a Ray rollout
    worker CUDA when it reserves GPUs (`worker_gpus > 0`) and sees one, else CPU.

    Raises:
        ValueError: naming `rollout.device`, for `cuda` without a CUDA device.
    """
    name = cfg.rollout.device
    if name == "auto":
        cuda = torch.cuda.is_available()
        if worker_gpus is not None:
            name = "cuda" if worker_gpus > 0 and cuda else "cpu"
        else:
            name = "cpu" if cfg.train.device == "cpu" or not cuda else "cuda"
    return resolve_device(name, key="rollout.device")


def vllm_dtype(cfg: Config, cuda: bool) -> str:
    """vLLM's weight dtype: `model.dtype` when set; when not, bfloat16 on CUDA (FlashAttention
    and CUDA graphs need 16-bit; half the weight memory) and float32 without CUDA (the CPU build,
    whose logprobs then equal the learner's float32 ones)."""
    if "dtype" in cfg.model.model_fields_set:
        return cfg.model.dtype
    return "bfloat16" if cuda else cfg.model.dtype


def vllm_engine_kwargs(cfg: Config, cuda: bool) -> dict[str, Any]:
    """`VLLMEngine` keywords of a run: dtype (`vllm_dtype`), seed, push bucket size, the GPU
    memory share (`rollout.gpu_memory_utilization`, CUDA only), then `rollout.vllm_kwargs`
    (which may set `enforce_eager`; its default is per platform, `VLLMEngine`)."""
    kw: dict[str, Any] = {"dtype": vllm_dtype(cfg, cuda), "seed": cfg.seed,
                          "bucket_bytes": int(cfg.rollout.weight_bucket_mb) << 20}
    if cuda and cfg.rollout.gpu_memory_utilization is not None:
        kw["gpu_memory_utilization"] = cfg.rollout.gpu_memory_utilization
    return {**kw, **dict(cfg.rollout.vllm_kwargs)}


def shares_learner_gpu(cfg: Config, cuda: bool) -> bool:
    """Whether vLLM runs on the GPU of a learner in this process: `rollout.engine=vllm` on a
    CUDA machine, the learner in the driver on CUDA (`train.learner_workers=0`,
    `train.device` not cpu), and vLLM in this process (`rollout.num_workers=0`) or in Ray
    workers that reserve GPUs (Ray does not count the driver's use of a GPU, so a worker may get
    the learner's; on one GPU it does)."""
    return (cfg.rollout.engine == "vllm" and cuda and cfg.train.learner_workers == 0
            and cfg.train.device != "cpu" and (cfg.rollout.num_workers == 0 or cfg.rollout.worker_gpus > 0))


def engine_memory_config(cfg: Config, params: int, *, reference: bool, say: Callable[[str], None],
                         cuda: bool | None = None, gpu_bytes: int | None = None) -> Config:
    """The config the vLLM engine is built with: `cfg` itself unless vLLM shares the learner's
    GPU (`shares_learner_gpu`); then the split is said (`[memory] ...`), checked, and the
    computed share (`agentrl.infra.devices.engine_share`) put in `rollout.gpu_memory_utilization`
    when it is not set.

    Args:
        params: the policy's parameter count.
        reference: a float32 reference model lives in the learner's process.
        cuda, gpu_bytes: the machine's (default: `torch.cuda.is_available()`, the total memory of
            CUDA device 0); given by tests.

    Raises:
        ValueError: the split does not fit (`check_engine_share`: the figures and the fixes).
    """
    cuda = torch.cuda.is_available() if cuda is None else cuda
    if not shares_learner_gpu(cfg, cuda):
        return cfg
    if gpu_bytes is None:
        gpu_bytes = int(torch.cuda.get_device_properties(0).total_memory)
    dtype_bytes = getattr(torch, vllm_dtype(cfg, cuda)).itemsize
    split: MemorySplit = engine_share(
        gpu_bytes, params, engine_dtype_bytes=dtype_bytes, share=cfg.rollout.gpu_memory_utilization,
        learner_bytes_per_param=learner_bytes_per_param(reference=reference, lora=cfg.model.lora_r > 0))
    say(f"[memory] vLLM shares the learner's GPU: {split.describe()}")
    check_engine_share(split)
    if cfg.rollout.gpu_memory_utilization is not None:
        return cfg
    rollout = cfg.rollout.model_copy(update={"gpu_memory_utilization": split.share})
    return cfg.model_copy(update={"rollout": rollout})


def make_engine(cfg: Config, model: Any, tok: Any = None, *, cast: bool = True,
                device: torch.device | str | None = None) -> tuple[Engine, Any]:
    """The engine that samples from `model`, a live model or a model directory.

    A live model (`tok` its tokenizer; used as given, not copied): a `VisionHFEngine` for a
    vision-language model (its config has a `vision_config`), else an `HFEngine` with
    `rollout.torch_threads`; with `cast` (the default) the text model is cast to `model.dtype`
    and compiled per `rollout.compile`, without it used as given and not compiled (the warm
    start's pass-rate checks).

    A directory (`str` or `Path`), by `rollout.engine`: `hf` loads it in `model.dtype` into an
    `HFEngine` (`rollout.compile`), or a `VisionHFEngine` for a vision-language directory;
    `vllm` gives a `VLLMEngine` (`vllm_engine_kwargs`; it takes images on a vision-language
    directory).

    The hf engines' model and sampling live on `device` (default `rollout_device(cfg)`; a Ray
    worker passes its own, `rollout_device(cfg, worker_gpus=...)`).

    Returns:
        `(engine, tokenizer)`; the tokenizer of a vision-language policy carries its image
        processor as `tokenizer.image_processor` (`agentrl.rollout.chat.renderer_for`).

    Raises:
        FileNotFoundError: a directory that does not exist.
        ImportError: `vllm` asked for but not installed (the message says how to install it).
        ValueError: `rollout.device=cuda` without a CUDA device; a live model with parameters
            on the meta device (never loaded).
    """
    if isinstance(model, (str, Path)) and not Path(model).is_dir():
        raise FileNotFoundError(f"model directory not found: {model}")
    if isinstance(model, (str, Path)) and cfg.rollout.engine == "vllm":
        from agentrl.rollout.engines.vllm import VLLMEngine

        engine = VLLMEngine(str(model), **vllm_engine_kwargs(cfg, torch.cuda.is_available()))
        return engine, load_processor(model)  # vLLM takes the images (engine.accepts_images)
    dev = torch.device(device) if device is not None else rollout_device(cfg)
    if not isinstance(model, (str, Path)):
        return _live_engine(cfg, model, tok, cast, dev), tok
    dtype = getattr(torch, cfg.model.dtype)
    if is_vlm_dir(model):
        vlm, tok, image_processor = load_vlm(model, dtype=dtype)
        tok.image_processor = image_processor
        return _live_engine(cfg, vlm, tok, False, dev), tok
    hf = HFEngine(str(model), torch_threads=cfg.rollout.torch_threads, dtype=dtype,
                  compile=bool(cfg.rollout.compile), device=dev)
    return hf, hf.tokenizer


def _live_engine(cfg: Config, model: Any, tok: Any, cast: bool, device: torch.device) -> Engine:
    """`make_engine`'s engine of a live model (see there), moved to `device`."""
    if getattr(model.config, "vision_config", None) is not None:  # a vision-language policy
        return VisionHFEngine(check_materialised(model).to(device), image_token_id=model.config.image_token_id,
                              banned_ids=vision_token_ids(model.config),
                              torch_threads=cfg.rollout.torch_threads)
    if not cast:
        return HFEngine(model, tok, torch_threads=cfg.rollout.torch_threads, device=device)
    if cfg.model.dtype != "float32":  # the pushed float32 weights are cast by `update_weights`
        model = model.to(getattr(torch, cfg.model.dtype))
    return HFEngine(model, tok, torch_threads=cfg.rollout.torch_threads, compile=cfg.rollout.compile,
                    device=device)

