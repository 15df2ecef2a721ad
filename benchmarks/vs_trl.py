"""Side-by-side speed of agentrl's GRPO and TRL's GRPOTrainer on identical work.

    python benchmarks/vs_trl.py                     # base (2x4x32) and large (8x8x64)
    python benchmarks/vs_trl.py --variants trl,ours,ours+all   # + the proposed patches
    python benchmarks/vs_trl.py --variants ab+PATCH --rounds 1 --steps 16   # one patch, A/B

Takes ~3 minutes on 2 idle cores, ~9 on 2 cores shared with several busy jobs (mostly the
workers' imports). See benchmarks/README.md for the settings table and the results.

One tiny Qwen2 (the peer baseline's: 417K parameters, 943-token byte-level BPE; built once into a
temporary directory that both sides load), one prompt set (the 64 'Write about {topic} number
{i}.' prompts), one reward (fraction of 'a' characters). For each configuration (prompts per
step x generations per prompt x max completion tokens) the variants run in turn, each in its own
subprocess (OMP_NUM_THREADS=1, torch intra/inter-op threads 1), for `--rounds` rounds:
TRL, ours, TRL, ours, ... All workers import and set up in parallel first (untimed) and wait
before their first step; they are then released one at a time, so timed runs never overlap.
Each process runs `--warmup + --steps` training steps; warm-up steps are left out of the medians.

Matching settings (both sides): temperature 1.0, top_p 1, AdamW (lr `--lr`, betas 0.9/0.999, eps
1e-8, weight decay 0, constant schedule, grad-norm clip 1.0), float32, one optimizer step per batch
(TRL num_iterations=1, steps_per_generation=1; ours update_epochs=1, minibatches=1), no
reference model (TRL beta=0; ours kl_coef=0), token-mean loss over the batch (TRL loss_type
'dapo', its 1.16 default; ours agg=token-mean), clip 0.2 both ways, group-std advantages, one
forward/backward over the whole batch (ours micro_batch_size = batch), no SFT, no evaluation in
the timed steps. Timed step: TRL from `on_step_begin` to `on_step_end` (generation, reward,
forward/backward, optimizer); ours `perf/step_s` of `agentrl.train.train` (rollout with env
reward, update, weight sync).

Prints the table and writes all per-step records as JSON (`--json`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CONFIGS = {"base": (2, 4, 32), "large": (8, 8, 64)}
"""name -> (prompts per step, generations per prompt, max completion tokens)."""
DEFAULT_STEPS = {"base": (2, 10), "large": (1, 5)}
"""name -> (warm-up steps, timed steps) per process: with 2 rounds, 20 (base) and 10 (large)
timed steps per side, which keeps the default run under 10 minutes on 2 busy cores."""


def worker_env() -> dict[str, str]:
    """Environment of every worker: one thread everywhere, offline, quiet."""
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
                "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                "HF_DATASETS_OFFLINE": "1", "WANDB_DISABLED": "true", "PYTHONUNBUFFERED": "1",
                "TRANSFORMERS_VERBOSITY": "error"})
    return env


def worker_cmd(variant: str, model: str, cfg: tuple[int, int, int], steps: int, lr: float,
               seed: int) -> list[str]:
    """Command line of one worker: 'trl', 'ours', 'trl-compile', 'ours-compile' (each side with
    its torch.compile option: GRPOConfig(torch_compile=True), train.compile=true and rollout.compile=true) or
    'ours+PATCH[+PATCH]'."""
    p, g, c = cfg
    script = "vs_trl_trl.py" if variant.startswith("trl") else "vs_trl_ours.py"
    cmd = [sys.executable, str(HERE / script), "--model", model, "--prompts", str(p), "--gens", str(g),
           "--max-tokens", str(c), "--steps", str(steps), "--lr", str(lr), "--seed", str(seed), "--wait-go"]
    if variant.endswith("-compile"):
        cmd.append("--compile")
    if variant.startswith(("ours+", "ab+")):
        cmd += ["--patch", variant.split("+", 1)[1].replace("+", ",")]
    if variant.startswith("ab+"):
        cmd.append("--toggle")
    return cmd


def split_ab(runs: list[dict], warmup: int) -> tuple[list[dict], list[dict], float]:
    """An A/B worker's runs as (runs without the patch, runs with it, median paired CPU ratio
    with/without over consecutive timed steps (2k, 2k+1))."""
    off, on, ratios = [], [], []
    for r in runs:
        st = r["steps"][warmup:]
        off.append({**r, "steps": [s for s in st if not s["patched"]]})
        on.append({**r, "steps": [s for s in st if s["patched"]]})
        ratios += [b["cpu_s"] / a["cpu_s"] for a, b in zip(st, st[1:])
                   if not a["patched"] and b["patched"]]
    return off, on, _med(ratios)


class Worker:
    """A worker process: started (imports, model, trainer set-up) in parallel with the others,
    then released alone with `run()`, so no two timed runs ever overlap."""

    def __init__(self, name: str, cmd: list[str], logdir: Path):
        self.name = name
        self.out_path, self.err_path = logdir / f"{name}.out", logdir / f"{name}.err"
        self._out, self._err = self.out_path.open("w"), self.err_path.open("w")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=self._out, stderr=self._err,
                                     text=True, env=worker_env())

    def _fail(self, why: str) -> RuntimeError:
        return RuntimeError(f"{self.name}: {why}:\n{self.err_path.read_text()[-3000:]}")

    def ready(self) -> bool:
        """Set up and waiting (raises if the process died first)."""
        if "READY" in self.out_path.read_text():
            return True
        if self.proc.poll() is not None:
            raise self._fail(f"exited with {self.proc.returncode} during set-up")
        return False

    def run(self, timeout: float) -> dict:
        """Release the worker, wait for it, return its RESULT."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("GO\n")
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise self._fail(f"no result within {timeout:.0f} s") from None
        finally:
            self._out.close()
            self._err.close()
        for line in reversed(self.out_path.read_text().splitlines()):
            if line.startswith("RESULT "):
                return json.loads(line[len("RESULT "):])
        raise self._fail(f"exited with {self.proc.returncode} without a result")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def summarize(runs: list[dict], warmup: int) -> dict:
    """Medians over the timed steps of all runs of one variant (warm-up steps dropped)."""
    steps = [s for r in runs for s in r["steps"][warmup:]]
    sec = [s["sec"] for s in steps]
    tok = [s["gen_tokens"] for s in steps]

    def med(key: str) -> float:
        return _med([s.get(key, 0.0) for s in steps])

    compute = [s.get("gen_forward", 0.0) + s.get("fwd_logprobs", 0.0) + s.get("backward", 0.0)
               + s.get("optim", 0.0) for s in steps]
    out = {"n_steps": len(steps), "median_step_s": _med(sec),
           "median_cpu_s": _med([s["cpu_s"] for s in steps]),
           "median_wall_s": _med([s["wall_s"] for s in steps]),
           "q1_step_s": statistics.quantiles(sec, n=4)[0] if len(sec) > 1 else float("nan"),
           "q3_step_s": statistics.quantiles(sec, n=4)[2] if len(sec) > 1 else float("nan"),
           "tokens_per_step": statistics.mean(tok) if tok else float("nan"),
           "tokens_per_s": sum(tok) / sum(sec) if sec else float("nan"),
           "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
           "process_s": _med([r["process_s"] for r in runs]),
           "generate_s": med("generate"), "gen_forward_s": med("gen_forward"),
           "fwd_logprobs_s": med("fwd_logprobs"), "backward_s": med("backward"), "optim_s": med("optim"),
           "overhead_frac": _med([(s["sec"] - c) / s["sec"] for s, c in zip(steps, compute)]),
           "reward_first": _med([r["steps"][0].get("reward", float("nan")) for r in runs]),
           "reward_last": _med([r["steps"][-1].get("reward", float("nan")) for r in runs])}
    for k in ("rollout_s", "env_s", "update_s", "sync_s"):
        if steps and k in steps[0]:
            out[k] = med(k)
    return out


def baseline_of(variant: str, variants: dict) -> str | None:
    """The TRL variant a variant is compared with: 'trl-compile' for our '-compile' variants when
    it ran (each side with its torch.compile option), else 'trl' (None if TRL did not run)."""
    if variant.startswith("ours") and variant.endswith("-compile") and "trl-compile" in variants:
        return "trl-compile"
    return "trl" if "trl" in variants else None


def format_table(results: dict[str, dict[str, dict]]) -> str:
    """Markdown tables: one row per (config, variant), then our step split."""
    lines = ["| config | side | steps | median s/step (IQR) | CPU s/step | gen tokens/step | gen tokens/s "
             "| peak RSS MB | time agentrl/TRL | speedup (wall) | speedup (CPU) | framework overhead |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for cname, variants in results.items():
        for v, s in variants.items():
            base = baseline_of(v, variants)
            trl = variants[base] if base else None
            if trl:
                ratio = s["median_step_s"] / trl["median_step_s"]
                vs = f"{ratio:.2f} | {1 / ratio:.2f}x | {trl['median_cpu_s'] / s['median_cpu_s']:.2f}x"
            else:
                vs = "- | - | -"
            lines.append(f"| {cname} {'x'.join(map(str, CONFIGS[cname]))} | {v} | {s['n_steps']} | "
                         f"{s['median_step_s']:.3f} ({s['q1_step_s']:.3f}-{s['q3_step_s']:.3f}) | "
                         f"{s['median_cpu_s']:.3f} | {s['tokens_per_step']:.1f} | {s['tokens_per_s']:.0f} | "
                         f"{s['peak_rss_mb']:.0f} | {vs} | {100 * s['overhead_frac']:.0f}% |")
    lines += ["", "| config | side | rollout s | (env s) | update s | sync s | generate s "
              "| gen model fwd s | learner fwd s | backward s | optim s |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    def cell(s: dict, key: str, digits: int) -> str:
        return f"{s[key]:.{digits}f}" if key in s else "-"

    for cname, variants in results.items():
        for v, s in variants.items():
            lines.append(f"| {cname} | {v} | {cell(s, 'rollout_s', 3)} | {cell(s, 'env_s', 4)} | "
                         f"{cell(s, 'update_s', 3)} | {cell(s, 'sync_s', 4)} | {s['generate_s']:.3f} | "
                         f"{s['gen_forward_s']:.3f} | {s['fwd_logprobs_s']:.3f} | {s['backward_s']:.3f} | "
                         f"{s['optim_s']:.4f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--configs", default="base,large", help=f"comma list of {', '.join(CONFIGS)}")
    ap.add_argument("--variants", default="trl,ours",
                    help="comma list: trl, ours, trl-compile, ours-compile (each side's torch.compile option; "
                         "ours-compile is compared with trl-compile when both run), "
                         "ours+PATCH[+PATCH] (PATCH in benchmarks/vs_trl_patches.py, "
                         "or all), ab+PATCH[+PATCH] (one process, patches off/on on alternate steps)")
    ap.add_argument("--rounds", type=int, default=2,
                    help="processes per variant and config (alternating); all are alive at once "
                         "during set-up, 0.5-0.9 GB each")
    ap.add_argument("--steps", type=int, default=None,
                    help="timed steps per process (default: 10 base, 5 large)")
    ap.add_argument("--warmup", type=int, default=None,
                    help="untimed first steps per process (default: 2 base, 1 large)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model-dir", default=None, help="reuse/build the tiny model here (default: temp dir)")
    ap.add_argument("--json", default="runs/bench/vs_trl.json", help="where to write all records")
    ap.add_argument("--timeout", type=float, default=600,
                    help="seconds for the set-up of all workers, and for each worker's run")
    a = ap.parse_args(argv)
    t_start = time.perf_counter()
    sys.path.insert(0, str(HERE))
    from vs_trl_model import build_tiny_qwen

    tmp = tempfile.TemporaryDirectory(prefix="bench_model_")
    model = a.model_dir or tmp.name
    if not (Path(model) / "config.json").exists():
        info = build_tiny_qwen(model)
        print(f"[model] {model}: {info}", flush=True)
    variants = a.variants.split(",")
    configs = a.configs.split(",")
    raw: dict[str, dict[str, list[dict]]] = {c: {v: [] for v in variants} for c in configs}
    warm = {c: DEFAULT_STEPS[c][0] if a.warmup is None else a.warmup for c in configs}
    timed = {c: DEFAULT_STEPS[c][1] if a.steps is None else a.steps for c in configs}
    order = [(c, r, v) for c in configs for r in range(a.rounds) for v in variants]
    logdir = Path(tempfile.mkdtemp(prefix="vs_trl_logs_"))
    # 1) every worker imports and sets up at once (no timing happens then) ...
    t0 = time.perf_counter()
    workers = {key: Worker(f"{key[0]}-{key[1]}-{key[2]}",
                           worker_cmd(key[2], model, CONFIGS[key[0]], warm[key[0]] + timed[key[0]], a.lr,
                                      a.seed + key[1]), logdir) for key in order}
    try:
        while not all(w.ready() for w in workers.values()):
            if time.perf_counter() - t0 > a.timeout:
                raise RuntimeError(f"workers not set up within {a.timeout:.0f} s (logs: {logdir})")
            time.sleep(0.5)
        print(f"[setup] {len(workers)} worker processes set up in {time.perf_counter() - t0:.0f} s", flush=True)
        # 2) ... then they train one at a time, alternating: TRL, ours, TRL, ours, ...
        for key in order:
            cname, r, v = key
            t1 = time.perf_counter()
            res = workers[key].run(a.timeout)
            res["warmup"] = warm[cname]
            raw[cname][v].append(res)
            st = [s["sec"] for s in res["steps"][warm[cname]:]]
            print(f"[{cname} round {r + 1}/{a.rounds}] {v:>10}: median {_med(st):.3f} s/step, "
                  f"{statistics.mean(s['gen_tokens'] for s in res['steps']):.0f} tokens/step, "
                  f"run {time.perf_counter() - t1:.0f} s", flush=True)
    finally:
        for w in workers.values():
            w.kill()
    shutil.rmtree(logdir, ignore_errors=True)  # kept (and named in the error) only on failure
    results: dict[str, dict[str, dict]] = {}
    for c in configs:
        results[c] = {}
        for v in variants:
            if v.startswith("ab+"):  # one process alternating without / with the patches
                off, on, ratio = split_ab(raw[c][v], warm[c])
                results[c][f"{v} (off)"] = summarize(off, 0)
                results[c][f"{v} (on)"] = summarize(on, 0)
                results[c][f"{v} (on)"]["paired_cpu_ratio"] = ratio
            else:
                results[c][v] = summarize(raw[c][v], warm[c])
    table = format_table(results)
    print()
    print(table)
    print()
    for c in configs:
        for v, s in results[c].items():
            if "paired_cpu_ratio" in s:
                print(f"{c}: {v}: CPU time per step with/without, paired steps: {s['paired_cpu_ratio']:.3f}")
        for v in results[c]:
            base = baseline_of(v, results[c])
            if base is None or v == base or v.startswith("trl"):
                continue
            s, t = results[c][v], results[c][base]
            print(f"{c}: {v} {s['median_step_s']:.3f} s/step vs {base} {t['median_step_s']:.3f} s/step "
                  f"-> {t['median_step_s'] / s['median_step_s']:.2f}x faster by wall time, "
                  f"{t['median_cpu_s'] / s['median_cpu_s']:.2f}x by CPU time (target >= 3x); "
                  f"generated tokens/step {s['tokens_per_step']:.1f} vs {t['tokens_per_step']:.1f}")
    total = time.perf_counter() - t_start
    print(f"total wall time {total:.0f} s", flush=True)
    out = {"args": vars(a), "results": results, "raw": raw, "wall_s": total, "table": table}
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(out, indent=1))
    tmp.cleanup()
    return out


if __name__ == "__main__":
    main()
