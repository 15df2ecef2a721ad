"""The evaluation harness: N episodes per task through the same agent loop and envs as training,
written to `results.jsonl`, summarised (pass@k, rewards, turns, tokens, finish reasons, sandbox
verdicts, errors) into `summary.json` / `summary.md`, and printed as a table.

    tasks (reset kwargs) x samples  ->  batches of episodes  ->  run_episodes (one generate call
    per turn for the whole batch; envs step in a thread pool)  ->  one row per episode  ->  summary

Reproducibility: the sampler seed of batch b is derived from `(seed, b)`
(`numpy.random.SeedSequence`), and `run_episodes` uses `batch_seed + turn` for turn `turn`, so
the same engine, tasks, samples, batch size and seed give the same episodes. Changing the batch
size changes which rows share a generate call, hence the draws.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from agentrl.eval.episodes import episode_success, extrinsic_return
from agentrl.eval.report import print_summary, summarize, summary_markdown
from agentrl.eval.tasks import list_tasks
from agentrl.infra.jsonl import jsonable
from agentrl.log.progress import Reporter
from agentrl.rollout.agent_loop import EpisodeSpec, run_episodes
from agentrl.rollout.chat import ChatRenderer
from agentrl.rollout.engines.base import Engine, SamplingParams
from agentrl.rollout.envs import build_env
from agentrl.types import Trajectory, episode_errors, json_message

REPAIR_KEYS = ("first_attempt_pass@1", "first_attempt_pass@1_se", "repair_rate", "repair_rate_se",
               "attempts_mean", "independent_pass", "independent_pass_se", "feedback_gain", "feedback_gain_se",
               "independent_repair_rate")
"""The repair metrics (`agentrl.eval.attempts`) a multi-turn evaluation logs under `eval/`."""


def batch_seed(seed: int, batch_index: int) -> int:
    """The sampler seed of batch `batch_index` of a run with `seed` (a 32-bit int)."""
    return int(np.random.SeedSequence([int(seed), int(batch_index)]).generate_state(1)[0])


def task_label(reset_kwargs: dict[str, Any]) -> str:
    """A readable task id from reset kwargs, for envs whose reset info has no `task_id`:
    `seed=10000003`, or the options as compact JSON."""
    parts = []
    if reset_kwargs.get("seed") is not None:
        parts.append(f"seed={reset_kwargs['seed']}")
    if reset_kwargs.get("options"):
        parts.append(json.dumps(reset_kwargs["options"], sort_keys=True, default=str,
                                separators=(",", ":"))[:120])
    return " ".join(parts) or "task"


def _end_reason(tr: Trajectory) -> str:
    if tr.info.get("env_timeout"):
        return f"{tr.info['env_timeout']}_timeout"  # reset_timeout | step_timeout
    if tr.info.get("agent_error"):  # the user's agent failed (`agentrl.gateway.agents`)
        return "agent_error"
    if not tr.turns and "error" in tr.info:
        return "reset_error"
    if tr.turns and tr.turns[-1].info.get("env_exception"):
        return "env_error"
    if tr.terminated:  # the task ended (a turn limit reached on the same step does not matter)
        return "terminated"
    if tr.info.get("truncated_by") == "max_episode_tokens":
        return "max_episode_tokens"
    return "truncated" if tr.truncated else "unfinished"


def _num(x: float) -> float | None:
    return None if x != x else float(x)  # NaN -> None (JSON has no NaN)


def episode_row(tr: Trajectory, task_index: int, sample: int, reset_kwargs: dict[str, Any]) -> dict[str, Any]:
    """One `results.jsonl` row for an episode.

    Fields: `task_index`, `task_id` (the env's reset `info["task_id"]`, else `task_label`),
    `sample` (0..N-1), `reset_kwargs`, `success` (`agentrl.eval.episodes.episode_success`), `reward`
    (extrinsic return, `agentrl.eval.episodes.extrinsic_return`; None when NaN), `return` (sum of all
    turn rewards, bonuses included; None when NaN), `verdict` (last turn's `info["verdict"]` or
    None), `turns`, `tokens` (sampled tokens), `total_tokens` (all tokens), `finish_reasons`
    (sampler finish reason per turn), `end` (see `agentrl.eval.report`), `errors` (the
    messages of every `info["error"]` recorded, `agentrl.types.episode_errors`: env
    exceptions, tool-call errors, the code env's failure reasons, a failed reset, the user's
    agent's failure),
    `turn_rewards`, `turn_verdicts`, `seconds` (generate + env time attributed to the episode),
    `policy_version`, `messages` (the full transcript; an image part's image is the text
    `<image HxW>`, `agentrl.types.json_message`).
    """
    errors = episode_errors(tr)
    last = tr.turns[-1].info if tr.turns else {}
    return {
        "task_index": task_index,
        "task_id": tr.task_id or task_label(reset_kwargs),
        "sample": sample,
        "reset_kwargs": reset_kwargs,
        "success": bool(episode_success(tr)),
        "reward": _num(extrinsic_return(tr)),
        "return": _num(tr.episode_return),
        "verdict": last.get("verdict"),
        "turns": len(tr.turns),
        "tokens": tr.num_sampled,
        "total_tokens": len(tr.token_ids),
        "finish_reasons": [t.finish_reason for t in tr.turns],
        "end": _end_reason(tr),
        "errors": [str(e) for e in errors],
        "turn_rewards": [_num(t.reward) for t in tr.turns],
        "turn_verdicts": [t.info.get("verdict") for t in tr.turns],
        "seconds": float(sum(tr.timings.values())),
        "policy_version": tr.policy_version,
        "messages": [json_message(m) for m in tr.messages],
    }


def _unique_task_ids(rows: list[dict[str, Any]]) -> None:
    """Give every task index one task id (its first row's), made unique with `#index`."""
    first: dict[int, str] = {}
    for r in rows:
        first.setdefault(r["task_index"], r["task_id"])
    count: dict[str, int] = {}
    for tid in first.values():
        count[tid] = count.get(tid, 0) + 1
    for r in rows:
        tid = first[r["task_index"]]
        r["task_id"] = tid if count[tid] == 1 else f"{tid}#{r['task_index']}"


def check_k(k_list: Sequence[int], samples: int) -> list[int]:
    """Validate the k values against the samples per task.

    Returns:
        The sorted distinct k values.

    Raises:
        ValueError: empty `k_list`, a k < 1, `samples` < 1, or a k larger than `samples`
            (pass@k needs at least k samples per task, case E5).
    """
    ks = sorted({int(k) for k in k_list})
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    if not ks or ks[0] < 1:
        raise ValueError(f"k: give one or more k >= 1, got {list(k_list)}")
    if ks[-1] > samples:
        raise ValueError(f"k: pass@{ks[-1]} needs at least {ks[-1]} samples per task, but samples={samples}; "
                         f"use --samples {ks[-1]} or more, or drop k > {samples}")
    return ks


def run_eval(
    engine: Engine,
    renderer: ChatRenderer,
    make_env: Callable[[], Any],
    tasks: Sequence[dict[str, Any]],
    *,
    samples: int = 1,
    k_list: Sequence[int] = (1,),
    temperature: float = 0.0,
    top_p: float = 1.0,
    max_tokens: int = 512,
    seed: int | None = 0,
    out_dir: str | Path | None = None,
    max_episode_tokens: int = 4096,
    batch_size: int = 64,
    env_threads: int = 8,
    envs: Sequence[Any] | None = None,
    executor: ThreadPoolExecutor | None = None,
    meta: dict[str, Any] | None = None,
    console: Any = None,
    rollout: Callable[[list[EpisodeSpec], SamplingParams, int | None], list[Trajectory]] | None = None,
    step_timeout_s: float | None = None,
    reset_timeout_s: float | None = None,
    reporter: Any = None,
    stage: str = "eval",
) -> dict[str, Any]:
    """Evaluate a policy: `samples` episodes of every task, summarised.

    Args:
        engine: the policy (`HFEngine`, vLLM, or `ScriptedEngine` for a scripted policy).
        renderer: `ChatRenderer` of the engine's tokenizer.
        make_env: makes one env (called `min(batch_size, episodes)` times unless `envs` given,
            and once for each env whose reset or step timed out, to replace it).
        tasks: reset kwargs of each task, e.g. `{"seed": 10_000_000 + i}` or
            `{"options": {"task": ...}}` (see `agentrl.eval.tasks.list_tasks`).
        samples: episodes per task (N of pass@k).
        k_list: the k values of pass@k (each <= samples).
        temperature: sampling temperature; 0 = greedy.
        top_p: nucleus mass.
        max_tokens: most sampled tokens per turn.
        seed: base sampler seed (None: the engine's RNG state, not reproducible).
        out_dir: where to write `results.jsonl`, `summary.json`, `summary.md` (created; None:
            write nothing).
        max_episode_tokens: cap on an episode's total length (tokens, prompt included).
        batch_size: episodes run together (one generate call per turn for all of them).
        env_threads: threads stepping envs (sandbox runs) concurrently, when `executor` is None.
        envs: pre-made envs to reuse (at least `min(batch_size, episodes)`); a list is updated
            in place when an env is replaced after a time-out.
        executor: thread pool for env steps (one of `env_threads` threads is made if None).
        meta: run settings copied into `summary["meta"]` (env, model, dataset, ...).
        console: a rich Console to print the tables and progress on (None: silent).
        rollout: runs a batch elsewhere instead of `run_episodes` here: `(specs, params, seed)
            -> trajectories` in spec order, e.g. `lambda sp, p, s: pool.run(sp, p, s,
            split="heldout")` over an `agentrl.rollout.workers.RolloutPool` (Ray workers, each
            with its own engine and envs). `engine`, `make_env`, `envs` and `executor` are then
            unused; `renderer` gives the stop ids.
        step_timeout_s, reset_timeout_s: most seconds an env step / reset may run (None: no
            limit); see `run_episodes`.
        reporter: where the progress (episodes done, ETA) goes (`agentrl.log.progress.Reporter`;
            default: one on `console`, silent without one).
        stage: the progress line's name.

    Returns:
        The summary dict (`agentrl.eval.report.summarize`) plus `timing`
        (`seconds`, `episodes_per_s`, `generate_s`, `env_s`).

    Raises:
        ValueError: no tasks, bad `samples`/`k_list` (`check_k`), `batch_size` < 1, or too few
            `envs`.
    """
    ks = _checked_args(k_list, samples, tasks, batch_size)
    jobs = [(ti, j, dict(kw)) for ti, kw in enumerate(tasks) for j in range(samples)]
    width = min(batch_size, len(jobs))
    params = SamplingParams(temperature=temperature, top_p=top_p, max_tokens=max_tokens,
                            stop_token_ids=list(renderer.stop_ids))
    pool: ThreadPoolExecutor | None = None
    run_batch = rollout
    if run_batch is None:
        local_envs = _eval_envs(envs, make_env, width)
        pool = executor or ThreadPoolExecutor(max_workers=max(1, env_threads))
        run_batch = _local_runner(engine, renderer, make_env, local_envs, pool,
                                  max_episode_tokens, step_timeout_s, reset_timeout_s)

    if reporter is None:
        reporter = Reporter(console, enabled=console is not None)
    progress = reporter.stage(stage, len(jobs), unit="episodes")
    t0 = time.perf_counter()
    try:
        rows, gen_s, env_s = _run_jobs(jobs, width, run_batch, params, seed, progress)
    finally:
        progress.close()
        if executor is None and pool is not None:
            pool.shutdown(wait=True)
    seconds = time.perf_counter() - t0
    run_meta = {"samples": samples, "k": ks, "temperature": temperature, "top_p": top_p,
                "max_tokens": max_tokens, "max_episode_tokens": max_episode_tokens, "seed": seed,
                "batch_size": batch_size, **(meta or {})}
    summary = _summary(rows, ks, run_meta, seconds, gen_s, env_s)
    _report(summary, rows, out_dir, console)
    return summary


def _checked_args(k_list: Sequence[int], samples: int, tasks: Sequence[dict[str, Any]],
                  batch_size: int) -> list[int]:
    """The k values of pass@k (`check_k`); ValueError for no tasks or `batch_size` < 1."""
    ks = check_k(k_list, samples)
    if not tasks:
        raise ValueError("tasks: nothing to evaluate (empty task list)")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    return ks


def _summary(rows: list[dict[str, Any]], ks: list[int], run_meta: dict[str, Any], seconds: float,
             gen_s: float, env_s: float) -> dict[str, Any]:
    """`summarize` of the episode rows (task ids made unique first) plus its `timing`."""
    _unique_task_ids(rows)
    summary = summarize(rows, ks, run_meta)
    summary["timing"] = {"seconds": seconds, "episodes_per_s": len(rows) / seconds if seconds > 0 else None,
                         "generate_s": gen_s, "env_s": env_s}
    return summary


def _eval_envs(envs: Sequence[Any] | None, make_env: Callable[[], Any], width: int) -> list[Any]:
    """The envs to run on: `width` made with `make_env` when `envs` is None, else `envs` itself
    when a list (an env replaced after a time-out stays in it) or a list of them.

    Raises:
        ValueError: fewer than `width` envs given.
    """
    if envs is None:
        envs = [make_env() for _ in range(width)]
    elif len(envs) < width:
        raise ValueError(f"envs: {len(envs)} given, need {width} (min(batch_size, episodes))")
    return envs if isinstance(envs, list) else list(envs)


def _local_runner(engine: Engine, renderer: ChatRenderer, make_env: Callable[[], Any],
                  local_envs: list[Any], pool: ThreadPoolExecutor, max_episode_tokens: int,
                  step_timeout_s: float | None, reset_timeout_s: float | None
                  ) -> Callable[[list[EpisodeSpec], SamplingParams, int | None], list[Trajectory]]:
    """`run_episodes` here, on `local_envs` with env steps on `pool`: `(specs, params, seed) ->
    trajectories` in spec order. An env with the `run_agents` batch hook (the user's agent,
    `agentrl.gateway.agents`) runs the batch itself, one trajectory per episode."""

    def run_here(specs: list[EpisodeSpec], p: SamplingParams, s: int | None) -> list[Trajectory]:
        agents = getattr(getattr(local_envs[0], "unwrapped", local_envs[0]), "run_agents", None)
        if agents is not None:
            return agents(engine, renderer, specs, p, max_episode_tokens=max_episode_tokens, seed=s,
                          timeout_s=step_timeout_s, one_per_run=True)
        return run_episodes(engine, renderer, local_envs, specs, p,
                            max_episode_tokens=max_episode_tokens, executor=pool, seed=s,
                            step_timeout_s=step_timeout_s, reset_timeout_s=reset_timeout_s,
                            make_env=make_env)

    return run_here


def _run_jobs(jobs: list[tuple[int, int, dict[str, Any]]], width: int,
              run_batch: Callable[[list[EpisodeSpec], SamplingParams, int | None], list[Trajectory]],
              params: SamplingParams, seed: int | None, progress: Any
              ) -> tuple[list[dict[str, Any]], float, float]:
    """Run the (task index, sample, reset kwargs) jobs `width` at a time, batch b with seed
    `batch_seed(seed, b)`. Returns the episode rows in job order and the summed generate and
    env seconds."""
    rows: list[dict[str, Any]] = []
    gen_s = env_s = 0.0
    for b, start in enumerate(range(0, len(jobs), width)):
        chunk = jobs[start:start + width]
        specs = [EpisodeSpec(reset_kwargs=kw, group_id=ti) for ti, _, kw in chunk]
        trajs = run_batch(specs, params, None if seed is None else batch_seed(seed, b))
        for (ti, j, kw), tr in zip(chunk, trajs, strict=True):
            rows.append(episode_row(tr, ti, j, kw))
            gen_s += tr.timings.get("generate", 0.0)
            env_s += tr.timings.get("env", 0.0)
        progress.advance(len(chunk))
    return rows, gen_s, env_s


def _report(summary: dict[str, Any], rows: list[dict[str, Any]], out_dir: str | Path | None,
            console: Any) -> None:
    """Write the outputs to `out_dir` (when given) and print the summary on `console` (when
    given)."""
    if out_dir is not None:
        write_outputs(out_dir, rows, summary)
    if console is not None:
        print_summary(summary, console)
        if out_dir is not None:
            console.print(f"results: {Path(out_dir) / 'results.jsonl'}; summary: {Path(out_dir) / 'summary.json'}",
                          markup=False, highlight=False)


def write_outputs(out_dir: str | Path, rows: Sequence[dict[str, Any]], summary: dict[str, Any]) -> None:
    """Write `results.jsonl` (one row per episode), `summary.json` and `summary.md` to `out_dir`
    (created if missing; existing files are replaced)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with (out / "results.jsonl").open("w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(jsonable(r), allow_nan=False) + "\n")
    (out / "summary.json").write_text(json.dumps(jsonable(summary), indent=1, allow_nan=False))
    (out / "summary.md").write_text(summary_markdown(summary))


def training_metrics(summary: dict[str, Any]) -> dict[str, float]:
    """The flat metrics of an evaluation logged under `eval/`: `pass@k` and `pass@k_se` for
    each k, `reward_mean`, `tokens_mean`, `turns_mean`, `errors`, and in a multi-turn
    evaluation the repair metrics (`REPAIR_KEYS`). None values become NaN."""
    o = summary["overall"]
    keys = [m for k in summary["k"] for m in (f"pass@{k}", f"pass@{k}_se")]
    keys += ["reward_mean", "tokens_mean", "turns_mean", "errors"]
    keys += [k for k in REPAIR_KEYS if k in o]  # multi-turn evaluations only
    return {k: float("nan") if o.get(k) is None else float(o[k]) for k in keys}


def heldout_settings(cfg: Any) -> dict[str, Any]:
    """The settings of the held-out evaluation of a run with config `cfg`, shared by the
    trainer's evaluation (`evaluate_heldout`) and `agentrl eval`'s defaults, so that both give
    the same number for the same checkpoint: `samples` (`train.eval_samples`), `k_list`
    (1 and `samples`), `temperature` (`rollout.temperature`), `top_p`, `max_tokens`,
    `max_episode_tokens`, `seed` (the run's `seed`), `batch_size` (`train.eval_batch_size`;
    the sampler seed is drawn per batch) and the env time limits (`env.step_timeout_s`,
    `env.reset_timeout_s`)."""
    n = int(cfg.train.eval_samples)
    return {"samples": n, "k_list": sorted({1, n}), "temperature": float(cfg.rollout.temperature),
            "top_p": cfg.rollout.top_p, "max_tokens": cfg.rollout.max_tokens,
            "max_episode_tokens": cfg.rollout.max_episode_tokens, "seed": int(cfg.seed),
            "batch_size": int(cfg.train.eval_batch_size), "step_timeout_s": cfg.env.step_timeout_s,
            "reset_timeout_s": cfg.env.reset_timeout_s}


def evaluate_heldout(engine: Engine | None, renderer: ChatRenderer, envs: list[Any], cfg: Any,
                     pool: ThreadPoolExecutor | None, *, rollout: Callable[..., list[Trajectory]] | None = None,
                     out_dir: str | Path | None = None,
                     make_env: Callable[[], Any] | None = None, reporter: Any = None,
                     stage: str = "eval") -> dict[str, Any]:
    """The held-out evaluation of a run: the first `train.eval_tasks` tasks of the env's fixed
    held-out list (`agentrl.eval.tasks.list_tasks` on `envs[0]`, which must be made on the
    held-out split), `train.eval_samples` episodes each, with `heldout_settings(cfg)`. Runs
    before, during and after training; `agentrl eval --model RUN` runs the same tasks with the same
    settings, so it reproduces the figure exactly for the same checkpoint.

    Args:
        engine: the policy (None when `rollout` is given).
        renderer: the engine's `ChatRenderer`.
        envs: at least `agentrl.run.heldout_width(cfg)` held-out envs (reused, never made here).
        cfg: the run's `Config`.
        pool: threads stepping the envs.
        rollout: `(specs, params, seed) -> trajectories` to run batches elsewhere (Ray workers).
        out_dir: write `results.jsonl`, `summary.json`, `summary.md` there (None: nothing).
        make_env: makes a held-out env to replace one of `envs` whose call timed out (default:
            `build_env(cfg, "heldout")`, without shared reward wrappers).
        reporter, stage: progress of the episodes (see `run_eval`; None: silent).

    Returns:
        The summary of `run_eval` (`overall["pass@1"]`, `overall["pass@1_se"]`, ...).

    Raises:
        ValueError: too few `envs`, or an env without tasks.
    """
    if make_env is None:
        make_env = partial(build_env, cfg, "heldout")
    tasks, source = list_tasks(envs[0], cfg.train.eval_tasks, default_n=cfg.train.eval_tasks)
    meta = {"env": cfg.env.name, "split": "heldout", "tasks_from": source}
    if cfg.env.max_turns is not None:  # multi-turn: the summary adds the repair metrics
        meta["max_turns"] = cfg.env.max_turns
    return run_eval(engine, renderer, make_env, tasks, envs=envs, executor=pool, rollout=rollout,
                    out_dir=out_dir, meta=meta,
                    reporter=reporter, stage=stage, **heldout_settings(cfg))
