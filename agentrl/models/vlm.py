"""The embedded default vision-language model: a tiny Qwen2-VL (a few text layers, a small
vision tower) with our offline tokenizer, a ChatML template that renders image parts, and a
`Qwen2VLImageProcessorPil` constructed in code; saved as a normal Hugging Face model directory
(`AutoModelForImageTextToText`, `AutoTokenizer`, `AutoImageProcessor` load it offline).

The image path works without torchvision: images go through the PIL image processor, and the
processor's one other job, expanding each `<|image_pad|>` placeholder into one id per merged
patch, is `expand_image_pads` here (the same rule as `Qwen2VLProcessor.replace_image_token`:
`grid_t * grid_h * grid_w // merge_size**2` copies). `AutoProcessor` needs torchvision for
Qwen2-VL's video processor, so this module never uses it.

torch and transformers are imported inside the functions (importing this module is cheap).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.models.tiny import (
    CHAT_TEMPLATE,
    build_tokenizer,
    save_initialised,
    text_config_fields,
)
from agentrl.types import image_size

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
IMAGE_PAD = "<|image_pad|>"
"""The placeholder of one merged image patch (Qwen2-VL's names for these tokens)."""
VIDEO_PAD = "<|video_pad|>"
VISION_TOKENS = (VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD)
"""Special tokens added to the embedded tokenizer after its text tokens."""

_TEXT_PART = "{%- if part['type'] == 'text' -%}{{ part['text'] }}{%- endif -%}"
_TEXT_OR_IMAGE_PART = (
    "{%- if part['type'] == 'text' -%}{{ part['text'] }}"
    "{%- elif part['type'] == 'image' -%}{{ '" + VISION_START + IMAGE_PAD + VISION_END + "' }}"
    "{%- endif -%}"
)
if _TEXT_PART not in CHAT_TEMPLATE:  # pragma: no cover - guards the derivation below
    raise RuntimeError("agentrl.models.tiny.CHAT_TEMPLATE changed: update agentrl.models.vlm.VLM_CHAT_TEMPLATE")
VLM_CHAT_TEMPLATE = CHAT_TEMPLATE.replace(_TEXT_PART, _TEXT_OR_IMAGE_PART)
"""`agentrl.models.tiny.CHAT_TEMPLATE` where an image part renders as
`<|vision_start|><|image_pad|><|vision_end|>` (one pad; `expand_image_pads` widens it)."""

MIN_PIXELS = 56 * 56
MAX_PIXELS = 112 * 112
"""Default image size range of the embedded image processor (pixels, after resizing to
multiples of 28): a 56x56 image becomes 4 image tokens, a 112x112 one 16."""


def build_vlm_tokenizer(texts: Iterable[str], vocab_size: int = 1024) -> PreTrainedTokenizerBase:
    """`agentrl.models.tiny.build_tokenizer` plus the special tokens `VISION_TOKENS` (the last four
    ids) and `VLM_CHAT_TEMPLATE`.

    Raises:
        ValueError: `vocab_size` < 261 (see `build_tokenizer`).
    """
    tok = build_tokenizer(texts, vocab_size=vocab_size)
    tok.add_special_tokens({"additional_special_tokens": list(VISION_TOKENS)})
    tok.chat_template = VLM_CHAT_TEMPLATE
    return tok


def tiny_image_processor(min_pixels: int = MIN_PIXELS, max_pixels: int = MAX_PIXELS) -> Any:
    """Qwen2-VL's PIL image processor (no torchvision) with patch 14, merge 2, temporal patch 2:
    an image is resized (aspect kept) to a multiple of 28 per side with `min_pixels` to
    `max_pixels` pixels, normalised with the CLIP mean/std, and cut into 14x14 patches.

    Raises:
        ValueError: `min_pixels` > `max_pixels` or either < 28*28.
    """
    from transformers import Qwen2VLImageProcessorPil

    if not 28 * 28 <= min_pixels <= max_pixels:
        raise ValueError(f"image pixels: need 784 <= min_pixels <= max_pixels, got {min_pixels}, {max_pixels}")
    return Qwen2VLImageProcessorPil(min_pixels=min_pixels, max_pixels=max_pixels, patch_size=14,
                                    merge_size=2, temporal_patch_size=2)


def tiny_vlm_config(
    tokenizer: PreTrainedTokenizerBase,
    *,
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    intermediate_size: int = 384,
    vision_depth: int = 2,
    vision_width: int = 32,
    vision_heads: int = 2,
    max_position_embeddings: int = 2048,
) -> Any:
    """The `Qwen2VLConfig` of the embedded VLM for `tokenizer` (which must have `VISION_TOKENS`).

    Text model as `agentrl.models.tiny.tiny_config` (tied embeddings, GQA, float32); multimodal
    rotary sections split the rotary half-dimension 1/4 : 3/8 : 3/8 (time, height, width) as
    Qwen2-VL's `[16, 24, 24]` of 64. Vision tower: `vision_depth` blocks of width
    `vision_width`, patch 14, spatial merge 2, its merger projecting to `hidden_size`.

    Raises:
        ValueError: `hidden_size` not divisible by `num_heads`, a head dimension not divisible
            by 4 (rotary sections), `vision_width / vision_heads` not a whole number divisible by 4, or a
            tokenizer without the vision tokens.
    """
    from transformers import Qwen2VLConfig

    text = text_config_fields(tokenizer, hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads,
                              intermediate_size=intermediate_size, max_position_embeddings=max_position_embeddings)
    head_dim = hidden_size // num_heads
    if head_dim % 4:
        raise ValueError(f"head dimension {head_dim} (hidden_size / num_heads) must be divisible by 4")
    if vision_width % vision_heads or (vision_width // vision_heads) % 4:
        raise ValueError(f"vision_width {vision_width} / vision_heads {vision_heads} must be a whole head "
                         "dimension divisible by 4 (the vision tower's 2-D rotary embedding)")
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in VISION_TOKENS}
    if any(i is None or i == tokenizer.unk_token_id for i in ids.values()):
        raise ValueError(f"tokenizer lacks the vision tokens {VISION_TOKENS} (use build_vlm_tokenizer)")
    half = head_dim // 2
    hw = 3 * half // 8
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0,
                               "mrope_section": [half - 2 * hw, hw, hw]}
    vision = dict(depth=vision_depth, embed_dim=vision_width, num_heads=vision_heads,
                  hidden_size=hidden_size, mlp_ratio=2, patch_size=14, spatial_merge_size=2,
                  temporal_patch_size=2)
    return Qwen2VLConfig(text_config=text, vision_config=vision, image_token_id=ids[IMAGE_PAD],
                         video_token_id=ids[VIDEO_PAD], vision_start_token_id=ids[VISION_START],
                         vision_end_token_id=ids[VISION_END], tie_word_embeddings=True,
                         bos_token_id=None, eos_token_id=text["eos_token_id"],
                         pad_token_id=tokenizer.pad_token_id, dtype="float32")


def build_tiny_vlm(
    out_dir: str | Path,
    texts: Iterable[str],
    *,
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    intermediate_size: int = 384,
    vocab_size: int = 1024,
    vision_depth: int = 2,
    vision_width: int = 32,
    vision_heads: int = 2,
    min_pixels: int = MIN_PIXELS,
    max_pixels: int = MAX_PIXELS,
    seed: int = 0,
    max_position_embeddings: int = 2048,
    init_std: float | None = None,
) -> str:
    """Build the embedded VLM and save it as a Hugging Face model directory.

    Trains the tokenizer on `texts` (`build_vlm_tokenizer`), builds a randomly initialised
    `Qwen2VLForConditionalGeneration` (`tiny_vlm_config`) and the image processor
    (`tiny_image_processor`), and writes `config.json`, `generation_config.json`,
    `model.safetensors`, the tokenizer files, `chat_template.jinja` and
    `preprocessor_config.json` to `out_dir` (created if missing). Same arguments give the same
    files; the global torch RNG is left as it was. `init_std` (None: the configs' 0.02) is the
    `initializer_range` of the text and vision configs: the standard deviation of the normal
    initialisation of every weight matrix, the patch embedding and the token embedding (at 0.02
    the model sits on `visual_count`'s answer prior, image-blind, for hundreds of warm-start
    steps; `agentrl.run.VISION_DEFAULTS` gives the embedded VLM 0.1: docs/multimodal.md).

    Returns:
        `str(out_dir)`.

    Raises:
        ValueError: bad sizes (see `build_tokenizer`, `tiny_vlm_config`, `tiny_image_processor`).
    """
    from transformers import Qwen2VLForConditionalGeneration

    tokenizer = build_vlm_tokenizer(texts, vocab_size=vocab_size)
    config = tiny_vlm_config(tokenizer, hidden_size=hidden_size, num_layers=num_layers,
                             num_heads=num_heads, intermediate_size=intermediate_size,
                             vision_depth=vision_depth, vision_width=vision_width,
                             vision_heads=vision_heads, max_position_embeddings=max_position_embeddings)
    if init_std is not None:
        config.text_config.initializer_range = float(init_std)
        config.vision_config.initializer_range = float(init_std)
    processor = tiny_image_processor(min_pixels, max_pixels)
    return save_initialised(Qwen2VLForConditionalGeneration, config, tokenizer, seed, out_dir, processor)


def is_vlm_dir(path: str | Path) -> bool:
    """Whether the model directory `path` holds an image processor (`preprocessor_config.json`)
    beside a config whose model has a vision tower (`vision_config`)."""
    import json

    p = Path(path)
    if not (p / "preprocessor_config.json").is_file() or not (p / "config.json").is_file():
        return False
    try:
        return "vision_config" in json.loads((p / "config.json").read_text())
    except (OSError, ValueError):
        return False


def load_vlm(path: str | Path, *, dtype: torch.dtype | None = None
             ) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, Any]:
    """Load a local vision-language model directory (ours or a real Qwen2-VL-like one) offline,
    in eval mode, with the Auto classes.

    Returns:
        `(model, tokenizer, image_processor)`: `AutoModelForImageTextToText`, `AutoTokenizer`
        (padding side left, pad = eos when it has none), `AutoImageProcessor` (the PIL one when
        torchvision is missing).

    Raises:
        FileNotFoundError: `path` is not a directory.
        ValueError: `path` has no image processor or no vision tower (`is_vlm_dir`).
    """
    import torch
    from transformers import AutoImageProcessor, AutoModelForImageTextToText, AutoTokenizer

    if not Path(path).is_dir():
        raise FileNotFoundError(f"model directory not found: {path}")
    if not is_vlm_dir(path):
        raise ValueError(f"{path}: not a vision-language model directory (needs preprocessor_config.json "
                         "and a config.json with vision_config)")
    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    image_processor = AutoImageProcessor.from_pretrained(str(path), local_files_only=True)
    model = AutoModelForImageTextToText.from_pretrained(
        str(path), dtype=torch.float32 if dtype is None else dtype, local_files_only=True)
    model.eval()
    return model, tokenizer, image_processor


def to_pil(image: Any) -> Any:
    """A PIL RGB image from a PIL image (converted to RGB) or an `(H, W, 3)` uint8 array."""
    from PIL import Image

    if isinstance(image, Image.Image):
        return image.convert("RGB")
    return Image.fromarray(image)


class ImageProcessorError(ValueError):
    """The image processor failed on an image (`encode_images`); the message names the image
    (its index and size) and the processor's own error."""


def encode_images(image_processor: Any, images: Sequence[Any]) -> dict[str, Any]:
    """Pixel inputs of `images` (PIL images or `(H, W, 3)` uint8 arrays).

    Returns:
        `{"pixel_values": float32 tensor (sum of patches, C * temporal * patch * patch),
        "image_grid_thw": int64 tensor (len(images), 3)}` as the Qwen2-VL image processor
        gives them; empty tensors (0 rows) when `images` is empty.

    Raises:
        ImageProcessorError: the processor raised (any exception) on one of `images`.
    """
    import torch

    if not images:
        return {"pixel_values": torch.zeros(0, 0), "image_grid_thw": torch.zeros(0, 3, dtype=torch.long)}
    try:
        pil = [to_pil(im) for im in images]
        enc = image_processor(images=pil, return_tensors="pt")
    except Exception as e:  # noqa: BLE001 - whatever the processor raises, named with the image
        raise ImageProcessorError(_failing_image(image_processor, images, e)) from e
    return {"pixel_values": enc["pixel_values"].float(), "image_grid_thw": enc["image_grid_thw"].long()}


def _failing_image(image_processor: Any, images: Sequence[Any], error: Exception) -> str:
    """The message of `ImageProcessorError`: the first of `images` the processor fails on alone
    (index and size), with its error; `error` (of the whole call) when none fails alone."""
    for k, im in enumerate(images):
        try:
            image_processor(images=[to_pil(im)], return_tensors="pt")
        except Exception as e:  # noqa: BLE001 - this one fails: name it
            w, h = image_size(im)
            return f"image processor failed on image {k} of size {w}x{h} (WxH): {type(e).__name__}: {e}"
    return f"image processor failed on {len(images)} images: {type(error).__name__}: {error}"


def image_token_counts(image_grid_thw: Any, merge_size: int = 2) -> list[int]:
    """Placeholder tokens per image: `t * h * w // merge_size**2` for each row of
    `image_grid_thw` (as `Qwen2VLProcessor.replace_image_token`)."""
    return [int(t) * int(h) * int(w) // merge_size**2 for t, h, w in image_grid_thw.tolist()]


def expand_image_pads(ids: Sequence[int], pad_id: int, counts: Sequence[int]) -> list[int]:
    """`ids` with its k-th `pad_id` replaced by `counts[k]` copies of it.

    Raises:
        ValueError: the number of `pad_id`s in `ids` is not `len(counts)`.
    """
    found = sum(1 for t in ids if t == pad_id)
    if found != len(counts):
        raise ValueError(f"{found} image placeholders in the rendered ids for {len(counts)} images")
    out: list[int] = []
    k = 0
    for t in ids:
        if t == pad_id:
            out.extend([pad_id] * counts[k])
            k += 1
        else:
            out.append(t)
    return out
