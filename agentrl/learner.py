"""The learner: teacher-forced logprobs, the update loop over epochs x minibatches x
micro-batches, the frozen reference model, and checkpoints.

Logprobs are taken from `logits / temperature`, the distribution the sampler drew from, so a
policy that has not changed gives a PPO ratio of exactly 1 (case L4).
"""

from __future__ import annotations

import copy
import json
import math
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch


def token_logprobs(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
                   temperature: float = 1.0, with_entropy: bool = False,
                   entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Teacher-forced log-probability of every token given the tokens before it.

    Args:
        model: a causal LM returning `.logits` (B, T, V).
        input_ids: (B, T) long, right-padded.
        attention_mask: (B, T) 0/1.
        temperature: logits are divided by it (as the sampler did; 0 is treated as 1).
        with_entropy: also return the per-token entropy of the tempered distribution (nats).
        entropy_grad: keep the entropy in the autograd graph (for an entropy bonus); else it is
            computed without gradient (a metric).

    Returns:
        logp (B, T) float32 with `logp[:, t] = log p(input_ids[:, t] | input_ids[:, :t])` and
        `logp[:, 0] = 0` (the first token has no context); entropy (B, T) or None, aligned the
        same way (entropy of the distribution that produced token t).
    """
    t = temperature if temperature and temperature > 0 else 1.0
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1].float()
    if t != 1.0:
        logits = logits / t
    lse = torch.logsumexp(logits, dim=-1)
    picked = logits.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    logp = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    logp[:, 1:] = picked - lse
    ent = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            lg = logits if entropy_grad else logits.detach()
            p = torch.softmax(lg, dim=-1)
            ent = torch.zeros_like(logp)
            ent[:, 1:] = (lse if entropy_grad else lse.detach()) - (p * lg).sum(-1)
    return logp, ent


def _slice(batch: dict[str, Any], idx: torch.Tensor) -> dict[str, Any]:
    """Rows `idx` of every (B, ...) tensor in the batch, trimmed to the longest row."""
    width = int(batch["lengths"][idx].max())
    out: dict[str, Any] = {}
    for k, v in batch.items():
        if isinstance(v, torch.Tensor) and v.dim() >= 1 and v.shape[0] == batch["input_ids"].shape[0]:
            v = v[idx]
            if v.dim() == 2:
                v = v[:, :width]
        out[k] = v
    return out


class Learner:
    """Holds the policy, its optimizer and scheduler, and the frozen reference model.

    Args:
        model: the policy (a transformers causal LM), trained in place.
        lr, weight_decay, grad_clip: AdamW settings and the max global grad norm.
        temperature: the sampling temperature (logits are scaled by it).
        micro_batch_size: sequences per forward/backward.
        use_ref: keep a frozen copy as the KL reference.
    """

    def __init__(self, model: Any, *, lr: float, weight_decay: float = 0.0, grad_clip: float = 1.0,
                 temperature: float = 1.0, micro_batch_size: int = 16, use_ref: bool = False,
                 total_steps: int | None = None):
        self.model = model
        self.model.train()
        self.grad_clip = grad_clip
        self.temperature = temperature
        self.micro_batch_size = micro_batch_size
        self.optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda _: 1.0)
        self.ref_model = None
        if use_ref:
            self.ref_model = copy.deepcopy(model).eval()
            for p in self.ref_model.parameters():
                p.requires_grad_(False)
        self.optimizer_steps = 0

    # -- forward passes -----------------------------------------------------------------------
    @torch.no_grad()
    def logprobs(self, batch: dict[str, Any], *, ref: bool = False) -> torch.Tensor:
        """(B, T) logprobs of the policy (or the reference) on the batch, without gradient."""
        model = self.ref_model if ref else self.model
        out = torch.zeros_like(batch["loss_mask"])
        B = batch["input_ids"].shape[0]
        for s in range(0, B, self.micro_batch_size):
            idx = torch.arange(s, min(B, s + self.micro_batch_size))
            sub = _slice(batch, idx)
            lp, _ = token_logprobs(model, sub["input_ids"], sub["attention_mask"],
                                   temperature=self.temperature)
            out[idx, : lp.shape[1]] = lp
        return out

    # -- the update -----------------------------------------------------------------------------
    def update(self, batch: dict[str, Any], algo: Any, cfg: Any, *, epochs: int = 1,
               minibatches: int = 1, seed: int = 0, on_policy_shortcut: bool = True
               ) -> dict[str, float]:
        """Run `epochs` x `minibatches` optimizer steps of `algo.loss` on the batch.

        `batch["old_logprobs"]` is recomputed by the learner at the start of the update (the
        PPO ratio's denominator, contract 3). With a single optimizer step and no importance
        correction the policy has not moved yet, so the same forward pass gives both and the
        extra pass is skipped (`on_policy_shortcut`).

        Returns:
            metrics averaged over optimizer steps (`loss/*`, `grad_norm`, ...).
        """
        B = batch["input_ids"].shape[0]
        single = epochs * minibatches == 1 and on_policy_shortcut and "tis_weights" not in batch
        if not single:
            batch["old_logprobs"] = self.logprobs(batch)
        gen = torch.Generator().manual_seed(seed)
        sums: dict[str, float] = {}
        n_steps = 0
        for _ in range(epochs):
            perm = torch.randperm(B, generator=gen) if minibatches > 1 else torch.arange(B)
            for mb in torch.tensor_split(perm, minibatches):
                if len(mb) == 0:
                    continue
                num_tokens = float(batch["loss_mask"][mb].sum())
                self.optimizer.zero_grad(set_to_none=True)
                for micro in torch.split(mb, self.micro_batch_size):
                    sub = _slice(batch, micro)
                    sub["max_len"] = batch["input_ids"].shape[1]
                    logp, ent = token_logprobs(self.model, sub["input_ids"], sub["attention_mask"],
                                               temperature=self.temperature, with_entropy=True,
                                               entropy_grad=getattr(cfg, "entropy_coef", 0) > 0)
                    if single:
                        sub["old_logprobs"] = logp.detach()
                    loss, m = algo.loss(logp, sub, cfg, num_tokens=max(num_tokens, 1.0),
                                        num_seqs=len(mb), entropy=ent)
                    loss.backward()
                    w = len(micro) / len(mb)  # weight of per-micro-batch means
                    mask = sub["loss_mask"]
                    m["entropy"] = float((ent * mask).sum() / mask.sum().clamp(min=1))
                    for k, v in m.items():
                        sums[k] = sums.get(k, 0.0) + float(v) * w
                    # the loss is already normalised by the minibatch's counts: micro losses add up
                    sums["loss"] = sums.get("loss", 0.0) + float(loss.detach())
                gn = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
                sums["grad_norm"] = sums.get("grad_norm", 0.0) + float(gn)
                self.optimizer.step()
                self.scheduler.step()
                self.optimizer_steps += 1
                n_steps += 1
        return {k: v / max(n_steps, 1) for k, v in sums.items()}

    # -- checkpoints ----------------------------------------------------------------------------
    def save(self, path: str | Path, tokenizer: Any, extra: dict[str, Any]) -> Path:
        """Write a checkpoint atomically (a temp dir renamed into place): the policy as a Hugging
        Face model directory (loads with `AutoModelForCausalLM.from_pretrained`), optimizer and
        scheduler state, RNG states, and `extra` (step, policy version, data cursor) as JSON."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        self.model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        torch.save({"optimizer": self.optimizer.state_dict(),
                    "scheduler": self.scheduler.state_dict(),
                    "optimizer_steps": self.optimizer_steps,
                    "torch_rng": torch.get_rng_state(),
                    "numpy_rng": np.random.get_state(),
                    "python_rng": random.getstate()}, tmp / "trainer_state.pt")
        if self.ref_model is not None:
            torch.save(self.ref_model.state_dict(), tmp / "ref_model.pt")
        (tmp / "agentrl_state.json").write_text(json.dumps(extra, indent=1))
        shutil.rmtree(path, ignore_errors=True)
        os.replace(tmp, path)
        return path

    def load(self, path: str | Path) -> dict[str, Any]:
        """Restore optimizer, scheduler, RNG and reference state from `save`'s directory (the
        policy weights are loaded by the caller with `from_pretrained`). Returns `extra`."""
        path = Path(path)
        st = torch.load(path / "trainer_state.pt", weights_only=False)
        self.optimizer.load_state_dict(st["optimizer"])
        self.scheduler.load_state_dict(st["scheduler"])
        self.optimizer_steps = st["optimizer_steps"]
        torch.set_rng_state(st["torch_rng"])
        np.random.set_state(st["numpy_rng"])
        random.setstate(st["python_rng"])
        if self.ref_model is not None and (path / "ref_model.pt").exists():
            self.ref_model.load_state_dict(torch.load(path / "ref_model.pt"))
        return json.loads((path / "agentrl_state.json").read_text())


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    """The newest complete `OUT/checkpoints/step_N` (temp dirs of an interrupted save are skipped)."""
    ck = Path(out_dir) / "checkpoints"
    if not ck.is_dir():
        return None
    done = [p for p in ck.iterdir() if p.name.startswith("step_") and not p.name.endswith(".tmp")
            and (p / "agentrl_state.json").exists()]
    return max(done, key=lambda p: int(p.name.split("_")[1]), default=None)


def is_finite(x: float) -> bool:
    return not (math.isnan(x) or math.isinf(x))
