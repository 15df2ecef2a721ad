"""The training loop, read top to bottom in `train` (then `_evaluate_train_evaluate`), each
stage a function:

    set up -> the policy (resume, a given path, or the embedded model) -> warm start (SFT)
    -> the engine, learner and env sets -> evaluate
    for each step: collect rollouts -> batch -> advantages -> update -> sync weights -> log
                   -> checkpoint
    evaluate -> summary

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
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentrl.config import Config, ConfigError
from agentrl.env.registry import import_env_modules, resolve_env_id
from agentrl.eval.episodes import episode_success, reward_component_means
from agentrl.log.metrics import MetricsLog
from agentrl.rollout.chat import ChatRenderer
from agentrl.rollout.collect import check_batch_hooks, collect
from agentrl.rollout.engines.base import SamplingParams
from agentrl.rollout.source import AsyncSource, Leases, LockedEngine, SyncSource
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
from agentrl.types import Trajectory, collate

__all__ = ["DYNAMIC_SAMPLING_MAX_ROUNDS", "build_batch", "collect", "dynamic_sampling", "format_eval", "train"]


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
        drop = zero_variance_mask(scores, group_keys(ts)).tolist()
        return [t for t, d in zip(ts, drop) if not d]

    kept, rounds = informative(trajs), 0
    while len(kept) < want and rounds < max_rounds:
        rounds += 1
        kept += informative(more(rounds))
    groups: dict[Any, list[Trajectory]] = {}
    for t in kept:
        groups.setdefault((t.group_id, t.info.get("group_key")), []).append(t)
    out: list[Trajectory] = []
    for g in groups.values():
        if len(out) + len(g) > want:
            break
        out += g
    return out, rounds


def group_keys(trajs: list[Trajectory]) -> list[int]:
    """The advantage group of each trajectory: its `group_id` split further by the env's
    `info["group_key"]` (e.g. `self_propose`'s role and mode), so that episodes of different
    roles or modes never share a baseline even under one `group_id`. Returns ints numbered
    0, 1, ... in order of first appearance."""
    ids: dict[tuple[int, Any], int] = {}
    return [ids.setdefault((t.group_id, t.info.get("group_key")), len(ids)) for t in trajs]


def build_batch(trajs: list[Trajectory], pad_id: int) -> dict[str, Any]:
    """Collate trajectories and attach `scores` (B,) episode returns, `group_ids` (B,)
    (`group_keys`: role-aware) and `truncated` (B,). A NaN return (a failed reward) stays NaN, and an episode that sampled no
    token gets NaN (case A9): both are excluded from group statistics and get advantage 0."""
    batch = collate(trajs, pad_id)
    batch["scores"] = torch.tensor(
        [t.episode_return if t.num_sampled > 0 else float("nan") for t in trajs], dtype=torch.float32)
    batch["group_ids"] = torch.tensor(group_keys(trajs), dtype=torch.long)
    batch["truncated"] = torch.tensor([t.truncated for t in trajs], dtype=torch.bool)
    if any(t.info.get("sampler") == "teacher" for t in trajs):  # distill's GKD mixture
        batch["teacher_rows"] = torch.tensor([t.info.get("sampler") == "teacher" for t in trajs],
                                             dtype=torch.bool)
    return batch


# -- the stages ---------------------------------------------------------------------------------
@dataclass
class Loop:
    """What the stages of one run share. `engine` is the rollout engine (an in-process engine
    behind `LockedEngine`, or a `RolloutPool`), entered under `lock` by evaluation, refills and
    weight updates; `env_sets` leases each batch in flight its own train envs and thread pool;
    `eval_envs` + `pool` run the held-out evaluation; `new_env(split)` makes one env with the
    run's shared reward wrappers (to replace one whose call timed out), `rewards` those
    wrappers (the driver's; Ray workers and vLLM hold their own); `version` is the learner's
    policy version."""

    cfg: Config
    out: Path
    say: Callable[[str], None]
    algo: Any
    model: Any
    tok: Any
    renderer: ChatRenderer
    pad_id: int
    learner: Any
    engine: Any
    lock: threading.RLock
    env_sets: Leases
    eval_envs: list[Any]
    pool: ThreadPoolExecutor
    params: SamplingParams
    log: MetricsLog
    new_env: Callable[[str], Any]
    start_step: int = 0
    version: int = 0
    rewards: Any = None  # the driver's `RewardWrappers` (None without env.wrappers)
    source_start: int = 0  # the first step of the current batch source (`make_source`)
    reporter: Any = None
    """Where stage progress goes (`agentrl.log.progress.Reporter`)."""
    teacher_engine: Any = None
    """distill's teacher sampler (`algo.distill_teacher_fraction > 0`): an in-process engine
    behind `LockedEngine` with the frozen teacher's weights (`agentrl.run.make_teacher_engine`)."""
    teacher_envs: list[Any] | None = None
    """The train envs the teacher's episodes run in (n_T x group_size of them)."""


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


def signal_exit_code(name: str | None) -> int:
    """The exit status of a run stopped by signal `name` (the shell's convention, 128 + the
    signal's number): SIGINT (Ctrl-C) 130, SIGTERM 143; None (a plain KeyboardInterrupt) 130."""
    import signal as sig

    return 128 + int(sig.Signals[name] if name else sig.SIGINT)


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C / SIGTERM stopped the run after saving its last completed step; `exit_code` is
    `signal_exit_code` of the signal (130 or 143)."""

    def __init__(self, message: str, signal: str | None = None) -> None:
        super().__init__(message)
        self.exit_code = signal_exit_code(signal)


class SecondSignal(KeyboardInterrupt):
    """A second Ctrl-C / SIGTERM: the run stops at once without saving; `exit_code` as
    `RunInterrupted`'s."""

    def __init__(self, signal: str) -> None:
        super().__init__(signal)
        self.exit_code = signal_exit_code(signal)


class StopRequest:
    """Ctrl-C (SIGINT) and SIGTERM during the RL loop: the first asks the loop to stop after
    the step in progress (it saves a checkpoint and raises `RunInterrupted`); a second one
    interrupts at once (`SecondSignal`, a KeyboardInterrupt, no save). Handlers are installed only in the main
    thread and restored by `uninstall`."""

    def __init__(self) -> None:
        self.signal: str | None = None
        self._old: dict[int, Any] = {}

    def _handle(self, signum: int, _frame: Any) -> None:
        import signal as sig

        if self.signal is not None:
            raise SecondSignal(sig.Signals(signum).name)
        self.signal = sig.Signals(signum).name

    def install(self) -> None:
        """Take over SIGINT and SIGTERM (no-op outside the main thread)."""
        import signal as sig

        if threading.current_thread() is not threading.main_thread():
            return
        for s_ in (sig.SIGINT, sig.SIGTERM):
            self._old[s_] = sig.signal(s_, self._handle)

    def uninstall(self) -> None:
        """Restore the previous handlers."""
        import signal as sig

        for s_, h in self._old.items():
            sig.signal(s_, h)
        self._old.clear()


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


def reward_state(lp: Loop) -> dict[str, Any] | None:
    """The state of the run's reward wrappers, to checkpoint (None when `env.wrappers` is
    empty): `driver` (this process's `RewardWrappers.state_dict`) and `workers` (each rollout
    worker's, when a `RolloutPool` holds the envs; else None)."""
    if not lp.cfg.env.wrappers:
        return None
    workers = lp.engine.reward_states() if hasattr(lp.engine, "reward_states") else None
    return {"format": 1, "driver": lp.rewards.state_dict() if lp.rewards is not None else None,
            "workers": workers}


def restore_reward_state(lp: Loop, ck: Path) -> None:
    """Load checkpoint `ck`'s reward wrapper state (`reward_state`) into the driver's wrappers
    and push the workers' back to them; says a `[resume]` note for each part not restored (a
    checkpoint without the file, a changed `env.wrappers` or `rollout.num_workers`).

    Raises:
        ValueError: the file is unreadable, or a part does not fit its wrapper (names `ck`).
    """
    from agentrl.learner.checkpoints import REWARD_STATE, unpack_state

    f = ck / REWARD_STATE
    if not f.exists():
        if lp.cfg.env.wrappers:
            lp.say(f"[resume] {ck} has no {REWARD_STATE}: the reward wrappers start from their initial state")
        return
    if not lp.cfg.env.wrappers:
        lp.say(f"[resume] {f} is not used: this run has no env.wrappers")
        return
    state = unpack_state(f)
    notes: list[str] = []
    try:
        if lp.rewards is not None:
            notes += lp.rewards.load_state_dict(state["driver"] or {})
        if hasattr(lp.engine, "load_reward_states"):
            notes += lp.engine.load_reward_states(state["workers"] or [])
    except ValueError as e:
        raise ValueError(f"{f}: {e}") from None
    for note in notes:
        lp.say(f"[resume] {note}")


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


def held_version(lp: Loop) -> int:
    """The policy version of the weights the engine holds."""
    return int(lp.engine.version if hasattr(lp.engine, "run") else lp.engine.policy_version)


def apply_weights(lp: Loop, state_dict: dict[str, Any], v: int) -> None:
    """Load weights `v` into the engine, unless it already holds newer ones (an older push
    applied late in async mode); never while evaluation or a refill is sampling."""
    with lp.lock:
        if v < held_version(lp):
            return
        lp.engine.update_weights(state_dict, v)


def evaluate(lp: Loop, tag: str) -> dict[str, float]:
    """Evaluate the learner's current weights on the held-out list (written to
    OUT/eval/<tag>, as `agentrl eval` writes): in async mode the engine may still hold an
    older version (a push is applied only when an actor starts its next batch)."""
    from agentrl.eval.harness import evaluate_heldout, training_metrics

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


def task_seeds(cfg: Config, *key: int) -> list[int]:
    """`rollout.tasks_per_step` task seeds drawn from the generator seeded `[cfg.seed, *key]`."""
    rng = np.random.default_rng([cfg.seed, *key])
    return [int(s) for s in rng.integers(0, 2**31 - 1, size=cfg.rollout.tasks_per_step)]


def run_batch(lp: Loop, step: int) -> list[Trajectory]:
    """Batch `step`: `tasks_per_step` task seeds drawn from (seed, step), so a resumed or
    asynchronous run samples the same tasks; each task run `group_size` times. With distill's
    GKD mixture (`lp.teacher_engine`) the last n_T tasks are played by the teacher
    (`agentrl.algos.distill.mark_teacher_rows`), after the student's, group-major as well."""
    cfg = lp.cfg
    seeds = task_seeds(cfg, step)
    n_s = len(seeds) - len(lp.teacher_envs or []) // cfg.algo.group_size  # the student's tasks
    with lp.env_sets.lease() as (envs_, pool_):  # several batches may be in flight
        trajs = collect(lp.engine, lp.renderer, envs_, seeds[:n_s], cfg.algo.group_size,
                        lp.params, cfg, pool_, group_base=step * cfg.rollout.tasks_per_step,
                        sample_seed=cfg.seed * 100_003 + step,
                        make_env=partial(lp.new_env, "train")) if n_s else []
        if n_s < len(seeds):  # distill's GKD mixture: the teacher plays the other tasks
            from agentrl.algos.distill import mark_teacher_rows

            teach = collect(lp.teacher_engine, lp.renderer, lp.teacher_envs, seeds[n_s:], cfg.algo.group_size,
                            lp.params, cfg, pool_, group_base=step * cfg.rollout.tasks_per_step + n_s,
                            sample_seed=(cfg.seed * 100_003 + step) * 31 + 7,
                            make_env=partial(lp.new_env, "train"))
            mark_teacher_rows(teach, held_version(lp))
            trajs = trajs + teach
    prefetch_reference(lp, trajs)
    return trajs


def frozen_workers(learner: Any) -> list[Any]:
    """The learner's frozen-model workers (`agentrl.learner.frozen.RemoteFrozenModel`): the
    reference's (`placement.reference=worker`) and the teacher's (`placement.teacher=worker`),
    those that are set."""
    return [w for w in (getattr(learner, "reference", None), getattr(learner, "teacher", None))
            if w is not None]


def prefetch_reference(lp: Loop, trajs: list[Trajectory]) -> None:
    """The pipeline (`placement.reference=worker`, `placement.teacher=worker`): start the
    reference's and the teacher's logprobs of a batch on their workers as soon as it is
    sampled, without waiting. In sync mode they overlap the rest of the step up to the point
    the loop needs them (the rollout metrics, collation and PPO's or distill's own policy pass);
    in async mode this runs on the actor thread, so the logprobs of batch s+1 overlap the
    learner's update of batch s. The loop's `learner.logprobs(batch, ref=True)` (and distill's
    `prepare`) takes the result when its batch has the same rows
    (`agentrl.learner.frozen.batch_key`); when dynamic sampling or the staleness filter changed the
    rows, it is computed then."""
    workers = frozen_workers(lp.learner)
    if workers and trajs and not lp.cfg.algo.dynamic_sampling:
        batch = build_batch(trajs, lp.pad_id)
        for w in workers:
            w.prefetch(batch)


def refill(lp: Loop, step: int, r: int) -> list[Trajectory]:
    """Fresh groups for refill round r (1, 2, ...) of dynamic sampling at `step`."""
    cfg = lp.cfg
    with lp.lock, lp.env_sets.lease() as (envs_, pool_):  # async actors use the engine too
        return collect(lp.engine, lp.renderer, envs_, task_seeds(cfg, step, r), cfg.algo.group_size,
                       lp.params, cfg, pool_,
                       group_base=(step + r * cfg.train.steps) * cfg.rollout.tasks_per_step,
                       sample_seed=(cfg.seed * 100_003 + step) * 31 + r, make_env=partial(lp.new_env, "train"))


def source_end(cfg: Config, start: int) -> int:
    """The step before which an async source started at `start` stops sampling: the next
    checkpoint step (`train.save_every`), or the last step."""
    every = cfg.train.save_every
    return min(cfg.train.steps, (start // every + 1) * every) if every else cfg.train.steps


def make_source(lp: Loop, start: int) -> Any:
    """Where batches `start, start+1, ...` come from: sampled on demand (sync), or by actor
    threads that sample ahead with bounded staleness (async), up to the next checkpoint step
    only (`source_end`): at each checkpoint the pipeline is drained and a new source starts
    from the checkpoint's weights (`restart_source`), exactly as `--resume` does, so that a
    resumed async run samples what the uninterrupted one did (docs/observability.md)."""
    cfg = lp.cfg
    lp.source_start = start
    if start == lp.start_step and cfg.rollout.mode == "async" and cfg.train.max_staleness == 0 \
            and cfg.rollout.batches_in_flight > 1:
        lp.say("[warning] train.max_staleness=0: one batch samples at a time (each needs the previous "
               "update), so rollout.batches_in_flight > 1 only adds idle actor threads and env sets")
    batch = lambda step: run_batch(lp, step)  # noqa: E731
    apply = lambda sd, v: apply_weights(lp, sd, v)  # noqa: E731
    if cfg.rollout.mode == "async":
        return AsyncSource(batch, apply, start=start, version=lp.version,
                           max_staleness=cfg.train.max_staleness, queue_size=cfg.rollout.queue_size,
                           batches_in_flight=cfg.rollout.batches_in_flight, end=source_end(cfg, start))
    return SyncSource(batch, apply)


def restart_source(lp: Loop, source: Any, start: int) -> Any:
    """After the checkpoint of step `start` (async): stop the drained source (it sampled no
    batch from `start` on), load the learner's weights into the engine (the actor may hold an
    older version) and start a new source at `start`: what `--resume` builds from that
    checkpoint."""
    source.close()
    apply_weights(lp, lp.learner.state_dict_for_engines(), lp.version)
    return make_source(lp, start)


def rollout_metrics(lp: Loop, trajs: list[Trajectory], m: dict[str, float]) -> list[Trajectory]:
    """Record the batch's rollout metrics in `m`, over every fresh episode sampled for the step
    (before dynamic sampling drops groups): `rollout/reward_mean` and `rollout/reward_std` over
    the non-NaN episode returns (NaN when there are none), `env/errors`, `env/timeouts`, ...
    Returns the trajectories fresh enough to train on (at most `train.max_staleness` versions
    behind the learner)."""
    m["perf/env_s"] = float(sum(t.timings.get("env", 0.0) for t in trajs))
    m["perf/generate_s"] = float(sum(t.timings.get("generate", 0.0) for t in trajs))
    stale = [lp.version - t.policy_version for t in trajs]
    m["rollout/staleness_max"] = float(max(stale))
    for k in range(max(stale) + 1):  # staleness histogram (versions behind the learner)
        m[f"async/staleness_{k}"] = float(stale.count(k))
    trajs = [t for t, s in zip(trajs, stale) if s <= lp.cfg.train.max_staleness]
    m["rollout/dropped_stale"] = float(len(stale) - len(trajs))
    rets = np.array([t.episode_return for t in trajs], dtype=float)
    valid = rets[~np.isnan(rets)]
    m["rollout/reward_mean"] = float(valid.mean()) if len(valid) else float("nan")
    m["rollout/reward_std"] = float(valid.std()) if len(valid) else float("nan")
    m["rollout/pass_rate"] = float(np.mean([episode_success(t) for t in trajs]))
    m["rollout/response_len"] = float(np.mean([t.num_sampled for t in trajs]))
    m["rollout/turns"] = float(np.mean([len(t.turns) for t in trajs]))
    m["rollout/truncated_frac"] = float(np.mean([t.truncated for t in trajs]))
    m["env/errors"] = float(sum(len(t.info.get("errors", [])) for t in trajs))
    m["env/timeouts"] = float(sum(bool(t.info.get("env_timeout")) for t in trajs))  # resets + steps
    # env steps whose code ran WITHOUT a sandbox (code_sandbox with backend='subprocess')
    m["sandbox/unisolated"] = float(sum(bool((turn.info or {}).get("unisolated"))
                                        for t in trajs for turn in t.turns))
    m["rollout/nan_rewards"] = float(np.isnan(rets).sum())
    teach = [t.info.get("sampler") == "teacher" for t in trajs]
    if any(teach):  # distill's GKD mixture: the above are over both samplers' episodes
        for name, sel in (("teacher", True), ("student", False)):
            ts = [t for t, k in zip(trajs, teach) if k == sel]
            r = [t.episode_return for t in ts if t.episode_return == t.episode_return]
            m[f"rollout/{name}_reward_mean"] = float(np.mean(r)) if r else float("nan")
            m[f"rollout/{name}_pass_rate"] = float(np.mean([episode_success(t) for t in ts])) if ts else float("nan")
    m.update(reward_component_means(trajs))
    m.update(group_key_metrics(trajs))
    return trajs


def group_key_metrics(trajs: list[Trajectory]) -> dict[str, float]:
    """Per env group key (`info["group_key"]`, e.g. `propose`, `solve/deduce`):
    `rollout/<key>/episodes`, `.../pass_rate` (for `self_propose`'s proposals: the valid
    proposal rate; for its solves: the solve rate) and `.../reward_mean`; and `env/<name>`, the
    largest value of each `info["env_stats"]` entry (e.g. `env/buffer_size`)."""
    m: dict[str, float] = {}
    keys = sorted({str(t.info["group_key"]) for t in trajs if t.info.get("group_key") is not None})
    for k in keys:
        ts = [t for t in trajs if str(t.info.get("group_key")) == k]
        rets = [t.episode_return for t in ts if t.episode_return == t.episode_return]
        m[f"rollout/{k}/episodes"] = float(len(ts))
        m[f"rollout/{k}/pass_rate"] = float(np.mean([episode_success(t) for t in ts]))
        m[f"rollout/{k}/reward_mean"] = float(np.mean(rets)) if rets else float("nan")
    for t in trajs:
        for name, v in (t.info.get("env_stats") or {}).items():
            m[f"env/{name}"] = max(m.get(f"env/{name}", float("-inf")), float(v))
    return m


def mark_trained(trajs: list[Trajectory], batch: dict[str, Any]) -> None:
    """Record in each trajectory's `info` what the update made of it (shown by `agentrl show`):
    `advantage`, the mean advantage over its trained tokens (loss_mask 1; the episode's one
    advantage for GRPO-style algorithms), and `trained`, whether any of its advantages is
    non-zero, i.e. whether it carries policy-gradient signal (an episode of a group whose
    rewards were all equal, or whose reward failed, has advantage 0: the learner leaves it out
    of its forwards when its loss has no KL or entropy term). Nothing is recorded when the
    algorithm's rows are not the trajectories (e.g. DPO's pairs)."""
    adv = batch.get("advantages")
    if not isinstance(adv, torch.Tensor) or adv.shape[0] != len(trajs) or adv.dim() not in (1, 2):
        return
    for i, t in enumerate(trajs):
        if adv.dim() == 1:
            a, nonzero = float(adv[i]), bool(adv[i] != 0)
        else:
            mask = batch["loss_mask"][i] > 0
            vals = adv[i][mask] if mask.any() else adv[i][:0]
            a = float(vals.mean()) if len(vals) else 0.0
            nonzero = bool((vals != 0).any()) if len(vals) else False
        t.info["advantage"], t.info["trained"] = a, nonzero


def update(lp: Loop, trajs: list[Trajectory], step: int, m: dict[str, float]) -> list[Trajectory]:
    """Dynamic sampling (DAPO), the batch, algorithm passes, advantages and the learner's
    update; records their metrics in `m` (the algorithm's `advantages` statistics as `adv/...`,
    e.g. `adv/reward_mean` over the groups trained on; its `prepare` ones as `rollout/...`;
    the learner's as `loss/...`) and returns the trajectories trained on."""
    cfg, algo, learner = lp.cfg, lp.algo, lp.learner
    t0 = time.perf_counter()
    if cfg.algo.dynamic_sampling:  # DAPO: drop groups without signal, refill with new tasks
        trajs, m["rollout/refill_rounds"] = dynamic_sampling(
            trajs, lambda r: refill(lp, step, r), cfg.rollout.tasks_per_step * cfg.algo.group_size)
    batch = build_batch(trajs, lp.pad_id)
    if not bool((batch["loss_mask"] != 0).any()):  # e.g. every reset failed: nothing to learn from
        m["loss/skipped_empty_batch"] = 1.0
        errs = [str(t.info["error"]) for t in trajs if t.info.get("error")]
        lp.say(f"[warning] step {step + 1}: update skipped: the batch has no trainable tokens "
               f"({len(trajs)} episodes, {len(errs)} with an env error"
               + (f"; first: {errs[0][:200]}" if errs else "") + ") (loss/skipped_empty_batch)")
        m["loss/lr"] = learner.lr
        m["perf/policy_update_s"] = 0.0
        m["perf/update_s"] = time.perf_counter() - t0
        m["perf/update_tokens"] = 0.0
        return []
    if cfg.algo.overlong_buffer > 0 or algo.masks_truncated(cfg.algo):  # DAPO overlong shaping/filter
        from agentrl.algos.shaping import shape_batch

        sm = shape_batch(batch, trajs, cfg.algo, cfg.rollout.max_tokens,
                         mask_truncated=algo.masks_truncated(cfg.algo))
        m.update({f"rollout/{k}": v for k, v in sm.items()})
    ref0 = learner.ref_seconds
    t_prep = time.perf_counter()
    batch, pm = algo.prepare(batch, learner, cfg.algo)  # PPO values, DPO pairs, ...
    m.update({f"rollout/{k}": float(v) for k, v in pm.items()})
    # the no-grad pass of `prepare` (PPO: old logprobs and values), its reference calls excluded
    m["perf/prepare_s"] = time.perf_counter() - t_prep - (learner.ref_seconds - ref0)
    if algo.needs_reference(cfg.algo) and "ref_logprobs" not in batch:
        batch["ref_logprobs"] = learner.logprobs(batch, ref=True)
    m["perf/reference_s"] = learner.ref_seconds - ref0  # computing (inline) or waiting (worker)
    log_gap(lp, batch, step, m)
    batch["advantages"], gstats = algo.advantages(batch, cfg.algo)
    mark_trained(trajs, batch)
    # what the advantages were computed from (the kept groups' valid returns, under dynamic
    # sampling): their own names, never over the raw rollout statistics above
    m.update({f"adv/{k}": float(v) for k, v in gstats.items()})
    from agentrl.learner.local import NonFiniteGradientError

    t_upd = time.perf_counter()
    try:
        upd = learner.update(batch, algo, cfg.algo, epochs=cfg.algo.update_epochs,
                             minibatches=cfg.algo.minibatches, seed=cfg.seed + step)
    except NonFiniteGradientError as e:
        raise NonFiniteGradientError(f"step {step + 1}: {e}") from None
    # the learner's update (PPO: the value head shares the policy's forward, backward and
    # optimizer step, so this is the policy and value update together)
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


def log_gap(lp: Loop, batch: dict[str, Any], step: int, m: dict[str, float]) -> None:
    """Every `placement.logp_gap_every` steps with a bfloat16 reference (teacher) worker:
    `ref/logp_gap_mean` and `ref/logp_gap_max` (`teacher/...`), |logp_bf16 - logp_fp32| (nats)
    over the batch's first `placement.logp_gap_tokens` agent tokens, and `ref/logp_gap_tokens`
    (how many)."""
    p = lp.cfg.placement
    if not p.logp_gap_every or step % p.logp_gap_every:
        return
    for w in frozen_workers(lp.learner):
        if w.dtype == "float32":
            continue
        g = w.logp_gap(batch, p.logp_gap_tokens)
        prefix = "ref" if w.role == "reference" else w.role
        m.update({f"{prefix}/logp_gap_mean": g["mean"], f"{prefix}/logp_gap_max": g["max"],
                  f"{prefix}/logp_gap_tokens": g["tokens"]})


def worker_profile(lp: Loop, m: dict[str, float]) -> None:
    """The workers' share of the step (call after `perf/step_s` is set): `perf/reward_model_s`
    (seconds the reward model computed: in this process's env wrappers, or on its worker),
    `perf/reference_busy_s` and `perf/reference_wait_s` (`perf/teacher_...`: the reference
    (teacher) worker computed / the
    loop waited for it), and the idle seconds of each worker, `perf/<worker>_idle_s` = step
    seconds - its busy seconds. Not logged for an inline reward model in Ray rollout workers
    (its time is spent in their processes)."""
    rm_here = lp.cfg.placement.reward_model == "worker" or lp.cfg.rollout.num_workers == 0
    if lp.rewards is not None and hasattr(lp.rewards, "take_reward_model_seconds") and rm_here:
        m["perf/reward_model_s"] = lp.rewards.take_reward_model_seconds()
        if lp.cfg.placement.reward_model == "worker":
            m["perf/reward_model_idle_s"] = max(0.0, m["perf/step_s"] - m["perf/reward_model_s"])
    for w in frozen_workers(lp.learner):
        m.update(w.take_metrics())
        m[f"perf/{w.role}_idle_s"] = max(0.0, m["perf/step_s"] - m[f"perf/{w.role}_busy_s"])


def sync(lp: Loop, source: Any, step: int, m: dict[str, float]) -> None:
    """Bump the policy version and push the new weights to the engine (every step in sync
    mode, every `rollout.sync_every` steps of the current source in async mode, counted from
    its start, so that a resumed run pushes at the same steps); `perf/sync_s` seconds (gathering
    from learner ranks included) and `perf/sync_mb` MiB per push."""

    t0 = time.perf_counter()
    lp.version += 1
    if lp.cfg.rollout.mode == "sync" or (step + 1 - lp.source_start) % lp.cfg.rollout.sync_every == 0:
        sd = lp.learner.state_dict_for_engines()
        source.push_weights(sd, lp.version)
        m["perf/sync_mb"] = sum(v.numel() * v.element_size() for v in sd.values()) / 2**20
    m["perf/sync_s"] = time.perf_counter() - t0


def log_step(lp: Loop, step: int, m: dict[str, float], trajs: list[Trajectory]) -> str:
    """Write step `step + 1`'s metrics (and its rollouts every `train.log_rollouts_every`
    steps and at the last step, so that `agentrl show` has one after any run); returns the
    progress line."""
    lp.log.log(step + 1, m)
    every = lp.cfg.train.log_rollouts_every
    if every and ((step + 1) % every == 0 or step + 1 == lp.cfg.train.steps):
        (lp.out / "rollouts").mkdir(exist_ok=True)
        with (lp.out / "rollouts" / f"step_{step + 1}.jsonl").open("w") as f:
            for t in trajs:
                f.write(json.dumps(t.to_dict()) + "\n")
    r, p = m["rollout/reward_mean"], m["rollout/pass_rate"]
    return (f"reward {r:.3f} " + ("" if r == p else f"pass {p:.2f} ")  # code_sandbox: the same number
            + f"len {m['rollout/response_len']:.0f} {m['perf/step_s']:.1f}s/step")


def checkpoint(lp: Loop, step: int) -> Path:
    """Save the learner, the reward wrappers' state (`reward_state`, as `REWARD_STATE`) and the
    train envs' `agentrl.env.base.env_state` (as `env_state` in `agentrl_state.json`, when they have
    one) after `step` steps to OUT/checkpoints/step_<step>, then delete all but the newest
    `train.keep_checkpoints`."""
    from agentrl.env.base import env_state
    from agentrl.learner.checkpoints import REWARD_STATE, pack_state, prune

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


def shut_down(lp: Loop) -> None:
    """Close the metrics log, the env sets' thread pools and the engine."""
    lp.log.close()
    for _, p_ in lp.env_sets.items:
        p_.shutdown()
    if hasattr(lp.engine, "shutdown"):
        lp.engine.shutdown()


def report(lp: Loop, before: dict[str, float], after: dict[str, float], final: Path,
           extra: dict[str, Any], console: Any) -> dict[str, Any]:
    """The run's summary (written to OUT/summary.json) and its closing lines. The held-out
    evaluations' `reward_mean` is left out of the summary when it equals their pass@1
    (`heldout_reward_is_pass@1`; OUT/eval/*/summary.json keep every metric); `stage_seconds`
    holds `sft` (the warm start's `sft_seconds`) and `stage_seconds(OUT/metrics.jsonl)`."""
    from agentrl.log.summary import (
        cost_profile,
        format_profile,
        reward_repeats_pass1,
        stage_seconds,
        summary_panel,
    )

    cfg, out, say = lp.cfg, lp.out, lp.say
    b, a = before["pass@1"], after["pass@1"]
    same = reward_repeats_pass1(before, after)  # code_sandbox: reward = solved = pass@1
    ev_b, ev_a = ({k: v for k, v in e.items() if not (same and k == "reward_mean")} for e in (before, after))
    summary = {"env": cfg.env.name, "algo": cfg.algo.name, "steps": cfg.train.steps,
               "eval_before": ev_b, "eval_after": ev_a, "heldout_reward_is_pass@1": same,
               "pass@1_ratio": (a / b) if b > 0 else None, "pass@1_gain": a - b,
               "checkpoint": str(final), **extra,
               "stage_seconds": {**({"sft": extra["sft_seconds"]} if extra.get("sft_seconds") else {}),
                                 **stage_seconds(out / "metrics.jsonl")}}
    summary["cost_profile"] = {label: {"seconds": sec, "share": share}
                               for label, sec, share in cost_profile(summary["stage_seconds"])}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    ratio = f"{a / b:.2f}x" if b > 0 else "n/a"
    say(f"[eval] held-out (T={cfg.rollout.temperature}, {cfg.train.eval_tasks} tasks x "
        f"{cfg.train.eval_samples}, ± standard error): before RL {format_eval(before, cfg.train.eval_samples)}"
        f" -> after RL {format_eval(after, cfg.train.eval_samples)}")
    say(f"[eval] held-out pass@1: before RL {b:.3f} -> after RL {a:.3f} ({ratio}, {a - b:+.3f} absolute); "
        f"`agentrl eval --model {out}` reproduces the after-RL figure ({out / 'eval'})")
    say(f"[done] checkpoint: {final}; metrics: {out / 'metrics.jsonl'}")
    if cfg.quiet or console is None:  # the panel shows it otherwise
        say(f"[profile] {format_profile(summary['stage_seconds'])}")
    if console is not None:
        console.print(summary_panel(summary, out))
    return summary


# -- the loop -----------------------------------------------------------------------------------
def train(cfg: Config, *, console: Any = None) -> dict[str, Any]:
    """Train `cfg.algo.name` on `cfg.env.name`; returns the summary (also OUT/summary.json).

    Raises:
        ValueError: a configuration that cannot run (e.g. unknown env), before any work.
    """
    from agentrl.learner.lora import wrap_lora
    from agentrl.log.progress import Reporter
    from agentrl.sft import warm_start

    reporter = Reporter(console, enabled=not cfg.quiet)
    say = reporter.line  # flushed: a log file grows while the run works
    cfg, algo, out = set_up(cfg)
    say(f"[run] {cfg.algo.name} on {cfg.env.name}: {cfg.train.steps} steps -> {out}")
    timings: dict[str, float] = {}

    # 1) the policy: resume, a given path, or the embedded default (+ warm start)
    ck = resume_checkpoint(cfg, out, say)
    if ck is not None and json.loads((ck / "agentrl_state.json").read_text())["step"] >= cfg.train.steps \
            and (out / "summary.json").exists():
        say(f"[resume] {out} finished all {cfg.train.steps} steps already; nothing to do")
        return json.loads((out / "summary.json").read_text())
    model, tok, path = load_policy(cfg, out, ck, reporter)
    if getattr(tok, "image_processor", None) is not None:  # a vision-language policy
        from agentrl.rollout.chat import VisionChatRenderer

        renderer: ChatRenderer = VisionChatRenderer(tok, tok.image_processor)
    else:
        renderer = ChatRenderer(tok)
    if algo.needs_teacher:  # per-token log-probabilities compared by id
        from agentrl.algos.distill import check_teacher_tokenizer

        try:
            check_teacher_tokenizer(cfg.algo.teacher_path, tok)
        except ValueError as e:
            raise ConfigError(f"config error: {e}") from None
    sft_info: dict[str, Any] = {}
    if ck is None and cfg.sft.steps > 0:
        pad_id = tok.pad_token_id if tok.pad_token_id is not None else renderer.end_of_turn_id
        sft_info = warm_start(cfg, model, tok, renderer, pad_id, out, say, reporter)  # sft_seconds
    if ck is None and cfg.model.lora_r > 0:  # LoRA: train adapters only; the base stays frozen
        model = wrap_lora(model, r=cfg.model.lora_r, alpha=cfg.model.lora_alpha,
                          target_modules=cfg.model.lora_target_modules, seed=cfg.seed,
                          base_path=out / "sft_model" if sft_info else path)
    lp = build_loop(cfg, algo, out, model, tok, renderer, ck, say, reporter)
    try:
        return _evaluate_train_evaluate(lp, ck, sft_info, timings, console)
    finally:  # learner ranks, reference and teacher workers (Ray actors) are stopped whatever happened
        reporter.stop()
        if hasattr(lp.learner, "shutdown"):
            lp.learner.shutdown()
        for w in frozen_workers(lp.learner):
            w.shutdown()


def _evaluate_train_evaluate(lp: Loop, ck: Path | None, sft_info: dict[str, Any],
                             timings: dict[str, float], console: Any) -> dict[str, Any]:
    """The rest of `train`: evaluate, the RL loop, the final checkpoint, evaluation and the
    summary."""
    from agentrl.learner.local import latest_checkpoint

    cfg, out = lp.cfg, lp.out
    before = evaluate_before(lp, resumed=ck is not None)

    # 2) the RL loop
    bar = lp.reporter.stage("train", cfg.train.steps, unit="RL steps", every_s=0.0,
                            completed=lp.start_step)  # no terminal: a line per step
    worker_profile(lp, {"perf/step_s": 0.0})  # the evaluation's model time is not a step's
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
            trajs = rollout_metrics(lp, trajs, m)
            trajs = update(lp, trajs, step, m)
            sync(lp, source, step, m)
            m["perf/step_s"] = m["perf/rollout_s"] + m["perf/update_s"] + m["perf/sync_s"]
            worker_profile(lp, m)
            m["perf/loop_s"] = time.perf_counter() - t_loop  # wall clock since the loop started
            if cfg.train.eval_every and (step + 1) % cfg.train.eval_every == 0 and step + 1 < cfg.train.steps:
                m.update({f"eval/{k}": v for k, v in evaluate(lp, f"step_{step + 1}").items()})
                worker_profile(lp, {"perf/step_s": 0.0})  # the evaluation's model time is not a step's
            line = log_step(lp, step, m, trajs)
            if cfg.train.save_every and (step + 1) % cfg.train.save_every == 0:
                checkpoint(lp, step + 1)
                if cfg.rollout.mode == "async" and step + 1 < cfg.train.steps and stop.signal is None:
                    source = restart_source(lp, source, step + 1)  # as a resume from it would
            bar.advance(1, line)
            if stop.signal is not None:  # Ctrl-C / SIGTERM: keep the step just finished
                path = out / "checkpoints" / f"step_{step + 1}"
                if not (cfg.train.save_every and (step + 1) % cfg.train.save_every == 0):
                    checkpoint(lp, step + 1)
                raise RunInterrupted(f"[stopped] {stop.signal} after step {step + 1}/{cfg.train.steps}; "
                                     f"checkpoint {path}; continue with: agentrl train --resume {out}",
                                     stop.signal)
    finally:
        bar.close()
        stop.uninstall()
        source.close()
    timings["rl_s"] = time.perf_counter() - t_loop

    # 3) final checkpoint, evaluation and summary
    final = out / "checkpoints" / f"step_{cfg.train.steps}"
    if latest_checkpoint(out) != final:  # not saved by the loop (or by the run resumed here)
        checkpoint(lp, cfg.train.steps)
    after = evaluate(lp, "after")
    lp.log.log(cfg.train.steps, {f"eval/{k}": v for k, v in after.items()})
    shut_down(lp)
    return report(lp, before, after, final, {**sft_info, **timings}, console)
