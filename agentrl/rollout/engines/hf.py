"""`HFEngine`: batched sampling with a Hugging Face transformers causal LM (the CPU default).

One `generate` call turns prompt token ids into completions:

1. Output rows (prompt i, sample j) are sorted by prompt length and cut into chunks of at most
   `max_batch` rows. Identical prompts (the `n` copies, or a GRPO group sent as separate
   prompts) are prefilled once per chunk and their cache rows copied.
2. The distinct prompts of a chunk are left-padded; the attention mask marks real tokens and
   `position_ids = cumsum(mask) - 1`, so a padded prompt sees exactly the positions and keys
   of the unpadded one. One prefill forward fills a `DynamicCache` and gives the
   last-position logits.
3. A loop of single-token steps samples one token per row per step. For float32 Qwen2/Llama
   models (`static_decode.unsupported_reason`) a step is `StaticDecoder.step`: the model's
   layers written as plain torch ops on a preallocated KV cache, about half the CPU time of a
   transformers forward for small models, same results to float32 rounding; otherwise (or with
   `static_decode=False`) it is a transformers forward with the `DynamicCache`. With
   `compile=True` the static step and the sampling run as one `torch.compile` graph
   (`StaticDecoder.step_sample`; batch, capacity and column dynamic). A row ends at
   the first of `stop_token_ids` (kept, finish reason "stop") or at `max_tokens` ("length").
   Finished rows are dropped from the batch (cache rows index-selected) once at least a quarter
   of the batch has finished (measured: never dropping is ~1.6x slower when rows end early;
   dropping at 1/4 or 1/2 are equal); compiled, never down to one row, whose size-1 batch
   would compile another graph.

Sampler logprobs (case L4): `log_softmax(logits / T)` over the full vocabulary at the sampled
token, before top-p filtering, with T = 1 for greedy (temperature 0). This is what the learner
recomputes with a teacher-forced forward at the same temperature, so the PPO ratio is exactly 1
when the weights have not changed.

Reproducibility: every output row has its own 64-bit seed, `row_seeds(prompts, n, seed,
seed_offsets)` (a hash of the call's seed, the row's prompt ids and the occurrence of that prompt
in the call, counted from `params.seed_offsets` when the call is a shard of a batch, as in the
vLLM engine), and its uniform draw at decode step t is `row_uniforms(seed, t)`, a
counter-based hash. So a row's tokens depend only on (call seed, prompt ids, occurrence of that
prompt in the call, step), not on the other rows of the call, the chunking or the rollout
worker it runs on; the same call gives the same completions. The exception is float32
rounding: a different batch size may pick different matmul kernels, which can flip a near-tie
between two tokens, as in every batched engine. With `seed=None` the row seeds are drawn from
torch's global generator (not reproducible).

Partial rollouts (`rollout.partial`, `weight_poll`): when set, `weight_poll()` is called at every
token boundary (after a decode step's tokens are recorded, before the next step); when it loaded
new weights (it returns True) the chunk stops there, and its unfinished rows resume from their
prompt plus the tokens sampled so far, re-prefilled with the new weights, drawing their
uniforms from step `t + 1` on (`row_uniforms` is counter-based). So an interrupted row gives
exactly the tokens and logprobs of one decode whose weights switched at those positions (up to
the float32 rounding of a prefill against cached decode steps), nothing sampled twice or lost,
and each token's version is in `Completion.versions`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from agentrl.models.sampling import UNIFORM_BLOCK, row_uniforms, sample_next
from agentrl.models.static_decode import DecoderWeights, StaticDecoder, unsupported_reason
from agentrl.models.tiny import cache_kwarg, load_model, new_cache
from agentrl.rollout.engines.base import Completion, SamplingParams, row_seeds

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

COMPACT_FRACTION = 0.25
"""Drop finished rows from the batch once at least this fraction of it has finished."""


def check_params(params: SamplingParams) -> None:
    """Validate `params`.

    Raises:
        ValueError: naming the field, if temperature < 0, top_p not in (0, 1], max_tokens < 1
            or n < 1.
    """
    if params.temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {params.temperature}")
    if not 0.0 < params.top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {params.top_p}")
    if params.max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {params.max_tokens}")
    if params.n < 1:
        raise ValueError(f"n must be >= 1, got {params.n}")


def check_prompts(prompts: Any, vocab: int) -> None:
    """Each prompt of `prompts` (sequences of ids) is non-empty and its ids are in [0, vocab).

    Raises:
        ValueError: naming the first prompt (its index) that is empty or has an id outside.
    """
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise ValueError(f"prompt {i} is empty")
        if min(p) < 0 or max(p) >= vocab:
            raise ValueError(f"prompt {i} has a token id outside [0, {vocab})")


def record_stops(tokens: torch.Tensor, stop_ids: torch.Tensor, alive: torch.Tensor, rows: torch.Tensor,
                 out_len: torch.Tensor, stopped: torch.Tensor, t: int) -> int | None:
    """Mark the batch slots whose token `t` is a stop token as finished, in place.

    Args:
        tokens: (S,) long, the tokens just sampled, one per batch slot.
        stop_ids: (K,) long stop token ids (K may be 0: nothing stops).
        alive: (S,) bool, the slots still decoding; the stopped ones are cleared.
        rows: (S,) long, batch slot -> output row.
        out_len: (R,) long per output row; a stopped row's is set to `t + 1` (stop token kept).
        stopped: (R,) bool per output row; set for the stopped rows.
        t: the 0-based index of `tokens` in the completions.

    Returns:
        The number of slots still alive if any slot stopped now, else None (unchanged).
    """
    if not stop_ids.numel():
        return None
    hit = torch.isin(tokens, stop_ids) & alive
    if not bool(hit.any()):
        return None
    out_len[rows[hit]] = t + 1
    stopped[rows[hit]] = True
    alive &= ~hit
    return int(alive.sum())


def check_finite_logprobs(out_logprobs: torch.Tensor, out_len: torch.Tensor, engine: str) -> None:
    """Raise when a returned token's logprob is not finite (the weights have likely diverged).

    Args:
        out_logprobs: (R, max_new) float32 sampler logprobs per output row.
        out_len: (R,) long, the tokens each row returns (positions past it are ignored).
        engine: the engine's name for the message (e.g. "HFEngine").

    Raises:
        FloatingPointError: naming how many rows had a NaN or infinite logprob.
    """
    kept = torch.arange(out_logprobs.shape[1], device=out_logprobs.device)[None] < out_len[:, None]
    bad = (~torch.isfinite(out_logprobs) & kept).any(-1)
    if bool(bad.any()):
        raise FloatingPointError(
            f"{engine}.generate: the model gave non-finite logits (NaN or inf) in {int(bad.sum())} of "
            f"{out_logprobs.shape[0]} rows; its weights have likely diverged (check the learner's loss "
            "and grad norm)")


def check_materialised(model: Any) -> Any:
    """`model`, after checking that none of its parameters or buffers is on the meta device.

    Raises:
        ValueError: naming the first such tensor (a model built under `torch.device("meta")`
            and never loaded cannot sample; `.to(device)` would fail with "Cannot copy out of
            meta tensor").
    """
    for name, t in (*model.named_parameters(), *model.named_buffers()):
        if t.is_meta:
            raise ValueError(f"the engine's model has {name} on the meta device (built without weights, "
                             "never loaded): load its weights first")
    return model


class HFEngine:
    """Token-in, token-out sampling with a transformers causal LM (implements `Engine`).

    Args:
        model_or_path: a local Hugging Face model directory (loaded with
            `agentrl.models.tiny.load_model`) or a loaded `PreTrainedModel`. A passed model is used
            as is (not copied) and put in eval mode: give the engine its own instance when a
            learner trains another one in the same process.
        tokenizer: optional; loaded with the model when a path is given. The engine itself
            only needs ids (`pad_token_id` is used for padding when there is one).
        torch_threads: if given, `torch.set_num_threads(torch_threads)` (process-wide).
        device: torch device of the model and the sampling (the model is moved there).
        max_batch: most rows (prompts x n) in one batched forward; larger calls are chunked.
        dtype: parameter dtype when loading from a path (default float32).
        static_decode: run decode steps with `StaticDecoder` when the model supports it (see
            module doc; same tokens, about half the time per token for small models). False:
            always the transformers forward. `static_decode_reason` says why it is not used.
        compile: run each static decode step and its sampling as one `torch.compile` graph
            (`StaticDecoder.step_sample`; no effect without static decoding). The first
            `generate` compiles (tens of seconds); later steps take about 0.5-0.65x the eager time
            per token at batch 8 and 0.8-0.9x at batch 64 on the TRL benchmark's model.

    Attributes:
        policy_version: version of the loaded weights (0 until `update_weights`).
        weight_poll: None, or a function called at every token boundary of `generate` (in the
            generating thread) that may load new weights with `update_weights` and returns
            whether it did; the in-flight rows then resume with them (module doc).

    Raises:
        ValueError: a model with tensors on the meta device (`check_materialised`), bad
            `max_batch`.
    """

    def __init__(
        self,
        model_or_path: str | Path | PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase | None = None,
        *,
        torch_threads: int | None = None,
        device: str | torch.device = "cpu",
        max_batch: int = 128,
        dtype: torch.dtype | None = None,
        static_decode: bool = True,
        compile: bool = False,
    ) -> None:
        if torch_threads is not None:
            torch.set_num_threads(torch_threads)
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if isinstance(model_or_path, (str, Path)):
            model, loaded_tok = load_model(model_or_path, dtype=dtype)
            tokenizer = tokenizer if tokenizer is not None else loaded_tok
        else:
            model = model_or_path
        self.device = torch.device(device)
        self._model = cast(Any, check_materialised(model)).to(self.device).eval()
        self._tokenizer = tokenizer
        self.max_batch = max_batch
        self.policy_version = 0
        params = inspect.signature(self._model.forward).parameters
        self._cache_kw = cache_kwarg(self._model)
        self._has_logits_to_keep = "logits_to_keep" in params
        self._vocab = self._model.get_input_embeddings().weight.shape[0]
        pad = getattr(tokenizer, "pad_token_id", None) if tokenizer is not None else None
        self._pad_id = int(pad) if pad is not None else 0
        self.static_decode = static_decode
        self.compile = compile
        self._decoder_weights: DecoderWeights | None = None
        self.weight_poll: Callable[[], bool] | None = None

    @property
    def model(self) -> PreTrainedModel:
        """The wrapped transformers model."""
        return self._model

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase | None:
        """The tokenizer given or loaded with the model (None if neither)."""
        return self._tokenizer

    @property
    def static_decode_reason(self) -> str | None:
        """None when decode steps run on `StaticDecoder`, else why not (the option is off, or
        what about the model is unsupported)."""
        if not self.static_decode:
            return "static_decode=False"
        return unsupported_reason(self._model)

    def compile_note(self) -> str:
        """One line on what `compile=True` does for this engine ("" when it is off): that the
        decode step compiles at the first `generate`, or why compiling has no effect."""
        if not self.compile:
            return ""
        why = self.static_decode_reason
        if why is not None:
            return f"rollout.compile has no effect: no static decoder ({why})"
        return ("the engine's decode step and sampler are compiled at the first generate "
                "(torch.compile; 30 s to 1 min on 2 cores, then faster tokens)")

    # -- public API ---------------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        """Sample `params.n` completions per prompt.

        Args:
            prompts: token ids, each non-empty and within the model's vocabulary.
            params: sampling settings (`SamplingParams`).

        Returns:
            `len(prompts) * params.n` completions, prompt-major (prompt 0's n first). Each has
            its sampled ids (stop token included), their sampler logprobs (see module doc) and
            finish reason "stop" or "length". With a `seed`, a completion depends only on
            its prompt, the occurrence of that prompt in the call, `params` and `seed`, not on
            the other prompts (up to float32 rounding, see module doc).

        Raises:
            ValueError: bad params (`check_params`), an empty prompt, or an id outside the
                vocabulary.
            FloatingPointError: the model gave non-finite logits (NaN or inf) for a returned
                token (diverged weights).
        """
        check_params(params)
        check_prompts(prompts, self._vocab)
        if not prompts:
            return []
        if params.seed is None:  # not reproducible: seeds from torch's global generator
            seeds = torch.randint(-(1 << 63), (1 << 63) - 1, (len(prompts) * params.n,), dtype=torch.int64)
        else:
            seeds = torch.tensor(row_seeds(prompts, params.n, params.seed, params.seed_offsets), dtype=torch.int64)
        seeds = seeds.to(self.device)
        # Output row r = i * n + j samples prompt i. Identical prompts share one prefill: rows
        # point at a distinct prompt, and rows are batched shortest prompt first, copies together.
        distinct: dict[tuple[int, ...], int] = {}
        row_src = [distinct.setdefault(tuple(p), len(distinct)) for p in prompts for _ in range(params.n)]
        uniq = list(distinct)
        rows = sorted(range(len(row_src)), key=lambda r: (len(uniq[row_src[r]]), row_src[r]))
        results: list[Completion] = [None] * len(rows)  # type: ignore[list-item]
        with torch.inference_mode():
            for start in range(0, len(rows), self.max_batch):
                chunk = rows[start : start + self.max_batch]
                local: dict[int, int] = {}
                src = [local.setdefault(row_src[r], len(local)) for r in chunk]
                done = self._generate_chunk([list(uniq[u]) for u in local], src, params,
                                            seeds[torch.tensor(chunk, device=self.device)])
                for r, completion in zip(chunk, done, strict=True):
                    results[r] = completion
        return results

    def update_weights(self, state_dict: dict[str, Any], version: int) -> None:
        """Copy `state_dict` (parameter name -> tensor, any device/dtype) into the model and
        set `policy_version = version`.

        A key may be missing only when its tensor is tied to one that is given (e.g.
        `lm_head.weight` with tied embeddings). Everything is checked before anything is
        copied, so a bad state dict leaves the weights and version unchanged. The copies go
        straight into the model's tensors (`Tensor.copy_`, converting dtype and device), the
        same result as `load_state_dict(strict=False)` at about half the cost.

        Raises:
            KeyError: naming unexpected keys, or missing keys that are not tied to given ones.
            ValueError: naming a key whose shape differs from the model's.
        """
        own = self._model.state_dict()
        unexpected = sorted(set(state_dict) - set(own))
        if unexpected:
            raise KeyError(f"unexpected keys in state_dict: {unexpected[:8]}")
        given = {own[k].data_ptr() for k in state_dict}
        missing = sorted(k for k in own if k not in state_dict and own[k].data_ptr() not in given)
        if missing:
            raise KeyError(f"state_dict is missing keys: {missing[:8]}")
        for k, v in state_dict.items():
            if tuple(v.shape) != tuple(own[k].shape):
                raise ValueError(f"{k}: shape {tuple(v.shape)} != model's {tuple(own[k].shape)}")
        with torch.no_grad():  # `own` shares the model's storage: plain copies (no load hooks)
            for k, v in state_dict.items():
                own[k].copy_(v)
        self._decoder_weights = None  # the fused copies are rebuilt from the new weights
        self.policy_version = int(version)

    # -- internals ----------------------------------------------------------------------------
    def _new_cache(self) -> Any:
        return new_cache(self._model)

    def _forward(
        self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, cache: Any
    ) -> torch.Tensor:
        """One forward with the cache; returns float32 logits of the last position, (B, V)."""
        kwargs: dict[str, Any] = {self._cache_kw: cache}
        if self._has_logits_to_keep:
            kwargs["logits_to_keep"] = 1
        out = self._model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **kwargs)
        return out.logits[:, -1, :].float()

    def _decoder(self) -> DecoderWeights | None:
        """The `DecoderWeights` of the current weights (rebuilt when they changed), or None
        when static decoding is off or the model is unsupported."""
        if self.static_decode_reason is not None:
            self._decoder_weights = None
            return None
        if self._decoder_weights is None or self._decoder_weights.stale():
            self._decoder_weights = None  # free the old copies before making new ones
            self._decoder_weights = DecoderWeights(self._model)
        return self._decoder_weights

    def _generate_chunk(
        self,
        prompts: list[list[int]],
        src: list[int],
        params: SamplingParams,
        seeds: torch.Tensor,
    ) -> list[Completion]:
        """Sample one completion per row, row k continuing `prompts[src[k]]` with seed
        `seeds[k]` ((rows,) int64); returns the completions in row order, each token's policy
        version in `versions`. When `weight_poll` loads new weights at a token boundary, the
        unfinished rows resume from their prefix with them (module doc)."""
        toks: list[list[int]] = [[] for _ in src]
        lps: list[list[float]] = [[] for _ in src]
        vers: list[list[int]] = [[] for _ in src]
        reasons = ["length"] * len(src)
        rows, step0 = list(range(len(src))), 0  # rows of this round -> rows of the chunk
        cur_prompts, cur_src, cur_seeds = prompts, src, seeds
        while True:
            version = self.policy_version
            sub = replace(params, max_tokens=params.max_tokens - step0)
            out_t, out_lp, out_len, stopped, cut = self._decode(cur_prompts, cur_src, sub, cur_seeds, step0)
            again = []
            for k, (t_k, lp_k, n, stop) in enumerate(zip(out_t.tolist(), out_lp.tolist(), out_len.tolist(),
                                                         stopped.tolist())):
                r = rows[k]
                toks[r] += t_k[:n]
                lps[r] += lp_k[:n]
                vers[r] += [version] * n
                if stop:
                    reasons[r] = "stop"
                elif cut is not None:
                    again.append(r)
            if not again:
                break
            step0 += cast(int, cut)  # resume the interrupted rows from their prefix
            distinct: dict[tuple[int, ...], int] = {}
            cur_src = [distinct.setdefault((*prompts[src[r]], *toks[r]), len(distinct)) for r in again]
            cur_prompts = [list(p) for p in distinct]
            cur_seeds = seeds[torch.tensor(again, device=self.device)]
            rows = again
        return [Completion(token_ids=toks[r], logprobs=lps[r], finish_reason=reasons[r], versions=vers[r])
                for r in range(len(src))]

    def _decode(self, prompts: list[list[int]], src: list[int], params: SamplingParams, seeds: torch.Tensor,
                step0: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int | None]:
        """Prefill the distinct `prompts` once, then sample up to `params.max_tokens` tokens per
        row, row k continuing `prompts[src[k]]` with seed `seeds[k]` ((rows,) int64) and the
        uniforms of decode steps `step0, step0 + 1, ...`.

        Returns:
            (rows, max_new) sampled ids and sampler logprobs, (rows,) lengths, (rows,) bool
            stopped by a stop token, and `cut`: None, or the tokens every unfinished row holds
            when `weight_poll` loaded new weights (those rows' lengths are `cut`).
        """
        dev, max_new = self.device, params.max_tokens
        poll, cut = self.weight_poll, None
        width, logits, mask, next_pos, cache, dec = self._prefill(prompts, src, max_new)
        n_rows = len(src)
        out_tokens = torch.zeros((n_rows, max_new), dtype=torch.long, device=dev)
        out_logprobs = torch.zeros((n_rows, max_new), dtype=torch.float32, device=dev)
        out_len = torch.full((n_rows,), max_new, dtype=torch.long, device=dev)
        stopped = torch.zeros(n_rows, dtype=torch.bool, device=dev)
        stop_ids = torch.tensor(sorted(set(params.stop_token_ids)), dtype=torch.long, device=dev)
        rows = torch.arange(n_rows, device=dev)  # batch slot -> output row
        every_row = True  # rows is still 0..n_rows-1: plain column views instead of indexing
        alive = torch.ones(n_rows, dtype=torch.bool, device=dev)  # per batch slot
        n_alive = n_rows

        block: torch.Tensor | None = None

        def draws(t: int) -> torch.Tensor | None:
            """(rows in the batch,) uniforms of decode step t. Each row's draw is a function of
            its own seed and t only (module doc); they are hashed for UNIFORM_BLOCK steps of
            every row of the chunk at once."""
            nonlocal block
            if params.temperature == 0:
                return None
            if t % UNIFORM_BLOCK == 0:
                steps = torch.arange(step0 + t, step0 + min(t + UNIFORM_BLOCK, max_new), device=dev)
                block = row_uniforms(seeds[None, :], steps[:, None])  # (steps, n_rows)
            # A fresh tensor (stride 1, offset 0) either way: a compiled step guards on the
            # strides and storage offset of its inputs, a one-row batch's too.
            step_draws = cast(torch.Tensor, block)[t % UNIFORM_BLOCK]
            return step_draws.clone() if every_row else step_draws[rows]

        sampled = sample_next(logits, params.temperature, params.top_p, draws(0))
        for t in range(max_new):
            tokens, logprobs = sampled
            if every_row:
                out_tokens[:, t] = tokens
                out_logprobs[:, t] = logprobs
            else:
                out_tokens[rows, t] = tokens
                out_logprobs[rows, t] = logprobs
            left = record_stops(tokens, stop_ids, alive, rows, out_len, stopped, t)
            n_alive = n_alive if left is None else left
            if n_alive == 0 or t == max_new - 1:
                break
            if poll is not None and poll():  # new weights: the unfinished rows resume with them
                cut = t + 1
                break
            # (Compiled: never down to one row, where torch.compile would build another graph.)
            if len(rows) - n_alive >= max(1, int(COMPACT_FRACTION * len(rows))) and not (
                    self.compile and dec is not None and n_alive < 2):
                keep = alive.nonzero().squeeze(-1)
                if dec is not None:
                    dec.select(keep)
                else:
                    cache.batch_select_indices(keep)
                rows, alive, mask, next_pos = rows[keep], alive[keep], mask[keep], next_pos[keep]
                tokens, every_row = tokens[keep], False
            if dec is not None:  # step and sample in one call (one compiled graph with `compile`)
                sampled = dec.step_sample(tokens, next_pos, width + t, params.temperature, params.top_p,
                                          draws(t + 1), compiled=self.compile)
            else:
                mask[:, width + t] = 1
                logits = self._forward(tokens[:, None], mask[:, : width + t + 1], next_pos[:, None], cache)
                sampled = sample_next(logits, params.temperature, params.top_p, draws(t + 1))
            next_pos = next_pos + 1

        if cut is not None:
            out_len = torch.where(stopped, out_len, cut)
        check_finite_logprobs(out_logprobs, out_len, "HFEngine")
        return out_tokens, out_logprobs, out_len, stopped, cut

    def _prefill(self, prompts: list[list[int]], src: list[int], max_new: int
                 ) -> tuple[int, torch.Tensor, torch.Tensor, torch.Tensor, Any, StaticDecoder | None]:
        """One forward of the distinct `prompts` (left-padded to `width` columns), expanded to
        the rows (row k continues `prompts[src[k]]`). Returns `width`, the last logits (rows,
        V), the attention mask (rows, width + max_new) with room for every new token, each
        row's next position id (rows,), and the KV cache: the HF cache, or None with the static
        decoder (`dec`) holding it when the model has one and `max_new > 1`."""
        dev = self.device
        lengths = torch.tensor([len(p) for p in prompts], device=dev)
        width = int(lengths.max())
        # Left-padded ids; the mask gets room for every new token up front (sliced per step).
        ids = torch.full((len(prompts), width), self._pad_id, dtype=torch.long, device=dev)
        mask = torch.zeros((len(prompts), width + max_new), dtype=torch.long, device=dev)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p) :] = 1
        pos = (mask[:, :width].cumsum(-1) - 1).clamp(min=0)
        cache = self._new_cache()
        logits = self._forward(ids, mask[:, :width], pos, cache)
        next_pos = lengths  # position id of each row's next token, (rows,)
        expand = torch.tensor(src, dtype=torch.long, device=dev)
        weights = self._decoder() if max_new > 1 else None
        dec = None
        if weights is not None:  # the cache moves into the decoder's preallocated buffers
            dec = StaticDecoder(weights, cache, mask[:, :width], expand, width + max_new)
            cache = None
            logits, mask, next_pos = logits[expand], mask[expand], next_pos[expand]
        elif src != list(range(len(prompts))):
            cache.batch_select_indices(expand)
            logits, mask, next_pos = logits[expand], mask[expand], next_pos[expand]
        return width, logits, mask, next_pos, cache, dec

