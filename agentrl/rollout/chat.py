"""Messages -> token ids without ever re-tokenizing the conversation (contract 1).

The opening messages are rendered once with the chat template. After that, each sampled turn
is kept as the exact ids the engine produced, and each observation is rendered *on its own*
as the chat template's delta for the new messages, then appended. So the ids a trajectory
trains on are exactly the ids the sampler saw and produced, whatever the template does to
earlier turns (a template that drops `<think>` blocks from history cannot change them: case M4).
Deltas are cut after the assistant's end of turn wherever the template puts it, so templates
that rewrite history (Qwen3, R1-distill) or move the system prompt (Mistral) are accepted; with
`rollout.history=template` the agent loop renders each turn's prompt from the messages instead.
Special-token strings in env text are encoded as text (`neutralize`), and every fragment that
sits in the middle of a sequence (a piece of env text, an answer after a generation prompt) is
encoded as a continuation (`encode_continuation`: no "▁" from a SentencePiece-style
tokenizer). Messages a template refuses or drops are rendered through the role fallbacks of
`agentrl.rollout.roles` (roles as `user`, runs of users merged, system messages folded), in one
order on every path. docs/models.md.

Renders are memoised (`RENDER_CACHE_SIZE` entries per renderer and kind, keys of at most
`RENDER_KEY_CHARS` characters): the ids of an opening
prompt or an observation delta are a function of the messages (and tools) alone, so a group's
episodes reset on the same task, and an observation an env sends again ("Now the last digit.",
the same test failure), are rendered once. Only messages made of plain dicts, lists, tuples,
strings, numbers, booleans and None are memoised, keyed by their `repr` (which keeps key order
and types); anything else (image parts) is rendered every time.
"""

from __future__ import annotations

import json
import re
from typing import Any

from agentrl.env.content import message_images
from agentrl.models.tiny import generation_eos_ids
from agentrl.models.tiny import render_ids as _render
from agentrl.models.tokens import decode_fragment, encode_continuation
from agentrl.models.vlm import (
    IMAGE_PAD,
    VISION_TOKENS,
    encode_images,
    expand_image_pads,
    image_token_counts,
    to_pil,
)
from agentrl.rollout.roles import OBSERVATION_ROLES, first_accepted, role_fallbacks

Message = dict[str, Any]

# The conversations deltas are cut from: a user message and an assistant turn (no system
# message: some templates move the system prompt to the last user message, e.g. Mistral's).
_USER: Message = {"role": "user", "content": "u"}
_SYSTEM: Message = {"role": "system", "content": "s"}
_THINK = "<think>\nx\n</think>\n\na"  # an assistant turn as a thinking model samples it

RENDER_CACHE_SIZE = 1024
"""Most memoised renders a `ChatRenderer` keeps per kind (prompts, deltas); past it the memo is
emptied and refilled."""
RENDER_KEY_CHARS = 8192
"""Messages whose key (`render_key`) is longer than this are not memoised (long histories, as
`rollout.history=template` renders each turn, and large tool outputs rarely repeat): the memo
holds at most about `2 * RENDER_CACHE_SIZE * RENDER_KEY_CHARS` characters of keys."""

_PLAIN = (str, int, float, bool, type(None))

HISTORY_MODES = ("exact", "template")
"""`rollout.history`: `exact` (the context is the sampled ids plus observation deltas) or
`template` (each turn's prompt is the template's rendering of the messages so far)."""


class RenderError(ValueError):
    """The chat template cannot render an observation (e.g. a role it refuses): a recorded env
    error for that episode (contract 7), never a crash."""


class _Dropped(Exception):
    """The template rendered the messages without a message's text (Phi-3's `tool`)."""


def _assistant(content: str) -> Message:
    return {"role": "assistant", "content": content}


def render_ids(tokenizer: Any, messages: list[Message], *, add_generation_prompt: bool,
               tools: list[dict] | None = None) -> list[int]:
    """Render chat messages with the tokenizer's chat template to a plain list of token ids
    (see `agentrl.models.tiny.render_ids`). Text is encoded with every added token live: this
    is what `apply_chat_template` does; `ChatRenderer` encodes env text safely instead."""
    return _render(tokenizer, messages, add_generation_prompt=add_generation_prompt, tools=tools)


def special_strings(tokenizer: Any) -> list[str]:
    """The tokenizer's special-token strings (control tokens such as `<|im_end|>`,
    `<|eot_id|>`, `[INST]`, `<|image_pad|>`: added tokens marked special), longest first."""
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    toks = {t.content for t in added.values() if t.content and t.special}
    toks |= {t for t in getattr(tokenizer, "all_special_tokens", []) if t}
    return sorted(toks, key=len, reverse=True)


def _text_parts(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"]
    return []


_MARK = "\ue000"  # a private-use character: the placeholder of a special string in env text
_MARK_RE = re.compile(_MARK + "([\ue100-\uf8ff])")


def neutralize(messages: list[Message], pattern: re.Pattern | None) -> tuple[list[Message], list[str]]:
    """`messages` with every special-token string inside a non-assistant message's text
    replaced by a placeholder (a private-use character and an index), and the strings replaced
    in index order. Assistant messages are the model's own and keep theirs."""
    if pattern is None:
        return list(messages), []
    found: list[str] = []

    def sub(text: str) -> str:
        def one(m: re.Match) -> str:
            found.append(m.group())
            return _MARK + chr(0xE100 + len(found) - 1)
        return pattern.sub(one, text)

    out = []
    for m in messages:
        c = m.get("content")
        if m.get("role") == "assistant" or not any(pattern.search(t) for t in _text_parts(c)):
            out.append(m)
        elif isinstance(c, str):
            out.append({**m, "content": sub(c)})
        else:
            out.append({**m, "content": [{**p, "text": sub(p.get("text", ""))}
                                         if isinstance(p, dict) and p.get("type") == "text" else p
                                         for p in c]})
    if len(found) > 0xF8FF - 0xE100:
        raise RenderError(f"{len(found)} special-token strings in one observation; at most "
                          f"{0xF8FF - 0xE100} are supported")
    return out, found


def encode_neutralized(tokenizer: Any, text: str, found: list[str], *, continuation: bool = False
                       ) -> list[int]:
    """Ids of `text` (a chat template's rendering of `neutralize`d messages): the template's
    own text with its control tokens live, and each placeholder as its original string encoded
    as plain text (its first character on its own, then the rest), the equivalent of
    `split_special_tokens=True` for env text. Every piece after the first is encoded as a
    continuation (`encode_continuation`: no "▁" added by a SentencePiece-style tokenizer, the
    decoded ids are the text); the first piece too when `continuation` (`text` is itself cut
    from the middle of a rendering). Without placeholders: `tokenizer.encode(text)` (or
    `encode_continuation(text)`)."""
    def enc(s: str, mid: bool) -> list[int]:
        if not s:
            return []
        return encode_continuation(tokenizer, s) if mid else list(tokenizer.encode(s, add_special_tokens=False))

    if not found or _MARK not in text:
        return enc(text, continuation)
    ids: list[int] = []
    cursor = 0
    for m in _MARK_RE.finditer(text):
        ids += enc(text[cursor:m.start()], continuation or cursor > 0)
        orig = found[ord(m.group(1)) - 0xE100]
        ids += enc(orig[0], continuation or m.start() > 0) + enc(orig[1:], True)
        cursor = m.end()
    return ids + enc(text[cursor:], True)


def _first_diff(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def _common_suffix(a: list[int], b: list[int]) -> list[int]:
    k = 0
    while k < min(len(a), len(b)) and a[-1 - k] == b[-1 - k]:
        k += 1
    return a[len(a) - k:]


def _plain(x: Any) -> bool:
    """True when `x` is made only of dicts (str keys), lists, tuples and `_PLAIN` scalars, so
    that its `repr` identifies it (key order and types included)."""
    t = type(x)
    if t in _PLAIN:
        return True
    if t is dict:
        return all(type(k) is str and _plain(v) for k, v in x.items())
    if t is list or t is tuple:
        return all(_plain(v) for v in x)
    return False


def render_key(*parts: Any, max_chars: int | None = RENDER_KEY_CHARS) -> str | None:
    """A memo key of `parts` (messages, tools): their `repr` when they are plain (`_plain`) and
    it has at most `max_chars` characters (None: any length), else None (not memoised)."""
    if not _plain(parts):
        return None
    key = repr(parts)
    return key if max_chars is None or len(key) <= max_chars else None


class ChatRenderer:
    """Incremental renderer for one tokenizer's chat template.

    Attributes:
        end_of_turn_id: the id that closes an assistant turn (`<|im_end|>` for ChatML,
            `<|eot_id|>` for Llama 3, `</s>` for Mistral), found from the template itself: the
            first control token after the assistant's content.
        glue_ids: ids the template puts after an assistant's end-of-turn (ChatML: "\\n"); they
            are context (loss_mask 0), never sampled.
        stop_ids: ids that end sampling: end-of-turn first, then the tokenizer's eos, then the
            model's own eos ids (`generation_eos_ids` of the directory the tokenizer was loaded
            from, `tokenizer.name_or_path`: its generation_config.json's `eos_token_id`, where
            vLLM and transformers' `generate` stop too; Llama-3.1's `<|eom_id|>` and
            `<|end_of_text|>` besides `<|eot_id|>`), each once.
        history: `exact` (default) or `template` (`HISTORY_MODES`; read by the agent loop).
        template_kwargs: extra variables for the chat template (`rollout.chat_template_kwargs`,
            e.g. `{"enable_thinking": false}` for Qwen3).
        rewrites_history: True when the template renders an earlier assistant turn (or the
            system prompt) differently from how it was sampled once more messages follow
            (Qwen3 and R1-distill drop `<think>` blocks, Mistral moves the system prompt to the
            last user message); `history_note` says how. None when the check could not run (the
            template refuses its probe conversations even with the role fallbacks):
            `history_note` says so, claiming neither.
        control_ids: ids of the tokenizer's special and added tokens (never merged with text).
        accepts_images: False: this renderer renders text only; an observation with image
            parts is refused by the agent loop (`check_images_allowed`).

    Raises:
        ValueError: the template has no control token after an assistant turn (no end of turn
            to stop at), or `history` is not one of `HISTORY_MODES`.
    """

    accepts_images = False

    def __init__(self, tokenizer: Any, history: str = "exact",
                 template_kwargs: dict[str, Any] | None = None):
        if history not in HISTORY_MODES:
            raise ValueError(f"rollout.history={history!r}: allowed are {', '.join(HISTORY_MODES)}")
        self.tokenizer = tokenizer
        self.history = history
        self.template_kwargs = dict(template_kwargs or {})
        self._memo: dict[str, dict[str, tuple]] = {"prompt": {}, "delta": {}, "rendered": {}}
        specials = special_strings(tokenizer)
        self._pattern = re.compile("|".join(re.escape(c) for c in specials)) if specials else None
        vocab = tokenizer.get_vocab()
        added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
        control_ids = {vocab[c] for c in specials if c in vocab} | set(added)
        self.control_ids = frozenset(int(i) for i in control_ids)
        one = [_USER, _assistant("a")]
        suffix = _common_suffix(self._ids(one, False), self._ids([_USER, _assistant("b")], False))
        eot = next((t for t in suffix if t in control_ids), None)
        if eot is None:
            raise ValueError("chat template: cannot locate the assistant's end-of-turn token "
                             "(no control token follows an assistant message)")
        self.end_of_turn_id = int(eot)
        after = suffix[suffix.index(eot) + 1:]
        nxt = self._after_turn([{"role": "user", "content": "v"}])
        k = _first_diff(after, nxt)
        self.glue_ids = after[:k]
        eos = tokenizer.eos_token_id
        model_eos = generation_eos_ids(getattr(tokenizer, "name_or_path", "") or "")
        firsts = [self.end_of_turn_id] + ([] if eos is None else [int(eos)])
        self.stop_ids = list(dict.fromkeys(firsts + model_eos))
        self.rewrites_history, self.history_note = self._history_check()

    # -- rendering -----------------------------------------------------------------------
    def render_text(self, messages: list[Message], gen: bool, tools: list[dict] | None = None
                    ) -> tuple[str, list[str]]:
        """The chat template's text of `messages` (with the generation prompt when `gen`) after
        `neutralize`, and the special strings it replaced; `encode_neutralized` gives its ids.

        Raises:
            Exception: whatever the template raises (jinja errors, `raise_exception`).
        """
        safe, found = neutralize(list(messages), self._pattern)
        text = self.tokenizer.apply_chat_template(safe, tools=list(tools) if tools else None,
                                                  tokenize=False, add_generation_prompt=gen,
                                                  **self.template_kwargs)
        return text, found

    def _ids(self, messages: list[Message], gen: bool, tools: list[dict] | None = None) -> list[int]:
        text, found = self.render_text(messages, gen, tools)
        return encode_neutralized(self.tokenizer, text, found)

    def _after_turn(self, new_messages: list[Message]) -> list[int]:
        """The ids the template renders after the end-of-turn of an assistant turn that follows
        one user message, when `new_messages` follow it, up to the next generation prompt."""
        a = self._ids([_USER, _assistant("a"), *new_messages], True)
        b = self._ids([_USER, _assistant("b"), *new_messages], True)
        d = _first_diff(a, b)  # where the assistant's content starts
        try:
            end = a.index(self.end_of_turn_id, d)
        except ValueError:
            raise RenderError("chat template: the assistant turn has no end-of-turn token when "
                              "messages follow it") from None
        return a[end + 1:]

    def _history_check(self) -> tuple[bool | None, str]:
        """(rewrites, note): False and '' when the template renders earlier turns as sampled,
        True and how not; None and 'could not be checked (...)' when it refuses the probes."""
        notes = []
        for content in ("a", _THINK):
            try:
                head = self._prompt_ids([_SYSTEM, _USER], None)
                later = self._prompt_ids([_SYSTEM, _USER, _assistant(content), {"role": "user", "content": "v"}], None)
            except RenderError as e:
                cause = e.__cause__ or e
                return None, f"could not be checked ({type(cause).__name__}: {cause})"[:200]
            sampled = head + encode_continuation(self.tokenizer, content) + [self.end_of_turn_id]
            if content == "a" and later[: len(sampled)] != sampled:
                notes.append("renders an earlier assistant turn or the system prompt differently "
                             "from the generation prompt and the sampled ids")
            if content == _THINK and "\nx\n" not in self.tokenizer.decode(later):
                notes.append("drops the <think> blocks of earlier assistant turns")
        return bool(notes), "; ".join(notes)

    def render_observation(self, new_messages: list[Message], render: Any = None
                           ) -> tuple[list[int], list[Message]]:
        """`render(messages)` (default `_after_turn`) of `new_messages` and the messages rendered:
        the first of their `role_fallbacks` the template accepts; where it drops a message's
        text, the same with every message as `user`. The drift check renders through this too.

        Raises:
            RenderError: the template refuses every fallback (or `render` raised it).
        """
        new_messages, render = list(new_messages), render or self._after_turn

        def checked(c: list[Message]) -> list[int]:  # a template checking alternation by parity
            ids = render(c)  # accepts [user, tool] after a turn, then refuses the next assistant turn
            if any(m.get("role") != "user" for m in c):
                self._ids([_USER, _assistant("a"), *c, _assistant("b")], False)
            return ids

        def pick(msgs: list[Message]) -> tuple[list[int], list[Message]]:
            try:
                return first_accepted(role_fallbacks(msgs, OBSERVATION_ROLES), checked, RenderError)
            except RenderError:
                raise
            except Exception as e:  # noqa: BLE001 - a template that refuses every fallback
                raise RenderError(f"chat template cannot render the observation: {e}") from e

        ids, used = pick(new_messages)
        if not self._renders_contents(ids, new_messages):
            ids, used = pick([{**m, "role": "user"} for m in new_messages])
        return ids, used

    def _memoised(self, kind: str, key: str | None, render: Any) -> list[int]:
        """`render()`, or the ids it gave for `key` before (module doc); a fresh list either way."""
        memo = self._memo[kind]
        if key is not None:
            hit = memo.get(key)
            if hit is not None:
                return list(hit)
        ids = render()
        if key is not None:
            if len(memo) >= RENDER_CACHE_SIZE:
                memo.clear()
            memo[key] = tuple(ids)
        return ids

    def prompt_ids(self, messages: list[Message], tools: list[dict] | None = None) -> list[int]:
        """Ids of the opening messages followed by the assistant generation prompt (control
        strings in their text encoded as text: `neutralize`, `encode_neutralized`), through the
        role fallbacks (`_prompt_render`). Memoised (module doc).

        Raises:
            RenderError: the template refuses the messages (e.g. roles out of order).
        """
        return self.prompt_render(messages, tools)[0]

    def prompt_render(self, messages: list[Message], tools: list[dict] | None = None
                      ) -> tuple[list[int], list[Message]]:
        """`prompt_ids` and the messages it rendered (`_prompt_render`), memoised with it (the
        messages kept only where a fallback changed them); the drift check reads both."""
        key = None if self.accepts_images else render_key(list(messages), tools)
        fresh: list[list[Message]] = []

        def render() -> list[int]:
            ids, used = self._prompt_render(messages, tools)
            fresh.append(used)
            return ids

        ids, kept = self._memoised("prompt", key, render), self._memo["rendered"]
        if fresh:
            if key is not None and fresh[0] != list(messages):
                if len(kept) >= RENDER_CACHE_SIZE:
                    kept.clear()
                kept[key] = tuple(fresh[0])
            return ids, fresh[0]
        return ids, list(kept.get(key, messages))

    def _prompt_ids(self, messages: list[Message], tools: list[dict] | None) -> list[int]:
        return self._prompt_render(messages, tools)[0]

    def _prompt_render(self, messages: list[Message], tools: list[dict] | None
                       ) -> tuple[list[int], list[Message]]:
        """The ids of `prompt_ids` (not memoised) and the messages rendered: `messages`, or where
        the template refuses them, or drops the text of a message of another role than system /
        user / assistant (Gemma-3 refuses `tool`, Phi-3 drops it), the first of their
        `role_fallbacks` it accepts: those messages as `user` ones, as `delta_ids` renders them
        (an `agentrl serve` request or a rewritten context holding tool results), then runs of
        users merged (`merge_user_runs`), then system messages folded into the next user message
        (`fold_system`: Gemma-2 refuses the system role), then both.

        Raises:
            RenderError: the template refuses every fallback.
        """
        messages = list(messages)
        users = any(m.get("role") == "user" for m in messages)  # else a system text must show
        other = [m for m in messages if m.get("role") not in ("user", "assistant", "system" if users else "")]

        def render(c: list[Message]) -> list[int]:
            ids = self._ids(c, True, tools)
            if c == messages and other and not self._renders_contents(ids, other):
                raise _Dropped("the template drops a message's text")
            return ids

        try:
            return first_accepted(role_fallbacks(messages), render, RenderError)
        except RenderError:
            raise
        except Exception as e:  # noqa: BLE001 - jinja errors, raise_exception in templates
            raise RenderError(f"chat template cannot render the messages: {type(e).__name__}: {e}") from e

    def delta_ids(self, new_messages: list[Message]) -> list[int]:
        """Ids of `new_messages` (observations) as they render after an assistant turn, followed
        by the generation prompt of the next assistant turn. Excludes `glue_ids`.

        The delta is cut after the end-of-turn of the assistant turn in the template's rendering
        of `[user, assistant, *new_messages]`, wherever the template puts it, so a template
        that rewrites earlier turns (Qwen3, R1-distill) still gives the observation's exact
        rendering. Messages the template refuses or drops go through the role fallbacks
        (`render_observation`: `tool` as `user` on Gemma-3, Mistral, Phi-3; runs of users merged
        with `USER_JOIN` on Mistral, Gemma-3; system messages folded on Gemma-2).

        Raises:
            RenderError: the template cannot render the observation even so (recorded as the
                episode's env error by the agent loop).
        """
        key = None if self.accepts_images else render_key(list(new_messages))
        return self._memoised("delta", key, lambda: self._delta_ids(new_messages))

    def _delta_ids(self, new_messages: list[Message]) -> list[int]:
        ids, _ = self.render_observation(new_messages)
        if ids[: len(self.glue_ids)] != self.glue_ids:
            raise RenderError("chat template puts different ids after an assistant turn before "
                              "these messages than before a user message")
        return ids[len(self.glue_ids):]

    def _renders_contents(self, ids: list[int], messages: list[Message]) -> bool:
        """Does the text of `ids` hold every message's text, as it is or JSON-quoted (Llama 3.1's
        template writes a tool result `| tojson`: a result with a quote or a newline was taken
        for dropped and rendered as a user turn)?"""
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        return all(p.strip() in text or json.dumps(p.strip(), ensure_ascii=False)[1:-1] in text
                   for m in messages for p in _text_parts(m.get("content")))

    def close_turn(self, sampled_ids: list[int]) -> list[int]:
        """Context ids to append after a sampled turn: the end-of-turn token if the sampler
        did not produce it (the turn hit max_tokens), then the template's glue."""
        closing = [] if sampled_ids and sampled_ids[-1] in self.stop_ids else [self.end_of_turn_id]
        return closing + list(self.glue_ids)

    def decode_action(self, sampled_ids: list[int]) -> str:
        """The text of a sampled turn as the env sees it: without the trailing stop token, decoded
        as text that follows the generation prompt (`decode_fragment`: a SentencePiece decoder
        would drop the turn's leading space, e.g. one space of a line's indentation)."""
        ids = sampled_ids[:-1] if sampled_ids and sampled_ids[-1] in self.stop_ids else sampled_ids
        return decode_fragment(self.tokenizer, ids, self._decode_ids)

    def _decode_ids(self, ids: list[int]) -> str:
        """`tokenizer.decode(ids, skip_special_tokens=False)`. A transformers tokenizer whose
        `decode` is the base class's only converts a flat list of ids (`to_py_obj`, a Python
        check per id) and calls `_decode`: that call is made directly, the ids made ints."""
        if getattr(type(self.tokenizer).decode, "__qualname__", "") == "PreTrainedTokenizerBase.decode":
            inner = getattr(self.tokenizer, "_decode", None)
            if callable(inner):
                return inner(list(map(int, ids)), skip_special_tokens=False)
        return self.tokenizer.decode(ids, skip_special_tokens=False)


class VisionChatRenderer(ChatRenderer):
    """`ChatRenderer` for a vision-language model: image parts render through the chat
    template (one image placeholder each, e.g. Qwen2-VL's `<|vision_start|><|image_pad|>
    <|vision_end|>`), the placeholder is widened to one id per merged patch as the model's
    processor would (`agentrl.models.vlm.expand_image_pads`), and the images go through the image
    processor. Deltas are cut exactly as in `ChatRenderer`, so history is never re-rendered.

    Args:
        tokenizer: the model's tokenizer (its chat template must render image parts).
        image_processor: a Qwen2-VL-style image processor (returns `pixel_values` and
            `image_grid_thw`; has `merge_size`).
        image_token: the placeholder token (default the tokenizer's `image_token`, else
            `<|image_pad|>`).

    Attributes:
        image_token_id: the placeholder's id.
        vision_token_ids: ids of the vision special tokens the tokenizer has (a sampler must
            never produce them: the model's forward counts placeholders against images).

    Raises:
        ValueError: the tokenizer lacks the placeholder token, or the template problems of
            `ChatRenderer`.
    """

    accepts_images = True

    def __init__(self, tokenizer: Any, image_processor: Any, image_token: str | None = None,
                 history: str = "exact", template_kwargs: dict[str, Any] | None = None):
        super().__init__(tokenizer, history, template_kwargs)
        self.image_processor = image_processor
        token = image_token or getattr(tokenizer, "image_token", None) or IMAGE_PAD
        vocab = tokenizer.get_vocab()
        if token not in vocab:
            raise ValueError(f"tokenizer has no image placeholder token {token!r}")
        self.image_token_id = vocab[token]
        self.merge_size = int(getattr(image_processor, "merge_size", 2))
        self.vision_token_ids = sorted({vocab[t] for t in (*VISION_TOKENS, token) if t in vocab})

    def _with_images(self, ids: list[int], messages: list[Message]) -> tuple[list[int], dict[str, Any]]:
        import numpy as np


        images = message_images(list(messages))
        px = encode_images(self.image_processor, images)
        # the images themselves too, (H, W, 3) uint8 RGB: an engine that runs its own image
        # processor (vLLM) takes images, not pixel values
        px["images"] = [np.asarray(to_pil(im)) for im in images]
        counts = image_token_counts(px["image_grid_thw"], self.merge_size)
        return expand_image_pads(ids, self.image_token_id, counts), px

    def prompt_inputs(self, messages: list[Message], tools: list[dict] | None = None
                      ) -> tuple[list[int], dict[str, Any]]:
        """Ids of the opening messages (placeholders widened) + the generation prompt, and
        `encode_images` of their images in order plus `images` (the images as `(H, W, 3)` uint8
        RGB arrays).

        Raises:
            ValueError: the template rendered a different number of placeholders than there
                are images.
        """
        return self._with_images(super().prompt_ids(messages, tools=tools), messages)

    def delta_inputs(self, new_messages: list[Message]) -> tuple[list[int], dict[str, Any]]:
        """`ChatRenderer.delta_ids` of `new_messages` with placeholders widened, and
        `encode_images` of their images in order.

        Raises:
            ValueError: as `prompt_inputs`, and as `ChatRenderer.delta_ids`.
        """
        return self._with_images(super().delta_ids(new_messages), new_messages)

    def prompt_ids(self, messages: list[Message], tools: list[dict] | None = None) -> list[int]:
        """The ids of `prompt_inputs` (what the engine is fed, placeholders widened)."""
        return self.prompt_inputs(messages, tools)[0]

    def delta_ids(self, new_messages: list[Message]) -> list[int]:
        """The ids of `delta_inputs`."""
        return self.delta_inputs(new_messages)[0]


_PROBE_TOOL = [{"type": "function", "function": {"name": "agentrl_probe_tool", "description": "d",
                                                  "parameters": {"type": "object", "properties": {}}}}]


def renders_tools(renderer: ChatRenderer) -> bool:
    """Does the chat template put a request's `tools` in the prompt? (Gemma-3's and Phi-3's do
    not: an agent's tool schemas never reach the model there, as with vLLM.)"""
    try:
        text, _ = renderer.render_text([_USER], True, _PROBE_TOOL)
    except Exception:  # noqa: BLE001 - a template that refuses the probe renders no tools either
        return False
    return "agentrl_probe_tool" in text


NO_TOOLS_NOTE = ("[tools] the chat template does not render `tools`: an agent's tool schemas never "
                 "reach the model's prompt; describe the tools in the system message")
"""Printed by `agentrl train --agent` and `agentrl serve` for such a template."""


def renderer_for(tokenizer: Any, history: str = "exact",
                 template_kwargs: dict[str, Any] | None = None) -> ChatRenderer:
    """The renderer of a policy: a `VisionChatRenderer` when `tokenizer` carries an image
    processor (`tokenizer.image_processor`, a vision-language policy), else a `ChatRenderer`;
    `history` is `rollout.history` (`HISTORY_MODES`).

    Raises:
        ValueError: as `ChatRenderer` / `VisionChatRenderer` (a template without an end of turn,
            a tokenizer without the image placeholder).
    """
    image_processor = getattr(tokenizer, "image_processor", None)
    if image_processor is not None:
        return VisionChatRenderer(tokenizer, image_processor, history=history,
                                  template_kwargs=template_kwargs)
    return ChatRenderer(tokenizer, history, template_kwargs)
