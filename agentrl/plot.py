"""`agentrl plot`: PNG learning curves from one or more runs' OUT/metrics.jsonl, runs overlaid.

One figure per quantity (reward, pass rate, KL, entropy, response length, held-out pass@1) and
one for the seconds per stage (one panel per `perf/*` key). A figure is written only when at
least one run logged one of its keys. matplotlib runs on its non-interactive Agg backend, so
plotting works on a machine without a display.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentrl.summary import read_metrics

FIGURES: dict[str, tuple[str, list[str]]] = {
    "reward": ("rollout reward (mean per episode)", ["rollout/reward_mean"]),
    "pass_rate": ("rollout pass rate", ["rollout/pass_rate"]),
    "kl": ("KL to the reference / old policy", ["loss/kl", "loss/approx_kl"]),
    "entropy": ("token entropy (nats)", ["loss/entropy"]),
    "response_length": ("sampled tokens per episode", ["rollout/response_len"]),
    "eval_pass1": ("held-out pass@1", ["eval/pass@1"]),
}
"""file stem -> (title, metric keys drawn in it: each key of each run is one line)."""


def _series(rows: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    pts = {}
    for r in rows:  # a later row of the same step (e.g. the final eval) wins
        v = r.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            pts[int(r["step"])] = float(v)
    steps = sorted(pts)
    return steps, [pts[s] for s in steps]


def _label(run: Path, runs: list[Path]) -> str:
    names = [p.name for p in runs]
    return run.name if names.count(run.name) == 1 else str(run)


def plot_runs(run_dirs: Sequence[str | Path], out_png_dir: str | Path) -> list[Path]:
    """Write PNG curves of the runs' metrics, all runs overlaid in each figure.

    Args:
        run_dirs: run output directories (each with a metrics.jsonl).
        out_png_dir: where the PNGs go (created).

    Returns:
        paths of the written PNGs: `<stem>.png` for the stems of `FIGURES` that have data, and
        `perf.png` (seconds per stage against step) when `perf/*` keys were logged.

    Raises:
        FileNotFoundError: a run directory has no metrics.jsonl.
        ValueError: no run directory given.
    """
    try:
        import matplotlib
    except ImportError as e:  # a core dependency, but an environment may lack it
        raise ModuleNotFoundError(f"agentrl plot needs matplotlib ({e}): pip install 'matplotlib>=3.8'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not run_dirs:
        raise ValueError("give at least one run directory")
    runs = [Path(d) for d in run_dirs]
    data = {}
    for run in runs:
        if not (run / "metrics.jsonl").exists():
            raise FileNotFoundError(f"{run / 'metrics.jsonl'} not found (is {run} a run directory?)")
        data[run] = read_metrics(run / "metrics.jsonl")
    out = Path(out_png_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    for stem, (title, keys) in FIGURES.items():
        fig, ax = plt.subplots(figsize=(6.4, 4.0))
        drawn = 0
        for i, run in enumerate(runs):  # a colour per run, a line style per key
            for key, style in zip(keys, ("-", "--", ":")):
                x, y = _series(data[run], key)
                if not x:
                    continue
                name = _label(run, runs) + ("" if len(keys) == 1 else f" · {key}")
                ax.plot(x, y, style, color=f"C{i % 10}", marker="o" if len(x) < 30 else None,
                        markersize=3, label=name)
                drawn += 1
        if drawn:
            ax.set_title(title)
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
            fig.tight_layout()
            fig.savefig(out / f"{stem}.png", dpi=100)
            written.append(out / f"{stem}.png")
        plt.close(fig)

    perf = sorted({k for rows in data.values() for r in rows for k in r if k.startswith("perf/")})
    if perf:
        cols = min(3, len(perf))
        nrows = math.ceil(len(perf) / cols)
        fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.0 * nrows), squeeze=False)
        for ax, key in zip(axes.flat, perf):
            for i, run in enumerate(runs):
                x, y = _series(data[run], key)
                if x:
                    ax.plot(x, y, color=f"C{i % 10}", label=_label(run, runs))
            ax.set_title(f"{key} (s)", fontsize=9)
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
        for ax in list(axes.flat)[len(perf):]:
            ax.axis("off")
        axes.flat[0].legend(fontsize=7)
        fig.suptitle("time per stage")
        fig.tight_layout()
        fig.savefig(out / "perf.png", dpi=100)
        written.append(out / "perf.png")
        plt.close(fig)
    return written
