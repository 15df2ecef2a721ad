"""The env registry: Gymnasium's own, plus short CLI names, `--import` modules and installed
packages' entry points; `make_env` by name. Built-in envs are registered by *string* entry point,
so `import agentrl` does not import `agentrl_envs` (the `envs/` folder) until an env is made."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from pathlib import Path
from typing import Any

import gymnasium as gym
from gymnasium.envs.registration import load_env_creator

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


def module_folder(name: str) -> str | None:
    """The `sys.path` folder module `name` (dotted or not) is found in, in this process: the
    folder to put on another process's `sys.path` (a Ray worker's) for it to import the module
    the same way. None when it is not found, or not from a folder (built-in, frozen, zip)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):  # a parent package that does not import
        return None
    if spec is None:
        return None
    locations = list(spec.submodule_search_locations or [])
    if spec.origin and spec.has_location:
        where = Path(spec.origin).parent  # a module's file, or a package's __init__.py
    elif locations:  # a namespace package: its folder
        where = Path(locations[0])
    else:
        return None
    up = name.count(".") + (1 if locations else 0)  # a package's folder is itself one level
    for _ in range(up):
        where = where.parent
    top = name.split(".")[0]  # (an editable install may map a package to a folder of another name)
    return str(where) if (where / top).is_dir() or (where / f"{top}.py").is_file() else None


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


def registered_turn_limit(name: str) -> tuple[bool, int | None]:
    """Whether env `name` (a short name or id) is registered yet (nothing is imported), and the
    turn limit it is registered with (`register_env(max_turns=...)`, or a `max_turns` in its
    registered constructor kwargs; None when it has none)."""
    env_id = _lookup(name)
    if env_id is None:
        return False, None
    spec = gym.registry[env_id]
    limit = spec.max_episode_steps or (spec.kwargs or {}).get("max_turns")
    return True, int(limit) if limit is not None else None


REASONING_GYM_PREFIX = "reasoning_gym:"
"""`--env reasoning_gym:NAME`: reasoning-gym's dataset NAME (`agentrl_envs.reasoning_gym_env`)."""


def register_reasoning_gym(task: str) -> str:
    """Register reasoning-gym's dataset `task` as `reasoning_gym/<task>-v0` (its name checked
    when the env is made) and return that id."""
    return register_env(f"reasoning_gym/{task}-v0", "agentrl_envs.reasoning_gym_env:ReasoningGymEnv",
                        short_name=f"{REASONING_GYM_PREFIX}{task}", kwargs={"task": task},
                        description=f"reasoning-gym's {task} (its generator, its scorer)")


def resolve_env_id(name: str) -> str:
    """Map a CLI `--env` value to a Gymnasium id.

    Accepts, in this order:
    - `reasoning_gym:NAME`: reasoning-gym's dataset NAME (`register_reasoning_gym`);
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
    if name.startswith(REASONING_GYM_PREFIX):  # before `module:NAME`: the library's own module
        return register_reasoning_gym(name[len(REASONING_GYM_PREFIX):])
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
                     f"point in the group '{ENTRY_POINT_GROUP}'; reasoning-gym's datasets: "
                     f"'{REASONING_GYM_PREFIX}NAME' (e.g. {REASONING_GYM_PREFIX}basic_arithmetic)")


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
    register_env("agentrl/Agent-v0", "agentrl.gateway.agents:AgentEnv", short_name="agent",
                 description="your own agent (--agent MODULE:FUNCTION, an async function of an "
                             "OpenAI client and a task) over --dataset tasks.jsonl, through the gateway")
    register_env("agentrl/MCPTools-v0", "agentrl_envs.mcp_tools:MCPToolsEnv", short_name="mcp_tools",
                 max_turns=8,
                 description="answer --dataset questions with the tools of MCP servers "
                             "(env.kwargs.servers: stdio commands or loopback URLs)")
    register_env("agentrl/VisualCount-v0", "agentrl_envs.visual_count:VisualCountEnv",
                 short_name="visual_count",
                 description="look at a drawn board of coloured shapes; count them or say where one "
                             "is (image observations: needs a vision-language policy)")
