"""The `agentrl` command line. Arguments and config are parsed and validated before torch is
imported, so `--help` and config errors are instant."""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer
from rich.console import Console

from agentrl.config import ConfigError, config_reference, load_config

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Train LLM agents with RL in multi-turn Gymnasium text environments.")
console = Console(stderr=False)


def _fail(msg: str) -> None:
    console.print(f"[red]{msg}[/red]")
    raise typer.Exit(2)


@app.command()
def train(
    overrides: Annotated[Optional[list[str]], typer.Argument(help="Config overrides key=value, e.g. train.lr=1e-4 algo.group_size=4.")] = None,
    env: Annotated[Optional[str], typer.Option(help="Environment: short name, Gymnasium id, or pkg.module:Class.")] = None,
    algo: Annotated[Optional[str], typer.Option(help="Algorithm: grpo, dr_grpo, gspo, rloo, reinforce_pp, ppo, dpo.")] = None,
    config: Annotated[Optional[str], typer.Option("--config", "-c", help="YAML file of config overrides.")] = None,
    steps: Annotated[Optional[int], typer.Option(help="Training steps (train.steps).")] = None,
    out: Annotated[Optional[str], typer.Option(help="Output directory.")] = None,
    seed: Annotated[Optional[int], typer.Option(help="Seed.")] = None,
    resume: Annotated[Optional[str], typer.Option(help="Resume from this output directory.")] = None,
    dataset: Annotated[Optional[str], typer.Option(help="Task file (HumanEval/MBPP/EvalPlus format) or 'humaneval'.")] = None,
    model: Annotated[Optional[str], typer.Option(help="Local Hugging Face model directory (model.path).")] = None,
    wrap: Annotated[Optional[list[str]], typer.Option(help="Reward wrapper to stack (repeatable): judge, safety, curiosity.")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
) -> None:
    """Train an agent: `agentrl train --env code_sandbox --algo grpo`."""
    try:
        cfg = load_config(config, overrides, **{
            "env.name": env, "algo.name": algo, "train.steps": steps, "out": out, "seed": seed,
            "resume": resume, "env.dataset": dataset, "model.path": model,
            "env.wrappers": list(wrap) if wrap else None, "quiet": quiet or None})
    except ConfigError as e:
        _fail(str(e))
    from agentrl.envs import resolve_env_id

    try:
        resolve_env_id(cfg.env.name)
    except (ValueError, ImportError, AttributeError) as e:
        _fail(f"config error: env.name: {e}")
    from agentrl.train import train as run_train

    run_train(cfg, console=console)


@app.command()
def envs() -> None:
    """List the registered environments, one line each."""
    import gymnasium as gym

    from agentrl.envs import DESCRIPTIONS, SHORT_NAMES

    short = {v: k for k, v in SHORT_NAMES.items()}
    for env_id in sorted(i for i in gym.registry if i in DESCRIPTIONS):
        console.print(f"{short.get(env_id, ''):14s} {env_id:28s} {DESCRIPTIONS[env_id]}")


@app.command("config")
def config_cmd(
    overrides: Annotated[Optional[list[str]], typer.Argument(help="Overrides key=value.")] = None,
    config: Annotated[Optional[str], typer.Option("--config", "-c", help="YAML file.")] = None,
    reference: Annotated[bool, typer.Option(help="Print the config reference (Markdown).")] = False,
) -> None:
    """Print the resolved config (or the reference of every key)."""
    if reference:
        print(config_reference())
        return
    try:
        cfg = load_config(config, overrides)
    except ConfigError as e:
        _fail(str(e))
    import yaml

    print(yaml.safe_dump(cfg.model_dump(), sort_keys=False))


def main() -> None:
    """Entry point of the `agentrl` script."""
    app(prog_name="agentrl")


if __name__ == "__main__":
    sys.exit(main())
