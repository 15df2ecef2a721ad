"""The agent loop: run many multi-turn episodes at once against one engine.

All live episodes advance in lockstep: their contexts are batched into one `engine.generate`
call, then every env steps in a thread pool (sandbox runs, HTTP calls are I/O-bound), then the
observations' ids are appended as chat-template deltas (never re-tokenizing: contract 1).

An env that raises in `reset` or `step` never kills the batch: the episode ends with
`info["error"]`, reward `error_reward`, and is kept (recorded) like any other. So does a call
that runs past its limit (`reset_timeout_s`, `step_timeout_s`): it is abandoned on its own
daemon thread (Python cannot stop a thread; that one is never reused, and closes its env if the
call ever returns), the other episodes go on, and the env instance is replaced in `envs` by a
fresh one from `make_env`, since the abandoned call may still be using it.
"""

from __future__ import annotations

import os
import queue
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from agentrl.env.content import content_error, message_images
from agentrl.models.vlm import ImageProcessorError
from agentrl.rollout.chat import ChatRenderer, RenderError
from agentrl.rollout.drift import check_episodes
from agentrl.rollout.engines.base import Engine, SamplingParams, prompt_key
from agentrl.rollout.spread import map_spread
from agentrl.types import Trajectory


@dataclass
class EpisodeSpec:
    """What to run: `reset_kwargs` for `env.reset` (seed, options), the group it belongs to,
    and its trunk: episodes of one group with the same `trunk` (not None) share their first
    turn (tree rollouts, `rollout.branch`): the first of them that starts samples it, the others
    take its tokens, logprobs and text (when their opening prompt has the same ids; otherwise
    they sample their own) and go on from there with their own envs and samples."""

    reset_kwargs: dict[str, Any]
    group_id: int = 0
    trunk: int | None = None


class EnvCallTimeout(Exception):
    """An env's `reset` or `step` ran longer than its limit (the call goes on in the background)."""


def _short_error(e: BaseException) -> str:
    tb = traceback.extract_tb(e.__traceback__)
    where = f" at {tb[-1].filename.rsplit('/', 1)[-1]}:{tb[-1].lineno}" if tb else ""
    return f"{type(e).__name__}: {e}{where}"[:500]


class _CallThread:
    """A daemon thread that runs the calls `call_with_timeout` hands it, one at a time. After a
    call that returned in time (or raised) it waits in `_IDLE` for the next one: a new thread per
    call cost about 40 us of CPU more, 2/3 of the CPU of handing a batch's cheap env calls to
    threads (`env.step_timeout_s` is set by default). After a call that was abandoned it calls
    `on_late` and exits: it never runs anything else."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._loop, name="agentrl-env-call", daemon=True).start()

    def _loop(self) -> None:
        while True:
            fn, box, cond, on_late = self.jobs.get()
            try:
                out: dict[str, Any] = {"value": fn()}
            except BaseException as e:  # noqa: BLE001 - re-raised on the caller's thread
                out = {"error": e}
            with cond:
                box.update(out)
                late = box.get("abandoned", False)
                idle = not late and self._park()  # idle before the caller has the result
                cond.notify_all()
            if late and on_late is not None:
                try:
                    on_late()
                except Exception:  # noqa: BLE001 - cleanup of an abandoned env: best effort
                    pass
            if not idle:
                return
            del fn, box, cond, on_late, out  # hold nothing of the call (its env) while idle

    def _park(self) -> bool:
        """Put this thread in `_IDLE` (a call handed to it meanwhile waits in `jobs`); False
        when enough threads are idle already (this one then exits)."""
        with _IDLE_LOCK:
            if len(_IDLE) >= _MAX_IDLE:
                return False
            _IDLE.append(self)
            return True


_IDLE: list[_CallThread] = []  # call threads waiting for a call (last in, first out)
_IDLE_LOCK = threading.Lock()
_MAX_IDLE = 64  # more idle ones than this exit


def _after_fork() -> None:
    """In a forked child: none of the parent's call threads exist there, and the lock may have
    been held by one of them at the fork."""
    global _IDLE_LOCK
    _IDLE_LOCK = threading.Lock()
    _IDLE.clear()


os.register_at_fork(after_in_child=_after_fork)


def call_with_timeout(fn: Callable[[], Any], timeout_s: float | None, *,
                      on_late: Callable[[], Any] | None = None) -> Any:
    """`fn()`, here when `timeout_s` is None, else on a daemon call thread (`_CallThread`: an
    idle one from an earlier call, or a new one) waited for at most `timeout_s` seconds.

    A call that does not return in time is abandoned: its thread (a daemon, so it never holds up
    the interpreter's exit) is used for nothing else, and calls `on_late` if `fn` returns after
    all (e.g. to close the env it was stepping; errors there are ignored). A call that returned
    in time leaves its thread to later calls (as a thread pool's worker is).

    Raises:
        EnvCallTimeout: `fn` ran longer than `timeout_s` seconds.
        Whatever `fn` raises (with its own traceback).
    """
    if timeout_s is None:
        return fn()
    box: dict[str, Any] = {}
    cond = threading.Condition()
    with _IDLE_LOCK:
        worker = _IDLE.pop() if _IDLE else None
    (worker or _CallThread()).jobs.put((fn, box, cond, on_late))
    with cond:
        if not cond.wait_for(lambda: "value" in box or "error" in box, timeout=timeout_s):
            box["abandoned"] = True  # read by the thread when (if ever) `fn` returns
            raise EnvCallTimeout(f"timed out after {timeout_s:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def _bad_parts(obs: Any) -> str | None:
    """What is wrong with the content parts (list contents) of observation `obs`, or None.
    String contents are not looked at here (the text path is unchanged)."""
    for k, m in enumerate(obs or []):
        if isinstance(m, dict) and isinstance(m.get("content"), list):
            err = content_error(m["content"])
            if err:
                return f"message {k}: {err}"
    return None


def _safe_reset(env: Any, kw: dict[str, Any], timeout_s: float | None = None) -> tuple[list | None, dict]:
    try:
        obs, info = call_with_timeout(lambda: env.reset(**kw), timeout_s, on_late=_closer(env))
        bad = _bad_parts(obs)
        if bad:  # e.g. a float or RGBA image: recorded like a reset that raised
            return None, {**dict(info or {}), "error": f"reset returned a bad observation: {bad}"}
        return obs, dict(info or {})
    except EnvCallTimeout as e:
        return None, {"error": f"reset {e}", "env_timeout": "reset"}
    except Exception as e:  # noqa: BLE001 - contract 7: a failing env is recorded, never fatal
        return None, {"error": f"reset failed: {_short_error(e)}"}


def _safe_step(env: Any, action: str, timeout_s: float | None = None) -> tuple[list, float, bool, bool, dict]:
    try:
        obs, reward, terminated, truncated, info = call_with_timeout(
            lambda: env.step(action), timeout_s, on_late=_closer(env))
        bad = _bad_parts(obs)
        if bad:  # recorded like a step that raised (contract 7)
            return [], float("nan"), True, False, {"error": f"step returned a bad observation: {bad}",
                                                   "env_exception": True}
        return list(obs or []), float(reward), bool(terminated), bool(truncated), dict(info or {})
    except EnvCallTimeout as e:  # a penalised failure, like an env that raised (module doc)
        return [], float("nan"), True, False, {"error": f"step {e}", "env_timeout": "step"}
    except Exception as e:  # noqa: BLE001 - contract 7
        return [], float("nan"), True, False, {"error": f"step failed: {_short_error(e)}",
                                               "env_exception": True}


class ImageObservationError(ValueError):
    """An env sent an image to a policy that cannot see (a configuration error: the run stops)."""


def env_label(env: Any) -> str:
    """How messages name `env`: its Gymnasium id, else its (unwrapped) class name."""
    spec = getattr(env, "spec", None)
    return getattr(spec, "id", None) or type(getattr(env, "unwrapped", env)).__name__


def check_images_allowed(env: Any, renderer: ChatRenderer, messages: list) -> None:
    """Raise when `messages` carry image parts and `renderer` renders text only (a text-only
    model's chat template would silently drop them).

    Raises:
        ImageObservationError: naming the env (its Gymnasium id, else its class) and the model
            (the tokenizer's `name_or_path`).
    """
    if getattr(renderer, "accepts_images", False) or not message_images(messages):
        return
    env_name = env_label(env)
    model = getattr(renderer.tokenizer, "name_or_path", "") or type(renderer.tokenizer).__name__
    raise ImageObservationError(
        f"env {env_name} sent an image observation, but the model {model!r} is text-only: "
        "use a vision-language model (model.vision=true builds the embedded tiny one, or "
        "model.path=<a local VLM directory>), or an env without images")


def _closer(env: Any) -> Callable[[], Any] | None:
    close = getattr(env, "close", None)
    return close if callable(close) else None


def opening_prompt(env: Any, renderer: ChatRenderer, reset_kwargs: dict[str, Any], *,
                   max_episode_tokens: int, reset_timeout_s: float | None = None
                   ) -> tuple[list[int] | None, bool]:
    """The prompt ids an episode reset with `reset_kwargs` opens with, as `run_episodes` puts
    it in its first generate call (None when the reset fails or times out, or the prompt leaves
    no room under `max_episode_tokens`: such an episode is in no generate call).

    Returns:
        `(ids or None, timed_out)`; after a time-out `env` must not be used again.
    """
    obs, info = _safe_reset(env, reset_kwargs, reset_timeout_s)
    if obs is None:
        return None, bool(info.get("env_timeout"))
    check_images_allowed(env, renderer, obs)
    try:
        ids = renderer.prompt_ids(obs, tools=info.get("tools"))
    except (ImageProcessorError, RenderError):  # run_episodes records it as a failed reset
        return None, False
    return (ids if len(ids) < max_episode_tokens else None), False


def run_episodes(
    engine: Engine,
    renderer: ChatRenderer,
    envs: list[Any],
    specs: Sequence[EpisodeSpec],
    params: SamplingParams,
    *,
    max_episode_tokens: int = 4096,
    executor: ThreadPoolExecutor | None = None,
    error_reward: float = 0.0,
    seed: int | None = None,
    on_turn: Callable[[int], None] | None = None,
    step_timeout_s: float | None = None,
    reset_timeout_s: float | None = None,
    make_env: Callable[[], Any] | None = None,
    seed_offsets: Mapping[bytes, int] | None = None,
) -> list[Trajectory]:
    """Run `len(specs)` episodes concurrently, episode i on `envs[i]`.

    Args:
        engine: the inference engine (`generate` from token ids).
        renderer: chat renderer of the engine's tokenizer.
        envs: one env per episode (reused across calls; each is reset here). A list: an env
            whose call timed out is replaced in it by `make_env()`.
        specs: reset arguments, group id and trunk per episode (episodes of a group with one
            trunk share their first turn: `EpisodeSpec`).
        params: sampling settings; `max_tokens` is the per-turn cap (tokens), further capped by
            what is left of `max_episode_tokens`. `params.n` must be 1 (groups are explicit).
        max_episode_tokens: cap on an episode's total length (tokens, prompt included); reaching
            it truncates the episode (`info["truncated_by"] = "max_episode_tokens"`).
        executor: thread pool for env resets/steps (one is made if None).
        error_reward: reward of a step whose env raised or timed out (the reason goes in
            `info["error"]`).
        seed: base seed of the sampler; turn k uses `seed + k` (None: engine state).
        on_turn: called with the number of live episodes after each generation (progress).
        step_timeout_s, reset_timeout_s: most seconds one `env.step` / `env.reset` may run
            (None: no limit). A step over it ends its episode (`terminated`, reward
            `error_reward`, `info["error"]`, `info["env_timeout"] = "step"`); a reset over it
            gives an empty episode (`info["env_timeout"] = "reset"`), as a failed reset does.
        make_env: makes a fresh env to replace one whose call timed out (needed with a limit).
        seed_offsets: for the first generate call, occurrences of each opening prompt
            (`prompt_key` of its ids) in rows of the same batch that run elsewhere and come
            before these (a rollout worker's earlier shards), so that this call's rows get
            the per-row seeds one call over the whole batch would give them (`row_seeds`).

    Returns:
        One `Trajectory` per spec, in order, with `policy_version` the version that sampled its
        first (oldest) token, else the engine's when the episode started (with batches in
        flight a weight update may land between two turns: later turns are then sampled by a
        newer version, never an older one), and the version
        of each sampled token in `token_versions` (the engine's `Completion.versions`, else the
        version it held before the call; with `rollout.partial` a turn may switch versions).

    Raises:
        ValueError: if `len(envs) < len(specs)`, `params.n != 1`, or a time limit is set
            without `make_env`.
    """
    if len(envs) < len(specs):
        raise ValueError(f"need one env per episode: {len(envs)} envs for {len(specs)} episodes")
    if params.n != 1:
        raise ValueError("run_episodes runs one sample per spec; express groups as repeated specs")
    if renderer.accepts_images and renderer.history == "template":
        raise ValueError("rollout.history=template renders text only; a vision-language policy needs "
                         "rollout.history=exact")
    if make_env is None and (step_timeout_s is not None or reset_timeout_s is not None):
        raise ValueError("step_timeout_s / reset_timeout_s need make_env: an env whose call timed "
                         "out is still in use by that call and is replaced, never reused")
    own_pool = executor is None
    pool = executor or ThreadPoolExecutor(max_workers=8)
    run = _Run(engine, renderer, envs, specs, params, max_episode_tokens, pool, error_reward,
               step_timeout_s, reset_timeout_s, make_env)
    try:
        return run.episodes(seed, on_turn, seed_offsets)
    finally:
        if own_pool:
            pool.shutdown(wait=True)


def turn_samples(trajs: Sequence[Trajectory]) -> list[Trajectory]:
    """The training samples of `trajs`: an episode sampled with `rollout.history=template`
    (it has `turn_prompts`) becomes one sample per turn, whose context is the prompt that turn
    was sampled from and whose completion is that turn's sampled ids (loss_mask 1 on them
    only). Each sample's one turn carries the episode's return (the sum of its turn rewards),
    so the episode's reward is shared by its turns; it keeps the episode's `group_id`, so a
    group-relative algorithm normalises over all turn samples of the group's episodes (an
    episode of n turns counts n times in the group's mean and std). `info` gains `turn_index`,
    `episode_turns` and `episode_return`. Other episodes (`exact`) are returned unchanged."""
    out: list[Trajectory] = []
    for tr in trajs:
        if not tr.turn_prompts:
            out.append(tr)
            continue
        ret = float(sum(t.reward for t in tr.turns))
        for k, (ctx, t) in enumerate(zip(tr.turn_prompts, tr.turns)):
            s = Trajectory(group_id=tr.group_id, task_id=tr.task_id, policy_version=tr.policy_version,
                           messages=tr.messages, terminated=tr.terminated, truncated=tr.truncated,
                           info={**tr.info, "turn_index": k, "episode_turns": len(tr.turns),
                                 "episode_return": ret}, timings=dict(tr.timings))
            s.append_context(ctx)
            kept = len(tr.token_versions) == len(tr.token_ids) and bool(tr.token_versions)
            s.append_sampled(tr.token_ids[t.start:t.end], tr.sampler_logprobs[t.start:t.end],
                             tr.token_versions[t.start:t.end] if kept else None,
                             reward=ret, text=t.text, finish_reason=t.finish_reason, info=dict(t.info))
            out.append(s)
    return out


@dataclass
class _Run:
    """One `run_episodes` call: its arguments, and the episodes' trajectories as they grow."""

    engine: Engine
    renderer: ChatRenderer
    envs: list[Any]
    specs: Sequence[EpisodeSpec]
    params: SamplingParams
    max_episode_tokens: int
    pool: ThreadPoolExecutor
    error_reward: float
    step_timeout_s: float | None
    reset_timeout_s: float | None
    make_env: Callable[[], Any] | None
    trajs: list[Trajectory] = field(default_factory=list)
    tools: dict[int, Any] = field(default_factory=dict)

    def episodes(self, seed: int | None, on_turn: Callable[[int], None] | None,
                 seed_offsets: Mapping[bytes, int] | None) -> list[Trajectory]:
        self.trajs = [Trajectory(group_id=s.group_id, policy_version=self.engine.policy_version)
                      for s in self.specs]
        live = self.reset_all()
        turn = 0
        while live:
            live = self.make_room(live)
            if not live:
                break
            offsets = None
            if turn == 0 and seed_offsets:  # later turns' contexts are the episodes' own
                offsets = [seed_offsets.get(prompt_key(self.trajs[i].token_ids), 0) for i in live]
            shared = self.trunks(live) if turn == 0 else {}
            actions = self.generate(live, None if seed is None else seed + turn, offsets, shared)
            if on_turn:
                on_turn(len(live))
            live = self.step_all(live, actions)
            turn += 1
        for tr in self.trajs:
            tr.info["num_turns"] = len(tr.turns)
        # info["template_drift"], every episode; renderings shared by a group's episodes
        check_episodes(self.renderer, self.trajs, [self.tools.get(i) for i in range(len(self.trajs))])
        for tr in self.trajs:
            tr.validate()
        return self.trajs

    def trunks(self, live: list[int]) -> dict[int, int]:
        """Episodes that take their first turn from another (`EpisodeSpec.trunk`): follower ->
        leader, the first live episode of the same (group, trunk) whose opening ids it shares.

        Raises:
            ValueError: trunks with a vision renderer (images are not compared).
        """
        out: dict[int, int] = {}
        first: dict[tuple[int, int], int] = {}
        for i in live:
            trunk = self.specs[i].trunk
            if trunk is None:
                continue
            if self.renderer.accepts_images:
                raise ValueError("shared first turns (rollout.branch > 1) are for text policies")
            j = first.setdefault((self.specs[i].group_id, trunk), i)
            if j != i and self.trajs[i].token_ids == self.trajs[j].token_ids:
                out[i] = j
        return out

    def retire(self, i: int) -> None:
        """Replace `envs[i]`, whose call timed out (it may still be running in it)."""
        assert self.make_env is not None  # checked by run_episodes
        self.envs[i] = self.make_env()

    def reset_all(self) -> list[int]:
        """Reset every env; returns the episodes that started (a failed reset: a recorded,
        empty, zero-reward episode)."""
        n, t0 = len(self.specs), time.perf_counter()
        resets = list(self.pool.map(
            lambda i: _safe_reset(self.envs[i], self.specs[i].reset_kwargs, self.reset_timeout_s),
            range(n)))
        live: list[int] = []
        for i, (obs, info) in enumerate(resets):
            tr = self.trajs[i]
            tr.info.update({k: v for k, v in info.items() if k != "tools"})
            tr.task_id = str(info.get("task_id", ""))
            tr.timings["env"] = 0.0
            tr.timings["generate"] = 0.0
            if info.get("env_timeout"):
                self.retire(i)
            if obs is None:
                tr.terminated = True
                continue
            check_images_allowed(self.envs[i], self.renderer, obs)
            try:
                ids, px = self.observation_inputs(obs, tools=info.get("tools"), opening=True)
            except (ImageProcessorError, RenderError) as e:  # recorded like a bad observation (contract 7)
                tr.info["error"] = (f"reset returned a bad observation: env {env_label(self.envs[i])}: "
                                    f"{e}")
                tr.terminated = True
                continue
            tr.messages = list(obs)
            self.tools[i] = info.get("tools")
            self.add_observation(tr, ids, px)
            live.append(i)
        reset_s = time.perf_counter() - t0
        for tr in self.trajs:
            tr.timings["env"] += reset_s / max(n, 1)
        return live

    def observation_inputs(self, msgs: list, *, tools: list | None = None, opening: bool = False
                           ) -> tuple[list[int], dict[str, Any] | None]:
        """The ids of observation `msgs` as context: the opening prompt (with `tools`) or a
        delta after an assistant turn, and with a vision renderer the images' pixel inputs
        (else None).

        Raises:
            ImageProcessorError: the image processor failed on one of the images.
        """
        r = self.renderer
        if not r.accepts_images:
            return (r.prompt_ids(msgs, tools=tools) if opening else r.delta_ids(msgs)), None
        return r.prompt_inputs(msgs, tools) if opening else r.delta_inputs(msgs)

    def add_observation(self, tr: Trajectory, ids: list[int], px: dict[str, Any] | None) -> None:
        """Append `observation_inputs`' ids to `tr` as context, and the images' pixel inputs
        and placeholder spans with them when there are any (`Trajectory.append_images`)."""
        start = len(tr.token_ids)
        tr.append_context(ids)
        if px is not None:
            tr.append_images(start, ids, px, self.renderer.image_token_id)

    def make_room(self, live: list[int], lengths: Mapping[int, int] | None = None) -> list[int]:
        """Truncate the episodes that reached `max_episode_tokens` (their ids, or `lengths`: the
        template's renderings of their history); returns the others."""
        out = []
        for i in live:
            if self.max_episode_tokens - (len(self.trajs[i].token_ids) if lengths is None else lengths[i]) <= 0:
                self.trajs[i].truncated = True
                self.trajs[i].info["truncated_by"] = "max_episode_tokens"
            else:
                out.append(i)
        return out

    def contexts(self, live: list[int]) -> dict[int, list[int]]:
        """The ids each live episode samples its next turn from: its ids so far
        (`rollout.history=exact`), or (`template`) the chat template's rendering of its messages
        so far, recorded in `Trajectory.turn_prompts`. An episode whose messages the template
        cannot render ends with the error recorded (contract 7) and is left out."""
        if self.renderer.history != "template":
            return {i: self.trajs[i].token_ids for i in live}
        out = {}
        for i in live:
            tr = self.trajs[i]
            try:
                ctx = tr.token_ids if not tr.turns else self.renderer.prompt_ids(tr.messages, self.tools.get(i))
            except RenderError as e:
                tr.info["error"] = f"step returned a bad observation: env {env_label(self.envs[i])}: {e}"
                tr.info.setdefault("errors", []).append(tr.info["error"])
                tr.turns[-1].reward = self.error_reward
                tr.terminated = True
                continue
            tr.turn_prompts.append(list(ctx))
            out[i] = tr.turn_prompts[-1]
        return out

    def generate(self, live: list[int], seed: int | None, offsets: list[int] | None,
                 shared: Mapping[int, int] | None = None) -> list[str]:
        """One generate call for every live episode, except those in `shared` (follower ->
        leader, `trunks`), which take their leader's sample; appends the sampled turns and
        returns their texts."""
        ctx = self.contexts(live)
        for i in set(ctx) - set(self.make_room(list(ctx), {i: len(c) for i, c in ctx.items()})):
            self.trajs[i].turn_prompts.pop()  # history=template: a rendering with no room left
            del ctx[i]
        if len(ctx) < len(live):  # episodes whose history the template refused, or out of room
            if offsets is not None:
                offsets = [o for i, o in zip(live, offsets) if i in ctx]
            live[:] = [i for i in live if i in ctx]
            if not live:
                return []
        shared = {i: j for i, j in (shared or {}).items() if i in ctx and j in ctx}
        rows = [i for i in live if i not in shared]  # the episodes that sample
        if offsets is not None and shared:
            offsets = [o for i, o in zip(live, offsets) if i not in shared]
        room = {i: self.max_episode_tokens - max(len(self.trajs[i].token_ids), len(ctx[i])) for i in live}
        cap = min(self.params.max_tokens, max(room.values()))
        p = replace(self.params, max_tokens=cap, seed=seed, seed_offsets=offsets)
        t0 = time.perf_counter()
        version = int(self.engine.policy_version)  # of tokens whose engine gives no versions
        if self.renderer.accepts_images:  # the engine gets each episode's images so far
            if not getattr(self.engine, "accepts_images", False):
                raise ValueError(f"engine {type(self.engine).__name__} takes no images; a vision "
                                 "renderer needs one that does (VisionHFEngine)")
            outs = self.engine.generate([ctx[i] for i in rows], p,  # type: ignore[call-arg]
                                        images=[self.trajs[i].vision for i in rows])
        else:
            outs = self.engine.generate([ctx[i] for i in rows], p)
        gen_s = time.perf_counter() - t0
        sampled = dict(zip(rows, outs))
        actions = []
        for i in live:
            out = sampled[shared.get(i, i)]
            ids, lps, finish = out.token_ids, out.logprobs, out.finish_reason
            vers = getattr(out, "versions", None) or [version] * len(ids)
            if len(ids) > room[i]:  # a row with less room than the batch cap
                ids, lps, vers, finish = ids[: room[i]], lps[: room[i]], vers[: room[i]], "length"
            text = self.renderer.decode_action(ids)
            tr = self.trajs[i]
            if not tr.num_sampled and len(vers):  # the first, oldest token's (versions never decrease)
                tr.policy_version = int(vers[0])
            tr.append_sampled(ids, lps, vers, text=text, finish_reason=finish)
            if i in shared:  # a tree rollout's branch (`trunks`)
                tr.info["shared_first_turn"] = True
            tr.messages.append({"role": "assistant", "content": text})
            tr.timings["generate"] += gen_s / len(live)
            actions.append(text)
        return actions

    def step_all(self, live: list[int], actions: list[str]) -> list[int]:
        """Step every live env with its text, concurrently; returns the episodes that go on."""
        t0 = time.perf_counter()
        results = map_spread(self.pool, lambda i, a: _safe_step(self.envs[i], a, self.step_timeout_s), live,
                             actions, [self.trajs[i].group_id for i in live])  # a group's twins apart
        env_s = time.perf_counter() - t0
        still = []
        for i, (obs, reward, terminated, truncated, info) in zip(live, results):
            tr = self.trajs[i]
            tr.timings["env"] += env_s / len(live)
            obs_inputs = None
            if not (terminated or truncated):
                check_images_allowed(self.envs[i], self.renderer, obs)
                try:
                    obs_inputs = self.observation_inputs(obs)
                except (ImageProcessorError, RenderError) as e:  # a penalised, recorded step (contract 7)
                    terminated, truncated = True, False
                    info = {**info, "error": f"step returned a bad observation: env "
                            f"{env_label(self.envs[i])}: {e}", "env_exception": True}
            if info.get("env_exception") or info.get("env_timeout"):  # a penalised, recorded step
                reward = self.error_reward
            if info.get("env_timeout"):
                tr.info["env_timeout"] = info["env_timeout"]
                self.retire(i)
            t = tr.turns[-1]
            t.reward = reward
            t.info = {k: v for k, v in info.items() if k != "tools"}
            if info.get("error") is not None:
                tr.info.setdefault("errors", []).append(info["error"])
            tr.terminated, tr.truncated = terminated, truncated
            if terminated or truncated:
                continue
            assert obs_inputs is not None
            tr.append_context(self.renderer.close_turn(tr.token_ids[t.start:t.end]))
            self.add_observation(tr, *obs_inputs)
            tr.messages.extend(obs)
            still.append(i)
        return still
