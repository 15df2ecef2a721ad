"""A run, built from its `Config` in one place: the model and tokenizer (a checkpoint, a given
path or the embedded tiny model), the envs (`build_env`, with shared reward wrappers), the
rollout engine (in process, Ray workers or vLLM) and the held-out envs. `agentrl.train`,
`agentrl.sft` and `agentrl eval` build their pieces here; the Ray workers make their envs with
the same `build_env` (`agentrl.env.base`), so that every env of a run is made one way.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentrl.config import Config, ConfigError
from agentrl.rollout.envs import _env_accepts, build_env

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
    opening messages and reference answers of `TOKENIZER_TASKS` training tasks, and of
    `TOKENIZER_TASKS x share` tasks of each env of `sft.mix_envs`). Progress goes
    to `reporter` (`agentrl.log.progress.Reporter`; None: silent): the task texts as a stage with
    its ETA, then the tokenizer training and model build (one call) as start/end lines."""
    from agentrl.env.content import content_error, content_text
    from agentrl.log.progress import Reporter
    from agentrl.models.tiny import build_tiny_model

    reporter = reporter or Reporter(enabled=False)
    target = out / ("base_vlm" if cfg.model.vision else "base_model")
    if (target / "config.json").exists():
        return str(target)
    from agentrl.rollout.envs import build_named_env

    sources = [(cfg.env.name, build_env(cfg, "train"), TOKENIZER_TASKS)] + [  # the warm start's other envs too
        (name, build_named_env(cfg, name, "train"), max(1, round(TOKENIZER_TASKS * share)))
        for name, share in cfg.sft.mix_envs.items()]
    texts: list[str] = []
    with reporter.stage("model", sum(n for _, _, n in sources), unit="task texts for the tokenizer") as st:
        for name, env, n in sources:
            get = getattr(env.unwrapped, "reference_answer", None)
            failed, last_bad = 0, ""
            for i in range(n):
                try:  # a reset that raises is a lost task here, as in rollouts (contract 7)
                    obs, _ = env.reset(seed=500_000 + i)
                except Exception:  # noqa: BLE001 - the env's own failure, not ours
                    failed += 1
                    continue
                if not isinstance(obs, list) or not all(isinstance(m, dict) and "content" in m for m in obs):
                    raise ConfigError(f"env {name}: reset(seed={500_000 + i}) returned "
                                      f"{type(obs).__name__} {str(obs)[:80]!r}, not a list of chat "
                                      "messages ({'role': ..., 'content': ...})")
                bad = next((e for e in (content_error(m["content"]) for m in obs) if e), None)
                if bad:  # e.g. an image the processor cannot render: a lost task, as in rollouts
                    failed, last_bad = failed + 1, bad
                    continue
                texts.extend(content_text(m["content"]) for m in obs)
                if get is not None and get():
                    texts.append(get())
                st.advance()
            if failed == n:
                raise ConfigError(f"env {name}: every reset raised or returned a bad observation "
                                  f"({n} of {n}) while gathering texts for the embedded tokenizer"
                                  + (f"; last bad observation: {last_bad}" if last_bad else ""))
            feedback = getattr(env.unwrapped, "corpus_texts", None)
            if feedback is not None:
                texts.extend(feedback())
    m = cfg.model
    with reporter.stage("model", None, unit=f"training the tokenizer on {len(texts)} texts and "
                        "building the model"):
        if m.vision:
            from agentrl.models.vlm import build_tiny_vlm

            return build_tiny_vlm(str(target), texts, hidden_size=m.hidden_size, num_layers=m.num_layers,
                                  num_heads=m.num_heads, intermediate_size=m.intermediate_size,
                                  vocab_size=m.vocab_size, vision_depth=m.vision_depth,
                                  vision_width=m.vision_width, vision_heads=m.vision_heads, seed=cfg.seed,
                                  init_std=m.init_std)
        return build_tiny_model(str(target), texts, hidden_size=m.hidden_size, num_layers=m.num_layers,
                                num_heads=m.num_heads, intermediate_size=m.intermediate_size,
                                vocab_size=m.vocab_size, seed=cfg.seed, init_std=m.init_std)


def load_policy(cfg: Config, out: Path, checkpoint: Path | None,
                reporter: Any = None) -> tuple[Any, Any, str | Path]:
    """The policy to train and its tokenizer: the `checkpoint` (full weights, or LoRA adapters on
    their base) when resuming, else `model.path`, else the embedded model (`default_model_dir`,
    its progress to `reporter`).

    Returns:
        `(model, tokenizer, directory loaded)`, the model in eval mode (`agentrl.models.tiny.load_model`).

    Raises:
        ValueError: a vision-language policy with settings it cannot run with yet
            (`check_vision_training`).
    """
    from agentrl.learner.lora import load_checkpoint
    from agentrl.models.tiny import load_model
    from agentrl.models.vlm import is_vlm_dir

    if checkpoint is not None:
        if is_vlm_dir(checkpoint):
            return (*_load_vlm_policy(checkpoint), checkpoint)
        return (*load_checkpoint(checkpoint), checkpoint)
    check_vision_training(cfg)
    path = cfg.model.path or default_model_dir(cfg, out, reporter)
    if is_vlm_dir(path):
        return (*_load_vlm_policy(path), path)
    return (*load_model(path), path)


def _load_vlm_policy(path: str | Path) -> tuple[Any, Any]:
    """`(model, tokenizer)` of a vision-language directory (`agentrl.models.vlm.load_vlm`), the image
    processor carried as `tokenizer.image_processor` (for the renderer, the engine and the
    checkpoints)."""
    from agentrl.models.vlm import load_vlm

    model, tok, image_processor = load_vlm(path)
    tok.image_processor = image_processor
    return model, tok


def vision_engine(cfg: Config, path: str | Path) -> tuple[Any, Any]:
    """`(VisionHFEngine, VisionChatRenderer)` of the vision-language directory `path` (for
    `agentrl eval`): the model loaded with the Auto classes, in `model.dtype`."""
    from agentrl.models.vision_logprobs import vision_token_ids
    from agentrl.rollout.chat import VisionChatRenderer
    from agentrl.rollout.engines.hf_vision import VisionHFEngine

    model, tok = _load_vlm_policy(path)
    if cfg.model.dtype != "float32":
        model = model.to(getattr(torch, cfg.model.dtype))
    engine = VisionHFEngine(model, image_token_id=model.config.image_token_id,
                            banned_ids=vision_token_ids(model.config), torch_threads=cfg.rollout.torch_threads)
    return engine, VisionChatRenderer(tok, tok.image_processor)


def check_vision_training(cfg: Config) -> None:
    """With a vision-language policy (`model.vision`, or a `model.path` holding one), refuse at
    start-up what does not run with images yet: LoRA, PPO's value head, a reference worker and
    learner ranks (docs/multimodal.md). Ray rollout workers (`rollout.num_workers > 0`) and the
    vLLM engine (`rollout.engine=vllm`: token prompts plus images) do.

    Raises:
        ValueError: naming the key to change.
    """
    from agentrl.models.vlm import is_vlm_dir

    if not (cfg.model.vision or (cfg.model.path and is_vlm_dir(cfg.model.path))):
        return
    bad = [(cfg.model.lora_r > 0, "model.lora_r=0"),
           (cfg.algo.name == "ppo", "an algorithm without a value head (grpo, rloo, ...)"),
           (cfg.placement.reference == "worker", "placement.reference other than worker"),
           (cfg.train.learner_workers > 0, "train.learner_workers=0")]
    need = [fix for hit, fix in bad if hit]
    if need:
        raise ValueError("a vision-language policy trains without LoRA, a value head, a reference "
                         "worker or learner ranks for now; "
                         f"set {', '.join(need)} (docs/multimodal.md)")


# -- engine -------------------------------------------------------------------------------------
def make_teacher_engine(cfg: Config, tok: Any) -> Any:
    """An in-process `HFEngine` holding the teacher (`cfg.algo.teacher_path`) in `cfg.model.dtype`,
    to sample the teacher's episodes of GKD's mixture (`algo.distill_teacher_fraction`); a
    copy of its own (the inline scorer `load_teacher` stays float32 and untouched). Its
    `policy_version` stays 0: the teacher never changes.

    Raises:
        FileNotFoundError: `teacher_path` is not a directory.
    """
    from agentrl.models.tiny import load_model
    from agentrl.rollout.engines.hf import HFEngine

    model, _ = load_model(cfg.algo.teacher_path, dtype=getattr(torch, cfg.model.dtype))
    model.requires_grad_(False)
    return HFEngine(model.eval(), tok, torch_threads=cfg.rollout.torch_threads, compile=cfg.rollout.compile)


def make_engine(cfg: Config, model: Any, tok: Any, out: Path) -> Any:
    """The rollout engine of a run, holding a copy of `model`'s current weights as version 0.

    Returns:
        a `RolloutPool` of Ray workers (`rollout.num_workers > 0`) or of vLLM
        (`rollout.engine=vllm`), which hold their own envs and load the weights written to
        OUT/rollout_model (a vision-language policy's with its image processor, so the workers
        build `VisionHFEngine`); else an in-process `VisionHFEngine` for a vision-language policy
        (`tok.image_processor` set) or `HFEngine` (`rollout.torch_threads`, `rollout.compile`). Every engine holds its weights in `model.dtype` (the in-process
        engine a copy cast to it; the learner keeps float32 master weights, its compute
        precision is `train.precision`).
    """
    from agentrl.learner.lora import plain_copy

    image_processor = getattr(tok, "image_processor", None)  # a vision-language policy
    if cfg.rollout.num_workers > 0 or cfg.rollout.engine == "vllm":
        from agentrl.rollout.workers import RolloutPool  # Ray workers (or vLLM) hold the envs

        plain_copy(model).save_pretrained(out / "rollout_model")
        tok.save_pretrained(out / "rollout_model")
        if image_processor is not None:  # a VLM directory: the workers build VisionHFEngine
            image_processor.save_pretrained(out / "rollout_model")
        return RolloutPool(cfg, out / "rollout_model")  # current weights = version 0
    if image_processor is not None:  # in-process
        from agentrl.models.vision_logprobs import vision_token_ids
        from agentrl.rollout.engines.hf_vision import VisionHFEngine

        return VisionHFEngine(plain_copy(model).eval(), image_token_id=model.config.image_token_id,
                              banned_ids=vision_token_ids(model.config),
                              torch_threads=cfg.rollout.torch_threads)
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


# -- defaults that depend on the env or on the policy ----------------------------------------------
# Defaults that depend on the env or on the policy, resolved once per run.
#
# A few settings have a better default for some runs than the global one in `agentrl.config`:
#
# - an env whose observations carry images (its class sets `observes_images = True`, e.g.
#   `visual_count`) gets `model.vision=true` when neither `model.path` nor `model.vision` is
#   given: the embedded text model cannot read images (the agent loop refuses them), so the
#   embedded default is then the tiny vision-language model;
# - a vision-language policy (`model.vision`, given or resolved as above) gets `VISION_DEFAULTS`
#   for the keys the user did not set: the initialisation std `model.init_std` 0.1 instead of
#   the architecture's 0.02 (docs/multimodal.md: at 0.02 the tiny VLM sits on `visual_count`'s
#   answer prior, image-blind, for hundreds of warm-start steps), the warm start's learning
#   rate 5e-4 instead of 2e-3 (at 2e-3 it stayed image-blind), a warm start of exactly 300
#   steps (no pass-rate stop: an image-blind model passes the stop checks on `visual_count`'s
#   answer prior, so they ended the warm start before it read the board) and RL's learning rate
#   `train.lr` 3e-5 instead of 3e-4 (at 3e-4 and 1e-4 GRPO lost much of what the warm start had
#   learnt to read; docs/multimodal.md, "The default CLI job");
#
# A key counts as set when it is in its section's pydantic `model_fields_set` (given in a YAML
# file, an override or a keyword; a resumed run's saved config sets every key, so a resumed run
# keeps its settings). The text main job (`agentrl train` with nothing else) is unchanged.
# `agentrl config` prints the resolved values.

VISION_DEFAULTS: dict[str, dict[str, Any]] = {
    "model": {"init_std": 0.1},
    "sft": {"lr": 5e-4, "steps": 300, "stop_pass_rate": None, "stop_pass_at_k": None},
    "train": {"lr": 3e-5},
}
"""Section -> key -> value: defaults for a vision-language policy (keys the user did not set)."""


def env_observes_images(name: str) -> bool:
    """Does env `name`'s class declare `observes_images = True` (its observations carry image
    parts)? The class is looked up, not built.

    Raises:
        ValueError: an unknown env (`agentrl.env.registry.resolve_env_id`).
    """
    import gymnasium as gym
    from gymnasium.envs.registration import load_env_creator

    from agentrl.env.registry import resolve_env_id

    ep = gym.spec(resolve_env_id(name)).entry_point
    cls = load_env_creator(ep) if isinstance(ep, str) else ep
    return bool(getattr(cls, "observes_images", False))


def _fill(section: Any, values: dict[str, Any]) -> Any:
    """`section` with `values` for the keys not in its `model_fields_set` (a copy, or itself)."""
    update = {k: v for k, v in values.items() if k not in section.model_fields_set}
    if not update:
        return section
    return section.model_copy(update=update)  # pydantic adds the filled keys to model_fields_set


def resolve_run_defaults(cfg: Config) -> Config:
    """`cfg` with the env- and policy-dependent defaults filled into the keys the user did not
    set (see the module docstring), in that order: `model.vision` for an env that observes
    images (no `model.path`), then `VISION_DEFAULTS` when `model.vision` is true. (An
    algorithm's own defaults, e.g. GSPO's clips, are its config class's defaults:
    `agentrl.algos.configs`.)

    A `model.path` holding a vision-language directory gets no `VISION_DEFAULTS` (a given model
    is not the embedded one the figures were measured on).

    Raises:
        ValueError: an unknown env.
    """
    model = cfg.model
    if model.path is None and "vision" not in model.model_fields_set and env_observes_images(cfg.env.name):
        model = _fill(model, {"vision": True})
    update: dict[str, Any] = {"model": model}
    if model.vision and model.path is None:
        for section, values in VISION_DEFAULTS.items():
            update[section] = _fill(update.get(section, getattr(cfg, section)), values)
    return cfg.model_copy(update=update)
