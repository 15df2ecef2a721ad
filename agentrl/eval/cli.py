"""`agentrl eval`: the command behind the CLI (plain function; `agentrl/cli.py` wires it into
typer). Builds the env exactly as training does (`agentrl.run.build_env` from a `Config`),
lists the tasks, loads the policy and runs `agentrl.eval.harness.run_eval`; or compares two
evaluation directories.

The policy (`model`):
- a local Hugging Face model directory (ours or any causal LM with a chat template);
- a training checkpoint `OUT/checkpoints/step_N`, or a training output dir `OUT` (its latest
  checkpoint). Then `OUT/config.json` (the training config) is the base config, so the env,
  dataset, turn limit and rollout caps are the ones the run trained with, unless overridden;
- `default` (or `tiny`): the embedded default model, built (random weights, tokenizer trained
  on the env's texts) in `OUT/base_model` exactly as `agentrl train` builds it (a baseline);
- `reference` (or `scripted`): the env's `reference_answer()` fed through the harness by a
  `ScriptedEngine` (see `agentrl.eval.reference`), with a tokenizer trained offline on the
  tasks' texts; `reference:DIR` uses the tokenizer of model directory DIR instead. The token
  caps are raised so that no reference answer is cut.

The arguments of `eval_command` (`agentrl eval --help` gives the same):

env: env name (short name, Gymnasium id or `pkg.module:Class`); default: the run
    config's, else `code_sandbox`.
model: see the module doc (required unless `compare`).
dataset: task file for envs that take one (`env.dataset`).
split: task split for envs that take one (`train`, `heldout`, `all`); default `all`
    when `dataset` is given (a benchmark file is evaluated whole), else `heldout`.
samples: episodes per task (N); default the config's `train.eval_samples` (4), or 1
    for the (deterministic) `reference` policy.
k: pass@k values, e.g. `"1,5,10"` (each <= samples); default 1 and `samples`.
temperature: sampling temperature (0 = greedy); default the config's
    `rollout.temperature` (a run's own, so its figures reproduce), except greedy for a
    bare model directory (no run config, no `config`) with one sample.
out: output directory (default `eval_runs/<env>_<model>_<time>`).
seed: sampler seed (default the config's `seed`); the same seed reproduces a run.
compare: two evaluation directories: print and return `report.compare(A, B)` instead.
max_tasks: evaluate at most this many tasks (the first ones of the env's task list);
    for envs without a task list, the number of seeded tasks `EVAL_SEED + i`. Default:
    every task of `dataset` when one is given, else the config's `train.eval_tasks`
    (256): with the other defaults, the run's own held-out evaluation
    (`agentrl.eval.harness.heldout_settings`), so `agentrl eval RUN` reproduces the
    figure the run printed.
max_turns: extra turn limit per episode (`env.max_turns`).
workers: Ray rollout workers (`agentrl.rollout.workers.RolloutPool`), each with its own
    engine and envs, sharing every batch; 0 or None: in this process (default
    `rollout.num_workers`). Not with `reference` (the scripted policy runs here). Envs
    made by Ray workers must be registered on import (built-in, or `pkg.module:Class`).
batch_size: episodes per batch (one generate call per turn for the whole batch); default
    the config's `train.eval_batch_size` (the sampler seeds are drawn per batch).
env_threads: threads stepping envs (sandbox runs) in parallel (default
    `rollout.env_threads`).
max_tokens: tokens per turn (default `rollout.max_tokens`).
max_episode_tokens: tokens per episode (default `rollout.max_episode_tokens`).
top_p: nucleus mass (default `rollout.top_p`).
config: YAML/JSON config file (default: the training run's config.json when `model` is
    a run or checkpoint).
overrides: `key=value` config overrides (e.g. `env.kwargs.reward=fraction`).
console: rich Console for tables and progress (None: a new one).
imports: modules to import before the env is looked up (`env.imports`, added to the
    config's), so that their `register_env` calls run.
overwrite: replace an earlier evaluation in `out` (`check_eval_out`); without it, an
    `out` that is not empty is refused before any work.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

from agentrl.config import ConfigError, load_config
from agentrl.env.registry import import_env_modules, resolve_env_id
from agentrl.eval.harness import check_k, run_eval
from agentrl.eval.reference import reference_setup
from agentrl.eval.report import compare, print_compare
from agentrl.eval.tasks import list_tasks
from agentrl.learner.checkpoints import intact, run_checkpoint
from agentrl.rollout.envs import _env_accepts, build_env
from agentrl.run import build, default_model_dir, quiet_libraries, resolve_run_defaults
from agentrl.startup_model import check_chat_template

REFERENCE_NAMES = ("reference", "scripted")
DEFAULT_NAMES = ("default", "tiny")


def parse_k(k: str | int | Sequence[int]) -> list[int]:
    """`"1,5,10"` (or an int, or a list) -> `[1, 5, 10]`.

    Raises:
        ValueError: a value that is not a positive integer, naming it.
    """
    if isinstance(k, int):
        items: list[Any] = [k]
    elif isinstance(k, str):
        items = [p.strip() for p in k.split(",") if p.strip()]
    else:
        items = list(k)
    out = []
    for v in items:
        try:
            iv = int(v)
        except (TypeError, ValueError):
            raise ValueError(f"k: {v!r} is not an integer (give e.g. --k 1,5,10)") from None
        if iv < 1:
            raise ValueError(f"k: {v!r} must be a positive integer (give e.g. --k 1,5,10)")
        out.append(iv)
    if not out:
        raise ValueError("k: give at least one k (e.g. --k 1)")
    return sorted(set(out))


def _is_hf_dir(p: Path) -> bool:
    import json

    cfg = p / "config.json"
    if not cfg.is_file():
        return False
    try:
        data = json.loads(cfg.read_text())
    except ValueError:
        return False
    return isinstance(data, dict) and ("model_type" in data or "architectures" in data)


def resolve_model(model: str) -> tuple[Path, Path | None]:
    """Find the model directory and the training config that goes with it.

    Args:
        model: a Hugging Face model directory, a checkpoint `OUT/checkpoints/step_N`, or a
            training output dir `OUT` (its newest intact checkpoint is used, each newer one
            that is not intact named on stderr; `agentrl.learner.checkpoints.intact`).

    Returns:
        `(model_dir, run_config)` where `run_config` is `OUT/config.json` of the training run
        when there is one, else None.

    Raises:
        FileNotFoundError: `model` is none of the above (the message says what was looked for),
            a run's checkpoint named itself is not intact, or a run has no intact checkpoint.
    """
    p = Path(model).expanduser()
    if not p.exists():
        raise FileNotFoundError(f"model: {model!r} does not exist (give a Hugging Face model directory, "
                                "a checkpoint OUT/checkpoints/step_N, a training output dir, or 'reference')")
    if _is_hf_dir(p):
        run = p.parent.parent if p.parent.name == "checkpoints" else None
        if run is not None and (why := intact(p)) is not None:  # a run's checkpoint, named itself
            raise FileNotFoundError(f"model: {p} is not an intact checkpoint: {why}")
        cfg = run / "config.json" if run is not None and (run / "config.json").is_file() else None
        return p, cfg
    try:
        ck = run_checkpoint(p, on_skip=lambda c, why: print(f"[eval] skipping {c}: {why}", file=sys.stderr))
    except FileNotFoundError as e:
        raise FileNotFoundError(f"model: {e}") from None
    if ck is not None:
        return ck, (p / "config.json") if (p / "config.json").is_file() else None
    raise FileNotFoundError(f"model: {p} is neither a Hugging Face model directory (config.json with "
                            "model_type) nor a training output dir with checkpoints/step_N")


EVAL_FLAGS = {"env.name": "--env", "env.dataset": "--dataset", "env.max_turns": "--max-turns",
              "rollout.num_workers": "--workers", "rollout.env_threads": "--env-threads",
              "rollout.max_tokens": "--max-tokens", "rollout.max_episode_tokens": "--max-episode-tokens",
              "rollout.top_p": "--top-p", "seed": "--seed"}
"""The options of `agentrl eval` by the config key they set (`load_config`'s conflict message)."""
EVAL_OUTPUTS = ("results.jsonl", "summary.json", "summary.md")
"""What `agentrl eval` writes in `--out` (`run_eval`)."""
EVAL_BUILT = ("base_model", "base_vlm")
"""The embedded model `--model default` builds in `--out` (`agentrl.run.default_model_dir`)."""


def check_eval_out(out: Path, *, overwrite: bool) -> list[Path]:
    """`--out` of an evaluation, checked before any work: absent or empty; an earlier
    evaluation there (`EVAL_OUTPUTS`, `EVAL_BUILT`) is replaced only with `overwrite`, as
    `agentrl train --overwrite` replaces a run.

    Returns:
        the paths an `overwrite` removes (to remove once the arguments are checked).

    Raises:
        ValueError: `out` is a file; it holds an earlier evaluation (without `overwrite`: the
            message says `--overwrite`); it holds files `agentrl eval` does not write (a
            training run, anything else: refused with or without `overwrite`).
    """
    if out.exists() and not out.is_dir():
        raise ValueError(f"out: {out} is a file, not a folder")
    items = sorted(out.iterdir()) if out.is_dir() else []
    foreign = [p.name for p in items if p.name not in EVAL_OUTPUTS + EVAL_BUILT]
    if foreign:
        raise ValueError(f"out: {out} holds files agentrl eval did not write ({', '.join(foreign[:6])}"
                         f"{', ...' if len(foreign) > 6 else ''}): choose another --out")
    if items and not overwrite:
        raise ValueError(f"out: {out} already holds an evaluation ({', '.join(p.name for p in items)}); "
                         "replace it with --overwrite, or choose another --out")
    return items


def _remove(paths: Sequence[Path]) -> None:
    import shutil

    for p in paths:
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink()


def _probe_env(cfg: Any, split_arg: str, split: str | None) -> Any:
    """The first env of the evaluation (`build_env(cfg, split_arg)`). With `--split` given
    (`split`), an env that takes no `split` keyword, or one that refuses this split's name,
    is a `--split` error.

    Raises:
        ValueError: `--split` on an env without splits (naming the env), or a split the env
            does not have (the env's own message lists its splits).
        ConfigError: the env cannot be made for another reason (naming the key).
    """
    if split is not None and not _env_accepts(cfg.env.name, "split"):
        raise ValueError(f"--split {split}: env {cfg.env.name} has no splits (its constructor takes "
                         "no split keyword): leave --split out")
    try:
        return build_env(cfg, split_arg)
    except ConfigError as e:
        if split is None:
            raise
        try:  # the env without the split: the split's fault when this one works
            build_env(cfg).close()
        except ConfigError:
            raise e from None
        made = e.__cause__ or e  # gymnasium's error, whose cause is the env's own
        cause = made.__cause__ or made
        raise ValueError(f"--split {split}: env {cfg.env.name} has no such split: {cause}") from None


def _default_out(env: str, model: str) -> str:
    name = Path(model.split(":", 1)[0]).name or "model"
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in f"{env}_{name}")
    return str(Path("eval_runs") / f"{safe}_{time.strftime('%Y%m%d-%H%M%S')}")


def eval_command(
    env: str | None = None,
    model: str | None = None,
    dataset: str | None = None,
    split: str | None = None,
    samples: int | None = None,
    k: str | int | Sequence[int] | None = None,
    temperature: float | None = None,
    out: str | None = None,
    seed: int | None = None,
    compare: Sequence[str] | None = None,
    max_tasks: int | None = None,
    max_turns: int | None = None,
    workers: int | None = None,
    *,
    batch_size: int | None = None,
    env_threads: int | None = None,
    max_tokens: int | None = None,
    max_episode_tokens: int | None = None,
    top_p: float | None = None,
    config: str | None = None,
    overrides: Sequence[str] | None = None,
    console: Any = None,
    imports: Sequence[str] | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Run `agentrl eval` (or `agentrl eval --compare A B`); the arguments are described in the
    module docstring. The steps: the config (`_eval_config`), the checks of `out`, the env
    modules and defaults (`_prepare`), the tasks, the policy and its engine (`_policy`:
    `agentrl.run.build`), then `agentrl.eval.harness.run_eval`.

    Returns:
        The summary dict (see `agentrl.eval.harness.run_eval`), or the comparison dict.

    Raises:
        ValueError: bad arguments or config (naming the key), unknown env, a `split` the env
            does not have, k > samples, an `out` that is not empty (`check_eval_out`).
        FileNotFoundError: model, dataset or comparison directory not found.
    """
    from rich.console import Console


    console = console or Console()
    if compare:
        return _compare(compare, console)
    if not model:
        raise ValueError("model: give a model directory, a checkpoint, a training output dir, or 'reference'")
    if k is not None:
        parse_k(k)  # a malformed k fails before any work
    scripted, builtin = (model.split(":", 1)[0].lower() in names for names in (REFERENCE_NAMES, DEFAULT_NAMES))
    model_dir, run_cfg = (None, None) if scripted or builtin else resolve_model(model)
    base = config or (str(run_cfg) if run_cfg is not None else None)
    cfg = _eval_config(base, overrides, imports, {
        "env.name": env, "env.dataset": dataset, "env.max_turns": max_turns,
        "rollout.num_workers": workers, "rollout.env_threads": env_threads,
        "rollout.max_tokens": max_tokens, "rollout.max_episode_tokens": max_episode_tokens,
        "rollout.top_p": top_p, "seed": seed})
    if scripted and workers:
        raise ValueError("workers: the reference policy runs in this process; use workers=0")
    samples = samples or (1 if scripted else cfg.train.eval_samples)  # the reference is deterministic
    ks = check_k(parse_k(k) if k is not None else [1, samples], samples)
    if max_tasks is None and not dataset:
        max_tasks = cfg.train.eval_tasks  # the run's own held-out list
    out_dir = out or _default_out(cfg.env.name, model)
    replaced = check_eval_out(Path(out_dir), overwrite=overwrite)
    cfg = _prepare(cfg, builtin)
    split_arg = split or ("all" if dataset else "heldout")
    probe = _probe_env(cfg, split_arg, split)
    if model_dir is not None:  # a tokenizer without a usable chat template: one line, nothing written
        check_chat_template(cfg, model_dir, "--model")
    _remove(replaced)  # --overwrite: the earlier evaluation, once the arguments are checked
    if builtin:  # the embedded model, built as a run builds it
        model_dir = Path(default_model_dir(cfg, Path(out_dir)))
    tasks, task_source = list_tasks(probe, max_tasks, default_n=cfg.train.eval_tasks)
    # a run's config (its own or -c): its sampling temperature, as the run evaluated; a bare
    # model with one sample: greedy
    temp = temperature if temperature is not None else (
        cfg.rollout.temperature if base is not None or samples > 1 else 0.0)
    engine, renderer, rollout, label, mt, met = _policy(cfg, model, model_dir, split_arg, tasks)
    pool = engine if hasattr(engine, "run") else None  # a RolloutPool
    meta = {"env": cfg.env.name, "model": label, "dataset": cfg.env.dataset, "split": split_arg,
            "tasks_from": task_source, "max_turns": cfg.env.max_turns,
            "env_kwargs": dict(cfg.env.kwargs) or None, "wrappers": list(cfg.env.wrappers) or None,
            "task_notes": task_notes(probe)}
    console.print(f"[eval] {cfg.env.name}: {len(tasks)} tasks ({task_source}) x {samples} samples, "
                  f"k={ks}, T={temp}, model {label} -> {out_dir}"
                  + (f"; {meta['task_notes']}" if meta["task_notes"] else ""), markup=False, highlight=False)
    meta.update({"engine": "scripted" if scripted else cfg.rollout.engine,
                 "workers": cfg.rollout.num_workers if pool is not None else 0})
    try:
        return run_eval(None if pool is not None else engine, renderer, partial(build_env, cfg, split_arg), tasks,
                        samples=samples, k_list=ks, temperature=temp, top_p=cfg.rollout.top_p, max_tokens=mt,
                        seed=cfg.seed, out_dir=out_dir, max_episode_tokens=met,
                        batch_size=batch_size or cfg.train.eval_batch_size,
                        env_threads=cfg.rollout.env_threads, meta=meta, console=console, rollout=rollout,
                        step_timeout_s=cfg.env.step_timeout_s, reset_timeout_s=cfg.env.reset_timeout_s)
    finally:
        if pool is not None:
            pool.shutdown()


def task_notes(env: Any) -> str | None:
    """The evaluated env's notes on its task list (`startup_notes()`, e.g. code_sandbox's
    reward-hacking guard: `trivial: 3 of 378 all tasks flagged`), joined with `; `, for the
    `[eval]` line and `meta["task_notes"]` (summary.json, summary.md); None without any."""
    notes = getattr(getattr(env, "unwrapped", env), "startup_notes", None)
    text = "; ".join(str(n) for n in notes()) if callable(notes) else ""
    return text or None


def _compare(dirs: Sequence[str], console: Any) -> dict[str, Any]:
    """`agentrl eval --compare A B`: print and return `agentrl.eval.report.compare(A, B)`.

    Raises:
        ValueError: not exactly two directories.
    """
    if len(dirs) != 2:
        raise ValueError(f"compare: give exactly two evaluation directories, got {len(dirs)}")
    result = compare(dirs[0], dirs[1])
    print_compare(result, console)
    return result


def _eval_config(base: str | None, overrides: Sequence[str] | None, imports: Sequence[str] | None,
                 flags: dict[str, Any]) -> Any:
    """The evaluation's `Config`: the file `base` (a run's config.json, or `--config`), the
    `overrides` and the options `flags` (by config key), with `imports` added to `env.imports`.

    Raises:
        ValueError: a bad config or a conflict between an option and an override (naming both).
    """
    try:
        cfg = load_config(base, list(overrides or []), flag_names=EVAL_FLAGS, **flags)
        if imports:
            cfg = cfg.model_copy(update={"env": cfg.env.model_copy(
                update={"imports": list(dict.fromkeys([*cfg.env.imports, *imports]))})})
    except ConfigError as e:
        raise ValueError(str(e)) from None
    return cfg


def _prepare(cfg: Any, builtin: bool) -> Any:
    """Once the arguments are valid: the env modules imported (ImportError naming the module),
    the env looked up (ValueError naming the registered envs), the run's defaults for the
    embedded model (`builtin`: the VLM for an env that observes images), quiet libraries and
    `rollout.torch_threads` threads. Returns the config to evaluate with."""
    import torch


    import_env_modules(cfg.env.imports)
    resolve_env_id(cfg.env.name)
    if builtin:  # the embedded model a run would build
        cfg = resolve_run_defaults(cfg)
    quiet_libraries()
    torch.set_num_threads(cfg.rollout.torch_threads)
    return cfg


def _policy(cfg: Any, model: str, model_dir: Path | None, split: str,
            tasks: list[Any]) -> tuple[Any, Any, Any, str, int, int]:
    """The evaluated policy: `reference` (`agentrl.eval.reference.reference_setup`, its token
    caps raised so that no answer is cut), else the engine and renderer of `model_dir` from
    `agentrl.run.build` (a `RolloutPool` with `rollout.num_workers > 0`).

    Returns:
        `(engine, renderer, rollout, label, max_tokens, max_episode_tokens)`: `rollout` runs
        batches on the pool's workers (None in process).
    """
    mt, met = cfg.rollout.max_tokens, cfg.rollout.max_episode_tokens
    name = model.split(":", 1)[0].lower()
    if name in REFERENCE_NAMES:
        tok_dir = model.split(":", 1)[1] if ":" in model else None
        engine, renderer, answer_cap, episode_cap = reference_setup(
            partial(build_env, cfg, split), tasks, tokenizer_dir=tok_dir, vocab_size=cfg.model.vocab_size)
        return (engine, renderer, None, "reference" + (f" (tokenizer {tok_dir})" if tok_dir else ""),
                max(mt, answer_cap), max(met, episode_cap))
    run = build(cfg, model_dir=model_dir)
    pool = run.engine if hasattr(run.engine, "run") else None

    def rollout(specs: list[Any], params: Any, s: int | None) -> list[Any]:
        return pool.run(specs, params, s, split=split, one_per_run=True)

    return run.engine, run.renderer, rollout if pool is not None else None, str(model_dir), mt, met
