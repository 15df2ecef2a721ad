"""Token-in, token-out sampling from token ids plus images with a Hugging Face vision-language
model (Qwen2-VL style: `pixel_values`, `image_grid_thw`, `mm_token_type_ids`).

One `generate` call is batched as `HFEngine`'s (without its static decoder):

1. Output rows (prompt i, sample j) are sorted by prompt length and cut into chunks of at most
   `max_batch` rows. The distinct prompts of a chunk (a prompt's `n` samples share its ids and
   images) are prefilled once and their cache rows copied to their samples.
2. The prefill is one forward of the left-padded prompts with an attention mask, the prompts'
   `pixel_values` and `image_grid_thw` concatenated in row order, and explicit multimodal
   rotary positions (`agentrl.models.vision_batch.mrope_positions`: each row's own
   `get_rope_index` over its real tokens), so a padded row sees what it sees alone.
3. Single-token decode steps with the `DynamicCache`: row b's token k (0-based) has position
   `max(prompt positions of b) + 1 + k` in all three rotary rows (transformers' `rope_deltas`).
   A row ends at the first of `stop_token_ids` (kept, "stop") or at `max_tokens` ("length");
   finished rows are dropped from the batch once `COMPACT_FRACTION` of it has finished.

`max_batch=1` is the unbatched path (each sample prefilled and decoded alone), kept for
comparison (`benchmarks/vision_engine_batching.py`). Sampling is `HFEngine`'s: `sample_next`
with the per-row streams of `row_uniforms` seeded by `row_seeds`, logprobs
`log_softmax(logits / T)`, so a row's tokens do not depend on the other rows of the call (up to
float32 rounding of a different batch shape). The vision special tokens are never sampled
(their logits are -inf; the learner's twin, `agentrl.models.vision_logprobs`, removes them the
same way).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch

from agentrl.models.sampling import row_uniforms, sample_next
from agentrl.models.tiny import cache_kwarg, new_cache
from agentrl.models.vision_batch import mrope_positions, safe_pad_id, vision_batch_inputs
from agentrl.rollout.engines.base import Completion, SamplingParams, row_seeds
from agentrl.rollout.engines.hf import (
    COMPACT_FRACTION,
    check_finite_logprobs,
    check_params,
    record_stops,
)


class VisionHFEngine:
    """Generate from token ids and images (implements `Engine`, plus `images=`).

    Args:
        model: a loaded transformers vision-language model (used as is, put in eval mode).
        image_token_id: the image placeholder id (`VisionChatRenderer.image_token_id`).
        banned_ids: ids never sampled (`VisionChatRenderer.vision_token_ids`).
        torch_threads: if given, `torch.set_num_threads(torch_threads)`.
        max_batch: most rows (prompts x n) in one batched forward; larger calls are chunked
            (1: one sample at a time).

    Attributes:
        policy_version: version of the loaded weights (0 until `update_weights`).
        accepts_images: True.
    """

    accepts_images = True

    def __init__(self, model: Any, *, image_token_id: int, banned_ids: Sequence[int] = (),
                 torch_threads: int | None = None, max_batch: int = 128) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if torch_threads is not None:
            torch.set_num_threads(torch_threads)
        self.model = model.eval()
        self.image_token_id = int(image_token_id)
        self.banned_ids = sorted({int(i) for i in banned_ids})
        self.max_batch = int(max_batch)
        self.policy_version = 0
        self._cache_kw = cache_kwarg(self.model)
        self._pad_id = safe_pad_id([*self.banned_ids, self.image_token_id])
        self._keep_kw = ({"logits_to_keep": 1}
                         if "logits_to_keep" in inspect.signature(self.model.forward).parameters else {})

    def generate(self, prompts: list[list[int]], params: SamplingParams,
                 images: Sequence[dict[str, Any] | None] | None = None) -> list[Completion]:
        """Sample `params.n` completions per prompt, prompt-major.

        Args:
            prompts: token ids, placeholders already widened (one id per merged patch).
            params: as `HFEngine.generate`.
            images: per prompt, its `Trajectory.vision` (`pixel_values`, `image_grid_thw`) or
                None for a text-only prompt.

        Returns:
            `len(prompts) * params.n` completions as `HFEngine.generate` (stop token included,
            sampler logprobs, finish reason "stop" or "length").

        Raises:
            ValueError: bad params, an empty prompt, `images` not one per prompt, placeholders
                that do not match the images (`vision_forward_inputs`).
            FloatingPointError: non-finite logits at a returned token.
        """
        check_params(params)
        images = list(images) if images is not None else [None] * len(prompts)
        if len(images) != len(prompts):
            raise ValueError(f"{len(images)} image entries for {len(prompts)} prompts")
        for i, p in enumerate(prompts):
            if not len(p):
                raise ValueError(f"prompt {i} is empty")
        if not prompts:
            return []
        n = params.n
        if params.seed is None:
            seeds = torch.randint(-(1 << 63), (1 << 63) - 1, (len(prompts) * n,), dtype=torch.int64)
        else:
            seeds = torch.tensor(row_seeds(prompts, n, params.seed, params.seed_offsets), dtype=torch.int64)
        # Output row r = i * n + j samples prompt i; rows are batched shortest prompt first.
        rows = sorted(range(len(prompts) * n), key=lambda r: (len(prompts[r // n]), r // n))
        results: list[Completion] = [None] * len(rows)  # type: ignore[list-item]
        with torch.inference_mode():
            for start in range(0, len(rows), self.max_batch):
                chunk = rows[start:start + self.max_batch]
                local: dict[int, int] = {}
                src = [local.setdefault(r // n, len(local)) for r in chunk]
                done = self._generate_chunk([prompts[i] for i in local], [images[i] for i in local], src,
                                            params, seeds[torch.tensor(chunk)])
                for r, completion in zip(chunk, done, strict=True):
                    results[r] = completion
        return results

    def _logits(self, out: Any) -> torch.Tensor:
        logits = out.logits[:, -1, :].float()
        if self.banned_ids:
            logits[:, self.banned_ids] = float("-inf")
        return logits

    def _generate_chunk(self, prompts: list[list[int]], visions: list[dict[str, Any] | None],
                        src: list[int], params: SamplingParams, seeds: torch.Tensor) -> list[Completion]:
        """Prefill the distinct `prompts` (with `visions`) once, then sample one completion per
        row, row k continuing `prompts[src[k]]` with seed `seeds[k]` ((rows,) int64); returns
        the completions in row order."""
        dev = next(self.model.parameters()).device
        max_new = params.max_tokens
        inputs = vision_batch_inputs(prompts, visions, self.image_token_id, pad_id=self._pad_id,
                                     left_pad=True, device=dev)
        pos = mrope_positions(self.model, inputs)  # (3, P, W)
        next_pos = pos.amax(dim=(0, 2)) + 1  # (P,): each row's next position
        width = inputs["input_ids"].shape[1]
        mask = torch.nn.functional.pad(inputs.pop("attention_mask"), (0, max_new))  # room for new tokens
        cache = new_cache(self.model)
        logits = self._logits(self.model(**inputs, attention_mask=mask[:, :width], position_ids=pos,
                                          **{self._cache_kw: cache}, use_cache=True, **self._keep_kw))
        if src != list(range(len(prompts))):
            expand = torch.tensor(src, dtype=torch.long, device=dev)
            cache.batch_select_indices(expand)
            logits, mask, next_pos = logits[expand], mask[expand], next_pos[expand]
        seeds = seeds.to(dev)
        n_rows = len(src)
        out_tokens = torch.zeros((n_rows, max_new), dtype=torch.long, device=dev)
        out_logprobs = torch.zeros((n_rows, max_new), dtype=torch.float32, device=dev)
        out_len = torch.full((n_rows,), max_new, dtype=torch.long, device=dev)
        stopped = torch.zeros(n_rows, dtype=torch.bool, device=dev)
        stop_ids = torch.tensor(sorted(set(params.stop_token_ids)), dtype=torch.long, device=dev)
        rows = torch.arange(n_rows, device=dev)  # batch slot -> output row
        alive = torch.ones(n_rows, dtype=torch.bool, device=dev)  # per batch slot
        n_alive = n_rows
        for t in range(max_new):
            u = None if params.temperature == 0 else row_uniforms(seeds[rows], t)
            tokens, logprobs = sample_next(logits, params.temperature, params.top_p, u)
            out_tokens[rows, t] = tokens
            out_logprobs[rows, t] = logprobs
            left = record_stops(tokens, stop_ids, alive, rows, out_len, stopped, t)
            n_alive = n_alive if left is None else left
            if n_alive == 0 or t == max_new - 1:
                break
            if len(rows) - n_alive >= max(1, int(COMPACT_FRACTION * len(rows))):
                keep = alive.nonzero().squeeze(-1)
                cache.batch_select_indices(keep)
                rows, alive, mask, next_pos, tokens = rows[keep], alive[keep], mask[keep], next_pos[keep], tokens[keep]
            mask[:, width + t] = 1
            logits = self._logits(self.model(input_ids=tokens[:, None], attention_mask=mask[:, :width + t + 1],
                                              position_ids=next_pos[:, None], **{self._cache_kw: cache},
                                              use_cache=True))
            next_pos = next_pos + 1
        check_finite_logprobs(out_logprobs, out_len, "VisionHFEngine")
        toks, lps, lens = out_tokens.tolist(), out_logprobs.tolist(), out_len.tolist()
        return [Completion(toks[r][:lens[r]], lps[r][:lens[r]], "stop" if s else "length")
                for r, s in enumerate(stopped.tolist())]

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
