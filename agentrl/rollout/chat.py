"""Messages -> token ids without ever re-tokenizing the conversation (contract 1).

The opening messages are rendered once with the chat template. After that, each sampled turn
is kept as the exact ids the engine produced, and each observation is rendered *on its own*
as the chat template's delta for the new messages, then appended. So the ids a trajectory
trains on are exactly the ids the sampler saw and produced, whatever the template does to
earlier turns (a template that drops `<think>` blocks from history cannot change them: case M4).
"""

from __future__ import annotations

import re
from typing import Any

from agentrl.env.content import message_images
from agentrl.models.tiny import render_ids as _render
from agentrl.models.vlm import (
    IMAGE_PAD,
    VISION_TOKENS,
    encode_images,
    expand_image_pads,
    image_token_counts,
    to_pil,
)

Message = dict[str, Any]

# The conversations deltas are cut from: a user message and an assistant turn (no system
# message: some templates move the system prompt to the last user message, e.g. Mistral's).
_USER: Message = {"role": "user", "content": "u"}
_SYSTEM: Message = {"role": "system", "content": "s"}
_THINK = "<think>\nx\n</think>\n\na"  # an assistant turn as a thinking model samples it

HISTORY_MODES = ("exact", "template")
"""`rollout.history`: `exact` (the context is the sampled ids plus observation deltas) or
`template` (each turn's prompt is the template's rendering of the messages so far)."""


class RenderError(ValueError):
    """The chat template cannot render an observation (e.g. a role it refuses): a recorded env
    error for that episode (contract 7), never a crash."""


def _assistant(content: str) -> Message:
    return {"role": "assistant", "content": content}


def render_ids(tokenizer: Any, messages: list[Message], *, add_generation_prompt: bool,
               tools: list[dict] | None = None) -> list[int]:
    """Render chat messages with the tokenizer's chat template to a plain list of token ids
    (see `agentrl.models.tiny.render_ids`). Text is encoded with every added token live: this
    is what `apply_chat_template` does; `ChatRenderer` encodes env text safely instead."""
    return _render(tokenizer, messages, add_generation_prompt=add_generation_prompt, tools=tools)


def control_strings(tokenizer: Any) -> list[str]:
    """The strings the tokenizer turns into one added-token id (special tokens such as
    `<|im_end|>` and added ones such as `<tool_call>`), longest first."""
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    toks = {t.content for t in added.values() if t.content}
    toks |= {t for t in getattr(tokenizer, "all_special_tokens", []) if t}
    return sorted(toks, key=len, reverse=True)


def _text_parts(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"]
    return []


def _escape_positions(text: str, messages: list[Message], pattern: re.Pattern) -> list[tuple[int, int]]:
    """`[start, end)` spans in the rendered `text` of the control strings that come from the
    messages' content (every role but the assistant's) rather than from the template.

    Each occurrence is located by a window of its content (up to 16 characters each side),
    searched left to right, so a template that trims or wraps the content still matches.

    Raises:
        RenderError: an occurrence could not be located in the rendered text.
    """
    spans: list[tuple[int, int]] = []
    cursor = 0
    for m in messages:
        if m.get("role") == "assistant":
            continue
        for part in _text_parts(m.get("content")):
            for occ in pattern.finditer(part):
                lo = max(0, occ.start() - 16)
                window = part[lo: occ.end() + 16]
                at = text.find(window, cursor)
                if at < 0:  # the template changed the content around it: try the bare token
                    window, lo = occ.group(), occ.start()
                    at = text.find(window, cursor)
                if at < 0:
                    raise RenderError(f"chat template rendered message text in a way the control "
                                      f"string {occ.group()!r} in it cannot be located")
                start = at + occ.start() - lo
                spans.append((start, start + len(occ.group())))
                cursor = start + len(occ.group())
    return spans


def encode_rendered(tokenizer: Any, text: str, messages: list[Message],
                    controls: list[str] | None = None) -> list[int]:
    """Token ids of `text` (a chat template's rendering of `messages`) where only the template's
    own control strings become control ids: a special or added token string inside a message's
    content (env observations, tool results, pages, judge replies, prompts) is encoded as plain
    text (its first character on its own, then the rest), like `split_special_tokens=True`.
    Assistant content keeps its tokens live (it is the model's own, sampled).

    Without control strings in the content this is `tokenizer.encode(text)`, unchanged.

    Raises:
        RenderError: as `_escape_positions`.
    """
    controls = control_strings(tokenizer) if controls is None else controls
    enc = lambda s: list(tokenizer.encode(s, add_special_tokens=False)) if s else []  # noqa: E731
    if not controls:
        return enc(text)
    pattern = re.compile("|".join(re.escape(c) for c in controls))
    spans = _escape_positions(text, messages, pattern)
    if not spans:
        return enc(text)
    ids: list[int] = []
    cursor = 0
    for s, e in spans:
        ids += enc(text[cursor:s])
        piece = text[s:e]
        ids += enc(piece[0]) + encode_rendered_plain(tokenizer, piece[1:], pattern)
        cursor = e
    return ids + enc(text[cursor:])


def encode_rendered_plain(tokenizer: Any, text: str, pattern: re.Pattern) -> list[int]:
    """`text` (content, never structure) encoded with every control string in it broken up."""
    ids: list[int] = []
    cursor = 0
    for occ in pattern.finditer(text):
        ids += tokenizer.encode(text[cursor:occ.start()], add_special_tokens=False) if occ.start() > cursor else []
        ids += tokenizer.encode(occ.group()[0], add_special_tokens=False)
        ids += encode_rendered_plain(tokenizer, occ.group()[1:], pattern)
        cursor = occ.end()
    return ids + (tokenizer.encode(text[cursor:], add_special_tokens=False) if cursor < len(text) else [])


def _first_diff(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def _common_suffix(a: list[int], b: list[int]) -> list[int]:
    k = 0
    while k < min(len(a), len(b)) and a[-1 - k] == b[-1 - k]:
        k += 1
    return a[len(a) - k:]


class ChatRenderer:
    """Incremental renderer for one tokenizer's chat template.

    Attributes:
        end_of_turn_id: the id that closes an assistant turn (`<|im_end|>` for ChatML,
            `<|eot_id|>` for Llama 3, `</s>` for Mistral), found from the template itself: the
            first control token after the assistant's content.
        glue_ids: ids the template puts after an assistant's end-of-turn (ChatML: "\\n"); they
            are context (loss_mask 0), never sampled.
        stop_ids: ids that end sampling: end-of-turn first, then the tokenizer's eos.
        history: `exact` (default) or `template` (`HISTORY_MODES`; read by the agent loop).
        template_kwargs: extra variables for the chat template (`rollout.chat_template_kwargs`,
            e.g. `{"enable_thinking": false}` for Qwen3).
        rewrites_history: True when the template renders an earlier assistant turn (or the
            system prompt) differently from how it was sampled once more messages follow
            (Qwen3 and R1-distill drop `<think>` blocks, Mistral moves the system prompt to the
            last user message); `history_note` says how.
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
        self._controls = control_strings(tokenizer)
        vocab = tokenizer.get_vocab()
        control_ids = {vocab[c] for c in self._controls if c in vocab}
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
        self.stop_ids = [self.end_of_turn_id] + ([eos] if eos not in (None, self.end_of_turn_id) else [])
        self.history_note = self._history_check()
        self.rewrites_history = bool(self.history_note)

    # -- rendering -----------------------------------------------------------------------
    def _ids(self, messages: list[Message], gen: bool, tools: list[dict] | None = None) -> list[int]:
        text = self.tokenizer.apply_chat_template(list(messages), tools=list(tools) if tools else None,
                                                  tokenize=False, add_generation_prompt=gen,
                                                  **self.template_kwargs)
        return encode_rendered(self.tokenizer, text, messages, self._controls)

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

    def _history_check(self) -> str:
        """'' when the template renders earlier turns as they were sampled, else how not."""
        for content in ("a", _THINK):
            try:
                head = self._ids([_SYSTEM, _USER], True)
                later = self._ids([_SYSTEM, _USER, _assistant(content), {"role": "user", "content": "v"}], True)
            except Exception as e:  # noqa: BLE001 - e.g. a template without a system role
                return f"could not be checked ({type(e).__name__}: {e})"[:200]
            sampled = head + self.tokenizer.encode(content, add_special_tokens=False) + [self.end_of_turn_id]
            if later[: len(sampled)] != sampled:
                return ("drops or rewrites <think> blocks of earlier turns" if content == _THINK
                        else "renders an earlier assistant turn or the system prompt differently "
                        "from the generation prompt and the sampled ids")
        return ""

    def _render_observation(self, new_messages: list[Message]) -> list[int]:
        try:
            ids = self._after_turn(list(new_messages))
        except RenderError:
            raise
        except Exception as e:  # noqa: BLE001 - a template that refuses a role: try it as user
            as_user = [{**m, "role": "user"} if m.get("role") not in ("user", "system") else m
                       for m in new_messages]
            if as_user == list(new_messages):
                raise RenderError(f"chat template cannot render the observation: {e}") from e
            try:
                ids = self._after_turn(as_user)
            except Exception as e2:  # noqa: BLE001
                raise RenderError(f"chat template cannot render the observation: {e2}") from e2
        return ids

    def prompt_ids(self, messages: list[Message], tools: list[dict] | None = None) -> list[int]:
        """Ids of the opening messages followed by the assistant generation prompt (control
        strings in their text encoded as text: `encode_rendered`).

        Raises:
            RenderError: the template refuses the messages (e.g. roles out of order).
        """
        try:
            return self._ids(list(messages), True, tools)
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
        rendering. A template that refuses or drops a role (Gemma-3 and Mistral for `tool`,
        Phi-3 for anything but system/user/assistant) renders those messages as `user` ones.

        Raises:
            RenderError: the template cannot render the observation even so (recorded as the
                episode's env error by the agent loop).
        """
        ids = self._render_observation(new_messages)
        if not self._renders_contents(ids, new_messages):
            as_user = [{**m, "role": "user"} for m in new_messages]
            ids = self._render_observation(as_user)
        if ids[: len(self.glue_ids)] != self.glue_ids:
            raise RenderError("chat template puts different ids after an assistant turn before "
                              "these messages than before a user message")
        return ids[len(self.glue_ids):]

    def _renders_contents(self, ids: list[int], messages: list[Message]) -> bool:
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        return all(p.strip() in text for m in messages for p in _text_parts(m.get("content")))

    def close_turn(self, sampled_ids: list[int]) -> list[int]:
        """Context ids to append after a sampled turn: the end-of-turn token if the sampler
        did not produce it (the turn hit max_tokens), then the template's glue."""
        closing = [] if sampled_ids and sampled_ids[-1] in self.stop_ids else [self.end_of_turn_id]
        return closing + list(self.glue_ids)

    def decode_action(self, sampled_ids: list[int]) -> str:
        """The text of a sampled turn as the env sees it: without the trailing stop token."""
        ids = sampled_ids[:-1] if sampled_ids and sampled_ids[-1] in self.stop_ids else sampled_ids
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
