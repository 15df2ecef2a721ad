"""Time to accuracy over seeds for `benchmarks/async_vs_sync.py --seeds ...` (issue 43): the pure
pieces (the standard error over held-out tasks, the aggregation over seeds),
the JSON record and the plot of the held-out curves (modes overlaid, one column per seed).

The target of every seed is that seed's sync run's final held-out value; a mode's ratio is its
training seconds to that value over sync's (`time_to` of `async_vs_sync`). Over seeds: the
median ratio (for an even count, the mean of the two middle values) and the range (min, max);
a seed without a ratio (the mode never reaches the target, or sync's time to it is 0: the
evaluation before RL already reaches it) is left out of the median, and those seeds are counted.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any


def task_se(tasks: list[dict], key: str = "reward_mean") -> float | None:
    """Standard error over held-out tasks of the mean of per-task `key`: std(ddof=1) / sqrt(m)
    over the m tasks with a value (as `pass@k_se` in `agentrl.eval.report`); None when m < 2."""
    vals = [float(t[key]) for t in tasks if t.get(key) is not None]
    if len(vals) < 2:
        return None
    return statistics.stdev(vals) / math.sqrt(len(vals))


def aggregate(per_seed: dict[str, dict[str, dict]], modes: list[str],
              key: str = "final") -> dict[str, dict[str, Any]]:
    """Per mode over seeds: `ratios` (time to target / sync's, per seed; None = no ratio: not
    reached, or sync's time 0), `median_ratio` and `range` (min, max) over the others,
    `no_ratio` (count of None), and the
    final values' `final_mean` and `final_delta_mean` (mode's final - sync's final, mean over
    seeds) with `final_delta_se` (the mean over seeds of the quadrature sum of both runs' standard
    errors over tasks; None when any is missing).

    Args:
        per_seed: seed (str) -> mode -> {"ratio": float | None, key: float, key + "_se": float | None}.
        modes: the modes to aggregate, each present in every seed.
        key: the held-out value compared (e.g. "at_sync_steps": at sync's step count, equal samples);
            the output names stay `final_*`.
    """
    out: dict[str, dict[str, Any]] = {}
    for m in modes:
        ratios = [per_seed[s][m]["ratio"] for s in per_seed]
        got = [r for r in ratios if r is not None]
        finals = [per_seed[s][m][key] for s in per_seed]
        deltas = [per_seed[s][m][key] - per_seed[s]["sync"][key] for s in per_seed]
        ses = [(per_seed[s][m][f"{key}_se"], per_seed[s]["sync"][f"{key}_se"]) for s in per_seed]
        se = (sum(math.hypot(a, b) for a, b in ses) / len(ses)
              if all(a is not None and b is not None for a, b in ses) else None)
        out[m] = {"ratios": ratios, "median_ratio": statistics.median(got) if got else None,
                  "range": [min(got), max(got)] if got else None, "no_ratio": len(ratios) - len(got),
                  "final_mean": sum(finals) / len(finals), "final_delta_mean": sum(deltas) / len(deltas),
                  "final_delta_se": se}
    return out


def write_json(path: Path, record: dict) -> None:
    """Write `record` (JSON-able) to `path`, indented, creating the folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1, allow_nan=False) + "\n")


def plot(path: Path, record: dict) -> None:
    """Held-out metric vs training seconds (top row) and vs episodes sampled (bottom row), one
    column per seed, the modes overlaid; a dashed line at each seed's target (sync's final)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seeds = list(record["seeds"])
    fig, axes = plt.subplots(2, len(seeds), figsize=(4.2 * len(seeds), 6.4), squeeze=False)
    metric = record["settings"]["metric"]
    for j, s in enumerate(seeds):
        rs = record["seeds"][s]
        for m, r in rs["modes"].items():
            t = f"{r['time_to_target_s']:.0f} s" if r["time_to_target_s"] is not None else "not reached"
            ratio = f", {r['ratio']:.2f}x" if r["ratio"] is not None else ""
            axes[0][j].plot(*zip(*r["curve_s"]), marker="o", ms=3, label=f"{m}: {t}{ratio}")
            axes[1][j].plot(*zip(*r["curve_samples"]), marker="o", ms=3, label=m)
        for i in (0, 1):
            axes[i][j].axhline(rs["target"], ls="--", c="grey", lw=0.8)
            axes[i][j].set_ylabel(f"held-out {metric}")
            axes[i][j].legend(fontsize=7)
        axes[0][j].set_title(f"seed {s}: target {rs['target']:.3f} (sync's final)", fontsize=9)
        axes[0][j].set_xlabel("training seconds")
        axes[1][j].set_xlabel("episodes sampled")
    la = record["load_average"]
    fig.suptitle(f"time to accuracy, rollout-bound job (async_vs_sync.py), commit {record['commit']}; "
                 f"load avg {la['start'][0]:.1f} -> {la['end'][0]:.1f} on 2 shared cores", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
