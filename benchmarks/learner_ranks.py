"""Learner ranks on this machine: update throughput and memory of the in-process learner, 1 and
2 gloo ranks (each 1 thread), and weight-sync seconds per push vs model size.

Update throughput: one GRPO update (token-mean, micro-batch 8, plain transformers forward:
`prefix_share=False` in-process, as the ranks run it) on R rows of about T tokens of a random
Qwen2 model, after one warm-up update; trained tokens (attention-mask ones) per second, the
median of `--repeats` updates, and each arm's peak RSS per process (a rank's own; in-process:
this process's rise over its start). Arms run one after another (same machine, same run).

Weight sync: seconds of one `state_dict_for_engines()` + `HFEngine.update_weights` (the
in-process path) and of the same from 2 ranks (gathered tensor by tensor, to the driver through
the object store, then into the engine), for models of about 1M, 20M and 100M parameters;
megabytes per push.

    python benchmarks/learner_ranks.py                 # both parts (about 10 min on 2 cores)
    python benchmarks/learner_ranks.py --quick         # a smoke run (small sizes)
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

CONFIGS = {  # name: Qwen2 config keywords
    "embedded (0.9M)": dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                            num_key_value_heads=4, intermediate_size=384, vocab_size=1024),
    "qwen2-20M": dict(hidden_size=384, num_hidden_layers=8, num_attention_heads=6, num_key_value_heads=2,
                      intermediate_size=1536, vocab_size=16384),
    "qwen2-100M": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                       num_key_value_heads=4, intermediate_size=2688, vocab_size=32768),
}


def make_model(kw: dict, seed: int = 0):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(max_position_embeddings=1024, tie_word_embeddings=True, **kw)
    return Qwen2ForCausalLM(cfg).float()


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def make_batch(vocab: int, rows: int, tokens: int, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(tokens // 2, tokens + 1, (rows,), generator=g)
    T = int(lengths.max())
    pos = torch.arange(T)[None]
    attn = (pos < lengths[:, None]).long()
    ids = torch.randint(3, vocab, (rows, T), generator=g) * attn
    loss_mask = ((pos >= tokens // 4) & (pos < lengths[:, None])).float()
    adv = torch.randn(rows, generator=g)
    return {"input_ids": ids, "attention_mask": attn, "loss_mask": loss_mask, "lengths": lengths,
            "sampler_logprobs": torch.zeros(rows, T), "advantages": adv}


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def time_updates(learner, batch, repeats: int) -> list[float]:
    from agentrl.algos import get_algorithm
    from agentrl.config import algo_config

    algo = get_algorithm("grpo")
    cfg = algo_config(name="grpo")
    learner.update(dict(batch), algo, cfg)  # warm-up
    out = []
    for s in range(repeats):
        t0 = time.perf_counter()
        learner.update(dict(batch), algo, cfg, seed=s)
        out.append(time.perf_counter() - t0)
    return out


def in_process_arm(name: str, rows: int, tokens: int, repeats: int) -> dict:
    """The in-process arm in a fresh process (so its peak RSS is its own)."""
    code = (f"import json,sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import learner_ranks as b; "
            f"print(json.dumps(b._in_process({name!r}, {rows}, {tokens}, {repeats})))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    return json.loads(r.stdout.strip().splitlines()[-1])


def _in_process(name: str, rows: int, tokens: int, repeats: int) -> dict:
    from agentrl.learner.local import Learner

    torch.set_num_threads(1)
    base = rss_mb()
    model = make_model(CONFIGS[name])
    batch = make_batch(CONFIGS[name]["vocab_size"], rows, tokens)
    learner = Learner(model, lr=1e-4, micro_batch_size=8, prefix_share=False)
    times = time_updates(learner, batch, repeats)
    return {"s": statistics.median(times), "rss_mb": [rss_mb()], "base_mb": base,
            "tokens": int(batch["attention_mask"].sum())}


def group_arm(name: str, workers: int, rows: int, tokens: int, repeats: int) -> dict:
    import ray

    from agentrl.learner.group import LearnerGroup

    model = make_model(CONFIGS[name])
    batch = make_batch(CONFIGS[name]["vocab_size"], rows, tokens)
    group = LearnerGroup(model, dict(lr=1e-4, micro_batch_size=8, prefix_share=False), workers=workers)
    try:
        times = time_updates(group, batch, repeats)
        rss = ray.get([r.peak_rss_mb.remote() for r in group.ranks])
    finally:
        group.shutdown()
    return {"s": statistics.median(times), "rss_mb": rss, "tokens": int(batch["attention_mask"].sum())}


def sync_arms(name: str, repeats: int) -> dict:
    from agentrl.learner.group import LearnerGroup
    from agentrl.learner.local import Learner
    from agentrl.rollout.engines.hf import HFEngine

    model = make_model(CONFIGS[name])
    engine = HFEngine(copy.deepcopy(model).eval(), None, torch_threads=1)
    mb = sum(v.numel() * v.element_size() for v in model.state_dict().values()) / 2**20
    local = Learner(copy.deepcopy(model), lr=1e-4, prefix_share=False)
    res = {"params": n_params(model), "mb": mb}
    ts = []
    for v in range(repeats):
        t0 = time.perf_counter()
        engine.update_weights(local.state_dict_for_engines(), v + 1)
        ts.append(time.perf_counter() - t0)
    res["in_process_s"] = statistics.median(ts)
    del local
    group = LearnerGroup(copy.deepcopy(model), dict(lr=1e-4, prefix_share=False), workers=2)
    try:
        ts = []
        for v in range(repeats):
            t0 = time.perf_counter()
            engine.update_weights(group.state_dict_for_engines(), v + 1)
            ts.append(time.perf_counter() - t0)
        res["ranks2_s"] = statistics.median(ts)
    finally:
        group.shutdown()
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=192)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    ap.add_argument("--json", default="benchmarks/results/learner_ranks.json")
    args = ap.parse_args()
    from agentrl.infra.cluster import ensure_ray

    ensure_ray(None, num_cpus=2)
    update_models = ["embedded (0.9M)"] if args.quick else ["embedded (0.9M)", "qwen2-20M"]
    sync_models = ["embedded (0.9M)"] if args.quick else list(CONFIGS)
    rows, tokens = (8, 48) if args.quick else (args.rows, args.tokens)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    out: dict = {"commit": commit, "rows": rows, "tokens": tokens, "update": {}, "sync": {}}
    print(f"commit {commit}; update: {rows} rows of <= {tokens} tokens, micro-batch 8, GRPO, 1 thread per process")
    print("| model | params | arm | update s | tokens/s | vs in-process | peak RSS per process (MB) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name in update_models:
        p = n_params(make_model(CONFIGS[name]))
        arms = {"in-process": in_process_arm(name, rows, tokens, args.repeats),
                "1 rank": group_arm(name, 1, rows, tokens, args.repeats),
                "2 ranks": group_arm(name, 2, rows, tokens, args.repeats)}
        base = arms["in-process"]["s"]
        for arm, r in arms.items():
            r["tokens_per_s"] = r["tokens"] / r["s"]
            r["speedup"] = base / r["s"]
            print(f"| {name} | {p / 1e6:.1f}M | {arm} | {r['s']:.3f} | {r['tokens_per_s']:.0f} | "
                  f"{r['speedup']:.2f}x | {', '.join(f'{x:.0f}' for x in r['rss_mb'])} |")
        out["update"][name] = arms
    print("\n| model | params | MB per push | in-process s | 2 ranks -> driver s |")
    print("| --- | --- | --- | --- | --- |")
    for name in sync_models:
        r = sync_arms(name, args.repeats)
        out["sync"][name] = r
        print(f"| {name} | {r['params'] / 1e6:.1f}M | {r['mb']:.1f} | {r['in_process_s']:.3f} | {r['ranks2_s']:.3f} |")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=1))
    print(f"written: {args.json}")


if __name__ == "__main__":
    main()
