"""The `agentrl` command line. Arguments and config are parsed and validated before torch is
imported, so `--help` and config errors are instant."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from pydantic import BaseModel
from rich.console import Console
from rich.markup import escape

from agentrl.algos.configs import ALGO_CONFIGS, AlgoBase
from agentrl.config import Config, ConfigError, _set_dotted, branch_turns_error, load_config
from agentrl.env.registry import (
    DESCRIPTIONS,
    SHORT_NAMES,
    import_env_modules,
    load_env_plugins,
    registered_turn_limit,
    resolve_env_id,
)
from agentrl.infra.corpus_server import main as serve
from agentrl.infra.signals import RunInterrupted
from agentrl.log.plot import plot_runs
from agentrl.log.show import show_episode
from agentrl.sandbox.backends import BackendError
from agentrl.sandbox.doctor import render, run_checks

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Train LLM agents with RL in multi-turn Gymnasium text environments.")
console = Console(stderr=False)
_DEFAULT = Config()  # the defaults shown by `agentrl train --help` (the options default to None:
# an option not given leaves the config's, or a resumed run's, value)


TRAIN_FLAGS = {"env.name": "--env", "algo.name": "--algo", "train.steps": "--steps", "out": "--out",
               "seed": "--seed", "resume": "--resume", "env.dataset": "--dataset", "model.path": "--model",
               "env.wrappers": "--wrap", "quiet": "--quiet", "rollout.ray_address": "--ray-address",
               "overwrite": "--overwrite", "sft.steps": "--steps"}
"""The options of `agentrl train` / `sft` by the config key they set (for `load_config`'s
message when an option and a `key=value` override disagree)."""


def _fail(msg: str) -> None:
    console.print(f"[red]{escape(msg)}[/red]", soft_wrap=True)  # escaped: a message may hold [brackets]; one line
    raise typer.Exit(2)


def _check_dataset(env: str | None, dataset: str | None) -> None:
    """Load `--dataset` before anything starts, for the code_sandbox env (the env that reads
    it): a missing, empty, corrupt or malformed file is a one-line error and exit 2; reference
    solutions that fail the static check (compile + entry point) are reported, count and ids."""
    if not dataset:
        return

    try:
        if resolve_env_id(env or "code_sandbox") != resolve_env_id("code_sandbox"):
            return  # another env's dataset format: that env checks it
    except (ValueError, ImportError, AttributeError):
        return  # reported by the env check
    from agentrl_envs.code_datasets import load_dataset, reference_problems

    try:
        tasks = load_dataset(dataset)
    except (ValueError, OSError) as e:  # FileNotFoundError, PermissionError are OSErrors
        _fail(f"--dataset: {e}")
    bad = reference_problems(tasks)
    if bad:
        shown = ", ".join(bad[:10]) + (", ..." if len(bad) > 10 else "")
        console.print(f"[yellow]{escape(f'dataset {dataset}: {len(bad)} of {len(tasks)} reference solutions fail the static check (compile + define the entry point; tests not run): {shown}')}[/yellow]")


@app.command()
def train(
    overrides: Annotated[Optional[list[str]], typer.Argument(help="Config overrides key=value, e.g. train.lr=1e-4 algo.group_size=4.")] = None,
    env: Annotated[Optional[str], typer.Option(help="Environment: short name, Gymnasium id, or pkg.module:Class.", show_default=_DEFAULT.env.name)] = None,
    algo: Annotated[Optional[str], typer.Option(help="Algorithm: grpo, dr_grpo, gspo, rloo, reinforce_pp, ppo, dpo, cispo, gigpo, distill (docs/algorithms.md).", show_default=_DEFAULT.algo.name)] = None,
    config: Annotated[Optional[str], typer.Option("--config", "-c", help="YAML file of config overrides.")] = None,
    steps: Annotated[Optional[int], typer.Option(help="Training steps (train.steps).", show_default=str(_DEFAULT.train.steps))] = None,
    out: Annotated[Optional[str], typer.Option(help="Output directory.", show_default=_DEFAULT.out)] = None,
    seed: Annotated[Optional[int], typer.Option(help="Seed.", show_default=str(_DEFAULT.seed))] = None,
    resume: Annotated[Optional[str], typer.Option(help="Resume from this output directory.")] = None,
    dataset: Annotated[Optional[str], typer.Option(help="Task file (HumanEval/MBPP/EvalPlus format) or 'humaneval'; with --algo dpo, a preference JSONL file ({prompt, chosen, rejected} per line) trains offline DPO.", show_default="the env's own tasks")] = None,
    model: Annotated[Optional[str], typer.Option(help="Local Hugging Face model directory (model.path).", show_default="the embedded tiny model, built in OUT/base_model (OUT/base_vlm with model.vision)")] = None,
    wrap: Annotated[Optional[list[str]], typer.Option(help="Reward wrapper to stack (repeatable): judge, classifier, safety, curiosity.")] = None,
    ray_address: Annotated[Optional[str], typer.Option(help="Ray cluster to join (rollout.ray_address).")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress output.")] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace the earlier run in --out (its files only).")] = False,
    imports: Annotated[Optional[list[str]], typer.Option("--import", help="Python module to import first, so that its register_env calls run (repeatable): --import my_envs for ./my_envs.py.")] = None,
    agent: Annotated[Optional[str], typer.Option(help="Your agent as the env: MODULE:FUNCTION, `async def FUNCTION(client, task) -> reward` with an openai.AsyncOpenAI client on the gateway; tasks from --dataset tasks.jsonl (docs/agents.md).")] = None,
) -> None:
    """Train an agent: `agentrl train --env code_sandbox --algo grpo`. Every config key is an
    override (`agentrl config --reference`); with none, the main job: the embedded model,
    warm start, then GRPO on code_sandbox."""
    if agent:
        env, overrides = _agent_overrides(agent, env, overrides, warm_start=True)
    if resume and not (Path(resume).is_dir() and (Path(resume) / "config.json").is_file()):
        _fail(f"--resume: {resume} is not a run directory (no config.json)")
    saved = Path(resume) / "config.json" if resume else None
    base = json.loads(saved.read_text()) if saved is not None and saved.exists() else None
    flags = {"env.name": env, "algo.name": algo, "train.steps": steps, "out": out, "seed": seed,
             "resume": resume, "env.dataset": dataset, "model.path": model,
             "env.wrappers": list(wrap) if wrap else None, "quiet": quiet or None,
             "rollout.ray_address": ray_address, "overwrite": overwrite or None}
    try:  # resume: the run's saved config, then this command's options on top
        cfg = load_config(config, overrides, base=base, flag_names=TRAIN_FLAGS, **flags)
    except ConfigError as e:
        _fail(str(e))
    if resume:  # an unisolated sandbox only when this command line asks (never config.json alone)
        from agentrl.startup import (
            ResumeError,
            asked_settings,
            check_resume_edits,
            check_resume_isolation,
        )

        try:
            asked = asked_settings(config, overrides)
            check_resume_isolation(cfg, asked)
            for key, value in flags.items():  # the options given: this command line's too
                if value is not None:
                    _set_dotted(asked, key, value)
            check_resume_edits(Path(resume), base or {}, asked)  # config.json edited by hand: refused
        except (ResumeError, ConfigError) as e:
            _fail(str(e))
    if imports:  # added to the imports of the config (a resumed run's included)
        cfg = cfg.model_copy(update={"env": cfg.env.model_copy(
            update={"imports": list(dict.fromkeys([*cfg.env.imports, *imports]))})})
    from agentrl.offline import is_preference_file

    prefs = dataset or (cfg.env.dataset if resume else None)  # a resumed run's: its saved config's
    if cfg.algo.name == "dpo" and prefs and is_preference_file(prefs):
        if resume:  # offline DPO saves no resumable state: refused, not run as an env dataset
            _fail(f"--resume: offline DPO from a preference file ({prefs}) has no resume; start it "
                  "again with --overwrite (or another --out)")
        _offline("dpo", cfg, prefs)  # offline DPO from the preference file: no env
        return

    try:
        import_env_modules(cfg.env.imports)
    except ImportError as e:  # the message names the module (--import / env.imports)
        _fail(f"import error: {e}")
    try:
        env_id = resolve_env_id(cfg.env.name)
    except (ValueError, ImportError, AttributeError) as e:
        _fail(f"config error: env.name: {e}")
    branch_err = branch_turns_error(cfg, registered_turn_limit(env_id))  # its registered limit
    if branch_err:
        _fail(f"config error: {branch_err}")
    _check_dataset(cfg.env.name, cfg.env.dataset)
    from agentrl.learner.optim import NonFiniteGradientError
    from agentrl.startup import check_learner_device

    try:  # the in-process learner's device here; learner ranks check their own
        check_learner_device(cfg)
    except ValueError as e:
        _fail(str(e))
    from agentrl.learner.group import PlacementError
    from agentrl.startup import OutError, ResumeError
    from agentrl.train import DeadRewardError
    from agentrl.train import train as run_train

    try:
        run_train(cfg, console=console)
    except RunInterrupted as e:  # exit 130 for Ctrl-C, 143 for SIGTERM (128 + the signal)
        console.print(f"[yellow]{escape(str(e))}[/yellow]")
        raise typer.Exit(e.exit_code) from None
    except KeyboardInterrupt as e:  # before the RL loop, or a second Ctrl-C: no save of its own
        from agentrl.learner.checkpoints import latest_checkpoint

        run = cfg.resume or cfg.out
        ck = latest_checkpoint(run)
        hint = (f"the newest checkpoint is {ck}: continue with --resume {run}" if ck is not None else
                f"no step was saved: start again with --overwrite (or another --out than {run})")
        console.print(f"[yellow]stopped: {escape(hint)}[/yellow]")
        raise typer.Exit(getattr(e, "exit_code", 130)) from None
    except (NonFiniteGradientError, DeadRewardError) as e:
        _fail(f"stopped: {e}")
    except (OutError, ResumeError, PlacementError, ConfigError) as e:
        _fail(str(e))
    except BackendError as e:  # no isolated sandbox on this machine: say how to get one
        _fail(f"sandbox: {e}")


def _agent_overrides(agent: str, env: str | None, overrides: list[str] | None, *,
                     warm_start: bool = False) -> tuple[str, list[str]]:
    """`--agent MODULE:FUNCTION`: the env `agent` with `env.kwargs.agent`, and no warm start
    unless `sft.steps` is given (an agent's tasks have no reference answers)."""
    if env not in (None, "agent", "agentrl/Agent-v0"):
        _fail(f"--agent runs your agent as the env: drop --env {env}")
    ov = list(overrides or [])
    if warm_start and not any(o.partition("=")[0].strip() == "sft.steps" for o in ov):
        ov.append("sft.steps=0")
    return "agent", [*ov, f"env.kwargs.agent={json.dumps(agent)}"]


def _offline(stage: str, cfg: Any, dataset: str) -> None:
    from agentrl.offline import dpo_from_file, sft_from_file

    run = dpo_from_file if stage == "dpo" else sft_from_file
    try:
        summary = run(cfg, dataset, say=lambda m: console.print(m, markup=False, highlight=False))
    except (FileNotFoundError, ValueError) as e:
        _fail(str(e))
    console.print(json.dumps(summary), markup=False, highlight=False, soft_wrap=True)  # one line: parseable


@app.command()
def sft(
    dataset: Annotated[str, typer.Option(help="Conversations JSONL: {\"messages\": [{role, content}, ...]} per line; every assistant message is trained on.")],
    overrides: Annotated[Optional[list[str]], typer.Argument(help="Config overrides key=value, e.g. sft.lr=1e-4 sft.batch_size=8.")] = None,
    model: Annotated[Optional[str], typer.Option(help="Local Hugging Face model directory (model.path); default: the embedded tiny model.")] = None,
    steps: Annotated[Optional[int], typer.Option(help="Optimizer steps (sft.steps).")] = None,
    out: Annotated[Optional[str], typer.Option(help="Output directory (the model goes to OUT/model).")] = None,
    seed: Annotated[Optional[int], typer.Option(help="Seed.")] = None,
    config: Annotated[Optional[str], typer.Option("--config", "-c", help="YAML file of config overrides.")] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace the earlier run in --out (its files only).")] = False,
) -> None:
    """Supervised fine-tuning from a file of conversations: `agentrl sft --dataset convs.jsonl`."""
    try:
        cfg = load_config(config, overrides, flag_names=TRAIN_FLAGS, **{
            "model.path": model, "sft.steps": steps, "out": out, "seed": seed,
            "overwrite": overwrite or None})
    except ConfigError as e:
        _fail(str(e))
    _offline("sft", cfg, dataset)


@app.command("eval")
def eval_cmd(
    overrides: Annotated[Optional[list[str]], typer.Argument(help="Config overrides key=value.")] = None,
    env: Annotated[Optional[str], typer.Option(help="Env: short name, Gymnasium id, or pkg.module:Class (default: the run's, else code_sandbox).")] = None,
    model: Annotated[Optional[str], typer.Option(help="Model dir, OUT/checkpoints/step_N, training output dir, 'default', or 'reference'.")] = None,
    dataset: Annotated[Optional[str], typer.Option(help="Task file or 'humaneval'.")] = None,
    split: Annotated[Optional[str], typer.Option(help="train | heldout | all, for envs with splits (default: all with --dataset, else heldout).")] = None,
    samples: Annotated[Optional[int], typer.Option(min=1, help="Episodes per task (n; default train.eval_samples, 4).")] = None,
    k: Annotated[Optional[str], typer.Option(help="pass@k values, comma-separated, each <= samples (default 1 and samples).")] = None,
    temperature: Annotated[Optional[float], typer.Option(min=0.0, help="0 = greedy. Default: rollout.temperature of the run's config; greedy for a bare model with --samples 1.")] = None,
    out: Annotated[Optional[str], typer.Option(help="Output dir (default eval_runs/<env>_<model>_<time>).")] = None,
    seed: Annotated[Optional[int], typer.Option(help="Sampler seed (reproducible).")] = None,
    compare: Annotated[Optional[tuple[str, str]], typer.Option(help="--compare A B: difference per metric and per task.")] = None,
    max_tasks: Annotated[Optional[int], typer.Option("--max-tasks", "--tasks", min=1, help="Evaluate only the first N tasks (default: all of --dataset, else train.eval_tasks, 256: the run's own held-out evaluation).")] = None,
    max_turns: Annotated[Optional[int], typer.Option(min=1, help="Turn limit per episode.")] = None,
    workers: Annotated[Optional[int], typer.Option(min=0, help="Ray rollout workers; 0 = in-process.")] = None,
    batch_size: Annotated[Optional[int], typer.Option(min=1, help="Episodes per generate call (default train.eval_batch_size).")] = None,
    env_threads: Annotated[Optional[int], typer.Option(min=1, help="Threads stepping envs.")] = None,
    max_tokens: Annotated[Optional[int], typer.Option(min=1, help="Tokens per turn.")] = None,
    max_episode_tokens: Annotated[Optional[int], typer.Option(min=16, help="Tokens per episode.")] = None,
    top_p: Annotated[Optional[float], typer.Option(help="Nucleus sampling mass.")] = None,
    config: Annotated[Optional[str], typer.Option("--config", "-c", help="YAML file of config overrides.")] = None,
    imports: Annotated[Optional[list[str]], typer.Option("--import", help="Python module to import first, so that its register_env calls run (repeatable): --import my_envs for ./my_envs.py.")] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace the earlier evaluation in --out (its files only).")] = False,
    agent: Annotated[Optional[str], typer.Option(help="Evaluate your agent (MODULE:FUNCTION, docs/agents.md) on --dataset's held-out tasks (--split).")] = None,
) -> None:
    """Evaluate a model: pass@k, rewards, turns, tokens, verdicts -> OUT/results.jsonl, summary.json, summary.md."""
    from agentrl.eval.cli import eval_command

    if agent:
        env, overrides = _agent_overrides(agent, env, overrides)

    if not compare:
        _check_dataset(env, dataset)
    try:
        eval_command(env=env, model=model, dataset=dataset, split=split, samples=samples, k=k,
                     temperature=temperature, out=out, seed=seed, compare=compare, max_tasks=max_tasks,
                     max_turns=max_turns, workers=workers, batch_size=batch_size, env_threads=env_threads,
                     max_tokens=max_tokens, max_episode_tokens=max_episode_tokens, top_p=top_p,
                     config=config, overrides=overrides, console=console, imports=imports,
                     overwrite=overwrite)
    except ImportError as e:  # an --import / env.imports module (named in the message)
        _fail(f"import error: {e}")
    except (ValueError, FileNotFoundError, LookupError, ConfigError) as e:
        _fail(str(e))


@app.command("serve")
def serve_cmd(
    model: Annotated[str, typer.Option(help="Model directory, checkpoint OUT/checkpoints/step_N, or training output dir.")],
    port: Annotated[int, typer.Option(help="Port on 127.0.0.1 (0: a free one).")] = 8000,
    api_key: Annotated[Optional[str], typer.Option(help="Key requests must carry (default: none needed).")] = None,
    tool_parser: Annotated[str, typer.Option(help="The model's tool-call format: auto (read from the model's tokenizer, as rollout.tool_parser=auto) or hermes, llama3_json, mistral, openai.")] = "auto",
    max_tokens: Annotated[int, typer.Option(min=1, help="Most new tokens per call.")] = 1024,
    max_context: Annotated[int, typer.Option(min=16, help="Most tokens of a prompt and its completion.")] = 4096,
    chat_template_kwargs: Annotated[Optional[str], typer.Option(help="The chat template's variables, a JSON object, e.g. '{\"enable_thinking\": false}' (default: a training run's own rollout.chat_template_kwargs, else none).")] = None,
) -> None:
    """Serve a model through the gateway's OpenAI-compatible /v1/chat/completions on 127.0.0.1
    (model name "policy"), to try an agent before and after training (docs/agents.md)."""
    import json
    import time

    import transformers

    from agentrl.gateway.serve import start
    from agentrl.rollout.chat import NO_TOOLS_NOTE, renders_tools

    transformers.utils.logging.disable_progress_bar()  # a failure is then one line
    kwargs = None
    if chat_template_kwargs is not None:
        try:
            kwargs = json.loads(chat_template_kwargs)
        except ValueError:
            kwargs = None
        if not isinstance(kwargs, dict):
            _fail(f"serve: --chat-template-kwargs must be a JSON object, got {chat_template_kwargs!r}")
    try:
        served = start(model, port=port, api_key=api_key, tool_parser=tool_parser,
                       max_tokens=max_tokens, max_context=max_context, template_kwargs=kwargs)
    except (FileNotFoundError, ValueError, OSError) as e:
        _fail(f"serve: {e}")
    if Path(served.model_dir) != Path(model).expanduser():  # a run folder: say which checkpoint
        console.print(f"{model} is a training run's folder: its newest checkpoint {served.model_dir}",
                      markup=False, highlight=False, soft_wrap=True)
    fixed = served.session.renderer.template_kwargs
    console.print(f"serving {escape(model)} at {served.url} (model \"policy\", tool-call format "
                  f"{served.tool_parser}: {served.tool_parser_why}"
                  + (f"; chat template variables {json.dumps(fixed)}" if fixed else "")
                  + "); Ctrl-C stops", markup=False)
    if not renders_tools(served.session.renderer):
        console.print(NO_TOOLS_NOTE, markup=False, highlight=False, soft_wrap=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        served.close()


@app.command("serve-judge")
def serve_judge_cmd(
    model: Annotated[str, typer.Option(help="Local Hugging Face model directory.")],
    port: Annotated[int, typer.Option(help="Port on 127.0.0.1.")] = 8000,
    host: Annotated[str, typer.Option(help="Host to bind (loopback by default).")] = "127.0.0.1",
) -> None:
    """Serve a local transformers model as an OpenAI-compatible chat-completions judge."""
    from agentrl.rewards.serve_judge import main as serve

    serve(model, port=port, host=host)


@app.command("serve-corpus")
def serve_corpus_cmd(
    path: Annotated[str, typer.Argument(help="Directory of .txt/.md files or a JSONL of documents.")],
    port: Annotated[int, typer.Option(help="Port.")] = 8765,
    host: Annotated[str, typer.Option(help="Host to bind (loopback by default).")] = "127.0.0.1",
) -> None:
    """Serve a document corpus over HTTP for the web_qa env's fetch tool."""
    serve(path, host=host, port=port)


@app.command()
def envs(
    imports: Annotated[Optional[list[str]], typer.Option("--import", help="Python module to import first, so that its register_env calls run (repeatable).")] = None,
) -> None:
    """List the registered environments, one line each (built in, installed packages' `agentrl.envs` entry points, and --import modules)."""
    import gymnasium as gym


    try:
        load_env_plugins()
        import_env_modules(list(imports or []))
    except ImportError as e:
        _fail(f"import error: {e}")

    short = {v: k for k, v in SHORT_NAMES.items()}
    for env_id in sorted(i for i in gym.registry if i in DESCRIPTIONS):
        console.print(f"{short.get(env_id, ''):14s} {env_id:28s} {DESCRIPTIONS[env_id]}", markup=False, highlight=False, soft_wrap=True)


@app.command("config")
def config_cmd(
    overrides: Annotated[Optional[list[str]], typer.Argument(help="Overrides key=value.")] = None,
    config: Annotated[Optional[str], typer.Option("--config", "-c", help="YAML file.")] = None,
    reference: Annotated[bool, typer.Option(help="Print the config reference (Markdown).")] = False,
    algo: Annotated[Optional[str], typer.Option(help="Algorithm (algo.name): its keys only in the reference, or the config of a run with it.")] = None,
) -> None:
    """Print the resolved config, the env- and policy-dependent defaults filled in as a run
    resolves them (`agentrl.run`), or the reference of every key (`--algo NAME`: of that
    algorithm's `algo` keys only)."""
    try:
        if reference:
            print(config_reference(algo))
            return
        cfg = load_config(config, overrides, **{"algo.name": algo})
        from agentrl.run import resolve_run_defaults

        import_env_modules(cfg.env.imports)
        cfg = resolve_run_defaults(cfg)
    except (ConfigError, ValueError, ImportError, AttributeError) as e:
        _fail(str(e))
    import yaml

    print(yaml.safe_dump(cfg.model_dump(), sort_keys=False))


@app.command()
def plot(
    runs: Annotated[list[str], typer.Argument(help="Run output directories (overlaid).")],
    out: Annotated[Optional[str], typer.Option(help="Where the PNGs go (default: FIRST_RUN/plots).")] = None,
) -> None:
    """Plot learning curves of one or more runs: `agentrl plot runs/a runs/b`."""
    try:
        paths = plot_runs(runs, out or str(Path(runs[0]) / "plots"))
    except (FileNotFoundError, ValueError, ModuleNotFoundError) as e:  # ModuleNotFoundError: no matplotlib
        _fail(str(e))
    for p in paths:
        console.print(str(p), markup=False, highlight=False)


@app.command()
def show(
    run: Annotated[str, typer.Argument(help="Run output directory.")],
    step: Annotated[Optional[int], typer.Option(help="Training step of the saved rollouts (default: the latest).")] = None,
    index: Annotated[int, typer.Option(help="Episode within the step (group-major).")] = 0,
    plain: Annotated[bool, typer.Option(help="No colour: trained tokens wrapped in ⟦ ⟧.")] = False,
) -> None:
    """Print a saved episode with roles, rewards, verdicts and the loss mask visible."""
    try:
        show_episode(run, step, index, Console(no_color=plain, highlight=False), plain=plain)
    except (FileNotFoundError, IndexError) as e:
        _fail(str(e))


@app.command()
def doctor(
    model: Annotated[Optional[str], typer.Option(help="A model directory (or a checkpoint, or a training run's folder: its newest checkpoint): report its chat template's properties (end of turn, history rewriting, tool format, turn-boundary merges, system role, vocabulary) instead of the machine's.")] = None,
) -> None:
    """What this machine has for agentrl: sandbox backend and isolation, torch/CUDA devices, Ray,
    vLLM, plotting/TensorBoard, installed extras, with the fix for each missing part. Exit code 1
    when a part a default run needs is missing. With --model DIR: what agentrl makes of that
    model's tokenizer and chat template (docs/models.md); exit 1 when it cannot use the template
    or cannot read the weights' safetensors headers."""
    if model is not None:
        _doctor_model(model)
        return
    checks = run_checks()
    for line in render(checks):
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    if any(c.status == "fail" for c in checks):
        raise typer.Exit(1)


def _doctor_model(path: str) -> None:
    import transformers

    from agentrl.learner.checkpoints import run_checkpoint
    from agentrl.rollout.model_doctor import (
        FATAL_VERDICTS,
        DoctorError,
        format_report,
        inspect_model,
    )

    transformers.utils.logging.set_verbosity_error()
    try:  # a training run's folder: its newest intact checkpoint, as serve / eval / train take it
        ck = run_checkpoint(path, on_skip=lambda c, why: console.print(f"skipping {c}: {why}", markup=False))
    except FileNotFoundError as e:
        _fail(f"--model {e}")
    if ck is not None:
        console.print(f"{path} is a training run's folder: its newest checkpoint {ck}", markup=False,
                      highlight=False, soft_wrap=True)
        path = str(ck)
    try:
        rep = inspect_model(path)
    except DoctorError as e:
        _fail(str(e))
    for line in format_report(rep):
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    if "renderer_error" in rep or rep["vocabulary"]["verdict"].startswith(FATAL_VERDICTS):
        raise typer.Exit(1)


@app.command()
def merge(
    checkpoint: Annotated[str, typer.Argument(help="A LoRA checkpoint directory (OUT/checkpoints/step_N).")],
    out: Annotated[str, typer.Argument(help="Where the merged Hugging Face model is written.")],
) -> None:
    """Merge a LoRA checkpoint's adapters into its base model (a plain model directory)."""
    import transformers

    from agentrl.learner.lora import merge_checkpoint

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    try:
        console.print(f"merged model: {merge_checkpoint(checkpoint, out)}", markup=False)
    except (FileNotFoundError, ValueError) as e:
        _fail(str(e))


# -- `agentrl config --reference`: the config reference (docs/config.md) ------------------------
def _rows(model: type[BaseModel], prefix: str, skip: tuple[str, ...] = (),
          keep: list[str] | None = None) -> list[str]:
    """Markdown table rows `| key | default | meaning |` of `model`'s fields (those in `keep`
    when given, without those in `skip`)."""
    rows = []
    for name, f in model.model_fields.items():
        if name in skip or (keep is not None and name not in keep):
            continue
        default = f.default_factory() if f.default_factory else f.default  # type: ignore[call-arg]
        shown = "required" if f.is_required() else f"`{default!r}`"
        rows.append(f"| `{prefix}{name}` | {shown} | {f.description or ''} |")
    return rows


def config_reference(algo: str | None = None) -> str:
    """The config reference as Markdown, generated from the field docstrings. The `algo` section
    is its keys shared by every algorithm and then each algorithm's own (`algo` given: only
    that algorithm's keys).

    Raises:
        ConfigError: `algo` is not an algorithm's name.
    """
    if algo is not None and algo not in ALGO_CONFIGS:
        raise ConfigError(f"config error: algo.name: unknown algorithm {algo!r}; allowed: "
                          f"{', '.join(ALGO_CONFIGS)}")
    lines = ["# Configuration reference", "",
             "Generated from `agentrl/config/__init__.py` and `agentrl/algos/configs.py` (`agentrl config "
             f"--reference{f' --algo {algo}' if algo else ''}`).", ""]

    def table(title: str, rows: list[str], intro: str = "") -> None:
        if rows:
            lines.extend([f"## {title}", "", *([intro, ""] if intro else []), "| key | default | meaning |",
                          "| --- | --- | --- |", *rows, ""])

    def algo_section() -> None:
        if algo is not None:
            cls = ALGO_CONFIGS[algo]
            table(f"algo (algo.name={algo})", _rows(cls, "algo."), cls.__doc__ or "")
            return
        table("algo", _rows(AlgoBase, "algo."), "Keys of every algorithm; `algo.name` picks the "
              "algorithm and with it the other keys allowed (below, or `agentrl config --reference "
              "--algo NAME`). A key the algorithm does not have is refused.")
        for name, cls in ALGO_CONFIGS.items():
            own = tuple(k for k, f in AlgoBase.model_fields.items() if cls.model_fields[k] == f)
            table(f"algo (algo.name={name})", _rows(cls, "algo.", skip=own), cls.__doc__ or "")

    def walk(model: type[BaseModel], prefix: str) -> None:
        plain = []
        for name, f in model.model_fields.items():
            if model is Config and name == "algo":
                algo_section()
            elif isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel):
                walk(f.annotation, f"{prefix}{name}.")
            else:
                plain.append(name)
        table(prefix.rstrip(".") or "top level", _rows(model, prefix, keep=plain))

    walk(Config, "")
    return "\n".join(lines)


def main() -> None:
    """Entry point of the `agentrl` script. The current folder goes on `sys.path` (as with
    `python -m`), so `--env my_envs:MyEnv` finds `./my_envs.py`, here and in rollout workers."""
    import os

    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (cwd, os.environ.get("PYTHONPATH")) if p)
    app(prog_name="agentrl")


if __name__ == "__main__":
    sys.exit(main())
