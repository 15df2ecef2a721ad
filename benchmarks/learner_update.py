"""Time of one `Learner.update` with the learner's forward paths, in the same process.

The batch is the TRL benchmark's (`vs_trl.py`): its tiny Qwen2 model (`vs_trl_model.py`), P
prompts of the shared set x G sampled completions of at most N tokens (large configuration:
8 x 8 x 64, the default), one GRPO step as the benchmark runs it (micro-batch = whole batch,
no KL, clip 0.2, token-mean). Arms (`--arms`, each a way `Learner.update` computes the same
logprobs and gradients):

- `off`: `prefix_share=False`, one transformers forward over the padded rows (`token_logprobs`);
- `share`: prefix sharing with the transformers forward and the model's logits gathered at the
  loss positions (`decoder_and_head` switched off);
- `head`: + the fused lm_head/log-softmax/entropy from hidden states (`logprob_head`);
- `static`: + the decoder as plain torch ops (`static_forward`), the library's default;
- `compiled`: + that decoder through `torch.compile` (`train.compile=true`; its first update,
  a warm-up one, compiles).

The arms take turns on one learner (off, share, head, static, off, ...) after warm-up updates,
so all see the same batch and the same machine load; medians of wall and CPU time per arm and
the median ratio of each arm to the first within a round are printed.

    python benchmarks/learner_update.py                       # large: 8 x 8 x 64
    python benchmarks/learner_update.py --prompts 2 --gens 4 --max-tokens 32   # base
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ARMS = ("off", "share", "head", "static", "compiled")


def make_batch(model, tok, prompts: int, gens: int, max_tokens: int, seed: int):
    """P x G trajectories (prompt-major, like the benchmark's groups) sampled from the model."""
    import torch
    from vs_trl_env import frac_a, prompt_text

    from agentrl.algos.shaping import build_batch
    from agentrl.types import Trajectory

    eos, pad = tok.eos_token_id, tok.pad_token_id
    trajs = []
    torch.manual_seed(seed)
    for i in range(prompts):
        ids = tok.apply_chat_template([{"role": "user", "content": prompt_text(i)}],
                                      add_generation_prompt=True, tokenize=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        x = torch.tensor([ids] * gens)
        with torch.no_grad():
            out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=True,
                                 temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=max_tokens,
                                 eos_token_id=eos, pad_token_id=pad)
        for row in out[:, len(ids):].tolist():
            comp = row[: row.index(eos) + 1] if eos in row else row
            t = Trajectory(group_id=i)
            t.append_context(ids)
            t.append_sampled(comp, [0.0] * len(comp), reward=frac_a(tok.decode(comp)))
            trajs.append(t)
    return build_batch(trajs, pad_id=pad)


def main(argv: list[str] | None = None) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--gens", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--arms", default=",".join(ARMS), help=f"comma list of {', '.join(ARMS)}")
    ap.add_argument("--repeats", type=int, default=7, help="timed updates per arm (>= 5)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed updates per arm first")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    sys.path.insert(0, str(HERE))
    import torch

    torch.set_num_threads(a.threads)
    from vs_trl_model import build_tiny_qwen

    from agentrl.algos import get_algorithm
    from agentrl.config import algo_config
    from agentrl.learner.local import Learner
    from agentrl.models.tiny import load_model

    with tempfile.TemporaryDirectory(prefix="learner_update_") as d:
        build_tiny_qwen(d)
        model, tok = load_model(d)
    model.eval()
    batch = make_batch(model, tok, a.prompts, a.gens, a.max_tokens, a.seed)
    cfg = algo_config(name="grpo", group_size=a.gens, kl_coef=0.0, clip_low=0.2, clip_high=0.2,
                     agg="token-mean", scale="std")
    algo = get_algorithm("grpo")
    batch["advantages"], _ = algo.advantages(batch, cfg)
    learner = Learner(model, lr=1e-3, weight_decay=0.0, grad_clip=1.0, temperature=1.0,
                      micro_batch_size=a.prompts * a.gens)
    n_tok = int(batch["loss_mask"].sum())
    print(f"batch: {tuple(batch['input_ids'].shape)} (rows, width), {n_tok} trained tokens, "
          f"prompt {int(batch['loss_mask'][0].nonzero()[0])} tokens; fused AdamW: {learner.fused}; "
          f"torch threads {torch.get_num_threads()}")

    import agentrl.learner.prefix_share as ps

    arms = a.arms.split(",")
    unknown = set(arms) - set(ARMS)
    if unknown:
        ap.error(f"--arms: unknown {sorted(unknown)}; allowed: {', '.join(ARMS)}")
    split, static_ok = ps.decoder_and_head, ps.static_forward_supported

    def set_arm(arm: str) -> None:
        learner.prefix_share, learner.compile = arm != "off", arm == "compiled"
        learner.train_forward = learner._train_forward()  # the forward is chosen from these
        ps.decoder_and_head = split if arm in ("head", "static", "compiled") else (lambda m: None)
        ps.static_forward_supported = static_ok if arm in ("static", "compiled") else (lambda m: False)

    times: dict[str, list[tuple[float, float]]] = {arm: [] for arm in arms}
    try:
        for i in range(len(arms) * (a.warmup + a.repeats)):
            arm = arms[i % len(arms)]
            set_arm(arm)
            sub = dict(batch)
            t0, c0 = time.perf_counter(), time.process_time()
            learner.update(sub, algo, cfg)
            t1, c1 = time.perf_counter(), time.process_time()
            if i >= len(arms) * a.warmup:
                times[arm].append((t1 - t0, c1 - c0))
    finally:
        ps.decoder_and_head, ps.static_forward_supported = split, static_ok
    res: dict[str, float] = {}
    first = arms[0]
    for arm, v in times.items():
        wall, cpu = statistics.median(w for w, _ in v), statistics.median(c for _, c in v)
        paired = statistics.median(x[1] / y[1] for x, y in zip(v, times[first]))
        res.update({f"{arm}_wall_s": wall, f"{arm}_cpu_s": cpu, f"{arm}_vs_{first}": paired})
        print(f"{arm:>6}: {wall:.3f} s wall, {cpu:.3f} s CPU (median of {a.repeats}); "
              f"{paired:.2f}x the CPU time of {first} (median of paired ratios)")
    return res


if __name__ == "__main__":
    main()
