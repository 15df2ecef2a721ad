"""The training loop, read top to bottom in `train`, each stage a named function:

    set up -> the policy (resume, a given path, or the embedded model) -> warm start (SFT)
    -> the engine, learner and env sets -> evaluate
    for each step: collect -> build batch -> advantages -> epochs x minibatches -> optimizer
                   step (`update`) -> sync weights -> log -> checkpoint
    evaluate -> summary

The loop names no algorithm: it reads what the algorithm declares (`prepare`, `advantages`,
`needs_reference`, the hooks of `agentrl.algos.base.Algorithm`); batch shaping
and filtering live in `agentrl.algos.shaping`, collection in `agentrl.rollout.stages`, the
metrics and the summary in `agentrl.log.steps`, signals in `agentrl.infra.signals`.
Everything runs in this process when `rollout.num_workers=0` and `train.learner_workers=0` (a
breakpoint works anywhere); the learner is `agentrl.learner.group.make_learner`'s.
The pieces of a run are built by `agentrl.run`; the warm start is `agentrl.sft.warm_start`.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import torch

from agentrl.algos.shaping import build_batch, filter_groups, shape_batch
from agentrl.config import Config, ConfigError
from agentrl.env.base import env_state
from agentrl.env.registry import import_env_modules, resolve_env_id
from agentrl.eval.episodes import episode_success, reward_component_means
from agentrl.eval.harness import evaluate_heldout, training_metrics
from agentrl.infra.signals import RunInterrupted, StopRequest
from agentrl.learner.checkpoints import REWARD_STATE, pack_state, prune
from agentrl.learner.local import NonFiniteGradientError, latest_checkpoint
from agentrl.learner.lora import wrap_lora
from agentrl.log.metrics import MetricsLog
from agentrl.log.progress import Reporter
from agentrl.log.steps import (
    format_eval,
    log_gap,
    log_step,
    mark_trained,
    report,
    rollout_metrics,
    worker_profile,
)
from agentrl.rewards.state import restore_reward_state, reward_state
from agentrl.rollout.chat import ChatRenderer, VisionChatRenderer
from agentrl.rollout.collect import check_batch_hooks
from agentrl.rollout.engines.base import SamplingParams
from agentrl.rollout.source import Leases, LockedEngine
from agentrl.rollout.stages import (
    Loop,
    drop_stale,
    frozen_workers,
    held_version,
    make_source,
    refill,
    restart_source,
    shut_down,
    sync,
)
from agentrl.run import (
    build_env,
    heldout_envs,
    load_policy,
    make_engine,
    quiet_libraries,
    reward_wrappers,
    rollout_compile_note,
    seed_everything,
)
from agentrl.sft import warm_start
from agentrl.types import Trajectory

__all__ = ["train"]


# -- set-up ---------------------------------------------------------------------------------------
def lr_schedule(cfg: Config) -> Callable[[int], float]:
    """The run's learning-rate factor per optimizer step (`agentrl.learner.schedules.lr_multiplier`):
    `train.lr_warmup_steps` of warm-up, then `train.lr_schedule` decaying to
    `train.lr_min_ratio` at the run's last optimizer step (`train.steps` x
    `algo.update_epochs` x `algo.minibatches`)."""
    from functools import partial

    from agentrl.learner.schedules import lr_multiplier

    total = cfg.train.steps * cfg.algo.update_epochs * cfg.algo.minibatches
    return partial(lr_multiplier, warmup=cfg.train.lr_warmup_steps, total=total,
                   schedule=cfg.train.lr_schedule, min_ratio=cfg.train.lr_min_ratio)


def set_up(cfg: Config) -> tuple[Config, Any, Path]:
    """Threads, seeds and the algorithm of the run; writes OUT/config.json.

    Returns:
        `(cfg with the run's resolved defaults (`agentrl.run`: the env's, the
        policy's), the algorithm (`agentrl.algos.get_algorithm`), OUT)`.

    Raises:
        ValueError: an unknown env, an `algo` option the algorithm does not support
            (refused by the config's schema), dynamic sampling with `group_size < 2`, or
            `train.device=cuda` without a CUDA device.
        OutError: a new run's `out` is not empty (without `overwrite`), a file, or not writable.
    """
    from agentrl.algos import get_algorithm
    from agentrl.learner.local import resolve_device
    from agentrl.run import resolve_run_defaults

    resolve_device(cfg.train.device)  # fail early: train.device=cuda without a CUDA device
    quiet_libraries()
    torch.set_num_threads(cfg.train.torch_threads)
    seed_everything(cfg.seed)
    import_env_modules(cfg.env.imports)  # their register_env calls run before the lookup
    resolve_env_id(cfg.env.name)  # fail early on an unknown env
    algo = get_algorithm(cfg.algo.name)
    cfg = resolve_run_defaults(cfg)  # a VLM for an image env, its SFT lr
    if cfg.algo.dynamic_sampling and cfg.algo.group_size < 2:
        raise ConfigError("config error: algo.dynamic_sampling needs algo.group_size >= 2 "
                          "(singleton groups carry no signal and would all be dropped)")
    if cfg.sft.steps > 0 and not cfg.resume and not env_has_reference_answers(cfg.env.name):
        raise ConfigError(f"config error: sft.steps={cfg.sft.steps}: env {cfg.env.name} offers no "
                          "reference answers (reference_answer()) for the warm start: set sft.steps=0")
    if cfg.sft.steps > 0 and not cfg.resume:
        for name in cfg.sft.mix_envs:
            try:
                has = env_has_reference_answers(name)
            except ValueError as e:  # an unknown name, reported with the key
                raise ConfigError(f"config error: sft.mix_envs: {e}") from None
            if not has:
                raise ConfigError(f"config error: sft.mix_envs: env {name} offers no reference answers "
                                  "(reference_answer()) to mix into the warm start")
    preflight(cfg)  # before check_out: an --overwrite that fails here has deleted nothing
    out = Path(cfg.resume or cfg.out)
    if cfg.resume:  # the run's own folder; a stray --out / --overwrite is not recorded in it
        cfg = cfg.model_copy(update={"out": str(out), "overwrite": False})
        check_resume_keeps_the_run(cfg, out)
    if not cfg.resume:
        from agentrl.learner.checkpoints import check_out

        try:
            check_out(out, overwrite=cfg.overwrite)
        except ValueError as e:
            raise OutError(str(e)) from None
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(cfg.model_dump_json(indent=1))
    except OSError as e:
        raise OutError(f"out: cannot write to {out}: {e.strerror or e}") from None
    return cfg, algo, out


def preflight(cfg: Config) -> None:
    """Checks of the settings that would otherwise fail only after OUT was (re)written: the env
    is built once (with its wrappers), reset once and closed, `model.path` is a model
    directory, vLLM imports when `rollout.engine=vllm`, a vision policy runs only where images
    do (`agentrl.run.check_vision_training`), a text policy only where no image is
    (`check_policy_sees_images`), and W&B finds an API key (`log.wandb`, `check_wandb_login`).

    Raises:
        ConfigError: naming the key (`env.kwargs`, `env.wrappers`, `env.wrapper_kwargs`,
            `model.path`, `model.vision`, `rollout.engine`, `log.wandb`, or the vision refusal's key).
    """
    import importlib.util

    from agentrl.models.vlm import is_vlm_dir
    from agentrl.rollout.envs import build_env
    from agentrl.run import check_vision_training

    path = cfg.model.path
    if path and not Path(path).is_dir():
        raise ConfigError(f"config error: model.path: model directory not found: {path}")
    if path and not (Path(path) / "config.json").is_file():
        raise ConfigError(f"config error: model.path: {path} holds no config.json (not a Hugging "
                          "Face model directory)")
    if path and cfg.model.vision and not is_vlm_dir(path):
        raise ConfigError(f"config error: model.vision=true with model.path={path}, a text-only model "
                          "(no image processor and vision tower): model.vision builds the embedded "
                          "vision-language model only without model.path; give a vision-language "
                          "model directory, or drop model.path (docs/multimodal.md)")
    if cfg.rollout.engine == "vllm" and importlib.util.find_spec("vllm") is None:
        raise ConfigError("config error: rollout.engine=vllm: vLLM is not installed in this "
                          "environment (docs/scale_out.md says how; or rollout.engine=hf)")
    try:
        check_vision_training(cfg)
    except ValueError as e:
        raise ConfigError(f"config error: {e}") from None
    if cfg.log.wandb:
        from agentrl.log.metrics import check_wandb_login

        check_wandb_login()
    env = build_env(cfg, "train")  # ConfigError for keywords the env or a wrapper refuses
    try:
        check_policy_sees_images(cfg, env)
    finally:
        env.close()


def check_policy_sees_images(cfg: Config, env: Any) -> None:
    """A text-only policy (`model.path` a text model, or the embedded text default) on an env
    whose observations carry images is refused at start-up: `env` is reset once (seed
    `cfg.seed`, within `env.reset_timeout_s`) and its opening messages are looked at; a reset
    that raises or times out is left to the rollouts (contract 7).

    Raises:
        ConfigError: naming the env and the key to set (`model.vision=true`, or `model.path`).
    """
    from agentrl.env.content import message_images
    from agentrl.models.vlm import is_vlm_dir

    path = cfg.model.path
    if cfg.model.vision or (path and is_vlm_dir(path)):  # a resumed run's too: its config says
        return
    from agentrl.rollout.agent_loop import call_with_timeout

    try:  # within env.reset_timeout_s, as in rollouts
        obs, _ = call_with_timeout(lambda: env.reset(seed=cfg.seed), cfg.env.reset_timeout_s)
    except Exception:  # noqa: BLE001 - the env's own failure (or a timeout), met again in rollouts
        return
    if isinstance(obs, list) and message_images([m for m in obs if isinstance(m, dict)]):
        model = f"model.path={path} is a text-only model" if path else "the embedded default is a text model"
        raise ConfigError(f"config error: model.vision: env {cfg.env.name} sends image observations, but "
                          f"{model}: set model.vision=true (the embedded tiny vision-language model) or "
                          "model.path=<a local vision-language model directory> (docs/multimodal.md)")


RESUME_FIXED = ("env.name", "algo.name", "env.dataset")
"""Settings a resumed run keeps: changing one would continue another run's policy, optimizer and
metrics under a different task or objective (start a new run for that)."""


def check_resume_keeps_the_run(cfg: Config, out: Path) -> None:
    """`--resume OUT` with a setting of `RESUME_FIXED` other than the run's (OUT/config.json)
    is refused before anything is written, so the run's config.json stays the run's; so is a
    `train.steps` below the step of the run's newest intact checkpoint.

    Raises:
        ResumeError: names the setting, the run's value and the one asked for.
    """
    saved_file = out / "config.json"
    if not saved_file.is_file():
        return
    saved = json.loads(saved_file.read_text())
    now = json.loads(cfg.model_dump_json())
    for key in RESUME_FIXED:
        section, name = key.split(".")
        was, want = saved.get(section, {}).get(name), now[section][name]
        if was != want:
            raise ResumeError(f"--resume {out}: the run was trained with {key}={was}, not {want}; "
                              "a resumed run keeps its env and algorithm (start a new run with "
                              "--out for another one)")
    from agentrl.learner.local import latest_checkpoint

    ck = latest_checkpoint(out)
    done = json.loads((ck / "agentrl_state.json").read_text())["step"] if ck is not None else 0
    if cfg.train.steps < done:  # would rewrite config.json's train.steps below the run's own
        raise ResumeError(f"--resume {out}: the run is at step {done}, past train.steps={cfg.train.steps}; "
                          f"give --steps {done} or more (or leave --steps out)")


def env_has_reference_answers(name: str) -> bool:
    """Does env `name`'s class define `reference_answer()` (the warm start's targets)?"""
    import gymnasium as gym
    from gymnasium.envs.registration import load_env_creator

    ep = gym.spec(resolve_env_id(name)).entry_point
    cls = load_env_creator(ep) if isinstance(ep, str) else ep
    return callable(getattr(cls, "reference_answer", None))


class OutError(ValueError):
    """`out` cannot take a new run (not empty, a file): the message says what to do."""


class ResumeError(ValueError):
    """`--resume` found no intact checkpoint to continue from."""


def resume_checkpoint(cfg: Config, out: Path, say: Callable[[str], None]) -> Path | None:
    """The checkpoint to resume from with `cfg.resume` (OUT's newest intact one; newer ones
    that fail their manifest are skipped, each named), or None for a new run.

    Raises:
        ResumeError: `cfg.resume` is set and OUT has no intact checkpoint.
    """
    from agentrl.learner.local import latest_checkpoint

    if not cfg.resume:
        return None
    ck = latest_checkpoint(out, on_skip=lambda p, why: say(f"[resume] skipping {p}: {why}"))
    if ck is None:
        raise ResumeError(f"--resume {out}: no intact checkpoint to resume from (the run stopped "
                          "before its first save, or every checkpoint failed its manifest); start it "
                          f"again with --out {out} --overwrite")
    if cfg.train.learner_workers > 0 and not (ck / "dcp").is_dir():
        raise ResumeError(f"--resume {out}: {ck} was written by the in-process learner "
                          "(train.learner_workers=0) and has no sharded state (dcp/) for learner ranks; "
                          "resume it with train.learner_workers=0")
    return ck


def build_loop(cfg: Config, algo: Any, out: Path, model: Any, tok: Any, renderer: ChatRenderer,
               ck: Path | None, say: Callable[[str], None], reporter: Any = None) -> Loop:
    """The engine (current weights), the learner (loaded from `ck` on resume), the env sets
    with their shared reward wrappers, the held-out envs and the metrics log; stage progress
    goes to `reporter` (None: silent)."""
    from agentrl.learner.group import make_learner
    from agentrl.learner.lora import merged_state_dict

    engine = make_engine(cfg, model, tok, out)
    learner = make_learner(cfg, algo, model, lr_schedule(cfg))
    if cfg.placement.reference == "worker" and algo.needs_reference(cfg.algo):
        from agentrl.learner.frozen import make_reference

        learner.reference = make_reference(cfg, model, tok, out, ck)
    if cfg.placement.teacher == "worker" and algo.needs_teacher:
        from agentrl.learner.frozen import make_teacher

        learner.teacher = make_teacher(cfg)
    for note in (learner.compile_note(), rollout_compile_note(cfg, engine)):
        if note:
            say(f"[compile] {note}")
    for note in learner.fast_path_notes():
        say(f"[learner] {note}")
    start_step, version, extra = 0, 0, {}
    if ck is not None:
        extra = learner.load(ck)
        restore_inline_reference(cfg, learner, ck, out)
        start_step, version = extra["step"], extra["policy_version"]
        engine.update_weights(merged_state_dict(model), version)
        say(f"[resume] from {ck} at step {start_step} (policy version {version})")
    n_eps = cfg.rollout.tasks_per_step * cfg.algo.group_size
    rewards = reward_wrappers(cfg)
    new_env = partial(build_env, cfg, rewards=rewards)  # new_env(split)
    envs = [new_env("train") for _ in range(n_eps)]
    check_batch_hooks(engine, envs[0])  # e.g. self_propose with Ray rollout workers: refused now
    if ck is not None and "env_state" in extra:  # e.g. self_propose's task buffer
        from agentrl.env.base import load_env_state

        load_env_state(envs[0], extra["env_state"])
    eval_envs = heldout_envs(cfg, rewards)
    pool = ThreadPoolExecutor(max_workers=cfg.rollout.env_threads)
    log = MetricsLog(out, cfg.log.tensorboard, start_step=start_step, run_config=cfg.model_dump(),
                     wandb_project=cfg.log.wandb_project if cfg.log.wandb else None)
    if log.note:
        say(f"[warning] {log.note}")
    params = SamplingParams(temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
                            max_tokens=cfg.rollout.max_tokens, stop_token_ids=renderer.stop_ids)
    # Async actor threads, evaluation and refills share the engine: an in-process engine is
    # entered by one generate / weight update at a time (LockedEngine), so that batches in flight
    # interleave per generate call; evaluation and refills hold the same (re-entrant) lock for
    # their whole run, and weight updates take it too. Each batch leases its own envs + pool.
    lock = threading.RLock()
    if not hasattr(engine, "run"):
        engine = LockedEngine(engine, lock)
    env_sets = Leases(lambda: ([new_env("train") for _ in range(n_eps)],
                               ThreadPoolExecutor(max_workers=cfg.rollout.env_threads)), [(envs, pool)])
    if cfg.rollout.mode == "async" and not hasattr(engine, "run"):
        env_sets.fill(cfg.rollout.batches_in_flight)  # built now, in a fixed order
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else renderer.end_of_turn_id
    from agentrl.log.progress import Reporter

    lp = Loop(cfg, out, say, algo, model, tok, renderer, pad_id, learner, engine, lock, env_sets,
              eval_envs, pool, params, log, new_env, start_step, version, rewards,
              reporter=reporter or Reporter(enabled=False))
    if algo.needs_teacher and cfg.algo.distill_teacher_fraction > 0:  # GKD's mixture
        from agentrl.algos.distill import teacher_task_count
        from agentrl.run import make_teacher_engine

        n_t = teacher_task_count(cfg.algo.distill_teacher_fraction, cfg.rollout.tasks_per_step)
        lp.teacher_engine = LockedEngine(make_teacher_engine(cfg, tok), lock)
        lp.teacher_envs = [new_env("train") for _ in range(n_t * cfg.algo.group_size)]
        say(f"[distill] the teacher plays {n_t} of each step's {cfg.rollout.tasks_per_step} tasks "
            f"(algo.distill_teacher_fraction={cfg.algo.distill_teacher_fraction})")
    if ck is not None:
        restore_reward_state(lp, ck)
    return lp


def restore_inline_reference(cfg: Config, learner: Any, ck: Path, out: Path) -> None:
    """A run that started with `placement.reference=worker` and resumes inline: its checkpoints
    hold no reference weights (`ref_model.pt`), so the learner's frozen copy (made from the
    resumed policy) is loaded from OUT/reference_model, the weights the run started from.

    Raises:
        ResumeError: neither is there (the learner would silently take the resumed policy as
            its reference)."""
    ref = getattr(learner, "ref_model", None)
    if cfg.placement.reference != "inline" or ref is None or (ck / "ref_model.pt").exists() \
            or (ck / "dcp").is_dir():  # (learner ranks' checkpoints keep the reference in dcp/)
        return
    if not (out / "reference_model" / "config.json").exists():
        raise ResumeError(f"--resume {out}: {ck} has no reference weights (ref_model.pt) and "
                          f"{out / 'reference_model'} does not exist")
    from agentrl.models.tiny import load_model

    ref.load_state_dict(load_model(out / "reference_model")[0].state_dict())


# -- the stages that reach the learner and the evaluation -----------------------------------------
def evaluate(lp: Loop, tag: str) -> dict[str, float]:
    """Evaluate the learner's current weights on the held-out list (written to
    OUT/eval/<tag>, as `agentrl eval` writes): in async mode the engine may still hold an
    older version (a push is applied only when an actor starts its next batch)."""
    t0 = time.perf_counter()
    engine = lp.engine
    with lp.lock:
        if held_version(lp) < lp.version:
            engine.update_weights(lp.learner.state_dict_for_engines(), lp.version)
        remote = (lambda sp, p, s: engine.run(sp, p, seed=s, split="heldout")) if hasattr(engine, "run") else None
        r = training_metrics(evaluate_heldout(None if remote else engine, lp.renderer, lp.eval_envs, lp.cfg,
                                              lp.pool, rollout=remote, out_dir=lp.out / "eval" / tag,
                                              make_env=partial(lp.new_env, "heldout"),
                                              reporter=lp.reporter, stage=f"eval {tag}"))
        r["policy_version"] = float(held_version(lp))  # the weights evaluated
    r["seconds"] = time.perf_counter() - t0
    return r


def evaluate_before(lp: Loop, resumed: bool) -> dict[str, float]:
    """The held-out evaluation before RL (kept in OUT/eval_before.json; a resumed run reads it),
    logged at step 0 of OUT/metrics.jsonl (`eval/...`), so curves start from it."""
    cfg, out = lp.cfg, lp.out
    before = json.loads((out / "eval_before.json").read_text()) if resumed and \
        (out / "eval_before.json").exists() else None
    if before is None:
        lp.say(f"[eval] held-out: {cfg.train.eval_tasks} tasks x {cfg.train.eval_samples} samples ...")
        before = evaluate(lp, "before")
        (out / "eval_before.json").write_text(json.dumps(before))
        lp.log.log(0, {f"eval/{k}": v for k, v in before.items()})
        lp.say(f"[eval] before RL: {format_eval(before, cfg.train.eval_samples)} ({before['seconds']:.0f} s)")
    return before


def update(lp: Loop, trajs: list[Trajectory], step: int, m: dict[str, float]) -> list[Trajectory]:
    """Build the batch (the algorithm's group filter and shaping, `agentrl.algos.shaping`), the
    algorithm's passes (`prepare`, reference logprobs), advantages, and the learner's epochs x
    minibatches of optimizer steps; records their metrics in `m` (the algorithm's `advantages`
    statistics as `adv/...`, e.g. `adv/reward_mean` over the groups trained on; its `prepare`
    and shaping ones as `rollout/...`; the learner's as `loss/...`) and returns the
    trajectories trained on."""
    cfg, algo, learner = lp.cfg, lp.algo, lp.learner
    t0 = time.perf_counter()
    trajs, fm = filter_groups(trajs, partial(refill, lp, step), cfg.algo,
                              cfg.rollout.tasks_per_step * cfg.algo.group_size)
    m.update({f"rollout/{k}": v for k, v in fm.items()})
    batch = build_batch(trajs, lp.pad_id)
    if not bool((batch["loss_mask"] != 0).any()):  # e.g. every reset failed: nothing to learn from
        m["loss/skipped_empty_batch"] = 1.0
        errs = [str(t.info["error"]) for t in trajs if t.info.get("error")]
        lp.say(f"[warning] step {step + 1}: update skipped: the batch has no trainable tokens "
               f"({len(trajs)} episodes, {len(errs)} with an env error"
               + (f"; first: {errs[0][:200]}" if errs else "") + ") (loss/skipped_empty_batch)")
        m.update({"loss/lr": learner.lr, "perf/policy_update_s": 0.0,
                  "perf/update_s": time.perf_counter() - t0, "perf/update_tokens": 0.0})
        return []
    sm = shape_batch(batch, trajs, cfg.algo, cfg.rollout.max_tokens,
                     mask_truncated=algo.masks_truncated(cfg.algo))
    m.update({f"rollout/{k}": v for k, v in sm.items()})
    ref0 = learner.ref_seconds
    t_prep = time.perf_counter()
    batch, pm = algo.prepare(batch, learner, cfg.algo)  # algorithm-specific passes: old logprobs, values, pairs, ...
    m.update({f"rollout/{k}": float(v) for k, v in pm.items()})
    # the no-grad pass of `prepare` (e.g. old logprobs and values), its reference calls excluded
    m["perf/prepare_s"] = time.perf_counter() - t_prep - (learner.ref_seconds - ref0)
    if algo.needs_reference(cfg.algo) and "ref_logprobs" not in batch:
        batch["ref_logprobs"] = learner.logprobs(batch, ref=True)
    m["perf/reference_s"] = learner.ref_seconds - ref0  # computing (inline) or waiting (worker)
    log_gap(frozen_workers(learner), cfg.placement, batch, step, m)
    batch["advantages"], gstats = algo.advantages(batch, cfg.algo)
    mark_trained(trajs, batch)
    # what the advantages were computed from (the kept groups' valid returns, under a group
    # filter): their own names, never over the raw rollout statistics
    m.update({f"adv/{k}": float(v) for k, v in gstats.items()})
    t_upd = time.perf_counter()
    try:
        upd = learner.update(batch, algo, cfg.algo, epochs=cfg.algo.update_epochs,
                             minibatches=cfg.algo.minibatches, seed=cfg.seed + step)
    except NonFiniteGradientError as e:
        raise NonFiniteGradientError(f"step {step + 1}: {e}") from None
    # the learner's update (a value head shares the policy's forward, backward and optimizer
    # step, so this is the policy and value update together)
    m["perf/policy_update_s"] = time.perf_counter() - t_upd
    if upd.get("skipped_nonfinite"):
        lp.say(f"[warning] step {step + 1}: {upd['skipped_nonfinite']:.0f} optimizer step(s) skipped: "
               f"non-finite gradient norm (loss/skipped_nonfinite; {learner.nonfinite_streak} in a row, "
               f"the run stops at train.max_nonfinite_steps={cfg.train.max_nonfinite_steps})")
    m.update({f"loss/{k}": v for k, v in upd.items()})
    m["loss/lr"] = learner.lr  # the lr of the next step
    m["perf/update_s"] = time.perf_counter() - t0
    m["perf/update_tokens"] = float(batch["attention_mask"].sum())  # tokens the update forwarded
    return trajs


def checkpoint(lp: Loop, step: int) -> Path:
    """Save the learner, the reward wrappers' state (`reward_state`, as `REWARD_STATE`) and the
    train envs' `agentrl.env.base.env_state` (as `env_state` in `agentrl_state.json`, when they have
    one) after `step` steps to OUT/checkpoints/step_<step>, then delete all but the newest
    `train.keep_checkpoints`."""
    path = lp.out / "checkpoints" / f"step_{step}"
    extra: dict[str, Any] = {"step": step, "policy_version": lp.version}
    state = env_state(lp.env_sets.items[0][0][0])  # e.g. self_propose's task buffer (shared)
    if state is not None:
        extra["env_state"] = state
    rs = reward_state(lp)
    lp.learner.save(path, lp.tok, extra,
                    files={REWARD_STATE: pack_state(rs)} if rs is not None else None)
    prune(lp.out, lp.cfg.train.keep_checkpoints)
    return path


# -- the loop -------------------------------------------------------------------------------------
def train(cfg: Config, *, console: Any = None) -> dict[str, Any]:
    """Train `cfg.algo.name` on `cfg.env.name`; returns the summary (also OUT/summary.json).

    Raises:
        ValueError: a configuration that cannot run (e.g. unknown env), before any work.
        RunInterrupted: Ctrl-C / SIGTERM stopped the run after saving its last step.
    """
    reporter = Reporter(console, enabled=not cfg.quiet)
    say = reporter.line  # flushed: a log file grows while the run works
    cfg, algo, out = set_up(cfg)
    say(f"[run] {cfg.algo.name} on {cfg.env.name}: {cfg.train.steps} steps -> {out}")

    # 1) the policy: resume, a given path, or the embedded default (+ warm start)
    ck = resume_checkpoint(cfg, out, say)
    if ck is not None and json.loads((ck / "agentrl_state.json").read_text())["step"] >= cfg.train.steps \
            and (out / "summary.json").exists():
        say(f"[resume] {out} finished all {cfg.train.steps} steps already; nothing to do")
        return json.loads((out / "summary.json").read_text())
    model, tok, path = load_policy(cfg, out, ck, reporter)
    renderer = VisionChatRenderer(tok, tok.image_processor) \
        if getattr(tok, "image_processor", None) is not None else ChatRenderer(tok)  # a VLM policy
    try:
        algo.check_tokenizer(cfg.algo, tok)  # e.g. a teacher's, compared by id
    except ValueError as e:
        raise ConfigError(f"config error: {e}") from None
    extra: dict[str, Any] = {}  # the summary's: the warm start's `sft_seconds`, the loop's `rl_s`
    if ck is None and cfg.sft.steps > 0:
        pad_id = tok.pad_token_id if tok.pad_token_id is not None else renderer.end_of_turn_id
        extra = warm_start(cfg, model, tok, renderer, pad_id, out, say, reporter)
    if ck is None and cfg.model.lora_r > 0:  # LoRA: train adapters only; the base stays frozen
        model = wrap_lora(model, r=cfg.model.lora_r, alpha=cfg.model.lora_alpha,
                          target_modules=cfg.model.lora_target_modules, seed=cfg.seed,
                          base_path=out / "sft_model" if extra else path)
    lp = build_loop(cfg, algo, out, model, tok, renderer, ck, say, reporter)
    try:  # learner ranks, reference and teacher workers (Ray actors) are stopped whatever happens
        before = evaluate_before(lp, resumed=ck is not None)

        # 2) the RL loop
        bar = lp.reporter.stage("train", cfg.train.steps, unit="RL steps", every_s=0.0,
                                completed=lp.start_step)  # no terminal: a line per step
        workers = frozen_workers(lp.learner)
        worker_profile(workers, lp.rewards, cfg, {"perf/step_s": 0.0})  # evaluation's time: no step's
        source = make_source(lp, lp.start_step)
        t_loop = time.perf_counter()
        stop = StopRequest()
        try:  # on any exception (Ctrl-C too) the actor threads are stopped before it propagates
            stop.install()
            for step in range(lp.start_step, cfg.train.steps):
                m: dict[str, float] = {}
                t0 = time.perf_counter()
                trajs, src_metrics = source.next_batch(step)  # sync: sampled now; async: from the actor
                m.update(src_metrics)
                m["perf/rollout_s"] = time.perf_counter() - t0
                trajs = drop_stale(lp, trajs, m)
                m.update(rollout_metrics(trajs, episode_success, [
                    algo.mixture_metrics(trajs, episode_success),
                    reward_component_means(trajs)]))
                trajs = update(lp, trajs, step, m)
                sync(lp, source, step, m)
                m["perf/step_s"] = m["perf/rollout_s"] + m["perf/update_s"] + m["perf/sync_s"]
                worker_profile(workers, lp.rewards, cfg, m)
                m["perf/loop_s"] = time.perf_counter() - t_loop  # wall clock since the loop started
                if cfg.train.eval_every and (step + 1) % cfg.train.eval_every == 0 and step + 1 < cfg.train.steps:
                    m.update({f"eval/{k}": v for k, v in evaluate(lp, f"step_{step + 1}").items()})
                    worker_profile(workers, lp.rewards, cfg, {"perf/step_s": 0.0})
                line = log_step(lp, step, m, trajs)
                saved = bool(cfg.train.save_every and (step + 1) % cfg.train.save_every == 0)
                if saved:
                    checkpoint(lp, step + 1)
                    if cfg.rollout.mode == "async" and step + 1 < cfg.train.steps and stop.signal is None:
                        source = restart_source(lp, source, step + 1)  # as a resume from it would
                bar.advance(1, line)
                if stop.signal is not None:  # Ctrl-C / SIGTERM: keep the step just finished
                    path = checkpoint(lp, step + 1) if not saved else out / "checkpoints" / f"step_{step + 1}"
                    raise RunInterrupted(f"[stopped] {stop.signal} after step {step + 1}/{cfg.train.steps}; "
                                         f"checkpoint {path}; continue with: agentrl train --resume {out}",
                                         stop.signal)
        finally:
            bar.close()
            stop.uninstall()
            source.close()
        extra["rl_s"] = time.perf_counter() - t_loop

        # 3) final checkpoint, evaluation and summary
        final = out / "checkpoints" / f"step_{cfg.train.steps}"
        if latest_checkpoint(out) != final:  # not saved by the loop (or by the run resumed here)
            checkpoint(lp, cfg.train.steps)
        after = evaluate(lp, "after")
        lp.log.log(cfg.train.steps, {f"eval/{k}": v for k, v in after.items()})
        shut_down(lp)
        return report(lp, before, after, final, extra, console)
    finally:
        reporter.stop()
        if hasattr(lp.learner, "shutdown"):
            lp.learner.shutdown()
        for w in frozen_workers(lp.learner):
            w.shutdown()
