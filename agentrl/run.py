"""A run, built from its `Config` in one place: the model and tokenizer (a checkpoint, a given
path or the embedded tiny model), the envs (`build_env`, with shared reward wrappers), the
rollout engine (in process, Ray workers or vLLM) and the held-out envs. `agentrl.train`,
`agentrl.sft` and `agentrl eval` build their pieces here; the Ray workers make their envs with
the same `build_env` (`agentrl.envs`), so that every env of a run is made one way.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentrl.config import Config
from agentrl.envs import _env_accepts, build_env

__all__ = ["_env_accepts", "build_env", "default_model_dir", "heldout_envs", "load_policy", "make_engine",
           "quiet_libraries", "reward_wrappers", "rollout_compile_note", "seed_everything"]


def quiet_libraries() -> None:
    """Silence transformers' per-file progress bars and info logs (our own progress shows)."""
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators with `seed`."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


# -- model --------------------------------------------------------------------------------------
TOKENIZER_TASKS = 2000
"""Training tasks whose opening messages and reference answers train the embedded model's
tokenizer."""


def default_model_dir(cfg: Config, out: Path, reporter: Any = None) -> str:
    """Build the embedded tiny model in `OUT/base_model` (tokenizer trained on texts of the env:
    opening messages and reference answers of `TOKENIZER_TASKS` training tasks). Progress goes
    to `reporter` (`agentrl.progress.Reporter`; None: silent): the task texts as a stage with
    its ETA, then the tokenizer training and model build (one call) as start/end lines."""
    from agentrl.envs import content_text
    from agentrl.model import build_tiny_model
    from agentrl.progress import Reporter

    reporter = reporter or Reporter(enabled=False)
    target = out / ("base_vlm" if cfg.model.vision else "base_model")
    if (target / "config.json").exists():
        return str(target)
    env = build_env(cfg, "train")
    texts = []
    get = getattr(env.unwrapped, "reference_answer", None)
    with reporter.stage("model", TOKENIZER_TASKS, unit="task texts for the tokenizer") as st:
        for i in range(TOKENIZER_TASKS):
            obs, _ = env.reset(seed=500_000 + i)
            texts.extend(content_text(m["content"]) for m in obs)
            if get is not None and get():
                texts.append(get())
            st.advance()
    feedback = getattr(env.unwrapped, "corpus_texts", None)
    if feedback is not None:
        texts.extend(feedback())
    m = cfg.model
    with reporter.stage("model", None, unit=f"training the tokenizer on {len(texts)} texts and "
                        "building the model"):
        if m.vision:
            from agentrl.vlm import build_tiny_vlm

            return build_tiny_vlm(str(target), texts, hidden_size=m.hidden_size, num_layers=m.num_layers,
                                  num_heads=m.num_heads, intermediate_size=m.intermediate_size,
                                  vocab_size=m.vocab_size, seed=cfg.seed)
        return build_tiny_model(str(target), texts, hidden_size=m.hidden_size, num_layers=m.num_layers,
                                num_heads=m.num_heads, intermediate_size=m.intermediate_size,
                                vocab_size=m.vocab_size, seed=cfg.seed)


def load_policy(cfg: Config, out: Path, checkpoint: Path | None,
                reporter: Any = None) -> tuple[Any, Any, str | Path]:
    """The policy to train and its tokenizer: the `checkpoint` (full weights, or LoRA adapters on
    their base) when resuming, else `model.path`, else the embedded model (`default_model_dir`,
    its progress to `reporter`).

    Returns:
        `(model, tokenizer, directory loaded)`, the model in eval mode (`agentrl.model.load_model`).

    Raises:
        ValueError: a vision-language policy (`refuse_vision_policy`).
    """
    from agentrl.lora import load_checkpoint
    from agentrl.model import load_model

    if checkpoint is not None:
        return (*load_checkpoint(checkpoint), checkpoint)
    refuse_vision_policy(cfg)
    path = cfg.model.path or default_model_dir(cfg, out, reporter)
    return (*load_model(path), path)


def refuse_vision_policy(cfg: Config) -> None:
    """Fail at start-up on a vision-language policy (`model.vision`, or a `model.path` holding
    one): the run builder, the SFT warm start and checkpoints are text-only (docs/multimodal.md).

    Raises:
        ValueError: naming the key and what works today.
    """
    from agentrl.vlm import is_vlm_dir

    which = ("model.vision=true" if cfg.model.vision else
             f"model.path={cfg.model.path} (a vision-language model)"
             if cfg.model.path and is_vlm_dir(cfg.model.path) else None)
    if which:
        raise ValueError(f"{which}: training or evaluating a vision-language policy from the CLI "
                         "is not wired yet (the run builder, the SFT warm start and checkpoints "
                         "are text-only); what works today is in docs/multimodal.md")


# -- engine -------------------------------------------------------------------------------------
def make_engine(cfg: Config, model: Any, tok: Any, out: Path) -> Any:
    """The rollout engine of a run, holding a copy of `model`'s current weights as version 0.

    Returns:
        a `RolloutPool` of Ray workers (`rollout.num_workers > 0`) or of vLLM
        (`rollout.engine=vllm`), which hold their own envs and load the weights written to
        OUT/rollout_model; else an in-process `HFEngine` (`rollout.torch_threads`,
        `rollout.compile`). Every engine holds its weights in `model.dtype` (the in-process
        engine a copy cast to it; the learner keeps float32 master weights, its compute
        precision is `train.precision`).
    """
    from agentrl.lora import plain_copy

    if cfg.rollout.num_workers > 0 or cfg.rollout.engine == "vllm":
        from agentrl.rollout.workers import RolloutPool  # Ray workers (or vLLM) hold the envs

        plain_copy(model).save_pretrained(out / "rollout_model")
        tok.save_pretrained(out / "rollout_model")
        return RolloutPool(cfg, out / "rollout_model")  # current weights = version 0
    from agentrl.rollout.engines.hf import HFEngine

    copy = plain_copy(model).eval()
    if cfg.model.dtype != "float32":  # the pushed float32 weights are cast by `update_weights`
        copy = copy.to(getattr(torch, cfg.model.dtype))
    return HFEngine(copy, tok, torch_threads=cfg.rollout.torch_threads, compile=cfg.rollout.compile)


def rollout_compile_note(cfg: Config, engine: Any) -> str:
    """One line on what `rollout.compile` does in this run ("" when it is off)."""
    if not cfg.rollout.compile:
        return ""
    if cfg.rollout.engine != "hf":
        return f"rollout.compile has no effect on engine {cfg.rollout.engine!r} (it compiles the hf engine)"
    if hasattr(engine, "compile_note"):  # the in-process HFEngine
        return engine.compile_note()
    if cfg.model.dtype != "float32":
        return f"rollout.compile has no effect: the static decoder needs float32 weights (model.dtype={cfg.model.dtype})"
    return ("each rollout worker compiles its decode step at its first generate if the model has a "
            "static decoder (float32 Qwen2/Llama; torch.compile, 30 s to 1 min per worker)")


# -- envs ---------------------------------------------------------------------------------------
def reward_wrappers(cfg: Config) -> Any:
    """One `RewardWrappers` for `cfg.env.wrappers` (judge client, curiosity memory, safety
    multiplier shared by every env made with it), or None when the run has no wrappers."""
    if not cfg.env.wrappers:
        return None
    from agentrl.rewards import RewardWrappers

    return RewardWrappers.from_config(cfg)


def heldout_envs(cfg: Config, rewards: Any = None) -> list[Any]:
    """The envs of the held-out evaluation: `heldout_width(cfg)` envs of the `heldout` split
    (fixed, so that evaluation batches do not depend on training's); the task list is the
    first `train.eval_tasks` tasks of that split (`agentrl.eval.harness.evaluate_heldout`)."""
    from agentrl.eval.harness import heldout_width

    return [build_env(cfg, "heldout", rewards) for _ in range(heldout_width(cfg))]
