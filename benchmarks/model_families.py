"""Start-up time and peak memory of each tiny model family (`agentrl.models.families`).

    python benchmarks/model_families.py                  # every family, 3 rounds -> benchmarks/results/model_families.json
    python benchmarks/model_families.py --families qwen3,gemma3 --rounds 1 --out /tmp/f.json

For each family the parent writes the tiny model directory (`build_family`, default sizes: the
ones docs/models.md and the tests use), timing it, then runs one fresh subprocess per family and
round (torch threads 1, `OMP_NUM_THREADS=1`) that imports torch, transformers and agentrl, and
then times the start-up a run pays for that model:

- `arch_import_s`: importing the architecture's transformers modules (transformers imports them
  on first use; a run pays it once);
- `engine_s`: `make_engine` on the directory (tokenizer + weights into an `HFEngine`, float32,
  CPU, `rollout.compile` off as by default);
- `renderer_s`: `ChatRenderer` on its tokenizer (the template's end of turn, glue, history check);
- `first_generate_s`: the first `generate` of the rendered opening prompt (system + user), 32
  new tokens at most, T=1, seed 0, stopping at the renderer's stop ids;
- `startup_s`: engine + renderer + first generate (`arch_import_s` not included);
- `drift_check_ms`: `agentrl.rollout.drift.episode_drift` on a three-turn scripted episode (tool
  result, user message), mean of 20 (the per-episode cost of `rollout/template_drift`);
- `peak_rss_mib` (the child's peak resident memory, `ru_maxrss`) and `rss_after_imports_mib`
  (its peak before loading the model): the model's own share is their difference.

Per family, the median over `--rounds` subprocesses of each timing (the machine is shared, so
wall times vary); memory from the same rounds (max). `params` and `weights_mib` (float32) too.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from overhead_common import git_commit  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "model_families.json"
COMMAND = "python benchmarks/model_families.py"


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def child(model_dir: str) -> dict:
    """One family's start-up figures, measured in this (fresh) process."""
    import torch

    torch.set_num_threads(1)
    import transformers

    from agentrl.config import load_config
    from agentrl.rollout.agent_loop import EpisodeSpec, run_episodes
    from agentrl.rollout.chat import ChatRenderer
    from agentrl.rollout.drift import episode_drift
    from agentrl.rollout.engines.base import SamplingParams
    from agentrl.rollout.engines.make import make_engine
    from agentrl.rollout.engines.scripted import ScriptedEngine

    transformers.utils.logging.set_verbosity_error()
    sys.path.insert(0, str(ROOT / "tests" / "rollout"))
    from test_families import ToolTurnsEnv  # the three-turn tool episode of the family tests

    base = _rss_mib()
    cfg = load_config(None, [f"model.path={model_dir}"])
    ta = time.perf_counter()  # transformers imports an architecture's modules when first used
    transformers.AutoModelForCausalLM._model_mapping[type(transformers.AutoConfig.from_pretrained(model_dir))]
    t0 = time.perf_counter()
    engine, tok = make_engine(cfg, model_dir, device="cpu")
    t1 = time.perf_counter()
    r = ChatRenderer(tok)
    t2 = time.perf_counter()
    prompt = r.prompt_ids([{"role": "system", "content": "You are a helpful assistant."},
                           {"role": "user", "content": "What is 2 + 3?"}])
    engine.generate([prompt], SamplingParams(temperature=1.0, max_tokens=32, stop_token_ids=r.stop_ids, seed=0))
    t3 = time.perf_counter()
    answers = iter(["call the calculator", "it is 5", "The answer is 5."])
    scripted = ScriptedEngine(tok, lambda p: next(answers))
    tr = run_episodes(scripted, r, [ToolTurnsEnv()], [EpisodeSpec({"seed": 0})],
                      SamplingParams(max_tokens=64, stop_token_ids=r.stop_ids))[0]
    t4 = time.perf_counter()
    for _ in range(20):
        drift = episode_drift(r, tr)
    drift_ms = (time.perf_counter() - t4) / 20 * 1e3
    model = engine.model if hasattr(engine, "model") else None
    params = sum(p.numel() for p in model.parameters()) if model is not None else None
    return {"arch_import_s": t0 - ta, "engine_s": t1 - t0, "renderer_s": t2 - t1, "first_generate_s": t3 - t2, "startup_s": t3 - t0,
            "drift_check_ms": drift_ms, "drift": bool(drift), "rss_after_imports_mib": base,
            "peak_rss_mib": _rss_mib(), "params": params,
            "weights_mib": params * 4 / 2**20 if params else None}


def run(families: list[str], rounds: int) -> dict:
    """Build each family's directory and measure it in `rounds` fresh subprocesses."""
    import torch
    import transformers

    from agentrl.models.families import FAMILIES, _model_class, build_family

    for f in FAMILIES.values():  # import every architecture's modules before timing the builds
        _model_class(f.arch)
    commit = git_commit()  # the code measured: read before the children start
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in families:
            t0 = time.perf_counter()
            d = build_family(name, Path(tmp) / name)
            build_s = time.perf_counter() - t0
            rows = []
            for _ in range(rounds):
                p = subprocess.run([sys.executable, __file__, "--child", d], env=env, capture_output=True,
                                   text=True, check=True)
                rows.append(json.loads(p.stdout.strip().splitlines()[-1]))
            med = {k: statistics.median(r[k] for r in rows) for k in
                   ("arch_import_s", "engine_s", "renderer_s", "first_generate_s", "startup_s", "drift_check_ms")}
            mem = {k: max(r[k] for r in rows) for k in ("rss_after_imports_mib", "peak_rss_mib")}
            results[name] = {"build_s": build_s, **med, **mem, "params": rows[0]["params"],
                             "weights_mib": rows[0]["weights_mib"], "drift": rows[0]["drift"]}
            print(name, json.dumps({k: round(v, 3) if isinstance(v, float) else v
                                    for k, v in results[name].items()}), flush=True)
    return {"commit": commit, "command": COMMAND, "rounds": rounds, "cpus": os.cpu_count(),
            "load_avg_1m": os.getloadavg()[0], "torch": torch.__version__,
            "transformers": transformers.__version__, "families": results}


def table(res: dict) -> str:
    """The markdown table docs/models.md shows."""
    lines = ["| family | parameters | weights MiB | build s | arch import s | engine s | renderer s | first generate s | "
             "start-up s | peak RSS MiB (after imports) | drift check ms / 3-turn episode |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for n, r in res["families"].items():
        lines.append(f"| {n} | {r['params']:,} | {r['weights_mib']:.2f} | {r['build_s']:.2f} | {r['arch_import_s']:.2f} | {r['engine_s']:.2f} | "
                     f"{r['renderer_s']:.3f} | {r['first_generate_s']:.2f} | {r['startup_s']:.2f} | "
                     f"{r['peak_rss_mib']:.0f} ({r['rss_after_imports_mib']:.0f}) | {r['drift_check_ms']:.1f} |")
    return "\n".join(lines)


def main() -> None:
    from agentrl.models.families import FAMILIES

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child)))
        return
    res = run(a.families.split(","), a.rounds)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1) + "\n")
    print(table(res))
    print(f"-> {a.out}")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
