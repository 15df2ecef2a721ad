"""Token-in, token-out sampling from token ids plus images with a Hugging Face vision-language
model (Qwen2-VL style: `pixel_values`, `image_grid_thw`, `mm_token_type_ids`).

One row at a time, no batching and no static decoder: the prompt (with its images) is
prefilled with the model's own forward, which computes Qwen2-VL's multimodal rotary positions,
then tokens are decoded with the KV cache. Sampling is `HFEngine`'s: `sample_next` with the
per-row streams of `row_uniforms` seeded by `row_seeds`, logprobs `log_softmax(logits / T)`.
The vision special tokens are never sampled (their logits are -inf; the learner's twin,
`agentrl.models.vision_logprobs`, removes them the same way).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from agentrl.model import cache_kwarg, new_cache
from agentrl.models.sampling import row_uniforms, sample_next
from agentrl.models.vision_logprobs import vision_forward_inputs
from agentrl.rollout.engines.base import Completion, SamplingParams, row_seeds
from agentrl.rollout.engines.hf import check_params


class VisionHFEngine:
    """Generate from token ids and images (implements `Engine`, plus `images=`).

    Args:
        model: a loaded transformers vision-language model (used as is, put in eval mode).
        image_token_id: the image placeholder id (`VisionChatRenderer.image_token_id`).
        banned_ids: ids never sampled (`VisionChatRenderer.vision_token_ids`).
        torch_threads: if given, `torch.set_num_threads(torch_threads)`.

    Attributes:
        policy_version: version of the loaded weights (0 until `update_weights`).
        accepts_images: True.
    """

    accepts_images = True

    def __init__(self, model: Any, *, image_token_id: int, banned_ids: Sequence[int] = (),
                 torch_threads: int | None = None) -> None:
        if torch_threads is not None:
            torch.set_num_threads(torch_threads)
        self.model = model.eval()
        self.image_token_id = int(image_token_id)
        self.banned_ids = sorted({int(i) for i in banned_ids})
        self.policy_version = 0
        self._cache_kw = cache_kwarg(self.model)

    def generate(self, prompts: list[list[int]], params: SamplingParams,
                 images: Sequence[dict[str, Any] | None] | None = None) -> list[Completion]:
        """Sample `params.n` completions per prompt, prompt-major.

        Args:
            prompts: token ids, placeholders already widened (one id per merged patch).
            params: as `HFEngine.generate`.
            images: per prompt, its `Trajectory.vision` (`pixel_values`, `image_grid_thw`) or
                None for a text-only prompt.

        Returns:
            Completions as `HFEngine.generate` (stop token included, sampler logprobs).

        Raises:
            ValueError: bad params, `images` not one per prompt, placeholders that do not match
                the images (`vision_forward_inputs`).
            FloatingPointError: non-finite logits.
        """
        check_params(params)
        images = list(images) if images is not None else [None] * len(prompts)
        if len(images) != len(prompts):
            raise ValueError(f"{len(images)} image entries for {len(prompts)} prompts")
        if params.seed is None:
            seeds = torch.randint(-(1 << 63), (1 << 63) - 1, (len(prompts) * params.n,)).tolist()
        else:
            seeds = row_seeds(prompts, params.n, params.seed, params.seed_offsets)
        out = []
        with torch.inference_mode():
            for i, p in enumerate(prompts):
                for j in range(params.n):
                    out.append(self._one(p, images[i], params, seeds[i * params.n + j]))
        return out

    def _logits(self, out: Any) -> torch.Tensor:
        logits = out.logits[:, -1, :].float()
        if self.banned_ids:
            logits[:, self.banned_ids] = float("-inf")
        return logits

    def _one(self, prompt: list[int], vision: dict[str, Any] | None, params: SamplingParams,
             seed: int) -> Completion:
        inputs = vision_forward_inputs(prompt, vision, self.image_token_id)
        cache = new_cache(self.model)
        logits = self._logits(self.model(**inputs, **{self._cache_kw: cache}, use_cache=True))
        seed_t = torch.tensor([seed], dtype=torch.int64)
        stops = set(params.stop_token_ids)
        toks: list[int] = []
        lps: list[float] = []
        finish = "length"
        for t in range(params.max_tokens):
            u = None if params.temperature == 0 else row_uniforms(seed_t, t)
            tok, lp = sample_next(logits, params.temperature, params.top_p, u)
            if not torch.isfinite(lp).all():
                raise FloatingPointError("VisionHFEngine.generate: non-finite logits")
            toks.append(int(tok[0]))
            lps.append(float(lp[0]))
            if toks[-1] in stops:
                finish = "stop"
                break
            if t < params.max_tokens - 1:
                logits = self._logits(self.model(input_ids=tok[:, None], **{self._cache_kw: cache}, use_cache=True))
        return Completion(toks, lps, finish)

    def update_weights(self, state_dict: dict[str, Any], version: int) -> None:
        """Load `state_dict` (strict, except keys tied to given ones) and set the version.

        Raises:
            KeyError: unexpected keys.
        """
        own = self.model.state_dict()
        unexpected = sorted(set(state_dict) - set(own))
        if unexpected:
            raise KeyError(f"unexpected keys in state_dict: {unexpected[:8]}")
        self.model.load_state_dict(state_dict, strict=False)
        self.policy_version = int(version)
