"""Sandbox throughput: executions/second of ``run_tests`` on a 3-assert program vs bare spawns.

All are measured in the same run, on the same machine, with the same parallelism:
``bare`` spawns ``<real interpreter> -c <program with its asserts>`` (no sandbox at all; the
real binary, not a pyenv shim); ``bare -I -S`` is the same without ``site`` (the cheapest
possible interpreter start, a stricter baseline); ``sandbox`` calls ``SandboxPool.run_tests``
with full isolation (default backend) from as many threads as the pool has workers.  The bare
rates are measured before and after the sandbox and averaged (load drifts on shared hosts).

    python benchmarks/sandbox_throughput.py [--seconds 10] [--workers N] [--backend auto]

Prints one line per measurement and the ratios sandbox/bare (target: >= 2).  The program's
asserts are runner-decided (``assert add(1, 2) == 3``), so ``run_tests`` runs them in one
process; ``sandbox, two processes`` forces the split run (``force_split=True``) that tests
computing their own expectations get (docs/sandbox.md, "One-process runs").  A tree without
``force_split`` (before this change) measures its default path only.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import threading
import time

from agentrl.sandbox import Limits, SandboxPool
from agentrl.sandbox.backends import real_python

CODE = "def add(a, b):\n    return a + b\n"
TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add('a', 'b') == 'ab'"]


def _rate(fn, seconds: float, threads: int) -> tuple[float, int]:
    """Calls/second of ``fn`` run back to back from ``threads`` threads for ``seconds``."""
    count = [0] * threads
    stop = time.monotonic() + seconds

    def loop(k: int) -> None:
        while time.monotonic() < stop:
            fn()
            count[k] += 1

    t0 = time.monotonic()
    ts = [threading.Thread(target=loop, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    n = sum(count)
    return n / (time.monotonic() - t0), n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0, help="duration of each measurement")
    ap.add_argument("--workers", type=int, default=None, help="parallelism (default: cores)")
    ap.add_argument("--backend", default="auto", help="auto, bwrap, docker or subprocess")
    args = ap.parse_args()
    workers = args.workers or os.cpu_count() or 1
    exe, _ = real_python()
    program = CODE + "\n".join(TESTS) + "\n"

    def bare(*flags: str):
        def spawn() -> None:
            subprocess.run([exe, *flags, "-c", program], check=True, stdin=subprocess.DEVNULL)

        return spawn

    with SandboxPool(workers=workers, backend=args.backend) as pool:
        limits = Limits(wall_s=10.0, cpu_s=10.0)

        import inspect
        has_split = "force_split" in inspect.signature(pool.run_tests).parameters

        def sandboxed(**kw) -> None:
            r = pool.run_tests(CODE, TESTS, limits=limits, **kw)
            if r.verdict != "pass":
                raise RuntimeError(f"benchmark program did not pass: {r}")

        def split() -> None:
            sandboxed(force_split=True)

        pool.map_tests([{"code": CODE, "tests": TESTS}] * workers)  # start the warm servers
        plain = [_rate(bare(), args.seconds, workers)]
        strict = [_rate(bare("-I", "-S"), args.seconds, workers)]
        sbx_rate, sbx_n = _rate(sandboxed, args.seconds, workers)
        split_rate, split_n = _rate(split, args.seconds, workers) if has_split else (None, 0)
        plain.append(_rate(bare(), args.seconds, workers))
        strict.append(_rate(bare("-I", "-S"), args.seconds, workers))
        restarts = pool.restarts
    print(f"cores={os.cpu_count()} workers={workers} backend={pool.backend} interpreter={exe}")
    for label, rates in (("bare python -c", plain), ("bare python -I -S -c", strict)):
        (r1, n1), (r2, n2) = rates
        print(f"{label:22s}: {(r1 + r2) / 2:8.1f} / s  (before {r1:.1f} / s, {n1} runs; "
              f"after {r2:.1f} / s, {n2} runs)")
    print(f"{'sandbox run_tests':22s}: {sbx_rate:8.1f} / s  ({sbx_n} runs, {restarts} restarts)")
    if split_rate is not None:
        print(f"{'sandbox, two processes':22s}: {split_rate:8.1f} / s  ({split_n} runs)")
    for label, rates in (("bare python -c", plain), ("bare python -I -S -c", strict)):
        mean = (rates[0][0] + rates[1][0]) / 2
        print(f"ratio sandbox / {label:22s}: {sbx_rate / mean:6.2f}x")
        if split_rate is not None:
            print(f"ratio two processes / {label:16s}: {split_rate / mean:6.2f}x")


if __name__ == "__main__":
    main()
