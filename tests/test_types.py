"""The contracts as types (agentrl/types.py): the keys of a collated batch are the `Batch`
TypedDict's, every batch key the library reads or writes is one of them, and (checked by mypy:
`test_mypy_passes`, and .ci/run) the learners, collectors and engines satisfy their Protocols."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from agentrl.learner.group import LearnerGroup
from agentrl.learner.local import Learner
from agentrl.rollout.engines.base import Engine
from agentrl.rollout.engines.hf import HFEngine
from agentrl.rollout.engines.scripted import ScriptedEngine
from agentrl.rollout.source import AsyncSource, LockedEngine, SyncSource
from agentrl.train import build_batch
from agentrl.types import Batch, Collector, Trajectory, collate
from agentrl.types import Learner as LearnerProto

ROOT = Path(__file__).resolve().parents[1]
BATCH_KEYS = set(Batch.__optional_keys__) | set(Batch.__required_keys__)
BATCH_NAMES = {"batch", "sub"}  # the names the library gives a batch and a micro-batch


# -- checked by mypy (`mypy` with pyproject.toml's [tool.mypy]); never called ---------------------
def _learners_satisfy_the_protocol(a: Learner, b: LearnerGroup) -> list[LearnerProto]:
    return [a, b]


def _sources_satisfy_the_protocol(a: SyncSource, b: AsyncSource) -> list[Collector]:
    return [a, b]


def _engines_satisfy_the_protocol(a: HFEngine, b: ScriptedEngine, c: LockedEngine) -> list[Engine]:
    return [a, b, c]


def _collate_gives_a_batch(t: Trajectory) -> torch.Tensor:
    b: Batch = collate([t], pad_id=0)
    return b["input_ids"]


# -- runtime ------------------------------------------------------------------------------------
def _traj(n_prompt: int, sampled: list[int], reward: float, group: int = 0) -> Trajectory:
    t = Trajectory(group_id=group)
    t.append_context(list(range(3, 3 + n_prompt)))
    t.append_sampled(sampled, [-0.5] * len(sampled), reward=reward)
    return t


def test_collate_keys_are_batch_keys() -> None:
    b = collate([_traj(2, [7, 8], 1.0), _traj(3, [9], 0.0)], pad_id=0)
    assert set(b) == {"input_ids", "attention_mask", "loss_mask", "sampler_logprobs",
                      "token_rewards", "lengths"}
    assert set(b) <= BATCH_KEYS
    assert b["input_ids"].shape == b["loss_mask"].shape == (2, 4)
    assert b["input_ids"].dtype == torch.long and b["loss_mask"].dtype == torch.float32
    assert b["lengths"].tolist() == [4, 4]


def test_collate_with_images_adds_vision() -> None:
    t = _traj(2, [7], 1.0)
    t.vision = {"pixel_values": torch.zeros(1, 4), "image_grid_thw": torch.ones(1, 3, dtype=torch.long),
                "image_spans": [[0, 1]], "images": [np.zeros((2, 2, 3), np.uint8)]}
    b = collate([t, _traj(1, [5], 0.0)], pad_id=0)
    assert "vision" in BATCH_KEYS and b["vision"][0] is t.vision and b["vision"][1] is None


def test_build_batch_keys_are_batch_keys() -> None:
    t = _traj(2, [7, 8], 1.0)
    t.info["sampler"] = "teacher"
    b = build_batch([t, _traj(1, [5], 0.0, group=1)], pad_id=0)
    assert {"scores", "group_ids", "truncated", "teacher_rows"} <= set(b) <= BATCH_KEYS


def batch_keys_in_source() -> dict[str, list[str]]:
    """Every string key of a batch that agentrl/ reads or writes: `batch["k"]`,
    `batch.get("k")` and `"k" in batch` (also on `sub`, a micro-batch), key -> places."""
    found: dict[str, list[str]] = {}
    for f in sorted((ROOT / "agentrl").rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            key = None
            if (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name)
                    and node.value.id in BATCH_NAMES and isinstance(node.slice, ast.Constant)):
                key = node.slice.value
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr == "get" and isinstance(node.func.value, ast.Name)
                  and node.func.value.id in BATCH_NAMES and node.args
                  and isinstance(node.args[0], ast.Constant)):
                key = node.args[0].value
            elif (isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant)
                  and isinstance(node.ops[0], (ast.In, ast.NotIn))
                  and isinstance(node.comparators[0], ast.Name)
                  and node.comparators[0].id in BATCH_NAMES):
                key = node.left.value
            if isinstance(key, str):
                found.setdefault(key, []).append(f"{f.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}")
    return found


def test_every_batch_key_in_the_library_is_declared() -> None:
    found = batch_keys_in_source()
    unknown = {k: v[:3] for k, v in found.items() if k not in BATCH_KEYS}
    assert not unknown, f"batch keys not declared in agentrl.types.Batch: {unknown}"
    unused = BATCH_KEYS - set(found)
    assert not unused, f"keys declared in agentrl.types.Batch that agentrl/ never uses: {unused}"


def test_mypy_passes() -> None:
    """mypy with pyproject.toml's [tool.mypy]: agentrl/types.py strictly, and this module's typed
    functions above (`Learner` and `LearnerGroup` are `agentrl.types.Learner`s, ...). A few
    seconds: torch and the other heavy libraries are read as Any."""
    r = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
