"""Supervised warm start on reference answers, so a tiny model starts RL from a non-zero
pass rate. A real stage with its own loss curve: token-mean cross-entropy over the answer
tokens (and the end-of-turn token) only; prompt tokens have loss_mask 0.

An env offers reference answers through `env.unwrapped.reference_answer() -> str | None`,
called right after `reset` (code_sandbox returns the task's reference solution).
`sft.mix_envs` mixes other envs' reference answers into the same stage.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentrl.config import Config
from agentrl.eval.episodes import EVAL_SEED, episode_success, extrinsic_return
from agentrl.eval.metrics import pass_at_k_many
from agentrl.infra.devices import resolve_device
from agentrl.learner.forward import precision_autocast, to_device, token_logprobs
from agentrl.learner.lora import plain_copy
from agentrl.learner.optim import NonFiniteLossError
from agentrl.log.progress import Reporter
from agentrl.models.tokens import encode_continuation
from agentrl.rollout.agent_loop import check_images_allowed
from agentrl.rollout.chat import ChatRenderer
from agentrl.rollout.collect import collect_independent
from agentrl.rollout.engines.make import make_engine
from agentrl.rollout.envs import build_env, build_named_env
from agentrl.sft_repairs import policy_repair_examples, wants_policy_repairs
from agentrl.types import Trajectory, collate


def sft_examples(env: Any, renderer: ChatRenderer, n: int, *, seed: int,
                 repair_fraction: float = 0.0) -> list[Trajectory]:
    """Reset `env` with seeds `seed .. seed+n-1` and build one supervised example per task:
    context = the opening messages + generation prompt (mask 0; with a vision renderer their
    images too, `Trajectory.vision`), target = the reference answer's ids + end-of-turn (mask 1).
    Tasks without a reference answer are skipped.

    With `repair_fraction` > 0 and an env offering `repair_demo(rng)` (code_sandbox), task i is
    a *repair* example with that probability (drawn from `numpy.random.default_rng(seed + i)`):
    context = the opening, a wrong attempt, its closing glue and the env's real feedback as the
    agent loop renders them (mask 0), target = the fix + end-of-turn (mask 1)
    (`repair_example`). With 0 nothing is drawn: the examples are those of before.

    Raises:
        ValueError: if the env offers no reference answers at all.
        ImageObservationError: the opening messages carry images and `renderer` renders text
            only (`agentrl.rollout.agent_loop.check_images_allowed`), before any step is trained.
    """
    out = []
    get = getattr(env.unwrapped, "reference_answer", None)
    if get is None:
        raise ValueError("sft: this env has no reference_answer(); set sft.steps=0")
    tok = renderer.tokenizer
    demo = getattr(env.unwrapped, "repair_demo", None) if repair_fraction > 0 else None
    for i in range(n):
        obs, info = env.reset(seed=seed + i)
        ans = get()
        if not ans:
            continue
        if demo is not None and not renderer.accepts_images:
            rng = np.random.default_rng(seed + i)
            if rng.random() < repair_fraction:
                ex = repair_example(renderer, obs, info, demo(rng))
                if ex is not None:
                    out.append(ex)
                    continue
                obs, info = env.reset(seed=seed + i)  # no failing mutant: a plain example
        tr = Trajectory(task_id=str(info.get("task_id", "")))
        if renderer.accepts_images:  # a vision renderer: the images go with the example
            ctx, px = renderer.prompt_inputs(obs, tools=info.get("tools"))  # type: ignore[attr-defined]
            tr.append_context(ctx)
            tr.append_images(0, ctx, px, renderer.image_token_id)  # type: ignore[attr-defined]
        else:  # a text-only model's template would drop image parts silently: refuse them
            check_images_allowed(env, renderer, obs)
            tr.append_context(renderer.prompt_ids(obs, tools=info.get("tools")))
        ids = encode_continuation(tok, ans) + [renderer.end_of_turn_id]
        tr.append_sampled(ids, [0.0] * len(ids), text=ans)
        out.append(tr)
    if not out:
        raise ValueError("sft: the env returned no reference answers; set sft.steps=0")
    return out


def repair_example(renderer: ChatRenderer, obs: list[dict[str, Any]], info: dict[str, Any],
                   demo: tuple[str, list[dict[str, Any]], str] | None) -> Trajectory | None:
    """A supervised repair example from `demo = (wrong attempt, feedback messages, fix)` after
    the opening `obs`, tokenized as the agent loop would have: prompt ids, the attempt's ids and
    end-of-turn, `close_turn`'s glue, `delta_ids(feedback)` (all mask 0), then the fix and
    end-of-turn (mask 1). None when `demo` is None."""
    if demo is None:
        return None
    wrong, feedback, fix = demo
    tok = renderer.tokenizer
    tr = Trajectory(task_id=str(info.get("task_id", "")))
    tr.append_context(renderer.prompt_ids(obs, tools=info.get("tools")))
    attempt = encode_continuation(tok, wrong) + [renderer.end_of_turn_id]
    tr.append_context(attempt + renderer.close_turn(attempt))
    tr.append_context(renderer.delta_ids(feedback))
    ids = encode_continuation(tok, fix) + [renderer.end_of_turn_id]
    tr.append_sampled(ids, [0.0] * len(ids), text=fix)
    tr.messages = [*obs, {"role": "assistant", "content": wrong}, *feedback,
                   {"role": "assistant", "content": fix}]
    return tr


def warm_start_examples(cfg: Config, renderer: ChatRenderer, n: int, *,
                        seed: int) -> tuple[list[Trajectory], dict[str, int]]:
    """The warm start's examples: `sft_examples` of `n` training tasks of `env.name` (a share
    `sft.repair_fraction` of them repair examples when the env is multi-turn, `env.max_turns` >
    1), plus, for
    each env of `sft.mix_envs`, those of `round(n * share)` of its training tasks (its own seeds,
    offset per env), in one list (`sft_train` shuffles them together: one mixed stage).

    Returns:
        `(examples, {env name: examples from it})`.

    Raises:
        ValueError: an env offers no reference answers (`sft_examples`).
    """
    repair = cfg.sft.repair_fraction if (cfg.env.max_turns or 1) > 1 else 0.0
    out = sft_examples(build_env(cfg, "train"), renderer, n, seed=seed, repair_fraction=repair)
    counts = {cfg.env.name: len(out)}
    for j, (name, share) in enumerate(cfg.sft.mix_envs.items(), start=1):
        ex = sft_examples(build_named_env(cfg, name, "train"), renderer, max(1, round(n * share)),
                          seed=seed + 1_000_003 * j)
        counts[name] = counts.get(name, 0) + len(ex)
        out += ex
    return out, counts


def stage_device(cfg: Config) -> torch.device:
    """The device of the stages that train in the driver (the warm start, offline DPO and SFT):
    `train.device` (`resolve_device`); with learner ranks (`train.learner_workers > 0`, whose
    device the ranks check) the driver's GPU when it has one and `train.device` is not `cpu`,
    else the CPU (a CPU-only head node).

    Raises:
        ValueError: `train.device=cuda` without a CUDA device, in-process."""
    if cfg.train.learner_workers > 0:
        use_cuda = cfg.train.device != "cpu" and torch.cuda.is_available()
        return torch.device("cuda" if use_cuda else "cpu")
    return resolve_device(cfg.train.device)


def sft_train(model: Any, examples: list[Trajectory], *, steps: int, lr: float, batch_size: int,
              pad_id: int, seed: int = 0, grad_clip: float = 1.0,
              log: Callable[[int, float], None] | None = None,
              stop: Callable[[int], bool] | None = None, check_every: int = 10,
              device: str | torch.device | None = None, precision: str = "fp32") -> list[float]:
    """Train `model` in place for up to `steps` AdamW steps of `batch_size` examples (sampled
    without replacement, reshuffled each epoch) with a cosine learning-rate decay to 10% of `lr`.
    Every `check_every` steps `stop(steps_done)` may end the stage early (e.g. once the model
    solves enough training tasks, so RL starts with room to improve). The steps run on `device`
    (`resolve_device`; None: the model's) at `precision` (`bf16`: the forward under bf16
    autocast, float32 weights, AdamW state and loss, as the learner; `precision_autocast`); the
    model is back on its own device afterwards (also after an error).

    Returns:
        the loss (nats per answer token) of every step run.

    Raises:
        NonFiniteLossError: a step's loss or gradient norm is NaN or infinite (the weights are
            not updated by that step; the message names `sft.lr` and the step).
    """
    home = next(model.parameters()).device
    dev = resolve_device(device) if device is not None else home
    model.to(dev)
    try:
        return _sft_steps(model, examples, steps=steps, lr=lr, batch_size=batch_size, pad_id=pad_id,
                          seed=seed, grad_clip=grad_clip, log=log, stop=stop, check_every=check_every,
                          device=dev, precision=precision)
    finally:
        model.to(home)


def _sft_steps(model: Any, examples: list[Trajectory], *, steps: int, lr: float, batch_size: int,
               pad_id: int, seed: int, grad_clip: float, log: Callable[[int, float], None] | None,
               stop: Callable[[int], bool] | None, check_every: int, device: torch.device,
               precision: str) -> list[float]:
    """`sft_train`'s loop, on `device` (the model is there)."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: 0.1 + 0.9 * 0.5 * (1 + torch.cos(torch.tensor(s / max(steps, 1) * 3.14159)).item()))
    gen = torch.Generator().manual_seed(seed)
    order: list[int] = []
    losses = []
    model.train()
    for step in range(steps):
        if len(order) < batch_size:
            order += torch.randperm(len(examples), generator=gen).tolist()
        idx, order = order[:batch_size], order[batch_size:]
        batch = to_device(collate([examples[i] for i in idx], pad_id), device)
        with precision_autocast(device, precision):  # logp in float32 (upcast logits)
            logp, _ = token_logprobs(model, batch["input_ids"], batch["attention_mask"],
                                     vision=batch.get("vision"))
        mask = batch["loss_mask"]
        loss = -(logp * mask).sum() / mask.sum().clamp(min=1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        if not (torch.isfinite(loss) and torch.isfinite(gn)):
            raise NonFiniteLossError(
                f"warm start step {step}: loss {loss.item():.4g}, grad norm {gn.item():.4g} (not finite); "
                f"the model has diverged or was built so (lower sft.lr, now {lr:g}, or check "
                f"model.init_std); nothing was saved")
        opt.step()
        sched.step()
        losses.append(loss.item())
        if log:
            log(step, losses[-1])
        if stop is not None and (step + 1) % check_every == 0 and stop(step + 1):
            break
    return losses


def evaluate(engine: Any, renderer: ChatRenderer, envs: list[Any], cfg: Config,
             pool: ThreadPoolExecutor, *, n_tasks: int, samples: int, temperature: float
             ) -> dict[str, float]:
    """pass@1, pass@`samples`, mean reward, sampled tokens and turns per episode on the seeded
    tasks `EVAL_SEED + i` of `envs`' split, `samples` episodes each: the warm start's stop check
    on *training* tasks. The
    held-out figure of a run is `agentrl.eval.harness.evaluate_heldout` (the env's fixed
    held-out list). The samples are independent whatever `rollout.branch` (tree rollouts
    shape training groups: here they would copy first turns and bias pass@k)."""
    trajs = collect_independent(engine, renderer, envs, [EVAL_SEED + i for i in range(n_tasks)],
                                samples, cfg, pool, temperature=temperature,
                                sample_seed=cfg.seed + 777)
    succ = np.array([episode_success(t) for t in trajs], dtype=float)
    rets = np.array([extrinsic_return(t) for t in trajs], dtype=float)
    per_task = succ.reshape(-1, samples).sum(axis=1)  # collect is group-major
    at_k, _ = pass_at_k_many([samples] * len(per_task), per_task.astype(int).tolist(), samples)
    return {"pass@1": float(succ.mean()), f"pass@{samples}": float(at_k.mean()),
            "reward_mean": float(np.nanmean(rets)),
            "tokens_mean": float(np.mean([t.num_sampled for t in trajs])),
            "turns_mean": float(np.mean([len(t.turns) for t in trajs]))}


def policy_repair_phase(cfg: Config, model: Any, tok: Any, renderer: ChatRenderer, pad_id: int,
                        examples: list[Trajectory], slog: Any, step0: int, say: Callable[[str], None]
                        ) -> dict[str, Any]:
    """The warm start's second phase (`sft.policy_repair_tasks` > 0 on a multi-turn run): repair
    examples from the policy's own episodes on that many training tasks
    (`agentrl.sft_repairs.policy_repair_examples`: the exact context of every answer after
    failed feedback, the task's reference as the target), mixed with as many of the first
    phase's `examples` (drawn with the run's seed, so its first-attempt skill is rehearsed), and
    `sft.policy_repair_steps` steps of `sft_train` on them (`sft.lr`, `sft.batch_size`, no stop
    checks). Losses go to SLOG (`sft/loss`, steps after STEP0, with `sft/phase` 2).

    Returns:
        `sft_policy_repairs` (examples), `sft_policy_first_attempt` (the policy's first-attempt
        pass rate on those tasks before the phase), `sft_policy_repair_steps`,
        `sft_policy_repair_loss_first` / `_last`.
    """
    sc = cfg.sft
    reps, st = policy_repair_examples(cfg, model, tok, renderer, tasks=sc.policy_repair_tasks,
                                      seed=cfg.seed * 7919 + 1)
    info: dict[str, Any] = {"sft_policy_repairs": len(reps), "sft_policy_first_attempt": st["first_attempt_pass_rate"],
                            "sft_policy_repair_steps": 0}
    if not reps:
        say("[sft] policy repairs: no failed attempt to learn from; second phase skipped")
        return info
    rng = np.random.default_rng(cfg.seed + 4099)
    keep = rng.choice(len(examples), size=min(len(examples), len(reps)), replace=False)
    mix = [examples[int(i)] for i in keep] + reps

    def log(s: int, loss: float) -> None:
        slog.write(json.dumps({"step": step0 + s, "sft/loss": loss, "sft/phase": 2}) + "\n")

    losses = sft_train(model, mix, steps=sc.policy_repair_steps, lr=sc.lr, batch_size=sc.batch_size,
                       pad_id=pad_id, seed=cfg.seed + 1, log=log, device=stage_device(cfg),
                       precision=cfg.train.precision)
    say(f"[sft] policy repairs: {len(reps)} contexts after a failed attempt on {int(st['episodes'])} "
        f"training tasks (first attempts passed {st['first_attempt_pass_rate']:.3f}); "
        f"{len(losses)} steps on them and as many first-phase examples: loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    return {**info, "sft_policy_repair_steps": len(losses), "sft_policy_repair_loss_first": losses[0],
            "sft_policy_repair_loss_last": losses[-1]}


def warm_start(cfg: Config, model: Any, tok: Any, renderer: ChatRenderer, pad_id: int, out: Path,
               say: Callable[[str], None], reporter: Any = None) -> dict[str, Any]:
    """The warm start of a run (`cfg.sft`): `sft_train` on `warm_start_examples` of training
    tasks (the run's env's, mixed with those of `sft.mix_envs`), stopped early once, on the
    run's env's training tasks (never the held-out split; episodes of `sft.check_turns` turns
    when set, e.g. first attempts only), pass@1 reaches
    `sft.stop_pass_rate` and pass@k (k = `sft.check_samples`) reaches `sft.stop_pass_at_k`
    (each when set; checked every `sft.check_every` steps from `sft.min_steps` on, on
    `sft.check_tasks` tasks x k samples). Then, on a multi-turn run with
    `sft.policy_repair_tasks` > 0, the second phase `policy_repair_phase` (also when
    `sft.steps` is 0: on the loaded model).
    Trains `model` in place, writes OUT/sft_metrics.jsonl (line-buffered: each row is on disk
    when written) and saves OUT/sft_model. Progress (steps, ETA, loss) goes to `reporter`
    (`agentrl.log.progress.Reporter`; None: silent).

    Returns:
        `sft_loss_first`, `sft_loss_last` (nats per answer token; None without a first phase),
        `sft_steps`, `sft_seconds` (both phases),
        `sft_train_pass@1` (the last stop check's, None without one), `sft_examples` (examples
        per env), and the second phase's keys (`policy_repair_phase`) when it ran.

    Raises:
        ValueError: the env offers no reference answers (`sft_examples`).
    """
    reporter = reporter or Reporter(enabled=False)
    t0 = time.perf_counter()
    examples, counts = warm_start_examples(cfg, renderer, max(2000, cfg.sft.batch_size),
                                           seed=cfg.seed * 7919 + 1)
    if cfg.sft.mix_envs:
        say("[sft] one mixed stage on " + ", ".join(f"{c} {name}" for name, c in counts.items())
            + " reference answers")
    slog = (out / "sft_metrics.jsonl").open("w", buffering=1)  # line-buffered
    checks: list[tuple[int, float]] = []

    sc = cfg.sft
    k = sc.check_samples
    ccfg = cfg if sc.check_turns is None else cfg.model_copy(  # the checks' episodes
        update={"env": cfg.env.model_copy(update={"max_turns": sc.check_turns})})

    def stop(done: int) -> bool:  # pass@1 / pass@k on training tasks (never the held-out split)
        if (sc.stop_pass_rate is None and sc.stop_pass_at_k is None) or done < sc.min_steps:
            return False
        # float32, uncompiled, on the CPU as the run's in-process engine (the model may be on a GPU)
        eng, _ = make_engine(cfg, plain_copy(model).cpu().eval(), tok, cast=False)
        envs_ = [build_env(ccfg, "train") for _ in range(k * sc.check_tasks)]
        with ThreadPoolExecutor(cfg.rollout.env_threads) as p_:
            r = evaluate(eng, renderer, envs_, ccfg, p_, n_tasks=sc.check_tasks, samples=k,
                         temperature=cfg.rollout.temperature)
        model.train()
        checks.append((done, r["pass@1"]))
        row = {"step": done, "sft/train_pass@1": r["pass@1"], "sft/train_turns": r["turns_mean"]}
        if k > 1:
            row[f"sft/train_pass@{k}"] = r[f"pass@{k}"]
        slog.write(json.dumps(row) + "\n")
        return ((sc.stop_pass_rate is None or r["pass@1"] >= sc.stop_pass_rate)
                and (sc.stop_pass_at_k is None or r[f"pass@{k}"] >= sc.stop_pass_at_k))

    bar = reporter.stage("sft", cfg.sft.steps, unit="warm-start steps")

    def log(s: int, loss: float) -> None:
        slog.write(json.dumps({"step": s, "sft/loss": loss}) + "\n")
        bar.advance(1, f"loss {loss:.3f}" + (f" · train pass@1 {checks[-1][1]:.3f}" if checks else ""))

    try:
        losses = sft_train(model, examples, steps=cfg.sft.steps, lr=cfg.sft.lr,
                           batch_size=cfg.sft.batch_size, pad_id=pad_id, seed=cfg.seed,
                           log=log, stop=stop, check_every=cfg.sft.check_every,
                           device=stage_device(cfg), precision=cfg.train.precision) if cfg.sft.steps else []
    finally:
        bar.close()
    seconds = time.perf_counter() - t0
    info: dict[str, Any] = {"sft_loss_first": losses[0] if losses else None,
                            "sft_loss_last": losses[-1] if losses else None, "sft_steps": len(losses),
                            "sft_seconds": seconds, "sft_train_pass@1": checks[-1][1] if checks else None,
                            "sft_examples": counts}
    if losses:
        say(f"[sft] {len(losses)} steps: loss {losses[0]:.3f} -> {losses[-1]:.3f} "
            f"({seconds:.0f} s)" + (f", train pass@1 {checks[-1][1]:.3f}" if checks else ""))
    try:
        if wants_policy_repairs(cfg):
            info.update(policy_repair_phase(cfg, model, tok, renderer, pad_id, examples, slog, len(losses), say))
            info["sft_seconds"] = time.perf_counter() - t0
    finally:
        slog.close()
    model.save_pretrained(out / "sft_model")
    tok.save_pretrained(out / "sft_model")
    if getattr(tok, "image_processor", None) is not None:
        tok.image_processor.save_pretrained(out / "sft_model")
    return info
