"""What an observation may hold: message content checks (text parts, image parts and what makes
an image unrenderable), the text and the images of messages."""

from __future__ import annotations

from typing import Any

import numpy as np

from agentrl.types import Message, image_size, is_image

MAX_IMAGE_ASPECT = 200
"""Largest `max(H, W) / min(H, W)` of an image the Qwen2-VL image processor renders
(`transformers`' `smart_resize` raises above it). There is no lower bound on size beyond
`H, W >= 1`: an image under the processor's `min_pixels` is scaled up to it."""


def image_size_error(x: Any) -> str | None:
    """What makes image `x` (one `is_image` accepts) unrenderable by the image processor, or
    None: a zero width or height, or an aspect ratio over `MAX_IMAGE_ASPECT`."""
    w, h = image_size(x)
    if w == 0 or h == 0:
        return f"image of size {w}x{h} (WxH) has a zero dimension"
    if max(w, h) / min(w, h) > MAX_IMAGE_ASPECT:
        return (f"image of size {w}x{h} (WxH) has aspect ratio {max(w, h) / min(w, h):g}, over the "
                f"image processor's limit of {MAX_IMAGE_ASPECT}")
    return None


def content_error(content: Any) -> str | None:
    """What is wrong with a message's `content`, or None when it is valid: a str, or a list of
    `{"type": "text", "text": str}` / `{"type": "image", "image": PIL image or (H, W, 3) uint8
    array}` parts (`ChatMessages`), each image with both sides >= 1 and an aspect ratio of at
    most `MAX_IMAGE_ASPECT` (`image_size_error`)."""
    if isinstance(content, str):
        return None
    if not isinstance(content, list):
        return f"content must be a str or a list of parts, got {type(content).__name__}"
    for k, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            if not isinstance(part.get("text"), str):
                return f"part {k}: a text part needs a str 'text'"
        elif kind == "image":
            img = part.get("image")
            if not is_image(img):
                got = (f"array {img.shape} {img.dtype}" if isinstance(img, np.ndarray)
                       else type(img).__name__)
                return f"part {k}: 'image' must be a PIL image or an (H, W, 3) uint8 array, got {got}"
            size_err = image_size_error(img)
            if size_err:
                return f"part {k}: {size_err}"
        else:
            return f"part {k}: type must be 'text' or 'image', got {part!r:.80}"
    return None


def content_text(content: Any) -> str:
    """The text of a message's `content`: the str itself, or its text parts joined (images
    dropped)."""
    if isinstance(content, str):
        return content
    return "".join(p["text"] for p in content or [] if isinstance(p, dict) and p.get("type") == "text")


def message_images(messages: list[Message]) -> list[Any]:
    """The images of `messages`' image parts, in order of appearance (as the chat template
    renders them)."""
    return [p["image"] for m in messages if isinstance(m.get("content"), list)
            for p in m["content"] if isinstance(p, dict) and p.get("type") == "image"]
