"""Partial rollouts on vLLM (`rollout.partial`): a `VLLMEngine.generate` whose requests are stopped
at a token boundary when new weights are loaded, and resumed from the same prefix with them.

The call drives vLLM's `LLMEngine` step by step (`add_request`, `step`, `abort_request`) instead
of `LLM.generate`, with `output_kind=DELTA` (each `step` gives the tokens and processed logprobs
each request sampled in it). After every `step` the engine's `weight_poll()` is called, as the HF
engine calls it after every decode step. A push (`VLLMEngine.update_weights` while such a call
runs) first aborts every unfinished request (`abort_inflight`: vLLM's prefix-cache reset refuses
while requests run, and no token of the old weights may be sampled after the load), then loads the
weights and resets the prefix cache; the call then resubmits each aborted row as a new request
whose prompt is the row's prompt plus every token it has received, with `max_tokens` less those
tokens. vLLM prefills that prefix with the new weights and samples on from it. Tokens are only
ever taken from `step` outputs: a token the engine core sampled but had not returned when the
request was aborted (possible with the engine core in a child process) is dropped and sampled
again from the same prefix by the new weights, so nothing is counted twice or lost. Each token's
version is the engine's `policy_version` when the `step` that returned it ran (weights change
only inside `weight_poll`, between steps).

Seeds: vLLM seeds a request's sampler (`torch.Generator.manual_seed(seed)`) when it is added and
draws from it at every step; the CPU build's generator cannot be moved on by an offset, and a
resubmitted request is a new request. So a row resumed after `k` tokens is seeded with
`resume_seed(row_seed, k)`, a hash of the row's seed and `k`: the same call, with the same pushes
at the same token positions, gives the same tokens (reproducible), but the draws after a switch
are not those an uninterrupted request would have made at those steps; greedy rows (temperature
0) draw nothing and give exactly the tokens of one decode whose weights switched there
(`tests/e2e/test_vllm_partial.py`, against the HF engine).
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass, field
from typing import Any

from agentrl.rollout.engines.base import Completion

_IDS = itertools.count()


def resume_seed(seed: int | None, k: int) -> int | None:
    """The vLLM request seed of a row resumed after `k` received tokens: `seed` itself for
    `k = 0`, else `blake2b(seed, k) mod 2**63`; None stays None (unseeded)."""
    if seed is None or k == 0:
        return seed
    h = hashlib.blake2b(digest_size=8)
    h.update(int(seed).to_bytes(16, "little", signed=True))
    h.update(int(k).to_bytes(8, "little"))
    return int.from_bytes(h.digest(), "little") & (2**63 - 1)


@dataclass
class Inflight:
    """The rows of one partial `generate` call: per row its prompt, vLLM sampling params and
    seed, and what it has received (ids, logprobs, versions, finish reason); `active` maps a
    running request id to its row; `aborted` lists the rows stopped by a push, to resubmit."""

    prompts: list[list[int]]
    sampling: list[Any]
    seeds: list[int | None]
    toks: list[list[int]] = field(default_factory=list)
    lps: list[list[float]] = field(default_factory=list)
    vers: list[list[int]] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    active: dict[str, int] = field(default_factory=dict)
    aborted: list[int] = field(default_factory=list)


def abort_inflight(engine: Any) -> None:
    """Abort every running request of the engine's partial `generate` call (if one runs) and
    mark its rows for resubmission; called by `VLLMEngine.update_weights` before it loads."""
    state: Inflight | None = getattr(engine, "_inflight", None)
    if state is None or not state.active:
        return
    engine.llm.llm_engine.abort_request(list(state.active))
    state.aborted += sorted(state.active.values())
    state.active.clear()


def _submit(engine: Any, state: Inflight, r: int) -> None:
    """Add row `r` as a new vLLM request: its prompt plus the tokens it has received."""
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    k = len(state.toks[r])
    params = state.sampling[r].clone()
    params.max_tokens = state.sampling[r].max_tokens - k
    params.seed = resume_seed(state.seeds[r], k)
    params.output_kind = RequestOutputKind.DELTA
    rid = f"agentrl-partial-{next(_IDS)}"
    engine.llm.llm_engine.add_request(rid, TokensPrompt(prompt_token_ids=[*state.prompts[r], *state.toks[r]]),
                                      params)
    state.active[rid] = r


def _take(state: Inflight, outputs: list[Any], version: int) -> None:
    """Record the tokens of one `step`'s outputs (DELTA) with `version`; finished rows leave
    `active`.

    Raises:
        RuntimeError: vLLM finished a request with another reason than "stop" or "length".
    """
    for out in outputs:
        r = state.active.get(out.request_id)
        if r is None:  # an aborted request's late output
            continue
        o = out.outputs[0]
        ids = list(o.token_ids)
        state.toks[r] += ids
        state.lps[r] += [float(step[tok].logprob) for tok, step in zip(ids, o.logprobs or [])]
        state.vers[r] += [version] * len(ids)
        if out.finished:
            if o.finish_reason not in ("stop", "length"):
                raise RuntimeError(f"vLLM finished a request with {o.finish_reason!r}")
            state.reasons[r] = o.finish_reason
            del state.active[out.request_id]


def generate_partial(engine: Any, prompts: list[list[int]], sampling: list[Any],
                     seeds: list[int | None]) -> list[Completion]:
    """One completion per row (row r continues `prompts[r]` with vLLM params `sampling[r]`,
    whose seed is `seeds[r]`), stepping vLLM's engine and calling `engine.weight_poll()` after
    every step; rows aborted by a push are resubmitted from their prefix (module doc).

    Returns:
        the completions in row order, `versions` per token.

    Raises:
        RuntimeError: a partial call is already running on this engine, or vLLM finished a
            request with another reason than "stop" or "length".
    """
    if getattr(engine, "_inflight", None) is not None:
        raise RuntimeError("VLLMEngine.generate: a partial generate call is already running")
    n = len(prompts)
    state = Inflight(prompts, sampling, seeds, [[] for _ in range(n)], [[] for _ in range(n)],
                     [[] for _ in range(n)], ["length"] * n)
    le = engine.llm.llm_engine
    engine._inflight = state
    try:
        for r in range(n):
            _submit(engine, state, r)
        while state.active:
            _take(state, le.step(), engine.policy_version)
            poll = engine.weight_poll
            if state.active and poll is not None and poll():
                abort_inflight(engine)  # new weights: whatever still runs resumes with them
            for r in state.aborted:
                _submit(engine, state, r)
            state.aborted.clear()
    finally:
        if state.active:  # an error or an interrupt: leave nothing running in vLLM
            le.abort_request(list(state.active))
        engine._inflight = None
    for r in range(n):
        if len(state.lps[r]) != len(state.toks[r]):
            raise RuntimeError(f"vLLM returned {len(state.toks[r])} ids but {len(state.lps[r])} logprobs")
    return [Completion(token_ids=state.toks[r], logprobs=state.lps[r], finish_reason=state.reasons[r],
                       versions=state.vers[r]) for r in range(n)]
