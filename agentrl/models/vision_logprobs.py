"""Teacher-forced logprobs of a trajectory with images on a vision-language model (Qwen2-VL
style), the learner-side twin of `agentrl.rollout.engines.hf_vision.VisionHFEngine`.

The policy both sides define is the model's next-token distribution at `logits / T` with the
vision special tokens removed (their logits set to -inf): a sampler that produced a placeholder
id would break the model's count of placeholders against images.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def vision_token_ids(config: Any) -> list[int]:
    """The vision special token ids of a vision-language model's config (`image_token_id`,
    `video_token_id`, `vision_start_token_id`, `vision_end_token_id`, those it has): the ids a
    sampler never produces and the learner removes the same way."""
    names = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
    return sorted({int(getattr(config, n)) for n in names if getattr(config, n, None) is not None})


def vision_forward_inputs(token_ids: Sequence[int], vision: dict[str, Any] | None, image_token_id: int
                          ) -> dict[str, torch.Tensor]:
    """The keyword inputs of one row's forward: `input_ids` (1, T), and with images
    `pixel_values`, `image_grid_thw` and `mm_token_type_ids` (1, T; 1 on `image_token_id`).

    Raises:
        ValueError: the placeholder ids are not `sum(t * h * w) / 4` of the images' grids
            (merge size 2) when `vision` has images.
    """
    ids = torch.tensor([list(token_ids)], dtype=torch.long)
    out: dict[str, torch.Tensor] = {"input_ids": ids}
    if vision is not None and vision.get("image_grid_thw") is not None and len(vision["image_grid_thw"]):
        grid = vision["image_grid_thw"]
        want = int((grid.prod(-1) // 4).sum())
        got = int((ids == image_token_id).sum())
        if got != want:
            raise ValueError(f"{got} image placeholder ids for images of {want} merged patches")
        out.update(pixel_values=vision["pixel_values"], image_grid_thw=grid,
                   mm_token_type_ids=(ids == image_token_id).long())
    return out


def vision_logprobs(model: Any, token_ids: Sequence[int], vision: dict[str, Any] | None, *,
                    image_token_id: int, temperature: float = 1.0,
                    banned_ids: Sequence[int] = ()) -> torch.Tensor:
    """Teacher-forced `log pi(token_t | tokens_<t, images)` of one trajectory, float32 (T,).

    Position 0 (no context) gets 0. Logits are divided by `temperature` (1 when it is 0, as
    the sampler reports greedy logprobs under T = 1), `banned_ids` set to -inf, then float32
    `log_softmax` over the vocabulary, matching `agentrl.models.sampling.sample_next`.

    Raises:
        ValueError: as `vision_forward_inputs`.
    """
    inputs = vision_forward_inputs(token_ids, vision, image_token_id)
    dev = next(model.parameters()).device
    inputs = {k: v.to(dev) for k, v in inputs.items()}
    logits = model(**inputs, use_cache=False).logits[0].float()  # (T, V)
    if temperature not in (0, 1.0):
        logits = logits / temperature
    if banned_ids:
        logits[:, list(banned_ids)] = float("-inf")
    logp = logits.log_softmax(-1)
    ids = inputs["input_ids"][0]
    out = torch.zeros(len(ids), dtype=torch.float32, device=logits.device)
    out[1:] = logp[:-1].gather(-1, ids[1:, None]).squeeze(-1)
    return out
