"""The Ray cluster a run uses: `ensure_ray` starts a private local one or joins one (rollout
workers and learner ranks both call it)."""

from __future__ import annotations

import os
from typing import Any


def ensure_ray(address: str | None = None, *, num_cpus: int | None = None, **init_kwargs: Any) -> None:
    """Start a private local Ray cluster, or join the one at `address`; no-op if already up.

    Args:
        address: a cluster address (`"auto"`, `"ray://host:10001"`, `"host:6379"`), given
            explicitly (`rollout.ray_address`); None or "" starts a new local cluster of this
            process (`ray.init(address="local")`), never joining one already running on the
            machine (`ray start`: its address file /tmp/ray/ray_current_cluster, stale or not,
            and `RAY_ADDRESS` are not read). Ray 2.60 protects it with token authentication by
            default (a token in ~/.ray/auth_token; `RAY_AUTH_MODE` overrides); its gRPC servers
            listen on every interface, and Ray turns a loopback `_node_ip_address` back into
            the host's address, so it cannot be confined to 127.0.0.1 (docs/scale_out.md).
        num_cpus: CPUs of a *local* cluster (ignored when joining one).
        init_kwargs: further `ray.init` keywords (e.g. `runtime_env`, `job_config`).

    Logs of the workers stay in Ray's session folder (`log_to_driver=False`), and no dashboard
    is started: on 2 cores `ray.init` alone takes 11-21 s and ~650 MiB (docs/scale_out.md).
    """
    import ray

    if ray.is_initialized():
        return
    kw: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
    if address:
        kw.update(init_kwargs)
        ray.init(address=address, **kw)
        return
    kw["num_cpus"] = num_cpus
    kw.update(init_kwargs)
    ray.init(address="local", **kw)


def local_cluster_cpus() -> float:
    """CPUs of the local cluster `ensure_ray(None)` starts or has started (a float, Ray's unit).

    Sources: `ray.cluster_resources()` when this process already runs Ray (a test's
    `ray.init(num_cpus=2)`, a pool started earlier), else what `ray.init` would detect: Ray's
    own count (its container-aware `get_num_cpus`, cgroup quotas included), or
    `os.cpu_count()` where a Ray release moved that helper.
    """
    import sys

    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        return float(ray.cluster_resources().get("CPU", 0.0))
    try:
        from ray._private.utils import get_num_cpus
    except ImportError:
        return float(os.cpu_count() or 1)
    return float(get_num_cpus())


def local_cluster_gpus() -> float:
    """GPUs of the local cluster `ensure_ray(None)` starts or has started: `ray.cluster_resources()`
    when this process already runs Ray, else the CUDA devices this process's torch sees
    (`CUDA_VISIBLE_DEVICES` applies to both; a CPU build of torch sees none, and a worker
    reserving a GPU needs torch's CUDA to use it)."""
    import sys

    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        return float(ray.cluster_resources().get("GPU", 0.0))
    import torch

    return float(torch.cuda.device_count()) if torch.cuda.is_available() else 0.0


def actor_options(cpus: float, gpus: float) -> dict[str, Any]:
    """Ray actor options of a worker role: its reserved CPUs / GPUs, no restarts (a dead worker
    fails the step with Ray's error, the run's checkpoint stays)."""
    return {"num_cpus": cpus, "num_gpus": gpus, "max_restarts": 0}
