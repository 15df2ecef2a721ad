"""Batched inputs of a Qwen2-VL style vision-language model: several rows of token ids, each
with its own images (or none), in one forward. Shared by `VisionHFEngine` (left-padded
prompts, then decoding) and the learner's teacher-forced forward (right-padded trajectories).

A batch is the rows' ids padded to one width with an attention mask, the rows' `pixel_values`
and `image_grid_thw` concatenated in row order (the model scatters image features into the
placeholders in row-major order, so row order is image order), and `mm_token_type_ids` (1 on
the image placeholder). The multimodal rotary positions (M-RoPE, three rows: time, height,
width) are the model's own `get_rope_index` over each row's real tokens, so a padded row gets
the positions it has alone; passing them explicitly also keeps the model's cached
`rope_deltas` (state left by its own `generate`) out of the forward.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from agentrl.models.vision_logprobs import vision_forward_inputs


def safe_pad_id(banned_ids: Sequence[int]) -> int:
    """The smallest id >= 0 not in `banned_ids` (the vision tokens): a padding id must not be an
    image or video placeholder, which the model counts over the whole batch."""
    banned = {int(i) for i in banned_ids}
    return next(i for i in range(len(banned) + 1) if i not in banned)


def vision_batch_inputs(rows: Sequence[Sequence[int]], visions: Sequence[dict[str, Any] | None],
                        image_token_id: int, *, pad_id: int, left_pad: bool,
                        device: torch.device | str | None = None) -> dict[str, torch.Tensor]:
    """One forward's keyword inputs for B rows of ids with their images.

    Args:
        rows: B non-empty lists of token ids (placeholders widened, one id per merged patch).
        visions: per row its `Trajectory.vision` (`pixel_values` (N_i, D), `image_grid_thw`
            (K_i, 3)) or None.
        image_token_id: the image placeholder id.
        pad_id: id put in padding (not a vision token id: `safe_pad_id`).
        left_pad: pad on the left (prompts to decode from) or on the right (teacher forcing).
        device: where the tensors go (default: CPU).

    Returns:
        `input_ids` (B, T) long, `attention_mask` (B, T) long 0/1, `mm_token_type_ids` (B, T)
        long (1 on `image_token_id`), T the longest row; with any image also `pixel_values`
        (sum N_i, D) and `image_grid_thw` (sum K_i, 3), concatenated in row order.

    Raises:
        ValueError: `visions` not one per row, an empty row, or a row whose placeholders do not
            match its images (`vision_forward_inputs`).
    """
    if len(visions) != len(rows):
        raise ValueError(f"{len(visions)} image entries for {len(rows)} rows")
    width = max((len(r) for r in rows), default=0)
    ids = torch.full((len(rows), width), int(pad_id), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    pixels, grids = [], []
    for i, (r, vis) in enumerate(zip(rows, visions, strict=True)):
        if not len(r):
            raise ValueError(f"row {i} is empty")
        one = vision_forward_inputs(r, vis, image_token_id)  # checks the placeholders
        cols = slice(width - len(r), width) if left_pad else slice(0, len(r))
        ids[i, cols] = one["input_ids"][0]
        mask[i, cols] = 1
        if "pixel_values" in one:
            pixels.append(one["pixel_values"])
            grids.append(one["image_grid_thw"])
    out = {"input_ids": ids, "attention_mask": mask,
           "mm_token_type_ids": ((ids == int(image_token_id)) & mask.bool()).long()}
    if pixels:
        out["pixel_values"] = torch.cat(pixels)
        out["image_grid_thw"] = torch.cat(grids)
    return {k: v.to(device) for k, v in out.items()} if device is not None else out


def _rope_index_fn(model: Any) -> Any:
    """The model's `get_rope_index` (on the model or, as in transformers 5's Qwen2-VL, on its
    inner `Qwen2VLModel`; found through PEFT or FSDP wrappers by walking the modules), or None."""
    fn = getattr(model, "get_rope_index", None)
    if fn is not None:
        return fn
    for m in model.modules():
        fn = getattr(m, "get_rope_index", None)
        if fn is not None:
            return fn
    return None


def mrope_positions(model: Any, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """The M-RoPE position ids of a `vision_batch_inputs` batch, (3, B, T) long.

    Each row's real tokens get the positions the model gives that row alone (its
    `get_rope_index` with the attention mask): text tokens count up by one, an image's
    placeholders take (time, row, column) positions on its merged-patch grid, and the text
    after it continues from the largest position + 1. Padding gets 0 (masked anyway). A row's
    next decoded token has position `positions[:, b].max() + 1` in all three rows (transformers'
    `rope_deltas`). Without images (or a model without `get_rope_index`) the positions are
    `cumsum(mask) - 1` in all three rows.

    Raises:
        ValueError: images in the batch but the model has no `get_rope_index`.
    """
    mask = inputs["attention_mask"]
    fn = _rope_index_fn(model)
    if "image_grid_thw" in inputs:
        if fn is None:
            raise ValueError("a batch with images needs a model with get_rope_index (Qwen2-VL style)")
        pos, _ = fn(input_ids=inputs["input_ids"], mm_token_type_ids=inputs["mm_token_type_ids"],
                    image_grid_thw=inputs["image_grid_thw"], attention_mask=mask)
        return pos.masked_fill(mask[None] == 0, 0)
    text = (mask.cumsum(-1) - 1).clamp(min=0).masked_fill(mask == 0, 0)
    return text[None].expand(3, -1, -1).contiguous()
