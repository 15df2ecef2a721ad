"""The template drift check of a batch (`check_episodes`, issue 43 "a leaner loop"): its shared
renderings and its one batched tokenizer call give, episode by episode, exactly what
`episode_drift` gives without any cache, drifting episodes included; the batched encode is
used only where it is the same function as `encode`."""

from __future__ import annotations

import copy

import pytest
import transformers
from test_families import run_scripted

from agentrl.models.families import FAMILIES, build_family_tokenizer
from agentrl.rollout.chat import ChatRenderer
from agentrl.rollout.drift import (
    VERIFIED_TRANSFORMERS,
    _backend_batch,
    _batch_encode_is_encode,
    _tail,
    check_episodes,
    episode_drift,
    prefetch_boundaries,
)

NAMES = list(FAMILIES)
# a leading "\n" merges with the generation prompt's "\n" (drift for ChatML families), a
# control string as text, non-ASCII, blanks at both ends, a repeated answer
ANSWER_SETS = [["\nhello", "fine", "done"], ["<|im_end|> x", " é ü ", "done"],
               ["call the calculator", "it is 5", "The answer is 5."], ["fine", "fine", "fine"]]


@pytest.fixture(scope="module")
def toks():
    return {n: build_family_tokenizer(FAMILIES[n]) for n in NAMES}


@pytest.mark.parametrize("name", NAMES)
def test_batch_check_equals_the_uncached_check_of_each_episode(name, toks):
    """Four episodes (one drifting for Qwen2.5: a turn starting with "\\n") checked
    as one batch record exactly `episode_drift(r, tr)` of each alone, no cache; and the batched
    encodes equal `tokenizer.encode` of each text."""
    tok = toks[name]
    r = ChatRenderer(tok)
    trajs = [run_scripted(tok, r, answers=a) for a in ANSWER_SETS]
    alone = [episode_drift(r, tr) or False for tr in trajs]
    for tr in trajs:
        tr.info.pop("template_drift")
    check_episodes(r, trajs, [None] * len(trajs))
    assert [tr.info["template_drift"] for tr in trajs] == alone
    if name == "qwen2_5":  # (test_drift: its generation prompt ends with "\n")
        assert alone[0] and alone[0]["where"] == "generation prompt / sampled text"
    assert _batch_encode_is_encode(tok)
    assert (_backend_batch(tok) is not None) == transformers.__version__.startswith(VERIFIED_TRANSFORMERS)
    cache: dict = {}
    prefetch_boundaries(r, trajs, cache)
    texts = cache.get("text", {})
    want = set()  # each turn whose generation prompt has text after its last control token
    for tr in trajs:  # (Mistral's ends with [/INST]: nothing to check, nothing encoded)
        for t in tr.turns:
            tail = _tail(r, tr.token_ids[: t.start])
            if tail:
                want |= {t.text, tok.decode(tail, skip_special_tokens=False) + t.text}
    assert set(texts) == want and (want or name.startswith("mistral"))
    for text, ids in texts.items():
        assert list(ids) == tok.encode(text, add_special_tokens=False), text


def test_template_changed_after_sampling_is_found_by_the_batch_check(toks):
    """The same altered template as in test_drift: the batch check reports it at the same place
    as the uncached check (the shared renderings are per batch and per template)."""
    tok = copy.deepcopy(toks["qwen2_5"])
    r = ChatRenderer(tok)
    trajs = [run_scripted(tok, r, answers=a) for a in ANSWER_SETS[1:]]
    tok.chat_template = tok.chat_template.replace("'<|im_start|>user'", "'<|im_start|>tool'")
    alone = [episode_drift(r, tr) for tr in trajs]
    assert all(d and d["where"] == "after turn" and d["turn"] == 0 for d in alone)
    check_episodes(r, trajs, [None] * len(trajs))
    assert [tr.info["template_drift"] for tr in trajs] == alone


def test_a_tokenizer_that_overrides_encode_is_encoded_one_text_at_a_time(toks):
    """A tokenizer class whose `encode` is its own is not batch-encoded (the batch call might
    not be its `encode`): nothing is prefetched, and the check still finds the merge."""
    base = toks["qwen2_5"]

    class Own(type(base)):
        def encode(self, *args, **kwargs):
            return super().encode(*args, **kwargs)

    tok = copy.deepcopy(base)
    tok.__class__ = Own
    assert not _batch_encode_is_encode(tok)
    r = ChatRenderer(tok)
    trajs = [run_scripted(tok, r, answers=a) for a in ANSWER_SETS[:2]]
    cache: dict = {}
    prefetch_boundaries(r, trajs, cache)
    assert "text" not in cache
    assert trajs[0].info["template_drift"]["where"] == "generation prompt / sampled text"
    assert trajs[1].info["template_drift"] == (episode_drift(r, trajs[1]) or False)


def test_a_backend_with_truncation_is_not_called_directly(toks):
    """`encode` turns the backend's truncation off before encoding; a backend left with
    truncation on (here at 2 ids) is therefore not called directly, and the prefetched ids
    are still `encode`'s, untruncated."""
    tok = copy.deepcopy(toks["qwen2_5"])
    r = ChatRenderer(tok)
    trajs = [run_scripted(tok, r, answers=a) for a in ANSWER_SETS[2:]]
    tok._tokenizer.enable_truncation(max_length=2)
    assert _backend_batch(tok) is None
    cache: dict = {}
    prefetch_boundaries(r, trajs, cache)
    assert cache["text"] and all(list(ids) == tok.encode(t, add_special_tokens=False)
                                 for t, ids in cache["text"].items())
    assert max(len(ids) for ids in cache["text"].values()) > 2
