"""Repair examples from the policy's own failed attempts: the warm start's second phase on a
multi-turn run (`sft.policy_repair_tasks` > 0; issue 40, docs/learning.md).

The first phase's reference repairs (`agentrl.sft.repair_example`) show a *mutated reference*
as the failed attempt; the attempts a policy fails with look otherwise (a wrong operation, a
name it never defined, broken syntax), and conditioned on them a repair turn did worse than a
fresh first attempt (`agentrl.eval.attempts.independent_metrics`: feedback gain -0.13 to
-0.18 before RL). Here the policy itself runs episodes of up to `env.max_turns` attempts on
training tasks with the agent loop; every context in which it was given feedback after a
failed attempt becomes an example whose target is the task's reference solution. The context
is the episode's exact ids up to that turn (the opening, the sampled attempts as sampled, the
template's glue, the env's real feedback, the generation prompt: what the agent loop feeds the
policy at a repair turn, contract 1; with `rollout.history=template` the prompt that turn was
sampled from, `Trajectory.turn_prompts`), mask 0; the target is the reference's ids and the end of
turn, mask 1. The idea is on-policy self-correction data in the manner of RISE (Qu et al.,
"Recursive Introspection", NeurIPS 2024, arXiv:2407.18219), with the task's reference as the
improved answer instead of a better policy's sample.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from agentrl.config import Config
from agentrl.learner.lora import plain_copy
from agentrl.models.tokens import encode_continuation
from agentrl.rollout.chat import ChatRenderer
from agentrl.rollout.collect import collect_independent
from agentrl.rollout.engines.make import make_engine
from agentrl.rollout.envs import build_env
from agentrl.types import Trajectory

CHUNK = 64
"""Episodes per `collect` call."""


def wants_policy_repairs(cfg: Config) -> bool:
    """Does the run's warm start have the second phase? `sft.policy_repair_tasks` > 0 on a
    multi-turn run (`env.max_turns` > 1); a single-turn run ignores the key (no feedback to
    repair from)."""
    return cfg.sft.policy_repair_tasks > 0 and (cfg.env.max_turns or 1) > 1


def repair_contexts(tr: Trajectory) -> list[list[int]]:
    """The contexts of `tr` in which the policy answered after a failed attempt: for every turn
    j >= 1 whose previous turn did not pass (`info["verdict"]` != "pass"), the ids turn j was
    sampled from -- `tr.turn_prompts[j]` when the episode has them (`rollout.history=template`:
    the template's rendering of the history, which may move the system prompt or re-encode
    earlier turns), else `tr.token_ids` up to turn j's first sampled id (`exact`: the
    generation prompt included)."""
    return [list(tr.turn_prompts[j]) if tr.turn_prompts else list(tr.token_ids[: tr.turns[j].start])
            for j in range(1, len(tr.turns)) if tr.turns[j - 1].info.get("verdict") != "pass"]


def policy_repair_examples(cfg: Config, model: Any, tok: Any, renderer: ChatRenderer, *, tasks: int,
                           seed: int) -> tuple[list[Trajectory], dict[str, float]]:
    """Repair examples from the policy's own episodes (module doc) on the training tasks of
    seeds `seed .. seed + tasks - 1`, one episode each, sampled at `rollout.temperature` by the
    in-process engine (float32, on the CPU, as the warm start's checks) on a copy of `model`.

    Returns:
        `(examples, stats)`: one example per repair context (`repair_contexts`) of an episode
        whose task has a reference solution; stats `episodes`, `first_attempt_pass_rate` (the
        policy's first attempts on these tasks), `repair_contexts`.

    Raises:
        ValueError: the env offers no `reference_answer`, or an episode's task differs from its
            seed's (the episodes would be paired with other tasks' references).
    """
    if renderer.accepts_images:
        return [], {"episodes": 0.0, "first_attempt_pass_rate": float("nan"), "repair_contexts": 0.0}
    eng, _ = make_engine(cfg, plain_copy(model).cpu().eval(), tok, cast=False)
    seeds = [seed + i for i in range(tasks)]
    envs = [build_env(cfg, "train") for _ in range(min(CHUNK, tasks))]
    with ThreadPoolExecutor(cfg.rollout.env_threads) as pool:
        trajs = collect_independent(eng, renderer, envs, seeds, 1, cfg, pool,
                                    temperature=cfg.rollout.temperature, sample_seed=cfg.seed + 991)
    ref_env = build_env(cfg, "train")
    get = getattr(ref_env.unwrapped, "reference_answer", None)
    if get is None:
        raise ValueError("sft.policy_repair_tasks: this env has no reference_answer(); set it to 0")
    out: list[Trajectory] = []
    firsts = 0
    for sd, tr in zip(seeds, trajs):
        firsts += bool(tr.turns) and tr.turns[0].info.get("verdict") == "pass"
        contexts = repair_contexts(tr)
        if not contexts:
            continue
        _, info = ref_env.reset(seed=sd)
        if str(info.get("task_id", "")) != tr.task_id:
            raise ValueError(f"sft.policy_repair_tasks: seed {sd} reset to task {info.get('task_id')!r}, "
                             f"its episode ran {tr.task_id!r}")
        ref = get()
        if not ref:
            continue
        ids = encode_continuation(tok, ref) + [renderer.end_of_turn_id]
        for ctx in contexts:
            ex = Trajectory(task_id=tr.task_id)
            ex.append_context(ctx)
            ex.append_sampled(list(ids), [0.0] * len(ids), text=ref)
            out.append(ex)
    return out, {"episodes": float(len(trajs)), "first_attempt_pass_rate": firsts / max(len(trajs), 1),
                 "repair_contexts": float(len(out))}
