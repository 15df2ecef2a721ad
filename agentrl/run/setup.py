"""A run's set-up, before anything is built (`agentrl.run.build` calls `set_up` first): threads,
seeds, the env's modules, the algorithm, the env- and policy-dependent defaults
(`agentrl.run.defaults`), the start-up checks (`agentrl.startup`), OUT's lock and
OUT/config.json.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentrl.algos import get_algorithm
from agentrl.config import Config
from agentrl.env.registry import import_env_modules, resolve_env_id
from agentrl.infra.runfolder import RunLocked, check_no_links, lock_run, unlock_run
from agentrl.learner.checkpoints import check_out
from agentrl.run.defaults import resolve_run_defaults
from agentrl.startup import (
    OutError,
    check_learner_device,
    check_resume_keeps_the_run,
    check_settings,
    preflight,
    resolve_model_path,
)


def quiet_libraries() -> None:
    """Silence transformers' per-file progress bars and info logs (our own progress shows)."""
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators with `seed`."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def set_up(cfg: Config, notes: list[str] | None = None) -> tuple[Config, Any, Path]:
    """Threads, seeds and the algorithm of the run; takes OUT's lock (`agentrl.infra.runfolder`,
    held until `agentrl.infra.runfolder.unlock_run(out)` or the process ends; released when this
    raises); writes OUT/config.json.

    Returns:
        `(cfg with the run's resolved defaults (`agentrl.run.defaults`: the env's, the
        policy's), the algorithm (`agentrl.algos.get_algorithm`), OUT)`; `notes` (a list,
        when given) receives the start-up notes: the checkpoint a run folder given as `model.path`
        stands for (`agentrl.startup.resolve_model_path`), the env's (`agentrl.startup.preflight`).

    Raises:
        ValueError: an unknown env.
        ConfigError: a setting that cannot run (`agentrl.startup.check_learner_device`:
            `train.device=cuda` without CUDA for the in-process learner, a CUDA rank without
            one whole GPU; `agentrl.startup.resolve_model_path`, `agentrl.startup.check_settings`,
            `agentrl.startup.preflight`).
        ResumeError: `--resume` with a setting the run keeps changed
            (`agentrl.startup.check_resume_keeps_the_run`).
        OutError: a new run's `out` is not empty (without `overwrite`), a file, or not writable;
            another process holds OUT's lock (names its pid); a resumed run's OUT (or an
            `--overwrite`'s) holds a symbolic link.
    """
    check_learner_device(cfg)  # fail early: train.device=cuda without CUDA (in this process)
    quiet_libraries()
    torch.set_num_threads(cfg.train.torch_threads)
    seed_everything(cfg.seed)
    import_env_modules(cfg.env.imports)  # their register_env calls run before the lookup
    resolve_env_id(cfg.env.name)  # fail early on an unknown env
    algo = get_algorithm(cfg.algo.name)
    found: list[str] = []
    cfg = resolve_model_path(cfg, found)  # a run folder as model.path: its newest checkpoint
    cfg = resolve_run_defaults(cfg)  # a VLM for an image env, its SFT lr
    check_settings(cfg)
    out = Path(cfg.resume or cfg.out)
    if out.exists() and not out.is_dir():  # before the env checks: the cheapest refusal first
        raise OutError(f"out: {out} is a file, not a folder")
    found += preflight(cfg)  # before check_out: an --overwrite that fails here has deleted nothing
    if notes is not None:
        notes.extend(found)
    _lock(out)  # held until `release` (or the process ends): no second run checks and writes it
    try:
        if cfg.resume:  # the run's own folder; a stray --out / --overwrite is not recorded in it
            cfg = cfg.model_copy(update={"out": str(out), "overwrite": False})
            try:
                check_no_links(out, "--resume")
            except ValueError as e:
                raise OutError(str(e)) from None
            check_resume_keeps_the_run(cfg, out)
        else:
            try:
                check_out(out, overwrite=cfg.overwrite)
            except ValueError as e:
                raise OutError(str(e)) from None
        try:
            (out / "config.json").write_text(cfg.model_dump_json(indent=1))
        except OSError as e:
            raise OutError(f"out: cannot write to {out}: {e.strerror or e}") from None
    except BaseException:
        unlock_run(out)
        raise
    return cfg, algo, out


def _lock(out: Path) -> None:
    """`agentrl.infra.runfolder.lock_run` of `out`, as an `OutError`."""
    try:
        lock_run(out)
    except RunLocked as e:
        raise OutError(str(e)) from None
    except OSError as e:
        raise OutError(f"out: cannot write to {out}: {e.strerror or e}") from None
