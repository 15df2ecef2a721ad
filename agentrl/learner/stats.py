"""The metrics of one `Learner.update`, accumulated over micro-batches, optimizer steps and
ranks."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from agentrl.learner.dist import DataParallel

SUMMED_METRICS = frozenset({"loss", "pg_loss", "vf_loss", "kl", "distill_kl"})
"""Loss metrics that are a micro-batch's share of its minibatch's value (normalised by the
minibatch's counts, as the losses are): `Learner.update` adds them up over micro-batches (and
ranks), then averages them over optimizer steps. Other metrics are micro-batch means, averaged
weighted by agent tokens (then over steps); `*_min` and `*_max` metrics are the minimum and
maximum over the whole update."""


@dataclass
class UpdateStats:
    """The metrics of one update, accumulated over micro-batches and optimizer steps.

    Loss terms in `SUMMED_METRICS` are added up over micro-batches (and ranks), other metrics
    are micro-batch means weighted by agent tokens; both are averaged over optimizer steps.
    `*_min` / `*_max` metrics are the extremes over the update. The sampler/learner mismatch
    `logp_mismatch` is the mean |old_logprobs - sampler_logprobs| over agent tokens and
    `logp_mismatch_max` its largest value (nats)."""

    sums: dict[str, float] = field(default_factory=dict)  # additive (and, on ranks, over ranks)
    lows: dict[str, float] = field(default_factory=dict)
    highs: dict[str, float] = field(default_factory=dict)
    grad_norms: float = 0.0  # the sum of the global gradient norms of the steps taken
    steps: int = 0
    skipped: int = 0
    idle: int = 0  # rows left out of the forwards
    mism: list[float] = field(default_factory=lambda: [0.0, 0.0])  # sum |old - sampler|, tokens
    mism_max: float = -math.inf

    def mismatch(self, logp: torch.Tensor, sampler: torch.Tensor, mask: torch.Tensor) -> None:
        """Add the gap between learner logprobs `logp` and `sampler` (B, T) on agent tokens."""
        gap = (logp - sampler).abs()
        self.mism[0] += float((gap * mask).sum())
        self.mism[1] += float(mask.sum())
        if bool((mask != 0).any()):
            self.mism_max = max(self.mism_max, float(gap[mask != 0].max()))

    def micro(self, m: dict[str, Any], loss: torch.Tensor, ent: torch.Tensor, mask: torch.Tensor,
              fwd_tokens: float, rows_share: float) -> None:
        """Add a micro-batch's loss metrics `m`, its `loss` and mean entropy (B, T) `ent` over
        `mask`. Its means weigh its share of the minibatch's `fwd_tokens` forwarded agent tokens
        (`rows_share`, its share of the forwarded rows, when there are none)."""
        w = float(mask.sum()) / fwd_tokens if fwd_tokens > 0 else rows_share
        m["entropy"] = float((ent.detach() * mask).sum() / mask.sum().clamp(min=1))
        m["loss"] = float(loss.detach())
        for k, v in m.items():
            v = float(v)
            if k.endswith("_min"):
                self.lows[k] = min(self.lows.get(k, math.inf), v)
            elif k.endswith("_max"):
                self.highs[k] = max(self.highs.get(k, -math.inf), v)
            else:  # shares of the minibatch's loss terms add up; means are weighted
                self.sums[k] = self.sums.get(k, 0.0) + v * (1.0 if k in SUMMED_METRICS else w)

    def step(self, grad_norm: float | None) -> None:
        """Count an optimizer step: taken with `grad_norm`, or skipped (None)."""
        self.steps += 1
        if grad_norm is None:
            self.skipped += 1
        else:
            self.grad_norms += grad_norm

    def result(self, dp: DataParallel | None, *, rows: int | None) -> dict[str, float]:
        """The update's metrics (over every rank with `dp`): `grad_norm` the mean over the steps
        taken (NaN: none was), `skipped_nonfinite` the steps skipped, `skipped_rows_frac` the
        idle rows over `rows` (None: rows were never left out)."""
        sums, lows, highs, mism = self.sums, self.lows, self.highs, self.mism
        if self.mism_max > -math.inf:
            highs["logp_mismatch_max"] = self.mism_max
        if dp is not None:  # every rank's micro-batch sums (a rank may have had none)
            tot = dp.reduce_floats({**sums, "__mism_abs": mism[0], "__mism_n": mism[1]})
            mism = [tot.pop("__mism_abs", 0.0), tot.pop("__mism_n", 0.0)]
            sums = tot
            lows, highs = dp.reduce_floats(lows, "min"), dp.reduce_floats(highs, "max")
        out = {k: v / max(self.steps, 1) for k, v in sums.items()}
        out.update(lows)
        out.update(highs)
        if self.steps:
            taken = self.steps - self.skipped
            out["grad_norm"] = self.grad_norms / taken if taken else math.nan
            out["skipped_nonfinite"] = float(self.skipped)
        if rows is not None and self.steps:
            out["skipped_rows_frac"] = self.idle / max(1, rows)
        if mism[1] > 0:
            out["logp_mismatch"] = mism[0] / mism[1]
        return out
