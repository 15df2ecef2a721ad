"""The Ray cluster a run uses: `ensure_ray` starts a private local one or joins one (rollout
workers and learner ranks both call it)."""

from __future__ import annotations

from typing import Any


def ensure_ray(address: str | None = None, *, num_cpus: int | None = None, **init_kwargs: Any) -> None:
    """Start a private local Ray cluster, or join the one at `address`; no-op if already up.

    Args:
        address: a cluster address (`"auto"`, `"ray://host:10001"`, `"host:6379"`); None or ""
            starts a local cluster in this process.
        num_cpus: CPUs of a *local* cluster (ignored when joining one).
        init_kwargs: further `ray.init` keywords (e.g. `runtime_env`, `job_config`).

    Logs of the workers stay in Ray's session folder (`log_to_driver=False`), and no dashboard
    is started: on 2 cores `ray.init` alone takes 11-21 s and ~650 MiB (docs/scale_out.md).
    """
    import ray

    if ray.is_initialized():
        return
    kw: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
    if not address:
        kw["num_cpus"] = num_cpus
    kw.update(init_kwargs)
    ray.init(address=address or None, **kw)


def actor_options(cpus: float, gpus: float) -> dict[str, Any]:
    """Ray actor options of a worker role: its reserved CPUs / GPUs, no restarts (a dead worker
    fails the step with Ray's error, the run's checkpoint stays)."""
    return {"num_cpus": cpus, "num_gpus": gpus, "max_restarts": 0}
