"""Defaults that depend on the env or on the policy, resolved once per run.

A few settings have a better default for some runs than the global one in `agentrl.config`:

- an env whose observations carry images (its class sets `observes_images = True`, e.g.
  `visual_count`) gets `model.vision=true` when neither `model.path` nor `model.vision` is
  given: the embedded text model cannot read images (the agent loop refuses them), so the
  embedded default is then the tiny vision-language model;
- a vision-language policy (`model.vision`, given or resolved as above) gets `VISION_DEFAULTS`
  for the keys the user did not set: the initialisation std `model.init_std` 0.1 instead of
  the architecture's 0.02 (docs/multimodal.md: at 0.02 the tiny VLM sits on `visual_count`'s
  answer prior, image-blind, for hundreds of warm-start steps), the warm start's learning
  rate 5e-4 instead of 2e-3 (at 2e-3 it stayed image-blind), a warm start of exactly 300
  steps (no pass-rate stop: an image-blind model passes the stop checks on `visual_count`'s
  answer prior, so they ended the warm start before it read the board) and RL's learning rate
  `train.lr` 3e-5 instead of 3e-4 (at 3e-4 and 1e-4 GRPO lost much of what the warm start had
  learnt to read; docs/multimodal.md, "The default CLI job").

A key counts as set when it is in its section's pydantic `model_fields_set` (given in a YAML
file, an override or a keyword; a resumed run's saved config sets every key, so a resumed run
keeps its settings). The text main job (`agentrl train` with nothing else) is unchanged.
`agentrl config` prints the resolved values.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
from gymnasium.envs.registration import load_env_creator

from agentrl.config import Config
from agentrl.env.registry import resolve_env_id

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
