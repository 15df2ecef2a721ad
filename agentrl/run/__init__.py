"""A run, built from its `Config` in one place (`build`): the start-up checks
(`agentrl.startup`), the model and tokenizer (a checkpoint, a given path or the embedded tiny
model), its renderer, the warm start, the rollout engine (in process, Ray workers or vLLM), the
learner with its reference and teacher workers, and the envs (`build_env`, with shared reward
wrappers) with the held-out ones. `agentrl train` uses all of it, `agentrl eval` the policy of a
model directory and its engine (`build(cfg, model_dir=...)`), `agentrl sft` and offline DPO the
policy (`load_policy`); the Ray workers build their engines with the same
`agentrl.rollout.engines.make.make_engine`.

Before anything is built, `set_up` (`agentrl.run.setup`) checks the run and resolves the env-
and policy-dependent defaults (`agentrl.run.defaults`); both are re-exported here.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

from agentrl.algos.distill import teacher_task_count
from agentrl.config import Config, ConfigError
from agentrl.env.base import load_env_state
from agentrl.env.content import content_error, content_text
from agentrl.learner.frozen import make_reference, make_teacher
from agentrl.learner.group import make_learner
from agentrl.learner.lora import load_checkpoint, merged_state_dict, plain_copy, wrap_lora
from agentrl.learner.rank import ModelSource
from agentrl.learner.schedules import lr_multiplier
from agentrl.log.progress import Reporter
from agentrl.models.tiny import build_tiny_model, load_model
from agentrl.models.tokens import fragment_warning
from agentrl.models.vlm import build_tiny_vlm, is_vlm_dir, load_vlm
from agentrl.rewards import RewardWrappers
from agentrl.rollout.chat import NO_TOOLS_NOTE, ChatRenderer, renderer_for, renders_tools
from agentrl.rollout.collect import check_batch_hooks
from agentrl.rollout.engines.make import engine_memory_config, load_processor, make_engine
from agentrl.rollout.envs import PARSER_KWARGS, _env_accepts, build_env, build_named_env
from agentrl.rollout.source import Leases, LockedEngine
from agentrl.rollout.tool_format import resolve_tool_parser
from agentrl.rollout.workers import RolloutPool
from agentrl.run.defaults import (  # noqa: F401 (re-exported: callers import them from here)
    VISION_DEFAULTS,
    env_observes_images,
    resolve_run_defaults,
)
from agentrl.run.setup import quiet_libraries, seed_everything, set_up  # noqa: F401 (re-exported)
from agentrl.sft_repairs import wants_policy_repairs
from agentrl.startup import (
    check_vision_training,
    restore_inline_reference,
    resume_checkpoint,
)
from agentrl.startup_model import check_tokenizer, first_turn_room_warning


def policy_renderer(cfg: Config, tok: Any) -> ChatRenderer:
    """The policy's chat renderer with `rollout.history` and `rollout.chat_template_kwargs`."""
    return renderer_for(tok, cfg.rollout.history, cfg.rollout.chat_template_kwargs)


def lr_schedule(cfg: Config) -> Callable[[int], float]:
    """The run's learning-rate factor per optimizer step (`agentrl.learner.schedules.lr_multiplier`):
    `train.lr_warmup_steps` of warm-up, then `train.lr_schedule` decaying to
    `train.lr_min_ratio` at the run's last optimizer step (`train.steps` x
    `algo.update_epochs` x `algo.minibatches`)."""
    total = cfg.train.steps * cfg.algo.update_epochs * cfg.algo.minibatches
    return partial(lr_multiplier, warmup=cfg.train.lr_warmup_steps, total=total,
                   schedule=cfg.train.lr_schedule, min_ratio=cfg.train.lr_min_ratio)


# -- the builder --------------------------------------------------------------------------------
@dataclass
class Run:
    """The pieces of a run, made by `build`. For training every field is set (the teacher's
    only for distillation's mixture); for an evaluation (`build(cfg, model_dir=...)`) only `cfg`,
    `tok`, `renderer` and `engine`.

    `engine` is the rollout engine: an in-process engine behind `LockedEngine` (entered under
    `lock`), or a `RolloutPool` (Ray workers or vLLM, which hold their own envs; it has `run`).
    `env_sets` leases each batch in flight its own train envs and thread pool (the first set's
    pool is `pool`, which also steps `eval_envs`, the held-out envs); `new_env(split)` makes
    one env with the run's shared reward wrappers `rewards` (None without `env.wrappers`).
    `summary` is set (and nothing after `checkpoint`) when a resumed run had finished already.
    """

    cfg: Config
    out: Path | None = None
    algo: Any = None
    checkpoint: Path | None = None
    """The checkpoint resumed from (None: a new run)."""
    model: Any = None
    """The policy the learner trains (LoRA-wrapped with `model.lora_r > 0`)."""
    tok: Any = None
    """Its tokenizer (a vision-language policy's carries `image_processor`)."""
    renderer: ChatRenderer | None = None
    pad_id: int = 0
    engine: Any = None
    learner: Any = None
    lock: Any = field(default_factory=threading.RLock)
    rewards: Any = None
    new_env: Callable[[str], Any] | None = None
    env_sets: Leases | None = None
    eval_envs: list[Any] = field(default_factory=list)
    pool: ThreadPoolExecutor | None = None
    start_step: int = 0
    version: int = 0
    mixture_engine: Any = None
    """A second sampler of each step's tasks (distill's GKD mixture, `algo.distill_teacher_fraction
    > 0`: an in-process engine behind `LockedEngine` (under `lock`) with the frozen teacher's
    weights); None for most runs."""
    mixture_envs: list[Any] | None = None
    """The train envs the second sampler's episodes run in (its tasks x group_size of them)."""
    notes: list[str] = field(default_factory=list)
    """Lines the loop prints once its metrics log is open (e.g. how a second sampler splits
    each step's tasks)."""
    sft_info: dict[str, Any] = field(default_factory=dict)
    """The warm start's figures (`agentrl.sft.warm_start`; empty without one)."""
    summary: dict[str, Any] | None = None
    policy_dir: str | None = None
    """The directory holding `model`'s weights (the checkpoint resumed from, the warm start's
    OUT/sft_model, `model.path` or the embedded model's); learner ranks load from it."""


def build(cfg: Config, *, reporter: Any = None, warm_start: Callable[..., dict[str, Any]] | None = None,
          model_dir: str | Path | None = None) -> Run:
    """Build a run: `set_up` (every start-up check; OUT/config.json written), the checkpoint to
    resume from (`agentrl.startup.resume_checkpoint`), the policy (`load_policy`) and its
    renderer, the warm start (`warm_start(cfg, model, tok, renderer, pad_id, out, say,
    reporter)`, i.e. `agentrl.sft.warm_start`, on a new run with `sft.steps > 0`; None: none),
    LoRA adapters (`model.lora_r > 0`), then the engine and learner (`_engine_and_learner`) and
    the envs (`_envs`). Lines and stage progress go to `reporter`
    (`agentrl.log.progress.Reporter`; None: silent).

    With `model_dir` (for `agentrl eval`): only the policy of that model directory, its
    renderer and its engine (`rollout.num_workers > 0`: a `RolloutPool`; else `make_engine`);
    no check, nothing written.

    Returns:
        the `Run`; its `summary` is set (and nothing else built) when `--resume` finds the run
        finished already.

    Raises:
        ConfigError, OutError, ResumeError: the start-up checks' (`agentrl.startup`).
    """
    if model_dir is not None:
        if cfg.rollout.num_workers > 0:  # the workers render images themselves
            engine: Any = RolloutPool(cfg, str(model_dir))
            tok = load_processor(model_dir)  # (for the renderer's stop ids)
        else:
            engine, tok = make_engine(cfg, str(model_dir))
        return Run(cfg, tok=tok, renderer=policy_renderer(cfg, tok), engine=engine)
    reporter = reporter or Reporter(enabled=False)
    say = reporter.line
    notes: list[str] = []
    cfg, algo, out = set_up(cfg, notes)
    say(f"[run] {cfg.algo.name} on {cfg.env.name}: {cfg.train.steps} steps -> {out}" + "".join(f"; {n}" for n in notes))
    ck = resume_checkpoint(cfg, out, say)
    if ck is not None and json.loads((ck / "agentrl_state.json").read_text())["step"] >= cfg.train.steps \
            and (out / "summary.json").exists():
        say(f"[resume] {out} finished all {cfg.train.steps} steps already; nothing to do")
        return Run(cfg, out, algo, ck, summary=json.loads((out / "summary.json").read_text()))
    model, tok, path = load_policy(cfg, out, ck, reporter)
    renderer = policy_renderer(cfg, tok)
    if renderer.rewrites_history is None:
        say(f"[template] whether the chat template rewrites history {renderer.history_note}")
    elif renderer.rewrites_history:
        say(f"[template] the chat template {renderer.history_note}: with rollout.history="
            f"{cfg.rollout.history} " + ("the policy samples each turn from its own sampled ids "
                                         "(token-exact), not from the template's re-rendering"
                                         if cfg.rollout.history == "exact" else
                                         "each turn is sampled from the template's rendering and "
                                         "trained as its own sample"))
    if warning := fragment_warning(tok):  # a legacy SentencePiece tokenizer: spaces before fragments
        say(f"[template] mid-sequence text: {warning}")
    check_tokenizer(cfg, algo, tok)  # e.g. a teacher's, compared by id
    if any(k not in cfg.env.kwargs and _env_accepts(cfg.env.name, k) for k in PARSER_KWARGS):  # build_env's
        say("[tools] tool-call format {}: {}".format(*resolve_tool_parser(cfg)))
    if cfg.env.name == "agent" and not renders_tools(renderer):
        say(NO_TOOLS_NOTE)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else renderer.end_of_turn_id
    sft_info: dict[str, Any] = {}
    if ck is None and (cfg.sft.steps > 0 or wants_policy_repairs(cfg)) and warm_start is not None:
        sft_info = warm_start(cfg, model, tok, renderer, pad_id, out, say, reporter)  # sft_seconds
    if ck is None and cfg.model.lora_r > 0:  # LoRA: train adapters only; the base stays frozen
        model = wrap_lora(model, r=cfg.model.lora_r, alpha=cfg.model.lora_alpha,
                          target_modules=cfg.model.lora_target_modules, seed=cfg.seed,
                          base_path=out / "sft_model" if sft_info else path)
    run = Run(cfg, out, algo, ck, model, tok, renderer, pad_id, sft_info=sft_info,
              policy_dir=str(out / "sft_model" if sft_info else path))
    resumed = _engine_and_learner(run, say)
    _envs(run, resumed)
    probe = run.new_env("train")
    try:
        warning = first_turn_room_warning(cfg, probe, renderer)
    finally:
        probe.close()
    if warning:
        say(warning)
    return run


def _engine_and_learner(run: Run, say: Callable[[str], None]) -> dict[str, Any]:
    """`build`'s engine (`rollout_engine`: the current weights), learner
    (`agentrl.learner.group.make_learner`) with its reference and teacher workers
    (`placement.*=worker`), their compile notes, and on resume the learner's state, the
    reference's weights and the engine's weights (the checkpoint's). Sets `run.engine`,
    `run.learner`, `run.start_step`, `run.version`; returns the checkpoint's extra state
    (`Learner.load`; empty for a new run)."""
    cfg, model, tok, out, ck = run.cfg, run.model, run.tok, run.out, run.checkpoint
    assert out is not None
    reference = run.algo.needs_reference(cfg.algo) and cfg.placement.reference == "inline"
    engine_cfg = engine_memory_config(cfg, sum(p.numel() for p in model.parameters()), reference=reference, say=say)
    run.engine = rollout_engine(engine_cfg, model, tok, out)
    run.learner = learner = make_learner(cfg, run.algo, model, lr_schedule(cfg), rank_source(run))
    if cfg.placement.reference == "worker" and run.algo.needs_reference(cfg.algo):
        learner.reference = make_reference(cfg, model, tok, out, ck)
    if run.algo.needs_teacher:  # on its worker, or inline (loaded at its first use)
        learner.teacher = make_teacher(cfg, learner)
    for note in (learner.compile_note(), rollout_compile_note(cfg, run.engine)):
        if note:
            say(f"[compile] {note}")
    for note in learner.fast_path_notes():
        say(f"[learner] {note}")
    extra: dict[str, Any] = {}
    if ck is not None:
        extra = learner.load(ck)
        restore_inline_reference(cfg, learner, ck, out)
        run.start_step, run.version = extra["step"], extra["policy_version"]
        run.engine.update_weights(merged_state_dict(model), run.version)
        say(f"[resume] from {ck} at step {run.start_step} (policy version {run.version})")
    return extra


def rank_source(run: Run) -> ModelSource | None:
    """Where learner ranks load the policy (`agentrl.learner.rank.ModelSource`): the run's
    `policy_dir`, with the LoRA settings of fresh adapters (a new run with `model.lora_r > 0`:
    `wrap_lora` with the same seed gives the same adapters); None without learner ranks."""
    cfg = run.cfg
    if cfg.train.learner_workers == 0 or run.policy_dir is None:
        return None
    lora = None
    if run.checkpoint is None and cfg.model.lora_r > 0:
        lora = dict(r=cfg.model.lora_r, alpha=cfg.model.lora_alpha,
                    target_modules=cfg.model.lora_target_modules, seed=cfg.seed,
                    base_path=run.policy_dir)
    return ModelSource(run.policy_dir, lora=lora)


def _envs(run: Run, resumed: dict[str, Any]) -> None:
    """`build`'s envs: the shared reward wrappers, the first set of train envs (the
    checkpoint's env state, `resumed["env_state"]`, loaded into the first), the held-out envs,
    the engine behind `LockedEngine` when in process, the env sets of the batches in flight,
    and distillation's teacher sampler with its envs (`algo.distill_teacher_fraction > 0`)."""
    cfg = run.cfg
    n_eps = cfg.rollout.tasks_per_step * cfg.algo.group_size
    run.rewards = reward_wrappers(cfg)
    run.new_env = new_env = partial(build_env, cfg, rewards=run.rewards)  # new_env(split)
    envs = [new_env("train") for _ in range(n_eps)]
    check_batch_hooks(run.engine, envs[0])  # e.g. self_propose with Ray rollout workers: refused now
    if "env_state" in resumed:  # e.g. self_propose's task buffer
        load_env_state(envs[0], resumed["env_state"])
    run.eval_envs = heldout_envs(cfg, run.rewards)
    run.pool = ThreadPoolExecutor(max_workers=cfg.rollout.env_threads)
    # Async actor threads, evaluation and refills share the engine: an in-process engine is
    # entered by one generate / weight update at a time (LockedEngine), so that batches in flight
    # interleave per generate call; evaluation and refills hold the same (re-entrant) lock for
    # their whole run, and weight updates take it too. Each batch leases its own envs + pool.
    if not hasattr(run.engine, "run"):
        run.engine = LockedEngine(run.engine, run.lock)
    run.env_sets = Leases(lambda: ([new_env("train") for _ in range(n_eps)],
                                   ThreadPoolExecutor(max_workers=cfg.rollout.env_threads)), [(envs, run.pool)])
    if cfg.rollout.mode == "async" and not hasattr(run.engine, "run"):
        run.env_sets.fill(cfg.rollout.batches_in_flight)  # built now, in a fixed order
    if run.algo.needs_teacher and cfg.algo.distill_teacher_fraction > 0:  # GKD's mixture
        n_t = teacher_task_count(cfg.algo.distill_teacher_fraction, cfg.rollout.tasks_per_step)
        run.mixture_engine = LockedEngine(teacher_engine(cfg, run.tok), run.lock)
        run.mixture_envs = [new_env("train") for _ in range(n_t * cfg.algo.group_size)]
        run.notes.append(f"[distill] the teacher plays {n_t} of each step's {cfg.rollout.tasks_per_step} "
                         f"tasks (algo.distill_teacher_fraction={cfg.algo.distill_teacher_fraction})")


# -- model --------------------------------------------------------------------------------------
TOKENIZER_TASKS = 2000
"""Training tasks whose opening messages and reference answers train the embedded model's
tokenizer."""


def default_model_dir(cfg: Config, out: Path, reporter: Any = None) -> str:
    """Build the embedded tiny model in `OUT/base_model` (tokenizer trained on texts of the env:
    opening messages and reference answers of `TOKENIZER_TASKS` training tasks, and of
    `TOKENIZER_TASKS x share` tasks of each env of `sft.mix_envs`). Progress goes
    to `reporter` (`agentrl.log.progress.Reporter`; None: silent): the task texts as a stage with
    its ETA, then the tokenizer training and model build (one call) as start/end lines."""
    reporter = reporter or Reporter(enabled=False)
    target = out / ("base_vlm" if cfg.model.vision else "base_model")
    if (target / "config.json").exists():
        return str(target)
    sources = [(cfg.env.name, build_env(cfg, "train"), TOKENIZER_TASKS)] + [  # the warm start's other envs too
        (name, build_named_env(cfg, name, "train"), max(1, round(TOKENIZER_TASKS * share)))
        for name, share in cfg.sft.mix_envs.items()]
    texts: list[str] = []
    with reporter.stage("model", sum(n for _, _, n in sources), unit="task texts for the tokenizer") as st:
        for name, env, n in sources:
            get = getattr(env.unwrapped, "reference_answer", None)
            failed, last_bad = 0, ""
            for i in range(n):
                try:  # a reset that raises is a lost task here, as in rollouts (contract 7)
                    obs, _ = env.reset(seed=500_000 + i)
                except Exception:  # noqa: BLE001 - the env's own failure, not ours
                    failed += 1
                    continue
                if not isinstance(obs, list) or not all(isinstance(m, dict) and "content" in m for m in obs):
                    raise ConfigError(f"env {name}: reset(seed={500_000 + i}) returned "
                                      f"{type(obs).__name__} {str(obs)[:80]!r}, not a list of chat "
                                      "messages ({'role': ..., 'content': ...})")
                bad = next((e for e in (content_error(m["content"]) for m in obs) if e), None)
                if bad:  # e.g. an image the processor cannot render: a lost task, as in rollouts
                    failed, last_bad = failed + 1, bad
                    continue
                texts.extend(content_text(m["content"]) for m in obs)
                if get is not None and get():
                    texts.append(get())
                st.advance()
            if failed == n:
                raise ConfigError(f"env {name}: every reset raised or returned a bad observation "
                                  f"({n} of {n}) while gathering texts for the embedded tokenizer"
                                  + (f"; last bad observation: {last_bad}" if last_bad else ""))
            feedback = getattr(env.unwrapped, "corpus_texts", None)
            if feedback is not None:
                texts.extend(feedback())
    m = cfg.model
    with reporter.stage("model", None, unit=f"training the tokenizer on {len(texts)} texts and "
                        "building the model"):
        if m.vision:
            return build_tiny_vlm(str(target), texts, hidden_size=m.hidden_size, num_layers=m.num_layers,
                                  num_heads=m.num_heads, intermediate_size=m.intermediate_size,
                                  vocab_size=m.vocab_size, vision_depth=m.vision_depth,
                                  vision_width=m.vision_width, vision_heads=m.vision_heads, seed=cfg.seed,
                                  init_std=m.init_std)
        return build_tiny_model(str(target), texts, hidden_size=m.hidden_size, num_layers=m.num_layers,
                                num_heads=m.num_heads, intermediate_size=m.intermediate_size,
                                vocab_size=m.vocab_size, seed=cfg.seed, init_std=m.init_std)


def load_policy(cfg: Config, out: Path, checkpoint: Path | None,
                reporter: Any = None) -> tuple[Any, Any, str | Path]:
    """The policy to train and its tokenizer: the `checkpoint` (full weights, or LoRA adapters on
    their base) when resuming, else `model.path`, else the embedded model (`default_model_dir`,
    its progress to `reporter`).

    Returns:
        `(model, tokenizer, directory loaded)`, the model in eval mode (`agentrl.models.tiny.load_model`).

    Raises:
        ValueError: a vision-language policy with settings it cannot run with yet
            (`check_vision_training`).
    """
    if checkpoint is not None:
        if is_vlm_dir(checkpoint):
            return (*_load_vlm_policy(checkpoint), checkpoint)
        return (*load_checkpoint(checkpoint), checkpoint)
    check_vision_training(cfg)
    path = cfg.model.path or default_model_dir(cfg, out, reporter)
    if is_vlm_dir(path):
        return (*_load_vlm_policy(path), path)
    return (*load_model(path), path)


def _load_vlm_policy(path: str | Path) -> tuple[Any, Any]:
    """`(model, tokenizer)` of a vision-language directory (`agentrl.models.vlm.load_vlm`), the image
    processor carried as `tokenizer.image_processor` (for the renderer, the engine and the
    checkpoints)."""
    model, tok, image_processor = load_vlm(path)
    tok.image_processor = image_processor
    return model, tok


# -- engine -------------------------------------------------------------------------------------
def rollout_engine(cfg: Config, model: Any, tok: Any, out: Path) -> Any:
    """The rollout engine of a run, holding a copy of `model`'s current weights as version 0.

    Returns:
        a `RolloutPool` of Ray workers (`rollout.num_workers > 0`) or of vLLM
        (`rollout.engine=vllm`), which hold their own envs and load the weights written to
        OUT/rollout_model (a vision-language policy's with its image processor, so the workers
        build `VisionHFEngine`); else the in-process engine of `make_engine` on a plain copy:
        a `VisionHFEngine` for a vision-language policy (`tok.image_processor` set) or an
        `HFEngine` (`rollout.torch_threads`, `rollout.compile`) holding its weights in
        `model.dtype` (the learner keeps float32 master weights, its compute precision is
        `train.precision`).
    """
    if cfg.rollout.num_workers > 0 or cfg.rollout.engine == "vllm":  # they hold the envs
        plain_copy(model).save_pretrained(out / "rollout_model")
        tok.save_pretrained(out / "rollout_model")
        image_processor = getattr(tok, "image_processor", None)  # a vision-language policy
        if image_processor is not None:  # a VLM directory: the workers build VisionHFEngine
            image_processor.save_pretrained(out / "rollout_model")
        return RolloutPool(cfg, out / "rollout_model")  # current weights = version 0
    return make_engine(cfg, plain_copy(model).eval(), tok)[0]


def teacher_engine(cfg: Config, tok: Any) -> Any:
    """The in-process engine (`make_engine`) holding the teacher (`algo.teacher_path`) in
    `model.dtype`, to sample the teacher's episodes of GKD's mixture
    (`algo.distill_teacher_fraction`); a copy of its own (the inline scorer,
    `agentrl.learner.frozen.load_teacher`, stays float32 and untouched). Its `policy_version` stays 0: the teacher never changes.

    Raises:
        FileNotFoundError: `teacher_path` is not a directory.
    """
    model, _ = load_model(cfg.algo.teacher_path, dtype=getattr(torch, cfg.model.dtype))
    model.requires_grad_(False)
    return make_engine(cfg, model.eval(), tok)[0]


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


# -- envs ---------------------------------------------------------------------------------------
def reward_wrappers(cfg: Config) -> Any:
    """One `RewardWrappers` for `cfg.env.wrappers` (judge client, curiosity memory, safety
    multiplier shared by every env made with it), or None when the run has no wrappers."""
    if not cfg.env.wrappers:
        return None
    return RewardWrappers.from_config(cfg)


def heldout_width(cfg: Config) -> int:
    """Envs the held-out evaluation runs at once: `min(train.eval_batch_size, episodes)` with
    `train.eval_tasks x train.eval_samples` episodes."""
    episodes = cfg.train.eval_tasks * cfg.train.eval_samples
    return min(int(cfg.train.eval_batch_size), int(episodes))


def heldout_envs(cfg: Config, rewards: Any = None) -> list[Any]:
    """The envs of the held-out evaluation: `heldout_width(cfg)` envs of the `heldout` split
    (fixed, so that evaluation batches do not depend on training's); the task list is the
    first `train.eval_tasks` tasks of that split (`agentrl.eval.harness.evaluate_heldout`)."""
    return [build_env(cfg, "heldout", rewards) for _ in range(heldout_width(cfg))]
