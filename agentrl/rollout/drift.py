"""Per-episode template drift: do an episode's trained ids equal the chat template's rendering
of its messages? (Contract 1; `rollout/template_drift`; docs/models.md.)

The agent loop never re-renders history: an episode's ids are the opening prompt, then each
sampled turn as sampled, then each observation as the template's delta cut from a canned
conversation (`ChatRenderer.delta_ids`). This module renders the episode's *actual* messages
with the template and compares, region by region, with the tokenizer only (no model):

- **opening**: the ids before the first turn against the template's rendering of the opening
  messages (`prompt_ids`, through `ChatRenderer.prompt_render`, which also gives the messages
  it rendered: the renderer's role fallbacks, `agentrl.rollout.roles`, e.g. two opening user
  messages merged, a system message folded; the later regions render those messages, and each
  observation through the renderer's own `render_observation`, so the check renders what the
  renderer rendered, same fallbacks, same order).
- **after turn k**: the ids from turn k's end of turn to the start of turn k+1 (end of turn,
  glue, the observations, the next generation prompt; to the end of the episode for the last
  turn; a turn that stopped at another stop id, e.g. eos, counts as closed by the end of turn,
  as `ChatRenderer.close_turn` treats it) against the template's rendering of the episode's messages up to there, read after
  turn k's content. Turn k's content is rendered as a placeholder character, so how the
  template rewrites *content* (Qwen3 and R1-distill drop `<think>` blocks of earlier turns,
  Mistral trims it) is not drift: with `rollout.history=exact` the policy keeps what it
  sampled, by policy. For a template that rewrites history (`ChatRenderer.rewrites_history`)
  the system message and the tools are also left out of these renderings (Mistral moves both
  to the last user message; the agent loop keeps them where they were, by policy).
- **generation prompt / sampled text**: the text after the last control token of a turn's
  context, followed by the turn's text, encoded as one string, against the context's ids
  followed by the encoding of the turn's text alone (both encoded as continuations,
  `encode_continuation`: they sit after a control token, where a SentencePiece-style tokenizer
  puts no "▁"). A tokenizer that merges across this
  boundary (e.g. a generation prompt ending in "\\n" and a turn starting with "\\n", which
  the template's rendering tokenizes as one "\\n\\n" token) shows here. The sampled ids
  themselves are not compared with the encoding of their text: a model may sample a split
  the tokenizer would not make (it trains on what it sampled), which is not the template's.

Text from envs is encoded with special strings split on both sides (`neutralize`), as the
renderer does. With `rollout.history=template` the contexts are the template's own renderings
(`Trajectory.turn_prompts`): only the boundary check applies. A vision renderer's episodes are
not checked (their placeholders are widened per image).

Cost: one template rendering per turn plus one per episode, and tokenizer encodes of the
compared regions, a fraction of a millisecond per turn for the family templates
(docs/models.md). Every episode is checked; what is shared is only what is the same function
of the same inputs (`_memo`), per `run_episodes` call (`check_episodes`):
- the renderings that depend on the opening messages only (the opening; the region after the
  first turn, when the observations after it are the same) are computed once per group;
- the encoding of the text after the placeholder (the same for every turn followed by the
  same observations: "Now the last digit.", the generation prompt), and the decoding of each
  generation prompt, are computed once per batch;
- the boundary check's two encodes per turn (generation prompt + text, text alone) are done
  for the whole batch in one call (`prefetch_boundaries`) that is the same function as one
  `encode_continuation` per text (each text sent after the same sentinel, its id dropped;
  `_backend_batch`, `_batch_encode_is_encode`): most of the check's
  encoding cost was per-call overhead and the offsets `encode` computes and drops.
Nothing is skipped on the grounds that a merge "cannot" happen: whether a generation prompt's
last character merges with a turn's first depends on the tokenizer's pre-tokenizer and merges,
which this check exists to test.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from agentrl.models.tokens import continuation_prefix, decode_continuation, encode_continuation
from agentrl.rollout.chat import (
    ChatRenderer,
    Message,
    RenderError,
    encode_neutralized,
    render_key,
)
from agentrl.types import Trajectory

PLACE = "\ue001"
"""The placeholder rendered as a sampled turn's content (a private-use character; `neutralize`
uses \\ue000 and \\ue100-\\uf8ff)."""


T = TypeVar("T")


def _memo(cache: dict | None, kind: str, key: Any, fn: Callable[[], T]) -> T:
    """`fn()`, kept in `cache[kind]` under `key` (None: not kept). Exact: every memoised value
    is a pure function of its key for a given renderer (a template rendering of plain messages,
    keyed by their `render_key`, whose `repr` keeps types and key order; an encode or decode
    keyed by its text or ids), and a cache lives for one `run_episodes` call (one renderer)."""
    if cache is None or key is None:
        return fn()
    memo = cache.setdefault(kind, {})
    if key not in memo:
        memo[key] = fn()
    return memo[key]


def _encode(r: ChatRenderer, cache: dict | None, text: str, found: list[str]) -> list[int]:
    """`encode_neutralized(r.tokenizer, text, found, continuation=True)` (`text` is cut from the
    middle of a rendering, after the placeholder), memoised: the text after the placeholder is
    the same for every turn followed by the same observations (a fresh list)."""
    return list(_memo(cache, "encode", (text, *found),
                      lambda: tuple(encode_neutralized(r.tokenizer, text, found, continuation=True))))


def _decode(r: ChatRenderer, cache: dict | None, ids: list[int], mid: bool = True) -> str:
    """The text of `ids`, memoised (generation prompts repeat): `decode_continuation` when they
    follow a control token (`mid`: a SentencePiece decoder keeps their leading space), else
    `tokenizer.decode(ids, skip_special_tokens=False)`."""
    if not mid:
        return _memo(cache, "decode0", tuple(ids), lambda: r.tokenizer.decode(ids, skip_special_tokens=False))
    return _memo(cache, "decode", tuple(ids), lambda: decode_continuation(r.tokenizer, ids))


class _NotRendered(RenderError):
    """The template did not render the placeholder exactly once."""


def assistant_indices(messages: list[Message], turns: list[Any]) -> list[int]:
    """Index in `messages` of each sampled turn's assistant message, matched from the end (an
    env's opening may hold few-shot assistant messages before them).

    Raises:
        ValueError: a turn's text has no assistant message.
    """
    out: list[int] = []
    j = len(messages)
    for t in reversed(turns):
        j -= 1
        while j >= 0 and not (messages[j].get("role") == "assistant" and messages[j].get("content") == t.text):
            j -= 1
        if j < 0:
            raise ValueError("a sampled turn has no assistant message with its text")
        out.append(j)
    return out[::-1]


def _after_place(r: ChatRenderer, msgs: list[Message], gen: bool, tools: list | None,
                 cache: dict | None) -> list[int]:
    text, found = r.render_text(msgs, gen, tools)
    if text.count(PLACE) != 1:
        raise _NotRendered("the template did not render the turn's content")
    return _encode(r, cache, text.split(PLACE, 1)[1], found)


def _region_ids(r: ChatRenderer, history: list[Message], obs: list[Message], gen: bool,
                tools: list | None, cache: dict | None) -> tuple[list[int], list[Message]]:
    """The template's ids after the placeholder turn ending `history` (the messages as rendered
    so far), with `obs` after it, and `obs` as rendered: through the renderer's own fallbacks,
    in its order (`ChatRenderer.render_observation`: roles refused or dropped as `user`, runs of
    users merged, system messages folded), rendered after `history`."""
    if r.rewrites_history:
        history = [m for m in history if m.get("role") != "system"]
        tools = None
    return r.render_observation(obs, lambda c: _after_place(r, history + c, gen, tools, cache))


def _first_diff(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def _report(turn: int, where: str, pos: int, expected: list[int], got: list[int], d: int, tok: Any
            ) -> dict[str, Any]:
    def show(ids: list[int]) -> list[str]:
        return [tok.decode([i], skip_special_tokens=False) for i in ids[max(d - 2, 0): d + 4]]

    return {"turn": turn, "where": where, "position": int(pos), "expected": expected[d: d + 4],
            "got": got[d: d + 4], "expected_text": show(expected), "got_text": show(got)}


def _tail(r: ChatRenderer, ctx: list[int]) -> list[int]:
    """The ids of `ctx` after its last control token (all of them when it has none): a turn's
    generation prompt. Scanned from the end (the tail is short; the context is not)."""
    i = len(ctx) - 1
    while i >= 0 and ctx[i] not in r.control_ids:
        i -= 1
    return ctx[i + 1:]


def _text_ids(r: ChatRenderer, cache: dict | None, text: str, mid: bool = True) -> list[int]:
    """`encode_continuation(tokenizer, text)` (`mid`: the text follows a control token or other
    text, as every text the boundary check encodes does unless a context has no control token)
    or `tokenizer.encode(text, add_special_tokens=False)`, a fresh list; from `cache` when
    `prefetch_boundaries` encoded it."""
    if not mid:
        return list(_memo(cache, "text0", text,
                          lambda: tuple(r.tokenizer.encode(text, add_special_tokens=False))))
    return list(_memo(cache, "text", text, lambda: tuple(encode_continuation(r.tokenizer, text))))


def _batch_encode_is_encode(tok: Any) -> bool:
    """Whether `tok(texts, add_special_tokens=False)["input_ids"][i]` is, by construction,
    `tok.encode(texts[i], add_special_tokens=False)`: true for a transformers fast tokenizer
    that overrides none of `__call__`, `encode`, `_encode_plus`. Both then run the same
    `_encode_plus` (no padding, no truncation, the tokenizer's `split_special_tokens`); a
    single text is wrapped as a batch of one, and the `tokenizers` backend's `encode_batch`
    encodes each text of a batch on its own (the batch only saves per-call Python overhead)."""
    cls = type(tok)
    names = {"__call__": "PreTrainedTokenizerBase.__call__", "encode": "PreTrainedTokenizerBase.encode",
             "_encode_plus": "TokenizersBackend._encode_plus"}
    return (not hasattr(tok, "_switch_to_input_mode")
            and all(getattr(getattr(cls, k, None), "__qualname__", None) == v for k, v in names.items()))


VERIFIED_TRANSFORMERS = ("5.25.",)
"""transformers versions whose fast-tokenizer `_encode_plus` was read for `_backend_batch`."""


def _backend_batch(tok: Any) -> Callable[[list[str]], list[list[int]]] | None:
    """The `tokenizers` backend's `encode_batch_fast` (ids of each text, no special tokens) when
    it is, by construction, `tok.encode(text, add_special_tokens=False)` of each; else None.

    In the transformers versions read (`VERIFIED_TRANSFORMERS`), a fast tokenizer that
    overrides none of `__call__`, `encode`, `_encode_plus` (`_batch_encode_is_encode`) encodes
    a text by: turning the backend's truncation and padding off (when set), setting its
    `encode_special_tokens` to the tokenizer's `split_special_tokens`, and taking the `ids` of
    `backend.encode_batch([text], add_special_tokens=False)`. So when the backend has no
    truncation and no padding and already has that `encode_special_tokens`, the backend's
    call gives the same ids; `encode_batch_fast` is `encode_batch` without the character
    offsets (which the ids do not depend on), about 40 % less work on these texts."""
    import transformers  # (loaded already: `tok` is one of its tokenizers)

    be = getattr(tok, "_tokenizer", None)
    if (be is None or not transformers.__version__.startswith(VERIFIED_TRANSFORMERS)
            or not _batch_encode_is_encode(tok) or not hasattr(be, "encode_batch_fast")):
        return None
    if be.truncation is not None or be.padding is not None:
        return None
    if bool(be.encode_special_tokens) != bool(getattr(tok, "split_special_tokens", False)):
        return None
    return lambda texts: [e.ids for e in be.encode_batch_fast(texts, add_special_tokens=False)]


def prefetch_boundaries(r: ChatRenderer, trajs: list[Trajectory], cache: dict) -> None:
    """Encode, in one batched call, the texts the boundary checks of `trajs` will encode (each
    turn's generation prompt + text, and the text alone), into `cache["text"]`, when that call
    is the same function as `tokenizer.encode` (`_backend_batch`, else the tokenizer's own
    batch call when `_batch_encode_is_encode`). The checks encode continuations
    (`encode_continuation`: `encode(SENTINEL + text)` less the sentinel's id), so each text is
    sent with the same sentinel before it and its first id dropped, after checking that it is
    the sentinel's (the same function, by construction); where `encode_continuation` has no
    sentinel it is `encode`, and the texts are sent as they are. A context without a control
    token (its generation prompt starts the text) is left to the check. Never raises: on any
    error the checks encode one text at a time, as without it."""
    tok = r.tokenizer
    if r.accepts_images or not _batch_encode_is_encode(tok):
        return
    try:
        texts: dict[str, None] = {}
        for tr in trajs:
            for k, t in enumerate(tr.turns):
                ctx = tr.turn_prompts[k] if tr.turn_prompts else tr.token_ids[: t.start]
                tail = _tail(r, ctx)
                if tail and t.text and len(tail) < len(ctx):
                    texts[_decode(r, cache, tail) + t.text] = texts[t.text] = None
        if not texts:
            return
        pre = continuation_prefix(tok)
        head = pre[0] if pre else ""
        sent = [head + x for x in texts]
        fast = _backend_batch(tok)
        out = fast(sent) if fast else tok(sent, add_special_tokens=False, return_attention_mask=False,
                                          return_token_type_ids=False)["input_ids"]
        if pre:
            if any(ids[:1] != [pre[1]] for ids in out):
                raise ValueError("the sentinel did not come out first")  # the checks encode alone
            out = [ids[1:] for ids in out]
        cache.setdefault("text", {}).update(zip(texts, map(tuple, out)))
    except Exception:  # noqa: BLE001 - an optimisation only: the checks encode on their own
        cache.pop("text", None)


def _boundary(r: ChatRenderer, ctx: list[int], text: str, start: int, k: int, cache: dict | None = None
              ) -> dict[str, Any] | None:
    """Turn k's generation prompt (the context after its last control token) and its text,
    encoded as one string, against the context's ids + the text's own encoding, both as
    continuations (`encode_continuation`: they follow the control token; a SentencePiece-style
    tokenizer's "▁" of a text's start is no drift); `start` is the turn's first position."""
    tail = _tail(r, ctx)
    if not tail or not text:
        return None
    mid = len(tail) < len(ctx)  # the generation prompt follows a control token: a continuation
    joint = _text_ids(r, cache, _decode(r, cache, tail, mid) + text, mid)
    split = tail + _text_ids(r, cache, text)
    if joint == split:
        return None
    d = _first_diff(joint, split)
    return _report(k, "generation prompt / sampled text", start - len(tail) + d, joint, split, d, r.tokenizer)


def episode_drift(r: ChatRenderer, tr: Trajectory, tools: list | None = None,
                  cache: dict | None = None) -> dict[str, Any] | None:
    """The first place where `tr`'s ids differ from the template's rendering of its messages
    (see the module docstring for the regions compared), or None when they agree.

    Args:
        r: the renderer the episode was rendered with.
        tr: a finished episode with at least one turn.
        tools: the tool schemas its opening prompt was rendered with.
        cache: renderings by messages, shared by the episodes of one batch (None: none).

    Returns:
        None, or `{"turn", "where", "position", "expected", "got", "expected_text",
        "got_text"}`: the turn index (the region after it; 0 for the opening), the region
        (`opening`, `after turn`, `generation prompt / sampled text`, `template refuses the
        messages`, the latter with `error` instead of ids), the first differing position in
        `tr.token_ids` (with `rollout.history=template`: in the turn's sample, its prompt then
        its ids), up to 4 ids from there, expected vs got, and the tokens' texts, one string
        per id, with up to 2 ids of context before.
    """
    msgs, ids, turns = tr.messages, tr.token_ids, tr.turns
    at = assistant_indices(msgs, turns)
    try:
        expected, opening = _memo(cache, "open", render_key(msgs[: at[0]], tools, max_chars=None),
                                  lambda: r.prompt_render(msgs[: at[0]], tools))
    except ValueError as e:
        return {"turn": 0, "where": "template refuses the messages", "position": 0, "error": str(e)[:300]}
    if tr.turn_prompts:  # history=template: each context is the template's own rendering
        if expected != tr.turn_prompts[0]:
            d = _first_diff(expected, tr.turn_prompts[0])
            return _report(0, "opening", d, expected, tr.turn_prompts[0], d, r.tokenizer)
        return next((f for k, t in enumerate(turns)
                     if (f := _boundary(r, tr.turn_prompts[k], t.text, len(tr.turn_prompts[k]), k, cache))), None)
    if expected != ids[: turns[0].start]:
        d = _first_diff(expected, ids[: turns[0].start])
        return _report(0, "opening", d, expected, ids[: turns[0].start], d, r.tokenizer)
    rendered = list(opening)  # the messages as the renderer rendered them (its role fallbacks)
    for k, t in enumerate(turns):
        found = _boundary(r, ids[: t.start], t.text, t.start, k, cache)
        if found:
            return found
        found, obs = _after_turn(r, tr, at, k, rendered, tools, cache)
        if found:
            return found
        rendered += [msgs[at[k]], *obs]
    return None


def _after_turn(r: ChatRenderer, tr: Trajectory, at: list[int], k: int, rendered: list[Message],
                tools: list | None, cache: dict | None) -> tuple[dict[str, Any] | None, list[Message]]:
    """The region after turn k against the template's rendering; and turn k's observations as
    rendered (for the next regions' history)."""
    msgs, ids, t = tr.messages, tr.token_ids, tr.turns[k]
    last = k == len(tr.turns) - 1
    stop = t.end > t.start and ids[t.end - 1] in r.stop_ids
    got = ([r.end_of_turn_id] if stop else []) + ids[t.end: len(ids) if last else tr.turns[k + 1].start]
    start = t.end - 1 if stop else t.end
    obs = list(msgs[at[k] + 1: len(msgs) if last else at[k + 1]])
    try:
        history = [*rendered, {"role": "assistant", "content": PLACE}]
        expected, obs = _memo(cache, "after", render_key(history, obs, tools, max_chars=None),
                              lambda: _region_ids(r, history, obs, bool(obs), tools, cache))
    except Exception as e:  # noqa: BLE001 - jinja errors, raise_exception in templates
        return {"turn": k, "where": "template refuses the messages", "position": int(start),
                "error": f"{type(e).__name__}: {e}"[:300]}, obs
    if last:  # the template closes the last turn with glue the episode never needed
        expected = expected[: len(got)]
    if expected == got:
        return None, obs
    d = _first_diff(expected, got)
    return _report(k, "after turn", start + d, expected, got, d, r.tokenizer), obs


def check_episode(r: ChatRenderer, tr: Trajectory, tools: list | None = None,
                  cache: dict | None = None) -> None:
    """Record `episode_drift` in `tr.info["template_drift"]` (False when the ids agree, else the
    first difference); an episode without turns, or of a vision renderer, is not checked (no
    key). A check that fails records `info["template_drift_error"]` instead (never raises)."""
    if not tr.turns or r.accepts_images:
        return
    try:
        tr.info["template_drift"] = episode_drift(r, tr, tools, cache) or False
    except Exception as e:  # noqa: BLE001 - a check must never end a run (contract 7)
        tr.info["template_drift_error"] = f"{type(e).__name__}: {e}"[:300]


def check_episodes(r: ChatRenderer, trajs: list[Trajectory], tools: list[list | None]) -> None:
    """`check_episode` for each of `trajs` (one batch; `tools[i]`: episode i's tool schemas),
    with one cache of renderings and encodes for the batch (`prefetch_boundaries` first)."""
    cache: dict = {}
    prefetch_boundaries(r, [tr for tr in trajs if tr.turns], cache)
    for tr, tl in zip(trajs, tools):
        check_episode(r, tr, tl, cache)


def drift_line(trajs: list[Trajectory]) -> str | None:
    """The `[template]` line the training loop prints the first time a step has episodes whose
    ids differ from the template's rendering (None when none does): how many, and where the
    first one differs."""
    bad = [t.info["template_drift"] for t in trajs if t.info.get("template_drift")]
    if not bad:
        return None
    checked = sum("template_drift" in t.info for t in trajs)
    d = bad[0]
    where = (f"{d['where']}, turn {d['turn']}, position {d['position']}: template "
             f"{d.get('expected_text', '')!r} vs episode {d.get('got_text', d.get('error', ''))!r}")
    return (f"[template] {len(bad)} of {checked} episodes' ids differ from the chat template's rendering "
            f"of their messages (rollout/template_drift; the policy still trains on exactly what it "
            f"sampled); first: {where}; each episode's info['template_drift'] is in OUT/rollouts "
            "(docs/models.md; said once)")
