"""Token ids of text that sits in the middle of a sequence (contract 1).

A SentencePiece-style tokenizer (a `Metaspace` pre-tokenizer with `prepend_scheme="first"`: the
published Mistral v0.3, Phi-3, Llama-2 with `legacy=False`) puts a "▁" (a space) before the text
at offset 0: `encode("a")` is `▁a`, while the same "a" after `<|assistant|>\n` in a rendering is
`a`. Every fragment agentrl encodes on its own although it follows other ids (a piece of env
text around a special-token string, a warm-start / DPO / offline target after its generation
prompt, a scripted turn, the drift check's texts, the gateway's forced tool-call prefix) goes
through `encode_continuation`. docs/models.md ("Special tokens in environment text").

Here, not in `agentrl.rollout.chat`, so that the algorithms (DPO's targets) may use it: the
layout forbids `agentrl.algos -> agentrl.rollout` (tests/test_layout.py).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

_CONTINUATION: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""tokenizer -> (sentinel, its id) or (None, why there is none), worked out once per tokenizer."""

_STRIPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""tokenizer -> whether `decode` drops a fragment's leading space (`decode_strips_first_space`)."""


def _sentinel_of(tokenizer: Any) -> tuple[str | None, Any]:
    """`(sentinel string, its id)` for `encode_continuation`, or `(None, why there is none)`.

    The sentinel is one of the tokenizer's special added tokens (the eos first, then by id) that
    strips no whitespace to its right (`rstrip`), matches anywhere (`single_word` False), is no
    prefix of another added token, and is checked once to encode to exactly its own id, and to
    stay its own id with text after it. Worked out once per tokenizer (kept by weak reference)."""
    try:
        return _CONTINUATION[tokenizer]
    except (KeyError, TypeError):
        pass
    found: tuple[str | None, Any] = (None, "the tokenizer has no special added token")
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    contents = [t.content for t in added.values() if t.content]
    eos = getattr(tokenizer, "eos_token_id", None)
    for i, t in sorted(added.items(), key=lambda kv: (kv[0] != eos, kv[0])):
        c = t.content
        if (not c or not t.special or getattr(t, "rstrip", False) or getattr(t, "single_word", False)
                or any(o != c and o.startswith(c) for o in contents)):
            continue
        try:
            alone = list(tokenizer.encode(c, add_special_tokens=False))
            with_text = list(tokenizer.encode(c + "a b", add_special_tokens=False))
        except Exception as e:  # noqa: BLE001 - a tokenizer that refuses the probe
            found = (None, f"encoding the special token {c!r} failed: {type(e).__name__}")
            continue
        if alone == [int(i)] and with_text[:1] == [int(i)]:
            after = tokenizer.convert_ids_to_tokens(with_text[1:2])
            if after and str(after[0]).startswith("▁"):  # "▁" before "a": every text gets one
                found = (None, "the tokenizer puts a '▁' (a space) before the text after every special "
                               "token, a legacy SentencePiece conversion (a Prepend normalizer, or Metaspace "
                               "prepend_scheme='always'): fragments and env text around special-token strings "
                               "get a space the model's own rendering may lack; re-save the tokenizer with "
                               "legacy=False (docs/models.md)")
                break
            found = (c, int(i))
            break
        found = (None, f"the special token {c!r} does not encode to its own id alone "
                       "(split_special_tokens?)")
    try:
        _CONTINUATION[tokenizer] = found
    except TypeError:  # not weak-referenceable: worked out on each call
        pass
    return found


def continuation_note(tokenizer: Any) -> str:
    """'' when `encode_continuation` encodes fragments as continuations for `tokenizer`, else
    why it falls back to a plain `encode` (a SentencePiece-style tokenizer then gets a "▁"
    before every fragment)."""
    s, why = _sentinel_of(tokenizer)
    return "" if s is not None else f"fragments are encoded as whole texts: {why}"


def fragment_warning(tokenizer: Any) -> str:
    """`continuation_note` where it matters: '' unless fragments fall back to plain encodes AND
    a plain encode puts a "▁" (a space) before a text's start (a legacy or `"always"`
    SentencePiece tokenizer, or a SentencePiece one without a usable special token); the
    `[template] mid-sequence text:` start-up line of `agentrl train`."""
    note = continuation_note(tokenizer)
    if not note:
        return ""
    try:
        first = tokenizer.convert_ids_to_tokens(tokenizer.encode("a", add_special_tokens=False)[:1])
    except Exception:  # noqa: BLE001 - a tokenizer that refuses the probe: nothing to say
        return ""
    return note if first and str(first[0]).startswith("\u2581") else ""


def encode_continuation(tokenizer: Any, text: str) -> list[int]:
    """Ids of `text` as it is encoded in the *middle* of a sequence (after a control token or
    other text), not as the start of a text; no special tokens are added.

    Why: a SentencePiece-style tokenizer (a `Metaspace` pre-tokenizer with
    `prepend_scheme="first"`: Mistral v0.3, Llama-2 with `legacy=False`, Phi-3) prepends "▁"
    (a space) to the text at offset 0, so `encode("a")` is `▁a`, while the same "a" after
    `<|assistant|>\n` in a rendering is `a`. Encoding each fragment (an answer, a sampled turn,
    a piece of env text) on its own added a space before each.

    How: `tokenizer.encode(SENTINEL + text)` with the sentinel's id dropped, where SENTINEL is
    one of the tokenizer's special added tokens (`_sentinel_of`). Added tokens always split the
    input, so nothing merges across the sentinel and `text` starts at an offset > 0 ("first"
    prepends nothing): the ids are exactly those `text` gets right after a control token, and
    for a byte-level BPE tokenizer (no "▁", no prefix space) exactly `tokenizer.encode(text)`.
    Merges with the text *before* the fragment are not made (the fragment is encoded on its
    own, as before). Falls back to `tokenizer.encode(text)` where no sentinel qualifies
    (`continuation_note` says why) or the sentinel does not come out first."""
    if not text:
        return []
    s, sid = _sentinel_of(tokenizer)
    if s is None:
        return list(tokenizer.encode(text, add_special_tokens=False))
    ids = list(tokenizer.encode(s + text, add_special_tokens=False))
    if ids[:1] != [sid]:
        return list(tokenizer.encode(text, add_special_tokens=False))
    return ids[1:]


def continuation_prefix(tokenizer: Any) -> tuple[str, int] | None:
    """`(sentinel, id)` of `encode_continuation` (a batch encoder puts the sentinel before each
    text and drops its id from each result, `agentrl.rollout.drift.prefetch_boundaries`), or
    None where it falls back to plain encodes."""
    s, sid = _sentinel_of(tokenizer)
    return None if s is None else (s, sid)


def decode_continuation(tokenizer: Any, ids: list[int]) -> str:
    """The text of `ids` taken from the middle of a sequence: `decode([sentinel] + ids)` less the
    sentinel's text (a SentencePiece decoder drops the leading space of a decoded *text*, which
    a "▁x" in the middle of a sequence keeps); `decode(ids)` without a sentinel."""
    s, sid = _sentinel_of(tokenizer)
    if s is not None:
        out = tokenizer.decode([sid, *ids], skip_special_tokens=False)
        if out.startswith(s):
            return out[len(s):]
    return tokenizer.decode(ids, skip_special_tokens=False)


def decode_strips_first_space(tokenizer: Any) -> bool:
    """Whether `tokenizer.decode(ids)` of ids taken from the middle of a sequence loses their
    leading space where `decode_continuation` keeps it: a SentencePiece decoder strips the space
    of a decoded text's first "▁" (its `Strip` step), so a sampled turn `▁▁▁▁return x` decodes
    to three spaces of indentation, not four. Probed once per tokenizer (kept by weak reference)
    on " a"; False for a byte-level tokenizer (decode is exact)."""
    try:
        return _STRIPS[tokenizer]
    except (KeyError, TypeError):
        pass
    probe = " a"
    try:
        ids = encode_continuation(tokenizer, probe)
        strips = (tokenizer.decode(ids, skip_special_tokens=False) != probe
                  and decode_continuation(tokenizer, ids) == probe)
    except Exception:  # noqa: BLE001 - a tokenizer that refuses the probe: decode as it is
        strips = False
    try:
        _STRIPS[tokenizer] = strips
    except TypeError:  # not weak-referenceable: probed on each call
        pass
    return strips


def decode_fragment(tokenizer: Any, ids: list[int], plain: Callable[[list[int]], str] | None = None) -> str:
    """The text of `ids` from the middle of a sequence (a sampled turn, a region of an episode):
    `decode_continuation` where plain `decode` would drop their leading space
    (`decode_strips_first_space`), else `plain(ids)` (default
    `tokenizer.decode(ids, skip_special_tokens=False)`)."""
    if decode_strips_first_space(tokenizer):
        return decode_continuation(tokenizer, ids)
    return plain(ids) if plain is not None else tokenizer.decode(ids, skip_special_tokens=False)
