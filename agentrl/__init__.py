"""agentrl: reinforcement learning for LLM agents in multi-turn Gymnasium text environments."""

from agentrl.env.base import TextEnv
from agentrl.env.registry import make_env, register_builtin_envs, register_env

__version__ = "0.1.0"
__all__ = ["TextEnv", "make_env", "register_env", "__version__"]

register_builtin_envs()
