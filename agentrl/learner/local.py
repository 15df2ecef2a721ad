"""The learner in this process: the policy, its optimizer and scheduler, the frozen reference
model, no-grad logprobs (and values), and the update over epochs x minibatches x micro-batches.

The update reads top to bottom (`Learner.update`): minibatches -> micro-batches -> forward ->
the algorithm's loss -> backward -> clip -> step. Its forward is chosen once, at construction
(`agentrl.learner.forward`: the value head's for PPO; else each group's shared prompt run once
with lm_head and log-softmax only where the loss reads, `Learner(prefix_share=True)`; else the
plain transformers forward); the algorithm and the batch change it in one place only
(`Learner._forward_for`: a loss over the vocabulary, a batch with images). What the learner
reads of an algorithm are its declared needs (`agentrl.algos.base.Algorithm`, passed in); the checkpoint layout in
`agentrl.learner.checkpoints.write_checkpoint`; the optimizer in `agentrl.learner.optim`.

Devices and precision (`Learner(device=, precision=, gradient_checkpointing=)`, config
`train.device`, `train.precision`, `train.gradient_checkpointing`): the policy, value head and
reference model live on one device and every batch is moved there inside `logprobs` /
`update` (results come back on the batch's own device); `bf16` runs the forwards under
`torch.autocast` with float32 master weights and optimizer state, and the log-probabilities,
values and losses in float32 (logits upcast before the log-softmax). Dropout is off in every
forward (`disable_dropout`), and an optimizer step whose gradient norm is not finite is skipped
(`loss/skipped_nonfinite`; `max_nonfinite_steps` in a row raise `NonFiniteGradientError`).
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from agentrl.infra.devices import resolve_device
from agentrl.learner import checkpoints
from agentrl.learner.checkpoints import (
    ALGO_STATE,
    REF_MODEL,
    RUN_STATE,
    SHARDED,
    TRAINER_STATE,
    VALUE_HEAD,
    read_state,
    rng_state,
    set_rng_state,
    write_checkpoint,
)
from agentrl.learner.dist import DataParallel, load_sharded, shard, total_norm
from agentrl.learner.forward import (
    TrainForward,
    disable_dropout,
    enable_checkpointing,
    forward_rows,
    minibatch_rows,
    plain_forward,
    precision_autocast,
    prefix_shared_forward,
    slice_rows,
    to_device,
    token_logprobs,
    token_logprobs_values,
    values_before,
    values_forward,
    vocab_forward,
)
from agentrl.learner.lora import is_peft, merged_state_dict
from agentrl.learner.optim import NonFiniteGradientError, load_optimizer_state, make_adamw
from agentrl.learner.prefix_share import prefix_share_supported
from agentrl.learner.stats import UpdateStats
from agentrl.models.static_decode import unsupported_reason
from agentrl.models.static_forward import static_forward_supported

PRECISIONS = ("fp32", "bf16")
"""`Learner(precision=)` / `train.precision` values."""


def _frozen(model: torch.nn.Module) -> torch.nn.Module:
    """`model` in eval mode with no parameter requiring grad (the reference)."""
    return model.eval().requires_grad_(False)


class Learner:
    """Holds the policy, its optimizer and scheduler, and the frozen reference model.

    Args:
        model: the policy (a transformers causal LM), trained in place.
        lr, weight_decay, grad_clip: AdamW settings and the max global grad norm.
        temperature: the sampling temperature (logits are scaled by it).
        micro_batch_size: sequences per forward/backward.
        use_ref: keep a frozen copy as the KL reference (a PEFT/LoRA model keeps no copy: its
            base with adapters disabled is the reference).
        value_head: add a value head `torch.nn.Linear(hidden, 1)` on the policy's last hidden
            state (PPO), trained jointly with the policy by the same optimizer and saved in
            checkpoints. It starts at zero (V = 0 everywhere) so early values add no noise.
        prefix_share: the training forward of `update` uses `prefix_shared_logprobs` (each
            group's shared prompt forwarded once; lm_head, log-softmax and entropy only at
            loss positions, fused into `agentrl.learner.logprob_head.head_logprobs` when the entropy
            needs no gradient; the decoder as `agentrl.models.static_forward` for float32 Qwen2/Llama
            without LoRA) when the model supports it (`prefix_share_supported`: transformers
            decoder-only models, LoRA/PEFT-wrapped too). Not with a value head (PPO), which
            keeps the plain forward. Same losses and gradients to float32 rounding.
        compile: run that static decoder forward through `torch.compile` (inductor; see
            `agentrl.models.static_forward.forward_hidden`): tens of seconds of compiling at the first
            update, then 0.78-0.84x of the eager update time for small models on CPU. Falls
            back to eager, with a warning, if compiling fails.
        skip_zero_advantage: leave rows whose advantages are all 0 out of the update's forwards
            when the algorithm says they add nothing to its loss (`idle_zero_advantage_rows`:
            GRPO/GSPO without KL in the loss or entropy bonus, RLOO, REINFORCE++ without entropy
            bonus); the token and sequence counts that normalise the loss still include them,
            so the loss and gradient are the same to float32 rounding. Metrics computed from
            the forward (entropy, ratios, `logp_mismatch`) then cover the other rows (when
            every row of a minibatch is idle, its first row still runs, for the metrics);
            `skipped_rows_frac` reports the fraction left out.
        lr_schedule: the factor on `lr` at each optimizer step (`agentrl.learner.schedules.lr_multiplier`
            with the run's settings); None: constant. Stepped once per optimizer step, saved and
            restored with checkpoints.
        device: where the policy, value head, reference model and every batch tensor of the
            update live (`resolve_device`: `auto`, `cpu`, `cuda`); the model is moved there at
            construction, batches inside `logprobs` / `logprobs_and_values` / `update` (results
            come back on the batch's device). None: the model's device, as given.
        precision: `fp32`, or `bf16`: the forwards (policy and reference) run under
            `torch.autocast(device_type, dtype=torch.bfloat16)`; the weights, gradients and
            AdamW state stay float32, and logprobs, entropies, values and the loss are
            computed in float32 (logits upcast before the log-softmax). The hand-written static
            decoder (and so `compile`) is float32-only: under bf16 the prefix-shared forward
            runs the transformers decoder (`fast_path_notes` says so).
        gradient_checkpointing: transformers' checkpointing (`enable_checkpointing`, non-reentrant):
            activations are recomputed in the backward, for memory. The same gradient; the
            prefix-shared forward then runs without sharing (transformers drops the cache).
        max_nonfinite_steps: an optimizer step whose global gradient norm is NaN or infinite is
            skipped (no parameter, optimizer-state or scheduler change; counted in the update's
            `skipped_nonfinite`); this many skips in a row raise `NonFiniteGradientError`
            (None: never).
        dp: a rank's place (`agentrl.learner.rank`): the modules sharded by `dist.shard` (bf16:
            its `MixedPrecisionPolicy`), which moves the shards to `device`.
        load_reference: with `dp`, a fresh initial policy for the reference, loaded once the
            policy is sharded (never two full copies); None: a deep copy of `model`.

    Attributes:
        algo_state: small state an algorithm keeps across steps (e.g. PPO's adaptive KL
            coefficient); saved in checkpoints.
        prefix_share: the switch above.
        train_forward: the training forward chosen at construction (`agentrl.learner.forward`).
        fused: the optimizer is `torch.optim.AdamW(fused=True)` (False where torch has no fused
            kernel for these parameters' device and dtype: the default implementation).
        device: the learner's `torch.device`.
        nonfinite_streak: optimizer steps skipped in a row for a non-finite gradient norm.
    """

    def __init__(self, model: Any, *, lr: float, weight_decay: float = 0.0, grad_clip: float = 1.0,
                 temperature: float = 1.0, micro_batch_size: int = 16, use_ref: bool = False,
                 value_head: bool = False,
                 prefix_share: bool = True, compile: bool = False, skip_zero_advantage: bool = True,
                 lr_schedule: Callable[[int], float] | None = None,
                 device: str | torch.device | None = None, precision: str = "fp32",
                 gradient_checkpointing: bool = False, max_nonfinite_steps: int | None = None,
                 dp: DataParallel | None = None, load_reference: Callable[[], Any] | None = None):
        if precision not in PRECISIONS:
            raise ValueError(f"precision={precision!r}; allowed: {', '.join(PRECISIONS)}")
        dev = resolve_device(device) if device is not None else next(model.parameters()).device
        if dp is None:  # ranks: the model stays where it is until fully_shard moves its shards
            model.to(dev)
        self.model, self.device = model, dev
        self.model.train()
        disable_dropout(self.model)  # logprobs and values are a function of the weights
        self.precision = precision
        self.gradient_checkpointing = gradient_checkpointing
        if gradient_checkpointing:
            enable_checkpointing(model)
        self.max_nonfinite_steps = max_nonfinite_steps
        self.nonfinite_streak = 0
        self.grad_clip = grad_clip
        self.temperature = temperature
        self.micro_batch_size = micro_batch_size
        self.value_head: torch.nn.Module | None = None
        if value_head:
            self.value_head = torch.nn.Linear(model.config.hidden_size, 1).to(self.device)
            torch.nn.init.zeros_(self.value_head.weight)
            torch.nn.init.zeros_(self.value_head.bias)
        self.algo_state: dict[str, Any] = {}
        self.dp = dp
        self.prefix_share = prefix_share and dp is None  # ranks: the plain transformers forward
        self.compile = compile and dp is None
        self.skip_zero_advantage = skip_zero_advantage
        self._share_ok = prefix_share_supported(model)
        self.ref_model = None
        self.reference: Any = None  # a RemoteFrozenModel (placement.reference=worker), set by the loop
        self.teacher: Any = None  # distill's teacher (frozen.make_teacher: worker or inline), set by run.build
        self.ref_seconds = 0.0
        self.lora = is_peft(model)  # LoRA: the reference is the base with adapters disabled
        late_ref = use_ref and not self.lora and dp is not None and load_reference is not None
        if use_ref and not self.lora and not late_ref:
            self.ref_model = _frozen(copy.deepcopy(model))
        if dp is not None:  # FSDP2: parameters become DTensor shards before the optimizer sees them
            for m in (self.model, self.ref_model, self.value_head):
                if m is not None:
                    shard(m, device=self.device, precision=precision)
        if late_ref:  # loaded once the policy is sharded: never two full copies at once
            self.ref_model = shard(_frozen(load_reference()), device=dev, precision=precision)
        self.optimizer, self.fused = make_adamw(self._params(), lr=lr, weight_decay=weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_schedule or (lambda _: 1.0))
        self.optimizer_steps = 0
        self.train_forward = self._train_forward()

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The context of the learner's forwards: bf16 autocast on the learner's device, or
        nothing (fp32)."""
        return precision_autocast(self.device, self.precision)

    @property
    def lr(self) -> float:
        """The learning rate of the next optimizer step."""
        return float(self.optimizer.param_groups[0]["lr"])

    def state_dict_for_engines(self) -> dict[str, torch.Tensor]:
        """The policy's weights under the plain model's names, LoRA merged
        (`agentrl.learner.lora.merged_state_dict`), for `update_weights` of the engines."""
        return merged_state_dict(self.model)

    @property
    def static_ok(self) -> bool:
        """The prefix-shared forward may run the hand-written static decoder (and `compile` it):
        float32 compute only (under bf16 autocast the transformers decoder runs instead)."""
        return self.precision == "fp32"

    def _params(self) -> list[torch.nn.Parameter]:
        """The trained parameters: the policy's (those requiring grad) and the value head's."""
        heads = list(self.value_head.parameters()) if self.value_head is not None else []
        return [p for p in self.model.parameters() if p.requires_grad] + heads

    # -- forward passes -----------------------------------------------------------------------
    @torch.no_grad()
    def logprobs(self, batch: dict[str, Any], *, ref: bool = False) -> torch.Tensor:
        """(B, T) logprobs of the policy (or the reference) on the batch, without gradient.
        With `reference` set (a `agentrl.learner.frozen.RemoteFrozenModel`), the reference's come
        from that worker. `ref_seconds` adds up the seconds spent on reference logprobs."""
        if ref:
            t0 = time.perf_counter()
            try:
                if self.reference is not None:
                    return self.reference.logprobs(batch)
                return self._logprobs(batch, ref=True)
            finally:
                self.ref_seconds += time.perf_counter() - t0
        return self._logprobs(batch)

    def _logprobs(self, batch: dict[str, Any], *, ref: bool = False) -> torch.Tensor:
        if ref and self.ref_model is None and self.lora:
            with self.model.disable_adapter():
                return self._logprobs(batch)
        model = self.ref_model if ref else self.model
        home = batch["loss_mask"].device
        batch = to_device(batch, self.device)
        out = torch.zeros_like(batch["loss_mask"])
        for idx, real in self._row_chunks(batch["input_ids"].shape[0]):
            sub = slice_rows(batch, idx)
            with self.autocast():
                lp, _ = token_logprobs(model, sub["input_ids"], sub["attention_mask"],
                                       temperature=self.temperature, vision=sub.get("vision"))
            if real:
                out[idx, : lp.shape[1]] = lp
        if self.dp is not None:  # every rank filled its rows, the others are 0
            self.dp.all_sum(out)
        return out.to(home)

    def _row_chunks(self, B: int) -> list[tuple[torch.Tensor, bool]]:
        """Micro-batches of rows for a no-grad pass over a (B, ...) batch: (row indices on the
        learner's device, real). In-process every row, in chunks of `micro_batch_size`; on a
        rank its dealt rows (`DataParallel.my_units`), padded with dummy chunks (row 0, real
        False: run for the collectives, discarded) to the same count on every rank."""
        rows = torch.arange(B)
        if self.dp is not None:
            rows = self.dp.my_units(rows)
        chunks = [(c.to(self.device), True) for c in torch.split(rows, self.micro_batch_size) if len(c)]
        if self.dp is not None and B:
            n = self.dp.micro_count(B, self.micro_batch_size)
            chunks += [(torch.zeros(1, dtype=torch.long, device=self.device), False)] * (n - len(chunks))
        return chunks

    @torch.no_grad()
    def logprobs_and_values(self, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor,
                                                                     torch.Tensor]:
        """Policy logprobs and value-head values in one forward pass, without gradient.

        Returns:
            logp (B, T); values (B, T), V(s_t) of the state in which token t was sampled
            (aligned like logp, 0 at t = 0); last_values (B,), the value of the state after each
            row's last agent token (0 for a row without one): the bootstrap of a truncated
            episode (case A11).

        Raises:
            ValueError: the learner has no value head, or the batch has images.
        """
        if self.value_head is None:
            raise ValueError("logprobs_and_values needs Learner(value_head=True)")
        if "vision" in batch:
            raise ValueError("a value head (ppo) on a batch with images is not supported yet "
                             "(docs/multimodal.md)")
        home = batch["loss_mask"].device
        batch = to_device(batch, self.device)
        mask = batch["loss_mask"]
        logp, values, after = torch.zeros_like(mask), torch.zeros_like(mask), torch.zeros_like(mask)
        for idx, real in self._row_chunks(batch["input_ids"].shape[0]):
            sub = slice_rows(batch, idx)
            with self.autocast():
                lp, _, va = token_logprobs_values(self.model, self.value_head, sub["input_ids"],
                                                  sub["attention_mask"], temperature=self.temperature)
            if real:
                logp[idx, : lp.shape[1]] = lp
                values[idx, : lp.shape[1]] = values_before(va)
                after[idx, : lp.shape[1]] = va
        if self.dp is not None:
            for t in (logp, values, after):
                self.dp.all_sum(t)
        pos = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
        last = torch.where(mask != 0, pos, -1).max(dim=1).values  # last agent token, -1: none
        last_values = torch.where(last >= 0, after.gather(1, last.clamp(min=0)[:, None])[:, 0], 0.0)
        return logp.to(home), values.to(home), last_values.to(home)

    def update(self, batch: dict[str, Any], algo: Any, cfg: Any, *, epochs: int = 1,
               minibatches: int = 1, seed: int = 0, on_policy_shortcut: bool = True
               ) -> dict[str, float]:
        """Run `epochs` x `minibatches` optimizer steps of `algo.loss(logp, rows, cfg, ...)`.

        `old_logprobs` (contract 3) are recomputed first unless the batch has them or, with one
        optimizer step, the update's own forward gives them (`on_policy_shortcut`): before the
        only step the weights are the ones `old_logprobs` would be computed with, so the
        micro-batch's detached forward logprobs are its `old_logprobs` -- also for the truncated
        importance weights (`algo.tis_cap`) and the sampler/learner mismatch, which are then
        computed per micro-batch from them (one learner forward per update instead of two). A
        micro-batch's loss is normalised by its minibatch's counts and
        gets `max_len` = `cfg.norm_len` or the padded width. Rows `k*u .. k*u+u-1`
        (`batch["unit_size"]` u, default 1; DPO pairs 2) stay in one micro-batch.

        Returns: metrics averaged over optimizer steps (`UpdateStats.result`); {} without an
        agent token. Raises: `NonFiniteGradientError` (`max_nonfinite_steps` skips in a row);
        ValueError for rows that are not whole units or a forward the batch cannot have.
        """
        B, unit = batch["input_ids"].shape[0], int(batch.get("unit_size", 1))
        if B == 0 or not bool((batch["loss_mask"] != 0).any()):  # no agent token: no step
            return {}
        if B % unit:
            raise ValueError(f"batch of {B} rows is not a whole number of units of {unit}")
        single = epochs * minibatches == 1 and on_policy_shortcut
        if not single and "old_logprobs" not in batch:
            batch["old_logprobs"] = self.logprobs(batch)
        stats = UpdateStats()
        if not single and "sampler_logprobs" in batch:
            stats.mismatch(batch["old_logprobs"], batch["sampler_logprobs"], batch["loss_mask"])
        forward, idle = self._forward_for(batch, algo, cfg), self._idle_rows(batch, algo, cfg)
        micro_rows = max(unit, self.micro_batch_size // unit * unit)
        max_len = algo.norm_len(cfg) or batch["input_ids"].shape[1]
        ent_grad = algo.entropy_coef(cfg) > 0
        world = self.dp.world if self.dp is not None else 1
        batch = to_device(batch, self.device)  # the caller's batch keeps its tensors where they are
        gen = torch.Generator().manual_seed(seed)
        for _ in range(epochs):
            for mb in minibatch_rows(B // unit, unit, minibatches, gen):
                num_tokens = float(batch["loss_mask"][mb].sum())
                fwd = forward_rows(mb, idle)  # the counts above keep every row
                stats.idle += len(mb) - len(fwd)
                fwd_tokens = float(batch["loss_mask"][fwd].sum())
                self.optimizer.zero_grad(set_to_none=True)
                for micro, real in self._micro_batches(fwd, unit, micro_rows):
                    sub = slice_rows(batch, micro)
                    sub["max_len"] = max_len
                    with self.autocast():  # bf16: the forward; logp, values, loss in float32
                        logp, ent, kw = forward(sub, ent_grad)
                    if single:
                        sub["old_logprobs"] = logp.detach()
                    loss, m = algo.loss(logp, sub, cfg, num_tokens=max(num_tokens, 1.0),
                                        num_seqs=len(mb), entropy=ent, **kw)
                    # ranks: FSDP averages the gradient over ranks, the loss is a share of the sum
                    (loss * (world if real else 0.0)).backward()
                    if not real:  # a dummy micro-batch (collectives only): no metrics
                        continue
                    if single and "sampler_logprobs" in sub:
                        stats.mismatch(logp.detach(), sub["sampler_logprobs"], sub["loss_mask"])
                    stats.micro(m, loss, ent, sub["loss_mask"], fwd_tokens, len(micro) / len(fwd))
                stats.step(self._step(fill=len(fwd) < len(mb)))
        return stats.result(self.dp, rows=B * epochs if idle is not None else None)

    def _forward_for(self, batch: dict[str, Any], algo: Any, cfg: Any) -> TrainForward:
        """The training forward of this update: `train_forward`, chosen at construction, except
        where the algorithm or the batch decide (here only): a loss over the vocabulary
        (`algo.wants_vocab_logprobs(cfg)`) gets `vocab_forward`; a batch with images (`vision`) the plain
        forward, which runs the images (the prefix-shared forward has none).

        Raises:
            ValueError: a loss over the vocabulary, or a value head, on a batch with images.
        """
        vision = "vision" in batch
        if algo.wants_vocab_logprobs(cfg):
            if vision:
                raise ValueError("a loss over the vocabulary (algo.distill_kl=full|topk) "
                                 "on a batch with images is not supported")
            return vocab_forward(self.model, self.temperature)
        if vision and self.value_head is not None:
            raise ValueError("a value head (ppo) on a batch with images is not "
                             "supported yet (docs/multimodal.md)")
        return plain_forward(self.model, self.temperature) if vision else self.train_forward

    def _train_forward(self) -> TrainForward:
        """The training forward of this learner's settings: with a value head its forward (PPO);
        else the prefix-shared one where enabled and supported; else the plain one."""
        if self.value_head is not None:
            return values_forward(self.model, self.value_head, self.temperature)
        if self.prefix_share and self._share_ok:
            return prefix_shared_forward(self.model, self.temperature, static=self.static_ok,
                                         compiled=self.compile and self.static_ok)
        return plain_forward(self.model, self.temperature)

    def _step(self, *, fill: bool) -> float | None:
        """Clip the gradient to `grad_clip`, then step the optimizer and the scheduler; with
        `fill` (rows were left out) a parameter without gradient gets a zero one, so AdamW still
        steps it. A NaN/inf norm skips the step (weights, AdamW state, lr as before).

        Returns:
            the global gradient norm, or None when the step was skipped.

        Raises:
            NonFiniteGradientError: the `max_nonfinite_steps`-th skip in a row.
        """
        if fill:  # idle rows' gradient is exactly 0: AdamW still steps
            for p in self._params():
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
        gn = total_norm(torch.nn.utils.clip_grad_norm_(self._params(), self.grad_clip))
        if not math.isfinite(gn):
            self.optimizer.zero_grad(set_to_none=True)
            self.nonfinite_streak += 1
            if self.max_nonfinite_steps is not None and self.nonfinite_streak >= self.max_nonfinite_steps:
                raise NonFiniteGradientError(
                    f"{self.nonfinite_streak} optimizer steps in a row had a non-finite "
                    f"gradient norm ({gn}), the last after optimizer step "
                    f"{self.optimizer_steps}; stopping (train.max_nonfinite_steps="
                    f"{self.max_nonfinite_steps}). Look for NaN/inf rewards, advantages or "
                    "logprobs, or lower train.lr")
            return None
        self.nonfinite_streak = 0
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer_steps += 1
        return gn

    def _micro_batches(self, fwd: torch.Tensor, unit: int, micro_rows: int
                       ) -> list[tuple[torch.Tensor, bool]]:
        """The micro-batches (row indices, real) of a minibatch's forward rows `fwd` (whole
        units of `unit` rows, `micro_rows` rows per micro-batch). In-process: `fwd` in
        chunks. On a rank: its dealt units, chunked, then dummy micro-batches (the first unit,
        real False: backward with weight 0) up to the count every rank runs."""
        if self.dp is None:
            return [(m, True) for m in torch.split(fwd, micro_rows)]
        units = fwd.view(-1, unit)
        mine = self.dp.my_units(units).flatten()
        chunks = [(m, True) for m in torch.split(mine, micro_rows) if len(m)]
        n = self.dp.micro_count(len(units), micro_rows // unit)
        return chunks + [(fwd[:unit], False)] * (n - len(chunks))

    def compile_note(self) -> str:
        """One line on what `compile=True` will do for this learner ("" when it is off): that
        the decoder forward compiles at the first update, or why compiling has no effect."""
        if not self.compile:
            return ""
        if self.value_head is not None:
            why = "the value head (PPO) keeps the plain transformers forward"
        elif is_peft(self.model):
            why = "LoRA/PEFT adapters keep the transformers forward"
        elif not (self.prefix_share and self._share_ok):
            why = "the prefix-shared forward is off or unsupported for this model"
        elif not self.static_ok:
            why = (f"train.precision={self.precision} runs the transformers decoder under autocast "
                   "(the static decoder it compiles is float32 only)")
        elif self.gradient_checkpointing:
            why = "gradient checkpointing keeps the transformers forward"
        else:
            why = unsupported_reason(self.model, training=True) or ""
        if why:
            return f"train.compile has no effect: {why}"
        return ("the learner's decoder forward is compiled at the first update (torch.compile; "
                "about 1-2 min on 2 cores, then faster updates)")

    def fast_path_notes(self) -> list[str]:
        """One line for each fast path of the training forward that this learner's settings
        turn off (falling back to the transformers forward, which gives the right numbers):
        the static float32 decoder under bf16, prompt sharing and the static decoder under
        gradient checkpointing. [] when nothing is turned off."""
        shared = self.prefix_share and self._share_ok and self.value_head is None
        notes = []
        if shared and not self.static_ok and static_forward_supported(self.model):
            notes.append(f"train.precision={self.precision}: the learner's prefix-shared forward runs "
                         "the transformers decoder under autocast (the static decoder, "
                         "agentrl/models/static_forward.py, is float32 only)")
        if shared and self.gradient_checkpointing:
            notes.append("train.gradient_checkpointing: the learner's prefix-shared forward runs one "
                         "forward per micro-batch, without sharing the prompt (transformers drops the "
                         "cache while checkpointing) and without the static decoder")
        return notes

    def _idle_rows(self, batch: dict[str, Any], algo: Any, cfg: Any) -> torch.Tensor | None:
        """(B,) bool: rows the update can leave out of its forwards, or None (skip nothing).

        A row is idle when it has no agent token with a nonzero advantage and the algorithm
        says such rows add nothing to its loss or gradient (`algo.idle_zero_advantage_rows(cfg)`:
        a GRPO group whose rewards are all equal, with no KL in the loss and no entropy bonus).
        Not with a value head (PPO trains it on every row) or units of several rows (DPO).
        """
        adv = batch.get("advantages")
        if (not self.skip_zero_advantage or adv is None or self.value_head is not None
                or int(batch.get("unit_size", 1)) != 1 or not algo.idle_zero_advantage_rows(cfg)):
            return None
        mask = batch["loss_mask"] != 0
        active = ((adv[:, None] if adv.dim() == 1 else adv) != 0) & mask
        return (~active.any(-1)).cpu()  # indexes the CPU row indices of `update` (batch on GPU too)

    # -- checkpoints ----------------------------------------------------------------------------
    def save(self, path: str | Path, tokenizer: Any, extra: dict[str, Any],
             files: dict[str, bytes] | None = None) -> Path:
        """Write a checkpoint atomically (`agentrl.learner.checkpoints.write_checkpoint`): the
        policy as a Hugging Face model directory (loads with `AutoModelForCausalLM.from_pretrained`;
        LoRA: the adapters, see `agentrl.learner.lora.load_checkpoint`), optimizer and scheduler
        state, RNG states, the value head (PPO), the reference model, `algo_state`, `extra`
        (step, policy version, data cursor) and `files` (name -> bytes), all in the manifest."""
        state = {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                 "optimizer_steps": self.optimizer_steps, **rng_state()}
        return write_checkpoint(
            path, self.model, tokenizer, trainer_state=state, algo_state=self.algo_state, extra=extra,
            files=files, value_head=self.value_head.state_dict() if self.value_head is not None else None,
            ref_model=self.ref_model.state_dict() if self.ref_model is not None else None)

    def load(self, path: str | Path) -> dict[str, Any]:
        """Restore optimizer, scheduler, RNG and reference state from `save`'s directory (the
        policy weights are loaded by the caller with `from_pretrained`), and the value head and
        `algo_state` when present; a group's checkpoint (`dcp/`) too. Returns `extra`.

        Raises:
            ValueError: this learner has a value head but the checkpoint has none.
        """
        path = Path(path)
        if self.value_head is not None:
            head = read_state(path, VALUE_HEAD)
            if head is None:
                raise ValueError(f"{path}: checkpoint has no value head ({VALUE_HEAD}); it was "
                                 "not written by a learner with a value head (PPO)")
            self.value_head.load_state_dict(head)
        algo_state = read_state(path, ALGO_STATE)
        if algo_state is not None:
            self.algo_state = algo_state
        st = read_state(path, TRAINER_STATE)
        if "optimizer" not in st:  # written by learner ranks (train.learner_workers >= 1)
            self._load_sharded(path)
            st["optimizer"] = self.optimizer.state_dict()
        load_optimizer_state(self.optimizer, st["optimizer"], fused=self.fused)
        self.scheduler.load_state_dict(st["scheduler"])
        self.optimizer_steps = st["optimizer_steps"]
        set_rng_state(st)
        ref = read_state(path, REF_MODEL) if self.ref_model is not None else None
        if ref is not None:
            self.ref_model.load_state_dict(ref)
        return read_state(path, RUN_STATE)

    def _load_sharded(self, path: Path) -> None:
        """Model, value-head, optimizer and reference state from the DCP checkpoint of learner
        ranks (`path`/dcp, `agentrl.learner.rank.LearnerRank.save`), into this unsharded
        in-process learner (DCP without a process group). The RNG states stay as `load` sets
        them (the driver's)."""
        if not (path / SHARDED).is_dir():
            raise ValueError(f"{path}: no optimizer state ({TRAINER_STATE} has none and there is "
                             f"no {SHARDED}/ directory of learner ranks)")
        load_sharded(str(path / SHARDED), self, no_dist=True)


def latest_checkpoint(out_dir: str | Path, on_skip: Callable[[Path, str], None] | None = None) -> Path | None:
    """The newest intact `OUT/checkpoints/step_N` (`agentrl.learner.checkpoints.latest_checkpoint`:
    interrupted saves and checkpoints that fail their manifest are skipped)."""
    return checkpoints.latest_checkpoint(out_dir, on_skip)
