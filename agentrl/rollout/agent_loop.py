"""The agent loop: run many multi-turn episodes at once against one engine.

All live episodes advance in lockstep: their contexts are batched into one `engine.generate`
call, then every env steps in a thread pool (sandbox runs, HTTP calls are I/O-bound), then the
observations' ids are appended as chat-template deltas (never re-tokenizing: contract 1).

An env that raises in `reset` or `step` never kills the batch: the episode ends with
`info["error"]`, reward `error_reward`, and is kept (recorded) like any other.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from agentrl.rollout.chat import ChatRenderer
from agentrl.rollout.engines.base import Engine, SamplingParams
from agentrl.trajectory import Trajectory


@dataclass
class EpisodeSpec:
    """What to run: `reset_kwargs` for `env.reset` (seed, options), the group it belongs to."""

    reset_kwargs: dict[str, Any]
    group_id: int = 0


def _short_error(e: BaseException) -> str:
    tb = traceback.extract_tb(e.__traceback__)
    where = f" at {tb[-1].filename.rsplit('/', 1)[-1]}:{tb[-1].lineno}" if tb else ""
    return f"{type(e).__name__}: {e}{where}"[:500]


def _safe_reset(env: Any, kw: dict[str, Any]) -> tuple[list | None, dict]:
    try:
        obs, info = env.reset(**kw)
        return obs, dict(info or {})
    except Exception as e:  # noqa: BLE001 - contract 7: a failing env is recorded, never fatal
        return None, {"error": f"reset failed: {_short_error(e)}"}


def _safe_step(env: Any, action: str) -> tuple[list, float, bool, bool, dict]:
    try:
        obs, reward, terminated, truncated, info = env.step(action)
        return list(obs or []), float(reward), bool(terminated), bool(truncated), dict(info or {})
    except Exception as e:  # noqa: BLE001 - contract 7
        return [], float("nan"), True, False, {"error": f"step failed: {_short_error(e)}",
                                               "env_exception": True}


def run_episodes(
    engine: Engine,
    renderer: ChatRenderer,
    envs: Sequence[Any],
    specs: Sequence[EpisodeSpec],
    params: SamplingParams,
    *,
    max_episode_tokens: int = 4096,
    executor: ThreadPoolExecutor | None = None,
    error_reward: float = 0.0,
    seed: int | None = None,
    on_turn: Callable[[int], None] | None = None,
) -> list[Trajectory]:
    """Run `len(specs)` episodes concurrently, episode i on `envs[i]`.

    Args:
        engine: the inference engine (`generate` from token ids).
        renderer: chat renderer of the engine's tokenizer.
        envs: one env per episode (reused across calls; each is reset here).
        specs: reset arguments and group id per episode.
        params: sampling settings; `max_tokens` is the per-turn cap (tokens), further capped by
            what is left of `max_episode_tokens`. `params.n` must be 1 (groups are explicit).
        max_episode_tokens: cap on an episode's total length (tokens, prompt included); reaching
            it truncates the episode (`info["truncated_by"] = "max_episode_tokens"`).
        executor: thread pool for env resets/steps (one is made if None).
        error_reward: reward of a step whose env raised (the reason goes in `info["error"]`).
        seed: base seed of the sampler; turn k uses `seed + k` (None: engine state).
        on_turn: called with the number of live episodes after each generation (progress).

    Returns:
        One `Trajectory` per spec, in order, with `policy_version` of the engine when the
        episodes started (with batches in flight a weight update may land between two turns:
        later turns are then sampled by a newer version, never an older one).

    Raises:
        ValueError: if `len(envs) < len(specs)` or `params.n != 1`.
    """
    if len(envs) < len(specs):
        raise ValueError(f"need one env per episode: {len(envs)} envs for {len(specs)} episodes")
    if params.n != 1:
        raise ValueError("run_episodes runs one sample per spec; express groups as repeated specs")
    own_pool = executor is None
    pool = executor or ThreadPoolExecutor(max_workers=8)
    try:
        return _run(engine, renderer, envs, specs, params, max_episode_tokens, pool,
                    error_reward, seed, on_turn)
    finally:
        if own_pool:
            pool.shutdown(wait=True)


def _run(engine, renderer, envs, specs, params, max_episode_tokens, pool, error_reward, seed,
         on_turn) -> list[Trajectory]:
    n = len(specs)
    trajs = [Trajectory(group_id=s.group_id, policy_version=engine.policy_version) for s in specs]
    t0 = time.perf_counter()
    resets = list(pool.map(lambda i: _safe_reset(envs[i], specs[i].reset_kwargs), range(n)))
    live: list[int] = []
    for i, (obs, info) in enumerate(resets):
        tr = trajs[i]
        tr.info.update({k: v for k, v in info.items() if k != "tools"})
        tr.task_id = str(info.get("task_id", ""))
        tr.timings["env"] = 0.0
        tr.timings["generate"] = 0.0
        if obs is None:  # reset failed: a recorded, empty, zero-reward episode
            tr.terminated = True
            continue
        tr.messages = list(obs)
        tr.append_context(renderer.prompt_ids(obs, tools=info.get("tools")))
        live.append(i)
    reset_s = time.perf_counter() - t0
    for tr in trajs:
        tr.timings["env"] += reset_s / max(n, 1)

    turn = 0
    while live:
        # 1) generate for every live episode at once
        room = {i: max_episode_tokens - len(trajs[i].token_ids) for i in live}
        for i in [i for i in live if room[i] <= 0]:
            trajs[i].truncated = True
            trajs[i].info["truncated_by"] = "max_episode_tokens"
        live = [i for i in live if room[i] > 0]
        if not live:
            break
        cap = min(params.max_tokens, max(room[i] for i in live))
        p = replace(params, max_tokens=cap, seed=None if seed is None else seed + turn)
        t0 = time.perf_counter()
        outs = engine.generate([trajs[i].token_ids for i in live], p)
        gen_s = time.perf_counter() - t0
        if on_turn:
            on_turn(len(live))
        actions = []
        for i, out in zip(live, outs):
            ids, lps, finish = out.token_ids, out.logprobs, out.finish_reason
            if len(ids) > room[i]:  # a row with less room than the batch cap
                ids, lps, finish = ids[: room[i]], lps[: room[i]], "length"
            text = renderer.decode_action(ids)
            trajs[i].append_sampled(ids, lps, text=text, finish_reason=finish)
            trajs[i].messages.append({"role": "assistant", "content": text})
            trajs[i].timings["generate"] += gen_s / len(live)
            actions.append(text)
        # 2) step every env with its text, concurrently
        t0 = time.perf_counter()
        results = list(pool.map(lambda a: _safe_step(envs[a[0]], a[1]), zip(live, actions)))
        env_s = time.perf_counter() - t0
        still = []
        for i, (obs, reward, terminated, truncated, info) in zip(live, results):
            tr = trajs[i]
            tr.timings["env"] += env_s / len(live)
            if info.get("env_exception"):  # the env raised: a penalised, recorded step
                reward = error_reward
            t = tr.turns[-1]
            t.reward = reward
            t.info = {k: v for k, v in info.items() if k != "tools"}
            if info.get("error") is not None:
                tr.info.setdefault("errors", []).append(info["error"])
            tr.terminated, tr.truncated = terminated, truncated
            if terminated or truncated:
                continue
            tr.append_context(renderer.close_turn(tr.token_ids[t.start:t.end]))
            tr.append_context(renderer.delta_ids(obs))
            tr.messages.extend(obs)
            still.append(i)
        live = still
        turn += 1

    for tr in trajs:
        tr.info["num_turns"] = len(tr.turns)
        tr.validate()
    return trajs
