"""Worker roles: the frozen reference model, the distillation teacher and the reward model on
Ray actors of their own (`placement.reference=worker`, `placement.teacher=worker`,
`placement.reward_model=worker`), with their own CPUs / GPUs and dtype. `inline` (the default)
keeps today's behaviour: the reference is the learner's frozen copy, the teacher a frozen model
in the driver process (`InlineFrozenModel`, loaded once per process by `load_teacher`), the
reward model runs inside the env wrappers of the process that steps the envs. Either teacher is
`learner.teacher` (`make_teacher`, called by `agentrl.run.build`), with the same `logprobs(batch)`.

    driver ── RemoteFrozenModel ─▶ FrozenModelActor (Ray actor: a frozen model, prefill only,
       │        prefetch(batch)       no graph, dropout off; float32 | bfloat16 | int8)
       │        logprobs(batch)       role "reference": the policy's starting weights
       │                              role "teacher": `algo.teacher_path` (distill)
       └── RemoteClassifier ───▶ ClassifierActor (Ray actor: SequenceClassifier)
                (in the env wrappers: score / p_unsafe)

The reference and the teacher are the same machinery: a frozen causal LM whose teacher-forced
log-probabilities of a batch are computed by `frozen_logprobs` (the same micro-batches of
`train.micro_batch_size` rows, each trimmed to its longest row, the same `token_logprobs`), in the
driver or on a `FrozenModelActor`. So in float32 a worker's logprobs equal the inline ones bit
for bit on CPU (tested for both roles; the stated tolerance is 1e-6 nats, float32 rounding, for
other kernels or devices).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

from agentrl.infra.cluster import actor_options, ensure_ray
from agentrl.learner.forward import disable_dropout, full_precision, slice_rows, token_logprobs
from agentrl.learner.lora import plain_copy
from agentrl.models.int8 import REFERENCE_DTYPES, quantize_int8
from agentrl.models.tiny import load_model


def batch_key(batch: dict[str, Any]) -> str:
    """A digest of a batch's `input_ids` and `attention_mask` (shape and values): the key under
    which a prefetched reference result is found again when the same rows are collated later."""
    h = hashlib.blake2b(digest_size=16)
    for k in ("input_ids", "attention_mask"):
        t = batch[k].detach().cpu().contiguous()
        h.update(str(tuple(t.shape)).encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()


def frozen_logprobs(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    lengths: torch.Tensor, *, temperature: float = 1.0,
                    micro_batch_size: int = 16) -> torch.Tensor:
    """(B, T) float32 teacher-forced log-probabilities of a frozen `model` (no gradient): each
    token given those before it, at `temperature` (`agentrl.learner.forward.token_logprobs`), computed
    in micro-batches of `micro_batch_size` rows, each trimmed to its longest row (as
    `Learner.logprobs`); 0 at t = 0 and past each micro-batch's longest row. On the CPU.

    Args:
        model: a causal LM, on any device (the inputs are moved to it).
        input_ids, attention_mask: (B, T), right-padded; lengths: (B,) tokens per row.

    Raises:
        ValueError: a token id outside the model's vocabulary (another tokenizer).
    """
    check_vocabulary(model, input_ids)
    device = next(model.parameters()).device
    batch = {"input_ids": input_ids.cpu(), "attention_mask": attention_mask.cpu(), "lengths": lengths.cpu()}
    out = torch.zeros(input_ids.shape, dtype=torch.float32)
    with torch.no_grad():
        for idx in torch.split(torch.arange(input_ids.shape[0]), max(micro_batch_size, 1)):
            sub = slice_rows(batch, idx)
            lp, _ = token_logprobs(model, sub["input_ids"].to(device), sub["attention_mask"].to(device),
                                   temperature=temperature)
            out[idx, : lp.shape[1]] = lp.float().cpu()
    return out


def check_vocabulary(model: Any, input_ids: torch.Tensor) -> None:
    """Refuse ids a frozen `model` cannot score (a teacher or reference with another tokenizer).

    Args:
        input_ids: (B, T) token ids.

    Raises:
        ValueError: a token id at or above the model's input-embedding rows.
    """
    vocab = model.get_input_embeddings().weight.shape[0]
    if input_ids.numel() and int(input_ids.max()) >= vocab:
        raise ValueError(f"token id {int(input_ids.max())} is outside the frozen model's vocabulary "
                         f"of {vocab}: it must use the policy's tokenizer")


def frozen_vocab_logprobs(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                          lengths: torch.Tensor, *, temperature: float = 1.0, micro_batch_size: int = 16,
                          topk: int | None = None, vocab_size: int | None = None) -> dict[str, torch.Tensor]:
    """A frozen `model`'s whole next-token distribution at every position (no gradient), for
    distillation's exact reverse KL (`agentrl.algos.distill`, `algo.distill_kl=full|topk`):
    position t holds log p(. | input_ids[:, :t]) over the vocabulary, the distribution that
    produced token t, at `temperature`; 0 at t = 0 and past each micro-batch's longest row
    (micro-batches as `frozen_logprobs`). On the CPU. With `vocab_size` (the tokenizer's length,
    `len(tokenizer)`) the logits' padding rows beyond it (an embedding matrix rounded up, e.g.
    Qwen2.5-7B's 152,064 rows for 151,665 tokens) are sliced off before the softmax, so V is
    the tokenizer's size whatever the model's row count.

    Returns:
        `logprobs` (B, T) of the tokens themselves (what `frozen_logprobs` gives), and either
        `vocab_logprobs` (B, T, V) float32 (`topk` None) or `topk_logprobs` (B, T, k) float32
        with `topk_ids` (B, T, k) long, the k most likely tokens (k = min(topk, V)).

    Raises:
        ValueError: a token id outside the model's vocabulary (another tokenizer).
    """
    check_vocabulary(model, input_ids)
    device = next(model.parameters()).device
    t = temperature if temperature and temperature > 0 else 1.0
    batch = {"input_ids": input_ids.cpu(), "attention_mask": attention_mask.cpu(), "lengths": lengths.cpu()}
    B, T = input_ids.shape
    out: dict[str, torch.Tensor] = {"logprobs": torch.zeros((B, T), dtype=torch.float32)}
    with torch.no_grad():
        for idx in torch.split(torch.arange(B), max(micro_batch_size, 1)):
            sub = slice_rows(batch, idx)
            ids = sub["input_ids"].to(device)
            logits = model(input_ids=ids, attention_mask=sub["attention_mask"].to(device)).logits
            if vocab_size is not None and logits.shape[-1] > vocab_size:
                logits = logits[..., :vocab_size]  # padding rows are no token of the tokenizer
            with full_precision(logits):
                lv = torch.log_softmax(logits[:, :-1].float() / t, dim=-1)  # predicts tokens 1..W-1
            W, V = ids.shape[1], lv.shape[-1]
            out["logprobs"][idx, 1:W] = lv.gather(-1, ids[:, 1:, None]).squeeze(-1).cpu()
            if topk is None:
                if "vocab_logprobs" not in out:
                    out["vocab_logprobs"] = torch.zeros((B, T, V), dtype=torch.float32)
                out["vocab_logprobs"][idx, 1:W] = lv.cpu()
            else:
                k = min(int(topk), V)
                if "topk_logprobs" not in out:
                    out["topk_logprobs"] = torch.zeros((B, T, k), dtype=torch.float32)
                    out["topk_ids"] = torch.zeros((B, T, k), dtype=torch.long)
                vals, top = lv.topk(k, dim=-1)
                out["topk_logprobs"][idx, 1:W] = vals.cpu()
                out["topk_ids"][idx, 1:W] = top.cpu()
    return out


_TEACHERS: dict[tuple[str, str], Any] = {}
"""The inline teachers loaded in this process: (resolved path, device) -> model (`load_teacher`)."""
_TEACHER_VOCAB: dict[tuple[str, str], int] = {}
"""Their tokenizers' lengths, same keys (`InlineFrozenModel.vocab_size`)."""


def load_teacher(path: str | Path, device: str | torch.device = "cpu") -> Any:
    """The frozen teacher at `path` on `device` (loaded once per process and device; eval mode,
    no gradient, dropout off).

    Raises:
        FileNotFoundError: `path` is not a directory (from `agentrl.models.tiny.load_model`).
    """
    key = (str(Path(path).resolve()), str(device))
    if key not in _TEACHERS:
        model, tok = load_model(path)
        model.requires_grad_(False)
        disable_dropout(model)
        _TEACHERS[key] = model.to(device).eval()
        _TEACHER_VOCAB[key] = len(tok)
    return _TEACHERS[key]


@torch.no_grad()
def teacher_logprobs(teacher: Any, batch: dict[str, Any], *, temperature: float = 1.0,
                     micro_batch_size: int = 16) -> torch.Tensor:
    """(B, T) float32 log pi_teacher of every token of `batch["input_ids"]` given those before
    it, 0 at t = 0 and on padding, on the batch's device: `frozen_logprobs` of the inline
    `teacher` model (what a teacher worker computes).

    Args:
        teacher: the frozen teacher (`load_teacher`).
        batch: `input_ids`, `attention_mask` (B, T), `lengths` (B,).
        temperature: the sampler's (logits / temperature).
        micro_batch_size: rows per forward.

    Raises:
        ValueError: a token id is outside the teacher's vocabulary (another tokenizer; names
            `algo.teacher_path`).
    """
    try:
        out = frozen_logprobs(teacher, batch["input_ids"], batch["attention_mask"], batch["lengths"],
                              temperature=temperature, micro_batch_size=micro_batch_size)
    except ValueError as e:
        raise ValueError(f"algo.teacher_path: {e}") from None
    return out.to(batch["input_ids"].device)


class InlineFrozenModel:
    """Distillation's teacher in the learner's process (`placement.teacher=inline`): what the
    algorithm reads as `learner.teacher`, as `RemoteFrozenModel` on a worker, plus the whole
    next-token distributions (`vocab_logprobs`, for `algo.distill_kl=full|topk|forward`). The
    model is `load_teacher(model_dir, device)`, loaded at the first call (once per process and
    device).

    Args:
        model_dir: the teacher's directory (`algo.teacher_path`).
        device: where its forward runs (the learner's).
        temperature: the sampler's (logits / temperature).
        micro_batch_size: rows per forward (the learner's).
    """

    role = "teacher"
    on_worker = False
    """Not a worker: no prefetch, no worker metrics (`agentrl.rollout.stages.frozen_workers`)."""

    def __init__(self, model_dir: str | Path, *, device: str | torch.device = "cpu",
                 temperature: float = 1.0, micro_batch_size: int = 16) -> None:
        self.model_dir, self.device = model_dir, device
        self.temperature, self.micro_batch_size = float(temperature), int(micro_batch_size)

    @property
    def model(self) -> Any:
        """The frozen teacher model (`load_teacher`)."""
        return load_teacher(self.model_dir, self.device)

    def logprobs(self, batch: dict[str, Any]) -> torch.Tensor:
        """(B, T) float32 teacher-forced logprobs of `batch` on its device (`teacher_logprobs`).

        Raises:
            ValueError: a token id outside the teacher's vocabulary (names `algo.teacher_path`)."""
        return teacher_logprobs(self.model, batch, temperature=self.temperature,
                                micro_batch_size=self.micro_batch_size)

    @property
    def vocab_size(self) -> int:
        """The length of the teacher's tokenizer (the policy's: checked at start-up)."""
        model = self.model  # loads it (and its tokenizer's length) once per process
        return _TEACHER_VOCAB.get((str(Path(self.model_dir).resolve()), str(self.device)),
                                  model.get_input_embeddings().weight.shape[0])

    def vocab_logprobs(self, batch: dict[str, Any], topk: int | None = None) -> dict[str, torch.Tensor]:
        """`frozen_vocab_logprobs` of `batch` on its device over the tokenizer's ids (V =
        `vocab_size`: padding rows of the embedding matrix sliced off): `logprobs` (B, T) and
        either `vocab_logprobs` (B, T, V) (`topk` None) or `topk_logprobs`, `topk_ids` (B, T, k).

        Raises:
            ValueError: a token id outside the teacher's vocabulary (names `algo.teacher_path`)."""
        try:
            out = frozen_vocab_logprobs(self.model, batch["input_ids"], batch["attention_mask"],
                                        batch["lengths"], temperature=self.temperature,
                                        micro_batch_size=self.micro_batch_size, topk=topk,
                                        vocab_size=self.vocab_size)
        except ValueError as e:
            raise ValueError(f"algo.teacher_path: {e}") from None
        return {k: v.to(batch["input_ids"].device) for k, v in out.items()}


class FrozenModelActor:
    """A frozen causal LM in a process of its own (run as a Ray actor by `RemoteFrozenModel`;
    a plain object in tests and in-process use): the KL reference (the policy's starting
    weights) or the distillation teacher (`algo.teacher_path`).

    Args:
        model_dir: a Hugging Face model directory.
        dtype: `float32`, `bfloat16` (the forward runs in bf16, the log-softmax in float32 from
            upcast logits) or `int8` (`quantize_int8`: Linear layers dynamically quantized, CPU
            only).
        temperature: the sampler's temperature (logits are divided by it).
        micro_batch_size: rows per forward (as the learner's `train.micro_batch_size`).
        torch_threads: torch threads of the actor's process.
        device: `cpu` or `cuda`.
        keep_fp32: with `dtype` other than float32, also keep a float32 copy for `logp_gap`.

    Raises:
        ValueError: an unknown dtype, or int8 on a device other than the CPU.
        RuntimeError: int8 on a platform without it (`int8_unavailable`).
    """

    def __init__(self, model_dir: str, *, dtype: str = "float32", temperature: float = 1.0,
                 micro_batch_size: int = 16, torch_threads: int = 1, device: str = "cpu",
                 keep_fp32: bool = False) -> None:
        if dtype not in REFERENCE_DTYPES:
            raise ValueError(f"frozen model dtype {dtype!r}; allowed: {', '.join(REFERENCE_DTYPES)}")
        if dtype == "int8" and torch.device(device).type != "cpu":
            raise ValueError(f"frozen model dtype int8 runs on the CPU only (torch's dynamic int8 kernels), not {device}")
        torch.set_num_threads(torch_threads)
        self.device = torch.device(device)
        fp32, _ = load_model(model_dir)
        disable_dropout(fp32)
        fp32.eval().requires_grad_(False)
        self.fp32 = fp32.to(self.device) if (dtype == "float32" or keep_fp32) else None
        if dtype == "float32":
            self.model = fp32.to(self.device)
        elif dtype == "int8":
            self.model = quantize_int8(fp32).eval()
        else:
            self.model = load_model(model_dir, dtype=torch.bfloat16)[0].eval().requires_grad_(False).to(self.device)
        disable_dropout(self.model)
        self.dtype, self.temperature, self.micro_batch_size = dtype, temperature, micro_batch_size
        self.busy_s = 0.0

    def _logprobs(self, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                  lengths: torch.Tensor) -> torch.Tensor:
        return frozen_logprobs(model, input_ids, attention_mask, lengths, temperature=self.temperature,
                               micro_batch_size=self.micro_batch_size)

    def logprobs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 lengths: torch.Tensor) -> torch.Tensor:
        """(B, T) float32 teacher-forced logprobs of the frozen model (`frozen_logprobs`): for
        the reference what `Learner.logprobs(batch, ref=True)` computes, for the teacher what
        `teacher_logprobs` computes inline.

        Args:
            input_ids, attention_mask: (B, T), right-padded; lengths: (B,) tokens per row.

        Raises:
            ValueError: a token id outside the model's vocabulary."""
        t0 = time.perf_counter()
        try:
            return self._logprobs(self.model, input_ids, attention_mask, lengths)
        finally:
            self.busy_s += time.perf_counter() - t0

    def logp_gap(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, lengths: torch.Tensor,
                 loss_mask: torch.Tensor, max_tokens: int) -> dict[str, float]:
        """|logp_dtype - logp_fp32| (bf16 or int8 against float32) over the first `max_tokens` agent tokens (`loss_mask != 0`,
        in row-major order) of the batch's rows: `{"mean", "max", "tokens"}`; all 0 for a
        float32 model (the two are the same model).

        Raises:
            ValueError: a bf16 or int8 model loaded without `keep_fp32`."""
        if self.dtype == "float32":
            return {"mean": 0.0, "max": 0.0, "tokens": float(int((loss_mask != 0).sum()))}
        if self.fp32 is None:
            raise ValueError("logp_gap needs FrozenModelActor(keep_fp32=True)")
        t0 = time.perf_counter()
        mask = (loss_mask != 0).flatten()
        pick = mask.nonzero().flatten()[:max_tokens]
        rows = torch.unique(pick // input_ids.shape[1])
        sub = (input_ids[rows], attention_mask[rows], lengths[rows])
        gap = (self._logprobs(self.model, *sub) - self._logprobs(self.fp32, *sub)).abs()
        keep = torch.zeros(input_ids.numel(), dtype=torch.bool)
        keep[pick] = True
        g = gap[keep.view(input_ids.shape)[rows]]
        self.busy_s += time.perf_counter() - t0
        return {"mean": float(g.mean()) if len(g) else 0.0, "max": float(g.max()) if len(g) else 0.0,
                "tokens": float(len(g))}

    def take_busy(self) -> float:
        """Seconds this actor spent computing since the last call (then reset to 0)."""
        b, self.busy_s = self.busy_s, 0.0
        return b


class RemoteFrozenModel:
    """The driver's side of a frozen-model worker (`FrozenModelActor`), the reference's or the
    teacher's: `logprobs(batch)` answers what the inline model would (`frozen_logprobs`; for the
    reference `Learner.logprobs(batch, ref=True)`); `prefetch(batch)` starts that computation on
    the worker without waiting, so that it overlaps the driver's own work (the pipeline,
    docs/scale_out.md); a later `logprobs` of a batch with the same rows takes the result.

    Args:
        model_dir: the frozen model's directory (the reference: `save_reference_model`; the
            teacher: `algo.teacher_path`).
        role: `reference` or `teacher`: names the metrics (`perf/<role>_wait_s`, ...).
        dtype, temperature, micro_batch_size, torch_threads, keep_fp32: see `FrozenModelActor`.
        cpus, gpus: the actor's Ray resources (`placement.<role>_cpus` / `_gpus`); with
            gpus > 0 the actor runs on its CUDA device.
        ray_address: the cluster to join (None: a local one, or the one already up).

    Attributes:
        wait_s: seconds the driver waited for the worker's results (reset by `take_metrics`).
    """

    MAX_PENDING = 4
    """Prefetched results kept at most (the oldest is dropped)."""
    on_worker = True
    """A worker: prefetched, its metrics logged (`agentrl.rollout.stages.frozen_workers`)."""

    def __init__(self, model_dir: str | Path, *, role: str = "reference", dtype: str = "float32",
                 temperature: float = 1.0, micro_batch_size: int = 16, torch_threads: int = 1,
                 cpus: float = 1.0, gpus: float = 0.0, keep_fp32: bool = False,
                 ray_address: str | None = None) -> None:
        import ray


        ensure_ray(ray_address)
        self.role = role
        cls = ray.remote(**actor_options(cpus, gpus))(FrozenModelActor)
        self.actor = cls.remote(str(model_dir), dtype=dtype, temperature=temperature,
                                micro_batch_size=micro_batch_size, torch_threads=torch_threads,
                                device="cuda" if gpus > 0 else "cpu", keep_fp32=keep_fp32)
        self.dtype = dtype
        self._pending: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()
        self.wait_s = 0.0
        self.prefetched = 0

    @staticmethod
    def _args(batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return (batch["input_ids"].cpu(), batch["attention_mask"].cpu(), batch["lengths"].cpu())

    def prefetch(self, batch: dict[str, Any]) -> None:
        """Start the frozen model's logprobs of `batch` on the worker (returns at once)."""
        key = batch_key(batch)
        with self._lock:
            if key not in self._pending:
                self._pending[key] = self.actor.logprobs.remote(*self._args(batch))
                while len(self._pending) > self.MAX_PENDING:
                    self._pending.popitem(last=False)

    def logprobs(self, batch: dict[str, Any]) -> torch.Tensor:
        """(B, T) float32 logprobs of the frozen model on `batch`, on the batch's device: the
        prefetched result of the same rows when there is one, else computed now on the worker.

        Raises:
            ray.exceptions.RayTaskError: from the actor (e.g. a token id outside its vocabulary)."""
        import ray

        key = batch_key(batch)
        with self._lock:
            ref = self._pending.pop(key, None)
        if ref is not None:
            self.prefetched += 1
        else:
            ref = self.actor.logprobs.remote(*self._args(batch))
        t0 = time.perf_counter()
        out = ray.get(ref)
        self.wait_s += time.perf_counter() - t0
        return out.to(batch["loss_mask"].device)

    def vocab_logprobs(self, batch: dict[str, Any], topk: int | None = None) -> dict[str, torch.Tensor]:
        """Not on a worker (it returns sampled-token log-probabilities only).

        Raises:
            ValueError: always (the config refuses `placement.teacher=worker` with
                `algo.distill_kl` other than `sampled` at start-up)."""
        raise ValueError(f"{self.role} worker: whole next-token distributions (algo.distill_kl=full|topk|"
                         "forward) need placement.teacher=inline")

    def logp_gap(self, batch: dict[str, Any], max_tokens: int) -> dict[str, float]:
        """`FrozenModelActor.logp_gap` on the worker: mean / max |logp_dtype - logp_fp32| and the
        token count over the first `max_tokens` agent tokens of `batch`."""
        import ray

        return ray.get(self.actor.logp_gap.remote(*self._args(batch), batch["loss_mask"].cpu(), max_tokens))

    def take_metrics(self) -> dict[str, float]:
        """`perf/<role>_wait_s` (the driver waited), `perf/<role>_busy_s` (the worker computed)
        and `perf/<role>_prefetched` (results taken from a prefetch) since the last call."""
        import ray

        busy = float(ray.get(self.actor.take_busy.remote()))
        r = self.role
        m = {f"perf/{r}_wait_s": self.wait_s, f"perf/{r}_busy_s": busy,
             f"perf/{r}_prefetched": float(self.prefetched)}
        self.wait_s, self.prefetched = 0.0, 0
        return m

    def shutdown(self) -> None:
        """Stop the actor."""
        import ray

        ray.kill(self.actor)


def save_reference_model(model: Any, tok: Any, out: Path, checkpoint: Path | None = None) -> Path:
    """Write the frozen reference's weights to OUT/reference_model, once: `model`'s plain
    weights (LoRA merged: at the start of a run, the base). A resumed run keeps the directory of
    its first start, so the reference stays the policy the run started from; a run started with
    the inline reference and resumed with a worker takes the reference weights its `checkpoint`
    saved (`ref_model.pt`).

    Raises:
        ValueError: resuming from a `checkpoint` that has neither (no reference to restore)."""
    target = out / "reference_model"
    if (target / "config.json").exists():
        return target
    ref = plain_copy(model)
    if checkpoint is not None:
        if not (checkpoint / "ref_model.pt").exists():
            raise ValueError(f"placement.reference=worker: resuming from {checkpoint}, which has no "
                             f"reference weights (ref_model.pt) and {target} does not exist")
        ref.load_state_dict(torch.load(checkpoint / "ref_model.pt", map_location="cpu", weights_only=True))
    ref.save_pretrained(target)
    tok.save_pretrained(target)
    return target


def make_frozen_worker(cfg: Any, role: str, model_dir: str | Path) -> RemoteFrozenModel:
    """A frozen-model worker of a run: `model_dir` on a `RemoteFrozenModel` with the role's
    `placement.<role>_dtype` / `_cpus` / `_gpus`, the sampler's temperature,
    `train.micro_batch_size` and `train.torch_threads` (a bf16 worker keeps a float32 copy when
    `placement.logp_gap_every > 0`)."""
    p = cfg.placement
    dtype = getattr(p, f"{role}_dtype")
    return RemoteFrozenModel(model_dir, role=role, dtype=dtype, temperature=cfg.rollout.temperature,
                             micro_batch_size=cfg.train.micro_batch_size,
                             torch_threads=cfg.train.torch_threads, cpus=getattr(p, f"{role}_cpus"),
                             gpus=getattr(p, f"{role}_gpus"),
                             keep_fp32=dtype != "float32" and p.logp_gap_every > 0,
                             ray_address=cfg.rollout.ray_address)


def make_reference(cfg: Any, model: Any, tok: Any, out: Path, checkpoint: Path | None = None) -> RemoteFrozenModel:
    """The reference worker of a run (`placement.reference=worker`): OUT/reference_model
    (`save_reference_model`) on a `make_frozen_worker` of role `reference`."""
    return make_frozen_worker(cfg, "reference", save_reference_model(model, tok, out, checkpoint))


def inline_teacher(model_dir: str | Path, learner: Any) -> InlineFrozenModel:
    """The teacher at `model_dir` in this process with `learner`'s device (the CPU for a group of
    ranks), temperature and micro-batch size."""
    return InlineFrozenModel(model_dir, device=getattr(learner, "device", "cpu"),
                             temperature=learner.temperature, micro_batch_size=learner.micro_batch_size)


def make_teacher(cfg: Any, learner: Any) -> RemoteFrozenModel | InlineFrozenModel:
    """The distillation teacher of a run, set as `learner.teacher`: `algo.teacher_path` on a
    `make_frozen_worker` of role `teacher` (`placement.teacher=worker`), else in this process
    (`inline_teacher`, loaded at its first use)."""
    if cfg.placement.teacher == "worker":
        return make_frozen_worker(cfg, "teacher", cfg.algo.teacher_path)
    return inline_teacher(cfg.algo.teacher_path, learner)
