"""Every built-in code_sandbox reference solution through the real sandbox, one task at a time
(2 sandbox workers): how many fail, and the seconds per task. Run it on two commits to compare
the sandbox's cost per code run (the README names the figures it gave).

    python benchmarks/builtin_reference_check.py [--tasks 400]
"""

from __future__ import annotations

import argparse
import time

from agentrl.sandbox import SandboxPool
from agentrl_envs.code_sandbox import CodeSandboxEnv


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=400, help="tasks per split (train, heldout)")
    args = ap.parse_args()
    with SandboxPool(workers=2, backend="bwrap") as pool:
        env = CodeSandboxEnv(pool=pool)
        for split in ("train", "heldout"):
            tasks = env.tasks(split)[:args.tasks]
            failed, t0 = [], time.perf_counter()
            for t in tasks:
                env.reset(options={"task": t})
                _, reward, _, _, info = env.step(t.solution)
                if reward != 1.0:
                    failed.append((t.task_id, info.get("verdict")))
            per = (time.perf_counter() - t0) / max(1, len(tasks))
            print(f"{split}: {len(tasks)} reference solutions, {len(failed)} failed {failed[:5]}, "
                  f"{per * 1000:.1f} ms per task")


if __name__ == "__main__":
    main()
