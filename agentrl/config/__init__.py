"""Typed configuration: defaults here, YAML files in `configs/` override them, and dotted
`key=value` pairs on the command line override both.

Every field has a docstring (it is the config reference, see `agentrl config`). Unknown keys,
wrong types and unsupported values fail at start-up with the key and the allowed values.
This module imports no torch, so the CLI parses and validates before the heavy imports.
Here: the schema (one pydantic class per section, `Config` with the checks across sections) and
`load_config`; reading the YAML file and the overrides into a dict, and the error lines, are
`agentrl.config.overrides`'.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from agentrl.algos.configs import (
    SECTION,
    AlgoBase,
    AlgoConfig,
    DistillConfig,
    GRPOConfig,
    saved_algo_keys,
)
from agentrl.config.overrides import (  # re-exported: callers import them from here
    ConfigError,
    _merge,
    _set_dotted,  # noqa: F401 (agentrl.cli, agentrl.startup)
    format_error,
    gather,
)


class _Section(BaseModel):
    model_config = SECTION


class EnvConfig(_Section):
    """Section `env`: which environment, its kwargs, turn limit and reward wrappers."""

    name: str = "code_sandbox"
    """Env to train on: a short name (`agentrl envs`), a Gymnasium id, or `pkg.module:Class`."""
    imports: list[str] = Field(default_factory=list)
    """Python modules imported before the env is looked up, in every process of the run (Ray workers included), so that their `register_env` calls run: `--import my_envs` (repeatable). Installed packages can instead declare an entry point in the group `agentrl.envs`."""
    max_turns: int | None = Field(default=None, ge=1)
    """Extra limit on agent turns per episode (the registered limit still applies; the smaller wins).
    An env whose constructor takes `max_turns` (code_sandbox: attempts) also gets it, unless
    `env.kwargs.max_turns` is set."""
    dataset: str | None = None
    """Task source for envs that take one (code_sandbox: a HumanEval/MBPP/EvalPlus file or `humaneval`)."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Extra keyword arguments for the env's constructor."""
    wrappers: list[str] = Field(default_factory=list)
    """Reward wrappers stacked on the env, innermost first: judge, classifier, safety, curiosity."""
    wrapper_kwargs: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Per-wrapper options, e.g. `{judge: {url: ...}, safety: {method: lagrangian}, curiosity: {coef: 0.1}}`."""
    step_timeout_s: float | None = Field(default=60.0, gt=0)
    """Most seconds one `env.step` may run (null: no limit). A step over it ends its episode as a failed step (reward 0 as for an env that raised, `info["error"]`, counted in `env/timeouts`); the other episodes go on, and the env instance is replaced by a fresh one (the stuck call is left on its own thread, never reused)."""
    reset_timeout_s: float | None = Field(default=60.0, gt=0)
    """Most seconds one `env.reset` may run (null: no limit); a reset over it gives an empty, recorded episode (as a reset that raised), counted in `env/timeouts`, and a fresh env instance."""


class ModelConfig(_Section):
    """Section `model`: the policy (a local model directory or the embedded tiny default)."""

    path: str | None = None
    """Local Hugging Face model directory, a checkpoint `OUT/checkpoints/step_N`, or a training run's folder `OUT` (its newest intact checkpoint, named on the `[run]` line and recorded here in OUT/config.json; one with LoRA adapters is refused: `agentrl merge` it). None: build the embedded tiny default (see `tiny`)."""
    vision: bool = False
    """Embedded default (no `path`): build a tiny vision-language model (Qwen2-VL: the text sizes below, a vision tower of `model.vision_depth` blocks of width `model.vision_width`, a PIL image processor) in OUT/base_vlm instead of the text model, for envs whose observations carry images (docs/multimodal.md). Runs in-process or on Ray rollout workers, on the hf engine or vLLM; with images LoRA, PPO's value head, a reference worker and learner ranks are refused at start-up. When not set: true for an env whose observations carry images (its class sets `observes_images`: `visual_count`) and no `model.path`, else false (`agentrl.run`; `agentrl config` prints the resolved value)."""
    hidden_size: int = Field(default=128, ge=8)
    """Embedded default: hidden size of the tiny Qwen2 model."""
    num_layers: int = Field(default=4, ge=1)
    """Embedded default: number of transformer layers."""
    num_heads: int = Field(default=4, ge=1)
    """Embedded default: attention heads."""
    intermediate_size: int = Field(default=384, ge=8)
    """Embedded default: MLP width."""
    vocab_size: int = Field(default=1024, ge=300)
    """Embedded default: byte-level BPE vocabulary size trained offline on the env's corpus."""
    init_std: float | None = Field(default=None, gt=0, le=1.0)
    """Embedded default: standard deviation of the normal initialisation of its weight matrices and embeddings (transformers' `initializer_range`, in the text config and, with `model.vision`, the vision tower's). None: the architecture's 0.02. When not set: 0.1 for the embedded vision-language model (`agentrl.run.VISION_DEFAULTS`; at 0.02 it sits on `visual_count`'s answer prior, image-blind, for hundreds of warm-start steps: docs/multimodal.md), the architecture's 0.02 for the text model."""
    vision_width: int = Field(default=32, ge=4)
    """Embedded default with `model.vision`: width (embedding size) of the vision tower's blocks; must be divisible by `model.vision_heads`."""
    vision_depth: int = Field(default=2, ge=1)
    """Embedded default with `model.vision`: number of vision-tower blocks."""
    vision_heads: int = Field(default=2, ge=1)
    """Embedded default with `model.vision`: attention heads of the vision tower."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Parameter dtype of the rollout engine's weights (in-process HF engine, Ray workers, vLLM): `bfloat16` halves their memory and the sampler's logprobs then differ from the learner's by bf16 rounding (`loss/logp_mismatch` shows it, `algo.tis_cap` corrects for it). The learner keeps float32 master weights whatever this says (its compute precision is `train.precision`); the pushed weights are cast on load."""
    lora_r: int = Field(default=0, ge=0)
    """LoRA rank (0: off, train all weights). >0 trains PEFT LoRA adapters only (`agentrl[lora]`); the KL reference is then the base model with adapters disabled."""
    lora_alpha: int = Field(default=16, ge=1)
    """LoRA scaling numerator: the update is `(lora_alpha / lora_r) * B @ A`."""
    lora_target_modules: str | list[str] = "all-linear"
    """Modules that get adapters: a list of names (e.g. `[q_proj, v_proj]`) or `all-linear` (every linear layer but the output head)."""

    @model_validator(mode="after")
    def _vision_heads_divide_width(self) -> ModelConfig:
        if self.vision_width % self.vision_heads or (self.vision_width // self.vision_heads) % 4:
            raise ValueError(f"model.vision_width {self.vision_width} / model.vision_heads {self.vision_heads} "
                             "must be a whole head dimension divisible by 4 (the vision tower's 2-D rotary "
                             "embedding), e.g. vision_width=64 vision_heads=2")
        return self

    @field_validator("lora_r")
    @classmethod
    def _peft_installed(cls, v: int) -> int:
        import importlib.util

        if v > 0 and importlib.util.find_spec("peft") is None:
            raise ValueError("LoRA needs peft: pip install 'agentrl[lora]' (or set model.lora_r=0)")
        return v


class RolloutConfig(_Section):
    """Section `rollout`: sampling, the engine, rollout workers and the async pipeline."""

    engine: Literal["hf", "vllm"] = "hf"
    """Inference engine: `hf` (transformers, CPU default) or `vllm` (needs `agentrl[vllm]`)."""
    num_workers: int = Field(default=0, ge=0)
    """Ray rollout workers; 0 runs rollouts in-process (debuggable, the CPU default)."""
    tasks_per_step: int = Field(default=16, ge=1)
    """Distinct tasks per training step (each run `algo.group_size` times)."""
    temperature: float = Field(default=1.0, ge=0.0)
    """Sampling temperature (tokens); the learner scales logits by the same value."""
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    """Nucleus sampling mass."""
    max_tokens: int = Field(default=96, ge=1)
    """Most tokens the agent may sample per turn."""
    max_episode_tokens: int = Field(default=1024, ge=16)
    """Most tokens in a whole episode (prompt included); exceeding it truncates the episode. `agentrl train` warns at start-up (`[warning] env ...: the opening prompt ...`) when the env's opening prompt, rendered with the policy's tokenizer, leaves the first turn less than `rollout.max_tokens`."""
    env_threads: int = Field(default=4, ge=1)
    """Threads stepping envs concurrently (sandbox runs, HTTP calls)."""
    torch_threads: int = Field(default=1, ge=1)
    """torch threads of the engine process (on 2 cores keep engine + learner threads <= cores)."""
    ray_address: str | None = None
    """Ray cluster to join (`auto`, `host:6379`, `ray://host:10001`); None starts a local one."""
    worker_cpus: float = Field(default=1.0, gt=0)
    """CPUs Ray reserves per rollout worker."""
    worker_gpus: float = Field(default=0.0, ge=0)
    """GPUs per rollout worker (a fraction shares a GPU)."""
    max_restarts: int = Field(default=3, ge=0)
    """Times Ray restarts a dead rollout worker (its in-flight episodes are re-run)."""
    tool_parser: Literal["auto", "hermes", "llama3_json", "mistral", "openai"] = "auto"
    """Tool-call format the env's tools parse (given to an env whose constructor takes `parser`, e.g. web_qa, unless `env.kwargs.parser` is set): `hermes` (`<tool_call>{json}</tool_call>`: Qwen2.5/3, Hermes), `llama3_json` (`{"name": ..., "parameters": ...}` as the whole message or after `<|python_tag|>`: Llama-3.1/3.2), `mistral` (`[TOOL_CALLS] [{"name": ..., "arguments": ...}]`), `openai` (`{"tool_calls": [...]}`), or `auto`: picked from the policy's tokenizer (`<tool_call>` -> hermes, `[TOOL_CALLS]` -> mistral, `<|python_tag|>` or `<|eot_id|>` with an ipython role -> llama3_json, else hermes), printed as a `[tools]` start-up line (docs/tools.md). The embedded model is `hermes`."""
    vllm_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Extra `vllm.LLM` arguments for engine=vllm (max_model_len, enforce_eager, ...; the GPU memory share is `rollout.gpu_memory_utilization`)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Device of the hf engine's model and sampling (vLLM runs on its build's platform). `auto`: in this process the learner's choice (CPU with `train.device=cpu`, else CUDA when available); in a Ray rollout worker CUDA when it reserves GPUs (`rollout.worker_gpus > 0`), else CPU. `cuda` fails at start-up without a CUDA device, or for Ray workers that reserve no GPU (Ray hides the GPUs from them)."""
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    """vLLM on CUDA: the fraction of the GPU's memory vLLM claims (weights + KV cache). None: vLLM's 0.9 when it has a GPU of its own; when it shares the learner's GPU (the learner in this process on CUDA and the vLLM workers reserving GPUs), the computed share that leaves the learner 16 bytes per parameter (float32 weights, gradients, AdamW moments), 4 more for a reference model, and a margin for activations (`agentrl.infra.devices.engine_share`). Start-up prints the split and refuses one that cannot fit."""
    weight_bucket_mb: int = Field(default=512, ge=1)
    """vLLM: most megabytes per weight push message. A push sends the state dict cast to the engine's dtype in buckets of whole decoder layers up to this size (a layer larger than it goes alone), so no message nears msgpack's 4 GiB limit in vLLM's multiprocess engine."""
    compile: bool = False
    """HF engine: run each decode step and its sampling as one torch.compile graph (inductor with its C++ wrapper; float32 Qwen2/Llama, the static decoder's models): 30 s to 1 min of compiling at the first generate (a `[compile]` line says so, or why it has no effect), then about 0.5-0.65x the eager time per token at batch 8 and 0.8-0.9x at batch 64 on the TRL benchmark's model (`benchmarks/decode_step.py --compile`). Same tokens up to float32 rounding. Falls back to eager with a warning if compiling fails."""
    mode: Literal["sync", "async"] = "sync"
    """`sync`: sample then train (on-policy); `async`: actor threads (`batches_in_flight`) sample ahead with bounded staleness (`train.max_staleness`); stale batches are treated as on-policy unless `algo.tis_cap` is set (the main job's async reached sync's accuracy sooner only with `rollout.partial=true algo.tis_cap=2`: docs/scale_out.md)."""
    sync_every: int = Field(default=1, ge=1)
    """Async: push the learner's weights to the actor every N learner steps."""
    queue_size: int = Field(default=2, ge=1)
    """Async: backpressure: at most `queue_size + batches_in_flight` batches ahead of the learner."""
    batches_in_flight: int = Field(default=2, ge=1)
    """Async: batches sampling at once (needs `train.max_staleness >= 2` for 2 during updates)."""
    partial: bool = False
    """Async, text models, `engine=hf` in this process or on Ray rollout workers (`num_workers > 0`), or `engine=vllm` in this process (`num_workers=0`): partial rollouts. A weight push lands at the engine's next token boundary instead of between generate calls: in-flight rows stop after the token just sampled, the new weights are loaded, and they resume from the same prefix, re-prefilled (vLLM: running requests are aborted at the push and resubmitted from their prefix; a seeded sampled row resumes with a seed derived from its seed and its token count). A Ray worker gets each push at once, stages it (the newest wins) and loads it at its next token boundary, or at once when it is not generating (`agentrl/rollout/worker_weights.py`). Each token records the version that sampled it, staleness is measured per token (`rollout/staleness_tokens_mean`/`_max`) and `train.max_staleness` bounds a trajectory's oldest token (docs/design.md)."""
    history: Literal["exact", "template"] = "exact"
    """How a multi-turn episode's context is built. `exact`: the policy samples each turn from exactly the ids it sampled before plus the chat template's rendering of each observation (token-exact: what it trains on is what it saw; a template that renders history differently, e.g. Qwen3 or R1-distill dropping earlier `<think>` blocks, gets a `[template]` line at start-up saying so). `template`: each turn is sampled from the template's rendering of the messages so far (what the model sees at inference) and trained as its own sample (that prompt + that turn's ids), all turns sharing the episode's return and group (docs/models.md); text-only policies."""
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Extra variables for the chat template, e.g. `{"enable_thinking": false}` for Qwen3 (no thinking: the generation prompt carries an empty think block)."""
    branch: int = Field(default=1, ge=1)
    """Tree rollouts for multi-turn groups (a turn limit > 1: `env.max_turns`, else `env.kwargs.max_turns` or the limit the env is registered with, e.g. web_qa's 8): each group's `algo.group_size` episodes are `group_size / branch` first turns, each continued by `branch` episodes (the same sampled first-turn tokens and logprobs, then sampled apart; `EpisodeSpec.trunk`). The continuations of one first attempt see the same feedback, so with GiGPO's step-level credit (`algo.turn_credit=gigpo`) their second turns form one anchor group: a repair is compared with the other repairs of the same attempt (tree rollouts as in TreeRL, Hou et al. 2025, and ARPO, Dong et al. 2025, which branch after tool feedback). A shared first turn is trained once per episode that holds it, m = `branch` times: its gradient is m times that of one copy carrying the mean of its continuations' advantages, the weight of the m first turns it stands for. Training rollouts only: the warm start's pass-rate checks and every evaluation sample each episode apart. On the code-repair job: docs/learning.md ("Tree rollouts"). 1: every episode samples its own first turn. Must divide `algo.group_size`; text models; not with `--agent` (the user's agent runs its own turns)."""
    colocate: bool = False
    """Colocated GPU mode (vLLM and the learner on the same GPUs, vLLM asleep while the learner trains and woken with the new weights for rollout): not built yet, so `true` is refused at start-up. Without CUDA there is nothing to share (and vLLM's CPU build has no sleep mode); with CUDA the engine's `sleep`/`wake_up` exist (`VLLMEngine`) but the loop that drives them is not written (docs/scale_out.md). Today: separate GPUs for the learner and `rollout.worker_gpus`."""

    @model_validator(mode="after")
    def _one_memory_share(self) -> RolloutConfig:
        if self.gpu_memory_utilization is not None and "gpu_memory_utilization" in self.vllm_kwargs:
            raise ValueError("rollout.gpu_memory_utilization and rollout.vllm_kwargs.gpu_memory_utilization are "
                             "both set: keep rollout.gpu_memory_utilization only")
        if self.device == "cuda" and self.num_workers > 0 and self.worker_gpus == 0 and self.engine == "hf":
            raise ValueError("rollout.device=cuda with rollout.num_workers > 0 needs rollout.worker_gpus > 0 "
                             "(Ray hides the GPUs from a worker that reserves none)")
        if self.partial and (self.mode != "async" or self.engine not in ("hf", "vllm")
                             or (self.engine == "vllm" and self.num_workers > 0)):
            raise ValueError("rollout.partial=true needs rollout.mode=async with rollout.engine=hf (in this "
                             "process or on Ray workers) or rollout.engine=vllm with rollout.num_workers=0; "
                             f"got mode={self.mode}, engine={self.engine}, num_workers={self.num_workers}")
        return self

    @field_validator("colocate")
    @classmethod
    def _colocate_not_built(cls, v: bool) -> bool:
        if v:
            import torch

            where = ("this machine has no CUDA device (torch.cuda.is_available() is False), so there is "
                     "no GPU to share, and vLLM's CPU build has no sleep mode" if not torch.cuda.is_available()
                     else "the colocated loop (vLLM sleeps during the update, wakes with the new weights) "
                          "is not built yet")
            raise ValueError(f"rollout.colocate=true: {where}; use rollout.colocate=false (the learner and "
                             "the rollout engines on their own devices: rollout.worker_gpus, train.learner_gpus)")
        return v


class TrainConfig(_Section):
    """Section `train`: steps, optimizer, staleness bound, evaluation and checkpoints."""

    steps: int = Field(default=360, ge=0)
    """Training steps (each: rollout -> advantages -> updates)."""
    lr: float = Field(default=3e-4, gt=0)
    """AdamW learning rate. When not set and the policy is the embedded vision-language model (`model.vision`, given or resolved): 3e-5 (`agentrl.run.VISION_DEFAULTS`; at 3e-4 and 1e-4 GRPO undid much of what the warm start had learnt to read on `visual_count`, docs/multimodal.md)."""
    lr_warmup_steps: int = Field(default=0, ge=0)
    """Optimizer steps of linear learning-rate warm-up (from lr/(N+1) to lr)."""
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    """Learning rate after the warm-up: constant, or decaying (linearly, or on a half cosine) to `lr * lr_min_ratio` at the run's last optimizer step (`agentrl.learner.schedules.lr_multiplier`)."""
    lr_min_ratio: float = Field(default=0.0, ge=0.0, le=1.0)
    """Final learning rate of the decaying schedules, as a fraction of `lr`."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    grad_clip: float = Field(default=1.0, gt=0)
    """Max global gradient norm."""
    micro_batch_size: int = Field(default=16, ge=1)
    """Sequences per forward/backward; gradients accumulate to the full minibatch."""
    prefix_share: bool = True
    """Learner forward runs each group's shared prompt once and lm_head/log-softmax/entropy only at trained tokens (one fused function from the hidden states when the entropy needs no gradient; float32 Qwen2/Llama without LoRA run the decoder as plain torch ops, `agentrl/models/static_forward.py`). Same gradients to float32 rounding; PPO's value head keeps the plain forward. False: plain transformers forward."""
    skip_zero_advantage: bool = True
    """Leave rows whose advantages are all 0 (e.g. a GRPO group with equal rewards) out of the learner's forwards when the algorithm's loss gets nothing from them (GRPO/GSPO without KL in the loss or entropy bonus, RLOO, REINFORCE++ without entropy bonus); the loss is still normalised by every row's tokens, so the gradient is the same. Metrics from the forward (entropy, ratios, logp_mismatch) then cover the other rows; `loss/skipped_rows_frac` is logged (when every row of a minibatch is idle, its first row still runs for the metrics, so e.g. 7 of 8)."""
    compile: bool = False
    """Compile the learner's decoder forward with torch.compile (inductor, C++ kernels; float32 Qwen2/Llama without LoRA or value head, with `prefix_share`): 30 s to 2 min of compiling at the first update (a `[compile]` line says so, or why it has no effect), then 0.78x (8x8x64 batch) and 0.83x (2x4x32) the eager update time on the TRL benchmark's model (`benchmarks/learner_update.py --arms static,compiled`). `rollout.compile` does the same for the HF engine's decode step. Falls back to eager with a warning if compiling fails."""
    torch_threads: int = Field(default=1, ge=1)
    """torch threads of the learner process (of each learner rank with `learner_workers`)."""
    learner_workers: int = Field(default=0, ge=0)
    """0: the learner runs in the driver process (a breakpoint works). N >= 1: N learner ranks, each a Ray actor and one `torch.distributed` rank (gloo on CPU, NCCL on CUDA), the policy, value head and reference model sharded with FSDP2 (`fully_shard` per decoder layer, then the root), each rank training on its share of every minibatch with the loss normalised over the whole minibatch; same update as 0 to float32 rounding (docs/scale_out.md). Ranks run the plain transformers forward (no prompt sharing, static decoder or `compile`). Checkpoints are sharded (`torch.distributed.checkpoint`, DIR/dcp) plus a consolidated Hugging Face export, and resume with any number of ranks, 0 included."""
    learner_cpus: float = Field(default=1.0, gt=0)
    """CPUs reserved per learner rank (its Ray placement-group bundle)."""
    learner_gpus: float = Field(default=0.0, ge=0)
    """GPUs reserved per learner rank: 1 for ranks on CUDA (`train.device=cuda`, or `auto` with a GPU reserved: one whole GPU per rank, Ray's, set as the rank's device; 0, a fraction or more than 1 are refused at start-up), 0 for ranks on the CPU."""
    learner_timeout_s: float = Field(default=1800.0, gt=0)
    """Seconds a call to the learner ranks (set-up, an update, a save) may take before the run stops with an error naming the ranks that did not answer (a hung collective: a rank that died or stalls); also the process group's collective timeout. Raise it for updates that take longer."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the learner's policy, value head, reference model and update batches live: `auto` (CUDA when available, else CPU), `cpu`, or `cuda` (fails at start-up without a CUDA device). The in-process rollout engine keeps its own copy, on `rollout.device` (by default the learner's choice); the weights pushed to it are copied across."""
    precision: Literal["fp32", "bf16"] = "fp32"
    """Compute precision of the learner's forwards: `fp32`, or `bf16` (`torch.autocast` with bfloat16; the weights, gradients and AdamW state stay float32, and logprobs, values and the loss are computed in float32 from upcast logits). bf16 is for GPUs (bf16 tensor cores: faster matmuls, half the activation memory). On CPUs it works but is slow without bf16 instructions (AVX-512 BF16 / AMX): 6x the fp32 update time with `prefix_share` and 10x without on this project's AMD EPYC (AVX2; embedded model, 32 rows of about 200 tokens). Its logprobs differ from the fp32 sampler's by bf16 rounding (about 1e-3 nats on the tiny test model; `loss/logp_mismatch` shows it, `algo.tis_cap` corrects for it). The static float32 decoder (`prefix_share`'s fast path, and so `compile`) is then off (a `[learner]` line says so)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward (transformers' `gradient_checkpointing_enable`, non-reentrant) to save memory at about one extra forward's time: the same gradient. The prefix-shared forward then runs without sharing the prompt (transformers drops the cache)."""
    max_nonfinite_steps: int = Field(default=3, ge=1)
    """An optimizer step whose global gradient norm is NaN or infinite is skipped (weights, optimizer state and learning-rate schedule unchanged; counted as `loss/skipped_nonfinite` and logged); this many skipped steps in a row stop the run with an error naming the step."""
    max_nonfinite_reward_steps: int = Field(default=3, ge=0)
    """This many RL steps in a row whose episode rewards are all NaN or infinite (a dead reward source: an unreachable judge or reward model, a failing env) stop the run with an error naming the env, its reward settings and the first episode error, exit 2 (0: never stop; such steps train on nothing)."""
    save_every: int = Field(default=20, ge=0)
    """Checkpoint every N steps (0: only at the end, and on Ctrl-C / SIGTERM, which always save the last completed step). The default keeps a rolling checkpoint: about 10 MiB and 0.4-0.6 s per save (fsync and SHA-256 included) for the embedded model (weights and AdamW state; the reference adds its weights), 3x the weights in bytes in general; about 2% of the main job's wall time (docs/observability.md)."""
    keep_checkpoints: int = Field(default=2, ge=0)
    """Keep the newest N checkpoints of the run and delete older ones after each save (0: keep all). `--resume` falls back to an older one when the newest fails its manifest, so keep at least 2."""
    eval_every: int = Field(default=0, ge=0)
    """Evaluate on the held-out split every N steps (0: only before and after training)."""
    eval_tasks: int = Field(default=256, ge=1)
    """Held-out tasks of the evaluation before, during and after training: the first N of the env's fixed held-out list (`agentrl.eval.tasks.list_tasks`), the same tasks `agentrl eval` runs by default."""
    eval_samples: int = Field(default=4, ge=1)
    """Samples per held-out task (n of pass@k): the evaluation reports pass@1 and pass@n, each with its standard error over tasks."""
    eval_batch_size: int = Field(default=64, ge=1)
    """Episodes per generate call of the evaluation (the sampler's seeds are drawn per batch, so `agentrl eval` uses the same default to reproduce the figure exactly)."""
    max_staleness: int = Field(default=0, ge=0)
    """Drop trajectories sampled by a policy more than this many versions old."""
    log_rollouts_every: int = Field(default=5, ge=0)
    """Save the trajectories trained on to OUT/rollouts/step_N.jsonl every N steps and at the last step (0: never); `agentrl show` prints them."""


class SFTConfig(_Section):
    """Section `sft`: the supervised warm start before RL."""

    steps: int = Field(default=500, ge=0)
    """Most supervised warm-start steps on reference solutions of the training split (0: skip). When not set and the policy is the embedded vision-language model: 300 (`VISION_DEFAULTS`)."""
    stop_pass_rate: float | None = Field(default=0.2, ge=0.0, le=1.0)
    """End the warm start once pass@1 (rollout temperature) on training tasks reaches this, so RL starts with room to improve (None: no pass@1 condition; with `stop_pass_at_k` also None, every step runs). Checked every `check_every` steps. When not set and the policy is the embedded vision-language model: None, with `stop_pass_at_k` None too (`VISION_DEFAULTS`: on `visual_count` an image-blind model passes the checks on the answer prior, so they ended the warm start before the model read the board)."""
    check_every: int = Field(default=20, ge=1)
    """Warm-start steps between pass-rate checks."""
    min_steps: int = Field(default=150, ge=0)
    """Warm-start steps before the first pass-rate check."""
    stop_pass_at_k: float | None = Field(default=0.55, ge=0.0, le=1.0)
    """Also require pass@k (k = `check_samples`) on training tasks to reach this before ending the warm start: the share of tasks on which a group of samples finds a solution, which is what GRPO can reinforce (None: no such condition). None when not set and the policy is the embedded vision-language model (see `stop_pass_rate`)."""
    check_tasks: int = Field(default=64, ge=1)
    """Training tasks per pass-rate check."""
    check_samples: int = Field(default=4, ge=1)
    """Samples per task of a pass-rate check (the k of `stop_pass_at_k`)."""
    check_turns: int | None = Field(default=None, ge=1)
    """Turns per episode of the pass-rate checks: the checks' envs get `env.max_turns` = this (None: the run's `env.max_turns`). `1` on a multi-turn `code_sandbox` run (`configs/code_repair.yaml`) checks first attempts only, so the warm start stops on the single-turn job's first-attempt skill rather than on pass within all attempts (a repair-trained policy reaches the latter with a weaker first attempt, docs/learning.md). On an env where `max_turns` is a turn limit (not attempts), a smaller value cuts the checks' episodes short."""
    lr: float = Field(default=2e-3, gt=0)
    """Warm-start learning rate. When not set and the policy is the embedded vision-language model (`model.vision`, given or resolved): 5e-4 (`agentrl.run.VISION_DEFAULTS`; at 2e-3 it stayed image-blind on `visual_count`, docs/multimodal.md)."""
    batch_size: int = Field(default=32, ge=1)
    """Warm-start sequences per step."""
    repair_fraction: float = Field(default=0.5, ge=0.0, le=1.0)
    """Multi-turn runs only (`env.max_turns` > 1) on an env that offers reference repairs (code_sandbox): the share of warm-start examples that are repairs, i.e. a wrong attempt (the reference solution with one small mutation), the env's real feedback on it (a sandbox run, public tests only) and the fix as the target (`agentrl.sft.repair_example`, `envs/code_repair.py`), so that RL starts from a policy that sometimes repairs. Single-turn runs ignore it (their examples are unchanged)."""
    policy_repair_tasks: int = Field(default=0, ge=0)
    """Multi-turn runs only (`env.max_turns` > 1) on an env with reference solutions: a second warm-start phase after the first (also when `sft.steps` is 0, on the loaded `model.path`), on repair examples from the policy's *own* failed attempts: it runs one episode on each of this many training tasks, and every context in which it answered after failed feedback becomes an example with the task's reference as the target (`agentrl.sft_repairs`), mixed with as many first-phase examples, for `policy_repair_steps` steps. Conditioned on its own failures a repair turn did worse than a fresh attempt; this is the fix tried for it (docs/learning.md). 0: no second phase."""
    policy_repair_steps: int = Field(default=120, ge=1)
    """Steps of the second warm-start phase (`policy_repair_tasks`)."""
    mix_envs: dict[str, float] = Field(default_factory=dict)
    """Other envs whose reference answers join the warm start in one mixed stage, each with its number of examples relative to the run's own env (`{self_propose: 1.0}`: as many self_propose examples as `env.name` ones, shuffled together), e.g. to learn a second env's answer formats without forgetting the first. Each is made by name on its training split with its default kwargs (`env.kwargs`, `env.dataset` and the wrappers are the run's env's only); the stop checks stay on `env.name`; the embedded model's tokenizer also trains on their texts."""

    @field_validator("mix_envs")
    @classmethod
    def _positive_shares(cls, v: dict[str, float]) -> dict[str, float]:
        import math

        bad = {k: w for k, w in v.items() if not (math.isfinite(w) and w > 0)}
        if bad:
            raise ValueError(f"every share must be a finite number > 0, got {bad}")
        return v


class LogConfig(_Section):
    """Section `log`: TensorBoard and Weights & Biases."""

    tensorboard: bool = True
    """Write TensorBoard event files to OUT/tb (when `tensorboard` is installed)."""
    wandb: bool = False
    """Log to Weights & Biases (`agentrl[wandb]`; `WANDB_MODE=offline` logs without network)."""
    wandb_project: str = "agentrl"
    """W&B project name."""

    @field_validator("wandb")
    @classmethod
    def _wandb_installed(cls, v: bool) -> bool:
        import importlib.util

        if v and importlib.util.find_spec("wandb") is None:
            raise ValueError("wandb is not installed: pip install 'agentrl[wandb]' (or set log.wandb=false)")
        return v


def int8_unavailable() -> str | None:
    """Why this platform cannot run an int8 model (`agentrl.models.int8.quantize_int8`), or None
    when it can: torch must have `torch.ao.quantization.quantize_dynamic` (deprecated since torch
    2.10 in favour of `torchao`, still shipped by 2.13) and a quantized CPU kernel engine (fbgemm /
    x86 / onednn / qnnpack). The config checks this at start-up (`placement.*_dtype=int8`), so
    that a torch without it is refused then, naming the key, and not in the middle of a run.
    Imports torch, lazily: only when int8 is asked for (reading a config loads no torch)."""
    import torch

    try:
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic  # noqa: F401
    except ImportError as e:
        return (f"torch {torch.__version__} has no torch.ao.quantization.quantize_dynamic ({e}); "
                "int8 needs it (or a port to torchao, not built)")
    engines = set(torch.backends.quantized.supported_engines) - {"none"}
    if not engines & {"fbgemm", "x86", "onednn", "qnnpack"}:
        return f"torch {torch.__version__} has no quantized CPU kernels (engines: {sorted(engines) or 'none'})"
    return None


class PlacementConfig(_Section):
    """Section `placement`: where the reference, the distillation teacher and the reward models run (docs/scale_out.md)."""

    reference: Literal["inline", "worker"] = "inline"
    """`inline`: the KL reference is the learner's frozen copy of the policy, its logprobs computed in the step. `worker`: a Ray actor of its own holds the frozen reference (the run's starting weights, written to OUT/reference_model), prefill only, no graph, dropout off; its logprobs are started as soon as a batch is collated (in async mode as soon as it is sampled) and overlap the learner's own work. Same logprobs as inline in float32 (bit-equal on CPU, tested; stated tolerance 1e-6 nats)."""
    reference_cpus: float = Field(default=1.0, gt=0)
    """CPUs Ray reserves for the reference worker."""
    reference_gpus: float = Field(default=0.0, ge=0)
    """GPUs Ray reserves for the reference worker (> 0: it runs on CUDA)."""
    reference_dtype: Literal["float32", "bfloat16", "int8"] = "float32"
    """Parameter dtype of the reference worker: `float32`, `bfloat16`, or `int8` (CPU only: torch's dynamic int8 quantization of every Linear layer, per-channel weights, `agentrl.models.int8.quantize_int8`; refused at start-up where torch lacks it). Its logprobs then differ from float32 ones by the rounding; `ref/logp_gap_*` measures it (figures: docs/scale_out.md)."""
    teacher: Literal["inline", "worker"] = "inline"
    """distill: where the teacher (`algo.teacher_path`) runs. `inline`: a frozen copy in the driver process, on the learner's device, its logprobs computed in the step. `worker`: a Ray actor of its own (the reference worker's machinery: prefill only, no graph, dropout off, its own CPUs / GPUs and dtype), its logprobs started as soon as a batch is sampled and overlapping the rest of the step (`perf/teacher_*`). Same logprobs as inline in float32 (bit-equal on CPU, tested; stated tolerance 1e-6 nats). Other algorithms refuse `worker` at start-up."""
    teacher_cpus: float = Field(default=1.0, gt=0)
    """CPUs Ray reserves for the teacher worker."""
    teacher_gpus: float = Field(default=0.0, ge=0)
    """GPUs Ray reserves for the teacher worker (> 0: it runs on CUDA)."""
    teacher_dtype: Literal["float32", "bfloat16", "int8"] = "float32"
    """Parameter dtype of the teacher worker: `float32`, `bfloat16` (its logprobs then differ from float32 ones by the rounding; `teacher/logp_gap_*` measures it every `logp_gap_every` steps); or `int8` (CPU only, as for the reference)."""
    reward_model: Literal["inline", "worker"] = "inline"
    """`inline`: the classifier / safety reward model runs in the env wrappers of whichever process steps the envs. `worker`: on a Ray actor of its own (one per model path, shared by the driver's and every rollout worker's envs); needs a model path (`env.wrapper_kwargs.classifier.model` or `.safety.classifier`). The same scores as inline (tested)."""
    reward_model_cpus: float = Field(default=1.0, gt=0)
    """CPUs Ray reserves for the reward-model worker."""
    reward_model_gpus: float = Field(default=0.0, ge=0)
    """GPUs Ray reserves for the reward-model worker."""
    reward_model_dtype: Literal["float32", "bfloat16", "int8"] = "float32"
    """Parameter dtype of the reward-model worker: `float32`, `bfloat16`, or `int8` (CPU only, as for the reference)."""
    logp_gap_every: int = Field(default=10, ge=0)
    """With `reference_dtype` bfloat16 or int8 on a worker: every N steps log `ref/logp_gap_mean` and `ref/logp_gap_max`, |logp_dtype - logp_fp32| over a sample of the batch's agent tokens (the worker then keeps a float32 copy too). the same for a bf16 or int8 teacher worker as `teacher/logp_gap_*`. 0: never."""
    logp_gap_tokens: int = Field(default=256, ge=1)
    """Agent tokens (the batch's first, row by row) in each `ref/logp_gap` sample."""

    @field_validator("reference_dtype", "teacher_dtype", "reward_model_dtype")
    @classmethod
    def _int8_where_available(cls, v: str, info: Any) -> str:
        if v == "int8":
            why = int8_unavailable()
            if why is not None:
                raise ValueError(f"placement.{info.field_name}=int8: {why}; use float32 or bfloat16")
        return v

    @model_validator(mode="after")
    def _dtype_of_a_worker(self) -> PlacementConfig:
        for role in ("reference", "teacher", "reward_model"):
            dtype = getattr(self, f"{role}_dtype")
            if dtype != "float32" and getattr(self, role) != "worker":
                raise ValueError(f"placement.{role}_dtype={dtype} applies to a worker only: set "
                                 f"placement.{role}=worker (inline, the reference runs in the learner's "
                                 "train.precision and the reward model in float32)")
            if dtype == "int8" and getattr(self, f"{role}_gpus") > 0:
                raise ValueError(f"placement.{role}_dtype=int8 runs on the CPU only (torch's dynamic int8 "
                                 f"kernels); set placement.{role}_gpus=0 or use bfloat16 on a GPU")
        return self


class Config(_Section):
    env: EnvConfig = Field(default_factory=EnvConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    algo: AlgoConfig = Field(default_factory=GRPOConfig)
    """The algorithm and its keys: a union on `algo.name` (`agentrl.algos.configs`)."""
    train: TrainConfig = Field(default_factory=TrainConfig)
    sft: SFTConfig = Field(default_factory=SFTConfig)
    log: LogConfig = Field(default_factory=LogConfig)
    placement: PlacementConfig = Field(default_factory=PlacementConfig)
    seed: int = Field(0, ge=0)
    """Seed of tasks, sampling, and initialisation (>= 0)."""
    out: str = "runs/latest"
    """Output directory (metrics.jsonl, checkpoints/, rollouts/)."""
    resume: str | None = None
    """Resume from this output directory's newest intact checkpoint (an error when it has none)."""
    overwrite: bool = False
    """A new run into an `out` that is not empty refuses to start unless this is set; then the earlier run's files (and only agentrl's: config.json, metrics, checkpoints, base_model, sft_model, ...) are removed first."""
    quiet: bool = False
    """No progress bar (CI)."""

    @model_validator(mode="before")
    @classmethod
    def _algo_name_default(cls, data: Any) -> Any:
        """An `algo` section without `name` is grpo's (the default algorithm)."""
        if isinstance(data, dict) and isinstance(data.get("algo"), dict) and "name" not in data["algo"]:
            data = {**data, "algo": {**data["algo"], "name": "grpo"}}
        return data

    @model_validator(mode="after")
    def _overlong_within_budget(self) -> Config:
        if self.algo.overlong_buffer > self.rollout.max_tokens:
            raise ValueError(
                f"algo.overlong_buffer ({self.algo.overlong_buffer}) must be <= rollout.max_tokens "
                f"({self.rollout.max_tokens}): the penalty zone is the last `overlong_buffer` tokens "
                "of the turn budget")
        return self

    @model_validator(mode="after")
    def _teacher_worker_needs_distill(self) -> Config:
        if self.placement.teacher == "worker" and self.algo.name != "distill":
            raise ValueError(f"placement.teacher=worker: algo.name={self.algo.name} has no teacher "
                             "(only distill reads algo.teacher_path); set placement.teacher=inline")
        if (self.placement.teacher == "worker" and isinstance(self.algo, DistillConfig)
                and self.algo.distill_kl != "sampled"):
            raise ValueError(f"placement.teacher=worker with algo.distill_kl={self.algo.distill_kl}: "
                             "the teacher worker returns the log-probabilities of the sampled tokens only; "
                             "set placement.teacher=inline (full / topk) or algo.distill_kl=sampled")
        return self

    @model_validator(mode="after")
    def _teacher_samples_supported(self) -> Config:
        a = self.algo
        if not isinstance(a, DistillConfig) or a.distill_teacher_fraction == 0:
            return self  # (other algorithms have no `distill_teacher_fraction`: the schema refuses it)
        bad = [(a.distill_kl == "sampled", "algo.distill_kl=full|topk|forward (sampled is a policy gradient "
                                           "on the student's own samples; the teacher's are off-policy)"),
               (a.distill_reward_coef > 0, "algo.distill_reward_coef=0 (the env reward's advantage is "
                                           "on-policy only)"),
               (a.dynamic_sampling, "algo.dynamic_sampling=false"),
               (self.placement.teacher != "inline", "placement.teacher=inline"),
               (self.rollout.mode != "sync", "rollout.mode=sync"),
               (self.rollout.num_workers > 0, "rollout.num_workers=0"),
               (self.rollout.engine != "hf", "rollout.engine=hf"),
               (self.train.learner_workers > 0, "train.learner_workers=0")]
        need = [fix for hit, fix in bad if hit]
        if need:
            raise ValueError(f"algo.distill_teacher_fraction={a.distill_teacher_fraction} (the teacher samples "
                             "through an in-process hf engine) is not supported with this run: set "
                             + "; ".join(need))
        return self

    @model_validator(mode="after")
    def _reward_worker_needs_a_model(self) -> Config:
        if self.placement.reward_model == "worker":
            kw = self.env.wrapper_kwargs
            paths = [kw.get("classifier", {}).get("model"), kw.get("safety", {}).get("classifier")]
            if not any(n in self.env.wrappers for n in ("classifier", "safety")) or not any(paths):
                raise ValueError("placement.reward_model=worker needs a classifier or safety wrapper with "
                                 "a model path (env.wrapper_kwargs.classifier.model or "
                                 "env.wrapper_kwargs.safety.classifier); the built-in lexicon has no model")
        return self

    @model_validator(mode="after")
    def _turn_advantages_need_exact_history(self) -> Config:
        if getattr(self.algo, "turn_advantages", False) and self.rollout.history == "template":
            raise ValueError("algo.turn_advantages=true has no effect with rollout.history=template: each turn "
                             "is then its own sample carrying the episode's return, so the per-turn groups are "
                             "the episode groups (plain GRPO); set rollout.history=exact, or "
                             "algo.turn_advantages=false")
        return self

    @model_validator(mode="after")
    def _branch_fits_groups(self) -> Config:
        b = self.rollout.branch
        if b == 1:
            return self
        g = getattr(self.algo, "group_size", None)
        if g is None or g % b:
            raise ValueError(f"rollout.branch={b} must divide algo.group_size ({g}): each group is "
                             "group_size / branch first turns with branch continuations each")
        if self.env.name in ("agent", "agentrl/Agent-v0"):
            raise ValueError(f"rollout.branch={b}: --agent runs your agent, and the user's agent samples "
                             "its own turns (no first turn to share): set rollout.branch=1")
        err = branch_turns_error(self)
        if err:
            raise ValueError(err)
        if self.model.vision:
            raise ValueError(f"rollout.branch={b}: tree rollouts are for text models (model.vision=true)")
        return self

    @model_validator(mode="after")
    def _async_needs_staleness(self) -> Config:
        if self.rollout.mode == "async" and self.train.max_staleness < self.rollout.sync_every - 1:
            raise ValueError(
                f"train.max_staleness ({self.train.max_staleness}) must be >= rollout.sync_every - 1 "
                f"({self.rollout.sync_every - 1}) in async mode, or the actor would wait for weights "
                "that are never pushed")
        return self


_ALGO: TypeAdapter[Any] = TypeAdapter(AlgoConfig)


def branch_turns_error(cfg: Config, registered: tuple[bool, int | None] | None = None) -> str | None:
    """Why `rollout.branch` > 1 cannot run on `cfg`'s env for want of turns, or None: the turn
    limit is `env.max_turns`, else `env.kwargs.max_turns`, else the one the env is registered
    with, `registered` = (registered yet?, its limit) as `agentrl.env.registry.registered_turn_limit`
    gives it; under 2, or none at all, is refused (one turn would make the branches copies).
    None too when neither key is set and `registered` is None or says "not registered yet"
    (config validation has no registry; a module of `env.imports` / `--import` registers the
    env: `agentrl train` asks again with its registered limit once it is imported)."""
    if cfg.rollout.branch == 1:
        return None
    turns = cfg.env.max_turns or cfg.env.kwargs.get("max_turns")
    if turns is None:
        if registered is None or not registered[0]:
            return None
        turns = registered[1]
    if (turns or 1) >= 2:
        return None
    return (f"rollout.branch={cfg.rollout.branch} needs a multi-turn run (env.max_turns >= 2, "
            f"env.kwargs.max_turns or the env's registered limit; got {turns}): with one turn the "
            "branches would be copies")


def algo_config(**fields: Any) -> AlgoBase:
    """The `algo` section of algorithm `fields["name"]` (default grpo) with `fields` set, e.g.
    `algo_config(name="ppo", kl_coef=0.05)`: what `algo.*` keys of a config give.

    Raises:
        ConfigError: a key the algorithm does not have, a wrong type or value (as `load_config`).
    """
    try:
        return _ALGO.validate_python({"name": "grpo", **fields})
    except ValidationError as e:
        raise ConfigError(format_error(e, Config, ("algo",))) from None


def load_config(yaml_path: str | Path | None = None, overrides: list[str] | None = None,
                *, base: Any = None, flag_names: dict[str, str] | None = None, **top: Any) -> Config:
    """Build the config: defaults <- `base` <- YAML file <- `key=value` overrides <- `top`
    keywords. `base` (a dict) is a saved config (`OUT/config.json` of a run being resumed); a
    `.json` file is one too (`agentrl eval` reads a run's config.json so): from both, the `algo`
    keys the run's algorithm does not have are dropped (`saved_algo_keys`: a config saved
    before the per-algorithm split holds every algorithm's keys).
    `top` are the command-line options (dotted keys, None: not given); an option and an
    override that set the same key to different values are refused (neither silently wins);
    `flag_names` spells the options in that message (`{"train.steps": "--steps"}`).

    Values in overrides are parsed as YAML scalars (`train.lr=1e-4`, `algo.tis_cap=null`).

    Raises:
        ConfigError: unknown key, wrong type, unsupported value, a malformed override, or an
            option and an override that disagree; the message names the key and the allowed
            values (or both settings).
    """
    data = gather(yaml_path, overrides, top, flag_names)
    data = _merge(saved_algo_keys(copy.deepcopy(base or {}), data), data)
    try:
        return Config.model_validate(data)
    except ValidationError as e:
        raise ConfigError(format_error(e, Config)) from None
