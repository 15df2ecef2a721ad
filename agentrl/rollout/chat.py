"""Messages -> token ids without ever re-tokenizing the conversation (contract 1).

The opening messages are rendered once with the chat template. After that, each sampled turn
is kept as the exact ids the engine produced, and each observation is rendered *on its own*
as the chat template's delta for the new messages, then appended. So the ids a trajectory
trains on are exactly the ids the sampler saw and produced, whatever the template does to
earlier turns (a template that drops `<think>` blocks from history cannot change them: case M4).
"""

from __future__ import annotations

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

# A fixed conversation the deltas are cut from: rendering `BASE + new` and removing the ids of
# `BASE` leaves the template's rendering of `new` in the middle of a conversation.
_BASE: list[Message] = [
    {"role": "system", "content": "s"},
    {"role": "user", "content": "u"},
    {"role": "assistant", "content": "a"},
]


def render_ids(tokenizer: Any, messages: list[Message], *, add_generation_prompt: bool,
               tools: list[dict] | None = None) -> list[int]:
    """Render chat messages with the tokenizer's chat template to a plain list of token ids
    (see `agentrl.models.tiny.render_ids`)."""
    return _render(tokenizer, messages, add_generation_prompt=add_generation_prompt, tools=tools)


class ChatRenderer:
    """Incremental renderer for one tokenizer's chat template.

    Attributes:
        end_of_turn_id: the id that closes an assistant turn (`<|im_end|>` for ChatML), found
            from the template itself.
        glue_ids: ids the template puts after an assistant's end-of-turn (ChatML: "\\n"); they
            are context (loss_mask 0), never sampled.
        stop_ids: ids that end sampling: end-of-turn first, then the tokenizer's eos.
        accepts_images: False: this renderer renders text only; an observation with image
            parts is refused by the agent loop (`check_images_allowed`).

    Raises:
        ValueError: if the template does not render a conversation as a prefix-extension of its
            start (then deltas cannot be cut and the tokenizer needs a different template).
    """

    accepts_images = False

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        base = render_ids(tokenizer, _BASE, add_generation_prompt=False)
        head = render_ids(tokenizer, _BASE[:2], add_generation_prompt=True)
        if base[: len(head)] != head:
            raise ValueError("chat template: a conversation must extend its generation prompt")
        # the assistant span in `base` is: content ids + end-of-turn + glue
        content = tokenizer.encode("a", add_special_tokens=False)
        rest = base[len(head):]
        if rest[: len(content)] != content or len(rest) <= len(content):
            raise ValueError("chat template: cannot locate the assistant's end-of-turn token")
        self.end_of_turn_id = rest[len(content)]
        self.glue_ids = rest[len(content) + 1:]
        self._base_len = len(base)
        self._base = base
        eos = tokenizer.eos_token_id
        self.stop_ids = [self.end_of_turn_id] + ([eos] if eos not in (None, self.end_of_turn_id) else [])

    def prompt_ids(self, messages: list[Message], tools: list[dict] | None = None) -> list[int]:
        """Ids of the opening messages followed by the assistant generation prompt."""
        return render_ids(self.tokenizer, messages, add_generation_prompt=True, tools=tools)

    def delta_ids(self, new_messages: list[Message]) -> list[int]:
        """Ids of `new_messages` (observations) as they render after an assistant turn, followed
        by the generation prompt of the next assistant turn. Excludes `glue_ids`.

        Raises:
            ValueError: if the template re-renders earlier turns differently when new messages
                follow (the delta would not be a prefix-extension).
        """
        full = render_ids(self.tokenizer, _BASE + list(new_messages), add_generation_prompt=True)
        if full[: self._base_len] != self._base:
            raise ValueError("chat template re-renders history when messages are added; "
                             "observation deltas cannot be cut")
        return full[self._base_len:]

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

    def __init__(self, tokenizer: Any, image_processor: Any, image_token: str | None = None):
        super().__init__(tokenizer)
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


def renderer_for(tokenizer: Any) -> ChatRenderer:
    """The renderer of a policy: a `VisionChatRenderer` when `tokenizer` carries an image
    processor (`tokenizer.image_processor`, a vision-language policy), else a `ChatRenderer`.

    Raises:
        ValueError: as `ChatRenderer` / `VisionChatRenderer` (a template without an end of turn,
            a tokenizer without the image placeholder).
    """
    image_processor = getattr(tokenizer, "image_processor", None)
    if image_processor is not None:
        return VisionChatRenderer(tokenizer, image_processor)
    return ChatRenderer(tokenizer)
