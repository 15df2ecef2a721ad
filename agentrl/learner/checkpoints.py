"""Run folders and checkpoint integrity.

- A new run never writes into a folder that holds anything (`check_out`): an earlier run is
  continued with `--resume OUT` or replaced with `--overwrite` (which removes agentrl's own
  artefacts only, and refuses when anything else is there).
- A checkpoint is written into a temporary folder, each file fsynced, a `manifest.json` of
  SHA-256 digests added, then renamed into place (`seal`); `intact` re-hashes it, and
  `latest_checkpoint` returns the newest intact `OUT/checkpoints/step_N`, naming the ones it
  skipped (a flipped byte, a truncated file, a missing file); `run_checkpoint` the one a run
  folder given as a model stands for.
- `prune` keeps the newest `keep` checkpoints (`train.keep_checkpoints`).
- The layout of a learner's checkpoint is written by `write_checkpoint` (the in-process learner
  and the group of ranks alike) and its parts read back by `read_state`; `rng_state` /
  `set_rng_state` are the torch, numpy, Python (and CUDA) generators saved with it.
- `pack_state` / `unpack_state`: a nested state (dicts, lists, scalars, numpy arrays; the reward
  wrappers' state, `REWARD_STATE`) as one safetensors file: the arrays as tensors, the rest as
  JSON in the file's metadata.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentrl.infra.runfolder import LOCK_NAME, check_no_links

MANIFEST = "manifest.json"
TRAINER_STATE = "trainer_state.pt"
"""Optimizer (in-process learner), scheduler, optimizer-step count and the driver's RNG states."""
VALUE_HEAD = "value_head.pt"
REF_MODEL = "ref_model.pt"
ALGO_STATE = "algo_state.pt"
RUN_STATE = "agentrl_state.json"
"""`extra` of `write_checkpoint`: the loop's step, policy version and data cursor."""
SHARDED = "dcp"
"""The learner ranks' `torch.distributed.checkpoint` folder (`agentrl.learner.rank`)."""
REWARD_STATE = "reward_state.safetensors"
"""The reward wrappers' state in a checkpoint (`agentrl.rewards.RewardWrappers.state_dict`)."""
RUN_CONFIG = "run_config.json"
"""The run's config when the checkpoint was saved (OUT/config.json then): `--resume` compares
OUT/config.json with it (`agentrl.startup.check_resume_edits`)."""

RUN_ARTEFACTS = ("config.json", "metrics.jsonl", "sft_metrics.jsonl", "summary.json", "eval_before.json",
                 "checkpoints", "rollouts", "eval", "tb", "base_model", "sft_model", "rollout_model",
                 "reference_model", "plots", "model", "merged")
"""What `agentrl train` (and `plot`, `sft`, offline DPO, `merge`) writes in OUT (`--overwrite` removes these; `checkpoints.old-*` too)."""


def _is_artefact(p: Path) -> bool:
    return p.name in RUN_ARTEFACTS or p.name.startswith("checkpoints.old-") or p.name.endswith(".tmp")


def check_out(out: Path, *, overwrite: bool, resumable: bool = True) -> list[str]:
    """Make `out` ready for a new run (not a resume): it must be absent or empty; with
    `overwrite`, agentrl's artefacts in it are removed first. Returns the names removed.
    `resumable`: the command has `--resume` (`agentrl train`), so the refusal offers it; the
    offline stages (`agentrl sft`, offline DPO) have none.

    Raises:
        ValueError: `out` is an existing file; it holds an earlier run or other files (without
            `overwrite`: the message says `--overwrite`, and `--resume` when `resumable`); with
            `overwrite`, it holds files agentrl did not write, or a symbolic link anywhere
            (`agentrl.infra.runfolder.check_no_links`; nothing is removed then).
    """
    if out.exists() and not out.is_dir():
        raise ValueError(f"out: {out} is a file, not a folder")
    if not out.exists():
        return []
    items = sorted(p for p in out.iterdir() if p.name != LOCK_NAME)  # the lock is the run's own, kept
    if not items:
        return []
    foreign = [p.name for p in items if not _is_artefact(p)]
    if not overwrite:
        what = "an earlier run" if (out / "config.json").exists() else "files"
        cont = f"continue it with --resume {out}, " if resumable else ""
        raise ValueError(f"out: {out} already holds {what} ({', '.join(p.name for p in items[:6])}"
                         f"{', ...' if len(items) > 6 else ''}); {cont}replace it with --overwrite, "
                         "or choose another --out")
    if foreign:
        raise ValueError(f"out: {out} holds files agentrl did not write ({', '.join(foreign[:6])}); "
                         "--overwrite removes only a run's own files: choose another --out")
    check_no_links(out, "--overwrite")  # every artefact checked before any is removed
    for p in items:
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink()
    return [p.name for p in items]


def _digest(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)


def seal(tmp: Path, final: Path) -> Path:
    """Finish a checkpoint written in `tmp`: fsync every file, write `manifest.json` (SHA-256
    and size of each file, relative paths), fsync it and the folder, replace `final` with it
    (rename) and fsync the parent. Returns `final`."""
    manifest = {}
    for p in _files(tmp):
        with p.open("rb") as f:
            os.fsync(f.fileno())
        manifest[str(p.relative_to(tmp))] = {"sha256": _digest(p), "bytes": p.stat().st_size}
    m = tmp / MANIFEST
    m.write_text(json.dumps(manifest, indent=1, sort_keys=True))
    with m.open("rb") as f:
        os.fsync(f.fileno())
    _fsync_dir(tmp)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    _fsync_dir(final.parent)
    return final


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_checkpoint(path: str | Path, model: Any, tokenizer: Any, *, trainer_state: dict[str, Any],
                     algo_state: dict[str, Any], extra: dict[str, Any],
                     files: dict[str, bytes] | None = None,
                     value_head: dict[str, torch.Tensor] | None = None,
                     ref_model: dict[str, torch.Tensor] | None = None,
                     sharded: Callable[[Path], None] | None = None) -> Path:
    """Write a learner's checkpoint atomically into `path` (a temp folder, sealed: `seal`):

        config.json, model weights    `model.save_pretrained` (LoRA: the adapters)
        tokenizer files                `tokenizer.save_pretrained` (+ its image processor)
        trainer_state.pt               `trainer_state`
        value_head.pt, ref_model.pt    the value head's / reference model's state (when given)
        dcp/                           what `sharded(tmp)` writes (learner ranks)
        algo_state.pt                  `algo_state` (e.g. PPO's adaptive KL coefficient)
        agentrl_state.json             `extra` (step, policy version, data cursor)
        NAME                           each of `files` (name -> bytes, e.g. the reward state)

    Returns `path`."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if getattr(tokenizer, "image_processor", None) is not None:  # a vision-language policy
        tokenizer.image_processor.save_pretrained(tmp)
    if sharded is not None:
        sharded(tmp)
    torch.save(trainer_state, tmp / TRAINER_STATE)
    if ref_model is not None:
        torch.save(ref_model, tmp / REF_MODEL)
    if value_head is not None:
        torch.save(value_head, tmp / VALUE_HEAD)
    torch.save(algo_state, tmp / ALGO_STATE)
    (tmp / RUN_STATE).write_text(json.dumps(extra, indent=1))
    for name, data in (files or {}).items():
        (tmp / name).write_bytes(data)
    return seal(tmp, path)


def read_state(path: str | Path, name: str) -> Any:
    """The part `name` of the checkpoint in `path` (`TRAINER_STATE`, `VALUE_HEAD`, `REF_MODEL`,
    `ALGO_STATE`: tensors on the CPU and plain containers, loaded with `weights_only=True`, so a
    tampered file runs no code; `RUN_STATE`: the `extra` dict, its `step` checked), or None when
    the checkpoint has no such file.

    Raises:
        ValueError: the file cannot be loaded as tensors and plain containers (a pickle of
            anything else, a truncated file), or `RUN_STATE` is not valid (`check_run_state`).
    """
    f = Path(path) / name
    if not f.exists():
        return None
    if name == RUN_STATE:
        try:
            return check_run_state(json.loads(f.read_text()), f)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"{f}: unreadable: {e}") from None
    return safe_load(f)


def safe_load(f: Path) -> Any:
    """`torch.load(f, weights_only=True)` on the CPU: tensors, dicts, lists, tuples and scalars
    only (no code of the file's runs).

    Raises:
        ValueError: anything else in the file, or an unreadable file (names it).
    """
    try:
        return torch.load(f, weights_only=True, map_location="cpu")
    except Exception as e:  # noqa: BLE001 - UnpicklingError, RuntimeError, EOFError, OSError ...
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"{f}: not loadable as tensors and plain containers ({first})") from None


def check_run_state(extra: Any, where: Path | str = RUN_STATE) -> dict[str, Any]:
    """`extra` when it is a dict whose `step` and `policy_version` (when present) are integers
    >= 0 (a negative step would truncate metrics.jsonl on resume).

    Raises:
        ValueError: naming the file and the key.
    """
    if not isinstance(extra, dict):
        raise ValueError(f"{where}: not a JSON object")
    for key in ("step", "policy_version"):
        v = extra.get(key, 0)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"{where}: {key} must be an integer >= 0, not {v!r}")
    if "step" not in extra:
        raise ValueError(f"{where}: no step")
    return extra


def rng_state() -> dict[str, Any]:
    """This process's torch, numpy, Python and CUDA (None without CUDA) generator states, as
    tensors and plain containers (`torch.load(weights_only=True)` reads them back)."""
    _, keys, pos, has_gauss, cached = np.random.get_state()
    version, words, gauss_next = random.getstate()
    return {"torch_rng": torch.get_rng_state(),
            "numpy_rng": {"keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)), "pos": int(pos),
                          "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
            "python_rng": {"version": int(version), "state": torch.tensor(words, dtype=torch.int64),
                           "gauss_next": gauss_next},
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_state(st: dict[str, Any]) -> None:
    """Restore the generators of `rng_state` (CUDA's when saved and available).

    Raises:
        ValueError: `st` is not `rng_state`'s layout (e.g. written by an older agentrl).
    """
    try:
        npr, pyr = st["numpy_rng"], st["python_rng"]
        torch.set_rng_state(st["torch_rng"])
        np.random.set_state(("MT19937", npr["keys"].numpy().astype(np.uint32), int(npr["pos"]),
                             int(npr["has_gauss"]), float(npr["cached_gaussian"])))
        random.setstate((int(pyr["version"]), tuple(int(w) for w in pyr["state"].tolist()),
                         pyr["gauss_next"]))
    except (KeyError, TypeError, AttributeError, ValueError, RuntimeError) as e:
        raise ValueError(f"RNG state not in this agentrl's layout: {type(e).__name__}: {e}") from None
    if st.get("cuda_rng") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda_rng"])


def intact(ck: Path) -> str | None:
    """None when checkpoint `ck` is whole (`manifest_mismatch`) and loadable (`unloadable`),
    else why not."""
    return manifest_mismatch(ck) or unloadable(ck)


def manifest_mismatch(ck: Path) -> str | None:
    """None when `ck/manifest.json` lists every file of `ck` (and nothing else) with its size and
    SHA-256, all matching, and no entry of `ck` is a symbolic link; else why not (no manifest,
    an empty or malformed one, a file missing, added, resized or changed)."""
    m = ck / MANIFEST
    if m.is_symlink() or not m.is_file():
        return f"no {MANIFEST} (a checkpoint is intact only with one)"
    try:
        manifest = json.loads(m.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        return f"unreadable {MANIFEST}: {e}"
    if not isinstance(manifest, dict) or not manifest:
        return f"{MANIFEST} lists no files"
    links = [p for p in ck.rglob("*") if p.is_symlink()]
    if links:
        return f"{links[0].relative_to(ck)} is a symbolic link"
    present = {str(p.relative_to(ck)) for p in _files(ck)}
    if present - set(manifest):
        return f"{sorted(present - set(manifest))[0]} is not in {MANIFEST}"
    for rel, want in manifest.items():
        p = ck / rel
        if not isinstance(want, dict) or not isinstance(want.get("bytes"), int) \
                or not isinstance(want.get("sha256"), str):
            return f"{MANIFEST}: malformed entry for {rel}"
        if rel not in present:
            return f"{rel} is missing"
        if p.stat().st_size != want["bytes"]:
            return f"{rel} has {p.stat().st_size} bytes, the manifest says {want['bytes']}"
        if _digest(p) != want["sha256"]:
            return f"{rel} does not match its SHA-256 in {MANIFEST}"
    return None


def unloadable(ck: Path) -> str | None:
    """None when every part of checkpoint `ck` reads back as data: `agentrl_state.json`
    (`check_run_state`), each `*.pt` as tensors and plain containers (`safe_load`, memory-mapped),
    each `*.safetensors` header, and the DCP `.metadata` of learner ranks (`check_dcp_metadata`);
    else why not. Nothing in `ck` is executed."""
    from safetensors import safe_open

    try:
        read_state(ck, RUN_STATE)
        for p in _files(ck):
            if p.suffix == ".pt":
                torch.load(p, weights_only=True, map_location="cpu", mmap=True)
            elif p.suffix == ".safetensors":
                with safe_open(str(p), framework="pt") as f:
                    f.keys()
            elif p.name == ".metadata" and p.parent.name == SHARDED:
                check_dcp_metadata(p)
    except Exception as e:  # noqa: BLE001 - any failure to read it back: the checkpoint is not loadable
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return f"cannot be loaded: {first}"
    return None


_DCP_GLOBALS = {("torch", "Size"), ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"),
                ("pathlib", "PurePosixPath"), ("collections", "OrderedDict"),
                ("torch.distributed.checkpoint.filesystem", "_StorageInfo")}


class _DcpUnpickler(pickle.Unpickler):
    """Reads a DCP `.metadata` pickle, resolving only the classes that file is made of (the
    metadata dataclasses of `torch.distributed.checkpoint.metadata`, dtypes, sizes, paths)."""

    def find_class(self, module: str, name: str) -> Any:
        ok = (module, name) in _DCP_GLOBALS or (
            module == "torch" and isinstance(getattr(torch, name, None), (torch.dtype, torch.layout)))
        if module == "torch.distributed.checkpoint.metadata":
            import torch.distributed.checkpoint.metadata as meta

            obj = getattr(meta, name, None)
            ok = isinstance(obj, type) and obj.__module__ == meta.__name__
        if not ok:
            raise pickle.UnpicklingError(f"{module}.{name} is not allowed in DCP metadata")
        return super().find_class(module, name)


def check_dcp_metadata(path: Path) -> None:
    """Unpickle the DCP `.metadata` file `path` with only its own classes allowed, before
    `torch.distributed.checkpoint` (which uses plain `pickle.load`) reads it.

    Raises:
        pickle.UnpicklingError: it names another global (a payload).
    """
    with path.open("rb") as f:
        _DcpUnpickler(f).load()


def checkpoints(out: Path) -> list[Path]:
    """The complete `OUT/checkpoints/step_N` folders (interrupted saves, `*.tmp`, and symbolic
    links left out), oldest first."""
    ck = Path(out) / "checkpoints"
    if not ck.is_dir():
        return []
    done = [p for p in ck.iterdir() if p.name.startswith("step_") and not p.name.endswith(".tmp")
            and not p.is_symlink()
            and p.name[5:].isdigit() and (p / RUN_STATE).exists()]
    return sorted(done, key=lambda p: int(p.name[5:]))


def latest_checkpoint(out: str | Path, on_skip: Callable[[Path, str], None] | None = None) -> Path | None:
    """The newest intact checkpoint of run folder `out` (None: none); each newer one that
    fails `intact` is skipped and reported to `on_skip(path, reason)`."""
    for ck in reversed(checkpoints(Path(out))):
        why = intact(ck)
        if why is None:
            return ck
        if on_skip is not None:
            on_skip(ck, why)
    return None


def is_run_folder(p: Path, config: Any) -> bool:
    """Whether folder `p` (its `config.json` parsed as `config`, `{}` when it has none) is a
    training run's output folder: it has `checkpoints/` or `metrics.jsonl`, or its
    `config.json` is a run's config (`env`, `algo` and `model` keys)."""
    run_config = isinstance(config, dict) and {"env", "algo", "model"} <= set(config)
    return (p / "checkpoints").is_dir() or (p / "metrics.jsonl").is_file() or run_config


def run_checkpoint(path: str | Path, on_skip: Callable[[Path, str], None] | None = None) -> Path | None:
    """When `path` is a training run's folder (it has `checkpoints/` and is no model directory
    itself: no `config.json` with `model_type` or `architectures`), its newest intact checkpoint
    (`latest_checkpoint`, newer ones that fail then reported to `on_skip`); None for anything else
    (a model directory, a checkpoint, a path that does not exist), left to the caller.
    `agentrl serve`, `eval`, `doctor --model` and `train model.path=` take a run folder so.

    Raises:
        FileNotFoundError: a run folder without an intact checkpoint (naming why the newest
            two are not), or without `checkpoints/` (`is_run_folder`): one message for every
            command that takes a model; the folder of an offline stage (`agentrl sft`, offline
            DPO: no `checkpoints/`, its model in `model/`) names that model directory.
    """
    p = Path(path)
    try:
        own = json.loads((p / "config.json").read_text())
    except (OSError, ValueError):
        own = {}
    if isinstance(own, dict) and ("model_type" in own or "architectures" in own):
        return None
    if not (p / "checkpoints").is_dir():
        if (p / "summary.json").is_file() and (p / "model" / "config.json").is_file():
            raise FileNotFoundError(f"{p} is the output folder of an offline stage (agentrl sft or offline "
                                    f"DPO), not a model: its model is {p / 'model'}; give that")
        if is_run_folder(p, own):  # a run that saved none yet (or whose checkpoints/ is gone)
            raise FileNotFoundError(f"{p} is a training run's folder with no checkpoint to use as a "
                                    "model (no checkpoints/ in it: the run saved none; it saves one "
                                    "every train.save_every steps and at its end): give a model "
                                    "directory, a checkpoint OUT/checkpoints/step_N, or a run "
                                    "folder that has one")
        return None
    skipped: list[tuple[Path, str]] = []
    ck = latest_checkpoint(p, lambda c, why: skipped.append((c, why)))
    if ck is None:
        why = "; ".join(f"{c.name}: {w}" for c, w in skipped[:2]) or "checkpoints/ holds none"
        raise FileNotFoundError(f"{p} is a training run's folder with no intact checkpoint "
                                f"to use as a model ({why})")
    for c, w in skipped if on_skip is not None else ():
        on_skip(c, w)
    return ck


def prune(out: Path, keep: int) -> list[Path]:
    """Delete all but the newest `keep` checkpoints of `out` (0: keep all); returns those
    deleted."""
    if keep <= 0:
        return []
    old = checkpoints(out)[:-keep]
    for p in old:
        shutil.rmtree(p, ignore_errors=True)
    return old


def _encode(obj: Any, path: str, arrays: dict[str, Any]) -> Any:
    if isinstance(obj, np.ndarray):
        arrays[path] = np.ascontiguousarray(obj)
        return {"__array__": path, "shape": list(obj.shape)}  # safetensors stores () as (1,)
    if isinstance(obj, dict):
        if not all(isinstance(k, str) for k in obj):
            raise TypeError(f"pack_state: {path or 'the state'} has a key that is not a string")
        return {k: _encode(v, f"{path}/{k}", arrays) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_encode(v, f"{path}/{i}", arrays) for i, v in enumerate(obj)]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"pack_state: {path or 'the state'} is a {type(obj).__name__} (allowed: dict, "
                    "list, numpy array, int, float, str, bool, None)")


def _decode(obj: Any, arrays: Any) -> Any:
    if isinstance(obj, dict):
        if set(obj) == {"__array__", "shape"}:
            return arrays.get_tensor(obj["__array__"]).reshape(obj["shape"])
        return {k: _decode(v, arrays) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_decode(v, arrays) for v in obj]
    return obj


def pack_state(state: Any) -> bytes:
    """`state` (nested dicts with string keys, lists, numpy arrays, JSON scalars) as the bytes
    of a safetensors file: each array a tensor named by its path in the state (`a/b/0`), the
    rest JSON in the metadata key `state`. Floats round-trip exactly (JSON `repr`; NaN allowed).

    Raises:
        TypeError: a leaf of another type, or a dict key that is not a string (names its path).
    """
    from safetensors.numpy import save

    arrays: dict[str, Any] = {}
    skeleton = _encode(state, "", arrays)
    return save(arrays, metadata={"state": json.dumps(skeleton)})


def unpack_state(path: Path) -> Any:
    """The state of a file holding `pack_state`'s bytes (arrays as numpy arrays, tuples as
    lists).

    Raises:
        ValueError: `path` is not a safetensors file written by `pack_state` (names the file).
    """
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="np") as f:
            meta = f.metadata() or {}
            if "state" not in meta:
                raise ValueError(f"{path}: no `state` metadata (not written by pack_state)")
            return _decode(json.loads(meta["state"]), f)
    except (OSError, json.JSONDecodeError, SafetensorError) as e:
        raise ValueError(f"{path}: unreadable state file: {e}") from e
