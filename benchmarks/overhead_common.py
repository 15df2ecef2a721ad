"""Helpers shared by the overhead benchmarks (`rollout_overhead.py`, `gateway_overhead.py`):
paired ratios against a baseline measured in the same run, and where a figure came from."""

from __future__ import annotations

import os
import shlex
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def spread(values: list[float], digits: int = 4) -> dict[str, Any]:
    """Median, min and max of `values` (one per A/B pair), and the values themselves."""
    return {"median": round(statistics.median(values), digits), "min": round(min(values), digits),
            "max": round(max(values), digits), "n": len(values),
            "values": [round(v, digits) for v in values]}


def pct(s: dict[str, Any]) -> str:
    """`spread` of ratios - 1 as '+x.x % [min, max]'."""
    return f"{100 * s['median']:+.1f} % [{100 * s['min']:+.1f}, {100 * s['max']:+.1f}]"


def git_commit(*exclude: str) -> str:
    """The short hash of HEAD, with `+dirty` when tracked files other than the paths in
    `exclude` (a benchmark's own outputs) differ from it; "unknown" outside git."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                *(f":(exclude){p}" for p in exclude)], cwd=ROOT, capture_output=True,
                               text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def provenance() -> dict[str, Any]:
    """The commit (and whether tracked files other than benchmarks/results/ had uncommitted
    changes), the command line, the cores and the 1/5/15-minute load averages now."""
    def git(*args: str) -> str:
        r = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
        return r.stdout.strip()

    return {"commit": git("rev-parse", "--short", "HEAD"),
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no", "--", ".",
                              ":(exclude)benchmarks/results")),
            "command": "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(sys.argv[0], ROOT),
                                                                     *sys.argv[1:]]),
            "cpus": os.cpu_count(), "loadavg": [round(x, 2) for x in os.getloadavg()]}
