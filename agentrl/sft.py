"""Supervised warm start on reference answers, so a tiny model starts RL from a non-zero
pass rate. A real stage with its own loss curve: token-mean cross-entropy over the answer
tokens (and the end-of-turn token) only; prompt tokens have loss_mask 0.

An env offers reference answers through `env.unwrapped.reference_answer() -> str | None`,
called right after `reset` (code_sandbox returns the task's reference solution).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from agentrl.learner import token_logprobs
from agentrl.rollout.chat import ChatRenderer
from agentrl.trajectory import Trajectory, collate


def sft_examples(env: Any, renderer: ChatRenderer, n: int, *, seed: int) -> list[Trajectory]:
    """Reset `env` with seeds `seed .. seed+n-1` and build one supervised example per task:
    context = the opening messages + generation prompt (mask 0), target = the reference answer's
    ids + end-of-turn (mask 1). Tasks without a reference answer are skipped.

    Raises:
        ValueError: if the env offers no reference answers at all.
    """
    out = []
    get = getattr(env.unwrapped, "reference_answer", None)
    if get is None:
        raise ValueError("sft: this env has no reference_answer(); set sft.steps=0")
    tok = renderer.tokenizer
    for i in range(n):
        obs, info = env.reset(seed=seed + i)
        ans = get()
        if not ans:
            continue
        tr = Trajectory(task_id=str(info.get("task_id", "")))
        tr.append_context(renderer.prompt_ids(obs, tools=info.get("tools")))
        ids = tok.encode(ans, add_special_tokens=False) + [renderer.end_of_turn_id]
        tr.append_sampled(ids, [0.0] * len(ids), text=ans)
        out.append(tr)
    if not out:
        raise ValueError("sft: the env returned no reference answers; set sft.steps=0")
    return out


def sft_train(model: Any, examples: list[Trajectory], *, steps: int, lr: float, batch_size: int,
              pad_id: int, seed: int = 0, grad_clip: float = 1.0,
              log: Callable[[int, float], None] | None = None,
              stop: Callable[[int], bool] | None = None, check_every: int = 10) -> list[float]:
    """Train `model` in place for up to `steps` AdamW steps of `batch_size` examples (sampled
    without replacement, reshuffled each epoch) with a cosine learning-rate decay to 10% of `lr`.
    Every `check_every` steps `stop(steps_done)` may end the stage early (e.g. once the model
    solves enough training tasks, so RL starts with room to improve).

    Returns:
        the loss (nats per answer token) of every step run.
    """
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: 0.1 + 0.9 * 0.5 * (1 + torch.cos(torch.tensor(s / max(steps, 1) * 3.14159)).item()))
    gen = torch.Generator().manual_seed(seed)
    order: list[int] = []
    losses = []
    model.train()
    for step in range(steps):
        if len(order) < batch_size:
            order += torch.randperm(len(examples), generator=gen).tolist()
        idx, order = order[:batch_size], order[batch_size:]
        batch = collate([examples[i] for i in idx], pad_id)
        logp, _ = token_logprobs(model, batch["input_ids"], batch["attention_mask"])
        mask = batch["loss_mask"]
        loss = -(logp * mask).sum() / mask.sum().clamp(min=1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if log:
            log(step, losses[-1])
        if stop is not None and (step + 1) % check_every == 0 and stop(step + 1):
            break
    return losses
