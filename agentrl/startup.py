"""The start-up checks of a run: everything `agentrl train` refuses before it writes or
builds anything heavy (settings, the env, the model directory, vision support, a resume's
folder), each failing with a message that names the key to change. `agentrl.run.set_up` and
`agentrl.run.build` call them in order.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import yaml
from gymnasium.envs.registration import load_env_creator

from agentrl.algos import get_algorithm
from agentrl.config import (  # the overrides as load_config reads them
    Config,
    ConfigError,
    _merge,
    _set_dotted,
)
from agentrl.env.content import message_images
from agentrl.env.registry import resolve_env_id
from agentrl.infra.cluster import local_cluster_cpus, local_cluster_gpus
from agentrl.infra.devices import resolve_device
from agentrl.learner.checkpoints import RUN_CONFIG, run_checkpoint
from agentrl.learner.local import latest_checkpoint
from agentrl.log.metrics import check_wandb_login
from agentrl.models.tiny import check_weights_readable, load_model
from agentrl.models.vlm import is_vlm_dir
from agentrl.rollout.agent_loop import call_with_timeout
from agentrl.rollout.envs import build_env
from agentrl.startup_model import check_chat_template, check_tokenizer_fits
from agentrl.yaml_safe import load_yaml


class OutError(ValueError):
    """`out` cannot take a new run (not empty, a file): the message says what to do."""


class ResumeError(ValueError):
    """`--resume` found no intact checkpoint to continue from."""


def check_settings(cfg: Config) -> None:
    """The settings that fail before anything is built (an `algo` option the algorithm does not
    support is refused by the config's schema already): Ray actors that cannot fit the local
    cluster (`check_local_cluster_fits`), dynamic sampling with `group_size < 2`,
    and a warm start (`sft.steps > 0`, a new run) on an env, or an `sft.mix_envs` env, without
    reference answers.

    Raises:
        ConfigError: naming the key.
    """
    check_local_cluster_fits(cfg)
    if cfg.algo.dynamic_sampling and cfg.algo.group_size < 2:
        raise ConfigError("config error: algo.dynamic_sampling needs algo.group_size >= 2 "
                          "(singleton groups carry no signal and would all be dropped)")
    if cfg.sft.steps > 0 and not cfg.resume and not env_has_reference_answers(cfg.env.name):
        raise ConfigError(f"config error: sft.steps={cfg.sft.steps}: env {cfg.env.name} offers no "
                          "reference answers (reference_answer()) for the warm start: set sft.steps=0")
    if cfg.sft.steps > 0 and not cfg.resume:
        for name in cfg.sft.mix_envs:
            try:
                has = env_has_reference_answers(name)
            except ValueError as e:  # an unknown name, reported with the key
                raise ConfigError(f"config error: sft.mix_envs: {e}") from None
            if not has:
                raise ConfigError(f"config error: sft.mix_envs: env {name} offers no reference answers "
                                  "(reference_answer()) to mix into the warm start")


def _ray_demands(cfg: Config) -> dict[str, list[tuple[str, float]]]:
    """The Ray actors a run starts and keeps for the whole run: per unit (`CPUs`, `GPUs`), a
    (keys, amount) per role that reserves some: rollout workers, learner ranks, and the
    reference / teacher / reward-model workers where `placement.*=worker` starts one (a
    reward-model worker is one per model path: counted once, the least it needs)."""
    r, t, pl = cfg.rollout, cfg.train, cfg.placement
    out: dict[str, list[tuple[str, float]]] = {"CPUs": [], "GPUs": []}

    def ask(unit: str, keys: str, amount: float) -> None:
        if amount > 0:
            out[unit].append((keys, amount))

    for unit, kind in (("CPUs", "cpus"), ("GPUs", "gpus")):
        per_worker = getattr(r, f"worker_{kind}")
        ask(unit, f"rollout.num_workers={r.num_workers} x rollout.worker_{kind}={per_worker:g}",
            r.num_workers * per_worker)
        per_rank = getattr(t, f"learner_{kind}")
        ask(unit, f"train.learner_workers={t.learner_workers} x train.learner_{kind}={per_rank:g}",
            t.learner_workers * per_rank)
        roles = [("reference", pl.reference == "worker" and get_algorithm(cfg.algo.name).needs_reference(cfg.algo)),
                 ("teacher", pl.teacher == "worker"), ("reward_model", pl.reward_model == "worker")]
        for role, on in roles:
            if on:
                n = getattr(pl, f"{role}_{kind}")
                ask(unit, f"placement.{role}_{kind}={n:g}", n)
    return out


def check_local_cluster_fits(cfg: Config, cpus: float | None = None, gpus: float | None = None) -> None:
    """The CPUs and GPUs the run's Ray actors reserve fit the local Ray cluster
    (`rollout.ray_address` unset): Ray waits for resources that no node has without a word,
    so `rollout.num_workers=3` at `rollout.worker_cpus=1` on a 2-CPU machine, or a worker
    reserving a GPU on a machine without one, hung at start-up with no output (the learner
    ranks' placement gives up after 60 s, the other workers never). Every actor that lives for
    the whole run counts (`_ray_demands`): rollout workers, learner ranks, and the reference,
    teacher and reward-model workers where `placement` starts them. The refusal is only for
    a demand that can never be placed. A joined cluster may grow: not checked.

    Args:
        cpus, gpus: the local cluster's CPUs / GPUs (default
            `agentrl.infra.cluster.local_cluster_cpus` / `local_cluster_gpus`).

    Raises:
        ConfigError: naming the keys of every role that reserves some (`rollout.num_workers` /
            `rollout.worker_cpus`, `train.learner_workers` / `train.learner_cpus`,
            `placement.reference_cpus`, ..., and the `*_gpus` keys), what they ask and what
            is there.
    """
    if cfg.rollout.ray_address:
        return
    demands = _ray_demands(cfg)
    for unit, have_fn, given in (("CPUs", local_cluster_cpus, cpus), ("GPUs", local_cluster_gpus, gpus)):
        asks = demands[unit]
        need = sum(n for _, n in asks)
        if not asks:
            continue
        have = have_fn() if given is None else given
        if need <= have + 1e-9:
            continue
        hint = ("lower them (fractions are allowed, e.g. rollout.worker_cpus=0.5) or join a larger "
                "cluster (rollout.ray_address)" if unit == "CPUs" else
                "set them to 0 (the workers run on the CPU), run where the GPUs are, or join a "
                "cluster that has them (rollout.ray_address)")
        raise ConfigError(f"config error: {' + '.join(what for what, _ in asks)} reserve {need:g} {unit} "
                          f"but the local Ray cluster has {have:g} (Ray would wait for them forever): {hint}")


def check_learner_device(cfg: Config) -> None:
    """Where the learner runs, its device: in this process (`train.learner_workers=0`) the
    driver resolves `train.device` (`cuda` without a CUDA device is refused here); on ranks the
    driver does not look (it may be a CPU-only head node: each rank checks its own device,
    `agentrl.learner.rank.rank_device`), and a CUDA rank must have exactly one whole GPU
    (`train.learner_gpus=1`): with 0 Ray leaves every GPU visible to every rank and each
    picks GPU 0, with a fraction two ranks share one (NCCL refuses both: "Duplicate GPU
    detected"), and more than 1 leaves GPUs idle. `train.device=auto` with
    `train.learner_gpus=0` runs the ranks on the CPU.

    Raises:
        ConfigError: naming `train.device` / `train.learner_gpus`.
    """
    t = cfg.train
    if t.learner_workers == 0:
        try:
            resolve_device(t.device)
        except ValueError as e:
            raise ConfigError(f"config error: {e}") from None
        return
    cuda = t.device == "cuda" or (t.device == "auto" and t.learner_gpus > 0)
    if cuda and t.learner_gpus != 1:
        why = ("0: Ray would leave every GPU visible to every rank and each would pick GPU 0"
               if t.learner_gpus == 0 else "a rank runs on one whole GPU; fractions would put "
               "two ranks on one GPU (NCCL refuses it)" if t.learner_gpus < 1 else
               "a rank uses one GPU; the others would stay idle")
        raise ConfigError(f"config error: train.learner_gpus={t.learner_gpus:g} with "
                          f"train.device={t.device} and train.learner_workers={t.learner_workers}: "
                          f"each CUDA learner rank needs train.learner_gpus=1 ({why}); "
                          "or train.device=cpu for ranks on the CPU")


def preflight(cfg: Config) -> list[str]:
    """Checks of the settings that would otherwise fail only after OUT was (re)written: the env
    is built once (with its wrappers), reset once and closed, `model.path` is a model
    directory whose weights load and cover the tokenizer's ids (`check_tokenizer_fits`) and
    whose chat template the policy's renderer can use (`check_chat_template`), vLLM
    imports when `rollout.engine=vllm`, a vision policy runs only where images do
    (`check_vision_training`), a text policy only where no image is
    (`check_policy_sees_images`), and W&B finds an API key (`log.wandb`, `check_wandb_login`).
    A new run with a warm start (`sft.steps > 0`) has the env check its reference solutions
    (`reference_failures()`, code_sandbox on a dataset file: run against their tests).

    Returns:
        the env's start-up notes (`startup_notes()`, e.g. code_sandbox's `trivial: 5 of 500
        train tasks dropped`), for the run's `[run]` line; [] for an env without them.

    Raises:
        ConfigError: naming the key (`env.kwargs`, `env.wrappers`, `env.wrapper_kwargs`,
            `model.path`, `model.vision`, `rollout.engine`, `log.wandb`, or the vision refusal's key).
    """
    path = cfg.model.path
    if path and not Path(path).is_dir():
        raise ConfigError(f"config error: model.path: model directory not found: {path}")
    if path and not (Path(path) / "config.json").is_file():
        raise ConfigError(f"config error: model.path: {path} holds no config.json (not a Hugging "
                          "Face model directory)")
    if path:
        try:
            check_weights_readable(path)
        except ValueError as e:
            raise ConfigError(f"config error: model.path: {e}") from None
        check_tokenizer_fits(path)
        check_chat_template(cfg, path)
    if path and cfg.model.vision and not is_vlm_dir(path):
        raise ConfigError(f"config error: model.vision=true with model.path={path}, a text-only model "
                          "(no image processor and vision tower): model.vision builds the embedded "
                          "vision-language model only without model.path; give a vision-language "
                          "model directory, or drop model.path (docs/multimodal.md)")
    if cfg.rollout.engine == "vllm" and importlib.util.find_spec("vllm") is None:
        raise ConfigError("config error: rollout.engine=vllm: vLLM is not installed in this "
                          "environment (docs/scale_out.md says how; or rollout.engine=hf)")
    try:
        check_vision_training(cfg)
    except ValueError as e:
        raise ConfigError(f"config error: {e}") from None
    if cfg.log.wandb:
        check_wandb_login()
    env = build_env(cfg, "train")  # ConfigError for keywords the env or a wrapper refuses
    try:
        check_splits(cfg, env)
        check_policy_sees_images(cfg, env)
        return env_notes(cfg, getattr(env, "unwrapped", env))
    finally:
        env.close()


def resolve_model_path(cfg: Config, notes: list[str] | None = None) -> Config:
    """`model.path` naming a training run's folder stands for its newest intact checkpoint
    (`agentrl.learner.checkpoints.run_checkpoint`, as `agentrl serve` / `eval` take it): the
    config with that checkpoint as `model.path` (so OUT/config.json records which), and a note
    naming it (and each newer checkpoint skipped) appended to `notes` for the `[run]` line.
    Anything else is returned as it is (`preflight` checks it).

    Raises:
        ConfigError: a run folder without an intact checkpoint, or whose newest checkpoint
            holds LoRA adapters (no full model: `agentrl merge` makes one); a `model.path`
            inside OUT of a new run with `overwrite` (it would be removed before it loads).
    """
    path = cfg.model.path
    if not path:
        return cfg
    skipped: list[str] = []
    try:
        ck = run_checkpoint(path, on_skip=lambda c, why: skipped.append(f"skipping {c}: {why}"))
    except FileNotFoundError as e:
        raise ConfigError(f"config error: model.path: {e}") from None
    used = Path(path) if ck is None else ck
    if cfg.overwrite and not cfg.resume and used.resolve().is_relative_to(Path(cfg.out).resolve()):
        raise ConfigError(f"config error: model.path: {used} is inside --out {cfg.out}, which --overwrite "
                          "would remove before it loads: copy it elsewhere, or choose another --out")
    if ck is None:
        return cfg
    if (ck / "adapter_config.json").is_file():
        raise ConfigError(f"config error: model.path: {path} is a training run's folder whose newest "
                          f"checkpoint {ck} holds LoRA adapters, not a model: merge them first "
                          f"(agentrl merge {ck} MERGED) and give model.path=MERGED")
    if notes is not None:
        notes.extend([*skipped, f"model.path {path} is a run folder: its newest checkpoint {ck}"])
    return cfg.model_copy(update={"model": cfg.model.model_copy(update={"path": str(ck)})})


def env_notes(cfg: Config, env: Any) -> list[str]:
    """`env.startup_notes()` (none without it), after the reference check of a new run's warm
    start (`env.reference_failures("train")`, when the env has it and `sft.steps > 0`)."""
    check = getattr(env, "reference_failures", None)
    if callable(check) and cfg.sft.steps > 0 and not cfg.resume:
        check("train")
    notes = getattr(env, "startup_notes", None)
    return [str(n) for n in notes()] if callable(notes) else []


def check_splits(cfg: Config, env: Any) -> None:
    """An env with a fixed task list per split (`tasks(split)`, e.g. code_sandbox on a dataset
    file) must have train tasks, and held-out tasks when the run evaluates (`train.eval_tasks`
    > 0; always 1 or more today), found before OUT is written.

    Raises:
        ConfigError: naming the split, the env and the keys that choose it.
    """
    listed = getattr(getattr(env, "unwrapped", env), "tasks", None)
    if not callable(listed) or "split" not in inspect.signature(listed).parameters:
        return
    for split in ("train", "heldout") if cfg.train.eval_tasks > 0 else ("train",):
        if not listed(split):
            raise ConfigError(f"config error: env {cfg.env.name}: the {split} split has no tasks "
                              f"(env.dataset={cfg.env.dataset}, env.kwargs={dict(cfg.env.kwargs)}); "
                              "give a larger dataset or another heldout_fraction in env.kwargs")


def check_policy_sees_images(cfg: Config, env: Any) -> None:
    """A text-only policy (`model.path` a text model, or the embedded text default) on an env
    whose observations carry images is refused at start-up: `env` is reset once (seed
    `cfg.seed`, within `env.reset_timeout_s`) and its opening messages are looked at; a reset
    that raises or times out is left to the rollouts (contract 7).

    Raises:
        ConfigError: naming the env and the key to set (`model.vision=true`, or `model.path`).
    """
    path = cfg.model.path
    if cfg.model.vision or (path and is_vlm_dir(path)):  # a resumed run's too: its config says
        return
    try:  # within env.reset_timeout_s, as in rollouts
        obs, _ = call_with_timeout(lambda: env.reset(seed=cfg.seed), cfg.env.reset_timeout_s)
    except Exception:  # noqa: BLE001 - the env's own failure (or a timeout), met again in rollouts
        return
    if isinstance(obs, list) and message_images([m for m in obs if isinstance(m, dict)]):
        model = f"model.path={path} is a text-only model" if path else "the embedded default is a text model"
        raise ConfigError(f"config error: model.vision: env {cfg.env.name} sends image observations, but "
                          f"{model}: set model.vision=true (the embedded tiny vision-language model) or "
                          "model.path=<a local vision-language model directory> (docs/multimodal.md)")


RESUME_FIXED = ("env.name", "algo.name", "env.dataset")
"""Settings a resumed run keeps: changing one would continue another run's policy, optimizer and
metrics under a different task or objective (start a new run for that)."""


def check_resume_keeps_the_run(cfg: Config, out: Path) -> None:
    """`--resume OUT` with a setting of `RESUME_FIXED` other than the run's (OUT/config.json)
    is refused before anything is written, so the run's config.json stays the run's; so is a
    `train.steps` below the step of the run's newest intact checkpoint.

    Raises:
        ResumeError: names the setting, the run's value and the one asked for.
    """
    saved_file = out / "config.json"
    if not saved_file.is_file():
        return
    saved = json.loads(saved_file.read_text())
    now = json.loads(cfg.model_dump_json())
    for key in RESUME_FIXED:
        section, name = key.split(".")
        was, want = saved.get(section, {}).get(name), now[section][name]
        if was != want:
            raise ResumeError(f"--resume {out}: the run was trained with {key}={was}, not {want}; "
                              "a resumed run keeps its env and algorithm (start a new run with "
                              "--out for another one)")
    ck = latest_checkpoint(out)
    done = json.loads((ck / "agentrl_state.json").read_text())["step"] if ck is not None else 0
    if cfg.train.steps < done:  # would rewrite config.json's train.steps below the run's own
        raise ResumeError(f"--resume {out}: the run is at step {done}, past train.steps={cfg.train.steps}; "
                          f"give --steps {done} or more (or leave --steps out)")


RESUME_FROM_STATE = ("train.lr", "train.weight_decay")
"""Settings a resumed run takes from its checkpoint's optimizer state (AdamW's param groups and
the scheduler's base rates): another value on the command line would be ignored, so it is
refused (`check_resume_edits`)."""
RESUME_UNCOMPARED = ("resume", "out", "overwrite", "quiet")
"""Settings of a command line, not of the run: not compared by `check_resume_edits`."""


def dotted(tree: Any, prefix: str = "") -> dict[str, Any]:
    """The leaves of nested dict `tree` by dotted key (`{"train": {"lr": 1}}` -> `{"train.lr": 1}`;
    lists and empty dicts are leaves)."""
    if not isinstance(tree, dict) or (not tree and prefix):
        return {prefix: tree}
    out: dict[str, Any] = {}
    for k, v in tree.items():
        out.update(dotted(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def check_resume_edits(out: Path, saved: dict[str, Any], asked: dict[str, Any]) -> None:
    """`--resume OUT` continues with the settings of the run's newest intact checkpoint (its
    `RUN_CONFIG`, the run's config.json when it was saved): a setting of OUT/config.json
    (`saved`, as read) that differs from the checkpoint's was edited after the run wrote it,
    and is refused unless this command line gives that key (`asked`: the nested settings of its
    `-c` file, `key=value` overrides and options). An edit of config.json took half effect
    before (the group size applied, the learning rate not: the optimizer's state holds it).
    A setting of `RESUME_FROM_STATE` given another value on the command line is refused too
    (the restored optimizer would ignore it). A checkpoint without `RUN_CONFIG` (written before
    it existed) is not compared.

    Raises:
        ResumeError: naming every edited key with both values, in one line.
    """
    ck = latest_checkpoint(out)
    if ck is None or not (ck / RUN_CONFIG).is_file():
        return
    try:
        was = dotted(json.loads((ck / RUN_CONFIG).read_text()))
    except (OSError, ValueError):
        return  # the manifest vouched for it; an unreadable one is left to the load
    now, given = dotted(saved), dotted(asked)

    def covered(key: str) -> bool:
        return any(key == g or key.startswith(g + ".") or g.startswith(key + ".") for g in given)

    for key in RESUME_FROM_STATE:
        if key in given and key in was and not _same_number(given[key], was[key]):
            raise ResumeError(f"--resume {out}: {key}={given[key]}: a resumed run keeps its checkpoint's "
                              f"{key}={json.dumps(was[key])} (the restored optimizer holds it); start a new "
                              "run with --out for another")
    edited = sorted(k for k in set(was) | set(now)
                    if k.split(".")[0] not in RESUME_UNCOMPARED and was.get(k) != now.get(k) and not covered(k))
    if edited:
        diff = ", ".join(f"{k}={json.dumps(now.get(k))} (checkpoint: {json.dumps(was.get(k))})" for k in edited)
        raise ResumeError(f"--resume {out}: config.json was edited after {ck.name} was saved: {diff}; a resumed "
                          "run keeps its checkpoint's settings: undo the edit, or give the setting on the "
                          "command line (key=value), or start a new run with --out")


def _same_number(a: Any, b: Any) -> bool:
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return a == b


UNISOLATED = {"backend": "subprocess"}
"""Settings (any depth of `env.kwargs` / `env.wrapper_kwargs`) under which code runs without a
sandbox (`agentrl.sandbox`: the `subprocess` backend)."""


def unisolated_keys(tree: Any, prefix: str) -> set[str]:
    """The dotted keys under `prefix` of nested dict `tree` that set `UNISOLATED`."""
    found: set[str] = set()
    if isinstance(tree, dict):
        for k, v in tree.items():
            key = f"{prefix}.{k}"
            if UNISOLATED.get(str(k)) == v:
                found.add(key)
            found |= unisolated_keys(v, key)
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            found |= unisolated_keys(v, f"{prefix}.{i}")
    return found


def asked_settings(yaml_path: str | Path | None, overrides: list[str] | None) -> dict[str, Any]:
    """The nested settings a command line itself gives: its `-c` YAML file's, then its
    `key=value` overrides' (no defaults, no saved config, not validated).

    Raises:
        ConfigError: unreadable YAML or a malformed override (as `load_config`).
    """
    data: dict[str, Any] = {}
    if yaml_path and Path(yaml_path).is_file():
        try:
            loaded = load_yaml(Path(yaml_path).read_text())
        except (ValueError, yaml.YAMLError) as e:
            raise ConfigError(f"{yaml_path}: invalid YAML ({' '.join(str(e).split())})") from None
        data = _merge(data, loaded if isinstance(loaded, dict) else {})
    for ov in overrides or []:
        k, _, v = ov.partition("=")
        try:
            _set_dotted(data, k.strip(), load_yaml(v) if v not in ("", "None") else None)
        except (ValueError, yaml.YAMLError) as e:
            raise ConfigError(f"override {k.strip()}: invalid value {v!r} ({' '.join(str(e).split())})") from None
    return data


def check_resume_isolation(cfg: Config, asked: dict[str, Any]) -> None:
    """`--resume` never lowers isolation from the run's (editable) config.json: an unisolated
    backend (`UNISOLATED`) in the resumed config must be asked for by this command line
    (`asked`: the nested settings of its `-c` file and `key=value` overrides).

    Raises:
        ResumeError: naming the key and how to ask for it.
    """
    env = {"kwargs": cfg.env.kwargs, "wrapper_kwargs": getattr(cfg.env, "wrapper_kwargs", None) or {}}
    now = unisolated_keys(env, "env")
    wanted = unisolated_keys(asked.get("env", {}), "env")
    missing = sorted(now - wanted)
    if missing:
        key = missing[0]
        raise ResumeError(f"--resume {cfg.resume}: the run's config.json sets {key}=subprocess (code runs "
                          "without a sandbox); a resumed run runs unisolated only when its command line "
                          f"asks: add {key}=subprocess, or set an isolated backend (bwrap, docker, auto)")


def env_has_reference_answers(name: str) -> bool:
    """Does env `name`'s class define `reference_answer()` (the warm start's targets)?"""
    ep = gym.spec(resolve_env_id(name)).entry_point
    cls = load_env_creator(ep) if isinstance(ep, str) else ep
    return callable(getattr(cls, "reference_answer", None))


def check_vision_training(cfg: Config) -> None:
    """With a vision-language policy (`model.vision`, or a `model.path` holding one), refuse at
    start-up what does not run with images yet: LoRA, PPO's value head, a reference worker,
    learner ranks and partial rollouts (`rollout.partial`: the vision engine does not interrupt
    a generation; without this check the run failed after its warm start; docs/multimodal.md). Ray rollout workers (`rollout.num_workers > 0`) and the
    vLLM engine (`rollout.engine=vllm`: token prompts plus images) do.

    Raises:
        ValueError: naming the key to change.
    """
    if not (cfg.model.vision or (cfg.model.path and is_vlm_dir(cfg.model.path))):
        return
    bad = [(cfg.model.lora_r > 0, "model.lora_r=0"),
           (cfg.algo.name == "ppo", "an algorithm without a value head (grpo, rloo, ...)"),
           (cfg.placement.reference == "worker", "placement.reference other than worker"),
           (cfg.train.learner_workers > 0, "train.learner_workers=0"),
           (cfg.rollout.partial, "rollout.partial=false")]
    need = [fix for hit, fix in bad if hit]
    if need:
        raise ValueError("a vision-language policy trains without LoRA, a value head, a reference "
                         "worker, learner ranks or partial rollouts for now; "
                         f"set {', '.join(need)} (docs/multimodal.md)")


def resume_checkpoint(cfg: Config, out: Path, say: Callable[[str], None]) -> Path | None:
    """The checkpoint to resume from with `cfg.resume` (OUT's newest intact one; newer ones
    that fail their manifest are skipped, each named), or None for a new run.

    Raises:
        ResumeError: `cfg.resume` is set and OUT has no intact checkpoint.
    """
    if not cfg.resume:
        return None
    ck = latest_checkpoint(out, on_skip=lambda p, why: say(f"[resume] skipping {p}: {why}"))
    if ck is None:
        raise ResumeError(f"--resume {out}: no intact checkpoint to resume from (the run stopped "
                          "before its first save, or every checkpoint failed its manifest); start it "
                          f"again with --out {out} --overwrite")
    if cfg.train.learner_workers > 0 and not (ck / "dcp").is_dir():
        raise ResumeError(f"--resume {out}: {ck} was written by the in-process learner "
                          "(train.learner_workers=0) and has no sharded state (dcp/) for learner ranks; "
                          "resume it with train.learner_workers=0")
    return ck


def restore_inline_reference(cfg: Config, learner: Any, ck: Path, out: Path) -> None:
    """A run that started with `placement.reference=worker` and resumes inline: its checkpoints
    hold no reference weights (`ref_model.pt`), so the learner's frozen copy (made from the
    resumed policy) is loaded from OUT/reference_model, the weights the run started from.

    Raises:
        ResumeError: neither is there (the learner would silently take the resumed policy as
            its reference)."""
    ref = getattr(learner, "ref_model", None)
    if cfg.placement.reference != "inline" or ref is None or (ck / "ref_model.pt").exists() \
            or (ck / "dcp").is_dir():  # (learner ranks' checkpoints keep the reference in dcp/)
        return
    if not (out / "reference_model" / "config.json").exists():
        raise ResumeError(f"--resume {out}: {ck} has no reference weights (ref_model.pt) and "
                          f"{out / 'reference_model'} does not exist")
    ref.load_state_dict(load_model(out / "reference_model")[0].state_dict())
