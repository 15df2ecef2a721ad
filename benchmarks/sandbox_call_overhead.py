"""Cost of the calls a test makes into the solution (split runs: each call crosses processes).

    python benchmarks/sandbox_call_overhead.py

One worker; a test calling an identity function 1 and 10 000 times; the best of 3 runs each
(wall time of ``run_tests``, milliseconds).  The difference / 9 999 is the cost of one call.
"""

from __future__ import annotations

import time

from agentrl.sandbox import Limits, SandboxPool


def main() -> None:
    with SandboxPool(workers=1, backend="bwrap") as pool:
        best = {}
        for n in (1, 10_000):
            best[n] = 1e9
            for _ in range(3):
                t0 = time.perf_counter()
                r = pool.run_tests("def f(x):\n    return x\n",
                                   [f"for i in range({n}):\n    assert f(i) == i"],
                                   limits=Limits(wall_s=60, cpu_s=60))
                best[n] = min(best[n], time.perf_counter() - t0)
            print(f"{n:>6} calls: {r.verdict}, {best[n] * 1000:.1f} ms")
        print(f"per call: {(best[10_000] - best[1]) / 9_999 * 1e6:.1f} us")


if __name__ == "__main__":
    main()
