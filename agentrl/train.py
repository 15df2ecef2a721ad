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
The run is built, its start-up checks run and its warm start (`agentrl.sft.warm_start`) made by\n`agentrl.run.build`.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from agentrl.algos.shaping import build_batch, filter_groups, shape_batch
from agentrl.config import Config
from agentrl.env.base import env_state
from agentrl.eval.attempts import step_attempt_metrics
from agentrl.eval.episodes import episode_success, reward_component_means
from agentrl.eval.harness import evaluate_heldout, training_metrics
from agentrl.eval.tasks import eval_task_count
from agentrl.infra.runfolder import unlock_run
from agentrl.infra.signals import RunInterrupted, StopRequest
from agentrl.learner.checkpoints import REWARD_STATE, RUN_CONFIG, pack_state, prune
from agentrl.learner.local import NonFiniteGradientError, latest_checkpoint
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
from agentrl.rollout.agent_loop import turn_samples
from agentrl.rollout.drift import drift_line
from agentrl.rollout.engines.base import SamplingParams
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
    worker_health,
)
from agentrl.run import Run, build
from agentrl.sft import warm_start
from agentrl.types import Trajectory

__all__ = ["train"]


# -- set-up ---------------------------------------------------------------------------------------
def build_loop(run: Run, say: Callable[[str], None], reporter: Any = None) -> Loop:
    """The loop's state on the pieces `run` (`agentrl.run.build`) made: the metrics log and the
    sampling parameters; on resume, the reward wrappers' state (`restore_reward_state`). Stage
    progress goes to `reporter` (None: silent)."""
    cfg, out, renderer = run.cfg, run.out, run.renderer
    assert out is not None and renderer is not None and run.new_env is not None and run.env_sets is not None
    log = MetricsLog(out, cfg.log.tensorboard, start_step=run.start_step, run_config=cfg.model_dump(),
                     wandb_project=cfg.log.wandb_project if cfg.log.wandb else None)
    if log.note:
        say(f"[warning] {log.note}")
    params = SamplingParams(temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
                            max_tokens=cfg.rollout.max_tokens, stop_token_ids=renderer.stop_ids)
    lp = Loop(cfg, out, say, run.algo, run.model, run.tok, renderer, run.pad_id, run.learner, run.engine,
              run.lock, run.env_sets, run.eval_envs, run.pool, params, log, run.new_env, run.start_step,
              run.version, run.rewards, reporter=reporter or Reporter(enabled=False),
              mixture_engine=run.mixture_engine, mixture_envs=run.mixture_envs)
    for note in run.notes:  # e.g. a second sampler's share of the tasks
        say(note)
    if run.checkpoint is not None:
        restore_reward_state(lp, run.checkpoint)
    return lp


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
        remote = (lambda sp, p, s: engine.run(sp, p, seed=s, split="heldout", one_per_run=True)) if hasattr(engine, "run") else None
        r = training_metrics(evaluate_heldout(None if remote else engine, lp.renderer, lp.eval_envs, lp.cfg,
                                              lp.pool, rollout=remote, out_dir=lp.out / "eval" / tag,
                                              make_env=partial(lp.new_env, "heldout"),
                                              reporter=lp.reporter, stage=f"eval {tag}"))
        r["policy_version"] = float(held_version(lp))  # the weights evaluated
    r["seconds"] = time.perf_counter() - t0
    return r


def heldout_tasks(lp: Loop) -> int:
    """The held-out tasks the run's evaluations run (`agentrl.eval.tasks.eval_task_count`): the
    first `train.eval_tasks`, or all of a smaller held-out list."""
    n = lp.cfg.train.eval_tasks
    return eval_task_count(lp.eval_envs[0], n) if lp.eval_envs else n


def evaluate_before(lp: Loop, resumed: bool) -> dict[str, float]:
    """The held-out evaluation before RL (kept in OUT/eval_before.json with the `temperature` it
    sampled at; a resumed run reads it), logged at step 0 of OUT/metrics.jsonl (`eval/...`), so curves start from it."""
    cfg, out = lp.cfg, lp.out
    before = json.loads((out / "eval_before.json").read_text()) if resumed and \
        (out / "eval_before.json").exists() else None
    if before is not None:
        before.pop("temperature", None)  # the file's record of it (`before_temperature`), no metric
    else:
        lp.say(f"[eval] held-out: {heldout_tasks(lp)} tasks x {cfg.train.eval_samples} samples ...")
        before = evaluate(lp, "before")
        (out / "eval_before.json").write_text(json.dumps({**before, "temperature": cfg.rollout.temperature}))
        lp.log.log(0, {f"eval/{k}": v for k, v in before.items()})
        lp.say(f"[eval] before RL: {format_eval(before, cfg.train.eval_samples)} ({before['seconds']:.0f} s)")
    return before


def update(lp: Loop, trajs: list[Trajectory], step: int, m: dict[str, float]) -> list[Trajectory]:
    """Build the batch (the algorithm's group filter and shaping, `agentrl.algos.shaping`), the
    algorithm's passes (`prepare`, reference logprobs), advantages, and the learner's epochs x
    minibatches of optimizer steps; records their metrics in `m` (the algorithm's `advantages`
    statistics as `adv/...`, e.g. `adv/reward_mean` over the groups trained on; its `prepare`
    and shaping ones as `rollout/...`; the learner's as `loss/...`) and returns the
    trajectories trained on (a batch without a trainable token is not: its update is skipped
    and its episodes are returned marked untrained, so that rollouts/ records them)."""
    cfg, algo, learner = lp.cfg, lp.algo, lp.learner
    t0 = time.perf_counter()
    sampled = len(trajs)
    trajs, fm = filter_groups(trajs, partial(refill, lp, step), cfg.algo,
                              cfg.rollout.tasks_per_step * cfg.algo.group_size)
    m.update({f"rollout/{k}": v for k, v in fm.items()})
    trajs = turn_samples(trajs)  # rollout.history=template: one sample per turn
    batch = build_batch(trajs, lp.pad_id)
    if not bool((batch["loss_mask"] != 0).any()):  # e.g. every reset failed: nothing to learn from
        m["loss/skipped_empty_batch"] = 1.0
        errs = [str(t.info["error"]) for t in trajs if t.info.get("error")]
        if not trajs and sampled and "refill_rounds" in fm:
            why = (f"dynamic sampling (algo.dynamic_sampling) kept no group: {sampled} episodes sampled, "
                   f"{fm['refill_rounds']} refill rounds, in every group the episodes scored alike")
        else:
            why = (f"{len(trajs)} episodes, {len(errs)} with an env error"
                   + (f"; first: {errs[0][:200]}" if errs else ""))
        lp.say(f"[warning] step {step + 1}: update skipped: the batch has no trainable tokens "
               f"({why}) (loss/skipped_empty_batch)")
        m.update({"loss/lr": learner.lr, "perf/policy_update_s": 0.0,
                  "perf/update_s": time.perf_counter() - t0, "perf/update_tokens": 0.0})
        for t in trajs:  # recorded in rollouts/ as any step's episodes (with their errors)
            t.info["advantage"], t.info["trained"] = 0.0, False
        return trajs
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


class DeadRewardError(RuntimeError):
    """`train.max_nonfinite_reward_steps` steps in a row had no finite reward."""


def check_reward_source(cfg: Config, trajs: list[Any], step: int, streak: int) -> int:
    """The count of steps in a row, ending with `step`, whose episode rewards are all NaN or
    infinite (0 when `trajs` has a finite one, or no episode).

    Raises:
        DeadRewardError: the count reaches `train.max_nonfinite_reward_steps` (> 0); names the
            env, its reward settings (`env.kwargs` keys naming a judge, URL or reward model) and
            the first episode error.
    """
    if not trajs or any(math.isfinite(t.episode_return) for t in trajs):
        return 0
    streak += 1
    cap = cfg.train.max_nonfinite_reward_steps
    if cap and streak >= cap:
        src = {k: v for k, v in cfg.env.kwargs.items() if any(w in k for w in ("judge", "url", "reward"))}
        errs = [str(e) for t in trajs for e in ([t.info["error"]] if t.info.get("error") else [])
                + list(t.info.get("errors", []))]
        raise DeadRewardError(
            f"step {step + 1}: every episode reward of the last {streak} steps was NaN or infinite: the "
            f"reward source of env {cfg.env.name}" + (f" ({', '.join(f'env.kwargs.{k}={v}' for k, v in src.items())})"
                                                      if src else "")
            + " gives no reward" + (f"; first error: {errs[0][:300]}" if errs else "")
            + f" (train.max_nonfinite_reward_steps={cap}; the last checkpoint is kept)")
    return streak


def checkpoint(lp: Loop, step: int) -> Path:
    """Save the learner, the run's config (`RUN_CONFIG`), the reward wrappers' state
    (`reward_state`, as `REWARD_STATE`) and the
    train envs' `agentrl.env.base.env_state` (as `env_state` in `agentrl_state.json`, when they have
    one) after `step` steps to OUT/checkpoints/step_<step>, then delete all but the newest
    `train.keep_checkpoints`."""
    path = lp.out / "checkpoints" / f"step_{step}"
    extra: dict[str, Any] = {"step": step, "policy_version": lp.version}
    state = env_state(lp.env_sets.items[0][0][0])  # e.g. self_propose's task buffer (shared)
    if state is not None:
        extra["env_state"] = state
    rs = reward_state(lp)
    files = {RUN_CONFIG: lp.cfg.model_dump_json(indent=1).encode()}  # what --resume compares config.json with
    if rs is not None:
        files[REWARD_STATE] = pack_state(rs)
    lp.learner.save(path, lp.tok, extra, files=files)
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
    try:  # OUT's lock (taken by `build`) is held until this returns or raises
        return _train(cfg, reporter, say, console)
    finally:
        unlock_run(Path(cfg.resume or cfg.out))


def _train(cfg: Config, reporter: Reporter, say: Callable[[str], None], console: Any) -> dict[str, Any]:
    """`train` after its reporter is made, under OUT's lock."""
    run = build(cfg, reporter=reporter, warm_start=warm_start)  # checks; policy (+ warm start)
    if run.summary is not None:  # a resumed run that had finished already
        return run.summary
    cfg, algo, out, ck = run.cfg, run.algo, run.out, run.checkpoint
    assert out is not None
    extra = dict(run.sft_info)  # the summary's: the warm start's `sft_seconds`, the loop's `rl_s`
    lp = build_loop(run, say, reporter)
    try:  # learner ranks and frozen-model workers (Ray actors) are stopped whatever happens
        before = evaluate_before(lp, resumed=ck is not None)

        # 2) the RL loop
        bar = lp.reporter.stage("train", cfg.train.steps, unit="RL steps", every_s=0.0,
                                completed=lp.start_step)  # no terminal: a line per step
        workers = frozen_workers(lp.learner)
        worker_profile(workers, lp.rewards, cfg, {"perf/step_s": 0.0})  # evaluation's time: no step's
        source = make_source(lp, lp.start_step)
        t_loop = time.perf_counter()
        stop = StopRequest()
        dead = 0  # steps in a row whose rewards were all non-finite
        drift_said = False  # the [template] drift line is said once per run
        try:  # on any exception (Ctrl-C too) the actor threads are stopped before it propagates
            stop.install()
            for step in range(lp.start_step, cfg.train.steps):
                m: dict[str, float] = {}
                t0 = time.perf_counter()
                trajs, src_metrics = source.next_batch(step)  # sync: sampled now; async: from the actor
                m.update(src_metrics)
                m["perf/rollout_s"] = time.perf_counter() - t0
                trajs = drop_stale(lp, trajs, m)
                worker_health(lp, m)
                m.update(rollout_metrics(trajs, episode_success, [
                    algo.mixture_metrics(trajs, episode_success),
                    reward_component_means(trajs), step_attempt_metrics(trajs)]))
                dead = check_reward_source(cfg, trajs, step, dead)
                if not drift_said and (said := drift_line(trajs)):
                    lp.say(said)
                    drift_said = True
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
        return report(lp, before, after, final, extra, console, n_tasks=heldout_tasks(lp))
    finally:
        reporter.stop()
        if hasattr(lp.learner, "shutdown"):
            lp.learner.shutdown()
        for w in frozen_workers(lp.learner):
            w.shutdown()
