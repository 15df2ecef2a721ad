"""Inline vs worker placement of the reference and reward models, with the pipeline, in one run.

A reward-bound PPO configuration on the safety env: the embedded tiny policy (its KL reference a
frozen copy: `algo.kl_coef > 0`), and a reward model, a ~5M-parameter BERT sequence classifier
built here from a config (random weights: its cost, not its judgement, is what is measured),
stacked on the env as `env.wrappers=[classifier]` (its score added to the env's reward).
Arms, each `train()` in a fresh subprocess on the same seed, run one after the other:

- `inline-sync`: today's default placement, sync mode;
- `workers-sync`: `placement.reference=worker`, `placement.reward_model=worker` (the pipeline
  in sync mode: the reference of batch s starts as soon as s is sampled, overlapping PPO's own
  no-grad pass);
- `inline-async`, `workers-async`: `rollout.mode=async`, `train.max_staleness=1`: batch s+1 is
  sampled (and scored, and with workers its reference computed) while the learner trains on s.

Reported per arm: the steady step time (wall seconds from the end of step 1 to the end of the
last step, per step: `perf/loop_s`), and the cost profile (seconds and share per stage, summed
over steps 2..N). With `--rounds R` the arms run R times, interleaved (the order reversed every
other round), and the ratios compare median step times: each arm with `inline-sync`, and
`workers-async` with `inline-async` (the placement alone). The machine's load (`uptime`) is printed before and
after: on a shared machine a measurement under load is only indicative.

    python benchmarks/placement.py [--steps 6] [--tasks 8] [--tokens 48] [--rounds 3] [--arms inline-sync,workers-async]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ARMS = {
    "inline-sync": [],
    "workers-sync": ["placement.reference=worker", "placement.reward_model=worker"],
    "inline-async": ["rollout.mode=async", "train.max_staleness=1", "rollout.batches_in_flight=1"],
    "workers-async": ["placement.reference=worker", "placement.reward_model=worker", "rollout.mode=async",
                      "train.max_staleness=1", "rollout.batches_in_flight=1"],
}


def build_classifier(out: Path, *, hidden: int = 256, layers: int = 4, vocab: int = 6000) -> tuple[str, int]:
    """A BERT sequence classifier of about 5M parameters (hidden 256, 4 layers, 4 heads, MLP
    1024, a 6000-entry WordPiece vocabulary whose only reachable pieces are single characters,
    so that a text is about one token per character: the full-sequence forward over a few
    hundred tokens that makes a reward model costly) with random weights, saved to `out`.
    Returns (path, parameter count)."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    chars = [chr(c) for c in range(33, 127)]
    entries = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + chars + [f"##{c}" for c in chars]
    entries += [f"##w{i}" for i in range(vocab - len(entries))]
    (out / "vocab.txt").write_text("\n".join(entries) + "\n")
    tok = BertTokenizerFast(vocab={w: i for i, w in enumerate(entries)})  # (transformers 5 ignores vocab_file)
    cfg = BertConfig(vocab_size=len(entries), hidden_size=hidden, num_hidden_layers=layers,
                     num_attention_heads=4, intermediate_size=4 * hidden, max_position_embeddings=512,
                     num_labels=2, id2label={0: "bad", 1: "good"}, label2id={"bad": 0, "good": 1})
    torch.manual_seed(0)
    model = BertForSequenceClassification(cfg)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return str(out), sum(p.numel() for p in model.parameters())


def arm_overrides(arm: str, out: Path, clf: str, args: argparse.Namespace) -> list[str]:
    """The `train()` overrides of one arm."""
    return [f"out={out}", "env.name=safety", "algo.name=ppo", "algo.kl_coef=0.05", "algo.group_size=1",
            f"rollout.tasks_per_step={args.tasks}", f"rollout.max_tokens={args.tokens}", f"train.steps={args.steps}",
            "sft.steps=0", "train.eval_tasks=2", "train.eval_samples=1", "train.log_rollouts_every=0",
            "train.save_every=0", "quiet=true", "log.tensorboard=false", "env.wrappers=[classifier]",
            f"env.wrapper_kwargs={{classifier: {{model: {clf}, mode: add, weight: 0.1, batch_size: 1, max_length: 512}}}}",
            "placement.reference_cpus=0.5", "placement.reward_model_cpus=0.5", *ARMS[arm]]


def run_arm(arm: str, out: Path, clf: str, args: argparse.Namespace) -> dict:
    """Run one arm in a subprocess; its steady step time and cost profile."""
    code = ("import sys, json, torch; torch.set_num_threads(1)\n"
            "from agentrl.config import load_config\nfrom agentrl.train import train\n"
            "train(load_config(None, json.loads(sys.argv[1])))\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    subprocess.run([sys.executable, "-c", code, json.dumps(arm_overrides(arm, out, clf, args))],
                   check=True, env=env, stdout=subprocess.DEVNULL)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "perf/loop_s" in r]
    steady = (steps[-1]["perf/loop_s"] - steps[0]["perf/loop_s"]) / (len(steps) - 1)
    keys = sorted({k for r in steps[1:] for k in r if k.startswith("perf/") and k.endswith("_s")
                   and k != "perf/loop_s"})
    stages = {k[len("perf/"):-2]: sum(r.get(k, 0.0) for r in steps[1:]) for k in keys}
    from agentrl.log.summary import cost_profile

    return {"arm": arm, "step_s": steady, "stages": stages,
            "profile": [(label, round(s, 3), round(share, 3)) for label, s, share in cost_profile(stages)],
            "reward_mean": [r["rollout/reward_mean"] for r in steps]}


def uptime() -> str:
    """`uptime`'s load averages."""
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--rounds", type=int, default=1, help="interleaved repeats; the median step time is compared")
    ap.add_argument("--json", default=str(Path(__file__).parent / "results" / "placement.json"))
    args = ap.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).parent).stdout.strip()
    load_before = uptime()
    print(f"commit {commit}; load before: {load_before}", flush=True)
    results = []
    arms = args.arms.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        clf, n = build_classifier(Path(tmp) / "classifier")
        print(f"reward model: BERT classifier, {n / 1e6:.2f}M parameters", flush=True)
        for rnd in range(args.rounds):  # interleaved, the order reversed every other round
            for arm in arms if rnd % 2 == 0 else arms[::-1]:
                r = run_arm(arm, Path(tmp) / f"{arm}-{rnd}", clf, args)
                r["round"], r["load"] = rnd, uptime()
                results.append(r)
                print(f"[round {rnd}] {arm}: {r['step_s']:.2f} s/step; " + " · ".join(
                    f"{label} {s:.2f}s {share:.0%}" for label, s, share in r["profile"]), flush=True)
    load_after = uptime()
    print(f"load after: {load_after}")
    by = {a: statistics.median(r["step_s"] for r in results if r["arm"] == a) for a in arms}
    for a, v in by.items():
        print(f"{a}: median {v:.2f} s/step over {args.rounds} round(s)")
    ratios = {f"{a} vs inline-sync": by["inline-sync"] / s for a, s in by.items() if "inline-sync" in by}
    if "inline-async" in by and "workers-async" in by:
        ratios["workers-async vs inline-async"] = by["inline-async"] / by["workers-async"]
    for k, v in ratios.items():
        print(f"step-time ratio {k}: {v:.2f}x")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"commit": commit, "load_before": load_before, "load_after": load_after,
                                           "args": vars(args), "classifier_params": n, "arms": results,
                                           "ratios": ratios}, indent=1))


if __name__ == "__main__":
    main()
