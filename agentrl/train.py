"""The training loop, one function read top to bottom:

    build or load the model (+ supervised warm start) -> evaluate
    for each step: collect rollouts -> batch -> advantages -> update -> sync weights -> log
                   -> checkpoint
    evaluate -> summary

Everything runs in this process when `rollout.num_workers=0` (a breakpoint works anywhere).
"""

from __future__ import annotations

import inspect
import json
import math
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentrl.config import Config
from agentrl.envs import make_env, resolve_env_id
from agentrl.rollout.agent_loop import EpisodeSpec, run_episodes
from agentrl.rollout.chat import ChatRenderer
from agentrl.rollout.engines.base import SamplingParams
from agentrl.rollout.source import AsyncSource, Leases, LockedEngine, SyncSource
from agentrl.trajectory import Trajectory, collate

EVAL_SEED = 10_000_000  # held-out evaluation tasks use seeds EVAL_SEED + i in every run


# -- env helpers --------------------------------------------------------------------------------
def _env_accepts(name: str, kwarg: str) -> bool:
    import gymnasium as gym

    spec = gym.spec(resolve_env_id(name))
    ep = spec.entry_point
    if isinstance(ep, str):
        mod, _, attr = ep.partition(":")
        import importlib

        ep = getattr(importlib.import_module(mod), attr)
    try:
        return kwarg in inspect.signature(ep).parameters
    except (TypeError, ValueError):
        return False


def build_env(cfg: Config, split: str | None = None, rewards: Any = None) -> Any:
    """Make one env from the config (dataset, split, kwargs, turn limit) with the reward
    wrappers of `cfg.env.wrappers` stacked on it. `rewards` (a `RewardWrappers`) lets many env
    copies share one judge client, curiosity memory and Lagrange multiplier."""
    kw = dict(cfg.env.kwargs)
    if cfg.env.dataset is not None:
        kw["dataset"] = cfg.env.dataset
    if split is not None and _env_accepts(cfg.env.name, "split"):
        kw["split"] = split
    env = make_env(cfg.env.name, max_turns=cfg.env.max_turns, env_kwargs=kw)
    if cfg.env.wrappers:
        if rewards is None:
            from agentrl.rewards import RewardWrappers  # imported only when a wrapper is asked for

            rewards = RewardWrappers(cfg.env.wrappers, cfg.env.wrapper_kwargs)
        env = rewards.wrap(env)
    return env


def episode_success(tr: Trajectory) -> bool:
    """Did the episode solve its task? The env's `info["success"]` or `verdict == "pass"` on
    its last turn when given, else a return of at least 1 (binary rewards)."""
    if tr.turns:
        info = tr.turns[-1].info
        if "success" in info:
            return bool(info["success"])
        if "verdict" in info:
            return info["verdict"] == "pass"
    r = tr.episode_return
    return r == r and r >= 1.0


def extrinsic_return(tr: Trajectory) -> float:
    """Episode return without intrinsic bonuses (`reward_components["extrinsic"]` when given)."""
    total = 0.0
    for t in tr.turns:
        comp = t.info.get("reward_components") or {}
        total += float(comp.get("extrinsic", t.reward))
    return total


def reward_component_means(trajs: list[Trajectory]) -> dict[str, float]:
    """Mean per episode of each reward component the wrappers report (`reward/judge`,
    `reward/safety`, `reward/intrinsic`, `reward/extrinsic`, ...)."""
    sums: dict[str, float] = {}
    for tr in trajs:
        for t in tr.turns:
            for k, v in (t.info.get("reward_components") or {}).items():
                if isinstance(v, (int, float)) and v == v:
                    sums[k] = sums.get(k, 0.0) + float(v)
    return {f"reward/{k}": v / max(len(trajs), 1) for k, v in sums.items()}


# -- model --------------------------------------------------------------------------------------
def default_model_dir(cfg: Config, out: Path) -> str:
    """Build the embedded tiny model in `OUT/base_model` (tokenizer trained on texts of the env:
    opening messages and reference answers of training tasks)."""
    from agentrl.model import build_tiny_model

    target = out / "base_model"
    if (target / "config.json").exists():
        return str(target)
    env = build_env(cfg, "train")
    texts = []
    get = getattr(env.unwrapped, "reference_answer", None)
    for i in range(2000):
        obs, _ = env.reset(seed=500_000 + i)
        texts.extend(m["content"] for m in obs)
        if get is not None and get():
            texts.append(get())
    feedback = getattr(env.unwrapped, "corpus_texts", None)
    if feedback is not None:
        texts.extend(feedback())
    m = cfg.model
    return build_tiny_model(str(target), texts, hidden_size=m.hidden_size, num_layers=m.num_layers,
                            num_heads=m.num_heads, intermediate_size=m.intermediate_size,
                            vocab_size=m.vocab_size, seed=cfg.seed)


# -- rollouts -----------------------------------------------------------------------------------
def collect(engine: Any, renderer: ChatRenderer, envs: list[Any], seeds: list[int], group_size: int,
            params: SamplingParams, cfg: Config, pool: ThreadPoolExecutor, *, group_base: int,
            sample_seed: int, split: str = "train") -> list[Trajectory]:
    """Run `group_size` episodes of each task seed (a group = the same task reset with the same
    seed). Returns `len(seeds) * group_size` trajectories, group-major. `engine` is an
    in-process engine, or a `RolloutPool` of Ray workers that hold their own envs."""
    specs = [EpisodeSpec({"seed": s}, group_id=group_base + j)
             for j, s in enumerate(seeds) for _ in range(group_size)]
    if hasattr(engine, "run"):  # a RolloutPool: Ray workers (or vLLM) hold the envs
        return engine.run(specs, params, seed=sample_seed, split=split)
    return run_episodes(engine, renderer, envs, specs, params, executor=pool,
                        max_episode_tokens=cfg.rollout.max_episode_tokens, seed=sample_seed)


def evaluate(engine: Any, renderer: ChatRenderer, envs: list[Any], cfg: Config,
             pool: ThreadPoolExecutor, *, n_tasks: int, samples: int, temperature: float
             ) -> dict[str, float]:
    """pass@1 and mean reward on the seeded tasks `EVAL_SEED + i` of `envs`' split, `samples`
    episodes each: the warm start's stop check on *training* tasks. The held-out figure of a
    run is `agentrl.eval.harness.evaluate_heldout` (the env's fixed held-out list)."""
    params = SamplingParams(temperature=temperature, top_p=cfg.rollout.top_p,
                            max_tokens=cfg.rollout.max_tokens, stop_token_ids=renderer.stop_ids)
    seeds = [EVAL_SEED + i for i in range(n_tasks)]
    trajs: list[Trajectory] = []
    per_call = len(envs) // samples
    for s in range(0, n_tasks, per_call):
        trajs += collect(engine, renderer, envs, seeds[s:s + per_call], samples, params, cfg, pool,
                         group_base=0, sample_seed=cfg.seed + 777 + s, split="train")
    succ = np.array([episode_success(t) for t in trajs], dtype=float)
    rets = np.array([extrinsic_return(t) for t in trajs], dtype=float)
    return {"pass@1": float(succ.mean()), "reward_mean": float(np.nanmean(rets)),
            "tokens_mean": float(np.mean([t.num_sampled for t in trajs]))}


def format_eval(ev: dict[str, float], samples: int) -> str:
    """`pass@1 0.203 ± 0.021, pass@4 0.412 ± 0.030` from evaluation metrics (± one standard
    error over tasks)."""
    parts = []
    for k in sorted({1, samples}):
        v, se = ev.get(f"pass@{k}", float("nan")), ev.get(f"pass@{k}_se", float("nan"))
        parts.append(f"pass@{k} {v:.3f}" + (f" ± {se:.3f}" if se == se else ""))
    return ", ".join(parts)


DYNAMIC_SAMPLING_MAX_ROUNDS = 3
"""Most refill collections per step of dynamic sampling (DAPO's `max_num_gen_batches`)."""


def dynamic_sampling(trajs: list[Trajectory], more: Any, want: int, *,
                     max_rounds: int = DYNAMIC_SAMPLING_MAX_ROUNDS) -> tuple[list[Trajectory], int]:
    """DAPO dynamic sampling (Yu et al. 2025, sec. 3.2): keep only the groups whose rewards
    differ (`zero_variance_mask`: groups with all-equal or fewer than two valid returns carry
    no gradient) and call `more(round)` for fresh groups until `want` trajectories are kept or
    `max_rounds` refills were made. Whole groups are kept, in order, up to `want` episodes.

    Returns:
        (kept trajectories, refill rounds used). Fewer than `want` (possibly none: then the
        step makes no update) when the refills run out.
    """
    from agentrl.algos.advantages import zero_variance_mask

    def informative(ts: list[Trajectory]) -> list[Trajectory]:
        if not ts:
            return []
        scores = torch.tensor([t.episode_return if t.num_sampled > 0 else float("nan") for t in ts])
        drop = zero_variance_mask(scores, [t.group_id for t in ts]).tolist()
        return [t for t, d in zip(ts, drop) if not d]

    kept, rounds = informative(trajs), 0
    while len(kept) < want and rounds < max_rounds:
        rounds += 1
        kept += informative(more(rounds))
    groups: dict[int, list[Trajectory]] = {}
    for t in kept:
        groups.setdefault(t.group_id, []).append(t)
    out: list[Trajectory] = []
    for g in groups.values():
        if len(out) + len(g) > want:
            break
        out += g
    return out, rounds


def build_batch(trajs: list[Trajectory], pad_id: int) -> dict[str, Any]:
    """Collate trajectories and attach `scores` (B,) episode returns, `group_ids` (B,) and
    `truncated` (B,). A NaN return (a failed reward) stays NaN, and an episode that sampled no
    token gets NaN (case A9): both are excluded from group statistics and get advantage 0."""
    batch = collate(trajs, pad_id)
    batch["scores"] = torch.tensor(
        [t.episode_return if t.num_sampled > 0 else float("nan") for t in trajs], dtype=torch.float32)
    batch["group_ids"] = torch.tensor([t.group_id for t in trajs], dtype=torch.long)
    batch["truncated"] = torch.tensor([t.truncated for t in trajs], dtype=torch.bool)
    return batch


# -- logging ------------------------------------------------------------------------------------
class MetricsLog:
    """Appends one JSON object per step to OUT/metrics.jsonl, and the finite numbers to
    TensorBoard (OUT/tb, when installed) and Weights & Biases (when `wandb_project` is given).

    A run starting at `start_step` (0, or the checkpoint's step on resume) first drops rows of
    later steps (logged by an interrupted run after its checkpoint, a torn last line included),
    and TensorBoard purges events from step `start_step + 1` on: every step is logged once.
    """

    def __init__(self, out: Path, tensorboard: bool = True, *, start_step: int = 0,
                 wandb_project: str | None = None, run_config: dict[str, Any] | None = None):
        self.path = out / "metrics.jsonl"
        rows = self.path.read_text().splitlines() if self.path.exists() else []
        self.path.write_text("".join(r + "\n" for r in rows if _row_step(r) <= start_step))
        self.tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(out / "tb"), purge_step=start_step + 1)
            except Exception:  # noqa: BLE001 - TensorBoard is optional
                self.tb = None
        self.wandb = _wandb_run(out, wandb_project, run_config, start_step) if wandb_project else None

    def log(self, step: int, metrics: dict[str, float]) -> None:
        row = {"step": step, **{k: (v if isinstance(v, (int, float)) and math.isfinite(v) else None)
                                if isinstance(v, (int, float)) else v for k, v in metrics.items()}}
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if self.tb is not None:
            for k, v in metrics.items():
                if isinstance(v, (int, float)) and math.isfinite(v):
                    self.tb.add_scalar(k, v, step)
            self.tb.flush()
        if self.wandb is not None:
            self.wandb.log({k: v for k, v in metrics.items()
                            if isinstance(v, (int, float)) and math.isfinite(v)}, step=step)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()


def _row_step(line: str) -> float:
    """The step of a metrics.jsonl line (inf for a torn or foreign line, so it is dropped)."""
    try:
        return float(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return math.inf


def _wandb_run(out: Path, project: str, run_config: dict[str, Any] | None, start_step: int) -> Any:
    """Start a W&B run in OUT (on resume, `start_step` > 0, continue the run whose id is kept in
    OUT/wandb_id.txt). `WANDB_MODE=offline` writes it under OUT/wandb without network."""
    import secrets

    import wandb

    id_file = out / "wandb_id.txt"
    resumed = start_step > 0 and id_file.exists()
    run_id = id_file.read_text().strip() if resumed else secrets.token_hex(4)
    id_file.write_text(run_id)
    return wandb.init(project=project, dir=str(out), name=out.resolve().name, id=run_id,
                      resume="allow", config=run_config)


def _quiet_libraries() -> None:
    """Silence transformers' per-file progress bars and info logs (our own progress shows)."""
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


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


# -- the loop -----------------------------------------------------------------------------------
def train(cfg: Config, *, console: Any = None) -> dict[str, Any]:
    """Train `cfg.algo.name` on `cfg.env.name`; returns the summary (also OUT/summary.json).

    Raises:
        ValueError: a configuration that cannot run (e.g. unknown env), before any work.
    """
    from agentrl.algos import get_algorithm, needs_reference, resolve_config
    from agentrl.eval.harness import evaluate_heldout, heldout_width, training_metrics
    from agentrl.learner import Learner, latest_checkpoint
    from agentrl.lora import load_checkpoint, merged_state_dict, plain_copy, wrap_lora
    from agentrl.model import load_model
    from agentrl.rollout.engines.hf import HFEngine
    from agentrl.sft import sft_examples, sft_train
    from agentrl.summary import stage_seconds, summary_panel

    say = (lambda msg: console.print(msg, markup=False, highlight=False, soft_wrap=True)) if console is not None else print
    _quiet_libraries()
    torch.set_num_threads(cfg.train.torch_threads)
    _seed_everything(cfg.seed)
    resolve_env_id(cfg.env.name)  # fail early on an unknown env
    algo = get_algorithm(cfg.algo.name)
    cfg = cfg.model_copy(update={"algo": resolve_config(algo, cfg.algo)})  # e.g. GSPO's clips
    if cfg.algo.dynamic_sampling and cfg.algo.group_size < 2:
        raise ValueError("algo.dynamic_sampling needs algo.group_size >= 2 (singleton groups "
                         "carry no signal and would all be dropped)")
    out = Path(cfg.resume or cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(cfg.model_dump_json(indent=1))
    timings: dict[str, float] = {}

    # 1) the model: resume, a given path, or the embedded default (+ warm start)
    ck = latest_checkpoint(out) if cfg.resume else None
    start_step, version = 0, 0
    if cfg.resume and ck is None:
        say(f"[resume] no checkpoint in {out}; starting from scratch")
    if ck is None and latest_checkpoint(out) is not None:  # never resume into an earlier run's
        old = out / f"checkpoints.old-{time.strftime('%Y%m%d-%H%M%S')}"
        (out / "checkpoints").rename(old)
        say(f"[out] checkpoints of an earlier run in {out} moved to {old}")
    if ck is not None:
        model, tok = load_checkpoint(ck)  # full weights, or LoRA adapters on their base
    else:
        path = cfg.model.path or default_model_dir(cfg, out)
        model, tok = load_model(path)
    renderer = ChatRenderer(tok)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else renderer.end_of_turn_id
    sft_info: dict[str, Any] = {}
    if ck is None and cfg.sft.steps > 0:
        t0 = time.perf_counter()
        examples = sft_examples(build_env(cfg, "train"), renderer, max(2000, cfg.sft.batch_size),
                                seed=cfg.seed * 7919 + 1)
        slog = (out / "sft_metrics.jsonl").open("w")
        checks: list[tuple[int, float]] = []

        def stop(done: int) -> bool:  # pass@1 on training tasks (never the held-out split)
            if cfg.sft.stop_pass_rate is None or done < cfg.sft.min_steps:
                return False
            eng = HFEngine(plain_copy(model).eval(), tok, torch_threads=cfg.rollout.torch_threads)
            envs_ = [build_env(cfg, "train") for _ in range(2 * cfg.sft.check_tasks)]
            with ThreadPoolExecutor(cfg.rollout.env_threads) as p_:
                r = evaluate(eng, renderer, envs_, cfg, p_, n_tasks=cfg.sft.check_tasks, samples=2,
                             temperature=cfg.rollout.temperature)
            model.train()
            checks.append((done, r["pass@1"]))
            slog.write(json.dumps({"step": done, "sft/train_pass@1": r["pass@1"]}) + "\n")
            return r["pass@1"] >= cfg.sft.stop_pass_rate

        losses = sft_train(model, examples, steps=cfg.sft.steps, lr=cfg.sft.lr,
                           batch_size=cfg.sft.batch_size, pad_id=pad_id, seed=cfg.seed,
                           log=lambda s, loss: slog.write(json.dumps({"step": s, "sft/loss": loss}) + "\n"),
                           stop=stop, check_every=cfg.sft.check_every)
        slog.close()
        timings["sft_s"] = time.perf_counter() - t0
        sft_info = {"sft_loss_first": losses[0], "sft_loss_last": losses[-1],
                    "sft_steps": len(losses), "sft_seconds": timings["sft_s"],
                    "sft_train_pass@1": checks[-1][1] if checks else None}
        say(f"[sft] {len(losses)} steps: loss {losses[0]:.3f} -> {losses[-1]:.3f} "
            f"({timings['sft_s']:.0f} s)" + (f", train pass@1 {checks[-1][1]:.3f}" if checks else ""))
        model.save_pretrained(out / "sft_model")
        tok.save_pretrained(out / "sft_model")
    if ck is None and cfg.model.lora_r > 0:  # LoRA: train adapters only; the base stays frozen
        model = wrap_lora(model, r=cfg.model.lora_r, alpha=cfg.model.lora_alpha,
                          target_modules=cfg.model.lora_target_modules, seed=cfg.seed,
                          base_path=out / "sft_model" if sft_info else path)

    if cfg.rollout.num_workers > 0 or cfg.rollout.engine == "vllm":
        from agentrl.rollout.workers import RolloutPool  # Ray workers (or vLLM) hold the envs

        plain_copy(model).save_pretrained(out / "rollout_model")
        tok.save_pretrained(out / "rollout_model")
        engine: Any = RolloutPool(cfg, out / "rollout_model")  # current weights = version 0
    else:
        engine = HFEngine(plain_copy(model).eval(), tok, torch_threads=cfg.rollout.torch_threads,
                          compile=cfg.rollout.compile)
    learner = Learner(model, lr=cfg.train.lr, weight_decay=cfg.train.weight_decay,
                      grad_clip=cfg.train.grad_clip, temperature=cfg.rollout.temperature,
                      micro_batch_size=cfg.train.micro_batch_size,
                      prefix_share=cfg.train.prefix_share, compile=cfg.train.compile,
                      skip_zero_advantage=cfg.train.skip_zero_advantage,
                      use_ref=needs_reference(algo, cfg.algo),
                      value_head=getattr(algo, "VALUE_HEAD", False))
    for note in (learner.compile_note(), rollout_compile_note(cfg, engine)):
        if note:
            say(f"[compile] {note}")
    if ck is not None:
        extra = learner.load(ck)
        start_step, version = extra["step"], extra["policy_version"]
        engine.update_weights(merged_state_dict(model), version)
        say(f"[resume] from {ck} at step {start_step} (policy version {version})")

    G = cfg.algo.group_size
    n_eps = cfg.rollout.tasks_per_step * G
    n_envs = heldout_width(cfg)  # fixed: evaluation batches do not depend on training's
    rewards = None
    if cfg.env.wrappers:
        from agentrl.rewards import RewardWrappers

        rewards = RewardWrappers(cfg.env.wrappers, cfg.env.wrapper_kwargs)
    envs = [build_env(cfg, "train", rewards) for _ in range(n_eps)]
    eval_envs = [build_env(cfg, "heldout", rewards) for _ in range(n_envs)]
    pool = ThreadPoolExecutor(max_workers=cfg.rollout.env_threads)
    log = MetricsLog(out, cfg.log.tensorboard, start_step=start_step, run_config=cfg.model_dump(),
                     wandb_project=cfg.log.wandb_project if cfg.log.wandb else None)
    params = SamplingParams(temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
                            max_tokens=cfg.rollout.max_tokens, stop_token_ids=renderer.stop_ids)

    # Async actor threads, evaluation and refills share the engine: an in-process engine is
    # entered by one generate / weight update at a time (LockedEngine), so that batches in flight
    # interleave per generate call; evaluation and refills hold the same (re-entrant) lock for
    # their whole run, and weight updates take it too. Each batch leases its own envs + pool.
    engine_lock = threading.RLock()
    if not hasattr(engine, "run"):
        engine = LockedEngine(engine, engine_lock)
    env_sets = Leases(lambda: ([build_env(cfg, "train", rewards) for _ in range(n_eps)],
                               ThreadPoolExecutor(max_workers=cfg.rollout.env_threads)), [(envs, pool)])
    if cfg.rollout.mode == "async" and not hasattr(engine, "run"):
        env_sets.fill(cfg.rollout.batches_in_flight)  # built now, in a fixed order

    def held_version() -> int:
        return int(engine.version if hasattr(engine, "run") else engine.policy_version)

    def apply_weights(state_dict: dict[str, Any], v: int) -> None:
        with engine_lock:  # never while evaluation or a refill is sampling
            if v < held_version():  # an older push applied late (async): keep the newer weights
                return
            engine.update_weights(state_dict, v)

    def run_eval(tag: str) -> dict[str, float]:
        """Evaluate the learner's current weights on the held-out list (written to
        OUT/eval/<tag>, as `agentrl eval` writes): in async mode the engine may still hold an
        older version (a push is applied only when an actor starts its next batch)."""
        t0 = time.perf_counter()
        with engine_lock:
            if held_version() < version:
                engine.update_weights(merged_state_dict(model), version)
            remote = (lambda sp, p, s: engine.run(sp, p, seed=s, split="heldout")) if hasattr(engine, "run") else None
            r = training_metrics(evaluate_heldout(None if remote else engine, renderer, eval_envs, cfg,
                                                  pool, rollout=remote, out_dir=out / "eval" / tag))
            r["policy_version"] = float(held_version())  # the weights evaluated
        r["seconds"] = time.perf_counter() - t0
        return r

    def refill(step: int, r: int) -> list[Trajectory]:
        """Fresh groups for refill round r (1, 2, ...) of dynamic sampling at `step`."""
        rng_r = np.random.default_rng([cfg.seed, step, r])
        seeds = [int(s) for s in rng_r.integers(0, 2**31 - 1, size=cfg.rollout.tasks_per_step)]
        with engine_lock, env_sets.lease() as (envs_, pool_):  # async actors use the engine too
            return collect(engine, renderer, envs_, seeds, G, params, cfg, pool_,
                           group_base=(step + r * cfg.train.steps) * cfg.rollout.tasks_per_step,
                           sample_seed=(cfg.seed * 100_003 + step) * 31 + r)

    def run_batch(step: int) -> list[Trajectory]:
        """Batch `step`: `tasks_per_step` task seeds drawn from (seed, step), so a resumed or
        asynchronous run samples the same tasks; each task run `group_size` times."""
        rng = np.random.default_rng([cfg.seed, step])
        seeds = [int(s) for s in rng.integers(0, 2**31 - 1, size=cfg.rollout.tasks_per_step)]
        with env_sets.lease() as (envs_, pool_):  # several batches may be in flight
            return collect(engine, renderer, envs_, seeds, G, params, cfg, pool_,
                           group_base=step * cfg.rollout.tasks_per_step,
                           sample_seed=cfg.seed * 100_003 + step)

    before = json.loads((out / "eval_before.json").read_text()) if ck is not None and \
        (out / "eval_before.json").exists() else None
    if before is None:
        say(f"[eval] held-out: {cfg.train.eval_tasks} tasks x {cfg.train.eval_samples} samples ...")
        before = run_eval("before")
        (out / "eval_before.json").write_text(json.dumps(before))
        say(f"[eval] before RL: {format_eval(before, cfg.train.eval_samples)} ({before['seconds']:.0f} s)")

    # 2) the RL loop
    progress = None
    if not cfg.quiet and console is not None:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        progress = Progress(TextColumn("[bold]train"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                            TimeElapsedColumn(), TextColumn("{task.fields[info]}"), console=console)
        progress.start()
        bar = progress.add_task("train", total=cfg.train.steps, completed=start_step, info="")
    if cfg.rollout.mode == "async" and cfg.train.max_staleness == 0 and cfg.rollout.batches_in_flight > 1:
        say("[warning] train.max_staleness=0: one batch samples at a time (each needs the previous "
            "update), so rollout.batches_in_flight > 1 only adds idle actor threads and env sets")
    if cfg.rollout.mode == "async":  # actor threads sample ahead with bounded staleness
        source: Any = AsyncSource(run_batch, apply_weights, start=start_step,
                                  version=version, max_staleness=cfg.train.max_staleness,
                                  queue_size=cfg.rollout.queue_size,
                                  batches_in_flight=cfg.rollout.batches_in_flight,
                                  end=cfg.train.steps)
    else:
        source = SyncSource(run_batch, apply_weights)
    t_loop = time.perf_counter()
    try:  # on any exception (Ctrl-C too) the actor threads are stopped before it propagates
        for step in range(start_step, cfg.train.steps):
            m: dict[str, float] = {}
            # collect
            t0 = time.perf_counter()
            trajs, src_metrics = source.next_batch(step)  # sync: sampled now; async: from the actor
            m.update(src_metrics)
            m["perf/rollout_s"] = time.perf_counter() - t0
            m["perf/env_s"] = float(sum(t.timings.get("env", 0.0) for t in trajs))
            stale = [version - t.policy_version for t in trajs]
            m["rollout/staleness_max"] = float(max(stale))
            for k in range(max(stale) + 1):  # staleness histogram (versions behind the learner)
                m[f"async/staleness_{k}"] = float(stale.count(k))
            trajs = [t for t, s in zip(trajs, stale) if s <= cfg.train.max_staleness]
            m["rollout/dropped_stale"] = float(len(stale) - len(trajs))
            rets = np.array([t.episode_return for t in trajs], dtype=float)
            m["rollout/reward_mean"] = float(np.nanmean(rets)) if len(rets) else float("nan")
            m["rollout/reward_std"] = float(np.nanstd(rets)) if len(rets) else float("nan")
            m["rollout/pass_rate"] = float(np.mean([episode_success(t) for t in trajs]))
            m["rollout/response_len"] = float(np.mean([t.num_sampled for t in trajs]))
            m["rollout/turns"] = float(np.mean([len(t.turns) for t in trajs]))
            m["rollout/truncated_frac"] = float(np.mean([t.truncated for t in trajs]))
            m["env/errors"] = float(sum(len(t.info.get("errors", [])) for t in trajs))
            m["rollout/nan_rewards"] = float(np.isnan(rets).sum())
            m.update(reward_component_means(trajs))
            # advantages + update
            t0 = time.perf_counter()
            if cfg.algo.dynamic_sampling:  # DAPO: drop groups without signal, refill with new tasks
                trajs, m["rollout/refill_rounds"] = dynamic_sampling(trajs, lambda r, s=step: refill(s, r), n_eps)
            batch = build_batch(trajs, pad_id)
            if hasattr(algo, "prepare"):  # algorithm-specific passes: PPO values, DPO pairs, ...
                batch, pm = algo.prepare(batch, learner, cfg.algo)
                m.update({f"rollout/{k}": float(v) for k, v in pm.items()})
            if needs_reference(algo, cfg.algo) and "ref_logprobs" not in batch:
                batch["ref_logprobs"] = learner.logprobs(batch, ref=True)
            batch["advantages"], gstats = algo.advantages(batch, cfg.algo)
            m.update({f"rollout/{k}": float(v) for k, v in gstats.items()})
            upd = learner.update(batch, algo, cfg.algo, epochs=cfg.algo.update_epochs,
                                 minibatches=cfg.algo.minibatches, seed=cfg.seed + step)
            m.update({f"loss/{k}": v for k, v in upd.items()})
            m["perf/update_s"] = time.perf_counter() - t0
            # sync
            t0 = time.perf_counter()
            version += 1
            if cfg.rollout.mode == "sync" or (step + 1 - start_step) % cfg.rollout.sync_every == 0:
                source.push_weights(merged_state_dict(model), version)
            m["perf/sync_s"] = time.perf_counter() - t0
            m["perf/step_s"] = m["perf/rollout_s"] + m["perf/update_s"] + m["perf/sync_s"]
            m["perf/loop_s"] = time.perf_counter() - t_loop  # wall clock since the loop started
            if cfg.train.eval_every and (step + 1) % cfg.train.eval_every == 0 and step + 1 < cfg.train.steps:
                ev = run_eval(f"step_{step + 1}")
                m.update({f"eval/{k}": v for k, v in ev.items()})
            log.log(step + 1, m)
            if cfg.train.log_rollouts_every and (step + 1) % cfg.train.log_rollouts_every == 0:
                (out / "rollouts").mkdir(exist_ok=True)
                with (out / "rollouts" / f"step_{step + 1}.jsonl").open("w") as f:
                    for t in trajs:
                        f.write(json.dumps(t.to_dict()) + "\n")
            if cfg.train.save_every and (step + 1) % cfg.train.save_every == 0:
                learner.save(out / "checkpoints" / f"step_{step + 1}", tok,
                             {"step": step + 1, "policy_version": version})
            line = (f"reward {m['rollout/reward_mean']:.3f} pass {m['rollout/pass_rate']:.2f} "
                    f"len {m['rollout/response_len']:.0f} {m['perf/step_s']:.1f}s/step")
            if progress is not None:
                progress.update(bar, advance=1, info=line)
            elif not cfg.quiet:
                say(f"[step {step + 1}/{cfg.train.steps}] {line}")
    finally:
        source.close()
    if progress is not None:
        progress.stop()
    timings["rl_s"] = time.perf_counter() - t_loop

    # 3) final checkpoint, evaluation and summary
    final = out / "checkpoints" / f"step_{cfg.train.steps}"
    if latest_checkpoint(out) != final:  # not saved by the loop (or by the run resumed here)
        learner.save(final, tok, {"step": cfg.train.steps, "policy_version": version})
    after = run_eval("after")
    log.log(cfg.train.steps, {f"eval/{k}": v for k, v in after.items()})
    log.close()
    for _, p_ in env_sets.items:
        p_.shutdown()
    if hasattr(engine, "shutdown"):
        engine.shutdown()
    b, a = before["pass@1"], after["pass@1"]
    summary = {"env": cfg.env.name, "algo": cfg.algo.name, "steps": cfg.train.steps,
               "eval_before": before, "eval_after": after,
               "pass@1_ratio": (a / b) if b > 0 else None, "pass@1_gain": a - b,
               "checkpoint": str(final), **sft_info, **timings,
               "stage_seconds": stage_seconds(out / "metrics.jsonl")}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    ratio = f"{a / b:.2f}x" if b > 0 else "n/a"
    say(f"[eval] held-out (T={cfg.rollout.temperature}, {cfg.train.eval_tasks} tasks x "
        f"{cfg.train.eval_samples}, ± standard error): before RL {format_eval(before, cfg.train.eval_samples)}"
        f" -> after RL {format_eval(after, cfg.train.eval_samples)}")
    say(f"[eval] held-out pass@1: before RL {b:.3f} -> after RL {a:.3f} ({ratio}, {a - b:+.3f} absolute); "
        f"`agentrl eval {out}` reproduces the after-RL figure ({out / 'eval'})")
    say(f"[done] checkpoint: {final}; metrics: {out / 'metrics.jsonl'}")
    if console is not None:
        console.print(summary_panel(summary, out))
    return summary
