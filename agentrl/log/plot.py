"""`agentrl plot`: PNG learning curves from one or more runs' OUT/metrics.jsonl, runs overlaid
(one colour per run, labelled by the run folder's name).

`dashboard.png`, the one to open first, holds every panel on one page; each panel is also
written alone:

- `reward.png`: the rollout reward per step, smoothed (solid) over the raw values (faint);
  the rollout pass rate is drawn with it (dashed) only where it differs from the reward (for
  code_sandbox the two are the same number, so it is not drawn twice).
- `eval_pass1.png`: held-out pass@1 with ± one standard error, from the evaluation before RL
  (logged at step 0) to the final one.
- `response_length.png`, `entropy.png`: smoothed over raw, as the reward.
- `kl.png`: `loss/kl` (to the reference) and `loss/approx_kl` (to the policy before the
  update), each only when it is not 0 at every step (KL off, or one on-policy epoch).
- `time_share.png`: the share of each stage in a step's wall time, stacked (generate = rollout
  minus env, env, update, sync, and held-out evaluation at the steps that ran one, the final
  one included), each stage's seconds smoothed as the curves before the shares are taken; one
  panel per run; the legend gives each stage's total seconds over the RL steps.
- `sft_loss.png`: the warm start's loss (OUT/sft_metrics.jsonl), when a run has one.

A figure is written only when a run has its data. Smoothing is the debiased exponential moving
average TensorBoard uses (`smooth`), with weight 0.6 under 50 points and 0.9 from 50 on.
matplotlib runs on its non-interactive Agg backend, so plotting works without a display.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agentrl.log.summary import read_metrics

STAGE_KEYS = ("generate", "env", "update", "sync", "eval")
"""The stacked stages of `time_share.png`, bottom to top."""


def smooth(y: Sequence[float], weight: float) -> list[float]:
    """Debiased exponential moving average (TensorBoard's scalar smoothing):
    `m_t = w m_{t-1} + (1 - w) y_t`, `m_0 = 0`, shown as `m_t / (1 - w^(t+1))`.

    Args:
        y: values in step order (finite).
        weight: `w` in [0, 1); 0 returns `y` unchanged.

    Returns:
        the smoothed values, same length as `y`.
    """
    out, m = [], 0.0
    for t, v in enumerate(y):
        m = weight * m + (1 - weight) * v
        out.append(m / (1 - weight ** (t + 1)))
    return out


def _weight(n: int) -> float:
    return 0.0 if n < 5 else 0.6 if n < 50 else 0.9


def series(rows: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """`(steps, values)` of `key` over the rows with a finite number for it, by step (a later
    row of the same step wins)."""
    pts = {}
    for r in rows:
        v = r.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            pts[int(r["step"])] = float(v)
    steps = sorted(pts)
    return steps, [pts[s] for s in steps]


def labels(runs: Sequence[Path]) -> list[str]:
    """A label per run: the folder's name, or its whole path when two runs share a name."""
    names = [p.name for p in runs]
    return [p.name if names.count(p.name) == 1 else str(p) for p in runs]


def stage_shares(rows: list[dict[str, Any]]) -> tuple[list[int], dict[str, list[float]]]:
    """Per RL step, the seconds of each stage of `STAGE_KEYS`: `generate` = `perf/rollout_s` -
    `perf/env_s`, `env`, `update`, `sync`, `eval` (`eval/seconds` of an evaluation logged at
    that step, else 0). Steps without `perf/rollout_s` (the before-RL row at step 0) are left
    out.

    Returns:
        `(steps, {stage: seconds per step})`.
    """
    by_step: dict[int, dict[str, float]] = {}
    for r in rows:
        d = by_step.setdefault(int(r["step"]), {})
        for k, v in r.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                d[k] = float(v)
    steps = [s for s in sorted(by_step) if "perf/rollout_s" in by_step[s]]
    out: dict[str, list[float]] = {k: [] for k in STAGE_KEYS}
    for s in steps:
        d = by_step[s]
        env = d.get("perf/env_s", 0.0)
        out["generate"].append(max(0.0, d["perf/rollout_s"] - env))
        out["env"].append(env)
        out["update"].append(d.get("perf/update_s", 0.0))
        out["sync"].append(d.get("perf/sync_s", 0.0))
        out["eval"].append(d.get("eval/seconds", 0.0))
    return steps, out


def _sft_rows(run: Path) -> list[dict[str, Any]]:
    p = run / "sft_metrics.jsonl"
    rows = []
    for line in p.read_text().splitlines() if p.exists() else []:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return [r for r in rows if isinstance(r, dict) and "step" in r]


def _curve(ax: Any, x: list[int], y: list[float], colour: str, label: str, style: str = "-") -> None:
    """Raw values faint, the smoothed curve over them."""
    if len(x) < 5:
        ax.plot(x, y, style, color=colour, marker="o", markersize=3, label=label)
        return
    ax.plot(x, y, style, color=colour, alpha=0.25, linewidth=1)
    ax.plot(x, smooth(y, _weight(len(y))), style, color=colour, linewidth=2, label=label)


def _same(a: tuple[list[int], list[float]], b: tuple[list[int], list[float]]) -> bool:
    return a[0] == b[0] and all(abs(u - v) < 1e-9 for u, v in zip(a[1], b[1]))


Panel = tuple[str, str, Callable[[Any], bool]]
"""(file stem, title, draw(ax) -> whether anything was drawn)."""


def panels(runs: list[Path], data: dict[Path, list[dict[str, Any]]]) -> list[Panel]:
    """The panels of the runs' figures (see the module doc), in dashboard order."""
    names = labels(runs)
    col = {run: f"C{i % 10}" for i, run in enumerate(runs)}

    def rollout(ax: Any) -> bool:
        drawn = False
        for run, name in zip(runs, names):
            r, p = series(data[run], "rollout/reward_mean"), series(data[run], "rollout/pass_rate")
            if r[0]:
                _curve(ax, *r, col[run], f"{name} reward")
                drawn = True
            if p[0] and not _same(r, p):
                _curve(ax, *p, col[run], f"{name} pass rate", "--")
                drawn = True
        return drawn

    def heldout(ax: Any) -> bool:
        drawn = False
        for run, name in zip(runs, names):
            x, y = series(data[run], "eval/pass@1")
            if not x:
                continue
            se = dict(zip(*series(data[run], "eval/pass@1_se")))
            ax.errorbar(x, y, yerr=[se.get(s, 0.0) for s in x], color=col[run], marker="o",
                        markersize=4, capsize=3, label=name)
            drawn = True
        ax.set_ylim(bottom=0)
        return drawn

    def one(key: str) -> Callable[[Any], bool]:
        def draw(ax: Any) -> bool:
            drawn = False
            for run, name in zip(runs, names):
                x, y = series(data[run], key)
                if x:
                    _curve(ax, x, y, col[run], name)
                    drawn = True
            return drawn
        return draw

    def kl(ax: Any) -> bool:
        drawn = False
        for run, name in zip(runs, names):
            for key, style in (("loss/kl", "-"), ("loss/approx_kl", ":")):
                x, y = series(data[run], key)
                if x and max(abs(v) for v in y) > 1e-12:  # all 0: KL off (or on-policy)
                    _curve(ax, x, y, col[run], f"{name} {key}", style)
                    drawn = True
        return drawn

    def sft(ax: Any) -> bool:
        drawn = False
        for run, name in zip(runs, names):
            x, y = series(_sft_rows(run), "sft/loss")
            if x:
                _curve(ax, x, y, col[run], name)
                drawn = True
        ax.set_xlabel("warm-start step")
        return drawn

    return [("reward", "rollout reward (pass rate dashed where it differs)", rollout),
            ("eval_pass1", "held-out pass@1 ± s.e. (step 0 = before RL)", heldout),
            ("response_length", "sampled tokens per episode", one("rollout/response_len")),
            ("entropy", "token entropy (nats)", one("loss/entropy")),
            ("kl", "KL (solid: to the reference; dotted: to the old policy)", kl),
            ("sft_loss", "warm-start loss (nats per answer token)", sft)]


def _time_share(ax: Any, rows: list[dict[str, Any]], name: str) -> bool:
    steps, sec = stage_shares(rows)
    if not steps:
        return False
    keys = [k for k in STAGE_KEYS if sum(sec[k]) > 0]
    sm = {k: smooth(sec[k], _weight(len(steps))) for k in keys}  # seconds smoothed, then shared
    tot = [sum(sm[k][i] for k in keys) or 1.0 for i in range(len(steps))]
    shares = [[sm[k][i] / tot[i] for i in range(len(steps))] for k in keys]
    ax.stackplot(steps, shares, labels=[f"{k} {sum(sec[k]):.1f}s" for k in keys],
                 colors=[f"C{STAGE_KEYS.index(k)}" for k in keys], alpha=0.8)
    ax.set_ylim(0, 1)
    ax.set_title(f"{name}: share of step time (smoothed; legend: total s)", fontsize=9)
    ax.legend(fontsize=7, loc="lower left", framealpha=0.9)
    return True


def plot_runs(run_dirs: Sequence[str | Path], out_png_dir: str | Path) -> list[Path]:
    """Write the PNGs of the module doc for the runs, overlaid in each figure.

    Args:
        run_dirs: run output directories (each with a metrics.jsonl).
        out_png_dir: where the PNGs go (created).

    Returns:
        paths of the written PNGs, `dashboard.png` first.

    Raises:
        FileNotFoundError: a run directory has no metrics.jsonl.
        ValueError: no run directory given.
        ModuleNotFoundError: matplotlib is not installed (the message says how to install it).
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
    names = labels(runs)

    def style(ax: Any, title: str) -> None:
        ax.set_title(title, fontsize=9)
        if not ax.get_xlabel():
            ax.set_xlabel("RL step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)

    kept: list[Panel] = []
    for stem, title, draw in panels(runs, data):
        fig, ax = plt.subplots(figsize=(6.4, 4.0))
        if draw(ax):
            style(ax, title)
            fig.tight_layout()
            fig.savefig(out / f"{stem}.png", dpi=100)
            written.append(out / f"{stem}.png")
            kept.append((stem, title, draw))
        plt.close(fig)
    timed = [(run, name) for run, name in zip(runs, names) if stage_shares(data[run])[0]]
    if timed:
        fig, axes = plt.subplots(1, len(timed), figsize=(5.5 * len(timed), 3.6), squeeze=False)
        for ax, (run, name) in zip(axes.flat, timed):
            _time_share(ax, data[run], name)
            ax.set_xlabel("RL step")
        fig.tight_layout()
        fig.savefig(out / "time_share.png", dpi=100)
        written.append(out / "time_share.png")
        plt.close(fig)

    # the dashboard: every panel on one page, then one time-share panel per run
    n = len(kept) + len(timed)
    if n:
        cols = min(3, n)
        rows_ = math.ceil(n / cols)
        fig, axes = plt.subplots(rows_, cols, figsize=(5.2 * cols, 3.6 * rows_), squeeze=False)
        for ax, (_, title, draw) in zip(axes.flat, kept):
            draw(ax)
            style(ax, title)
        for ax, (run, name) in zip(list(axes.flat)[len(kept):], timed):
            _time_share(ax, data[run], name)
            ax.set_xlabel("RL step")
        for ax in list(axes.flat)[n:]:
            ax.axis("off")
        fig.suptitle("agentrl: " + ", ".join(names))
        fig.tight_layout()
        fig.savefig(out / "dashboard.png", dpi=100)
        written.insert(0, out / "dashboard.png")
        plt.close(fig)
    return written
