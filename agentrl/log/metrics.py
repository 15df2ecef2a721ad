"""Per-step metrics of a run: OUT/metrics.jsonl, TensorBoard (OUT/tb) and Weights & Biases."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from agentrl.config import ConfigError


class MetricsLog:
    """Appends one JSON object per step to OUT/metrics.jsonl, and the finite numbers to
    TensorBoard (OUT/tb, when installed) and Weights & Biases (when `wandb_project` is given).

    A run starting at `start_step` (0, or the checkpoint's step on resume) first drops rows of
    later steps (logged by an interrupted run after its checkpoint, a torn last line included),
    and TensorBoard purges events from step `start_step + 1` on: every step is logged once.
    """

    def __init__(self, out: Path, tensorboard: bool = True, *, start_step: int = 0,
                 wandb_project: str | None = None, run_config: dict[str, Any] | None = None):
        self.path = out / "metrics.jsonl"
        rows = self.path.read_text().splitlines() if self.path.exists() else []
        self.path.write_text("".join(r + "\n" for r in rows if _row_step(r) <= start_step))
        self.tb = None
        self.note: str | None = None
        """Why TensorBoard is not written although asked for (None when it is, or not asked)."""
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as e:  # a core dependency, but an environment may lack it
                self.note = (f"TensorBoard is not written ({e}): pip install 'tensorboard>=2.15' "
                             "(or set log.tensorboard=false to silence this)")
            else:
                self.tb = SummaryWriter(str(out / "tb"), purge_step=start_step + 1)
        self.wandb = _wandb_run(out, wandb_project, run_config, start_step) if wandb_project else None

    def log(self, step: int, metrics: dict[str, float]) -> None:
        row = {"step": step, **{k: (v if isinstance(v, (int, float)) and math.isfinite(v) else None)
                                if isinstance(v, (int, float)) else v for k, v in metrics.items()}}
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if self.tb is not None:
            for k, v in metrics.items():
                if isinstance(v, (int, float)) and math.isfinite(v):
                    self.tb.add_scalar(k, v, step)
            self.tb.flush()
        if self.wandb is not None:
            self.wandb.log({k: v for k, v in metrics.items()
                            if isinstance(v, (int, float)) and math.isfinite(v)}, step=step)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()


def _row_step(line: str) -> float:
    """The step of a metrics.jsonl line (inf for a torn or foreign line, so it is dropped)."""
    try:
        return float(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return math.inf


def _wandb_run(out: Path, project: str, run_config: dict[str, Any] | None, start_step: int) -> Any:
    """Start a W&B run in OUT (on resume, `start_step` > 0, continue the run whose id is kept in
    OUT/wandb_id.txt). `WANDB_MODE=offline` writes it under OUT/wandb without network."""
    import secrets

    import wandb

    id_file = out / "wandb_id.txt"
    resumed = start_step > 0 and id_file.exists()
    run_id = id_file.read_text().strip() if resumed else secrets.token_hex(4)
    id_file.write_text(run_id)
    try:
        return wandb.init(project=project, dir=str(out), name=out.resolve().name, id=run_id,
                          resume="allow", config=run_config)
    except wandb.errors.UsageError as e:  # no API key (a wandb older than check_wandb_login knows)

        raise ConfigError(f"config error: log.wandb: {e} {WANDB_FIX}") from None


WANDB_FIX = ("Set WANDB_API_KEY (or run `wandb login`), log without network with WANDB_MODE=offline "
             "(upload later with `wandb sync OUT/wandb/offline-run-*`), or set log.wandb=false")
WANDB_NO_NETWORK = ("offline", "disabled", "dryrun")
"""`WANDB_MODE` values under which W&B needs no API key."""


def check_wandb_login() -> None:
    """Start-up check of `log.wandb=true`: unless `WANDB_MODE` is one of `WANDB_NO_NETWORK`
    (or `WANDB_DISABLED` is set), W&B must find an API key (`WANDB_API_KEY`, `wandb login`'s
    .netrc, its settings file). Asks `wandb.login(verify=False, prompt=False)`: no network, no
    prompt, nothing written. A wandb whose `login` has no `prompt` argument is not checked here
    (`wandb.init`'s own error is then turned into the same `ConfigError`).

    Raises:
        ConfigError: no API key, or a malformed one (`config error: log.wandb: ...`, naming
            `WANDB_API_KEY` and `WANDB_MODE=offline`).
    """
    import os

    if (os.environ.get("WANDB_MODE", "").lower() in WANDB_NO_NETWORK
            or os.environ.get("WANDB_DISABLED", "").lower() in ("1", "true", "yes")):
        return
    import wandb


    try:
        found = wandb.login(verify=False, prompt=False)
    except TypeError:
        return
    except wandb.errors.Error as e:  # AuthenticationError: a malformed WANDB_API_KEY
        raise ConfigError(f"config error: log.wandb: {e} {WANDB_FIX}") from None
    except ValueError as e:  # pydantic's ValidationError of its Settings: e.g. WANDB_MODE=bogus
        said = " ".join(str(e).split())
        raise ConfigError(f"config error: log.wandb: W&B refused its settings ({said}); check WANDB_MODE "
                          f"(online, offline, disabled) and the other WANDB_* variables. {WANDB_FIX}") from None
    if not found:
        raise ConfigError(f"config error: log.wandb: no W&B API key is configured. {WANDB_FIX}")
