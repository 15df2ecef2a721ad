"""The reward model on a Ray actor of its own (`placement.reward_model=worker`): `ClassifierActor`
holds a `SequenceClassifier`; `RemoteClassifier` is its driver-side handle, used by the env wrappers."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentrl.infra.cluster import actor_options, ensure_ray
from agentrl.infra.devices import resolve_device
from agentrl.models.int8 import REFERENCE_DTYPES, quantize_int8
from agentrl.rewards.classifier import SequenceClassifier, p_unsafe_from_logits, score_from_logits


# -- the reward model -----------------------------------------------------------------------------
def actor_device(gpus: float) -> str:
    """The device of an actor that reserves `gpus` GPUs: `cuda` (Ray makes its GPU visible as
    device 0) when it reserves any, else `cpu`."""
    return "cuda" if gpus > 0 else "cpu"


class ClassifierActor:
    """A `SequenceClassifier` in a process of its own (a Ray actor of `RemoteClassifier`).

    Args:
        path: the classifier's model directory; dtype: `float32`, `bfloat16` parameters, or
        `int8` (`quantize_int8`, CPU only); torch_threads: torch threads of the process;
        device: where the model runs (`cuda` for an actor that reserves a GPU: `actor_device`);
        kwargs: `SequenceClassifier` options.

    Raises:
        ValueError: an unknown dtype, int8 on CUDA, `cuda` where the process sees no CUDA device.
        RuntimeError: int8 without the platform's int8 path."""

    def __init__(self, path: str, *, dtype: str = "float32", torch_threads: int = 1, device: str = "cpu",
                 **kwargs: Any) -> None:
        if dtype not in REFERENCE_DTYPES:
            raise ValueError(f"reward model dtype {dtype!r}; allowed: {', '.join(REFERENCE_DTYPES)}")
        dev = resolve_device(device, key="reward model device")
        if dtype == "int8" and dev.type != "cpu":
            raise ValueError("placement.reward_model_dtype=int8 runs on CPU only: set "
                             "placement.reward_model_gpus=0 or reward_model_dtype=bfloat16")
        torch.set_num_threads(torch_threads)
        self.clf = SequenceClassifier(path, device=dev, **kwargs)
        if dtype == "bfloat16":
            self.clf.model.to(torch.bfloat16)
        elif dtype == "int8":
            self.clf.model = quantize_int8(self.clf.model).eval()
        self.busy_s = 0.0

    def logits(self, prompts: Sequence[Any], responses: Sequence[str]) -> np.ndarray:
        """`SequenceClassifier.logits` (B, num_labels) float64."""
        t0 = time.perf_counter()
        try:
            return self.clf.logits(prompts, responses)
        finally:
            self.busy_s += time.perf_counter() - t0

    def meta(self) -> dict[str, int]:
        """`num_labels`, `label`, `unsafe_label` of the loaded classifier."""
        return {"num_labels": self.clf.num_labels, "label": self.clf.label, "unsafe_label": self.clf.unsafe_label}

    def take_busy(self) -> float:
        """Seconds spent scoring since the last call (then reset to 0)."""
        b, self.busy_s = self.busy_s, 0.0
        return b


class RemoteClassifier:
    """A classifier scored on its own Ray actor, with the interface of `SequenceClassifier`
    (`score`, `p_unsafe`, `logits`), for the reward wrappers (`placement.reward_model=worker`).

    The actor is named after the model path and options (`get_if_exists`): the driver's env
    wrappers and those of every rollout worker of the run score on the same actor.

    Args:
        path: the classifier's model directory.
        dtype, cpus, gpus: the actor's dtype and Ray resources (`placement.reward_model_*`).
        torch_threads: torch threads of the actor.
        ray_address: the cluster to join (None: a local one, or the one already up).
        kwargs: `SequenceClassifier` options (label, unsafe_label, input_format, ...).

    Raises:
        FileNotFoundError: `path` is not a directory.
    """

    def __init__(self, path: str | Path, *, dtype: str = "float32", cpus: float = 1.0, gpus: float = 0.0,
                 torch_threads: int = 1, ray_address: str | None = None, **kwargs: Any) -> None:
        import json

        import ray


        if not Path(path).is_dir():
            raise FileNotFoundError(f"classifier model directory not found: {path}")
        ensure_ray(ray_address)
        spec = json.dumps([str(Path(path).resolve()), dtype, kwargs], sort_keys=True, default=str)
        name = "agentrl_reward_model_" + hashlib.blake2b(spec.encode(), digest_size=8).hexdigest()
        cls = ray.remote(**actor_options(cpus, gpus))(ClassifierActor)
        self.actor = cls.options(name=name, get_if_exists=True, lifetime=None).remote(
            str(path), dtype=dtype, torch_threads=torch_threads, device=actor_device(gpus), **kwargs)
        meta = ray.get(self.actor.meta.remote())
        self.num_labels, self.label, self.unsafe_label = meta["num_labels"], meta["label"], meta["unsafe_label"]
        self.wait_s = 0.0
        self._lock = threading.Lock()

    def logits(self, prompts: Sequence[Any], responses: Sequence[str]) -> np.ndarray:
        """(B, num_labels) float64 logits, computed on the actor."""
        import ray

        if len(prompts) != len(responses):
            raise ValueError(f"{len(prompts)} prompts for {len(responses)} responses")
        t0 = time.perf_counter()
        out = ray.get(self.actor.logits.remote(list(prompts), list(responses)))
        with self._lock:
            self.wait_s += time.perf_counter() - t0
        return out

    def score(self, prompts: Sequence[Any], responses: Sequence[str]) -> np.ndarray:
        """As `SequenceClassifier.score`."""
        return score_from_logits(self.logits(prompts, responses), self.num_labels, self.label)

    def p_unsafe(self, prompts: Sequence[Any], responses: Sequence[str]) -> np.ndarray:
        """As `SequenceClassifier.p_unsafe`."""
        return p_unsafe_from_logits(self.logits(prompts, responses), self.num_labels, self.unsafe_label)

    def take_busy(self) -> float:
        """Seconds the actor spent scoring since the last call (then reset to 0)."""
        import ray

        return float(ray.get(self.actor.take_busy.remote()))
