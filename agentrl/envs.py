"""Text environments: a `gymnasium.Env` whose actions are the agent's text and whose
observations are chat messages, and registration through Gymnasium's own registry.

Contract (docs/design.md):
- `reset(seed=None, options=None) -> (messages, info)`: the opening messages
  (`[{"role": "system"|"user", "content": str | parts}, ...]`; parts are text and image parts,
  `ChatMessages`). `options={"task": ...}` picks a task.
- `step(action: str) -> (messages, reward, terminated, truncated, info)`: `messages` are the new
  messages that follow the agent's turn (a `user` feedback or `tool` results; `[]` when the
  episode ends). `reward` is the scalar reward of that agent turn.
- A step never raises for bad agent output: errors become `info["error"]` with a penalty.

Built-in envs are registered here by *string* entry point, so `import agentrl` does not import
`agentrl_envs` (the `envs/` folder) until an env is made.
"""

from __future__ import annotations

import importlib
import inspect
import string
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.envs.registration import load_env_creator

if TYPE_CHECKING:
    from agentrl.config import Config

Message = dict[str, Any]


class ChatMessages(spaces.Space):
    """Observation space: a list of chat messages, each a dict with str `role` and `content`.

    `content` is a str, or a list of parts as in the OpenAI / Hugging Face chat formats:
    `{"type": "text", "text": str}` and `{"type": "image", "image": img}`, where `img` is a
    PIL image or an `(H, W, 3)` uint8 numpy array (`is_image`). `contains` is False for any
    other shape of content; `content_error` says what is wrong.
    """

    ROLES = ("system", "user", "assistant", "tool")

    def __init__(self, seed: int | None = None):
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def sample(self, mask: Any = None, probability: Any = None) -> list[Message]:
        n = int(self.np_random.integers(1, 3))
        return [{"role": "user", "content": f"message {int(self.np_random.integers(1e6))}"} for _ in range(n)]

    def contains(self, x: Any) -> bool:
        return isinstance(x, list) and all(
            isinstance(m, dict) and m.get("role") in self.ROLES and content_error(m.get("content")) is None
            for m in x
        )

    def __repr__(self) -> str:
        return "ChatMessages()"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, ChatMessages)


def is_image(x: Any) -> bool:
    """Whether `x` is an image an observation may carry: a PIL image, or a numpy array of
    shape `(H, W, 3)` (H, W >= 1), dtype uint8 (RGB, 0-255)."""
    if isinstance(x, np.ndarray):
        return x.dtype == np.uint8 and x.ndim == 3 and x.shape[2] == 3 and x.shape[0] > 0 and x.shape[1] > 0
    try:
        from PIL import Image
    except ImportError:  # pillow missing: nothing can be a PIL image
        return False
    return isinstance(x, Image.Image)


MAX_IMAGE_ASPECT = 200
"""Largest `max(H, W) / min(H, W)` of an image the Qwen2-VL image processor renders
(`transformers`' `smart_resize` raises above it). There is no lower bound on size beyond
`H, W >= 1`: an image under the processor's `min_pixels` is scaled up to it."""


def image_size(x: Any) -> tuple[int, int]:
    """`(width, height)` of image `x` (a PIL image or an `(H, W, 3)` array)."""
    if isinstance(x, np.ndarray):
        return int(x.shape[1]), int(x.shape[0])
    w, h = x.size
    return int(w), int(h)


def image_size_error(x: Any) -> str | None:
    """What makes image `x` (one `is_image` accepts) unrenderable by the image processor, or
    None: a zero width or height, or an aspect ratio over `MAX_IMAGE_ASPECT`."""
    w, h = image_size(x)
    if w == 0 or h == 0:
        return f"image of size {w}x{h} (WxH) has a zero dimension"
    if max(w, h) / min(w, h) > MAX_IMAGE_ASPECT:
        return (f"image of size {w}x{h} (WxH) has aspect ratio {max(w, h) / min(w, h):g}, over the "
                f"image processor's limit of {MAX_IMAGE_ASPECT}")
    return None


def content_error(content: Any) -> str | None:
    """What is wrong with a message's `content`, or None when it is valid: a str, or a list of
    `{"type": "text", "text": str}` / `{"type": "image", "image": PIL image or (H, W, 3) uint8
    array}` parts (`ChatMessages`), each image with both sides >= 1 and an aspect ratio of at
    most `MAX_IMAGE_ASPECT` (`image_size_error`)."""
    if isinstance(content, str):
        return None
    if not isinstance(content, list):
        return f"content must be a str or a list of parts, got {type(content).__name__}"
    for k, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            if not isinstance(part.get("text"), str):
                return f"part {k}: a text part needs a str 'text'"
        elif kind == "image":
            img = part.get("image")
            if not is_image(img):
                got = (f"array {img.shape} {img.dtype}" if isinstance(img, np.ndarray)
                       else type(img).__name__)
                return f"part {k}: 'image' must be a PIL image or an (H, W, 3) uint8 array, got {got}"
            size_err = image_size_error(img)
            if size_err:
                return f"part {k}: {size_err}"
        else:
            return f"part {k}: type must be 'text' or 'image', got {part!r:.80}"
    return None


def content_text(content: Any) -> str:
    """The text of a message's `content`: the str itself, or its text parts joined (images
    dropped)."""
    if isinstance(content, str):
        return content
    return "".join(p["text"] for p in content or [] if isinstance(p, dict) and p.get("type") == "text")


def message_images(messages: list[Message]) -> list[Any]:
    """The images of `messages`' image parts, in order of appearance (as the chat template
    renders them)."""
    return [p["image"] for m in messages if isinstance(m.get("content"), list)
            for p in m["content"] if isinstance(p, dict) and p.get("type") == "image"]


class AgentText(spaces.Space):
    """Action space: any str of at most `max_length` characters; samples random printable text."""

    def __init__(self, max_length: int = 100_000, seed: int | None = None):
        self.max_length = max_length
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        chars = np.array(list(string.printable))
        n = int(self.np_random.integers(0, 64))
        return "".join(self.np_random.choice(chars, size=n))

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"AgentText({self.max_length})"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, AgentText) and other.max_length == self.max_length


class TextEnv(gym.Env):
    """Base class of agentrl's text environments.

    Subclasses implement `reset` and `step` (Gymnasium signatures, str actions, message-list
    observations). Use `self.np_random` (seeded by `super().reset(seed=seed)`) for every random
    choice, never the global `random` (case G1). Put `info["task_id"]` in the reset info.
    """

    metadata: dict[str, Any] = {"render_modes": []}
    observation_space = ChatMessages()
    action_space = AgentText()

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        return [], {}


# ---------------------------------------------------------------------------------------------
# Registry: Gymnasium's, plus short names for the CLI.
# ---------------------------------------------------------------------------------------------

#: short CLI name -> Gymnasium id
SHORT_NAMES: dict[str, str] = {}
#: Gymnasium id -> one-line description (for `agentrl envs`)
DESCRIPTIONS: dict[str, str] = {}


def register_env(
    env_id: str,
    entry_point: str | type,
    *,
    short_name: str | None = None,
    description: str = "",
    max_turns: int | None = None,
    kwargs: dict[str, Any] | None = None,
) -> str:
    """Register a text env in Gymnasium's registry (one call; re-registering replaces it).

    Args:
        env_id: versioned Gymnasium id, e.g. `"my_pkg/MyEnv-v0"`.
        entry_point: `"pkg.module:Class"` (imported only when made) or the class itself.
        short_name: optional CLI name (`--env NAME`).
        description: one line shown by `agentrl envs`.
        max_turns: episode limit in agent turns (Gymnasium's `max_episode_steps`; reaching it
            gives `truncated=True`).
        kwargs: default constructor kwargs.

    Returns:
        env_id.
    """
    if env_id in gym.registry:
        del gym.registry[env_id]
    gym.register(id=env_id, entry_point=entry_point, max_episode_steps=max_turns, kwargs=kwargs or {})
    if short_name:
        SHORT_NAMES[short_name] = env_id
    DESCRIPTIONS[env_id] = description
    return env_id


ENTRY_POINT_GROUP = "agentrl.envs"
"""Entry-point group of installed packages' envs: each entry point names a module (imported, so
that its `register_env` calls run) or a function (called with no arguments), e.g. in the
package's pyproject.toml `[project.entry-points."agentrl.envs"] my_pkg = "my_pkg.envs"`."""

_plugins_loaded = False


def import_env_modules(modules: list[str] | tuple[str, ...]) -> None:
    """Import each module of `modules` (`env.imports`, `--import`) so that its import-time
    `register_env` calls run; a module already imported is not run again.

    Raises:
        ImportError: a module cannot be imported (the message names it and the folder searched).
    """
    import os

    for m in modules:
        try:
            importlib.import_module(m)
        except ImportError as e:
            raise ImportError(f"--import {m}: {e} (the current folder {os.getcwd()} and PYTHONPATH "
                              "are searched)") from e


def load_env_plugins() -> list[str]:
    """Load the installed packages' entry points of the group `ENTRY_POINT_GROUP` (once per
    process): a module is imported, a function is called. Returns the entry point names
    loaded this call. An entry point that fails to load raises (ImportError, or what its
    function raised), naming it."""
    global _plugins_loaded
    if _plugins_loaded:
        return []
    _plugins_loaded = True
    from importlib.metadata import entry_points

    names = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = ep.load()
        except Exception as e:  # noqa: BLE001 - re-raised with the entry point named
            raise ImportError(f"entry point {ep.name} = {ep.value} ({ENTRY_POINT_GROUP}): {e}") from e
        if callable(obj) and not inspect.ismodule(obj):
            obj()
        names.append(ep.name)
    return names


def _registered_id_of(entry: str, cls: Any) -> str | None:
    """The id a class is already registered under (by the class or by the `module:Class`
    string `entry`), or None."""
    for env_id, spec in gym.registry.items():
        if env_id in DESCRIPTIONS and (spec.entry_point is cls or spec.entry_point == entry):
            return env_id
    return None


def _lookup(name: str) -> str | None:
    if name in SHORT_NAMES:
        return SHORT_NAMES[name]
    if name in gym.registry:
        return name
    return None


def resolve_env_id(name: str) -> str:
    """Map a CLI `--env` value to a Gymnasium id.

    Accepts, in this order:
    - a short name (`code_sandbox`) or a registered id (`agentrl/CodeSandbox-v0`), including
      those registered by modules imported with `--import` (`env.imports`);
    - `module:NAME` where NAME is a short name or id that importing `module` registers
      (`my_envs:parity`);
    - `module:Class`: imported; if the module registered that class (by object or by the
      `module:Class` string), its id is returned, so the same env never gets a second id;
      else the class is registered as `custom/<Class>-v0`;
    - `namespace/Name-vN`, whose namespace is an importable module (`my_envs/GuessParity-v0`
      imports `my_envs`), or a module name whose import registers `name`;
    - anything registered by the installed packages' `agentrl.envs` entry points.

    Raises:
        ValueError: unknown name, naming the registered ones and how to import a module.
        ImportError, AttributeError: `module:Class` whose module or class does not exist.
    """
    found = _lookup(name)
    if found:
        return found
    if ":" in name:
        module, _, attr = name.partition(":")
        mod = importlib.import_module(module)
        found = _lookup(attr)
        if found and not hasattr(mod, attr):
            return found
        cls = getattr(mod, attr)
        return _registered_id_of(name, cls) or register_env(
            f"custom/{attr}-v0", cls, description=(cls.__doc__ or "").strip().split("\n")[0])
    for module in dict.fromkeys([name.split("/")[0], name]):  # my_envs/X-v0 -> my_envs
        if module and all(p.isidentifier() for p in module.split(".")):
            try:
                importlib.import_module(module)
            except ImportError:
                continue
            found = _lookup(name)
            if found:
                return found
    load_env_plugins()
    found = _lookup(name)
    if found:
        return found
    known = sorted(SHORT_NAMES) + sorted(i for i in gym.registry if i in DESCRIPTIONS and i not in SHORT_NAMES.values())
    raise ValueError(f"env: unknown environment {name!r}; registered: {', '.join(known)}. An env "
                     "registered in your own module: add --import MODULE (e.g. --import my_envs for "
                     "./my_envs.py), or give 'module:Class'; an installed package: declare an entry "
                     f"point in the group '{ENTRY_POINT_GROUP}'")


def make_env(name: str, *, max_turns: int | None = None, env_kwargs: dict[str, Any] | None = None,
             **kwargs: Any) -> gym.Env:
    """Make an env by CLI name or id. `max_turns` adds a further turn limit on top of the
    registered one: the smaller limit wins (case G2).

    Constructor keywords come from `kwargs` and `env_kwargs` (a dict, for a keyword that is
    also a parameter here: `env_kwargs={"max_turns": 2}` is the env's own `max_turns`).
    An env whose constructor takes `max_turns` (e.g. `code_sandbox`, where it is the number of
    attempts) also gets `max_turns` as a keyword unless the keywords set it, so
    `env.max_turns=3` gives three attempts instead of a TimeLimit of 3 on a one-attempt env.

    Raises:
        ValueError: unknown env name.
    """
    env_id = resolve_env_id(name)
    kwargs = {**(env_kwargs or {}), **kwargs}
    if max_turns is not None and "max_turns" not in kwargs and _takes_max_turns(env_id):
        kwargs["max_turns"] = max_turns
    env = gym.make(env_id, **kwargs)
    if max_turns is not None:
        env = gym.wrappers.TimeLimit(env, max_turns)
    return env


def _takes_max_turns(env_id: str) -> bool:
    """Whether the registered entry point's constructor has a `max_turns` parameter."""
    entry = gym.spec(env_id).entry_point
    try:
        creator = load_env_creator(entry) if isinstance(entry, str) else entry
        return "max_turns" in inspect.signature(creator).parameters
    except (TypeError, ValueError, ImportError, AttributeError):
        return False


def register_builtin_envs() -> None:
    """Register the envs shipped in `envs/` (package `agentrl_envs`) by string entry point."""
    register_env("agentrl/CodeSandbox-v0", "agentrl_envs.code_sandbox:CodeSandboxEnv",
                 short_name="code_sandbox",
                 description="write a Python function; rewarded by unit tests run in the sandbox")
    register_env("agentrl/WebQA-v0", "agentrl_envs.web_qa:WebQAEnv", short_name="web_qa",
                 max_turns=8,
                 description="multi-hop QA with search and fetch tools over a local HTTP corpus")
    register_env("agentrl/RLAIFJudge-v0", "agentrl_envs.rlaif_judge:RLAIFJudgeEnv",
                 short_name="rlaif_judge",
                 description="answer a question; an AI judge (offline rule judge without judge_url) scores it")
    register_env("agentrl/Safety-v0", "agentrl_envs.safety:SafetyEnv", short_name="safety",
                 description="help with benign requests, refuse harmful ones; a safety classifier judges harm")
    register_env("agentrl/Toy-v0", "agentrl_envs.toy:ToyEnv", short_name="toy",
                 description="trivially learnable toy: say the target word (for tests and demos)")
    register_env("agentrl/SelfPropose-v0", "agentrl_envs.self_propose:SelfProposeEnv",
                 short_name="self_propose",
                 description="propose Python tasks and solve buffered ones (deduce, abduce, induce); "
                             "the sandbox verifies")
    register_env("agentrl/VisualCount-v0", "agentrl_envs.visual_count:VisualCountEnv",
                 short_name="visual_count",
                 description="look at a drawn board of coloured shapes; count them or say where one "
                             "is (image observations: needs a vision-language policy)")


# -- env state in checkpoints ---------------------------------------------------------------------
def env_state(env: Any) -> dict[str, Any] | None:
    """The state a checkpoint keeps for `env` (wrappers allowed): its unwrapped env's
    `state_dict()` (JSON-able, e.g. `self_propose`'s task buffer), or None when it has none.
    The training loop stores it as `env_state` in the checkpoint's `agentrl_state.json`."""
    fn = getattr(getattr(env, "unwrapped", env), "state_dict", None)
    return fn() if callable(fn) else None


def load_env_state(env: Any, state: dict[str, Any]) -> None:
    """Restore `env_state(env)`'s `state` into `env` (on resume).

    Raises:
        ValueError: the env has no `load_state_dict` (the checkpoint came from another env).
    """
    fn = getattr(getattr(env, "unwrapped", env), "load_state_dict", None)
    if not callable(fn):
        raise ValueError(f"checkpoint has env_state but env {type(env).__name__} cannot load it "
                         "(no load_state_dict): was it written by another env?")
    fn(state)


# -- from a config -------------------------------------------------------------------------------
def _env_accepts(name: str, kwarg: str) -> bool:
    """Does the entry point of env `name` take the keyword `kwarg` (e.g. `split`)?"""
    spec = gym.spec(resolve_env_id(name))
    ep = spec.entry_point
    if isinstance(ep, str):
        mod, _, attr = ep.partition(":")
        ep = getattr(importlib.import_module(mod), attr)
    try:
        return kwarg in inspect.signature(ep).parameters
    except (TypeError, ValueError):
        return False


def build_env(cfg: Config, split: str | None = None, rewards: Any = None) -> Any:
    """Make one env from the config (dataset, split, kwargs, turn limit) with the reward
    wrappers of `cfg.env.wrappers` stacked on it. `rewards` (a `RewardWrappers`) lets many env
    copies share one judge client, curiosity memory and Lagrange multiplier. The modules of
    `cfg.env.imports` are imported first (in a Ray worker too).

    Raises:
        ConfigError: the env's constructor refused the keywords (a TypeError or ValueError from
            it: an unknown keyword in `env.kwargs`, a value it does not accept); the message
            names the key and the keywords.
    """
    import_env_modules(cfg.env.imports)
    kw = dict(cfg.env.kwargs)
    if cfg.env.dataset is not None:
        kw["dataset"] = cfg.env.dataset
    if split is not None and _env_accepts(cfg.env.name, "split"):
        kw["split"] = split
    try:
        env = make_env(cfg.env.name, max_turns=cfg.env.max_turns, env_kwargs=kw)
    except (TypeError, ValueError) as e:  # a keyword the env does not take, a value it refuses
        from agentrl.config import ConfigError

        key = ("env.kwargs" if cfg.env.kwargs else "env.dataset" if cfg.env.dataset is not None
               else "env.name")
        cause = e.__cause__ or e  # gymnasium re-raises the creator's error with its own text
        raise ConfigError(f"config error: {key}: {cfg.env.name} cannot be made with keywords "
                          f"{kw!r}: {type(cause).__name__}: {cause}") from e
    if cfg.env.wrappers:
        try:
            if rewards is None:
                # imported only when a wrapper is asked for
                from agentrl.rewards import RewardWrappers

                rewards = RewardWrappers.from_config(cfg)
            env = rewards.wrap(env)
        except (TypeError, ValueError) as e:  # an unknown wrapper, a keyword it does not take
            from agentrl.config import ConfigError

            if isinstance(e, ConfigError):
                raise
            raise ConfigError(f"config error: env.wrappers / env.wrapper_kwargs: "
                              f"{type(e).__name__}: {e}") from e
    return env


def build_named_env(cfg: Config, name: str, split: str | None = None) -> Any:
    """Make env `name` other than the run's own (e.g. one of `sft.mix_envs`): its default
    kwargs, on `split` when its constructor takes one, the modules of `cfg.env.imports`
    imported first; none of the run's env kwargs, dataset or reward wrappers."""
    import_env_modules(cfg.env.imports)
    kw = {"split": split} if split is not None and _env_accepts(name, "split") else {}
    return make_env(name, env_kwargs=kw)

