"""Every inference engine of agentrl is built here, by `make_engine`: from a live model (the
trainer's in-process engine, the warm start's checks, the distillation teacher's sampler) or
from a model directory (a Ray rollout worker, `agentrl eval`), text or vision-language, Hugging
Face or vLLM. `load_processor` gives a directory's tokenizer (with its image processor).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from agentrl.config import Config
from agentrl.models.vision_logprobs import vision_token_ids
from agentrl.models.vlm import is_vlm_dir, load_vlm
from agentrl.rollout.engines.base import Engine
from agentrl.rollout.engines.hf import HFEngine
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


def make_engine(cfg: Config, model: Any, tok: Any = None, *, cast: bool = True) -> tuple[Engine, Any]:
    """The engine that samples from `model`, a live model or a model directory.

    A live model (`tok` its tokenizer; used as given, not copied): a `VisionHFEngine` for a
    vision-language model (its config has a `vision_config`), else an `HFEngine` with
    `rollout.torch_threads`; with `cast` (the default) the text model is cast to `model.dtype`
    and compiled per `rollout.compile`, without it used as given and not compiled (the warm
    start's pass-rate checks).

    A directory (`str` or `Path`), by `rollout.engine`: `hf` loads it in `model.dtype` into an
    `HFEngine` (`rollout.compile`), or a `VisionHFEngine` for a vision-language directory;
    `vllm` gives a `VLLMEngine` (`model.dtype`, seed `cfg.seed`, `rollout.vllm_kwargs`; it takes
    images on a vision-language directory).

    Returns:
        `(engine, tokenizer)`; the tokenizer of a vision-language policy carries its image
        processor as `tokenizer.image_processor` (`agentrl.rollout.chat.renderer_for`).

    Raises:
        FileNotFoundError: a directory that does not exist.
        ImportError: `vllm` asked for but not installed (the message says how to install it).
    """
    if not isinstance(model, (str, Path)):
        return _live_engine(cfg, model, tok, cast), tok
    if not Path(model).is_dir():
        raise FileNotFoundError(f"model directory not found: {model}")
    dtype = getattr(torch, cfg.model.dtype)
    if cfg.rollout.engine == "vllm":
        from agentrl.rollout.engines.vllm import VLLMEngine

        engine = VLLMEngine(str(model), dtype=cfg.model.dtype, seed=cfg.seed, **dict(cfg.rollout.vllm_kwargs))
        return engine, load_processor(model)  # vLLM takes the images (engine.accepts_images)
    if is_vlm_dir(model):
        vlm, tok, image_processor = load_vlm(model, dtype=dtype)
        tok.image_processor = image_processor
        return _live_engine(cfg, vlm, tok, cast=False), tok
    hf = HFEngine(str(model), torch_threads=cfg.rollout.torch_threads, dtype=dtype,
                  compile=bool(cfg.rollout.compile))
    return hf, hf.tokenizer


def _live_engine(cfg: Config, model: Any, tok: Any, cast: bool) -> Engine:
    """`make_engine`'s engine of a live model (see there)."""
    if getattr(model.config, "vision_config", None) is not None:  # a vision-language policy
        return VisionHFEngine(model, image_token_id=model.config.image_token_id,
                              banned_ids=vision_token_ids(model.config),
                              torch_threads=cfg.rollout.torch_threads)
    if not cast:
        return HFEngine(model, tok, torch_threads=cfg.rollout.torch_threads)
    if cfg.model.dtype != "float32":  # the pushed float32 weights are cast by `update_weights`
        model = model.to(getattr(torch, cfg.model.dtype))
    return HFEngine(model, tok, torch_threads=cfg.rollout.torch_threads, compile=cfg.rollout.compile)
