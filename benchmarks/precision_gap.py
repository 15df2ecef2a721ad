"""Reduced precision, measured: the logprob gap of a bf16 / int8 reference and of a bf16 sampler
against float32, and what it does to the KL term and the loss, on real sampled trajectories.

Per model (`--models`): the embedded default (hidden 128, 4 layers, 0.9M parameters) and a
Qwen2 of 19.3M parameters (key `qwen2-21M`) built by the same builder from a config (hidden
512, 6 layers, 8 heads, MLP 1536, the same 1024-token tokenizer), both with random initial weights, then:

1. `train()` in a subprocess on the main job's env (`code_sandbox`, GRPO, `algo.kl_coef`): a
   short supervised warm start of `--sft-steps` steps on reference solutions (so the
   distribution is far from uniform), then `--rl-steps` GRPO steps with the KL in the loss. The
   reference is the warm-started model (OUT/sft_model: the policy when RL started), the policy
   the last checkpoint.
2. Trajectories: `collect` on training tasks (`--tasks` x `--group`, the same task seeds and
   sampling seed) with the in-process HF engine holding the policy in float32 and in bfloat16
   (`model.dtype=bfloat16`, `agentrl.run.rollout_engine`).
3. Sampler gap: |sampler logprob - the float32 learner's teacher-forced logprob| over the agent
   tokens (mean, p99, max): what `loss/logp_mismatch` and `loss/logp_mismatch_max` log.
4. Reference gap: the reference worker's own code (`agentrl.learner.frozen.FrozenModelActor`, here in
   process) in float32, bfloat16 and int8 on the float32 engine's trajectories:
   |logp_x - logp_fp32| over the agent tokens (mean, p99, max; what `ref/logp_gap_*` logs on a
   sample), and the seconds of one reference pass over the batch (1 thread, after a warm-up
   pass; on a shared machine only indicative).
5. The KL term and the loss with each reference, at the start of the update (logp = old, the
   float32 learner's): token-mean k1 and k3 over the whole batch (`agentrl.algos.kl.kl`, k3 the default
   `algo.kl_kind`), the per-sequence k1 sum (the KL of the reward in PPO / RLOO /
   REINFORCE++); on the first `--grad-rows` rows, GRPO's loss (`grpo.loss`, `algo.kl_coef`)
   and its difference from the float32 reference's, and the L2 norm of the change of the loss
   gradient w.r.t. the policy's parameters (against the policy-gradient part's norm when that
   is not 0). Twice: for the policy after the RL steps, and for the policy at RL start (= the
   reference, the situation of every run's first step: the float32 KL is exactly 0, so what a
   reduced reference shows there is its rounding alone).

Writes benchmarks/results/precision_gap.json and .md.

    python benchmarks/precision_gap.py                              # both models (~20 min on 2 cores)
    python benchmarks/precision_gap.py --models embedded --sft-steps 20 --rl-steps 1   # a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

MODELS = {  # name: (`model.*` overrides of the embedded builder, vocab 1024 in both; the run's budget)
    "embedded": ([], {"sft_steps": 200, "sft_batch": 32, "rl_steps": 4, "rl_tasks": 16, "rl_group": 8,
                      "tasks": 16, "group": 8}),
    # 25x the compute per token: a shorter warm start and fewer, smaller RL steps
    "qwen2-21M": (["model.hidden_size=512", "model.num_layers=6", "model.num_heads=8",
                   "model.intermediate_size=1536"],
                  {"sft_steps": 60, "sft_batch": 16, "rl_steps": 2, "rl_tasks": 8, "rl_group": 4,
                   "tasks": 8, "group": 8}),
}
RESULTS = Path(__file__).resolve().parent / "results"


def budget(name: str, args: argparse.Namespace) -> dict[str, int]:
    """Model `name`'s run budget (`MODELS`), each entry replaced by its command-line value when
    one was given."""
    b = dict(MODELS[name][1])
    b.update({k: v for k, v in vars(args).items() if k in b and v is not None})
    return b


def run_overrides(name: str, out: Path, args: argparse.Namespace) -> list[str]:
    """The `train()` overrides of model `name`'s warm start + RL steps."""
    b = budget(name, args)
    return [f"out={out}", "env.name=code_sandbox", "algo.name=grpo", f"algo.kl_coef={args.kl_coef}",
            f"sft.steps={b['sft_steps']}", "sft.stop_pass_rate=null", "sft.stop_pass_at_k=null",
            f"sft.batch_size={b['sft_batch']}", f"train.steps={b['rl_steps']}",
            f"rollout.tasks_per_step={b['rl_tasks']}", f"algo.group_size={b['rl_group']}",
            f"rollout.max_tokens={args.tokens}", "train.eval_tasks=4", "train.eval_samples=1",
            "train.log_rollouts_every=0", "quiet=true", "log.tensorboard=false", f"seed={args.seed}",
            *MODELS[name][0]]


def train_model(name: str, out: Path, args: argparse.Namespace) -> float:
    """`train()` of model `name` in a fresh subprocess; returns its wall seconds."""
    code = ("import sys; from agentrl.config import load_config; from agentrl.train import train; "
            "train(load_config(None, sys.argv[1:]))")
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code, *run_overrides(name, out, args)], check=True,
                   env={**os.environ, "OMP_NUM_THREADS": "1"})
    return time.perf_counter() - t0


def stats(x: torch.Tensor) -> dict[str, float]:
    """mean, p99 and max of a 1-D float tensor (nats)."""
    x = x.double()
    return {"mean": float(x.mean()), "p99": float(torch.quantile(x, 0.99)), "max": float(x.max())}


def sample(policy_dir: str, dtype: str, out: Path, args: argparse.Namespace, tasks: int,
           group: int) -> tuple[list, int]:
    """The trajectories of `tasks` training tasks x `group` episodes sampled by the
    in-process HF engine holding the policy in `dtype` (seeds fixed by `--seed`), and the
    tokenizer's pad id."""
    from concurrent.futures import ThreadPoolExecutor

    from agentrl.config import load_config
    from agentrl.models.tiny import load_model
    from agentrl.rollout.chat import ChatRenderer
    from agentrl.rollout.collect import collect
    from agentrl.rollout.engines.base import SamplingParams
    from agentrl.rollout.envs import build_env
    from agentrl.run import rollout_engine

    c = load_config(None, [f"model.path={policy_dir}", f"model.dtype={dtype}", "env.name=code_sandbox",
                           f"rollout.max_tokens={args.tokens}"])
    model, tok = load_model(policy_dir)
    engine = rollout_engine(c, model, tok, out)
    renderer = ChatRenderer(tok)
    params = SamplingParams(temperature=c.rollout.temperature, top_p=c.rollout.top_p,
                            max_tokens=c.rollout.max_tokens, stop_token_ids=renderer.stop_ids)
    n = tasks * group
    envs = [build_env(c, "train") for _ in range(n)]
    seeds = [10_000 + args.seed * 1000 + i for i in range(tasks)]
    with ThreadPoolExecutor(c.rollout.env_threads) as pool:
        trajs = collect(engine, renderer, envs, seeds, group, params, c, pool, group_base=0,
                        sample_seed=args.seed * 7 + 1)
    return trajs, tok.pad_token_id


def kl_and_loss(policy_dir: str, batch: dict, refs: dict[str, torch.Tensor], kl_coef: float,
                grad_rows: int) -> dict:
    """For each reference's logprobs (B, T): token-mean k1 / k3 of the float32 policy against
    it (nats per token) and the mean per-sequence k1 sum (nats per sequence), over the whole
    batch; GRPO's loss at logp = old and the L2 norm of its gradient w.r.t. the policy's
    parameters, over the first `grad_rows` rows (whole groups: advantages from the whole
    batch); then the differences from the float32 reference's, the gradient's as a share of the
    policy-gradient part's norm (`grad_diff_vs_pg`, None when that is 0: every group's rewards
    equal)."""
    from agentrl.algos import get_algorithm
    from agentrl.algos.common import sequence_kl
    from agentrl.algos.kl import kl
    from agentrl.config import algo_config
    from agentrl.learner.forward import disable_dropout, slice_rows, token_logprobs
    from agentrl.models.tiny import load_model

    grpo = get_algorithm("grpo")
    cfg = algo_config(name="grpo", kl_coef=kl_coef)
    pg_cfg = algo_config(name="grpo", kl_coef=0.0)
    model, _ = load_model(policy_dir)
    disable_dropout(model)
    params = [p for p in model.parameters() if p.requires_grad]
    mask = batch["loss_mask"] != 0
    full = dict(batch)
    full["advantages"], _ = grpo.advantages(full, cfg)
    sub = slice_rows(full, torch.arange(min(grad_rows, full["input_ids"].shape[0])))
    n_tok, n_seq = float(sub["loss_mask"].sum()), sub["input_ids"].shape[0]
    logp, _ = token_logprobs(model, sub["input_ids"], sub["attention_mask"], temperature=1.0)

    def grad_of(loss: torch.Tensor) -> torch.Tensor:
        g = torch.autograd.grad(loss, params, allow_unused=True, retain_graph=True)
        return torch.cat([(x if x is not None else torch.zeros_like(p)).flatten() for x, p in zip(g, params)])

    pg, _ = grpo.loss(logp, sub, pg_cfg, num_tokens=n_tok, num_seqs=n_seq)
    pg_norm = float(grad_of(pg).norm())  # the policy-gradient part alone (the same for every reference)
    out: dict[str, dict] = {}
    grads: dict[str, torch.Tensor] = {}
    for name, ref in refs.items():
        full["ref_logprobs"] = ref
        row = {k: float(kl(full["old_logprobs"], ref, k)[mask].mean()) for k in ("k1", "k3")}
        row["seq_k1"] = sequence_kl(full)
        sub["ref_logprobs"] = ref[: n_seq, : sub["input_ids"].shape[1]]
        loss, m = grpo.loss(logp, sub, cfg, num_tokens=n_tok, num_seqs=n_seq)
        grads[name] = grad_of(loss)
        row["loss"], row["kl_term"] = float(loss.detach()), float(m.get("kl", 0.0))
        row["grad_norm"], row["pg_grad_norm"] = float(grads[name].norm()), pg_norm
        out[name] = row
    for name in refs:
        if name == "float32":
            continue
        r, f = out[name], out["float32"]
        r["loss_diff"] = r["loss"] - f["loss"]
        r["k1_diff"], r["k3_diff"] = r["k1"] - f["k1"], r["k3"] - f["k3"]
        # the change of the loss gradient a reduced reference makes, against the policy gradient
        r["grad_diff_norm"] = float((grads[name] - grads["float32"]).norm())
        r["grad_diff_vs_pg"] = r["grad_diff_norm"] / pg_norm if pg_norm > 0 else None
    return out


def measure(name: str, out: Path, args: argparse.Namespace) -> dict:
    """All figures of model `name` (its run in OUT)."""
    from agentrl.algos.shaping import build_batch
    from agentrl.learner.checkpoints import latest_checkpoint
    from agentrl.learner.frozen import FrozenModelActor as ReferenceActor
    from agentrl.learner.local import Learner
    from agentrl.models.tiny import load_model

    torch.set_num_threads(1)
    b = budget(name, args)
    ref_dir, policy_dir = str(out / "sft_model"), str(latest_checkpoint(out))
    res: dict = {"params": sum(p.numel() for p in load_model(ref_dir)[0].parameters())}
    sft = [json.loads(x) for x in (out / "sft_metrics.jsonl").read_text().splitlines()]
    losses = [r["sft/loss"] for r in sft if "sft/loss" in r]
    res["sft_loss_first_last"] = [losses[0], losses[-1]]
    rl = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    res["rl_kl"] = [r.get("loss/kl") for r in rl if "loss/loss" in r]
    actors = {dt: ReferenceActor(ref_dir, dtype=dt, temperature=1.0, micro_batch_size=8)
              for dt in ("float32", "bfloat16", "int8")}
    for policy_name, pdir in (("after_rl", policy_dir), ("at_rl_start", ref_dir)):
        part: dict = {}
        trajs, pad = {}, 0
        for dt in (("float32", "bfloat16") if policy_name == "after_rl" else ("float32",)):
            trajs[dt], pad = sample(pdir, dt, out / f"engine_{policy_name}_{dt}", args, b["tasks"], b["group"])
        learner = Learner(load_model(pdir)[0], lr=1e-4, micro_batch_size=8)  # the float32 learner
        for dt, tr in trajs.items():
            batch = build_batch(tr, pad_id=pad)
            old = learner.logprobs(batch)
            mask = batch["loss_mask"] != 0
            part[f"sampler_{dt}"] = {**stats((batch["sampler_logprobs"] - old).abs()[mask]),
                                     "tokens": int(mask.sum()), "rows": len(tr),
                                     "neg_logp_mean": float(-old[mask].mean())}
        batch = build_batch(trajs["float32"], pad_id=pad)
        part["reward_mean"] = float(batch["scores"].nanmean())
        batch["old_logprobs"] = learner.logprobs(batch)
        args_ = (batch["input_ids"], batch["attention_mask"], batch["lengths"])
        mask = batch["loss_mask"] != 0
        refs, secs = {}, {}
        for dt, a in actors.items():
            a.logprobs(*args_)  # warm-up
            t0 = time.perf_counter()
            refs[dt] = a.logprobs(*args_)
            secs[dt] = time.perf_counter() - t0
        for dt in ("bfloat16", "int8"):
            part[f"reference_{dt}"] = {**stats((refs[dt] - refs["float32"]).abs()[mask]), "tokens": int(mask.sum())}
        part["reference_seconds"] = secs
        part["kl_loss"] = kl_and_loss(pdir, batch, refs, args.kl_coef, args.grad_rows)
        res[policy_name] = part
    return res


def fmt(x: float) -> str:
    return f"{x:.2e}" if x != 0 and (abs(x) < 1e-2 or abs(x) >= 1e3) else f"{x:.4f}"


def grad_cell(row: dict) -> str:
    if "grad_diff_vs_pg" not in row:
        return "–"
    v = row["grad_diff_vs_pg"]
    return f"{fmt(v)}" if v is not None else f"(no pg) {fmt(row['grad_diff_norm'])}"


def markdown(results: dict, meta: dict) -> str:
    """The tables of benchmarks/results/precision_gap.md."""
    lines = ["# Reduced precision: measured gaps (`benchmarks/precision_gap.py`)", "",
             f"Commit `{meta['commit']}`, torch {meta['torch']}, {meta['args']}.", ""]
    lines += ["## |logp_x - logp_fp32| over the agent tokens (nats), the policy after the RL steps", "",
              "| model | params | what | mean | p99 | max | tokens |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, r in results.items():
        a = r["after_rl"]
        for key, label in (("sampler_float32", "sampler fp32 vs learner fp32"),
                           ("sampler_bfloat16", "sampler bf16 vs learner fp32"),
                           ("reference_bfloat16", "reference bf16 vs fp32"),
                           ("reference_int8", "reference int8 vs fp32")):
            s = a[key]
            lines.append(f"| {name} | {r['params'] / 1e6:.2f}M | {label} | {fmt(s['mean'])} | {fmt(s['p99'])} "
                         f"| {fmt(s['max'])} | {s['tokens']} |")
    lines += ["", "## The KL term and GRPO's loss with each reference (logp = old, fp32 policy)", "",
              "| model | policy | reference | k1 (token mean) | k3 (token mean) | seq k1 | loss | loss - fp32's "
              "| \\|Δgrad\\| / \\|grad pg\\| | ref pass s |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, r in results.items():
        for pol in ("at_rl_start", "after_rl"):
            kl = r[pol]["kl_loss"]
            for dt, row in kl.items():
                lines.append(f"| {name} | {pol.replace('_', ' ')} | {dt} | {fmt(row['k1'])} | {fmt(row['k3'])} "
                             f"| {fmt(row['seq_k1'])} | {fmt(row['loss'])} | {fmt(row.get('loss_diff', 0.0))} "
                             f"| {grad_cell(row)} | {r[pol]['reference_seconds'][dt]:.2f} |")
    lines += ["", "Warm start (SFT loss first -> last), the sampled tokens' mean -logp (uniform: ln 1024 = 6.93), "
              "the policy-gradient norm, and the logged `loss/kl` of the RL steps:", ""]
    for name, r in results.items():
        a = r["after_rl"]
        lines.append(f"- {name}: SFT {r['sft_loss_first_last'][0]:.3f} -> {r['sft_loss_first_last'][1]:.3f}; "
                     f"mean -logp {a['sampler_float32']['neg_logp_mean']:.3f}; "
                     f"|grad pg| {a['kl_loss']['float32']['pg_grad_norm']:.3g} (at RL start "
                     f"{r['at_rl_start']['kl_loss']['float32']['pg_grad_norm']:.3g}); "
                     f"reward mean {a.get('reward_mean', float('nan')):.3f}; "
                     f"RL loss/kl {[round(k, 6) if k is not None else None for k in r['rl_kl']]}; "
                     f"run {r['run_s']:.0f} s")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="embedded,qwen2-21M")
    for k in ("sft-steps", "sft-batch", "rl-steps", "rl-tasks", "rl-group", "tasks", "group"):
        p.add_argument(f"--{k}", type=int, default=None, help="default: the model's (MODELS)")
    p.add_argument("--kl-coef", type=float, default=0.05)
    p.add_argument("--grad-rows", type=int, default=32, help="rows of the batch in the gradient comparison")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--work", default=None, help="keep the runs here (and reuse those already there) "
                                               "instead of a temporary folder")
    args = p.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).resolve().parent).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                           text=True, cwd=Path(__file__).resolve().parent).stdout.strip()
    meta = {"commit": commit + ("+dirty" if dirty else ""), "torch": torch.__version__,
            "args": " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k not in ("out", "work") and v is not None),
            "uptime_start": os.getloadavg()}
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="precision_gap_") as tmp:
        for name in args.models.split(","):
            out = Path(args.work or tmp) / name
            if args.work and (out / "sft_model").is_dir():
                s = json.loads((out / "run_s.json").read_text())
                print(f"[{name}] reusing the run in {out}", flush=True)
            else:
                s = train_model(name, out, args)
                (out / "run_s.json").write_text(json.dumps(s))
            print(f"[{name}] trained in {s:.0f} s; measuring", flush=True)
            results[name] = {**measure(name, out, args), "run_s": s}
            print(json.dumps(results[name]["after_rl"]["reference_int8"]), flush=True)
    meta["uptime_end"] = os.getloadavg()
    dest = Path(args.out)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "precision_gap.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")
    (dest / "precision_gap.md").write_text(markdown(results, meta))
    print(markdown(results, meta))


if __name__ == "__main__":
    main()
